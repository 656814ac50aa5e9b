/* scorer.c - ckv_score_layer: dispatches on cfg->scorer to the scorer families (score_window.c,
 * score_simple.c, score_observed.c, score_expected.c) and reports which tokens each scorer protects;
 * also the helpers they share (input checks, the local query head -> local KV head map, the group
 * mean with its replica all-reduce). It computes no scores itself, does not set protected scores
 * (the caller does, after the cross-head reduction) and selects nothing. */
#include "evict/scorer.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/fastmath.h"
#include "core/status.h"
#include "evict/score_defensive.h"

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
    if (!in->be || in->be->device != CKV_DEVICE_HOST)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "scorer %s: needs a backend with host memory (got %s)", who,
                         in->be ? in->be->name : "none");
    const ckv_attn_cache *c = &in->cache;
    if (!c->k || !c->v || !c->off)
        return ckv_error(CKV_STATUS_ERR_ARG, "scorer %s: layer %d cache has no keys/values/offsets", who, in->layer);
    if (c->head_dim != in->head_dim || c->n_kv_heads < in->n_kv_local)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "scorer %s: cache head_dim %d / %d heads, expected %d / %d", who,
                         c->head_dim, c->n_kv_heads, in->head_dim, in->n_kv_local);
    if (c->len)
        for (int g = 0; g < in->n_kv_local; g++)
            if (c->len[g] < in->L)
                return ckv_error(CKV_STATUS_ERR_SHAPE, "scorer %s: cache head %d holds %d rows, fewer than L %d", who,
                                 g, c->len[g], in->L);
    return CKV_STATUS_OK;
}

int ckv_score_local_kv(const ckv_score_inputs *in, int j) {
    int group = in->n_heads / in->n_kv_heads;
    int g = (in->q_head0 + j) / group - in->kv_head0;
    return g >= 0 && g < in->n_kv_local ? g : -1;
}

ckv_status ckv_score_group_mean(const ckv_score_inputs *in, float *scores) {
    size_t n = (size_t)in->n_kv_local * (size_t)in->L;
    if (in->replica && in->replica->size > 1) {
        ckv_status s = in->replica->ops->allreduce_f32(in->replica, scores, n, CKV_COMM_OP_SUM);
        if (s != CKV_STATUS_OK) return s;
    }
    const float group = (float)(in->n_heads / in->n_kv_heads);
    for (size_t i = 0; i < n; i++) scores[i] /= group;
    return CKV_STATUS_OK;
}

float ckv_score_exp_row(float *x, int n) {
    /* independent lanes so that the reductions vectorise without reassociation */
    float ml[16];
    for (int l = 0; l < 16; l++) ml[l] = x[0];
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) ml[l] = x[i + l] > ml[l] ? x[i + l] : ml[l];
    float m = ml[0];
    for (int l = 1; l < 16; l++) m = ml[l] > m ? ml[l] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (i = 0; i < n; i++) x[i] = ckv_fast_expf(x[i] - m);
    double sl[8] = {0};
    for (i = 0; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) sl[l] += x[i + l];
    double sum = ((sl[0] + sl[4]) + (sl[1] + sl[5])) + ((sl[2] + sl[6]) + (sl[3] + sl[7]));
    for (; i < n; i++) sum += x[i];
    return (float)(1.0 / sum);
}

double ckv_score_l1(const float *x, int n) {
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lane[l] += fabsf(x[i + l]);
    double s = 0.0;
    for (int l = 0; l < 16; l++) s += lane[l];
    for (; i < n; i++) s += fabsf(x[i]);
    return s;
}

ckv_status ckv_score_layer(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores,
                           ckv_score_info *info) {
    if (!cfg || !scores || !info) return ckv_error(CKV_STATUS_ERR_ARG, "ckv_score_layer: missing config/scores/info");
    info->protect_head = 0;
    info->protect_tail = 0;
    switch (cfg->scorer) {
    case CKV_SCORER_SNAPKV:
    case CKV_SCORER_PYRAMIDKV:
        CKV_TRY(ckv_score_snapkv(in, cfg->window, cfg->kernel, cfg->pool, scores));
        info->protect_tail = cfg->window;
        return CKV_STATUS_OK;
    case CKV_SCORER_TOVA:
        CKV_TRY(ckv_score_tova(in, scores));
        info->protect_tail = 1;
        return CKV_STATUS_OK;
    case CKV_SCORER_KNORM: return ckv_score_knorm(in, scores);
    case CKV_SCORER_STREAMING_LLM:
        CKV_TRY(ckv_score_streaming_llm(in, cfg->n_sink, scores));
        info->protect_head = cfg->n_sink;
        return CKV_STATUS_OK;
    case CKV_SCORER_OBSERVED_ATTENTION: return ckv_score_observed_attention(in, scores);
    case CKV_SCORER_EXPECTED_ATTENTION:
        CKV_TRY(ckv_score_expected_attention(in, cfg, scores));
        info->protect_head = cfg->n_sink;
        return CKV_STATUS_OK;
    case CKV_SCORER_RANDOM: return ckv_score_random(in, cfg->seed, scores);
    case CKV_SCORER_NONE:
        return ckv_error(CKV_STATUS_ERR_ARG, "press none: nothing to score (the cache is kept whole)");
    case CKV_SCORER_DEFENSIVEKV: return ckv_score_defensivekv(in, cfg, scores, info);
    default: break;
    }
    return ckv_error(CKV_STATUS_ERR_ARG, "ckv_score_layer: unknown scorer kind %d", (int)cfg->scorer);
}
