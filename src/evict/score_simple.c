/* score_simple.c - the scorers that need no attention: knorm (minus the L2 norm of each post-RoPE key,
 * so the smallest norms are kept), streaming_llm (score = token index, so that with the n_sink sinks
 * protected by the caller a top-k keeps the sinks and the most recent tokens, which is the kept set
 * of kvpress's StreamingLLMPress) and random (uniform [0, 1) from a counter-based generator keyed on
 * the seed, the layer, the GLOBAL KV head and the token, so scores do not depend on tensor
 * parallelism; it does not reproduce torch's generator). Each is one backend op over the layer's
 * segments or scores (evict_row_norm, evict_fill, evict_random). No communication, no selection. */
#include "core/status.h"
#include "evict/scorer.h"

ckv_status ckv_score_knorm(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    (void)cfg;
    CKV_TRY(ckv_score_check_inputs(in, "knorm"));
    in->be->ops->evict_row_norm(in->be, scores, in->L, &in->kv, in->L, CKV_EVICT_KEYS, -1.0f);
    return CKV_STATUS_OK;
}

ckv_status ckv_score_streaming_llm(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    const int n_sink = cfg->n_sink;
    CKV_TRY(ckv_score_check_inputs(in, "streaming_llm"));
    if (n_sink < 0) return ckv_error(CKV_STATUS_ERR_ARG, "n_sink %d must be >= 0", n_sink);
    if (in->L <= n_sink)
        return ckv_error(CKV_STATUS_ERR_ARG, "n_sink %d needs a context longer than %d tokens, got %d", n_sink,
                         n_sink, in->L);
    /* (float)t is exact up to 2^24 tokens */
    in->be->ops->evict_fill(in->be, scores, in->n_kv_local, in->L, 0, in->L, CKV_EVICT_FILL_INDEX, 0.0f);
    return CKV_STATUS_OK;
}

ckv_status ckv_score_random(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    const uint64_t seed = cfg->seed;
    CKV_TRY(ckv_score_check_inputs(in, "random"));
    in->be->ops->evict_random(in->be, scores, in->n_kv_local, in->L, in->L, seed, in->layer, in->kv_head0);
    return CKV_STATUS_OK;
}
