/* analyze_stats.h - attention-concentration statistics of one query head, for `ckv analyze`
 * (docs/presses.md, "Attention-concentration statistics"): over the evictable context rows, how
 * much of the analysed query's attention its top 1%, 5% and 10% of rows hold, how well a press's
 * scores predict that attention (recall of the query's top rows among the scores' top rows, and the
 * Spearman rank correlation), and the spread of the projected value norms (largest / median
 * ||V_i W_O^h||_1). It computes from what the caller hands it (attention weights, scores, norms on
 * the host) with scratch sized once; it runs no model, selects nothing and allocates nothing per
 * call. */
#ifndef CKV_ENGINE_ANALYZE_STATS_H
#define CKV_ENGINE_ANALYZE_STATS_H

#include <stdint.h>

#include "core/status.h"

#define CKV_CONC_N_TOP 3 /* the top fractions below */

/* 0.01, 0.05, 0.10: the top fractions of the context rows; k = max(1, ceil(f * L)) rows each */
extern const double ckv_conc_fractions[CKV_CONC_N_TOP];

/* One head's statistics. NaN where undefined (no scores given; a median norm of 0; constant ranks). */
typedef struct {
    int32_t top_k[CKV_CONC_N_TOP];    /* rows in each top set */
    double top_share[CKV_CONC_N_TOP]; /* attention of the query's top_k context rows / its attention on all context rows */
    double recall[CKV_CONC_N_TOP];    /* |top_k by attention ∩ top_k by score| / top_k */
    double spearman;                  /* rank correlation of score and attention over the context rows */
    double norm_spread;               /* max_i / median_i ||V_i W_O^h||_1 over the context rows */
} ckv_conc_stats;

/* A value and its row, for the descending sorts (ties: lower row first, as the selection breaks them). */
typedef struct {
    double v;
    int32_t i;
} ckv_conc_pair;

/* Scratch for up to n_max context rows. */
typedef struct {
    int n_max;
    ckv_conc_pair *pairs; // [n_max] one sort at a time
    double *rank_a;       // [n_max] average rank of each row by attention (ties share their mean rank)
    double *rank_s;       // [n_max] the same by score
    int32_t *pos_s;       // [n_max] each row's place in the score order (0 = highest)
} ckv_conc_ws;

ckv_status ckv_conc_ws_init(ckv_conc_ws *ws, int n_max);
void ckv_conc_ws_free(ckv_conc_ws *ws); /* accepts partial objects */

/* The statistics of one head over L context rows: attn [L] the query's attention weights (any
 * positive scale: only ratios and ranks are used), score [L] the press's scores as its selection
 * ranks them (NULL: recall and spearman are NaN), norm [L] ||V_i W_O^h||_1. */
ckv_status ckv_conc_compute(const double *attn, const float *score, const double *norm, int L, ckv_conc_ws *ws,
                            ckv_conc_stats *out);

#endif
