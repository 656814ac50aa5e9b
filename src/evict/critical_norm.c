/* critical_norm.c - CriticalKV's value norm N[g, t] = mean over the query heads h of KV head g of
 * || V[g, t] W_O^h ||_1, W_O^h the d x D block of o_proj that head h's output passes through
 * (kvpress CriticalKVPress.vwl1norm), through the backend's evict_value_norm op (blocked GEMMs; the
 * [L, D] product never exists). Sums over a rank's query heads are all-reduced over the replica
 * group when tp > Hkv, then divided by the full group size. It selects nothing. */
#include "core/status.h"
#include "evict/scorer.h"

ckv_status ckv_critical_value_norm(const ckv_score_inputs *in, float *out) {
    CKV_TRY(ckv_score_check_inputs(in, "critical value norm"));
    if (!in->wo || !out)
        return ckv_error(CKV_STATUS_ERR_ARG, "critical value norm: layer %d needs o_proj and an output buffer",
                         in->layer);
    if (in->wo->rows != in->D || in->wo->cols != (int64_t)in->n_q_local * in->head_dim)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "critical value norm: o_proj is %lld x %lld, expected %d x %d",
                         (long long)in->wo->rows, (long long)in->wo->cols, in->D, in->n_q_local * in->head_dim);
    ckv_backend *be = in->be;
    be->ops->evict_fill(be, out, in->n_kv_local, in->L, 0, in->L, CKV_EVICT_FILL_VALUE, 0.0f);
    CKV_TRY(be->ops->evict_value_norm(be, out, in->L, &in->kv, in->L, in->wo, in->n_q_local, ckv_score_head0(in),
                                      in->n_heads / in->n_kv_heads));
    return ckv_score_group_mean(in, out);
}
