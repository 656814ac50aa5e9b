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
 * The statistics are accumulated block by block over the tokens (one pass, shifted by the first
 * token's query for accuracy, sums in double); nothing of size [L, n_heads * d] is materialised.
 * It selects nothing. Host buffers only. */
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

typedef struct {
    float *q;       // [B, hq] pre-RoPE queries of one token block
    float *xt;      // [d, B] one head's shifted queries, transposed
    float *outer;   // [d, d] one block's sum of outer products
    float *shift;   // [hq] the first statistics token's queries
    double *s1;     // [n_q_local, d] sums of (q - shift)
    double *s2;     // [n_q_local, d, d] sums of (q - shift)(q - shift)^T
    double *cb, *sb; // [d / 2] averaged cos / sin
    double *mu;     // [n_q_local, d] rotated means (double)
    float *muf;     // [d] one head's rotated mean
    float *covf;    // [d, d] one head's rotated covariance
    float *kc;      // [B, d] keys @ cov
    float *logit;   // [L - n_sink]
} ckv_ea_ws;

static void ea_free(ckv_ea_ws *w) {
    ckv_free(w->q);
    ckv_free(w->xt);
    ckv_free(w->outer);
    ckv_free(w->shift);
    ckv_free(w->s1);
    ckv_free(w->s2);
    ckv_free(w->cb);
    ckv_free(w->sb);
    ckv_free(w->mu);
    ckv_free(w->muf);
    ckv_free(w->covf);
    ckv_free(w->kc);
    ckv_free(w->logit);
}

static ckv_status ea_alloc(ckv_ea_ws *w, int hl, int d, int n) {
    const size_t B = CKV_EA_BLOCK, hq = (size_t)hl * (size_t)d, dd = (size_t)d * (size_t)d;
    CKV_TRY(ckv_alloc((void **)&w->q, B * hq * sizeof(float), "expected_attention queries"));
    CKV_TRY(ckv_alloc((void **)&w->xt, (size_t)d * B * sizeof(float), "expected_attention block"));
    CKV_TRY(ckv_alloc((void **)&w->outer, dd * sizeof(float), "expected_attention outer products"));
    CKV_TRY(ckv_alloc((void **)&w->shift, hq * sizeof(float), "expected_attention shift"));
    CKV_TRY(ckv_alloc((void **)&w->s1, hq * sizeof(double), "expected_attention sums"));
    CKV_TRY(ckv_alloc((void **)&w->s2, (size_t)hl * dd * sizeof(double), "expected_attention covariances"));
    CKV_TRY(ckv_alloc((void **)&w->cb, (size_t)(d / 2) * sizeof(double), "expected_attention cos"));
    CKV_TRY(ckv_alloc((void **)&w->sb, (size_t)(d / 2) * sizeof(double), "expected_attention sin"));
    CKV_TRY(ckv_alloc((void **)&w->mu, hq * sizeof(double), "expected_attention means"));
    CKV_TRY(ckv_alloc((void **)&w->muf, (size_t)d * sizeof(float), "expected_attention mean"));
    CKV_TRY(ckv_alloc((void **)&w->covf, dd * sizeof(float), "expected_attention covariance"));
    CKV_TRY(ckv_alloc((void **)&w->kc, B * (size_t)d * sizeof(float), "expected_attention keys @ cov"));
    CKV_TRY(ckv_alloc((void **)&w->logit, (size_t)n * sizeof(float), "expected_attention logits"));
    return CKV_STATUS_OK;
}

/* Pass over the tokens n_sink .. L-1: shifted first and second moments of the pre-RoPE queries. */
static void ea_statistics(const ckv_score_inputs *in, int n_sink, int cov, ckv_ea_ws *w) {
    const int L = in->L, d = in->head_dim, D = in->D, hl = in->n_q_local, hq = hl * d;
    ckv_backend *be = in->be;
    for (int t0 = n_sink; t0 < L; t0 += CKV_EA_BLOCK) {
        const int nb = L - t0 < CKV_EA_BLOCK ? L - t0 : CKV_EA_BLOCK;
        be->ops->matmul(be, w->q, in->xn + (size_t)t0 * (size_t)D, in->wq, in->bq, nb); /* [nb, hq] */
        if (t0 == n_sink) memcpy(w->shift, w->q, (size_t)hq * sizeof(float));
        for (int j = 0; j < hl; j++) {
            double *s1 = w->s1 + (size_t)j * d;
            for (int i = 0; i < nb; i++) {
                const float *qi = w->q + (size_t)i * hq + (size_t)j * d;
                const float *sh = w->shift + (size_t)j * d;
                for (int a = 0; a < d; a++) {
                    float x = qi[a] - sh[a];
                    w->xt[(size_t)a * nb + i] = x;
                    s1[a] += x;
                }
            }
            if (!cov) continue;
            ckv_backend_matmul_f32(be, w->outer, w->xt, w->xt, NULL, d, nb, d); /* [d, d] = X^T X */
            double *s2 = w->s2 + (size_t)j * d * d;
            for (size_t e = 0; e < (size_t)d * d; e++) s2[e] += w->outer[e];
        }
    }
}

ckv_status ckv_score_expected_attention(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "expected_attention"));
    if (!in->xn || !in->wq || !in->pos || !in->inv_freq)
        return ckv_error(CKV_STATUS_ERR_ARG, "scorer expected_attention: layer %d needs the attention input, q_proj, "
                         "positions and rope tables", in->layer);
    const int n_sink = cfg->n_sink, n_future = cfg->n_future, cov = cfg->use_covariance != 0;
    if (n_sink < 0) return ckv_error(CKV_STATUS_ERR_ARG, "--n_sink %d must be >= 0", n_sink);
    if (n_future < 1) return ckv_error(CKV_STATUS_ERR_ARG, "--n_future %d must be >= 1", n_future);
    if (in->L <= n_sink)
        return ckv_error(CKV_STATUS_ERR_ARG, "--n_sink %d needs a context longer than %d tokens, got %d", n_sink,
                         n_sink, in->L);
    const int L = in->L, d = in->head_dim, h = d / 2, hl = in->n_q_local, n = L - n_sink;
    ckv_backend *be = in->be;
    ckv_ea_ws w;
    memset(&w, 0, sizeof w);
    ckv_status s;
    CKV_TRY_GOTO(s, ea_alloc(&w, hl, d, n), done);
    ea_statistics(in, n_sink, cov, &w);

    /* averaged rotation over positions P0 .. P0 + n_future - 1, P0 the first position after the context
     * (kvpress: q_len, equal to pos[L-1] + 1 for a context at positions 0 .. L-1) */
    const int64_t p0 = (int64_t)in->pos[L - 1] + 1;
    for (int a = 0; a < h; a++) {
        double c = 0.0, sn = 0.0;
        for (int p = 0; p < n_future; p++) {
            float angle = (float)(p0 + p) * in->inv_freq[a]; /* fp32, as the rotary embedding */
            c += (double)(cosf(angle) * in->rope_scale);
            sn += (double)(sinf(angle) * in->rope_scale);
        }
        w.cb[a] = c / n_future;
        w.sb[a] = sn / n_future;
    }

    memset(scores, 0, (size_t)in->n_kv_local * (size_t)L * sizeof(float));
    const double inv_n = 1.0 / (double)n;
    const float sqrt_d = (float)sqrt((double)d);
    for (int j = 0; j < hl; j++) {
        /* mean and covariance (biased: divided by n), then rotated */
        double *mu = w.mu + (size_t)j * d, *s1 = w.s1 + (size_t)j * d, *s2 = w.s2 + (size_t)j * d * d;
        const float *sh = w.shift + (size_t)j * d;
        for (int a = 0; a < d; a++) s1[a] *= inv_n; /* mean - shift */
        for (int a = 0; a < d; a++) mu[a] = (double)sh[a] + s1[a];
        ea_rotate(mu, 1, w.cb, w.sb, d);
        for (int a = 0; a < d; a++) w.muf[a] = (float)mu[a];
        if (cov) {
            for (int a = 0; a < d; a++)
                for (int b = 0; b < d; b++) s2[(size_t)a * d + b] = s2[(size_t)a * d + b] * inv_n - s1[a] * s1[b];
            for (int b = 0; b < d; b++) ea_rotate(s2 + b, (size_t)d, w.cb, w.sb, d);         /* R cov */
            for (int a = 0; a < d; a++) ea_rotate(s2 + (size_t)a * d, 1, w.cb, w.sb, d);     /* (R cov) R^T */
            for (int a = 0; a < d; a++)
                for (int b = 0; b < d; b++) /* symmetric up to rounding: symmetrise for x @ cov^T = x @ cov */
                    w.covf[(size_t)a * d + b] = (float)(0.5 * (s2[(size_t)a * d + b] + s2[(size_t)b * d + a]));
        }
        /* logits over keys n_sink .. L-1 */
        const int g = ckv_score_local_kv(in, j);
        const float *K = in->cache.k + ((size_t)in->cache.off[g] + (size_t)n_sink) * (size_t)d; // [n, d]
        for (int t0 = 0; t0 < n; t0 += CKV_EA_BLOCK) {
            const int nb = n - t0 < CKV_EA_BLOCK ? n - t0 : CKV_EA_BLOCK;
            const float *Kb = K + (size_t)t0 * d;
            if (cov) ckv_backend_matmul_f32(be, w.kc, Kb, w.covf, NULL, nb, d, d); /* [nb, d] */
            for (int i = 0; i < nb; i++) {
                const float *k = Kb + (size_t)i * d;
                double m1 = 0.0, m2 = 0.0;
                for (int a = 0; a < d; a++) m1 += (double)w.muf[a] * k[a];
                float x = (float)m1 / sqrt_d;
                if (cov) {
                    const float *kc = w.kc + (size_t)i * d;
                    for (int a = 0; a < d; a++) m2 += (double)kc[a] * k[a];
                    x += (float)m2 / (float)d / 2.0f;
                }
                w.logit[t0 + i] = x;
            }
        }
        /* softmax over the n keys (fp32), summed into the KV head's row */
        const float inv = ckv_score_exp_row(w.logit, n);
        float *dst = scores + (size_t)g * (size_t)L + n_sink;
        for (int t = 0; t < n; t++) dst[t] += w.logit[t] * inv;
    }
    CKV_TRY_GOTO(s, ckv_score_group_mean(in, scores), done);
    if (cfg->use_vnorm) {
        const float eps = (float)cfg->epsilon_ea;
        for (int g = 0; g < in->n_kv_local; g++) {
            const float *V = in->cache.v + (size_t)in->cache.off[g] * (size_t)d; // [L, d]
            float *row = scores + (size_t)g * (size_t)L;
            for (int t = n_sink; t < L; t++) {
                const float *v = V + (size_t)t * d;
                double ss = 0.0;
                for (int a = 0; a < d; a++) ss += (double)v[a] * v[a];
                row[t] = (row[t] + eps) * (float)sqrt(ss);
            }
        }
    }
    s = CKV_STATUS_OK;
done:
    ea_free(&w);
    return s;
}
