/* select.h - from scores to kept rows for one layer: protected tokens, kept counts (uniform,
 * pyramidkv, fixed tokens), CriticalKV's two-stage selection, and cross-head allocation (adakv,
 * critical_adakv, headkv, global top-k) agreed across tensor-parallel ranks by an all-gather of the
 * layer's scores. Every per-element step runs as a backend eviction op on device buffers; only the
 * per-head counts (budgets, kept counts) and the layer max cross to the host. Ties are broken by
 * lower position first (then lower head). It neither computes scores (scorer.h) nor touches the
 * cache (the engine compacts it). */
#ifndef CKV_EVICT_SELECT_H
#define CKV_EVICT_SELECT_H

#include <stdint.h>

#include "evict/press.h"
#include "evict/scorer.h"

/* One layer's selection. Buffers marked device live on the backend's device (host memory on the
 * cpu backend); ckv_selection_rows_host copies the kept rows to the host where needed. */
typedef struct {
    ckv_backend *be;
    int n_kv_local, n_kv_heads, L;
    int cap_L;           /* most tokens the buffers hold (ckv_selection_set_len may lower L to any length up to it) */
    int32_t *rows;       /* [n_kv_local, L] kept rows of head h at rows + h * L, ascending (device) */
    int32_t *n_keep;     /* [n_kv_local] kept counts (host) */
    float *scores;       /* [n_kv_local, L] base scores with protected tokens set: what selection ranked (device) */
    float *norms;        /* [n_kv_local, L] CriticalKV value norms (critical presses), else unused (device) */
    /* device scratch */
    float *tmp;          /* [n_kv_local, L] stage-2 keys of CriticalKV */
    float *all;          /* [n_kv_heads, L] the layer's scores, global head order (cross-head allocation) */
    int32_t *idx;        /* [n_kv_heads, L] forced rows (stage 1, safeguard) */
    int32_t *k_dev;      /* [n_kv_heads] per-row counts of one top-k */
    int32_t *k2_dev;     /* [n_kv_heads] per-row counts of a second top-k */
    int32_t *counts_dev; /* [n_kv_heads] cross-head counts */
    float *scalar;       /* [1] the layer max */
    int32_t *k_host;     /* [n_kv_heads] host staging of counts */
    int32_t *b1_host;    /* [n_kv_heads] CriticalKV's stage-1 counts (host) */
    int32_t *budget_host; /* [n_kv_heads] per-head budgets of a cross-head allocation (host) */
    int n_kept;      /* the per-head count the budget asked for (mean for cross-head allocation) */
    double score_seconds, select_seconds;
} ckv_selection;

/* Allocates the buffers of a layer with n_kv_local of n_kv_heads KV heads and L context tokens. */
ckv_status ckv_selection_init(ckv_selection *s, ckv_backend *be, int n_kv_local, int n_kv_heads, int L);
void ckv_selection_free(ckv_selection *s); /* accepts partial objects */
/* Sets the layer length the next ckv_evict_layer selects over (1 .. cap_L) without allocating: the
 * buffers keep their size and are read with stride L (decode-time compression of a growing cache). */
ckv_status ckv_selection_set_len(ckv_selection *s, int L);

/* Copies the kept rows [n_kv_local, L] (only the first n_keep[h] of head h are meaningful) to host. */
ckv_status ckv_selection_rows_host(const ckv_selection *s, int32_t *rows);

/* Per-head budgets for one layer from a head-importance profile (headkv); NULL when not used. */
typedef struct {
    int n_kv_heads;
    const int32_t *budget; /* [n_kv_heads] kept tokens per KV head of this layer (global heads, host) */
} ckv_head_budgets;

/* Scores layer in->layer and selects what each local head keeps (in->L context rows). A press that
 * selects across layers (CKV_ALLOC_MODEL, layer_defensivekv) is refused: see select_model.h. */
ckv_status ckv_evict_layer(const ckv_press_config *cfg, const ckv_score_inputs *in, const ckv_head_budgets *hb,
                           ckv_selection *out);

/* The scoring half of ckv_evict_layer: out->scores [n_kv_local, L] with the protected tokens set, and
 * every KV head's row all-gathered into out->all [n_kv_heads, L] (global head order, identical on
 * every rank); sets out->score_seconds, selects nothing. */
ckv_status ckv_evict_layer_scores(const ckv_press_config *cfg, const ckv_score_inputs *in, ckv_selection *out);

#endif
