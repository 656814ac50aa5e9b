/* test_analyze_stats.c - the attention-concentration statistics (src/engine/analyze_stats.c) on small
 * inputs worked out by hand: the top-k sizes (ceil, at least 1, no float overshoot at f L integral),
 * shares, recall with a tie at the cut (lower row first), Spearman's rho with tied ranks (average
 * ranks) and of a reversed order (-1), the norm spread with an even and an odd count, NaN where a
 * statistic is undefined (no scores, a median norm of 0, constant scores), the errors, and no
 * scratch left allocated. Against an independent computation on a model: test_analyze_stats.sh. */
#include <math.h>
#include <stdio.h>

#include "ckv_test.h"
#include "core/alloc.h"
#include "engine/analyze_stats.h"

#define NEAR(a, b) (fabs((a) - (b)) <= 1e-12 * (1.0 + fabs(b)))

static void test_small(ckv_conc_ws *ws) {
    /* 10 rows: attention concentrated on rows 3 and 7; k = 1, 1, 1 (ceil of 0.1, 0.5, 1.0) */
    const double attn[10] = {1, 1, 1, 6, 1, 1, 1, 4, 1, 1};
    const float score[10] = {0, 1, 2, 9, 4, 5, 6, 7, 8, 3};
    const double norm[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 20};
    ckv_conc_stats s;
    CHECK_OK(ckv_conc_compute(attn, score, norm, 10, ws, &s));
    CHECK_MSG(s.top_k[0] == 1 && s.top_k[1] == 1 && s.top_k[2] == 1, "top_k %d %d %d", s.top_k[0], s.top_k[1], s.top_k[2]);
    CHECK_MSG(NEAR(s.top_share[0], 6.0 / 18.0) && NEAR(s.top_share[2], 6.0 / 18.0), "share %.17g", s.top_share[0]);
    CHECK_MSG(s.recall[0] == 1.0, "recall %g (row 3 leads both orders)", s.recall[0]);
    CHECK_MSG(NEAR(s.norm_spread, 20.0 / 5.5), "spread %.17g (median of an even count: (5 + 6) / 2)", s.norm_spread);
    /* Spearman with ties: attention ranks rows 3, 7 first, the other 8 tie at mean place 5.5 */
    double ra[10], rs[10], ma = 0, ms = 0, sxy = 0, sxx = 0, syy = 0;
    for (int i = 0; i < 10; i++) ra[i] = i == 3 ? 0 : i == 7 ? 1 : 5.5;
    const int order[10] = {3, 8, 7, 6, 5, 4, 9, 2, 1, 0}; /* by score, descending */
    for (int r = 0; r < 10; r++) rs[order[r]] = r;
    for (int i = 0; i < 10; i++) ma += ra[i] / 10, ms += rs[i] / 10;
    for (int i = 0; i < 10; i++) sxy += (ra[i] - ma) * (rs[i] - ms), sxx += (ra[i] - ma) * (ra[i] - ma), syy += (rs[i] - ms) * (rs[i] - ms);
    CHECK_MSG(NEAR(s.spearman, sxy / sqrt(sxx * syy)), "spearman %.17g, expected %.17g", s.spearman, sxy / sqrt(sxx * syy));

    /* 100 rows: k = 1, 5, 10 exactly (0.05 * 100 must not round up to 6) */
    double a2[100], n2[101];
    float s2[100];
    for (int i = 0; i < 100; i++) a2[i] = 100 - i, s2[i] = (float)i, n2[i] = 1.0;
    CHECK_OK(ckv_conc_compute(a2, s2, n2, 100, ws, &s));
    CHECK_MSG(s.top_k[0] == 1 && s.top_k[1] == 5 && s.top_k[2] == 10, "top_k %d %d %d", s.top_k[0], s.top_k[1], s.top_k[2]);
    CHECK_MSG(s.recall[0] == 0 && s.recall[2] == 0 && NEAR(s.spearman, -1.0), "reversed: recall %g, rho %g", s.recall[2], s.spearman);
    CHECK_MSG(NEAR(s.top_share[1], (100 + 99 + 98 + 97 + 96) / 5050.0), "share %.17g", s.top_share[1]);
    CHECK_MSG(s.norm_spread == 1.0, "equal norms: spread %g", s.norm_spread);

    /* a tie at the score cut: rows 0 and 1 share the top score, the lower row is ranked first */
    const double a3[3] = {1, 5, 1}, n3[3] = {0, 0, 1};
    const float s3[3] = {2, 2, 1};
    CHECK_OK(ckv_conc_compute(a3, s3, n3, 3, ws, &s));
    CHECK_MSG(s.recall[0] == 0.0, "tie at the cut: recall %g (row 0 takes the single place)", s.recall[0]);
    CHECK_MSG(isnan(s.norm_spread), "median norm 0: spread %g, expected NaN", s.norm_spread);
    /* no scores, constant scores */
    CHECK_OK(ckv_conc_compute(a3, NULL, norm, 3, ws, &s));
    CHECK_MSG(isnan(s.recall[0]) && isnan(s.spearman) && NEAR(s.norm_spread, 3.0 / 2.0), "no scores: %g %g %g", s.recall[0],
              s.spearman, s.norm_spread);
    const float flat[3] = {1, 1, 1};
    CHECK_OK(ckv_conc_compute(a3, flat, norm, 3, ws, &s));
    CHECK_MSG(isnan(s.spearman), "constant scores: rho %g, expected NaN", s.spearman);
    /* one row */
    CHECK_OK(ckv_conc_compute(a3, s3, norm, 1, ws, &s));
    CHECK_MSG(s.top_k[2] == 1 && s.top_share[2] == 1.0 && s.recall[2] == 1.0 && s.norm_spread == 1.0, "one row");
}

int main(void) {
    const size_t live0 = ckv_alloc_live_bytes();
    ckv_conc_ws ws;
    CHECK_OK(ckv_conc_ws_init(&ws, 100));
    test_small(&ws);
    const double zero[2] = {0, 0}, norm[2] = {1, 1};
    ckv_conc_stats s;
    CHECK_FAILS(ckv_conc_compute(zero, NULL, norm, 2, &ws, &s), CKV_STATUS_ERR_RANGE, "sums to 0");
    CHECK_FAILS(ckv_conc_compute(norm, NULL, norm, 101, &ws, &s), CKV_STATUS_ERR_SHAPE, "101 context rows (scratch for 100)");
    CHECK_FAILS(ckv_conc_compute(NULL, NULL, norm, 2, &ws, &s), CKV_STATUS_ERR_ARG, "missing inputs");
    ckv_conc_ws_free(&ws);
    ckv_conc_ws_free(&ws); /* twice: a freed object is a partial one */
    CHECK_FAILS(ckv_conc_ws_init(&ws, 0), CKV_STATUS_ERR_ARG, "for 0 rows");
    CHECK_MSG(ckv_alloc_live_bytes() == live0, "scratch not freed: %zu bytes live, %zu before", ckv_alloc_live_bytes(), live0);
    return ckv_test_finish("test_analyze_stats");
}
