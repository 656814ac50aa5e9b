/* score_defensive.c - DefensiveKV's scorer (FFY0/DefensiveKV EfficientDefensiveKVPress.score), a port
 * of the official semantics, quirks included. Per layer, with n = L - w context tokens before the
 * window:
 *   1. window attention: queries of the last w tokens (the prefill's, or recomputed from the attention
 *      input: q_proj + bias, RoPE at their positions; ckv_score_window_queries), logits / sqrt(head_dim) against all L post-RoPE keys, causal
 *      inside the window, softmax over all L keys in fp32; only the n non-window columns are used;
 *   2. ave[g, t] = mean over the group's query heads and the w queries (snapkv's unpooled score);
 *   3. per (query head, window query) row: avg-pooled (kernel k, padding k / 2, zero padding counted)
 *      and rescaled so that the row keeps its attention mass: P * sum(row) / sum(P);
 *   4. defensive aggregation: max over the group's query heads and the w queries, floored at its own
 *      mean over the n tokens of the head;
 *   5. times N[g, t] / sum over ALL KV heads g' of the layer of N[g', t], N = CriticalKV's value norm
 *      (mean over the group of ||V W_O^h||_1; ckv_critical_value_norm) - normalised across heads;
 *   6. first stage: per KV head the tokens ranked by ave / sum(ave) (ties: lower position first); the
 *      first c are lifted to M, the layer-wide max of step 5's scores, where c = the rank at which
 *      the running share first reaches 0.9 - window_bias (0 if never), capped at
 *      m = (int)((L - w) * (1 - cr) - w); a negative cap forces all but the last |m| tokens.
 * Quirks kept from the official code (docs/presses.md lists them): window_bias is the attention on the
 * w tokens just BEFORE the window (the official code measures the last w columns after dropping the
 * window columns; all n columns when n < w); the cap uses L - w where L was meant; c excludes the
 * token that crosses the threshold; a negative cap slices from the end (Python's sorted[:m]); forced
 * tokens get exactly M (they tie with the best unforced token). Not kept: the official window gets M
 * too (tied with the forced tokens); here it is reported as protected and the caller gives it M + 1,
 * so it is never cut before a forced token. The official value norm runs in a Triton kernel (TF32
 * dot products on GPUs); here it is plain fp32.
 * Layer-DefensiveKV (press layer_defensivekv, EfficientLayerDefensiveKVPress) scores the same way; only
 * its window differs: the official window holds its layer's max M, and so competes at M in the one
 * top-k over every layer; here it holds nextafterf(M, +inf) (one ulp above its layer's forced tokens,
 * never cut before them) and nothing is reported protected.
 * It does not select (select.c ranks all heads of the layer at once: CKV_ALLOC_GLOBAL; select_model.c
 * every layer at once: CKV_ALLOC_MODEL) and, for defensivekv, does not set the window's score. What runs where: steps 1-4 and the value norms are backend ops on device
 * buffers (matmul, rope, evict_attn_probs for the [n_q_local, w, L] weights, evict_defensive_rows for
 * the mean, the window bias and the pooled mass-preserving max, ckv_critical_value_norm); the
 * per-head bookkeeping - the floor at the mean, the normalisation across heads, M and step 6's
 * ranking by running share - runs on the host over downloaded [n_kv_local, L - w] rows, and the
 * scores are written back once. Scratch is allocated per call and freed. */
#include "evict/score_defensive.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"

#define CKV_DEFENSIVE_THRESHOLD 0.9 /* DefensiveKV's stage-1 attention share (before the window bias) */

typedef struct {
    float s;
    int32_t t;
} ckv_def_rank;

/* descending share, then ascending position */
static int def_rank_cmp(const void *a, const void *b) {
    const ckv_def_rank *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return (x->t > y->t) - (x->t < y->t);
}

typedef struct {
    double *ave;        // [n_kv_local, n] sums of the weights over local heads and window queries
    float *avef;        // [n_kv_local, n] the same in fp32 (reduced over the replica group), then the mean
    float *dmax;        // [n_kv_local, n] max over local heads and window queries of the rescaled rows
    float *norm;        // [n_kv_local, L] CriticalKV value norms
    float *nsum;        // [n] value norms summed over all KV heads of the layer
    ckv_def_rank *rank; // [n] one head's first-stage ranking
} ckv_def_ws;

static void def_ws_free(ckv_def_ws *ws) {
    ckv_free(ws->ave);
    ckv_free(ws->avef);
    ckv_free(ws->dmax);
    ckv_free(ws->norm);
    ckv_free(ws->nsum);
    ckv_free(ws->rank);
    memset(ws, 0, sizeof *ws);
}

static ckv_status def_ws_init(ckv_def_ws *ws, const ckv_score_inputs *in, int w) {
    memset(ws, 0, sizeof *ws);
    const size_t L = (size_t)in->L, n = L - (size_t)w, nkv = (size_t)in->n_kv_local;
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->ave, nkv * n * sizeof(double), "defensivekv mean attention"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->avef, nkv * n * sizeof(float), "defensivekv mean attention"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->dmax, nkv * n * sizeof(float), "defensivekv max attention"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->norm, nkv * L * sizeof(float), "defensivekv value norms"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->nsum, n * sizeof(float), "defensivekv value norm sums"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->rank, n * sizeof(ckv_def_rank), "defensivekv first stage"), fail);
    return CKV_STATUS_OK;
fail:
    def_ws_free(ws);
    return s;
}

static ckv_status def_check(const ckv_score_inputs *in, const ckv_press_config *cfg, double *keep_frac) {
    const char *name = ckv_scorer_name(cfg->scorer);
    CKV_TRY(ckv_score_check_inputs(in, name));
    if (!in->xn || !in->wq || !in->wo || !in->pos || !in->inv_freq)
        return ckv_error(CKV_STATUS_ERR_ARG, "scorer %s: layer %d needs the attention input, q_proj, o_proj, "
                         "positions and rope tables", name, in->layer);
    const int w = cfg->window, k = cfg->kernel;
    if (w < 1) return ckv_error(CKV_STATUS_ERR_ARG, "window %d must be at least 1", w);
    if (in->L <= w)
        return ckv_error(CKV_STATUS_ERR_ARG, "window %d needs a context longer than %d tokens, got %d", w, w, in->L);
    if (k < 1 || k % 2 == 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "kernel %d must be odd and at least 1 (1 = no pooling)", k);
    if (cfg->pool != CKV_POOL_AVG)
        return ckv_error(CKV_STATUS_ERR_ARG, "press %s pools with avg only (DefensiveKV has no max pooling); "
                         "pool max is not supported", name);
    if (cfg->budget_tokens > 0) {
        *keep_frac = (double)(cfg->budget_tokens < in->L ? cfg->budget_tokens : in->L) / (double)in->L;
    } else {
        if (!(cfg->compression_ratio >= 0.0 && cfg->compression_ratio < 1.0))
            return ckv_error(CKV_STATUS_ERR_ARG, "press %s: compression ratio %g outside [0, 1)", name,
                             cfg->compression_ratio);
        *keep_frac = 1.0 - cfg->compression_ratio;
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_score_defensivekv(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores,
                                 ckv_score_info *info) {
    if (!in || !cfg || !scores || !info)
        return ckv_error(CKV_STATUS_ERR_ARG, "ckv_score_defensivekv: missing inputs/config/scores/info");
    info->protect_head = 0;
    info->protect_tail = 0;
    double keep_frac = 0.0;
    CKV_TRY(def_check(in, cfg, &keep_frac));
    const int w = cfg->window, L = in->L, n = L - w, nkv = in->n_kv_local;
    const int G = in->n_heads / in->n_kv_heads;
    ckv_backend *be = in->be;
    const int d = in->head_dim, nq = in->n_q_local;
    const size_t p_bytes = (size_t)nq * (size_t)w * (size_t)L * sizeof(float); /* [nq, w, L] weights */
    const size_t s_bytes = (size_t)nkv * (size_t)L * sizeof(float);
    ckv_def_ws ws;
    CKV_TRY(def_ws_init(&ws, in, w));
    ckv_score_dev dev = ckv_score_dev_begin(in);
    float *q = NULL, *P = NULL;           // device: [w, nq * d] window queries, [nq, w, L] their weights
    float *norm_dev = NULL, *dmax_dev = NULL; // device: [nkv, L] value norms, [nkv, n] defensive max
    double *ave_dev = NULL, *bias_dev = NULL; // device: [nkv, n] weight sums, [1] window bias
    float *out = NULL;                        // host view of the scores
    ckv_status s = CKV_STATUS_OK;

    /* 1: window queries and their attention weights on the device */
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&q, (size_t)w * (size_t)nq * d * sizeof(float),
                                        "defensivekv window queries"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&P, p_bytes, "defensivekv attention weights"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&norm_dev, s_bytes, "defensivekv value norms"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&dmax_dev, (size_t)nkv * n * sizeof(float), "defensivekv max"),
                 done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&ave_dev, (size_t)nkv * n * sizeof(double), "defensivekv mean"),
                 done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&bias_dev, sizeof(double), "defensivekv window bias"), done);
    /* the official code divides by math.sqrt(head_dim) */
    const ckv_evict_attn_params ap = ckv_score_attn_params(in, ckv_score_window_queries(in, w, q), w, L - w,
                                                           (float)sqrt((double)d), CKV_EVICT_LOGITS_DIV);
    CKV_TRY_GOTO(s, be->ops->evict_attn_probs(be, P, L, &ap), done);
    /* 2-4: per-head rows, defensive max (from 0: every value is >= 0), window bias; then to the host */
    const ckv_evict_defensive_params dp = {.p = P, .ld = L, .w = w, .n = n, .n_heads_local = nq,
                                           .head0 = ckv_score_head0(in), .group = G, .kernel = cfg->kernel,
                                           .n_kv = nkv, .ave = ave_dev, .dmax = dmax_dev, .bias = bias_dev,
                                           .accum = CKV_EVICT_ZERO_FIRST};
    CKV_TRY_GOTO(s, be->ops->evict_defensive_rows(be, &dp), done);
    double bias_sum = 0.0;
    CKV_TRY_GOTO(s, be->ops->sync(be), done);
    CKV_TRY_GOTO(s, be->ops->download(be, ws.ave, ave_dev, (size_t)nkv * n * sizeof(double)), done);
    CKV_TRY_GOTO(s, be->ops->download(be, ws.dmax, dmax_dev, (size_t)nkv * n * sizeof(float)), done);
    CKV_TRY_GOTO(s, be->ops->download(be, &bias_sum, bias_dev, sizeof bias_sum), done);
    for (size_t i = 0; i < (size_t)nkv * n; i++) ws.avef[i] = (float)ws.ave[i];
    CKV_TRY_GOTO(s, ckv_evict_allreduce(be, in->replica, ws.avef, (size_t)nkv * n, CKV_COMM_OP_SUM, 0), done);
    CKV_TRY_GOTO(s, ckv_evict_allreduce(be, in->replica, ws.dmax, (size_t)nkv * n, CKV_COMM_OP_MAX, 0), done);
    for (size_t i = 0; i < (size_t)nkv * n; i++) ws.avef[i] = (float)((double)ws.avef[i] / ((double)G * w));
    /* window bias: mean over ALL query heads of the layer and the window queries (quirk: the w columns
     * before the window) */
    float bias = (float)bias_sum;
    CKV_TRY_GOTO(s, ckv_evict_allreduce(be, in->tp, &bias, 1, CKV_COMM_OP_SUM, 0), done);
    const float window_bias = (float)((double)bias / ((double)in->n_heads * w));
    const float threshold = (float)(CKV_DEFENSIVE_THRESHOLD - (double)window_bias);
    for (int g = 0; g < nkv; g++) { /* floor at the head's mean */
        float *dm = ws.dmax + (size_t)g * n;
        double m = 0.0;
        for (int t = 0; t < n; t++) m += dm[t];
        const float mean = (float)(m / n);
        for (int t = 0; t < n; t++) dm[t] = dm[t] < mean ? mean : dm[t];
    }

    /* 5: value norms normalised over all KV heads of the layer (replicas of a head count once) */
    CKV_TRY_GOTO(s, ckv_critical_value_norm(in, norm_dev), done);
    {
        float *nh = NULL;
        CKV_TRY_GOTO(s, ckv_evict_host_view(be, norm_dev, s_bytes, (void **)&nh), done);
        memcpy(ws.norm, nh, s_bytes);
        CKV_TRY_GOTO(s, ckv_evict_host_release(be, norm_dev, nh, s_bytes, 0), done);
    }
    const int replica_leader = !in->replica || in->replica->size <= 1 || in->replica->rank == 0;
    for (int t = 0; t < n; t++) {
        double acc = 0.0;
        if (replica_leader)
            for (int g = 0; g < nkv; g++) acc += ws.norm[(size_t)g * L + t];
        ws.nsum[t] = (float)acc;
    }
    CKV_TRY_GOTO(s, ckv_evict_allreduce(be, in->tp, ws.nsum, (size_t)n, CKV_COMM_OP_SUM, 0), done);
    CKV_TRY_GOTO(s, ckv_evict_host_view(be, scores, s_bytes, (void **)&out), done);
    float M = 0.0f;
    for (int g = 0; g < nkv; g++) {
        float *dst = out + (size_t)g * L;
        const float *dm = ws.dmax + (size_t)g * n, *N = ws.norm + (size_t)g * L;
        for (int t = 0; t < n; t++) {
            dst[t] = ws.nsum[t] > 0.0f ? dm[t] * (N[t] / ws.nsum[t]) : 0.0f;
            M = dst[t] > M ? dst[t] : M;
        }
        for (int t = n; t < L; t++) dst[t] = 0.0f; /* the window: protected by the caller */
    }
    CKV_TRY_GOTO(s, ckv_evict_allreduce(be, in->tp, &M, 1, CKV_COMM_OP_MAX, 0), done);

    /* 6: first stage, per KV head */
    const int cap = (int)((double)n * keep_frac - (double)w);
    for (int g = 0; g < nkv; g++) {
        const float *a = ws.avef + (size_t)g * n;
        double tot = 0.0;
        for (int t = 0; t < n; t++) tot += a[t];
        const float totf = (float)tot;
        if (!(totf > 0.0f)) continue;
        for (int t = 0; t < n; t++) ws.rank[t] = (ckv_def_rank){a[t] / totf, t};
        qsort(ws.rank, (size_t)n, sizeof *ws.rank, def_rank_cmp);
        int c = 0; /* argmax of (cumsum >= threshold): 0 when no prefix reaches it */
        double cum = 0.0;
        for (int i = 0; i < n; i++) {
            cum += ws.rank[i].s;
            if ((float)cum >= threshold) {
                c = i;
                break;
            }
        }
        int k = c < cap ? c : cap;
        if (k < 0) k = n + k > 0 ? n + k : 0; /* Python's sorted[:k] with k < 0 */
        float *dst = out + (size_t)g * L;
        for (int i = 0; i < k; i++) dst[ws.rank[i].t] = M;
    }
    if (cfg->scorer == CKV_SCORER_LAYER_DEFENSIVEKV) { /* the window at its layer's max, one ulp above */
        const float win = nextafterf(M, INFINITY);
        for (int g = 0; g < nkv; g++)
            for (int t = n; t < L; t++) out[(size_t)g * L + t] = win;
    } else {
        info->protect_tail = w;
    }
done:
    if (out) {
        ckv_status s2 = ckv_evict_host_release(be, scores, out, s_bytes, s == CKV_STATUS_OK);
        if (s == CKV_STATUS_OK) s = s2;
    }
    ckv_score_dev_free(&dev);
    def_ws_free(&ws);
    return s;
}
