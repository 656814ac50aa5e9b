/* cuda_decode.cu - split-KV attention (docs/gpu.md §4): decode steps (bf16 and f32 caches) and the
 * head dims the prefill kernel (cuda_attention.cu) has no tile for. Semantics as backend.h's attention: query
 * head h of token t reads KV head h / (n_heads / n_kv_heads) of its sequence and sees the rows whose
 * original pos <= qpos[t]; a row that sees nothing is 0. Each kernel's block takes one (sequence,
 * KV head) segment's chunk of keys and the query rows of that segment (the GQA group's heads of the
 * sequence's tokens), so each K/V byte is read once per group of rows, and writes unnormalised
 * partials (o, m in base 2, l) that one merge kernel combines; the merge and the split plan
 * (plan_splits) also serve the prefill kernel's split-K (cuda_prefill_split.cu). Two split kernels:
 *  - decode_kernel: up to 4 query tokens per sequence (decode steps), head dims of whole 16-byte
 *    chunks (bf16: multiples of 8 up to 256; f32: multiples of 4 up to 128): bandwidth-bound, 16-byte
 *    K/V loads straight into registers, warp-shuffle dot products and merges, the split count
 *    planned from the SM count and the lengths;
 *  - decode_mma_kernel (cuda_decode_mma.cu): bf16 caches at head dims 64, 80, 96 and 128 with 4-8
 *    query rows per segment (GQA groups of 4-8), where the FMA kernel is issue-bound: tensor cores;
 *  - split_kernel: everything else (prefill of an f32 cache or an odd head dim): tiles in shared
 *    memory (K/V by 16-byte read-only loads where a row is whole 16-byte chunks), a thread per
 *    (row, key) score.
 * fp32 softmax and accumulation. Which path runs is decided here (attention_split) and in
 * cuda_attention.cu; the cache is not written here (cuda_kv.cu). */
#include <limits.h>
#include <math.h>

#include "ckv_decode_part.h"
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr int SK_TK = 32;      /* keys per tile of the split kernel */
constexpr int SK_RMAX = 8;     /* query rows per pass of the split kernel */
constexpr int SK_HDMAX = DECODE_HD_MAX;
constexpr int SK_THREADS = 128;
constexpr int SK_BLOCKS_PER_SM = 4; /* resident blocks per SM planned for (sass_expect.txt) */
constexpr int SK_OWN = SK_RMAX * SK_HDMAX / SK_THREADS; /* (row, dim) outputs per thread */
constexpr int SK_MAX_SPLITS = 32;

/* Rows of an ascending pos[0 .. len) that a query at qp sees: the count of pos[i] <= qp. */
__device__ __forceinline__ int visible_rows(const int32_t *pos, int len, int32_t qp) {
    int lo = 0, hi = len;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (__ldg(pos + mid) <= qp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
/* The unsigned type of a B-byte element (bf16 has no __ldg of its own everywhere). */
template <int B> struct sk_bits;
template <> struct sk_bits<2> { typedef unsigned short t; };
template <> struct sk_bits<4> { typedef unsigned t; };

/* Keys [kt, kt + nk) of X (rows of hd) into tile rows of SK_HDMAX (tile 16-byte aligned): 16-byte
 * read-only loads and 16-byte shared stores when a row is whole 16-byte chunks (bf16 head dims that
 * are multiples of 8, f32 multiples of 4; the segments' rows are 16-byte aligned, as decode_kernel
 * reads them), read-only element loads otherwise; no generic loads. */
template <typename T>
__device__ __forceinline__ void sk_load_tile(T *tile, const T *X, int kt, int nk, int hd, int tid) {
    constexpr int VEC = 16 / (int)sizeof(T);
    const T *src = X + (size_t)kt * (size_t)hd;
    if (hd % VEC == 0) {
        const int cpr = hd / VEC; /* 16-byte chunks per row */
        for (int e = tid; e < nk * cpr; e += SK_THREADS) {
            const int j = e / cpr, c = e - j * cpr;
            const uint4 w = __ldg((const uint4 *)(src + (size_t)j * (size_t)hd) + c);
            sts_f4((float *)(tile + j * SK_HDMAX) + 4 * c,
                   make_float4(__uint_as_float(w.x), __uint_as_float(w.y), __uint_as_float(w.z), __uint_as_float(w.w)));
        }
    } else {
        typedef typename sk_bits<(int)sizeof(T)>::t bits;
        for (int e = tid; e < nk * hd; e += SK_THREADS)
            ((bits *)tile)[(e / hd) * SK_HDMAX + e % hd] = __ldg((const bits *)src + e);
    }
}

/* ---- decode: split-KV ------------------------------------------------------------------------
 * grid (n_splits * row_blocks, n_kv_heads, n_seq), block 128. Block (sp + n_splits * rb, g, s) takes
 * rows [sp * chunk, +chunk) of segment (s, g) for the query rows [rb * rows_per_block, +rows_per_block)
 * reading it (all of them when row_blocks = 1): row r is token tok0 + r / group, head
 * g * group + r % group. Per tile: thread per (row, key) scores, one thread per row for the online
 * softmax, thread per (row, dim) outputs held in registers. Partial p of output row R (= token *
 * n_heads + head) and split sp: part[(R * n_splits + sp) * (hd + 2)]: o [hd] unnormalised, m, l. */
template <typename T>
__global__ void __launch_bounds__(SK_THREADS, SK_BLOCKS_PER_SM)
split_kernel(float *part, const float *q, const int32_t *qpos, ckv_kv_batch kv, int n, int n_heads, float scale,
             int n_splits, int chunk, int rows_per_block) {
    __shared__ float qs[SK_RMAX * SK_HDMAX];  // [row][d] the pass's queries
    __shared__ float4 tile_raw[SK_TK * SK_HDMAX * sizeof(T) / 16];
    T *const tile = (T *)tile_raw;            // [key][d] K, then V, of the tile (16-byte aligned)
    __shared__ float sc[SK_RMAX * SK_TK];     // [row][key] scores, then weights
    __shared__ float rm[SK_RMAX], rl[SK_RMAX], rc[SK_RMAX]; /* row max, sum, rescale factor */
    __shared__ int cnt[SK_RMAX];              /* rows of the split each query sees: keys [k0, cnt) */

    const int sp = (int)blockIdx.x % n_splits, rblk = (int)blockIdx.x / n_splits;
    const int g = (int)blockIdx.y, s = (int)blockIdx.z, tid = (int)threadIdx.x;
    const int hd = kv.head_dim, group = n_heads / kv.n_kv_heads;
    int tok0, ntok;
    seq_rows(kv, s, n, &tok0, &ntok);
    const ckv_kv_seg *seg = seg_ptr(&kv.segs[s]) + g;
    const T *K = (const T *)seg_ptr(&seg->k), *V = (const T *)seg_ptr(&seg->v);
    const int32_t *pos = seg_ptr(&seg->pos);
    const int len = __ldg(&seg->len), k0 = sp * chunk, k1 = k0 + chunk < len ? k0 + chunk : len;
    const int r_end = ntok * group < (rblk + 1) * rows_per_block ? ntok * group : (rblk + 1) * rows_per_block;

    for (int rb = rblk * rows_per_block; rb < r_end; rb += SK_RMAX) { /* uniform; none past the sequence */
        const int rows = r_end; /* the pass's rows end here */
        const int nr = rows - rb < SK_RMAX ? rows - rb : SK_RMAX;
        for (int e = tid; e < SK_RMAX * hd; e += SK_THREADS) {
            const int r = e / hd, d = e % hd, row = rb + r;
            const size_t at = ((size_t)(tok0 + row / group) * (size_t)n_heads + (size_t)(g * group + row % group)) * hd;
            qs[r * SK_HDMAX + d] = r < nr ? q[at + (size_t)d] : 0.0f;
        }
        if (tid < SK_RMAX) {
            int c = 0;
            if (tid < nr) {
                c = visible_rows(pos, len, qpos[tok0 + (rb + tid) / group]);
                c = c < k1 ? c : k1;
            }
            cnt[tid] = c;
            rm[tid] = -INFINITY;
            rl[tid] = 0.0f;
        }
        __syncthreads();
        int kend = k0;
        for (int r = 0; r < SK_RMAX; r++) kend = cnt[r] > kend ? cnt[r] : kend;
        float acc[SK_OWN];
CKV_UNROLL
        for (int i = 0; i < SK_OWN; i++) acc[i] = 0.0f;

        for (int kt = k0; kt < kend; kt += SK_TK) {
            const int nk = kend - kt < SK_TK ? kend - kt : SK_TK;
            sk_load_tile(tile, K, kt, nk, hd, tid);
            __syncthreads();
            for (int e = tid; e < SK_RMAX * SK_TK; e += SK_THREADS) {
                const int r = e / SK_TK, j = e % SK_TK;
                float v = -INFINITY;
                if (r < nr && j < nk && kt + j < cnt[r]) {
                    float dot = 0.0f;
                    for (int d = 0; d < hd; d++) dot += qs[r * SK_HDMAX + d] * ld_f32(tile, (size_t)(j * SK_HDMAX + d));
                    v = dot * scale;
                }
                sc[e] = v;
            }
            __syncthreads();
            if (tid < SK_RMAX) { /* online softmax of row tid over the tile */
                float bm = -INFINITY;
                for (int j = 0; j < SK_TK; j++) bm = fmaxf(bm, sc[tid * SK_TK + j]);
                const float nm = fmaxf(rm[tid], bm);
                const float c = nm == -INFINITY ? 1.0f : expf(rm[tid] - nm);
                float sum = 0.0f;
                for (int j = 0; j < SK_TK; j++) {
                    const float v = sc[tid * SK_TK + j];
                    const float p = v == -INFINITY ? 0.0f : expf(v - nm);
                    sc[tid * SK_TK + j] = p;
                    sum += p;
                }
                rl[tid] = rl[tid] * c + sum;
                rm[tid] = nm;
                rc[tid] = c;
            }
            sk_load_tile(tile, V, kt, nk, hd, tid); /* the scores no longer need K */
            __syncthreads();
CKV_UNROLL
            for (int i = 0; i < SK_OWN; i++) {
                const int p = tid + i * SK_THREADS, r = p / hd, d = p % hd;
                if (r < nr) {
                    float a = acc[i] * rc[r];
                    for (int j = 0; j < nk; j++) a += sc[r * SK_TK + j] * ld_f32(tile, (size_t)(j * SK_HDMAX + d));
                    acc[i] = a;
                }
            }
            __syncthreads(); /* tile and sc are refilled next */
        }
CKV_UNROLL
        for (int i = 0; i < SK_OWN; i++) {
            const int p = tid + i * SK_THREADS, r = p / hd, d = p % hd, row = rb + r;
            if (r < nr) {
                const size_t R = (size_t)(tok0 + row / group) * (size_t)n_heads + (size_t)(g * group + row % group);
                part[(R * (size_t)n_splits + (size_t)sp) * (size_t)(hd + 2) + (size_t)d] = acc[i];
            }
        }
        if (tid < nr) {
            const int row = rb + tid;
            const size_t R = (size_t)(tok0 + row / group) * (size_t)n_heads + (size_t)(g * group + row % group);
            float *pm = part + (R * (size_t)n_splits + (size_t)sp) * (size_t)(hd + 2) + (size_t)hd;
            pm[0] = rm[tid] * LOG2E; /* the merge works in base 2 */
            pm[1] = rl[tid];
        }
        __syncthreads(); /* qs, cnt and the row state are refilled by the next pass */
    }
}

/* ---- decode: split-KV at bandwidth -----------------------------------------------------------
 * grid (n_splits, n_kv_heads, n_seq), block 128. Block (sp, g, s) takes the keys [sp * chunk,
 * +chunk) of segment (s, g) for every query row reading it, RP rows per pass (row r: token
 * tok0 + r / group, head g * group + r % group), so each K/V byte is read once per pass and the
 * GQA rows of a KV head share every load. Thread layout: a key row of HD values is CH 16-byte
 * chunks; LPK = the power of two >= CH lanes take one key (lane c its chunk c), so a block runs
 * NS = 128 / LPK key streams, stream j taking keys k0 + j, k0 + j + NS, ... U at a time (U K and U V
 * chunks and U positions in flight per thread; U = 4, or 2 where 4 would spill). Each lane holds its
 * chunk's dims of the RP queries (pre-scaled by scale * log2 e) and of the RP outputs in registers:
 * a score is the lane's partial
 * dot product summed over the LPK lanes by xor shuffles, masked by comparing the key's stored
 * position with the query's; the online softmax is per stream (base 2). At the end the streams of a
 * warp are merged by shuffles, the 4 warps through shared memory, and the block writes its partial
 * (o unnormalised, m in base 2, l) for the merge. No shared memory in the key loop. */
constexpr int DK_THREADS = 128;
constexpr int DK_WARPS = DK_THREADS / 32;
constexpr int DK_MIN_CHUNK = 256;   /* keys per block at least: the merge costs a row of hd + 2 floats */
constexpr int DK_BLOCKS_PER_SM = 4; /* resident blocks per SM planned for (sass_expect.txt) */

/* Merges the softmax state (m2, l2, o2) into (m, l, o) (base 2; m = -inf: empty). */
template <int VEC>
__device__ __forceinline__ void dk_merge_state(float &m, float &l, float *o, float m2, float l2, const float *o2) {
    const float M = fmaxf(m, m2);
    const float a = m == -INFINITY ? 0.0f : exp2f(m - M), b = m2 == -INFINITY ? 0.0f : exp2f(m2 - M);
    l = a * l + b * l2;
CKV_UNROLL
    for (int v = 0; v < VEC; v++) o[v] = a * o[v] + b * o2[v];
    m = M;
}

/* Blocks of the RP-row instance resident per SM (its launch bounds: 65536 / (128 x blocks)
 * registers per thread): 4; 3 for 4 bf16 rows, whose 128 registers spill on sm_80; 2 for 8 rows. */
template <typename T, int RP> constexpr int dk_blocks_per_sm() {
    return RP >= 8 ? 2 : RP >= 4 && sizeof(T) == 2 ? 3 : DK_BLOCKS_PER_SM;
}

template <typename T, int RP>
__global__ void __launch_bounds__(DK_THREADS, (dk_blocks_per_sm<T, RP>()))
decode_kernel(float *part, const float *q, const int32_t *qpos, ckv_kv_batch kv, int n, int n_heads,
              float scale_log2, int n_splits, int chunk) {
    constexpr int VEC = row_chunk<T>::VEC;
    constexpr int U = RP >= 8 || (VEC == 8 && RP >= 4) ? 2 : 4; /* keys in flight per lane: within the registers */
    __shared__ float wo[DK_WARPS * RP * DECODE_HD_MAX]; // [warp][row][d] each warp's merged o
    __shared__ float wm[DK_WARPS * RP], wl[DK_WARPS * RP]; /* [warp][row] its m (base 2) and l */

    const int sp = (int)blockIdx.x, g = (int)blockIdx.y, tid = (int)threadIdx.x;
    const int hd = kv.head_dim, group = n_heads / kv.n_kv_heads, CH = hd / VEC;
    int lpk = 1;
    while (lpk < CH) lpk <<= 1;
    const int ns = DK_THREADS / lpk, c = tid % lpk, j = tid / lpk, lane = tid & 31, warp = tid >> 5;
    const bool active = c < CH;
    const dk_split at = dk_split_of(kv, n, n_heads, chunk);
    const T *K = (const T *)at.k, *V = (const T *)at.v;
    const int32_t *pos = at.pos;
    const int tok0 = at.tok0, k0 = at.k0, k1 = at.k1, rows = at.rows;

    for (int rb = 0; rb < rows; rb += RP) { /* uniform */
        float qv[RP][VEC], o[RP][VEC], m[RP], l[RP];
        int32_t qp[RP];
CKV_UNROLL
        for (int r = 0; r < RP; r++) {
            const int row = rb + r;
            const size_t R = (size_t)(tok0 + row / group) * (size_t)n_heads + (size_t)(g * group + row % group);
            qp[r] = row < rows ? qpos[tok0 + row / group] : INT_MIN; /* INT_MIN: sees nothing */
            const bool ok = row < rows && active;
            float4 a = {0.0f, 0.0f, 0.0f, 0.0f};
CKV_UNROLL
            for (int h = 0; h < VEC / 4; h++) {
                if (ok) a = __ldg((const float4 *)(q + R * (size_t)hd + (size_t)(c * VEC + h * 4)));
                qv[r][h * 4] = a.x * scale_log2, qv[r][h * 4 + 1] = a.y * scale_log2;
                qv[r][h * 4 + 2] = a.z * scale_log2, qv[r][h * 4 + 3] = a.w * scale_log2;
            }
            m[r] = -INFINITY, l[r] = 0.0f;
CKV_UNROLL
            for (int v = 0; v < VEC; v++) o[r][v] = 0.0f;
        }
        for (int kb = k0; kb < k1; kb += ns * U) { /* uniform over the block */
            float kx[U][VEC], vx[U][VEC];
            int32_t kp[U];
CKV_UNROLL
            for (int u = 0; u < U; u++) { /* every load of the step issued before any use */
                const int key = kb + u * ns + j;
                const bool ok = key < k1;
                row_chunk<T>::load(kx[u], K, (size_t)key * (size_t)hd + (size_t)(c * VEC), ok && active);
                row_chunk<T>::load(vx[u], V, (size_t)key * (size_t)hd + (size_t)(c * VEC), ok && active);
                kp[u] = ok ? __ldg(pos + key) : INT_MAX;
            }
CKV_UNROLL
            for (int r = 0; r < RP; r++) {
                float sc[U], bm = -INFINITY;
CKV_UNROLL
                for (int u = 0; u < U; u++) {
                    float d = 0.0f;
CKV_UNROLL
                    for (int v = 0; v < VEC; v++) d = fmaf(qv[r][v], kx[u][v], d);
                    for (int off = 1; off < lpk; off <<= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
                    sc[u] = kp[u] <= qp[r] ? d : -INFINITY;
                    bm = fmaxf(bm, sc[u]);
                }
                if (bm == -INFINITY) continue; /* nothing visible in this step (same on the key's lanes) */
                const float M = fmaxf(m[r], bm);
                const float a = m[r] == -INFINITY ? 0.0f : exp2f(m[r] - M);
                float p[U], ps = 0.0f;
CKV_UNROLL
                for (int u = 0; u < U; u++) {
                    p[u] = sc[u] == -INFINITY ? 0.0f : exp2f(sc[u] - M);
                    ps += p[u];
                }
                l[r] = a * l[r] + ps;
                m[r] = M;
CKV_UNROLL
                for (int v = 0; v < VEC; v++) {
                    float x = a * o[r][v];
CKV_UNROLL
                    for (int u = 0; u < U; u++) x = fmaf(p[u], vx[u][v], x);
                    o[r][v] = x;
                }
            }
        }
        /* the warp's streams (lanes lpk apart) into one state, then the warps through shared memory */
        const int nr = rows - rb < RP ? rows - rb : RP;
CKV_UNROLL
        for (int r = 0; r < RP; r++) {
            for (int off = lpk; off < 32; off <<= 1) {
                float o2[VEC];
CKV_UNROLL
                for (int v = 0; v < VEC; v++) o2[v] = __shfl_xor_sync(0xffffffffu, o[r][v], off);
                const float m2 = __shfl_xor_sync(0xffffffffu, m[r], off), l2 = __shfl_xor_sync(0xffffffffu, l[r], off);
                dk_merge_state<VEC>(m[r], l[r], o[r], m2, l2, o2);
            }
            if (lane < lpk && active && r < nr) {
                float *dst = wo + (warp * RP + r) * DECODE_HD_MAX + c * VEC;
                const float4 lo = {o[r][0], o[r][1], o[r][2], o[r][3]};
                if (VEC == 4) {
                    *(float4 *)dst = lo;
                } else { /* lanes 4-7 of each 8 write their halves in the other order: conflict-free */
                    const float4 hi = {o[r][VEC - 4], o[r][VEC - 3], o[r][VEC - 2], o[r][VEC - 1]};
                    const bool sw = (c >> 2) & 1;
                    *(float4 *)(dst + (sw ? 4 : 0)) = sw ? hi : lo;
                    *(float4 *)(dst + (sw ? 0 : 4)) = sw ? lo : hi;
                }
            }
            if (lane == 0) wm[warp * RP + r] = m[r], wl[warp * RP + r] = l[r];
        }
        __syncthreads();
        dk_block_partial<DK_THREADS, DK_WARPS, RP, DECODE_HD_MAX>(part, wo, wm, wl, rb, nr, hd, tok0, group, g, n_heads,
                                                                 n_splits, sp);
        __syncthreads(); /* wo, wm, wl are refilled by the next pass */
    }
}

constexpr int MERGE_BATCH = 8; /* partials' loads in flight per lane in the merge */

/* Warp per output row and 32 of its dims (4 rows per block, blockIdx.y the dims): O = sum_s
 * 2^{m_s - M} o_s / sum_s 2^{m_s - M} l_s over the splits (docs/gpu.md §4; m in base 2), the weights
 * computed once per split and warp by the lanes, each dim summed in split order (the same order for
 * every row). */
__global__ void __launch_bounds__(DK_THREADS) merge_kernel(float *out, const float *part, int rows, int n_splits, int hd) {
    __shared__ float wt[DK_WARPS * MERGE_MAX_SPLITS]; // [warp][split] weights
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5;
    const size_t R = (size_t)blockIdx.x * DK_WARPS + (size_t)warp;
    const bool ok = R < (size_t)rows; /* no return: every lane meets the shuffles and the barrier */
    const float *pr = part + (ok ? R : 0) * (size_t)n_splits * (size_t)(hd + 2); // [n_splits, hd + 2]
    float M = -INFINITY;
    for (int sp = lane; sp < n_splits; sp += 32) M = fmaxf(M, pr[(size_t)sp * (hd + 2) + hd]);
    for (int off = 16; off > 0; off >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, off));
    float L = 0.0f;
    for (int sp = lane; sp < n_splits; sp += 32) {
        const float m = pr[(size_t)sp * (hd + 2) + hd];
        const float w = m == -INFINITY ? 0.0f : exp2f(m - M);
        wt[warp * MERGE_MAX_SPLITS + sp] = w;
        L += w * pr[(size_t)sp * (hd + 2) + hd + 1];
    }
    for (int off = 16; off > 0; off >>= 1) L += __shfl_xor_sync(0xffffffffu, L, off);
    __syncwarp();
    const int d = (int)blockIdx.y * 32 + lane; /* this warp's 32 dims */
    if (ok && d < hd) {
        float o = 0.0f;
        int sp = 0;
        /* MERGE_BATCH splits' loads issued together, then added in split order (a load under the
         * weight's test would wait for the one before: a chain of n_splits latencies per dim at batch
         * 1, where a few rows meet up to 64 splits; docs/gpu.md §4) */
        for (; sp + MERGE_BATCH <= n_splits; sp += MERGE_BATCH) {
            float v[MERGE_BATCH];
            CKV_UNROLL
            for (int j = 0; j < MERGE_BATCH; j++) v[j] = pr[(size_t)(sp + j) * (hd + 2) + d];
            CKV_UNROLL
            for (int j = 0; j < MERGE_BATCH; j++) {
                const float w = wt[warp * MERGE_MAX_SPLITS + sp + j];
                if (w != 0.0f) o += w * v[j];
            }
        }
        for (; sp < n_splits; sp++) {
            const float w = wt[warp * MERGE_MAX_SPLITS + sp];
            if (w != 0.0f) o += w * pr[(size_t)sp * (hd + 2) + d];
        }
        out[R * (size_t)hd + (size_t)d] = L > 0.0f ? o / L : 0.0f;
    }
}

template <typename T>
void launch_split(ctx *c, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                  int n_heads, float scale) {
    const int hd = kv->head_dim, n_kv = kv->n_kv_heads;
    const int long_batch = n > 4 * kv->n_seq; /* many rows per segment: one split, blocks of rows */
    /* Splits: enough blocks for two waves over the SMs, at most one per tile of keys (docs/gpu.md §4).
     * The partials are sized for SK_MAX_SPLITS, so a growing cache never reallocates them. */
    const int max_len = kv->max_len > 1 ? kv->max_len : 1;
    const int tiles = (max_len + SK_TK - 1) / SK_TK;
    int want = (2 * c->sms + kv->n_seq * n_kv - 1) / (kv->n_seq * n_kv);
    want = want < SK_MAX_SPLITS ? want : SK_MAX_SPLITS;
    want = want < tiles ? want : tiles;
    if (want < 1 || long_batch) want = 1;
    const int chunk = (tiles + want - 1) / want * SK_TK;
    const int n_splits = (max_len + chunk - 1) / chunk;
    const size_t need = (size_t)n * (size_t)n_heads * (size_t)(long_batch ? 1 : SK_MAX_SPLITS) * (size_t)(hd + 2);
    ckv_status s = grow(c, (void **)&c->part, &c->part_cap, need * sizeof(float), "the split-KV partials");
    if (s != CKV_STATUS_OK) {
        record(c, s);
        return;
    }
    /* long batches: blocks of 4 passes of query rows (a bound: sequences with fewer rows exit early) */
    const int group = n_heads / n_kv, rows_per_block = long_batch ? 4 * SK_RMAX : n * group;
    const int row_blocks = (n * group + rows_per_block - 1) / rows_per_block;
    CKV_LAUNCH(split_kernel<T>, dim3((unsigned)(n_splits * row_blocks), (unsigned)n_kv, (unsigned)kv->n_seq),
               dim3(SK_THREADS), 0, c->stream, c->part, q, qpos, *kv, n, n_heads, scale, n_splits, chunk, rows_per_block);
    launch_merge(c, out, c->part, n * n_heads, n_splits, hd);
}

template <typename T, int RP>
void launch_decode_rp(ctx *c, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                      int n_heads, float scale) {
    int n_splits, chunk;
    if (!decode_split_plan(c, kv, n, n_heads, dk_blocks_per_sm<T, RP>(), 32, &n_splits, &chunk)) return;
    CKV_LAUNCH((decode_kernel<T, RP>), dim3((unsigned)n_splits, (unsigned)kv->n_kv_heads, (unsigned)kv->n_seq),
               dim3(DK_THREADS), 0, c->stream, c->part, q, qpos, *kv, n, n_heads, scale * LOG2E, n_splits, chunk);
    launch_merge(c, out, c->part, n * n_heads, n_splits, kv->head_dim);
}

/* Query rows of the fullest segment at most: its tokens (the batch's per sequence, rounded up)
 * times the group. */
int decode_rows(const ckv_kv_batch *kv, int n, int n_heads) {
    return (n + kv->n_seq - 1) / kv->n_seq * (n_heads / kv->n_kv_heads);
}

/* Query rows per pass: the power of two covering a segment's rows (its tokens times the group),
 * at most 8. */
template <typename T>
void launch_decode(ctx *c, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                   int n_heads, float scale) {
    const int rows = decode_rows(kv, n, n_heads);
    if (rows <= 1)
        launch_decode_rp<T, 1>(c, out, q, qpos, kv, n, n_heads, scale);
    else if (rows <= 2)
        launch_decode_rp<T, 2>(c, out, q, qpos, kv, n, n_heads, scale);
    else if (rows <= 4)
        launch_decode_rp<T, 4>(c, out, q, qpos, kv, n, n_heads, scale);
    else
        launch_decode_rp<T, 8>(c, out, q, qpos, kv, n, n_heads, scale);
}

} // namespace

/* Splits of `items` blocks' keys (after FlashAttention-2's num_splits_heuristic, docs/gpu.md §4):
 * with `wave` blocks resident at once, the smallest split count whose wave efficiency (blocks /
 * (waves * wave)) is within PLAN_EFF_SHARE of the best, each split at least min_chunk keys, at most
 * `cap`. FlashAttention-2 takes 85% of the best; a split costs one partial row per query row (hd + 2
 * floats, under 1% of a decode split's K/V bytes), so ckv keeps closer to a full wave.
 * tools/bench/roofline.py mirrors this plan. */
constexpr double PLAN_EFF_SHARE = 0.95;
int plan_splits(int items, int wave, int max_len, int min_chunk, int cap) {
    int most = (max_len + min_chunk - 1) / min_chunk;
    most = most < cap ? most : cap;
    most = most < MERGE_MAX_SPLITS ? most : MERGE_MAX_SPLITS;
    if (most <= 1 || items >= wave) return 1;
    double eff[MERGE_MAX_SPLITS + 1], best = 0.0;
    for (int sp = 1; sp <= most; sp++) {
        const double waves = (double)items * sp / wave;
        eff[sp] = waves / ceil(waves);
        best = eff[sp] > best ? eff[sp] : best;
    }
    for (int sp = 1; sp <= most; sp++)
        if (eff[sp] >= PLAN_EFF_SHARE * best) return sp;
    return most;
}

bool decode_split_plan(ctx *c, const ckv_kv_batch *kv, int n, int n_heads, int blocks_per_sm, int key_align,
                       int *n_splits, int *chunk) {
    const int hd = kv->head_dim, segs = kv->n_seq * kv->n_kv_heads;
    const int wave = c->sms * blocks_per_sm; /* the kernel's launch bounds */
    /* the partials are sized by a bound that does not depend on the length: a growing cache never
     * reallocates them */
    int cap = (2 * wave + segs - 1) / segs;
    cap = cap < MERGE_MAX_SPLITS ? cap : MERGE_MAX_SPLITS;
    const int max_len = kv->max_len > 1 ? kv->max_len : 1;
    const int want = plan_splits(segs, wave, max_len, DK_MIN_CHUNK, cap);
    *chunk = ((max_len + want - 1) / want + key_align - 1) / key_align * key_align;
    *n_splits = (max_len + *chunk - 1) / *chunk;
    const size_t need = (size_t)n * (size_t)n_heads * (size_t)cap * (size_t)(hd + 2);
    ckv_status s = grow(c, (void **)&c->part, &c->part_cap, need * sizeof(float), "the split-KV partials");
    if (s != CKV_STATUS_OK) {
        record(c, s);
        return false;
    }
    return true;
}

void launch_merge(ctx *c, float *out, const float *part, int rows, int n_splits, int hd) {
    CKV_LAUNCH(merge_kernel, dim3((unsigned)((rows + DK_WARPS - 1) / DK_WARPS), (unsigned)((hd + 31) / 32)),
               dim3(DK_THREADS), 0, c->stream, out, part, rows, n_splits, hd);
}

void attention_split(ctx *c, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                     int n_heads, float scale) {
    const bool bf16 = kv->dtype == CKV_DTYPE_BF16;
    const int vec = bf16 ? 8 : 4; /* values per 16-byte load */
    /* a few query tokens per sequence, rows of whole 16-byte chunks, one key row per warp at most */
    const bool decode = n <= 4 * kv->n_seq && kv->head_dim % vec == 0 && kv->head_dim / vec <= 32;
    if (decode && bf16 && !c->decode_fma && decode_mma_fits(kv, decode_rows(kv, n, n_heads)))
        launch_decode_mma(c, out, q, qpos, kv, n, n_heads, scale);
    else if (decode && bf16)
        launch_decode<ckv_bf16>(c, out, q, qpos, kv, n, n_heads, scale);
    else if (decode)
        launch_decode<float>(c, out, q, qpos, kv, n, n_heads, scale);
    else if (bf16)
        launch_split<ckv_bf16>(c, out, q, qpos, kv, n, n_heads, scale);
    else
        launch_split<float>(c, out, q, qpos, kv, n, n_heads, scale);
}

} // namespace CKV_CUDA_NS
