/* cuda_evict_rows.cu - the CUDA backend's eviction ops over score rows and cached rows (semantics in
 * backend.h): colsum_finish, pool, head_sum, div, row_norm, add_mul, fill, random, max, scatter, and the selections topk (per row) and topk_counts (across heads). Element-wise ops match
 * the CPU reference (cpu/cpu_evict_rows.c) bit for bit (same fp32 / double operations in the same
 * order per element). The selections sort nothing: the k-th best entry in top-k order (descending
 * score, NaN after every number, then ascending index) is found by a binary search over an
 * order-preserving 32-bit key of the score and then over the indices of the tied entries, each step a
 * block-wide count; the kept entries are then written in ascending index order by a block scan. The
 * attention and GEMM ops are in cuda_evict_attn.cu. */
#include <float.h>

#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr unsigned THREADS = 256;

__global__ void colsum_finish_kernel(float *out, int ld_out, const double *colsum, int ld_in, int rows, int n,
                                     double denom, int minus_col) {
    const size_t total = (size_t)rows * (size_t)n;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(e / (size_t)n), t = (int)(e % (size_t)n);
        out[(size_t)r * ld_out + t] = (float)(colsum[(size_t)r * ld_in + t] / (minus_col ? denom - (double)t : denom));
    }
}

__global__ void pool_kernel(float *y, const float *x, int rows, int n, int ld, int kernel, int max) {
    const size_t total = (size_t)rows * (size_t)n;
    const int rad = kernel / 2;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(e / (size_t)n), t = (int)(e % (size_t)n);
        const float *xr = x + (size_t)r * ld;
        const int lo = t - rad < 0 ? 0 : t - rad, hi = t + rad >= n ? n - 1 : t + rad;
        float a = max ? xr[lo] : 0.0f;
        for (int u = max ? lo + 1 : lo; u <= hi; u++) a = max ? (xr[u] > a ? xr[u] : a) : a + xr[u];
        y[(size_t)r * ld + t] = max ? a : a / (float)kernel;
    }
}

/* one thread per column: the source heads in ascending order, as the CPU adds them */
__global__ void head_sum_kernel(float *dst, int ld_dst, const float *src, int ld_src, int n_src, int n, int head0,
                                int group) {
    for (int t = (int)(blockIdx.x * blockDim.x + threadIdx.x); t < n; t += (int)(gridDim.x * blockDim.x))
        for (int j = 0; j < n_src; j++) dst[(size_t)((head0 + j) / group) * ld_dst + t] += src[(size_t)j * ld_src + t];
}

__global__ void div_kernel(float *x, size_t n, float div) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] /= div;
}

template <typename T>
__global__ void row_norm_kernel(float *out, int ld, ckv_kv_batch kv, int n_rows, int values, float sign) {
    const int g = (int)blockIdx.y, d = kv.head_dim;
    const ckv_kv_seg *sg = &kv.segs[0][g];
    const T *base = (const T *)(values ? sg->v : sg->k);
    for (int t = (int)(blockIdx.x * blockDim.x + threadIdx.x); t < n_rows; t += (int)(gridDim.x * blockDim.x)) {
        double ss = 0.0; /* a ascending in double, as the CPU */
        for (int a = 0; a < d; a++) {
            const double v = (double)ld_f32(base, (size_t)t * d + a);
            ss += v * v;
        }
        out[(size_t)g * ld + t] = sign * (float)sqrt(ss);
    }
}

__global__ void add_mul_kernel(float *out, const float *s, const float *m, int rows, int n, int ld, float eps) {
    const size_t total = (size_t)rows * (size_t)n;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = (e / (size_t)n) * (size_t)ld + e % (size_t)n;
        out[i] = (s[i] + eps) * m[i];
    }
}

__global__ void fill_kernel(float *x, int rows, int ld, int t0, int t1, int kind, float value) {
    const size_t w = (size_t)(t1 - t0), total = (size_t)rows * w;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int t = t0 + (int)(e % w);
        x[(e / w) * (size_t)ld + (size_t)t] = kind == 1 ? (float)t : value;
    }
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) { /* the splitmix64 finaliser */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__global__ void random_kernel(float *x, int rows, int n, int ld, uint64_t seed, int layer, int head0) {
    const uint64_t kl = mix64(mix64(seed) ^ (uint64_t)(uint32_t)layer);
    const size_t total = (size_t)rows * (size_t)n;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(e / (size_t)n), t = (int)(e % (size_t)n);
        const uint64_t kr = mix64(kl ^ ((uint64_t)(uint32_t)(head0 + r) << 32));
        const uint64_t v = mix64(kr + (uint64_t)t * 0xD1B54A32D192ED03ull);
        x[(size_t)r * ld + t] = (float)(v >> 40) * (1.0f / 16777216.0f);
    }
}

__global__ void max_kernel(float *out, const float *x, int rows, int ld, int t0, int t1) {
    __shared__ float red[32];
    float m = -FLT_MAX;
    const size_t w = (size_t)(t1 > t0 ? t1 - t0 : 0), total = (size_t)rows * w;
    for (size_t e = threadIdx.x; e < total; e += blockDim.x) m = fmaxf(m, x[(e / w) * (size_t)ld + t0 + e % w]);
    m = block_max(m, red);
    if (threadIdx.x == 0) *out = m;
}

__global__ void scatter_kernel(float *x, int ld, const int32_t *idx, int ld_idx, const int32_t *k, float value) {
    const int r = (int)blockIdx.x;
    for (int i = (int)threadIdx.x; i < k[r]; i += (int)blockDim.x) x[(size_t)r * ld + idx[(size_t)r * ld_idx + i]] = value;
}

/* ---- selection ------------------------------------------------------------------------------ */

/* Order-preserving key of a score: larger key = better in top-k order; every NaN gets 0 (last). */
__device__ __forceinline__ uint32_t score_key(float s) {
    if (s != s) return 0u;
    const uint32_t b = __float_as_uint(s);
    const uint32_t k = (b & 0x80000000u) ? ~b : b | 0x80000000u; /* monotone over the floats */
    return k < 1u ? 1u : k;
}

/* Entries e < count of a score matrix: flat e -> row e / n, column e % n; index order = e. */
struct scores {
    const float *s;
    int ld, n;
    __device__ __forceinline__ uint32_t key(int64_t e) const { return score_key(s[(e / n) * (int64_t)ld + e % n]); }
};

/* Block-wide count of entries [0, count) with key >= lo (imax < 0), or key == lo and e <= imax. */
__device__ int64_t count_keys(const scores &sc, int64_t count, uint32_t lo, int64_t imax, unsigned long long *red) {
    unsigned long long c = 0;
    for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {
        const uint32_t k = sc.key(e);
        c += imax < 0 ? k >= lo : (k == lo && e <= imax);
    }
    return (int64_t)block_sum(c, red);
}

/* The last kept entry of the top `want` (1 <= want <= count): its key and index. Uniform. */
__device__ void topk_boundary(const scores &sc, int64_t count, int64_t want, uint32_t *kb, int64_t *ib,
                              unsigned long long *red) {
    uint32_t lo = 0u, hi = 0xffffffffu; /* count(key >= lo) >= want > count(key >= hi) unless hi holds */
    if (count_keys(sc, count, hi, -1, red) >= want) {
        lo = hi;
    } else {
        while (hi - lo > 1u) {
            const uint32_t mid = lo + (hi - lo) / 2u;
            if (count_keys(sc, count, mid, -1, red) >= want)
                lo = mid;
            else
                hi = mid;
        }
    }
    const int64_t gt = lo == 0xffffffffu ? 0 : count_keys(sc, count, lo + 1u, -1, red), need = want - gt;
    int64_t ilo = -1, ihi = count - 1; /* ties of key lo with index <= ihi reach need */
    while (ihi - ilo > 1) {
        const int64_t mid = ilo + (ihi - ilo) / 2;
        if (count_keys(sc, count, lo, mid, red) >= need)
            ihi = mid;
        else
            ilo = mid;
    }
    *kb = lo;
    *ib = ihi;
}

__device__ __forceinline__ bool kept(uint32_t k, int64_t e, uint32_t kb, int64_t ib) {
    return k > kb || (k == kb && e <= ib);
}

/* One block per row: idx[r, 0 .. k[r]) = the kept columns in ascending order (block scan). */
__global__ void topk_kernel(int32_t *idx, int ld_idx, const float *s, int ld, int n, const int32_t *kk) {
    __shared__ unsigned long long red[32];
    __shared__ int wsum[32];
    __shared__ int base;
    const int r = (int)blockIdx.x, want = kk[r];
    if (want <= 0) return; /* uniform */
    const scores sc = {s + (size_t)r * ld, ld, n};
    uint32_t kb;
    int64_t ib;
    topk_boundary(sc, n, want, &kb, &ib, red);
    int32_t *out = idx + (size_t)r * ld_idx;
    if (threadIdx.x == 0) base = 0;
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5, nw = (int)blockDim.x >> 5;
    for (int c0 = 0; c0 < n; c0 += (int)blockDim.x) {
        const int t = c0 + (int)threadIdx.x;
        const int f = t < n && kept(sc.key(t), t, kb, ib) ? 1 : 0;
        int x = f; /* inclusive scan within the warp */
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += y;
        }
        __syncthreads(); /* base of the previous chunk is final; wsum is free */
        if (lane == 31) wsum[warp] = x;
        __syncthreads();
        int before = base;
        for (int w = 0; w < warp; w++) before += wsum[w];
        if (f) out[before + x - 1] = t;
        __syncthreads();
        if (threadIdx.x == 0)
            for (int w = 0; w < nw; w++) base += wsum[w];
    }
}

/* One block: the boundary of the `total` best entries over all rows, then each row's count. */
__global__ void topk_counts_kernel(int32_t *counts, const float *s, int ld, int rows, int n, int64_t total) {
    __shared__ unsigned long long red[32];
    const scores sc = {s, ld, n};
    const int64_t count = (int64_t)rows * n;
    uint32_t kb = 0xffffffffu;
    int64_t ib = -1; /* nothing kept */
    if (total > 0) topk_boundary(sc, count, total, &kb, &ib, red);
    for (int r = 0; r < rows; r++) {
        unsigned long long c = 0;
        for (int t = (int)threadIdx.x; t < n; t += (int)blockDim.x) {
            const int64_t e = (int64_t)r * n + t;
            c += total > 0 && kept(sc.key(e), e, kb, ib);
        }
        c = block_sum(c, red);
        if (threadIdx.x == 0) counts[r] = (int32_t)c;
    }
}

/* launch(T(), op) with T the element type of KV dtype t */
template <typename F> ckv_status by_dtype(ckv_dtype t, const char *op, F launch) {
    if (t == CKV_DTYPE_BF16) {
        launch(ckv_bf16(), op);
    } else if (t == CKV_DTYPE_F32) {
        launch(float(), op);
    } else {
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: %s: KV dtype %s (bf16 or f32 only)",
                         CKV_CUDA_BACKEND_NAME, op, ckv_dtype_name(t));
    }
    return CKV_STATUS_OK;
}

} // namespace

/* What a ckv_status-returning op reports: a launch error now, naming the op (asynchronous faults
 * surface from sync()). */
ckv_status op_status(ctx *c, const char *op) {
    op_done(c, op);
    if (c->pending == CKV_STATUS_OK) return CKV_STATUS_OK;
    const ckv_status s = c->pending;
    c->pending = CKV_STATUS_OK;
    return ckv_error(s, "%s", c->pending_msg);
}

void evict_colsum_finish(ckv_backend *be, float *out, int ld_out, const double *colsum, int ld_in, int rows, int n,
                         double denom, int minus_col) {
    ctx *c = ctx_of(be);
    if (rows <= 0 || n <= 0) return;
    CKV_LAUNCH(colsum_finish_kernel, dim3(blocks_for((size_t)rows * n, THREADS)), dim3(THREADS), 0, c->stream, out,
               ld_out, colsum, ld_in, rows, n, denom, minus_col);
    op_done(c, "evict_colsum_finish");
}

void evict_pool(ckv_backend *be, float *y, const float *x, int rows, int n, int ld, int kernel, int max) {
    ctx *c = ctx_of(be);
    if (rows <= 0 || n <= 0) return;
    CKV_LAUNCH(pool_kernel, dim3(blocks_for((size_t)rows * n, THREADS)), dim3(THREADS), 0, c->stream, y, x, rows, n, ld,
               kernel, max);
    op_done(c, "evict_pool");
}

void evict_head_sum(ckv_backend *be, float *dst, int ld_dst, const float *src, int ld_src, int n_src, int n, int head0,
                    int group) {
    ctx *c = ctx_of(be);
    if (n_src <= 0 || n <= 0) return;
    CKV_LAUNCH(head_sum_kernel, dim3(blocks_for((size_t)n, THREADS)), dim3(THREADS), 0, c->stream, dst, ld_dst, src,
               ld_src, n_src, n, head0, group);
    op_done(c, "evict_head_sum");
}

void evict_div(ckv_backend *be, float *x, size_t n, float div) {
    ctx *c = ctx_of(be);
    if (n == 0) return;
    CKV_LAUNCH(div_kernel, dim3(blocks_for(n, THREADS)), dim3(THREADS), 0, c->stream, x, n, div);
    op_done(c, "evict_div");
}

void evict_row_norm(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows, int values, float sign) {
    ctx *c = ctx_of(be);
    if (n_rows <= 0 || kv->n_kv_heads <= 0) return;
    const dim3 grid(blocks_for((size_t)n_rows, THREADS), (unsigned)kv->n_kv_heads);
    record(c, by_dtype(kv->dtype, "evict_row_norm", [&](auto t, const char *) {
        CKV_LAUNCH((row_norm_kernel<decltype(t)>), grid, dim3(THREADS), 0, c->stream, out, ld, *kv, n_rows, values, sign);
    }));
    op_done(c, "evict_row_norm");
}

void evict_add_mul(ckv_backend *be, float *out, const float *s, const float *m, int rows, int n, int ld, float eps) {
    ctx *c = ctx_of(be);
    if (rows <= 0 || n <= 0) return;
    CKV_LAUNCH(add_mul_kernel, dim3(blocks_for((size_t)rows * n, THREADS)), dim3(THREADS), 0, c->stream, out, s, m, rows,
               n, ld, eps);
    op_done(c, "evict_add_mul");
}

void evict_fill(ckv_backend *be, float *x, int rows, int ld, int t0, int t1, int kind, float value) {
    ctx *c = ctx_of(be);
    if (rows <= 0 || t1 <= t0) return;
    CKV_LAUNCH(fill_kernel, dim3(blocks_for((size_t)rows * (size_t)(t1 - t0), THREADS)), dim3(THREADS), 0, c->stream, x,
               rows, ld, t0, t1, kind, value);
    op_done(c, "evict_fill");
}

void evict_random(ckv_backend *be, float *x, int rows, int n, int ld, uint64_t seed, int layer, int head0) {
    ctx *c = ctx_of(be);
    if (rows <= 0 || n <= 0) return;
    CKV_LAUNCH(random_kernel, dim3(blocks_for((size_t)rows * n, THREADS)), dim3(THREADS), 0, c->stream, x, rows, n, ld,
               seed, layer, head0);
    op_done(c, "evict_random");
}

void evict_max(ckv_backend *be, float *out, const float *x, int rows, int ld, int t0, int t1) {
    ctx *c = ctx_of(be);
    CKV_LAUNCH(max_kernel, dim3(1), dim3(THREADS), 0, c->stream, out, x, rows > 0 ? rows : 0, ld, t0, t1);
    op_done(c, "evict_max");
}

void evict_scatter(ckv_backend *be, float *x, int ld, int rows, const int32_t *idx, int ld_idx, const int32_t *k,
                   float value) {
    ctx *c = ctx_of(be);
    if (rows <= 0) return;
    CKV_LAUNCH(scatter_kernel, dim3((unsigned)rows), dim3(THREADS), 0, c->stream, x, ld, idx, ld_idx, k, value);
    op_done(c, "evict_scatter");
}

ckv_status evict_topk(ckv_backend *be, int32_t *idx, int ld_idx, const float *s, int ld, int rows, int n,
                      const int32_t *k) {
    ctx *c = ctx_of(be);
    if (rows <= 0 || n <= 0) return CKV_STATUS_OK;
    CKV_LAUNCH(topk_kernel, dim3((unsigned)rows), dim3(THREADS), 0, c->stream, idx, ld_idx, s, ld, n, k);
    return op_status(c, "evict_topk");
}

ckv_status evict_topk_counts(ckv_backend *be, int32_t *counts, const float *s, int ld, int rows, int n, int64_t total) {
    ctx *c = ctx_of(be);
    const int64_t all = (int64_t)rows * (int64_t)n;
    if (total < 0 || total > all || all > INT32_MAX)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: evict_topk_counts: top-%lld of %d x %d scores",
                         CKV_CUDA_BACKEND_NAME, (long long)total, rows, n);
    if (rows <= 0) return CKV_STATUS_OK;
    CKV_LAUNCH(topk_counts_kernel, dim3(1), dim3(1024), 0, c->stream, counts, s, ld, rows, n, total);
    return op_status(c, "evict_topk_counts");
}

} // namespace CKV_CUDA_NS
