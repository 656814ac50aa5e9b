/* select.h - from scores to kept rows for one layer: protected tokens, kept counts (uniform,
 * pyramidkv, fixed tokens), CriticalKV's two-stage selection, and cross-head allocation (adakv,
 * critical_adakv, global top-k) agreed across tensor-parallel ranks by an all-gather of the layer's
 * scores. Ties are broken by lower position first (then lower head). It neither computes scores
 * (scorer.h) nor touches the cache (the engine compacts it). */
#ifndef CKV_EVICT_SELECT_H
#define CKV_EVICT_SELECT_H

#include <stdint.h>

#include "evict/press.h"
#include "evict/scorer.h"

typedef struct {
    int n_kv_local, L;
    int32_t *rows;   /* [n_kv_local, L] kept rows of head h at rows + h * L, ascending */
    int32_t *n_keep; /* [n_kv_local] */
    float *scores;   /* [n_kv_local, L] base scores with protected tokens set (what selection ranked) */
    float *norms;    /* [n_kv_local, L] CriticalKV value norms (critical presses), else unused */
    int n_kept;      /* the per-head count the budget asked for (mean for cross-head allocation) */
    double score_seconds, select_seconds;
} ckv_selection;

ckv_status ckv_selection_init(ckv_selection *s, int n_kv_local, int L);
void ckv_selection_free(ckv_selection *s); /* accepts partial objects */

/* Per-head budgets for one layer from a head-importance profile (headkv); NULL when not used. */
typedef struct {
    int n_kv_heads;
    const int32_t *budget; /* [n_kv_heads] kept tokens per KV head of this layer (global heads) */
} ckv_head_budgets;

/* Scores layer in->layer and selects what each local head keeps (in->L context rows). */
ckv_status ckv_evict_layer(const ckv_press_config *cfg, const ckv_score_inputs *in, const ckv_head_budgets *hb,
                           ckv_selection *out);

/* Top-k of s[n] (ties: lower index first), written ascending into idx[k]. */
ckv_status ckv_topk_ascending(const float *s, int n, int k, int32_t *idx);

#endif
