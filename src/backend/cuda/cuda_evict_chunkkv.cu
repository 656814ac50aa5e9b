/* cuda_evict_chunkkv.cu - evict_chunk_rank on the CUDA backend: ChunkKV's chunk selection from a
 * layer's scores (semantics in backend.h) without the host. chunk_mean_kernel (a thread per chunk)
 * sums its rows in the op's order (heads in fp32, rows in double, ascending), so the means are the
 * CPU's bit for bit; chunk_rank_kernel (a thread per chunk) counts the chunks that rank before it in
 * top-k order (descending mean, NaN after every number, ties to the lower chunk): the chunk is kept
 * when fewer than `keep` do, which is the CPU's sorted prefix; chunk_offsets_kernel (one block) gives
 * each kept chunk its first output index by a scan in chunk order and writes the count;
 * chunk_rows_kernel (a thread per row) writes every kept row to each output row. Scratch (means,
 * offsets) comes from the eviction workspace sized by evict_reserve; nothing is allocated,
 * downloaded or synchronised. */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr unsigned CR_THREADS = 256;
constexpr int CR_SCAN = 1024; /* threads of the offsets block */

__global__ void chunk_mean_kernel(double *mean, const float *s, int ld, int H, int n, int C, int n_chunks) {
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= n_chunks) return;
    const int t0 = c * C, t1 = t0 + C < n ? t0 + C : n;
    double sum = 0.0;
    for (int t = t0; t < t1; t++) {
        float over_heads = 0.0f;
        for (int h = 0; h < H; h++) over_heads += s[(size_t)h * ld + t];
        sum += (double)over_heads;
    }
    mean[c] = sum / (double)(t1 - t0);
}

__device__ __forceinline__ bool chunk_better(double ma, int a, double mb, int b) {
    if (isnan(ma) || isnan(mb)) return isnan(mb) && (!isnan(ma) || a < b);
    return ma > mb || (ma == mb && a < b);
}

/* off[c] = 1 when chunk c is kept, else 0 */
__global__ void chunk_rank_kernel(int32_t *off, const double *mean, int n_chunks, int keep) {
    const int c = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (c >= n_chunks) return;
    const double m = mean[c];
    int before = 0;
    for (int b = 0; b < n_chunks && before < keep; b++) before += chunk_better(mean[b], b, m, c);
    off[c] = before < keep;
}

/* One block: off[c] <- the first output index of kept chunk c (-1 when dropped), *n_kept the total. Each
 * thread takes a contiguous run of chunks; the runs' totals are added in order by thread 0. */
__global__ void chunk_offsets_kernel(int32_t *off, int32_t *n_kept, int n_chunks, int n, int C) {
    __shared__ int32_t part[CR_SCAN];
    const int tid = (int)threadIdx.x, per = (n_chunks + CR_SCAN - 1) / CR_SCAN;
    const int c0 = tid * per, c1 = c0 + per < n_chunks ? c0 + per : n_chunks;
    int32_t sum = 0;
    for (int c = c0; c < c1; c++) sum += off[c] ? (c * C + C < n ? C : n - c * C) : 0;
    part[tid] = sum;
    __syncthreads();
    if (tid == 0) {
        int32_t run = 0;
        for (int i = 0; i < CR_SCAN; i++) {
            const int32_t v = part[i];
            part[i] = run;
            run += v;
        }
        *n_kept = run;
    }
    __syncthreads();
    int32_t at = part[tid];
    for (int c = c0; c < c1; c++) {
        const int len = c * C + C < n ? C : n - c * C;
        if (off[c]) {
            off[c] = at;
            at += len;
        } else {
            off[c] = -1;
        }
    }
}

__global__ void chunk_rows_kernel(int32_t *rows, int ld_rows, int n_rows, const int32_t *off, int n, int C) {
    const int t = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (t >= n) return;
    const int c = t / C, o = off[c];
    if (o < 0) return;
    for (int r = 0; r < n_rows; r++) rows[(size_t)r * ld_rows + o + (t - c * C)] = t;
}

/* mean [chunks] double, off [chunks] int32 */
void chunk_rank_parts(size_t bytes[2], int n_chunks) {
    bytes[0] = sizeof(double) * (size_t)n_chunks, bytes[1] = sizeof(int32_t) * (size_t)n_chunks;
}

} // namespace

size_t chunk_rank_scratch_bytes(int n) {
    size_t bytes[2];
    chunk_rank_parts(bytes, n > 0 ? n : 0); /* at most one chunk per row */
    return parts_total(bytes, 2, NULL);
}

ckv_status evict_chunk_rank(ckv_backend *be, int32_t *rows, int ld_rows, int n_rows, int32_t *n_kept, const float *s,
                            int ld, int H, int n, int C, int keep) {
    ctx *c = ctx_of(be);
    const char *op = "evict_chunk_rank";
    const int n_chunks = C >= 1 ? (n + C - 1) / C : 0;
    if (C < 1 || C > n || keep < 1 || keep > n_chunks || H < 1 || ld < n || ld_rows < n || n_rows < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: %s: chunks of %d over %d rows keeping %d of %d (%d heads)",
                         CKV_CUDA_BACKEND_NAME, op, C, n, keep, n_chunks, H);
    size_t bytes[2];
    void *parts[2];
    chunk_rank_parts(bytes, n_chunks);
    CKV_TRY(scratch_parts(c, bytes, parts, 2, op));
    double *mean = (double *)parts[0];
    int32_t *off = (int32_t *)parts[1];
    const dim3 per_chunk(blocks_for((size_t)n_chunks, CR_THREADS));
    CKV_LAUNCH(chunk_mean_kernel, per_chunk, dim3(CR_THREADS), 0, c->stream, mean, s, ld, H, n, C, n_chunks);
    CKV_LAUNCH(chunk_rank_kernel, per_chunk, dim3(CR_THREADS), 0, c->stream, off, (const double *)mean, n_chunks, keep);
    CKV_LAUNCH(chunk_offsets_kernel, dim3(1), dim3(CR_SCAN), 0, c->stream, off, n_kept, n_chunks, n, C);
    CKV_LAUNCH(chunk_rows_kernel, dim3(blocks_for((size_t)n, CR_THREADS)), dim3(CR_THREADS), 0, c->stream, rows,
               ld_rows, n_rows, (const int32_t *)off, n, C);
    return op_status(c, op);
}

} // namespace CKV_CUDA_NS
