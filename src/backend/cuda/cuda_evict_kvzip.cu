/* cuda_evict_kvzip.cu - evict_kvzip on the CUDA backend: KVzip's attention maxima of one replayed
 * chunk (semantics in backend.h) on tensor cores, for the caches window_covers (bf16 or f32, head
 * dims 16, 32, 64, 80, 96, 128; others are refused naming the op). Pass 1 is the window scores'
 * (window_stats_ranges, cuda_evict_window.cu) over three key ranges: the sinks, the chunk's rows and
 * the replayed rows, with the replay's first row as q_row0, so each replayed query's softmax max and
 * 1 / sum cover exactly its columns (online per 512-key chunk, merged in ascending order). Pass 2
 * (kvzip_colmax_kernel) takes one tile of the chunk's keys per block and KV head, recomputes the
 * tile's logits for every replayed row of the group's local query heads (ckv_qk_tile.h: 16-byte
 * cp.async keys, ldmatrix for bf16, mma.sync m16n8k16 with the fp32 queries split into three bf16
 * terms), forms exp(s - m) / l (times KVzip+'s 1 / ||h|| and ||v W_O||), and keeps each column's
 * maximum: per lane over its rows, over the 8 lane groups by a butterfly, over the 4 warps in shared
 * memory, then raised into the scores. Maxima do not depend on their order, so the result does not
 * depend on scheduling; logits differ from the CPU's fp32 lanes by a few ulp. Scratch (statistics
 * and per-chunk partials) comes from the eviction workspace sized by evict_reserve; nothing is
 * allocated, downloaded or synchronised per call. */
#include "cuda_internal.h"
#include "ckv_win_rows.h"

namespace CKV_CUDA_NS {

namespace {

/* Grid (key tiles of BN over the chunk's C rows, KV heads), FA_THREADS. out[g * ld + start + c] =
 * max(out, p) over the replayed rows i of g's local query heads j, p = exp(s - m) / l of column
 * sink + c (times hinv[i] vn[j * ld_vn + c] with KVzip+). */
template <typename T, int HD>
__global__ void __launch_bounds__(FA_THREADS, 2)
kvzip_colmax_kernel(float *out, int ld, const float2 *stats, const float *q, int n_q, int start, int C,
                    ckv_kv_batch kv, int n_heads_local, int head0, int group, float scale, const float *hinv,
                    const float *vn, int ld_vn) {
    typedef fa_tile<T, HD> tile_t;
    constexpr int BN = tile_t::BN;
    alignas(16) __shared__ typename tile_t::elem ks[BN * tile_t::KS]; // [key][KS]
    __shared__ float red[FA_THREADS / 32][BN];                        // [warp][column]
    const int g = (int)blockIdx.y, kb = (int)blockIdx.x * BN;
    const win_rows w = win_rows_of(g, head0, group, n_heads_local, n_q);
    if (w.jlo >= w.jhi) return; /* a KV head without local heads: uniform, before any barrier */
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31, tq = lane & 3;
    float acc[BN / 8][2]; /* this lane's columns nt * 8 + 2 tq + e */
CKV_UNROLL
    for (int nt = 0; nt < BN / 8; nt++) acc[nt][0] = acc[nt][1] = 0.0f;
    win_stage_tile<T, HD>(ks, (const T *)kv.segs[0][g].k, start + kb, start + C, tid);
    win_tile_rows<T, HD>(ks, q, n_q, n_heads_local, w, stats, warp, lane,
                         [&](const float (*sc)[4], const float2 *st, int i0, int j) {
CKV_UNROLL
        for (int nt = 0; nt < BN / 8; nt++)
CKV_UNROLL
            for (int e = 0; e < 4; e++) {
                const int c = kb + nt * 8 + 2 * tq + (e & 1), h = e >> 1, i = i0 + 8 * h;
                if (i < n_q && c < C) {
                    float p = expf(win_logit(sc[nt][e], scale, 1) - st[h].x) * st[h].y;
                    if (vn) p = p * hinv[i] * vn[(size_t)j * ld_vn + c];
                    acc[nt][e & 1] = fmaxf(acc[nt][e & 1], p); /* NaN ignored, as the CPU's comparison */
                }
            }
    });
    /* over the 8 lane groups, then the warps */
    win_cols_reduce<BN>(acc, red, warp, lane, [](float x, float y) { return fmaxf(x, y); });
    if (tid < BN && kb + tid < C) {
        float *o = out + (size_t)g * ld + start + kb + tid;
        float m = *o;
        for (int v = 0; v < FA_THREADS / 32; v++) m = red[v][tid] > m ? red[v][tid] : m;
        *o = m;
    }
}

template <typename T, int HD>
void kvzip_colmax_launch(ctx *c, float *out, int ld, const float2 *stats, const ckv_evict_kvzip_params *z) {
    const int C = z->end - z->start, BN = fa_tile<T, HD>::BN;
    const dim3 grid((unsigned)((C + BN - 1) / BN), (unsigned)z->kv->n_kv_heads);
    CKV_LAUNCH((kvzip_colmax_kernel<T, HD>), grid, dim3(FA_THREADS), 0, c->stream, out, ld, stats, z->q, z->n_q,
               z->start, C, *z->kv, z->n_heads_local, z->head0, z->group, z->scale, z->hinv, z->vn, z->ld_vn);
}
template <typename T, int HD> struct kvzip_colmax_f {
    template <typename... A> static void run(A... a) { kvzip_colmax_launch<T, HD>(a...); }
};

} // namespace

ckv_status evict_kvzip(ckv_backend *be, float *out, int ld, const ckv_evict_kvzip_params *z) {
    ctx *c = ctx_of(be);
    const char *op = "evict_kvzip";
    if (!z || !z->kv || z->n_q < 1 || z->sink < 0 || z->sink > z->start || z->start >= z->end || z->end > z->ctx ||
        z->end > ld || z->group < 1 || z->n_heads_local < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: %s: rows out of order (sink %d, chunk %d..%d, context %d, %d "
                         "replayed, ld %d)", CKV_CUDA_BACKEND_NAME, op, z ? z->sink : 0, z ? z->start : 0,
                         z ? z->end : 0, z ? z->ctx : 0, z ? z->n_q : 0, ld);
    if ((z->hinv == NULL) != (z->vn == NULL))
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: %s: KVzip+ needs both the row norms and the value norms",
                         CKV_CUDA_BACKEND_NAME, op);
    const ckv_kv_batch *kv = z->kv;
    CKV_TRY(kv_dtype_check(kv->dtype, op));
    if (!window_covers(kv))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: %s: head_dim %d (16, 32, 64, 80, 96 or 128)",
                         CKV_CUDA_BACKEND_NAME, op, kv->head_dim);
    const int lo[3] = {0, z->start, z->ctx}, hi[3] = {z->sink, z->end, z->ctx + z->n_q};
    const key_ranges kr = key_ranges_of(3, lo, hi);
    float2 *stats = NULL; /* [n_heads_local, n_q] */
    CKV_TRY(window_stats_ranges(c, &stats, &kr, z->q, z->n_q, z->ctx, kv, z->n_heads_local, z->head0, z->group,
                                z->scale, 1, op));
    win_dispatch<kvzip_colmax_f>(kv, c, out, ld, (const float2 *)stats, z);
    return op_status(c, op);
}

} // namespace CKV_CUDA_NS
