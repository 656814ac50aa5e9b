/* score_keys.c - the attention-free key scorers: keydiff (kvpress KeyDiffPress: minus the cosine
 * similarity of each post-RoPE key to its head's mean normalised key, so the most distinctive keys
 * are kept). One backend op over the layer's segments (evict_keydiff); per KV head, so it needs no
 * communication (replicas of a head compute the same scores). It protects nothing and selects
 * nothing. */
#include "core/status.h"
#include "evict/scorer.h"

ckv_status ckv_score_keydiff(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    (void)cfg;
    CKV_TRY(ckv_score_check_inputs(in, "keydiff"));
    if (!in->be->ops->evict_keydiff)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "press keydiff: the %s backend has no keydiff op", in->be->name);
    return in->be->ops->evict_keydiff(in->be, scores, in->L, &in->kv, in->L);
}
