/* cuda_decode.cu - split-KV attention (docs/gpu.md §4): decode steps, f32 caches and head dims
 * the prefill kernel (cuda_attention.cu) has no tile for. Semantics as backend.h's attention: query
 * head h of token t reads KV head h / (n_heads / n_kv_heads) of its sequence and sees the rows whose
 * original pos <= qpos[t]; a row that sees nothing is 0. A block takes one (sequence, KV head)
 * segment's chunk of rows and all query rows of that segment (the GQA group's heads of the
 * sequence's tokens, 8 at a time), so each K/V tile is read once per group; it writes unnormalised
 * partials (o, m, l) that a merge kernel combines. fp32 softmax and accumulation. Which kernel runs
 * is decided in cuda_attention.cu; the cache is not written here (cuda_kv.cu). */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr int SK_TK = 32;      /* keys per tile of the split kernel */
constexpr int SK_RMAX = 8;     /* query rows per pass of the split kernel */
constexpr int SK_HDMAX = DECODE_HD_MAX;
constexpr int SK_THREADS = 128;
constexpr int SK_OWN = SK_RMAX * SK_HDMAX / SK_THREADS; /* (row, dim) outputs per thread */
constexpr int SK_MAX_SPLITS = 32;

/* Rows of an ascending pos[0 .. len) that a query at qp sees: the count of pos[i] <= qp. */
__device__ __forceinline__ int visible_rows(const int32_t *pos, int len, int32_t qp) {
    int lo = 0, hi = len;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (pos[mid] <= qp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}
/* ---- decode: split-KV ------------------------------------------------------------------------
 * grid (n_splits * row_blocks, n_kv_heads, n_seq), block 128. Block (sp + n_splits * rb, g, s) takes
 * rows [sp * chunk, +chunk) of segment (s, g) for the query rows [rb * rows_per_block, +rows_per_block)
 * reading it (all of them when row_blocks = 1): row r is token tok0 + r / group, head
 * g * group + r % group. Per tile: thread per (row, key) scores, one thread per row for the online
 * softmax, thread per (row, dim) outputs held in registers. Partial p of output row R (= token *
 * n_heads + head) and split sp: part[(R * n_splits + sp) * (hd + 2)]: o [hd] unnormalised, m, l. */
template <typename T>
__global__ void __launch_bounds__(SK_THREADS)
split_kernel(float *part, const float *q, const int32_t *qpos, ckv_kv_batch kv, int n, int n_heads, float scale,
             int n_splits, int chunk, int rows_per_block) {
    __shared__ float qs[SK_RMAX * SK_HDMAX];  // [row][d] the pass's queries
    __shared__ T tile[SK_TK * SK_HDMAX];      // [key][d] K, then V, of the tile
    __shared__ float sc[SK_RMAX * SK_TK];     // [row][key] scores, then weights
    __shared__ float rm[SK_RMAX], rl[SK_RMAX], rc[SK_RMAX]; /* row max, sum, rescale factor */
    __shared__ int cnt[SK_RMAX];              /* rows of the split each query sees: keys [k0, cnt) */

    const int sp = (int)blockIdx.x % n_splits, rblk = (int)blockIdx.x / n_splits;
    const int g = (int)blockIdx.y, s = (int)blockIdx.z, tid = (int)threadIdx.x;
    const int hd = kv.head_dim, group = n_heads / kv.n_kv_heads;
    int tok0, ntok;
    seq_rows(kv, s, n, &tok0, &ntok);
    const ckv_kv_seg *seg = &kv.segs[s][g];
    const T *K = (const T *)seg->k, *V = (const T *)seg->v;
    const int len = seg->len, k0 = sp * chunk, k1 = k0 + chunk < len ? k0 + chunk : len;
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
                c = visible_rows(seg->pos, len, qpos[tok0 + (rb + tid) / group]);
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
            for (int e = tid; e < nk * hd; e += SK_THREADS)
                tile[(e / hd) * SK_HDMAX + e % hd] = K[(size_t)kt * hd + (size_t)e];
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
            for (int e = tid; e < nk * hd; e += SK_THREADS) /* the scores no longer need K */
                tile[(e / hd) * SK_HDMAX + e % hd] = V[(size_t)kt * hd + (size_t)e];
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
            pm[0] = rm[tid];
            pm[1] = rl[tid];
        }
        __syncthreads(); /* qs, cnt and the row state are refilled by the next pass */
    }
}

/* One block per output row: O = sum_s e^{m_s - M} o_s / sum_s e^{m_s - M} l_s (docs/gpu.md §4). */
__global__ void merge_kernel(float *out, const float *part, int n_splits, int hd) {
    const size_t R = blockIdx.x;
    const float *pr = part + R * (size_t)n_splits * (size_t)(hd + 2); // [n_splits, hd + 2]
    float M = -INFINITY;
    for (int sp = 0; sp < n_splits; sp++) M = fmaxf(M, pr[(size_t)sp * (hd + 2) + hd]);
    float L = 0.0f;
    for (int sp = 0; sp < n_splits; sp++) {
        const float m = pr[(size_t)sp * (hd + 2) + hd];
        L += m == -INFINITY ? 0.0f : expf(m - M) * pr[(size_t)sp * (hd + 2) + hd + 1];
    }
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int sp = 0; sp < n_splits; sp++) {
            const float m = pr[(size_t)sp * (hd + 2) + hd];
            if (m != -INFINITY) o += expf(m - M) * pr[(size_t)sp * (hd + 2) + d];
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
    CKV_LAUNCH(merge_kernel, dim3((unsigned)(n * n_heads)), dim3(SK_THREADS), 0, c->stream, out, c->part, n_splits, hd);
}

} // namespace

void attention_split(ctx *c, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                     int n_heads, float scale) {
    if (kv->dtype == CKV_DTYPE_BF16)
        launch_split<ckv_bf16>(c, out, q, qpos, kv, n, n_heads, scale);
    else
        launch_split<float>(c, out, q, qpos, kv, n, n_heads, scale);
}

} // namespace CKV_CUDA_NS
