/* cuda_attention.cu - causal attention of a batch of query tokens over the KV segments of one layer
 * (backend.h: query head h of token t reads KV head h / (n_heads / n_kv_heads) of its sequence and
 * sees the rows whose original pos <= qpos[t]; a row that sees nothing is 0). Two kernels:
 *  - prefill: a FlashAttention-2 style tiled kernel (docs/gpu.md §3): a block takes 128 or 64 query
 *    rows of one head (16 per warp, chosen at launch), K/V tiles stream through two stages of shared
 *    memory by cp.async (ckv_async.h),
 *    S = Q K^T and O += P V run on tensor cores through the one mma wrapper (ckv_mma.h; layouts
 *    docs/gpu.md §1), online softmax in fp32 and base 2 on the accumulator fragments, masking by
 *    comparing stored positions (so compacted caches stay causal), and the key loop ends at the last
 *    tile a row of the block sees. Head dims 16, 32, 64, 80, 96, 128; bf16 caches (q and the softmax
 *    weights rounded to bf16, fragments by ldmatrix) and f32 caches (every fp32 operand split into
 *    three bf16 terms: fp32-class products, as the parity studies' fp32 attention needs).
 *    Split-K (docs/gpu.md §3b): when the blocks fill less than a wave of the SMs, each block's keys
 *    are cut into splits (cuda_prefill_split.cu plans them) that write unnormalised partials, which
 *    the split-KV merge of cuda_decode.cu combines.
 *  - everything else (decode steps, other head dims up to 256): the split-KV kernels of
 *    cuda_decode.cu.
 * fp32 softmax and accumulation. The cache is not written here (cuda_kv.cu). */
#include <limits.h>

#include "ckv_qk_tile.h" /* FA_BM, FA_THREADS, fa_tile, fa_load_tile, fa_q, fa_scores */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

/* threadIdx.x read again (volatile on the GPU: not merged with an earlier read), so that values
 * derived from it are recomputed after the tile loop instead of held, or spilled, across it. */
__device__ __forceinline__ int tid_reread() {
#if defined(CKV_CUDA_EMU)
    return (int)threadIdx.x;
#else
    unsigned t;
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
    return (int)t;
#endif
}

/* ---- prefill: flash attention on tensor cores ------------------------------------------------
 * grid (ceil(n / BM), n_heads, n_seq x splits: z = sequence x splits + split, §3b), block 2 BM
 * threads (BM = 128: 8 warps, bf16 caches at head dims 64-128 unless that grid leaves SMs idle or
 * split-K runs, launch_flash_hd; else BM = 64: 4 warps); the row
 * blocks run last first (the causal ones with the most keys start first). Lane (g = lane >> 2,
 * t = lane & 3) of warp w owns query rows g and g + 8 of the warp's 16 (the C-fragment rows,
 * docs/gpu.md §1).
 * One kernel for both cache types; what differs is in fa_tile (tile shape and shared layout) and in
 * the fragment functions below (fa_q, fa_scores, fa_pv):
 *  - bf16 caches: tiles of 64 keys as bf16 rows of HD values, each row padded to an odd number of
 *    16-byte chunks, so the 8 rows of an ldmatrix phase (and the 8 lanes of a 16-byte cp.async
 *    phase) fall in 8 distinct groups of 4 banks: conflict-free for every head dim, 80 and 96
 *    included (an XOR swizzle needs a power-of-two chunk count). K fragments from ldmatrix, V
 *    fragments from ldmatrix.trans; q and the softmax weights rounded to bf16; one mma per product.
 *  - f32 caches (the parity studies' fp32 attention): tiles of 32 keys as fp32 rows; fragments
 *    from shared loads, each fp32 value split into three bf16 terms (ckv_split_bf16x2) and each product taken as the six mma of
 *    the terms that matter, smallest first: fp32-class accuracy on the bf16 tensor cores (the terms
 *    left out are about 2^-25 of a product; docs/gpu.md §3a). K rows are padded by 8 floats (the
 *    8-byte fragment loads of a half-warp hit 32 distinct banks), V rows by 4 (the 4-byte loads of
 *    rows 2t, 2t + 1 of a warp hit 32 distinct banks).
 * Pipeline (docs/gpu.md §3): two stages of (K, V, positions); tile j sits in stage j & 1. At the
 * top of tile j its copies are waited for and one barrier makes them visible and frees stage
 * (j + 1) & 1 (every warp is past tile j - 1); tile j + 1 is issued into it at once and lands while
 * S = Q K_j^T, the softmax and O += P V_j run, unless K_j's last position already reaches the
 * block's last query (causal tile skipping without loading the next tile). One barrier per tile.
 * Copies are 16-byte cp.async. */

/* O += P V: the C fragments of key tiles 2j, 2j+1 are the A fragment of key step j (rows g, g+8;
 * keys 2t.. and 2t+8..). bf16: B (k = key, n = dim) from V rows through ldmatrix.trans: matrices
 * (keys +0-7, dims +0-7), (+8-15, +0-7), (+0-7, +8-15), (+8-15, +8-15) give b0, b1 of dim tiles 2p
 * and 2p + 1. */
template <int HD>
__device__ __forceinline__ void fa_pv(float (*o)[4], float (*sc)[4], const uint16_t *vs, int lane) {
    constexpr int BN = fa_tile<ckv_bf16, HD>::BN, RS = fa_tile<ckv_bf16, HD>::VS;
    const int lm = lane >> 3, lr = lane & 7;
CKV_UNROLL
    for (int j = 0; j < BN / 16; j++) {
        const uint32_t a[4] = {ckv_pack_bf16x2(sc[2 * j][0], sc[2 * j][1]), ckv_pack_bf16x2(sc[2 * j][2], sc[2 * j][3]),
                               ckv_pack_bf16x2(sc[2 * j + 1][0], sc[2 * j + 1][1]),
                               ckv_pack_bf16x2(sc[2 * j + 1][2], sc[2 * j + 1][3])};
CKV_UNROLL
        for (int p = 0; p < HD / 16; p++) {
            uint32_t b[4];
            ckv_ldmatrix_x4_trans(b, vs + (j * 16 + (lm & 1) * 8 + lr) * RS + p * 16 + (lm >> 1) * 8);
            ckv_mma_bf16_16816(o[2 * p], a, b, o[2 * p]);
            ckv_mma_bf16_16816(o[2 * p + 1], a, b + 2, o[2 * p + 1]);
        }
    }
}
/* f32: b0 = (V[2t][dim g], V[2t+1][g]), b1 = (V[2t+8][g], V[2t+9][g]) of dim tile nd (4-byte loads). */
template <int HD>
__device__ __forceinline__ void fa_pv(float (*o)[4], float (*sc)[4], const float *vs, int lane) {
    constexpr int BN = fa_tile<float, HD>::BN, RS = fa_tile<float, HD>::VS;
    const int gq = lane >> 2, tq = lane & 3;
CKV_UNROLL
    for (int j = 0; j < BN / 16; j++) {
        uint32_t a[3][4], t[3], u[3];
CKV_UNROLL
        for (int i = 0; i < 4; i++) { /* a0 = (tile 2j: c0, c1), a1 = (2j: c2, c3), a2, a3 = tile 2j + 1 */
            const float *c = sc[2 * j + (i >> 1)] + (i & 1) * 2;
            ckv_split_bf16x2(c[0], c[1], t);
            a[0][i] = t[0], a[1][i] = t[1], a[2][i] = t[2];
        }
CKV_UNROLL
        for (int nd = 0; nd < HD / 8; nd++) {
            const float *vr = vs + (j * 16 + 2 * tq) * RS + nd * 8 + gq;
            uint32_t b[3][2];
            ckv_split_bf16x2(vr[0], vr[RS], t);
            ckv_split_bf16x2(vr[8 * RS], vr[9 * RS], u);
            b[0][0] = t[0], b[1][0] = t[1], b[2][0] = t[2], b[0][1] = u[0], b[1][1] = u[1], b[2][1] = u[2];
            fa_mma_split(o[nd], a, b);
        }
    }
}

/* The block's shared memory: two stages, each a K tile, a V tile and the tile's positions; tile j
 * lives in stage j & 1. 68.5 KiB at head dim 128 (bf16; 67.3 KiB f32): 2 blocks fit an SM of
 * sm_80 (164 KiB) and sm_90 (228 KiB), so the launch opts in to dynamic shared memory past 48 KiB. */
template <typename T, int HD> struct fa_stages {
    typedef fa_tile<T, HD> tile_t;
    static constexpr int STAGES = 2;
    static constexpr int KT = tile_t::BN * tile_t::KS, VT = tile_t::BN * tile_t::VS; /* values per tile */
    static constexpr size_t BYTES =
        (size_t)STAGES * ((size_t)(KT + VT) * sizeof(typename tile_t::elem) + (size_t)tile_t::BN * sizeof(int32_t));
};

/* Tile [kb, kb + BN) of K, V and the positions into one stage by 16-byte cp.async (4-byte for the
 * positions). 128 threads copy K and V each; 256 split them, warps 0-3 K and warps 4-7 V (warp-
 * uniform), so each thread issues the same copies as in a 128-thread block's K alone. */
template <typename T, int HD, int NT>
__device__ __forceinline__ void fa_load_stage(typename fa_tile<T, HD>::elem *ks, typename fa_tile<T, HD>::elem *vs,
                                              int32_t *kp, const T *K, const T *V, const int32_t *kpos, int kb,
                                              int len, int tid) {
    typedef fa_tile<T, HD> tile_t;
    static_assert(NT == FA_THREADS || NT == 2 * FA_THREADS, "a block of 4 or 8 warps");
    if (NT == FA_THREADS) {
        fa_load_tile<T, HD, tile_t::KS>(ks, K, kb, len, tid);
        fa_load_tile<T, HD, tile_t::VS>(vs, V, kb, len, tid);
    } else if (tid < FA_THREADS) {
        fa_load_tile<T, HD, tile_t::KS>(ks, K, kb, len, tid);
    } else {
        fa_load_tile<T, HD, tile_t::VS>(vs, V, kb, len, tid - FA_THREADS);
    }
    const int key = kb + tid;
    if (tid < tile_t::BN) ckv_cp_async<4>(kp + tid, kpos + (key < len ? key : 0), key < len);
}

/* Resident blocks per SM the instance is built for (its launch bounds): 4-warp blocks 2, 8-warp
 * blocks 1 (8 warps per SM either way; 255 registers a thread). */
constexpr int fa_blocks_per_sm(int bm) { return bm == FA_BM ? FA_BLOCKS_PER_SM : 1; }

template <typename T, int HD, int BM>
__global__ void __launch_bounds__(2 * BM, fa_blocks_per_sm(BM))
flash_kernel(float *out, const float *q, const int32_t *qpos, ckv_kv_batch kv, int n, int n_heads, float scale_log2,
             prefill_split sk) {
    typedef fa_tile<T, HD> tile_t;
    typedef fa_stages<T, HD> st_t;
    typedef typename tile_t::elem elem;
    constexpr int BN = tile_t::BN, NT = 2 * BM;
    CKV_SHARED_DYN(fa_smem, st_t::BYTES);
    elem *ks = (elem *)fa_smem;                            // [2][BN][KS] K tiles (HD used)
    elem *vs = ks + st_t::STAGES * st_t::KT;               // [2][BN][VS] V tiles
    int32_t *kp = (int32_t *)(vs + st_t::STAGES * st_t::VT); // [2][BN]   positions (0 past len: masked by index)

    const int s = (int)blockIdx.z / sk.n_splits, h = (int)blockIdx.y, m0 = ((int)gridDim.x - 1 - (int)blockIdx.x) * BM;
    int tok0, ntok;
    seq_rows(kv, s, n, &tok0, &ntok);
    if (m0 >= ntok) return; /* uniform over the block, before any barrier */
    const int group = n_heads / kv.n_kv_heads;
    const ckv_kv_seg *seg = &kv.segs[s][h / group];
    const T *K = (const T *)seg->k, *V = (const T *)seg->v;
    const int32_t *kpos = seg->pos;
    const int k0 = ((int)blockIdx.z % sk.n_splits) * sk.chunk; /* split-K (§3b): this block's keys [k0, len) */
    const int len = seg->len - k0 < sk.chunk ? seg->len : k0 + sk.chunk;
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31, gq = lane >> 2, tq = lane & 3;

    const int r0 = m0 + warp * 16 + gq, r1 = r0 + 8; /* this lane's rows within the sequence */
    const bool ok0 = r0 < ntok, ok1 = r1 < ntok;
    const int32_t qp0 = ok0 ? qpos[tok0 + r0] : INT_MIN, qp1 = ok1 ? qpos[tok0 + r1] : INT_MIN;
    const int last = (m0 + BM < ntok ? m0 + BM : ntok) - 1;
    const int32_t qmin = qpos[tok0 + m0], qmax = qpos[tok0 + last]; /* tokens ascend */
    const bool rows_full = last == m0 + BM - 1;                      /* every row of the block is a token */

    /* tile 0 of this block's keys goes first; Q is read meanwhile */
    if (k0 < len) fa_load_stage<T, HD, NT>(ks, vs, kp, K, V, kpos, k0, len, tid);
    ckv_cp_async_commit();

    const float *q0 = q + ((size_t)(tok0 + r0) * (size_t)n_heads + (size_t)h) * HD; // [HD] (row r0)
    const float *q1 = q0 + (size_t)8 * (size_t)n_heads * HD;                        // [HD] (row r1)
    fa_q<T, HD> qf;
    qf.load(q0, q1, ok0, ok1, tq);
    float o[HD / 8][4]; /* O accumulator: C fragments of the HD / 8 dim tiles */
CKV_UNROLL
    for (int nd = 0; nd < HD / 8; nd++) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.0f;
    float mx0 = -INFINITY, mx1 = -INFINITY; /* running row max of the raw scores (rows r0, r1) */
    float l0 = 0.0f, l1 = 0.0f;             /* this lane's part of the running row sums */

    for (int kb = k0, st = 0; kb < len; kb += BN, st ^= 1) {
        ckv_cp_async_wait<0>(); /* tile j, the one group in flight */
        __syncthreads();        /* tile j visible to every warp; every warp is done with tile j - 1 */
        const elem *kt = ks + st * st_t::KT, *vt = vs + st * st_t::VT;
        const int32_t *kpt = kp + st * BN;
        if (kpt[0] > qmax) break; /* uniform: no key from here on is visible to any row of the block */
        /* positions ascend strictly: once this tile reaches qmax, no later tile is visible (uniform) */
        const bool more = kb + BN < len && kpt[BN - 1] < qmax;
        if (more) /* tile j + 1 into the stage tile j - 1 left; it lands during this whole tile */
            fa_load_stage<T, HD, NT>(ks + (st ^ 1) * st_t::KT, vs + (st ^ 1) * st_t::VT, kp + (st ^ 1) * BN, K, V,
                                     kpos, kb + BN, len, tid);
        ckv_cp_async_commit();

        float sc[BN / 8][4]; /* S: C fragments of the BN / 8 key tiles */
CKV_UNROLL
        for (int nt = 0; nt < BN / 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
        fa_scores<HD>(sc, qf, kt, lane);
        /* causal mask (c0, c1: row g, keys 2t, 2t+1; c2, c3: row g + 8) unless every key of the
         * tile is visible to every row; row max over the row's 4 lanes (xor 1, 2) */
        const bool full = rows_full && kb + BN <= len && kpt[BN - 1] <= qmin; /* uniform */
        float bm0 = -INFINITY, bm1 = -INFINITY;
CKV_UNROLL
        for (int nt = 0; nt < BN / 8; nt++)
CKV_UNROLL
            for (int e = 0; e < 4; e++) {
                const int col = nt * 8 + 2 * tq + (e & 1);
                const float v = full || (kb + col < len && kpt[col] <= (e < 2 ? qp0 : qp1)) ? sc[nt][e] : -INFINITY;
                sc[nt][e] = v;
                if (e < 2)
                    bm0 = fmaxf(bm0, v);
                else
                    bm1 = fmaxf(bm1, v);
            }
        bm0 = fmaxf(bm0, __shfl_xor_sync(0xffffffffu, bm0, 1));
        bm0 = fmaxf(bm0, __shfl_xor_sync(0xffffffffu, bm0, 2));
        bm1 = fmaxf(bm1, __shfl_xor_sync(0xffffffffu, bm1, 1));
        bm1 = fmaxf(bm1, __shfl_xor_sync(0xffffffffu, bm1, 2));
        const float nm0 = fmaxf(mx0, bm0), nm1 = fmaxf(mx1, bm1);
        /* exp(scale (x - m)) = exp2(x scale log2(e) - m scale log2(e)): one FFMA and one EX2 per
         * weight; a row with nothing visible yet keeps 0 and rescales by 1 */
        const float c0 = nm0 == -INFINITY ? 1.0f : exp2f((mx0 - nm0) * scale_log2);
        const float c1 = nm1 == -INFINITY ? 1.0f : exp2f((mx1 - nm1) * scale_log2);
        const float ms0 = nm0 == -INFINITY ? 0.0f : nm0 * scale_log2, ms1 = nm1 == -INFINITY ? 0.0f : nm1 * scale_log2;
        mx0 = nm0, mx1 = nm1;
        l0 *= c0, l1 *= c1;
CKV_UNROLL
        for (int nd = 0; nd < HD / 8; nd++) o[nd][0] *= c0, o[nd][1] *= c0, o[nd][2] *= c1, o[nd][3] *= c1;
CKV_UNROLL
        for (int nt = 0; nt < BN / 8; nt++)
CKV_UNROLL
            for (int e = 0; e < 4; e++) {
                const float p = exp2f(fmaf(sc[nt][e], scale_log2, -(e < 2 ? ms0 : ms1))); /* -inf: 0 */
                sc[nt][e] = p;
                if (e < 2)
                    l0 += p;
                else
                    l1 += p;
            }
        fa_pv<HD>(o, sc, vt, lane);
        if (!more) break;
    }
    ckv_cp_async_wait<0>(); /* nothing in flight at exit */
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    /* O = o / l (nothing seen: 0) into out [n, n_heads, HD]; with split-K (§3b) o unnormalised into
     * split sp's partial row [HD + 2] (launch_merge's layout), then m (base 2) and l */
    const bool split = sk.part != nullptr;
    const int ns = split ? sk.n_splits : 1, rs = split ? HD + 2 : HD; /* partials per row, row stride */
    const float inv0 = split ? 1.0f : l0 > 0.0f ? 1.0f / l0 : 0.0f, inv1 = split ? 1.0f : l1 > 0.0f ? 1.0f / l1 : 0.0f;
    /* the lane's rows recomputed from the thread index, not held across the tile loop (the f32
     * instance at head dim 128 spilled them there on sm_80) */
    const int te = tid_reread(), re0 = m0 + (te >> 5) * 16 + ((te & 31) >> 2), re1 = re0 + 8;
    const bool oke0 = re0 < ntok, oke1 = re1 < ntok;
    const size_t R0 = (size_t)(tok0 + re0) * (size_t)n_heads + (size_t)h;
    float *o0 = (split ? sk.part : out) + (R0 * (size_t)ns + (size_t)((int)blockIdx.z % ns)) * (size_t)rs;
    float *o1 = o0 + (size_t)8 * (size_t)n_heads * (size_t)ns * (size_t)rs;
CKV_UNROLL
    for (int nd = 0; nd < HD / 8; nd++) {
        const int d = nd * 8 + 2 * tq;
        if (oke0) *(float2 *)(o0 + d) = make_float2(o[nd][0] * inv0, o[nd][1] * inv0); /* 8-byte stores */
        if (oke1) *(float2 *)(o1 + d) = make_float2(o[nd][2] * inv1, o[nd][3] * inv1);
    }
    if (split && tq == 0 && oke0) *(float2 *)(o0 + HD) = make_float2(mx0 * scale_log2, l0); /* -inf: saw nothing */
    if (split && tq == 0 && oke1) *(float2 *)(o1 + HD) = make_float2(mx1 * scale_log2, l1);
}

template <typename T, int HD, int BM>
void launch_flash_bm(ctx *c, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                     int n_heads, float scale_log2, prefill_split sk) {
    constexpr size_t smem = fa_stages<T, HD>::BYTES;
    if (smem > 48 * 1024)
        CKV_CUDA_OP_CHECK(c, cudaFuncSetAttribute(flash_kernel<T, HD, BM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                  (int)smem),
                          "opt the prefill attention kernel in to its shared memory");
    const dim3 grid((unsigned)((n + BM - 1) / BM), (unsigned)n_heads, (unsigned)(kv->n_seq * sk.n_splits));
    CKV_LAUNCH((flash_kernel<T, HD, BM>), grid, dim3(2 * BM), smem, c->stream, out, q, qpos, *kv, n, n_heads,
               scale_log2, sk);
}

/* The block's rows: 8 warps (128 rows, each K/V tile shared by twice the queries: half the tile
 * fills per query) for bf16 caches at the models' head dims (64-128) unless that grid leaves SMs
 * idle that the 64-row grid would keep busy (at most 1 in 16 fewer: a grid of 128 blocks on 132
 * SMs is wide, one of 4 blocks is not); 4 warps (64 rows) otherwise, for f32 caches (255
 * registers of six-product fragments), for head dims 16 and 32, and under split-K (§3b: the plan
 * counts 64-row blocks, two per SM). */
template <typename T, int HD>
void launch_flash_hd(ctx *c, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                     int n_heads, float scale_log2, prefill_split sk) {
    constexpr bool wide = sizeof(T) == 2 && HD >= 64;
    const long long rows = (long long)n_heads * kv->n_seq, sms = c->sms;
    const long long b128 = (n + 2 * FA_BM - 1) / (2 * FA_BM) * rows, b64 = (n + FA_BM - 1) / FA_BM * rows;
    const long long busy128 = b128 < sms ? b128 : sms, busy64 = b64 < sms ? b64 : sms; /* SMs with a block */
    if (wide && sk.n_splits == 1 && busy128 * 16 >= busy64 * 15)
        launch_flash_bm<T, HD, wide ? 2 * FA_BM : FA_BM>(c, out, q, qpos, kv, n, n_heads, scale_log2, sk);
    else
        launch_flash_bm<T, HD, FA_BM>(c, out, q, qpos, kv, n, n_heads, scale_log2, sk);
}

template <typename T>
void launch_flash(ctx *c, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                  int n_heads, float scale) {
    const prefill_split sk = prefill_split_plan(c, kv, n, n_heads); /* planned for 64-row blocks */
    const float sl2 = scale * 1.44269504088896341f; /* log2(e) folded into the scale */
    switch (kv->head_dim) {
    case 16: launch_flash_hd<T, 16>(c, out, q, qpos, kv, n, n_heads, sl2, sk); break;
    case 32: launch_flash_hd<T, 32>(c, out, q, qpos, kv, n, n_heads, sl2, sk); break;
    case 64: launch_flash_hd<T, 64>(c, out, q, qpos, kv, n, n_heads, sl2, sk); break;
    case 80: launch_flash_hd<T, 80>(c, out, q, qpos, kv, n, n_heads, sl2, sk); break;
    case 96: launch_flash_hd<T, 96>(c, out, q, qpos, kv, n, n_heads, sl2, sk); break;
    default: launch_flash_hd<T, 128>(c, out, q, qpos, kv, n, n_heads, sl2, sk); break;
    }
    if (sk.part) launch_merge(c, out, sk.part, n * n_heads, sk.n_splits, kv->head_dim);
}

} // namespace

void attention(ckv_backend *be, float *out, const ckv_attention_params *a) {
    ctx *c = ctx_of(be);
    const float *q = a->q;         // [n, n_heads, hd]
    const int32_t *qpos = a->qpos; // [n]
    const ckv_kv_batch *kv = a->kv;
    const int n = a->n, n_heads = a->n_heads;
    const float scale = a->scale;
    const int hd = kv->head_dim;
    if (n <= 0 || n_heads <= 0 || hd <= 0) return;
    if (kv->n_kv_heads <= 0 || n_heads % kv->n_kv_heads != 0 || kv->n_seq <= 0 || hd > DECODE_HD_MAX ||
        (kv->dtype != CKV_DTYPE_BF16 && kv->dtype != CKV_DTYPE_F32)) {
        record(c, ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                            "%s backend: attention: %d query heads over %d KV heads, head dim %d, KV dtype %s, %d "
                            "sequences (needs heads divisible by KV heads, head dim <= %d, bf16 or f32)",
                            CKV_CUDA_BACKEND_NAME, n_heads, kv->n_kv_heads, hd, ckv_dtype_name(kv->dtype), kv->n_seq,
                            DECODE_HD_MAX));
        return;
    }
    const bool flash_hd = hd == 16 || hd == 32 || hd == 64 || hd == 80 || hd == 96 || hd == 128;
    const bool prefill = n > 4 * kv->n_seq; /* more than a few query tokens per sequence */
    const bool bf16 = kv->dtype == CKV_DTYPE_BF16;
    if (flash_hd && prefill && bf16) {
        launch_flash<ckv_bf16>(c, out, q, qpos, kv, n, n_heads, scale);
    } else if (flash_hd && prefill) { /* an f32 cache: fp32-accurate products on the tensor cores */
        launch_flash<float>(c, out, q, qpos, kv, n, n_heads, scale);
    } else {
        attention_split(c, out, q, qpos, kv, n, n_heads, scale);
    }
    op_done(c, "attention");
}

} // namespace CKV_CUDA_NS
