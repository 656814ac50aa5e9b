/* score_observed.c - observed_attention (H2O-like, kvpress ObservedAttentionPress): for key j, the sum
 * over all L context queries of their causal attention weight on j, divided by L - j (the number of
 * queries that see j), averaged over the group's query heads. The attention is the model's own
 * (eager attention: q_proj + bias, RoPE, logits times 1/sqrt(head_dim), fp32 softmax), recomputed
 * from the attention input block by block over the queries: the largest buffer is one query block of
 * one head against the keys it sees ([B, L], B shrinking as L grows), never [L, L]. Column sums are
 * accumulated in double. It protects nothing and selects nothing. Host buffers only. */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "evict/scorer.h"

/* Query block: about 8M logits per block at most, between 16 and 256 queries. */
static int observed_block(int L) {
    long b = (8L << 20) / (long)L;
    b = b < 16 ? 16 : b > 256 ? 256 : b;
    return b > L ? L : (int)b;
}

ckv_status ckv_score_observed_attention(const ckv_score_inputs *in, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "observed_attention"));
    if (!in->xn || !in->wq || !in->pos || !in->inv_freq)
        return ckv_error(CKV_STATUS_ERR_ARG, "scorer observed_attention: layer %d needs the attention input, q_proj, "
                         "positions and rope tables", in->layer);
    const int L = in->L, d = in->head_dim, D = in->D, hq = in->n_q_local * d, B = observed_block(L);
    ckv_backend *be = in->be;
    float *q = NULL, *qh = NULL, *logits = NULL; // [B, hq], [B, d], [B, L]
    double *colsum = NULL;                       // [n_kv_local, L]
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_alloc((void **)&q, (size_t)B * (size_t)hq * sizeof(float), "observed queries"), done);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&qh, (size_t)B * (size_t)d * sizeof(float), "observed head queries"), done);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&logits, (size_t)B * (size_t)L * sizeof(float), "observed logits"), done);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&colsum, (size_t)in->n_kv_local * (size_t)L * sizeof(double),
                              "observed column sums"), done);
    /* the model's eager attention multiplies by the scaling */
    const float scale = 1.0f / sqrtf((float)d);
    for (int t0 = 0; t0 < L; t0 += B) {
        const int nb = L - t0 < B ? L - t0 : B, nk = t0 + nb; /* the block's last query sees keys 0 .. nk-1 */
        be->ops->matmul(be, q, in->xn + (size_t)t0 * (size_t)D, in->wq, in->bq, nb);
        be->ops->rope(be, q, in->pos + t0, nb, in->n_q_local, d, in->inv_freq, in->rope_scale);
        for (int j = 0; j < in->n_q_local; j++) {
            const int g = ckv_score_local_kv(in, j);
            const float *K = in->cache.k + (size_t)in->cache.off[g] * (size_t)d; // [L, d]
            for (int i = 0; i < nb; i++)
                memcpy(qh + (size_t)i * d, q + (size_t)i * hq + (size_t)j * d, (size_t)d * sizeof(float));
            ckv_backend_matmul_f32(be, logits, qh, K, NULL, nb, d, nk); /* [nb, nk] */
            double *restrict cs = colsum + (size_t)g * (size_t)L;
            for (int i = 0; i < nb; i++) {
                float *row = logits + (size_t)i * (size_t)nk;
                const int n_vis = t0 + i + 1;
                for (int t = 0; t < n_vis; t++) row[t] *= scale;
                const float inv = ckv_score_exp_row(row, n_vis);
                for (int t = 0; t < n_vis; t++) cs[t] += (double)(row[t] * inv);
            }
        }
    }
    for (int g = 0; g < in->n_kv_local; g++)
        for (int t = 0; t < L; t++)
            scores[(size_t)g * L + t] = (float)(colsum[(size_t)g * L + t] / (double)(L - t));
    s = ckv_score_group_mean(in, scores);
done:
    ckv_free(q);
    ckv_free(qh);
    ckv_free(logits);
    ckv_free(colsum);
    return s;
}
