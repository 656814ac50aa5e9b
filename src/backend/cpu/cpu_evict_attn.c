/* cpu_evict_attn.c - the CPU backend's eviction ops over attention weights: window / observed
 * attention column sums and weights (evict_attn_colsum, evict_attn_probs), chunked non-causal attention
 * column sums (evict_chunk_colsum) and the one-row softmax (evict_softmax_add). Semantics as in
 * backend.h. Logits go through ckv's fp32 GEMM with the same shapes the scorers used before they moved
 * behind the op table, so scores are bit-for-bit what they were; keys of F16/BF16 caches are converted
 * to fp32 scratch first. For colsum and probs the backend's pool takes output rows (a query head, or
 * with per-KV-head sums a KV head and its query heads in ascending order), each task computing its
 * heads' logits on its own thread (ckv_cpu_matmul_f32_task) into its own workspace, so every sum is
 * added in the order one thread adds it; chunk_colsum runs its heads in order. Scratch is allocated
 * per call and freed before returning. It selects nothing (CriticalKV's value norms: cpu_evict_vnorm.c). */
#include <math.h>

#include "core/alloc.h"
#include "cpu_backend.h"
#include "core/quant.h"

/* x[0..n) <- exp(x - max x) in fp32 (n >= 1); returns (float)(1 / sum), the sum in double. */
static float evict_exp_row(float *x, int n) {
    float ml[16]; /* independent lanes so that the reductions vectorise without reassociation */
    for (int l = 0; l < 16; l++) ml[l] = x[0];
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) ml[l] = x[i + l] > ml[l] ? x[i + l] : ml[l];
    float m = ml[0];
    for (int l = 1; l < 16; l++) m = ml[l] > m ? ml[l] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (i = 0; i < n; i++) x[i] = ckv_cpu_expf(x[i] - m); /* arguments <= 0 */
    double sl[8] = {0};
    for (i = 0; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) sl[l] += x[i + l];
    double sum = ((sl[0] + sl[4]) + (sl[1] + sl[5])) + ((sl[2] + sl[6]) + (sl[3] + sl[7]));
    for (; i < n; i++) sum += x[i];
    return (float)(1.0 / sum);
}

/* fp32 view of rows [0, n) of segment g's keys (values): the segment itself for F32 caches, else
 * converted into scratch [n, d]. */
static const float *evict_seg_f32(const ckv_kv_batch *kv, int g, int n, int values, float *scratch) {
    const ckv_kv_seg *sg = &kv->segs[0][g];
    const void *src = values ? sg->v : sg->k;
    if (kv->dtype == CKV_DTYPE_F32) return src;
    ckv_convert_to_f32(scratch, src, kv->dtype, (size_t)n * (size_t)kv->head_dim);
    return scratch;
}

/* Scratch of the attention ops: one head's queries, logits, softmax scales and (non-F32 caches) keys. */
typedef struct {
    float *qh;     // [n_q, d]
    float *logits; // [n_q, n_keys]
    float *inv;    // [n_q] 1 / sum of each row's exponentials
    float *keys;   // [n_keys, d] fp32 keys of one segment (F16/BF16 caches only)
} evict_attn_ws;

static void evict_attn_ws_free(evict_attn_ws *w) {
    ckv_free(w->qh);
    ckv_free(w->logits);
    ckv_free(w->inv);
    ckv_free(w->keys);
}

static ckv_status evict_attn_ws_init(evict_attn_ws *w, const ckv_kv_batch *kv, int n_q, int n_keys) {
    memset(w, 0, sizeof *w);
    const size_t d = (size_t)kv->head_dim;
    ckv_status s = ckv_alloc((void **)&w->qh, (size_t)n_q * d * sizeof(float), "eviction head queries");
    if (s == CKV_STATUS_OK)
        s = ckv_alloc((void **)&w->logits, (size_t)n_q * (size_t)n_keys * sizeof(float), "eviction logits");
    if (s == CKV_STATUS_OK) s = ckv_alloc((void **)&w->inv, (size_t)n_q * sizeof(float), "eviction softmax scales");
    if (s == CKV_STATUS_OK && kv->dtype != CKV_DTYPE_F32)
        s = ckv_alloc((void **)&w->keys, (size_t)n_keys * d * sizeof(float), "eviction fp32 keys");
    if (s != CKV_STATUS_OK) evict_attn_ws_free(w);
    return s;
}

/* Softmax weights of local query head j's n_q queries into w->logits ([n_q, n_keys], row i valid for
 * columns 0 .. q_row0 + i), scaled by w->inv[i] (weight = logits[i, t] * inv[i]). */
static void evict_head_weights(ckv_backend *be, const ckv_threadpool *tasks, evict_attn_ws *w, const float *q, int n_q,
                               int q_row0, const ckv_kv_batch *kv, int n_heads_local, int j, int g, float scale,
                               int divide) {
    const int d = kv->head_dim, hq = n_heads_local * d, n_keys = q_row0 + n_q;
    const float *K = evict_seg_f32(kv, g, n_keys, 0, w->keys); // [n_keys, d]
    for (int i = 0; i < n_q; i++)
        memcpy(w->qh + (size_t)i * d, q + (size_t)i * hq + (size_t)j * d, (size_t)d * sizeof(float));
    ckv_cpu_matmul_f32_task(be, tasks, w->logits, w->qh, K, NULL, n_q, d, n_keys); /* [n_q, n_keys] */
    for (int i = 0; i < n_q; i++) {
        float *row = w->logits + (size_t)i * (size_t)n_keys;
        const int n_vis = q_row0 + i + 1;
        if (divide)
            for (int t = 0; t < n_vis; t++) row[t] = row[t] / scale;
        else
            for (int t = 0; t < n_vis; t++) row[t] *= scale;
        w->inv[i] = evict_exp_row(row, n_vis);
    }
}

/* Logits all workers of one call may hold together (at least one worker's, however large). */
#define CKV_CPU_ATTN_LOGITS_BYTES ((size_t)64 << 20)

/* One call of evict_attn_colsum / evict_attn_probs: its arguments, the pool running its tasks and one
 * workspace per worker. */
typedef struct evict_attn_job {
    ckv_backend *be;
    const ckv_threadpool *tasks;
    evict_attn_ws *ws; // [workers]
    const float *q;
    int n_q, q_row0, n_heads_local, head0, group, divide, per_kv;
    const ckv_kv_batch *kv;
    float scale;
    double *colsum; /* colsum: [n_out, n_cols] */
    int n_cols;
    float *p;       /* probs: [n_heads_local, n_q, ld] */
    int ld;
    int n_rows, workers; /* output rows, split into `workers` contiguous parts */
    void (*rows)(const struct evict_attn_job *jb, int begin, int end, evict_attn_ws *w);
} evict_attn_job;

/* Output rows [begin, end) of a column-sum job: row r is local query head r, or (per_kv) KV head r with
 * its local query heads in ascending order. */
static void colsum_rows(const evict_attn_job *jb, int begin, int end, evict_attn_ws *w) {
    const int n_keys = jb->q_row0 + jb->n_q;
    for (int j = 0; j < jb->n_heads_local; j++) {
        const int g = (jb->head0 + j) / jb->group, r = jb->per_kv ? g : j;
        if (r < begin || r >= end) continue;
        evict_head_weights(jb->be, jb->tasks, w, jb->q, jb->n_q, jb->q_row0, jb->kv, jb->n_heads_local, j, g, jb->scale,
                           jb->divide);
        double *restrict cs = jb->colsum + (size_t)r * (size_t)jb->n_cols;
        for (int i = 0; i < jb->n_q; i++) {
            const float *row = w->logits + (size_t)i * (size_t)n_keys;
            const int n_vis = jb->q_row0 + i + 1, nc = n_vis < jb->n_cols ? n_vis : jb->n_cols;
            const float f = w->inv[i];
            for (int t = 0; t < nc; t++) cs[t] += (double)(row[t] * f);
        }
    }
}

/* Local query heads [begin, end) of a weights job. */
static void probs_rows(const evict_attn_job *jb, int begin, int end, evict_attn_ws *w) {
    const int n_keys = jb->q_row0 + jb->n_q;
    for (int j = begin; j < end; j++) {
        evict_head_weights(jb->be, jb->tasks, w, jb->q, jb->n_q, jb->q_row0, jb->kv, jb->n_heads_local, j,
                           (jb->head0 + j) / jb->group, jb->scale, jb->divide);
        for (int i = 0; i < jb->n_q; i++) {
            const float *row = w->logits + (size_t)i * (size_t)n_keys;
            float *dst = jb->p + ((size_t)j * (size_t)jb->n_q + (size_t)i) * (size_t)jb->ld;
            const int n_vis = jb->q_row0 + i + 1;
            const float f = w->inv[i];
            for (int t = 0; t < n_vis; t++) dst[t] = row[t] * f;
            for (int t = n_vis; t < jb->ld; t++) dst[t] = 0.0f;
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

/* Runs the job's rows over its n_rows output rows on the task pool, with a workspace per worker. */
static ckv_status evict_attn_run(evict_attn_job *jb) {
    ckv_threadpool *pool = ckv_cpu_task_pool(jb->be);
    int workers = pool ? ckv_threadpool_size(pool) : 1;
    if (workers > jb->n_rows) workers = jb->n_rows;
    if (workers > CKV_CPU_MAX_TASK_WORKERS) workers = CKV_CPU_MAX_TASK_WORKERS;
    const size_t per = (size_t)jb->n_q * (size_t)(jb->q_row0 + jb->n_q) * sizeof(float); /* one worker's logits */
    while (workers > 1 && (size_t)workers * per > CKV_CPU_ATTN_LOGITS_BYTES) workers--;
    if (workers < 1) workers = 1;
    evict_attn_ws ws[CKV_CPU_MAX_TASK_WORKERS];
    ckv_status s = CKV_STATUS_OK;
    int made = 0;
    for (; made < workers && s == CKV_STATUS_OK; made++) s = evict_attn_ws_init(&ws[made], jb->kv, jb->n_q, jb->q_row0 + jb->n_q);
    if (s != CKV_STATUS_OK) made--; /* the one that failed freed itself */
    if (s == CKV_STATUS_OK) {
        jb->ws = ws;
        jb->workers = workers;
        jb->tasks = workers > 1 ? pool : NULL;
        if (jb->tasks)
            ckv_threadpool_for(pool, workers, 1, attn_worker, jb);
        else
            attn_worker(jb, 0, 1, 0);
    }
    for (int i = 0; i < made; i++) evict_attn_ws_free(&ws[i]);
    return s;
}

ckv_status ckv_cpu_evict_attn_colsum(ckv_backend *be, double *colsum, int n_cols, const ckv_evict_attn_params *a,
                                     ckv_evict_colsum_rows rows, ckv_evict_accum accum) {
    const int per_kv = rows == CKV_EVICT_PER_KV_HEAD;
    const int n_out = per_kv ? a->kv->n_kv_heads : a->n_heads_local;
    if (accum == CKV_EVICT_ZERO_FIRST) memset(colsum, 0, (size_t)n_out * (size_t)n_cols * sizeof(double));
    if (a->n_q < 1) return CKV_STATUS_OK;
    evict_attn_job jb = {.be = be, .q = a->q, .n_q = a->n_q, .q_row0 = a->q_row0, .n_heads_local = a->n_heads_local,
                         .head0 = a->head0, .group = a->group, .divide = a->logits == CKV_EVICT_LOGITS_DIV,
                         .per_kv = per_kv, .kv = a->kv, .scale = a->scale, .colsum = colsum, .n_cols = n_cols,
                         .n_rows = n_out, .rows = colsum_rows};
    return evict_attn_run(&jb);
}

ckv_status ckv_cpu_evict_attn_probs(ckv_backend *be, float *p, int ld, const ckv_evict_attn_params *a) {
    if (a->n_q < 1) return CKV_STATUS_OK;
    evict_attn_job jb = {.be = be, .q = a->q, .n_q = a->n_q, .q_row0 = a->q_row0, .n_heads_local = a->n_heads_local,
                         .head0 = a->head0, .group = a->group, .divide = a->logits == CKV_EVICT_LOGITS_DIV,
                         .kv = a->kv, .scale = a->scale, .p = p, .ld = ld, .n_rows = a->n_heads_local,
                         .rows = probs_rows};
    return evict_attn_run(&jb);
}

ckv_status ckv_cpu_evict_chunk_colsum(ckv_backend *be, double *colsum, int n_cols, const ckv_evict_attn_params *a,
                                      int n_pad, ckv_evict_accum accum) {
    if (a->logits != CKV_EVICT_LOGITS_MUL)
        return ckv_error(CKV_STATUS_ERR_ARG, "evict_chunk_colsum: logits are (q . k) * scale; dividing is not offered");
    const ckv_kv_batch *kv = a->kv;
    const float *q = a->q; // [n_q, n_heads_local, d]
    const float scale = a->scale;
    const int n_q = a->n_q, q_row0 = a->q_row0, n_heads_local = a->n_heads_local, head0 = a->head0, group = a->group;
    if (accum == CKV_EVICT_ZERO_FIRST) memset(colsum, 0, (size_t)kv->n_kv_heads * (size_t)n_cols * sizeof(double));
    if (n_q < 1) return CKV_STATUS_OK;
    const int d = kv->head_dim, hq = n_heads_local * d, n_keys = n_q + n_pad;
    const size_t esz = ckv_dtype_size(kv->dtype);
    evict_attn_ws w;
    CKV_TRY(evict_attn_ws_init(&w, kv, n_keys + 1, n_keys)); /* logits: n_q rows of n_q, then one of n_keys */
    for (int j = 0; j < n_heads_local; j++) {
        const int g = (head0 + j) / group;
        const char *src = (const char *)kv->segs[0][g].k + (size_t)q_row0 * (size_t)d * esz;
        const float *K = (const float *)(const void *)src; // [n_q, d]
        if (kv->dtype != CKV_DTYPE_F32) {
            ckv_convert_to_f32(w.keys, src, kv->dtype, (size_t)n_q * (size_t)d);
            K = w.keys;
        }
        for (int i = 0; i < n_q; i++)
            memcpy(w.qh + (size_t)i * d, q + (size_t)i * hq + (size_t)j * d, (size_t)d * sizeof(float));
        ckv_cpu_matmul_f32(be, w.logits, w.qh, K, NULL, n_q, d, n_q); /* [n_q, n_q] */
        double *restrict cs = colsum + (size_t)g * (size_t)n_cols + q_row0;
        float *row = w.logits + (size_t)n_q * (size_t)n_q; /* past the GEMM's rows: one row of n_keys */
        for (int i = 0; i <= n_q; i++) { /* the real queries, then (i = n_q) one padding query */
            if (i == n_q && n_pad == 0) break;
            for (int t = 0; t < n_q; t++) row[t] = i < n_q ? w.logits[(size_t)i * n_q + t] * scale : 0.0f;
            for (int t = n_q; t < n_keys; t++) row[t] = -1e-9f;
            const float f = evict_exp_row(row, n_keys);
            for (int rep = 0; rep < (i < n_q ? 1 : n_pad); rep++) /* every padding query weighs the same */
                for (int t = 0; t < n_q; t++) cs[t] += (double)(row[t] * f);
        }
    }
    evict_attn_ws_free(&w);
    return CKV_STATUS_OK;
}

void ckv_cpu_evict_softmax_add(ckv_backend *be, float *dst, float *x, int n) {
    (void)be;
    const float inv = evict_exp_row(x, n);
    for (int t = 0; t < n; t++) dst[t] += x[t] * inv;
}
