/* cpu_attention.c - causal attention of query tokens over the ragged, position-sorted KV segments of
 * a batch of sequences (prefill chunks and single-token decode alike, one sequence or many), fp32
 * arithmetic; F16/BF16 caches are widened one block of keys at a time. One pass over the visible keys (a
 * prefix of each head's rows, found by binary search on pos) with an online (flash-style) softmax
 * over fixed blocks of keys; all state lives in fixed-size stack arrays, so it allocates nothing.
 * Work items are tiles of query rows that share one KV head (a GQA group's heads and neighbouring
 * tokens), claimed dynamically by the pool's threads; a tile goes through the lane kernel (rows in
 * vector lanes, no horizontal sums) or, for 1-2 rows or head_dim > 256, the row kernel; on CPUs with
 * AVX2 but no AVX-512, tiles of up to CKV_ATTN_GQA_ROWS rows (decode: one token's GQA group) go
 * through the GQA kernel of cpu_attention_avx2.c. The tiling
 * depends on the shapes only and a row's arithmetic not on the thread that runs it, so results are
 * identical for any thread count. It does not write the cache (kv_store, cpu_ops.c) and knows
 * nothing of eviction scores or sliding windows. */
#include <math.h>
#include <stdatomic.h>

#include "cpu_attention.h"
#include "cpu_backend.h"

#define CKV_ATTN_LANES 16     /* most query rows per work item: one vector lane each in the lane kernel */
#define CKV_ATTN_LANE_HD 256  /* largest head_dim of the lane kernel (its stack arrays are [hd, lanes]) */
#define CKV_ATTN_LANE_MIN_ROWS 3 /* fewer rows in a tile: the row kernel wastes fewer lanes (measured) */
/* Tiles shrink (down to CKV_ATTN_MIN_TILE rows) until there are CKV_ATTN_MIN_ITEMS work items, so that
 * decode has some parallelism. This depends on the shapes only, never on the thread count, which is
 * what keeps results identical for any number of threads. */
#define CKV_ATTN_MIN_TILE 4
#define CKV_ATTN_MIN_ITEMS 16
_Static_assert(CKV_ATTN_BLOCK % 4 == 0, "the lane kernel takes keys in groups of 4");
_Static_assert(CKV_ATTN_LANES == CKV_ATTN_TILE_ROWS, "a tile's rows are the lane kernel's lanes");

#define CKV_ATTN_MAX_SEQ 64   /* sequences per pass over the thread pool (larger batches take several) */
#define CKV_ATTN_CONV_HD 512  /* largest head_dim of an F16/BF16 cache (its block buffers are thread-local) */
/* Split-K for decode: when a sequence's query rows of a KV head fit one tile (decode, short question
 * chunks), each head's keys are cut into ranges of at least CKV_ATTN_SPLIT_MIN keys (at most
 * CKV_ATTN_MAX_SPLIT ranges, whole blocks each) that separate work items attend, and a merge
 * combines their (max, sum, accumulator) partials in range order. The cut depends on the sequence's
 * own shape only, so results do not depend on the thread count or on the other sequences of a batch. */
#define CKV_ATTN_SPLIT_MIN 256
#define CKV_ATTN_MAX_SPLIT 16

/* The work of one call (or of up to CKV_ATTN_MAX_SEQ sequences of it). */
typedef struct {
    float *out;                  // [n, n_heads, hd]
    const float *q;              // [n, n_heads, hd]
    const int32_t *qpos;         // [n]
    const ckv_kv_batch *kv;
    int n_heads, group, hd, n_kv;
    float scale;
    int n_seq;                            /* sequences in this pass */
    int seq0[CKV_ATTN_MAX_SEQ];           /* batch index of each */
    int tok0[CKV_ATTN_MAX_SEQ];           /* first token row of each */
    int rows_per_head[CKV_ATTN_MAX_SEQ];  /* query rows (token, head) reading one KV head: n_s * group */
    int tile[CKV_ATTN_MAX_SEQ];           /* query rows per work item */
    int tiles_per_head[CKV_ATTN_MAX_SEQ]; /* ceil(rows_per_head / tile) */
    int split[CKV_ATTN_MAX_SEQ];          /* key ranges each head's keys are split into (1: none) */
    int chunk[CKV_ATTN_MAX_SEQ];          /* keys per range when split */
    size_t part0[CKV_ATTN_MAX_SEQ];       /* first float of the sequence's partials in ws */
    int item0[CKV_ATTN_MAX_SEQ + 1];      /* first work item of each (prefix sums of n_kv * tiles * split) */
    int n_items;
    float *ws;                            /* partials [n_kv, split, rows, hd + 2] per split sequence */
    atomic_int next;    /* next work item to claim */
} ckv_attn_job;


/* Keys or values j0 .. j0 + nb - 1 of a head as fp32: the cache itself when it is F32, else widened
 * into buf [nb, hd]. */
static const float *ckv_attn_rows(const void *base, ckv_dtype dt, int j0, int nb, int hd, float *buf) {
    if (dt == CKV_DTYPE_F32) return (const float *)base + (size_t)j0 * (size_t)hd;
    const uint16_t *h = (const uint16_t *)base + (size_t)j0 * (size_t)hd;
    ckv_convert_to_f32(buf, h, dt, (size_t)nb * (size_t)hd);
    return buf;
}

/* Rows of a head's sorted positions that a query at `qp` sees: the count of pos[i] <= qp. */
static int ckv_attn_visible(const int32_t *pos, int len, int32_t qp) {
    int lo = 0, hi = len;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if (pos[mid] <= qp)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* ---- lane kernel: head_dim <= CKV_ATTN_LANE_HD -----------------------------------------------
 * The tile's queries are transposed once to qt [hd, lanes], so each key needs no horizontal sum:
 * scores of 4 keys for all rows are 4 vector FMAs per element of the key (a register-blocked
 * rank-1 update), and the output accumulates transposed in acc [hd, lanes] the same way from the
 * values. Lanes are independent: a row's result does not depend on the tile it shares. */

/* st [nb, lanes] = K[0..nb) . qt (unscaled) */
static void ckv_attn_lane_scores(float st[][CKV_ATTN_LANES], const float *restrict kb, const float *restrict qt,
                                 int nb, int hd) {
    int j = 0;
    for (; j + 4 <= nb; j += 4) {
        const float *k0 = kb + (size_t)j * (size_t)hd, *k1 = k0 + hd, *k2 = k1 + hd, *k3 = k2 + hd;
        float a0[CKV_ATTN_LANES] = {0}, a1[CKV_ATTN_LANES] = {0}, a2[CKV_ATTN_LANES] = {0}, a3[CKV_ATTN_LANES] = {0};
        for (int d = 0; d < hd; d++) {
            const float *qd = qt + (size_t)d * CKV_ATTN_LANES;
            for (int r = 0; r < CKV_ATTN_LANES; r++) {
                a0[r] += k0[d] * qd[r];
                a1[r] += k1[d] * qd[r];
                a2[r] += k2[d] * qd[r];
                a3[r] += k3[d] * qd[r];
            }
        }
        memcpy(st[j], a0, sizeof a0);
        memcpy(st[j + 1], a1, sizeof a1);
        memcpy(st[j + 2], a2, sizeof a2);
        memcpy(st[j + 3], a3, sizeof a3);
    }
    for (; j < nb; j++) {
        const float *k0 = kb + (size_t)j * (size_t)hd;
        float a0[CKV_ATTN_LANES] = {0};
        for (int d = 0; d < hd; d++) {
            const float *qd = qt + (size_t)d * CKV_ATTN_LANES;
            for (int r = 0; r < CKV_ATTN_LANES; r++) a0[r] += k0[d] * qd[r];
        }
        memcpy(st[j], a0, sizeof a0);
    }
}

/* Zero values standing in for the keys past the end of a block's last group of 4. */
static const float ckv_attn_zero_row[CKV_ATTN_LANE_HD];

/* acc [hd, lanes] += V[0..nb)^T . p   (p [nb rounded up to 4, lanes], zero past nb). Keys always go
 * in the same groups of 4 from the block start, so a row's sum order does not depend on how many
 * keys the other rows of its tile see. */
static void ckv_attn_lane_pv(float *restrict acc, const float *restrict vb, const float p[][CKV_ATTN_LANES], int nb,
                             int hd) {
    for (int j = 0; j < nb; j += 4) {
        const float *v0 = vb + (size_t)j * (size_t)hd;
        const float *v1 = j + 1 < nb ? v0 + hd : ckv_attn_zero_row;
        const float *v2 = j + 2 < nb ? v0 + 2 * hd : ckv_attn_zero_row;
        const float *v3 = j + 3 < nb ? v0 + 3 * hd : ckv_attn_zero_row;
        const float *p0 = p[j], *p1 = p[j + 1], *p2 = p[j + 2], *p3 = p[j + 3];
        for (int d = 0; d < hd; d++) {
            float *ad = acc + (size_t)d * CKV_ATTN_LANES;
            for (int r = 0; r < CKV_ATTN_LANES; r++)
                ad[r] += v0[d] * p0[r] + v1[d] * p1[r] + v2[d] * p2[r] + v3[d] * p3[r];
        }
    }
}

/* ---- lane kernel, AVX-512 versions of the two products ----------------------------------------
 * Same layouts and results up to rounding: scores take 16 keys per pass (16 independent FMA chains,
 * one load of qt and 16 broadcasts of key elements per element of the key), the output product keeps
 * 16 columns of acc (times the correction factor) in registers across the block's keys. Chosen at run
 * time when the CPU has AVX-512F; the target attribute lets this file build without -mavx512f. */
#if (defined(__GNUC__) || defined(__clang__)) && defined(__x86_64__) && CKV_ATTN_LANES == 16
#include <immintrin.h>
#define CKV_ATTN_HAVE_AVX512 1
#define CKV_ATTN_AVX512 __attribute__((target("avx512f")))

static CKV_ATTN_AVX512 void ckv_attn_lane_scores_avx512(float st[][CKV_ATTN_LANES], const float *restrict kb,
                                                        const float *restrict qt, int nb, int hd) {
    const size_t h1 = (size_t)hd, h2 = 2 * (size_t)hd;
    int j = 0;
    for (; j + 16 <= nb; j += 16) {
        /* key i of the 16 at kg[i / 3] + (i % 3) * hd: six moving pointers */
        const float *k0 = kb + (size_t)j * h1, *k1 = k0 + 3 * h1, *k2 = k0 + 6 * h1, *k3 = k0 + 9 * h1,
                    *k4 = k0 + 12 * h1, *k5 = k0 + 15 * h1;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,
               a9 = a0, a10 = a0, a11 = a0, a12 = a0, a13 = a0, a14 = a0, a15 = a0;
        const float *qd = qt;
        for (int d = 0; d < hd; d++) {
            const __m512 q = _mm512_loadu_ps(qd);
            qd += CKV_ATTN_LANES;
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(k0[0]), q, a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(k0[h1]), q, a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(k0[h2]), q, a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(k1[0]), q, a3);
            a4 = _mm512_fmadd_ps(_mm512_set1_ps(k1[h1]), q, a4);
            a5 = _mm512_fmadd_ps(_mm512_set1_ps(k1[h2]), q, a5);
            a6 = _mm512_fmadd_ps(_mm512_set1_ps(k2[0]), q, a6);
            a7 = _mm512_fmadd_ps(_mm512_set1_ps(k2[h1]), q, a7);
            a8 = _mm512_fmadd_ps(_mm512_set1_ps(k2[h2]), q, a8);
            a9 = _mm512_fmadd_ps(_mm512_set1_ps(k3[0]), q, a9);
            a10 = _mm512_fmadd_ps(_mm512_set1_ps(k3[h1]), q, a10);
            a11 = _mm512_fmadd_ps(_mm512_set1_ps(k3[h2]), q, a11);
            a12 = _mm512_fmadd_ps(_mm512_set1_ps(k4[0]), q, a12);
            a13 = _mm512_fmadd_ps(_mm512_set1_ps(k4[h1]), q, a13);
            a14 = _mm512_fmadd_ps(_mm512_set1_ps(k4[h2]), q, a14);
            a15 = _mm512_fmadd_ps(_mm512_set1_ps(k5[0]), q, a15);
            k0++, k1++, k2++, k3++, k4++, k5++;
        }
        _mm512_storeu_ps(st[j], a0);
        _mm512_storeu_ps(st[j + 1], a1);
        _mm512_storeu_ps(st[j + 2], a2);
        _mm512_storeu_ps(st[j + 3], a3);
        _mm512_storeu_ps(st[j + 4], a4);
        _mm512_storeu_ps(st[j + 5], a5);
        _mm512_storeu_ps(st[j + 6], a6);
        _mm512_storeu_ps(st[j + 7], a7);
        _mm512_storeu_ps(st[j + 8], a8);
        _mm512_storeu_ps(st[j + 9], a9);
        _mm512_storeu_ps(st[j + 10], a10);
        _mm512_storeu_ps(st[j + 11], a11);
        _mm512_storeu_ps(st[j + 12], a12);
        _mm512_storeu_ps(st[j + 13], a13);
        _mm512_storeu_ps(st[j + 14], a14);
        _mm512_storeu_ps(st[j + 15], a15);
    }
    for (; j + 4 <= nb; j += 4) {
        const float *k0 = kb + (size_t)j * h1;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int d = 0; d < hd; d++) {
            const __m512 q = _mm512_loadu_ps(qt + (size_t)d * CKV_ATTN_LANES);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(k0[d]), q, a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(k0[h1 + (size_t)d]), q, a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(k0[h2 + (size_t)d]), q, a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(k0[3 * h1 + (size_t)d]), q, a3);
        }
        _mm512_storeu_ps(st[j], a0);
        _mm512_storeu_ps(st[j + 1], a1);
        _mm512_storeu_ps(st[j + 2], a2);
        _mm512_storeu_ps(st[j + 3], a3);
    }
    for (; j < nb; j++) {
        const float *k0 = kb + (size_t)j * h1;
        __m512 a0 = _mm512_setzero_ps();
        for (int d = 0; d < hd; d++)
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(k0[d]), _mm512_loadu_ps(qt + (size_t)d * CKV_ATTN_LANES), a0);
        _mm512_storeu_ps(st[j], a0);
    }
}

/* acc [hd, lanes] = acc * corr + V[0..nb)^T . p; keys in order, one FMA each. */
static CKV_ATTN_AVX512 void ckv_attn_lane_pv_avx512(float *restrict acc, const float *restrict vb,
                                                    const float p[][CKV_ATTN_LANES], int nb, int hd,
                                                    const float *corr) {
    const __m512 cv = _mm512_loadu_ps(corr);
    int d0 = 0;
    for (; d0 + 16 <= hd; d0 += 16) {
        float *ad = acc + (size_t)d0 * CKV_ATTN_LANES;
#define CKV_LD(i) _mm512_mul_ps(_mm512_loadu_ps(ad + (i) * CKV_ATTN_LANES), cv)
        __m512 a0 = CKV_LD(0), a1 = CKV_LD(1), a2 = CKV_LD(2), a3 = CKV_LD(3), a4 = CKV_LD(4), a5 = CKV_LD(5),
               a6 = CKV_LD(6), a7 = CKV_LD(7), a8 = CKV_LD(8), a9 = CKV_LD(9), a10 = CKV_LD(10), a11 = CKV_LD(11),
               a12 = CKV_LD(12), a13 = CKV_LD(13), a14 = CKV_LD(14), a15 = CKV_LD(15);
#undef CKV_LD
        const float *v = vb + d0;
        for (int j = 0; j < nb; j++) {
            const __m512 w = _mm512_loadu_ps(p[j]);
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(v[0]), w, a0);
            a1 = _mm512_fmadd_ps(_mm512_set1_ps(v[1]), w, a1);
            a2 = _mm512_fmadd_ps(_mm512_set1_ps(v[2]), w, a2);
            a3 = _mm512_fmadd_ps(_mm512_set1_ps(v[3]), w, a3);
            a4 = _mm512_fmadd_ps(_mm512_set1_ps(v[4]), w, a4);
            a5 = _mm512_fmadd_ps(_mm512_set1_ps(v[5]), w, a5);
            a6 = _mm512_fmadd_ps(_mm512_set1_ps(v[6]), w, a6);
            a7 = _mm512_fmadd_ps(_mm512_set1_ps(v[7]), w, a7);
            a8 = _mm512_fmadd_ps(_mm512_set1_ps(v[8]), w, a8);
            a9 = _mm512_fmadd_ps(_mm512_set1_ps(v[9]), w, a9);
            a10 = _mm512_fmadd_ps(_mm512_set1_ps(v[10]), w, a10);
            a11 = _mm512_fmadd_ps(_mm512_set1_ps(v[11]), w, a11);
            a12 = _mm512_fmadd_ps(_mm512_set1_ps(v[12]), w, a12);
            a13 = _mm512_fmadd_ps(_mm512_set1_ps(v[13]), w, a13);
            a14 = _mm512_fmadd_ps(_mm512_set1_ps(v[14]), w, a14);
            a15 = _mm512_fmadd_ps(_mm512_set1_ps(v[15]), w, a15);
            v += hd;
        }
        _mm512_storeu_ps(ad, a0);
        _mm512_storeu_ps(ad + 1 * CKV_ATTN_LANES, a1);
        _mm512_storeu_ps(ad + 2 * CKV_ATTN_LANES, a2);
        _mm512_storeu_ps(ad + 3 * CKV_ATTN_LANES, a3);
        _mm512_storeu_ps(ad + 4 * CKV_ATTN_LANES, a4);
        _mm512_storeu_ps(ad + 5 * CKV_ATTN_LANES, a5);
        _mm512_storeu_ps(ad + 6 * CKV_ATTN_LANES, a6);
        _mm512_storeu_ps(ad + 7 * CKV_ATTN_LANES, a7);
        _mm512_storeu_ps(ad + 8 * CKV_ATTN_LANES, a8);
        _mm512_storeu_ps(ad + 9 * CKV_ATTN_LANES, a9);
        _mm512_storeu_ps(ad + 10 * CKV_ATTN_LANES, a10);
        _mm512_storeu_ps(ad + 11 * CKV_ATTN_LANES, a11);
        _mm512_storeu_ps(ad + 12 * CKV_ATTN_LANES, a12);
        _mm512_storeu_ps(ad + 13 * CKV_ATTN_LANES, a13);
        _mm512_storeu_ps(ad + 14 * CKV_ATTN_LANES, a14);
        _mm512_storeu_ps(ad + 15 * CKV_ATTN_LANES, a15);
    }
    for (; d0 < hd; d0++) {
        float *ad = acc + (size_t)d0 * CKV_ATTN_LANES;
        __m512 a0 = _mm512_mul_ps(_mm512_loadu_ps(ad), cv);
        for (int j = 0; j < nb; j++)
            a0 = _mm512_fmadd_ps(_mm512_set1_ps(vb[(size_t)j * (size_t)hd + (size_t)d0]), _mm512_loadu_ps(p[j]), a0);
        _mm512_storeu_ps(ad, a0);
    }
}

/* ckv_cpu_expf on 16 lanes: the project's exp through its vector form (core/fastmath.h), which the
 * vectoriser compiles to AVX-512 code inside this target. */
static inline CKV_ATTN_AVX512 __m512 ckv_attn_exp16(__m512 x) {
    float t[CKV_ATTN_LANES] __attribute__((aligned(64)));
    _mm512_store_ps(t, x);
    ckv_fast_expf_n(t, t, CKV_ATTN_LANES);
    return _mm512_load_ps(t);
}

/* ckv_attn_lane_softmax with the 16 lanes in one register. */
static CKV_ATTN_AVX512 void ckv_attn_lane_softmax_avx512(float st[][CKV_ATTN_LANES], int nb, int jb, const int *cnt,
                                                         float scale, float *mx, float *sum, float *corr) {
    const __m512i cntv = _mm512_loadu_si512(cnt);
    const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    __m512 bm = ninf;
    for (int j = 0; j < nb; j++) {
        const __mmask16 vis = _mm512_cmpgt_epi32_mask(cntv, _mm512_set1_epi32(jb + j));
        const __m512 x = _mm512_mask_mul_ps(ninf, vis, _mm512_loadu_ps(st[j]), sc);
        _mm512_storeu_ps(st[j], x);
        bm = _mm512_max_ps(bm, x);
    }
    const __m512 old = _mm512_loadu_ps(mx);
    const __m512 m = _mm512_max_ps(bm, old);
    /* exp(-inf - m) is 0 for the first visible block; a row with nothing visible yet keeps 1 */
    __m512 c = ckv_attn_exp16(_mm512_sub_ps(old, m));
    c = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(old, ninf, _CMP_EQ_OQ), c, _mm512_setzero_ps());
    c = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(m, ninf, _CMP_EQ_OQ), c, _mm512_set1_ps(1.0f));
    _mm512_storeu_ps(mx, m);
    _mm512_storeu_ps(corr, c);
    __m512 bs0 = _mm512_setzero_ps(), bs1 = _mm512_setzero_ps();
    int j = 0;
    for (; j + 2 <= nb; j += 2) {
        const __mmask16 v0 = _mm512_cmpgt_epi32_mask(cntv, _mm512_set1_epi32(jb + j));
        const __mmask16 v1 = _mm512_cmpgt_epi32_mask(cntv, _mm512_set1_epi32(jb + j + 1));
        const __m512 w0 = _mm512_maskz_mov_ps(v0, ckv_attn_exp16(_mm512_sub_ps(_mm512_loadu_ps(st[j]), m)));
        const __m512 w1 = _mm512_maskz_mov_ps(v1, ckv_attn_exp16(_mm512_sub_ps(_mm512_loadu_ps(st[j + 1]), m)));
        _mm512_storeu_ps(st[j], w0);
        _mm512_storeu_ps(st[j + 1], w1);
        bs0 = _mm512_add_ps(bs0, w0);
        bs1 = _mm512_add_ps(bs1, w1);
    }
    for (; j < nb; j++) {
        const __mmask16 v0 = _mm512_cmpgt_epi32_mask(cntv, _mm512_set1_epi32(jb + j));
        const __m512 w0 = _mm512_maskz_mov_ps(v0, ckv_attn_exp16(_mm512_sub_ps(_mm512_loadu_ps(st[j]), m)));
        _mm512_storeu_ps(st[j], w0);
        bs0 = _mm512_add_ps(bs0, w0);
    }
    for (j = nb; j < ((nb + 3) & ~3); j++) _mm512_storeu_ps(st[j], _mm512_setzero_ps()); /* padding of 4 keys */
    _mm512_storeu_ps(sum, _mm512_fmadd_ps(_mm512_loadu_ps(sum), c, _mm512_add_ps(bs0, bs1)));
}

static int ckv_attn_use_avx512(void) {
    static atomic_int state; /* 0 unknown, 1 no, 2 yes */
    int s = atomic_load_explicit(&state, memory_order_relaxed);
    if (s == 0) {
        __builtin_cpu_init();
        s = __builtin_cpu_supports("avx512f") ? 2 : 1;
        atomic_store_explicit(&state, s, memory_order_relaxed);
    }
    return s == 2;
}
#endif

/* Online softmax step over a block: masks keys a row does not see, updates the running max and
 * sum, turns st into weights and returns in corr the factor the accumulator must be scaled by. */
static void ckv_attn_lane_softmax(float st[][CKV_ATTN_LANES], int nb, int jb, const int *cnt, float scale, float *mx,
                                  float *sum, float *corr) {
    float bm[CKV_ATTN_LANES], bs[CKV_ATTN_LANES];
    for (int r = 0; r < CKV_ATTN_LANES; r++) bm[r] = -INFINITY;
    for (int j = 0; j < nb; j++)
        for (int r = 0; r < CKV_ATTN_LANES; r++) {
            float x = jb + j < cnt[r] ? st[j][r] * scale : -INFINITY;
            st[j][r] = x;
            bm[r] = x > bm[r] ? x : bm[r];
        }
    for (int r = 0; r < CKV_ATTN_LANES; r++) {
        float m = bm[r] > mx[r] ? bm[r] : mx[r];
        /* exp(-inf - m) is 0 for the first visible block; a row with nothing visible yet keeps 1 */
        corr[r] = m == -INFINITY ? 1.0f : mx[r] == -INFINITY ? 0.0f : ckv_cpu_expf(mx[r] - m);
        mx[r] = m;
        bs[r] = 0.0f;
    }
    /* the exps of the whole block in one branch-free pass (the vectoriser's SIMD code), then the mask */
    for (int j = 0; j < nb; j++)
        for (int r = 0; r < CKV_ATTN_LANES; r++) st[j][r] -= mx[r];
    ckv_fast_expf_n(&st[0][0], &st[0][0], (size_t)nb * CKV_ATTN_LANES);
    for (int j = 0; j < nb; j++)
        for (int r = 0; r < CKV_ATTN_LANES; r++) {
            float w = jb + j < cnt[r] ? st[j][r] : 0.0f;
            st[j][r] = w;
            bs[r] += w;
        }
    for (int j = nb; j < ((nb + 3) & ~3); j++) /* padding of the last group of 4 keys */
        for (int r = 0; r < CKV_ATTN_LANES; r++) st[j][r] = 0.0f;
    for (int r = 0; r < CKV_ATTN_LANES; r++) sum[r] = sum[r] * corr[r] + bs[r];
}

static void ckv_attn_tile_lanes(const ckv_attn_tile *tl) {
    const int hd = tl->hd;
    float qt[CKV_ATTN_LANE_HD * CKV_ATTN_LANES];  // [hd, lanes] queries, transposed
    float acc[CKV_ATTN_LANE_HD * CKV_ATTN_LANES]; // [hd, lanes] output accumulator, transposed
    float st[CKV_ATTN_BLOCK][CKV_ATTN_LANES];     // [block, lanes] scores, then weights
    float mx[CKV_ATTN_LANES], sum[CKV_ATTN_LANES], corr[CKV_ATTN_LANES];

    for (int d = 0; d < hd; d++)
        for (int r = 0; r < CKV_ATTN_LANES; r++) qt[d * CKV_ATTN_LANES + r] = r < tl->nr ? tl->q[r][d] : 0.0f;
    memset(acc, 0, (size_t)hd * CKV_ATTN_LANES * sizeof(float));
    for (int r = 0; r < CKV_ATTN_LANES; r++) {
        mx[r] = -INFINITY;
        sum[r] = 0.0f;
    }
#ifdef CKV_ATTN_HAVE_AVX512
    const int avx512 = ckv_attn_use_avx512();
#endif
    static _Thread_local float kbuf[CKV_ATTN_BLOCK * CKV_ATTN_LANE_HD]; // [block, hd] widened keys (F16/BF16)
    static _Thread_local float vbuf[CKV_ATTN_BLOCK * CKV_ATTN_LANE_HD]; // [block, hd] widened values
    for (int jb = 0; jb < tl->maxcnt; jb += CKV_ATTN_BLOCK) {
        const int nb = tl->maxcnt - jb < CKV_ATTN_BLOCK ? tl->maxcnt - jb : CKV_ATTN_BLOCK;
        const float *kb = ckv_attn_rows(tl->k, tl->dtype, jb, nb, hd, kbuf); // [nb, hd]
        const float *vb = ckv_attn_rows(tl->v, tl->dtype, jb, nb, hd, vbuf); // [nb, hd]
#ifdef CKV_ATTN_HAVE_AVX512
        if (avx512) {
            ckv_attn_lane_scores_avx512(st, kb, qt, nb, hd);
            ckv_attn_lane_softmax_avx512(st, nb, jb, tl->cnt, tl->scale, mx, sum, corr);
            ckv_attn_lane_pv_avx512(acc, vb, (const float(*)[CKV_ATTN_LANES])st, nb, hd, corr);
            continue;
        }
#endif
        ckv_attn_lane_scores(st, kb, qt, nb, hd);
        ckv_attn_lane_softmax(st, nb, jb, tl->cnt, tl->scale, mx, sum, corr);
        for (int d = 0; d < hd; d++)
            for (int r = 0; r < CKV_ATTN_LANES; r++) acc[d * CKV_ATTN_LANES + r] *= corr[r];
        ckv_attn_lane_pv(acc, vb, (const float(*)[CKV_ATTN_LANES])st, nb, hd);
    }
    for (int r = 0; r < tl->nr; r++) {
        float inv = tl->cnt[r] > 0 ? 1.0f / sum[r] : 0.0f; /* no visible key: the row is 0 */
        float *o = tl->out[r];
        if (tl->ms[r]) { /* a partial over one key range: the merge normalises */
            inv = 1.0f;
            tl->ms[r][0] = mx[r];
            tl->ms[r][1] = tl->cnt[r] > 0 ? sum[r] : 0.0f;
        }
        for (int d = 0; d < hd; d++) o[d] = acc[d * CKV_ATTN_LANES + r] * inv;
    }
}

/* ---- row kernel: any head_dim, tiles of 1-2 rows ----------------------------------------------
 * One query row at a time, accumulating in its output row; dot products with 16 partial sums. Each
 * row only visits its own visible keys. */

static inline float ckv_attn_dot(const float *restrict a, const float *restrict b, int n) {
    float acc[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    for (int l = 0; i < n; i++, l++) acc[l] += a[i] * b[i];
    for (int w = 8; w > 0; w >>= 1)
        for (int l = 0; l < w; l++) acc[l] += acc[l + w];
    return acc[0];
}

static inline void ckv_attn_axpy(float *restrict y, float a, const float *restrict x, int n) {
    for (int i = 0; i < n; i++) y[i] += a * x[i];
}

static inline void ckv_attn_scale(float *restrict y, float a, int n) {
    for (int i = 0; i < n; i++) y[i] *= a;
}

static void ckv_attn_exp_block(float *restrict p, float m, int nb) {
    for (int j = 0; j < nb; j++) p[j] = ckv_cpu_expf(p[j] - m);
}

static void ckv_attn_tile_rows(const ckv_attn_tile *tl) {
    const int hd = tl->hd;
    float p[CKV_ATTN_BLOCK]; // [block] scores, then weights
    static _Thread_local float kbuf[CKV_ATTN_BLOCK * CKV_ATTN_CONV_HD]; // [block, hd] widened keys (F16/BF16)
    static _Thread_local float vbuf[CKV_ATTN_BLOCK * CKV_ATTN_CONV_HD]; // [block, hd] widened values
    for (int r = 0; r < tl->nr; r++) {
        float *acc = tl->out[r]; // [hd]
        const float *q = tl->q[r];
        const int cnt = tl->cnt[r];
        float mx = -INFINITY, sum = 0.0f;
        memset(acc, 0, (size_t)hd * sizeof(float));
        for (int jb = 0; jb < cnt; jb += CKV_ATTN_BLOCK) {
            const int nb = cnt - jb < CKV_ATTN_BLOCK ? cnt - jb : CKV_ATTN_BLOCK;
            const float *kb = ckv_attn_rows(tl->k, tl->dtype, jb, nb, hd, kbuf); // [nb, hd]
            const float *vb = ckv_attn_rows(tl->v, tl->dtype, jb, nb, hd, vbuf); // [nb, hd]
            for (int j = 0; j < nb; j++) p[j] = ckv_attn_dot(q, kb + (size_t)j * (size_t)hd, hd) * tl->scale;
            float bmax = p[0];
            for (int j = 1; j < nb; j++) bmax = p[j] > bmax ? p[j] : bmax;
            if (bmax > mx) {
                if (sum > 0.0f) { /* rescale what was accumulated under the old max */
                    float corr = ckv_cpu_expf(mx - bmax);
                    sum *= corr;
                    ckv_attn_scale(acc, corr, hd);
                }
                mx = bmax;
            }
            ckv_attn_exp_block(p, mx, nb);
            for (int j = 0; j < nb; j++) sum += p[j];
            for (int j = 0; j < nb; j++) ckv_attn_axpy(acc, p[j], vb + (size_t)j * (size_t)hd, hd);
        }
        if (tl->ms[r]) { /* a partial over one key range: the merge normalises */
            tl->ms[r][0] = mx;
            tl->ms[r][1] = sum;
        } else if (cnt > 0) {
            ckv_attn_scale(acc, 1.0f / sum, hd); /* no visible key: the row stays 0 */
        }
    }
}

/* ---- work items ---------------------------------------------------------------------------- */

/* Partials of (sequence slot s, head g, range c, row r): [hd] accumulator, then max and sum. */
static float *ckv_attn_part(const ckv_attn_job *job, int s, int g, int c, int r) {
    const size_t rows = (size_t)job->rows_per_head[s], stride = (size_t)job->hd + 2;
    return job->ws + job->part0[s] + (((size_t)g * (size_t)job->split[s] + (size_t)c) * rows + (size_t)r) * stride;
}

static void ckv_attn_item(const ckv_attn_job *job, int item) {
    int s = 0;
    while (item >= job->item0[s + 1]) s++;
    const int local = item - job->item0[s];
    const int hd = job->hd, group = job->group, n_kv = job->n_kv;
    const int g = local % n_kv, split = job->split[s];
    const int c = split > 1 ? local / n_kv : 0; /* key range (split sequences have one tile) */
    const int tile = split > 1 ? 0 : job->tiles_per_head[s] - 1 - local / n_kv; /* latest tokens first */
    const int r0 = tile * job->tile[s];
    const ckv_kv_seg *seg = &job->kv->segs[job->seq0[s]][g];
    const int k0 = c * job->chunk[s], k1 = split > 1 ? k0 + job->chunk[s] : seg->len;
    const size_t rowb = (size_t)hd * ckv_dtype_size(job->kv->dtype);

    ckv_attn_tile tl;
    memset(&tl, 0, sizeof tl);
    tl.k = (const char *)seg->k + (size_t)k0 * rowb;
    tl.v = (const char *)seg->v + (size_t)k0 * rowb;
    tl.dtype = job->kv->dtype;
    tl.nr = job->rows_per_head[s] - r0 < job->tile[s] ? job->rows_per_head[s] - r0 : job->tile[s];
    tl.hd = hd;
    tl.scale = job->scale;
    for (int r = 0; r < tl.nr; r++) {
        const int row = r0 + r, t = job->tok0[s] + row / group, h = g * group + row % group;
        const size_t at = ((size_t)t * (size_t)job->n_heads + (size_t)h) * (size_t)hd;
        tl.q[r] = job->q + at;
        int vis = ckv_attn_visible(seg->pos, seg->len, job->qpos[t]); /* keys 0 .. vis-1 */
        vis = vis < k1 ? vis : k1;
        tl.cnt[r] = vis > k0 ? vis - k0 : 0;
        if (split > 1) {
            float *part = ckv_attn_part(job, s, g, c, row);
            tl.out[r] = part;
            tl.ms[r] = part + hd;
        } else {
            tl.out[r] = job->out + at;
        }
        if (tl.cnt[r] > tl.maxcnt) tl.maxcnt = tl.cnt[r];
    }
    if (tl.nr <= CKV_ATTN_GQA_ROWS && ckv_attn_tile_gqa_avx2(&tl)) return; /* decode: a GQA group's rows on AVX2 */
    if (hd <= CKV_ATTN_LANE_HD && tl.nr >= CKV_ATTN_LANE_MIN_ROWS)
        ckv_attn_tile_lanes(&tl);
    else
        ckv_attn_tile_rows(&tl);
}

static void ckv_attn_worker(void *arg, int begin, int end, int tid) {
    (void)begin;
    (void)end;
    (void)tid;
    ckv_attn_job *job = arg;
    for (;;) {
        int item = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (item >= job->n_items) break;
        ckv_attn_item(job, item);
    }
}

/* Merges the key-range partials of (sequence slot, head) items [begin, end) into the output rows:
 * rescaled to the largest max, in range order. */
static void ckv_attn_merge(void *arg, int begin, int end, int tid) {
    (void)tid;
    const ckv_attn_job *job = arg;
    const int hd = job->hd, group = job->group;
    for (int it = begin; it < end; it++) {
        const int s = it / job->n_kv, g = it % job->n_kv;
        if (job->split[s] <= 1) continue;
        for (int row = 0; row < job->rows_per_head[s]; row++) {
            const int t = job->tok0[s] + row / group, h = g * group + row % group;
            float *o = job->out + ((size_t)t * (size_t)job->n_heads + (size_t)h) * (size_t)hd;
            float m = -INFINITY;
            for (int c = 0; c < job->split[s]; c++) {
                const float *p = ckv_attn_part(job, s, g, c, row);
                if (p[hd + 1] > 0.0f && p[hd] > m) m = p[hd];
            }
            float sum = 0.0f;
            memset(o, 0, (size_t)hd * sizeof(float));
            for (int c = 0; c < job->split[s]; c++) {
                const float *p = ckv_attn_part(job, s, g, c, row);
                if (!(p[hd + 1] > 0.0f)) continue; /* a range the query sees nothing of */
                const float w = ckv_cpu_expf(p[hd] - m);
                sum += p[hd + 1] * w;
                ckv_attn_axpy(o, w, p, hd);
            }
            if (sum > 0.0f) ckv_attn_scale(o, 1.0f / sum, hd);
        }
    }
}

/* Tile size of a sequence with `rows` query rows per KV head: bigger tiles share key blocks among
 * more rows, smaller ones give each thread enough items. It depends on this sequence's shape only,
 * so a sequence gets the same arithmetic alone or in a batch, and for any thread count. */
static int ckv_attn_tile_size(int rows, int n_kv) {
    int tile = CKV_ATTN_LANES;
    while (tile > CKV_ATTN_MIN_TILE && n_kv * ((rows + tile - 1) / tile) < CKV_ATTN_MIN_ITEMS) tile /= 2;
    return tile;
}

/* How a sequence's keys are split: ranges of whole blocks, each >= CKV_ATTN_SPLIT_MIN keys. */
static void ckv_attn_split_plan(int rows, int tile, int max_len, int *split, int *chunk) {
    *split = 1;
    *chunk = max_len;
    if (rows > tile || max_len < 2 * CKV_ATTN_SPLIT_MIN) return;
    int n = max_len / CKV_ATTN_SPLIT_MIN;
    n = n < CKV_ATTN_MAX_SPLIT ? n : CKV_ATTN_MAX_SPLIT;
    int c = (max_len + n - 1) / n;
    c = (c + CKV_ATTN_BLOCK - 1) / CKV_ATTN_BLOCK * CKV_ATTN_BLOCK;
    *chunk = c;
    *split = (max_len + c - 1) / c;
}

void ckv_cpu_attention(ckv_backend *be, float *out, const ckv_attention_params *a) {
    const float *q = a->q;         // [n, n_heads, hd]
    const int32_t *qpos = a->qpos; // [n]
    const ckv_kv_batch *kv = a->kv;
    const int n = a->n, n_heads = a->n_heads;
    const float scale = a->scale;
    const int n_kv = kv->n_kv_heads, hd = kv->head_dim;
    if (n <= 0 || n_heads <= 0 || hd <= 0) return;
    if (n_kv <= 0 || n_heads % n_kv != 0 || kv->n_seq < 1 || (kv->dtype != CKV_DTYPE_F32 && hd > CKV_ATTN_CONV_HD)) {
        /* a caller bug this void op cannot report: make it loud rather than plausible */
        for (size_t i = 0; i < (size_t)n * (size_t)n_heads * (size_t)hd; i++) out[i] = NAN;
        return;
    }
    ckv_threadpool *pool = ckv_cpu_pool(be);
    const int n_threads = ckv_threadpool_size(pool);
    const ckv_cpu_ctx *ctx = be->ctx;
    ckv_attn_job job = {.out = out, .q = q, .qpos = qpos, .kv = kv, .n_heads = n_heads, .group = n_heads / n_kv,
                        .hd = hd, .n_kv = n_kv, .scale = scale, .ws = ctx->attn_ws};
    int s = 0;
    while (s < kv->n_seq) { /* passes of up to CKV_ATTN_MAX_SEQ sequences whose partials fit ws */
        size_t used = 0;
        int any_split = 0;
        job.n_seq = 0;
        job.item0[0] = 0;
        for (; s < kv->n_seq && job.n_seq < CKV_ATTN_MAX_SEQ; s++) {
            const int i = job.n_seq;
            const int t0 = kv->seq_start ? kv->seq_start[s] : 0, t1 = kv->seq_start ? kv->seq_start[s + 1] : n;
            int max_len = 0;
            for (int g = 0; g < n_kv; g++) max_len = kv->segs[s][g].len > max_len ? kv->segs[s][g].len : max_len;
            job.seq0[i] = s;
            job.tok0[i] = t0;
            job.rows_per_head[i] = (t1 - t0) * job.group;
            job.tile[i] = ckv_attn_tile_size(job.rows_per_head[i], n_kv);
            job.tiles_per_head[i] = (job.rows_per_head[i] + job.tile[i] - 1) / job.tile[i];
            ckv_attn_split_plan(job.rows_per_head[i], job.tile[i], max_len, &job.split[i], &job.chunk[i]);
            size_t need = job.split[i] > 1
                              ? (size_t)n_kv * (size_t)job.split[i] * (size_t)job.rows_per_head[i] * (size_t)(hd + 2)
                              : 0;
            if (need > ctx->attn_ws_floats) { /* never fits (a shape property): no split */
                job.split[i] = 1;
                need = 0;
            }
            if (used + need > ctx->attn_ws_floats) break; /* the next pass takes it */
            job.part0[i] = used;
            used += need;
            any_split |= job.split[i] > 1;
            job.item0[i + 1] = job.item0[i] + n_kv * job.tiles_per_head[i] * job.split[i];
            job.n_seq++;
        }
        job.n_items = job.item0[job.n_seq];
        atomic_init(&job.next, 0);
        if (job.n_items > 0)
            ckv_threadpool_for(pool, job.n_items < n_threads ? job.n_items : n_threads, 1, ckv_attn_worker, &job);
        if (any_split) ckv_threadpool_for(pool, job.n_seq * n_kv, 1, ckv_attn_merge, &job);
    }
}
