/* cuda_ops.cu - the CUDA backend's element-wise and row-wise kernels: embedding gather (bf16 or fp32
 * table), RMSNorm, RoPE (the op's inv_freq and attn_scale cover default, llama3 and YaRN alike),
 * SwiGLU, residual add and count_nonfinite. fp32 arithmetic throughout, matching the CPU reference
 * (src/backend/cpu/cpu_ops.c) to a few ulp. Matmul, KV cache and attention are elsewhere. */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr unsigned THREADS = 256;

/* ---- embedding: one block per token ---------------------------------------------------------- */

template <typename T>
__global__ void embedding_kernel(float *out, const T *table, size_t row_elems, int64_t rows, int64_t cols,
                                 const int32_t *ids) {
    const int i = (int)blockIdx.x;
    const int32_t id = ids[i];
    float *o = out + (size_t)i * (size_t)cols; // [cols]
    for (int64_t j = threadIdx.x; j < cols; j += blockDim.x)
        o[j] = id >= 0 && id < rows ? ld_f32(table, (size_t)id * row_elems + (size_t)j) : NAN; /* bad id: loud */
}

/* ---- rmsnorm: one block per row; sum of squares in fp32 over 256 partial sums ----------------- */

__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int dim, float eps) {
    __shared__ float red[32];
    const float *xr = x + (size_t)blockIdx.x * (size_t)dim; // [dim]
    float *orow = out + (size_t)blockIdx.x * (size_t)dim;   // [dim]
    float ss = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += xr[j] * xr[j];
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ss / (float)dim + eps); /* as HF: x * rsqrt(mean + eps), then w * that */
    for (int j = threadIdx.x; j < dim; j += blockDim.x) orow[j] = w[j] * (xr[j] * r); /* same j: in place is fine */
}

/* ---- rope: one thread per (token, head, pair) ------------------------------------------------- */

__global__ void rope_kernel(float *x, const int32_t *pos, int n, int n_heads, int hd, const float *inv_freq,
                            float attn_scale) {
    const int half = hd / 2;
    const size_t total = (size_t)n * (size_t)n_heads * (size_t)half;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total; idx += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(idx % (size_t)half);
        const size_t th = idx / (size_t)half; /* token * n_heads + head */
        const int t = (int)(th / (size_t)n_heads);
        const float angle = (float)pos[t] * inv_freq[i]; /* fp32, as HF; full-range sinf/cosf */
        const float c = cosf(angle) * attn_scale, s = sinf(angle) * attn_scale;
        float *xh = x + th * (size_t)hd; // [hd]
        const float a = xh[i], b = xh[i + half];
        xh[i] = a * c - b * s;
        xh[i + half] = b * c + a * s;
    }
}

/* ---- element-wise ---------------------------------------------------------------------------- */

__global__ void swiglu_kernel(float *out, const float *gate, const float *up, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float g = gate[i];
        out[i] = g / (1.0f + expf(-g)) * up[i];
    }
}

__global__ void add_kernel(float *x, const float *y, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] += y[i];
}

__global__ void count_nonfinite_kernel(unsigned long long *count, const float *x, size_t n) {
    __shared__ unsigned long long red[32];
    unsigned long long bad = 0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        bad += isfinite(x[i]) ? 0ull : 1ull;
    bad = block_sum(bad, red);
    if (threadIdx.x == 0 && bad) atomicAdd(count, bad);
}

} // namespace

void embedding(ckv_backend *be, float *out, const ckv_weight *table, const int32_t *ids, int n) {
    ctx *c = ctx_of(be);
    if (n <= 0 || table->cols <= 0) return;
    if (table->dtype == CKV_DTYPE_BF16 && table->row_bytes % sizeof(ckv_bf16) == 0) {
        CKV_LAUNCH((embedding_kernel<ckv_bf16>), dim3((unsigned)n), dim3(THREADS), 0, c->stream, out,
                   (const ckv_bf16 *)table->data, table->row_bytes / sizeof(ckv_bf16), table->rows, table->cols, ids);
    } else if (table->dtype == CKV_DTYPE_F32 && table->row_bytes % sizeof(float) == 0) {
        CKV_LAUNCH((embedding_kernel<float>), dim3((unsigned)n), dim3(THREADS), 0, c->stream, out,
                   (const float *)table->data, table->row_bytes / sizeof(float), table->rows, table->cols, ids);
    } else {
        record(c, ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: embedding: table dtype %s (row_bytes %zu) is not bf16 or f32",
                            CKV_CUDA_BACKEND_NAME, ckv_dtype_name(table->dtype), table->row_bytes));
        return;
    }
    op_done(c, "embedding");
}

void rmsnorm(ckv_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps) {
    ctx *c = ctx_of(be);
    if (n <= 0 || dim <= 0) return;
    CKV_LAUNCH(rmsnorm_kernel, dim3((unsigned)n), dim3(THREADS), 0, c->stream, out, x, w, dim, eps);
    op_done(c, "rmsnorm");
}

void rope(ckv_backend *be, float *x, const int32_t *pos, int n, int n_heads, int hd, const float *inv_freq,
          float attn_scale) {
    ctx *c = ctx_of(be);
    if (n <= 0 || n_heads <= 0 || hd < 2) return;
    const size_t total = (size_t)n * (size_t)n_heads * (size_t)(hd / 2);
    CKV_LAUNCH(rope_kernel, dim3(blocks_for(total, THREADS)), dim3(THREADS), 0, c->stream, x, pos, n, n_heads, hd,
               inv_freq, attn_scale);
    op_done(c, "rope");
}

void swiglu(ckv_backend *be, float *out, const float *gate, const float *up, size_t n) {
    ctx *c = ctx_of(be);
    if (n == 0) return;
    CKV_LAUNCH(swiglu_kernel, dim3(blocks_for(n, THREADS)), dim3(THREADS), 0, c->stream, out, gate, up, n);
    op_done(c, "swiglu");
}

void add(ckv_backend *be, float *x, const float *y, size_t n) {
    ctx *c = ctx_of(be);
    if (n == 0) return;
    CKV_LAUNCH(add_kernel, dim3(blocks_for(n, THREADS)), dim3(THREADS), 0, c->stream, x, y, n);
    op_done(c, "add");
}

ckv_status count_nonfinite(ckv_backend *be, const float *x, size_t n, size_t *n_bad) {
    ctx *c = ctx_of(be);
    *n_bad = 0;
    if (c->pending != CKV_STATUS_OK) return be->ops->sync(be);
    if (n == 0) return CKV_STATUS_OK;
    CKV_CUDA_CHECK(cudaMemsetAsync(c->count, 0, sizeof *c->count, c->stream), "count_nonfinite");
    CKV_LAUNCH(count_nonfinite_kernel, dim3(blocks_for(n, THREADS) < 1024 ? blocks_for(n, THREADS) : 1024),
               dim3(THREADS), 0, c->stream, c->count, x, n);
    op_done(c, "count_nonfinite");
    unsigned long long host = 0;
    CKV_TRY(be->ops->download(be, &host, c->count, sizeof host)); /* waits; reports a failed op */
    *n_bad = (size_t)host;
    return CKV_STATUS_OK;
}

} // namespace CKV_CUDA_NS
