/* ckv_qk_tile.h - the S = Q K^T tile of the CUDA backend's tensor-core kernels, shared by prefill
 * attention (cuda_attention.cu) and the window scores of the eviction ops (cuda_evict_window.cu):
 * the key tile's shape and shared layout per cache type (fa_tile), its 16-byte cp.async load
 * (fa_load_tile, FA_THREADS threads), a warp's 16 fp32 query rows as A fragments (fa_q: bf16 for a
 * bf16 cache, the three-term split per k-step for an f32 cache) and the tile's scores on tensor
 * cores (fa_scores; layouts docs/gpu.md §1, the split §3a). The softmax, masking and what is done
 * with the scores are the kernels'. */
#ifndef CKV_QK_TILE_H
#define CKV_QK_TILE_H

#include "backend/gpu_workspace.h" /* the prefill tile's rows, blocks per SM, largest head dim */
#include "ckv_async.h"
#include "ckv_mma.h"

namespace CKV_CUDA_NS {
namespace {

constexpr int FA_BM = CKV_GPU_PREFILL_ROWS; /* query rows per block: 4 warps x 16 */
constexpr int FA_THREADS = 128;
constexpr int FA_BLOCKS_PER_SM = CKV_GPU_PREFILL_BLOCKS_PER_SM; /* the launch bounds (sass_expect.txt) */
constexpr int FA_HD_MAX = CKV_GPU_PREFILL_HD_MAX;               /* the largest head dim with a tile */
static_assert(FA_BM == 4 * 16, "a block's 4 warps hold 16 query rows each");

template <typename T, int HD> struct fa_tile;
template <int HD> struct fa_tile<ckv_bf16, HD> {
    typedef uint16_t elem;                                    /* bf16 bits */
    static constexpr int BN = 64;                             /* keys per tile */
    static constexpr int KS = ((HD / 8) | 1) * 8, VS = KS;    /* row strides in values (odd chunks) */
};
template <int HD> struct fa_tile<float, HD> {
    typedef float elem;
    static constexpr int BN = 32;
    static constexpr int KS = HD + 8, VS = HD + 4;
};

/* Rows [kb, kb + BN) of a [len, HD] segment into a tile of row stride RS values by 16-byte cp.async
 * (rows past len: zeros, nothing read). */
template <typename T, int HD, int RS>
__device__ __forceinline__ void fa_load_tile(typename fa_tile<T, HD>::elem *tile, const T *src, int kb, int len,
                                             int tid) {
    constexpr int BN = fa_tile<T, HD>::BN, EC = 16 / (int)sizeof(T), CH = HD / EC; /* values, chunks per row */
    static_assert(BN * CH % FA_THREADS == 0, "whole chunks per thread");
CKV_UNROLL
    for (int i = 0; i < BN * CH / FA_THREADS; i++) {
        const int e = tid + i * FA_THREADS, r = e / CH, c = e % CH;
        const bool valid = kb + r < len;
        ckv_cp_async<16>(tile + r * RS + c * EC, src + (valid ? (size_t)(kb + r) * HD + (size_t)(c * EC) : 0), valid);
    }
}

/* This lane's Q: the A fragments of rows g, g + 8, one per k-step of 16 dims (a0 (g, 2t..), a1
 * (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..)), from 8-byte loads of the fp32 rows. A bf16 cache
 * keeps them in registers as bf16 for the whole key loop; an f32 cache reads them again per tile
 * (L1 hits: the block's 64 rows) and splits them there, since 64 more live registers beside the
 * accumulator spill at head dim 128. */
__device__ __forceinline__ float2 fa_q_pair(const float *row, bool ok, int d) {
    return ok ? *(const float2 *)(row + d) : make_float2(0.0f, 0.0f);
}
template <typename T, int HD> struct fa_q;
template <int HD> struct fa_q<ckv_bf16, HD> {
    uint32_t a[HD / 16][4];
    __device__ __forceinline__ void load(const float *q0, const float *q1, bool ok0, bool ok1, int tq) {
CKV_UNROLL
        for (int kk = 0; kk < HD / 16; kk++) {
            const int d = kk * 16 + 2 * tq;
            const float2 x0 = fa_q_pair(q0, ok0, d), x1 = fa_q_pair(q1, ok1, d);
            const float2 x2 = fa_q_pair(q0, ok0, d + 8), x3 = fa_q_pair(q1, ok1, d + 8);
            a[kk][0] = ckv_pack_bf16x2(x0.x, x0.y), a[kk][1] = ckv_pack_bf16x2(x1.x, x1.y);
            a[kk][2] = ckv_pack_bf16x2(x2.x, x2.y), a[kk][3] = ckv_pack_bf16x2(x3.x, x3.y);
        }
    }
};
template <int HD> struct fa_q<float, HD> {
    const float *q0, *q1;
    bool ok0, ok1;
    int tq;
    __device__ __forceinline__ void load(const float *r0, const float *r1, bool o0, bool o1, int t) {
        q0 = r0, q1 = r1, ok0 = o0, ok1 = o1, tq = t;
    }
    /* the three-term split of k-step kk's fragment: a[term][register] */
    __device__ __forceinline__ void split(int kk, uint32_t a[3][4]) const {
        const int d = kk * 16 + 2 * tq;
        const float2 x[4] = {fa_q_pair(q0, ok0, d), fa_q_pair(q1, ok1, d), fa_q_pair(q0, ok0, d + 8),
                             fa_q_pair(q1, ok1, d + 8)};
CKV_UNROLL
        for (int i = 0; i < 4; i++) {
            uint32_t t[3];
            ckv_split_bf16x2(x[i].x, x[i].y, t);
            a[0][i] = t[0], a[1][i] = t[1], a[2][i] = t[2];
        }
    }
};

/* d += x y from the three-term splits of x (A) and y (B): the six products of terms i + j <= 2,
 * smallest first. */
__device__ __forceinline__ void fa_mma_split(float d[4], const uint32_t a[3][4], const uint32_t b[3][2]) {
    ckv_mma_bf16_16816(d, a[2], b[0], d);
    ckv_mma_bf16_16816(d, a[0], b[2], d);
    ckv_mma_bf16_16816(d, a[1], b[1], d);
    ckv_mma_bf16_16816(d, a[1], b[0], d);
    ckv_mma_bf16_16816(d, a[0], b[1], d);
    ckv_mma_bf16_16816(d, a[0], b[0], d);
}

/* S = Q K^T over the tile (sc zeroed by the caller). bf16: B (k = dim, n = key) from K rows; x4
 * matrices (keys +0-7, dims +0-7), (+0-7, +8-15), (+8-15, +0-7), (+8-15, +8-15) give b0, b1 of key
 * tiles 2p and 2p + 1 (lane l gives row l & 7 of matrix l >> 3). */
template <int HD>
__device__ __forceinline__ void fa_scores(float (*sc)[4], const fa_q<ckv_bf16, HD> &qf, const uint16_t *ks, int lane) {
    constexpr int BN = fa_tile<ckv_bf16, HD>::BN, RS = fa_tile<ckv_bf16, HD>::KS;
    const int lm = lane >> 3, lr = lane & 7;
CKV_UNROLL
    for (int kk = 0; kk < HD / 16; kk++)
CKV_UNROLL
        for (int p = 0; p < BN / 16; p++) {
            uint32_t b[4];
            ckv_ldmatrix_x4(b, ks + (p * 16 + (lm >> 1) * 8 + lr) * RS + kk * 16 + (lm & 1) * 8);
            ckv_mma_bf16_16816(sc[2 * p], qf.a[kk], b, sc[2 * p]);
            ckv_mma_bf16_16816(sc[2 * p + 1], qf.a[kk], b + 2, sc[2 * p + 1]);
        }
}
/* fp32 queries against a bf16 tile (the eviction ops' window scores, whose parity needs fp32-class
 * logits): A as fa_q<float>'s three-term split, B exact bf16 from ldmatrix as above; the three mma
 * of the terms per product, smallest first. */
template <int HD>
__device__ __forceinline__ void fa_scores(float (*sc)[4], const fa_q<float, HD> &qf, const uint16_t *ks, int lane) {
    constexpr int BN = fa_tile<ckv_bf16, HD>::BN, RS = fa_tile<ckv_bf16, HD>::KS;
    const int lm = lane >> 3, lr = lane & 7;
CKV_UNROLL
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t a[3][4];
        qf.split(kk, a);
CKV_UNROLL
        for (int p = 0; p < BN / 16; p++) {
            uint32_t b[4];
            ckv_ldmatrix_x4(b, ks + (p * 16 + (lm >> 1) * 8 + lr) * RS + kk * 16 + (lm & 1) * 8);
CKV_UNROLL
            for (int h = 0; h < 2; h++)
CKV_UNROLL
                for (int term = 2; term >= 0; term--) ckv_mma_bf16_16816(sc[2 * p + h], a[term], b + 2 * h, sc[2 * p + h]);
        }
    }
}
/* f32: b0 = K[key g][dims 2t, 2t+1], b1 = K[g][2t+8, 2t+9] of key tile nt (8-byte loads). */
template <int HD>
__device__ __forceinline__ void fa_scores(float (*sc)[4], const fa_q<float, HD> &qf, const float *ks, int lane) {
    constexpr int BN = fa_tile<float, HD>::BN, RS = fa_tile<float, HD>::KS;
    const int gq = lane >> 2, tq = lane & 3;
CKV_UNROLL
    for (int kk = 0; kk < HD / 16; kk++) {
        uint32_t a[3][4], t[3];
        qf.split(kk, a);
CKV_UNROLL
        for (int nt = 0; nt < BN / 8; nt++) {
            const float *kr = ks + (nt * 8 + gq) * RS + kk * 16 + 2 * tq;
            const float2 k0 = *(const float2 *)kr, k1 = *(const float2 *)(kr + 8);
            uint32_t b[3][2], u[3];
            ckv_split_bf16x2(k0.x, k0.y, t);
            ckv_split_bf16x2(k1.x, k1.y, u);
            b[0][0] = t[0], b[1][0] = t[1], b[2][0] = t[2], b[0][1] = u[0], b[1][1] = u[1], b[2][1] = u[2];
            fa_mma_split(sc[nt], a, b);
        }
    }
}

} // namespace
} // namespace CKV_CUDA_NS

#endif
