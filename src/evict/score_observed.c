/* score_observed.c - observed_attention (H2O-like, kvpress ObservedAttentionPress): for key j, the sum
 * over all L context queries of their causal attention weight on j, divided by L - j (the number of
 * queries that see j), averaged over the group's query heads. The attention is the model's own
 * (eager attention: q_proj + bias, RoPE, logits times 1/sqrt(head_dim), fp32 softmax), recomputed
 * from the attention input block by block over the queries through the backend's ops: each block's
 * queries (matmul, rope) feed evict_attn_colsum, which accumulates the column sums per KV head in
 * double, heads then queries in order; never [L, L]. It protects nothing and selects nothing. */
#include <math.h>

#include "core/status.h"
#include "evict/scorer.h"

/* Query block: 1,024 queries (the op forms no [B, L] matrix; fewer blocks repack the keys and
 * re-read q_proj fewer times). */
#define CKV_OBSERVED_BLOCK 1024
static int observed_block(int L) { return L < CKV_OBSERVED_BLOCK ? L : CKV_OBSERVED_BLOCK; }

ckv_status ckv_score_observed_attention(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    (void)cfg;
    CKV_TRY(ckv_score_check_inputs(in, "observed_attention"));
    if (!in->xn || !in->wq || !in->pos || !in->inv_freq)
        return ckv_error(CKV_STATUS_ERR_ARG, "scorer observed_attention: layer %d needs the attention input, q_proj, "
                         "positions and rope tables", in->layer);
    const int L = in->L, d = in->head_dim, D = in->D, hq = in->n_q_local * d, B = observed_block(L);
    ckv_backend *be = in->be;
    ckv_score_dev dev = ckv_score_dev_begin(in);
    float *q = NULL;      // [B, hq]
    double *colsum = NULL; // [n_kv_local, L]
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&q, (size_t)B * (size_t)hq * sizeof(float), "observed queries"),
                 done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&colsum, (size_t)in->n_kv_local * (size_t)L * sizeof(double),
                                        "observed column sums"), done);
    /* the model's eager attention multiplies by the scaling */
    const float scale = 1.0f / sqrtf((float)d);
    for (int t0 = 0; t0 < L; t0 += B) {
        const int nb = L - t0 < B ? L - t0 : B;
        be->ops->matmul(be, q, in->xn + (size_t)t0 * (size_t)D, in->wq, in->bq, nb);
        be->ops->rope(be, q, in->pos + t0, nb, in->n_q_local, d, in->inv_freq, in->rope_scale);
        const ckv_evict_attn_params a = ckv_score_attn_params(in, q, nb, t0, scale, CKV_EVICT_LOGITS_MUL);
        CKV_TRY_GOTO(s, be->ops->evict_attn_colsum(be, colsum, L, &a, CKV_EVICT_PER_KV_HEAD,
                                                   t0 == 0 ? CKV_EVICT_ZERO_FIRST : CKV_EVICT_ADD), done);
    }
    be->ops->evict_colsum_finish(be, scores, L, colsum, L, in->n_kv_local, L, (double)L, CKV_EVICT_DENOM_MINUS_COL);
    s = ckv_score_group_mean(in, scores);
done:
    ckv_score_dev_free(&dev);
    return s;
}
