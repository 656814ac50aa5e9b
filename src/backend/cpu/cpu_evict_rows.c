/* cpu_evict_rows.c - the CPU backend's element-wise and row-wise eviction ops: finishing column sums,
 * pooling, the sum over a group's query heads, division, key / value row norms, (s + eps) * N, fills
 * (constants, token indices, seeded random scores), the layer max, and the top-k family (per row,
 * scatter, cross-head counts) with the SPEC tie rule. Semantics as in backend.h; every sum runs in
 * the order backend.h fixes, so results do not depend on the thread count (row norms are split over
 * the backend's threads by (segment, row block), evict_topk by rows; the rest runs on the calling
 * thread). Nothing
 * allocates (the top-k ops select by a radix select, below). No GEMMs (cpu_evict_attn.c) and no
 * decisions about budgets (evict/). */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "cpu_backend.h"
#include "cpu_lanes.h"
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

void ckv_cpu_evict_colsum_finish(ckv_backend *be, float *out, int ld_out, const double *colsum, int ld_in, int rows,
                                 int n, double denom, ckv_evict_denom minus_col) {
    (void)be;
    for (int r = 0; r < rows; r++) {
        const double *c = colsum + (size_t)r * (size_t)ld_in;
        float *o = out + (size_t)r * (size_t)ld_out;
        for (int t = 0; t < n; t++) o[t] = (float)(c[t] / (minus_col ? denom - (double)t : denom));
    }
}

void ckv_cpu_evict_pool(ckv_backend *be, float *y, const float *x, int rows, int n, int ld, int kernel,
                        ckv_evict_pool_kind max) {
    (void)be;
    const int r = kernel / 2;
    for (int row = 0; row < rows; row++) {
        const float *xr = x + (size_t)row * (size_t)ld;
        float *yr = y + (size_t)row * (size_t)ld;
        for (int t = 0; t < n; t++) {
            const int lo = t - r < 0 ? 0 : t - r, hi = t + r >= n ? n - 1 : t + r;
            if (max) {
                float m = xr[lo];
                for (int u = lo + 1; u <= hi; u++) m = xr[u] > m ? xr[u] : m;
                yr[t] = m;
            } else {
                float s = 0.0f;
                for (int u = lo; u <= hi; u++) s += xr[u];
                yr[t] = s / (float)kernel;
            }
        }
    }
}

void ckv_cpu_evict_head_sum(ckv_backend *be, float *dst, int ld_dst, const float *src, int ld_src, int n_src, int n,
                            int head0, int group) {
    (void)be;
    for (int j = 0; j < n_src; j++) {
        float *restrict d = dst + (size_t)((head0 + j) / group) * (size_t)ld_dst;
        const float *restrict s = src + (size_t)j * (size_t)ld_src;
        for (int t = 0; t < n; t++) d[t] += s[t];
    }
}

void ckv_cpu_evict_div(ckv_backend *be, float *x, size_t n, float div) {
    (void)be;
    for (size_t i = 0; i < n; i++) x[i] /= div;
}

/* Rows of one row_norm unit: units are (segment, block of NORM_BLOCK rows), over the backend's
 * threads; each row's sum is its lane sum (backend.h) whatever unit or thread computes it. */
enum { NORM_BLOCK = 256, NORM_ROWS = 8 };

typedef struct {
    float *out;
    int ld, n_rows, blocks;
    const ckv_kv_batch *kv;
    ckv_evict_kv_part values;
    float sign;
} row_norm_job;

void ckv_cpu_sumsq_rows(double *ss, const float *x, int n, int d) {
    for (int t = 0; t < n; t += CKV_CPU_LANE_ROWS) {
        const int nr = n - t < CKV_CPU_LANE_ROWS ? n - t : CKV_CPU_LANE_ROWS;
        const float *rows[CKV_CPU_LANE_ROWS];
        double o[CKV_CPU_LANE_ROWS];
        ckv_cpu_lane_rows_of(rows, x + (size_t)t * (size_t)d, (size_t)d, nr);
        ckv_cpu_lanes_sumsq(o, rows, d);
        for (int i = 0; i < nr; i++) ss[t + i] = o[i];
    }
}

/* out[t] = sign * sqrt(sum_a x_t[a]^2) for n <= NORM_ROWS rows x_t of d fp32 values. */
static void row_norms_f32(float *out, const float *x, int n, int d, float sign) {
    double ss[NORM_ROWS];
    for (int t0 = 0; t0 < n; t0 += NORM_ROWS) {
        const int nr = n - t0 < NORM_ROWS ? n - t0 : NORM_ROWS;
        ckv_cpu_sumsq_rows(ss, x + (size_t)t0 * (size_t)d, nr, d);
        for (int i = 0; i < nr; i++) out[t0 + i] = sign * (float)sqrt(ss[i]);
    }
}

static void row_norm_units(void *ctx, int u0, int u1, int tid) {
    (void)tid;
    const row_norm_job *jb = ctx;
    const ckv_kv_batch *kv = jb->kv;
    const int d = kv->head_dim;
    const size_t es = ckv_dtype_size(kv->dtype), rowb = (size_t)d * es;
    float buf[NORM_ROWS * 512]; /* [NORM_ROWS, d] rows converted to fp32 (d <= 512), else one piece at a time */
    for (int u = u0; u < u1; u++) {
        int g, b, t0, t1;
        ckv_cpu_unit_rows(u, jb->blocks, NORM_BLOCK, jb->n_rows, &g, &b, &t0, &t1);
        const ckv_kv_seg *sg = &kv->segs[0][g];
        const char *base = jb->values ? sg->v : sg->k;
        float *dst = jb->out + (size_t)g * (size_t)jb->ld;
        if (kv->dtype == CKV_DTYPE_F32) {
            row_norms_f32(dst + t0, (const float *)(const void *)(base + (size_t)t0 * rowb), t1 - t0, d, jb->sign);
        } else if (d <= 512) {
            for (int t = t0; t < t1; t += NORM_ROWS) {
                const int nr = t1 - t < NORM_ROWS ? t1 - t : NORM_ROWS;
                ckv_convert_to_f32(buf, base + (size_t)t * rowb, kv->dtype, (size_t)nr * (size_t)d);
                row_norms_f32(dst + t, buf, nr, d, jb->sign);
            }
        } else {
            for (int t = t0; t < t1; t++) {
                double l[CKV_CPU_LANES] = {0.0};
                for (int a0 = 0; a0 < d; a0 += 512) { /* fp32 conversion in pieces of a fixed buffer (512: whole lanes) */
                    const int na = d - a0 < 512 ? d - a0 : 512;
                    ckv_convert_to_f32(buf, base + (size_t)t * rowb + (size_t)a0 * es, kv->dtype, (size_t)na);
                    for (int a = 0; a < na; a++) l[a % CKV_CPU_LANES] += (double)buf[a] * (double)buf[a];
                }
                dst[t] = jb->sign * (float)sqrt(ckv_cpu_lanes_total(l));
            }
        }
    }
}

void ckv_cpu_evict_row_norm(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows,
                            ckv_evict_kv_part values, float sign) {
    row_norm_job jb = {out, ld, n_rows, ckv_cpu_blocks((size_t)(n_rows > 0 ? n_rows : 0), NORM_BLOCK), kv, values, sign};
    if (jb.blocks > 0) ckv_threadpool_for(ckv_cpu_pool(be), kv->n_kv_heads * jb.blocks, 1, row_norm_units, &jb);
}

void ckv_cpu_evict_add_mul(ckv_backend *be, float *out, const float *s, const float *m, int rows, int n, int ld,
                           float eps) {
    (void)be;
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < n; t++) {
            const size_t i = (size_t)r * (size_t)ld + (size_t)t;
            out[i] = (s[i] + eps) * m[i];
        }
}

void ckv_cpu_evict_fill(ckv_backend *be, float *x, int rows, int ld, int t0, int t1, ckv_evict_fill_kind kind,
                        float value) {
    (void)be;
    for (int r = 0; r < rows; r++) {
        float *row = x + (size_t)r * (size_t)ld;
        for (int t = t0; t < t1; t++) row[t] = kind == CKV_EVICT_FILL_INDEX ? (float)t : value;
    }
}

static uint64_t evict_mix(uint64_t x) { /* the splitmix64 finaliser */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void ckv_cpu_evict_random(ckv_backend *be, float *x, int rows, int n, int ld, uint64_t seed, int layer, int head0) {
    (void)be;
    const uint64_t kl = evict_mix(evict_mix(seed) ^ (uint64_t)(uint32_t)layer);
    for (int r = 0; r < rows; r++) {
        const uint64_t kr = evict_mix(kl ^ ((uint64_t)(uint32_t)(head0 + r) << 32));
        float *dst = x + (size_t)r * (size_t)ld;
        for (int t = 0; t < n; t++) {
            const uint64_t v = evict_mix(kr + (uint64_t)t * 0xD1B54A32D192ED03ull);
            dst[t] = (float)(v >> 40) * (1.0f / 16777216.0f); /* 24 bits: [0, 1) exactly */
        }
    }
}

void ckv_cpu_evict_max(ckv_backend *be, float *out, const float *x, int rows, int ld, int t0, int t1) {
    (void)be;
    enum { W = 16 }; /* independent maxima, so the loop is not one chain of dependent comparisons */
    float m[W];
    for (int j = 0; j < W; j++) m[j] = -FLT_MAX;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * (size_t)ld;
        int t = t0;
        for (; t + W <= t1; t += W)
            for (int j = 0; j < W; j++) m[j] = xr[t + j] > m[j] ? xr[t + j] : m[j]; /* a NaN never replaces */
        for (; t < t1; t++) m[0] = xr[t] > m[0] ? xr[t] : m[0];
    }
    float mx = -FLT_MAX; /* the maximum is one value whichever order finds it (+0 and -0 aside, which add 1 alike) */
    for (int j = 0; j < W; j++) mx = m[j] > mx ? m[j] : mx;
    *out = mx;
}

/* ---- top-k ----------------------------------------------------------------------------------
 * Both ops select over a 32-bit key that orders the scores as the SPEC's tie rule does (descending
 * score, NaN last, then ascending index). The cross-head counts histogram every row's keys 11 bits
 * at a time from the top until the boundary bucket holds at most TOPK_CAND keys (one pass when the
 * scores spread over more than total / TOPK_CAND buckets), then one pass in flat order counts the
 * keys above the bucket per row and keeps the bucket's keys aside with their rows, which are ranked
 * among themselves (ties to the lower flat index). The per-row top-k first finds the row's smallest and largest key: every key
 * shares the bits above the highest bit in which those two differ, so its histograms start below
 * them, 11 bits at a time, for as long as the boundary bucket holds more than TOPK_CAND keys; a last
 * pass writes the keys above the bucket in index order and keeps the bucket's keys (at most
 * TOPK_CAND, on the stack), which are ranked among themselves and merged in: three passes over a row
 * whose keys spread over more than TOPK_CAND buckets of the first histogram. The range and the last
 * pass run 16 keys at a time with AVX-512 (the same output as the scalar loops that finish the row,
 * or do all of it in builds without AVX-512).
 * Linear in n, no allocation, the output in ascending index order, nothing sorted. */

/* Order-preserving key: larger score, larger key; -0 and +0 equal; every NaN 0, below -inf. */
static inline uint32_t topk_key(float f) {
    uint32_t u; /* integer operations only, so that loops over keys vectorise */
    memcpy(&u, &f, sizeof u);
    const uint32_t mag = u & 0x7fffffffu, neg = (uint32_t)0 - (u >> 31);
    const uint32_t key = mag == 0 ? 0x80000000u : u ^ (neg | 0x80000000u); /* negative: ~u; else u | sign */
    return mag > 0x7f800000u ? 0u : key;                                    /* NaN */
}

#if defined(__AVX512F__)
/* topk_key of 16 scores. */
static inline __m512i topk_key16(__m512 f) {
    const __m512i u = _mm512_castps_si512(f), sign = _mm512_set1_epi32((int)0x80000000u);
    const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __m512i key = _mm512_xor_si512(u, _mm512_or_si512(_mm512_srai_epi32(u, 31), sign));
    const __mmask16 zero = _mm512_cmpeq_epi32_mask(mag, _mm512_setzero_si512());
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7f800000));
    return _mm512_maskz_mov_epi32((__mmask16)~nan, _mm512_mask_mov_epi32(key, zero, sign));
}

/* Appends the lanes of v selected by m at dst (popcount(m) entries; nothing written past them). */
static inline int topk_append16(int32_t *dst, __mmask16 m, __m512i v) {
    const int c = __builtin_popcount((unsigned)m);
    _mm512_mask_storeu_epi32(dst, (__mmask16)((1u << c) - 1u), _mm512_maskz_compress_epi32(m, v));
    return c;
}
#endif

enum { TOPK_CAND = 2048, TOPK_BITS = 11 }; /* boundary-bucket keys a row's selection holds on the stack; bits a
                                            * histogram level resolves */

/* The key of the k-th largest (1 <= k <= n) of n keys whose bits above `bits` all equal those of
 * `prefix` (its lower bits 0), and in *above how many are larger (a radix select over the low bits,
 * 8 at a time). */
static uint32_t topk_key_threshold(const uint32_t *key, int n, int k, int bits, uint32_t prefix, int *above) {
    uint32_t mask = ~(bits >= 32 ? 0u : (1u << bits) - 1u);
    int left = k;
    *above = 0;
    for (int shift = bits - 8 > 0 ? bits - 8 : 0, width = bits - shift; width > 0;
         width = shift >= 8 ? 8 : shift, shift -= width) {
        int hist[256] = {0};
        const uint32_t hm = (1u << width) - 1u;
        for (int i = 0; i < n; i++)
            if ((key[i] & mask) == prefix) hist[(key[i] >> shift) & hm]++;
        int b = (int)hm;
        while (hist[b] < left) left -= hist[b], *above += hist[b], b--;
        prefix |= (uint32_t)b << shift;
        mask |= hm << shift;
    }
    return prefix;
}

/* The smallest and the largest key of s [n]. */
static void topk_range(const float *s, int n, uint32_t *lo, uint32_t *hi) {
    uint32_t a = UINT32_MAX, b = 0;
    int i = 0;
#if defined(__AVX512F__)
    __m512i va = _mm512_set1_epi32(-1), vb = _mm512_setzero_si512();
    for (; i + 16 <= n; i += 16) {
        const __m512i key = topk_key16(_mm512_loadu_ps(s + i));
        va = _mm512_min_epu32(va, key);
        vb = _mm512_max_epu32(vb, key);
    }
    a = _mm512_reduce_min_epu32(va);
    b = _mm512_reduce_max_epu32(vb);
#endif
    for (; i < n; i++) {
        const uint32_t key = topk_key(s[i]);
        a = key < a ? key : a;
        b = key > b ? key : b;
    }
    *lo = a;
    *hi = b;
}

/* The top-k (1 <= k <= n) of one row s [n] into out [k], ascending indices (see the section's comment). */
static void topk_row(const float *s, int n, int k, int32_t *out) {
    uint32_t lo, hi;
    topk_range(s, n, &lo, &hi);
    /* every key shares the bits above the highest one in which the smallest and largest differ: the
     * histograms start below them */
    int bits = lo == hi ? 0 : 32 - __builtin_clz(lo ^ hi);
    uint32_t mask = bits >= 32 ? 0u : ~((1u << bits) - 1u), prefix = lo & mask; /* the boundary bucket */
    int left = k, above = 0; /* keys still to take from the bucket; keys above it */
    while (bits > 0) {
        const int width = bits < TOPK_BITS ? bits : TOPK_BITS, shift = bits - width;
        const uint32_t hm = (1u << width) - 1u;
        uint32_t hist[2][1 << TOPK_BITS]; /* two halves counted apart: a run of keys in one bucket (sorted
                                           * scores) does not wait on its own increments */
        memset(hist, 0, sizeof hist);
        int i = 0;
        for (; i + 1 < n; i += 2) {
            const uint32_t k0 = topk_key(s[i]), k1 = topk_key(s[i + 1]);
            if ((k0 & mask) == prefix) hist[0][(k0 >> shift) & hm]++;
            if ((k1 & mask) == prefix) hist[1][(k1 >> shift) & hm]++;
        }
        if (i < n && (topk_key(s[i]) & mask) == prefix) hist[0][(topk_key(s[i]) >> shift) & hm]++;
        int b = (int)hm;
        while (hist[0][b] + hist[1][b] < (uint32_t)left) /* b >= 0 */
            left -= (int)(hist[0][b] + hist[1][b]), above += (int)(hist[0][b] + hist[1][b]), b--;
        prefix |= (uint32_t)b << shift;
        mask |= hm << shift;
        bits = shift;
        if (hist[0][b] + hist[1][b] <= TOPK_CAND) break;
    }
    uint32_t ckey[TOPK_CAND + 1]; /* [nc] the bucket's keys and indices, in index order (+1: the */
    int32_t cidx[TOPK_CAND + 1];  /* branch-free pass below writes one entry past the last) */
    int o = 0, nc = 0;
    ckey[0] = prefix; /* (written by the pass below when nc > 0: defined for the compiler's flow analysis) */
    if (mask == 0xffffffffu) { /* the bucket is one key: its first `left` are taken */
        for (int i = 0; i < n; i++) {
            const uint32_t key = topk_key(s[i]);
            if (key > prefix || (key == prefix && left-- > 0)) out[o++] = i;
        }
        return;
    }
    int i = 0;
#if defined(__AVX512F__)
    const __m512i vmask = _mm512_set1_epi32((int)mask), vpre = _mm512_set1_epi32((int)prefix);
    __m512i vi = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (; i + 16 <= n; i += 16, vi = _mm512_add_epi32(vi, _mm512_set1_epi32(16))) {
        const __m512i key = topk_key16(_mm512_loadu_ps(s + i)), m = _mm512_and_si512(key, vmask);
        const __mmask16 gt = _mm512_cmpgt_epu32_mask(m, vpre), eq = _mm512_cmpeq_epi32_mask(m, vpre);
        o += topk_append16(out + o, gt, vi);
        topk_append16((int32_t *)ckey + nc, eq, key);
        nc += topk_append16(cidx + nc, eq, vi);
    }
#endif
    for (; i < n; i++) { /* no branch on the keys (random scores would mispredict half): a slot is
                          * written for every key, kept when the key qualifies; out[o] stays below
                          * k as o <= above < k */
        const uint32_t key = topk_key(s[i]), m = key & mask;
        out[o] = i;
        o += m > prefix;
        ckey[nc] = key;
        cidx[nc] = i;
        nc += m == prefix;
    }
    int cabove;
    const int low = __builtin_ctz(mask); /* the bits below the bucket's prefix */
    const uint32_t thr = topk_key_threshold(ckey, nc, left, low, prefix, &cabove);
    int ties = left - cabove, nk = 0;
    for (int c = 0; c < nc; c++) /* the bucket's kept indices, ascending, into cidx[0 .. left) */
        if (ckey[c] > thr || (ckey[c] == thr && ties-- > 0)) cidx[nk++] = cidx[c];
    for (int a = above - 1, j = left - 1, w = k - 1; j >= 0; w--) /* merged from the back */
        out[w] = a >= 0 && out[a] > cidx[j] ? out[a--] : cidx[j--];
}

typedef struct {
    int32_t *idx;
    const float *s;
    const int32_t *k;
    int ld_idx, ld, n;
} topk_job;

/* Rows [r0, r1) of evict_topk, each selected on its own (rows are independent: any split is exact). */
static void topk_rows_units(void *ctx, int r0, int r1, int tid) {
    (void)tid;
    const topk_job *jb = ctx;
    for (int r = r0; r < r1; r++)
        if (jb->k[r] > 0)
            topk_row(jb->s + (size_t)r * (size_t)jb->ld, jb->n, jb->k[r], jb->idx + (size_t)r * (size_t)jb->ld_idx);
}

/* Scores below which evict_topk selects on the calling thread: a few microseconds of work, less than
 * waking the pool's workers. */
enum { TOPK_INLINE_SCORES = 1 << 16 };

ckv_status ckv_cpu_evict_topk(ckv_backend *be, int32_t *idx, int ld_idx, const float *s, int ld, int rows, int n,
                              const int32_t *k) {
    for (int r = 0; r < rows; r++)
        if (k[r] < 0 || k[r] > n)
            return ckv_error(CKV_STATUS_ERR_ARG, "cpu evict_topk: top-%d of %d scores (row %d)", k[r], n, r);
    topk_job jb = {idx, s, k, ld_idx, ld, n};
    const int grain = (int64_t)rows * n <= TOPK_INLINE_SCORES ? rows : 1;
    ckv_threadpool_for(ckv_cpu_pool(be), rows, grain, topk_rows_units, &jb);
    return CKV_STATUS_OK;
}

void ckv_cpu_evict_scatter(ckv_backend *be, float *x, int ld, int rows, const int32_t *idx, int ld_idx,
                           const int32_t *k, float value) {
    (void)be;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < k[r]; i++) x[(size_t)r * (size_t)ld + (size_t)idx[(size_t)r * (size_t)ld_idx + (size_t)i]] = value;
}

ckv_status ckv_cpu_evict_topk_counts(ckv_backend *be, int32_t *counts, const float *s, int ld, int rows, int n,
                                     int64_t total) {
    (void)be;
    const int64_t all = (int64_t)rows * (int64_t)n;
    if (total < 0 || total > all || all > INT32_MAX)
        return ckv_error(CKV_STATUS_ERR_ARG, "cpu evict_topk_counts: top-%lld of %d x %d scores", (long long)total, rows, n);
    for (int r = 0; r < rows; r++) counts[r] = 0;
    if (total == 0) return CKV_STATUS_OK;
    /* the boundary bucket over every row's keys: 11 bits a level, from the top, until it holds at most
     * TOPK_CAND keys or is one key */
    uint32_t prefix = 0, mask = 0;
    int64_t left = total, above = 0; /* keys still to take from the bucket; keys above it */
    for (int bits = 32; bits > 0;) {
        const int width = bits < TOPK_BITS ? bits : TOPK_BITS, shift = bits - width;
        const uint32_t hm = (1u << width) - 1u;
        int64_t hist[1 << TOPK_BITS];
        memset(hist, 0, sizeof hist);
        for (int r = 0; r < rows; r++) {
            const float *sr = s + (size_t)r * (size_t)ld;
            for (int i = 0; i < n; i++) {
                const uint32_t key = topk_key(sr[i]);
                if ((key & mask) == prefix) hist[(key >> shift) & hm]++;
            }
        }
        int b = (int)hm;
        while (hist[b] < left) left -= hist[b], above += hist[b], b--; /* b >= 0: left <= the matches */
        prefix |= (uint32_t)b << shift;
        mask |= hm << shift;
        bits = shift;
        if (hist[b] <= TOPK_CAND) break;
    }
    /* one pass in flat order (r * n + i): keys above the bucket counted; the bucket's keys either taken
     * in that order (one key) or kept aside with their rows and ranked among themselves, the ties going
     * to the lower flat index */
    const int exact = mask == 0xffffffffu;
    uint32_t ckey[TOPK_CAND]; /* [nc] the bucket's keys and rows, in flat order */
    int32_t crow[TOPK_CAND];
    int nc = 0;
    int64_t take = left;
    for (int r = 0; r < rows; r++) {
        const float *sr = s + (size_t)r * (size_t)ld;
        int32_t c = 0;
        for (int i = 0; i < n; i++) {
            const uint32_t key = topk_key(sr[i]), m = key & mask;
            if (m > prefix) {
                c++;
            } else if (m == prefix) {
                if (exact) {
                    c += take-- > 0;
                } else {
                    ckey[nc] = key;
                    crow[nc++] = r;
                }
            }
        }
        counts[r] = c;
    }
    if (exact) return CKV_STATUS_OK;
    int cabove;
    const uint32_t thr = topk_key_threshold(ckey, nc, (int)left, __builtin_ctz(mask), prefix, &cabove);
    int ties = (int)left - cabove;
    for (int c = 0; c < nc; c++) counts[crow[c]] += ckey[c] > thr || (ckey[c] == thr && ties-- > 0);
    return CKV_STATUS_OK;
}
