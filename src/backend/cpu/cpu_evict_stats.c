/* cpu_evict_stats.c - the CPU backend's statistics ops of two scorers (semantics in backend.h):
 * expected attention's shifted query moments of a token block (evict_moments: the second moments as
 * one GEMM X^T X per head, the heads over the backend's pool) and per-key logits mu.k / sqrt(d) +
 * k^T cov k / d / 2 (evict_ea_logits: keys @ cov by GEMMs over blocks of 256 rows, the blocks over the
 * pool, each key's two sums in double in ascending order with eight keys side by side), and
 * DefensiveKV's window aggregation (mean, window bias, pooled mass-preserving max:
 * evict_defensive_rows: the KV heads over the pool, then the bias in one ordered pass). Every GEMM
 * runs on one worker's thread with ckv's kernels, whose sums do not depend on the thread count, and
 * each output is written by one worker, so scores are the same bits on any number of threads; F16/BF16 keys are converted to fp32 per block. Scratch is allocated per
 * call and freed before returning. No rotation, covariance or ranking bookkeeping (evict/). */
#include "core/alloc.h"
#include "cpu_backend.h"
#include "cpu_gemm.h"

typedef struct {
    double *s1, *s2;
    const float *q, *shift;
    int n, n_heads_local, d;
} moments_job;

/* Local head j's shifted sums s1 += x, s2 += X^T X (one GEMM on this thread) over the block's n rows.
 * scratch: xt [d, n] the head's shifted rows transposed, outer [d, d]. */
static ckv_status moments_head(void *ctx, int j, void *scratch) {
    const moments_job *jb = ctx;
    const int n = jb->n, d = jb->d;
    const size_t hq = (size_t)jb->n_heads_local * (size_t)d, dd = (size_t)d * (size_t)d;
    float *xt = scratch, *outer = xt + (size_t)d * (size_t)n;
    double *m1 = jb->s1 + (size_t)j * d;
    const float *sh = jb->shift + (size_t)j * d;
    for (int i = 0; i < n; i++) {
        const float *qi = jb->q + (size_t)i * hq + (size_t)j * d;
        for (int a = 0; a < d; a++) {
            const float x = qi[a] - sh[a];
            xt[(size_t)a * n + i] = x;
            m1[a] += x;
        }
    }
    if (!jb->s2) return CKV_STATUS_OK;
    ckv_cpu_gemm(NULL, NULL, outer, xt, xt, NULL, d, n, d); /* [d, d] = X^T X */
    double *m2 = jb->s2 + (size_t)j * dd;
    for (size_t e = 0; e < dd; e++) m2[e] += outer[e];
    return CKV_STATUS_OK;
}

ckv_status ckv_cpu_evict_moments(ckv_backend *be, double *s1, double *s2, const float *q, const float *shift, int n,
                                 int n_heads_local, int d, ckv_evict_accum zero) {
    const size_t hq = (size_t)n_heads_local * (size_t)d, dd = (size_t)d * (size_t)d;
    if (zero) {
        memset(s1, 0, hq * sizeof(double));
        if (s2) memset(s2, 0, (size_t)n_heads_local * dd * sizeof(double));
    }
    if (n < 1) return CKV_STATUS_OK;
    moments_job jb = {s1, s2, q, shift, n, n_heads_local, d};
    return ckv_cpu_evict_heads(be, n_heads_local, ((size_t)d * (size_t)n + dd) * sizeof(float), moments_head, &jb);
}

#define CKV_CPU_EA_BLOCK 256
#define CKV_CPU_EA_KEYS 8 /* keys whose sums run side by side (each in its own order) */

typedef struct {
    float *logit;
    const ckv_kv_batch *kv;
    const char *K; // [n, d] in the batch dtype
    int n;
    const float *mu, *cov;
    float sqrt_d;
} ea_job;

/* Logits of the keys of block b (CKV_CPU_EA_BLOCK rows). scratch: kc [B, d] keys @ cov, kb [B, d] fp32
 * keys (F16/BF16 caches), kt and ct [d, KEYS] a group of keys and their kc rows transposed. Each key's
 * two dot products are sums in double over a ascending; CKV_CPU_EA_KEYS keys run side by side so that
 * the loop vectorises across keys, never within a sum. */
static ckv_status ea_block(void *ctx, int b, void *scratch) {
    const ea_job *jb = ctx;
    const int d = jb->kv->head_dim, t0 = b * CKV_CPU_EA_BLOCK;
    const int nb = jb->n - t0 < CKV_CPU_EA_BLOCK ? jb->n - t0 : CKV_CPU_EA_BLOCK;
    const size_t es = ckv_dtype_size(jb->kv->dtype);
    float *kc = scratch, *kb = kc + (size_t)CKV_CPU_EA_BLOCK * (size_t)d;
    const float *Kb = (const float *)(const void *)(jb->K + (size_t)t0 * (size_t)d * es);
    if (jb->kv->dtype != CKV_DTYPE_F32) {
        ckv_convert_to_f32(kb, jb->K + (size_t)t0 * (size_t)d * es, jb->kv->dtype, (size_t)nb * (size_t)d);
        Kb = kb;
    }
    if (jb->cov) ckv_cpu_gemm(NULL, NULL, kc, Kb, jb->cov, NULL, nb, d, d); /* [nb, d] */
    float *kt = kb + (size_t)CKV_CPU_EA_BLOCK * (size_t)d, *ct = kt + (size_t)CKV_CPU_EA_KEYS * (size_t)d; // [d, KEYS]
    for (int i0 = 0; i0 < nb; i0 += CKV_CPU_EA_KEYS) {
        const int nk = nb - i0 < CKV_CPU_EA_KEYS ? nb - i0 : CKV_CPU_EA_KEYS;
        for (int i = 0; i < CKV_CPU_EA_KEYS; i++) { /* keys past nk repeat the last one and are dropped */
            const size_t r = (size_t)(i0 + (i < nk ? i : nk - 1)) * (size_t)d;
            for (int a = 0; a < d; a++) {
                kt[(size_t)a * CKV_CPU_EA_KEYS + i] = Kb[r + a];
                ct[(size_t)a * CKV_CPU_EA_KEYS + i] = jb->cov ? kc[r + a] : 0.0f;
            }
        }
        double m1[CKV_CPU_EA_KEYS] = {0}, m2[CKV_CPU_EA_KEYS] = {0};
        for (int a = 0; a < d; a++) {
            const float *ka = kt + (size_t)a * CKV_CPU_EA_KEYS, *ca = ct + (size_t)a * CKV_CPU_EA_KEYS;
            for (int i = 0; i < CKV_CPU_EA_KEYS; i++) {
                m1[i] += (double)jb->mu[a] * ka[i];
                m2[i] += (double)ca[i] * ka[i];
            }
        }
        for (int i = 0; i < nk; i++) {
            float x = (float)m1[i] / jb->sqrt_d;
            if (jb->cov) x += (float)m2[i] / (float)d / 2.0f;
            jb->logit[t0 + i0 + i] = x;
        }
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_cpu_evict_ea_logits(ckv_backend *be, float *logit, const ckv_kv_batch *kv, int g, int row0, int n,
                                   const float *mu, const float *cov, float sqrt_d) {
    const int d = kv->head_dim;
    const size_t es = ckv_dtype_size(kv->dtype);
    const ea_job jb = {logit, kv, (const char *)kv->segs[0][g].k + (size_t)row0 * (size_t)d * es, n, mu, cov, sqrt_d};
    return ckv_cpu_evict_heads(be, ckv_cpu_blocks((size_t)(n > 0 ? n : 0), CKV_CPU_EA_BLOCK),
                               (2 * (size_t)CKV_CPU_EA_BLOCK + 2 * CKV_CPU_EA_KEYS) * (size_t)d * sizeof(float), ea_block,
                               (void *)&jb);
}

/* Window rows of one KV head aggregated side by side: each row's mass and pooled mass are chains of
 * dependent additions in double, so a block of rows advances its chains together. */
#define CKV_CPU_DEF_ROWS 8

/* Scratch bytes of defensive_head for n columns: box [n] doubles, pooled [CKV_CPU_DEF_ROWS, n] floats. */
static size_t defensive_scratch_bytes(int n) {
    const size_t c = (size_t)(n > 0 ? n : 1);
    return c * sizeof(double) + (size_t)CKV_CPU_DEF_ROWS * c * sizeof(float);
}

/* KV head g = head0 / group + k: its rows of ave and dmax from its local query heads' window rows
 * (heads ascending, then rows; the heads of one KV head are consecutive, so its rows are too), in
 * blocks of CKV_CPU_DEF_ROWS rows. Every sum is added in the order a row-by-row pass adds it: ave[t]
 * row after row, a row's mass and pooled mass over t ascending, each box over its window ascending
 * (the box's missing neighbours at the edges are skipped, as adding +0.0 to a sum of non-negative
 * weights would leave it). */
static ckv_status defensive_head(void *ctx, int k, void *scratch) {
    const ckv_evict_defensive_params *d = ctx;
    const int g = d->head0 / d->group + k;
    const int ld = d->ld, w = d->w, n = d->n, r = d->kernel / 2;
    double *box = scratch;                                   /* [n] one row's box sums */
    float *pooled = (float *)(void *)(box + (n > 0 ? n : 1)); /* [CKV_CPU_DEF_ROWS, n] the block's pooled rows */
    double *av = d->ave + (size_t)g * (size_t)n;
    float *dm = d->dmax + (size_t)g * (size_t)n;
    int j0 = 0;
    while (j0 < d->n_heads_local && (d->head0 + j0) / d->group != g) j0++;
    int nh = 0;
    while (j0 + nh < d->n_heads_local && (d->head0 + j0 + nh) / d->group == g) nh++;
    const int n_rows = nh * w;
    for (int b0 = 0; b0 < n_rows; b0 += CKV_CPU_DEF_ROWS) {
        const int nb = n_rows - b0 < CKV_CPU_DEF_ROWS ? n_rows - b0 : CKV_CPU_DEF_ROWS;
        const float *row[CKV_CPU_DEF_ROWS];
        double mass[CKV_CPU_DEF_ROWS] = {0}, psum[CKV_CPU_DEF_ROWS] = {0}, scale[CKV_CPU_DEF_ROWS];
        for (int b = 0; b < nb; b++) row[b] = d->p + ((size_t)j0 * (size_t)w + (size_t)(b0 + b)) * (size_t)ld; // [n] used
        for (int t = 0; t < n; t++) {
            double a = av[t];
            for (int b = 0; b < nb; b++) {
                mass[b] += row[b][t];
                a += row[b][t];
            }
            av[t] = a;
        }
        /* avg pooling (zero padding counted), then rescaled to the row's own mass */
        for (int b = 0; b < nb; b++) {
            float *pb = pooled + (size_t)b * (size_t)n;
            for (int t = 0; t < n; t++) box[t] = 0.0;
            for (int u = -r; u <= r; u++) {
                const int t0 = u < 0 ? -u : 0, t1 = u > 0 ? n - u : n;
                for (int t = t0; t < t1; t++) box[t] += row[b][t + u];
            }
            for (int t = 0; t < n; t++) pb[t] = (float)(box[t] / d->kernel);
        }
        for (int t = 0; t < n; t++)
            for (int b = 0; b < nb; b++) psum[b] += pooled[(size_t)b * (size_t)n + (size_t)t];
        for (int b = 0; b < nb; b++) scale[b] = psum[b] > 0.0 ? mass[b] / psum[b] : 0.0;
        for (int b = 0; b < nb; b++) {
            const float *pb = pooled + (size_t)b * (size_t)n;
            for (int t = 0; t < n; t++) {
                const float v = (float)(pb[t] * scale[b]);
                dm[t] = v > dm[t] ? v : dm[t];
            }
        }
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_cpu_evict_defensive_rows(ckv_backend *be, const ckv_evict_defensive_params *d) {
    const int w = d->w, n = d->n;
    if (d->accum == CKV_EVICT_ZERO_FIRST) {
        memset(d->ave, 0, (size_t)d->n_kv * (size_t)n * sizeof(double));
        memset(d->dmax, 0, (size_t)d->n_kv * (size_t)n * sizeof(float));
        *d->bias = 0.0;
    }
    /* the KV heads the local query heads read, over the pool (each owns its rows of ave and dmax) */
    const int n_g = d->n_heads_local > 0 ? (d->head0 + d->n_heads_local - 1) / d->group - d->head0 / d->group + 1 : 0;
    CKV_TRY(ckv_cpu_evict_heads(be, n_g, defensive_scratch_bytes(n), defensive_head, (void *)d));
    /* the window bias, one sum over every head's rows in order */
    const int bias_lo = n > w ? n - w : 0;
    for (int j = 0; j < d->n_heads_local; j++)
        for (int i = 0; i < w; i++) {
            const float *row = d->p + ((size_t)j * (size_t)w + (size_t)i) * (size_t)d->ld;
            for (int t = bias_lo; t < n; t++) *d->bias += row[t];
        }
    return CKV_STATUS_OK;
}
