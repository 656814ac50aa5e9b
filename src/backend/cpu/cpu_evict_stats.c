/* cpu_evict_stats.c - the CPU backend's statistics ops of two scorers (semantics in backend.h):
 * expected attention's shifted query moments of a token block (evict_moments: the second moments as
 * one GEMM X^T X per head) and per-key logits mu.k / sqrt(d) + k^T cov k / d / 2 (evict_ea_logits:
 * keys @ cov by GEMMs over blocks of 256 rows), and DefensiveKV's window aggregation (mean, window
 * bias, pooled mass-preserving max: evict_defensive_rows). Same shapes and summation order as the
 * scorers used before they moved behind the op table, so scores are unchanged; F16/BF16 keys are
 * converted to fp32 per block. Scratch is allocated per call and freed before returning. No rotation,
 * covariance or ranking bookkeeping (evict/). */
#include "core/alloc.h"
#include "cpu_backend.h"

ckv_status ckv_cpu_evict_moments(ckv_backend *be, double *s1, double *s2, const float *q, const float *shift, int n,
                                 int n_heads_local, int d, ckv_evict_accum zero) {
    const size_t hq = (size_t)n_heads_local * (size_t)d, dd = (size_t)d * (size_t)d;
    if (zero) {
        memset(s1, 0, hq * sizeof(double));
        if (s2) memset(s2, 0, (size_t)n_heads_local * dd * sizeof(double));
    }
    if (n < 1) return CKV_STATUS_OK;
    float *xt = NULL, *outer = NULL; // [d, n] one head's shifted rows transposed, [d, d]
    ckv_status s = ckv_alloc((void **)&xt, (size_t)d * (size_t)n * sizeof(float), "moment block");
    if (s == CKV_STATUS_OK && s2) s = ckv_alloc((void **)&outer, dd * sizeof(float), "moment outer products");
    for (int j = 0; j < n_heads_local && s == CKV_STATUS_OK; j++) {
        double *m1 = s1 + (size_t)j * d;
        const float *sh = shift + (size_t)j * d;
        for (int i = 0; i < n; i++) {
            const float *qi = q + (size_t)i * hq + (size_t)j * d;
            for (int a = 0; a < d; a++) {
                const float x = qi[a] - sh[a];
                xt[(size_t)a * n + i] = x;
                m1[a] += x;
            }
        }
        if (!s2) continue;
        ckv_cpu_matmul_f32(be, outer, xt, xt, NULL, d, n, d); /* [d, d] = X^T X */
        double *m2 = s2 + (size_t)j * dd;
        for (size_t e = 0; e < dd; e++) m2[e] += outer[e];
    }
    ckv_free(xt);
    ckv_free(outer);
    return s;
}

#define CKV_CPU_EA_BLOCK 256

ckv_status ckv_cpu_evict_ea_logits(ckv_backend *be, float *logit, const ckv_kv_batch *kv, int g, int row0, int n,
                                   const float *mu, const float *cov, float sqrt_d) {
    const int d = kv->head_dim;
    const size_t es = ckv_dtype_size(kv->dtype);
    const char *K = (const char *)kv->segs[0][g].k + (size_t)row0 * (size_t)d * es; // [n, d] in the batch dtype
    float *kc = NULL, *kb = NULL; // [B, d] keys @ cov, [B, d] fp32 keys (F16/BF16 caches)
    ckv_status s = ckv_alloc((void **)&kc, (size_t)CKV_CPU_EA_BLOCK * (size_t)d * sizeof(float), "keys @ cov");
    if (s == CKV_STATUS_OK && kv->dtype != CKV_DTYPE_F32)
        s = ckv_alloc((void **)&kb, (size_t)CKV_CPU_EA_BLOCK * (size_t)d * sizeof(float), "fp32 keys");
    for (int t0 = 0; t0 < n && s == CKV_STATUS_OK; t0 += CKV_CPU_EA_BLOCK) {
        const int nb = n - t0 < CKV_CPU_EA_BLOCK ? n - t0 : CKV_CPU_EA_BLOCK;
        const float *Kb = (const float *)(const void *)(K + (size_t)t0 * (size_t)d * es);
        if (kb) {
            ckv_convert_to_f32(kb, K + (size_t)t0 * (size_t)d * es, kv->dtype, (size_t)nb * (size_t)d);
            Kb = kb;
        }
        if (cov) ckv_cpu_matmul_f32(be, kc, Kb, cov, NULL, nb, d, d); /* [nb, d] */
        for (int i = 0; i < nb; i++) {
            const float *k = Kb + (size_t)i * d;
            double m1 = 0.0, m2 = 0.0;
            for (int a = 0; a < d; a++) m1 += (double)mu[a] * k[a];
            float x = (float)m1 / sqrt_d;
            if (cov) {
                const float *c = kc + (size_t)i * d;
                for (int a = 0; a < d; a++) m2 += (double)c[a] * k[a];
                x += (float)m2 / (float)d / 2.0f;
            }
            logit[t0 + i] = x;
        }
    }
    ckv_free(kc);
    ckv_free(kb);
    return s;
}

ckv_status ckv_cpu_evict_defensive_rows(ckv_backend *be, const ckv_evict_defensive_params *d) {
    (void)be;
    double *ave = d->ave, *bias = d->bias;
    float *dmax = d->dmax;
    const float *p = d->p;
    const int ld = d->ld, w = d->w, n = d->n, n_heads_local = d->n_heads_local, head0 = d->head0, group = d->group;
    const int kernel = d->kernel, n_kv = d->n_kv;
    if (d->accum == CKV_EVICT_ZERO_FIRST) {
        memset(ave, 0, (size_t)n_kv * (size_t)n * sizeof(double));
        memset(dmax, 0, (size_t)n_kv * (size_t)n * sizeof(float));
        *bias = 0.0;
    }
    float *pooled = NULL; // [n] one row, pooled
    CKV_TRY(ckv_alloc((void **)&pooled, (size_t)(n > 0 ? n : 1) * sizeof(float), "defensive pooled row"));
    const int r = kernel / 2, bias_lo = n > w ? n - w : 0;
    for (int j = 0; j < n_heads_local; j++) {
        const int g = (head0 + j) / group;
        double *av = ave + (size_t)g * (size_t)n;
        float *dm = dmax + (size_t)g * (size_t)n;
        for (int i = 0; i < w; i++) {
            const float *row = p + ((size_t)j * (size_t)w + (size_t)i) * (size_t)ld; // [n] used
            double mass = 0.0;
            for (int t = 0; t < n; t++) {
                mass += row[t];
                av[t] += row[t];
            }
            for (int t = bias_lo; t < n; t++) *bias += row[t];
            /* avg pooling (zero padding counted), then rescaled to the row's own mass */
            double psum = 0.0;
            for (int t = 0; t < n; t++) {
                const int lo = t - r < 0 ? 0 : t - r, hi = t + r >= n ? n - 1 : t + r;
                double box = 0.0;
                for (int u = lo; u <= hi; u++) box += row[u];
                pooled[t] = (float)(box / kernel);
                psum += pooled[t];
            }
            const double scale = psum > 0.0 ? mass / psum : 0.0;
            for (int t = 0; t < n; t++) {
                const float v = (float)(pooled[t] * scale);
                dm[t] = v > dm[t] ? v : dm[t];
            }
        }
    }
    ckv_free(pooled);
    return CKV_STATUS_OK;
}
