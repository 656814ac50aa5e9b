/* score_expected.c - expected_attention as kvpress's ExpectedAttentionPress computes it:
 *  1. pre-RoPE queries (q_proj + bias, no RoPE) of the tokens n_sink .. L-1; their mean mu and their
 *     biased covariance cov (divided by L - n_sink), per query head;
 *  2. the RoPE rotation averaged over the n_future positions that follow the context
 *     (R = mean over p of the rotate_half rotation at angle (float)p * inv_freq, cos and sin times
 *     rope_scale as the model's rotary embedding returns them): mu <- R mu, cov <- R cov R^T;
 *  3. for every key t >= n_sink (post-RoPE): logit = mu.k / sqrt(d) + k^T cov k / d / 2, a softmax
 *     over those L - n_sink keys (fp32), the mean over the group's query heads;
 *  4. with vnorm: (score + epsilon) * ||v_t||_2.
 * The first n_sink tokens are left 0 here and reported as protected by ckv_score_layer.
 * What runs where: the queries (matmul), their shifted moments block by block (evict_moments: one
 * pass, shifted by the first statistics token's query for accuracy, sums in double; nothing of size
 * [L, n_heads * d]), the per-key logits (evict_ea_logits), the softmax (evict_softmax_add), the value
 * norms and the weighting (evict_row_norm, evict_add_mul) are backend ops on device buffers. The
 * per-head d x d bookkeeping - mean and covariance from the moments, the averaged rotation applied
 * to both, symmetrisation - runs on the host over the downloaded moments ([n_q_local, d, d] doubles)
 * and uploads mu and cov per head. It selects nothing. */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "evict/scorer.h"

#define CKV_EA_BLOCK 256

/* v <- R v for the averaged rotate_half rotation: (v[a], v[a + h]) -> (c v[a] - s v[a + h], s v[a] + c v[a + h]),
 * elements `stride` apart. */
static void ea_rotate(double *v, size_t stride, const double *c, const double *s, int d) {
    const int h = d / 2;
    for (int a = 0; a < h; a++) {
        double x1 = v[(size_t)a * stride], x2 = v[(size_t)(a + h) * stride];
        v[(size_t)a * stride] = c[a] * x1 - s[a] * x2;
        v[(size_t)(a + h) * stride] = s[a] * x1 + c[a] * x2;
    }
}

/* Host bookkeeping of the per-head statistics. */
typedef struct {
    float *shift;    // [hq] the first statistics token's queries
    double *s1;      // [n_q_local, d] sums of (q - shift)
    double *s2;      // [n_q_local, d, d] sums of (q - shift)(q - shift)^T
    double *cb, *sb; // [d / 2] averaged cos / sin
    double *mu;      // [d] one head's rotated mean (double)
    float *muf;      // [d] one head's rotated mean
    float *covf;     // [d, d] one head's rotated covariance
    float *inv_freq; // [d / 2] host copy of the rope table
} ckv_ea_host;

static void ea_host_free(ckv_ea_host *w) {
    ckv_free(w->shift);
    ckv_free(w->s1);
    ckv_free(w->s2);
    ckv_free(w->cb);
    ckv_free(w->sb);
    ckv_free(w->mu);
    ckv_free(w->muf);
    ckv_free(w->covf);
    ckv_free(w->inv_freq);
}

static ckv_status ea_host_alloc(ckv_ea_host *w, int hl, int d) {
    const size_t hq = (size_t)hl * (size_t)d, dd = (size_t)d * (size_t)d;
    CKV_TRY(ckv_alloc((void **)&w->shift, hq * sizeof(float), "expected_attention shift"));
    CKV_TRY(ckv_alloc((void **)&w->s1, hq * sizeof(double), "expected_attention sums"));
    CKV_TRY(ckv_alloc((void **)&w->s2, (size_t)hl * dd * sizeof(double), "expected_attention covariances"));
    CKV_TRY(ckv_alloc((void **)&w->cb, (size_t)(d / 2) * sizeof(double), "expected_attention cos"));
    CKV_TRY(ckv_alloc((void **)&w->sb, (size_t)(d / 2) * sizeof(double), "expected_attention sin"));
    CKV_TRY(ckv_alloc((void **)&w->mu, (size_t)d * sizeof(double), "expected_attention mean"));
    CKV_TRY(ckv_alloc((void **)&w->muf, (size_t)d * sizeof(float), "expected_attention mean"));
    CKV_TRY(ckv_alloc((void **)&w->covf, dd * sizeof(float), "expected_attention covariance"));
    CKV_TRY(ckv_alloc((void **)&w->inv_freq, (size_t)(d / 2) * sizeof(float), "expected_attention rope table"));
    return CKV_STATUS_OK;
}

/* Device buffers of the scorer. */
typedef struct {
    float *q;      // [B, hq] pre-RoPE queries of one token block
    float *shift;  // [hq]
    double *s1;    // [n_q_local, d]
    double *s2;    // [n_q_local, d, d]
    float *mu;     // [d]
    float *cov;    // [d, d]
    float *logit;  // [L - n_sink]
    float *norms;  // [n_kv_local, L] value norms (vnorm)
} ckv_ea_dev;

static ckv_status ea_dev_alloc(ckv_score_dev *dev, ckv_ea_dev *b, int hl, int d, int n, int nkv, int L) {
    const size_t hq = (size_t)hl * (size_t)d, dd = (size_t)d * (size_t)d;
    CKV_TRY(ckv_score_dev_alloc(dev, (void **)&b->q, CKV_EA_BLOCK * hq * sizeof(float), "expected_attention queries"));
    CKV_TRY(ckv_score_dev_alloc(dev, (void **)&b->shift, hq * sizeof(float), "expected_attention shift"));
    CKV_TRY(ckv_score_dev_alloc(dev, (void **)&b->s1, hq * sizeof(double), "expected_attention sums"));
    CKV_TRY(ckv_score_dev_alloc(dev, (void **)&b->s2, (size_t)hl * dd * sizeof(double), "expected_attention moments"));
    CKV_TRY(ckv_score_dev_alloc(dev, (void **)&b->mu, (size_t)d * sizeof(float), "expected_attention mean"));
    CKV_TRY(ckv_score_dev_alloc(dev, (void **)&b->cov, dd * sizeof(float), "expected_attention covariance"));
    CKV_TRY(ckv_score_dev_alloc(dev, (void **)&b->logit, (size_t)n * sizeof(float), "expected_attention logits"));
    CKV_TRY(ckv_score_dev_alloc(dev, (void **)&b->norms, (size_t)nkv * L * sizeof(float), "expected_attention norms"));
    return CKV_STATUS_OK;
}

/* Pass over the tokens n_sink .. L-1 on the device: shifted first and second moments of the pre-RoPE
 * queries; then the moments and the shift come to the host. */
static ckv_status ea_statistics(const ckv_score_inputs *in, int n_sink, int cov, ckv_ea_dev *b, ckv_ea_host *w) {
    const int L = in->L, d = in->head_dim, D = in->D, hl = in->n_q_local, hq = hl * d;
    ckv_backend *be = in->be;
    for (int t0 = n_sink; t0 < L; t0 += CKV_EA_BLOCK) {
        const int nb = L - t0 < CKV_EA_BLOCK ? L - t0 : CKV_EA_BLOCK;
        be->ops->matmul(be, b->q, in->xn + (size_t)t0 * (size_t)D, in->wq, in->bq, nb); /* [nb, hq] */
        if (t0 == n_sink) CKV_TRY(be->ops->copy(be, b->shift, b->q, (size_t)hq * sizeof(float)));
        CKV_TRY(be->ops->evict_moments(be, b->s1, cov ? b->s2 : NULL, b->q, b->shift, nb, hl, d,
                                         t0 == n_sink ? CKV_EVICT_ZERO_FIRST : CKV_EVICT_ADD));
    }
    CKV_TRY(be->ops->sync(be));
    CKV_TRY(be->ops->download(be, w->shift, b->shift, (size_t)hq * sizeof(float)));
    CKV_TRY(be->ops->download(be, w->s1, b->s1, (size_t)hq * sizeof(double)));
    if (cov) CKV_TRY(be->ops->download(be, w->s2, b->s2, (size_t)hq * (size_t)d * sizeof(double)));
    return CKV_STATUS_OK;
}

/* Local head j's rotated mean (w->muf) and, with cov, its rotated symmetrised covariance (w->covf),
 * from the moments over n tokens. */
static void ea_head_stats(ckv_ea_host *w, int j, int d, int n, int cov) {
    const double inv_n = 1.0 / (double)n;
    double *mu = w->mu, *s1 = w->s1 + (size_t)j * d, *s2 = w->s2 + (size_t)j * d * d;
    const float *sh = w->shift + (size_t)j * d;
    for (int a = 0; a < d; a++) s1[a] *= inv_n; /* mean - shift */
    for (int a = 0; a < d; a++) mu[a] = (double)sh[a] + s1[a];
    ea_rotate(mu, 1, w->cb, w->sb, d);
    for (int a = 0; a < d; a++) w->muf[a] = (float)mu[a];
    if (!cov) return;
    for (int a = 0; a < d; a++)
        for (int c = 0; c < d; c++) s2[(size_t)a * d + c] = s2[(size_t)a * d + c] * inv_n - s1[a] * s1[c];
    for (int c = 0; c < d; c++) ea_rotate(s2 + c, (size_t)d, w->cb, w->sb, d);     /* R cov */
    for (int a = 0; a < d; a++) ea_rotate(s2 + (size_t)a * d, 1, w->cb, w->sb, d); /* (R cov) R^T */
    for (int a = 0; a < d; a++)
        for (int c = 0; c < d; c++) /* symmetric up to rounding: symmetrise for x @ cov^T = x @ cov */
            w->covf[(size_t)a * d + c] = (float)(0.5 * (s2[(size_t)a * d + c] + s2[(size_t)c * d + a]));
}

ckv_status ckv_score_expected_attention(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "expected_attention"));
    if (!in->xn || !in->wq || !in->pos || !in->inv_freq)
        return ckv_error(CKV_STATUS_ERR_ARG, "scorer expected_attention: layer %d needs the attention input, q_proj, "
                         "positions and rope tables", in->layer);
    const int n_sink = cfg->n_sink, n_future = cfg->n_future, cov = cfg->use_covariance != 0;
    if (n_sink < 0) return ckv_error(CKV_STATUS_ERR_ARG, "n_sink %d must be >= 0", n_sink);
    if (n_future < 1) return ckv_error(CKV_STATUS_ERR_ARG, "n_future %d must be >= 1", n_future);
    if (in->L <= n_sink)
        return ckv_error(CKV_STATUS_ERR_ARG, "n_sink %d needs a context longer than %d tokens, got %d", n_sink,
                         n_sink, in->L);
    const int L = in->L, d = in->head_dim, h = d / 2, hl = in->n_q_local, n = L - n_sink, nkv = in->n_kv_local;
    ckv_backend *be = in->be;
    ckv_ea_host w;
    memset(&w, 0, sizeof w);
    ckv_ea_dev b;
    memset(&b, 0, sizeof b);
    ckv_score_dev dev = ckv_score_dev_begin(in);
    ckv_status s;
    CKV_TRY_GOTO(s, ea_host_alloc(&w, hl, d), done);
    CKV_TRY_GOTO(s, ea_dev_alloc(&dev, &b, hl, d, n, nkv, L), done);
    CKV_TRY_GOTO(s, ea_statistics(in, n_sink, cov, &b, &w), done);

    /* averaged rotation over positions P0 .. P0 + n_future - 1, P0 the first position after the context
     * (kvpress: q_len, equal to pos[L-1] + 1 for a context at positions 0 .. L-1) */
    int32_t last = 0;
    CKV_TRY_GOTO(s, be->ops->download(be, &last, in->pos + (L - 1), sizeof last), done);
    CKV_TRY_GOTO(s, be->ops->download(be, w.inv_freq, in->inv_freq, (size_t)h * sizeof(float)), done);
    const int64_t p0 = (int64_t)last + 1;
    for (int a = 0; a < h; a++) {
        double c = 0.0, sn = 0.0;
        for (int p = 0; p < n_future; p++) {
            float angle = (float)(p0 + p) * w.inv_freq[a]; /* fp32, as the rotary embedding */
            c += (double)(cosf(angle) * in->rope_scale);
            sn += (double)(sinf(angle) * in->rope_scale);
        }
        w.cb[a] = c / n_future;
        w.sb[a] = sn / n_future;
    }

    be->ops->evict_fill(be, scores, nkv, L, 0, L, CKV_EVICT_FILL_VALUE, 0.0f);
    const float sqrt_d = (float)sqrt((double)d);
    for (int j = 0; j < hl; j++) {
        ea_head_stats(&w, j, d, n, cov);
        CKV_TRY_GOTO(s, be->ops->upload(be, b.mu, w.muf, (size_t)d * sizeof(float)), done);
        if (cov) CKV_TRY_GOTO(s, be->ops->upload(be, b.cov, w.covf, (size_t)d * d * sizeof(float)), done);
        /* logits over keys n_sink .. L-1, softmax over them (fp32), summed into the KV head's row */
        const int g = ckv_score_local_kv(in, j);
        CKV_TRY_GOTO(s, be->ops->evict_ea_logits(be, b.logit, &in->kv, g, n_sink, n, b.mu, cov ? b.cov : NULL, sqrt_d),
                     done);
        be->ops->evict_softmax_add(be, scores + (size_t)g * (size_t)L + n_sink, b.logit, n);
        CKV_TRY_GOTO(s, be->ops->sync(be), done); /* mu and cov are overwritten for the next head */
    }
    CKV_TRY_GOTO(s, ckv_score_group_mean(in, scores), done);
    if (cfg->use_vnorm) { /* (score + epsilon) * ||v||_2 on the tokens after the sinks */
        be->ops->evict_row_norm(be, b.norms, L, &in->kv, L, CKV_EVICT_VALUES, 1.0f);
        be->ops->evict_add_mul(be, scores + n_sink, scores + n_sink, b.norms + n_sink, nkv, n, L, (float)cfg->epsilon_ea);
    }
    s = CKV_STATUS_OK;
done:
    ea_host_free(&w);
    ckv_score_dev_free(&dev);
    return s;
}
