/* test_analyze.c - the perturbation analysis (src/engine/analyze.c). (1) The per-head math against a
 * naive double-precision computation written here from the paper's formulas (softmax, y_i = V_i W_O^h
 * as a full product, o and o^ computed separately, theta evaluated literally as Eq. 5
 * C - (2 - 1/s) sum N_i A_i ||y_i||_1, the attention-only bound 2 (1 - s) max ||y_i||_1) on random
 * small inputs and random / empty / complete / top-attention kept sets, across the 256-row block
 * boundary; perturbation <= theta <= attention-only bound on many random selections; exact zeros
 * when everything is kept; the errors. (2) The layer hook on the fixture models (llama_gqa, qwen2_bias
 * with q bias): the full-cache output o of every head equals the model's own attention output of the
 * analysed token projected through that head's o_proj columns (so the recomputed query, RoPE, scale
 * and rows are the model's), the bound chain on real selections, zeros at budget 1, the error for a
 * press that evicts nothing, and no scratch left allocated. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "core/alloc.h"
#include "engine/analyze.h"
#include "engine/session.h"
#include "model/model.h"

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

/* ---- (1) one head against a naive reference -------------------------------------------------- */

typedef struct {
    double pert[CKV_ANALYZE_PRESSES], theta[CKV_ANALYZE_PRESSES], attn[CKV_ANALYZE_PRESSES], mass[CKV_ANALYZE_PRESSES];
    double out_l1, pmax, C;
} naive_out;

static void naive_head(const ckv_analyze_head_in *in, naive_out *r) {
    const int n = in->n_rows, L = in->n_ctx, d = in->d, D = in->D;
    double *A = calloc((size_t)n, sizeof(double)), *y = calloc((size_t)n * D, sizeof(double));
    double *o = calloc((size_t)D, sizeof(double)), *oh = calloc((size_t)D, sizeof(double));
    double *P = calloc((size_t)n, sizeof(double));
    double mx = -INFINITY, sum = 0.0;
    for (int i = 0; i < n; i++) {
        double z = 0.0;
        for (int c = 0; c < d; c++) z += (double)in->q[c] * (double)in->k[(size_t)i * d + c];
        A[i] = z * (double)in->scale;
        mx = fmax(mx, A[i]);
    }
    for (int i = 0; i < n; i++) sum += (A[i] = exp(A[i] - mx));
    for (int i = 0; i < n; i++) A[i] /= sum;
    r->pmax = 0.0, r->C = 0.0;
    for (int i = 0; i < n; i++) {
        P[i] = 0.0;
        for (int col = 0; col < D; col++) {
            double acc = 0.0;
            for (int c = 0; c < d; c++) acc += (double)in->v[(size_t)i * d + c] * (double)in->wo[(size_t)col * in->wo_stride + c];
            y[(size_t)i * D + col] = acc;
            P[i] += fabs(acc);
            o[col] += A[i] * acc;
        }
        r->pmax = fmax(r->pmax, P[i]);
        r->C += A[i] * P[i];
    }
    r->out_l1 = 0.0;
    for (int col = 0; col < D; col++) r->out_l1 += fabs(o[col]);
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
        double s = 0.0, kept = 0.0;
        for (int i = 0; i < n; i++)
            if (i >= L || in->keep[p][i]) s += A[i], kept += A[i] * P[i];
        memset(oh, 0, sizeof(double) * (size_t)D);
        for (int i = 0; i < n; i++)
            if (i >= L || in->keep[p][i])
                for (int col = 0; col < D; col++) oh[col] += A[i] / s * y[(size_t)i * D + col];
        r->pert[p] = 0.0;
        for (int col = 0; col < D; col++) r->pert[p] += fabs(o[col] - oh[col]);
        r->theta[p] = r->C - (2.0 - 1.0 / s) * kept; /* paper Eq. 5, literally */
        r->attn[p] = 2.0 * (1.0 - s) * r->pmax;
        r->mass[p] = s;
    }
    free(A), free(y), free(o), free(oh), free(P);
}

/* |got - ref| <= rtol |ref| + atol */
static void close_to(const char *what, double got, double ref, double rtol, double atol) {
    CHECK_MSG(fabs(got - ref) <= rtol * fabs(ref) + atol, "%s: got %.12g, expected %.12g (diff %.3g)", what, got, ref,
              fabs(got - ref));
}

typedef struct {
    int n, L, d, D, stride, col0;
    float *q, *k, *v, *wo; // [d], [n, d], [n, d], [D, stride]
    uint8_t *keep[CKV_ANALYZE_PRESSES];
} head_prob;

static head_prob head_make(int n, int L, int d, int D, int n_heads_wo, int head) {
    head_prob h;
    h.n = n, h.L = L, h.d = d, h.D = D, h.stride = n_heads_wo * d, h.col0 = head * d;
    h.q = malloc(sizeof(float) * (size_t)d);
    h.k = malloc(sizeof(float) * (size_t)n * d);
    h.v = malloc(sizeof(float) * (size_t)n * d);
    h.wo = malloc(sizeof(float) * (size_t)D * h.stride);
    ckv_test_fill(&rng_state, h.q, (size_t)d, -2.0, 2.0);
    ckv_test_fill(&rng_state, h.k, (size_t)n * d, -1.5, 1.5);
    ckv_test_fill(&rng_state, h.v, (size_t)n * d, -1.0, 1.0);
    ckv_test_fill(&rng_state, h.wo, (size_t)D * h.stride, -0.5, 0.5);
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) h.keep[p] = calloc((size_t)(L > 0 ? L : 1), 1);
    return h;
}

static void head_free(head_prob *h) {
    free(h->q), free(h->k), free(h->v), free(h->wo);
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) free(h->keep[p]);
}

static ckv_analyze_head_in head_in(const head_prob *h) {
    ckv_analyze_head_in in = {
        .n_rows = h->n, .n_ctx = h->L, .d = h->d, .D = h->D, .q = h->q, .k = h->k, .v = h->v,
        .wo = h->wo + h->col0, .wo_stride = h->stride, .scale = 1.0f / sqrtf((float)h->d),
    };
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) in.keep[p] = h->keep[p];
    return in;
}

/* Compares one computation with the reference and checks the chain of bounds on it. */
static void check_head(const char *name, const head_prob *h, ckv_backend *be, ckv_analyze_ws *ws) {
    ckv_analyze_head_in in = head_in(h);
    ckv_analyze_head got;
    memset(&got, 0, sizeof got);
    CHECK_OK(ckv_analyze_head_compute(&in, be, ws, &got));
    naive_out ref;
    naive_head(&in, &ref);
    char what[160];
    const double atol = 2e-6 * (ref.C + ref.out_l1); /* fp32 projections vs double */
    snprintf(what, sizeof what, "%s out_l1", name);
    close_to(what, got.out_l1, ref.out_l1, 1e-5, atol);
    snprintf(what, sizeof what, "%s max_norm", name);
    close_to(what, got.max_norm, ref.pmax, 1e-5, 0.0);
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
        int nk = 0;
        for (int i = 0; i < h->L; i++) nk += h->keep[p][i] != 0;
        CHECK_MSG(got.n_kept[p] == nk, "%s press %d: n_kept %d, expected %d", name, p, got.n_kept[p], nk);
        snprintf(what, sizeof what, "%s press %d perturbation", name, p);
        close_to(what, got.perturbation[p], ref.pert[p], 1e-5, atol);
        snprintf(what, sizeof what, "%s press %d theta", name, p);
        close_to(what, got.theta[p], ref.theta[p], 1e-5, atol);
        snprintf(what, sizeof what, "%s press %d attention-only bound", name, p);
        close_to(what, got.attn_bound[p], ref.attn[p], 1e-5, atol);
        snprintf(what, sizeof what, "%s press %d kept mass", name, p);
        close_to(what, got.kept_mass[p], ref.mass[p], 1e-12, 1e-15);
        /* Theorem 3.3 and its attention-only relaxation, on the computed numbers */
        CHECK_MSG(got.perturbation[p] <= got.theta[p] * (1.0 + 1e-12), "%s press %d: perturbation %.17g > theta %.17g",
                  name, p, got.perturbation[p], got.theta[p]);
        CHECK_MSG(got.theta[p] <= got.attn_bound[p] * (1.0 + 1e-12), "%s press %d: theta %.17g > attention bound %.17g",
                  name, p, got.theta[p], got.attn_bound[p]);
    }
    CHECK(got.n_rows == h->n);
}

/* keep[i] = 1 for the k context rows with the largest full-cache attention (ties: lower row). */
static void keep_top_attention(head_prob *h, int p, int k) {
    if (h->L < 1) return;
    double *z = malloc(sizeof(double) * (size_t)h->L);
    for (int i = 0; i < h->L; i++) {
        z[i] = 0.0;
        for (int c = 0; c < h->d; c++) z[i] += (double)h->q[c] * (double)h->k[(size_t)i * h->d + c];
    }
    memset(h->keep[p], 0, (size_t)h->L);
    for (int t = 0; t < k; t++) {
        int best = -1;
        for (int i = 0; i < h->L; i++)
            if (!h->keep[p][i] && (best < 0 || z[i] > z[best])) best = i;
        h->keep[p][best] = 1;
    }
    free(z);
}

static void test_head_math(ckv_backend *be) {
    static const int cfg[][5] = {/* n_rows, n_ctx, d, D, heads in wo */
                                 {37, 30, 8, 12, 3}, {5, 4, 2, 3, 1}, {300, 290, 16, 20, 2}, {513, 500, 4, 7, 2},
                                 {9, 0, 4, 6, 1}};
    for (size_t c = 0; c < sizeof cfg / sizeof cfg[0]; c++) {
        const int n = cfg[c][0], L = cfg[c][1], d = cfg[c][2], D = cfg[c][3], nh = cfg[c][4];
        head_prob h = head_make(n, L, d, D, nh, nh - 1);
        ckv_analyze_ws ws;
        CHECK_OK(ckv_analyze_ws_init(&ws, n, d, D));
        char name[96];
        /* random selections of several densities */
        for (int trial = 0; trial < 4; trial++) {
            double dens = 0.15 + 0.25 * trial;
            for (int p = 0; p < CKV_ANALYZE_PRESSES; p++)
                for (int i = 0; i < L; i++) h.keep[p][i] = ckv_test_rng_double(&rng_state) < dens;
            snprintf(name, sizeof name, "n=%d L=%d d=%d D=%d random %.2f", n, L, d, D, dens);
            check_head(name, &h, be, &ws);
        }
        if (L > 0) {
            /* top attention against random; everything evicted from the context against a single row */
            keep_top_attention(&h, 0, L / 3 > 0 ? L / 3 : 1);
            for (int i = 0; i < L; i++) h.keep[1][i] = ckv_test_rng_double(&rng_state) < 0.33;
            snprintf(name, sizeof name, "n=%d L=%d top-attention", n, L);
            check_head(name, &h, be, &ws);
            memset(h.keep[0], 0, (size_t)L);
            memset(h.keep[1], 0, (size_t)L);
            h.keep[1][L / 2] = 1;
            snprintf(name, sizeof name, "n=%d L=%d context evicted", n, L);
            check_head(name, &h, be, &ws);
        }
        /* everything kept: exact zeros, mass exactly 1 */
        for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) memset(h.keep[p], 1, (size_t)(L > 0 ? L : 1));
        ckv_analyze_head_in in = head_in(&h);
        ckv_analyze_head got;
        CHECK_OK(ckv_analyze_head_compute(&in, be, &ws, &got));
        for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
            CHECK_MSG(got.perturbation[p] == 0.0 && got.theta[p] == 0.0 && got.attn_bound[p] == 0.0 &&
                          got.kept_mass[p] == 1.0,
                      "n=%d all kept: perturbation %g theta %g bound %g mass %.17g", n, got.perturbation[p],
                      got.theta[p], got.attn_bound[p], got.kept_mass[p]);
        }
        /* the theorem on many random selections (computed values only) */
        int broken = 0;
        for (int trial = 0; trial < 200 && L > 0; trial++) {
            double dens = ckv_test_rng_double(&rng_state);
            for (int p = 0; p < CKV_ANALYZE_PRESSES; p++)
                for (int i = 0; i < L; i++) h.keep[p][i] = ckv_test_rng_double(&rng_state) < dens;
            in = head_in(&h);
            CHECK_OK(ckv_analyze_head_compute(&in, be, &ws, &got));
            for (int p = 0; p < CKV_ANALYZE_PRESSES; p++)
                broken += !(got.perturbation[p] <= got.theta[p] * (1.0 + 1e-12)) ||
                          !(got.theta[p] <= got.attn_bound[p] * (1.0 + 1e-12));
        }
        CHECK_MSG(broken == 0, "n=%d: %d selections break perturbation <= theta <= attention bound", n, broken);
        ckv_analyze_ws_free(&ws);
        head_free(&h);
    }
    fprintf(stderr, "ok   per-head math against the naive reference\n");

    /* errors */
    head_prob h = head_make(12, 12, 4, 5, 1, 0);
    ckv_analyze_ws ws;
    CHECK_OK(ckv_analyze_ws_init(&ws, 12, 4, 5));
    ckv_analyze_head_in in = head_in(&h);
    ckv_analyze_head got;
    CHECK_FAILS(ckv_analyze_head_compute(&in, be, &ws, &got), CKV_STATUS_ERR_ARG, "keeps no attended row");
    in.n_ctx = 13;
    CHECK_FAILS(ckv_analyze_head_compute(&in, be, &ws, &got), CKV_STATUS_ERR_ARG, "13 context rows out of 12");
    in.n_ctx = 4, in.n_rows = 13;
    CHECK_FAILS(ckv_analyze_head_compute(&in, be, &ws, &got), CKV_STATUS_ERR_SHAPE, "exceed the scratch");
    in.n_rows = 12, in.keep[1] = NULL;
    CHECK_FAILS(ckv_analyze_head_compute(&in, be, &ws, &got), CKV_STATUS_ERR_ARG, "press B has no kept set");
    ckv_analyze_ws_free(&ws);
    CHECK_FAILS(ckv_analyze_ws_init(&ws, 0, 4, 5), CKV_STATUS_ERR_ARG, "analysis scratch");
    head_free(&h);
}

/* ---- (2) the layer hook on fixture models --------------------------------------------------- */

typedef struct {
    ckv_analyzer *an;
    int n;      /* tokens prefilled (one chunk) */
    int bad_o;  /* heads whose o disagrees with the model's attention output */
    double max_rel;
} hook_check;

/* Runs the analysis hook, then compares every local head's ||o||_1 with the model's own attention
 * output of the last token (scratch.att, still holding the layer's attention) through W_O^h. */
static ckv_status checking_hook(void *ctx, ckv_session *s, int layer, int n_prompt) {
    hook_check *hc = ctx;
    CKV_TRY(ckv_analyze_layer_hook(hc->an, s, layer, n_prompt));
    const ckv_model *m = s->model;
    const int d = m->cfg.head_dim, D = m->cfg.hidden_size, nq = m->plan.n_q_local, hq = nq * d;
    const float *att = s->scratch.att + (size_t)(hc->n - 1) * hq; // [hq]
    const float *wo = m->layers[layer].wo.data;                     // [D, hq] (F32 on the cpu)
    for (int j = 0; j < nq; j++) {
        double l1 = 0.0;
        for (int r = 0; r < D; r++) {
            double acc = 0.0;
            for (int c = 0; c < d; c++) acc += (double)att[j * d + c] * (double)wo[(size_t)r * hq + j * d + c];
            l1 += fabs(acc);
        }
        const ckv_analyze_head *h = &hc->an->heads[(size_t)layer * m->cfg.n_heads + m->plan.q_head0 + j];
        double rel = fabs(h->out_l1 - l1) / (l1 > 0 ? l1 : 1.0);
        if (rel > hc->max_rel) hc->max_rel = rel;
        if (rel > 1e-4) {
            fprintf(stderr, "  layer %d head %d: ||o||_1 %.9g, model %.9g\n", layer, h->head, h->out_l1, l1);
            hc->bad_o++;
        }
    }
    return CKV_STATUS_OK;
}

static void run_model(ckv_backend *be, const char *name, const char *spec_a, const char *spec_b, double budget,
                      int expect_zero, int check_errors) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/%s", CKV_FIXTURES, name);
    ckv_model *m = NULL;
    CHECK_OK(ckv_model_load(&m, dir, be, NULL));
    if (!m) return;
    const int L = 150, nq = 3, n = L + nq;
    int32_t ids[153];
    for (int i = 0; i < n; i++) ids[i] = (int32_t)(3 + (int)(ckv_test_rng_double(&rng_state) * (m->cfg.vocab_size - 3)));
    ckv_press_config pa, pb;
    CHECK_OK(ckv_press_parse(&pa, spec_a));
    CHECK_OK(ckv_press_parse(&pb, spec_b));
    CHECK_OK(ckv_press_set_budget(&pa, budget));
    CHECK_OK(ckv_press_set_budget(&pb, budget));
    CHECK_OK(ckv_press_finalize(&pa));
    CHECK_OK(ckv_press_finalize(&pb));
    ckv_analyzer an;
    CHECK_OK(ckv_analyzer_init(&an, m, &pa, &pb, L, nq, 0));
    ckv_session s;
    CHECK_OK(ckv_session_init(&s, m, n, n, 1));
    hook_check hc = {&an, n, 0, 0.0};
    CHECK_OK(ckv_session_prefill_hook(&s, ids, n, NULL, NULL, checking_hook, &hc));
    CHECK_MSG(hc.bad_o == 0, "%s: %d heads' o differ from the model's attention output", name, hc.bad_o);
    ckv_analyze_summary sum;
    CHECK_OK(ckv_analyze_summarize(&an, &sum));
    CHECK(sum.n_heads == m->cfg.n_layers * m->cfg.n_heads);
    CHECK_MSG(sum.n_bound_violations == 0, "%s: %d bound violations", name, sum.n_bound_violations);
    const ckv_press_config *pr[CKV_ANALYZE_PRESSES] = {&pa, &pb};
    const int G = m->cfg.n_heads / m->cfg.n_kv_heads;
    long kept_sum[CKV_ANALYZE_PRESSES] = {0};
    for (int i = 0; i < sum.n_heads; i++) {
        const ckv_analyze_head *h = &an.heads[i];
        CHECK(h->n_rows == n && h->head == i % m->cfg.n_heads && h->layer == i / m->cfg.n_heads);
        CHECK(h->kv_head == h->head / (m->cfg.n_heads / m->cfg.n_kv_heads));
        for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
            const int kept = ckv_press_n_kept(pr[p], L); /* per head for uniform presses, the mean for adakv */
            if (pr[p]->alloc == CKV_ALLOC_UNIFORM)
                CHECK_MSG(h->n_kept[p] == kept, "%s: head %d press %d kept %d, expected %d", name, i, p, h->n_kept[p], kept);
            else if (i % G == 0)
                kept_sum[p] += h->n_kept[p];
            CHECK(h->perturbation[p] <= h->theta[p] * (1.0 + 1e-9) && h->theta[p] <= h->attn_bound[p] * (1.0 + 1e-9));
            if (expect_zero) CHECK(h->perturbation[p] == 0.0 && h->theta[p] == 0.0 && h->kept_mass[p] == 1.0);
            else CHECK(h->perturbation[p] > 0.0 && h->kept_mass[p] < 1.0);
        }
    }
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) /* adakv: the KV heads of a layer share n_kv_heads * n_kept */
        if (pr[p]->alloc == CKV_ALLOC_ADAKV)
            CHECK_MSG(kept_sum[p] == (long)m->cfg.n_layers * m->cfg.n_kv_heads * ckv_press_n_kept(pr[p], L),
                      "%s press %d: %ld rows kept over all KV heads", name, p, kept_sum[p]);
    fprintf(stderr, "ok   %s %s vs %s budget %g: %d heads, B less in %d, max |o - model| rel %.2g\n", name, spec_a,
            spec_b, budget, sum.n_heads, sum.n_b_less, hc.max_rel);
    ckv_session_free(&s);
    ckv_analyzer_free(&an);

    if (check_errors) { /* a press that evicts nothing; a context the window does not fit; no question */
        ckv_press_config none;
        CHECK_OK(ckv_press_parse(&none, "none"));
        CHECK_FAILS(ckv_analyzer_init(&an, m, &pa, &none, L, nq, 0), CKV_STATUS_ERR_ARG, "press B is none");
        CHECK_FAILS(ckv_analyzer_init(&an, m, &pa, &pb, 20, nq, 0), CKV_STATUS_ERR_ARG, "window");
        CHECK_FAILS(ckv_analyzer_init(&an, m, &pa, &pb, L, 0, 0), CKV_STATUS_ERR_ARG, "question");
    }
    ckv_model_free(m);
}

int main(void) {
    const size_t live0 = ckv_alloc_live_bytes(); /* the backend's kept eviction scratch included: checked after its free */
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 2));
    if (!be) return ckv_test_finish("test_analyze");
    test_head_math(be);
    run_model(be, "llama_gqa", "snapkv", "critical:snapkv", 0.3, 0, 1);
    run_model(be, "qwen2_bias", "snapkv_paper", "critical_adakv:snapkv_paper", 0.4, 0, 0);
    run_model(be, "mistral_gqa", "tova", "critical:knorm", 1.0, 1, 0);
    ckv_backend_free(be);
    CHECK_MSG(ckv_alloc_live_bytes() == live0, "memory not freed: %zu bytes live after the backend's free, %zu before "
              "its init", ckv_alloc_live_bytes(), live0);
    return ckv_test_finish("test_analyze");
}
