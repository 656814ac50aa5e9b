/* select_model.h - selection over every layer of the model at once: ONE top-k across all layers x KV
 * heads x context tokens (layer_defensivekv, DefensiveKV's EfficientLayerDefensiveKVPress, whose
 * budget is spread across layers by the scores themselves). ckv's prefill is layer-major, so each
 * layer is scored when it has seen the whole context (its attention inputs are gone afterwards) and
 * its scores are kept here, the layer left uncompressed, until the last layer's are in; one count over
 * the whole model then gives every (layer, KV head) its kept count, and each layer's kept rows are
 * selected into an ordinary ckv_selection for compaction. Ties: higher score first, then lower flat
 * index (layer * n_kv_heads + head) * L + position, as the one-layer selections break them. Under
 * tensor parallelism every layer's scores are all-gathered (select.h), so every rank counts the same
 * numbers. It neither compacts the cache nor decides when layers are scored (the engine does). */
#ifndef CKV_EVICT_SELECT_MODEL_H
#define CKV_EVICT_SELECT_MODEL_H

#include <stdint.h>

#include "evict/press.h"
#include "evict/scorer.h"
#include "evict/select.h"

typedef struct {
    ckv_backend *be;
    int n_layers, n_kv_local, n_kv_heads, L;
    int n_scored;         /* layers scored so far, in order 0, 1, ... */
    float *scores;        /* [n_layers, n_kv_heads, L] every layer's scores, global head order (device) */
    int32_t *counts_dev;  /* [n_layers, n_kv_heads] kept per (layer, head) (device) */
    int32_t *counts;      /* [n_layers, n_kv_heads] the same on the host, once counted */
    int counted;          /* 1 after ckv_model_select_count */
    double score_seconds, select_seconds;
} ckv_model_selection;

/* Device buffers for n_layers layers of L context tokens over n_kv_heads KV heads, n_kv_local of them
 * on this rank (4 n_layers n_kv_heads L bytes of scores). */
ckv_status ckv_model_selection_init(ckv_model_selection *ms, ckv_backend *be, int n_layers, int n_kv_local,
                                    int n_kv_heads, int L);
void ckv_model_selection_free(ckv_model_selection *ms); /* accepts zeroed and partial objects */

/* Scores layer in->layer (which must be layer ms->n_scored: layers in order) with the press's scorer
 * and keeps the layer's scores of every KV head; sel is the layer's scratch (ckv_selection_init of the
 * layer's shape). */
ckv_status ckv_model_select_score(const ckv_press_config *cfg, const ckv_score_inputs *in, ckv_model_selection *ms,
                                  ckv_selection *sel);

/* After the last layer: the ckv_press_model_kept(cfg, ...) best entries of the whole model and how many
 * of them fall in each (layer, KV head) (ms->counts); with cfg->layerwise (kvzip), each layer's
 * ckv_press_layerwise_kept best entries over its heads instead. */
ckv_status ckv_model_select_count(const ckv_press_config *cfg, ckv_model_selection *ms);

/* Layer `layer`'s selection into sel (of the layer's shape): the local heads' kept counts (from
 * kv_head0, the rank's first KV head), their kept rows in ascending order and their scores (what was
 * ranked). */
ckv_status ckv_model_select_layer(ckv_model_selection *ms, int layer, int kv_head0, ckv_selection *sel);

#endif
