/* scorer.c - ckv_score_layer: dispatches through the press registry (press_table.c) to the scorer
 * families (score_window.c, score_simple.c, score_observed.c, score_expected.c, score_defensive.c)
 * and reports which tokens each scorer protects (the registry's rule); also the helpers they share (input checks, the local query head -> local KV
 * head map, the group mean with its replica all-reduce through the backend's ops, device scratch
 * bookkeeping). It computes no scores itself, does not set protected scores (the caller does, after
 * the cross-head reduction) and selects nothing. */
#include "evict/scorer.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "evict/press_registry.h"

ckv_status ckv_score_check_inputs(const ckv_score_inputs *in, const char *who) {
    if (!in) return ckv_error(CKV_STATUS_ERR_ARG, "scorer %s: no inputs", who);
    if (in->L < 1) return ckv_error(CKV_STATUS_ERR_ARG, "scorer %s: layer %d has no context tokens (L %d)", who,
                                    in->layer, in->L);
    if (in->head_dim < 2 || in->head_dim % 2 != 0 || in->D < 1)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "scorer %s: head_dim %d must be even and >= 2, hidden size %d >= 1", who,
                         in->head_dim, in->D);
    if (in->n_heads < 1 || in->n_kv_heads < 1 || in->n_heads % in->n_kv_heads != 0)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "scorer %s: %d query heads are not a multiple of %d KV heads", who,
                         in->n_heads, in->n_kv_heads);
    if (in->n_q_local < 1 || in->q_head0 < 0 || in->q_head0 + in->n_q_local > in->n_heads)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "scorer %s: local query heads %d..%d outside 0..%d", who, in->q_head0,
                         in->q_head0 + in->n_q_local - 1, in->n_heads - 1);
    if (in->n_kv_local < 1 || in->kv_head0 < 0 || in->kv_head0 + in->n_kv_local > in->n_kv_heads)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "scorer %s: local KV heads %d..%d outside 0..%d", who, in->kv_head0,
                         in->kv_head0 + in->n_kv_local - 1, in->n_kv_heads - 1);
    for (int j = 0; j < in->n_q_local; j++)
        if (ckv_score_local_kv(in, j) < 0)
            return ckv_error(CKV_STATUS_ERR_SHAPE, "scorer %s: query head %d belongs to KV head %d, not held here (%d..%d)",
                             who, in->q_head0 + j, (in->q_head0 + j) / (in->n_heads / in->n_kv_heads), in->kv_head0,
                             in->kv_head0 + in->n_kv_local - 1);
    if (!in->be) return ckv_error(CKV_STATUS_ERR_ARG, "scorer %s: no backend", who);
    /* every eviction op is one every backend has; a table built outside backend init is checked here */
    if (ckv_backend_check_ops(in->be) != CKV_STATUS_OK)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "scorer %s: %s", who, ckv_error_message());
    const ckv_kv_batch *kv = &in->kv;
    if (!kv->segs || kv->n_seq != 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "scorer %s: layer %d needs the segments of one sequence (got %d)", who,
                         in->layer, kv->segs ? kv->n_seq : 0);
    if (kv->head_dim != in->head_dim || kv->n_kv_heads != in->n_kv_local)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "scorer %s: segments of head_dim %d / %d heads, expected %d / %d", who,
                         kv->head_dim, kv->n_kv_heads, in->head_dim, in->n_kv_local);
    if (kv->dtype != CKV_DTYPE_F32 && kv->dtype != CKV_DTYPE_F16 && kv->dtype != CKV_DTYPE_BF16)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "scorer %s: KV cache dtype %s", who, ckv_dtype_name(kv->dtype));
    if (kv->max_len < in->L)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "scorer %s: the segments hold at most %d rows, fewer than L %d", who,
                         kv->max_len, in->L);
    return CKV_STATUS_OK;
}

int ckv_score_local_kv(const ckv_score_inputs *in, int j) {
    int group = in->n_heads / in->n_kv_heads;
    int g = (in->q_head0 + j) / group - in->kv_head0;
    return g >= 0 && g < in->n_kv_local ? g : -1;
}

int ckv_score_head0(const ckv_score_inputs *in) {
    return in->q_head0 - in->kv_head0 * (in->n_heads / in->n_kv_heads);
}

ckv_evict_attn_params ckv_score_attn_params(const ckv_score_inputs *in, const float *q, int n_q, int q_row0,
                                            float scale, ckv_evict_logits logits) {
    const ckv_evict_attn_params a = {.q = q, .n_q = n_q, .q_row0 = q_row0, .kv = &in->kv,
                                     .n_heads_local = in->n_q_local, .head0 = ckv_score_head0(in),
                                     .group = in->n_heads / in->n_kv_heads, .scale = scale, .logits = logits};
    return a;
}

const float *ckv_score_window_queries(const ckv_score_inputs *in, int w, float *scratch) {
    const size_t hq = (size_t)in->n_q_local * (size_t)in->head_dim;
    if (in->q_tail && in->q_tail_rows >= w) return in->q_tail + (size_t)(in->q_tail_rows - w) * hq;
    ckv_backend *be = in->be;
    be->ops->matmul(be, scratch, in->xn + (size_t)(in->L - w) * (size_t)in->D, in->wq, in->bq, w);
    be->ops->rope(be, scratch, in->pos + (in->L - w), w, in->n_q_local, in->head_dim, in->inv_freq, in->rope_scale);
    return scratch;
}

int ckv_score_rank_kv_head0(const ckv_score_inputs *in, int rank) {
    return rank / (in->kv_replicas > 1 ? in->kv_replicas : 1) * in->n_kv_local;
}

ckv_status ckv_score_group_mean(const ckv_score_inputs *in, float *scores) {
    size_t n = (size_t)in->n_kv_local * (size_t)in->L;
    CKV_TRY(ckv_evict_allreduce(in->be, in->replica, scores, n, CKV_COMM_OP_SUM, 1));
    in->be->ops->evict_div(in->be, scores, n, (float)(in->n_heads / in->n_kv_heads));
    return CKV_STATUS_OK;
}

ckv_status ckv_score_zscore(const ckv_score_inputs *in, float *x, int ld, int n, const double *stats_dev) {
    ckv_backend *be = in->be;
    const int nkv = in->n_kv_local, size = in->tp && in->tp->size > 1 ? in->tp->size : 1;
    const size_t st_bytes = 2 * (size_t)nkv * sizeof(double);
    ckv_score_dev dev = ckv_score_dev_begin(in);
    double *all_d = NULL, *all = NULL; // [size, nkv, 2] device, host
    ckv_status s = ckv_alloc((void **)&all, (size_t)size * st_bytes, "z-score statistics");
    if (s == CKV_STATUS_OK) s = ckv_score_dev_alloc(&dev, (void **)&all_d, (size_t)size * st_bytes, "z-score statistics");
    if (s == CKV_STATUS_OK) s = ckv_evict_allgather(be, in->tp, stats_dev, all_d, st_bytes);
    if (s == CKV_STATUS_OK) s = be->ops->sync(be);
    if (s == CKV_STATUS_OK) s = be->ops->download(be, all, all_d, (size_t)size * st_bytes);
    for (size_t i = 0; s == CKV_STATUS_OK && i < (size_t)size * 2 * (size_t)nkv; i++) /* a device op reports a failed */
        if (isnan(all[i]))                                                            /* leverage factor so */
            s = ckv_error(CKV_STATUS_ERR_NUMERIC, "press leverage: the sketched Gram matrix of a KV head of layer %d "
                          "is not positive definite even with jitter 100", in->layer);
    if (s == CKV_STATUS_OK) {
        double s1 = 0.0, s2 = 0.0;
        for (int h = 0, r = 0; h < in->n_kv_heads && r < size; r++) { /* global heads ascending, each once */
            const int h0 = ckv_score_rank_kv_head0(in, r);
            for (int g = 0; g < nkv; g++)
                if (h0 + g == h) {
                    s1 += all[(size_t)r * 2 * nkv + 2 * g];
                    s2 += all[(size_t)r * 2 * nkv + 2 * g + 1];
                    h++;
                }
        }
        const double N = (double)in->n_kv_heads * (double)n, mean = s1 / N;
        const double var = N > 1.0 ? (s2 - s1 * mean) / (N - 1.0) : 0.0; /* torch.std: unbiased */
        const double sd = var > 0.0 ? sqrt(var) : 0.0;
        be->ops->evict_affine(be, x, nkv, n, ld, (float)mean, sd > 1e-6 ? (float)sd : 1e-6f);
    }
    ckv_score_dev_free(&dev);
    ckv_free(all);
    return s;
}

ckv_score_dev ckv_score_dev_begin(const ckv_score_inputs *in) {
    ckv_score_dev d = {.be = in->be, .arena = in->arena && in->arena->be == in->be ? in->arena : NULL};
    if (!d.arena && in->arena && !in->arena->be) { /* a zeroed arena takes the inputs' backend */
        in->arena->be = in->be;
        d.arena = in->arena;
    }
    d.mark = d.arena ? d.arena->top : 0;
    return d;
}

ckv_status ckv_score_dev_alloc(ckv_score_dev *d, void **out, size_t bytes, const char *what) {
    *out = NULL;
    const size_t b = ((bytes > 0 ? bytes : 1) + 255) & ~(size_t)255; /* 256-byte aligned pieces */
    ckv_score_arena *a = d->arena;
    if (a && a->base && d->mark + d->used + b <= a->cap) {
        *out = a->base + d->mark + d->used;
    } else {
        if (d->n >= CKV_SCORE_DEV_MAX) return ckv_error(CKV_STATUS_ERR_INTERNAL, "scorer scratch: too many buffers (%s)", what);
        CKV_TRY(d->be->ops->alloc(d->be, out, b, what));
        d->p[d->n++] = *out;
    }
    d->used += b;
    if (a) {
        a->top = d->mark + d->used;
        if (a->top > a->need) a->need = a->top;
    }
    return CKV_STATUS_OK;
}

void ckv_score_dev_free(ckv_score_dev *d) {
    if (!d || !d->be) return;
    for (int i = 0; i < d->n; i++) d->be->ops->release(d->be, d->p[i]);
    d->n = 0;
    ckv_score_arena *a = d->arena;
    if (a) {
        a->top = d->mark;
        if (a->top == 0 && a->need > a->cap) { /* nothing lives in it: grow to what the call needed */
            a->be->ops->release(a->be, a->base);
            a->base = NULL;
            a->cap = 0;
            if (a->be->ops->alloc(a->be, (void **)&a->base, a->need, "scorer scratch") == CKV_STATUS_OK) a->cap = a->need;
            else ckv_error_clear(); /* the next call allocates its own buffers */
        }
    }
    d->used = 0;
}

void ckv_score_arena_free(ckv_score_arena *a) {
    if (!a) return;
    if (a->be && a->base) a->be->ops->release(a->be, a->base);
    memset(a, 0, sizeof *a);
}

ckv_status ckv_score_layer(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores,
                           ckv_score_info *info) {
    if (!cfg || !scores || !info) return ckv_error(CKV_STATUS_ERR_ARG, "ckv_score_layer: missing config/scores/info");
    info->protect_head = 0;
    info->protect_tail = 0;
    const ckv_press_def *d = ckv_press_def_of(cfg->scorer);
    if (!d) return ckv_error(CKV_STATUS_ERR_ARG, "ckv_score_layer: unknown scorer kind %d", (int)cfg->scorer);
    if (!d->score) return ckv_error(CKV_STATUS_ERR_ARG, "press %s: nothing to score (the cache is kept whole)", d->name);
    CKV_TRY(d->score(in, cfg, scores));
    ckv_press_protected(cfg, in->L, &info->protect_head, &info->protect_tail);
    return CKV_STATUS_OK;
}
