/* test_evict_scorers.c - every scorer of src/evict against a naive double-precision reimplementation
 * written here from the formulas of docs/spec-eviction.md (snapkv avg/max/no pooling, tova, knorm,
 * streaming_llm, observed_attention on the full L x L matrix, expected_attention with an explicit
 * averaged RoPE matrix, CriticalKV's value norm on the full [L, D] product), on random small inputs
 * with G = 1, 2, 3; tensor-parallel splits (query heads split, KV heads replicated over a replica
 * group) against the tp = 1 result through a recording communicator; random's independence of the
 * split; pyramidkv's schedule against values computed with kvpress's own function; the errors
 * (L <= window, even kernel, n_sink >= L); and that scratch memory is returned. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "evict/press.h"
#include "evict/scorer.h"
#include "common/rank_view.h"

/* ---- random inputs --------------------------------------------------------------------------- */

static uint64_t rng_state = 0x1234567887654321ull;

static ckv_press_config press(ckv_scorer_kind kind) {
    ckv_press_config c;
    memset(&c, 0, sizeof c);
    c.scorer = kind;
    c.window = 64, c.kernel = 5, c.pool = CKV_POOL_AVG, c.n_sink = 4, c.n_future = 512;
    c.use_covariance = 1, c.use_vnorm = 1, c.epsilon_ea = 0.0, c.seed = 42;
    c.alpha = 0.5, c.eps = 1e-4, c.safeguard = 0.2, c.compression_ratio = 0.5;
    return c;
}

/* ---- naive references (double) --------------------------------------------------------------- */

static int group_of(const ckv_test_prob *p) { return p->H / p->Hkv; }

/* query of token t, head h: xn[t] @ wq_h^T + bq_h, optionally RoPE at pos[t] */
static void naive_q(const ckv_test_prob *p, int t, int h, int rope, double *q) {
    const int d = p->d, hf = d / 2;
    for (int a = 0; a < d; a++) {
        double s = p->bq[h * d + a];
        for (int c = 0; c < p->D; c++) s += (double)p->xn[(size_t)t * p->D + c] * p->wq[((size_t)h * d + a) * p->D + c];
        q[a] = s;
    }
    if (!rope) return;
    for (int i = 0; i < hf; i++) {
        float angle = (float)p->pos[t] * p->inv_freq[i];
        double c = cos((double)angle) * p->rope_scale, s = sin((double)angle) * p->rope_scale;
        double x1 = q[i], x2 = q[i + hf];
        q[i] = x1 * c - x2 * s;
        q[i + hf] = x2 * c + x1 * s;
    }
}

static const float *key(const ckv_test_prob *p, int g, int t) { return p->k + ((size_t)g * p->L + t) * p->d; }
static const float *val(const ckv_test_prob *p, int g, int t) { return p->v + ((size_t)g * p->L + t) * p->d; }

/* softmax of query q (head h) over keys 0 .. n-1 of its KV head, logits times `scale` */
static void naive_softmax(const ckv_test_prob *p, const double *q, int g, int n, double scale, double *w) {
    double m = -INFINITY, s = 0.0;
    for (int t = 0; t < n; t++) {
        const float *k = key(p, g, t);
        double x = 0.0;
        for (int a = 0; a < p->d; a++) x += q[a] * k[a];
        w[t] = x * scale;
        m = w[t] > m ? w[t] : m;
    }
    for (int t = 0; t < n; t++) s += (w[t] = exp(w[t] - m));
    for (int t = 0; t < n; t++) w[t] /= s;
}

/* snapkv (all_heads = 0) or tova-like mean over all heads (all_heads = 1): out [Hkv, L], entries
 * L-w .. L-1 zero */
static void naive_window(const ckv_test_prob *p, int w, int kernel, ckv_pool_kind pool, int all_heads, double *out) {
    const int L = p->L, n = L - w, G = group_of(p), r = kernel / 2;
    double *q = malloc(sizeof(double) * p->d), *wt = malloc(sizeof(double) * L);
    double *mean = malloc(sizeof(double) * L), *pooled = malloc(sizeof(double) * L);
    memset(out, 0, sizeof(double) * (size_t)p->Hkv * L);
    for (int h = 0; h < p->H; h++) {
        const int g = h / G;
        for (int t = 0; t < n; t++) mean[t] = 0.0;
        for (int i = 0; i < w; i++) {
            naive_q(p, L - w + i, h, 1, q);
            naive_softmax(p, q, g, L - w + i + 1, 1.0 / sqrt((double)p->d), wt);
            for (int t = 0; t < n; t++) mean[t] += wt[t] / w;
        }
        for (int t = 0; t < n; t++) {
            double acc = pool == CKV_POOL_MAX ? -INFINITY : 0.0;
            for (int u = t - r; u <= t + r; u++) {
                if (u < 0 || u >= n) continue;
                if (pool == CKV_POOL_MAX)
                    acc = mean[u] > acc ? mean[u] : acc;
                else
                    acc += mean[u];
            }
            pooled[t] = pool == CKV_POOL_MAX ? acc : acc / kernel;
        }
        for (int gg = 0; gg < p->Hkv; gg++) {
            if (!all_heads && gg != g) continue;
            for (int t = 0; t < n; t++) out[(size_t)gg * L + t] += pooled[t] / (all_heads ? p->H : G);
        }
    }
    free(q), free(wt), free(mean), free(pooled);
}

/* observed attention from the full causal L x L attention matrix of every head */
static void naive_observed(const ckv_test_prob *p, double *out) {
    const int L = p->L, G = group_of(p);
    double *A = malloc(sizeof(double) * (size_t)L * L), *q = malloc(sizeof(double) * p->d);
    memset(out, 0, sizeof(double) * (size_t)p->Hkv * L);
    for (int h = 0; h < p->H; h++) {
        const int g = h / G;
        memset(A, 0, sizeof(double) * (size_t)L * L);
        for (int i = 0; i < L; i++) {
            naive_q(p, i, h, 1, q);
            naive_softmax(p, q, g, i + 1, 1.0 / sqrt((double)p->d), A + (size_t)i * L);
        }
        for (int t = 0; t < L; t++) {
            double s = 0.0;
            for (int i = 0; i < L; i++) s += A[(size_t)i * L + t];
            out[(size_t)g * L + t] += s / (L - t) / G;
        }
    }
    free(A), free(q);
}

/* expected attention with the averaged rotation built as an explicit d x d matrix */
static void naive_expected(const ckv_test_prob *p, const ckv_press_config *c, double *out) {
    const int L = p->L, d = p->d, hf = d / 2, G = group_of(p), ns = c->n_sink, n = L - ns;
    double *Q = malloc(sizeof(double) * (size_t)n * d), *mu = malloc(sizeof(double) * d);
    double *cov = malloc(sizeof(double) * d * d), *R = malloc(sizeof(double) * d * d);
    double *tmp = malloc(sizeof(double) * d * d), *mur = malloc(sizeof(double) * d);
    double *covr = malloc(sizeof(double) * d * d), *lg = malloc(sizeof(double) * n);
    double *cb = malloc(sizeof(double) * d), *sb = malloc(sizeof(double) * d);
    /* R = mean over p of cos_p * I + sin_p * P (cos/sin duplicated over both halves, as emb = cat(freqs, freqs)) */
    for (int j = 0; j < d; j++) {
        double cs = 0.0, sn = 0.0;
        for (int f = 0; f < c->n_future; f++) {
            float angle = (float)(L + f) * p->inv_freq[j % hf];
            cs += cos((double)angle) * p->rope_scale;
            sn += sin((double)angle) * p->rope_scale;
        }
        cb[j] = cs / c->n_future, sb[j] = sn / c->n_future;
    }
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) {
            double P = (i >= hf && j == i - hf) ? 1.0 : (i < hf && j == i + hf) ? -1.0 : 0.0;
            R[i * d + j] = (i == j ? cb[j] : 0.0) + sb[j] * P;
        }
    memset(out, 0, sizeof(double) * (size_t)p->Hkv * L);
    for (int h = 0; h < p->H; h++) {
        const int g = h / G;
        for (int t = 0; t < n; t++) naive_q(p, ns + t, h, 0, Q + (size_t)t * d);
        for (int a = 0; a < d; a++) {
            double s = 0.0;
            for (int t = 0; t < n; t++) s += Q[(size_t)t * d + a];
            mu[a] = s / n;
        }
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++) {
                double s = 0.0;
                for (int t = 0; t < n; t++) s += (Q[(size_t)t * d + a] - mu[a]) * (Q[(size_t)t * d + b] - mu[b]);
                cov[a * d + b] = s / n;
            }
        for (int a = 0; a < d; a++) {
            double s = 0.0;
            for (int b = 0; b < d; b++) s += R[a * d + b] * mu[b];
            mur[a] = s;
        }
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++) {
                double s = 0.0;
                for (int e = 0; e < d; e++) s += R[a * d + e] * cov[e * d + b];
                tmp[a * d + b] = s;
            }
        for (int a = 0; a < d; a++)
            for (int b = 0; b < d; b++) {
                double s = 0.0;
                for (int e = 0; e < d; e++) s += tmp[a * d + e] * R[b * d + e];
                covr[a * d + b] = s;
            }
        double m = -INFINITY, sum = 0.0;
        for (int t = 0; t < n; t++) {
            const float *k = key(p, g, ns + t);
            double x = 0.0, y = 0.0;
            for (int a = 0; a < d; a++) x += mur[a] * k[a];
            x /= sqrt((double)d);
            if (c->use_covariance) {
                for (int a = 0; a < d; a++)
                    for (int b = 0; b < d; b++) y += k[a] * covr[a * d + b] * k[b];
                x += y / d / 2.0;
            }
            lg[t] = x;
            m = x > m ? x : m;
        }
        for (int t = 0; t < n; t++) sum += (lg[t] = exp(lg[t] - m));
        for (int t = 0; t < n; t++) out[(size_t)g * L + ns + t] += lg[t] / sum / G;
    }
    if (c->use_vnorm)
        for (int g = 0; g < p->Hkv; g++)
            for (int t = ns; t < L; t++) {
                const float *v = val(p, g, t);
                double s = 0.0;
                for (int a = 0; a < d; a++) s += (double)v[a] * v[a];
                out[(size_t)g * L + t] = (out[(size_t)g * L + t] + c->epsilon_ea) * sqrt(s);
            }
    free(Q), free(mu), free(cov), free(R), free(tmp), free(mur), free(covr), free(lg), free(cb), free(sb);
}

/* CriticalKV value norm from the full [L, D] product per head */
static void naive_critical(const ckv_test_prob *p, double *out) {
    const int L = p->L, d = p->d, D = p->D, G = group_of(p);
    double *VW = malloc(sizeof(double) * (size_t)L * D);
    memset(out, 0, sizeof(double) * (size_t)p->Hkv * L);
    for (int h = 0; h < p->H; h++) {
        const int g = h / G;
        for (int t = 0; t < L; t++)
            for (int c = 0; c < D; c++) {
                double s = 0.0;
                for (int a = 0; a < d; a++) s += (double)val(p, g, t)[a] * p->wo[(size_t)c * p->H * d + (size_t)h * d + a];
                VW[(size_t)t * D + c] = s;
            }
        for (int t = 0; t < L; t++) {
            double s = 0.0;
            for (int c = 0; c < D; c++) s += fabs(VW[(size_t)t * D + c]);
            out[(size_t)g * L + t] += s / G;
        }
    }
    free(VW);
}

/* ---- comparison helpers ---------------------------------------------------------------------- */

/* Compares columns [lo, hi) of every head's row of got [Hkv, L] with ref. */
static double compare_rows(const char *what, const float *got, const double *ref, int Hkv, int L, int lo, int hi,
                           double atol, double rtol) {
    const int n = hi - lo;
    float *g = malloc(sizeof(float) * (size_t)Hkv * n), *r = malloc(sizeof(float) * (size_t)Hkv * n);
    for (int h = 0; h < Hkv; h++)
        for (int t = 0; t < n; t++) {
            g[h * n + t] = got[(size_t)h * L + lo + t];
            r[h * n + t] = (float)ref[(size_t)h * L + lo + t];
        }
    double e = ckv_test_allclose(what, g, r, (size_t)Hkv * n, atol, rtol);
    free(g), free(r);
    return e;
}

static double worst_err = 0.0;
static void note(double e) { worst_err = e > worst_err ? e : worst_err; }

/* ---- recording communicator: emulates an all-reduce over ranks run one after another --------- */

#define MOCK_MAX 8
typedef struct {
    int phase;            /* 0: record each rank's buffer, 1: return the sum of the recorded buffers */
    float *rec[MOCK_MAX]; // [n] per rank
    size_t n;
    int calls[MOCK_MAX];
    int size;
} mock_ctx;

static ckv_status mock_allreduce(ckv_comm *c, float *buf, size_t n, ckv_comm_op op) {
    mock_ctx *m = c->ctx;
    if (op != CKV_COMM_OP_SUM) return ckv_error(CKV_STATUS_ERR_COMM, "mock: only sum");
    m->calls[c->rank]++;
    if (m->phase == 0) {
        free(m->rec[c->rank]);
        m->rec[c->rank] = malloc(sizeof(float) * n);
        memcpy(m->rec[c->rank], buf, sizeof(float) * n);
        m->n = n;
    } else {
        if (n != m->n) return ckv_error(CKV_STATUS_ERR_COMM, "mock: size %zu, recorded %zu", n, m->n);
        for (size_t i = 0; i < n; i++) {
            double s = 0.0;
            for (int r = 0; r < m->size; r++) s += m->rec[r][i];
            buf[i] = (float)s;
        }
    }
    return CKV_STATUS_OK;
}

static const ckv_comm_ops mock_ops = {.allreduce_f32 = mock_allreduce};

static void mock_free(mock_ctx *m) {
    for (int r = 0; r < MOCK_MAX; r++) free(m->rec[r]);
    memset(m, 0, sizeof *m);
}

/* which scorer a tp check runs */
typedef enum { TP_SNAPKV, TP_TOVA, TP_OBSERVED, TP_EXPECTED, TP_CRITICAL } tp_kind;

static ckv_status tp_run(tp_kind k, const ckv_score_inputs *in, const ckv_press_config *c, float *out) {
    ckv_score_info info;
    switch (k) {
    case TP_CRITICAL: return ckv_critical_value_norm(in, out);
    default: return ckv_score_layer(in, c, out, &info);
    }
}

/* Splits the heads over `tp` ranks like the sharding does (query heads evenly; KV heads split when
 * tp <= Hkv, else replicated over tp / Hkv ranks) and checks each rank's rows equal the tp = 1 rows. */
static void check_tp(const ckv_test_prob *p, ckv_backend *be, tp_kind k, const ckv_press_config *c, int tp,
                     const float *full, const char *what) {
    const int L = p->L, nq = p->H / tp;
    const int nkv = tp <= p->Hkv ? p->Hkv / tp : 1, reps = tp <= p->Hkv ? 1 : tp / p->Hkv;
    mock_ctx rep_ctx[MOCK_MAX], tp_ctx;
    memset(rep_ctx, 0, sizeof rep_ctx);
    memset(&tp_ctx, 0, sizeof tp_ctx);
    tp_ctx.size = tp;
    ckv_comm tpc[MOCK_MAX], repc[MOCK_MAX];
    float *out[MOCK_MAX];
    for (int r = 0; r < tp; r++) out[r] = malloc(sizeof(float) * (size_t)nkv * L);
    for (int phase = 0; phase < 2; phase++) {
        tp_ctx.phase = phase;
        for (int g = 0; g < MOCK_MAX; g++) rep_ctx[g].phase = phase, rep_ctx[g].size = reps;
        for (int r = 0; r < tp; r++) {
            const int kv0 = tp <= p->Hkv ? r * nkv : r / reps, rep_group = kv0, rep_rank = r % reps;
            tpc[r] = (ckv_comm){.ops = &mock_ops, .ctx = &tp_ctx, .rank = r, .size = tp, .kind = "mock"};
            repc[r] = (ckv_comm){.ops = &mock_ops, .ctx = &rep_ctx[rep_group], .rank = rep_rank, .size = reps, .kind = "mock"};
            ckv_test_rank_view v;
            ckv_test_view_make(&v, p, be, r * nq, nq, kv0, nkv, reps > 1 ? &repc[r] : NULL, &tpc[r]);
            CHECK_OK(tp_run(k, &v.in, c, out[r]));
            ckv_test_view_free(&v);
        }
    }
    char name[128];
    for (int r = 0; r < tp; r++) {
        const int kv0 = tp <= p->Hkv ? r * nkv : r / reps;
        snprintf(name, sizeof name, "%s tp %d rank %d", what, tp, r);
        note(ckv_test_allclose(name, out[r], full + (size_t)kv0 * L, (size_t)nkv * L, 1e-7, 1e-5));
        free(out[r]);
    }
    /* exactly one reduction per rank per phase over the right communicator */
    for (int r = 0; r < tp; r++) {
        const int kv0 = tp <= p->Hkv ? r * nkv : r / reps;
        int rep_calls = rep_ctx[kv0].calls[r % reps], tp_calls = tp_ctx.calls[r];
        if (k == TP_TOVA)
            CHECK_MSG(tp_calls == 2 && rep_calls == 0, "%s rank %d: %d tp / %d replica reductions", what, r, tp_calls,
                      rep_calls);
        else
            CHECK_MSG(tp_calls == 0 && rep_calls == (reps > 1 ? 2 : 0), "%s rank %d: %d tp / %d replica reductions",
                      what, r, tp_calls, rep_calls);
    }
    for (int g = 0; g < MOCK_MAX; g++) mock_free(&rep_ctx[g]);
    mock_free(&tp_ctx);
}

/* ---- the checks ------------------------------------------------------------------------------ */

typedef struct {
    int L, D, d, H, Hkv, w;
    float rope_scale;
} shape;

static void check_shape(ckv_backend *be, const shape *s) {
    ckv_test_prob p = ckv_test_prob_make(s->L, s->D, s->d, s->H, s->Hkv, s->rope_scale, 1.0, &rng_state);
    const int L = p.L, Hkv = p.Hkv;
    char name[160];
    fprintf(stderr, "-- L %d, D %d, d %d, H %d, Hkv %d (G %d), window %d, rope_scale %g\n", L, p.D, p.d, p.H, Hkv,
            p.H / Hkv, s->w, (double)s->rope_scale);
    ckv_test_rank_view v;
    ckv_test_view_make(&v, &p, be, 0, p.H, 0, Hkv, NULL, NULL);
    float *got = malloc(sizeof(float) * (size_t)Hkv * L);
    double *ref = malloc(sizeof(double) * (size_t)Hkv * L);
    ckv_score_info info;

    /* snapkv: avg 5 (kvpress), max 7 (paper), no pooling */
    const int kernels[3] = {5, 7, 1};
    const ckv_pool_kind pools[3] = {CKV_POOL_AVG, CKV_POOL_MAX, CKV_POOL_AVG};
    for (int i = 0; i < 3; i++) {
        ckv_press_config c = press(CKV_SCORER_SNAPKV);
        c.window = s->w, c.kernel = kernels[i], c.pool = pools[i];
        CHECK_OK(ckv_score_layer(&v.in, &c, got, &info));
        CHECK(info.protect_tail == s->w && info.protect_head == 0);
        naive_window(&p, s->w, kernels[i], pools[i], 0, ref);
        snprintf(name, sizeof name, "snapkv %s k%d", pools[i] == CKV_POOL_MAX ? "max" : "avg", kernels[i]);
        note(compare_rows(name, got, ref, Hkv, L, 0, L - s->w, 1e-8, 2e-5));
        for (int g = 0; g < Hkv; g++)
            for (int t = L - s->w; t < L; t++) CHECK(isfinite(got[(size_t)g * L + t]));
        if (i == 0) {
            check_tp(&p, be, TP_SNAPKV, &c, p.H, got, "snapkv");
            if (p.Hkv > 1) check_tp(&p, be, TP_SNAPKV, &c, p.Hkv, got, "snapkv");
            /* pyramidkv scores are snapkv's */
            ckv_press_config cp = c;
            cp.scorer = CKV_SCORER_PYRAMIDKV;
            float *got2 = malloc(sizeof(float) * (size_t)Hkv * L);
            CHECK_OK(ckv_score_layer(&v.in, &cp, got2, &info));
            CHECK(info.protect_tail == s->w);
            CHECK(memcmp(got, got2, sizeof(float) * (size_t)Hkv * L) == 0);
            free(got2);
        }
    }

    /* tova */
    {
        ckv_press_config c = press(CKV_SCORER_TOVA);
        CHECK_OK(ckv_score_layer(&v.in, &c, got, &info));
        CHECK(info.protect_tail == 1 && info.protect_head == 0);
        naive_window(&p, 1, 1, CKV_POOL_AVG, 1, ref);
        note(compare_rows("tova", got, ref, Hkv, L, 0, L - 1, 1e-8, 2e-5));
        for (int g = 1; g < Hkv; g++) CHECK(memcmp(got, got + (size_t)g * L, sizeof(float) * (size_t)L) == 0);
        check_tp(&p, be, TP_TOVA, &c, p.H, got, "tova");
    }

    /* knorm */
    {
        ckv_press_config c = press(CKV_SCORER_KNORM);
        CHECK_OK(ckv_score_layer(&v.in, &c, got, &info));
        CHECK(info.protect_tail == 0 && info.protect_head == 0);
        for (int g = 0; g < Hkv; g++)
            for (int t = 0; t < L; t++) {
                double ss = 0.0;
                for (int a = 0; a < p.d; a++) ss += (double)key(&p, g, t)[a] * key(&p, g, t)[a];
                ref[(size_t)g * L + t] = -sqrt(ss);
            }
        note(compare_rows("knorm", got, ref, Hkv, L, 0, L, 0.0, 1e-6));
    }

    /* observed attention: blockwise against the full L x L matrix */
    {
        ckv_press_config c = press(CKV_SCORER_OBSERVED_ATTENTION);
        CHECK_OK(ckv_score_layer(&v.in, &c, got, &info));
        CHECK(info.protect_tail == 0 && info.protect_head == 0);
        naive_observed(&p, ref);
        note(compare_rows("observed_attention", got, ref, Hkv, L, 0, L, 1e-8, 2e-5));
        check_tp(&p, be, TP_OBSERVED, &c, p.H, got, "observed_attention");
    }

    /* expected attention: defaults, then without covariance / vnorm, small n_future, epsilon */
    for (int variant = 0; variant < 3; variant++) {
        ckv_press_config c = press(CKV_SCORER_EXPECTED_ATTENTION);
        if (variant == 1) c.use_covariance = 0, c.use_vnorm = 0, c.n_future = 7, c.n_sink = 0;
        if (variant == 2) c.n_future = 33, c.n_sink = 2, c.epsilon_ea = 0.01;
        CHECK_OK(ckv_score_layer(&v.in, &c, got, &info));
        CHECK(info.protect_head == c.n_sink && info.protect_tail == 0);
        naive_expected(&p, &c, ref);
        snprintf(name, sizeof name, "expected_attention cov %d vnorm %d n_future %d n_sink %d eps %g", c.use_covariance,
                 c.use_vnorm, c.n_future, c.n_sink, c.epsilon_ea);
        note(compare_rows(name, got, ref, Hkv, L, c.n_sink, L, 1e-8, 5e-5));
        if (variant == 0) check_tp(&p, be, TP_EXPECTED, &c, p.H, got, "expected_attention");
    }

    /* CriticalKV value norm against the full [L, D] product */
    {
        CHECK_OK(ckv_critical_value_norm(&v.in, got));
        naive_critical(&p, ref);
        note(compare_rows("critical value norm", got, ref, Hkv, L, 0, L, 1e-6, 1e-5));
        check_tp(&p, be, TP_CRITICAL, NULL, p.H, got, "critical value norm");
        if (p.Hkv > 1) check_tp(&p, be, TP_CRITICAL, NULL, p.Hkv, got, "critical value norm");
    }

    /* streaming_llm: index scores; with the sinks protected a top-k keeps sinks + the most recent */
    {
        ckv_press_config c = press(CKV_SCORER_STREAMING_LLM);
        CHECK_OK(ckv_score_layer(&v.in, &c, got, &info));
        CHECK(info.protect_head == 4 && info.protect_tail == 0);
        int ok = 1;
        for (int g = 0; g < Hkv; g++)
            for (int t = 0; t < L; t++) ok &= got[(size_t)g * L + t] == (float)t;
        CHECK_MSG(ok, "streaming_llm scores are not the token indices");
        /* kvpress: n_pruned = L - int(L * (1 - cr)) tokens after the sinks are removed */
        const double cr = 0.7;
        const int n_kept = (int)(L * (1 - cr)), n_pruned = L - n_kept;
        float *row = malloc(sizeof(float) * (size_t)L);
        memcpy(row, got, sizeof(float) * (size_t)L);
        float mx = -INFINITY;
        for (int t = 0; t < L; t++) mx = row[t] > mx ? row[t] : mx;
        for (int t = 0; t < info.protect_head; t++) row[t] = mx + 1.0f;
        /* the n_kept-th largest score (distinct values) must separate kept and pruned as kvpress does */
        for (int t = 0; t < L; t++) {
            int rank = 0;
            for (int u = 0; u < L; u++) rank += row[u] > row[t] || (row[u] == row[t] && u < t);
            int kept = rank < n_kept, kv_kept = !(t >= 4 && t < 4 + n_pruned);
            CHECK_MSG(kept == kv_kept, "streaming_llm token %d: kept %d, kvpress keeps %d", t, kept, kv_kept);
        }
        free(row);
    }

    /* random: in [0, 1), deterministic, independent of the head split, seed- and layer-dependent */
    {
        ckv_press_config c = press(CKV_SCORER_RANDOM);
        CHECK_OK(ckv_score_layer(&v.in, &c, got, &info));
        int in_range = 1;
        for (size_t i = 0; i < (size_t)Hkv * L; i++) in_range &= got[i] >= 0.0f && got[i] < 1.0f;
        CHECK_MSG(in_range, "random scores outside [0, 1)");
        float *other = malloc(sizeof(float) * (size_t)Hkv * L); /* [Hkv, L] */
        for (int g = 0; g < Hkv; g++) {
            ckv_test_rank_view v1;
            ckv_test_view_make(&v1, &p, be, g * (p.H / Hkv), p.H / Hkv, g, 1, NULL, NULL);
            CHECK_OK(ckv_score_layer(&v1.in, &c, other, &info));
            CHECK_MSG(memcmp(other, got + (size_t)g * L, sizeof(float) * (size_t)L) == 0,
                      "random scores of KV head %d depend on the split", g);
            ckv_test_view_free(&v1);
        }
        if (Hkv > 1) CHECK(memcmp(got, got + L, sizeof(float) * (size_t)L) != 0);
        c.seed = 43;
        CHECK_OK(ckv_score_layer(&v.in, &c, other, &info)); /* head 0 compared */
        CHECK(memcmp(other, got, sizeof(float) * (size_t)L) != 0);
        c.seed = 42;
        v.in.layer = 4;
        CHECK_OK(ckv_score_layer(&v.in, &c, other, &info));
        CHECK(memcmp(other, got, sizeof(float) * (size_t)L) != 0);
        v.in.layer = 3;
        double mean = 0.0;
        for (size_t i = 0; i < (size_t)Hkv * L; i++) mean += got[i];
        mean /= (double)Hkv * L;
        CHECK_MSG(fabs(mean - 0.5) < 0.1, "random scores mean %g", mean);
        free(other);
    }

    free(got), free(ref);
    ckv_test_view_free(&v);
    ckv_test_prob_free(&p);
}

static void check_errors(ckv_backend *be) {
    ckv_test_prob p = ckv_test_prob_make(50, 16, 8, 4, 2, 1.0f, 1.0, &rng_state);
    ckv_test_rank_view v;
    ckv_test_view_make(&v, &p, be, 0, 4, 0, 2, NULL, NULL);
    float *got = malloc(sizeof(float) * 2 * 50);
    ckv_score_info info;
    ckv_press_config c = press(CKV_SCORER_SNAPKV); /* window 64 > L 50 */
    CHECK_FAILS(ckv_score_layer(&v.in, &c, got, &info), CKV_STATUS_ERR_ARG,
                "window 64 needs a context longer than 64 tokens, got 50");
    c.window = 50; /* L == window is refused too */
    CHECK_FAILS(ckv_score_layer(&v.in, &c, got, &info), CKV_STATUS_ERR_ARG,
                "window 50 needs a context longer than 50 tokens, got 50");
    c.scorer = CKV_SCORER_PYRAMIDKV;
    CHECK_FAILS(ckv_score_layer(&v.in, &c, got, &info), CKV_STATUS_ERR_ARG, "window 50");
    c.scorer = CKV_SCORER_SNAPKV, c.window = 8, c.kernel = 4;
    CHECK_FAILS(ckv_score_layer(&v.in, &c, got, &info), CKV_STATUS_ERR_ARG, "kernel 4");
    c = press(CKV_SCORER_STREAMING_LLM);
    c.n_sink = 50;
    CHECK_FAILS(ckv_score_layer(&v.in, &c, got, &info), CKV_STATUS_ERR_ARG, "n_sink 50");
    c = press(CKV_SCORER_EXPECTED_ATTENTION);
    c.n_sink = 60;
    CHECK_FAILS(ckv_score_layer(&v.in, &c, got, &info), CKV_STATUS_ERR_ARG, "n_sink 60");
    c = press(CKV_SCORER_NONE);
    CHECK_FAILS(ckv_score_layer(&v.in, &c, got, &info), CKV_STATUS_ERR_ARG, "none");
    /* a query head outside the local KV heads */
    c = press(CKV_SCORER_KNORM);
    v.in.n_kv_local = 1, v.in.kv.n_kv_heads = 1;
    CHECK_FAILS(ckv_score_layer(&v.in, &c, got, &info), CKV_STATUS_ERR_SHAPE, "query head 2");
    free(got);
    ckv_test_view_free(&v);
    ckv_test_prob_free(&p);
}

/* kvpress PyramidKVPress.get_layer_budget, values computed with kvpress 0.5.5 itself:
 *   python -c "from types import SimpleNamespace as NS; from kvpress import PyramidKVPress as P;
 *     f=lambda l,n,L,cr,w=64,b=20: P(compression_ratio=cr,window_size=w,beta=b).get_layer_budget(
 *       NS(config=NS(num_hidden_layers=n),layer_idx=l),L); print(f(0,24,1000,0.5))"  */
static void check_pyramid(void) {
    static const struct {
        int layer, n_layers, L;
        double cr;
        int window;
        double beta;
        int want;
    } cases[] = {
        {0, 24, 1000, 0.5, 64, 20, 936},       {12, 24, 1000, 0.5, 64, 20, 481},
        {23, 24, 1000, 0.5, 64, 20, 64},       {0, 28, 4096, 0.8, 64, 20, 819},  /* fallback: min < window */
        {27, 28, 4096, 0.8, 64, 20, 819},      {3, 7, 1024, 0.75, 64, 20, 256},  /* fallback */
        {0, 4, 300, 0.5, 64, 20, 236},         {1, 4, 300, 0.5, 64, 20, 179},
        {2, 4, 300, 0.5, 64, 20, 121},         {3, 4, 300, 0.5, 64, 20, 64},
        {0, 2, 130, 0.5, 64, 20, 66},          {0, 24, 200, 0.3, 64, 20, 140},
        {10, 24, 200, 0.9, 64, 20, 20},        {0, 1, 1000, 0.5, 64, 20, 936},   /* one layer: steps 0 */
        {0, 32, 131072, 0.6, 64, 20, 102236},  {31, 32, 131072, 0.6, 64, 20, 2621},
        {17, 32, 131072, 0.6, 64, 20, 47609},  {0, 2, 100, 0.0, 64, 20, 100},    /* cr 0: everything */
        {0, 24, 65, 0.5, 64, 20, 32},          {0, 8, 500, 0.5, 32, 10, 468},
        {7, 8, 500, 0.5, 32, 10, 32},          {3, 8, 500, 0.5, 32, 10, 281},
        {1, 5, 100, 0.25, 16, 20, 80},         {3, 5, 100, 0.25, 16, 20, 70},    /* 79.5 -> 80, 70.5 -> 70 */
        {1, 3, 101, 0.5, 16, 20, 50},          {2, 5, 101, 0.5, 16, 20, 50},     /* 50.5 -> 50 */
        {12, 24, 1000, 0.5, 0, 0, 481},        /* window 0 / beta 0: kvpress defaults 64 / 20 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int got = ckv_pyramidkv_n_kept(cases[i].layer, cases[i].n_layers, cases[i].L, cases[i].cr, cases[i].window,
                                       cases[i].beta);
        CHECK_MSG(got == cases[i].want, "pyramidkv layer %d/%d L %d cr %g window %d beta %g: %d, kvpress %d",
                  cases[i].layer, cases[i].n_layers, cases[i].L, cases[i].cr, cases[i].window, cases[i].beta, got,
                  cases[i].want);
    }
}

/* A longer context: several query blocks in observed attention and several statistics blocks in
 * expected attention. */
static void check_long(ckv_backend *be) {
    ckv_test_prob p = ckv_test_prob_make(700, 24, 8, 4, 2, 1.0f, 1.0, &rng_state);
    const int L = p.L;
    fprintf(stderr, "-- long context: L %d (several blocks)\n", L);
    ckv_test_rank_view v;
    ckv_test_view_make(&v, &p, be, 0, p.H, 0, p.Hkv, NULL, NULL);
    float *got = malloc(sizeof(float) * (size_t)p.Hkv * L);
    double *ref = malloc(sizeof(double) * (size_t)p.Hkv * L);
    ckv_score_info info;
    ckv_press_config c = press(CKV_SCORER_OBSERVED_ATTENTION);
    CHECK_OK(ckv_score_layer(&v.in, &c, got, &info));
    naive_observed(&p, ref);
    note(compare_rows("observed_attention L 700", got, ref, p.Hkv, L, 0, L, 1e-9, 5e-5));
    c = press(CKV_SCORER_EXPECTED_ATTENTION);
    CHECK_OK(ckv_score_layer(&v.in, &c, got, &info));
    naive_expected(&p, &c, ref);
    note(compare_rows("expected_attention L 700", got, ref, p.Hkv, L, c.n_sink, L, 1e-9, 5e-5));
    CHECK_OK(ckv_critical_value_norm(&v.in, got));
    naive_critical(&p, ref);
    note(compare_rows("critical value norm L 700", got, ref, p.Hkv, L, 0, L, 1e-6, 1e-5));
    free(got), free(ref);
    ckv_test_view_free(&v);
    ckv_test_prob_free(&p);
}

int main(void) {
    const size_t live0 = ckv_alloc_live_bytes(); /* the backend's kept eviction scratch included: checked after its free */
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 2));
    if (!be) return ckv_test_finish("test_evict_scorers");
    const shape shapes[] = {
        {120, 24, 8, 2, 2, 8, 1.0f},   /* G 1 */
        {160, 32, 16, 4, 2, 16, 1.0f}, /* G 2 */
        {200, 48, 12, 6, 2, 12, 1.0f}, /* G 3 */
        {150, 40, 10, 3, 1, 10, 1.25f} /* G 3, one KV head, scaled RoPE (YaRN-like) */
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) check_shape(be, &shapes[i]);
    check_long(be);
    check_errors(be);
    check_pyramid();
    fprintf(stderr, "worst |diff| over all comparisons: %.3g\n", worst_err);
    ckv_backend_free(be);
    CHECK_MSG(ckv_alloc_live_bytes() == live0, "memory not freed: %zu bytes live after the backend's free, %zu before "
              "its init", ckv_alloc_live_bytes(), live0);
    return ckv_test_finish("test_evict_scorers");
}
