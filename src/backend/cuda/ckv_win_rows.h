/* ckv_win_rows.h - the query side of the eviction ops' tensor-core score kernels, shared by the
 * window scores (cuda_evict_window.cu) and KVzip's maxima (cuda_evict_kvzip.cu): which local query
 * heads and rows of a KV head's GQA group a warp takes (win_rows), loading them as fa_q fragments,
 * the logit's scaling, the pass-2 skeleton (a staged key tile, its logits and the rows' softmax
 * statistics per 16-row slice, the columns combined over lanes and warps), and the dispatch over the
 * cache type and the head dims the kernels are compiled for (window_covers). The keys, tiles and mma are ckv_qk_tile.h's; what the kernels do
 * with the scores is theirs. */
#ifndef CKV_WIN_ROWS_H
#define CKV_WIN_ROWS_H

#include "ckv_qk_tile.h"

namespace CKV_CUDA_NS {
namespace {

/* The window rows of KV head g's local query heads [jlo, jhi): row R of the block's range is query
 * i = R % nq16 of head jlo + R / nq16 (nq16 = n_q rounded up to 16, so a warp's 16 rows are one
 * head's; rows i >= n_q are padding). */
struct win_rows {
    int jlo, jhi, nq16;
};

__device__ __forceinline__ win_rows win_rows_of(int g, int head0, int group, int n_heads_local, int n_q) {
    win_rows w;
    w.jlo = g * group - head0 > 0 ? g * group - head0 : 0;
    w.jhi = (g + 1) * group - head0 < n_heads_local ? (g + 1) * group - head0 : n_heads_local;
    w.nq16 = (n_q + 15) / 16 * 16;
    return w;
}

/* This lane's query rows (g, g + 8 of the warp's 16 at block row R0): the head, queries, and the
 * A-fragment source (fa_q) */
template <int HD>
__device__ __forceinline__ int win_load_q(fa_q<float, HD> &qf, int *i0, const float *q, int n_q, int n_heads_local,
                                          const win_rows &w, int R0, int lane) {
    const int j = w.jlo + R0 / w.nq16, i = R0 % w.nq16 + (lane >> 2);
    const float *r0 = q + ((size_t)i * n_heads_local + j) * HD;
    qf.load(r0, r0 + (size_t)8 * n_heads_local * HD, i < n_q, i + 8 < n_q, lane & 3);
    *i0 = i;
    return j;
}

/* logit as the op scales it (fp32) */
__device__ __forceinline__ float win_logit(float dot, float scale, int divide) { return divide ? dot / scale : dot * scale; }


/* One key tile of a pass-2 kernel: rows [kb, kb + BN) of src (rows past len: zeros) into ks by
 * cp.async, waited for and visible to the block. */
template <typename T, int HD>
__device__ __forceinline__ void win_stage_tile(typename fa_tile<T, HD>::elem *ks, const T *src, int kb, int len,
                                               int tid) {
    fa_load_tile<T, HD, fa_tile<T, HD>::KS>(ks, src, kb, len, tid);
    ckv_cp_async_commit();
    ckv_cp_async_wait<0>();
    __syncthreads();
}

/* The rows of the group w this warp takes (16 at a time, FA_BM apart) against the staged tile ks:
 * per slice, the tile's logits sc = Q K^T (unscaled) and the statistics st[h] = (m, 1 / l) of the
 * lane's rows i0 + 8 h (stats [n_heads_local, n_q]; zeros for padding rows), handed to
 * f(sc, st, i0, j) with j the slice's local query head. */
template <typename T, int HD, typename F>
__device__ __forceinline__ void win_tile_rows(const typename fa_tile<T, HD>::elem *ks, const float *q, int n_q,
                                              int n_heads_local, const win_rows &w, const float2 *stats, int warp,
                                              int lane, F f) {
    constexpr int BN = fa_tile<T, HD>::BN;
    const int rows = (w.jhi - w.jlo) * w.nq16;
    for (int R0 = warp * 16; R0 < rows; R0 += FA_BM) { /* warp-uniform */
        fa_q<float, HD> qf;
        int i0;
        const int j = win_load_q<HD>(qf, &i0, q, n_q, n_heads_local, w, R0, lane);
        float sc[BN / 8][4];
CKV_UNROLL
        for (int nt = 0; nt < BN / 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
        fa_scores<HD>(sc, qf, ks, lane);
        float2 st[2];
CKV_UNROLL
        for (int h = 0; h < 2; h++) {
            const int i = i0 + 8 * h;
            st[h] = i < n_q ? stats[(size_t)j * n_q + i] : make_float2(0.0f, 0.0f);
        }
        f(sc, st, i0, j);
    }
}

/* Each column's lane values acc[nt][e] (column nt * 8 + 2 tq + e) combined over the 8 lane groups
 * by a fixed butterfly (xor 4, 8, 16: v = op(v, other)) into red[warp][column]; then a barrier. */
template <int BN, typename V, typename Op>
__device__ __forceinline__ void win_cols_reduce(V (*acc)[2], V (*red)[BN], int warp, int lane, Op op) {
    const int tq = lane & 3;
CKV_UNROLL
    for (int nt = 0; nt < BN / 8; nt++)
CKV_UNROLL
        for (int e = 0; e < 2; e++) {
            V v = acc[nt][e];
            for (int x = 4; x <= 16; x <<= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, x));
            if (lane < 4) red[warp][nt * 8 + 2 * tq + e] = v;
        }
    __syncthreads();
}

/* F<T, HD>::run(args...) for the cache's type and head dim (window_covers said it is one of them). */
template <template <typename, int> class F, typename... A> void win_dispatch(const ckv_kv_batch *kv, A... args) {
    const bool bf = kv->dtype == CKV_DTYPE_BF16;
    switch (kv->head_dim) {
    case 16: bf ? F<ckv_bf16, 16>::run(args...) : F<float, 16>::run(args...); break;
    case 32: bf ? F<ckv_bf16, 32>::run(args...) : F<float, 32>::run(args...); break;
    case 64: bf ? F<ckv_bf16, 64>::run(args...) : F<float, 64>::run(args...); break;
    case 80: bf ? F<ckv_bf16, 80>::run(args...) : F<float, 80>::run(args...); break;
    case 96: bf ? F<ckv_bf16, 96>::run(args...) : F<float, 96>::run(args...); break;
    default: bf ? F<ckv_bf16, 128>::run(args...) : F<float, 128>::run(args...); break;
    }
}

} // namespace
} // namespace CKV_CUDA_NS

#endif
