/* score_window.c - the observation-window scorers: snapkv (and pyramidkv, whose scores are snapkv's),
 * finch (the question as the window, no pooling, optionally count-normalised rows) and tova, driven through the backend's eviction ops. Queries of the last w tokens are the
 * ones the prefill's forward computed when its hook hands them over (in->q_tail), else recomputed
 * from the attention input (q_proj + bias, RoPE at their positions, as the model does); their logits
 * against all L post-RoPE keys are divided by sqrt(head_dim) and softmaxed over all L keys in fp32
 * with causal masking inside the window; the last w columns are dropped and the rest averaged over
 * the w queries (evict_attn_colsum, evict_colsum_finish). snapkv then pools each query head's row
 * along the tokens (evict_pool: avg with the zero padding counted in the divisor; max ignoring it)
 * and averages over the group's query heads (evict_head_sum, then the group mean); tova (w = 1)
 * averages over all query heads of the layer. Device scratch per call. It does not set protected
 * scores (the window is reported by the caller) and does no selection. */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "evict/scorer.h"

static ckv_status window_need(const ckv_score_inputs *in, const char *who) {
    if (!in->xn || !in->wq || !in->pos || !in->inv_freq)
        return ckv_error(CKV_STATUS_ERR_ARG, "scorer %s: layer %d needs the attention input, q_proj, positions and "
                         "rope tables", who, in->layer);
    return CKV_STATUS_OK;
}

/* mean [n_q_local, L - w] (device) = per local query head, the mean over the w window queries of the
 * attention weights on keys 0 .. L-w-1. q [w, n_q_local * d] (the queries unless the forward's are
 * given: ckv_score_window_queries) and colsum [n_q_local, L - w] are scratch. */
static ckv_status window_means(const ckv_score_inputs *in, int w, float *q, double *colsum, float *mean) {
    ckv_backend *be = in->be;
    const int d = in->head_dim, L = in->L, n_out = L - w;
    /* kvpress divides the logits by math.sqrt(head_dim) (a division, not a multiply) */
    const ckv_evict_attn_params a = ckv_score_attn_params(in, ckv_score_window_queries(in, w, q), w, L - w,
                                                          (float)sqrt((double)d), CKV_EVICT_LOGITS_DIV);
    CKV_TRY(be->ops->evict_attn_colsum(be, colsum, n_out, &a, CKV_EVICT_PER_QUERY_HEAD, CKV_EVICT_ZERO_FIRST));
    be->ops->evict_colsum_finish(be, mean, n_out, colsum, n_out, in->n_q_local, n_out, (double)w,
                                 CKV_EVICT_DENOM_FIXED);
    return CKV_STATUS_OK;
}

ckv_status ckv_score_snapkv(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    const int window = cfg->window, kernel = cfg->kernel;
    const ckv_pool_kind pool = cfg->pool;
    CKV_TRY(ckv_score_check_inputs(in, "snapkv"));
    CKV_TRY(window_need(in, "snapkv"));
    if (window < 1) return ckv_error(CKV_STATUS_ERR_ARG, "window %d must be at least 1", window);
    if (in->L <= window)
        return ckv_error(CKV_STATUS_ERR_ARG, "window %d needs a context longer than %d tokens, got %d", window,
                         window, in->L);
    if (kernel < 1 || kernel % 2 == 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "kernel %d must be odd and at least 1 (1 = no pooling)", kernel);
    if (pool != CKV_POOL_AVG && pool != CKV_POOL_MAX)
        return ckv_error(CKV_STATUS_ERR_ARG, "pool %d: expected avg or max", (int)pool);
    const int L = in->L, n_out = L - window, nq = in->n_q_local, hq = nq * in->head_dim;
    ckv_backend *be = in->be;
    ckv_score_dev dev = ckv_score_dev_begin(in);
    float *q = NULL, *mean = NULL, *pooled = NULL; // [w, hq], [nq, L - w] each
    double *colsum = NULL;                         // [nq, L - w]
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&q, (size_t)window * hq * sizeof(float), "snapkv queries"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&colsum, (size_t)nq * n_out * sizeof(double), "snapkv column sums"),
                 done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&mean, (size_t)nq * n_out * sizeof(float), "snapkv head scores"),
                 done);
    CKV_TRY_GOTO(s, window_means(in, window, q, colsum, mean), done);
    const float *rows = mean;
    if (kernel > 1) {
        CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&pooled, (size_t)nq * n_out * sizeof(float),
                                            "snapkv pooled scores"), done);
        be->ops->evict_pool(be, pooled, mean, nq, n_out, n_out, kernel,
                          pool == CKV_POOL_MAX ? CKV_EVICT_POOL_MAX : CKV_EVICT_POOL_AVG);
        rows = pooled;
    }
    /* the window's own entries stay 0 (the caller protects them) */
    be->ops->evict_fill(be, scores, in->n_kv_local, L, 0, L, CKV_EVICT_FILL_VALUE, 0.0f);
    be->ops->evict_head_sum(be, scores, L, rows, n_out, nq, n_out, ckv_score_head0(in), in->n_heads / in->n_kv_heads);
    s = ckv_score_group_mean(in, scores);
done:
    ckv_score_dev_free(&dev);
    return s;
}

/* finch's normalised means: mean [n_q_local, L - w] = per local query head, the mean over the w question
 * rows of (attention weight x r) on keys 0 .. L-w-1, r = L - w + i the context row of question row i
 * (kvpress: torch.arange(k_len - window, k_len), a count of the rows before it), the product and the
 * sum over the rows in fp32 (row i ascending), then divided by w. One attention op per question row.
 * colsum [n_q_local, L - w], p and weight [n_q_local, L - w] are scratch. */
static ckv_status finch_means(const ckv_score_inputs *in, int w, const float *q, double *colsum, float *p,
                              float *weight, float *mean) {
    ckv_backend *be = in->be;
    const int d = in->head_dim, L = in->L, n_out = L - w, nq = in->n_q_local;
    be->ops->evict_fill(be, mean, nq, n_out, 0, n_out, CKV_EVICT_FILL_VALUE, 0.0f);
    for (int i = 0; i < w; i++) {
        const int r = L - w + i;
        const ckv_evict_attn_params a = ckv_score_attn_params(in, q + (size_t)i * (size_t)nq * (size_t)d, 1, r,
                                                              (float)sqrt((double)d), CKV_EVICT_LOGITS_DIV);
        CKV_TRY(be->ops->evict_attn_colsum(be, colsum, n_out, &a, CKV_EVICT_PER_QUERY_HEAD, CKV_EVICT_ZERO_FIRST));
        be->ops->evict_colsum_finish(be, p, n_out, colsum, n_out, nq, n_out, 1.0, CKV_EVICT_DENOM_FIXED); /* p, exact */
        be->ops->evict_fill(be, weight, nq, n_out, 0, n_out, CKV_EVICT_FILL_VALUE, (float)r);
        be->ops->evict_add_mul(be, p, p, weight, nq, n_out, n_out, 0.0f);
        be->ops->evict_head_sum(be, mean, n_out, p, n_out, nq, n_out, 0, 1); /* += row by row */
    }
    be->ops->evict_div(be, mean, (size_t)nq * (size_t)n_out, (float)w);
    return CKV_STATUS_OK;
}

ckv_status ckv_score_finch(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "finch"));
    CKV_TRY(window_need(in, "finch"));
    CKV_TRY(ckv_press_check_context(cfg, in->L)); /* a question, and a context before it */
    const int w = cfg->question_rows;
    const int L = in->L, n_out = L - w, nq = in->n_q_local, hq = nq * in->head_dim;
    ckv_backend *be = in->be;
    ckv_score_dev dev = ckv_score_dev_begin(in);
    float *q = NULL, *mean = NULL, *p = NULL, *weight = NULL; // [w, hq], [nq, L - w] each
    double *colsum = NULL;                                    // [nq, L - w]
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&q, (size_t)w * hq * sizeof(float), "finch queries"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&colsum, (size_t)nq * n_out * sizeof(double), "finch column sums"),
                 done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&mean, (size_t)nq * n_out * sizeof(float), "finch head scores"),
                 done);
    if (cfg->normalize_scores) {
        CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&p, (size_t)nq * n_out * sizeof(float), "finch weights"), done);
        CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&weight, (size_t)nq * n_out * sizeof(float), "finch counts"),
                     done);
        CKV_TRY_GOTO(s, finch_means(in, w, ckv_score_window_queries(in, w, q), colsum, p, weight, mean), done);
    } else {
        CKV_TRY_GOTO(s, window_means(in, w, q, colsum, mean), done);
    }
    /* the question's own entries stay 0 (the caller protects them) */
    be->ops->evict_fill(be, scores, in->n_kv_local, L, 0, L, CKV_EVICT_FILL_VALUE, 0.0f);
    be->ops->evict_head_sum(be, scores, L, mean, n_out, nq, n_out, ckv_score_head0(in), in->n_heads / in->n_kv_heads);
    s = ckv_score_group_mean(in, scores);
done:
    ckv_score_dev_free(&dev);
    return s;
}

ckv_status ckv_score_tova(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    (void)cfg;
    CKV_TRY(ckv_score_check_inputs(in, "tova"));
    CKV_TRY(window_need(in, "tova"));
    if (in->L < 2)
        return ckv_error(CKV_STATUS_ERR_ARG, "scorer tova needs a context longer than 1 token, got %d", in->L);
    const int L = in->L, n_out = L - 1, nq = in->n_q_local, hq = nq * in->head_dim;
    ckv_backend *be = in->be;
    ckv_score_dev dev = ckv_score_dev_begin(in);
    float *q = NULL, *mean = NULL, *acc = NULL; // [1, hq], [nq, L - 1], [L]
    double *colsum = NULL;                      // [nq, L - 1]
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&q, (size_t)hq * sizeof(float), "tova query"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&colsum, (size_t)nq * n_out * sizeof(double), "tova column sums"),
                 done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&mean, (size_t)nq * n_out * sizeof(float), "tova head scores"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&acc, (size_t)L * sizeof(float), "tova scores"), done);
    CKV_TRY_GOTO(s, window_means(in, 1, q, colsum, mean), done);
    be->ops->evict_fill(be, acc, 1, L, 0, L, CKV_EVICT_FILL_VALUE, 0.0f);
    be->ops->evict_head_sum(be, acc, L, mean, n_out, nq, n_out, 0, nq); /* every local head into one row */
    /* mean over ALL query heads of the layer: every rank holds distinct query heads */
    CKV_TRY_GOTO(s, ckv_evict_allreduce(be, in->tp, acc, (size_t)L, CKV_COMM_OP_SUM, 1), done);
    be->ops->evict_div(be, acc, (size_t)L, (float)in->n_heads);
    be->ops->evict_fill(be, acc, 1, L, L - 1, L, CKV_EVICT_FILL_VALUE, 0.0f); /* the last token: protected by the caller */
    for (int g = 0; g < in->n_kv_local && s == CKV_STATUS_OK; g++)
        s = be->ops->copy(be, scores + (size_t)g * (size_t)L, acc, (size_t)L * sizeof(float));
done:
    ckv_score_dev_free(&dev);
    return s;
}
