/* kvzip.c - KVzip's context replay and its scores (see kvzip.h). The replay runs layer-major through
 * the session's own layers (ckv_model_layer over the rows after the context, in prefill chunks), so
 * each layer's replay attends to the whole context and to itself exactly as kvpress's forward does;
 * after a layer has run, its replayed queries (recomputed from the attention input: q_proj with its
 * bias, RoPE at positions L, L + 1, ...) are scored on the host against that layer's cached keys,
 * and after the last layer every layer is cut back to its L context rows. What runs where: the
 * layers, q_proj and RoPE are backend ops; the logits, softmax and maxima run on the host in fp32
 * (the keys of each local head read through the cache's head access: (L + R) d values per head per
 * layer and chunk; 2 R (n_sink + C + R) d multiply-adds per query head, C the chunk, R its replay).
 * Every buffer is allocated once before the first chunk. It selects and compacts nothing. */
#include "engine/kvzip.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "evict/scorer.h"

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
    int R, hq, d, nkv;             /* longest replay, local query width, head_dim, local KV heads */
    float *q_dev;                  /* [R, hq] replayed queries (device) */
    int32_t *pos_dev;              /* [R] their positions (device) */
    float *q;                      /* [R, hq] (host) */
    float *k, *v;                  /* [L + R, d] one head's cached keys and values (host) */
    int32_t *kpos;                 /* [L + R] their positions (host) */
    float *logit;                  /* [n_sink + C + R] one query's logits over the columns it reads (host) */
    int32_t *ids;                  /* [R] one chunk's replay ids (host) */
} kvzip_work;

static void work_free(ckv_backend *be, kvzip_work *w) {
    be->ops->release(be, w->q_dev);
    be->ops->release(be, w->pos_dev);
    ckv_free(w->q);
    ckv_free(w->k);
    ckv_free(w->v);
    ckv_free(w->kpos);
    ckv_free(w->logit);
    ckv_free(w->ids);
}

static ckv_status work_init(kvzip_work *w, const ckv_session *s, const ckv_press_config *cfg, int L) {
    const ckv_model *m = s->model;
    ckv_backend *be = m->be;
    memset(w, 0, sizeof *w);
    w->R = ckv_kvzip_replay_rows(cfg, L);
    w->d = m->cfg.head_dim;
    w->hq = m->plan.n_q_local * w->d;
    w->nkv = m->plan.n_kv_local;
    const size_t R = (size_t)w->R, rows = (size_t)L + R, cols = (size_t)cfg->n_sink + (size_t)cfg->chunk_size + R;
    ckv_status st = be->ops->alloc(be, (void **)&w->q_dev, R * (size_t)w->hq * sizeof(float), "kvzip queries");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&w->pos_dev, R * sizeof(int32_t), "kvzip positions");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->q, R * (size_t)w->hq * sizeof(float), "kvzip queries");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->k, rows * (size_t)w->d * sizeof(float), "kvzip keys");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->v, rows * (size_t)w->d * sizeof(float), "kvzip values");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->kpos, rows * sizeof(int32_t), "kvzip positions");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->logit, cols * sizeof(float), "kvzip logits");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&w->ids, R * sizeof(int32_t), "kvzip replay ids");
    return st;
}

/* One query's softmax over its columns logit[n] in fp32 (max subtracted, the sum in double). */
static void softmax_row(float *x, int n) {
    float mx = -INFINITY;
    for (int t = 0; t < n; t++) mx = x[t] > mx ? x[t] : mx;
    double sum = 0.0;
    for (int t = 0; t < n; t++) sum += (double)(x[t] = expf(x[t] - mx));
    for (int t = 0; t < n; t++) x[t] = (float)((double)x[t] / sum);
}

static float dot(const float *a, const float *b, int d) {
    float acc = 0.0f;
    for (int j = 0; j < d; j++) acc += a[j] * b[j];
    return acc;
}

/* Layer `layer` of chunk [start, end) replayed as rows L .. L + q - 1: for each local KV head, the
 * maximum over its local query heads and the q replayed queries of their attention to the chunk's
 * rows (columns: the first `sink` rows, the chunk, the replay up to the query itself), into
 * sc [n_kv_local, L] at columns start .. end - 1. */
static ckv_status score_chunk(ckv_session *s, kvzip_work *w, int layer, int L, int q, int start, int end, int sink,
                              float *sc) {
    ckv_model *m = s->model;
    ckv_backend *be = m->be;
    const ckv_shard_plan *p = &m->plan;
    const int d = w->d, G = m->cfg.n_heads / m->cfg.n_kv_heads, C = end - start;
    const size_t D = (size_t)m->cfg.hidden_size;
    be->ops->matmul(be, w->q_dev, s->xn + (size_t)L * D, &m->layers[layer].wq, m->layers[layer].bq, q);
    be->ops->rope(be, w->q_dev, w->pos_dev, q, p->n_q_local, d, m->inv_freq, m->rope_scale);
    CKV_TRY(be->ops->sync(be));
    CKV_TRY(be->ops->download(be, w->q, w->q_dev, (size_t)q * (size_t)w->hq * sizeof(float)));
    const float scale = (float)sqrt((double)d);
    for (int h = 0; h < w->nkv; h++) {
        if (s->kv.layers[layer].len[h] != L + q)
            return ckv_error(CKV_STATUS_ERR_INTERNAL, "kvzip: layer %d head %d holds %d rows during the replay, expected %d",
                             layer, h, s->kv.layers[layer].len[h], L + q);
        CKV_TRY(ckv_kv_head_read(&s->kv, layer, h, w->k, w->v, w->kpos));
        float *row = sc + (size_t)h * (size_t)L;
        for (int j = 0; j < p->n_q_local; j++) {
            if ((p->q_head0 + j) / G - p->kv_head0 != h) continue; /* another KV head's query */
            for (int i = 0; i < q; i++) {
                const float *qi = w->q + (size_t)i * (size_t)w->hq + (size_t)j * (size_t)d;
                int n = 0;
                for (int t = 0; t < sink; t++) w->logit[n++] = dot(qi, w->k + (size_t)t * d, d) / scale;
                for (int t = start; t < end; t++) w->logit[n++] = dot(qi, w->k + (size_t)t * d, d) / scale;
                for (int t = 0; t <= i; t++) w->logit[n++] = dot(qi, w->k + (size_t)(L + t) * d, d) / scale;
                softmax_row(w->logit, n);
                for (int t = 0; t < C; t++) {
                    const float a = w->logit[sink + t];
                    if (a > row[start + t]) row[start + t] = a;
                }
            }
        }
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
    const ckv_press_ids *prompts[3] = {&cfg->repeat_ids, &cfg->repeat_next_ids, &cfg->suffix_ids};
    static const char *const names[3] = {"repeat_ids", "repeat_next_ids", "suffix_ids"};
    for (int k = 0; k < 3; k++) {
        if (prompts[k]->n < 1) return ckv_error(CKV_STATUS_ERR_ARG, "press kvzip needs option %s", names[k]);
        for (int j = 0; j < prompts[k]->n; j++)
            if (prompts[k]->id[j] >= m->cfg.vocab_size)
                return ckv_error(CKV_STATUS_ERR_ARG, "press kvzip: replay prompt id %d is outside the vocabulary of %d",
                                 (int)prompts[k]->id[j], m->cfg.vocab_size);
    }
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
