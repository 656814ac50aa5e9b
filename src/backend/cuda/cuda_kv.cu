/* cuda_kv.cu - the CUDA backend's KV-cache kernels: kv_store (append a batch's keys, values and
 * positions to its segments in the cache's dtype, then advance every segment's len on the device)
 * kv_gather (compact every segment of a sequence to its kept rows in one launch) and kv_rerotate
 * (kept keys rotated to their row index, in place). Segment
 * descriptors (ckv_kv_seg) are read and written on the device; the host never sees lengths here.
 * No attention or eviction arithmetic. */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr unsigned THREADS = 128;
constexpr int GATHER_ROWS = 8; /* kept rows per block of kv_gather */
constexpr int ROTATE_ROWS = 8; /* rows per block of kv_rerotate */

/* Sequence of token t and its index among that sequence's tokens. */
__device__ __forceinline__ void token_seq(const ckv_kv_batch &kv, int t, int *s, int *i) {
    *s = kv.seq_of ? kv.seq_of[t] : 0;
    *i = t - (kv.seq_start ? kv.seq_start[*s] : 0);
}

/* One block per (token, KV head): k, v [n, n_kv, hd] -> row len + i of the segment. */
template <typename T>
__global__ void kv_store_kernel(ckv_kv_batch kv, const float *k, const float *v, const int32_t *pos) {
    const int t = (int)blockIdx.x, g = (int)blockIdx.y, hd = kv.head_dim;
    int s, i;
    token_seq(kv, t, &s, &i);
    ckv_kv_seg *seg = &kv.segs[s][g];
    const int row = seg->len + i;
    if (row >= seg->cap) return; /* the caller checked capacities; never write past them */
    const size_t src = ((size_t)t * (size_t)kv.n_kv_heads + (size_t)g) * (size_t)hd;
    T *kd = (T *)seg->k + (size_t)row * (size_t)hd, *vd = (T *)seg->v + (size_t)row * (size_t)hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        st_f32(kd, (size_t)d, k[src + (size_t)d]);
        st_f32(vd, (size_t)d, v[src + (size_t)d]);
    }
    if (threadIdx.x == 0) seg->pos[row] = pos[t];
}

/* After the store (stream order): every segment of sequence s grows by its token count. */
__global__ void kv_advance_kernel(ckv_kv_batch kv, int n) {
    const int s = (int)blockIdx.x;
    const int count = kv.seq_start ? kv.seq_start[s + 1] - kv.seq_start[s] : n;
    for (int g = threadIdx.x; g < kv.n_kv_heads; g += blockDim.x) {
        ckv_kv_seg *seg = &kv.segs[s][g];
        const int len = seg->len + count;
        seg->len = len < seg->cap ? len : seg->cap;
    }
}

/* Block (b, g): kept rows b * GATHER_ROWS .. of segment g, elements spread over the threads. */
template <typename T>
__global__ void kv_gather_kernel(ckv_kv_seg *dst, const ckv_kv_seg *src, const int32_t *keep, int stride,
                                 const int32_t *n_keep, int hd) {
    const int g = (int)blockIdx.y, r0 = (int)blockIdx.x * GATHER_ROWS;
    const int nk = n_keep[g];
    /* the data pointers only: block 0 writes dst[g].len meanwhile */
    const T *sk = (const T *)src[g].k, *sv = (const T *)src[g].v;
    const int32_t *sp = src[g].pos;
    T *dk = (T *)dst[g].k, *dv = (T *)dst[g].v;
    int32_t *dp = dst[g].pos;
    const int32_t *kg = keep + (size_t)g * (size_t)stride; // [stride]
    const int rows = nk - r0 < GATHER_ROWS ? nk - r0 : GATHER_ROWS;
    for (int e = threadIdx.x; e < rows * hd; e += blockDim.x) {
        const int r = r0 + e / hd, d = e % hd;
        const size_t from = (size_t)kg[r] * (size_t)hd + (size_t)d, to = (size_t)r * (size_t)hd + (size_t)d;
        dk[to] = sk[from];
        dv[to] = sv[from];
    }
    for (int r = threadIdx.x; r < rows; r += blockDim.x) dp[r0 + r] = sp[kg[r0 + r]];
    if (blockIdx.x == 0 && threadIdx.x == 0) dst[g].len = nk;
}

/* Block (b, g, s): rows b * ROTATE_ROWS .. of segment g of sequence s, a thread per (row, pair); then
 * the rows' positions become their indices (after every thread has read them). */
template <typename T>
__global__ void kv_rerotate_kernel(ckv_kv_batch kv, const float *inv_freq) {
    const ckv_kv_seg *seg = &kv.segs[blockIdx.z][blockIdx.y];
    const int half = kv.head_dim / 2, len = seg->len, r0 = (int)blockIdx.x * ROTATE_ROWS;
    T *k = (T *)seg->k;
    int32_t *pos = seg->pos;
    for (int e = threadIdx.x; e < ROTATE_ROWS * half; e += blockDim.x) {
        const int i = r0 + e / half, j = e % half;
        if (i >= len) break; /* e grows with i */
        const float a = (float)(i - pos[i]) * inv_freq[j], c = cosf(a), sn = sinf(a); /* full-range, as rope */
        const size_t at = (size_t)i * (size_t)kv.head_dim + (size_t)j;
        const float x0 = ld_f32(k, at), x1 = ld_f32(k, at + (size_t)half);
        st_f32(k, at, x0 * c - x1 * sn); /* x cos + rotate_half(x) sin */
        st_f32(k, at + (size_t)half, x1 * c + x0 * sn);
    }
    __syncthreads();
    for (int r = threadIdx.x; r < ROTATE_ROWS && r0 + r < len; r += blockDim.x) pos[r0 + r] = r0 + r;
}

} // namespace

void kv_store(ckv_backend *be, const ckv_kv_batch *kv, const float *k, const float *v, const int32_t *pos, int n) {
    ctx *c = ctx_of(be);
    if (n <= 0 || kv->n_kv_heads <= 0 || kv->n_seq <= 0) return;
    const dim3 grid((unsigned)n, (unsigned)kv->n_kv_heads);
    if (kv->dtype == CKV_DTYPE_BF16)
        CKV_LAUNCH((kv_store_kernel<ckv_bf16>), grid, dim3(THREADS), 0, c->stream, *kv, k, v, pos);
    else if (kv->dtype == CKV_DTYPE_F32)
        CKV_LAUNCH((kv_store_kernel<float>), grid, dim3(THREADS), 0, c->stream, *kv, k, v, pos);
    else {
        record(c, ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: kv_store: KV dtype %s (bf16 or f32 only)",
                            CKV_CUDA_BACKEND_NAME, ckv_dtype_name(kv->dtype)));
        return;
    }
    CKV_LAUNCH(kv_advance_kernel, dim3((unsigned)kv->n_seq), dim3(THREADS), 0, c->stream, *kv, n);
    op_done(c, "kv_store");
}

void kv_gather(ckv_backend *be, const ckv_kv_gather_params *g) {
    ctx *c = ctx_of(be);
    const ckv_dtype dtype = g->dtype;
    ckv_kv_seg *dst = g->dst;
    const ckv_kv_seg *src = g->src;
    const int32_t *keep = g->keep, *n_keep = g->n_keep;
    const int head_dim = g->head_dim, n_kv = g->n_kv, stride = g->stride;
    if (n_kv <= 0) return;
    /* a zero stride keeps nothing: one block per segment still sets len = n_keep = 0 */
    const dim3 grid((unsigned)((stride + GATHER_ROWS - 1) / GATHER_ROWS > 0 ? (stride + GATHER_ROWS - 1) / GATHER_ROWS : 1),
                    (unsigned)n_kv);
    if (dtype == CKV_DTYPE_BF16)
        CKV_LAUNCH((kv_gather_kernel<ckv_bf16>), grid, dim3(THREADS), 0, c->stream, dst, src, keep, stride, n_keep,
                   head_dim);
    else if (dtype == CKV_DTYPE_F32)
        CKV_LAUNCH((kv_gather_kernel<float>), grid, dim3(THREADS), 0, c->stream, dst, src, keep, stride, n_keep,
                   head_dim);
    else {
        record(c, ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: kv_gather: KV dtype %s (bf16 or f32 only)",
                            CKV_CUDA_BACKEND_NAME, ckv_dtype_name(dtype)));
        return;
    }
    op_done(c, "kv_gather");
}

void kv_rerotate(ckv_backend *be, const ckv_kv_batch *kv, const float *inv_freq) {
    ctx *c = ctx_of(be);
    if (kv->n_kv_heads <= 0 || kv->n_seq <= 0 || kv->max_len <= 0 || kv->head_dim < 2) return;
    /* max_len bounds every segment's len; blocks past a segment's own len return at once */
    const dim3 grid((unsigned)((kv->max_len + ROTATE_ROWS - 1) / ROTATE_ROWS), (unsigned)kv->n_kv_heads,
                    (unsigned)kv->n_seq);
    if (kv->dtype == CKV_DTYPE_BF16)
        CKV_LAUNCH((kv_rerotate_kernel<ckv_bf16>), grid, dim3(THREADS), 0, c->stream, *kv, inv_freq);
    else if (kv->dtype == CKV_DTYPE_F32)
        CKV_LAUNCH((kv_rerotate_kernel<float>), grid, dim3(THREADS), 0, c->stream, *kv, inv_freq);
    else {
        record(c, ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: kv_rerotate: KV dtype %s (bf16 or f32 only)",
                            CKV_CUDA_BACKEND_NAME, ckv_dtype_name(kv->dtype)));
        return;
    }
    op_done(c, "kv_rerotate");
}

} // namespace CKV_CUDA_NS
