/* test_evict_ops.c - the eviction ops of the backend table (backend.h, "eviction ops") on the cpu
 * backend against naive double-precision references written here from their comments: attention
 * column sums and weights (both logit scalings, per query head and per KV head, accumulation over
 * query blocks), finishing, pooling (avg / max), head sums, division, row norms, (s + eps) * m,
 * fills, seeded random scores, the layer max, the one-row softmax, CriticalKV value
 * norms (F32 and BF16 o_proj), expected attention's moments and logits, DefensiveKV's window aggregation, per-row top-k with ties and NaN, scatter and the cross-head counts;
 * keys and values as F32, F16 and BF16 segments. Inputs are random (never zeros); outputs are
 * poisoned before each op. The ops that split their work over the backend's threads (value norms,
 * column sums and weights, keydiff, lagkv, cur, leverage) give the same bits on 1 to 5 threads; leverage
 * of a head at positions other than segment 0's gives the bits of that head scored alone. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "core/tensor.h"

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static void poison(void *p, size_t bytes) { memset(p, 0x7f, bytes); }

/* One sequence's segments over n_kv heads of L rows in dtype dt, from fp32 k, v [n_kv, L, d]; kf, vf
 * receive the values the segments really hold (rounded to dt). */
typedef struct {
    ckv_kv_seg segs[4];
    ckv_kv_seg *list[1];
    ckv_kv_batch b;
    void *k, *v;
    int32_t *pos;
} segset;

static void seg_make(segset *s, ckv_dtype dt, int n_kv, int L, int d, float *kf, float *vf) {
    const size_t n = (size_t)n_kv * L * d, es = ckv_dtype_size(dt);
    s->k = malloc(n * es), s->v = malloc(n * es), s->pos = malloc(sizeof(int32_t) * (size_t)n_kv * L);
    ckv_convert_from_f32(s->k, kf, dt, n);
    ckv_convert_from_f32(s->v, vf, dt, n);
    ckv_convert_to_f32(kf, s->k, dt, n);
    ckv_convert_to_f32(vf, s->v, dt, n);
    for (int g = 0; g < n_kv; g++) {
        for (int t = 0; t < L; t++) s->pos[g * L + t] = t;
        s->segs[g] = (ckv_kv_seg){(char *)s->k + (size_t)g * L * d * es, (char *)s->v + (size_t)g * L * d * es,
                                  s->pos + (size_t)g * L, L, L};
    }
    s->list[0] = s->segs;
    s->b = (ckv_kv_batch){.dtype = dt, .head_dim = d, .n_kv_heads = n_kv, .n_seq = 1, .segs = s->list, .max_len = L};
}
/* seg_make over random keys and values in [-1, 1]. */
static void seg_random(segset *s, ckv_dtype dt, int n_kv, int L, int d, float *kf, float *vf) {
    ckv_test_fill(&rng, kf, (size_t)n_kv * L * d, -1, 1);
    ckv_test_fill(&rng, vf, (size_t)n_kv * L * d, -1, 1);
    seg_make(s, dt, n_kv, L, d, kf, vf);
}
static void seg_free(segset *s) { free(s->k), free(s->v), free(s->pos); }

static double worst = 0.0;
static void close_to(const char *what, const float *got, const double *ref, size_t n, double atol, double rtol) {
    float *r = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) r[i] = (float)ref[i];
    double e = ckv_test_allclose(what, got, r, n, atol, rtol);
    worst = e > worst ? e : worst;
    free(r);
}

static void check_attention(ckv_backend *be, ckv_dtype dt) {
    const int L = 90, d = 8, nkv = 2, nq_heads = 4, G = 2, w = 12;
    float *kf = malloc(sizeof(float) * nkv * L * d), *vf = malloc(sizeof(float) * nkv * L * d);
    ckv_test_fill(&rng, kf, (size_t)nkv * L * d, -1.5, 1.5), ckv_test_fill(&rng, vf, (size_t)nkv * L * d, -1, 1);
    segset s;
    seg_make(&s, dt, nkv, L, d, kf, vf);
    float *q = malloc(sizeof(float) * L * nq_heads * d); /* queries of every context row */
    ckv_test_fill(&rng, q, (size_t)L * nq_heads * d, -1.5, 1.5);
    double *ref = calloc((size_t)nq_heads * L, sizeof(double)), *cs = malloc(sizeof(double) * nq_heads * L);
    float *p = malloc(sizeof(float) * nq_heads * w * L), *got = malloc(sizeof(float) * nq_heads * L);
    double *pr = calloc((size_t)nq_heads * w * L, sizeof(double));
    char name[128];
    for (int divide = 0; divide < 2; divide++) {
        const float scale = divide ? sqrtf((float)d) : 1.0f / sqrtf((float)d);
        /* naive weights of queries r = q_row0 .. L-1 */
        memset(ref, 0, sizeof(double) * nq_heads * L);
        double *kvref = calloc((size_t)nkv * L, sizeof(double));
        for (int j = 0; j < nq_heads; j++)
            for (int r = 0; r < L; r++) {
                const float *qi = q + ((size_t)r * nq_heads + j) * d;
                double lg[90], m = -INFINITY, sum = 0;
                for (int t = 0; t <= r; t++) {
                    double x = 0;
                    for (int a = 0; a < d; a++) x += (double)qi[a] * kf[((size_t)(j / G) * L + t) * d + a];
                    lg[t] = divide ? x / scale : x * scale;
                    m = lg[t] > m ? lg[t] : m;
                }
                for (int t = 0; t <= r; t++) sum += (lg[t] = exp(lg[t] - m));
                for (int t = 0; t <= r; t++) {
                    kvref[(size_t)(j / G) * L + t] += lg[t] / sum;
                    if (r >= L - w) {
                        pr[((size_t)j * w + (r - (L - w))) * L + t] = lg[t] / sum;
                        ref[(size_t)j * L + t] += lg[t] / sum;
                    }
                }
            }
        /* window: per query head, columns 0 .. L-w-1 */
        poison(cs, sizeof(double) * nq_heads * L);
        const ckv_evict_logits lg_mode = divide ? CKV_EVICT_LOGITS_DIV : CKV_EVICT_LOGITS_MUL;
        const ckv_evict_attn_params aw = {q + (size_t)(L - w) * nq_heads * d, w, L - w, &s.b, nq_heads, 0, G, scale,
                                          lg_mode};
        CHECK_OK(be->ops->evict_attn_colsum(be, cs, L - w, &aw, CKV_EVICT_PER_QUERY_HEAD, CKV_EVICT_ZERO_FIRST));
        for (int j = 0; j < nq_heads; j++)
            for (int t = 0; t < L - w; t++) got[(size_t)j * (L - w) + t] = (float)cs[(size_t)j * (L - w) + t];
        double *r2 = malloc(sizeof(double) * nq_heads * (L - w));
        for (int j = 0; j < nq_heads; j++)
            for (int t = 0; t < L - w; t++) r2[(size_t)j * (L - w) + t] = ref[(size_t)j * L + t];
        snprintf(name, sizeof name, "attn_colsum window %s divide %d", ckv_dtype_name(dt), divide);
        close_to(name, got, r2, (size_t)nq_heads * (L - w), 1e-7, 1e-5);
        /* the last row alone (one query per head: a KV head's query heads in one GEMM strip), per query
         * head and per KV head, columns 0 .. L-2 */
        for (int per_kv = 0; per_kv < 2; per_kv++) {
            const int n_rows = per_kv ? nkv : nq_heads;
            const ckv_evict_attn_params a1 = {q + (size_t)(L - 1) * nq_heads * d, 1, L - 1, &s.b, nq_heads, 0, G, scale,
                                              lg_mode};
            poison(cs, sizeof(double) * nq_heads * L);
            CHECK_OK(be->ops->evict_attn_colsum(be, cs, L - 1, &a1, per_kv ? CKV_EVICT_PER_KV_HEAD : CKV_EVICT_PER_QUERY_HEAD,
                                                CKV_EVICT_ZERO_FIRST));
            for (int i = 0; i < n_rows * (L - 1); i++) got[i] = (float)cs[i];
            double *r1 = calloc((size_t)n_rows * (L - 1), sizeof(double));
            for (int j = 0; j < nq_heads; j++)
                for (int t = 0; t < L - 1; t++)
                    r1[(size_t)(per_kv ? j / G : j) * (L - 1) + t] += pr[((size_t)j * w + (w - 1)) * L + t];
            snprintf(name, sizeof name, "attn_colsum one query per %s head %s divide %d", per_kv ? "KV" : "query",
                     ckv_dtype_name(dt), divide);
            close_to(name, got, r1, (size_t)n_rows * (L - 1), 1e-7, 1e-5);
            free(r1);
        }
        /* all queries in three blocks, per KV head */
        poison(cs, sizeof(double) * nkv * L);
        for (int r0 = 0; r0 < L; r0 += 32) {
            const int nb = L - r0 < 32 ? L - r0 : 32;
            const ckv_evict_attn_params ab = {q + (size_t)r0 * nq_heads * d, nb, r0, &s.b, nq_heads, 0, G, scale, lg_mode};
            CHECK_OK(be->ops->evict_attn_colsum(be, cs, L, &ab, CKV_EVICT_PER_KV_HEAD,
                                                r0 == 0 ? CKV_EVICT_ZERO_FIRST : CKV_EVICT_ADD));
        }
        for (int i = 0; i < nkv * L; i++) got[i] = (float)cs[i];
        snprintf(name, sizeof name, "attn_colsum blocks per KV head %s divide %d", ckv_dtype_name(dt), divide);
        close_to(name, got, kvref, (size_t)nkv * L, 1e-6, 1e-5);
        /* finish with the per-column divisor */
        poison(got, sizeof(float) * nkv * L);
        be->ops->evict_colsum_finish(be, got, L, cs, L, nkv, L, (double)L, CKV_EVICT_DENOM_MINUS_COL);
        for (int i = 0; i < nkv * L; i++) kvref[i] /= (double)(L - i % L);
        close_to("colsum_finish minus_col", got, kvref, (size_t)nkv * L, 1e-7, 1e-5);
        /* weights */
        poison(p, sizeof(float) * nq_heads * w * L);
        CHECK_OK(be->ops->evict_attn_probs(be, p, L, &aw));
        if (divide) /* the chunked non-causal sums multiply by the scale only */
            CHECK_FAILS(be->ops->evict_chunk_colsum(be, cs, L, &aw, 0, CKV_EVICT_ZERO_FIRST), CKV_STATUS_ERR_ARG,
                        "dividing is not offered");
        snprintf(name, sizeof name, "attn_probs %s divide %d", ckv_dtype_name(dt), divide);
        close_to(name, p, pr, (size_t)nq_heads * w * L, 1e-7, 1e-5);
        free(r2), free(kvref);
    }
    /* DefensiveKV's aggregation of the last weights (divide 1), kernel 5 */
    {
        const int n = L - w, kern = 5;
        double *ave = malloc(sizeof(double) * nkv * n), bias = -1, rbias = 0;
        float *dm = malloc(sizeof(float) * nkv * n), *ga = malloc(sizeof(float) * nkv * n);
        double *rave = calloc((size_t)nkv * n, sizeof(double)), *rdm = calloc((size_t)nkv * n, sizeof(double));
        poison(ave, sizeof(double) * nkv * n), poison(dm, sizeof(float) * nkv * n);
        const ckv_evict_defensive_params dp = {.p = p, .ld = L, .w = w, .n = n, .n_heads_local = nq_heads, .head0 = 0,
                                               .group = G, .kernel = kern, .n_kv = nkv, .ave = ave, .dmax = dm,
                                               .bias = &bias, .accum = CKV_EVICT_ZERO_FIRST};
        CHECK_OK(be->ops->evict_defensive_rows(be, &dp));
        for (int j = 0; j < nq_heads; j++)
            for (int i = 0; i < w; i++) {
                const double *row = pr + ((size_t)j * w + i) * L;
                double mass = 0, psum = 0, pooled[90];
                for (int t = 0; t < n; t++) mass += row[t], rave[(j / G) * n + t] += row[t];
                for (int t = (n > w ? n - w : 0); t < n; t++) rbias += row[t];
                for (int t = 0; t < n; t++) {
                    pooled[t] = 0;
                    for (int u = t - kern / 2; u <= t + kern / 2; u++) pooled[t] += u >= 0 && u < n ? row[u] : 0;
                    psum += (pooled[t] /= kern);
                }
                for (int t = 0; t < n; t++) rdm[(j / G) * n + t] = fmax(rdm[(j / G) * n + t], pooled[t] * mass / psum);
            }
        for (int i = 0; i < nkv * n; i++) ga[i] = (float)ave[i];
        close_to("defensive_rows mean", ga, rave, (size_t)nkv * n, 1e-7, 1e-5);
        close_to("defensive_rows max", dm, rdm, (size_t)nkv * n, 1e-7, 1e-5);
        CHECK_MSG(fabs(bias - rbias) <= 1e-5 * fabs(rbias), "defensive_rows bias %.9g, reference %.9g", bias, rbias);
        free(ave), free(dm), free(ga), free(rave), free(rdm);
    }
    /* row norms */
    float *nrm = malloc(sizeof(float) * nkv * L);
    double *nref = malloc(sizeof(double) * nkv * L);
    for (int values = 0; values < 2; values++) {
        poison(nrm, sizeof(float) * nkv * L);
        be->ops->evict_row_norm(be, nrm, L, &s.b, L, values ? CKV_EVICT_VALUES : CKV_EVICT_KEYS, values ? 1.0f : -1.0f);
        for (int i = 0; i < nkv * L; i++) {
            double ss = 0;
            for (int a = 0; a < d; a++) ss += pow((values ? vf : kf)[(size_t)i * d + a], 2);
            nref[i] = (values ? 1 : -1) * sqrt(ss);
        }
        close_to(values ? "row_norm values" : "row_norm keys (negated)", nrm, nref, (size_t)nkv * L, 0, 1e-6);
    }
    /* value norms: o_proj [D, nq_heads * d] as F32 and BF16 */
    const int D = 24;
    float *wo = malloc(sizeof(float) * D * nq_heads * d);
    ckv_test_fill(&rng, wo, (size_t)D * nq_heads * d, -0.5, 0.5);
    uint16_t *wo16 = malloc(2 * (size_t)D * nq_heads * d);
    ckv_convert_from_f32(wo16, wo, CKV_DTYPE_BF16, (size_t)D * nq_heads * d);
    for (int wdt = 0; wdt < 2; wdt++) {
        if (wdt) ckv_convert_to_f32(wo, wo16, CKV_DTYPE_BF16, (size_t)D * nq_heads * d);
        ckv_weight W = {wdt ? (void *)wo16 : (void *)wo, wdt ? CKV_DTYPE_BF16 : CKV_DTYPE_F32, D, nq_heads * d,
                        (size_t)nq_heads * d * (wdt ? 2 : 4)};
        be->ops->evict_fill(be, nrm, nkv, L, 0, L, CKV_EVICT_FILL_VALUE, 0.0f);
        CHECK_OK(be->ops->evict_value_norm(be, nrm, L, &s.b, L, &W, nq_heads, 0, G));
        memset(nref, 0, sizeof(double) * nkv * L);
        for (int j = 0; j < nq_heads; j++)
            for (int t = 0; t < L; t++) {
                double l1 = 0;
                for (int r = 0; r < D; r++) {
                    double y = 0;
                    for (int a = 0; a < d; a++) y += (double)vf[((size_t)(j / G) * L + t) * d + a] * wo[(size_t)r * nq_heads * d + j * d + a];
                    l1 += fabs(y);
                }
                nref[(size_t)(j / G) * L + t] += l1;
            }
        snprintf(name, sizeof name, "value_norm %s values, %s o_proj", ckv_dtype_name(dt), wdt ? "BF16" : "F32");
        close_to(name, nrm, nref, (size_t)nkv * L, 1e-6, 1e-5);
    }
    /* expected-attention moments (two blocks, two heads) and logits */
    {
        const int hl = 2, nb = 20;
        float *qq = malloc(sizeof(float) * 2 * nb * hl * d), sh[2 * 8], mu[8], cv[64], lg[90];
        ckv_test_fill(&rng, qq, (size_t)2 * nb * hl * d, -1, 1), ckv_test_fill(&rng, mu, (size_t)d, -1, 1), ckv_test_fill(&rng, cv, 64, -0.3, 0.3);
        for (int a = 0; a < d; a++)
            for (int c = 0; c < a; c++) cv[a * d + c] = cv[c * d + a]; /* symmetric */
        memcpy(sh, qq, sizeof(float) * hl * d);
        double *m1 = malloc(sizeof(double) * hl * d), *m2 = malloc(sizeof(double) * hl * d * d);
        poison(m1, sizeof(double) * hl * d), poison(m2, sizeof(double) * hl * d * d);
        for (int blk = 0; blk < 2; blk++)
            CHECK_OK(be->ops->evict_moments(be, m1, m2, qq + (size_t)blk * nb * hl * d, sh, nb, hl, d,
                                             blk == 0 ? CKV_EVICT_ZERO_FIRST : CKV_EVICT_ADD));
        double r1[16], r2[128];
        float g1[16], g2[128];
        memset(r1, 0, sizeof r1), memset(r2, 0, sizeof r2);
        for (int i = 0; i < 2 * nb; i++)
            for (int j = 0; j < hl; j++)
                for (int a = 0; a < d; a++) {
                    const double xa = (double)qq[((size_t)i * hl + j) * d + a] - sh[j * d + a];
                    r1[j * d + a] += xa;
                    for (int c = 0; c < d; c++) r2[(j * d + a) * d + c] += xa * ((double)qq[((size_t)i * hl + j) * d + c] - sh[j * d + c]);
                }
        for (int i = 0; i < hl * d; i++) g1[i] = (float)m1[i];
        for (int i = 0; i < hl * d * d; i++) g2[i] = (float)m2[i];
        close_to("moments s1", g1, r1, (size_t)hl * d, 1e-6, 1e-5);
        close_to("moments s2", g2, r2, (size_t)hl * d * d, 1e-6, 1e-5);
        double lr[90];
        const int row0 = 5, n = L - row0;
        for (int withcov = 0; withcov < 2; withcov++) {
            poison(lg, sizeof lg);
            CHECK_OK(be->ops->evict_ea_logits(be, lg, &s.b, 1, row0, n, mu, withcov ? cv : NULL, sqrtf((float)d)));
            for (int t = 0; t < n; t++) {
                const float *k = kf + ((size_t)L + row0 + t) * d;
                double x = 0, y = 0;
                for (int a = 0; a < d; a++) x += (double)mu[a] * k[a];
                for (int a = 0; a < d && withcov; a++)
                    for (int c = 0; c < d; c++) y += (double)k[a] * cv[a * d + c] * k[c];
                lr[t] = x / sqrt((double)d) + y / d / 2.0;
            }
            snprintf(name, sizeof name, "ea_logits %s cov %d", ckv_dtype_name(dt), withcov);
            close_to(name, lg, lr, (size_t)n, 1e-6, 1e-5);
        }
        free(qq), free(m1), free(m2);
    }
    free(wo), free(wo16), free(nrm), free(nref);
    free(kf), free(vf), free(q), free(ref), free(cs), free(p), free(got), free(pr);
    seg_free(&s);
}

static void check_rows(ckv_backend *be) {
    enum { R = 3, N = 40, LD = 44 };
    float x[R * LD], y[R * LD];
    double ref[R * N];
    ckv_test_fill(&rng, x, R * LD, -2, 2);
    for (int mx = 0; mx < 2; mx++)
        for (int k = 1; k <= 7; k += 2) {
            poison(y, sizeof y);
            be->ops->evict_pool(be, y, x, R, N, LD, k, mx ? CKV_EVICT_POOL_MAX : CKV_EVICT_POOL_AVG);
            float g[R * N];
            for (int r = 0; r < R; r++)
                for (int t = 0; t < N; t++) {
                    double acc = mx ? -INFINITY : 0;
                    for (int u = t - k / 2; u <= t + k / 2; u++)
                        if (u >= 0 && u < N) acc = mx ? fmax(acc, x[r * LD + u]) : acc + x[r * LD + u];
                    ref[r * N + t] = mx ? acc : acc / k;
                    g[r * N + t] = y[r * LD + t];
                }
            close_to(mx ? "pool max" : "pool avg", g, ref, R * N, 1e-6, 1e-6);
        }
    /* head sums: 4 query heads, head0 1, group 2 -> rows 0, 1, 1, 2 */
    float dst[3 * N], src[4 * N];
    ckv_test_fill(&rng, src, 4 * N, -1, 1);
    ckv_test_fill(&rng, dst, 3 * N, -1, 1);
    for (int i = 0; i < 3 * N; i++) ref[i] = dst[i];
    for (int j = 0; j < 4; j++)
        for (int t = 0; t < N; t++) ref[((1 + j) / 2) * N + t] += src[j * N + t];
    be->ops->evict_head_sum(be, dst, N, src, N, 4, N, 1, 2);
    close_to("head_sum", dst, ref, 3 * N, 1e-6, 1e-6);
    for (int i = 0; i < 3 * N; i++) ref[i] = dst[i] / 3.0;
    be->ops->evict_div(be, dst, 3 * N, 3.0f);
    close_to("div", dst, ref, 3 * N, 0, 1e-7);
    float m[R * LD], o[R * LD];
    ckv_test_fill(&rng, m, R * LD, 0.1, 2);
    poison(o, sizeof o);
    be->ops->evict_add_mul(be, o, x, m, R, N, LD, 0.25f);
    int ok = 1;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < N; t++) ok &= o[r * LD + t] == (x[r * LD + t] + 0.25f) * m[r * LD + t];
    CHECK_MSG(ok, "add_mul differs from (s + eps) * m");
    /* fills, max, random */
    be->ops->evict_fill(be, o, R, LD, 0, N, CKV_EVICT_FILL_INDEX, 0.0f);
    be->ops->evict_fill(be, o, R, LD, 3, 5, CKV_EVICT_FILL_VALUE, -7.5f);
    ok = 1;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < N; t++) ok &= o[r * LD + t] == (t >= 3 && t < 5 ? -7.5f : (float)t);
    CHECK_MSG(ok, "fill index / value");
    float mxv = 0;
    x[LD + 7] = NAN, x[2 * LD + 9] = 50.0f, x[2 * LD + 30] = 60.0f;
    be->ops->evict_max(be, &mxv, x, R, LD, 0, 20);
    CHECK_MSG(mxv == 50.0f, "max over columns 0..19 = %g, want 50 (NaN ignored)", mxv);
    float ra[4 * N], rb[N];
    be->ops->evict_random(be, ra, 4, N, N, 42, 3, 0);
    be->ops->evict_random(be, rb, 1, N, N, 42, 3, 2);
    CHECK_MSG(memcmp(ra + 2 * N, rb, sizeof rb) == 0, "random scores depend on the head split");
    ok = 1;
    for (int i = 0; i < 4 * N; i++) ok &= ra[i] >= 0.0f && ra[i] < 1.0f;
    CHECK_MSG(ok && memcmp(ra, ra + N, sizeof rb) != 0, "random scores outside [0, 1) or equal across heads");
    /* one-row softmax */
    float sx[N], sd[N];
    double sr[N], mm = -INFINITY, sum = 0;
    ckv_test_fill(&rng, sx, N, -3, 3), ckv_test_fill(&rng, sd, N, -1, 1);
    for (int t = 0; t < N; t++) mm = fmax(mm, sx[t]);
    for (int t = 0; t < N; t++) sum += exp(sx[t] - mm);
    for (int t = 0; t < N; t++) sr[t] = sd[t] + exp(sx[t] - mm) / sum;
    be->ops->evict_softmax_add(be, sd, sx, N);
    close_to("softmax_add", sd, sr, N, 1e-7, 1e-6);
}

/* rank of (s, i) under the top-k order: how many entries come before it */
static int before(const float *s, int n, int i) {
    int c = 0;
    for (int u = 0; u < n; u++) {
        if (u == i) continue;
        const int un = s[u] != s[u], in = s[i] != s[i];
        c += (!un && in) || (!un && !in && (s[u] > s[i] || (s[u] == s[i] && u < i))) || (un && in && u < i);
    }
    return c;
}

static void check_topk(ckv_backend *be) {
    enum { R = 4, N = 37, LD = 40 };
    float s[R * LD];
    for (int i = 0; i < R * LD; i++) s[i] = (float)(int)(ckv_test_rng_double(&rng) * 6) - 2.0f; /* many ties */
    s[3] = NAN, s[LD + 5] = NAN, s[LD + 6] = -INFINITY, s[2 * LD + 1] = INFINITY;
    const int32_t k[R] = {0, 5, 17, N};
    int32_t idx[R * LD];
    poison(idx, sizeof idx);
    CHECK_OK(be->ops->evict_topk(be, idx, LD, s, LD, R, N, k));
    for (int r = 0; r < R; r++) {
        uint8_t want[N] = {0};
        for (int i = 0; i < N; i++) want[i] = before(s + r * LD, N, i) < k[r];
        int ok = 1;
        for (int i = 0; i < k[r]; i++) {
            ok &= idx[r * LD + i] >= 0 && idx[r * LD + i] < N && want[idx[r * LD + i]];
            if (i) ok &= idx[r * LD + i] > idx[r * LD + i - 1];
        }
        CHECK_MSG(ok, "topk row %d (k %d): not the tie-ruled set in ascending order", r, k[r]);
    }
    /* scatter the forced rows of row 1 and 2 */
    float x[R * LD];
    memcpy(x, s, sizeof x);
    be->ops->evict_scatter(be, x, LD, R, idx, LD, k, FLT_MAX);
    int forced = 0;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < N; t++) forced += x[r * LD + t] == FLT_MAX;
    CHECK_MSG(forced == k[0] + k[1] + k[2] + k[3], "scatter set %d entries, want %d", forced, k[0] + k[1] + k[2] + k[3]);
    /* cross-head counts against the flattened rank */
    float flat[R * N];
    for (int r = 0; r < R; r++) memcpy(flat + r * N, s + r * LD, sizeof(float) * N);
    const int64_t totals[3] = {0, 61, R * N};
    for (int c = 0; c < 3; c++) {
        int32_t cnt[R], want[R] = {0};
        poison(cnt, sizeof cnt);
        CHECK_OK(be->ops->evict_topk_counts(be, cnt, s, LD, R, N, totals[c]));
        for (int i = 0; i < R * N; i++) want[i / N] += before(flat, R * N, i) < totals[c];
        CHECK_MSG(!memcmp(cnt, want, sizeof cnt), "topk_counts total %lld: %d %d %d %d, want %d %d %d %d",
                  (long long)totals[c], cnt[0], cnt[1], cnt[2], cnt[3], want[0], want[1], want[2], want[3]);
    }
    const int32_t bad[R] = {0, 0, N + 1, 0};
    CHECK_FAILS(be->ops->evict_topk(be, idx, LD, s, LD, R, N, bad), CKV_STATUS_ERR_ARG, "top-38 of 37");
}

/* Kept rows idx [rows, n] of s [rows, n]: k[r] ascending indices of row r, each ranked below k[r] by
 * before(); the first wrong one and the count per row are printed. */
static void check_kept(const char *what, const float *s, const int32_t *idx, int rows, int n, const int32_t *k) {
    for (int r = 0; r < rows; r++) {
        int bad = 0, first = -1;
        for (int i = 0; i < k[r]; i++) {
            const int32_t j = idx[(size_t)r * n + i];
            const int ok = j >= 0 && j < n && (!i || j > idx[(size_t)r * n + i - 1]) && before(s + (size_t)r * n, n, j) < k[r];
            if (!ok && first < 0) first = i;
            bad += !ok;
        }
        CHECK_MSG(!bad, "topk %s row %d (k %d): %d of the kept indices wrong, first at %d", what, r, k[r], bad, first);
    }
}

/* Rows long enough for every byte of the selection's keys to matter: values that share their high
 * bytes, -0 beside +0, subnormals, NaNs and infinities, ties across the whole row; kept sets against the
 * tie rule's rank (before()). */
static void check_topk_long(ckv_backend *be) {
    enum { R = 3, N = 3001 };
    static float s[R * N];
    static int32_t idx[R * N];
    static const float pick[] = {1.0f, 1.0000001f, 1.0000002f, 0.99999994f, -0.0f, 0.0f, 1e-40f, -1e-40f,
                                 -1.0f, 3e38f, -3e38f, INFINITY, -INFINITY, NAN, 65536.0f, 65537.0f};
    for (int i = 0; i < R * N; i++) s[i] = pick[(int)(ckv_test_rng_double(&rng) * 16) & 15];
    for (int i = 0; i < N; i += 7) s[2 * N + i] = (float)ckv_test_rng_double(&rng); /* distinct values too */
    const int32_t k[R] = {1, 1900, N - 1}; /* 1900: inside the run of zeros, whose signs must tie */
    CHECK_OK(be->ops->evict_topk(be, idx, N, s, N, R, N, k));
    check_kept("long", s, idx, R, N, k);
    const int64_t total = 5600; /* inside the zeros as well */
    int32_t cnt[R], want[R] = {0};
    CHECK_OK(be->ops->evict_topk_counts(be, cnt, s, N, R, N, total));
    for (int i = 0; i < R * N; i++) want[i / N] += before(s, R * N, i) < total;
    CHECK_MSG(!memcmp(cnt, want, sizeof cnt), "topk_counts long: %d %d %d, want %d %d %d", cnt[0], cnt[1], cnt[2],
              want[0], want[1], want[2]);
}

/* Rows whose boundary bucket (the keys' top 11 bits) holds more keys than the per-row selection
 * keeps aside: 6,000 values within a few thousand ulps of 1 (pairs tied), and 6,000 equal values
 * with a few above and NaNs, so that the selection refines the bucket by its lower bits or takes
 * the first of one tied key; kept sets against before(), and the cross-head counts over all three
 * rows against the flat rank. */
static void check_topk_wide(ckv_backend *be) {
    enum { R = 3, N = 6000 };
    static float s[R * N];
    static int32_t idx[R * N];
    for (int i = 0; i < N; i++) {
        s[i] = nextafterf(1.0f, 2.0f) + (float)((i * 7919) % (N / 2)) * 1.1920929e-7f; /* pairs tied */
        s[N + i] = i % 997 == 5 ? 3.0f : i % 1499 == 7 ? NAN : 2.0f;
        s[2 * N + i] = 1.0f + (float)((i * 104729) % N) * 1.1920929e-7f * (i % 3 == 0 ? 1.0f : 8.0f);
    }
    const int32_t k[R] = {2500, 3001, 4801};
    CHECK_OK(be->ops->evict_topk(be, idx, N, s, N, R, N, k));
    check_kept("wide", s, idx, R, N, k);
    /* cross-head counts whose boundary falls among the tied 2.0s, the pairs near 1 or the NaNs */
    const int64_t totals[4] = {100, 5000, 9000, R * N - 3};
    for (int c = 0; c < 4; c++) {
        int32_t cnt[R], want[R] = {0};
        CHECK_OK(be->ops->evict_topk_counts(be, cnt, s, N, R, N, totals[c]));
        for (int i = 0; i < R * N; i++) want[i / N] += before(s, R * N, i) < totals[c];
        CHECK_MSG(!memcmp(cnt, want, sizeof cnt), "topk_counts wide, total %lld: %d %d %d, want %d %d %d",
                  (long long)totals[c], cnt[0], cnt[1], cnt[2], want[0], want[1], want[2]);
    }
}

/* Bit-for-bit equality of n floats (or doubles, dbl) from two thread counts: the first mismatches and
 * the largest difference are printed. */
static void same_bits(const char *what, int threads, const void *got, const void *want, size_t n, int dbl) {
    size_t bad = 0;
    double maxd = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double a = dbl ? ((const double *)got)[i] : ((const float *)got)[i];
        const double b = dbl ? ((const double *)want)[i] : ((const float *)want)[i];
        if (!memcmp((const char *)got + i * (dbl ? 8 : 4), (const char *)want + i * (dbl ? 8 : 4), dbl ? 8 : 4)) continue;
        if (bad++ < 3) fprintf(stderr, "  %s, %d threads: [%zu] = %.9g, 1 thread %.9g\n", what, threads, i, a, b);
        if (fabs(a - b) > maxd) maxd = fabs(a - b);
    }
    CHECK_MSG(bad == 0, "%s: %zu of %zu values differ between %d threads and 1 (max |diff| %.3g)", what, bad, n, threads,
              maxd);
}

/* The threaded eviction ops on 1 to 5 threads over a context of several value-norm blocks (4 and 5
 * threads split the window column sums' 6 x 20 rows inside query heads). */
static void check_thread_counts(ckv_dtype dt) {
    enum { L = 300, d = 16, nkv = 3, nq = 6, G = 2, w = 20, D = 24, K = 8, N_OUT = 6 };
    float *kf = malloc(sizeof(float) * nkv * L * d), *vf = malloc(sizeof(float) * nkv * L * d);
    float *q = malloc(sizeof(float) * w * nq * d), *wo = malloc(sizeof(float) * D * nq * d);
    float *phi = malloc(sizeof(float) * nkv * d * K), inv_freq[d / 2];
    ckv_test_fill(&rng, q, (size_t)w * nq * d, -1, 1);
    ckv_test_fill(&rng, wo, (size_t)D * nq * d, -0.5, 0.5);
    ckv_test_fill(&rng, phi, (size_t)nkv * d * K, -1, 1);
    for (int i = 0; i < d / 2; i++) inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)d);
    segset s;
    seg_random(&s, dt, nkv, L, d, kf, vf);
    ckv_weight W = {wo, CKV_DTYPE_F32, D, nq * d, (size_t)nq * d * sizeof(float)};
    /* per thread count: the outputs of every op, one after another */
    const size_t n_norm = (size_t)nkv * L, n_cs = (size_t)nq * L, n_csk = (size_t)nkv * L, n_p = (size_t)nq * w * L;
    const size_t n_f = N_OUT * n_norm + n_p; /* value norms, keydiff, lagkv x2, cur, leverage; probs */
    float *f[2] = {malloc(sizeof(float) * n_f), malloc(sizeof(float) * n_f)};
    double *c[2] = {malloc(sizeof(double) * (n_cs + n_csk + 2 * nkv)), malloc(sizeof(double) * (n_cs + n_csk + 2 * nkv))};
    const char *names[N_OUT] = {"value_norm", "keydiff", "lagkv", "lagkv cross", "cur", "leverage"};
    double *xc[2] = {malloc(sizeof(double) * (n_csk + (size_t)nq * d * (d + 1))),
                     malloc(sizeof(double) * (n_csk + (size_t)nq * d * (d + 1)))};
    float *xl[2] = {malloc(sizeof(float) * L), malloc(sizeof(float) * L)};
    double *dav[2] = {malloc(sizeof(double) * nkv * L), malloc(sizeof(double) * nkv * L)}, dbias[2];
    float *ddm[2] = {malloc(sizeof(float) * nkv * L), malloc(sizeof(float) * nkv * L)};
    const int threads[5] = {1, 2, 3, 4, 5};
    for (int ti = 0; ti < 5; ti++) {
        ckv_backend *be = NULL;
        CHECK_OK(ckv_backend_init(&be, "cpu", threads[ti]));
        if (!be) break;
        float *o = f[ti > 0];
        double *cs = c[ti > 0];
        poison(o, sizeof(float) * n_f);
        poison(cs, sizeof(double) * (n_cs + n_csk + 2 * nkv));
        be->ops->evict_fill(be, o, nkv, L, 0, L, CKV_EVICT_FILL_VALUE, 0.0f);
        CHECK_OK(be->ops->evict_value_norm(be, o, L, &s.b, L, &W, nq, 0, G));
        CHECK_OK(be->ops->evict_keydiff(be, o + n_norm, L, &s.b, L));
        CHECK_OK(be->ops->evict_lagkv(be, o + 2 * n_norm, L, &s.b, L, 4, 16, CKV_EVICT_LAGKV_RANK));
        CHECK_OK(be->ops->evict_lagkv(be, o + 3 * n_norm, L, &s.b, L, 4, 16, CKV_EVICT_LAGKV_CROSS));
        CHECK_OK(be->ops->evict_cur(be, o + 4 * n_norm, L, &s.b, L, 4, CKV_EVICT_CUR_PRODUCT, 16));
        CHECK_OK(be->ops->evict_leverage(be, o + 5 * n_norm, L, cs + n_cs + n_csk, &s.b, 0, L, inv_freq, 1.0f, phi, K));
        const ckv_evict_attn_params adiv = {q, w, L - w, &s.b, nq, 0, G, 4.0f, CKV_EVICT_LOGITS_DIV};
        const ckv_evict_attn_params amul = {q, w, L - w, &s.b, nq, 0, G, 0.25f, CKV_EVICT_LOGITS_MUL};
        CHECK_OK(be->ops->evict_attn_colsum(be, cs, L, &adiv, CKV_EVICT_PER_QUERY_HEAD, CKV_EVICT_ZERO_FIRST));
        CHECK_OK(be->ops->evict_attn_colsum(be, cs + n_cs, L, &amul, CKV_EVICT_PER_KV_HEAD, CKV_EVICT_ZERO_FIRST));
        CHECK_OK(be->ops->evict_attn_probs(be, o + N_OUT * n_norm, L, &adiv));
        /* chunk column sums (a chunk of w keys, 3 padding queries), moments of the w queries, EA logits */
        double *ex = xc[ti > 0];
        float *lg = xl[ti > 0];
        const ckv_evict_attn_params achunk = {q, w, L - w, &s.b, nq, 0, G, 0.25f, CKV_EVICT_LOGITS_MUL};
        CHECK_OK(be->ops->evict_chunk_colsum(be, ex, L, &achunk, 3, CKV_EVICT_ZERO_FIRST));
        CHECK_OK(be->ops->evict_moments(be, ex + n_csk, ex + n_csk + nq * d, q, q + nq * d, w, nq, d,
                                        CKV_EVICT_ZERO_FIRST));
        CHECK_OK(be->ops->evict_ea_logits(be, lg, &s.b, 1, 2, L - 2, q, wo, 4.0f)); /* cov: d x d of wo */
        const ckv_evict_defensive_params dp = {o + N_OUT * n_norm, L, w, L - w, nq, 0, G, 5, nkv,
                                               dav[ti > 0], ddm[ti > 0], &dbias[ti > 0], CKV_EVICT_ZERO_FIRST};
        CHECK_OK(be->ops->evict_defensive_rows(be, &dp));
        if (ti > 0) {
            same_bits("defensive_rows mean", threads[ti], dav[1], dav[0], (size_t)nkv * (L - w), 1);
            same_bits("defensive_rows max", threads[ti], ddm[1], ddm[0], (size_t)nkv * (L - w), 0);
            same_bits("defensive_rows bias", threads[ti], &dbias[1], &dbias[0], 1, 1);
            same_bits("chunk_colsum", threads[ti], xc[1], xc[0], n_csk, 1);
            same_bits("moments", threads[ti], xc[1] + n_csk, xc[0] + n_csk, (size_t)nq * d * (d + 1), 1);
            same_bits("ea_logits", threads[ti], xl[1], xl[0], L - 2, 0);
            char what[96];
            for (int k = 0; k < N_OUT; k++) {
                snprintf(what, sizeof what, "%s (%s)", names[k], ckv_dtype_name(dt));
                same_bits(what, threads[ti], f[1] + k * n_norm, f[0] + k * n_norm, n_norm, 0);
            }
            snprintf(what, sizeof what, "attn_probs (%s)", ckv_dtype_name(dt));
            same_bits(what, threads[ti], f[1] + N_OUT * n_norm, f[0] + N_OUT * n_norm, n_p, 0);
            snprintf(what, sizeof what, "attn_colsum per query head (%s)", ckv_dtype_name(dt));
            same_bits(what, threads[ti], c[1], c[0], n_cs, 1);
            snprintf(what, sizeof what, "attn_colsum per KV head (%s)", ckv_dtype_name(dt));
            same_bits(what, threads[ti], c[1] + n_cs, c[0] + n_cs, n_csk, 1);
            snprintf(what, sizeof what, "leverage statistics (%s)", ckv_dtype_name(dt));
            same_bits(what, threads[ti], c[1] + n_cs + n_csk, c[0] + n_cs + n_csk, 2 * nkv, 1);
        }
        ckv_backend_free(be);
    }
    seg_free(&s);
    free(kf), free(vf), free(q), free(wo), free(phi), free(f[0]), free(f[1]), free(c[0]), free(c[1]);
    free(xc[0]), free(xc[1]), free(xl[0]), free(xl[1]), free(dav[0]), free(dav[1]), free(ddm[0]), free(ddm[1]);
}

/* Leverage of a head whose positions differ from segment 0's (the op shares segment 0's rotary angles
 * with the heads at its positions): the same bits as the head scored alone. */
static void check_leverage_positions(ckv_backend *be) {
    enum { L = 200, d = 16, nkv = 3, K = 8 };
    float *kf = malloc(sizeof(float) * nkv * L * d), *vf = malloc(sizeof(float) * nkv * L * d);
    float *phi = malloc(sizeof(float) * nkv * d * K), inv_freq[d / 2], all[nkv * L], one[L];
    double st_all[2 * nkv], st_one[2];
    ckv_test_fill(&rng, phi, (size_t)nkv * d * K, -1, 1);
    for (int i = 0; i < d / 2; i++) inv_freq[i] = powf(10000.0f, -2.0f * (float)i / (float)d);
    segset s;
    seg_random(&s, CKV_DTYPE_F32, nkv, L, d, kf, vf);
    for (int t = 0; t < L; t++) s.pos[L + t] = t % 3 ? 2 * t + 5 : t; /* head 1: every third row at head 0's */
    CHECK_OK(be->ops->evict_leverage(be, all, L, st_all, &s.b, 0, L, inv_freq, 1.0f, phi, K));
    ckv_kv_seg *alone[1] = {&s.segs[1]};
    ckv_kv_batch b1 = s.b;
    b1.n_kv_heads = 1;
    b1.segs = alone;
    CHECK_OK(be->ops->evict_leverage(be, one, L, st_one, &b1, 0, L, inv_freq, 1.0f, phi + d * K, K));
    int bad = 0;
    for (int t = 0; t < L; t++)
        if (memcmp(&all[L + t], &one[t], sizeof one[t]) && bad++ < 3)
            fprintf(stderr, "  leverage, head 1 of 3 [%d] = %.9g, alone %.9g\n", t, all[L + t], one[t]);
    CHECK_MSG(bad == 0 && !memcmp(&st_all[2], st_one, sizeof st_one),
              "leverage of a head at its own positions: %d of %d scores differ from the head scored alone", bad, L);
    seg_free(&s);
    free(kf), free(vf), free(phi);
}

int main(void) {
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 2));
    if (!be) return ckv_test_finish("test_evict_ops");
    const ckv_dtype dts[3] = {CKV_DTYPE_F32, CKV_DTYPE_F16, CKV_DTYPE_BF16};
    for (int i = 0; i < 3; i++) check_attention(be, dts[i]);
    check_rows(be);
    check_topk(be);
    check_topk_long(be);
    check_topk_wide(be);
    check_thread_counts(CKV_DTYPE_F32);
    check_thread_counts(CKV_DTYPE_BF16);
    check_leverage_positions(be);
    fprintf(stderr, "worst |diff| over all comparisons: %.3g\n", worst);
    ckv_backend_free(be);
    return ckv_test_finish("test_evict_ops");
}
