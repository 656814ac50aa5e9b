/* select.c - protected tokens, kept counts, CriticalKV two-stage selection and cross-head
 * allocation (see select.h), driven through the backend's eviction ops (evict_max, evict_fill,
 * evict_topk, evict_scatter, evict_add_mul, evict_topk_counts) and the score collectives of
 * evict_comm.c. The formulas follow docs/spec-eviction.md; where kvpress evaluates a budget in a
 * particular order (b1 = int((1 - cr) * L * alpha)) that order is kept. The host computes only
 * per-head counts. */
#include "evict/select.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"

ckv_status ckv_selection_init(ckv_selection *s, ckv_backend *be, int n_kv_local, int n_kv_heads, int L) {
    memset(s, 0, sizeof *s);
    if (!be || n_kv_local < 1 || n_kv_heads < n_kv_local || L < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "selection of %d of %d heads x %d tokens", n_kv_local, n_kv_heads, L);
    s->be = be;
    s->n_kv_local = n_kv_local;
    s->n_kv_heads = n_kv_heads;
    s->L = L;
    s->cap_L = L;
    const size_t n = (size_t)n_kv_local * (size_t)L, na = (size_t)n_kv_heads * (size_t)L, H = (size_t)n_kv_heads;
    ckv_status st = be->ops->alloc(be, (void **)&s->rows, n * sizeof(int32_t), "kept rows");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&s->scores, n * sizeof(float), "scores");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&s->norms, n * sizeof(float), "value norms");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&s->tmp, n * sizeof(float), "selection keys");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&s->all, na * sizeof(float), "layer scores");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&s->idx, na * sizeof(int32_t), "forced rows");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&s->k_dev, H * sizeof(int32_t), "top-k counts");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&s->k2_dev, H * sizeof(int32_t), "top-k counts");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&s->counts_dev, H * sizeof(int32_t), "head budgets");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&s->scalar, sizeof(float), "layer max");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&s->n_keep, (size_t)n_kv_local * sizeof(int32_t), "kept counts");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&s->k_host, H * sizeof(int32_t), "top-k counts");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&s->b1_host, H * sizeof(int32_t), "stage-1 counts");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&s->budget_host, H * sizeof(int32_t), "head budgets");
    if (st != CKV_STATUS_OK) ckv_selection_free(s);
    return st;
}

void ckv_selection_free(ckv_selection *s) {
    if (!s) return;
    ckv_backend *be = s->be;
    if (be) {
        be->ops->release(be, s->rows);
        be->ops->release(be, s->scores);
        be->ops->release(be, s->norms);
        be->ops->release(be, s->tmp);
        be->ops->release(be, s->all);
        be->ops->release(be, s->idx);
        be->ops->release(be, s->k_dev);
        be->ops->release(be, s->k2_dev);
        be->ops->release(be, s->counts_dev);
        be->ops->release(be, s->scalar);
    }
    ckv_free(s->n_keep);
    ckv_free(s->k_host);
    ckv_free(s->b1_host);
    ckv_free(s->budget_host);
    memset(s, 0, sizeof *s);
}

ckv_status ckv_selection_rows_host(const ckv_selection *s, int32_t *rows) {
    CKV_TRY(s->be->ops->sync(s->be));
    return s->be->ops->download(s->be, rows, s->rows, (size_t)s->n_kv_local * (size_t)s->L * sizeof(int32_t));
}

/* Uploads n host counts into a device count array. */
static ckv_status put_counts(ckv_backend *be, int32_t *dev, const int32_t *host, int n) {
    return be->ops->upload(be, dev, host, (size_t)n * sizeof(int32_t));
}

/* Protected tokens get (max over the layer's unprotected scores, all heads and ranks) + 1. */
static ckv_status protect(const ckv_score_inputs *in, const ckv_score_info *info, ckv_selection *sel) {
    ckv_backend *be = in->be;
    const int L = in->L, head = info->protect_head, tail = info->protect_tail, nkv = in->n_kv_local;
    if (head <= 0 && tail <= 0) return CKV_STATUS_OK;
    if (head + tail >= L) { /* everything is protected: nothing to rank against */
        be->ops->evict_fill(be, sel->scores, nkv, L, 0, L, CKV_EVICT_FILL_VALUE, 1.0f);
        return CKV_STATUS_OK;
    }
    be->ops->evict_max(be, sel->scalar, sel->scores, nkv, L, head, L - tail);
    CKV_TRY(ckv_evict_allreduce(be, in->tp, sel->scalar, 1, CKV_COMM_OP_MAX, 1));
    float mx = 0.0f;
    CKV_TRY(be->ops->sync(be));
    CKV_TRY(be->ops->download(be, &mx, sel->scalar, sizeof mx));
    const float p = mx + 1.0f;
    be->ops->evict_fill(be, sel->scores, nkv, L, 0, head > 0 ? head : 0, CKV_EVICT_FILL_VALUE, p);
    be->ops->evict_fill(be, sel->scores, nkv, L, L - (tail > 0 ? tail : 0), L, CKV_EVICT_FILL_VALUE, p);
    return CKV_STATUS_OK;
}

/* CriticalKV on nr rows s [nr, L] with value norms N [nr, L]: row r's top-b1[r] of s are forced, the
 * rest ranked by (s + eps) * N; keeps k[r] rows into rows [nr, L]. b1, k: host counts. */
static ckv_status critical_rows(ckv_backend *be, ckv_selection *sel, const float *s, const float *N, int nr, int L,
                                const int32_t *b1, const int32_t *k, float eps) {
    CKV_TRY(put_counts(be, sel->k_dev, b1, nr));
    CKV_TRY(put_counts(be, sel->k2_dev, k, nr));
    CKV_TRY(be->ops->evict_topk(be, sel->idx, L, s, L, nr, L, sel->k_dev));
    be->ops->evict_add_mul(be, sel->tmp, s, N, nr, L, L, eps);
    be->ops->evict_scatter(be, sel->tmp, L, nr, sel->idx, L, sel->k_dev, INFINITY); /* above any finite product */
    return be->ops->evict_topk(be, sel->rows, L, sel->tmp, L, nr, L, sel->k2_dev);
}

/* Plain per-row top-k[r] of s [nr, L] into the kept rows. */
static ckv_status topk_rows(ckv_backend *be, ckv_selection *sel, const float *s, int nr, int L, const int32_t *k) {
    CKV_TRY(put_counts(be, sel->k2_dev, k, nr));
    return be->ops->evict_topk(be, sel->rows, L, s, L, nr, L, sel->k2_dev);
}

/* All-gathers the local scores [n_kv_local, L] into sel->all [n_kv_heads, L] (global head order). */
static ckv_status gather_heads(const ckv_score_inputs *in, ckv_selection *sel) {
    ckv_backend *be = in->be;
    const size_t per = (size_t)in->n_kv_local * (size_t)in->L * sizeof(float);
    if (!in->tp || in->tp->size == 1) return be->ops->copy(be, sel->all, sel->scores, per);
    const int tp = in->tp->size;
    float *buf = NULL; // [tp, n_kv_local, L] (device)
    CKV_TRY(be->ops->alloc(be, (void **)&buf, per * (size_t)tp, "score all-gather"));
    ckv_status st = ckv_evict_allgather(be, in->tp, sel->scores, buf, per);
    for (int r = 0; r < tp && st == CKV_STATUS_OK; r++) /* replicas write the same head: identical rows */
        st = be->ops->copy(be, sel->all + (size_t)ckv_score_rank_kv_head0(in, r) * in->L,
                           (const char *)buf + (size_t)r * per, per);
    be->ops->release(be, buf);
    return st;
}

/* Cross-head allocation over all heads of the layer (sel->all): per-head budgets (global heads, host). */
static ckv_status allocate_budgets(const ckv_press_config *cfg, ckv_backend *be, ckv_selection *sel, int n_kv, int L,
                                   const ckv_press_kept *kept, int32_t *budget) {
    if (cfg->alloc == CKV_ALLOC_ADAKV) { /* safeguard: each head's top n_safe are forced */
        for (int h = 0; h < n_kv; h++) sel->k_host[h] = kept->safeguard;
        CKV_TRY(put_counts(be, sel->k_dev, sel->k_host, n_kv));
        CKV_TRY(be->ops->evict_topk(be, sel->idx, L, sel->all, L, n_kv, L, sel->k_dev));
        be->ops->evict_scatter(be, sel->all, L, n_kv, sel->idx, L, sel->k_dev, FLT_MAX);
    }
    CKV_TRY(be->ops->evict_topk_counts(be, sel->counts_dev, sel->all, L, n_kv, L, (int64_t)kept->layer_total));
    CKV_TRY(be->ops->sync(be));
    return be->ops->download(be, budget, sel->counts_dev, (size_t)n_kv * sizeof(int32_t));
}

ckv_status ckv_selection_set_len(ckv_selection *s, int L) {
    if (L < 1 || L > s->cap_L) return ckv_error(CKV_STATUS_ERR_ARG, "selection of %d tokens in buffers for %d", L, s->cap_L);
    s->L = L;
    return CKV_STATUS_OK;
}

/* The backend's eviction scratch sized for this layer before any op runs (evict_reserve). */
static ckv_status reserve_scratch(const ckv_press_config *cfg, const ckv_score_inputs *in) {
    ckv_backend *be = in->be;
    if (!ckv_backend_supports(be, CKV_BACKEND_CAP_EVICT_RESERVE)) return CKV_STATUS_OK; /* no scratch kept */
    /* query rows per attention op: a scorer's window, observed_attention's blocks of <= 256, or
     * compactor's chunks */
    int q_rows = cfg->window > 256 ? cfg->window : 256;
    if (cfg->scorer == CKV_SCORER_COMPACTOR && cfg->chunk_size > q_rows) q_rows = cfg->chunk_size;
    const int lev = cfg->scorer == CKV_SCORER_LEVERAGE || cfg->scorer == CKV_SCORER_COMPACTOR;
    const ckv_evict_shape sh = {in->L, q_rows, in->n_q_local, in->n_kv_local, in->n_kv_heads, in->head_dim, in->D,
                                in->kv.dtype, in->wo ? in->wo->dtype : in->kv.dtype, lev ? cfg->sketch_dimension : 0};
    return be->ops->evict_reserve(be, &sh);
}

/* ChunkKV (kvpress ChunkKVPress) on the layer's scores sel->all [n_kv_heads, L] (protected tokens set):
 * the chunks of chunk_length tokens from token 0 (a shorter last chunk when L is not a multiple) are
 * ranked by the mean over their tokens of the scores summed over every KV head of the layer (in
 * global head order, so every tensor-parallel rank ranks the same numbers); the best
 * max(1, int(n_chunks * (1 - cr))) chunks are kept whole by every head, ties to the lower chunk.
 * A context shorter than one chunk falls back to the per-head top-k (kvpress delegates to the
 * scorer's own compression). The ranking and the kept rows are the backend's evict_chunk_rank on the
 * device; only the kept count comes back (one int). */
static ckv_status chunk_rows(const ckv_press_config *cfg, const ckv_score_inputs *in, ckv_selection *sel,
                             int per_head) {
    ckv_backend *be = in->be;
    const int L = in->L, H = in->n_kv_heads, nkv = in->n_kv_local, C = cfg->chunk_length;
    const int full = L / C, n_chunks = full + (L % C > 0);
    if (full == 0) {
        for (int h = 0; h < nkv; h++) sel->n_keep[h] = per_head;
        return topk_rows(be, sel, sel->scores, nkv, L, sel->n_keep);
    }
    if (!ckv_backend_supports(be, CKV_BACKEND_CAP_CHUNK_RANK))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "press chunkkv: backend %s offers no evict_chunk_rank", be->name);
    int keep = (int)((double)n_chunks * (1.0 - cfg->compression_ratio));
    if (keep < 1) keep = 1;
    if (keep > n_chunks) keep = n_chunks;
    CKV_TRY(be->ops->evict_chunk_rank(be, sel->rows, L, nkv, sel->k_dev, sel->all, L, H, L, C, keep));
    int32_t n = 0;
    CKV_TRY(be->ops->download(be, &n, sel->k_dev, sizeof n));
    for (int h = 0; h < nkv; h++) sel->n_keep[h] = n;
    return CKV_STATUS_OK;
}

/* finch with chunk_length C (kvpress FinchPress.compress): the rows cut into chunks of C from row 0 (a
 * shorter last one); every head keeps, in each chunk, its max(1, floor(len * (1 - cr))) best rows of
 * sel->scores (protected rows set), by one top-k per chunk over the local heads. The chunk-relative
 * indices are shifted to rows on the host (4 n_kv_local L bytes down and back per layer). */
static ckv_status finch_chunk_rows(const ckv_press_config *cfg, ckv_backend *be, ckv_selection *sel, int nkv, int L) {
    const int C = cfg->chunk_length;
    int32_t *rows = NULL, *k = NULL; // [nkv, L] kept rows (host); [nkv] one chunk's counts
    ckv_status st = ckv_alloc((void **)&rows, (size_t)nkv * (size_t)L * sizeof(int32_t), "finch chunk rows");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&k, (size_t)nkv * sizeof(int32_t), "finch chunk counts");
    int off = 0;
    for (int t0 = 0; t0 < L && st == CKV_STATUS_OK; t0 += C) {
        const int len = L - t0 < C ? L - t0 : C, n = ckv_press_n_kept(cfg, len);
        for (int h = 0; h < nkv; h++) k[h] = n;
        st = put_counts(be, sel->k2_dev, k, nkv);
        if (st == CKV_STATUS_OK) st = be->ops->evict_topk(be, sel->rows + off, L, sel->scores + t0, L, nkv, len, sel->k2_dev);
        if (st == CKV_STATUS_OK) st = be->ops->sync(be);
        for (int h = 0; h < nkv && st == CKV_STATUS_OK; h++)
            st = be->ops->download(be, rows + (size_t)h * L + off, sel->rows + (size_t)h * L + off, (size_t)n * sizeof(int32_t));
        for (int h = 0; h < nkv && st == CKV_STATUS_OK; h++)
            for (int i = 0; i < n; i++) rows[(size_t)h * L + off + i] += t0;
        off += n;
    }
    for (int h = 0; h < nkv; h++) sel->n_keep[h] = off;
    if (st == CKV_STATUS_OK) st = be->ops->upload(be, sel->rows, rows, (size_t)nkv * (size_t)L * sizeof(int32_t));
    ckv_free(rows);
    ckv_free(k);
    return st;
}

/* The layer's scores into out->scores with the protected tokens set. */
static ckv_status layer_scores(const ckv_press_config *cfg, const ckv_score_inputs *in, ckv_selection *out) {
    if (out->L != in->L || out->n_kv_local != in->n_kv_local || out->n_kv_heads != in->n_kv_heads || out->be != in->be)
        return ckv_error(CKV_STATUS_ERR_ARG, "selection buffers do not fit the layer");
    ckv_score_info info = {0, 0};
    CKV_TRY(reserve_scratch(cfg, in));
    CKV_TRY(ckv_score_layer(in, cfg, out->scores, &info));
    return protect(in, &info, out);
}

ckv_status ckv_evict_layer_scores(const ckv_press_config *cfg, const ckv_score_inputs *in, ckv_selection *out) {
    const double t0 = ckv_time_now();
    CKV_TRY(layer_scores(cfg, in, out));
    CKV_TRY(gather_heads(in, out));
    CKV_TRY(in->be->ops->sync(in->be));
    out->score_seconds = ckv_time_now() - t0;
    return CKV_STATUS_OK;
}

ckv_status ckv_evict_layer(const ckv_press_config *cfg, const ckv_score_inputs *in, const ckv_head_budgets *hb,
                           ckv_selection *out) {
    const int L = in->L, nkv = in->n_kv_local, H = in->n_kv_heads;
    if (cfg->alloc == CKV_ALLOC_MODEL)
        return ckv_error(CKV_STATUS_ERR_ARG, "press %s selects over every layer at once (one top-k over the model), "
                         "not one layer at a time", ckv_scorer_name(cfg->scorer));
    ckv_backend *be = in->be;
    double t0 = ckv_time_now();
    CKV_TRY(layer_scores(cfg, in, out));
    ckv_press_kept kept;
    ckv_press_layer_kept(cfg, in->layer, in->n_layers, L, H, &kept);
    const int n_kept = kept.per_head;
    out->n_kept = n_kept;
    if (cfg->critical) CKV_TRY(ckv_critical_value_norm(in, out->norms));
    CKV_TRY(be->ops->sync(be));
    double t1 = ckv_time_now();
    out->score_seconds = t1 - t0;

    const float eps = (float)cfg->eps;
    int32_t *b1 = out->b1_host, *budget = out->budget_host; // host [H] each, kept with the selection
    ckv_status st = CKV_STATUS_OK;
    if (cfg->alloc == CKV_ALLOC_CHUNK) {
        st = gather_heads(in, out);
        if (st == CKV_STATUS_OK) st = chunk_rows(cfg, in, out, n_kept);
    } else if (st == CKV_STATUS_OK && (cfg->alloc == CKV_ALLOC_UNIFORM || cfg->alloc == CKV_ALLOC_PER_LAYER)) {
        for (int h = 0; h < nkv; h++) {
            b1[h] = kept.first_stage;
            out->n_keep[h] = n_kept;
        }
        st = cfg->critical ? critical_rows(be, out, out->scores, out->norms, nkv, L, b1, out->n_keep, eps)
             : cfg->scorer == CKV_SCORER_FINCH && cfg->chunk_length > 0 && cfg->budget_tokens <= 0
                 ? finch_chunk_rows(cfg, be, out, nkv, L)
                 : topk_rows(be, out, out->scores, nkv, L, out->n_keep);
    } else if (st == CKV_STATUS_OK) {
        st = gather_heads(in, out);
        if (st == CKV_STATUS_OK && cfg->alloc == CKV_ALLOC_HEADKV) {
            if (!hb || hb->n_kv_heads != H) st = ckv_error(CKV_STATUS_ERR_ARG, "headkv: no budgets for layer %d", in->layer);
            for (int h = 0; h < H && st == CKV_STATUS_OK; h++) budget[h] = hb->budget[h] < L ? hb->budget[h] : L;
        } else if (st == CKV_STATUS_OK) {
            st = allocate_budgets(cfg, be, out, H, L, &kept, budget);
        }
        /* the local heads' rows of the safeguarded scores (adakv), else of the base scores */
        const float *s = out->all + (size_t)in->kv_head0 * (size_t)L;
        for (int h = 0; h < nkv && st == CKV_STATUS_OK; h++) {
            const int k = budget[in->kv_head0 + h];
            out->n_keep[h] = k;
            b1[h] = ckv_press_first_stage(cfg, k);
        }
        if (st == CKV_STATUS_OK)
            st = cfg->critical ? critical_rows(be, out, s, out->norms, nkv, L, b1, out->n_keep, eps)
                               : topk_rows(be, out, s, nkv, L, out->n_keep);
    }
    if (st == CKV_STATUS_OK) st = be->ops->sync(be);
    out->select_seconds = ckv_time_now() - t1;
    return st;
}
