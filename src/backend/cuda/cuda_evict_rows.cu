/* cuda_evict_rows.cu - the CUDA backend's eviction ops over score rows and cached rows (semantics in
 * backend.h): colsum_finish, pool, head_sum, div, row_norm, add_mul, fill, random, max, scatter, and
 * the selections topk (per row) and topk_counts (across heads). Element-wise ops match the CPU
 * reference (cpu/cpu_evict_rows.c) bit for bit (same fp32 / double operations in the same order per
 * element). The selections sort nothing: a radix select over an order-preserving 32-bit key of the
 * score, spread over blocks of one row's entries, finds the k-th best entry in top-k order
 * (descending score, NaN after every number, then ascending index); tie ranks come from per-tile
 * counts and a scan, so kept sets equal the CPU's exactly. Scratch: the eviction workspace. The
 * attention and GEMM ops are in cuda_evict_attn.cu. */
#include <float.h>

#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr unsigned THREADS = 256;

__global__ void colsum_finish_kernel(float *out, int ld_out, const double *colsum, int ld_in, int rows, int n,
                                     double denom, int minus_col) {
    const size_t total = (size_t)rows * (size_t)n;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(e / (size_t)n), t = (int)(e % (size_t)n);
        out[(size_t)r * ld_out + t] = (float)(colsum[(size_t)r * ld_in + t] / (minus_col ? denom - (double)t : denom));
    }
}

__global__ void pool_kernel(float *y, const float *x, int rows, int n, int ld, int kernel, int max) {
    const size_t total = (size_t)rows * (size_t)n;
    const int rad = kernel / 2;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(e / (size_t)n), t = (int)(e % (size_t)n);
        const float *xr = x + (size_t)r * ld;
        const int lo = t - rad < 0 ? 0 : t - rad, hi = t + rad >= n ? n - 1 : t + rad;
        float a = max ? xr[lo] : 0.0f;
        for (int u = max ? lo + 1 : lo; u <= hi; u++) a = max ? (xr[u] > a ? xr[u] : a) : a + xr[u];
        y[(size_t)r * ld + t] = max ? a : a / (float)kernel;
    }
}

/* one thread per column: the source heads in ascending order, as the CPU adds them */
__global__ void head_sum_kernel(float *dst, int ld_dst, const float *src, int ld_src, int n_src, int n, int head0,
                                int group) {
    for (int t = (int)(blockIdx.x * blockDim.x + threadIdx.x); t < n; t += (int)(gridDim.x * blockDim.x))
        for (int j = 0; j < n_src; j++) dst[(size_t)((head0 + j) / group) * ld_dst + t] += src[(size_t)j * ld_src + t];
}

__global__ void div_kernel(float *x, size_t n, float div) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) x[i] /= div;
}

template <typename T>
__global__ void row_norm_kernel(float *out, int ld, ckv_kv_batch kv, int n_rows, int values, float sign) {
    const int g = (int)blockIdx.y, d = kv.head_dim;
    const ckv_kv_seg *sg = &kv.segs[0][g];
    const T *base = (const T *)(values ? sg->v : sg->k);
    for (int t = (int)(blockIdx.x * blockDim.x + threadIdx.x); t < n_rows; t += (int)(gridDim.x * blockDim.x)) {
        const auto x = [&](int a) { return (double)ld_f32(base, (size_t)t * d + a); };
        out[(size_t)g * ld + t] = sign * (float)sqrt(lane_sum(d, x, x)); /* the CPU's lane sum */
    }
}

__global__ void add_mul_kernel(float *out, const float *s, const float *m, int rows, int n, int ld, float eps) {
    const size_t total = (size_t)rows * (size_t)n;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const size_t i = (e / (size_t)n) * (size_t)ld + e % (size_t)n;
        out[i] = (s[i] + eps) * m[i];
    }
}

__global__ void fill_kernel(float *x, int rows, int ld, int t0, int t1, int index, float value) {
    const size_t w = (size_t)(t1 - t0), total = (size_t)rows * w;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int t = t0 + (int)(e % w);
        x[(e / w) * (size_t)ld + (size_t)t] = index ? (float)t : value;
    }
}

__device__ __forceinline__ uint64_t mix64(uint64_t x) { /* the splitmix64 finaliser */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

__global__ void random_kernel(float *x, int rows, int n, int ld, uint64_t seed, int layer, int head0) {
    const uint64_t kl = mix64(mix64(seed) ^ (uint64_t)(uint32_t)layer);
    const size_t total = (size_t)rows * (size_t)n;
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        const int r = (int)(e / (size_t)n), t = (int)(e % (size_t)n);
        const uint64_t kr = mix64(kl ^ ((uint64_t)(uint32_t)(head0 + r) << 32));
        const uint64_t v = mix64(kr + (uint64_t)t * 0xD1B54A32D192ED03ull);
        x[(size_t)r * ld + t] = (float)(v >> 40) * (1.0f / 16777216.0f);
    }
}

__global__ void max_kernel(float *out, const float *x, int rows, int ld, int t0, int t1) {
    __shared__ float red[32];
    float m = -FLT_MAX;
    const size_t w = (size_t)(t1 > t0 ? t1 - t0 : 0), total = (size_t)rows * w;
    for (size_t e = threadIdx.x; e < total; e += blockDim.x) m = fmaxf(m, x[(e / w) * (size_t)ld + t0 + e % w]);
    m = block_max(m, red);
    if (threadIdx.x == 0) *out = m;
}

__global__ void scatter_kernel(float *x, int ld, const int32_t *idx, int ld_idx, const int32_t *k, float value) {
    const int r = (int)blockIdx.x;
    for (int i = (int)threadIdx.x; i < k[r]; i += (int)blockDim.x) x[(size_t)r * ld + idx[(size_t)r * ld_idx + i]] = value;
}

/* ---- selection: radix select across many blocks ---------------------------------------------
 * The k-th best entry of a segment (a row for evict_topk, the whole matrix for evict_topk_counts)
 * in top-k order is found without sorting: four passes over an order-preserving 32-bit key of the
 * score, each a histogram of the next 8 bits among the entries that match the digits found so far
 * (blocks of SEL_TILE entries of one row, shared histograms, then global atomics) followed by a
 * one-thread pick of the digit; that gives the boundary key kb and `need`, how many entries of key kb
 * the top k takes. Ties of kb are kept in index order: per-tile counts of entries above kb and equal
 * to it, an exclusive scan over the tiles of each segment, then each entry's rank. Integer counts
 * only, so the result is exact and the same for any grid. Every index is 32-bit: a row's columns,
 * the row, the tile; a row's base pointer is formed once per block. */

constexpr int SEL_ITEMS = 8;                            /* entries per thread per tile */
constexpr int SEL_TILE = (int)THREADS * SEL_ITEMS;      /* entries of one row per block */
constexpr unsigned SEL_SCAN_THREADS = 1024;

/* Order-preserving key of a score: larger key = better in top-k order; every NaN gets 0 (last). */
__device__ __forceinline__ uint32_t score_key(float s) {
    if (s != s) return 0u;
    const uint32_t b = __float_as_uint(s);
    const uint32_t k = (b & 0x80000000u) ? ~b : b | 0x80000000u; /* monotone over the floats */
    return k < 1u ? 1u : k;
}

/* One segment's search: the digits found so far (prefix, the top 8 * pass bits), how many of the
 * entries matching them are still to be taken (want), and none = 1 when the top k is empty. After the
 * fourth pass prefix is the boundary key kb and want is `need`. */
struct sel_state {
    uint32_t prefix;
    int want, none;
};

/* Entries of a tile (or before it) above the boundary key and equal to it. */
struct sel_pair {
    int gt, eq;
};

/* Scratch layout of one selection: states [segs], histograms [4, segs, 256], tile counts and their
 * exclusive scans [rows * tiles]. */
struct sel_scratch {
    sel_state *st;
    unsigned *hist;
    sel_pair *tile, *before;
};

size_t sel_bytes(int rows, int tiles, int segs, size_t *at) {
    const size_t b[4] = {sizeof(sel_state) * (size_t)segs, sizeof(unsigned) * 4 * 256 * (size_t)segs,
                         sizeof(sel_pair) * (size_t)rows * tiles, sizeof(sel_pair) * (size_t)rows * tiles};
    return parts_total(b, 4, at);
}

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }

/* The segment of row r: the row itself (per_row) or the whole matrix. */
__device__ __forceinline__ int seg_of(int r, int per_row) { return per_row ? r : 0; }

__global__ void sel_init_kernel(sel_state *st, const int32_t *k, int segs, int total, int count) {
    const int sg = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (sg >= segs) return;
    const int want = k ? k[sg] : total, n = count;
    st[sg].prefix = 0u;
    st[sg].want = want < n ? want : n;
    st[sg].none = want <= 0;
}

/* Pass p: histogram of bits [24 - 8p, 32 - 8p) of the keys whose higher digits match the prefix. */
__global__ void sel_hist_kernel(unsigned *hist, const sel_state *st, const float *s, int ld, int n, int per_row,
                                int pass) {
    __shared__ unsigned h[256];
    const int r = (int)blockIdx.y, sg = seg_of(r, per_row), t0 = (int)blockIdx.x * SEL_TILE;
    const sel_state q = st[sg];
    if (q.none) return; /* uniform over the block */
    for (int i = (int)threadIdx.x; i < 256; i += (int)blockDim.x) h[i] = 0u;
    __syncthreads();
    const int shift = 24 - 8 * pass;
    const float *row = s + (size_t)r * (size_t)ld;
    const int end = n - t0 < SEL_TILE ? n - t0 : SEL_TILE;
    for (int i = (int)threadIdx.x; i < end; i += (int)blockDim.x) {
        const uint32_t key = score_key(row[t0 + i]);
        if (pass == 0 || (key >> (shift + 8)) == (q.prefix >> (shift + 8))) atomicAdd(&h[(key >> shift) & 255u], 1u);
    }
    __syncthreads();
    unsigned *gh = hist + ((size_t)pass * (size_t)(per_row ? gridDim.y : 1) + (size_t)sg) * 256;
    for (int i = (int)threadIdx.x; i < 256; i += (int)blockDim.x)
        if (h[i]) atomicAdd(&gh[i], h[i]);
}

/* Pass p of each segment: the digit holding the want-th best matching entry (one thread). */
__global__ void sel_pick_kernel(sel_state *st, const unsigned *hist, int segs, int pass) {
    const int sg = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (sg >= segs || st[sg].none) return;
    const unsigned *h = hist + ((size_t)pass * (size_t)segs + (size_t)sg) * 256;
    int want = st[sg].want, b = 255;
    for (; b > 0 && (int)h[b] < want; b--) want -= (int)h[b];
    st[sg].prefix |= (uint32_t)b << (24 - 8 * pass);
    st[sg].want = want;
}

/* Per tile: entries above the boundary key and equal to it. */
__global__ void sel_tile_kernel(sel_pair *tile, const sel_state *st, const float *s, int ld, int n, int per_row) {
    __shared__ int wsum[32];
    const int r = (int)blockIdx.y, t0 = (int)blockIdx.x * SEL_TILE;
    const sel_state q = st[seg_of(r, per_row)];
    const float *row = s + (size_t)r * (size_t)ld;
    const int end = n - t0 < SEL_TILE ? n - t0 : SEL_TILE;
    int gt = 0, eq = 0;
    if (!q.none)
        for (int i = (int)threadIdx.x; i < end; i += (int)blockDim.x) {
            const uint32_t key = score_key(row[t0 + i]);
            gt += key > q.prefix;
            eq += key == q.prefix;
        }
    int g_all = 0, e_all = 0;
    (void)block_scan_excl(gt, wsum, &g_all);
    (void)block_scan_excl(eq, wsum, &e_all);
    if (threadIdx.x == 0) tile[(size_t)r * gridDim.x + blockIdx.x] = sel_pair{g_all, e_all};
}

/* Per segment (one block): the exclusive scan of its tiles in index order; for evict_topk_counts
 * (counts != NULL) each tile's kept entries are added to its row's count. */
__global__ void sel_scan_kernel(sel_pair *before, int32_t *counts, const sel_pair *tile, const sel_state *st, int tiles,
                                int rows, int per_row) {
    __shared__ int wsum[32];
    const int sg = (int)blockIdx.x;
    const sel_state q = st[sg];
    const int first = per_row ? sg * tiles : 0, n_t = per_row ? tiles : rows * tiles;
    int g_run = 0, e_run = 0;
    for (int c0 = 0; c0 < n_t; c0 += (int)blockDim.x) {
        const int i = c0 + (int)threadIdx.x;
        const sel_pair v = i < n_t ? tile[first + i] : sel_pair{0, 0};
        int g_all = 0, e_all = 0;
        const int gb = g_run + block_scan_excl(v.gt, wsum, &g_all), eb = e_run + block_scan_excl(v.eq, wsum, &e_all);
        if (i < n_t) {
            before[first + i] = sel_pair{gb, eb};
            if (counts && !q.none) {
                const int need = q.want, kept = v.gt + imin(eb + v.eq, need) - imin(eb, need);
                if (kept) atomicAdd(&counts[(first + i) / tiles], kept);
            }
        }
        g_run += g_all;
        e_run += e_all;
    }
}

/* evict_topk's output: each kept column t of row r at idx[r, G + min(T, need)], G and T the entries
 * of the row before t above kb and equal to it (so ascending column order). */
__global__ void sel_write_kernel(int32_t *idx, int ld_idx, const sel_pair *before, const sel_state *st, const float *s,
                                 int ld, int n) {
    __shared__ int wsum[32];
    const int r = (int)blockIdx.y, t0 = (int)blockIdx.x * SEL_TILE;
    const sel_state q = st[r];
    if (q.none) return; /* uniform */
    const float *row = s + (size_t)r * (size_t)ld;
    int32_t *out = idx + (size_t)r * (size_t)ld_idx;
    const sel_pair b = before[(size_t)r * gridDim.x + blockIdx.x];
    int g_run = b.gt, e_run = b.eq;
    const int end = n - t0 < SEL_TILE ? n - t0 : SEL_TILE;
    for (int c0 = 0; c0 < end; c0 += (int)blockDim.x) {
        const int i = c0 + (int)threadIdx.x;
        const uint32_t key = i < end ? score_key(row[t0 + i]) : 0u;
        const int gt = i < end && key > q.prefix, eq = i < end && key == q.prefix;
        int all = 0; /* entries above kb in the high half, equal to kb in the low (at most 256 each) */
        const int x = block_scan_excl((gt << 16) | eq, wsum, &all);
        const int G = g_run + (x >> 16), T = e_run + (x & 0xffff);
        if (gt || (eq && T < q.want)) out[G + imin(T, q.want)] = t0 + i;
        g_run += all >> 16;
        e_run += all & 0xffff;
    }
}

/* One selection: per_row (k [rows] device) or across the matrix (total); then the output kernel. */
ckv_status select_run(ctx *c, int32_t *idx, int ld_idx, int32_t *counts, const float *s, int ld, int rows, int n,
                      const int32_t *k, int total, const char *op) {
    const int per_row = k != NULL, segs = per_row ? rows : 1, tiles = (n + SEL_TILE - 1) / SEL_TILE;
    size_t at[4];
    void *base = NULL;
    const size_t bytes = sel_bytes(rows, tiles, segs, at);
    CKV_TRY(scratch_parts(c, &bytes, &base, 1, op));
    const sel_scratch x = {(sel_state *)base, (unsigned *)((char *)base + at[1]), (sel_pair *)((char *)base + at[2]),
                           (sel_pair *)((char *)base + at[3])};
    CKV_CUDA_CHECK(cudaMemsetAsync(x.hist, 0, sizeof(unsigned) * 4 * 256 * (size_t)segs, c->stream), op);
    if (counts) CKV_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * (size_t)rows, c->stream), op);
    const dim3 grid((unsigned)tiles, (unsigned)rows), seg_grid(blocks_for((size_t)segs, 32));
    const int count = per_row ? n : rows * n;
    CKV_LAUNCH(sel_init_kernel, seg_grid, dim3(32), 0, c->stream, x.st, k, segs, total, count);
    for (int pass = 0; pass < 4; pass++) {
        CKV_LAUNCH(sel_hist_kernel, grid, dim3(THREADS), 0, c->stream, x.hist, x.st, s, ld, n, per_row, pass);
        CKV_LAUNCH(sel_pick_kernel, seg_grid, dim3(32), 0, c->stream, x.st, x.hist, segs, pass);
    }
    CKV_LAUNCH(sel_tile_kernel, grid, dim3(THREADS), 0, c->stream, x.tile, x.st, s, ld, n, per_row);
    CKV_LAUNCH(sel_scan_kernel, dim3((unsigned)segs), dim3(SEL_SCAN_THREADS), 0, c->stream, x.before, counts, x.tile,
               x.st, tiles, rows, per_row);
    if (idx)
        CKV_LAUNCH(sel_write_kernel, grid, dim3(THREADS), 0, c->stream, idx, ld_idx, x.before, x.st, s, ld, n);
    return CKV_STATUS_OK;
}

/* launch(T(), op) with T the element type of KV dtype t */
template <typename F> ckv_status by_dtype(ckv_dtype t, const char *op, F launch) {
    if (t == CKV_DTYPE_BF16) {
        launch(ckv_bf16(), op);
    } else if (t == CKV_DTYPE_F32) {
        launch(float(), op);
    } else {
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s backend: %s: KV dtype %s (bf16 or f32 only)",
                         CKV_CUDA_BACKEND_NAME, op, ckv_dtype_name(t));
    }
    return CKV_STATUS_OK;
}

} // namespace

size_t topk_scratch_bytes(int rows, int n) {
    if (rows < 1 || n < 1) return 0;
    const size_t per = sel_bytes(rows, (n + SEL_TILE - 1) / SEL_TILE, rows, NULL); /* per-row segments: the larger */
    return (per + 255) / 256 * 256;
}

/* What a ckv_status-returning op reports: a launch error now, naming the op (asynchronous faults
 * surface from sync()). */
ckv_status op_status(ctx *c, const char *op) {
    op_done(c, op);
    if (c->pending == CKV_STATUS_OK) return CKV_STATUS_OK;
    const ckv_status s = c->pending;
    c->pending = CKV_STATUS_OK;
    return ckv_error(s, "%s", c->pending_msg);
}

void evict_colsum_finish(ckv_backend *be, float *out, int ld_out, const double *colsum, int ld_in, int rows, int n,
                         double denom, ckv_evict_denom minus_col) {
    ctx *c = ctx_of(be);
    if (rows <= 0 || n <= 0) return;
    CKV_LAUNCH(colsum_finish_kernel, dim3(blocks_for((size_t)rows * n, THREADS)), dim3(THREADS), 0, c->stream, out,
               ld_out, colsum, ld_in, rows, n, denom, minus_col);
    op_done(c, "evict_colsum_finish");
}

void evict_pool(ckv_backend *be, float *y, const float *x, int rows, int n, int ld, int kernel,
                ckv_evict_pool_kind max) {
    ctx *c = ctx_of(be);
    if (rows <= 0 || n <= 0) return;
    CKV_LAUNCH(pool_kernel, dim3(blocks_for((size_t)rows * n, THREADS)), dim3(THREADS), 0, c->stream, y, x, rows, n, ld,
               kernel, max);
    op_done(c, "evict_pool");
}

void evict_head_sum(ckv_backend *be, float *dst, int ld_dst, const float *src, int ld_src, int n_src, int n, int head0,
                    int group) {
    ctx *c = ctx_of(be);
    if (n_src <= 0 || n <= 0) return;
    CKV_LAUNCH(head_sum_kernel, dim3(blocks_for((size_t)n, THREADS)), dim3(THREADS), 0, c->stream, dst, ld_dst, src,
               ld_src, n_src, n, head0, group);
    op_done(c, "evict_head_sum");
}

void evict_div(ckv_backend *be, float *x, size_t n, float div) {
    ctx *c = ctx_of(be);
    if (n == 0) return;
    CKV_LAUNCH(div_kernel, dim3(blocks_for(n, THREADS)), dim3(THREADS), 0, c->stream, x, n, div);
    op_done(c, "evict_div");
}

void evict_row_norm(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows,
                    ckv_evict_kv_part values, float sign) {
    ctx *c = ctx_of(be);
    if (n_rows <= 0 || kv->n_kv_heads <= 0) return;
    const dim3 grid(blocks_for((size_t)n_rows, THREADS), (unsigned)kv->n_kv_heads);
    record(c, by_dtype(kv->dtype, "evict_row_norm", [&](auto t, const char *) {
        CKV_LAUNCH((row_norm_kernel<decltype(t)>), grid, dim3(THREADS), 0, c->stream, out, ld, *kv, n_rows, values, sign);
    }));
    op_done(c, "evict_row_norm");
}

void evict_add_mul(ckv_backend *be, float *out, const float *s, const float *m, int rows, int n, int ld, float eps) {
    ctx *c = ctx_of(be);
    if (rows <= 0 || n <= 0) return;
    CKV_LAUNCH(add_mul_kernel, dim3(blocks_for((size_t)rows * n, THREADS)), dim3(THREADS), 0, c->stream, out, s, m, rows,
               n, ld, eps);
    op_done(c, "evict_add_mul");
}

void evict_fill(ckv_backend *be, float *x, int rows, int ld, int t0, int t1, ckv_evict_fill_kind kind, float value) {
    ctx *c = ctx_of(be);
    if (rows <= 0 || t1 <= t0) return;
    const int index = kind == CKV_EVICT_FILL_INDEX;
    CKV_LAUNCH(fill_kernel, dim3(blocks_for((size_t)rows * (size_t)(t1 - t0), THREADS)), dim3(THREADS), 0, c->stream, x,
               rows, ld, t0, t1, index, value);
    op_done(c, "evict_fill");
}

void evict_random(ckv_backend *be, float *x, int rows, int n, int ld, uint64_t seed, int layer, int head0) {
    ctx *c = ctx_of(be);
    if (rows <= 0 || n <= 0) return;
    CKV_LAUNCH(random_kernel, dim3(blocks_for((size_t)rows * n, THREADS)), dim3(THREADS), 0, c->stream, x, rows, n, ld,
               seed, layer, head0);
    op_done(c, "evict_random");
}

void evict_max(ckv_backend *be, float *out, const float *x, int rows, int ld, int t0, int t1) {
    ctx *c = ctx_of(be);
    CKV_LAUNCH(max_kernel, dim3(1), dim3(THREADS), 0, c->stream, out, x, rows > 0 ? rows : 0, ld, t0, t1);
    op_done(c, "evict_max");
}

void evict_scatter(ckv_backend *be, float *x, int ld, int rows, const int32_t *idx, int ld_idx, const int32_t *k,
                   float value) {
    ctx *c = ctx_of(be);
    if (rows <= 0) return;
    CKV_LAUNCH(scatter_kernel, dim3((unsigned)rows), dim3(THREADS), 0, c->stream, x, ld, idx, ld_idx, k, value);
    op_done(c, "evict_scatter");
}

ckv_status evict_topk(ckv_backend *be, int32_t *idx, int ld_idx, const float *s, int ld, int rows, int n,
                      const int32_t *k) {
    ctx *c = ctx_of(be);
    if (rows <= 0 || n <= 0) return CKV_STATUS_OK;
    CKV_TRY(select_run(c, idx, ld_idx, NULL, s, ld, rows, n, k, 0, "evict_topk"));
    return op_status(c, "evict_topk");
}

ckv_status evict_topk_counts(ckv_backend *be, int32_t *counts, const float *s, int ld, int rows, int n, int64_t total) {
    ctx *c = ctx_of(be);
    const int64_t all = (int64_t)rows * (int64_t)n;
    if (total < 0 || total > all || all > INT32_MAX)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: evict_topk_counts: top-%lld of %d x %d scores",
                         CKV_CUDA_BACKEND_NAME, (long long)total, rows, n);
    if (rows <= 0) return CKV_STATUS_OK;
    if (n <= 0) {
        CKV_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(int32_t) * (size_t)rows, c->stream), "evict_topk_counts");
        return op_status(c, "evict_topk_counts");
    }
    CKV_TRY(select_run(c, NULL, 0, counts, s, ld, rows, n, NULL, (int)total, "evict_topk_counts"));
    return op_status(c, "evict_topk_counts");
}

} // namespace CKV_CUDA_NS
