/* cuda_evict_kvzip_norms.cu - evict_kvzip_norms on the CUDA backend: KVzip+'s norms of one replayed
 * chunk (semantics in backend.h) in double, for bf16 or f32 caches and head dims up to 256. Three
 * kernels: the replay rows' 1 / ||x|| (one block per row, a tree over 256 partial sums); each local
 * query head's Gram block G_j = W_j W_j^T of o_proj's columns (16 x 16 output tiles, the hidden
 * columns ascending through shared-memory tiles, as the CPU's sums); and sqrt(v^T G_j v) of the
 * chunk's value rows read from the KV segments (a block per head and 8 rows, a thread per dim a
 * summing b ascending, the dims added in ascending order by one thread per row, as the CPU's). The
 * Gram blocks are scratch in the eviction workspace sized by evict_reserve; nothing is allocated,
 * downloaded or synchronised per call. It scores nothing (evict_kvzip takes the norms). */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

enum { NORM_THREADS = 256, GRAM_TILE = 16, VN_ROWS = 8, VN_MAX_DIM = 256 };

/* Grid n_q, NORM_THREADS. hinv[i] = 1 / ||x_i|| over the D columns, the squares summed in double. */
__global__ void kvzip_rownorm_kernel(float *hinv, const float *x, int D) {
    __shared__ double part[NORM_THREADS];
    const int i = (int)blockIdx.x, tid = (int)threadIdx.x;
    const float *xi = x + (size_t)i * (size_t)D;
    double ss = 0.0;
    for (int c = tid; c < D; c += NORM_THREADS) ss += (double)xi[c] * (double)xi[c];
    part[tid] = ss;
    __syncthreads();
    for (int h = NORM_THREADS / 2; h > 0; h >>= 1) {
        if (tid < h) part[tid] += part[tid + h];
        __syncthreads();
    }
    if (tid == 0) hinv[i] = 1.0f / (float)sqrt(part[0]);
}

/* Grid (d tiles, d tiles, local query heads), GRAM_TILE x GRAM_TILE threads. gram[j, a, b] = sum_c
 * wot[j d + a, c] wot[j d + b, c] in double over c ascending ([n_heads_local, d, d]). */
__global__ void kvzip_gram_kernel(double *gram, const float *wot, int d, int D) {
    __shared__ float ta[GRAM_TILE][GRAM_TILE + 1], tb[GRAM_TILE][GRAM_TILE + 1]; // [row][column]
    const int j = (int)blockIdx.z, tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    const int a0 = (int)blockIdx.y * GRAM_TILE, b0 = (int)blockIdx.x * GRAM_TILE;
    const float *w = wot + (size_t)j * (size_t)d * (size_t)D;
    double acc = 0.0;
    for (int c0 = 0; c0 < D; c0 += GRAM_TILE) {
        const bool col = c0 + tx < D;
        ta[ty][tx] = a0 + ty < d && col ? w[(size_t)(a0 + ty) * D + c0 + tx] : 0.0f;
        tb[ty][tx] = b0 + ty < d && col ? w[(size_t)(b0 + ty) * D + c0 + tx] : 0.0f;
        __syncthreads();
        const int n = D - c0 < GRAM_TILE ? D - c0 : GRAM_TILE;
        for (int k = 0; k < n; k++) acc += (double)ta[ty][k] * (double)tb[tx][k];
        __syncthreads();
    }
    if (a0 + ty < d && b0 + tx < d) gram[((size_t)j * d + a0 + ty) * d + b0 + tx] = acc;
}

/* Grid (blocks of VN_ROWS chunk rows, local query heads), d threads. vn[j * ld_vn + c] = sqrt(v^T G_j
 * v) of chunk row start + c of KV head (head0 + j) / group: thread a forms v_a (sum_b G_j[b, a] v_b)
 * (G symmetric: a coalesced read of column a), and one thread per row adds the d terms ascending. */
template <typename T>
__global__ void kvzip_vnorm_kernel(float *vn, int ld_vn, const double *gram, ckv_kv_batch kv, int start, int C,
                                   int head0, int group) {
    __shared__ float vs[VN_ROWS][VN_MAX_DIM];   // [row][dim]
    __shared__ double red[VN_ROWS][VN_MAX_DIM]; // [row][dim]
    const int j = (int)blockIdx.y, c0 = (int)blockIdx.x * VN_ROWS, a = (int)threadIdx.x, d = kv.head_dim;
    const T *v = (const T *)kv.segs[0][(head0 + j) / group].v;
    const int nr = C - c0 < VN_ROWS ? C - c0 : VN_ROWS;
    for (int r = 0; r < nr; r++) vs[r][a] = ld_f32(v, (size_t)(start + c0 + r) * (size_t)d + (size_t)a);
    __syncthreads();
    const double *g = gram + (size_t)j * (size_t)d * (size_t)d;
    double ga[VN_ROWS];
CKV_UNROLL
    for (int r = 0; r < VN_ROWS; r++) ga[r] = 0.0;
    for (int b = 0; b < d; b++) {
        const double gba = g[(size_t)b * d + a];
CKV_UNROLL
        for (int r = 0; r < VN_ROWS; r++)
            if (r < nr) ga[r] += gba * (double)vs[r][b];
    }
CKV_UNROLL
    for (int r = 0; r < VN_ROWS; r++)
        if (r < nr) red[r][a] = (double)vs[r][a] * ga[r];
    __syncthreads();
    if (a < nr) {
        double acc = 0.0;
        for (int t = 0; t < d; t++) acc += red[a][t];
        vn[(size_t)j * ld_vn + c0 + a] = (float)sqrt(acc > 0.0 ? acc : 0.0);
    }
}

} // namespace

size_t kvzip_norms_scratch_bytes(int n_heads_local, int d) {
    const size_t gram = sizeof(double) * (size_t)n_heads_local * (size_t)d * (size_t)d;
    return parts_total(&gram, 1, NULL);
}

ckv_status evict_kvzip_norms(ckv_backend *be, const ckv_evict_kvzip_norms_params *n) {
    ctx *c = ctx_of(be);
    const char *op = "evict_kvzip_norms";
    if (!n || !n->kv || !n->wot || !n->x || !n->hinv || !n->vn || n->n_q < 1 || n->hidden < 1 || n->start < 0 ||
        n->start >= n->end || n->end - n->start > n->ld_vn || n->group < 1 || n->n_heads_local < 1 || n->head0 < 0 ||
        (n->head0 + n->n_heads_local - 1) / n->group >= n->kv->n_kv_heads)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: %s: rows or heads out of range (chunk %d..%d, ld_vn %d, %d "
                         "replayed, heads %d+%d of group %d)", CKV_CUDA_BACKEND_NAME, op, n ? n->start : 0,
                         n ? n->end : 0, n ? n->ld_vn : 0, n ? n->n_q : 0, n ? n->head0 : 0,
                         n ? n->n_heads_local : 0, n ? n->group : 0);
    const ckv_kv_batch *kv = n->kv;
    CKV_TRY(kv_dtype_check(kv->dtype, op));
    const int d = kv->head_dim, H = n->n_heads_local, C = n->end - n->start;
    if (d < 1 || d > VN_MAX_DIM)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: %s: head_dim %d (up to %d)", CKV_CUDA_BACKEND_NAME, op,
                         d, (int)VN_MAX_DIM);
    const size_t bytes = sizeof(double) * (size_t)H * (size_t)d * (size_t)d;
    void *part = NULL;
    CKV_TRY(scratch_parts(c, &bytes, &part, 1, op));
    double *gram = (double *)part; /* [H, d, d] */
    CKV_LAUNCH(kvzip_rownorm_kernel, dim3((unsigned)n->n_q), dim3(NORM_THREADS), 0, c->stream, n->hinv, n->x, n->hidden);
    const unsigned tiles = (unsigned)((d + GRAM_TILE - 1) / GRAM_TILE);
    CKV_LAUNCH(kvzip_gram_kernel, dim3(tiles, tiles, (unsigned)H), dim3(GRAM_TILE, GRAM_TILE), 0, c->stream, gram, n->wot,
               d, n->hidden);
    const dim3 grid((unsigned)((C + VN_ROWS - 1) / VN_ROWS), (unsigned)H);
    if (kv->dtype == CKV_DTYPE_BF16)
        CKV_LAUNCH(kvzip_vnorm_kernel<ckv_bf16>, grid, dim3((unsigned)d), 0, c->stream, n->vn, n->ld_vn,
                   (const double *)gram, *kv, n->start, C, n->head0, n->group);
    else
        CKV_LAUNCH(kvzip_vnorm_kernel<float>, grid, dim3((unsigned)d), 0, c->stream, n->vn, n->ld_vn,
                   (const double *)gram, *kv, n->start, C, n->head0, n->group);
    return op_status(c, op);
}

} // namespace CKV_CUDA_NS
