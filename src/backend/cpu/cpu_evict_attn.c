/* cpu_evict_attn.c - the CPU backend's eviction ops over attention weights: window / observed
 * attention column sums and weights (evict_attn_colsum, evict_attn_probs), chunked non-causal attention
 * column sums (evict_chunk_colsum) and the one-row softmax (evict_softmax_add). Semantics as in
 * backend.h. A segment's keys are packed once into the fp32 GEMM's weight panels: with an F32 cache
 * and several workers every segment the call reads, before the rows, its panels split over the
 * workers and shared by them; otherwise by each worker (converted to fp32 first for F16/BF16 caches,
 * ckv_gemm_pack_all) and kept while its rows read the same segment;
 * one-query calls (tova, finch's question rows) read them in place instead (the kernel set's dots:
 * the same sums, no pack for a handful of rows). The rows of a call are its query heads' queries,
 * head after head; a worker's consecutive rows of one KV head go through in strips of a few register
 * tiles (ckv_gemm_packed_rows, each strip's logits only up to its last row's visible key; a tile may
 * hold rows of two heads), and each strip is scaled, exponentiated (the sum taken in the same pass)
 * and summed or written while it is in L2, so no [n_q, n_keys] matrix is formed. The backend's pool
 * takes contiguous parts of the rows (per-query-head sums and weights: 9 heads x 64 queries split
 * 288 / 288 over 2 workers, not 5 / 4 heads), or of the output rows (per-KV-head sums: a KV head and
 * its query heads in ascending order; chunk_colsum: a KV head), each worker in its own workspace. A
 * worker whose part starts inside a query head keeps that head's rows aside and they are added after
 * the pool, after the rows of the workers before it, so every sum is added in the order one thread
 * adds it, whatever the thread count. Scratch is the backend's eviction scratch, not zeroed
 * (ckv_cpu_evict_scratch_raw: kept between calls). It selects nothing (CriticalKV's value norms: cpu_evict_vnorm.c). */
#include <math.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#include "core/quant.h"
#include "cpu_backend.h"
#include "cpu_gemm.h"

/* How evict_scaled_exp_row scales its row first. */
typedef enum { EVICT_SCALE_NONE, EVICT_SCALE_MUL, EVICT_SCALE_DIV } evict_scale_kind;

/* x * scale, x / scale or x, as `kind` says (an exact IEEE operation: the same bits in every lane). */
static inline float evict_scale_one(float x, float scale, evict_scale_kind kind) {
    return kind == EVICT_SCALE_DIV ? x / scale : kind == EVICT_SCALE_MUL ? x * scale : x;
}

/* x[0..n) <- exp(x - m) in fp32 (arguments <= 0: ckv_fast_expf_nonpos, in 16 lanes in an AVX-512 build:
 * ckv_fast_expf_nonpos16); returns their sum in double:
 * lane l of 8 adds x[l], x[l + 8], ... in order, the lanes are added ((0 + 4) + (1 + 5)) + ((2 + 6) +
 * (3 + 7)), then the last n % 8 values one by one. Each exponential is added while it is in a register. */
static double evict_exp_sum(float *x, int n, float m) {
    double sl[8] = {0};
    int i = 0;
#ifdef __AVX512F__
    const __m512 mv = _mm512_set1_ps(m);
    __m512d acc = _mm512_setzero_pd(); /* lane l: sl[l] */
    for (; i + 16 <= n; i += 16) {
        const __m512 e = ckv_fast_expf_nonpos16(_mm512_sub_ps(_mm512_loadu_ps(x + i), mv)); /* its bits, 16 lanes */
        _mm512_storeu_ps(x + i, e);
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        acc = _mm512_add_pd(acc, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    _mm512_storeu_pd(sl, acc);
#endif
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            x[i + l] = ckv_fast_expf_nonpos(x[i + l] - m);
            sl[l] += x[i + l];
        }
    double sum = ((sl[0] + sl[4]) + (sl[1] + sl[5])) + ((sl[2] + sl[6]) + (sl[3] + sl[7]));
    for (; i < n; i++) {
        x[i] = ckv_fast_expf_nonpos(x[i] - m);
        sum += x[i];
    }
    return sum;
}

/* x[0..n) <- exp(s(x) - max s(x)) in fp32 (n >= 1), s the scaling of `kind` applied in the same pass
 * as the maximum; returns (float)(1 / sum), the sum in double. */
static float evict_scaled_exp_row(float *x, int n, float scale, evict_scale_kind kind) {
    float ml[16]; /* independent lanes: lane l takes x[l], x[l + 16], ... */
    int i = 0;
    int e2;
    if (kind == EVICT_SCALE_DIV && frexpf(scale, &e2) == 0.5f && e2 > -125 && e2 < 126) {
        /* x / 2^k and x * 2^-k round the same real number: the same bits, without the division
         * (sqrt(head_dim) for head_dim 16, 64, 256) */
        scale = ldexpf(1.0f, 1 - e2);
        kind = EVICT_SCALE_MUL;
    }
    x[0] = evict_scale_one(x[0], scale, kind);
#ifdef __AVX512F__
    /* vmaxps(a, b) = a > b ? a : b lane by lane (b when either is NaN): the comparison of the loop below,
     * which the compiler does not vectorise; x[0], scaled already, is scaled once only */
    const __m512 sv = _mm512_set1_ps(scale);
    __m512 mv = _mm512_set1_ps(x[0]);
    if (n >= 16) {
        __m512 v = _mm512_loadu_ps(x);
        if (kind == EVICT_SCALE_DIV) v = _mm512_mask_div_ps(v, (__mmask16)0xFFFE, v, sv);
        else if (kind == EVICT_SCALE_MUL) v = _mm512_mask_mul_ps(v, (__mmask16)0xFFFE, v, sv);
        _mm512_storeu_ps(x, v);
        mv = _mm512_max_ps(v, mv);
        i = 16;
    }
    for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_loadu_ps(x + i);
        if (kind == EVICT_SCALE_DIV) v = _mm512_div_ps(v, sv);
        else if (kind == EVICT_SCALE_MUL) v = _mm512_mul_ps(v, sv);
        _mm512_storeu_ps(x + i, v);
        mv = _mm512_max_ps(v, mv);
    }
    _mm512_storeu_ps(ml, mv);
#else
    for (int l = 0; l < 16; l++) ml[l] = x[0];
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) {
            if (i + l > 0) x[i + l] = evict_scale_one(x[i + l], scale, kind);
            ml[l] = x[i + l] > ml[l] ? x[i + l] : ml[l];
        }
#endif
    float m = ml[0];
    for (int l = 1; l < 16; l++) m = ml[l] > m ? ml[l] : m;
    for (; i < n; i++) {
        if (i > 0) x[i] = evict_scale_one(x[i], scale, kind);
        m = x[i] > m ? x[i] : m;
    }
    return (float)(1.0 / evict_exp_sum(x, n, m));
}

/* x[0..n) <- exp(x - max x) in fp32 (n >= 1); returns (float)(1 / sum), the sum in double. */
static float evict_exp_row(float *x, int n) { return evict_scaled_exp_row(x, n, 1.0f, EVICT_SCALE_NONE); }

/* Scratch of one worker: one segment's packed keys, one strip's queries, logits and softmax scales,
 * and the rows of a query head the worker shares with the worker before it (column-sum jobs split by
 * rows), kept for evict_attn_run to add after that worker's. */
typedef struct {
    float *kp;       // [ckv_gemm_packed_floats(d, n_keys)] keys of segment kp_g packed for the GEMM
    float *keys;     // [n_keys, d] fp32 keys of one segment (F16/BF16 caches only)
    const float *kd; // segment kp_g's fp32 keys [n_keys, d] read in place by arch->dots (direct jobs)
    float *qs;       // [CKV_CPU_ATTN_STRIP rows, d] one strip's query rows, contiguous
    float *logits;   // [CKV_CPU_ATTN_STRIP rows, n_keys] one strip of queries' logits
    float *inv;      // [CKV_CPU_ATTN_STRIP] 1 / sum of each strip row's exponentials
    float *def;      // [n_q, n_keys] exponentials of the deferred rows (row = query; row-split jobs only)
    float *def_inv;  // [n_q] their 1 / sum
    int def_head;    // the local query head whose first rows the worker before holds (-1: none)
    int def_i0, def_i1; // its deferred queries [def_i0, def_i1)
    int kp_g;        // the segment kp (or kd) holds (-1: none yet)
} evict_attn_ws;

/* Query rows per strip: a few register tiles whose logits stay in L2 at a few thousand keys. */
static int evict_strip_rows(const ckv_gemm_arch *a) { return 2 * a->mr; }
#define CKV_CPU_ATTN_STRIP_MAX (2 * CKV_GEMM_MR_MAX)

#define EVICT_ROUND16(x) (((x) + 15) & ~(size_t)15)

/* Floats of one worker's workspace for n_keys keys (the logits rows: n_cols; packed keys unless
 * `direct`; n_def deferred rows), each part rounded to 16 floats so the next stays 64-byte aligned. */
static size_t evict_attn_ws_floats(const ckv_gemm_arch *arch, const ckv_kv_batch *kv, int n_keys, size_t n_cols,
                                   int direct, int n_def) {
    const size_t d = (size_t)kv->head_dim;
    size_t f = (direct ? 0 : EVICT_ROUND16(ckv_gemm_packed_floats(arch, (int)d, n_keys))) +
               EVICT_ROUND16((size_t)CKV_CPU_ATTN_STRIP_MAX * d) +
               EVICT_ROUND16((size_t)CKV_CPU_ATTN_STRIP_MAX * n_cols) + EVICT_ROUND16((size_t)CKV_CPU_ATTN_STRIP_MAX);
    if (kv->dtype != CKV_DTYPE_F32) f += EVICT_ROUND16((size_t)n_keys * d);
    if (n_def > 0) f += EVICT_ROUND16((size_t)n_def * (size_t)n_keys) + EVICT_ROUND16((size_t)n_def);
    return f;
}

/* w's parts carved from `at` (evict_attn_ws_floats of them). */
static void evict_attn_ws_carve(evict_attn_ws *w, float *at, const ckv_gemm_arch *arch, const ckv_kv_batch *kv,
                                int n_keys, size_t n_cols, int direct, int n_def) {
    const size_t d = (size_t)kv->head_dim;
    memset(w, 0, sizeof *w);
    w->kp_g = -1;
    w->def_head = -1;
    if (!direct) {
        w->kp = at;
        at += EVICT_ROUND16(ckv_gemm_packed_floats(arch, (int)d, n_keys));
    }
    w->qs = at;
    at += EVICT_ROUND16((size_t)CKV_CPU_ATTN_STRIP_MAX * d);
    w->logits = at;
    at += EVICT_ROUND16((size_t)CKV_CPU_ATTN_STRIP_MAX * n_cols);
    w->inv = at;
    at += EVICT_ROUND16((size_t)CKV_CPU_ATTN_STRIP_MAX);
    if (kv->dtype != CKV_DTYPE_F32) {
        w->keys = at;
        at += EVICT_ROUND16((size_t)n_keys * d);
    }
    if (n_def > 0) {
        w->def = at;
        at += EVICT_ROUND16((size_t)n_def * (size_t)n_keys);
        w->def_inv = at;
    }
}
#undef EVICT_ROUND16

/* Rows row0 .. row0 + n of segment g's keys for the GEMM (unless w holds segment g already: the rows
 * an op reads are the same for every segment of one call): packed into w->kp, or with `direct` left
 * in place for arch->dots (w->kd; F16/BF16 caches converted to fp32 first in either case). */
static void evict_pack_keys(evict_attn_ws *w, const ckv_gemm_arch *arch, const ckv_kv_batch *kv, int g, int row0,
                            int n, int direct) {
    if (w->kp_g == g) return;
    const size_t d = (size_t)kv->head_dim, esz = ckv_dtype_size(kv->dtype);
    const char *src = (const char *)kv->segs[0][g].k + (size_t)row0 * d * esz;
    const float *K = (const float *)(const void *)src; // [n, d]
    if (kv->dtype != CKV_DTYPE_F32) {
        ckv_convert_to_f32(w->keys, src, kv->dtype, (size_t)n * d);
        K = w->keys;
    }
    if (direct)
        w->kd = K;
    else
        ckv_gemm_pack_all(arch, w->kp, K, (int)d, n);
    w->kp_g = g;
}

/* Scratch all workers of one call may hold together (at least one worker's, however large). */
#define CKV_CPU_ATTN_SCRATCH_BYTES ((size_t)64 << 20)

/* One call of evict_attn_colsum / evict_attn_probs / evict_chunk_colsum: its arguments and one
 * workspace per worker. */
typedef struct evict_attn_job {
    const ckv_gemm_arch *arch;
    evict_attn_ws *ws; // [workers]
    const float *q;
    int n_q, q_row0, n_heads_local, head0, group, divide, per_kv;
    int n_pad;      /* chunk_colsum: padding queries and keys */
    const ckv_kv_batch *kv;
    float scale;
    double *colsum; /* colsum: [n_out, n_cols] */
    int n_cols;
    float *p;       /* probs: [n_heads_local, n_q, ld] */
    int ld;
    int n_keys;     /* keys a worker packs: q_row0 + n_q (chunk: n_q) */
    int direct;     /* logits by arch->dots over the keys in place, no packing (one-query calls) */
    float *kp_all;  /* [n_g, ckv_gemm_packed_floats(d, n_keys)] packed keys of segments g0 .. g0 + n_g - 1
                       shared by every worker (F32 caches, several workers), or NULL: a pack per worker */
    int g0, n_g;
    int row_split;  /* the units are the rows of the run (query head j's query i: unit j * n_q + i) */
    int n_rows;     /* output rows (the units unless row_split) */
    int n_units, workers; /* work units, split into `workers` contiguous parts */
    void (*rows)(const struct evict_attn_job *jb, int begin, int end, evict_attn_ws *w);
} evict_attn_job;

/* The rows of a call: local query head j's n_q queries are rows j * n_q .. j * n_q + n_q - 1 (query i
 * at context row q_row0 + i), the heads in ascending order. A strip of them may hold rows of several
 * heads of one KV head, so a register tile is filled across the heads (64 queries of 3 heads: 14
 * tiles of 14 rows instead of 15 partly empty). */
static int run_head(const evict_attn_job *jb, int R) { return R / jb->n_q; }
static int run_query(const evict_attn_job *jb, int R) { return R % jb->n_q; }

/* What a job does with one strip's weights (rows R0 .. R0 + ns). */
typedef void (*evict_strip_fn)(const struct evict_attn_job *jb, const evict_attn_ws *w, int R0, int ns);

/* Softmax weights of rows R0 .. R0 + ns over the keys w holds, into w->logits (row R - R0, stride
 * n_keys, valid for the row's visible columns 0 .. q_row0 + query), scaled by w->inv[R - R0]
 * (weight = logits[.., t] * inv). The strip's query rows are copied contiguous first; its logits go
 * only up to the last key any of its rows sees. */
static void evict_strip_weights(const evict_attn_job *jb, evict_attn_ws *w, int R0, int ns) {
    const int d = jb->kv->head_dim;
    const size_t hq = (size_t)jb->n_heads_local * (size_t)d;
    int n_vis = 0;
    for (int r = 0; r < ns; r++) {
        const int i = run_query(jb, R0 + r), j = run_head(jb, R0 + r);
        memcpy(w->qs + (size_t)r * (size_t)d, jb->q + (size_t)i * hq + (size_t)j * (size_t)d,
               (size_t)d * sizeof(float));
        n_vis = jb->q_row0 + i + 1 > n_vis ? jb->q_row0 + i + 1 : n_vis;
    }
    if (jb->direct)
        jb->arch->dots(ns, d, w->qs, (size_t)d, w->kd, (size_t)d, n_vis, w->logits, (size_t)jb->n_keys);
    else
        ckv_gemm_packed_rows(jb->arch, w->logits, (size_t)jb->n_keys, w->qs, (size_t)d, w->kp, ns, d, n_vis);
    for (int r = 0; r < ns; r++)
        w->inv[r] = evict_scaled_exp_row(w->logits + (size_t)r * (size_t)jb->n_keys,
                                         jb->q_row0 + run_query(jb, R0 + r) + 1, jb->scale,
                                         jb->divide ? EVICT_SCALE_DIV : EVICT_SCALE_MUL);
}

/* Rows [R_begin, R_end) in runs of rows whose query heads share a KV head, each run strip by strip
 * over its KV head's keys, each strip's weights to fn: the rows in ascending order. */
static void evict_row_runs(const evict_attn_job *jb, evict_attn_ws *w, int R_begin, int R_end, evict_strip_fn fn) {
    const int S = evict_strip_rows(jb->arch);
    for (int R0 = R_begin; R0 < R_end;) {
        const int g = (jb->head0 + run_head(jb, R0)) / jb->group;
        int j = run_head(jb, R0) + 1;
        while (j < jb->n_heads_local && (jb->head0 + j) / jb->group == g) j++;
        const int R1 = j * jb->n_q < R_end ? j * jb->n_q : R_end;
        if (jb->kp_all && w->kp_g != g) { /* packed before the rows, by all workers */
            w->kp = jb->kp_all + (size_t)(g - jb->g0) * ckv_gemm_packed_floats(jb->arch, jb->kv->head_dim, jb->n_keys);
            w->kp_g = g;
        }
        evict_pack_keys(w, jb->arch, jb->kv, g, 0, jb->n_keys, jb->direct);
        for (int s0 = R0; s0 < R1; s0 += S) {
            const int ns = R1 - s0 < S ? R1 - s0 : S;
            evict_strip_weights(jb, w, s0, ns);
            fn(jb, w, s0, ns);
        }
        R0 = R1;
    }
}

/* cs[t] += (double)(logits[i, t] * inv[i]) for rows i < ns in order, row i over its first
 * min(vis0 + i, n_cols) columns (rows ld floats apart), row by row: with ld a multiple of 1,024 the
 * rows lie 4 KiB multiples apart, and reading them side by side (column blocks) shares L1 sets (an
 * evict_window_colsum case at 4,096 keys ran slower that way). */
static void colsum_add_rows(double *restrict cs, const float *logits, size_t ld, const float *inv, int ns, int vis0,
                            int n_cols) {
    for (int i = 0; i < ns; i++) {
        const float *row = logits + (size_t)i * ld;
        const int n_vis = vis0 + i, nc = n_vis < n_cols ? n_vis : n_cols;
        const float f = inv[i];
        for (int t = 0; t < nc; t++) cs[t] += (double)(row[t] * f);
    }
}

/* The output row of local query head j in a column-sum job (per_kv: its KV head). */
static int colsum_row_of(const evict_attn_job *jb, int j) { return jb->per_kv ? (jb->head0 + j) / jb->group : j; }

/* colsum[row of its head, t] += (double)p_t for the strip's rows in order, each head's rows as one
 * block; the rows of w->def_head are kept in w->def instead (the worker before adds that head's first
 * rows; evict_attn_run adds these after them). */
static void colsum_strip(const evict_attn_job *jb, const evict_attn_ws *w, int R0, int ns) {
    const size_t nk = (size_t)jb->n_keys;
    for (int r = 0; r < ns;) {
        const int j = run_head(jb, R0 + r), i = run_query(jb, R0 + r);
        const int nr = jb->n_q - i < ns - r ? jb->n_q - i : ns - r; /* this head's rows of the strip */
        if (j == w->def_head) {
            for (int k = 0; k < nr; k++) {
                const int vis = jb->q_row0 + i + k + 1, nc = vis < jb->n_cols ? vis : jb->n_cols;
                memcpy(w->def + (size_t)(i + k - w->def_i0) * nk, w->logits + (size_t)(r + k) * nk,
                       (size_t)nc * sizeof(float));
                w->def_inv[i + k - w->def_i0] = w->inv[r + k];
            }
        } else {
            colsum_add_rows(jb->colsum + (size_t)colsum_row_of(jb, j) * (size_t)jb->n_cols,
                            w->logits + (size_t)r * nk, nk, w->inv + r, nr, jb->q_row0 + i + 1, jb->n_cols);
        }
        r += nr;
    }
}

/* p[j, i, :] = the strip's weights, zero past each row's visible keys. */
static void probs_strip(const evict_attn_job *jb, const evict_attn_ws *w, int R0, int ns) {
    for (int r = 0; r < ns; r++) {
        const int j = run_head(jb, R0 + r), i = run_query(jb, R0 + r);
        const float *row = w->logits + (size_t)r * (size_t)jb->n_keys;
        float *dst = jb->p + ((size_t)j * (size_t)jb->n_q + (size_t)i) * (size_t)jb->ld;
        const int n_vis = jb->q_row0 + i + 1;
        const float f = w->inv[r];
        for (int t = 0; t < n_vis; t++) dst[t] = row[t] * f;
        for (int t = n_vis; t < jb->ld; t++) dst[t] = 0.0f;
    }
}

/* Units [begin, end) of a column-sum job. With row_split, rows [begin, end); a part starting inside a
 * query head defers that head's rows (w->def_head). Otherwise output rows: row r is local query head
 * r, or (per_kv) KV head r with its local query heads in ascending order (a contiguous range of them). */
static void colsum_rows(const evict_attn_job *jb, int begin, int end, evict_attn_ws *w) {
    if (jb->row_split) {
        if (run_query(jb, begin) != 0) {
            const int j = run_head(jb, begin), head_end = (j + 1) * jb->n_q;
            w->def_head = j;
            w->def_i0 = run_query(jb, begin);
            w->def_i1 = (end < head_end ? end : head_end) - j * jb->n_q;
        }
        evict_row_runs(jb, w, begin, end, colsum_strip);
        return;
    }
    int j_begin = 0, j_end;
    while (j_begin < jb->n_heads_local && colsum_row_of(jb, j_begin) < begin) j_begin++;
    for (j_end = j_begin; j_end < jb->n_heads_local && colsum_row_of(jb, j_end) < end;) j_end++;
    evict_row_runs(jb, w, j_begin * jb->n_q, j_end * jb->n_q, colsum_strip);
}

/* Rows [begin, end) of a weights job (its units are rows: each is written on its own). */
static void probs_rows(const evict_attn_job *jb, int begin, int end, evict_attn_ws *w) {
    evict_row_runs(jb, w, begin, end, probs_strip);
}

/* KV heads [begin, end) of a chunk job: each one's local query heads in ascending order, their
 * queries over the chunk's own n_q keys and n_pad padding keys (logit -1e-9), then the padding
 * queries (logit 0 on every real key), all in fp32 (logits (q . k) * scale). */
static void chunk_rows(const evict_attn_job *jb, int begin, int end, evict_attn_ws *w) {
    const int S = evict_strip_rows(jb->arch), n_q = jb->n_q, n_pad = jb->n_pad, n_keys = n_q + n_pad;
    for (int j = 0; j < jb->n_heads_local; j++) {
        const int g = (jb->head0 + j) / jb->group;
        if (g < begin || g >= end) continue;
        evict_pack_keys(w, jb->arch, jb->kv, g, jb->q_row0, n_q, 0);
        double *restrict cs = jb->colsum + (size_t)g * (size_t)jb->n_cols + jb->q_row0;
        for (int i0 = 0; i0 < n_q; i0 += S) {
            const int ns = n_q - i0 < S ? n_q - i0 : S;
            const size_t hq = (size_t)jb->n_heads_local * (size_t)jb->kv->head_dim;
            ckv_gemm_packed_rows(jb->arch, w->logits, (size_t)n_keys,
                                 jb->q + (size_t)i0 * hq + (size_t)j * (size_t)jb->kv->head_dim, hq, w->kp, ns,
                                 jb->kv->head_dim, n_q); /* [ns, n_q] */
            for (int i = 0; i < ns; i++) {
                float *row = w->logits + (size_t)i * (size_t)n_keys;
                for (int t = 0; t < n_q; t++) row[t] *= jb->scale;
                for (int t = n_q; t < n_keys; t++) row[t] = -1e-9f;
                const float f = evict_exp_row(row, n_keys);
                for (int t = 0; t < n_q; t++) cs[t] += (double)(row[t] * f);
            }
        }
        if (n_pad > 0) { /* one padding query: every one weighs the same */
            float *row = w->logits;
            for (int t = 0; t < n_q; t++) row[t] = 0.0f;
            for (int t = n_q; t < n_keys; t++) row[t] = -1e-9f;
            const float f = evict_exp_row(row, n_keys);
            for (int rep = 0; rep < n_pad; rep++)
                for (int t = 0; t < n_q; t++) cs[t] += (double)(row[t] * f);
        }
    }
}

/* Panels [begin, end) of the shared packs: panel u is panel u % n_panels of segment g0 + u / n_panels
 * (ckv_gemm_pack_all's panels, one by one). */
static void pack_worker(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const evict_attn_job *jb = ctx;
    const int d = jb->kv->head_dim, nr = jb->arch->nr, n_panels = (jb->n_keys + nr - 1) / nr;
    const size_t per_g = ckv_gemm_packed_floats(jb->arch, d, jb->n_keys), panel = (size_t)d * (size_t)nr;
    for (int u = begin; u < end; u++) {
        const int g = jb->g0 + u / n_panels, q = u % n_panels, j0 = q * nr;
        const float *K = (const float *)jb->kv->segs[0][g].k; // [n_keys, d]
        jb->arch->pack(d, K + (size_t)j0 * (size_t)d, (size_t)d, jb->n_keys - j0 < nr ? jb->n_keys - j0 : nr,
                       jb->kp_all + (size_t)(g - jb->g0) * per_g + (size_t)q * panel);
    }
}

/* Worker w of a job: its contiguous part of the output rows, in its own workspace. */
static void attn_worker(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const evict_attn_job *jb = ctx;
    for (int w = begin; w < end; w++) {
        int r0, r1;
        ckv_cpu_part(jb->n_units, jb->workers, w, &r0, &r1);
        if (r1 > r0) jb->rows(jb, r0, r1, &jb->ws[w]);
    }
}

/* Runs the job's rows over its units on the backend's pool, with a workspace per worker sized for
 * jb->n_keys keys (the logits rows: jb->n_keys + jb->n_pad); a column-sum job split by rows then adds
 * each worker's deferred rows, worker by worker, after the rows of the workers before it. */
static ckv_status evict_attn_run(ckv_backend *be, evict_attn_job *jb) {
    ckv_threadpool *pool = ckv_cpu_pool(be);
    jb->arch = ckv_gemm_best_arch();
    if (jb->direct && !jb->arch->dots) jb->direct = 0;
    int workers = pool ? ckv_threadpool_size(pool) : 1;
    const size_t n_cols = (size_t)jb->n_keys + (size_t)jb->n_pad;
    /* a column-sum job split by rows keeps up to n_q deferred rows per worker; when that does not fit,
     * it is split by output rows */
    int n_def = jb->row_split && jb->colsum && workers > 1 && jb->n_q > 1 ? jb->n_q : 0;
    if (n_def > 0 && (size_t)workers * evict_attn_ws_floats(jb->arch, jb->kv, jb->n_keys, n_cols, jb->direct, n_def) *
                             sizeof(float) > CKV_CPU_ATTN_SCRATCH_BYTES) {
        jb->row_split = 0;
        n_def = 0;
    }
    jb->n_units = jb->row_split ? jb->n_heads_local * jb->n_q : jb->n_rows;
    if (workers > jb->n_units) workers = jb->n_units;
    if (workers > CKV_CPU_MAX_TASK_WORKERS) workers = CKV_CPU_MAX_TASK_WORKERS;
    /* F32 keys read by several workers (not chunk_colsum's own rows): every segment packed once, the
     * panels split over the workers, before the rows; when they do not fit, a pack per worker */
    jb->g0 = jb->head0 / jb->group;
    jb->n_g = (jb->head0 + jb->n_heads_local - 1) / jb->group - jb->g0 + 1;
    const size_t per_g = ckv_gemm_packed_floats(jb->arch, jb->kv->head_dim, jb->n_keys);
    int share = !jb->direct && jb->rows != chunk_rows && jb->kv->dtype == CKV_DTYPE_F32 && workers > 1;
    const size_t per_own = evict_attn_ws_floats(jb->arch, jb->kv, jb->n_keys, n_cols, jb->direct, n_def);
    const size_t per_shared = evict_attn_ws_floats(jb->arch, jb->kv, jb->n_keys, n_cols, 1, n_def);
    if (share && ((size_t)jb->n_g * per_g + (size_t)workers * per_shared) * sizeof(float) > CKV_CPU_ATTN_SCRATCH_BYTES)
        share = 0;
    const size_t per = share ? per_shared : per_own; /* floats */
    const size_t shared = share ? (size_t)jb->n_g * per_g : 0;
    while (workers > 1 && (size_t)workers * per * sizeof(float) > CKV_CPU_ATTN_SCRATCH_BYTES) workers--;
    if (workers < 1) workers = 1;
    /* not zeroed: every part is written before it is read (packs with their zero columns, a strip's
     * queries and logits up to its visible keys, the deferred rows as far as they are added); zeroing
     * 6 MB per layer on SmolLM2 at 4K took about a fifth of the micro-kernel's time */
    float *scratch = NULL;
    CKV_TRY(ckv_cpu_evict_scratch_raw(be, (shared + (size_t)workers * per) * sizeof(float), (void **)&scratch));
    evict_attn_ws ws[CKV_CPU_MAX_TASK_WORKERS];
    for (int w = 0; w < workers; w++)
        evict_attn_ws_carve(&ws[w], scratch + shared + (size_t)w * per, jb->arch, jb->kv, jb->n_keys, n_cols,
                            share || jb->direct, n_def);
    jb->ws = ws;
    jb->workers = workers;
    jb->kp_all = share ? scratch : NULL;
    if (share)
        ckv_threadpool_for(pool, jb->n_g * ((jb->n_keys + jb->arch->nr - 1) / jb->arch->nr), 8, pack_worker, jb);
    if (workers > 1)
        ckv_threadpool_for(pool, workers, 1, attn_worker, jb);
    else
        attn_worker(jb, 0, 1, 0);
    for (int w = 1; w < workers; w++) {
        const evict_attn_ws *x = &ws[w];
        if (x->def_head >= 0)
            colsum_add_rows(jb->colsum + (size_t)colsum_row_of(jb, x->def_head) * (size_t)jb->n_cols, x->def,
                            (size_t)jb->n_keys, x->def_inv, x->def_i1 - x->def_i0, jb->q_row0 + x->def_i0 + 1,
                            jb->n_cols);
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_cpu_evict_attn_colsum(ckv_backend *be, double *colsum, int n_cols, const ckv_evict_attn_params *a,
                                     ckv_evict_colsum_rows rows, ckv_evict_accum accum) {
    const int per_kv = rows == CKV_EVICT_PER_KV_HEAD;
    const int n_out = per_kv ? a->kv->n_kv_heads : a->n_heads_local;
    if (accum == CKV_EVICT_ZERO_FIRST) memset(colsum, 0, (size_t)n_out * (size_t)n_cols * sizeof(double));
    if (a->n_q < 1) return CKV_STATUS_OK;
    evict_attn_job jb = {.q = a->q, .n_q = a->n_q, .q_row0 = a->q_row0, .n_heads_local = a->n_heads_local,
                         .head0 = a->head0, .group = a->group, .divide = a->logits == CKV_EVICT_LOGITS_DIV,
                         .per_kv = per_kv, .kv = a->kv, .scale = a->scale, .colsum = colsum, .n_cols = n_cols,
                         .n_keys = a->q_row0 + a->n_q, .direct = a->n_q == 1, .row_split = !per_kv,
                         .n_rows = n_out, .rows = colsum_rows};
    return evict_attn_run(be, &jb);
}

ckv_status ckv_cpu_evict_attn_probs(ckv_backend *be, float *p, int ld, const ckv_evict_attn_params *a) {
    if (a->n_q < 1) return CKV_STATUS_OK;
    evict_attn_job jb = {.q = a->q, .n_q = a->n_q, .q_row0 = a->q_row0, .n_heads_local = a->n_heads_local,
                         .head0 = a->head0, .group = a->group, .divide = a->logits == CKV_EVICT_LOGITS_DIV,
                         .kv = a->kv, .scale = a->scale, .p = p, .ld = ld, .n_keys = a->q_row0 + a->n_q,
                         .direct = a->n_q == 1, .row_split = 1, .n_rows = a->n_heads_local, .rows = probs_rows};
    return evict_attn_run(be, &jb);
}

ckv_status ckv_cpu_evict_chunk_colsum(ckv_backend *be, double *colsum, int n_cols, const ckv_evict_attn_params *a,
                                      int n_pad, ckv_evict_accum accum) {
    if (a->logits != CKV_EVICT_LOGITS_MUL)
        return ckv_error(CKV_STATUS_ERR_ARG, "evict_chunk_colsum: logits are (q . k) * scale; dividing is not offered");
    if (accum == CKV_EVICT_ZERO_FIRST) memset(colsum, 0, (size_t)a->kv->n_kv_heads * (size_t)n_cols * sizeof(double));
    if (a->n_q < 1) return CKV_STATUS_OK;
    evict_attn_job jb = {.q = a->q, .n_q = a->n_q, .q_row0 = a->q_row0, .n_heads_local = a->n_heads_local,
                         .head0 = a->head0, .group = a->group, .n_pad = n_pad, .kv = a->kv, .scale = a->scale,
                         .colsum = colsum, .n_cols = n_cols, .n_keys = a->n_q, .n_rows = a->kv->n_kv_heads,
                         .rows = chunk_rows};
    return evict_attn_run(be, &jb);
}

void ckv_cpu_evict_softmax_add(ckv_backend *be, float *dst, float *x, int n) {
    (void)be;
    const float inv = evict_exp_row(x, n);
    for (int t = 0; t < n; t++) dst[t] += x[t] * inv;
}
