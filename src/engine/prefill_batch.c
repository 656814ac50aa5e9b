/* prefill_batch.c - several sessions' prompts prefilled in one forward (see prefill_batch.h). */
#include "engine/prefill_batch.h"

#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"

ckv_status ckv_prefill_batch_init(ckv_prefill_batch *b, ckv_model *m, int max_tokens, int max_seq) {
    memset(b, 0, sizeof *b);
    if (max_seq < 1 || max_seq > CKV_LOGITS_ROWS || max_tokens < max_seq)
        return ckv_error(CKV_STATUS_ERR_ARG, "prefill batch of %d sequences over %d tokens: expected 1 .. %d sequences and at "
                         "least one token each", max_seq, max_tokens, CKV_LOGITS_ROWS);
    ckv_backend *be = m->be;
    const size_t D = (size_t)m->cfg.hidden_size, T = (size_t)max_tokens, S = (size_t)max_seq;
    b->model = m;
    b->max_tokens = max_tokens;
    b->max_seq = max_seq;
    ckv_status st = ckv_model_scratch_init(&b->scratch, m, max_tokens);
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&b->x, T * D * sizeof(float), "prefill batch hidden states");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&b->xn, T * D * sizeof(float), "prefill batch attention inputs");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&b->last, S * D * sizeof(float), "prefill batch last rows");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&b->lists, S * sizeof *b->lists, "prefill batch segment lists");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&b->seq_of, T * sizeof(int32_t), "prefill batch rows");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&b->seq_start, (S + 1) * sizeof(int32_t), "prefill batch rows");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&b->lists_host, S * sizeof *b->lists_host, "prefill batch segment lists");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&b->seq_of_host, T * sizeof(int32_t), "prefill batch rows");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&b->split, (S + 1) * sizeof(int32_t), "prefill batch rows");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&b->pos, T * sizeof(int32_t), "prefill batch positions");
    if (st != CKV_STATUS_OK) ckv_prefill_batch_free(b);
    return st;
}

void ckv_prefill_batch_free(ckv_prefill_batch *b) {
    if (!b) return;
    if (b->model) {
        ckv_backend *be = b->model->be;
        ckv_model_scratch_free(&b->scratch, b->model);
        void *dev[] = {b->x, b->xn, b->last, b->lists, b->seq_of, b->seq_start};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) be->ops->release(be, dev[i]);
    }
    ckv_free(b->lists_host);
    ckv_free(b->seq_of_host);
    ckv_free(b->split);
    ckv_free(b->pos);
    memset(b, 0, sizeof *b);
}

/* The members must be begun prefills of b's model, distinct, of one KV dtype, within b's sizes. */
static ckv_status batch_check(const ckv_prefill_batch *b, ckv_session *const *ss, int n) {
    if (n < 1 || n > b->max_seq)
        return ckv_error(CKV_STATUS_ERR_ARG, "prefill batch of %d sessions: expected 1 .. %d", n, b->max_seq);
    long rows = 0;
    for (int i = 0; i < n; i++) {
        const ckv_session *s = ss[i];
        if (s->model != b->model) return ckv_error(CKV_STATUS_ERR_ARG, "prefill batch: session %d belongs to another model", i);
        if (s->pf_n < 1 || s->pf_layer != 0)
            return ckv_error(CKV_STATUS_ERR_ARG, "prefill batch: session %d has no prefill begun (or one already running)", i);
        if (s->kv.dtype != ss[0]->kv.dtype)
            return ckv_error(CKV_STATUS_ERR_ARG, "prefill batch: sessions 0 and %d have KV caches of different dtypes", i);
        for (int j = 0; j < i; j++)
            if (ss[j] == s) return ckv_error(CKV_STATUS_ERR_ARG, "prefill batch: session %d appears twice (rows %d and %d)", i, j, i);
        rows += s->pf_n;
    }
    if (rows > b->max_tokens)
        return ckv_error(CKV_STATUS_ERR_RANGE, "prefill batch of %ld prompt tokens: more than the %d it was sized for", rows,
                         b->max_tokens);
    return CKV_STATUS_OK;
}

/* Layer l of every member: pools reserved where a press reserves them lazily, the layer over all rows,
 * the attention inputs handed to the sessions that keep them, the finite check, then each hook. */
static ckv_status batch_layer(ckv_prefill_batch *b, ckv_session *const *ss, const ckv_layer_hook *hooks,
                              void *const *hook_ctx, int n, int l) {
    ckv_model *m = b->model;
    ckv_backend *be = m->be;
    const size_t D = (size_t)m->cfg.hidden_size, hq = (size_t)m->plan.n_q_local * (size_t)m->cfg.head_dim;
    const int rows = b->split[n];
    ckv_kv_cache *caches[CKV_LOGITS_ROWS];
    int max_len = 0, keep_xn = 0;
    for (int i = 0; i < n; i++) {
        ckv_session *s = ss[i];
        if (!ckv_kv_layer_has_pool(&s->kv, l)) CKV_TRY(ckv_kv_layer_reserve(&s->kv, l, s->capacity));
        caches[i] = &s->kv;
        b->lists_host[i] = s->kv.layers[l].segs;
        for (int h = 0; h < s->kv.n_kv; h++) {
            int len = s->kv.layers[l].len[h] + s->pf_n;
            max_len = len > max_len ? len : max_len;
        }
        keep_xn |= s->xn != NULL;
    }
    CKV_TRY(be->ops->upload(be, b->lists, b->lists_host, (size_t)n * sizeof *b->lists));
    const ckv_kv_cache *c0 = caches[0];
    ckv_kv_batch view = {.dtype = c0->dtype, .head_dim = c0->head_dim, .n_kv_heads = c0->n_kv, .n_seq = n, .segs = b->lists,
                         .seq_of = b->seq_of, .seq_start = b->seq_start, .max_len = max_len};
    CKV_TRY(ckv_model_layer_batch(m, &b->scratch, l, b->x, b->pos, rows, caches, n, b->split, &view, keep_xn ? b->xn : NULL));
    for (int i = 0; i < n; i++)
        if (ss[i]->xn)
            CKV_TRY(be->ops->copy(be, ss[i]->xn, b->xn + (size_t)b->split[i] * D, (size_t)ss[i]->pf_n * D * sizeof(float)));
    CKV_TRY(ckv_model_check_finite(m, b->x, rows, l)); /* one synchronisation per layer, as a prefill */
    for (int i = 0; i < n; i++) {
        if (hooks && hooks[i]) /* the session's rows of the batch: its whole prompt, queries included */
            CKV_TRY(ckv_session_run_hook(ss[i], hooks[i], hook_ctx ? hook_ctx[i] : NULL, l, ss[i]->pf_n,
                                         b->scratch.q + (size_t)b->split[i] * hq, ss[i]->pf_n));
        ss[i]->pf_layer = l + 1;
    }
    return CKV_STATUS_OK;
}

static ckv_status batch_forward(ckv_prefill_batch *b, ckv_session *const *ss, const ckv_layer_hook *hooks,
                                void *const *hook_ctx, int n, const float **logits) {
    ckv_model *m = b->model;
    ckv_backend *be = m->be;
    const size_t D = (size_t)m->cfg.hidden_size;
    /* the rows: every member's embedded prompt, one after another */
    b->split[0] = 0;
    for (int i = 0; i < n; i++) {
        const ckv_session *s = ss[i];
        int r0 = b->split[i];
        CKV_TRY(be->ops->copy(be, b->x + (size_t)r0 * D, s->x, (size_t)s->pf_n * D * sizeof(float)));
        memcpy(b->pos + r0, s->pos, (size_t)s->pf_n * sizeof(int32_t));
        for (int t = 0; t < s->pf_n; t++) b->seq_of_host[r0 + t] = i;
        b->split[i + 1] = r0 + s->pf_n;
    }
    CKV_TRY(be->ops->upload(be, b->seq_of, b->seq_of_host, (size_t)b->split[n] * sizeof(int32_t)));
    CKV_TRY(be->ops->upload(be, b->seq_start, b->split, (size_t)(n + 1) * sizeof(int32_t)));
    for (int l = 0; l < m->cfg.n_layers; l++) CKV_TRY(batch_layer(b, ss, hooks, hook_ctx, n, l));
    for (int i = 0; i < n; i++)
        CKV_TRY(be->ops->copy(be, b->last + (size_t)i * D, b->x + (size_t)(b->split[i + 1] - 1) * D, D * sizeof(float)));
    CKV_TRY(ckv_model_logits(m, &b->scratch, b->last, n, logits));
    return be->ops->sync(be);
}

ckv_status ckv_prefill_batch_run(ckv_prefill_batch *b, ckv_session *const *sessions, const ckv_layer_hook *hooks,
                                 void *const *hook_ctx, int n, const float **logits) {
    ckv_status st = batch_check(b, sessions, n);
    if (st != CKV_STATUS_OK) return st; /* nothing ran: the prefills stay begun */
    double t0 = ckv_time_now();
    st = batch_forward(b, sessions, hooks, hook_ctx, n, logits);
    double dt = ckv_time_now() - t0;
    for (int i = 0; i < n; i++) {
        ckv_session *s = sessions[i];
        s->prefill_seconds += dt;
        if (st == CKV_STATUS_OK) {
            s->n_past += s->pf_n;
            s->prefill_tokens += s->pf_n;
        }
        ckv_session_prefill_abort(s); /* done or dropped: no prefill in progress */
    }
    if (st != CKV_STATUS_OK) return st;
    b->seconds += dt;
    b->calls++;
    b->rows += b->split[n];
    b->seqs += n;
    return CKV_STATUS_OK;
}
