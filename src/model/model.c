/* model.c - loads one rank's slice of a Llama / Mistral / Qwen2 checkpoint onto the backend and
 * frees it. The slice boundaries come from shard/; the forward pass is in forward.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/quant.h"
#include "model/model.h"
#include "model/rope.h"
#include "model/source.h"

/* The loader's host staging buffer k (0: fp32 values, 1: bytes to upload) of at least `bytes`, kept
 * from one tensor to the next: a fresh (zeroed) buffer per tensor cost a page fault and a clearing
 * per 4 KiB of every tensor, most of a random-weight 8B model's 31-s load onto a GPU. */
static ckv_status load_stage(ckv_model *m, int k, size_t bytes, const char *name, void **out) {
    if (bytes > m->stage_cap[k]) {
        ckv_free(m->stage[k]);
        m->stage[k] = NULL;
        m->stage_cap[k] = 0;
        CKV_TRY(ckv_alloc(&m->stage[k], bytes, name));
        m->stage_cap[k] = bytes;
    }
    *out = m->stage[k];
    return CKV_STATUS_OK;
}

static void load_stage_free(ckv_model *m) {
    for (int k = 0; k < 2; k++) {
        ckv_free(m->stage[k]);
        m->stage[k] = NULL;
        m->stage_cap[k] = 0;
    }
}

/* Reads `name` (rows [r0, r1) x cols [c0, c1) of a 2-D tensor, or the whole tensor when r1 < 0) as
 * fp32 into a fresh device buffer of n floats (norms, biases). */
static ckv_status load_f32(ckv_model *m, const ckv_weight_source *st, float **dst, const char *name, int ndim,
                           const int64_t *shape, int64_t r0, int64_t r1, int64_t c0, int64_t c1, size_t n) {
    ckv_backend *be = m->be;
    CKV_TRY(be->ops->alloc(be, (void **)dst, n * sizeof(float), name));
    m->weight_bytes += n * sizeof(float);
    if (be->device == CKV_DEVICE_HOST)
        return st->read_f32(st->ctx, name, ndim, shape, r0, r1, c0, c1, *dst);
    float *tmp = NULL;
    CKV_TRY(load_stage(m, 0, n * sizeof(float), name, (void **)&tmp));
    CKV_TRY(st->read_f32(st->ctx, name, ndim, shape, r0, r1, c0, c1, tmp));
    return be->ops->upload(be, *dst, tmp, n * sizeof(float));
}

/* An fp32 tensor (norms, biases): the whole tensor, or a 2-D slice. */
static ckv_status load_tensor(ckv_model *m, const ckv_weight_source *st, float **dst, const char *name, int ndim,
                              const int64_t *shape, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    size_t n = 1;
    if (r1 >= 0) {
        n = (size_t)(r1 - r0) * (size_t)(c1 - c0);
    } else {
        for (int i = 0; i < ndim; i++) n *= (size_t)shape[i];
    }
    return load_f32(m, st, dst, name, ndim, shape, r0, r1, c0, c1, n);
}

/* Loads rows [r0, r1) x cols [c0, c1) of the 2-D tensor `name` (shape [shape0, shape1]) as a
 * weight matrix in the model's weight dtype. */
static ckv_status load_matrix(ckv_model *m, const ckv_weight_source *st, ckv_weight *w, const char *name,
                              const int64_t *shape, int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    ckv_backend *be = m->be;
    ckv_dtype dt = m->wdtype;
    /* kept as stored when asked, the source hands out its bytes, the backend computes that type and the
     * slice keeps whole blocks */
    const ckv_dtype sdt = m->as_stored && st->stored_dtype && st->read_raw ? st->stored_dtype(st->ctx, name) : dt;
    const int be_ = ckv_dtype_block_elems(sdt);
    if (sdt != dt && be->ops->weight_dtype_ok(be, sdt) && c0 % be_ == 0 && c1 % be_ == 0) {
        memset(w, 0, sizeof *w);
        w->dtype = sdt, w->rows = r1 - r0, w->cols = c1 - c0, w->row_bytes = ckv_dtype_row_bytes(sdt, w->cols);
        const size_t bytes = (size_t)w->rows * w->row_bytes;
        CKV_TRY(be->ops->alloc(be, &w->data, bytes, name));
        m->weight_bytes += bytes;
        if (be->device == CKV_DEVICE_HOST) return st->read_raw(st->ctx, name, shape, r0, r1, c0, c1, w->data);
        void *tmp = NULL;
        CKV_TRY(load_stage(m, 1, bytes, name, &tmp));
        CKV_TRY(st->read_raw(st->ctx, name, shape, r0, r1, c0, c1, tmp));
        return be->ops->upload(be, w->data, tmp, bytes);
    }
    memset(w, 0, sizeof *w);
    w->dtype = dt;
    w->rows = r1 - r0;
    w->cols = c1 - c0;
    w->row_bytes = ckv_dtype_row_bytes(dt, w->cols);
    const size_t n = (size_t)w->rows * (size_t)w->cols;
    if (dt == CKV_DTYPE_F32) return load_f32(m, st, (float **)&w->data, name, 2, shape, r0, r1, c0, c1, n);
    const size_t bytes = (size_t)w->rows * w->row_bytes;
    CKV_TRY(be->ops->alloc(be, &w->data, bytes, name));
    m->weight_bytes += bytes;
    float *tmp = NULL;
    void *conv = NULL;
    CKV_TRY(load_stage(m, 0, n * sizeof(float), name, (void **)&tmp));
    CKV_TRY(load_stage(m, 1, bytes, name, &conv));
    CKV_TRY(st->read_f32(st->ctx, name, 2, shape, r0, r1, c0, c1, tmp));
    ckv_convert_from_f32(conv, tmp, dt, n);
    return be->ops->upload(be, w->data, conv, bytes);
}

static ckv_status load_vector(ckv_model *m, const ckv_weight_source *st, float **dst, const char *name, int64_t len,
                              int64_t begin, int64_t count) {
    /* a 1-D slice is read as rows of a [len, 1] view: use the whole-tensor path when unsliced */
    if (begin == 0 && count == len) return load_tensor(m, st, dst, name, 1, &len, 0, -1, 0, -1);
    ckv_backend *be = m->be;
    float *tmp = NULL;
    CKV_TRY(load_stage(m, 0, (size_t)len * sizeof(float), name, (void **)&tmp));
    ckv_status s = st->read_f32(st->ctx, name, 1, &len, 0, -1, 0, -1, tmp);
    if (s == CKV_STATUS_OK) s = be->ops->alloc(be, (void **)dst, (size_t)count * sizeof(float), name);
    if (s == CKV_STATUS_OK) s = be->ops->upload(be, *dst, tmp + begin, (size_t)count * sizeof(float));
    if (s == CKV_STATUS_OK) m->weight_bytes += (size_t)count * sizeof(float);
    return s;
}

static ckv_status load_layer(ckv_model *m, const ckv_weight_source *st, int i) {
    const ckv_model_config *c = &m->cfg;
    const ckv_shard_plan *p = &m->plan;
    ckv_layer_weights *w = &m->layers[i];
    int64_t D = c->hidden_size, d = c->head_dim, F = c->intermediate_size;
    int64_t qrows = (int64_t)c->n_heads * d, kvrows = (int64_t)c->n_kv_heads * d;
    int64_t q0 = (int64_t)p->q_head0 * d, q1 = q0 + (int64_t)p->n_q_local * d;
    int64_t k0 = (int64_t)p->kv_head0 * d, k1 = k0 + (int64_t)p->n_kv_local * d;
    int64_t f0 = p->ff0, f1 = p->ff0 + p->n_ff_local;
    char name[160];
#define CKV_NAME(suffix) (snprintf(name, sizeof name, "model.layers.%d.%s", i, suffix), name)
    int64_t sq[2] = {qrows, D}, skv[2] = {kvrows, D}, so[2] = {D, qrows}, sf[2] = {F, D}, sd[2] = {D, F};
    CKV_TRY(load_tensor(m, st, &w->attn_norm, CKV_NAME("input_layernorm.weight"), 1, &D, 0, -1, 0, -1));
    CKV_TRY(load_matrix(m, st, &w->wq, CKV_NAME("self_attn.q_proj.weight"), sq, q0, q1, 0, D));
    CKV_TRY(load_matrix(m, st, &w->wk, CKV_NAME("self_attn.k_proj.weight"), skv, k0, k1, 0, D));
    CKV_TRY(load_matrix(m, st, &w->wv, CKV_NAME("self_attn.v_proj.weight"), skv, k0, k1, 0, D));
    if (c->attention_bias) {
        CKV_TRY(load_vector(m, st, &w->bq, CKV_NAME("self_attn.q_proj.bias"), qrows, q0, q1 - q0));
        CKV_TRY(load_vector(m, st, &w->bk, CKV_NAME("self_attn.k_proj.bias"), kvrows, k0, k1 - k0));
        CKV_TRY(load_vector(m, st, &w->bv, CKV_NAME("self_attn.v_proj.bias"), kvrows, k0, k1 - k0));
    }
    CKV_TRY(load_matrix(m, st, &w->wo, CKV_NAME("self_attn.o_proj.weight"), so, 0, D, q0, q1));
    /* Llama's attention_bias also biases o_proj; a row-parallel bias is added once, on rank 0 */
    if (c->attention_bias && c->arch == CKV_ARCH_LLAMA && p->rank == 0)
        CKV_TRY(load_tensor(m, st, &w->bo, CKV_NAME("self_attn.o_proj.bias"), 1, &D, 0, -1, 0, -1));
    CKV_TRY(load_tensor(m, st, &w->mlp_norm, CKV_NAME("post_attention_layernorm.weight"), 1, &D, 0, -1, 0, -1));
    CKV_TRY(load_matrix(m, st, &w->wgate, CKV_NAME("mlp.gate_proj.weight"), sf, f0, f1, 0, D));
    CKV_TRY(load_matrix(m, st, &w->wup, CKV_NAME("mlp.up_proj.weight"), sf, f0, f1, 0, D));
    CKV_TRY(load_matrix(m, st, &w->wdown, CKV_NAME("mlp.down_proj.weight"), sd, 0, D, f0, f1));
#undef CKV_NAME
    return CKV_STATUS_OK;
}

static ckv_status model_load_weights(ckv_model *m, const ckv_weight_source *st, const char *dir) {
    const ckv_model_config *c = &m->cfg;
    const ckv_shard_plan *p = &m->plan;
    ckv_status s = CKV_STATUS_OK;
    int64_t V = c->vocab_size, D = c->hidden_size;
    int64_t se[2] = {V, D};
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) s = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the layer table");
    if (s == CKV_STATUS_OK) s = load_matrix(m, st, &m->embed, "model.embed_tokens.weight", se, 0, V, 0, D);
    if (s == CKV_STATUS_OK) s = load_tensor(m, st, &m->final_norm, "model.norm.weight", 1, &D, 0, -1, 0, -1);
    for (int i = 0; i < c->n_layers && s == CKV_STATUS_OK; i++) s = load_layer(m, st, i);
    if (s == CKV_STATUS_OK) {
        int64_t v0 = p->vocab0, v1 = p->vocab0 + p->n_vocab_local;
        if (c->tie_word_embeddings) {
            if (p->tp == 1) {
                m->lm_head = m->embed;
                m->lm_head_tied = 1;
            } else {
                s = load_matrix(m, st, &m->lm_head, "model.embed_tokens.weight", se, v0, v1, 0, D);
            }
        } else if (!st->has(st->ctx, "lm_head.weight")) {
            s = ckv_error(CKV_STATUS_ERR_FORMAT,
                          "%s: tensor 'lm_head.weight' is missing and config.json does not tie word embeddings", dir);
        } else {
            s = load_matrix(m, st, &m->lm_head, "lm_head.weight", se, v0, v1, 0, D);
        }
    }
    load_stage_free(m);
    if (st->release_pages) st->release_pages(st->ctx);
    return s;
}

ckv_status ckv_model_load(ckv_model **out, const char *dir, ckv_backend *be, ckv_comm *tp) {
    return ckv_model_load_opts(out, dir, be, tp, NULL);
}

/* Loads from dir's checkpoint, or from random weights when seed is not NULL. */
static ckv_status model_load(ckv_model **out, const char *dir, ckv_backend *be, ckv_comm *tp, const ckv_model_opts *opts,
                             const uint64_t *seed) {
    *out = NULL;
    ckv_dtype wdt = opts && opts->weights_dtype != CKV_DTYPE_DEFAULT ? opts->weights_dtype : be->weight_dtype;
    if ((wdt != CKV_DTYPE_F32 && wdt != CKV_DTYPE_F16 && wdt != CKV_DTYPE_BF16) || !be->ops->weight_dtype_ok(be, wdt))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "--weights-dtype %s: the %s backend does not compute weights in it",
                         ckv_dtype_name(wdt), be->name);
    ckv_model *m = calloc(1, sizeof *m);
    if (!m) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the model");
    m->be = be;
    m->tp = tp;
    m->wdtype = wdt;
    m->as_stored = opts && opts->as_stored;
    ckv_weight_source src;
    ckv_status s = seed ? ckv_source_open_random(&src, &m->cfg, dir, *seed) : ckv_source_open(&src, &m->cfg, dir);
    const ckv_model_config *c = &m->cfg;
    if (s == CKV_STATUS_OK)
        s = ckv_shard_plan_init(&m->plan, tp ? tp->size : 1, tp ? tp->rank : 0, c->n_heads, c->n_kv_heads, c->head_dim,
                                c->intermediate_size, c->vocab_size);
    /* when tp > Hkv several ranks hold the same KV head: scorers reduce their partial sums among them */
    if (s == CKV_STATUS_OK && tp && tp->size > 1 && m->plan.kv_replicas > 1)
        s = tp->ops->split(tp, m->plan.replica_group, tp->rank, &m->replica);
    if (s == CKV_STATUS_OK) s = model_load_weights(m, &src, dir);
    ckv_source_close(&src);
    if (s == CKV_STATUS_OK) {
        float inv[1024];
        if (c->head_dim / 2 > 1024) s = ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "head_dim %d is too large", c->head_dim);
        if (s == CKV_STATUS_OK)
            s = ckv_rope_init_freqs(&c->rope, c->head_dim, c->max_position_embeddings, inv, &m->rope_scale);
        if (s == CKV_STATUS_OK)
            s = be->ops->alloc(be, (void **)&m->inv_freq, sizeof(float) * (size_t)(c->head_dim / 2), "rope frequencies");
        if (s == CKV_STATUS_OK) s = be->ops->upload(be, m->inv_freq, inv, sizeof(float) * (size_t)(c->head_dim / 2));
    }
    if (s != CKV_STATUS_OK) {
        ckv_model_free(m);
        return s;
    }
    *out = m;
    return CKV_STATUS_OK;
}

ckv_status ckv_model_load_opts(ckv_model **out, const char *dir, ckv_backend *be, ckv_comm *tp,
                               const ckv_model_opts *opts) {
    /* --random-weights: dir needs only config.json */
    if (opts && opts->random_weights) return model_load(out, dir, be, tp, opts, &opts->random_seed);
    return model_load(out, dir, be, tp, opts, NULL);
}

ckv_status ckv_model_load_random(ckv_model **out, const char *dir, ckv_backend *be, ckv_comm *tp,
                                 const ckv_model_opts *opts, uint64_t seed) {
    return model_load(out, dir, be, tp, opts, &seed);
}

void ckv_model_free(ckv_model *m) {
    if (!m) return;
    ckv_backend *be = m->be;
    if (m->layers) {
        for (int i = 0; i < m->cfg.n_layers; i++) {
            ckv_layer_weights *w = &m->layers[i];
            void *bufs[] = {w->attn_norm, w->wq.data, w->bq, w->wk.data, w->bk, w->wv.data, w->bv,
                            w->wo.data, w->bo, w->mlp_norm, w->wgate.data, w->wup.data, w->wdown.data};
            for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++) be->ops->release(be, bufs[j]);
        }
        free(m->layers);
    }
    if (!m->lm_head_tied) be->ops->release(be, m->lm_head.data);
    be->ops->release(be, m->embed.data);
    be->ops->release(be, m->final_norm);
    be->ops->release(be, m->inv_freq);
    ckv_comm_free(m->replica);
    load_stage_free(m);
    free(m);
}

size_t ckv_model_weight_bytes_dtype(const ckv_model_config *c, const ckv_shard_plan *p, ckv_dtype dtype) {
    size_t D = (size_t)c->hidden_size, d = (size_t)c->head_dim, V = (size_t)c->vocab_size;
    size_t es = ckv_dtype_size(dtype) ? ckv_dtype_size(dtype) : sizeof(float);
    size_t mat = (size_t)p->n_q_local * d * D * 2 + (size_t)p->n_kv_local * d * D * 2 + (size_t)p->n_ff_local * D * 3;
    size_t vec = 2 * D;
    if (c->attention_bias) vec += (size_t)(p->n_q_local + 2 * p->n_kv_local) * d;
    size_t mats = mat * (size_t)c->n_layers + V * D;
    if (!(c->tie_word_embeddings && p->tp == 1)) mats += (size_t)p->n_vocab_local * D;
    return mats * es + (vec * (size_t)c->n_layers + D) * sizeof(float);
}

size_t ckv_model_weight_bytes(const ckv_model_config *c, const ckv_shard_plan *p) {
    return ckv_model_weight_bytes_dtype(c, p, CKV_DTYPE_F32);
}

static void fp_mix(uint64_t *h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) *h = (*h ^ b[i]) * 0x100000001b3ull;
}

ckv_status ckv_model_fingerprint(const ckv_model *m, char out[17]) {
    const ckv_model_config *c = &m->cfg;
    uint64_t h = 0xcbf29ce484222325ull;
    int shape[] = {c->arch, c->vocab_size, c->hidden_size, c->intermediate_size, c->n_layers, c->n_heads,
                   c->n_kv_heads, c->head_dim, c->tie_word_embeddings, c->attention_bias, (int)c->rope.type};
    fp_mix(&h, shape, sizeof shape);
    fp_mix(&h, &c->rope.theta, sizeof c->rope.theta);
    fp_mix(&h, &c->rope.factor, sizeof c->rope.factor);
    /* weights every rank holds in full: the first rows of the embeddings and the final norm */
    float sample[1024];
    /* the first rows of the embeddings, as fp32 whatever they are stored in (the same model gives
     * the same fingerprint on every backend up to the rounding of its weight dtype) */
    size_t n = (size_t)c->hidden_size * 4 < 1024 ? (size_t)c->hidden_size * 4 : 1024;
    if (n > (size_t)c->vocab_size * (size_t)c->hidden_size) n = (size_t)c->vocab_size * (size_t)c->hidden_size;
    {
        /* whole rows (block types quantise along rows), dequantised as the f32 loader would */
        const size_t D = (size_t)c->hidden_size, rows = (n + D - 1) / D;
        unsigned char *raw = NULL; // [rows, row_bytes]
        float *vals = NULL;        // [rows, D]
        ckv_status st = ckv_alloc((void **)&raw, rows * m->embed.row_bytes, "fingerprint rows");
        if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&vals, rows * D * sizeof(float), "fingerprint values");
        if (st == CKV_STATUS_OK) st = m->be->ops->download(m->be, raw, m->embed.data, rows * m->embed.row_bytes);
        for (size_t r = 0; r < rows && st == CKV_STATUS_OK; r++)
            ckv_dequant_row(m->embed.dtype, raw + r * m->embed.row_bytes, vals + r * D, D);
        if (st == CKV_STATUS_OK) memcpy(sample, vals, n * sizeof(float));
        ckv_free(raw);
        ckv_free(vals);
        CKV_TRY(st);
    }
    fp_mix(&h, sample, n * sizeof(float));
    n = (size_t)c->hidden_size < 1024 ? (size_t)c->hidden_size : 1024;
    CKV_TRY(m->be->ops->download(m->be, sample, m->final_norm, n * sizeof(float)));
    fp_mix(&h, sample, n * sizeof(float));
    snprintf(out, 17, "%016llx", (unsigned long long)h);
    return CKV_STATUS_OK;
}
