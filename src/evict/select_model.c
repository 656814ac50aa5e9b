/* select_model.c - one top-k over every layer of the model (see select_model.h): each layer's scores
 * from the press's scorer (ckv_evict_layer_scores: protected tokens set, heads all-gathered) copied
 * into one [n_layers, n_kv_heads, L] device buffer, then the backend's cross-row count
 * (evict_topk_counts over n_layers * n_kv_heads rows) and per-row top-k (evict_topk) give the kept
 * counts and rows. Only the counts cross to the host. No scoring of its own, no cache access. */
#include "evict/select_model.h"

#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"

ckv_status ckv_model_selection_init(ckv_model_selection *ms, ckv_backend *be, int n_layers, int n_kv_local,
                                    int n_kv_heads, int L) {
    memset(ms, 0, sizeof *ms);
    if (!be || n_layers < 1 || n_kv_local < 1 || n_kv_heads < n_kv_local || L < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "model-wide selection of %d layers x %d of %d heads x %d tokens", n_layers,
                         n_kv_local, n_kv_heads, L);
    const size_t rows = (size_t)n_layers * (size_t)n_kv_heads;
    if (rows * (size_t)L > (size_t)INT32_MAX)
        return ckv_error(CKV_STATUS_ERR_RANGE, "model-wide selection: %d layers x %d KV heads x %d tokens exceed 2^31 "
                         "entries", n_layers, n_kv_heads, L);
    ms->be = be;
    ms->n_layers = n_layers;
    ms->n_kv_local = n_kv_local;
    ms->n_kv_heads = n_kv_heads;
    ms->L = L;
    ckv_status st = be->ops->alloc(be, (void **)&ms->scores, rows * (size_t)L * sizeof(float), "model-wide scores");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&ms->counts_dev, rows * sizeof(int32_t), "model-wide counts");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&ms->counts, rows * sizeof(int32_t), "model-wide counts");
    if (st != CKV_STATUS_OK) ckv_model_selection_free(ms);
    return st;
}

void ckv_model_selection_free(ckv_model_selection *ms) {
    if (!ms) return;
    if (ms->be) {
        ms->be->ops->release(ms->be, ms->scores);
        ms->be->ops->release(ms->be, ms->counts_dev);
    }
    ckv_free(ms->counts);
    memset(ms, 0, sizeof *ms);
}

ckv_status ckv_model_select_score(const ckv_press_config *cfg, const ckv_score_inputs *in, ckv_model_selection *ms,
                                  ckv_selection *sel) {
    if (in->layer != ms->n_scored || in->layer >= ms->n_layers)
        return ckv_error(CKV_STATUS_ERR_ARG, "model-wide selection: layer %d scored after %d of %d layers", in->layer,
                         ms->n_scored, ms->n_layers);
    if (in->L != ms->L || in->n_kv_heads != ms->n_kv_heads || in->n_kv_local != ms->n_kv_local || in->be != ms->be)
        return ckv_error(CKV_STATUS_ERR_ARG, "model-wide selection: layer %d has %d tokens x %d heads, the buffers %d x %d",
                         in->layer, in->L, in->n_kv_heads, ms->L, ms->n_kv_heads);
    CKV_TRY(ckv_evict_layer_scores(cfg, in, sel));
    const size_t per = (size_t)ms->n_kv_heads * (size_t)ms->L;
    CKV_TRY(ms->be->ops->copy(ms->be, ms->scores + (size_t)in->layer * per, sel->all, per * sizeof(float)));
    ms->score_seconds += sel->score_seconds;
    ms->n_scored++;
    return CKV_STATUS_OK;
}

ckv_status ckv_model_select_count(const ckv_press_config *cfg, ckv_model_selection *ms) {
    if (ms->n_scored != ms->n_layers)
        return ckv_error(CKV_STATUS_ERR_ARG, "model-wide selection: counted after %d of %d layers", ms->n_scored,
                         ms->n_layers);
    ckv_backend *be = ms->be;
    const double t0 = ckv_time_now();
    const int rows = ms->n_layers * ms->n_kv_heads;
    if (cfg->layerwise) { /* kvzip layerwise: each layer its own count across its heads */
        const long total = ckv_press_layerwise_kept(cfg, ms->L, ms->n_kv_heads);
        const size_t per = (size_t)ms->n_kv_heads * (size_t)ms->L;
        for (int l = 0; l < ms->n_layers; l++)
            CKV_TRY(be->ops->evict_topk_counts(be, ms->counts_dev + (size_t)l * (size_t)ms->n_kv_heads,
                                               ms->scores + (size_t)l * per, ms->L, ms->n_kv_heads, ms->L, (int64_t)total));
    } else {
        const long total = ckv_press_model_kept(cfg, ms->n_layers, ms->L, ms->n_kv_heads);
        CKV_TRY(be->ops->evict_topk_counts(be, ms->counts_dev, ms->scores, ms->L, rows, ms->L, (int64_t)total));
    }
    CKV_TRY(be->ops->sync(be));
    CKV_TRY(be->ops->download(be, ms->counts, ms->counts_dev, (size_t)rows * sizeof(int32_t)));
    ms->counted = 1;
    ms->select_seconds += ckv_time_now() - t0;
    return CKV_STATUS_OK;
}

ckv_status ckv_model_select_layer(ckv_model_selection *ms, int layer, int kv_head0, ckv_selection *sel) {
    if (!ms->counted || layer < 0 || layer >= ms->n_layers)
        return ckv_error(CKV_STATUS_ERR_ARG, "model-wide selection: layer %d of %d before the count", layer, ms->n_layers);
    if (sel->L != ms->L || sel->n_kv_local != ms->n_kv_local || sel->n_kv_heads != ms->n_kv_heads || kv_head0 < 0 ||
        kv_head0 + ms->n_kv_local > ms->n_kv_heads)
        return ckv_error(CKV_STATUS_ERR_ARG, "model-wide selection: layer %d's buffers do not fit", layer);
    ckv_backend *be = ms->be;
    const double t0 = ckv_time_now();
    const int L = ms->L, nkv = ms->n_kv_local;
    const size_t row0 = (size_t)layer * (size_t)ms->n_kv_heads + (size_t)kv_head0;
    const float *s = ms->scores + row0 * (size_t)L; // [nkv, L] the local heads' rows of the layer
    int total = 0;
    for (int h = 0; h < nkv; h++) total += sel->n_keep[h] = ms->counts[row0 + (size_t)h];
    sel->n_kept = total / nkv;
    CKV_TRY(be->ops->upload(be, sel->k2_dev, sel->n_keep, (size_t)nkv * sizeof(int32_t)));
    CKV_TRY(be->ops->evict_topk(be, sel->rows, L, s, L, nkv, L, sel->k2_dev));
    CKV_TRY(be->ops->copy(be, sel->scores, s, (size_t)nkv * (size_t)L * sizeof(float)));
    CKV_TRY(be->ops->sync(be));
    sel->select_seconds = ckv_time_now() - t0;
    ms->select_seconds += sel->select_seconds;
    return CKV_STATUS_OK;
}
