/* cuda_evict_window.cu - the window scores of the attention eviction ops on tensor cores: each
 * window query row's softmax max and 1 / sum over the keys it sees (window_stats) and the column
 * sums of the weights exp(s - m) / l (window_colsum), for evict_attn_colsum and evict_attn_probs
 * (cuda_evict_attn.cu dispatches here when window_covers the cache: bf16 or f32, head dims 16, 32,
 * 64, 80, 96, 128; its scalar kernels take the rest). A block takes the window rows of one KV
 * head's GQA group (each local query head's n_q rows padded to 16, 16 rows per warp, 64 per step)
 * against a tile of keys staged by 16-byte cp.async (ckv_qk_tile.h: bf16 rows padded to an odd
 * number of 16-byte chunks read by ldmatrix, fp32 rows padded by 8 floats); S = Q K^T by
 * mma.sync m16n8k16 with the fp32 queries split into three bf16 terms (three mma per product for a
 * bf16 cache, six for an f32 cache: fp32-class logits, docs/gpu.md §3a). Pass 1 runs over chunks
 * of WIN_CHUNK keys (double-buffered tiles), each lane keeping an online max and double sum of its
 * elements, merged over the row's 4 lanes by a fixed butterfly and over the chunks in ascending
 * order by a merge kernel. Pass 2 takes one key tile per block, recomputes its logits, and adds
 * the weights down the columns: per lane in double over its rows, over the 8 lane groups by a
 * fixed butterfly, over the 4 warps in ascending order, so no [L, w] matrix is written and the
 * sums do not depend on scheduling. Scratch (stats, per-chunk partials) comes from the eviction
 * workspace (window_scratch_bytes, sized by evict_reserve). What the scores mean: backend.h. */
#include "cuda_internal.h"
#include "ckv_win_rows.h"

namespace CKV_CUDA_NS {

namespace {

constexpr int WIN_CHUNK = 512; /* keys per pass-1 block (a multiple of both tile widths) */
/* Resident blocks per SM both passes are compiled for: at 3 (168 registers) every instance fits
 * without spilling and with the same loop instructions as at 2, where ptxas took up to 251 of 255
 * for the f32 ones; 3 x 35 KiB of pass 1's tiles fit the SM's shared memory. */
constexpr int WIN_BLOCKS_PER_SM = 3;

/* Pass 1: grid (row blocks of 64, chunks of the key ranges kr, local KV heads), FA_THREADS. Per row
 * and chunk: m = max of the visible logits (key t <= q_row0 + i), l = sum of exp(s - m) in double;
 * pm, pl [n_chunks, n_heads_local, n_q]. */
template <typename T, int HD>
__global__ void __launch_bounds__(FA_THREADS, WIN_BLOCKS_PER_SM)
window_stats_kernel(float *pm, double *pl, const float *q, int n_q, int q_row0, ckv_kv_batch kv, int n_heads_local,
                    int head0, int group, float scale, int divide, key_ranges kr) {
    typedef fa_tile<T, HD> tile_t;
    constexpr int BN = tile_t::BN;
    alignas(16) __shared__ typename tile_t::elem ks[2][BN * tile_t::KS]; // [buf][key][KS]
    const int g = head0 / group + (int)blockIdx.z, c = (int)blockIdx.y;
    const win_rows w = win_rows_of(g, head0, group, n_heads_local, n_q);
    const int R0b = (int)blockIdx.x * FA_BM;
    if (R0b >= (w.jhi - w.jlo) * w.nq16) return; /* uniform, before any barrier */
    int k0 = 0, hi = 0; /* chunk c's range, with constant indices (a dynamic one puts kr on the stack) */
CKV_UNROLL
    for (int r = 0; r < 3; r++)
        if (r < kr.n && c >= kr.first[r] && c < kr.first[r + 1]) k0 = kr.lo[r] + (c - kr.first[r]) * WIN_CHUNK, hi = kr.hi[r];
    const int k1 = k0 + WIN_CHUNK < hi ? k0 + WIN_CHUNK : hi;
    const T *K = (const T *)kv.segs[0][g].k;
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31, tq = lane & 3;
    const int R0 = R0b + warp * 16;
    const bool live = R0 < (w.jhi - w.jlo) * w.nq16; /* warp-uniform */
    fa_q<float, HD> qf;
    int i0 = 0, j = 0;
    if (live)
        j = win_load_q<HD>(qf, &i0, q, n_q, n_heads_local, w, R0, lane);
    else
        qf.load(q, q, false, false, tq); /* read by no one: the warp has no rows */
    const int lim0 = q_row0 + i0, lim1 = lim0 + 8; /* last key rows g, g + 8 see */
    float m[2] = {-INFINITY, -INFINITY};
    double l[2] = {0.0, 0.0};
    fa_load_tile<T, HD, tile_t::KS>(ks[0], K, k0, k1, tid);
    ckv_cp_async_commit();
    for (int kb = k0, it = 0; kb < k1; kb += BN, it++) {
        if (kb + BN < k1) fa_load_tile<T, HD, tile_t::KS>(ks[(it + 1) & 1], K, kb + BN, k1, tid);
        ckv_cp_async_commit();
        ckv_cp_async_wait<1>(); /* tile it has landed (tile it + 1 may be in flight) */
        __syncthreads();
        if (live) {
            float sc[BN / 8][4];
CKV_UNROLL
            for (int nt = 0; nt < BN / 8; nt++) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
            fa_scores<HD>(sc, qf, ks[it & 1], lane);
            float bm[2] = {-INFINITY, -INFINITY};
CKV_UNROLL
            for (int nt = 0; nt < BN / 8; nt++)
CKV_UNROLL
                for (int e = 0; e < 4; e++) {
                    const int t = kb + nt * 8 + 2 * tq + (e & 1), h = e >> 1;
                    const float x = t < k1 && t <= (h ? lim1 : lim0) ? win_logit(sc[nt][e], scale, divide) : -INFINITY;
                    sc[nt][e] = x;
                    bm[h] = fmaxf(bm[h], x);
                }
CKV_UNROLL
            for (int h = 0; h < 2; h++) {
                const float nm = fmaxf(m[h], bm[h]);
                if (nm == -INFINITY) continue; /* nothing visible yet */
                double s = m[h] == -INFINITY ? 0.0 : l[h] * (double)expf(m[h] - nm);
CKV_UNROLL
                for (int nt = 0; nt < BN / 8; nt++)
                    for (int e = 2 * h; e < 2 * h + 2; e++) s += (double)expf(sc[nt][e] - nm); /* -inf: 0 */
                m[h] = nm, l[h] = s;
            }
        }
        __syncthreads(); /* every warp is done with tile it before tile it + 2 overwrites it */
    }
    ckv_cp_async_wait<0>();
    if (!live) return;
    /* the row's 4 lanes (xor 1, 2: the same sums in every lane, commutative) */
CKV_UNROLL
    for (int h = 0; h < 2; h++)
        for (int x = 1; x <= 2; x <<= 1) {
            const float om = __shfl_xor_sync(0xffffffffu, m[h], x);
            const double ol = __shfl_xor_sync(0xffffffffu, l[h], x);
            const float nm = fmaxf(m[h], om);
            if (nm != -INFINITY)
                l[h] = (m[h] == -INFINITY ? 0.0 : l[h] * (double)expf(m[h] - nm)) +
                       (om == -INFINITY ? 0.0 : ol * (double)expf(om - nm));
            m[h] = nm;
        }
    if (tq != 0) return;
    for (int h = 0; h < 2; h++) {
        const int i = i0 + 8 * h;
        if (i >= n_q) continue;
        const size_t at = ((size_t)c * n_heads_local + j) * n_q + i;
        pm[at] = m[h], pl[at] = l[h];
    }
}

/* Thread per (head j, query i): the chunks' partials merged in ascending order into the op's
 * stats [n_heads_local, n_q] = (m, (float)(1 / sum)). */
__global__ void window_merge_kernel(float2 *stats, const float *pm, const double *pl, int n_chunks, int n_rows) {
    const int e = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (e >= n_rows) return;
    float mx = -INFINITY;
    for (int c = 0; c < n_chunks; c++) mx = fmaxf(mx, pm[(size_t)c * n_rows + e]);
    double s = 0.0;
    for (int c = 0; c < n_chunks; c++) {
        const float mc = pm[(size_t)c * n_rows + e];
        if (mc != -INFINITY) s += pl[(size_t)c * n_rows + e] * (double)expf(mc - mx);
    }
    stats[e] = make_float2(mx, (float)(1.0 / s));
}

/* Pass 2: grid (key tiles of BN, output rows), FA_THREADS. colsum[o, t] += exp(s - m) / l over the
 * window rows of o (o a KV head with per_kv, else a local query head) that see t, for t < n_cols
 * and t < q_row0 + n_q. */
template <typename T, int HD>
__global__ void __launch_bounds__(FA_THREADS, WIN_BLOCKS_PER_SM)
window_colsum_kernel(double *colsum, int n_cols, const float2 *stats, const float *q, int n_q, int q_row0,
                     ckv_kv_batch kv, int n_heads_local, int head0, int group, float scale, int divide, int per_kv) {
    typedef fa_tile<T, HD> tile_t;
    constexpr int BN = tile_t::BN;
    alignas(16) __shared__ typename tile_t::elem ks[BN * tile_t::KS]; // [key][KS]
    __shared__ double red[FA_THREADS / 32][BN];                       // [warp][column]
    const int o = (int)blockIdx.y, kb = (int)blockIdx.x * BN;
    const int g = per_kv ? o : (head0 + o) / group;
    win_rows w = win_rows_of(g, head0, group, n_heads_local, n_q);
    if (!per_kv) w.jlo = o, w.jhi = o + 1;
    if (w.jlo >= w.jhi) return; /* a KV head without local heads: uniform, before any barrier */
    const int n_keys = q_row0 + n_q < n_cols ? q_row0 + n_q : n_cols;
    const int tid = (int)threadIdx.x, warp = tid >> 5, lane = tid & 31, tq = lane & 3;
    double acc[BN / 8][2]; /* this lane's columns nt * 8 + 2 tq + e */
CKV_UNROLL
    for (int nt = 0; nt < BN / 8; nt++) acc[nt][0] = acc[nt][1] = 0.0;
    win_stage_tile<T, HD>(ks, (const T *)kv.segs[0][g].k, kb, n_keys, tid);
    win_tile_rows<T, HD>(ks, q, n_q, n_heads_local, w, stats, warp, lane,
                         [&](const float (*sc)[4], const float2 *st, int i0, int) {
CKV_UNROLL
        for (int nt = 0; nt < BN / 8; nt++)
CKV_UNROLL
            for (int e = 0; e < 4; e++) {
                const int t = kb + nt * 8 + 2 * tq + (e & 1), h = e >> 1, i = i0 + 8 * h;
                if (i < n_q && t < n_keys && t <= q_row0 + i)
                    acc[nt][e & 1] += (double)(expf(win_logit(sc[nt][e], scale, divide) - st[h].x) * st[h].y);
            }
    });
    /* over the 8 lane groups, then the warps in order */
    win_cols_reduce<BN>(acc, red, warp, lane, [](double x, double y) { return x + y; });
    if (tid < BN && kb + tid < n_keys) {
        double s = colsum[(size_t)o * n_cols + kb + tid];
        for (int v = 0; v < FA_THREADS / 32; v++) s += red[v][tid];
        colsum[(size_t)o * n_cols + kb + tid] = s;
    }
}

template <typename T, int HD>
void window_stats_launch(ctx *c, float *pm, double *pl, const key_ranges *kr, const float *q, int n_q, int q_row0,
                         const ckv_kv_batch *kv, int H, int head0, int group, float scale, int divide) {
    const int n_g = (head0 + H - 1) / group - head0 / group + 1, per_g = (group < H ? group : H) * ((n_q + 15) / 16 * 16);
    const dim3 grid((unsigned)((per_g + FA_BM - 1) / FA_BM), (unsigned)kr->first[kr->n], (unsigned)n_g);
    CKV_LAUNCH((window_stats_kernel<T, HD>), grid, dim3(FA_THREADS), 0, c->stream, pm, pl, q, n_q, q_row0, *kv, H,
               head0, group, scale, divide, *kr);
}

template <typename T, int HD>
void window_colsum_launch(ctx *c, double *colsum, int n_cols, const float2 *stats, const float *q, int n_q, int q_row0,
                          const ckv_kv_batch *kv, int H, int head0, int group, float scale, int divide, int per_kv) {
    const int keys = q_row0 + n_q < n_cols ? q_row0 + n_q : n_cols, BN = fa_tile<T, HD>::BN;
    const dim3 grid((unsigned)((keys + BN - 1) / BN), (unsigned)(per_kv ? kv->n_kv_heads : H));
    CKV_LAUNCH((window_colsum_kernel<T, HD>), grid, dim3(FA_THREADS), 0, c->stream, colsum, n_cols, stats, q, n_q,
               q_row0, *kv, H, head0, group, scale, divide, per_kv);
}

template <typename T, int HD> struct win_stats_f {
    template <typename... A> static void run(A... a) { window_stats_launch<T, HD>(a...); }
};
template <typename T, int HD> struct win_colsum_f {
    template <typename... A> static void run(A... a) { window_colsum_launch<T, HD>(a...); }
};

int window_chunks(int n_keys) { return (n_keys + WIN_CHUNK - 1) / WIN_CHUNK; }

/* stats [H, n_q] float2, pm [chunks, H, n_q] float, pl [chunks, H, n_q] double */
void window_parts(size_t bytes[3], int n_q, int H, int n_chunks) {
    const size_t rows = (size_t)n_q * (size_t)H, part = rows * (size_t)n_chunks;
    bytes[0] = sizeof(float2) * rows, bytes[1] = sizeof(float) * part, bytes[2] = sizeof(double) * part;
}

} // namespace

bool window_covers(const ckv_kv_batch *kv) {
    const int d = kv->head_dim;
    return (kv->dtype == CKV_DTYPE_BF16 || kv->dtype == CKV_DTYPE_F32) &&
           (d == 16 || d == 32 || d == 64 || d == 80 || d == 96 || d == 128);
}

size_t window_scratch_bytes(int query_rows, int n_heads_local, int rows) {
    size_t bytes[3];
    /* + 2: the chunks of up to three key ranges over `rows` keys (evict_kvzip) */
    window_parts(bytes, query_rows, n_heads_local, window_chunks(rows) + 2);
    return parts_total(bytes, 3, NULL);
}

key_ranges key_ranges_of(int n, const int *lo, const int *hi) {
    key_ranges kr;
    kr.n = n, kr.first[0] = 0;
    for (int r = 0; r < n; r++) {
        kr.lo[r] = lo[r], kr.hi[r] = hi[r];
        kr.first[r + 1] = kr.first[r] + (hi[r] > lo[r] ? window_chunks(hi[r] - lo[r]) : 0);
    }
    return kr;
}

ckv_status window_stats(ctx *c, float2 **stats, const float *q, int n_q, int q_row0, const ckv_kv_batch *kv, int H,
                        int head0, int group, float scale, int divide, const char *op) {
    const int lo = 0, hi = q_row0 + n_q;
    const key_ranges kr = key_ranges_of(1, &lo, &hi);
    return window_stats_ranges(c, stats, &kr, q, n_q, q_row0, kv, H, head0, group, scale, divide, op);
}

ckv_status window_stats_ranges(ctx *c, float2 **stats, const key_ranges *kr, const float *q, int n_q, int q_row0,
                               const ckv_kv_batch *kv, int H, int head0, int group, float scale, int divide,
                               const char *op) {
    const int n_chunks = kr->first[kr->n];
    size_t bytes[3];
    void *parts[3];
    window_parts(bytes, n_q, H, n_chunks);
    CKV_TRY(scratch_parts(c, bytes, parts, 3, op));
    *stats = (float2 *)parts[0];
    win_dispatch<win_stats_f>(kv, c, (float *)parts[1], (double *)parts[2], kr, q, n_q, q_row0, kv, H, head0, group,
                              scale, divide);
    const int n_rows = n_q * H;
    CKV_LAUNCH(window_merge_kernel, dim3(blocks_for((size_t)n_rows, 256)), dim3(256), 0, c->stream, *stats,
               (const float *)parts[1], (const double *)parts[2], n_chunks, n_rows);
    return CKV_STATUS_OK;
}

void window_colsum(ctx *c, double *colsum, int n_cols, const float2 *stats, const float *q, int n_q, int q_row0,
                   const ckv_kv_batch *kv, int H, int head0, int group, float scale, int divide, int per_kv) {
    win_dispatch<win_colsum_f>(kv, c, colsum, n_cols, stats, q, n_q, q_row0, kv, H, head0, group, scale, divide,
                               per_kv);
}

} // namespace CKV_CUDA_NS
