/* cuda_evict_chunk.cu - the CUDA backend's ops of Compactor's chunked non-causal attention
 * (semantics in backend.h): evict_chunk_colsum (one chunk's queries attending to the chunk's own keys
 * without a causal mask, plus kvpress's padding keys and queries of the last chunk) and
 * evict_row_stats (each row's sum and sum of squares, for the z-score). Two kernels per chunk:
 *  - chunk_rowstats_kernel, block per (query, local head): each 16-byte chunk of a key row is read by
 *    one lane (LPK = the power of two >= the row's chunks lanes per key, 32 / LPK keys per warp step,
 *    coalesced), the lane's query chunks held in registers, the dot reduced by xor shuffles in a fixed
 *    order; a first pass finds the softmax max (the padding logit -1e-9 included), a second recomputes
 *    the same logits and sums the exponentials in double; stats [n_heads_local, n_q] {max, 1 / sum}
 *    in the eviction workspace.
 *  - chunk_colsum_kernel, block per (32 key columns, KV head): the key tile staged in shared memory as
 *    fp32 (16-byte loads, float4 stores, rows padded by 4 floats so that a quarter-warp's float4 reads
 *    of 8 rows fall in distinct banks), queries staged 8 at a time in the same layout (a float4 per
 *    thread from global memory; read as broadcasts); each warp computes the weights of 2 queries for
 *    its 32 columns, warp 0 adds them to the column's double in the op's order (heads ascending, real
 *    queries ascending, then the n_pad padding queries).
 * The row kernel computes each logit twice and the column kernel once more: 3 n_q^2 d multiply-adds
 * per local head and chunk, the chunk's keys re-read from L2 by every query's block.
 * Logits are fp32 dot products summed in another order than the CPU's GEMM, so column sums agree
 * with cpu/cpu_evict_attn.c to a few ulp; every sum has a fixed order, so results are deterministic.
 * Head dims: multiples of 8 up to 256. It allocates nothing (stats from the reserved workspace),
 * waits for nothing, and selects nothing; the queries are recomputed by the scorer
 * (evict/score_compactor.c). */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr int CK_THREADS = 128;          /* 4 warps */
constexpr int CK_WARPS = CK_THREADS / 32;
constexpr int CK_COLS = 32;              /* key columns per block of the column kernel: a lane each */
constexpr int CK_QB = 8;                 /* queries staged per step of the column kernel (2 per warp) */
constexpr int CK_MAX_DIM = 256;
constexpr int CK_KS = CK_MAX_DIM + 4;    /* row stride of the staged keys (floats) */
constexpr float CK_PAD_LOGIT = -1e-9f;   /* kvpress's logit of a padding key */
constexpr int ROW_THREADS = 256;         /* evict_row_stats */

/* Where value v of 16-byte chunk cc of a d-wide row sits in a staged fp32 row: chunks of 4 values
 * are stored as float4 at cc * 4 (first half of a bf16 chunk) and d / 2 + cc * 4 (its second half),
 * so consecutive chunks store to consecutive float4s. */
__device__ __forceinline__ int ck_pos(int cc, int v, int d) { return (v >> 2) * (d >> 1) + cc * 4 + (v & 3); }

template <int VEC> __device__ __forceinline__ void ck_store(float *row, int cc, const float *x, int d) {
CKV_UNROLL
    for (int h = 0; h < VEC / 4; h++)
        sts_f4(row + ck_pos(cc, 4 * h, d), make_float4(x[4 * h], x[4 * h + 1], x[4 * h + 2], x[4 * h + 3]));
}

/* The logit of key t of the chunk for this lane's query chunks qr (LPK lanes per key; lanes c and
 * c + 32 of a 64-chunk row are one lane's two chunks); every lane of the key gets it. */
template <typename T>
__device__ __forceinline__ float ck_key_logit(const float (*qr)[row_chunk<T>::VEC], const T *K, int t, int n_q, int d,
                                              int c, int lpk, float scale) {
    constexpr int VEC = row_chunk<T>::VEC;
    const int ch = d / VEC;
    float dot = 0.0f;
CKV_UNROLL
    for (int u = 0; u < 2; u++) {
        const int cc = c + 32 * u;
        float x[VEC];
        row_chunk<T>::load(x, K, (size_t)t * (size_t)d + (size_t)(cc * VEC), t < n_q && cc < ch);
CKV_UNROLL
        for (int v = 0; v < VEC; v++) dot += qr[u][v] * x[v];
    }
    for (int o = lpk >> 1; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    return dot * scale;
}

/* Block (i, j): stats[j, i] = {m, (float)(1 / sum)} of query i of local head j over the chunk's
 * n_q keys and n_pad padding keys (logit -1e-9): m the max logit, the sum of exp(logit - m) in double. */
template <typename T>
__global__ void chunk_rowstats_kernel(float2 *stats, const float *q, int n_q, int q_row0, ckv_kv_batch kv,
                                      int n_heads_local, int head0, int group, float scale, int n_pad) {
    constexpr int VEC = row_chunk<T>::VEC;
    __shared__ double red[32];
    __shared__ float redf[32];
    const int i = (int)blockIdx.x, j = (int)blockIdx.y, d = kv.head_dim, ch = d / VEC;
    int lpk = 1;
    while (lpk < ch && lpk < 32) lpk <<= 1;
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5, c = lane % lpk, sub = lane / lpk;
    const int kpw = 32 / lpk;
    const T *K = (const T *)kv.segs[0][(head0 + j) / group].k + (size_t)q_row0 * (size_t)d;
    const float *qv = q + ((size_t)i * n_heads_local + j) * (size_t)d;
    float qr[2][VEC];
CKV_UNROLL
    for (int u = 0; u < 2; u++) {
        const int cc = c + 32 * u;
CKV_UNROLL
        for (int v = 0; v < VEC; v++) qr[u][v] = cc < ch ? qv[cc * VEC + v] : 0.0f;
    }
    /* every lane of a warp runs the same steps (the shuffles); keys past n_q read nothing */
    float m = n_pad > 0 ? CK_PAD_LOGIT : -INFINITY;
    for (int t0 = warp * kpw; t0 < n_q; t0 += CK_WARPS * kpw) {
        const int t = t0 + sub;
        const float l = ck_key_logit<T>(qr, K, t, n_q, d, c, lpk, scale);
        if (t < n_q) m = fmaxf(m, l);
    }
    m = block_max(m, redf);
    double s = 0.0;
    for (int t0 = warp * kpw; t0 < n_q; t0 += CK_WARPS * kpw) {
        const int t = t0 + sub;
        const float l = ck_key_logit<T>(qr, K, t, n_q, d, c, lpk, scale);
        if (t < n_q && c == 0) s += (double)expf(l - m);
    }
    s = block_sum(s, red);
    if (threadIdx.x == 0) {
        s += (double)n_pad * (double)expf(CK_PAD_LOGIT - m);
        stats[(size_t)j * n_q + i] = make_float2(m, (float)(1.0 / s));
    }
}

/* Block (column tile, KV head g): colsum[g, q_row0 + t] += the weights of key t (t in the tile) over
 * the local heads of g (ascending), their queries (ascending), then the n_pad padding queries, whose
 * weight on every real key is (float)(1 / (n_q + n_pad e^-1e-9)) as the softmax of their logits
 * (0 on the real keys, -1e-9 on the padding) gives it. */
template <typename T>
__global__ void chunk_colsum_kernel(double *colsum, int n_cols, const float2 *stats, const float *q, int n_q, int q_row0,
                                    ckv_kv_batch kv, int n_heads_local, int head0, int group, float scale, int n_pad) {
    constexpr int VEC = row_chunk<T>::VEC;
    __shared__ float ks[CK_COLS * CK_KS]; /* [CK_COLS, CK_KS] the tile's keys, fp32, staged layout */
    __shared__ float qs[CK_QB * CK_MAX_DIM]; /* [CK_QB, d] queries, staged layout */
    __shared__ float ps[CK_QB * CK_COLS];    /* [CK_QB, CK_COLS] weights of the staged queries */
    const int g = (int)blockIdx.y, d = kv.head_dim, ch = d / VEC, t0 = (int)blockIdx.x * CK_COLS;
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5, t = t0 + lane;
    const int jlo = g * group - head0 < 0 ? 0 : g * group - head0;
    const int jhi = (g + 1) * group - head0 < n_heads_local ? (g + 1) * group - head0 : n_heads_local;
    if (jlo >= jhi) return; /* no local head reads this KV head: the whole block leaves */
    const T *K = (const T *)kv.segs[0][g].k + (size_t)q_row0 * (size_t)d;
    for (int e = (int)threadIdx.x; e < CK_COLS * ch; e += CK_THREADS) {
        const int r = e / ch, cc = e % ch;
        float x[VEC];
        row_chunk<T>::load(x, K, (size_t)(t0 + r) * (size_t)d + (size_t)(cc * VEC), t0 + r < n_q);
        ck_store<VEC>(ks + r * CK_KS, cc, x, d);
    }
    const bool live = t < n_q && q_row0 + t < n_cols;
    double acc = warp == 0 && live ? colsum[(size_t)g * n_cols + q_row0 + t] : 0.0;
    for (int j = jlo; j < jhi; j++) {
        for (int i0 = 0; i0 < n_q; i0 += CK_QB) {
            const int nb = n_q - i0 < CK_QB ? n_q - i0 : CK_QB;
            __syncthreads(); /* the previous step's qs and ps are read (the first: ks is written) */
            for (int e = (int)threadIdx.x; e < nb * (d / 4); e += CK_THREADS) { /* a float4 per thread */
                const int r = e / (d / 4), k = e % (d / 4);
                const float *src = q + ((size_t)(i0 + r) * n_heads_local + j) * (size_t)d + (size_t)(4 * k);
                sts_f4(qs + r * d + ck_pos(k / (VEC / 4), 4 * (k % (VEC / 4)), d), __ldg((const float4 *)src));
            }
            __syncthreads();
            for (int r = warp; r < nb; r += CK_WARPS) {
                float p = 0.0f;
                if (t < n_q) {
                    const float *kr = ks + lane * CK_KS, *qr = qs + r * d;
                    float dot = 0.0f;
                    for (int a = 0; a < d; a += 4) {
                        const float4 kk = lds_f4(kr + a), qq = lds_f4(qr + a);
                        dot += kk.x * qq.x;
                        dot += kk.y * qq.y;
                        dot += kk.z * qq.z;
                        dot += kk.w * qq.w;
                    }
                    const float2 st = stats[(size_t)j * n_q + i0 + r];
                    p = expf(dot * scale - st.x) * st.y;
                }
                ps[r * CK_COLS + lane] = p;
            }
            __syncthreads();
            if (warp == 0)
                for (int r = 0; r < nb; r++) acc += (double)ps[r * CK_COLS + lane];
        }
        if (warp == 0 && n_pad > 0) {
            const float f = (float)(1.0 / ((double)n_q + (double)n_pad * (double)expf(CK_PAD_LOGIT)));
            for (int r = 0; r < n_pad; r++) acc += (double)f;
        }
    }
    if (warp == 0 && live) colsum[(size_t)g * n_cols + q_row0 + t] = acc;
}

/* Block per row r: stats[r] = {sum x, sum x^2} in double, each thread's columns ascending, then the
 * block's fixed reduction tree. */
__global__ void row_stats_kernel(double *stats, const float *x, int n, int ld) {
    __shared__ double red[32];
    const int r = (int)blockIdx.x;
    const float *row = x + (size_t)r * (size_t)ld;
    double s1 = 0.0, s2 = 0.0;
    for (int t = (int)threadIdx.x; t < n; t += ROW_THREADS) {
        const double v = (double)row[t];
        s1 += v;
        s2 += v * v;
    }
    s1 = block_sum(s1, red);
    s2 = block_sum(s2, red);
    if (threadIdx.x == 0) {
        stats[2 * r] = s1;
        stats[2 * r + 1] = s2;
    }
}

} // namespace

ckv_status evict_chunk_colsum(ckv_backend *be, double *colsum, int n_cols, const ckv_evict_attn_params *a, int n_pad,
                              ckv_evict_accum accum) {
    ctx *c = ctx_of(be);
    const char *op = "evict_chunk_colsum";
    if (a->logits != CKV_EVICT_LOGITS_MUL)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: %s: logits are (q . k) * scale; dividing is not offered",
                         CKV_CUDA_BACKEND_NAME, op);
    const ckv_kv_batch *kv = a->kv;
    CKV_TRY(kv_dtype_check(kv->dtype, op));
    const int d = kv->head_dim, n_q = a->n_q, H = a->n_heads_local;
    if (d < 8 || d > CK_MAX_DIM || d % 8 != 0)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: %s: head_dim %d (multiples of 8 up to %d)",
                         CKV_CUDA_BACKEND_NAME, op, d, CK_MAX_DIM);
    if (n_pad < 0 || n_cols < 0 || a->q_row0 < 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: %s: %d padding rows, %d columns, first row %d",
                         CKV_CUDA_BACKEND_NAME, op, n_pad, n_cols, a->q_row0);
    if (accum == CKV_EVICT_ZERO_FIRST && kv->n_kv_heads > 0 && n_cols > 0)
        CKV_CUDA_CHECK(cudaMemsetAsync(colsum, 0, sizeof(double) * (size_t)kv->n_kv_heads * n_cols, c->stream), op);
    if (n_q < 1 || H < 1 || n_cols < 1) return op_status(c, op);
    float2 *stats = NULL; /* [H, n_q] */
    const size_t bytes = sizeof(float2) * (size_t)n_q * (size_t)H;
    CKV_TRY(scratch_parts(c, &bytes, (void **)&stats, 1, op));
    const dim3 rows((unsigned)n_q, (unsigned)H), tiles((unsigned)((n_q + CK_COLS - 1) / CK_COLS), (unsigned)kv->n_kv_heads);
    if (kv->dtype == CKV_DTYPE_BF16) {
        CKV_LAUNCH(chunk_rowstats_kernel<ckv_bf16>, rows, dim3(CK_THREADS), 0, c->stream, stats, a->q, n_q, a->q_row0,
                   *kv, H, a->head0, a->group, a->scale, n_pad);
        CKV_LAUNCH(chunk_colsum_kernel<ckv_bf16>, tiles, dim3(CK_THREADS), 0, c->stream, colsum, n_cols, stats, a->q,
                   n_q, a->q_row0, *kv, H, a->head0, a->group, a->scale, n_pad);
    } else {
        CKV_LAUNCH(chunk_rowstats_kernel<float>, rows, dim3(CK_THREADS), 0, c->stream, stats, a->q, n_q, a->q_row0, *kv,
                   H, a->head0, a->group, a->scale, n_pad);
        CKV_LAUNCH(chunk_colsum_kernel<float>, tiles, dim3(CK_THREADS), 0, c->stream, colsum, n_cols, stats, a->q, n_q,
                   a->q_row0, *kv, H, a->head0, a->group, a->scale, n_pad);
    }
    return op_status(c, op);
}

void evict_row_stats(ckv_backend *be, double *stats, const float *x, int rows, int n, int ld) {
    ctx *c = ctx_of(be);
    if (rows > 0)
        CKV_LAUNCH(row_stats_kernel, dim3((unsigned)rows), dim3(ROW_THREADS), 0, c->stream, stats, x, n < 0 ? 0 : n, ld);
    op_done(c, "evict_row_stats");
}

} // namespace CKV_CUDA_NS
