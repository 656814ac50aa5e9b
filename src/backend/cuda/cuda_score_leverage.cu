/* cuda_score_leverage.cu - the CUDA backend's approximate-leverage op (backend.h evict_leverage) and
 * the affine map its scorer applies after the cross-head statistics (evict_affine). Five launches,
 * none of size L x L and no stored pre-RoPE keys: the keys are rotated back where they are read
 * (the CPU reference's fp32 rotation, cpu/cpu_evict_leverage.c) by
 *  1. per-block column sums of the pre-RoPE keys (double; one thread per channel, rows ascending),
 *  2. the mean from them (blocks ascending), then per-block partial Gram matrices of the sketched
 *     centred rows (x_t = (pre_t - mean) phi, channels ascending; lower triangle),
 *  3. one block per head: the Gram matrix from the partials, Cholesky of G + jI column by column
 *     (every entry by the CPU's formula, the CPU's jitter schedule), and the factor's inverse,
 *  4. per row, y = C^-1 x as a product with the inverse and the leverage ||y||^2 (fp32, >= 0),
 *  5. per head, sum and sum of squares of the scores (a fixed block reduction), NaN when no jitter
 *     made G + jI positive definite (the scorer turns that into its error: no sync here).
 * Everything after the fp32 rotation is in double here, where the CPU forms its three products (the
 * sketch, the Gram matrix, the product with the factor's inverse) in fp32 through its GEMM kernels:
 * the scores agree to the CPU's fp32 rounding (test_backend_ops: 1e-4 relative). Scratch: the backend's
 * eviction workspace. It does not draw the sketch, normalise across heads or select. */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr unsigned THREADS = 256;
constexpr int MAX_DIM = 1024;
constexpr int MAX_K = 256;
constexpr int MAX_BLOCKS = 64; /* row blocks per head of the mean and Gram passes */

/* Channel a of row t's key rotated back to its pre-RoPE value, as the CPU rounds it (fp32). */
template <typename T>
__device__ __forceinline__ float pre_rope(const T *k, int t, int a, int d, const int32_t *pos, const float *inv_freq,
                                          float rope_scale) {
    const T *y = k + (size_t)t * d;
    const int half = d / 2;
    if (a >= 2 * half) return ld_f32(y, (size_t)a); /* odd head dim: the last channel is not rotated */
    const int i = a < half ? a : a - half;
    const float ang = (float)pos[t] * inv_freq[i]; /* fp32, as the rope op */
    const double c = (double)(cosf(ang) * rope_scale), s = (double)(sinf(ang) * rope_scale), ir = 1.0 / (c * c + s * s);
    const double y1 = (double)ld_f32(y, (size_t)i), y2 = (double)ld_f32(y, (size_t)(i + half));
    return (float)(a < half ? (y1 * c + y2 * s) * ir : (y2 * c - y1 * s) * ir);
}

/* Rows [b chunk, +chunk) of n from row0: part[(g nb + b) d + a] = sum of pre-RoPE channel a.
 * grid (nb, n_kv) */
template <typename T>
__global__ void lev_mean_kernel(double *part, ckv_kv_batch kv, int row0, int n, int chunk, const float *inv_freq,
                                float rope_scale) {
    const int b = (int)blockIdx.x, g = (int)blockIdx.y, d = kv.head_dim;
    const T *k = (const T *)kv.segs[0][g].k;
    const int32_t *pos = kv.segs[0][g].pos; /* the segment's own positions */
    const int t1 = (b + 1) * chunk < n ? (b + 1) * chunk : n;
    for (int a = (int)threadIdx.x; a < d; a += (int)blockDim.x) {
        double s = 0.0;
        for (int t = b * chunk; t < t1; t++) s += (double)pre_rope(k, row0 + t, a, d, pos, inv_freq, rope_scale);
        part[((size_t)g * gridDim.x + (size_t)b) * (size_t)d + (size_t)a] = s;
    }
}

/* One row's sketch into xs [k]: cs [d] = pre - mean (threads over channels), then x_j = sum_a cs[a]
 * phi[a][j] (threads over j, channels ascending). Every thread calls it; it ends on a barrier. */
template <typename T>
__device__ __forceinline__ void sketch_row(double *xs, double *cs, const double *mean, const T *k, int t, int d,
                                           const int32_t *pos, const float *inv_freq, float rope_scale,
                                           const float *phi, int kd) {
    for (int a = (int)threadIdx.x; a < d; a += (int)blockDim.x)
        cs[a] = (double)pre_rope(k, t, a, d, pos, inv_freq, rope_scale) - mean[a];
    __syncthreads();
    for (int j = (int)threadIdx.x; j < kd; j += (int)blockDim.x) {
        double x = 0.0;
        for (int a = 0; a < d; a++) x += cs[a] * (double)phi[(size_t)a * kd + j];
        xs[j] = x;
    }
    __syncthreads();
}

/* (i, j), j <= i, of lower-triangle entry e = i (i + 1) / 2 + j. */
__device__ __forceinline__ void tri_ij(int e, int *i, int *j) {
    int r = (int)((sqrt(8.0 * (double)e + 1.0) - 1.0) / 2.0);
    while (r * (r + 1) / 2 > e) r--;
    while ((r + 1) * (r + 2) / 2 <= e) r++;
    *i = r, *j = e - r * (r + 1) / 2;
}

/* The block's rows' Gram matrix: gpart[(g nb + b) tri + e] = sum_t x_t[i] x_t[j]; mean[g] [d] from
 * the column sums (written by block 0). grid (nb, n_kv) */
template <typename T>
__global__ void lev_gram_kernel(double *gpart, double *mean_out, const double *part, ckv_kv_batch kv, int row0, int n,
                                int chunk, const float *inv_freq, float rope_scale, const float *phi, int kd) {
    __shared__ double mean[MAX_DIM], cs[MAX_DIM], xs[MAX_K];
    const int b = (int)blockIdx.x, g = (int)blockIdx.y, d = kv.head_dim, nb = (int)gridDim.x;
    const int tri = kd * (kd + 1) / 2;
    for (int a = (int)threadIdx.x; a < d; a += (int)blockDim.x) {
        double s = 0.0;
        for (int p = 0; p < nb; p++) s += part[((size_t)g * nb + (size_t)p) * (size_t)d + (size_t)a];
        mean[a] = s / (double)n;
        if (b == 0) mean_out[(size_t)g * d + a] = mean[a];
    }
    double *gp = gpart + ((size_t)g * nb + (size_t)b) * (size_t)tri;
    for (int e = (int)threadIdx.x; e < tri; e += (int)blockDim.x) gp[e] = 0.0;
    __syncthreads();
    const T *k = (const T *)kv.segs[0][g].k;
    const int32_t *pos = kv.segs[0][g].pos;
    const float *ph = phi + (size_t)g * (size_t)d * (size_t)kd;
    const int t1 = (b + 1) * chunk < n ? (b + 1) * chunk : n;
    for (int t = b * chunk; t < t1; t++) { /* uniform */
        sketch_row(xs, cs, mean, k, row0 + t, d, pos, inv_freq, rope_scale, ph, kd);
        for (int e = (int)threadIdx.x; e < tri; e += (int)blockDim.x) {
            int i, j;
            tri_ij(e, &i, &j);
            gp[e] += xs[i] * xs[j];
        }
        __syncthreads(); /* xs and cs are refilled by the next row */
    }
}

/* Head g: G = sum of the partials (blocks ascending); C = Cholesky(G + jI) by columns, each entry
 * s = G[i][j] (+ j on the diagonal) - sum_{m < j} C[i][m] C[j][m] as the CPU, jitter 1e-2 x 10^tries
 * for 5 tries; ok[g] = 1 when one factors; then Ci = C^-1 (one thread per column, forward
 * substitution). grid n_kv, block THREADS */
__global__ void lev_factor_kernel(double *Cm, double *Ci, int *ok, const double *gpart, int nb, int kd) {
    __shared__ int fail;
    const int g = (int)blockIdx.x, tri = kd * (kd + 1) / 2, tid = (int)threadIdx.x;
    double *C = Cm + (size_t)g * kd * kd, *L = Ci + (size_t)g * kd * kd; // [kd, kd] each, row-major lower
    double *G = L; /* the inverse's space holds G (lower, row-major) until the factor is done */
    for (int e = tid; e < tri; e += (int)blockDim.x) {
        int i, j;
        tri_ij(e, &i, &j);
        double s = 0.0;
        for (int p = 0; p < nb; p++) s += gpart[((size_t)g * nb + (size_t)p) * (size_t)tri + (size_t)e];
        G[(size_t)i * kd + j] = s;
    }
    __syncthreads();
    double jitter = 1e-2;
    int good = 0;
    for (int tries = 0; tries < 5 && !good; tries++, jitter *= 10.0) {
        if (tid == 0) fail = 0;
        __syncthreads();
        for (int j = 0; j < kd; j++) {
            if (tid == 0) {
                double s = G[(size_t)j * kd + j] + jitter;
                for (int m = 0; m < j; m++) s -= C[(size_t)j * kd + m] * C[(size_t)j * kd + m];
                if (!(s > 0.0)) fail = 1;
                C[(size_t)j * kd + j] = s > 0.0 ? sqrt(s) : 1.0;
            }
            __syncthreads();
            if (fail) break; /* uniform */
            for (int i = j + 1 + tid; i < kd; i += (int)blockDim.x) {
                double s = G[(size_t)i * kd + j];
                for (int m = 0; m < j; m++) s -= C[(size_t)i * kd + m] * C[(size_t)j * kd + m];
                C[(size_t)i * kd + j] = s / C[(size_t)j * kd + j];
            }
            __syncthreads();
        }
        good = !fail;
        __syncthreads(); /* fail is reset by the next try */
    }
    if (tid == 0) ok[g] = good;
    for (int col = tid; good && col < kd; col += (int)blockDim.x) /* G is no longer read */
        for (int i = 0; i < kd; i++) {
            double s = i == col ? 1.0 : 0.0;
            for (int m = col; m < i; m++) s -= C[(size_t)i * kd + m] * L[(size_t)m * kd + col];
            L[(size_t)i * kd + col] = i < col ? 0.0 : s / C[(size_t)i * kd + i];
        }
}

/* out[g ld + t] = max(0, ||Ci x_t||^2) for rows t of [b chunk, +chunk). grid (blocks, n_kv) */
template <typename T>
__global__ void lev_score_kernel(float *out, int ld, const double *Ci, const int *ok, const double *mean_in,
                                 ckv_kv_batch kv, int row0, int n, int chunk, const float *inv_freq, float rope_scale,
                                 const float *phi, int kd) {
    __shared__ double mean[MAX_DIM], cs[MAX_DIM], xs[MAX_K], ys[MAX_K];
    const int b = (int)blockIdx.x, g = (int)blockIdx.y, d = kv.head_dim;
    if (!ok[g]) return; /* uniform: the statistics report it */
    for (int a = (int)threadIdx.x; a < d; a += (int)blockDim.x) mean[a] = mean_in[(size_t)g * d + a];
    __syncthreads();
    const T *k = (const T *)kv.segs[0][g].k;
    const int32_t *pos = kv.segs[0][g].pos;
    const float *ph = phi + (size_t)g * (size_t)d * (size_t)kd;
    const double *L = Ci + (size_t)g * kd * kd;
    const int t1 = (b + 1) * chunk < n ? (b + 1) * chunk : n;
    for (int t = b * chunk; t < t1; t++) { /* uniform */
        sketch_row(xs, cs, mean, k, row0 + t, d, pos, inv_freq, rope_scale, ph, kd);
        for (int i = (int)threadIdx.x; i < kd; i += (int)blockDim.x) {
            double y = 0.0;
            for (int m = 0; m <= i; m++) y += L[(size_t)i * kd + m] * xs[m];
            ys[i] = y;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            double lev = 0.0;
            for (int i = 0; i < kd; i++) lev += ys[i] * ys[i];
            out[(size_t)g * ld + t] = (float)(lev > 0.0 ? lev : 0.0);
        }
        __syncthreads(); /* xs, ys and cs are refilled by the next row */
    }
}

/* stats[g] = {sum_t out, sum_t out^2} (double), NaN when head g did not factor. grid n_kv */
__global__ void lev_stats_kernel(double *stats, const float *out, int ld, const int *ok, int n) {
    __shared__ double red[32];
    const int g = (int)blockIdx.x;
    double s1 = 0.0, s2 = 0.0;
    for (int t = (int)threadIdx.x; ok[g] && t < n; t += (int)blockDim.x) {
        const double v = (double)out[(size_t)g * ld + t];
        s1 += v, s2 += v * v;
    }
    s1 = block_sum(s1, red);
    s2 = block_sum(s2, red);
    if (threadIdx.x == 0) stats[2 * g] = ok[g] ? s1 : (double)NAN, stats[2 * g + 1] = ok[g] ? s2 : (double)NAN;
}

__global__ void affine_kernel(float *x, int rows, int n, int ld, float sub, float div) {
    const size_t total = (size_t)rows * (size_t)n;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const size_t r = e / (size_t)n, t = e % (size_t)n;
        x[r * ld + t] = (x[r * ld + t] - sub) / div;
    }
}

} // namespace

/* Row blocks of the moment passes over n rows. */
static int leverage_blocks(int n) { return n / 256 < 1 ? 1 : n / 256 > MAX_BLOCKS ? MAX_BLOCKS : n / 256; }

/* workspace (doubles): part [n_kv, nb, d], mean [n_kv, d], gpart [n_kv, nb, tri], C, Ci [n_kv, k, k]; ok [n_kv] (int) */
size_t leverage_scratch_bytes(int n_kv, int d, int n, int k) {
    if (n_kv < 1 || d < 1 || n < 1 || k < 1) return 0;
    const size_t nk = (size_t)n_kv, nb = (size_t)leverage_blocks(n), tri = (size_t)k * (size_t)(k + 1) / 2;
    const size_t doubles = nk * nb * (size_t)d + nk * (size_t)d + nk * nb * tri + 2 * nk * (size_t)k * (size_t)k;
    return doubles * sizeof(double) + nk * sizeof(int);
}

ckv_status evict_leverage(ckv_backend *be, float *out, int ld, double *stats, const ckv_kv_batch *kv, int row0, int n,
                          const float *inv_freq, float rope_scale, const float *phi, int k) {
    ctx *c = ctx_of(be);
    const int d = kv->head_dim;
    if (d < 2 || d > MAX_DIM || k < 1 || k > MAX_K)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "evict_leverage: head_dim %d outside 2..%d or sketch %d outside 1..%d",
                         d, MAX_DIM, k, MAX_K);
    if (n < 1 || row0 < 0) return ckv_error(CKV_STATUS_ERR_ARG, "evict_leverage: %d rows from row %d", n, row0);
    if (kv->dtype != CKV_DTYPE_BF16 && kv->dtype != CKV_DTYPE_F32)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: evict_leverage: KV dtype %s (bf16 or f32 only)",
                         CKV_CUDA_BACKEND_NAME, ckv_dtype_name(kv->dtype));
    const size_t n_kv = (size_t)kv->n_kv_heads, tri = (size_t)k * (size_t)(k + 1) / 2;
    const int nb = leverage_blocks(n), chunk = (n + nb - 1) / nb;
    const size_t at_mean = n_kv * (size_t)nb * (size_t)d, at_gp = at_mean + n_kv * (size_t)d;
    const size_t at_c = at_gp + n_kv * (size_t)nb * tri, at_ci = at_c + n_kv * (size_t)k * (size_t)k;
    const size_t at_ok = at_ci + n_kv * (size_t)k * (size_t)k;
    CKV_TRY(grow(c, &c->evict_ws, &c->evict_ws_cap, leverage_scratch_bytes(kv->n_kv_heads, d, n, k), "evict_leverage"));
    double *ws = (double *)c->evict_ws;
    int *ok = (int *)(ws + at_ok);
    const dim3 grid((unsigned)nb, (unsigned)n_kv);
    const unsigned score_blocks = blocks_for((size_t)n, 8), score_chunk = (unsigned)((n + (int)score_blocks - 1) / (int)score_blocks);
    auto run = [&](auto t) {
        typedef decltype(t) T;
        CKV_LAUNCH((lev_mean_kernel<T>), grid, dim3(THREADS), 0, c->stream, ws, *kv, row0, n, chunk, inv_freq,
                   rope_scale);
        CKV_LAUNCH((lev_gram_kernel<T>), grid, dim3(THREADS), 0, c->stream, ws + at_gp, ws + at_mean, ws, *kv, row0, n,
                   chunk, inv_freq, rope_scale, phi, k);
        CKV_LAUNCH(lev_factor_kernel, dim3((unsigned)n_kv), dim3(THREADS), 0, c->stream, ws + at_c, ws + at_ci, ok,
                   ws + at_gp, nb, k);
        CKV_LAUNCH((lev_score_kernel<T>), dim3(score_blocks, (unsigned)n_kv), dim3(THREADS), 0, c->stream, out, ld,
                   ws + at_ci, ok, ws + at_mean, *kv, row0, n, (int)score_chunk, inv_freq, rope_scale, phi, k);
    };
    if (kv->dtype == CKV_DTYPE_BF16)
        run(ckv_bf16());
    else
        run(float());
    CKV_LAUNCH(lev_stats_kernel, dim3((unsigned)n_kv), dim3(THREADS), 0, c->stream, stats, out, ld, ok, n);
    return op_status(c, "evict_leverage");
}

void evict_affine(ckv_backend *be, float *x, int rows, int n, int ld, float sub, float div) {
    ctx *c = ctx_of(be);
    if (rows < 1 || n < 1) return;
    CKV_LAUNCH(affine_kernel, dim3(blocks_for((size_t)rows * (size_t)n, THREADS)), dim3(THREADS), 0, c->stream, x, rows,
               n, ld, sub, div);
    op_done(c, "evict_affine");
}

} // namespace CKV_CUDA_NS
