/* analyze_stats.c - attention-concentration statistics of one query head (see analyze_stats.h):
 * three descending sorts of the context rows (by attention, by score, by value norm) in scratch
 * sized once, then shares, recalls, Spearman's rho on average ranks, and the norm spread. It does
 * not compute attention, scores or norms. */
#include "engine/analyze_stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

const double ckv_conc_fractions[CKV_CONC_N_TOP] = {0.01, 0.05, 0.10};

ckv_status ckv_conc_ws_init(ckv_conc_ws *ws, int n_max) {
    memset(ws, 0, sizeof *ws);
    if (n_max < 1) return ckv_error(CKV_STATUS_ERR_ARG, "concentration statistics for %d rows", n_max);
    ws->n_max = n_max;
    const size_t n = (size_t)n_max;
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->pairs, n * sizeof *ws->pairs, "concentration sort"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->rank_a, n * sizeof(double), "concentration attention ranks"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->rank_s, n * sizeof(double), "concentration score ranks"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->pos_s, n * sizeof(int32_t), "concentration score order"), fail);
    return CKV_STATUS_OK;
fail:
    ckv_conc_ws_free(ws);
    return s;
}

void ckv_conc_ws_free(ckv_conc_ws *ws) {
    if (!ws) return;
    ckv_free(ws->pairs);
    ckv_free(ws->rank_a);
    ckv_free(ws->rank_s);
    ckv_free(ws->pos_s);
    memset(ws, 0, sizeof *ws);
}

/* descending by value, then ascending by row */
static int pair_cmp(const void *pa, const void *pb) {
    const ckv_conc_pair *a = pa, *b = pb;
    if (a->v != b->v) return a->v > b->v ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* Sorts v[0..L-1] into ws->pairs, descending; rank (if given) gets each row's average rank. */
static void sort_rows(ckv_conc_ws *ws, int L, const double *vd, const float *vf, double *rank) {
    ckv_conc_pair *p = ws->pairs;
    for (int i = 0; i < L; i++) p[i] = (ckv_conc_pair){vd ? vd[i] : (double)vf[i], i};
    qsort(p, (size_t)L, sizeof *p, pair_cmp);
    if (!rank) return;
    for (int a = 0; a < L;) {
        int b = a + 1;
        while (b < L && p[b].v == p[a].v) b++;
        const double r = 0.5 * (double)(a + b - 1); /* mean of places a .. b-1 */
        for (int t = a; t < b; t++) rank[p[t].i] = r;
        a = b;
    }
}

static double pearson(const double *x, const double *y, int n) {
    double mx = 0.0, my = 0.0;
    for (int i = 0; i < n; i++) mx += x[i], my += y[i];
    mx /= n, my /= n;
    double sxy = 0.0, sxx = 0.0, syy = 0.0;
    for (int i = 0; i < n; i++) {
        const double a = x[i] - mx, b = y[i] - my;
        sxy += a * b, sxx += a * a, syy += b * b;
    }
    return sxx > 0.0 && syy > 0.0 ? sxy / sqrt(sxx * syy) : NAN;
}

ckv_status ckv_conc_compute(const double *attn, const float *score, const double *norm, int L, ckv_conc_ws *ws,
                            ckv_conc_stats *out) {
    if (!attn || !norm || !ws || !out) return ckv_error(CKV_STATUS_ERR_ARG, "concentration statistics: missing inputs");
    if (L < 1 || L > ws->n_max)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "concentration statistics: %d context rows (scratch for %d)", L, ws->n_max);
    double total = 0.0;
    for (int i = 0; i < L; i++) total += attn[i];
    if (!(total > 0.0) || !isfinite(total))
        return ckv_error(CKV_STATUS_ERR_RANGE, "concentration statistics: context attention sums to %g", total);

    for (int t = 0; t < CKV_CONC_N_TOP; t++) {
        int k = (int)ceil(ckv_conc_fractions[t] * (double)L - 1e-9);
        out->top_k[t] = k < 1 ? 1 : k;
    }
    if (score) { /* the score order first: each row's place in it */
        sort_rows(ws, L, NULL, score, ws->rank_s);
        for (int r = 0; r < L; r++) ws->pos_s[ws->pairs[r].i] = r;
    }
    sort_rows(ws, L, attn, NULL, ws->rank_a);
    for (int t = 0; t < CKV_CONC_N_TOP; t++) {
        const int k = out->top_k[t];
        double held = 0.0;
        int hit = 0;
        for (int r = 0; r < k; r++) {
            held += ws->pairs[r].v;
            if (score) hit += ws->pos_s[ws->pairs[r].i] < k;
        }
        out->top_share[t] = held / total;
        out->recall[t] = score ? (double)hit / (double)k : NAN;
    }
    out->spearman = score ? pearson(ws->rank_a, ws->rank_s, L) : NAN;

    sort_rows(ws, L, norm, NULL, NULL);
    const double med = L % 2 ? ws->pairs[L / 2].v : 0.5 * (ws->pairs[L / 2 - 1].v + ws->pairs[L / 2].v);
    out->norm_spread = med > 0.0 ? ws->pairs[0].v / med : NAN;
    return CKV_STATUS_OK;
}
