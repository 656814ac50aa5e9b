/* session.c - layer-major chunked prefill and decode steps over one rank's KV cache. */
#include "engine/session.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"

ckv_status ckv_session_init(ckv_session *s, ckv_model *m, int capacity, int chunk, int compress) {
    return ckv_session_init_kv(s, m, capacity, chunk, compress, m->be->kv_dtype);
}

ckv_status ckv_session_init_kv(ckv_session *s, ckv_model *m, int capacity, int chunk, int compress, ckv_dtype kv_dtype) {
    static atomic_ullong next_id = 1;
    memset(s, 0, sizeof *s);
    s->id = atomic_fetch_add(&next_id, 1);
    const ckv_model_config *c = &m->cfg;
    if (capacity < 1) return ckv_error(CKV_STATUS_ERR_ARG, "session capacity %d must be positive", capacity);
    if (capacity > c->max_context)
        return ckv_error(CKV_STATUS_ERR_RANGE,
                         "%d tokens (prompt + --max-new-tokens) exceed the model's context window of %d tokens "
                         "(max_position_embeddings)", capacity, c->max_context);
    if (chunk < 1) return ckv_error(CKV_STATUS_ERR_ARG, "--chunk must be >= 1, got %d", chunk);
    if (chunk > capacity) chunk = capacity;
    s->model = m;
    s->capacity = capacity;
    s->chunk = chunk;
    s->compress = compress;
    s->mark_past = -1;
    ckv_backend *be = m->be;
    ckv_status st = ckv_kv_cache_init(&s->kv, be, c->n_layers, m->plan.n_kv_local, c->head_dim, kv_dtype);
    for (int l = 0; l < c->n_layers && st == CKV_STATUS_OK && !compress; l++) st = ckv_kv_layer_reserve(&s->kv, l, capacity);
    if (st == CKV_STATUS_OK && compress && compress != CKV_SESSION_DERIVED)
        st = be->ops->alloc(be, (void **)&s->xn, (size_t)capacity * c->hidden_size * sizeof(float), "attention inputs");
    if (st == CKV_STATUS_OK)
        st = ckv_alloc((void **)&s->mark_lens, (size_t)c->n_layers * (size_t)m->plan.n_kv_local * sizeof(int32_t),
                       "cache marks");
    if (st == CKV_STATUS_OK) st = ckv_model_scratch_init(&s->scratch, m, chunk);
    if (st == CKV_STATUS_OK)
        st = be->ops->alloc(be, (void **)&s->x, (size_t)capacity * c->hidden_size * sizeof(float), "hidden states");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&s->pos, (size_t)capacity * sizeof(int32_t), "positions");
    if (st != CKV_STATUS_OK) ckv_session_free(s);
    return st;
}

void ckv_session_free(ckv_session *s) {
    if (!s) return;
    if (s->model) {
        ckv_model_scratch_free(&s->scratch, s->model);
        s->model->be->ops->release(s->model->be, s->x);
        s->model->be->ops->release(s->model->be, s->xn);
    }
    ckv_kv_cache_free(&s->kv);
    ckv_free(s->pos);
    ckv_free(s->mark_lens);
    memset(s, 0, sizeof *s);
}

ckv_status ckv_session_prefill_begin(ckv_session *s, const int32_t *ids, int n) {
    ckv_model *m = s->model;
    if (n < 1) return ckv_error(CKV_STATUS_ERR_ARG, "empty prompt");
    if (s->pf_n > 0) return ckv_error(CKV_STATUS_ERR_ARG, "a prefill of %d tokens is still in progress", s->pf_n);
    if (s->n_past + n > s->capacity)
        return ckv_error(CKV_STATUS_ERR_RANGE, "prompt of %d tokens after %d cached exceeds the session capacity %d", n,
                         s->n_past, s->capacity);
    double t0 = ckv_time_now();
    size_t D = (size_t)m->cfg.hidden_size;
    for (int i = 0; i < n; i++) s->pos[i] = s->n_past + i;
    for (int c0 = 0; c0 < n; c0 += s->chunk) {
        int cn = n - c0 < s->chunk ? n - c0 : s->chunk;
        CKV_TRY(ckv_model_embed(m, &s->scratch, s->x + (size_t)c0 * D, ids + c0, cn));
    }
    s->pf_n = n;
    s->pf_layer = 0;
    s->prefill_seconds += ckv_time_now() - t0;
    return CKV_STATUS_OK;
}

ckv_status ckv_session_run_hook(ckv_session *s, ckv_layer_hook hook, void *hook_ctx, int layer, int n_prompt,
                                const float *q_tail, int q_tail_rows) {
    s->q_tail = q_tail_rows > 0 ? q_tail : NULL;
    s->q_tail_rows = q_tail_rows;
    s->q_tail_end = n_prompt;
    s->q_tail_layer = layer;
    ckv_status st = hook(hook_ctx, s, layer, n_prompt);
    s->q_tail = NULL;
    return st;
}

ckv_status ckv_session_prefill_layer(ckv_session *s, ckv_layer_hook hook, void *hook_ctx, int *done) {
    ckv_model *m = s->model;
    int n = s->pf_n, l = s->pf_layer;
    *done = 0;
    if (n < 1 || l >= m->cfg.n_layers) return ckv_error(CKV_STATUS_ERR_ARG, "no prefill layer left to run");
    double t0 = ckv_time_now();
    size_t D = (size_t)m->cfg.hidden_size;
    ckv_status st = CKV_STATUS_OK;
    if (!ckv_kv_layer_has_pool(&s->kv, l)) st = ckv_kv_layer_reserve(&s->kv, l, s->capacity); /* compress: lazily */
    int cn = 0; /* rows of the last chunk: their queries stay in the scratch */
    for (int c0 = 0; c0 < n && st == CKV_STATUS_OK; c0 += s->chunk) {
        cn = n - c0 < s->chunk ? n - c0 : s->chunk;
        st = ckv_model_layer(m, &s->scratch, l, s->x + (size_t)c0 * D, s->pos + c0, cn, &s->kv, s->xn ? s->xn + (size_t)c0 * D : NULL);
    }
    if (st == CKV_STATUS_OK) st = ckv_model_check_finite(m, s->x, n, l); /* one synchronisation per layer of a prefill */
    if (st == CKV_STATUS_OK && hook) st = ckv_session_run_hook(s, hook, hook_ctx, l, n, s->scratch.q, cn);
    s->prefill_seconds += ckv_time_now() - t0;
    if (st != CKV_STATUS_OK) return st;
    s->pf_layer = l + 1;
    *done = s->pf_layer == m->cfg.n_layers;
    return CKV_STATUS_OK;
}

ckv_status ckv_session_prefill_end(ckv_session *s, float *all_logits, const float **last) {
    ckv_model *m = s->model;
    const ckv_model_config *c = &m->cfg;
    int n = s->pf_n;
    if (n < 1 || s->pf_layer != c->n_layers) return ckv_error(CKV_STATUS_ERR_ARG, "the prefill has layers left to run");
    double t0 = ckv_time_now();
    size_t D = (size_t)c->hidden_size;
    const float *lg = NULL;
    if (all_logits) {
        int rows = s->scratch.n_logits;
        for (int c0 = 0; c0 < n; c0 += rows) {
            int cn = n - c0 < rows ? n - c0 : rows;
            CKV_TRY(ckv_model_logits(m, &s->scratch, s->x + (size_t)c0 * D, cn, &lg));
            memcpy(all_logits + (size_t)c0 * c->vocab_size, lg, (size_t)cn * c->vocab_size * sizeof(float));
        }
        lg += (size_t)((n - 1) % rows) * c->vocab_size; /* the last row of the last group: the last token */
    } else {
        CKV_TRY(ckv_model_logits(m, &s->scratch, s->x + (size_t)(n - 1) * D, 1, &lg));
    } /* the logits' download waited for the device and reported any failed op */
    s->pf_n = 0;
    s->pf_layer = 0;
    s->n_past += n;
    s->prefill_tokens += n;
    s->prefill_seconds += ckv_time_now() - t0;
    if (last) *last = lg;
    return CKV_STATUS_OK;
}

void ckv_session_prefill_abort(ckv_session *s) {
    s->pf_n = 0;
    s->pf_layer = 0;
}

ckv_status ckv_session_prefill_hook(ckv_session *s, const int32_t *ids, int n, float *all_logits, const float **last,
                                    ckv_layer_hook hook, void *hook_ctx) {
    ckv_status st = ckv_session_prefill_begin(s, ids, n);
    for (int done = 0; st == CKV_STATUS_OK && !done;) st = ckv_session_prefill_layer(s, hook, hook_ctx, &done);
    if (st == CKV_STATUS_OK) st = ckv_session_prefill_end(s, all_logits, last);
    if (st != CKV_STATUS_OK) ckv_session_prefill_abort(s);
    return st;
}

ckv_status ckv_session_prefill(ckv_session *s, const int32_t *ids, int n, float *all_logits, const float **last) {
    return ckv_session_prefill_hook(s, ids, n, all_logits, last, NULL, NULL);
}

ckv_status ckv_session_decode(ckv_session *s, int32_t token, const float **logits) {
    ckv_model *m = s->model;
    if (s->pf_n > 0) return ckv_error(CKV_STATUS_ERR_ARG, "decode during a prefill in progress");
    if (s->n_past + 1 > s->capacity)
        return ckv_error(CKV_STATUS_ERR_RANGE, "decode past the session capacity of %d tokens", s->capacity);
    double t0 = ckv_time_now();
    int32_t pos = s->n_past;
    CKV_TRY(ckv_model_embed(m, &s->scratch, s->x, &token, 1));
    for (int l = 0; l < m->cfg.n_layers; l++) CKV_TRY(ckv_model_layer(m, &s->scratch, l, s->x, &pos, 1, &s->kv, NULL));
    CKV_TRY(ckv_model_logits(m, &s->scratch, s->x, 1, logits)); /* the step's one wait for the device */
    s->n_past++;
    s->decode_tokens++;
    s->decode_seconds += ckv_time_now() - t0;
    return CKV_STATUS_OK;
}

ckv_status ckv_session_mark(ckv_session *s) {
    ckv_kv_cache_lengths(&s->kv, s->mark_lens);
    s->mark_past = s->n_past;
    return CKV_STATUS_OK;
}

ckv_status ckv_session_rewind(ckv_session *s) {
    if (s->mark_past < 0) return ckv_error(CKV_STATUS_ERR_ARG, "session rewind without a mark");
    CKV_TRY(ckv_kv_cache_truncate(&s->kv, s->mark_lens));
    s->n_past = s->mark_past;
    return CKV_STATUS_OK;
}

size_t ckv_session_bytes_for(const ckv_model *m, int capacity, int chunk) {
    const ckv_model_config *c = &m->cfg;
    const ckv_shard_plan *p = &m->plan;
    if (chunk > capacity) chunk = capacity;
    size_t n = (size_t)chunk, D = (size_t)c->hidden_size, d = (size_t)c->head_dim;
    size_t nl = n < CKV_LOGITS_ROWS ? n : CKV_LOGITS_ROWS;
    size_t act = (n * (2 * D + 2 * (size_t)p->n_q_local * d + 2 * (size_t)p->n_kv_local * d + 2 * (size_t)p->n_ff_local + 2) +
                  nl * ((size_t)p->n_vocab_local + (size_t)c->vocab_size)) * sizeof(float);
    size_t kv = (size_t)c->n_layers * (size_t)p->n_kv_local * (size_t)capacity *
                (2 * d * ckv_dtype_size(m->be->kv_dtype) + sizeof(int32_t));
    return kv + act + (size_t)capacity * D * sizeof(float);
}

size_t ckv_session_bytes(const ckv_session *s) {
    const ckv_model *m = s->model;
    const ckv_model_config *c = &m->cfg;
    size_t d = (size_t)c->head_dim;
    /* the estimate assumes the backend's KV dtype: correct it for the one this session uses */
    size_t full = ckv_session_bytes_for(m, s->capacity, s->chunk);
    size_t rows = (size_t)c->n_layers * (size_t)m->plan.n_kv_local * (size_t)s->capacity;
    return full - rows * 2 * d * ckv_dtype_size(m->be->kv_dtype) + rows * 2 * d * ckv_dtype_size(s->kv.dtype);
}
