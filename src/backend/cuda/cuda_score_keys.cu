/* cuda_score_keys.cu - the CUDA backend's ops for the attention-free key scorers (semantics in
 * backend.h): KeyDiff (evict_keydiff), LagKV (evict_lagkv) and CUR (evict_cur). They read the cached
 * keys and values only: no queries, no attention weights, nothing of size L x L. LagKV is one block
 * per (partition, KV head) after a fill of the unscored rows, every sum in the CPU's order
 * (cpu/cpu_evict_keys.c). KeyDiff and CUR are three launches over the layer's segments: squared
 * row norms in double (one thread per row, the CPU's lane sums), a per-head pass (KeyDiff's anchor: one thread per channel,
 * rows ascending; CUR's window sums and its combination), and the per-row scores. The per-row
 * arithmetic equals the CPU's; the context-wide sums of CUR and KeyDiff's anchor norm are reduced
 * in another order (double), so scores agree with the CPU's to double rounding before the fp32
 * result. Scratch: the backend's eviction workspace. */
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
        const auto x = [&](int a) { return (double)ld_f32(base, (size_t)t * d + a); };
        dst[t] = lane_sum(d, x, x);
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
        for (int t = 0; t < n_rows; t++) s += (double)ld_f32(k, (size_t)t * d + a) * (1.0 / fmax(sqrt(sg[t]), 1e-12));
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
        const double dot = lane_sum(d, [&](int a) { return (double)ld_f32(k, (size_t)t * d + a); },
                                    [&](int a) { return an[a]; });
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

/* LagKV before compression starts: sinks and everything 1, or when the context is shorter than
 * n_sink + 2 lag the recency ramp (t - n_sink) / (n_rows - n_sink) from row n_sink. grid (blocks, n_kv) */
__global__ void lagkv_fill_kernel(float *out, int ld, int n_rows, int n_sink, int ramp) {
    const int g = (int)blockIdx.y;
    for (int t = (int)(blockIdx.x * blockDim.x + threadIdx.x); t < n_rows; t += (int)(gridDim.x * blockDim.x))
        out[(size_t)g * ld + t] = ramp && t >= n_sink ? (float)(t - n_sink) / (float)(n_rows - n_sink) : 1.0f;
}

/* LagKV on partition p (rows t0 = n_sink + p lag .. + lag) of segment g against the channel range of
 * partition p + 1, keys then values, as the CPU reference: lo/hi one thread per channel; each row's
 * spread one thread per row, lane sums (fp32 quotient, double sums); the softmax's max and
 * sum by thread 0 rows ascending; the rank one thread per row. sr: [n_kv, P - 1, 2, lag] spreads
 * then scores. grid (P - 1, n_kv), block THREADS */
template <typename T>
__global__ void lagkv_kernel(float *out, int ld, double *sr, ckv_kv_batch kv, int n_sink, int lag, int cross) {
    __shared__ float lo[MAX_DIM], hi[MAX_DIM]; /* channel range of the next partition */
    __shared__ double total; /* the softmax's denominator */
    const int p = (int)blockIdx.x, g = (int)blockIdx.y, d = kv.head_dim, tid = (int)threadIdx.x;
    const int t0 = n_sink + p * lag;
    double *s = sr + ((size_t)g * gridDim.x + (size_t)p) * 2 * (size_t)lag, *r = s + lag; // [lag] each
    for (int values = 0; values < 2; values++) {
        const T *x = (const T *)(values ? kv.segs[0][g].v : kv.segs[0][g].k);
        for (int a = tid; a < d; a += (int)blockDim.x) {
            float l = ld_f32(x, (size_t)(t0 + lag) * d + a), h = l;
            for (int t = t0 + lag + 1; t < t0 + 2 * lag; t++) {
                const float v = ld_f32(x, (size_t)t * d + a);
                l = v < l ? v : l;
                h = v > h ? v : h;
            }
            lo[a] = l, hi[a] = h;
        }
        __syncthreads();
        for (int i = tid; i < lag; i += (int)blockDim.x) {
            const size_t row = (size_t)(t0 + i) * d;
            const auto z = [&](int a) { return (double)((ld_f32(x, row + a) - lo[a]) / (hi[a] - lo[a])); };
            const double mean = lane_sum(d, z, [](int) { return 1.0; }) / (double)d;
            const auto e = [&](int a) { return z(a) - mean; };
            const double var = lane_sum(d, e, e);
            s[i] = d > 1 ? sqrt(var / (double)(d - 1)) : (double)NAN; /* torch.std: unbiased */
        }
        __syncthreads();
        if (tid == 0) {
            double mx = -INFINITY, sum = 0.0;
            for (int i = 0; i < lag; i++) mx = s[i] > mx ? s[i] : mx;
            for (int i = 0; i < lag; i++) sum += (s[i] = exp(s[i] - mx));
            total = sum;
        }
        __syncthreads();
        for (int i = tid; i < lag; i += (int)blockDim.x) r[i] = (values ? r[i] : 0.0) + 0.5 * (s[i] / total);
        __syncthreads(); /* lo, hi and s are refilled by the values' pass; r is read below */
    }
    for (int i = tid; i < lag; i += (int)blockDim.x) {
        if (cross) {
            out[(size_t)g * ld + t0 + i] = (float)r[i];
            continue;
        }
        int rank = 0; /* argsort of argsort: the row's place in ascending order */
        for (int u = 0; u < lag; u++) rank += r[u] < r[i] || (r[u] == r[i] && u < i);
        out[(size_t)g * ld + t0 + i] = (float)rank / (float)lag;
    }
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

ckv_status evict_lagkv(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows, int n_sink, int lag,
                       ckv_evict_lagkv_score score) {
    const int cross = score == CKV_EVICT_LAGKV_CROSS;
    ctx *c = ctx_of(be);
    CKV_TRY(check_dim(kv, n_rows, "evict_lagkv"));
    if (n_sink < 0 || lag < 1 || n_rows <= n_sink)
        return ckv_error(CKV_STATUS_ERR_ARG, "evict_lagkv: %d rows, %d sinks, lag %d", n_rows, n_sink, lag);
    const size_t n_kv = (size_t)kv->n_kv_heads;
    const int ramp = n_rows < n_sink + 2 * lag, parts = ramp ? 0 : (n_rows - n_sink) / lag - 1;
    CKV_LAUNCH(lagkv_fill_kernel, dim3(blocks_for((size_t)n_rows, THREADS), (unsigned)n_kv), dim3(THREADS), 0,
               c->stream, out, ld, n_rows, n_sink, ramp);
    if (parts > 0) {
        CKV_TRY(grow(c, &c->evict_ws, &c->evict_ws_cap, n_kv * (size_t)parts * 2 * (size_t)lag * sizeof(double),
                     "evict_lagkv"));
        double *sr = (double *)c->evict_ws; // [n_kv, parts, 2, lag]
        CKV_TRY(by_dtype(kv->dtype, "evict_lagkv", [&](auto t) {
            CKV_LAUNCH((lagkv_kernel<decltype(t)>), dim3((unsigned)parts, (unsigned)n_kv), dim3(THREADS), 0, c->stream,
                       out, ld, sr, *kv, n_sink, lag, cross);
        }));
    }
    return op_status(c, "evict_lagkv");
}

ckv_status evict_cur(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows, int n_sink,
                     ckv_evict_cur_kind kind, int window) {
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
