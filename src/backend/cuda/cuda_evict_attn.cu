/* cuda_evict_attn.cu - the CUDA backend's eviction ops that multiply (semantics in backend.h):
 * window / observed attention column sums and weights (evict_attn_colsum, evict_attn_probs: a row
 * kernel finds each query's softmax max and 1 / sum, a column kernel recomputes the weights and adds
 * them heads-then-queries in ascending order, the order the op fixes), one-row softmax
 * (evict_softmax_add), CriticalKV's value norms ||V W_O^h||_1 (evict_value_norm: bf16 cache and
 * o_proj at head dims 32-128 by vnorm_mma_kernel, an mma.sync GEMM with the L1 norm in its epilogue
 * that never stores the projection; otherwise per block of value rows one strided-batched cuBLAS GEMM
 * over every local head, then a half-warp per row summing the L1 norm in the op's 16 fp32 lanes), and expected attention's query
 * moments and key logits (evict_moments, evict_ea_logits), DefensiveKV's window aggregation
 * (evict_defensive_rows, its double sums in the op's order, so bit for bit). fp32 dot products and fp32 GEMMs sum in
 * another order than the CPU's, so scores agree with cpu/cpu_evict_*.c to a few ulp, not bit for bit.
 * Scratch comes from the backend's eviction workspace (ctx evict_ws, grown by the first call that
 * needs more: only then does an op wait for the stream); value rows are read through the device
 * segment table, so no op downloads, allocates or synchronises per call. */
#include "ckv_async.h"
#include "ckv_mma.h"
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

/* Bytes of n parts laid out 256-byte aligned, and where part i starts (at may be NULL). */
size_t parts_total(const size_t *bytes, int n, size_t *at) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (at) at[i] = total;
        total += (bytes[i] + 255) / 256 * 256;
    }
    return total;
}

/* parts[i] of bytes[i] (256-byte aligned) in the eviction workspace. The ops run in stream order,
 * so each reuses the workspace at once; it is sized by evict_reserve before a layer's ops run, and
 * grow() (which waits for the stream) reallocates only for an op larger than what was reserved. */
ckv_status scratch_parts(ctx *c, const size_t *bytes, void **parts, int n, const char *op) {
    size_t at[4];
    CKV_TRY(grow(c, &c->evict_ws, &c->evict_ws_cap, parts_total(bytes, n, at), op));
    for (int i = 0; i < n; i++) parts[i] = (char *)c->evict_ws + at[i];
    return CKV_STATUS_OK;
}

ckv_status kv_dtype_check(ckv_dtype t, const char *op) {
    if (t == CKV_DTYPE_BF16 || t == CKV_DTYPE_F32) return CKV_STATUS_OK;
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: %s: KV dtype %s (bf16 or f32 only)", CKV_CUDA_BACKEND_NAME,
                     op, ckv_dtype_name(t));
}

namespace {

constexpr unsigned THREADS = 256;
/* CriticalKV's value norms: value rows per batched GEMM, as many as keep the block's projection
 * [n_heads_local, rows, D] fp32 within VNORM_PROJ_BYTES (16 .. VNORM_MAX_ROWS rows). */
constexpr size_t VNORM_PROJ_BYTES = (size_t)32 << 20;
constexpr int VNORM_MAX_ROWS = 256;

/* How evict_value_norm runs for a shape. fused (bf16 values and o_proj, head dim
 * 32, 64, 80, 96 or 128, o_proj's rows 16-byte aligned): vnorm_mma_kernel, scratch the per-head norms
 * [H, n_rows] fp32. Otherwise blocked GEMMs: the GEMM's operand type (bf16 when values and o_proj
 * both are: exact products on tensor cores), whether o_proj is converted to fp32 first (f32 values,
 * bf16 o_proj), rows per GEMM, and its scratch: staged values [H, rows, d], projection [H, rows, D]
 * fp32, converted o_proj [D, H * d] fp32 (or nothing). */
struct vnorm_plan {
    int rows;
    bool fused, bf16, convert_wo;
    size_t bytes[3];
};

bool vnorm_fused_dim(int d);

vnorm_plan vnorm_plan_of(ckv_dtype kv_dtype, ckv_dtype wo_dtype, int H, int d, int D, int n_rows, bool wo_aligned) {
    vnorm_plan p;
    p.bf16 = kv_dtype == CKV_DTYPE_BF16 && wo_dtype == CKV_DTYPE_BF16;
    p.fused = p.bf16 && wo_aligned && vnorm_fused_dim(d);
    p.convert_wo = kv_dtype != CKV_DTYPE_BF16 && wo_dtype == CKV_DTYPE_BF16;
    const size_t per_row = (size_t)H * (size_t)D * sizeof(float), fit = VNORM_PROJ_BYTES / (per_row ? per_row : 1);
    p.rows = fit < 16 ? 16 : fit > (size_t)VNORM_MAX_ROWS ? VNORM_MAX_ROWS : (int)(fit / 16 * 16);
    if (p.fused) {
        p.bytes[0] = (size_t)H * (size_t)(n_rows > 0 ? n_rows : 0) * sizeof(float);
        p.bytes[1] = p.bytes[2] = 0;
        return p;
    }
    p.bytes[0] = (size_t)H * p.rows * d * (p.bf16 ? sizeof(ckv_bf16) : sizeof(float));
    p.bytes[1] = (size_t)p.rows * per_row;
    p.bytes[2] = p.convert_wo ? (size_t)D * H * d * sizeof(float) : 0;
    return p;
}

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

/* dst [n_heads_local, rows, d] (element type G) = value rows [t0, t0 + rows) of the KV head of each
 * local query head j, (head0 + j) / group, read through the device segment table: one B operand per
 * head of the batched GEMM (a GQA group's heads get copies of the same rows). */
template <typename T, typename G>
__global__ void value_rows_kernel(G *dst, ckv_kv_batch kv, int head0, int group, int t0, int rows, int ld_rows) {
    const int d = kv.head_dim, j = (int)blockIdx.y;
    const T *V = (const T *)kv.segs[0][(head0 + j) / group].v + (size_t)t0 * (size_t)d;
    G *o = dst + (size_t)j * (size_t)ld_rows * (size_t)d;
    const unsigned total = (unsigned)rows * (unsigned)d; /* < 2^32: rows <= VNORM_MAX_ROWS */
    for (unsigned e = blockIdx.x * blockDim.x + threadIdx.x; e < total; e += gridDim.x * blockDim.x)
        st_f32(o, e, ld_f32(V, e));
}

/* out[g, t] += (float)L1(proj_j row t) for the local heads j of KV head g, j ascending. The L1 norm
 * in the op's order: 16 fp32 lanes (lane l: columns l, l + 16, .. ascending), the lanes added in
 * double in lane order, then the tail columns in double. A half-warp per (row t, KV head g): thread
 * l of it is lane l, so each step reads 16 consecutive floats (two full 32-byte sectors) and the
 * lane sums are gathered in order by shuffles. proj [n_heads_local, ld_rows, D] */
__global__ void l1_rows_kernel(float *out, int ld, int t0, const float *proj, int nb, int ld_rows, int D, int head0,
                               int group, int n_heads_local) {
    const int half = (int)((blockIdx.x * blockDim.x + threadIdx.x) >> 4), l = (int)threadIdx.x & 15;
    const int base = (int)threadIdx.x & 16, g0 = head0 / group;
    const int t = half % nb, g = g0 + half / nb;
    const int jlo = g * group - head0 < 0 ? 0 : g * group - head0;
    const int jend = (g + 1) * group - head0 < n_heads_local ? (g + 1) * group - head0 : n_heads_local;
    const bool live = jlo < jend; /* whole warps stay for the shuffles below */
    const int full = D / 16 * 16;
    float acc = live && l == 0 ? out[(size_t)g * ld + t0 + t] : 0.0f;
    for (int j = jlo; j < (live ? jend : jlo + 1); j++) {
        const float *y = proj + ((size_t)j * ld_rows + t) * (size_t)D;
        float lane = 0.0f;
        if (live)
            for (int i = l; i < full; i += 16) lane += fabsf(y[i]);
        double s = 0.0;
        for (int k = 0; k < 16; k++) s += (double)__shfl_sync(0xffffffffu, lane, base + k);
        if (live && l == 0) {
            for (int i = full; i < D; i++) s += fabsf(y[i]);
            acc += (float)s;
        }
    }
    if (live && l == 0) out[(size_t)g * ld + t0 + t] = acc;
}

/* CriticalKV's value norms with the L1 norm fused into the GEMM (bf16 values and o_proj, head dim
 * HD in 32, 64, 80, 96, 128): a block of VN_THREADS takes VN_BM value rows of one local head j
 * (blockIdx.y) and walks all D output columns in chunks of VN_BN. The rows' A fragments (ldmatrix
 * from a cp.async tile) stay in registers for the whole walk; each chunk of W_O^j^T rows ([VN_BN,
 * HD] bf16: o_proj rows c0.., columns j*HD..) is staged by cp.async into one of two shared buffers
 * while the other is multiplied (mma m16n8k16, fp32 accumulation); the epilogue sums |y| of the
 * chunk per row (the lane's 16 values in (tile, register) order, then the row's 4 lanes by xor 1, 2)
 * into a double running sum over chunks ascending. The fp32 projection never leaves registers;
 * part[j, t] = (float) that sum. Rows past n_rows and columns past D read zeros (they add 0).
 * Shared rows are padded to HD + 8 elements (272 bytes at 128: 8 ldmatrix rows fall in 8 distinct
 * 16-byte bank groups, no conflicts). Every sum has one fixed order, so the result does not depend
 * on scheduling. */
constexpr int VN_BM = 128, VN_BN = 64, VN_THREADS = 256;
template <int HD> struct vn_tile {
    static constexpr int RS = HD + 8;                      /* shared row stride (elements) */
    static constexpr int ELEMS = VN_BM * RS;               /* = 2 * VN_BN * RS: rows, then two W buffers */
    static_assert(VN_BM == 2 * VN_BN, "the rows' tile and the two W buffers share one array");
};

/* cp.async of `rows` rows of HD bf16 from src (row stride ld elements) into tile (stride RS); rows
 * at or past `valid` are zero-filled (their source is not read). */
template <int HD, int ROWS>
__device__ __forceinline__ void vn_load(uint16_t *tile, const ckv_bf16 *src, size_t ld, int valid, int tid) {
    constexpr int CH = HD / 8, RS = vn_tile<HD>::RS; /* 16-byte chunks per row */
    for (int e = tid; e < ROWS * CH; e += VN_THREADS) {
        const int r = e / CH, c = e % CH;
        const bool ok = r < valid;
        ckv_cp_async<16>(tile + r * RS + c * 8, src + (ok ? (size_t)r * ld + (size_t)c * 8 : 0), ok);
    }
}

template <int HD>
__global__ void __launch_bounds__(VN_THREADS, 2)
vnorm_mma_kernel(float *part, ckv_kv_batch kv, const ckv_bf16 *wo, size_t wld, int n_rows, int D, int head0, int group) {
    constexpr int RS = vn_tile<HD>::RS, KT = HD / 16;
    alignas(16) __shared__ uint16_t sm[vn_tile<HD>::ELEMS]; /* [VN_BM][RS] rows, then [2][VN_BN][RS] W chunks */
    const int j = (int)blockIdx.y, t0 = (int)blockIdx.x * VN_BM;
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31, lm = lane >> 3, lr = lane & 7;
    const ckv_bf16 *V = (const ckv_bf16 *)kv.segs[0][(head0 + j) / group].v + (size_t)t0 * HD;
    const ckv_bf16 *W = wo + (size_t)j * HD; /* W_O^j^T [D, HD], row stride wld */
    vn_load<HD, VN_BM>(sm, V, HD, n_rows - t0, tid);
    ckv_cp_async_commit();
    ckv_cp_async_wait<0>();
    __syncthreads();
    uint32_t a[KT][4]; /* rows 16 warp + (g, g + 8), k-steps of 16 */
CKV_UNROLL
    for (int kk = 0; kk < KT; kk++) ckv_ldmatrix_x4(a[kk], sm + (warp * 16 + (lm & 1) * 8 + lr) * RS + kk * 16 + (lm >> 1) * 8);
    __syncthreads(); /* the rows' tile is in registers: the array now holds the W buffers */
    vn_load<HD, VN_BN>(sm, W, wld, D, tid);
    ckv_cp_async_commit();
    double run0 = 0.0, run1 = 0.0; /* rows g, g + 8 of the warp */
    const int n_chunks = (D + VN_BN - 1) / VN_BN;
    for (int ch = 0; ch < n_chunks; ch++) {
        if (ch + 1 < n_chunks) {
            const int c1 = (ch + 1) * VN_BN;
            vn_load<HD, VN_BN>(sm + ((ch + 1) & 1) * VN_BN * RS, W + (size_t)c1 * wld, wld, D - c1, tid);
            ckv_cp_async_commit();
            ckv_cp_async_wait<1>();
        } else {
            ckv_cp_async_wait<0>();
        }
        __syncthreads();
        const uint16_t *ws = sm + (ch & 1) * VN_BN * RS;
        float y[VN_BN / 8][4];
CKV_UNROLL
        for (int nt = 0; nt < VN_BN / 8; nt++) y[nt][0] = y[nt][1] = y[nt][2] = y[nt][3] = 0.0f;
CKV_UNROLL
        for (int kk = 0; kk < KT; kk++)
CKV_UNROLL
            for (int p = 0; p < VN_BN / 16; p++) { /* columns 16p..: matrices (n +0-7 | +8-15) x (k +0-7 | +8-15) */
                uint32_t b[4];
                ckv_ldmatrix_x4(b, ws + (p * 16 + (lm >> 1) * 8 + lr) * RS + kk * 16 + (lm & 1) * 8);
                ckv_mma_bf16_16816(y[2 * p], a[kk], b, y[2 * p]);
                ckv_mma_bf16_16816(y[2 * p + 1], a[kk], b + 2, y[2 * p + 1]);
            }
        float s0 = 0.0f, s1 = 0.0f;
CKV_UNROLL
        for (int nt = 0; nt < VN_BN / 8; nt++) {
            s0 += fabsf(y[nt][0]), s0 += fabsf(y[nt][1]);
            s1 += fabsf(y[nt][2]), s1 += fabsf(y[nt][3]);
        }
        s0 += __shfl_xor_sync(0xffffffffu, s0, 1), s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
        s0 += __shfl_xor_sync(0xffffffffu, s0, 2), s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
        run0 += (double)s0, run1 += (double)s1;
        __syncthreads(); /* this buffer is refilled by the next chunk's copy */
    }
    const int r0 = t0 + warp * 16 + (lane >> 2), r1 = r0 + 8;
    if ((lane & 3) == 0) {
        if (r0 < n_rows) part[(size_t)j * n_rows + r0] = (float)run0;
        if (r1 < n_rows) part[(size_t)j * n_rows + r1] = (float)run1;
    }
}

/* out[g, t] += part[j, t] for the local heads j of KV head g, j ascending (thread per (t, g)). */
__global__ void vnorm_add_kernel(float *out, int ld, const float *part, int n_rows, int head0, int group,
                                 int n_heads_local) {
    const int t = (int)(blockIdx.x * blockDim.x + threadIdx.x), g = head0 / group + (int)blockIdx.y;
    if (t >= n_rows) return;
    const int jlo = g * group - head0 < 0 ? 0 : g * group - head0;
    const int jend = (g + 1) * group - head0 < n_heads_local ? (g + 1) * group - head0 : n_heads_local;
    float acc = out[(size_t)g * ld + t];
    for (int j = jlo; j < jend; j++) acc += part[(size_t)j * n_rows + t];
    out[(size_t)g * ld + t] = acc;
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

/* The rows' softmax max and 1 / sum: stats [n_heads_local, n_q] in the workspace. */
ckv_status attn_stats(ctx *c, float2 **stats, const float *q, int n_q, int q_row0, const ckv_kv_batch *kv,
                      int n_heads_local, int head0, int group, float scale, int divide, const char *op) {
    CKV_TRY(kv_dtype_check(kv->dtype, op));
    if (window_covers(kv)) /* tensor cores (cuda_evict_window.cu) */
        return window_stats(c, stats, q, n_q, q_row0, kv, n_heads_local, head0, group, scale, divide, op);
    const size_t bytes = sizeof(float2) * (size_t)n_q * (size_t)n_heads_local;
    CKV_TRY(scratch_parts(c, &bytes, (void **)stats, 1, op));
    const dim3 grid((unsigned)n_q, (unsigned)n_heads_local);
    if (kv->dtype == CKV_DTYPE_BF16)
        CKV_LAUNCH(attn_rowstats_kernel<ckv_bf16>, grid, dim3(THREADS), 0, c->stream, *stats, q, n_q, q_row0, *kv,
                   n_heads_local, head0, group, scale, divide);
    else
        CKV_LAUNCH(attn_rowstats_kernel<float>, grid, dim3(THREADS), 0, c->stream, *stats, q, n_q, q_row0, *kv,
                   n_heads_local, head0, group, scale, divide);
    return CKV_STATUS_OK;
}

/* vnorm_mma_kernel<HD> over the grid of (row tiles, local heads). */
template <int HD>
void vnorm_launch(ctx *c, float *part, const ckv_kv_batch *kv, int n_rows, const ckv_bf16 *wo, size_t wld, int D, int H,
                  int head0, int group) {
    const dim3 grid((unsigned)((n_rows + VN_BM - 1) / VN_BM), (unsigned)H);
    CKV_LAUNCH((vnorm_mma_kernel<HD>), grid, dim3(VN_THREADS), 0, c->stream, part, *kv, wo, wld, n_rows, D, head0, group);
}

/* evict_value_norm's fused path: per-head norms part [H, n_rows] by vnorm_mma_kernel (head dims
 * 32, 64, 80, 96, 128: vnorm_fused_dim), then added into out per KV head in head order. */
bool vnorm_fused_dim(int d) { return d == 32 || d == 64 || d == 80 || d == 96 || d == 128; }

ckv_status value_norm_fused(ctx *c, float *out, int ld, float *part, const ckv_kv_batch *kv, int n_rows,
                            const ckv_bf16 *wo, size_t wld, int D, int H, int head0, int group) {
    switch (kv->head_dim) {
    case 32: vnorm_launch<32>(c, part, kv, n_rows, wo, wld, D, H, head0, group); break;
    case 64: vnorm_launch<64>(c, part, kv, n_rows, wo, wld, D, H, head0, group); break;
    case 80: vnorm_launch<80>(c, part, kv, n_rows, wo, wld, D, H, head0, group); break;
    case 96: vnorm_launch<96>(c, part, kv, n_rows, wo, wld, D, H, head0, group); break;
    default: vnorm_launch<128>(c, part, kv, n_rows, wo, wld, D, H, head0, group); break;
    }
    const int n_g = (head0 + H - 1) / group - head0 / group + 1;
    CKV_LAUNCH(vnorm_add_kernel, dim3(blocks_for((size_t)n_rows, THREADS), (unsigned)n_g), dim3(THREADS), 0, c->stream,
               out, ld, part, n_rows, head0, group, H);
    return op_status(c, "evict_value_norm");
}

} // namespace

ckv_status evict_reserve(ckv_backend *be, const ckv_evict_shape *sh) {
    ctx *c = ctx_of(be);
    if (!sh || sh->rows < 0 || sh->query_rows < 0 || sh->n_heads_local < 0 || sh->n_kv_local < 0 || sh->n_kv_all < 0 ||
        sh->head_dim < 0 || sh->hidden < 0 || sh->sketch < 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: evict_reserve: no shape or a negative size", CKV_CUDA_BACKEND_NAME);
    /* the largest scratch of any op of such a layer (each op uses the workspace alone) */
    const size_t H = (size_t)sh->n_heads_local;
    const size_t stats = sizeof(float2) * (size_t)sh->query_rows * H;        /* attn_stats */
    const size_t defensive = sizeof(double) * (size_t)sh->query_rows * H;    /* evict_defensive_rows */
    const vnorm_plan pl = vnorm_plan_of(sh->kv_dtype, sh->wo_dtype, sh->n_heads_local, sh->head_dim, sh->hidden, sh->rows,
                                        true);
    size_t need = parts_total(&stats, 1, NULL);
    const size_t sizes[] = {parts_total(&defensive, 1, NULL), parts_total(pl.bytes, 3, NULL),
                            keys_scratch_bytes(sh->n_kv_local, sh->head_dim, sh->rows),
                            window_scratch_bytes(sh->query_rows, sh->n_heads_local, sh->rows),
                            topk_scratch_bytes(sh->n_kv_all > sh->n_kv_local ? sh->n_kv_all : sh->n_kv_local, sh->rows),
                            sh->sketch > 0 ? leverage_scratch_bytes(sh->n_kv_local, sh->head_dim, sh->rows, sh->sketch) : 0,
                            chunk_rank_scratch_bytes(sh->rows), kvzip_norms_scratch_bytes(sh->n_heads_local, sh->head_dim)};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) need = sizes[i] > need ? sizes[i] : need;
    return grow(c, &c->evict_ws, &c->evict_ws_cap, need, "evict_reserve");
}

/* The attention family's parameters as the kernels take them. */
#define CKV_ATTN_UNPACK(a)                                                                                           \
    const float *q = (a)->q;                                                                                         \
    const ckv_kv_batch *kv = (a)->kv;                                                                                \
    const int n_q = (a)->n_q, q_row0 = (a)->q_row0, n_heads_local = (a)->n_heads_local, head0 = (a)->head0,          \
              group = (a)->group, divide = (a)->logits == CKV_EVICT_LOGITS_DIV;                                     \
    const float scale = (a)->scale

ckv_status evict_attn_colsum(ckv_backend *be, double *colsum, int n_cols, const ckv_evict_attn_params *a,
                             ckv_evict_colsum_rows rows, ckv_evict_accum accum) {
    ctx *c = ctx_of(be);
    CKV_ATTN_UNPACK(a);
    const int per_kv = rows == CKV_EVICT_PER_KV_HEAD;
    const int n_out = per_kv ? kv->n_kv_heads : n_heads_local;
    if (accum == CKV_EVICT_ZERO_FIRST && n_out > 0 && n_cols > 0)
        CKV_CUDA_CHECK(cudaMemsetAsync(colsum, 0, sizeof(double) * (size_t)n_out * n_cols, c->stream), "evict_attn_colsum");
    if (n_q < 1 || n_heads_local < 1 || n_cols < 1) return op_status(c, "evict_attn_colsum");
    float2 *stats = NULL;
    CKV_TRY(attn_stats(c, &stats, q, n_q, q_row0, kv, n_heads_local, head0, group, scale, divide, "evict_attn_colsum"));
    const dim3 grid(blocks_for((size_t)n_cols, THREADS), (unsigned)n_out);
    if (window_covers(kv))
        window_colsum(c, colsum, n_cols, stats, q, n_q, q_row0, kv, n_heads_local, head0, group, scale, divide, per_kv);
    else if (kv->dtype == CKV_DTYPE_BF16)
        CKV_LAUNCH(attn_colsum_kernel<ckv_bf16>, grid, dim3(THREADS), 0, c->stream, colsum, n_cols, stats, q, n_q,
                   q_row0, *kv, n_heads_local, head0, group, scale, divide, per_kv);
    else
        CKV_LAUNCH(attn_colsum_kernel<float>, grid, dim3(THREADS), 0, c->stream, colsum, n_cols, stats, q, n_q, q_row0,
                   *kv, n_heads_local, head0, group, scale, divide, per_kv);
    return op_status(c, "evict_attn_colsum");
}

ckv_status evict_attn_probs(ckv_backend *be, float *p, int ld, const ckv_evict_attn_params *a) {
    ctx *c = ctx_of(be);
    CKV_ATTN_UNPACK(a);
    if (n_q < 1 || n_heads_local < 1) return CKV_STATUS_OK;
    float2 *stats = NULL;
    CKV_TRY(attn_stats(c, &stats, q, n_q, q_row0, kv, n_heads_local, head0, group, scale, divide, "evict_attn_probs"));
    const dim3 grid(blocks_for((size_t)ld, THREADS), (unsigned)n_q, (unsigned)n_heads_local);
    if (kv->dtype == CKV_DTYPE_BF16)
        CKV_LAUNCH(attn_probs_kernel<ckv_bf16>, grid, dim3(THREADS), 0, c->stream, p, ld, stats, q, n_q, q_row0, *kv,
                   n_heads_local, head0, group, scale, divide);
    else
        CKV_LAUNCH(attn_probs_kernel<float>, grid, dim3(THREADS), 0, c->stream, p, ld, stats, q, n_q, q_row0, *kv,
                   n_heads_local, head0, group, scale, divide);
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
    const int d = kv->head_dim, D = (int)wo->rows, H = n_heads_local;
    CKV_TRY(kv_dtype_check(kv->dtype, op));
    if (wo->dtype != CKV_DTYPE_F32 && wo->dtype != CKV_DTYPE_BF16)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: %s: o_proj stored as %s (needs F32 or BF16)",
                         CKV_CUDA_BACKEND_NAME, op, ckv_dtype_name(wo->dtype));
    if (wo->cols < (int64_t)n_heads_local * d)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "%s backend: %s: o_proj has %lld columns, %d heads x %d need more",
                         CKV_CUDA_BACKEND_NAME, op, (long long)wo->cols, n_heads_local, d);
    if (n_rows < 1 || n_heads_local < 1) return CKV_STATUS_OK;
    const size_t wes = ckv_dtype_size(wo->dtype), wld = wo->row_bytes / wes;
    const bool wo_aligned = (uintptr_t)wo->data % 16 == 0 && wo->row_bytes % 16 == 0;
    const vnorm_plan pl = vnorm_plan_of(kv->dtype, wo->dtype, H, d, D, n_rows, wo_aligned);
    void *parts[3];
    CKV_TRY(scratch_parts(c, pl.bytes, parts, 3, op));
    if (pl.fused) return value_norm_fused(c, out, ld, (float *)parts[0], kv, n_rows, (const ckv_bf16 *)wo->data, wld, D, H, head0, group);
    void *vb = parts[0];                                         /* [H, B, d] GEMM type */
    float *proj = (float *)parts[1];                             /* [H, B, D] fp32 */
    const void *A = wo->data;                                    /* W_O^j^T: columns j*d.. of wo */
    size_t lda = wld;
    if (pl.convert_wo) { /* f32 values against bf16 o_proj: the local heads' columns as fp32, once */
        float *wh = (float *)parts[2];                           /* [D, H * d] fp32 */
        CKV_LAUNCH(to_f32_kernel<ckv_bf16>, dim3(blocks_for((size_t)D * H * d, THREADS)), dim3(THREADS), 0, c->stream,
                   wh, (const ckv_bf16 *)wo->data, wld, (size_t)0, D, H * d);
        A = wh;
        lda = (size_t)H * d;
    }
    const cudaDataType_t gt = pl.bf16 ? CUDA_R_16BF : CUDA_R_32F;
    const int B = pl.rows, n_g = (head0 + H - 1) / group - head0 / group + 1;
    const float one = 1.0f, zero = 0.0f;
    for (int t0 = 0; t0 < n_rows; t0 += B) {
        const int nb = n_rows - t0 < B ? n_rows - t0 : B;
        const dim3 sgrid(blocks_for((size_t)nb * d, THREADS), (unsigned)H);
        if (pl.bf16)
            CKV_LAUNCH((value_rows_kernel<ckv_bf16, ckv_bf16>), sgrid, dim3(THREADS), 0, c->stream, (ckv_bf16 *)vb, *kv,
                       head0, group, t0, nb, B);
        else if (kv->dtype == CKV_DTYPE_BF16)
            CKV_LAUNCH((value_rows_kernel<ckv_bf16, float>), sgrid, dim3(THREADS), 0, c->stream, (float *)vb, *kv,
                       head0, group, t0, nb, B);
        else
            CKV_LAUNCH((value_rows_kernel<float, float>), sgrid, dim3(THREADS), 0, c->stream, (float *)vb, *kv, head0,
                       group, t0, nb, B);
        /* proj_j [nb, D] = vb_j [nb, d] @ W_O^j^T for every local head j in one batched GEMM
         * (docs/gpu.md §5 operand order; bf16 operands: exact products, fp32 accumulation) */
        CKV_CUBLAS_CHECK(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, D, nb, d, &one, A, gt, (int)lda,
                                                    (long long)d, vb, gt, d, (long long)B * d, &zero, proj, CUDA_R_32F,
                                                    D, (long long)B * D, H, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         op);
        CKV_LAUNCH(l1_rows_kernel, dim3(blocks_for((size_t)nb * n_g * 16, THREADS)), dim3(THREADS), 0, c->stream, out,
                   ld, t0, proj, nb, B, D, head0, group, H);
    }
    return op_status(c, op);
}

ckv_status evict_moments(ckv_backend *be, double *s1, double *s2, const float *q, const float *shift, int n,
                         int n_heads_local, int d, ckv_evict_accum zero) {
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

ckv_status evict_defensive_rows(ckv_backend *be, const ckv_evict_defensive_params *d) {
    ctx *c = ctx_of(be);
    const char *op = "evict_defensive_rows";
    const size_t cells = (size_t)d->n_kv * (size_t)d->n; /* ave, dmax [n_kv, n] */
    if (d->accum == CKV_EVICT_ZERO_FIRST) {
        if (d->n_kv > 0 && d->n > 0) {
            CKV_CUDA_CHECK(cudaMemsetAsync(d->ave, 0, sizeof(double) * cells, c->stream), op);
            CKV_CUDA_CHECK(cudaMemsetAsync(d->dmax, 0, sizeof(float) * cells, c->stream), op);
        }
        CKV_CUDA_CHECK(cudaMemsetAsync(d->bias, 0, sizeof(double), c->stream), op);
    }
    if (d->w < 1 || d->n < 1 || d->n_heads_local < 1 || d->n_kv < 1) return op_status(c, op);
    const size_t bytes = sizeof(double) * (size_t)d->n_heads_local * d->w; /* scale [n_heads_local, w] */
    double *scale = NULL;
    CKV_TRY(scratch_parts(c, &bytes, (void **)&scale, 1, op));
    CKV_LAUNCH(defensive_scale_kernel, dim3((unsigned)d->w, (unsigned)d->n_heads_local), dim3(32), 0, c->stream, scale,
               d->p, d->ld, d->w, d->n, d->kernel);
    CKV_LAUNCH(defensive_cols_kernel, dim3(blocks_for((size_t)d->n, THREADS), (unsigned)d->n_kv), dim3(THREADS), 0,
               c->stream, d->ave, d->dmax, scale, d->p, d->ld, d->w, d->n, d->n_heads_local, d->head0, d->group,
               d->kernel);
    CKV_LAUNCH(defensive_bias_kernel, dim3(1), dim3(1), 0, c->stream, d->bias, d->p, d->ld, d->w, d->n,
               d->n_heads_local);
    return op_status(c, op);
}

} // namespace CKV_CUDA_NS
