/* cpu_evict_attn.c - the CPU backend's eviction ops over attention weights: window / observed
 * attention column sums and weights (evict_attn_colsum, evict_attn_probs), chunked non-causal attention
 * column sums (evict_chunk_colsum) and the one-row softmax (evict_softmax_add). Semantics as in
 * backend.h. A segment's keys (converted to fp32 first for F16/BF16 caches) are packed once into the
 * fp32 GEMM's weight panels (ckv_gemm_pack_all) and kept while a worker's query heads read the same
 * segment; the queries of a worker's consecutive query heads of one KV head go through as one
 * sequence of rows, head after head, in strips of a few register tiles (ckv_gemm_packed_rows, each
 * strip's logits only up to its last row's visible key; a tile may hold rows of two heads, so only a
 * worker's last tile per KV head is partly empty), and each strip is scaled, exponentiated and summed or written
 * while it is in L2, so no [n_q, n_keys] matrix is formed. The backend's pool takes
 * output rows (a query head, or with per-KV-head sums a KV head and its query heads in ascending
 * order; chunk_colsum: a KV head), each worker in its own workspace, so every sum is added in the
 * order one thread adds it, whatever the thread count. Scratch is the backend's eviction scratch
 * (ckv_cpu_evict_scratch: kept between calls). It selects nothing (CriticalKV's value norms: cpu_evict_vnorm.c). */
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
    for (i = 0; i < n; i++) x[i] = ckv_cpu_expf(x[i] - m); /* arguments <= 0 */
    double sl[8] = {0};
    for (i = 0; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) sl[l] += x[i + l];
    double sum = ((sl[0] + sl[4]) + (sl[1] + sl[5])) + ((sl[2] + sl[6]) + (sl[3] + sl[7]));
    for (; i < n; i++) sum += x[i];
    return (float)(1.0 / sum);
}

/* x[0..n) <- exp(x - max x) in fp32 (n >= 1); returns (float)(1 / sum), the sum in double. */
static float evict_exp_row(float *x, int n) { return evict_scaled_exp_row(x, n, 1.0f, EVICT_SCALE_NONE); }

/* Scratch of one worker: one segment's packed keys, one strip's queries, logits and softmax scales. */
typedef struct {
    float *kp;     // [ckv_gemm_packed_floats(d, n_keys)] keys of segment kp_g packed for the GEMM
    float *keys;   // [n_keys, d] fp32 keys of one segment (F16/BF16 caches only)
    float *qs;     // [CKV_CPU_ATTN_STRIP rows, d] one strip's query rows, contiguous
    float *logits; // [CKV_CPU_ATTN_STRIP rows, n_keys] one strip of queries' logits
    float *inv;    // [CKV_CPU_ATTN_STRIP] 1 / sum of each strip row's exponentials
    int kp_g;      // the segment kp holds (-1: none yet)
} evict_attn_ws;

/* Query rows per strip: a few register tiles whose logits stay in L2 at a few thousand keys. */
static int evict_strip_rows(const ckv_gemm_arch *a) { return 2 * a->mr; }
#define CKV_CPU_ATTN_STRIP_MAX (2 * CKV_GEMM_MR_MAX)

/* Floats of one worker's workspace for n_keys keys (the logits rows: n_cols), each part rounded to
 * 16 floats so the next stays 64-byte aligned. */
static size_t evict_attn_ws_floats(const ckv_gemm_arch *arch, const ckv_kv_batch *kv, int n_keys, size_t n_cols) {
    const size_t d = (size_t)kv->head_dim;
#define EVICT_ROUND16(x) (((x) + 15) & ~(size_t)15)
    size_t f = EVICT_ROUND16(ckv_gemm_packed_floats(arch, (int)d, n_keys)) +
               EVICT_ROUND16((size_t)CKV_CPU_ATTN_STRIP_MAX * d) +
               EVICT_ROUND16((size_t)CKV_CPU_ATTN_STRIP_MAX * n_cols) + EVICT_ROUND16((size_t)CKV_CPU_ATTN_STRIP_MAX);
    if (kv->dtype != CKV_DTYPE_F32) f += EVICT_ROUND16((size_t)n_keys * d);
    return f;
}

/* w's parts carved from `at` (evict_attn_ws_floats of them). */
static void evict_attn_ws_carve(evict_attn_ws *w, float *at, const ckv_gemm_arch *arch, const ckv_kv_batch *kv,
                                int n_keys, size_t n_cols) {
    const size_t d = (size_t)kv->head_dim;
    memset(w, 0, sizeof *w);
    w->kp_g = -1;
    w->kp = at;
    at += EVICT_ROUND16(ckv_gemm_packed_floats(arch, (int)d, n_keys));
    w->qs = at;
    at += EVICT_ROUND16((size_t)CKV_CPU_ATTN_STRIP_MAX * d);
    w->logits = at;
    at += EVICT_ROUND16((size_t)CKV_CPU_ATTN_STRIP_MAX * n_cols);
    w->inv = at;
    at += EVICT_ROUND16((size_t)CKV_CPU_ATTN_STRIP_MAX);
    if (kv->dtype != CKV_DTYPE_F32) w->keys = at;
#undef EVICT_ROUND16
}

/* w->kp <- rows row0 .. row0 + n of segment g's keys, packed (unless it holds segment g already: the
 * rows an op packs are the same for every segment of one call). */
static void evict_pack_keys(evict_attn_ws *w, const ckv_gemm_arch *arch, const ckv_kv_batch *kv, int g, int row0,
                            int n) {
    if (w->kp_g == g) return;
    const size_t d = (size_t)kv->head_dim, esz = ckv_dtype_size(kv->dtype);
    const char *src = (const char *)kv->segs[0][g].k + (size_t)row0 * d * esz;
    const float *K = (const float *)(const void *)src; // [n, d]
    if (kv->dtype != CKV_DTYPE_F32) {
        ckv_convert_to_f32(w->keys, src, kv->dtype, (size_t)n * d);
        K = w->keys;
    }
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
    int n_rows, workers; /* output rows, split into `workers` contiguous parts */
    void (*rows)(const struct evict_attn_job *jb, int begin, int end, evict_attn_ws *w);
} evict_attn_job;

/* The rows of a run: local query heads j0 .. j0 + nh - 1 of one KV head, each with the call's n_q
 * queries, as one sequence of nh x n_q rows, head-major (row R: head j0 + R / n_q, query R % n_q, at
 * context row q_row0 + R % n_q). A strip of it may hold rows of several heads, so a register tile is
 * filled across the heads (64 queries of 3 heads: 14 tiles of 14 rows instead of 15 partly empty). */
static int run_head(const evict_attn_job *jb, int j0, int R) { return j0 + R / jb->n_q; }
static int run_query(const evict_attn_job *jb, int R) { return R % jb->n_q; }

/* What a job does with one strip's weights (rows R0 .. R0 + ns of the run at local head j0). */
typedef void (*evict_strip_fn)(const struct evict_attn_job *jb, const evict_attn_ws *w, int j0, int R0, int ns);

/* Softmax weights of the run's rows R0 .. R0 + ns over the keys packed in w->kp, into w->logits (row
 * R - R0, stride n_keys, valid for the row's visible columns 0 .. q_row0 + query), scaled by
 * w->inv[R - R0] (weight = logits[.., t] * inv). The strip's query rows are copied contiguous first;
 * its logits go only up to the last key any of its rows sees. */
static void evict_strip_weights(const evict_attn_job *jb, evict_attn_ws *w, int j0, int R0, int ns) {
    const int d = jb->kv->head_dim;
    const size_t hq = (size_t)jb->n_heads_local * (size_t)d;
    int n_vis = 0;
    for (int r = 0; r < ns; r++) {
        const int i = run_query(jb, R0 + r), j = run_head(jb, j0, R0 + r);
        memcpy(w->qs + (size_t)r * (size_t)d, jb->q + (size_t)i * hq + (size_t)j * (size_t)d, (size_t)d * sizeof(float));
        n_vis = jb->q_row0 + i + 1 > n_vis ? jb->q_row0 + i + 1 : n_vis;
    }
    ckv_gemm_packed_rows(jb->arch, w->logits, (size_t)jb->n_keys, w->qs, (size_t)d, w->kp, ns, d, n_vis);
    for (int r = 0; r < ns; r++)
        w->inv[r] = evict_scaled_exp_row(w->logits + (size_t)r * (size_t)jb->n_keys,
                                         jb->q_row0 + run_query(jb, R0 + r) + 1, jb->scale,
                                         jb->divide ? EVICT_SCALE_DIV : EVICT_SCALE_MUL);
}

/* Local query heads [j_begin, j_end) in runs of consecutive heads of one KV head, each run strip by
 * strip over its KV head's packed keys, each strip's weights to fn: every head's rows in query order,
 * the heads in ascending order. */
static void evict_head_runs(const evict_attn_job *jb, evict_attn_ws *w, int j_begin, int j_end, evict_strip_fn fn) {
    const int S = evict_strip_rows(jb->arch);
    for (int j0 = j_begin; j0 < j_end;) {
        const int g = (jb->head0 + j0) / jb->group;
        int nh = 1;
        while (j0 + nh < j_end && (jb->head0 + j0 + nh) / jb->group == g) nh++;
        evict_pack_keys(w, jb->arch, jb->kv, g, 0, jb->n_keys);
        const int n = nh * jb->n_q;
        for (int R0 = 0; R0 < n; R0 += S) {
            const int ns = n - R0 < S ? n - R0 : S;
            evict_strip_weights(jb, w, j0, R0, ns);
            fn(jb, w, j0, R0, ns);
        }
        j0 += nh;
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
 * block. */
static void colsum_strip(const evict_attn_job *jb, const evict_attn_ws *w, int j0, int R0, int ns) {
    for (int r = 0; r < ns;) {
        const int j = run_head(jb, j0, R0 + r), i = run_query(jb, R0 + r);
        const int nr = jb->n_q - i < ns - r ? jb->n_q - i : ns - r; /* this head's rows of the strip */
        colsum_add_rows(jb->colsum + (size_t)colsum_row_of(jb, j) * (size_t)jb->n_cols,
                        w->logits + (size_t)r * (size_t)jb->n_keys, (size_t)jb->n_keys, w->inv + r, nr,
                        jb->q_row0 + i + 1, jb->n_cols);
        r += nr;
    }
}

/* p[j, i, :] = the strip's weights, zero past each row's visible keys. */
static void probs_strip(const evict_attn_job *jb, const evict_attn_ws *w, int j0, int R0, int ns) {
    for (int r = 0; r < ns; r++) {
        const int j = run_head(jb, j0, R0 + r), i = run_query(jb, R0 + r);
        const float *row = w->logits + (size_t)r * (size_t)jb->n_keys;
        float *dst = jb->p + ((size_t)j * (size_t)jb->n_q + (size_t)i) * (size_t)jb->ld;
        const int n_vis = jb->q_row0 + i + 1;
        const float f = w->inv[r];
        for (int t = 0; t < n_vis; t++) dst[t] = row[t] * f;
        for (int t = n_vis; t < jb->ld; t++) dst[t] = 0.0f;
    }
}

/* Output rows [begin, end) of a column-sum job: row r is local query head r, or (per_kv) KV head r with
 * its local query heads in ascending order (a contiguous range of them). */
static void colsum_rows(const evict_attn_job *jb, int begin, int end, evict_attn_ws *w) {
    int j_begin = 0, j_end;
    while (j_begin < jb->n_heads_local && colsum_row_of(jb, j_begin) < begin) j_begin++;
    for (j_end = j_begin; j_end < jb->n_heads_local && colsum_row_of(jb, j_end) < end;) j_end++;
    evict_head_runs(jb, w, j_begin, j_end, colsum_strip);
}

/* Local query heads [begin, end) of a weights job. */
static void probs_rows(const evict_attn_job *jb, int begin, int end, evict_attn_ws *w) {
    evict_head_runs(jb, w, begin, end, probs_strip);
}

/* KV heads [begin, end) of a chunk job: each one's local query heads in ascending order, their
 * queries over the chunk's own n_q keys and n_pad padding keys (logit -1e-9), then the padding
 * queries (logit 0 on every real key), all in fp32 (logits (q . k) * scale). */
static void chunk_rows(const evict_attn_job *jb, int begin, int end, evict_attn_ws *w) {
    const int S = evict_strip_rows(jb->arch), n_q = jb->n_q, n_pad = jb->n_pad, n_keys = n_q + n_pad;
    for (int j = 0; j < jb->n_heads_local; j++) {
        const int g = (jb->head0 + j) / jb->group;
        if (g < begin || g >= end) continue;
        evict_pack_keys(w, jb->arch, jb->kv, g, jb->q_row0, n_q);
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

/* Worker w of a job: its contiguous part of the output rows, in its own workspace. */
static void attn_worker(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const evict_attn_job *jb = ctx;
    for (int w = begin; w < end; w++) {
        int r0, r1;
        ckv_cpu_part(jb->n_rows, jb->workers, w, &r0, &r1);
        if (r1 > r0) jb->rows(jb, r0, r1, &jb->ws[w]);
    }
}

/* Runs the job's rows over its n_rows output rows on the backend's pool, with a workspace per worker
 * sized for jb->n_keys keys (the logits rows: jb->n_keys + jb->n_pad). */
static ckv_status evict_attn_run(ckv_backend *be, evict_attn_job *jb) {
    ckv_threadpool *pool = ckv_cpu_pool(be);
    jb->arch = ckv_gemm_best_arch();
    int workers = pool ? ckv_threadpool_size(pool) : 1;
    if (workers > jb->n_rows) workers = jb->n_rows;
    if (workers > CKV_CPU_MAX_TASK_WORKERS) workers = CKV_CPU_MAX_TASK_WORKERS;
    const size_t n_cols = (size_t)jb->n_keys + (size_t)jb->n_pad;
    const size_t per = evict_attn_ws_floats(jb->arch, jb->kv, jb->n_keys, n_cols); /* one worker, floats */
    while (workers > 1 && (size_t)workers * per * sizeof(float) > CKV_CPU_ATTN_SCRATCH_BYTES) workers--;
    if (workers < 1) workers = 1;
    float *scratch = NULL;
    CKV_TRY(ckv_cpu_evict_scratch(be, (size_t)workers * per * sizeof(float), (void **)&scratch));
    evict_attn_ws ws[CKV_CPU_MAX_TASK_WORKERS];
    for (int w = 0; w < workers; w++)
        evict_attn_ws_carve(&ws[w], scratch + (size_t)w * per, jb->arch, jb->kv, jb->n_keys, n_cols);
    jb->ws = ws;
    jb->workers = workers;
    if (workers > 1)
        ckv_threadpool_for(pool, workers, 1, attn_worker, jb);
    else
        attn_worker(jb, 0, 1, 0);
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
                         .n_keys = a->q_row0 + a->n_q, .n_rows = n_out, .rows = colsum_rows};
    return evict_attn_run(be, &jb);
}

ckv_status ckv_cpu_evict_attn_probs(ckv_backend *be, float *p, int ld, const ckv_evict_attn_params *a) {
    if (a->n_q < 1) return CKV_STATUS_OK;
    evict_attn_job jb = {.q = a->q, .n_q = a->n_q, .q_row0 = a->q_row0, .n_heads_local = a->n_heads_local,
                         .head0 = a->head0, .group = a->group, .divide = a->logits == CKV_EVICT_LOGITS_DIV,
                         .kv = a->kv, .scale = a->scale, .p = p, .ld = ld, .n_keys = a->q_row0 + a->n_q,
                         .n_rows = a->n_heads_local, .rows = probs_rows};
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
