/* kvzip.c - KVzip's context replay and its scores (see kvzip.h). The replay runs layer-major through
 * the session's own layers (ckv_model_layer over the rows after the context, in prefill chunks), so
 * each layer's replay attends to the whole context and to itself exactly as kvpress's forward does;
 * after a layer has run, its replayed queries (recomputed from the attention input: q_proj with its
 * bias, RoPE at positions L, L + 1, ...) are scored on the host against that layer's cached keys,
 * and after the last layer every layer is cut back to its L context rows. What runs where: the
 * layers, q_proj and RoPE are backend ops; the logits, softmax (ckv's fast exp) and maxima run on the
 * host in fp32 (the keys of each local head read through the cache's head access: (L + R) d values
 * per head per layer and chunk; R (n_sink + C + R / 2) d multiply-adds and exps per query head, C the
 * chunk, R its replay), in blocks of queries over tiles of keys split over the backend's host thread
 * count. Every buffer (and that thread pool) is set up once before the first chunk. It selects and
 * compacts nothing. */
#include "engine/kvzip.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/fastmath.h"
#include "core/threadpool.h"
#include "evict/scorer.h"

enum { KVZIP_QB = 8, KVZIP_TILE = 64 }; /* queries scored together; key rows per tile (16 KiB at d 64: in L1) */
enum { KVZIP_PREV_TAIL = 8 }; /* kvpress's prev_postfix_size: a later chunk's prompt ends with the last 8 ids before it */

/* Chunk i of an L-token context: rows [*start, *end). kvpress cuts chunk_size tokens from row 0. */
static int chunk_count(const ckv_press_config *cfg, int L) {
    return L > cfg->chunk_size ? (L - 1) / cfg->chunk_size + 1 : 1;
}

static void chunk_rows(const ckv_press_config *cfg, int L, int i, int *start, int *end) {
    const int n = chunk_count(cfg, L);
    *start = n == 1 ? 0 : i * cfg->chunk_size;
    *end = n == 1 ? L : (i + 1) * cfg->chunk_size < L ? (i + 1) * cfg->chunk_size : L;
}

/* Length of chunk i's replay: its prompt (the first one, or the next one + the tail of the chunk
 * before), the suffix and the chunk. */
static int replay_len(const ckv_press_config *cfg, int L, int i) {
    int start, end, p0, p1;
    chunk_rows(cfg, L, i, &start, &end);
    int n = cfg->suffix_ids.n + end - start;
    if (i == 0) return n + cfg->repeat_ids.n;
    chunk_rows(cfg, L, i - 1, &p0, &p1);
    return n + cfg->repeat_next_ids.n + (p1 - p0 < KVZIP_PREV_TAIL ? p1 - p0 : KVZIP_PREV_TAIL);
}

ckv_status ckv_kvzip_check(const ckv_press_config *cfg, int vocab_size) {
    const ckv_press_ids *prompts[3] = {&cfg->repeat_ids, &cfg->repeat_next_ids, &cfg->suffix_ids};
    static const char *const names[3] = {"repeat_ids", "repeat_next_ids", "suffix_ids"};
    for (int k = 0; k < 3; k++) {
        if (prompts[k]->n < 1) return ckv_error(CKV_STATUS_ERR_ARG, "press kvzip needs option %s", names[k]);
        for (int j = 0; j < prompts[k]->n; j++)
            if (prompts[k]->id[j] >= vocab_size)
                return ckv_error(CKV_STATUS_ERR_ARG, "press kvzip: %s id %d is outside the vocabulary of %d", names[k],
                                 (int)prompts[k]->id[j], vocab_size);
    }
    return CKV_STATUS_OK;
}

int ckv_kvzip_replay_rows(const ckv_press_config *cfg, int L) {
    int most = 0;
    for (int i = 0; i < chunk_count(cfg, L); i++) {
        const int n = replay_len(cfg, L, i);
        most = n > most ? n : most;
    }
    return most;
}

/* Chunk i's replay ids into out [replay_len]. */
static void replay_ids(const ckv_press_config *cfg, const int32_t *ids, int L, int i, int32_t *out) {
    int start, end, n = 0;
    chunk_rows(cfg, L, i, &start, &end);
    const ckv_press_ids *prompt = i == 0 ? &cfg->repeat_ids : &cfg->repeat_next_ids;
    for (int j = 0; j < prompt->n; j++) out[n++] = prompt->id[j];
    if (i > 0) {
        int p0, p1;
        chunk_rows(cfg, L, i - 1, &p0, &p1);
        for (int t = p1 - p0 < KVZIP_PREV_TAIL ? p0 : p1 - KVZIP_PREV_TAIL; t < p1; t++) out[n++] = ids[t];
    }
    for (int j = 0; j < cfg->suffix_ids.n; j++) out[n++] = cfg->suffix_ids.id[j];
    for (int t = start; t < end; t++) out[n++] = ids[t];
}

typedef struct {
    int R, C, hq, d, nkv, nt;      /* longest replay, largest chunk, local query width, head_dim, local KV heads, threads */
    ckv_threadpool *pool;          /* nt host threads (the backend's count) */
    float *q_dev;                  /* [R, hq] replayed queries (device) */
    int32_t *pos_dev;              /* [R] their positions (device) */
    float *q;                      /* [R, hq] (host) */
    float *k;                      /* [nkv, L + R, d] the layer's cached keys, every local head (host) */
    float *v;                      /* [nkv, L + R, d] the layer's cached values, every local head (host) */
    int32_t *kpos;                 /* [L + R] their positions (host) */
    float *logit;                  /* [nt, KVZIP_QB, n_sink + C + R] a block of queries' logits per thread (host) */
    float *part;                   /* [nt, nkv, C] each thread's maxima over its queries (host) */
    int32_t *ids;                  /* [R] one chunk's replay ids (host) */
    /* kvzip_plus_normalization only (else NULL) */
    float *eye_dev;                /* [hq, hq] the identity, whose product with o_proj reads its columns (device) */
    float *wot_dev, *wot;          /* [hq, D] the local o_proj columns transposed (device, host) */
    double *gram;                  /* [n_q_local, d, d] W_O^j^T W_O^j of each local query head j (host) */
    float *xnh;                    /* [R, D] the replay's attention inputs (host) */
    float *hinv;                   /* [R] 1 / ||h|| of each replayed row (host) */
    float *vn;                     /* [n_q_local, n_sink + C + R] ||v W_O^j|| of the columns each query reads (host) */
} kvzip_work;

static void work_free(ckv_backend *be, kvzip_work *w) {
    ckv_threadpool_free(w->pool);
    be->ops->release(be, w->q_dev);
    be->ops->release(be, w->pos_dev);
    ckv_free(w->q);
    ckv_free(w->k);
    ckv_free(w->v);
    ckv_free(w->kpos);
    ckv_free(w->logit);
    ckv_free(w->part);
    ckv_free(w->ids);
    be->ops->release(be, w->eye_dev);
    be->ops->release(be, w->wot_dev);
    ckv_free(w->wot);
    ckv_free(w->gram);
    ckv_free(w->xnh);
    ckv_free(w->hinv);
    ckv_free(w->vn);
}

static ckv_status work_init(kvzip_work *w, const ckv_session *s, const ckv_press_config *cfg, int L) {
    const ckv_model *m = s->model;
    ckv_backend *be = m->be;
    memset(w, 0, sizeof *w);
    w->R = ckv_kvzip_replay_rows(cfg, L);
    w->C = cfg->chunk_size < L ? cfg->chunk_size : L;
    w->d = m->cfg.head_dim;
    w->hq = m->plan.n_q_local * w->d;
    w->nkv = m->plan.n_kv_local;
    w->nt = be->n_threads > 0 ? be->n_threads : 1;
    const size_t R = (size_t)w->R, rows = (size_t)L + R, cols = (size_t)cfg->n_sink + (size_t)w->C + R;
    const size_t nt = (size_t)w->nt, nkv = (size_t)w->nkv, d = (size_t)w->d;
    ckv_status st = ckv_threadpool_init(&w->pool, w->nt);
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&w->q_dev, R * (size_t)w->hq * sizeof(float), "kvzip queries");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&w->pos_dev, R * sizeof(int32_t), "kvzip positions");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->q, R * (size_t)w->hq * sizeof(float), "kvzip queries");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->k, nkv * rows * d * sizeof(float), "kvzip keys");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->v, nkv * rows * d * sizeof(float), "kvzip values");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->kpos, rows * sizeof(int32_t), "kvzip positions");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->logit, nt * KVZIP_QB * cols * sizeof(float), "kvzip logits");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->part, nt * nkv * (size_t)w->C * sizeof(float), "kvzip maxima");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->ids, R * sizeof(int32_t), "kvzip replay ids");
    if (st != CKV_STATUS_OK || !cfg->kvzip_plus_normalization) return st;
    const size_t hq = (size_t)w->hq, D = (size_t)m->cfg.hidden_size, nq = (size_t)m->plan.n_q_local;
    float *eye = NULL; // [hq, hq] (host, staged)
    st = ckv_alloc((void **)&eye, hq * hq * sizeof(float), "kvzip identity");
    if (st == CKV_STATUS_OK) {
        memset(eye, 0, hq * hq * sizeof(float));
        for (size_t i = 0; i < hq; i++) eye[i * hq + i] = 1.0f;
        st = be->ops->alloc(be, (void **)&w->eye_dev, hq * hq * sizeof(float), "kvzip identity");
    }
    if (st == CKV_STATUS_OK) st = be->ops->upload(be, w->eye_dev, eye, hq * hq * sizeof(float));
    ckv_free(eye);
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&w->wot_dev, hq * D * sizeof(float), "kvzip o_proj");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->wot, hq * D * sizeof(float), "kvzip o_proj");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->gram, nq * d * d * sizeof(double), "kvzip o_proj Gram");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->xnh, R * D * sizeof(float), "kvzip attention inputs");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->hinv, R * sizeof(float), "kvzip row norms");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->vn, nq * cols * sizeof(float), "kvzip value norms");
    return st;
}

/* KVzip+ (kvzip_plus_normalization) for layer `layer` of a chunk: 1 / ||h|| of the q replayed
 * attention inputs, and for each local query head j the norm ||v W_O^j||_2 of every column it reads
 * (the first `sink` rows, rows start .. end - 1, the replay's rows L ..), as sqrt(v^T (W_O^j^T W_O^j) v)
 * in double from o_proj's columns (read through a product with the identity). */
static ckv_status plus_norms(ckv_session *s, kvzip_work *w, int layer, int L, int q, int start, int end, int sink) {
    ckv_model *m = s->model;
    ckv_backend *be = m->be;
    const int d = w->d, hq = w->hq, nq = m->plan.n_q_local, G = m->cfg.n_heads / m->cfg.n_kv_heads;
    const int C = end - start;
    const size_t D = (size_t)m->cfg.hidden_size, rows = (size_t)L + (size_t)w->R;
    const size_t ld = (size_t)sink + (size_t)w->C + (size_t)w->R;
    be->ops->matmul(be, w->wot_dev, w->eye_dev, &m->layers[layer].wo, NULL, hq); /* [hq, D] = o_proj^T */
    CKV_TRY(be->ops->sync(be));
    CKV_TRY(be->ops->download(be, w->wot, w->wot_dev, (size_t)hq * D * sizeof(float)));
    CKV_TRY(be->ops->download(be, w->xnh, s->xn + (size_t)L * D, (size_t)q * D * sizeof(float)));
    for (int i = 0; i < q; i++) {
        double ss = 0.0;
        for (size_t c = 0; c < D; c++) ss += (double)w->xnh[(size_t)i * D + c] * (double)w->xnh[(size_t)i * D + c];
        w->hinv[i] = 1.0f / (float)sqrt(ss);
    }
    for (int j = 0; j < nq; j++) {
        double *g = w->gram + (size_t)j * (size_t)d * (size_t)d;
        for (int a = 0; a < d; a++)
            for (int b = 0; b <= a; b++) {
                const float *ra = w->wot + ((size_t)j * d + a) * D, *rb = w->wot + ((size_t)j * d + b) * D;
                double acc = 0.0;
                for (size_t c = 0; c < D; c++) acc += (double)ra[c] * (double)rb[c];
                g[a * d + b] = g[b * d + a] = acc;
            }
        const int h = (m->plan.q_head0 + j) / G - m->plan.kv_head0;
        const float *vh = w->v + (size_t)h * rows * (size_t)d;
        float *out = w->vn + (size_t)j * ld;
        for (int col = 0; col < sink + C + q; col++) {
            const size_t row = col < sink ? (size_t)col : col < sink + C ? (size_t)(start + col - sink)
                                                                      : (size_t)L + (size_t)(col - sink - C);
            const float *v = vh + row * (size_t)d;
            double acc = 0.0;
            for (int a = 0; a < d; a++) {
                double ga = 0.0;
                for (int b = 0; b < d; b++) ga += g[a * d + b] * (double)v[b];
                acc += (double)v[a] * ga;
            }
            out[col] = (float)sqrt(acc > 0.0 ? acc : 0.0);
        }
    }
    return CKV_STATUS_OK;
}

/* One query's softmax over its columns logit[n] in fp32: the max subtracted, ckv's fast exp, the sum
 * in double over 4 partial sums. */
static void softmax_row(float *x, int n) {
    float mx = -INFINITY;
    for (int t = 0; t < n; t++) mx = x[t] > mx ? x[t] : mx;
    for (int t = 0; t < n; t++) x[t] = ckv_fast_expf(x[t] - mx);
    double part[4] = {0, 0, 0, 0};
    int t = 0;
    for (; t + 4 <= n; t += 4)
        for (int u = 0; u < 4; u++) part[u] += (double)x[t + u];
    for (; t < n; t++) part[0] += (double)x[t];
    const double inv = 1.0 / ((part[0] + part[1]) + (part[2] + part[3]));
    for (t = 0; t < n; t++) x[t] = (float)((double)x[t] * inv);
}

enum { KVZIP_LANES = 16 };

/* The 16 fp32 lanes of a dot product added pairwise. */
static float lanes_sum(const float *a) {
    float h[8];
    for (int u = 0; u < 8; u++) h[u] = a[u] + a[u + 8];
    return ((h[0] + h[4]) + (h[1] + h[5])) + ((h[2] + h[6]) + (h[3] + h[7]));
}

/* out[r] = (q . k_r) / scale for the n rows k [n, d]: lane u of each dot sums the terms j = u mod 16
 * in order, then the lanes pairwise; four rows at a time, so four independent chains (each
 * statement one vector multiply-add). */
static void dots(const float *q, const float *k, int n, int d, float scale, float *out) {
    const size_t sd = (size_t)d;
    int r = 0;
    for (; r + 4 <= n; r += 4) {
        float a0[KVZIP_LANES] = {0}, a1[KVZIP_LANES] = {0}, a2[KVZIP_LANES] = {0}, a3[KVZIP_LANES] = {0};
        const float *k0 = k + (size_t)r * sd, *k1 = k0 + sd, *k2 = k1 + sd, *k3 = k2 + sd;
        int j = 0;
        for (; j + KVZIP_LANES <= d; j += KVZIP_LANES)
            for (int u = 0; u < KVZIP_LANES; u++) {
                a0[u] += q[j + u] * k0[j + u];
                a1[u] += q[j + u] * k1[j + u];
                a2[u] += q[j + u] * k2[j + u];
                a3[u] += q[j + u] * k3[j + u];
            }
        for (; j < d; j++) {
            a0[0] += q[j] * k0[j];
            a1[0] += q[j] * k1[j];
            a2[0] += q[j] * k2[j];
            a3[0] += q[j] * k3[j];
        }
        out[r] = lanes_sum(a0) / scale;
        out[r + 1] = lanes_sum(a1) / scale;
        out[r + 2] = lanes_sum(a2) / scale;
        out[r + 3] = lanes_sum(a3) / scale;
    }
    for (; r < n; r++) {
        float a0[KVZIP_LANES] = {0};
        const float *k0 = k + (size_t)r * sd;
        int j = 0;
        for (; j + KVZIP_LANES <= d; j += KVZIP_LANES)
            for (int u = 0; u < KVZIP_LANES; u++) a0[u] += q[j + u] * k0[j + u];
        for (; j < d; j++) a0[0] += q[j] * k0[j];
        out[r] = lanes_sum(a0) / scale;
    }
}

/* One chunk and layer's scoring, shared by the threads: items are (local query head, replayed query). */
typedef struct {
    kvzip_work *w;
    const ckv_shard_plan *p;
    int G, L, q, start, end, sink;
    size_t rows;                   /* L + R: the stride of one head's keys in w->k */
    float scale;                   /* sqrt(head_dim) */
} kvzip_task;

/* logit[x * ld + c0 + r] for the block's nq queries and key rows k [n, d], tile by tile, so that each
 * tile of keys serves every query of the block while it is in cache. */
static void block_dots(const float *const *qs, int nq, const float *k, int n, int d, float scale, float *logit, size_t ld,
                       int c0) {
    for (int t0 = 0; t0 < n; t0 += KVZIP_TILE) {
        const int tn = n - t0 < KVZIP_TILE ? n - t0 : KVZIP_TILE;
        for (int x = 0; x < nq; x++) dots(qs[x], k + (size_t)t0 * (size_t)d, tn, d, scale, logit + (size_t)x * ld + c0 + t0);
    }
}

/* Items [b, e): blocks of up to KVZIP_QB queries i0 .. of local query head j; query i attends to its
 * columns (the first `sink` rows, the chunk, the replay up to itself), the chunk's probabilities
 * raise the thread's maxima of its KV head. */
static void score_items(void *ctx, int b, int e, int tid) {
    const kvzip_task *t = ctx;
    kvzip_work *w = t->w;
    const int d = w->d, C = t->end - t->start, nb = (t->q + KVZIP_QB - 1) / KVZIP_QB;
    const size_t ld = (size_t)t->sink + (size_t)w->C + (size_t)w->R;
    float *logit = w->logit + (size_t)tid * KVZIP_QB * ld;
    for (int it = b; it < e; it++) {
        const int j = it / nb, i0 = it % nb * KVZIP_QB, nq = t->q - i0 < KVZIP_QB ? t->q - i0 : KVZIP_QB;
        const int h = (t->p->q_head0 + j) / t->G - t->p->kv_head0;
        const float *qs[KVZIP_QB];
        for (int x = 0; x < nq; x++) qs[x] = w->q + (size_t)(i0 + x) * (size_t)w->hq + (size_t)j * (size_t)d;
        const float *k = w->k + (size_t)h * t->rows * (size_t)d;
        block_dots(qs, nq, k, t->sink, d, t->scale, logit, ld, 0);
        block_dots(qs, nq, k + (size_t)t->start * (size_t)d, C, d, t->scale, logit, ld, t->sink);
        block_dots(qs, nq, k + (size_t)t->L * (size_t)d, i0 + nq, d, t->scale, logit, ld, t->sink + C);
        float *mx = w->part + ((size_t)tid * (size_t)w->nkv + (size_t)h) * (size_t)w->C;
        for (int x = 0; x < nq; x++) {
            float *row = logit + (size_t)x * ld;
            softmax_row(row, t->sink + C + i0 + x + 1); /* causal: the replay up to query i0 + x */
            if (w->vn) { /* KVzip+: / ||h|| by row, x ||v W_O^j|| by column */
                const float hinv = w->hinv[i0 + x], *vn = w->vn + (size_t)j * ld;
                for (int c = 0; c < C; c++) row[t->sink + c] = row[t->sink + c] * hinv * vn[t->sink + c];
            }
            for (int c = 0; c < C; c++) mx[c] = row[t->sink + c] > mx[c] ? row[t->sink + c] : mx[c];
        }
    }
}

/* Layer `layer` of chunk [start, end) replayed as rows L .. L + q - 1: for each local KV head, the
 * maximum over its local query heads and the q replayed queries of their attention to the chunk's
 * rows, into sc [n_kv_local, L] at columns start .. end - 1. Bit-identical for any thread count
 * (each query's softmax is computed whole by one thread; maxima do not depend on their order). */
static ckv_status score_chunk(ckv_session *s, kvzip_work *w, int layer, int L, int q, int start, int end, int sink,
                              float *sc) {
    ckv_model *m = s->model;
    ckv_backend *be = m->be;
    const ckv_shard_plan *p = &m->plan;
    const int d = w->d, C = end - start;
    const size_t D = (size_t)m->cfg.hidden_size, rows = (size_t)L + (size_t)w->R;
    be->ops->matmul(be, w->q_dev, s->xn + (size_t)L * D, &m->layers[layer].wq, m->layers[layer].bq, q);
    be->ops->rope(be, w->q_dev, w->pos_dev, q, p->n_q_local, d, m->inv_freq, m->rope_scale);
    CKV_TRY(be->ops->sync(be));
    CKV_TRY(be->ops->download(be, w->q, w->q_dev, (size_t)q * (size_t)w->hq * sizeof(float)));
    for (int h = 0; h < w->nkv; h++) {
        if (s->kv.layers[layer].len[h] != L + q)
            return ckv_error(CKV_STATUS_ERR_INTERNAL, "kvzip: layer %d head %d holds %d rows during the replay, expected %d",
                             layer, h, s->kv.layers[layer].len[h], L + q);
        CKV_TRY(ckv_kv_head_read(&s->kv, layer, h, w->k + (size_t)h * rows * (size_t)d, w->v + (size_t)h * rows * (size_t)d,
                                 w->kpos));
    }
    if (w->vn) CKV_TRY(plus_norms(s, w, layer, L, q, start, end, sink));
    for (size_t e = 0; e < (size_t)w->nt * (size_t)w->nkv * (size_t)w->C; e++) w->part[e] = 0.0f;
    kvzip_task t = {w, p, m->cfg.n_heads / m->cfg.n_kv_heads, L, q, start, end, sink, rows, (float)sqrt((double)d)};
    ckv_threadpool_for(w->pool, p->n_q_local * ((q + KVZIP_QB - 1) / KVZIP_QB), 1, score_items, &t);
    for (int th = 0; th < w->nt; th++)
        for (int h = 0; h < w->nkv; h++) {
            const float *mx = w->part + ((size_t)th * (size_t)w->nkv + (size_t)h) * (size_t)w->C;
            float *row = sc + (size_t)h * (size_t)L + (size_t)start;
            for (int c = 0; c < C; c++) row[c] = mx[c] > row[c] ? mx[c] : row[c];
        }
    return CKV_STATUS_OK;
}

/* Chunk i: its replay through every layer (scored after each), then every layer back to L rows. */
static ckv_status replay_chunk(ckv_session *s, const ckv_press_config *cfg, kvzip_work *w, const int32_t *ids, int L,
                               int i, float *sc, int32_t *lens) {
    ckv_model *m = s->model;
    ckv_backend *be = m->be;
    const size_t D = (size_t)m->cfg.hidden_size, per = (size_t)w->nkv * (size_t)L;
    const int q = replay_len(cfg, L, i);
    int start, end;
    chunk_rows(cfg, L, i, &start, &end);
    const int sink = cfg->n_sink < start ? cfg->n_sink : start;
    replay_ids(cfg, ids, L, i, w->ids);
    for (int t = 0; t < q; t++) s->pos[L + t] = L + t;
    CKV_TRY(be->ops->upload(be, w->pos_dev, s->pos + L, (size_t)q * sizeof(int32_t)));
    float *x = s->x + (size_t)L * D, *xn = s->xn + (size_t)L * D;
    for (int c0 = 0; c0 < q; c0 += s->chunk)
        CKV_TRY(ckv_model_embed(m, &s->scratch, x + (size_t)c0 * D, w->ids + c0, q - c0 < s->chunk ? q - c0 : s->chunk));
    ckv_status st = CKV_STATUS_OK;
    for (int l = 0; l < m->cfg.n_layers && st == CKV_STATUS_OK; l++) {
        for (int c0 = 0; c0 < q && st == CKV_STATUS_OK; c0 += s->chunk)
            st = ckv_model_layer(m, &s->scratch, l, x + (size_t)c0 * D, s->pos + L + c0, q - c0 < s->chunk ? q - c0 : s->chunk,
                                 &s->kv, xn + (size_t)c0 * D);
        if (st == CKV_STATUS_OK) st = score_chunk(s, w, l, L, q, start, end, sink, sc + (size_t)l * per);
    }
    for (int r = 0; r < m->cfg.n_layers * w->nkv; r++) lens[r] = L;
    const ckv_status cut = ckv_kv_cache_truncate(&s->kv, lens); /* also after a failure: the context rows stay */
    return st != CKV_STATUS_OK ? st : cut;
}

ckv_status ckv_kvzip_score(ckv_session *s, const ckv_press_config *cfg, const int32_t *ids, int L, float *scores) {
    ckv_model *m = s->model;
    ckv_backend *be = m->be;
    const int nl = m->cfg.n_layers, nkv = m->plan.n_kv_local;
    if (!ids) return ckv_error(CKV_STATUS_ERR_ARG, "press kvzip needs the context's token ids to replay it");
    if (!s->xn) return ckv_error(CKV_STATUS_ERR_ARG, "press kvzip: the session keeps no attention inputs");
    if (s->n_past != 0) return ckv_error(CKV_STATUS_ERR_ARG, "press kvzip compresses the first prefill of a session");
    for (int l = 0; l < nl; l++)
        for (int h = 0; h < nkv; h++)
            if (s->kv.layers[l].len[h] != L)
                return ckv_error(CKV_STATUS_ERR_INTERNAL, "kvzip: layer %d head %d holds %d rows before the replay, "
                                 "expected the %d context rows", l, h, s->kv.layers[l].len[h], L);
    const int R = ckv_kvzip_replay_rows(cfg, L);
    if (L + R > s->capacity)
        return ckv_error(CKV_STATUS_ERR_RANGE, "press kvzip: the replay of the %d-token context needs %d rows after it, "
                         "the session holds %d tokens", L, R, s->capacity);
    CKV_TRY(ckv_kvzip_check(cfg, m->cfg.vocab_size));
    kvzip_work w;
    const size_t n = (size_t)nl * (size_t)nkv * (size_t)L;
    float *sc = NULL;    // [n_layers, n_kv_local, L] (host)
    int32_t *lens = NULL; // [n_layers * n_kv_local]
    ckv_status st = work_init(&w, s, cfg, L);
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&sc, n * sizeof(float), "kvzip scores");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&lens, (size_t)nl * (size_t)nkv * sizeof(int32_t), "kvzip lengths");
    if (st == CKV_STATUS_OK) memset(sc, 0, n * sizeof(float));
    for (int i = 0; i < chunk_count(cfg, L) && st == CKV_STATUS_OK; i++) st = replay_chunk(s, cfg, &w, ids, L, i, sc, lens);
    /* replicas of a KV head (tp > Hkv) each saw some of its query heads */
    if (st == CKV_STATUS_OK) st = ckv_evict_allreduce(be, m->replica, sc, n, CKV_COMM_OP_MAX, 0);
    float top = 0.0f; /* the sinks: the model's largest score + 1 (kvpress's score_val.amax() + 1) */
    for (size_t e = 0; e < n && st == CKV_STATUS_OK; e++) top = sc[e] > top ? sc[e] : top;
    if (st == CKV_STATUS_OK) st = ckv_evict_allreduce(be, m->tp, &top, 1, CKV_COMM_OP_MAX, 0);
    const int n_sink = cfg->n_sink < L ? cfg->n_sink : L;
    for (size_t r = 0; r < (size_t)nl * (size_t)nkv && st == CKV_STATUS_OK; r++)
        for (int t = 0; t < n_sink; t++) sc[r * (size_t)L + (size_t)t] = top + 1.0f;
    if (st == CKV_STATUS_OK) st = be->ops->upload(be, scores, sc, n * sizeof(float));
    work_free(be, &w);
    ckv_free(sc);
    ckv_free(lens);
    return st;
}
