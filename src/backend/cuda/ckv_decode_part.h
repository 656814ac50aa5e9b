/* ckv_decode_part.h - the end of a split-KV decode block (docs/gpu.md §4), shared by the FMA decode
 * kernel (cuda_decode.cu) and the tensor-core one (cuda_decode_mma.cu): each warp has left its
 * softmax state per query row in shared memory (o unnormalised, m in base 2, l), and the block
 * merges its warps into the split's partial row (o, m, l) that the merge kernel reads; and what a
 * block reads (dk_split_of). The key loops, the split plan and the merge are the kernels' files. */
#ifndef CKV_DECODE_PART_H
#define CKV_DECODE_PART_H

#include "cuda_internal.h"

namespace CKV_CUDA_NS {
namespace {

constexpr float LOG2E = 1.44269504088896341f; /* the decode kernels' scores are in base 2 */

/* What block (sp, g, s) of a split-KV decode launch reads: segment (s, g)'s K, V and positions, its
 * keys [k0, k1) (split sp of `chunk` keys), and the segment's query rows (tokens from tok0, times
 * the group). */
struct dk_split {
    const void *k, *v;
    const int32_t *pos;
    int tok0, rows, k0, k1;
};

/* A pointer field at p (device memory: a segment's k, v or pos, the batch's per-sequence table) by
 * a read-only load: read through a generic load, the K/V and position loads through it would be
 * generic too. */
template <typename F> __device__ __forceinline__ F *seg_ptr(F *const *p) {
    return (F *)(uintptr_t)__ldg((const unsigned long long *)p);
}

__device__ __forceinline__ dk_split dk_split_of(const ckv_kv_batch &kv, int n, int n_heads, int chunk) {
    const int sp = (int)blockIdx.x, g = (int)blockIdx.y, s = (int)blockIdx.z;
    dk_split d;
    int ntok;
    seq_rows(kv, s, n, &d.tok0, &ntok);
    const ckv_kv_seg *seg = seg_ptr(&kv.segs[s]) + g;
    d.k = seg_ptr(&seg->k), d.v = seg_ptr(&seg->v), d.pos = seg_ptr(&seg->pos);
    const int len = __ldg(&seg->len);
    d.k0 = sp * chunk, d.k1 = d.k0 + chunk < len ? d.k0 + chunk : len;
    d.rows = ntok * (n_heads / kv.n_kv_heads);
    return d;
}

/* Block of NT threads; rows [rb, rb + nr) of the segment (s's tokens from tok0, KV head g): row r
 * is token tok0 + r / group, head g * group + r % group. wo [NW][RP][OS] the warps' o (read only
 * where that warp's m is finite), wm, wl [NW][RP]. part [R, n_splits, hd + 2], R = token x n_heads +
 * head. Every thread calls it (after the barrier that publishes wo, wm, wl). */
template <int NT, int NW, int RP, int OS>
__device__ __forceinline__ void dk_block_partial(float *part, const float *wo, const float *wm, const float *wl,
                                                 int rb, int nr, int hd, int tok0, int group, int g, int n_heads,
                                                 int n_splits, int sp) {
    for (int e = (int)threadIdx.x; e < nr * hd; e += NT) {
        const int r = e / hd, d = e % hd, row = rb + r;
        float M = -INFINITY;
        for (int w = 0; w < NW; w++) M = fmaxf(M, wm[w * RP + r]);
        float L = 0.0f, O = 0.0f;
        for (int w = 0; w < NW; w++) {
            const float mw = wm[w * RP + r];
            if (mw == -INFINITY) continue; /* that warp saw nothing: its o was never written */
            const float a = exp2f(mw - M);
            L += a * wl[w * RP + r];
            O += a * wo[(w * RP + r) * OS + d];
        }
        const size_t R = (size_t)(tok0 + row / group) * (size_t)n_heads + (size_t)(g * group + row % group);
        float *pr = part + (R * (size_t)n_splits + (size_t)sp) * (size_t)(hd + 2);
        pr[d] = O;
        if (d == 0) pr[hd] = M, pr[hd + 1] = L;
    }
}

} // namespace
} // namespace CKV_CUDA_NS

#endif
