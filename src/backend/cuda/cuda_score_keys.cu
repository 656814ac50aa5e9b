/* cuda_score_keys.cu - the CUDA backend's ops for the attention-free key scorers (semantics in
 * backend.h): KeyDiff (evict_keydiff) and CUR (evict_cur). They read the cached keys and values
 * only: no queries, no attention weights, nothing of size L x L. Each op is three launches over
 * the layer's segments: squared row norms in double (one thread per row, channels ascending, as the
 * CPU reference cpu/cpu_evict_keys.c), a per-head pass (KeyDiff's anchor: one thread per channel,
 * rows ascending; CUR's window sums and its combination), and the per-row scores. The per-row
 * arithmetic equals the CPU's; the context-wide sums of CUR and KeyDiff's anchor norm are reduced
 * in another order (double), so scores agree with the CPU's to double rounding before the fp32
 * result. Scratch: the backend's eviction workspace. LagKV has no CUDA op yet (its scorer says so). */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr unsigned THREADS = 256;
constexpr int MAX_DIM = 1024;

/* sq[(values * n_kv + g) * n_rows + t] = sum over channels of x^2 (double), x = keys (values = 0) or
 * values (1) of segment g. grid (blocks, n_kv, 1 or 2) */
template <typename T> __global__ void sq_norm_kernel(double *sq, ckv_kv_batch kv, int n_rows) {
    const int g = (int)blockIdx.y, values = (int)blockIdx.z, d = kv.head_dim;
    const ckv_kv_seg *sg = &kv.segs[0][g];
    const T *base = (const T *)(values ? sg->v : sg->k);
    double *dst = sq + ((size_t)values * (size_t)kv.n_kv_heads + (size_t)g) * (size_t)n_rows;
    for (int t = (int)(blockIdx.x * blockDim.x + threadIdx.x); t < n_rows; t += (int)(gridDim.x * blockDim.x)) {
        double ss = 0.0;
        for (int a = 0; a < d; a++) {
            const double v = (double)ld_f32(base, (size_t)t * d + a);
            ss += v * v;
        }
        dst[t] = ss;
    }
}

/* KeyDiff's anchor of segment g: anchor[g * (d + 1) + a] = mean over rows of k[a] / max(||k||, 1e-12),
 * then anchor[g * (d + 1) + d] = max(||anchor||, 1e-8). grid n_kv */
template <typename T> __global__ void keydiff_anchor_kernel(double *anchor, const double *sq, ckv_kv_batch kv, int n_rows) {
    const int g = (int)blockIdx.x, d = kv.head_dim;
    const T *k = (const T *)kv.segs[0][g].k;
    const double *sg = sq + (size_t)g * (size_t)n_rows;
    double *an = anchor + (size_t)g * (size_t)(d + 1);
    for (int a = (int)threadIdx.x; a < d; a += (int)blockDim.x) {
        double s = 0.0;
        for (int t = 0; t < n_rows; t++) s += (double)ld_f32(k, (size_t)t * d + a) / fmax(sqrt(sg[t]), 1e-12);
        an[a] = s / (double)n_rows;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double ss = 0.0;
        for (int a = 0; a < d; a++) ss += an[a] * an[a];
        an[d] = fmax(sqrt(ss), 1e-8);
    }
}

/* out[g * ld + t] = -(k_t . anchor) / (max(||k_t||, 1e-8) * ||anchor||). grid (blocks, n_kv) */
template <typename T>
__global__ void keydiff_score_kernel(float *out, int ld, const double *anchor, const double *sq, ckv_kv_batch kv,
                                     int n_rows) {
    const int g = (int)blockIdx.y, d = kv.head_dim;
    const T *k = (const T *)kv.segs[0][g].k;
    const double *an = anchor + (size_t)g * (size_t)(d + 1);
    for (int t = (int)(blockIdx.x * blockDim.x + threadIdx.x); t < n_rows; t += (int)(gridDim.x * blockDim.x)) {
        double dot = 0.0;
        for (int a = 0; a < d; a++) dot += (double)ld_f32(k, (size_t)t * d + a) * an[a];
        out[(size_t)g * ld + t] = (float)(-dot / (fmax(sqrt(sq[(size_t)g * n_rows + t]), 1e-8) * an[d]));
    }
}

/* CUR on segment g: the squared norms divided by their window sums (window > 0), combined by kind
 * into sq's key slot, divided by their sum; sinks 1. grid n_kv, block THREADS */
__global__ void cur_kernel(float *out, int ld, double *sq, int n_kv, int n_rows, int n_sink, int kind, int window) {
    __shared__ double red[32];
    const int g = (int)blockIdx.x;
    double *k2 = sq + (size_t)g * (size_t)n_rows, *v2 = sq + ((size_t)n_kv + (size_t)g) * (size_t)n_rows;
    if (window > 0) {
        const int n_win = (n_rows + window - 1) / window;
        for (int w = (int)threadIdx.x; w < 2 * n_win; w += (int)blockDim.x) {
            double *x = w < n_win ? k2 : v2;
            const int t0 = (w % n_win) * window, t1 = t0 + window < n_rows ? t0 + window : n_rows;
            double sum = 0.0;
            for (int t = t0; t < t1; t++) sum += x[t];
            for (int t = t0; t < t1; t++) x[t] /= sum;
        }
        __syncthreads();
    }
    double part = 0.0;
    for (int t = (int)threadIdx.x; t < n_rows; t += (int)blockDim.x) {
        const double a = k2[t], b = v2[t];
        const double s = kind == 0 ? a : kind == 1 ? b : kind == 2 ? (a + b) / 2.0 : a * b;
        k2[t] = s;
        part += s;
    }
    const double total = block_sum(part, red);
    for (int t = (int)threadIdx.x; t < n_rows; t += (int)blockDim.x)
        out[(size_t)g * ld + t] = t < n_sink ? 1.0f : (float)(k2[t] / total);
}

/* launch(T(), op) with T the element type of KV dtype t */
template <typename F> ckv_status by_dtype(ckv_dtype t, const char *op, F launch) {
    if (t == CKV_DTYPE_BF16) {
        launch(ckv_bf16());
    } else if (t == CKV_DTYPE_F32) {
        launch(float());
    } else {
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: %s: KV dtype %s (bf16 or f32 only)",
                         CKV_CUDA_BACKEND_NAME, op, ckv_dtype_name(t));
    }
    return CKV_STATUS_OK;
}

ckv_status check_dim(const ckv_kv_batch *kv, int n_rows, const char *op) {
    if (kv->head_dim < 1 || kv->head_dim > MAX_DIM)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: head_dim %d outside 1..%d", op, kv->head_dim, MAX_DIM);
    if (n_rows < 1) return ckv_error(CKV_STATUS_ERR_ARG, "%s: %d rows", op, n_rows);
    return CKV_STATUS_OK;
}

} // namespace

/* KeyDiff's anchors [n_kv, d + 1] then squared norms [n_kv, n_rows] (double): where the norms start */
static size_t keydiff_sq_at(size_t n_kv, int d) { return (n_kv * (size_t)(d + 1) * sizeof(double) + 255) / 256 * 256; }

size_t keys_scratch_bytes(int n_kv, int d, int n_rows) {
    const size_t nk = (size_t)(n_kv > 0 ? n_kv : 0), rows = (size_t)(n_rows > 0 ? n_rows : 0);
    const size_t keydiff = keydiff_sq_at(nk, d) + nk * rows * sizeof(double), cur = 2 * nk * rows * sizeof(double);
    return keydiff > cur ? keydiff : cur;
}

ckv_status evict_keydiff(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows) {
    ctx *c = ctx_of(be);
    CKV_TRY(check_dim(kv, n_rows, "evict_keydiff"));
    const size_t n_kv = (size_t)kv->n_kv_heads, sq_bytes = n_kv * (size_t)n_rows * sizeof(double);
    const size_t sq_at = keydiff_sq_at(n_kv, kv->head_dim);
    CKV_TRY(grow(c, &c->evict_ws, &c->evict_ws_cap, sq_at + sq_bytes, "evict_keydiff"));
    double *anchor = (double *)c->evict_ws, *sq = (double *)((char *)c->evict_ws + sq_at); // [n_kv, d + 1], [n_kv, n_rows]
    const dim3 rows(blocks_for((size_t)n_rows, THREADS), (unsigned)n_kv);
    CKV_TRY(by_dtype(kv->dtype, "evict_keydiff", [&](auto t) {
        CKV_LAUNCH((sq_norm_kernel<decltype(t)>), rows, dim3(THREADS), 0, c->stream, sq, *kv, n_rows);
        CKV_LAUNCH((keydiff_anchor_kernel<decltype(t)>), dim3((unsigned)n_kv), dim3(THREADS), 0, c->stream, anchor, sq,
                   *kv, n_rows);
        CKV_LAUNCH((keydiff_score_kernel<decltype(t)>), rows, dim3(THREADS), 0, c->stream, out, ld, anchor, sq, *kv,
                   n_rows);
    }));
    return op_status(c, "evict_keydiff");
}

ckv_status evict_cur(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows, int n_sink, int kind,
                     int window) {
    ctx *c = ctx_of(be);
    CKV_TRY(check_dim(kv, n_rows, "evict_cur"));
    if (kind < 0 || kind > 3 || window < 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "evict_cur: kind %d, window %d", kind, window);
    const size_t n_kv = (size_t)kv->n_kv_heads;
    CKV_TRY(grow(c, &c->evict_ws, &c->evict_ws_cap, 2 * n_kv * (size_t)n_rows * sizeof(double), "evict_cur"));
    double *sq = (double *)c->evict_ws; // [2, n_kv, n_rows]: squared key norms, then value norms
    const dim3 rows(blocks_for((size_t)n_rows, THREADS), (unsigned)n_kv, 2);
    CKV_TRY(by_dtype(kv->dtype, "evict_cur", [&](auto t) {
        CKV_LAUNCH((sq_norm_kernel<decltype(t)>), rows, dim3(THREADS), 0, c->stream, sq, *kv, n_rows);
    }));
    CKV_LAUNCH(cur_kernel, dim3((unsigned)n_kv), dim3(THREADS), 0, c->stream, out, ld, sq, (int)n_kv, n_rows, n_sink,
               kind, window);
    return op_status(c, "evict_cur");
}

} // namespace CKV_CUDA_NS
