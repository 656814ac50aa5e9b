/* cpu_attention_avx2.c - the AVX2 + FMA attention kernel for tiles of a few query rows that share
 * every key: one decode token's GQA group (e.g. 3 query heads per KV head). The lane kernel of
 * cpu_attention.c puts rows in vector lanes, which on AVX2 wastes most of its 16 lanes for 3 rows;
 * here head_dim is the vector dimension instead: each key (and value) row is loaded once per block
 * for all the tile's rows, widened in registers from F16 (F16C) or BF16, scores are 8-wide FMA
 * chains summed in a fixed tree, weights come from the project's fast exp, and the output rows
 * accumulate p * v with head_dim in registers, in chunks of 32. The online softmax is the same
 * block-by-block one as the other kernels (blocks of CKV_ATTN_BLOCK keys). Every function carries a
 * target attribute, so the file builds without -mavx2 and runs only after the CPU said yes. It does
 * not choose tiles or merge split-K partials (cpu_attention.c does). */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "cpu_attention.h"
#include "cpu_backend.h"

#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__)
#include <immintrin.h>

#define CKV_AVX2 __attribute__((target("avx2,fma,f16c")))

static int gqa_supported(void) {
    static atomic_int state; /* 0 unknown, 1 no, 2 yes */
    int s = atomic_load_explicit(&state, memory_order_relaxed);
    if (s == 0) {
        __builtin_cpu_init();
        int yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c") &&
                  !__builtin_cpu_supports("avx512f"); /* AVX-512 CPUs run the 16-lane kernel */
        s = yes ? 2 : 1;
        atomic_store_explicit(&state, s, memory_order_relaxed);
    }
    return s == 2;
}

/* 8 elements of a key or value row as fp32. */
static inline CKV_AVX2 __m256 gqa_load8(const void *row, ckv_dtype dt, int d) {
    if (dt == CKV_DTYPE_F32) return _mm256_loadu_ps((const float *)row + d);
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)((const uint16_t *)row + d));
    if (dt == CKV_DTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); /* BF16: the high half */
}

/* The sum of 8 lanes in a fixed order: (0+4, 1+5, 2+6, 3+7), then pairs, then the last two. */
static inline CKV_AVX2 float gqa_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* st[r][j] = q_r . k_j for the block's nb keys (unscaled), every row of the tile. */
static CKV_AVX2 void gqa_scores(float st[][CKV_ATTN_BLOCK], const float *const *q, int nr, const char *kb, size_t rowb,
                                ckv_dtype dt, int nb, int hd) {
    for (int j = 0; j < nb; j++) {
        const void *k = kb + (size_t)j * rowb;
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < hd; d += 8) {
            const __m256 kv = gqa_load8(k, dt, d);
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q[0] + d), kv, a0);
            if (nr > 1) a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q[1] + d), kv, a1);
            if (nr > 2) a2 = _mm256_fmadd_ps(_mm256_loadu_ps(q[2] + d), kv, a2);
            if (nr > 3) a3 = _mm256_fmadd_ps(_mm256_loadu_ps(q[3] + d), kv, a3);
        }
        st[0][j] = gqa_hsum(a0);
        if (nr > 1) st[1][j] = gqa_hsum(a1);
        if (nr > 2) st[2][j] = gqa_hsum(a2);
        if (nr > 3) st[3][j] = gqa_hsum(a3);
    }
}

/* acc_r [hd] += sum_j p[r][j] v_j for the block's keys, head_dim in chunks of 32 (4 registers per
 * row); keys in order, so a row's sum order is fixed. */
static CKV_AVX2 void gqa_pv(float *const *acc, int nr, const float p[][CKV_ATTN_BLOCK], const char *vb, size_t rowb,
                            ckv_dtype dt, int nb, int hd) {
    for (int d0 = 0; d0 < hd; d0 += 32) {
        const int w = hd - d0 < 32 ? (hd - d0) / 8 : 4; /* 8-wide registers in this chunk */
        __m256 o[CKV_ATTN_GQA_ROWS][4];
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < w; c++) o[r][c] = _mm256_loadu_ps(acc[r] + d0 + 8 * c);
        for (int j = 0; j < nb; j++) {
            const void *v = vb + (size_t)j * rowb;
            __m256 vv[4];
            for (int c = 0; c < w; c++) vv[c] = gqa_load8(v, dt, d0 + 8 * c);
            for (int r = 0; r < nr; r++) {
                const __m256 pr = _mm256_set1_ps(p[r][j]);
                for (int c = 0; c < w; c++) o[r][c] = _mm256_fmadd_ps(pr, vv[c], o[r][c]);
            }
        }
        for (int r = 0; r < nr; r++)
            for (int c = 0; c < w; c++) _mm256_storeu_ps(acc[r] + d0 + 8 * c, o[r][c]);
    }
}

static CKV_AVX2 void gqa_scale(float *y, float a, int n) {
    const __m256 av = _mm256_set1_ps(a);
    for (int d = 0; d < n; d += 8) _mm256_storeu_ps(y + d, _mm256_mul_ps(av, _mm256_loadu_ps(y + d)));
}

static CKV_AVX2 void gqa_tile(const ckv_attn_tile *tl) {
    const int hd = tl->hd, nr = tl->nr;
    const size_t rowb = (size_t)hd * ckv_dtype_size(tl->dtype);
    float st[CKV_ATTN_GQA_ROWS][CKV_ATTN_BLOCK]; // [rows, block] scores, then weights
    float mx[CKV_ATTN_GQA_ROWS], sum[CKV_ATTN_GQA_ROWS];
    for (int r = 0; r < nr; r++) {
        memset(tl->out[r], 0, (size_t)hd * sizeof(float));
        mx[r] = -INFINITY;
        sum[r] = 0.0f;
    }
    for (int jb = 0; jb < tl->maxcnt; jb += CKV_ATTN_BLOCK) {
        const int nb = tl->maxcnt - jb < CKV_ATTN_BLOCK ? tl->maxcnt - jb : CKV_ATTN_BLOCK;
        const char *kb = (const char *)tl->k + (size_t)jb * rowb, *vb = (const char *)tl->v + (size_t)jb * rowb;
        gqa_scores(st, tl->q, nr, kb, rowb, tl->dtype, nb, hd);
        for (int r = 0; r < nr; r++) { /* online softmax of the block, row by row */
            const int vis = tl->cnt[r] - jb < nb ? tl->cnt[r] - jb : nb; /* keys of the block this row sees */
            float bm = -INFINITY;
            for (int j = 0; j < vis; j++) {
                st[r][j] *= tl->scale;
                bm = st[r][j] > bm ? st[r][j] : bm;
            }
            if (bm > mx[r]) {
                if (sum[r] > 0.0f) { /* rescale what was accumulated under the old max */
                    const float corr = ckv_cpu_expf(mx[r] - bm);
                    sum[r] *= corr;
                    gqa_scale(tl->out[r], corr, hd);
                }
                mx[r] = bm;
            }
            float bs = 0.0f;
            for (int j = 0; j < nb; j++) {
                const float w = j < vis ? ckv_cpu_expf(st[r][j] - mx[r]) : 0.0f;
                st[r][j] = w;
                bs += w;
            }
            sum[r] += bs;
        }
        gqa_pv(tl->out, nr, (const float(*)[CKV_ATTN_BLOCK])st, vb, rowb, tl->dtype, nb, hd);
    }
    for (int r = 0; r < nr; r++) {
        if (tl->ms[r]) { /* a partial over one key range: the merge normalises */
            tl->ms[r][0] = mx[r];
            tl->ms[r][1] = tl->cnt[r] > 0 ? sum[r] : 0.0f;
        } else if (tl->cnt[r] > 0) {
            gqa_scale(tl->out[r], 1.0f / sum[r], hd); /* no visible key: the row stays 0 */
        }
    }
}

int ckv_attn_tile_gqa_avx2(const ckv_attn_tile *tl) {
    if (tl->nr < 1 || tl->nr > CKV_ATTN_GQA_ROWS || tl->hd % 8 != 0 || tl->hd > CKV_ATTN_GQA_HD || !gqa_supported()) return 0;
    if (tl->dtype != CKV_DTYPE_F32 && tl->dtype != CKV_DTYPE_F16 && tl->dtype != CKV_DTYPE_BF16) return 0;
    gqa_tile(tl);
    return 1;
}

#else
int ckv_attn_tile_gqa_avx2(const ckv_attn_tile *tl) {
    (void)tl;
    return 0;
}
#endif
