/* score_window.c - the observation-window scorers: snapkv (and pyramidkv, whose scores are snapkv's)
 * and tova. Queries of the last w tokens are recomputed from the attention input (q_proj + bias,
 * RoPE at their positions through the backend, as the model does), their logits against all L
 * post-RoPE keys are divided by sqrt(head_dim) and softmaxed over all L keys in fp32 with causal
 * masking inside the window; the last w columns are dropped and the rest averaged over the w
 * queries. snapkv then pools each query head's row along the tokens (avg: zero padding counted in
 * the divisor; max: padding ignored) and averages over the group's query heads; tova (w = 1) averages
 * over all query heads of the layer. Scratch is per query head ([w, L] logits), allocated and freed
 * per call. It does not set protected scores (the window is reported by the caller) and does no
 * selection. Host buffers only. */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "evict/scorer.h"

/* Scratch for the window attention of one query head at a time. */
typedef struct {
    float *q;       // [w, n_q_local * d] roped window queries of all local heads
    float *qh;      // [w, d] one head's queries, contiguous
    float *logits;  // [w, L] one head's logits, then weights
    double *colsum; // [L - w] column sums of the weights
} ckv_window_ws;

static void window_ws_free(ckv_window_ws *ws) {
    ckv_free(ws->q);
    ckv_free(ws->qh);
    ckv_free(ws->logits);
    ckv_free(ws->colsum);
    memset(ws, 0, sizeof *ws);
}

static ckv_status window_need(const ckv_score_inputs *in, const char *who) {
    if (!in->xn || !in->wq || !in->pos || !in->inv_freq)
        return ckv_error(CKV_STATUS_ERR_ARG, "scorer %s: layer %d needs the attention input, q_proj, positions and "
                         "rope tables", who, in->layer);
    return CKV_STATUS_OK;
}

/* Allocates the scratch and computes the roped queries of the last w context tokens. */
static ckv_status window_ws_init(ckv_window_ws *ws, const ckv_score_inputs *in, int w) {
    memset(ws, 0, sizeof *ws);
    const int d = in->head_dim, L = in->L, hd = in->n_q_local * d;
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->q, (size_t)w * (size_t)hd * sizeof(float), "window queries"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->qh, (size_t)w * (size_t)d * sizeof(float), "window head queries"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->logits, (size_t)w * (size_t)L * sizeof(float), "window logits"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->colsum, (size_t)(L - w) * sizeof(double), "window column sums"), fail);
    ckv_backend *be = in->be;
    /* q = xn[L-w:] @ wq^T + bq, then RoPE at the window's positions */
    be->ops->matmul(be, ws->q, in->xn + (size_t)(L - w) * (size_t)in->D, in->wq, in->bq, w);
    be->ops->rope(be, ws->q, in->pos + (L - w), w, in->n_q_local, d, in->inv_freq, in->rope_scale);
    return CKV_STATUS_OK;
fail:
    window_ws_free(ws);
    return s;
}

/* out [L - w] = mean over the w window queries of local query head j's attention weights on keys
 * 0 .. L-w-1 (softmax over all L keys, causal inside the window). */
static void window_head_mean(const ckv_score_inputs *in, ckv_window_ws *ws, int w, int j, float *out) {
    const int d = in->head_dim, L = in->L, hd = in->n_q_local * d, n_out = L - w;
    const int g = ckv_score_local_kv(in, j);
    const float *K = in->cache.k + (size_t)in->cache.off[g] * (size_t)d; // [L, d]
    for (int i = 0; i < w; i++) memcpy(ws->qh + (size_t)i * d, ws->q + (size_t)i * hd + (size_t)j * d, (size_t)d * sizeof(float));
    ckv_backend_matmul_f32(in->be, ws->logits, ws->qh, K, NULL, w, d, L);
    /* kvpress divides the logits by math.sqrt(head_dim) (a division, not a multiply) */
    const float sqrt_d = (float)sqrt((double)d);
    for (int t = 0; t < n_out; t++) ws->colsum[t] = 0.0;
    for (int i = 0; i < w; i++) {
        float *row = ws->logits + (size_t)i * (size_t)L; // [L]
        const int n_vis = L - w + i + 1;                 /* query L-w+i sees keys 0 .. L-w+i */
        for (int t = 0; t < n_vis; t++) row[t] = row[t] / sqrt_d;
        const float inv = ckv_score_exp_row(row, n_vis);
        double *restrict cs = ws->colsum;
        for (int t = 0; t < n_out; t++) cs[t] += (double)(row[t] * inv);
    }
    for (int t = 0; t < n_out; t++) out[t] = (float)(ws->colsum[t] / (double)w);
}

/* 1-D pooling along tokens, stride 1, padding k/2 on both sides. avg counts the zero padding in
 * the divisor (torch avg_pool1d's default count_include_pad); max ignores it (pads with -inf). */
static void window_pool(const float *x, float *y, int n, int k, ckv_pool_kind pool) {
    const int r = k / 2;
    for (int t = 0; t < n; t++) {
        int lo = t - r < 0 ? 0 : t - r, hi = t + r >= n ? n - 1 : t + r;
        if (pool == CKV_POOL_MAX) {
            float m = x[lo];
            for (int u = lo + 1; u <= hi; u++) m = x[u] > m ? x[u] : m;
            y[t] = m;
        } else {
            float s = 0.0f;
            for (int u = lo; u <= hi; u++) s += x[u];
            y[t] = s / (float)k;
        }
    }
}

ckv_status ckv_score_snapkv(const ckv_score_inputs *in, int window, int kernel, ckv_pool_kind pool, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "snapkv"));
    CKV_TRY(window_need(in, "snapkv"));
    if (window < 1) return ckv_error(CKV_STATUS_ERR_ARG, "--window %d must be at least 1", window);
    if (in->L <= window)
        return ckv_error(CKV_STATUS_ERR_ARG, "--window %d needs a context longer than %d tokens, got %d", window,
                         window, in->L);
    if (kernel < 1 || kernel % 2 == 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "--kernel %d must be odd and at least 1 (1 = no pooling)", kernel);
    if (pool != CKV_POOL_AVG && pool != CKV_POOL_MAX)
        return ckv_error(CKV_STATUS_ERR_ARG, "--pool %d: expected avg or max", (int)pool);
    const int L = in->L, n_out = L - window;
    memset(scores, 0, (size_t)in->n_kv_local * (size_t)L * sizeof(float));

    ckv_window_ws ws;
    float *mean = NULL, *pooled = NULL; // [L - w] each
    ckv_status s;
    CKV_TRY(window_ws_init(&ws, in, window));
    CKV_TRY_GOTO(s, ckv_alloc((void **)&mean, (size_t)n_out * sizeof(float), "snapkv head scores"), done);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&pooled, (size_t)n_out * sizeof(float), "snapkv pooled scores"), done);
    for (int j = 0; j < in->n_q_local; j++) {
        window_head_mean(in, &ws, window, j, mean);
        const float *row = mean;
        if (kernel > 1) {
            window_pool(mean, pooled, n_out, kernel, pool);
            row = pooled;
        }
        float *dst = scores + (size_t)ckv_score_local_kv(in, j) * (size_t)L; // [L]
        for (int t = 0; t < n_out; t++) dst[t] += row[t];
    }
    /* the window's own entries stay 0 (the caller protects them) */
    s = ckv_score_group_mean(in, scores);
done:
    ckv_free(mean);
    ckv_free(pooled);
    window_ws_free(&ws);
    return s;
}

ckv_status ckv_score_tova(const ckv_score_inputs *in, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "tova"));
    CKV_TRY(window_need(in, "tova"));
    if (in->L < 2)
        return ckv_error(CKV_STATUS_ERR_ARG, "scorer tova needs a context longer than 1 token, got %d", in->L);
    const int L = in->L, n_out = L - 1;
    ckv_window_ws ws;
    float *mean = NULL, *acc = NULL; // [L - 1], [L]
    ckv_status s;
    CKV_TRY(window_ws_init(&ws, in, 1));
    CKV_TRY_GOTO(s, ckv_alloc((void **)&mean, (size_t)n_out * sizeof(float), "tova head scores"), done);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&acc, (size_t)L * sizeof(float), "tova scores"), done);
    for (int j = 0; j < in->n_q_local; j++) {
        window_head_mean(in, &ws, 1, j, mean);
        for (int t = 0; t < n_out; t++) acc[t] += mean[t];
    }
    /* mean over ALL query heads of the layer: every rank holds distinct query heads */
    if (in->tp && in->tp->size > 1)
        CKV_TRY_GOTO(s, in->tp->ops->allreduce_f32(in->tp, acc, (size_t)L, CKV_COMM_OP_SUM), done);
    for (int t = 0; t < L; t++) acc[t] /= (float)in->n_heads;
    acc[L - 1] = 0.0f; /* the last token: protected by the caller */
    for (int g = 0; g < in->n_kv_local; g++) memcpy(scores + (size_t)g * (size_t)L, acc, (size_t)L * sizeof(float));
    s = CKV_STATUS_OK;
done:
    ckv_free(mean);
    ckv_free(acc);
    window_ws_free(&ws);
    return s;
}
