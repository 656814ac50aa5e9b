/* forward.c - the transformer forward of one rank: embedding, one decoder layer over a chunk of
 * tokens (Megatron-style: column-parallel q/k/v/gate/up, row-parallel o_proj/down followed by one
 * all-reduce each), final norm and vocabulary-parallel logits. Nothing here allocates except
 * ckv_model_scratch_init, which the engine calls once per session. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "model/model.h"

static size_t padded_vocab(const ckv_model *m) {
    /* the largest local vocabulary slice: every rank contributes this many columns to the gather */
    return (size_t)((m->cfg.vocab_size + m->plan.tp - 1) / m->plan.tp);
}

ckv_status ckv_model_scratch_init(ckv_model_scratch *s, const ckv_model *m, int n_max) {
    memset(s, 0, sizeof *s);
    if (n_max < 1) return ckv_error(CKV_STATUS_ERR_ARG, "--chunk must be >= 1, got %d", n_max);
    if (m->plan.tp > 1 && !ckv_comm_has_device_ops(m->tp))
        return ckv_error(CKV_STATUS_ERR_ARG, "a model split over %d ranks needs the group's device communicator "
                         "(engine/comm_backend.h), not a host one", m->plan.tp);
    ckv_backend *be = m->be;
    const ckv_model_config *c = &m->cfg;
    const ckv_shard_plan *p = &m->plan;
    size_t n = (size_t)n_max, D = (size_t)c->hidden_size, d = (size_t)c->head_dim;
    size_t qd = (size_t)p->n_q_local * d, kd = (size_t)p->n_kv_local * d, ff = (size_t)p->n_ff_local;
    s->n_max = n_max;
    s->n_logits = n_max < CKV_LOGITS_ROWS ? n_max : CKV_LOGITS_ROWS;
    size_t nl = (size_t)s->n_logits;
    struct {
        void **ptr;
        size_t bytes;
        const char *what;
    } bufs[] = {
        {(void **)&s->xn, n * D * 4, "normed activations"},
        {(void **)&s->q, n * qd * 4, "queries"},
        {(void **)&s->k, n * kd * 4, "keys"},
        {(void **)&s->v, n * kd * 4, "values"},
        {(void **)&s->att, n * qd * 4, "attention output"},
        {(void **)&s->gate, n * ff * 4, "MLP gate"},
        {(void **)&s->up, n * ff * 4, "MLP up"},
        {(void **)&s->proj, n * D * 4, "projection output"},
        {(void **)&s->logits, nl * (size_t)p->n_vocab_local * 4, "logits"},
        {(void **)&s->pos, n * 4, "positions"},
        {(void **)&s->ids, n * 4, "token ids"},
    };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) {
        ckv_status st = be->ops->alloc(be, bufs[i].ptr, bufs[i].bytes, bufs[i].what);
        if (st != CKV_STATUS_OK) {
            ckv_model_scratch_free(s, m);
            return st;
        }
    }
    ckv_status st = ckv_alloc((void **)&s->host_logits, nl * (size_t)c->vocab_size * 4, "host logits");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&s->pos_host, n * sizeof(int32_t), "host positions");
    if (st == CKV_STATUS_OK && p->tp > 1)
        st = ckv_alloc((void **)&s->host_part, nl * padded_vocab(m) * (size_t)p->tp * 4, "logit gather buffer");
    if (st != CKV_STATUS_OK) ckv_model_scratch_free(s, m);
    return st;
}

void ckv_model_scratch_free(ckv_model_scratch *s, const ckv_model *m) {
    if (!s) return;
    if (m) {
        ckv_backend *be = m->be;
        void *bufs[] = {s->xn, s->q, s->k, s->v, s->att, s->gate, s->up, s->proj, s->logits, s->pos, s->ids};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->ops->release(be, bufs[i]);
    }
    ckv_free(s->host_logits);
    ckv_free(s->host_part);
    ckv_free(s->pos_host);
    memset(s, 0, sizeof *s);
}

ckv_status ckv_model_ids_put(ckv_model *m, ckv_model_scratch *s, const int32_t *ids, int n) {
    if (n < 1 || n > s->n_max) return ckv_error(CKV_STATUS_ERR_ARG, "embed: %d tokens outside [1, %d]", n, s->n_max);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->cfg.vocab_size)
            return ckv_error(CKV_STATUS_ERR_RANGE, "token id %d at index %d is outside the vocabulary [0, %d)", ids[i],
                             i, m->cfg.vocab_size);
    return m->be->ops->upload(m->be, s->ids, ids, (size_t)n * sizeof(int32_t));
}

void ckv_model_embed_ids(ckv_model *m, ckv_model_scratch *s, float *x, int n) {
    m->be->ops->embedding(m->be, x, &m->embed, s->ids, n);
}

ckv_status ckv_model_embed(ckv_model *m, ckv_model_scratch *s, float *x, const int32_t *ids, int n) {
    CKV_TRY(ckv_model_ids_put(m, s, ids, n));
    ckv_model_embed_ids(m, s, x, n);
    return CKV_STATUS_OK;
}

/* Sums a row-parallel projection's partial output over the TP group through its device
 * communicator (which decides how device buffers move: directly, NCCL, or staged). */
static ckv_status allreduce_hidden(ckv_model *m, float *buf, size_t count) {
    if (!m->tp || m->tp->size == 1) return CKV_STATUS_OK;
    return ckv_comm_dev_allreduce_f32(m->tp, buf, count, CKV_COMM_OP_SUM);
}

ckv_status ckv_model_positions_put(ckv_model *m, ckv_model_scratch *s, const int32_t *pos, int n) {
    if (n < 1 || n > s->n_max) return ckv_error(CKV_STATUS_ERR_ARG, "positions: %d tokens outside [1, %d]", n, s->n_max);
    const size_t bytes = (size_t)n * sizeof(int32_t);
    if (n == s->pos_n && memcmp(s->pos_host, pos, bytes) == 0) return CKV_STATUS_OK;
    s->pos_n = 0; /* until the upload is queued */
    CKV_TRY(m->be->ops->upload(m->be, s->pos, pos, bytes));
    memcpy(s->pos_host, pos, bytes);
    s->pos_n = n;
    return CKV_STATUS_OK;
}

/* One decoder layer over n tokens whose keys/values go to `caches` (batch view kv); see model.h. */
static ckv_status model_layer(ckv_model *m, ckv_model_scratch *s, int layer, float *x, const int32_t *pos, int n,
                              ckv_kv_cache *const *caches, int n_seq, const int32_t *seq_start,
                              const ckv_kv_batch *kv, float *xn_out) {
    if (n < 1 || n > s->n_max) return ckv_error(CKV_STATUS_ERR_ARG, "layer: %d tokens outside [1, %d]", n, s->n_max);
    ckv_backend *be = m->be;
    const ckv_backend_ops *op = be->ops;
    const ckv_model_config *c = &m->cfg;
    const ckv_shard_plan *p = &m->plan;
    const ckv_layer_weights *w = &m->layers[layer];
    int D = c->hidden_size, d = c->head_dim, nq = p->n_q_local, nkv = p->n_kv_local, ff = p->n_ff_local;
    float eps = (float)c->rms_norm_eps;

    CKV_TRY(ckv_model_positions_put(m, s, pos, n));
    /* attention block */
    op->rmsnorm(be, s->xn, x, w->attn_norm, n, D, eps);
    if (xn_out) CKV_TRY(op->copy(be, xn_out, s->xn, (size_t)n * D * sizeof(float)));
    op->matmul(be, s->q, s->xn, &w->wq, w->bq, n);
    op->matmul(be, s->k, s->xn, &w->wk, w->bk, n);
    op->matmul(be, s->v, s->xn, &w->wv, w->bv, n);
    op->rope(be, s->q, s->pos, n, nq, d, m->inv_freq, m->rope_scale);
    op->rope(be, s->k, s->pos, n, nkv, d, m->inv_freq, m->rope_scale);
    CKV_TRY(ckv_kv_append_batch(caches, n_seq, seq_start, layer, kv, s->k, s->v, s->pos, n));
    const ckv_attention_params ap = {s->q, s->pos, kv, n, nq, 1.0f / sqrtf((float)d)};
    op->attention(be, s->att, &ap);
    op->matmul(be, s->proj, s->att, &w->wo, w->bo, n);
    CKV_TRY(allreduce_hidden(m, s->proj, (size_t)n * D));
    op->add(be, x, s->proj, (size_t)n * D);
    /* MLP block */
    op->rmsnorm(be, s->xn, x, w->mlp_norm, n, D, eps);
    op->matmul(be, s->gate, s->xn, &w->wgate, NULL, n);
    op->matmul(be, s->up, s->xn, &w->wup, NULL, n);
    op->swiglu(be, s->gate, s->gate, s->up, (size_t)n * ff);
    op->matmul(be, s->proj, s->gate, &w->wdown, NULL, n);
    CKV_TRY(allreduce_hidden(m, s->proj, (size_t)n * D));
    op->add(be, x, s->proj, (size_t)n * D);
    return CKV_STATUS_OK;
}

ckv_status ckv_model_layer(ckv_model *m, ckv_model_scratch *s, int layer, float *x, const int32_t *pos, int n,
                           ckv_kv_cache *kv, float *xn_out) {
    ckv_kv_batch view = ckv_kv_layer_batch(kv, layer, n);
    return model_layer(m, s, layer, x, pos, n, &kv, 1, NULL, &view, xn_out);
}

ckv_status ckv_model_layer_batch(ckv_model *m, ckv_model_scratch *s, int layer, float *x, const int32_t *pos, int n,
                                 ckv_kv_cache *const *caches, int n_seq, const int32_t *seq_start,
                                 const ckv_kv_batch *kv, float *xn_out) {
    if (n_seq < 1 || (n_seq > 1 && !seq_start) || kv->n_seq != n_seq)
        return ckv_error(CKV_STATUS_ERR_ARG, "layer batch: %d caches, a view of %d sequences", n_seq, kv->n_seq);
    return model_layer(m, s, layer, x, pos, n, caches, n_seq, seq_start, kv, xn_out);
}

/* Non-finite logits end the run with an error instead of sampling garbage. */
static ckv_status logits_check(const float *lg, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(lg[i]))
            return ckv_error(CKV_STATUS_ERR_NUMERIC, "the logits hold a non-finite value (%g at index %zu): the weights "
                             "or the activations overflowed", (double)lg[i], i);
    return CKV_STATUS_OK;
}

ckv_status ckv_model_check_finite(ckv_model *m, const float *x, int n, int layer) {
    size_t bad = 0;
    CKV_TRY(m->be->ops->count_nonfinite(m->be, x, (size_t)n * (size_t)m->cfg.hidden_size, &bad));
    if (bad)
        return ckv_error(CKV_STATUS_ERR_NUMERIC, "layer %d produced %zu non-finite activations (NaN or Inf) over %d "
                         "tokens: the weights or the inputs are corrupt", layer, bad, n);
    return CKV_STATUS_OK;
}

/* Final norm + lm_head; at tp > 1 the vocabulary slices gathered: *parts [tp, n, pad] (device, in the
 * communicator's workspace) with *pad floats a row slice; at tp 1 the rows stay in s->logits [n, V]. */
static ckv_status logits_compute(ckv_model *m, ckv_model_scratch *s, const float *x, int n, const float **parts,
                                 size_t *pad) {
    if (n < 1 || n > s->n_logits) return ckv_error(CKV_STATUS_ERR_ARG, "logits: %d rows outside [1, %d]", n, s->n_logits);
    ckv_backend *be = m->be;
    const ckv_model_config *c = &m->cfg;
    const ckv_shard_plan *p = &m->plan;
    int D = c->hidden_size, vl = p->n_vocab_local;
    be->ops->rmsnorm(be, s->xn, x, m->final_norm, n, D, (float)c->rms_norm_eps);
    be->ops->matmul(be, s->logits, s->xn, &m->lm_head, NULL, n);
    *parts = s->logits;
    *pad = (size_t)vl;
    if (p->tp == 1) return CKV_STATUS_OK;
    /* gather the vocabulary slices: every rank sends [n, pad] (its slice padded to the largest) */
    *pad = padded_vocab(m);
    const size_t send_bytes = (size_t)n * *pad * sizeof(float);
    float *ws = NULL; // [n, pad] send + [tp, n, pad] receive (device)
    CKV_TRY(ckv_comm_dev_workspace(m->tp, send_bytes * (size_t)(p->tp + 1), (void **)&ws));
    if ((size_t)vl == *pad)
        CKV_TRY(be->ops->copy(be, ws, s->logits, send_bytes));
    else
        for (int t = 0; t < n; t++)
            CKV_TRY(be->ops->copy(be, ws + (size_t)t * *pad, s->logits + (size_t)t * vl, (size_t)vl * sizeof(float)));
    CKV_TRY(ckv_comm_dev_allgather(m->tp, ws, ws + (size_t)n * *pad, send_bytes));
    *parts = ws + (size_t)n * *pad;
    return CKV_STATUS_OK;
}

/* The gathered slices parts [tp, n, pad] side by side into full [n, V]: host or device memory. */
static ckv_status logits_assemble(ckv_model *m, float *full, const float *parts, int n, size_t pad, int on_device) {
    ckv_backend *be = m->be;
    const int V = m->cfg.vocab_size, tp = m->plan.tp;
    for (int r = 0; r < tp; r++) {
        int v0, cnt;
        ckv_shard_range(V, tp, r, &v0, &cnt);
        for (int t = 0; t < n; t++) {
            float *dst = full + (size_t)t * V + v0;
            const float *src = parts + ((size_t)r * (size_t)n + (size_t)t) * pad;
            if (on_device) CKV_TRY(be->ops->copy(be, dst, src, (size_t)cnt * sizeof(float)));
            else memcpy(dst, src, (size_t)cnt * sizeof(float));
        }
    }
    return CKV_STATUS_OK;
}

/* The logits [n, V] of x on the host (device 0: downloaded and checked there) or on the device
 * (device 1: at tp > 1 assembled into full; left to the sample op to check, so the step waits
 * for the device once, for its ids). */
static ckv_status logits_get(ckv_model *m, ckv_model_scratch *s, const float *x, int n, int device, float *full,
                             const float **logits) {
    ckv_backend *be = m->be;
    const int tp = m->plan.tp;
    const size_t nv = (size_t)n * (size_t)m->cfg.vocab_size;
    const float *parts = NULL;
    size_t pad = 0;
    CKV_TRY(logits_compute(m, s, x, n, &parts, &pad));
    if (!device) {
        if (tp == 1) return ckv_model_logits_fetch(m, s, parts, n, logits);
        CKV_TRY(be->ops->download(be, s->host_part, parts, (size_t)n * pad * sizeof(float) * (size_t)tp));
        CKV_TRY(logits_assemble(m, s->host_logits, s->host_part, n, pad, 0));
        *logits = s->host_logits;
        return logits_check(s->host_logits, nv);
    }
    if (tp > 1) {
        if (!full) return ckv_error(CKV_STATUS_ERR_ARG, "device logits at tp %d need a [%d, %d] buffer", tp, n, m->cfg.vocab_size);
        CKV_TRY(logits_assemble(m, full, parts, n, pad, 1));
        parts = full;
    }
    *logits = parts; /* not checked here: the sample op marks a non-finite row (CKV_SAMPLE_NONFINITE) */
    return CKV_STATUS_OK;
}

ckv_status ckv_model_logits_fetch(ckv_model *m, ckv_model_scratch *s, const float *logits_dev, int n,
                                  const float **logits) {
    if (n < 1 || n > s->n_logits) return ckv_error(CKV_STATUS_ERR_ARG, "logits: %d rows outside [1, %d]", n, s->n_logits);
    const size_t nv = (size_t)n * (size_t)m->cfg.vocab_size;
    CKV_TRY(m->be->ops->download(m->be, s->host_logits, logits_dev, nv * sizeof(float)));
    *logits = s->host_logits;
    return logits_check(s->host_logits, nv);
}

ckv_status ckv_model_logits(ckv_model *m, ckv_model_scratch *s, const float *x, int n, const float **logits) {
    return logits_get(m, s, x, n, 0, NULL, logits);
}

ckv_status ckv_model_logits_device(ckv_model *m, ckv_model_scratch *s, const float *x, int n, float *full,
                                   const float **logits) {
    return logits_get(m, s, x, n, 1, full, logits);
}
