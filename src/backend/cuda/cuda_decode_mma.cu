/* cuda_decode_mma.cu - the split-KV decode kernel on tensor cores (docs/gpu.md §4) for bf16 caches
 * at head dims 64, 80, 96 and 128 when a (sequence, KV head) segment has 4-8 query rows (GQA groups
 * of 4-8, the GQA heads of a sequence's decode token), where the FMA kernel of cuda_decode.cu is
 * bound by its instruction issue rate rather than by HBM (docs/benchmarks.md). Same split plan,
 * partial format (o unnormalised, m in base 2, l) and merge as the FMA kernel, so which kernel ran
 * does not show outside it. A block takes one split of one segment: K and V tiles of 64 keys by
 * 16-byte cp.async into the prefill kernel's padded shared layout (ckv_qk_tile.h), each warp 16
 * keys of a tile: S^T = K Q^T by mma.sync m16n8k16 with the 8 query rows as n (K by ldmatrix; the
 * fp32 queries pre-scaled by scale log2 e, split into three bf16 terms held in shared memory and read
 * by ldmatrix per tile, as registers they spill at head dim 128; rows past the segment's repeat its
 * first and are not written), masked by the keys'
 * stored positions, online softmax per row in base 2 (max over the row's 8 lanes by shuffles), then
 * O^T += V^T P^T (V by ldmatrix.trans, the weights moved into the B layout by shuffles and split
 * into three bf16 terms). The warps' states are merged through shared memory into the block's
 * partial (ckv_decode_part.h). The routing is attention_split's (cuda_decode.cu); the plan and the
 * merge kernel live there too. */
#include <limits.h>
#include <math.h>

#include "ckv_decode_part.h"
#include "ckv_qk_tile.h"
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr int DM_THREADS = 128;
constexpr int DM_WARPS = DM_THREADS / 32;
constexpr int DM_RP = DECODE_MMA_ROWS; /* query rows per pass: the mma's n */
/* Resident blocks per SM planned for (sass_expect.txt): 4 (128 registers, no spill); 3 at head dim
 * 128, whose 41 KiB of shared memory (K and V tiles, the query terms) fit 3 times in an A100's 164 KiB. */
template <int HD> constexpr int dm_blocks_per_sm() { return HD >= 128 ? 3 : 4; }

/* This lane's B fragment of an fp32 pair (k = 2i, 2i + 1 in the low, high half) as three bf16 terms:
 * b[term][reg]. */
__device__ __forceinline__ void dm_split_pair(uint32_t b[3][2], int reg, float x0, float x1) {
    uint32_t t[3];
    ckv_split_bf16x2(x0, x1, t);
    b[0][reg] = t[0], b[1][reg] = t[1], b[2][reg] = t[2];
}

/* d += a b over b's three terms, smallest first. */
__device__ __forceinline__ void dm_mma3(float d[4], const uint32_t a[4], const uint32_t b[3][2]) {
CKV_UNROLL
    for (int term = 2; term >= 0; term--) ckv_mma_bf16_16816(d, a, b[term], d);
}

/* grid (n_splits, n_kv_heads, n_seq), DM_THREADS. Block (sp, g, s): keys [sp * chunk, +chunk) of
 * segment (s, g) for every query row reading it, DM_RP rows per pass (row r: token tok0 + r / group,
 * head g * group + r % group). With gq = lane >> 2, tq = lane & 3, a lane holds the scores and
 * outputs of rows 2 tq, 2 tq + 1: S^T's keys gq, gq + 8 of its warp's 16, O^T's dims gq, gq + 8 of
 * each 16. Partial: part[(R * n_splits + sp) * (HD + 2)], as the FMA kernel's. */
template <int HD>
__global__ void __launch_bounds__(DM_THREADS, (dm_blocks_per_sm<HD>()))
decode_mma_kernel(float *part, const float *q, const int32_t *qpos, ckv_kv_batch kv, int n, int n_heads,
                  float scale_log2, int n_splits, int chunk) {
    typedef fa_tile<ckv_bf16, HD> tile_t;
    constexpr int BN = tile_t::BN, KS = tile_t::KS, KT = HD / 16;
    static_assert(BN == DM_WARPS * 16, "16 keys of a tile per warp");
    constexpr int TILE_B = BN * KS * 2, WO_B = DM_WARPS * DM_RP * HD * 4; /* bytes of a tile, of wo */
    constexpr int SM_B = 2 * TILE_B > WO_B ? 2 * TILE_B : WO_B;
    __shared__ float4 sm[SM_B / 16]; // K [BN][KS] and V [BN][KS] bf16 tiles; after the key loop wo [warp][row][HD]
    __shared__ float4 qsm[3 * DM_RP * KS * 2 / 16]; // [term][row][KS] bf16: the queries' three terms
    __shared__ float wm[DM_WARPS * DM_RP], wl[DM_WARPS * DM_RP]; /* [warp][row] its m (base 2) and l */
    uint16_t *const ks = (uint16_t *)sm, *const vs = ks + BN * KS;
    float *const wo = (float *)sm;
    uint16_t *const qs = (uint16_t *)qsm;

    const int sp = (int)blockIdx.x, g = (int)blockIdx.y, tid = (int)threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3, lm = lane >> 3, lr = lane & 7;
    const int group = n_heads / kv.n_kv_heads;
    const dk_split at = dk_split_of(kv, n, n_heads, chunk);
    const ckv_bf16 *K = (const ckv_bf16 *)at.k, *V = (const ckv_bf16 *)at.v;
    const int32_t *pos = at.pos;
    const int tok0 = at.tok0, k0 = at.k0, k1 = at.k1, rows = at.rows;
    /* this lane's shared rows for ldmatrix: K as A (keys +0-7, +8-15 by lm & 1; dims +0, +8 by lm >> 1),
     * V as A of V^T by .trans (keys by lm >> 1, dims by lm & 1) */
    const uint16_t *ka = ks + (warp * 16 + (lm & 1) * 8 + lr) * KS + (lm >> 1) * 8;
    const uint16_t *va = vs + (warp * 16 + (lm >> 1) * 8 + lr) * KS + (lm & 1) * 8;
    /* and Q^T's terms as B (row lr, dims +0, +8 by lm & 1): terms 2, 1 by lm >> 1 (x4), term 0 (x2: lanes 0-15) */
    const uint16_t *qa = qs + ((2 - (lm >> 1)) * DM_RP + lr) * KS + (lm & 1) * 8;
    const uint16_t *q0a = qs + lr * KS + (lm & 1) * 8;
    /* the P^T fragment's sources: keys 2 tq (lane A) and 2 tq + 1 (lane B), rows gq & ~1, +1 */
    const int src_a = 8 * tq + (gq >> 1), src_b = src_a + 4;
    const bool odd = gq & 1;

    for (int rb = 0; rb < rows; rb += DM_RP) { /* uniform */
        const int nr = rows - rb < DM_RP ? rows - rb : DM_RP;
        /* Q^T's three bf16 terms, pre-scaled, into qs [term][row][dims] (published by the key loop's
         * first barrier; the previous pass ended with one). Rows of the pass past the segment's take
         * its first row's query and position: computed like the others, never written out, and every
         * lane makes the same loads (no lane-dependent access counts). */
        for (int e = tid; e < DM_RP * HD / 2; e += DM_THREADS) {
            const int r = e / (HD / 2), d = 2 * (e % (HD / 2)), row = rb + (r < nr ? r : 0);
            const size_t R = (size_t)(tok0 + row / group) * (size_t)n_heads + (size_t)(g * group + row % group);
            const float2 x = __ldg((const float2 *)(q + R * (size_t)HD + (size_t)d));
            uint32_t t[3];
            ckv_split_bf16x2(x.x * scale_log2, x.y * scale_log2, t);
CKV_UNROLL
            for (int term = 0; term < 3; term++) *(uint32_t *)(qs + (term * DM_RP + r) * KS + d) = t[term];
        }
        int32_t qp[2]; /* the query positions of rows 2 tq, 2 tq + 1 */
        float m[2], l[2], o[KT][4];
CKV_UNROLL
        for (int j = 0; j < 2; j++) {
            const int r = 2 * tq + j;
            qp[j] = __ldg(qpos + tok0 + (rb + (r < nr ? r : 0)) / group);
            m[j] = -INFINITY, l[j] = 0.0f;
        }
CKV_UNROLL
        for (int dt = 0; dt < KT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.0f;

        for (int kb = k0; kb < k1; kb += BN) { /* uniform over the block */
            fa_load_tile<ckv_bf16, HD, KS>(ks, K, kb, k1, tid);
            fa_load_tile<ckv_bf16, HD, KS>(vs, V, kb, k1, tid);
            ckv_cp_async_commit();
            const int key = kb + warp * 16 + gq;
            const int32_t kp0 = key < k1 ? __ldg(pos + key) : INT_MAX, kp1 = key + 8 < k1 ? __ldg(pos + key + 8) : INT_MAX;
            ckv_cp_async_wait<0>();
            __syncthreads();
            float sc[4] = {0.0f, 0.0f, 0.0f, 0.0f}; /* S^T: (key gq, row 2 tq), (gq, 2 tq + 1), (gq + 8, ..) */
CKV_UNROLL
            for (int kk = 0; kk < KT; kk++) {
                uint32_t a[4], b[3][2], b21[4];
                ckv_ldmatrix_x4(a, ka + kk * 16);
                ckv_ldmatrix_x4(b21, qa + kk * 16); /* terms 2 and 1: b0, b1 each */
                ckv_ldmatrix<2, false>(b[0], q0a + kk * 16);
                b[2][0] = b21[0], b[2][1] = b21[1], b[1][0] = b21[2], b[1][1] = b21[3];
                dm_mma3(sc, a, b);
            }
            float p[4];
CKV_UNROLL
            for (int j = 0; j < 2; j++) { /* row 2 tq + j: its 16 keys are on the 8 lanes of this tq */
                const float s0 = kp0 <= qp[j] ? sc[j] : -INFINITY, s1 = kp1 <= qp[j] ? sc[2 + j] : -INFINITY;
                float bm = fmaxf(s0, s1);
                for (int off = 4; off < 32; off <<= 1) bm = fmaxf(bm, __shfl_xor_sync(0xffffffffu, bm, off));
                const float M = fmaxf(m[j], bm);
                const float a = m[j] == -INFINITY ? 0.0f : exp2f(m[j] - M);
                p[j] = s0 == -INFINITY ? 0.0f : exp2f(s0 - M);
                p[2 + j] = s1 == -INFINITY ? 0.0f : exp2f(s1 - M);
                l[j] = a * l[j] + (p[j] + p[2 + j]); /* this lane's keys; the row's lanes summed at the end */
                m[j] = M;
CKV_UNROLL
                for (int dt = 0; dt < KT; dt++) o[dt][j] *= a, o[dt][2 + j] *= a;
            }
            /* P^T as B (k = key, n = row): b0 = P[keys 2 tq, 2 tq + 1][row gq], b1 = keys + 8 */
            float x[4], y[4];
CKV_UNROLL
            for (int i = 0; i < 4; i++) {
                x[i] = __shfl_sync(0xffffffffu, p[i], src_a);
                y[i] = __shfl_sync(0xffffffffu, p[i], src_b);
            }
            uint32_t pb[3][2];
            dm_split_pair(pb, 0, odd ? x[1] : x[0], odd ? y[1] : y[0]);
            dm_split_pair(pb, 1, odd ? x[3] : x[2], odd ? y[3] : y[2]);
CKV_UNROLL
            for (int dt = 0; dt < KT; dt++) {
                uint32_t a[4];
                ckv_ldmatrix_x4_trans(a, va + dt * 16);
                dm_mma3(o[dt], a, pb);
            }
            __syncthreads(); /* every warp is done with the tiles before the next loads */
        }
        /* the row's 8 lanes' sums; the warp's state into shared memory (over the tiles: none pending) */
CKV_UNROLL
        for (int j = 0; j < 2; j++) {
            for (int off = 4; off < 32; off <<= 1) l[j] += __shfl_xor_sync(0xffffffffu, l[j], off);
            const int r = 2 * tq + j; /* every row of the pass (those past nr are not read) */
            float *dst = wo + (warp * DM_RP + r) * HD + gq;
CKV_UNROLL
            for (int dt = 0; dt < KT; dt++) dst[dt * 16] = o[dt][j], dst[dt * 16 + 8] = o[dt][2 + j];
            if (gq == 0) wm[warp * DM_RP + r] = m[j], wl[warp * DM_RP + r] = l[j];
        }
        __syncthreads();
        dk_block_partial<DM_THREADS, DM_WARPS, DM_RP, HD>(part, wo, wm, wl, rb, nr, HD, tok0, group, g, n_heads,
                                                         n_splits, sp);
        __syncthreads(); /* wo (the tiles), wm, wl are refilled by the next pass */
    }
}

template <int HD>
void launch_hd(ctx *c, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n, int n_heads,
               float scale) {
    int n_splits, chunk; /* split boundaries on whole tiles */
    if (!decode_split_plan(c, kv, n, n_heads, dm_blocks_per_sm<HD>(), fa_tile<ckv_bf16, HD>::BN, &n_splits, &chunk)) return;
    CKV_LAUNCH((decode_mma_kernel<HD>), dim3((unsigned)n_splits, (unsigned)kv->n_kv_heads, (unsigned)kv->n_seq),
               dim3(DM_THREADS), 0, c->stream, c->part, q, qpos, *kv, n, n_heads, scale * LOG2E, n_splits, chunk);
    launch_merge(c, out, c->part, n * n_heads, n_splits, HD);
}

} // namespace

bool decode_mma_fits(const ckv_kv_batch *kv, int rows) {
    const int hd = kv->head_dim;
    return kv->dtype == CKV_DTYPE_BF16 && rows >= 4 && rows <= DECODE_MMA_ROWS &&
           (hd == 64 || hd == 80 || hd == 96 || hd == 128);
}

void launch_decode_mma(ctx *c, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                       int n_heads, float scale) {
    switch (kv->head_dim) {
    case 64: launch_hd<64>(c, out, q, qpos, kv, n, n_heads, scale); break;
    case 80: launch_hd<80>(c, out, q, qpos, kv, n, n_heads, scale); break;
    case 96: launch_hd<96>(c, out, q, qpos, kv, n, n_heads, scale); break;
    default: launch_hd<128>(c, out, q, qpos, kv, n, n_heads, scale); break; /* decode_mma_fits: 128 */
    }
}

} // namespace CKV_CUDA_NS
