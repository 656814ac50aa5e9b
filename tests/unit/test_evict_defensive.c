/* test_evict_defensive.c - DefensiveKV's scorer (ckv_score_defensivekv) against a naive double-precision
 * version written here from the formulas of docs/presses.md (window attention, mass-preserving avg
 * pooling, max over group heads and window queries floored at the head mean, value norms normalised
 * across KV heads, the first stage with its quirks: window bias on the w columns before the window,
 * the (L - w) cap, negative caps slicing from the end) on random inputs with G = 1, 2, 3, peaked and
 * flat attention; tensor-parallel splits (query heads split, KV heads replicated) against tp = 1
 * through a communicator that replays recorded sums and maxima; its errors; and HeadKV profiles:
 * loading (good file, unreadable, malformed JSON, bad schema, shape that does not match the model)
 * and budgets against numbers from the reference port (tools/oracle/headkv_reference.py). Also
 * checks that scratch memory is returned. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "evict/headkv.h"
#include "evict/press.h"
#include "evict/score_defensive.h"
#include "evict/scorer.h"
#include "evict/select.h"
#include "common/rank_view.h"

/* ---- random inputs --------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static ckv_press_config press_def(int w, int kernel, double cr) {
    ckv_press_config c;
    memset(&c, 0, sizeof c);
    c.scorer = CKV_SCORER_DEFENSIVEKV;
    c.alloc = CKV_ALLOC_GLOBAL;
    c.window = w, c.kernel = kernel, c.pool = CKV_POOL_AVG;
    c.compression_ratio = cr;
    return c;
}

/* ---- the naive reference (double) ------------------------------------------------------------ */

static const float *key(const ckv_test_prob *p, int g, int t) { return p->k + ((size_t)g * p->L + t) * p->d; }
static const float *val(const ckv_test_prob *p, int g, int t) { return p->v + ((size_t)g * p->L + t) * p->d; }

static void naive_q(const ckv_test_prob *p, int t, int h, double *q) {
    const int d = p->d, hf = d / 2;
    for (int a = 0; a < d; a++) {
        double s = p->bq[h * d + a];
        for (int c = 0; c < p->D; c++) s += (double)p->xn[(size_t)t * p->D + c] * p->wq[((size_t)h * d + a) * p->D + c];
        q[a] = s;
    }
    for (int i = 0; i < hf; i++) {
        float angle = (float)p->pos[t] * p->inv_freq[i];
        double c = cos((double)angle) * p->rope_scale, s = sin((double)angle) * p->rope_scale;
        double x1 = q[i], x2 = q[i + hf];
        q[i] = x1 * c - x2 * s;
        q[i + hf] = x2 * c + x1 * s;
    }
}

typedef struct {
    double window_bias, threshold;
    int cap;
    int count[8];    /* c per KV head (before the cap) */
    int n_forced[8]; /* per KV head */
    double M;
} naive_info;

typedef struct {
    double s;
    int t;
} ranked;

static int ranked_cmp(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->s != y->s) return x->s > y->s ? -1 : 1;
    return (x->t > y->t) - (x->t < y->t);
}

/* out [Hkv, L]: DefensiveKV scores of the L - w context tokens (forced tokens = M); window entries 0. */
static void naive_defensive(const ckv_test_prob *p, int w, int kernel, double cr, double *out, naive_info *ni) {
    const int L = p->L, n = L - w, G = p->H / p->Hkv, Hkv = p->Hkv, d = p->d, D = p->D, r = kernel / 2;
    double *q = malloc(sizeof(double) * d), *wt = malloc(sizeof(double) * L), *pooled = malloc(sizeof(double) * n);
    double *ave = calloc((size_t)Hkv * n, sizeof(double)), *dmax = calloc((size_t)Hkv * n, sizeof(double));
    double *N = calloc((size_t)Hkv * n, sizeof(double)), *nsum = calloc((size_t)n, sizeof(double));
    double bias = 0.0;
    for (int h = 0; h < p->H; h++) {
        const int g = h / G;
        for (int i = 0; i < w; i++) {
            const int qt = L - w + i, n_vis = qt + 1;
            naive_q(p, qt, h, q);
            double m = -INFINITY, z = 0.0;
            for (int t = 0; t < n_vis; t++) {
                double x = 0.0;
                for (int a = 0; a < d; a++) x += q[a] * key(p, g, t)[a];
                wt[t] = x / sqrt((double)d);
                m = wt[t] > m ? wt[t] : m;
            }
            for (int t = 0; t < n_vis; t++) z += (wt[t] = exp(wt[t] - m));
            for (int t = 0; t < n_vis; t++) wt[t] /= z;
            double mass = 0.0, psum = 0.0;
            for (int t = 0; t < n; t++) {
                mass += wt[t];
                ave[(size_t)g * n + t] += wt[t] / ((double)G * w);
            }
            for (int t = (n > w ? n - w : 0); t < n; t++) bias += wt[t];
            for (int t = 0; t < n; t++) {
                double s = 0.0;
                for (int u = t - r; u <= t + r; u++)
                    if (u >= 0 && u < n) s += wt[u];
                pooled[t] = s / kernel;
                psum += pooled[t];
            }
            for (int t = 0; t < n; t++) {
                double v = pooled[t] / psum * mass;
                dmax[(size_t)g * n + t] = v > dmax[(size_t)g * n + t] ? v : dmax[(size_t)g * n + t];
            }
        }
        /* value norm of head h */
        for (int t = 0; t < n; t++) {
            double s = 0.0;
            for (int c = 0; c < D; c++) {
                double x = 0.0;
                for (int a = 0; a < d; a++) x += (double)val(p, g, t)[a] * p->wo[(size_t)c * p->H * d + (size_t)h * d + a];
                s += fabs(x);
            }
            N[(size_t)g * n + t] += s / G;
        }
    }
    for (int g = 0; g < Hkv; g++) {
        double mean = 0.0;
        for (int t = 0; t < n; t++) mean += dmax[(size_t)g * n + t] / n;
        for (int t = 0; t < n; t++) dmax[(size_t)g * n + t] = fmax(dmax[(size_t)g * n + t], mean);
    }
    for (int t = 0; t < n; t++)
        for (int g = 0; g < Hkv; g++) nsum[t] += N[(size_t)g * n + t];
    double M = 0.0;
    for (int g = 0; g < Hkv; g++) {
        for (int t = 0; t < n; t++) {
            double s = dmax[(size_t)g * n + t] * N[(size_t)g * n + t] / nsum[t];
            out[(size_t)g * L + t] = s;
            M = fmax(M, s);
        }
        for (int t = n; t < L; t++) out[(size_t)g * L + t] = 0.0;
    }
    ni->window_bias = bias / ((double)p->H * w);
    ni->threshold = 0.9 - ni->window_bias;
    ni->cap = (int)((double)n * (1.0 - cr) - (double)w);
    ni->M = M;
    ranked *rk = malloc(sizeof(ranked) * (size_t)n);
    for (int g = 0; g < Hkv; g++) {
        double tot = 0.0;
        for (int t = 0; t < n; t++) tot += ave[(size_t)g * n + t];
        for (int t = 0; t < n; t++) rk[t] = (ranked){ave[(size_t)g * n + t] / tot, t};
        qsort(rk, (size_t)n, sizeof *rk, ranked_cmp);
        int c = 0;
        double cum = 0.0;
        for (int i = 0; i < n; i++) {
            cum += rk[i].s;
            if (cum >= ni->threshold) {
                c = i;
                break;
            }
        }
        int k = c < ni->cap ? c : ni->cap;
        if (k < 0) k = n + k > 0 ? n + k : 0;
        ni->count[g] = c;
        ni->n_forced[g] = k;
        for (int i = 0; i < k; i++) out[(size_t)g * L + rk[i].t] = M;
    }
    free(rk);
    free(q), free(wt), free(pooled), free(ave), free(dmax), free(N), free(nsum);
}

/* ---- a communicator that replays: pass P answers the first P collectives of every rank with the
 * reduction of what the ranks sent in the previous pass (exact by induction: a collective's input
 * depends only on earlier results), and returns later ones unreduced. Running tp ranks one after
 * another for (number of collectives + 1) passes gives each rank the result of a real job. ----- */

#define MOCK_RANKS 8
#define MOCK_CALLS 16
typedef struct {
    float *prev[MOCK_CALLS][MOCK_RANKS], *next[MOCK_CALLS][MOCK_RANKS];
    size_t n[MOCK_CALLS];
    int op[MOCK_CALLS];
    int size;
} mock_ctx;

static int mock_pass;                   /* collectives answered exactly in this pass */
static int mock_seq[MOCK_RANKS];        /* per tp rank: collectives issued in this pass (any comm) */
static int mock_cur_rank;               /* the tp rank running now */
static int mock_max_seq;

static ckv_status mock_allreduce(ckv_comm *c, float *buf, size_t n, ckv_comm_op op) {
    mock_ctx *m = c->ctx;
    const int idx = mock_seq[mock_cur_rank]++;
    if (idx >= MOCK_CALLS) return ckv_error(CKV_STATUS_ERR_COMM, "mock: too many collectives");
    if (mock_seq[mock_cur_rank] > mock_max_seq) mock_max_seq = mock_seq[mock_cur_rank];
    free(m->next[idx][c->rank]);
    m->next[idx][c->rank] = malloc(sizeof(float) * n);
    memcpy(m->next[idx][c->rank], buf, sizeof(float) * n);
    m->n[idx] = n;
    m->op[idx] = (int)op;
    if (idx < mock_pass) {
        for (int r = 0; r < m->size; r++)
            if (!m->prev[idx][r]) return ckv_error(CKV_STATUS_ERR_COMM, "mock: rank %d missing collective %d", r, idx);
        for (size_t i = 0; i < n; i++) {
            double acc = op == CKV_COMM_OP_SUM ? 0.0 : -INFINITY;
            for (int r = 0; r < m->size; r++) {
                const double x = m->prev[idx][r][i];
                acc = op == CKV_COMM_OP_SUM ? acc + x : (x > acc ? x : acc);
            }
            buf[i] = (float)acc;
        }
    }
    return CKV_STATUS_OK;
}

static const ckv_comm_ops mock_ops = {.allreduce_f32 = mock_allreduce};

static void mock_end_pass(mock_ctx *m) {
    for (int i = 0; i < MOCK_CALLS; i++)
        for (int r = 0; r < MOCK_RANKS; r++) {
            free(m->prev[i][r]);
            m->prev[i][r] = m->next[i][r];
            m->next[i][r] = NULL;
        }
}

static void mock_free(mock_ctx *m) {
    for (int i = 0; i < MOCK_CALLS; i++)
        for (int r = 0; r < MOCK_RANKS; r++) free(m->prev[i][r]), free(m->next[i][r]);
    memset(m, 0, sizeof *m);
}

static double worst_err = 0.0;
static void note(double e) { worst_err = e > worst_err ? e : worst_err; }

/* Splits the heads over tp ranks as the sharding does and compares every rank's rows with full. */
static void check_tp(const ckv_test_prob *p, ckv_backend *be, const ckv_press_config *c, int tp, const float *full) {
    const int L = p->L, nq = p->H / tp;
    const int nkv = tp <= p->Hkv ? p->Hkv / tp : 1, reps = tp <= p->Hkv ? 1 : tp / p->Hkv;
    mock_ctx *rep = calloc(MOCK_RANKS, sizeof(mock_ctx)), *tpx = calloc(1, sizeof(mock_ctx));
    tpx->size = tp;
    for (int g = 0; g < MOCK_RANKS; g++) rep[g].size = reps;
    float *out[MOCK_RANKS];
    for (int r = 0; r < tp; r++) out[r] = malloc(sizeof(float) * (size_t)nkv * L);
    mock_max_seq = 0;
    for (mock_pass = 0; mock_pass <= mock_max_seq && mock_pass < MOCK_CALLS; mock_pass++) {
        for (int r = 0; r < tp; r++) {
            const int kv0 = tp <= p->Hkv ? r * nkv : r / reps;
            ckv_comm tpc = {.ops = &mock_ops, .ctx = tpx, .rank = r, .size = tp, .kind = "mock"};
            ckv_comm repc = {.ops = &mock_ops, .ctx = &rep[kv0], .rank = r % reps, .size = reps, .kind = "mock"};
            mock_cur_rank = r;
            mock_seq[r] = 0;
            ckv_test_rank_view v;
            ckv_test_view_make(&v, p, be, r * nq, nq, kv0, nkv, reps > 1 ? &repc : NULL, &tpc);
            ckv_score_info info;
            CHECK_OK(ckv_score_defensivekv(&v.in, c, out[r], &info));
            ckv_test_view_free(&v);
        }
        mock_end_pass(tpx);
        for (int g = 0; g < MOCK_RANKS; g++) mock_end_pass(&rep[g]);
    }
    char name[128];
    for (int r = 0; r < tp; r++) {
        const int kv0 = tp <= p->Hkv ? r * nkv : r / reps;
        snprintf(name, sizeof name, "defensivekv tp %d rank %d (%d collectives)", tp, r, mock_max_seq);
        for (int h = 0; h < nkv; h++) /* the window entries are not compared (left to the caller) */
            note(ckv_test_allclose(name, out[r] + (size_t)h * L, full + (size_t)(kv0 + h) * L, (size_t)(L - c->window),
                                   1e-9, 2e-5));
        free(out[r]);
    }
    for (int g = 0; g < MOCK_RANKS; g++) mock_free(&rep[g]);
    mock_free(tpx);
    free(rep), free(tpx);
}

/* ---- defensivekv checks ---------------------------------------------------------------------- */

typedef struct {
    int L, D, d, H, Hkv, w, kernel;
    double cr;
    float rope_scale;
    double sharp;
    const char *what;
} dcase;

static int seen_threshold = 0, seen_negative_cap = 0, seen_zero_cap = 0, seen_short = 0;

static void check_case(ckv_backend *be, const dcase *k) {
    ckv_test_prob p = ckv_test_prob_make(k->L, k->D, k->d, k->H, k->Hkv, k->rope_scale, k->sharp, &rng_state);
    const int L = p.L, Hkv = p.Hkv, n = L - k->w;
    ckv_test_rank_view v;
    ckv_test_view_make(&v, &p, be, 0, p.H, 0, Hkv, NULL, NULL);
    ckv_press_config c = press_def(k->w, k->kernel, k->cr);
    float *got = malloc(sizeof(float) * (size_t)Hkv * L);
    double *ref = malloc(sizeof(double) * (size_t)Hkv * L);
    float *reff = malloc(sizeof(float) * (size_t)Hkv * L);
    ckv_score_info info = {-1, -1};
    CHECK_OK(ckv_score_defensivekv(&v.in, &c, got, &info));
    CHECK(info.protect_head == 0 && info.protect_tail == k->w);
    naive_info ni;
    naive_defensive(&p, k->w, k->kernel, k->cr, ref, &ni);
    for (size_t i = 0; i < (size_t)Hkv * L; i++) reff[i] = (float)ref[i];
    fprintf(stderr, "-- %s: L %d, H %d / Hkv %d, w %d, kernel %d, cr %g: window bias %.4f, cap %d, c", k->what, L,
            p.H, Hkv, k->w, k->kernel, k->cr, ni.window_bias, ni.cap);
    for (int g = 0; g < Hkv; g++) fprintf(stderr, " %d", ni.count[g]);
    fprintf(stderr, ", forced");
    for (int g = 0; g < Hkv; g++) fprintf(stderr, " %d", ni.n_forced[g]);
    fprintf(stderr, "\n");
    char name[160];
    float layer_max = 0.0f;
    for (int g = 0; g < Hkv; g++)
        for (int t = 0; t < n; t++) layer_max = fmaxf(layer_max, got[(size_t)g * L + t]);
    for (int g = 0; g < Hkv; g++) {
        snprintf(name, sizeof name, "%s head %d", k->what, g);
        note(ckv_test_allclose(name, got + (size_t)g * L, reff + (size_t)g * L, (size_t)n, 1e-9, 2e-5));
        int n_at_m = 0; /* forced entries hold exactly the layer max */
        for (int t = 0; t < n; t++) n_at_m += got[(size_t)g * L + t] == layer_max;
        for (int t = n; t < L; t++) CHECK(got[(size_t)g * L + t] == 0.0f);
        CHECK_MSG(n_at_m >= ni.n_forced[g], "%s head %d: %d entries at the layer max, %d forced", k->what, g, n_at_m,
                  ni.n_forced[g]);
        if (ni.count[g] > 0 && ni.count[g] < ni.cap) seen_threshold = 1;
    }
    { /* layer_defensivekv: the same scores; its window one ulp above the layer max, nothing protected */
        ckv_press_config cl = c;
        cl.scorer = CKV_SCORER_LAYER_DEFENSIVEKV;
        cl.alloc = CKV_ALLOC_MODEL;
        float *gl = malloc(sizeof(float) * (size_t)Hkv * L);
        ckv_score_info il = {-1, -1};
        CHECK_OK(ckv_score_defensivekv(&v.in, &cl, gl, &il));
        CHECK_MSG(il.protect_head == 0 && il.protect_tail == 0, "%s layer variant protects %d + %d", k->what,
                  il.protect_head, il.protect_tail);
        int same = 1, win = 1;
        for (int g = 0; g < Hkv; g++) {
            for (int t = 0; t < n; t++) same &= gl[(size_t)g * L + t] == got[(size_t)g * L + t];
            for (int t = n; t < L; t++) win &= gl[(size_t)g * L + t] == nextafterf(layer_max, INFINITY);
        }
        CHECK_MSG(same && win, "%s layer variant: context scores %s, window %s", k->what, same ? "equal" : "DIFFER",
                  win ? "at nextafter(max)" : "WRONG");
        free(gl);
    }
    if (ni.cap < 0) seen_negative_cap = 1;
    if (ni.cap == 0) seen_zero_cap = 1;
    if (n < k->w) seen_short = 1;
    /* budget given as tokens: the same first-stage cap as the equivalent ratio */
    {
        ckv_press_config cb = c;
        cb.compression_ratio = 0.0;
        cb.budget_tokens = (int)lround(L * (1.0 - k->cr));
        float *got2 = malloc(sizeof(float) * (size_t)Hkv * L);
        CHECK_OK(ckv_score_defensivekv(&v.in, &cb, got2, &info));
        int cap2 = (int)((double)n * ((double)cb.budget_tokens / L) - k->w);
        if (cap2 == ni.cap) CHECK(memcmp(got, got2, sizeof(float) * (size_t)Hkv * L) == 0);
        free(got2);
    }
    check_tp(&p, be, &c, p.H, got);
    if (Hkv > 1 && Hkv < p.H) check_tp(&p, be, &c, Hkv, got);
    free(got), free(ref), free(reff);
    ckv_test_view_free(&v);
    ckv_test_prob_free(&p);
}

static void check_errors(ckv_backend *be) {
    ckv_test_prob p = ckv_test_prob_make(40, 16, 8, 4, 2, 1.0f, 1.0, &rng_state);
    ckv_test_rank_view v;
    ckv_test_view_make(&v, &p, be, 0, 4, 0, 2, NULL, NULL);
    float *got = malloc(sizeof(float) * 2 * 40);
    ckv_score_info info;
    ckv_press_config c = press_def(40, 5, 0.5);
    CHECK_FAILS(ckv_score_defensivekv(&v.in, &c, got, &info), CKV_STATUS_ERR_ARG,
                "window 40 needs a context longer than 40 tokens, got 40");
    c = press_def(8, 4, 0.5);
    CHECK_FAILS(ckv_score_defensivekv(&v.in, &c, got, &info), CKV_STATUS_ERR_ARG, "kernel 4");
    c = press_def(8, 5, 0.5);
    c.pool = CKV_POOL_MAX;
    CHECK_FAILS(ckv_score_defensivekv(&v.in, &c, got, &info), CKV_STATUS_ERR_ARG, "avg only");
    c = press_def(8, 5, 1.0);
    CHECK_FAILS(ckv_score_defensivekv(&v.in, &c, got, &info), CKV_STATUS_ERR_ARG, "compression ratio 1");
    { /* a press that selects over the model has no one-layer selection */
        ckv_press_config cl = press_def(8, 5, 0.5);
        cl.scorer = CKV_SCORER_LAYER_DEFENSIVEKV;
        cl.alloc = CKV_ALLOC_MODEL;
        ckv_selection sel;
        CHECK_OK(ckv_selection_init(&sel, be, 2, 2, 40));
        CHECK_FAILS(ckv_evict_layer(&cl, &v.in, NULL, &sel), CKV_STATUS_ERR_ARG, "selects over every layer at once");
        cl.pool = CKV_POOL_MAX;
        CHECK_FAILS(ckv_score_defensivekv(&v.in, &cl, got, &info), CKV_STATUS_ERR_ARG, "press layer_defensivekv pools");
        ckv_selection_free(&sel);
    }
    c = press_def(8, 5, 0.5);
    v.in.wo = NULL;
    CHECK_FAILS(ckv_score_defensivekv(&v.in, &c, got, &info), CKV_STATUS_ERR_ARG, "o_proj");
    free(got);
    ckv_test_view_free(&v);
    ckv_test_prob_free(&p);
}

/* ---- headkv ---------------------------------------------------------------------------------- */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static const char *tmp_path(char *buf, size_t cap, const char *name) {
    snprintf(buf, cap, "%s/%s", CKV_TEST_TMP, name);
    return buf;
}

/* The profile and cases of tools/oracle/headkv_reference.py (C_PROFILE, C_CASES). */
static const char *const good_profile =
    "{\"format\": \"ckv-headkv-profile\", \"model\": \"synthetic\", \"n_layers\": 4, \"n_kv_heads\": 3,\n"
    " \"scores\": [[0.9, 0.1, 0.0], [0.25, 0.5, 0.35], [0.05, 0.3, 0.6], [0.2, 0.2, 0.2]],\n"
    " \"source\": \"test\", \"extra\": {\"ignored\": true}}\n";

static void check_headkv_load(void) {
    char path[1024];
    ckv_headkv_profile p;
    /* good file, defaults for beta / temp */
    write_text(tmp_path(path, sizeof path, "headkv_good.json"), good_profile);
    CHECK_OK(ckv_headkv_load(&p, path, 4, 3));
    CHECK(p.n_layers == 4 && p.n_kv_heads == 3 && p.scores && p.scores[0] == 0.9 && p.scores[11] == 0.2);
    CHECK(p.beta == 1.5 && p.temp == 1.0 && p.window == 0);
    CHECK(!strcmp(p.model, "synthetic") && !strcmp(p.source, "test"));
    ckv_headkv_free(&p);
    CHECK_OK(ckv_headkv_load(&p, path, 0, 0)); /* no model to check against */
    ckv_headkv_free(&p);
    /* beta / temp from the file */
    write_text(tmp_path(path, sizeof path, "headkv_params.json"),
               "{\"n_layers\": 1, \"n_kv_heads\": 2, \"scores\": [[1, 3]], \"beta\": 1.005, \"temp\": 2}");
    CHECK_OK(ckv_headkv_load(&p, path, 1, 2));
    CHECK(p.beta == 1.005 && p.temp == 2.0 && p.scores[1] == 3.0 && !p.model[0]);
    ckv_headkv_free(&p);
    /* errors */
    CHECK_FAILS(ckv_headkv_load(&p, tmp_path(path, sizeof path, "headkv_missing.json"), 4, 3), CKV_STATUS_ERR_IO,
                "headkv_missing.json");
    CHECK(p.scores == NULL);
    write_text(tmp_path(path, sizeof path, "headkv_bad.json"), "{\"n_layers\": 4, \"scores\": [[1, 2,]");
    CHECK_FAILS(ckv_headkv_load(&p, path, 4, 3), CKV_STATUS_ERR_FORMAT, "invalid JSON");
    write_text(tmp_path(path, sizeof path, "headkv_good.json"), good_profile);
    CHECK_FAILS(ckv_headkv_load(&p, path, 32, 8), CKV_STATUS_ERR_SHAPE, "has 4 layers x 3 KV heads, the model 32 x 8");
    CHECK_FAILS(ckv_headkv_load(&p, path, 4, 2), CKV_STATUS_ERR_SHAPE, "the model 4 x 2");
    CHECK(p.scores == NULL && p.n_layers == 0);
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"[1, 2]", "expected a JSON object"},
        {"{\"n_kv_heads\": 3, \"scores\": []}", "\"n_layers\" must be a positive integer"},
        {"{\"n_layers\": 4.5, \"n_kv_heads\": 3, \"scores\": []}", "\"n_layers\" must be a positive integer, got 4.5"},
        {"{\"n_layers\": 1, \"n_kv_heads\": 3}", "\"scores\" must be an array"},
        {"{\"n_layers\": 2, \"n_kv_heads\": 3, \"scores\": [[1, 2, 3]]}", "\"scores\" has 1 rows, \"n_layers\" says 2"},
        {"{\"n_layers\": 1, \"n_kv_heads\": 3, \"scores\": [[1, 2]]}", "scores[0] must hold 3 numbers"},
        {"{\"n_layers\": 1, \"n_kv_heads\": 2, \"scores\": [[1, -2]]}", "scores[0][1] must be a number >= 0"},
        {"{\"n_layers\": 1, \"n_kv_heads\": 2, \"scores\": [[1, \"x\"]]}", "scores[0][1] must be a number >= 0"},
        {"{\"n_layers\": 1, \"n_kv_heads\": 2, \"scores\": [[0, 0]]}", "every importance score is 0"},
        {"{\"n_layers\": 1, \"n_kv_heads\": 2, \"scores\": [[1, 1]], \"beta\": 0.5}", "\"beta\" 0.5 must be >= 1"},
        {"{\"n_layers\": 1, \"n_kv_heads\": 2, \"scores\": [[1, 1]], \"temp\": 0}", "\"temp\" 0 must be > 0"},
        {"{\"n_layers\": 1, \"n_kv_heads\": 2, \"scores\": [[1, 1]], \"beta\": \"x\"}", "\"beta\" must be a number"},
        {"{\"format\": \"headkv\", \"n_layers\": 1, \"n_kv_heads\": 2, \"scores\": [[1, 1]]}", "headkv_profile.py"},
        {"{\"0-0\": [0.1, 0.2], \"0-1\": [0.3]}", "\"n_layers\" must be a positive integer"}, /* HeadKV's own format */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_text(tmp_path(path, sizeof path, "headkv_schema.json"), bad[i].text);
        CHECK_FAILS(ckv_headkv_load(&p, path, 0, 0), CKV_STATUS_ERR_FORMAT, bad[i].needle);
        CHECK(p.scores == NULL);
    }
    CHECK_FAILS(ckv_headkv_load(&p, "", 1, 1), CKV_STATUS_ERR_ARG, "--profile");
    /* the committed fixture profiles load against their models */
    static const struct {
        const char *file;
        int n_layers, n_kv;
    } fx[] = {{"presses/headkv_profile_llama_gqa.json", 3, 2}, {"presses/headkv_profile_qwen2_bias.json", 2, 2}};
    for (size_t i = 0; i < sizeof fx / sizeof fx[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", CKV_FIXTURES, fx[i].file);
        CHECK_OK(ckv_headkv_load(&p, path, fx[i].n_layers, fx[i].n_kv));
        ckv_headkv_free(&p);
    }
}

static void check_headkv_budgets(void) {
    /* generated by: .venv-oracle/bin/python tools/oracle/headkv_reference.py --c-cases */
    static const struct {
        int L, n_kept, window;
        double beta, temp;
        int32_t want[12];
    } cases[] = {
        {300, 150, 0, 1.5, 1.0, {300, 83, 50, 132, 214, 165, 66, 149, 247, 116, 116, 116}},
        {300, 150, 32, 1.5, 1.0, {300, 98, 72, 136, 200, 162, 85, 149, 226, 123, 123, 123}},
        {300, 75, 64, 1.005, 1.0, {95, 68, 65, 73, 81, 77, 67, 75, 85, 72, 72, 72}},
        {300, 150, 64, 1.2, 2.0, {300, 84, 79, 108, 196, 136, 80, 121, 247, 98, 98, 98}},
        {1000, 100, 8, 1.5, 0.5, {156, 78, 39, 101, 126, 112, 67, 106, 134, 94, 94, 94}},
        {120, 110, 16, 1.01, 1.0, {120, 48, 17, 93, 120, 120, 32, 109, 120, 78, 78, 78}},
        {300, 29, 64, 1.5, 1.0, {29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29}},
        {50, 60, 8, 1.5, 1.0, {50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50, 50}},
        {300, 2, 0, 1.0, 1.0, {6, 1, 1, 2, 3, 2, 1, 2, 4, 1, 1, 1}},
    };
    char path[1024];
    write_text(tmp_path(path, sizeof path, "headkv_good.json"), good_profile);
    ckv_headkv_profile p;
    CHECK_OK(ckv_headkv_load(&p, path, 4, 3));
    int32_t got[12];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        p.beta = cases[i].beta, p.temp = cases[i].temp, p.window = cases[i].window;
        CHECK_OK(ckv_headkv_budgets(&p, cases[i].L, cases[i].n_kept, got));
        int same = 1;
        for (int j = 0; j < 12; j++) same &= got[j] == cases[i].want[j];
        CHECK_MSG(same, "headkv case %zu (L %d, n_kept %d, window %d, beta %g, temp %g): got %d %d %d %d ... want %d %d %d %d",
                  i, cases[i].L, cases[i].n_kept, cases[i].window, cases[i].beta, cases[i].temp, got[0], got[1], got[2],
                  got[3], cases[i].want[0], cases[i].want[1], cases[i].want[2], cases[i].want[3]);
    }
    /* errors */
    p.beta = 1.5, p.temp = 1.0, p.window = 0;
    CHECK_FAILS(ckv_headkv_budgets(&p, 0, 10, got), CKV_STATUS_ERR_ARG, "context 0");
    CHECK_FAILS(ckv_headkv_budgets(&p, 100, 0, got), CKV_STATUS_ERR_ARG, "kept count 0");
    p.window = 100;
    CHECK_FAILS(ckv_headkv_budgets(&p, 100, 50, got), CKV_STATUS_ERR_ARG, "window 100 outside [0, 100)");
    p.window = 0, p.beta = 0.9;
    CHECK_FAILS(ckv_headkv_budgets(&p, 100, 50, got), CKV_STATUS_ERR_ARG, "beta 0.9");
    p.beta = 1.5, p.temp = -1.0;
    CHECK_FAILS(ckv_headkv_budgets(&p, 100, 50, got), CKV_STATUS_ERR_ARG, "temp -1");
    ckv_headkv_free(&p);
    ckv_headkv_free(&p); /* twice is fine */
    ckv_headkv_free(NULL);
    CHECK_FAILS(ckv_headkv_budgets(&p, 100, 50, got), CKV_STATUS_ERR_ARG, "no profile");
}

int main(void) {
    const size_t live0 = ckv_alloc_live_bytes(); /* the backend's kept eviction scratch included: checked after its free */
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 2));
    if (!be) return ckv_test_finish("test_evict_defensive");
    const dcase cases[] = {
        {120, 24, 8, 2, 2, 8, 5, 0.5, 1.0f, 1.0, "G 1"},
        {160, 32, 16, 4, 2, 16, 5, 0.3, 1.0f, 1.0, "G 2"},
        {200, 48, 12, 6, 2, 12, 7, 0.75, 1.0f, 1.0, "G 3 kernel 7"},
        {150, 40, 10, 3, 1, 10, 1, 0.5, 1.25f, 1.0, "one KV head, no pooling, scaled RoPE"},
        {180, 32, 16, 4, 2, 16, 5, 0.25, 1.0f, 5.0, "peaked attention (threshold reached early)"},
        {100, 32, 16, 4, 2, 32, 5, 0.9, 1.0f, 1.0, "negative cap (all but |m| forced)"},
        {50, 32, 16, 6, 3, 32, 5, 0.2, 1.0f, 1.0, "L < 2w (window bias over all context columns)"},
        {100, 32, 8, 4, 2, 20, 3, 0.75, 1.0f, 1.0, "cap 0 (nothing forced)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_case(be, &cases[i]);
    CHECK_MSG(seen_threshold && seen_negative_cap && seen_zero_cap && seen_short,
              "cases do not cover threshold %d, negative cap %d, zero cap %d, short context %d", seen_threshold,
              seen_negative_cap, seen_zero_cap, seen_short);
    check_errors(be);
    check_headkv_load();
    check_headkv_budgets();
    fprintf(stderr, "worst |diff| over all score comparisons: %.3g\n", worst_err);
    ckv_backend_free(be);
    CHECK_MSG(ckv_alloc_live_bytes() == live0, "memory not freed: %zu bytes live after the backend's free, %zu before "
              "its init", ckv_alloc_live_bytes(), live0);
    return ckv_test_finish("test_evict_defensive");
}
