/* cuda_evict_attn.cu - the CUDA backend's eviction ops that multiply (semantics in backend.h):
 * window / observed attention column sums and weights (evict_attn_colsum, evict_attn_probs: a row
 * kernel finds each query's softmax max and 1 / sum, a column kernel recomputes the weights and adds
 * them heads-then-queries in ascending order, the order the op fixes), one-row softmax
 * (evict_softmax_add), CriticalKV's value norms ||V W_O^h||_1 (evict_value_norm: cuBLAS GEMMs over
 * blocks of 256 value rows, the L1 norm in the op's 16 fp32 lanes), and expected attention's query
 * moments and key logits (evict_moments, evict_ea_logits), DefensiveKV's window aggregation
 * (evict_defensive_rows, its double sums in the op's order, so bit for bit). fp32 dot products and fp32 GEMMs sum in
 * another order than the CPU's, so scores agree with cpu/cpu_evict_*.c to a few ulp, not bit for bit.
 * The GEMM ops read the segment descriptors once on the host (a small synchronous download) and
 * allocate their scratch per call, as the op table allows. */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr unsigned THREADS = 256;
constexpr int VNORM_BLOCK = 256; /* value rows projected per GEMM */

/* logit of query (j, i) and key t, scaled as the op says: fp32 dot, a ascending */
template <typename T>
__device__ __forceinline__ float evict_logit(const float *qv, const T *K, int t, int d, float scale, int divide) {
    float dot = 0.0f;
    for (int a = 0; a < d; a++) dot += qv[a] * ld_f32(K, (size_t)t * d + a);
    return divide ? dot / scale : dot * scale;
}

/* Block per query row (i, j): m = max over the r + 1 visible logits, inv = (float)(1 / sum e). */
template <typename T>
__global__ void attn_rowstats_kernel(float2 *stats, const float *q, int n_q, int q_row0, ckv_kv_batch kv,
                                     int n_heads_local, int head0, int group, float scale, int divide) {
    __shared__ double red[32];
    __shared__ float redf[32];
    const int i = (int)blockIdx.x, j = (int)blockIdx.y, d = kv.head_dim, r = q_row0 + i;
    const T *K = (const T *)kv.segs[0][(head0 + j) / group].k;
    const float *qv = q + ((size_t)i * n_heads_local + j) * d;
    float m = -INFINITY;
    for (int t = (int)threadIdx.x; t <= r; t += (int)blockDim.x) m = fmaxf(m, evict_logit(qv, K, t, d, scale, divide));
    m = block_max(m, redf);
    double s = 0.0;
    for (int t = (int)threadIdx.x; t <= r; t += (int)blockDim.x) s += (double)expf(evict_logit(qv, K, t, d, scale, divide) - m);
    s = block_sum(s, red);
    if (threadIdx.x == 0) stats[(size_t)j * n_q + i] = make_float2(m, (float)(1.0 / s));
}

/* Thread per column t of output row o: colsum[o, t] += p over heads j of o (ascending), then queries
 * i (ascending) that see t. */
template <typename T>
__global__ void attn_colsum_kernel(double *colsum, int n_cols, const float2 *stats, const float *q, int n_q, int q_row0,
                                   ckv_kv_batch kv, int n_heads_local, int head0, int group, float scale, int divide,
                                   int per_kv) {
    const int o = (int)blockIdx.y, d = kv.head_dim;
    const int t = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (t >= n_cols || t >= q_row0 + n_q) return;
    double acc = colsum[(size_t)o * n_cols + t];
    for (int j = 0; j < n_heads_local; j++) {
        const int g = (head0 + j) / group;
        if ((per_kv ? g : j) != o) continue;
        const T *K = (const T *)kv.segs[0][g].k;
        for (int i = t > q_row0 ? t - q_row0 : 0; i < n_q; i++) {
            const float2 st = stats[(size_t)j * n_q + i];
            const float *qv = q + ((size_t)i * n_heads_local + j) * d;
            acc += (double)(expf(evict_logit(qv, K, t, d, scale, divide) - st.x) * st.y);
        }
    }
    colsum[(size_t)o * n_cols + t] = acc;
}

template <typename T>
__global__ void attn_probs_kernel(float *p, int ld, const float2 *stats, const float *q, int n_q, int q_row0,
                                  ckv_kv_batch kv, int n_heads_local, int head0, int group, float scale, int divide) {
    const int i = (int)blockIdx.y, j = (int)blockIdx.z, d = kv.head_dim, r = q_row0 + i;
    const int t = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (t >= ld) return;
    const T *K = (const T *)kv.segs[0][(head0 + j) / group].k;
    const float2 st = stats[(size_t)j * n_q + i];
    const float *qv = q + ((size_t)i * n_heads_local + j) * d;
    p[((size_t)j * n_q + i) * ld + t] = t <= r ? expf(evict_logit(qv, K, t, d, scale, divide) - st.x) * st.y : 0.0f;
}

__global__ void softmax_add_kernel(float *dst, float *x, int n) {
    __shared__ double red[32];
    __shared__ float redf[32];
    float m = -INFINITY;
    for (int t = (int)threadIdx.x; t < n; t += (int)blockDim.x) m = fmaxf(m, x[t]);
    m = block_max(m, redf);
    double s = 0.0;
    for (int t = (int)threadIdx.x; t < n; t += (int)blockDim.x) {
        const float e = expf(x[t] - m);
        x[t] = e;
        s += (double)e;
    }
    const float inv = (float)(1.0 / block_sum(s, red));
    for (int t = (int)threadIdx.x; t < n; t += (int)blockDim.x) dst[t] += x[t] * inv;
}

/* dst [rows, cols] fp32 <- rows of a typed matrix (row stride `ld` elements, from column c0). */
template <typename T>
__global__ void to_f32_kernel(float *dst, const T *src, size_t ld, size_t c0, int rows, int cols) {
    const size_t total = (size_t)rows * (size_t)cols;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x)
        dst[e] = ld_f32(src, (e / (size_t)cols) * ld + c0 + e % (size_t)cols);
}

/* dst[t] += (float)L1(proj row t): 16 fp32 lanes (lane l: columns l, l + 16, ..), lanes in double in
 * order, then the tail columns in double. One warp per row. */
__global__ void l1_rows_kernel(float *dst, const float *proj, int nb, int D) {
    const int t = (int)(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32), lane = (int)threadIdx.x & 31;
    if (t >= nb) return; /* whole warps: no collective below */
    const float *y = proj + (size_t)t * D;
    const int full = D / 16 * 16;
    if (lane == 0) {
        float lanes[16];
        for (int l = 0; l < 16; l++) lanes[l] = 0.0f;
        for (int i = 0; i < full; i += 16)
            for (int l = 0; l < 16; l++) lanes[l] += fabsf(y[i + l]);
        double s = 0.0;
        for (int l = 0; l < 16; l++) s += lanes[l];
        for (int i = full; i < D; i++) s += fabsf(y[i]);
        dst[t] += (float)s;
    }
}

/* s1[j, a] += x (i ascending, double); s2[j, a, b] += (double)(fp32 sum over i of x_a x_b). */
__global__ void moments_kernel(double *s1, double *s2, const float *q, const float *shift, int n, int n_heads_local,
                               int d) {
    const int j = (int)blockIdx.y;
    const size_t hq = (size_t)n_heads_local * d;
    const float *sh = shift + (size_t)j * d;
    for (int e = (int)(blockIdx.x * blockDim.x + threadIdx.x); e < d + (s2 ? d * d : 0); e += (int)(gridDim.x * blockDim.x)) {
        if (e < d) {
            double m = s1[(size_t)j * d + e];
            for (int i = 0; i < n; i++) m += (double)(q[(size_t)i * hq + (size_t)j * d + e] - sh[e]);
            s1[(size_t)j * d + e] = m;
        } else {
            const int a = (e - d) / d, b = (e - d) % d;
            float o = 0.0f;
            for (int i = 0; i < n; i++) {
                const float *qi = q + (size_t)i * hq + (size_t)j * d;
                o += (qi[a] - sh[a]) * (qi[b] - sh[b]);
            }
            s2[((size_t)j * d + a) * d + b] += (double)o;
        }
    }
}

template <typename T>
__global__ void ea_logits_kernel(float *logit, ckv_kv_batch kv, int g, int row0, int n, const float *mu,
                                 const float *cov, float sqrt_d) {
    const int d = kv.head_dim;
    const T *K = (const T *)kv.segs[0][g].k;
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < n; i += (int)(gridDim.x * blockDim.x)) {
        const size_t at = (size_t)(row0 + i) * d;
        double m1 = 0.0;
        for (int a = 0; a < d; a++) m1 += (double)mu[a] * (double)ld_f32(K, at + a);
        float x = (float)m1 / sqrt_d;
        if (cov) {
            double m2 = 0.0;
            for (int b = 0; b < d; b++) {
                float kc = 0.0f; /* (k @ cov^T)[b] in fp32 */
                for (int a = 0; a < d; a++) kc += ld_f32(K, at + a) * cov[(size_t)b * d + a];
                m2 += (double)kc * (double)ld_f32(K, at + b);
            }
            x += (float)m2 / (float)d / 2.0f;
        }
        logit[i] = x;
    }
}

/* ---- DefensiveKV window aggregation: the op's sums in its own order, per row or per column ---- */

/* pooled[t] of one row: box sum in double of row[t - r .. t + r] clipped to 0 .. n-1, / kernel */
__device__ __forceinline__ float defensive_pooled(const float *row, int t, int n, int kernel) {
    const int r = kernel / 2, lo = t - r < 0 ? 0 : t - r, hi = t + r >= n ? n - 1 : t + r;
    double box = 0.0;
    for (int u = lo; u <= hi; u++) box += row[u];
    return (float)(box / kernel);
}

/* Block (i, j): scale = mass / psum of window row i of head j (t ascending, as the op fixes). */
__global__ void defensive_scale_kernel(double *scale, const float *p, int ld, int w, int n, int kernel) {
    if (threadIdx.x != 0) return; /* the sums are sequential; no collective in this kernel */
    const int i = (int)blockIdx.x, j = (int)blockIdx.y;
    const float *row = p + ((size_t)j * w + i) * ld;
    double mass = 0.0, psum = 0.0;
    for (int t = 0; t < n; t++) mass += row[t];
    for (int t = 0; t < n; t++) psum += defensive_pooled(row, t, n, kernel);
    scale[(size_t)j * w + i] = psum > 0.0 ? mass / psum : 0.0;
}

/* Thread per (g, t): ave and dmax over the heads of KV head g (ascending), then window rows. */
__global__ void defensive_cols_kernel(double *ave, float *dmax, const double *scale, const float *p, int ld, int w, int n,
                                      int n_heads_local, int head0, int group, int kernel) {
    const int g = (int)blockIdx.y, t = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (t >= n) return;
    double av = ave[(size_t)g * n + t];
    float dm = dmax[(size_t)g * n + t];
    for (int j = 0; j < n_heads_local; j++) {
        if ((head0 + j) / group != g) continue;
        for (int i = 0; i < w; i++) {
            const float *row = p + ((size_t)j * w + i) * ld;
            av += row[t];
            const float v = (float)(defensive_pooled(row, t, n, kernel) * scale[(size_t)j * w + i]);
            dm = v > dm ? v : dm;
        }
    }
    ave[(size_t)g * n + t] = av;
    dmax[(size_t)g * n + t] = dm;
}

/* *bias += the window's own columns, heads then rows then columns ascending (one thread). */
__global__ void defensive_bias_kernel(double *bias, const float *p, int ld, int w, int n, int n_heads_local) {
    double b = *bias;
    for (int j = 0; j < n_heads_local; j++)
        for (int i = 0; i < w; i++)
            for (int t = n > w ? n - w : 0; t < n; t++) b += p[((size_t)j * w + i) * ld + t];
    *bias = b;
}

ckv_status kv_dtype_check(ckv_dtype t, const char *op) {
    if (t == CKV_DTYPE_BF16 || t == CKV_DTYPE_F32) return CKV_STATUS_OK;
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: %s: KV dtype %s (bf16 or f32 only)", CKV_CUDA_BACKEND_NAME,
                     op, ckv_dtype_name(t));
}

/* Scratch of one op call, freed on every path. */
struct scratch {
    void *p[4] = {NULL, NULL, NULL, NULL};
    ~scratch() {
        for (void *q : p) cudaFree(q);
    }
};

ckv_status attn_stats(ctx *c, scratch *ws, const float *q, int n_q, int q_row0, const ckv_kv_batch *kv,
                      int n_heads_local, int head0, int group, float scale, int divide, const char *op) {
    CKV_TRY(kv_dtype_check(kv->dtype, op));
    CKV_CUDA_CHECK(cudaMalloc(&ws->p[0], sizeof(float2) * (size_t)n_q * n_heads_local), op);
    const dim3 grid((unsigned)n_q, (unsigned)n_heads_local);
    if (kv->dtype == CKV_DTYPE_BF16)
        CKV_LAUNCH(attn_rowstats_kernel<ckv_bf16>, grid, dim3(THREADS), 0, c->stream, (float2 *)ws->p[0], q, n_q, q_row0,
                   *kv, n_heads_local, head0, group, scale, divide);
    else
        CKV_LAUNCH(attn_rowstats_kernel<float>, grid, dim3(THREADS), 0, c->stream, (float2 *)ws->p[0], q, n_q, q_row0,
                   *kv, n_heads_local, head0, group, scale, divide);
    return CKV_STATUS_OK;
}

} // namespace

ckv_status evict_attn_colsum(ckv_backend *be, double *colsum, int n_cols, const float *q, int n_q, int q_row0,
                             const ckv_kv_batch *kv, int n_heads_local, int head0, int group, float scale, int divide,
                             int per_kv, int zero) {
    ctx *c = ctx_of(be);
    const int n_out = per_kv ? kv->n_kv_heads : n_heads_local;
    if (zero && n_out > 0 && n_cols > 0)
        CKV_CUDA_CHECK(cudaMemsetAsync(colsum, 0, sizeof(double) * (size_t)n_out * n_cols, c->stream), "evict_attn_colsum");
    if (n_q < 1 || n_heads_local < 1 || n_cols < 1) return op_status(c, "evict_attn_colsum");
    scratch ws;
    CKV_TRY(attn_stats(c, &ws, q, n_q, q_row0, kv, n_heads_local, head0, group, scale, divide, "evict_attn_colsum"));
    const dim3 grid(blocks_for((size_t)n_cols, THREADS), (unsigned)n_out);
    if (kv->dtype == CKV_DTYPE_BF16)
        CKV_LAUNCH(attn_colsum_kernel<ckv_bf16>, grid, dim3(THREADS), 0, c->stream, colsum, n_cols,
                   (const float2 *)ws.p[0], q, n_q, q_row0, *kv, n_heads_local, head0, group, scale, divide, per_kv);
    else
        CKV_LAUNCH(attn_colsum_kernel<float>, grid, dim3(THREADS), 0, c->stream, colsum, n_cols, (const float2 *)ws.p[0],
                   q, n_q, q_row0, *kv, n_heads_local, head0, group, scale, divide, per_kv);
    CKV_CUDA_CHECK(cudaStreamSynchronize(c->stream), "evict_attn_colsum"); /* before the scratch goes */
    return op_status(c, "evict_attn_colsum");
}

ckv_status evict_attn_probs(ckv_backend *be, float *p, int ld, const float *q, int n_q, int q_row0,
                            const ckv_kv_batch *kv, int n_heads_local, int head0, int group, float scale, int divide) {
    ctx *c = ctx_of(be);
    if (n_q < 1 || n_heads_local < 1) return CKV_STATUS_OK;
    scratch ws;
    CKV_TRY(attn_stats(c, &ws, q, n_q, q_row0, kv, n_heads_local, head0, group, scale, divide, "evict_attn_probs"));
    const dim3 grid(blocks_for((size_t)ld, THREADS), (unsigned)n_q, (unsigned)n_heads_local);
    if (kv->dtype == CKV_DTYPE_BF16)
        CKV_LAUNCH(attn_probs_kernel<ckv_bf16>, grid, dim3(THREADS), 0, c->stream, p, ld, (const float2 *)ws.p[0], q, n_q,
                   q_row0, *kv, n_heads_local, head0, group, scale, divide);
    else
        CKV_LAUNCH(attn_probs_kernel<float>, grid, dim3(THREADS), 0, c->stream, p, ld, (const float2 *)ws.p[0], q, n_q,
                   q_row0, *kv, n_heads_local, head0, group, scale, divide);
    CKV_CUDA_CHECK(cudaStreamSynchronize(c->stream), "evict_attn_probs");
    return op_status(c, "evict_attn_probs");
}

void evict_softmax_add(ckv_backend *be, float *dst, float *x, int n) {
    ctx *c = ctx_of(be);
    if (n < 1) return;
    CKV_LAUNCH(softmax_add_kernel, dim3(1), dim3(THREADS), 0, c->stream, dst, x, n);
    op_done(c, "evict_softmax_add");
}

ckv_status evict_value_norm(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows,
                            const ckv_weight *wo, int n_heads_local, int head0, int group) {
    ctx *c = ctx_of(be);
    const char *op = "evict_value_norm";
    const int d = kv->head_dim, D = (int)wo->rows;
    CKV_TRY(kv_dtype_check(kv->dtype, op));
    if (wo->dtype != CKV_DTYPE_F32 && wo->dtype != CKV_DTYPE_BF16)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: %s: o_proj stored as %s (needs F32 or BF16)",
                         CKV_CUDA_BACKEND_NAME, op, ckv_dtype_name(wo->dtype));
    if (wo->cols < (int64_t)n_heads_local * d)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "%s backend: %s: o_proj has %lld columns, %d heads x %d need more",
                         CKV_CUDA_BACKEND_NAME, op, (long long)wo->cols, n_heads_local, d);
    if (n_rows < 1 || n_heads_local < 1) return CKV_STATUS_OK;
    /* the segment descriptors, to hand cuBLAS the value rows */
    ckv_kv_seg *const *list = NULL;
    ckv_kv_seg segs[64];
    if (kv->n_kv_heads > 64)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: %s: %d KV heads (at most 64 per rank)",
                         CKV_CUDA_BACKEND_NAME, op, kv->n_kv_heads);
    CKV_CUDA_CHECK(cudaMemcpyAsync(&list, kv->segs, sizeof list, cudaMemcpyDeviceToHost, c->stream), op);
    CKV_CUDA_CHECK(cudaStreamSynchronize(c->stream), op);
    CKV_CUDA_CHECK(cudaMemcpyAsync(segs, list, sizeof(ckv_kv_seg) * (size_t)kv->n_kv_heads, cudaMemcpyDeviceToHost,
                                   c->stream), op);
    CKV_CUDA_CHECK(cudaStreamSynchronize(c->stream), op);
    scratch ws; /* wh [D, d], vb [B, d], proj [B, D] fp32 */
    CKV_CUDA_CHECK(cudaMalloc(&ws.p[0], sizeof(float) * (size_t)D * d), op);
    CKV_CUDA_CHECK(cudaMalloc(&ws.p[1], sizeof(float) * (size_t)VNORM_BLOCK * d), op);
    CKV_CUDA_CHECK(cudaMalloc(&ws.p[2], sizeof(float) * (size_t)VNORM_BLOCK * D), op);
    float *wh = (float *)ws.p[0], *vb = (float *)ws.p[1], *proj = (float *)ws.p[2];
    const size_t wes = ckv_dtype_size(wo->dtype), wld = wo->row_bytes / wes;
    const float one = 1.0f, zero = 0.0f;
    for (int j = 0; j < n_heads_local; j++) {
        const size_t c0 = (size_t)j * d;
        if (wo->dtype == CKV_DTYPE_BF16)
            CKV_LAUNCH(to_f32_kernel<ckv_bf16>, dim3(blocks_for((size_t)D * d, THREADS)), dim3(THREADS), 0, c->stream,
                       wh, (const ckv_bf16 *)wo->data, wld, c0, D, d);
        else
            CKV_LAUNCH(to_f32_kernel<float>, dim3(blocks_for((size_t)D * d, THREADS)), dim3(THREADS), 0, c->stream, wh,
                       (const float *)wo->data, wld, c0, D, d);
        const int g = (head0 + j) / group;
        for (int t0 = 0; t0 < n_rows; t0 += VNORM_BLOCK) {
            const int nb = n_rows - t0 < VNORM_BLOCK ? n_rows - t0 : VNORM_BLOCK;
            const size_t off = (size_t)t0 * d;
            if (kv->dtype == CKV_DTYPE_BF16)
                CKV_LAUNCH(to_f32_kernel<ckv_bf16>, dim3(blocks_for((size_t)nb * d, THREADS)), dim3(THREADS), 0,
                           c->stream, vb, (const ckv_bf16 *)segs[g].v + off, (size_t)d, (size_t)0, nb, d);
            else
                CKV_LAUNCH(to_f32_kernel<float>, dim3(blocks_for((size_t)nb * d, THREADS)), dim3(THREADS), 0, c->stream,
                           vb, (const float *)segs[g].v + off, (size_t)d, (size_t)0, nb, d);
            /* proj [nb, D] = vb [nb, d] @ wh^T (docs/gpu.md §5 operand order) */
            CKV_CUBLAS_CHECK(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, D, nb, d, &one, wh, CUDA_R_32F, d, vb,
                                          CUDA_R_32F, d, &zero, proj, CUDA_R_32F, D, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT),
                             op);
            CKV_LAUNCH(l1_rows_kernel, dim3((unsigned)((nb + 7) / 8)), dim3(THREADS), 0, c->stream,
                       out + (size_t)g * ld + t0, proj, nb, D);
        }
    }
    CKV_CUDA_CHECK(cudaStreamSynchronize(c->stream), op);
    return op_status(c, op);
}

ckv_status evict_moments(ckv_backend *be, double *s1, double *s2, const float *q, const float *shift, int n,
                         int n_heads_local, int d, int zero) {
    ctx *c = ctx_of(be);
    const size_t hq = (size_t)n_heads_local * d;
    if (zero) {
        CKV_CUDA_CHECK(cudaMemsetAsync(s1, 0, hq * sizeof(double), c->stream), "evict_moments");
        if (s2) CKV_CUDA_CHECK(cudaMemsetAsync(s2, 0, hq * d * sizeof(double), c->stream), "evict_moments");
    }
    if (n < 1 || n_heads_local < 1) return op_status(c, "evict_moments");
    const size_t work = (size_t)d + (s2 ? (size_t)d * d : 0);
    CKV_LAUNCH(moments_kernel, dim3(blocks_for(work, THREADS), (unsigned)n_heads_local), dim3(THREADS), 0, c->stream, s1,
               s2, q, shift, n, n_heads_local, d);
    return op_status(c, "evict_moments");
}

ckv_status evict_ea_logits(ckv_backend *be, float *logit, const ckv_kv_batch *kv, int g, int row0, int n,
                           const float *mu, const float *cov, float sqrt_d) {
    ctx *c = ctx_of(be);
    CKV_TRY(kv_dtype_check(kv->dtype, "evict_ea_logits"));
    if (n < 1) return CKV_STATUS_OK;
    if (kv->dtype == CKV_DTYPE_BF16)
        CKV_LAUNCH(ea_logits_kernel<ckv_bf16>, dim3(blocks_for((size_t)n, THREADS)), dim3(THREADS), 0, c->stream, logit,
                   *kv, g, row0, n, mu, cov, sqrt_d);
    else
        CKV_LAUNCH(ea_logits_kernel<float>, dim3(blocks_for((size_t)n, THREADS)), dim3(THREADS), 0, c->stream, logit,
                   *kv, g, row0, n, mu, cov, sqrt_d);
    return op_status(c, "evict_ea_logits");
}

ckv_status evict_defensive_rows(ckv_backend *be, double *ave, float *dmax, double *bias, const float *p, int ld, int w,
                                int n, int n_heads_local, int head0, int group, int kernel, int n_kv, int zero) {
    ctx *c = ctx_of(be);
    const char *op = "evict_defensive_rows";
    if (zero) {
        if (n_kv > 0 && n > 0) {
            CKV_CUDA_CHECK(cudaMemsetAsync(ave, 0, sizeof(double) * (size_t)n_kv * n, c->stream), op);
            CKV_CUDA_CHECK(cudaMemsetAsync(dmax, 0, sizeof(float) * (size_t)n_kv * n, c->stream), op);
        }
        CKV_CUDA_CHECK(cudaMemsetAsync(bias, 0, sizeof(double), c->stream), op);
    }
    if (w < 1 || n < 1 || n_heads_local < 1 || n_kv < 1) return op_status(c, op);
    scratch ws; /* scale [n_heads_local, w] */
    CKV_CUDA_CHECK(cudaMalloc(&ws.p[0], sizeof(double) * (size_t)n_heads_local * w), op);
    CKV_LAUNCH(defensive_scale_kernel, dim3((unsigned)w, (unsigned)n_heads_local), dim3(32), 0, c->stream,
               (double *)ws.p[0], p, ld, w, n, kernel);
    CKV_LAUNCH(defensive_cols_kernel, dim3(blocks_for((size_t)n, THREADS), (unsigned)n_kv), dim3(THREADS), 0, c->stream,
               ave, dmax, (const double *)ws.p[0], p, ld, w, n, n_heads_local, head0, group, kernel);
    CKV_LAUNCH(defensive_bias_kernel, dim3(1), dim3(1), 0, c->stream, bias, p, ld, w, n, n_heads_local);
    CKV_CUDA_CHECK(cudaStreamSynchronize(c->stream), op); /* before the scratch goes */
    return op_status(c, op);
}

} // namespace CKV_CUDA_NS
