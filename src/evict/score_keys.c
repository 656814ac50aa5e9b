/* score_keys.c - the attention-free key scorers: keydiff (kvpress KeyDiffPress: minus the cosine
 * similarity of each post-RoPE key to its head's mean normalised key, so the most distinctive keys
 * are kept) and lagkv (kvpress LagKVPress: each partition of lag_size tokens after the sinks is
 * scored against the next one's per-channel range of keys and values), and cur (kvpress CURPress:
 * squared key and value norms, normalised per local window, combined and normalised over the
 * context; its random-projection variant is not offered). One backend op each over the layer's
 * segments (evict_keydiff, evict_lagkv, evict_cur); per KV head, so they need no communication
 * (replicas of a head compute the same scores). keydiff protects nothing; lagkv gives its sinks and
 * the tail after its last scored partition kvpress's score 1 (above every other score), so nothing
 * is protected by rule either; cur gives its sinks kvpress's score 1 the same way. They select nothing. */
#include "core/status.h"
#include "evict/scorer.h"

ckv_status ckv_score_keydiff(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    (void)cfg;
    CKV_TRY(ckv_score_check_inputs(in, "keydiff"));
    if (!ckv_backend_supports(in->be, CKV_BACKEND_CAP_KEYDIFF))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "press keydiff: the %s backend has no keydiff op", in->be->name);
    return in->be->ops->evict_keydiff(in->be, scores, in->L, &in->kv, in->L);
}

ckv_status ckv_score_lagkv(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "lagkv"));
    if (!ckv_backend_supports(in->be, CKV_BACKEND_CAP_LAGKV))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "press lagkv: the %s backend has no lagkv op", in->be->name);
    if (in->L <= cfg->n_sink)
        return ckv_error(CKV_STATUS_ERR_ARG, "n_sink %d needs a context longer than %d tokens, got %d", cfg->n_sink,
                         cfg->n_sink, in->L);
    return in->be->ops->evict_lagkv(in->be, scores, in->L, &in->kv, in->L, cfg->n_sink, cfg->lag_size,
                                    cfg->cross_scoring ? CKV_EVICT_LAGKV_CROSS : CKV_EVICT_LAGKV_RANK);
}

/* the press option's values and the op's kinds are in the same order */
_Static_assert((int)CKV_CUR_KEY == (int)CKV_EVICT_CUR_KEYS && (int)CKV_CUR_VALUE == (int)CKV_EVICT_CUR_VALUES &&
                   (int)CKV_CUR_KV_AVG == (int)CKV_EVICT_CUR_MEAN && (int)CKV_CUR_KV_PRODUCT == (int)CKV_EVICT_CUR_PRODUCT,
               "cur kinds of the press and of the op differ");

ckv_status ckv_score_cur(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "cur"));
    if (!ckv_backend_supports(in->be, CKV_BACKEND_CAP_CUR))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "press cur: the %s backend has no cur op", in->be->name);
    return in->be->ops->evict_cur(in->be, scores, in->L, &in->kv, in->L, cfg->n_sink, (ckv_evict_cur_kind)cfg->leverage_type,
                                  cfg->use_local_approximation ? cfg->local_window_size : 0);
}
