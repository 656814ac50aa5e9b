/* kvzip.c - KVzip's context replay and its scores (see kvzip.h). The replay runs layer-major through
 * the session's own layers (ckv_model_layer over the rows after the context, in prefill chunks), so
 * each layer's replay attends to the whole context and to itself exactly as kvpress's forward does;
 * after a layer has run, its replayed queries (recomputed from the attention input: q_proj with its
 * bias, RoPE at positions L, L + 1, ...) are scored against that layer's cached keys by the backend's
 * evict_kvzip op (maxima into the device scores), and after the last layer every layer is cut back to
 * its L context rows. Everything runs as backend ops on the device, KVzip+'s norms
 * (kvzip_plus_normalization) too (evict_kvzip_norms over o_proj's columns, the chunk's cached values
 * and the replay's attention inputs); only the model's largest score comes back, as one float for
 * the sinks. Every buffer is set up once before the first chunk. It selects and compacts nothing. */
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
    int R, C, hq, d, nkv;          /* longest replay, largest chunk, local query width, head_dim, local KV heads */
    float *q_dev;                  /* [R, hq] replayed queries (device) */
    int32_t *pos_dev;              /* [R] their positions (device) */
    float *top_dev;                /* [1] the model's largest score (device) */
    int32_t *ids;                  /* [R] one chunk's replay ids (host) */
    /* kvzip_plus_normalization only (else NULL) */
    float *eye_dev;                /* [hq, hq] the identity, whose product with o_proj reads its columns (device) */
    float *wot_dev;                /* [hq, D] the local o_proj columns transposed (device) */
    float *hinv_dev;               /* [R] 1 / ||h|| of each replayed row (device) */
    float *vn_dev;                 /* [n_q_local, C] ||v W_O^j|| of each chunk row query head j reads (device) */
} kvzip_work;

static void work_free(ckv_backend *be, kvzip_work *w) {
    be->ops->release(be, w->q_dev);
    be->ops->release(be, w->pos_dev);
    be->ops->release(be, w->top_dev);
    ckv_free(w->ids);
    be->ops->release(be, w->eye_dev);
    be->ops->release(be, w->wot_dev);
    be->ops->release(be, w->hinv_dev);
    be->ops->release(be, w->vn_dev);
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
    const size_t R = (size_t)w->R;
    ckv_status st = be->ops->alloc(be, (void **)&w->q_dev, R * (size_t)w->hq * sizeof(float), "kvzip queries");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&w->pos_dev, R * sizeof(int32_t), "kvzip positions");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&w->top_dev, sizeof(float), "kvzip maximum");
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
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&w->hinv_dev, R * sizeof(float), "kvzip row norms");
    if (st == CKV_STATUS_OK)
        st = be->ops->alloc(be, (void **)&w->vn_dev, nq * (size_t)w->C * sizeof(float), "kvzip value norms");
    return st;
}

/* KVzip+ (kvzip_plus_normalization) for layer `layer` of a chunk: o_proj's local columns (its product
 * with the identity), then evict_kvzip_norms: 1 / ||h|| of the q replayed attention inputs and, for
 * each local query head j, ||W_O^j v|| of every chunk row it reads, on the device for evict_kvzip. */
static ckv_status plus_norms(ckv_session *s, kvzip_work *w, int layer, int L, int q, int start, int end) {
    ckv_model *m = s->model;
    ckv_backend *be = m->be;
    const ckv_shard_plan *p = &m->plan;
    const int G = m->cfg.n_heads / m->cfg.n_kv_heads;
    const ckv_kv_batch kv = ckv_kv_layer_batch(&s->kv, layer, 0);
    be->ops->matmul(be, w->wot_dev, w->eye_dev, &m->layers[layer].wo, NULL, w->hq); /* [hq, D] = o_proj^T */
    const ckv_evict_kvzip_norms_params nz = {w->wot_dev, s->xn + (size_t)L * (size_t)m->cfg.hidden_size, q,
                                             m->cfg.hidden_size, &kv, start, end, p->n_q_local,
                                             p->q_head0 - p->kv_head0 * G, G, w->hinv_dev, w->vn_dev, end - start};
    return be->ops->evict_kvzip_norms(be, &nz);
}

/* Layer `layer` of chunk [start, end) replayed as rows L .. L + q - 1: its queries (q_proj with its
 * bias, RoPE at the replay's positions) and evict_kvzip, which raises sc [n_kv_local, L] (device) at
 * columns start .. end - 1 to the maxima of their attention. */
static ckv_status score_chunk(ckv_session *s, kvzip_work *w, int layer, int L, int q, int start, int end, int sink,
                              float *sc) {
    ckv_model *m = s->model;
    ckv_backend *be = m->be;
    const ckv_shard_plan *p = &m->plan;
    const size_t D = (size_t)m->cfg.hidden_size;
    const int G = m->cfg.n_heads / m->cfg.n_kv_heads;
    for (int h = 0; h < w->nkv; h++)
        if (s->kv.layers[layer].len[h] != L + q)
            return ckv_error(CKV_STATUS_ERR_INTERNAL, "kvzip: layer %d head %d holds %d rows during the replay, expected %d",
                             layer, h, s->kv.layers[layer].len[h], L + q);
    be->ops->matmul(be, w->q_dev, s->xn + (size_t)L * D, &m->layers[layer].wq, m->layers[layer].bq, q);
    be->ops->rope(be, w->q_dev, w->pos_dev, q, p->n_q_local, w->d, m->inv_freq, m->rope_scale);
    if (w->vn_dev) CKV_TRY(plus_norms(s, w, layer, L, q, start, end));
    const ckv_kv_batch kv = ckv_kv_layer_batch(&s->kv, layer, 0);
    const ckv_evict_kvzip_params z = {w->q_dev, q, L, start, end, sink, &kv, p->n_q_local, p->q_head0 - p->kv_head0 * G,
                                      G, (float)sqrt((double)w->d), w->vn_dev ? w->hinv_dev : NULL, w->vn_dev,
                                      end - start};
    return be->ops->evict_kvzip(be, sc, L, &z);
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
    if (!ckv_backend_supports(be, CKV_BACKEND_CAP_KVZIP))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "press kvzip: backend %s offers no evict_kvzip", be->name);
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
    int32_t *lens = NULL; // [n_layers * n_kv_local]
    ckv_status st = work_init(&w, s, cfg, L);
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&lens, (size_t)nl * (size_t)nkv * sizeof(int32_t), "kvzip lengths");
    if (st == CKV_STATUS_OK && ckv_backend_supports(be, CKV_BACKEND_CAP_EVICT_RESERVE)) {
        const ckv_evict_shape sh = {L + R, R, m->plan.n_q_local, nkv, m->cfg.n_kv_heads, w.d, 0, s->kv.dtype,
                                    CKV_DTYPE_F32, 0};
        st = be->ops->evict_reserve(be, &sh);
    }
    if (st == CKV_STATUS_OK) be->ops->evict_fill(be, scores, nl * nkv, L, 0, L, CKV_EVICT_FILL_VALUE, 0.0f);
    for (int i = 0; i < chunk_count(cfg, L) && st == CKV_STATUS_OK; i++) st = replay_chunk(s, cfg, &w, ids, L, i, scores, lens);
    /* replicas of a KV head (tp > Hkv) each saw some of its query heads */
    if (st == CKV_STATUS_OK) st = ckv_evict_allreduce(be, m->replica, scores, n, CKV_COMM_OP_MAX, 1);
    float top = 0.0f; /* the sinks: the model's largest score + 1 (kvpress's score_val.amax() + 1) */
    if (st == CKV_STATUS_OK) be->ops->evict_max(be, w.top_dev, scores, nl * nkv, L, 0, L);
    if (st == CKV_STATUS_OK) st = ckv_evict_allreduce(be, m->tp, w.top_dev, 1, CKV_COMM_OP_MAX, 1);
    if (st == CKV_STATUS_OK) st = be->ops->download(be, &top, w.top_dev, sizeof top);
    const int n_sink = cfg->n_sink < L ? cfg->n_sink : L;
    if (st == CKV_STATUS_OK && n_sink > 0)
        be->ops->evict_fill(be, scores, nl * nkv, L, 0, n_sink, CKV_EVICT_FILL_VALUE, top + 1.0f);
    work_free(be, &w);
    ckv_free(lens);
    return st;
}
