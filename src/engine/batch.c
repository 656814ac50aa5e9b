/* batch.c - batched decode steps over several sessions (see batch.h). */
#include "engine/batch.h"

#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"

ckv_status ckv_decode_batch_init(ckv_decode_batch *b, ckv_model *m, int max_seq) {
    memset(b, 0, sizeof *b);
    if (max_seq < 1 || max_seq > CKV_LOGITS_ROWS)
        return ckv_error(CKV_STATUS_ERR_ARG, "decode batch of %d sequences: expected 1 .. %d", max_seq, CKV_LOGITS_ROWS);
    ckv_backend *be = m->be;
    const int L = m->cfg.n_layers;
    const size_t lists = (size_t)L * (size_t)max_seq;
    b->model = m;
    b->max_seq = max_seq;
    int32_t idx[CKV_LOGITS_ROWS + 1];
    for (int i = 0; i <= max_seq; i++) idx[i] = i;
    ckv_status st = ckv_model_scratch_init(&b->scratch, m, max_seq);
    if (st == CKV_STATUS_OK)
        st = be->ops->alloc(be, (void **)&b->x, (size_t)max_seq * (size_t)m->cfg.hidden_size * sizeof(float),
                            "batch hidden states");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&b->lists_host, lists * sizeof *b->lists_host, "batch segment lists");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&b->lists, lists * sizeof *b->lists, "batch segment lists");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&b->seq_of, (size_t)max_seq * sizeof(int32_t), "batch rows");
    if (st == CKV_STATUS_OK)
        st = be->ops->alloc(be, (void **)&b->seq_start, (size_t)(max_seq + 1) * sizeof(int32_t), "batch rows");
    if (st == CKV_STATUS_OK) st = be->ops->upload(be, b->seq_of, idx, (size_t)max_seq * sizeof(int32_t));
    if (st == CKV_STATUS_OK) st = be->ops->upload(be, b->seq_start, idx, (size_t)(max_seq + 1) * sizeof(int32_t));
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&b->pos, (size_t)max_seq * sizeof(int32_t), "batch positions");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&b->members, (size_t)max_seq * sizeof *b->members, "batch members");
    if (st == CKV_STATUS_OK && m->plan.tp > 1)
        st = be->ops->alloc(be, (void **)&b->full_logits, (size_t)max_seq * (size_t)m->cfg.vocab_size * sizeof(float),
                            "batch gathered logits");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&b->u, (size_t)max_seq * sizeof(double), "batch draws");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&b->ids, (size_t)max_seq * sizeof(int32_t), "batch ids");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&b->bound, (size_t)L * sizeof *b->bound, "batch key bounds");
    if (st == CKV_STATUS_OK)
        st = ckv_alloc((void **)&b->key, (size_t)(3 + L + 3 * max_seq) * sizeof *b->key, "batch recording key");
    b->graphs = ckv_backend_supports(be, CKV_BACKEND_CAP_GRAPHS) && m->plan.tp == 1;
    if (st != CKV_STATUS_OK) ckv_decode_batch_free(b);
    return st;
}

void ckv_decode_batch_free(ckv_decode_batch *b) {
    if (!b) return;
    if (b->model) {
        ckv_backend *be = b->model->be;
        if (b->graphs) be->ops->graph_release(be, b); /* before the buffers its recordings use */
        ckv_model_scratch_free(&b->scratch, b->model);
        be->ops->release(be, b->x);
        be->ops->release(be, b->lists);
        be->ops->release(be, b->seq_of);
        be->ops->release(be, b->seq_start);
        be->ops->release(be, b->full_logits);
        be->ops->release(be, b->u);
        be->ops->release(be, b->ids);
    }
    ckv_free(b->lists_host);
    ckv_free(b->pos);
    ckv_free(b->members);
    ckv_free(b->bound);
    ckv_free(b->key);
    memset(b, 0, sizeof *b);
}

int ckv_decode_len_bound(int len) {
    int p = 1;
    while (p <= len / 2) p <<= 1; /* the largest power of two <= len */
    const int g = p / 16 > 256 ? p / 16 : 256;
    return (len + g - 1) / g * g;
}

/* Points the device segment lists at the sessions' tables when the membership changed. A session's
 * table of a layer keeps its address for the session's life, so a steady batch uploads nothing. */
static ckv_status batch_members(ckv_decode_batch *b, ckv_session *const *sessions, int n) {
    int same = n == b->n_members;
    for (int i = 0; same && i < n; i++) same = b->members[i] == sessions[i]->id; /* ids: addresses get reused */
    if (same) return CKV_STATUS_OK;
    const int L = b->model->cfg.n_layers;
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < i; j++)
            if (sessions[j] == sessions[i])
                return ckv_error(CKV_STATUS_ERR_ARG, "decode batch: session %d appears twice (rows %d and %d)", i, j, i);
        if (sessions[i]->model != b->model)
            return ckv_error(CKV_STATUS_ERR_ARG, "decode batch: row %d's session belongs to another model", i);
        for (int l = 0; l < L; l++) b->lists_host[(size_t)l * b->max_seq + i] = sessions[i]->kv.layers[l].segs;
        b->members[i] = sessions[i]->id;
    }
    b->n_members = 0; /* until the upload succeeded */
    ckv_backend *be = b->model->be;
    for (int l = 0; l < L; l++)
        CKV_TRY(be->ops->upload(be, b->lists + (size_t)l * b->max_seq, b->lists_host + (size_t)l * b->max_seq,
                                (size_t)n * sizeof *b->lists));
    b->n_members = n;
    return CKV_STATUS_OK;
}

/* The host half of a step, before its device work: the checks, the members' segment lists, each
 * layer's key bound (b->bound), and the step's uploads (ids, positions) into the fixed device
 * buffers the forward reads, so that the forward itself uploads nothing (a CUDA graph of it replays
 * the same buffers). caches[n] and split[n + 1] are filled for batch_layers; *t0 is when the step
 * began. */
static ckv_status batch_prepare(ckv_decode_batch *b, ckv_session *const *sessions, const int32_t *tokens, int n,
                                ckv_kv_cache **caches, int32_t *split, double *t0) {
    ckv_model *m = b->model;
    if (n < 1 || n > b->max_seq)
        return ckv_error(CKV_STATUS_ERR_ARG, "decode batch of %d sessions: expected 1 .. %d", n, b->max_seq);
    for (int i = 0; i < n; i++) {
        if (sessions[i]->pf_n > 0) return ckv_error(CKV_STATUS_ERR_ARG, "decode batch row %d: a prefill is in progress", i);
        if (sessions[i]->n_past + 1 > sessions[i]->capacity)
            return ckv_error(CKV_STATUS_ERR_RANGE, "decode batch row %d: past the session capacity of %d tokens", i,
                             sessions[i]->capacity);
        b->pos[i] = sessions[i]->n_past;
    }
    CKV_TRY(batch_members(b, sessions, n));
    *t0 = ckv_time_now();
    for (int i = 0; i < n; i++) caches[i] = &sessions[i]->kv;
    for (int i = 0; i <= n; i++) split[i] = i;
    for (int i = 1; i < n; i++)
        if (caches[i]->dtype != caches[0]->dtype)
            return ckv_error(CKV_STATUS_ERR_ARG, "decode batch: rows 0 and %d have KV caches of different dtypes", i);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        int max_len = 0;
        for (int i = 0; i < n; i++)
            for (int h = 0; h < caches[i]->n_kv; h++) {
                const int len = caches[i]->layers[l].len[h];
                max_len = len > max_len ? len : max_len;
            }
        b->bound[l] = ckv_decode_len_bound(max_len + 1);
    }
    CKV_TRY(ckv_model_ids_put(m, &b->scratch, tokens, n));
    return ckv_model_positions_put(m, &b->scratch, b->pos, n);
}

/* The forward's device work up to the last hidden states b->x [n, D] (the ids and positions put). */
static ckv_status batch_layers(ckv_decode_batch *b, ckv_kv_cache *const *caches, const int32_t *split, int n) {
    ckv_model *m = b->model;
    const ckv_kv_cache *c0 = caches[0];
    ckv_model_embed_ids(m, &b->scratch, b->x, n);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        ckv_kv_batch view = {.dtype = c0->dtype, .head_dim = c0->head_dim, .n_kv_heads = c0->n_kv, .n_seq = n,
                             .segs = b->lists + (size_t)l * b->max_seq, .seq_of = b->seq_of,
                             .seq_start = b->seq_start, .max_len = b->bound[l]};
        CKV_TRY(ckv_model_layer_batch(m, &b->scratch, l, b->x, b->pos, n, caches, n, split, &view, NULL));
    }
    return CKV_STATUS_OK;
}

/* The step's bookkeeping once its outputs are on the host. */
static void batch_account(ckv_decode_batch *b, ckv_session *const *sessions, int n, double t0) {
    double dt = ckv_time_now() - t0;
    for (int i = 0; i < n; i++) {
        sessions[i]->n_past++;
        sessions[i]->decode_tokens++;
        sessions[i]->decode_seconds += dt;
    }
    b->step_seconds += dt;
    b->steps++;
    b->rows += n;
}

static int same_pick(const ckv_batch_pick *a, const ckv_batch_pick *b) {
    return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p;
}

/* The device work of a step after batch_prepare: the forward, the logits (b->logits_dev) and (picks
 * not NULL) one sample call per run of rows with the same settings into b->ids, reading the draws
 * b->u. No upload, host wait or allocation: it may be recorded as a CUDA graph. */
static ckv_status batch_device(ckv_decode_batch *b, ckv_kv_cache *const *caches, const int32_t *split, int n,
                               const ckv_batch_pick *picks) {
    ckv_model *m = b->model;
    ckv_backend *be = m->be;
    const int V = m->cfg.vocab_size;
    CKV_TRY(batch_layers(b, caches, split, n));
    const float *lg = NULL; // [n, V] device
    CKV_TRY(ckv_model_logits_device(m, &b->scratch, b->x, n, b->full_logits, &lg));
    b->logits_dev = lg;
    for (int i = 0, j; picks && i < n; i = j) {
        for (j = i + 1; j < n && same_pick(&picks[j], &picks[i]); j++) {
        }
        be->ops->sample(be, b->ids + i, lg + (size_t)i * V, j - i, V, picks[i].temperature, picks[i].top_k,
                        picks[i].top_p, b->u + i);
    }
    return CKV_STATUS_OK;
}

/* The key of a step's recording in b->key: everything the host arguments of its launches depend on
 * (the rows, the KV dtype, each layer's key bound, whether it samples and each row's sampling
 * settings); not the members, whose segment lists are device memory uploaded before the step. Its
 * bytes. */
static size_t batch_key(ckv_decode_batch *b, const ckv_kv_cache *c0, int n, const ckv_batch_pick *picks) {
    int32_t *k = b->key;
    size_t at = 0;
    k[at++] = n;
    k[at++] = (int32_t)c0->dtype;
    k[at++] = picks != NULL;
    for (int l = 0; l < b->model->cfg.n_layers; l++) k[at++] = b->bound[l];
    for (int i = 0; picks && i < n; i++) {
        memcpy(&k[at++], &picks[i].temperature, sizeof(float));
        memcpy(&k[at++], &picks[i].top_p, sizeof(float));
        k[at++] = picks[i].top_k;
    }
    return at * sizeof *k;
}

/* A replayed step's host bookkeeping: what its appends would have done to the caches' host lengths. */
static ckv_status batch_replayed(ckv_decode_batch *b, ckv_kv_cache *const *caches, const int32_t *split, int n) {
    for (int l = 0; l < b->model->cfg.n_layers; l++) CKV_TRY(ckv_kv_account_batch(caches, n, split, l, n));
    return CKV_STATUS_OK;
}

/* batch_device, recorded and replayed when b records (the first step of a key runs unrecorded, the
 * second is recorded, later ones replay: backend.h, graph_begin); a replay leaves the host
 * bookkeeping to batch_replayed. */
static ckv_status batch_run(ckv_decode_batch *b, ckv_kv_cache *const *caches, const int32_t *split, int n,
                            const ckv_batch_pick *picks) {
    ckv_backend *be = b->model->be;
    int replayed = 0;
    if (b->graphs) CKV_TRY(be->ops->graph_begin(be, b, b->key, batch_key(b, caches[0], n, picks), &replayed));
    if (replayed) return batch_replayed(b, caches, split, n);
    const ckv_status st = batch_device(b, caches, split, n, picks);
    return b->graphs ? be->ops->graph_end(be, st) : st;
}

/* The host waits once per step: for the logits' (or the ids') download, which also reports a failed op. */
ckv_status ckv_decode_batch_step(ckv_decode_batch *b, ckv_session *const *sessions, const int32_t *tokens, int n,
                                 const float **logits) {
    double t0 = 0.0;
    ckv_kv_cache *caches[CKV_LOGITS_ROWS];
    int32_t split[CKV_LOGITS_ROWS + 1];
    CKV_TRY(batch_prepare(b, sessions, tokens, n, caches, split, &t0));
    CKV_TRY(batch_run(b, caches, split, n, NULL));
    CKV_TRY(ckv_model_logits_fetch(b->model, &b->scratch, b->logits_dev, n, logits));
    batch_account(b, sessions, n, t0);
    return CKV_STATUS_OK;
}

ckv_status ckv_decode_batch_step_ids(ckv_decode_batch *b, ckv_session *const *sessions, const int32_t *tokens, int n,
                                     const ckv_batch_pick *picks, int32_t *ids) {
    ckv_backend *be = b->model->be;
    double t0 = 0.0, u[CKV_LOGITS_ROWS];
    ckv_kv_cache *caches[CKV_LOGITS_ROWS];
    int32_t split[CKV_LOGITS_ROWS + 1];
    CKV_TRY(batch_prepare(b, sessions, tokens, n, caches, split, &t0));
    for (int i = 0; picks && i < n; i++) u[i] = picks[i].u;
    if (picks) CKV_TRY(be->ops->upload(be, b->u, u, (size_t)n * sizeof(double)));
    CKV_TRY(batch_run(b, caches, split, n, picks));
    if (!picks) { /* a follower of a tensor-parallel group: its logits stay on the device */
        CKV_TRY(be->ops->sync(be));
        batch_account(b, sessions, n, t0);
        return CKV_STATUS_OK;
    }
    CKV_TRY(be->ops->download(be, ids, b->ids, (size_t)n * sizeof(int32_t))); /* the step's one wait */
    for (int i = 0; i < n; i++)
        if (ids[i] == CKV_SAMPLE_NONFINITE)
            return ckv_error(CKV_STATUS_ERR_NUMERIC, "decode batch row %d: the logits hold a non-finite value: the "
                             "weights or the activations overflowed", i);
    batch_account(b, sessions, n, t0);
    return CKV_STATUS_OK;
}
