/* compress.c - per-layer compression during layer-major prefill (see compress.h). */
#include "engine/compress.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "evict/headkv.h"

/* Writes one JSON line per KV head of the model: rank 0 gathers every rank's kept positions. */
static ckv_status dump_layer(ckv_compressor *cz, const ckv_session *s, int layer, const ckv_selection *sel,
                             const ckv_score_inputs *in) {
    ckv_model *m = s->model;
    ckv_comm *tp = m->tp;
    int L = sel->L, nkv = sel->n_kv_local, size = tp ? tp->size : 1;
    size_t per = (size_t)nkv * (size_t)(L + 1); /* per head: count, then positions */
    int32_t *mine = NULL, *all = NULL, *rows = NULL;
    ckv_status st = ckv_alloc((void **)&mine, per * sizeof(int32_t), "kept dump");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&all, per * (size_t)size * sizeof(int32_t), "kept dump gather");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&rows, (size_t)nkv * (size_t)L * sizeof(int32_t), "kept dump rows");
    if (st == CKV_STATUS_OK) st = ckv_selection_rows_host(sel, rows);
    if (st == CKV_STATUS_OK) {
        for (int h = 0; h < nkv; h++) {
            int32_t *row = mine + (size_t)h * (L + 1);
            row[0] = sel->n_keep[h];
            for (int i = 0; i < sel->n_keep[h]; i++) row[1 + i] = s->pos[rows[(size_t)h * L + i]];
        }
        if (size > 1)
            st = tp->ops->allgather(tp, mine, all, per * sizeof(int32_t));
        else
            memcpy(all, mine, per * sizeof(int32_t));
    }
    if (st == CKV_STATUS_OK && cz->dump_kept) {
        int last = -1;
        for (int r = 0; r < size; r++) {
            int head0 = ckv_score_rank_kv_head0(in, r);
            for (int h = 0; h < nkv; h++) {
                int g = head0 + h;
                if (g <= last) continue; /* replicas hold the same head */
                last = g;
                const int32_t *row = all + (size_t)r * per + (size_t)h * (L + 1);
                fprintf(cz->dump_kept, "{\"layer\": %d, \"kv_head\": %d, \"n_kept\": %d, \"positions\": [", layer, g,
                        row[0]);
                for (int i = 0; i < row[0]; i++) fprintf(cz->dump_kept, i ? ", %d" : "%d", row[1 + i]);
                fprintf(cz->dump_kept, "]}\n");
            }
        }
        if (ferror(cz->dump_kept)) st = ckv_error(CKV_STATUS_ERR_IO, "--dump-kept: write error");
    }
    ckv_free(mine);
    ckv_free(all);
    ckv_free(rows);
    return st;
}

void ckv_compress_score_inputs(const ckv_session *s, int layer, int L, ckv_score_inputs *in) {
    const ckv_model *m = s->model;
    const ckv_model_config *c = &m->cfg;
    const ckv_shard_plan *p = &m->plan;
    ckv_score_inputs v = {
        .layer = layer, .n_layers = c->n_layers, .L = L, .D = c->hidden_size, .head_dim = c->head_dim,
        .n_heads = c->n_heads, .n_kv_heads = c->n_kv_heads, .n_q_local = p->n_q_local, .n_kv_local = p->n_kv_local,
        .q_head0 = p->q_head0, .kv_head0 = p->kv_head0, .kv_replicas = p->kv_replicas, .xn = s->xn, .kv = ckv_kv_layer_batch(&s->kv, layer, 0),
        .pos = s->kv.layers[layer].segs_host[0].pos, /* the context rows' device positions (any head) */
        .wq = &m->layers[layer].wq, .bq = m->layers[layer].bq, .wo = &m->layers[layer].wo,
        .inv_freq = m->inv_freq, .rope_scale = m->rope_scale, .be = m->be, .replica = m->replica, .tp = m->tp,
    };
    if (s->q_tail && s->q_tail_layer == layer && s->q_tail_end == L) { /* in a prefill's hook: the forward's queries */
        v.q_tail = s->q_tail;
        v.q_tail_rows = s->q_tail_rows;
    }
    *in = v;
}

/* key_rerotation (kvpress KeyRerotationPress): row i of each local head, cached at position pos[i]
 * (post-RoPE), is rotated by the angles (float)(i - pos[i]) * inv_freq[j] in fp32, as kvpress does, so
 * the kept keys read as if the context had been n_kept tokens long; positions, values and masks are
 * unchanged (the question still follows at L, L+1, ...). One backend op over the layer's segments
 * after its compaction, in place on the device (kv_rerotate). */
static ckv_status rerotate_layer(ckv_session *s, int layer) {
    ckv_model *m = s->model;
    const ckv_kv_batch b = ckv_kv_layer_batch(&s->kv, layer, 0);
    m->be->ops->kv_rerotate(m->be, &b, m->inv_freq);
    return CKV_STATUS_OK;
}

ckv_status ckv_compress_context_end(const ckv_press_config *cfg, ckv_session *s) {
    if (!cfg || !ckv_press_rerotates(cfg)) return CKV_STATUS_OK;
    const ckv_kv_cache *kv = &s->kv;
    const int n_kept = kv->layers[0].len[0];
    for (int l = 0; l < s->model->cfg.n_layers; l++)
        for (int h = 0; h < kv->n_kv; h++)
            if (kv->layers[l].len[h] != n_kept)
                return ckv_error(CKV_STATUS_ERR_INTERNAL, "press %s re-rotated layer %d head %d to %d rows, layer 0 head 0 "
                                 "to %d: the next position is not one number", cfg->spec, l, h, kv->layers[l].len[h], n_kept);
    s->n_past = n_kept;
    return CKV_STATUS_OK;
}

/* Payload this rank has handed to its collectives so far. */
static unsigned long long comm_now(const ckv_model *m) {
    return (m->tp ? m->tp->bytes : 0) + (m->replica ? m->replica->bytes : 0);
}

/* The kept rows of sel (rows of the L context rows) compacted (dst == src) or gathered from src into
 * dst, then re-rotated when `press` (the compressor's, or a composed press's first) says so. */
static ckv_status compact_layer(ckv_compressor *cz, ckv_session *dst, const ckv_session *src, int layer, int L,
                                const ckv_selection *sel, const ckv_press_config *press) {
    double t0 = ckv_time_now();
    ckv_status st;
    if (dst == src)
        st = ckv_kv_layer_compact_dev(&dst->kv, layer, sel->rows, L, sel->n_keep, dst->capacity - L);
    else
        st = ckv_kv_layer_gather_from(&dst->kv, &src->kv, layer, sel->rows, L, sel->n_keep, dst->capacity - L);
    if (st == CKV_STATUS_OK && ckv_press_rerotates(press)) st = rerotate_layer(dst, layer);
    cz->compact_seconds += ckv_time_now() - t0;
    return st;
}

/* Layer `layer`'s statistics, the observer and the kept-position log (whose gather is added to
 * *log_bytes: it is not compression traffic); sel holds what the layer kept of its L context rows. */
static ckv_status record_layer(ckv_compressor *cz, const ckv_session *src, int layer, int L, const ckv_selection *sel,
                               const ckv_score_inputs *in, ckv_dtype kv_dtype, unsigned long long *log_bytes) {
    ckv_model *m = src->model;
    size_t row_bytes = (size_t)m->cfg.head_dim * 2 * ckv_dtype_size(kv_dtype);
    for (int h = 0; h < m->plan.n_kv_local; h++) {
        cz->kv_bytes_full += (size_t)L * row_bytes;
        cz->kv_bytes_kept += (size_t)sel->n_keep[h] * row_bytes;
        cz->kept_entries += sel->n_keep[h];
        cz->total_entries += L;
    }
    if (cz->observe) cz->observe(cz->observe_ctx, layer, sel);
    ckv_status st = CKV_STATUS_OK;
    if (cz->dump) {
        const unsigned long long b0 = comm_now(m);
        st = dump_layer(cz, src, layer, sel, in);
        *log_bytes += comm_now(m) - b0;
    }
    return st;
}

/* The model-wide buffers of a press that selects across layers. */
static void release_model(ckv_compressor *cz) {
    if (cz->replay_scores && cz->model) cz->model->be->ops->release(cz->model->be, cz->replay_scores);
    cz->replay_scores = NULL;
    if (!cz->model) return;
    ckv_model_selection_free(cz->model);
    free(cz->model);
    cz->model = NULL;
}

/* kvzip at the last layer: the replay's scores of every layer, before the selection reads them. */
static ckv_status kvzip_replay(ckv_compressor *cz, ckv_session *dst, const ckv_session *src, int L) {
    ckv_model *m = src->model;
    if (dst != src)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "press kvzip replays the context through the session that holds it; "
                         "a context derived from another session's cache (a sweep) cannot be replayed");
    const size_t n = (size_t)m->cfg.n_layers * (size_t)m->plan.n_kv_local * (size_t)L;
    CKV_TRY(m->be->ops->alloc(m->be, (void **)&cz->replay_scores, n * sizeof(float), "kvzip scores"));
    const double t0 = ckv_time_now();
    const ckv_status st = ckv_kvzip_score(dst, cz->cfg, cz->context_ids, L, cz->replay_scores);
    cz->score_seconds += ckv_time_now() - t0;
    return st;
}

/* Applies layer `layer`'s selection: compaction, then its record. */
static ckv_status apply_layer(ckv_compressor *cz, ckv_session *dst, const ckv_session *src, int layer, int L,
                              const ckv_selection *sel, const ckv_score_inputs *in, unsigned long long *log_bytes) {
    CKV_TRY(compact_layer(cz, dst, src, layer, L, sel, cz->cfg));
    return record_layer(cz, src, layer, L, sel, in, dst->kv.dtype, log_bytes);
}

/* A composed press's host rows (a partial set too). */
static void free_composed(ckv_compressor *cz) {
    ckv_free(cz->composed_rows);
    ckv_free(cz->composed_r2);
    ckv_free(cz->composed_scores);
    cz->composed_rows = cz->composed_r2 = NULL;
    cz->composed_scores = NULL;
    cz->composed_cap = 0;
}

/* One later press of a composed press on dst's compacted layer (every head holds n rows): scores and
 * selects on those rows in position order, with its own wrappers (critical:, chunkkv:), into the
 * compressor's selection (its length set to n; its buffers hold L), compacts the layer in place
 * (re-rotating the kept keys for a key_rerotation: member), and maps the kept rows back to context
 * rows: rows [n_kv_local, L] (host) holds, per head, the context rows kept so far. */
static ckv_status composed_stage(ckv_compressor *cz, ckv_session *dst, int layer, int L, int stage, int32_t *rows,
                                 int32_t *n_keep, int32_t *r2) {
    ckv_model *m = dst->model;
    const int nkv = m->plan.n_kv_local, n = dst->kv.layers[layer].len[0];
    ckv_press_config sc;
    ckv_press_stage(cz->cfg, stage, &sc);
    ckv_press_kept kept; /* a per_layer: member's count is its layer's */
    ckv_press_layer_kept(&sc, layer, m->cfg.n_layers, n, nkv, &kept);
    if (kept.per_head >= n) return CKV_STATUS_OK; /* it keeps every row */
    ckv_selection *s2 = &cz->sel;
    CKV_TRY(ckv_selection_set_len(s2, n));
    ckv_score_inputs in;
    ckv_compress_score_inputs(dst, layer, n, &in);
    in.arena = &cz->arena;
    in.xn = NULL; /* a later press reads keys and values only */
    in.q_tail = NULL;
    CKV_TRY(ckv_evict_layer(&sc, &in, NULL, s2));
    CKV_TRY(ckv_selection_rows_host(s2, r2)); /* [nkv, n] this press's kept rows of the n */
    for (int h = 0; h < nkv; h++) {
        int32_t *rh = rows + (size_t)h * L;
        const int32_t *kh = r2 + (size_t)h * n;
        for (int j = 0; j < s2->n_keep[h]; j++) rh[j] = rh[kh[j]]; /* kh ascending, kh[j] >= j: in place */
        n_keep[h] = s2->n_keep[h];
    }
    cz->score_seconds += s2->score_seconds;
    cz->select_seconds += s2->select_seconds;
    const double t0 = ckv_time_now();
    ckv_status st = ckv_kv_layer_compact_dev(&dst->kv, layer, s2->rows, n, s2->n_keep, dst->capacity - L);
    if (st == CKV_STATUS_OK && ckv_press_rerotates(&sc)) st = rerotate_layer(dst, layer); /* key_rerotation: member */
    cz->compact_seconds += ckv_time_now() - t0;
    return st;
}

/* composed (kvpress ComposedPress): the first press selects on the layer's L context rows and the
 * layer is compacted; each later press then keeps its share of the rows left (composed_stage); sel
 * ends holding the context rows kept after the last press (for the record). */
static ckv_status composed_layer(ckv_compressor *cz, ckv_session *dst, const ckv_session *src, int layer, int L,
                                 ckv_selection *sel, unsigned long long *log_bytes) {
    ckv_model *m = src->model;
    const int nkv = m->plan.n_kv_local;
    ckv_press_config first;
    ckv_press_stage(cz->cfg, 0, &first);
    ckv_score_inputs in;
    ckv_compress_score_inputs(src, layer, L, &in);
    in.arena = &cz->arena;
    CKV_TRY(ckv_evict_layer(&first, &in, NULL, sel));
    cz->score_seconds += sel->score_seconds;
    cz->select_seconds += sel->select_seconds;
    CKV_TRY(compact_layer(cz, dst, src, layer, L, sel, &first));
    if (cz->cfg->n_stages < 2) return record_layer(cz, src, layer, L, sel, &in, dst->kv.dtype, log_bytes);
    const size_t n = (size_t)nkv * (size_t)L;
    if (cz->composed_cap < n) { /* the first layer of a context: the layers after it reuse them */
        free_composed(cz);
        CKV_TRY(ckv_alloc((void **)&cz->composed_rows, n * sizeof(int32_t), "composed rows"));
        CKV_TRY(ckv_alloc((void **)&cz->composed_r2, n * sizeof(int32_t), "composed rows"));
        CKV_TRY(ckv_alloc((void **)&cz->composed_scores, n * sizeof(float), "composed scores"));
        cz->composed_cap = n;
    }
    int32_t *rows = cz->composed_rows, *r2 = cz->composed_r2; /* [nkv, L] kept so far; a later press's rows */
    float *first_scores = cz->composed_scores;                 /* [nkv, L] the first press's scores (the record's) */
    ckv_status st = ckv_selection_rows_host(sel, rows);
    if (st == CKV_STATUS_OK) st = m->be->ops->download(m->be, first_scores, sel->scores, n * sizeof(float));
    for (int i = 1; i < cz->cfg->n_stages && st == CKV_STATUS_OK; i++)
        st = composed_stage(cz, dst, layer, L, i, rows, sel->n_keep, r2);
    if (st == CKV_STATUS_OK) st = ckv_selection_set_len(sel, L); /* the record reads rows of the L context rows */
    if (st == CKV_STATUS_OK) st = m->be->ops->upload(m->be, sel->rows, rows, n * sizeof(int32_t));
    if (st == CKV_STATUS_OK) st = m->be->ops->upload(m->be, sel->scores, first_scores, n * sizeof(float));
    if (st == CKV_STATUS_OK) st = record_layer(cz, src, layer, L, sel, &in, dst->kv.dtype, log_bytes);
    return st;
}

/* A press that selects across layers (CKV_ALLOC_MODEL): layer `layer` is scored and left whole; after
 * the last layer, one count over the model, then every layer compacted (or gathered) to its share.
 * The model-wide buffers live from the first layer to the last (ckv_compressor_release on an abort). */
static ckv_status model_layer(ckv_compressor *cz, ckv_session *dst, const ckv_session *src, int layer, int L,
                              ckv_selection *sel, unsigned long long *log_bytes) {
    ckv_model *m = src->model;
    const ckv_model_config *c = &m->cfg;
    const ckv_shard_plan *p = &m->plan;
    ckv_status st = CKV_STATUS_OK;
    if (layer == 0) release_model(cz);
    if (!cz->model) {
        if (layer != 0)
            return ckv_error(CKV_STATUS_ERR_ARG, "press %s: layer %d compressed before layer 0", cz->cfg->spec, layer);
        if (!(cz->model = calloc(1, sizeof *cz->model))) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
        CKV_TRY(ckv_model_selection_init(cz->model, m->be, c->n_layers, p->n_kv_local, c->n_kv_heads, L));
    }
    ckv_score_inputs in;
    if (cz->cfg->scorer == CKV_SCORER_KVZIP) { /* scored by its replay, once every layer holds the context */
        if (layer < c->n_layers - 1) return CKV_STATUS_OK;
        CKV_TRY(kvzip_replay(cz, dst, src, L));
        for (int l = 0; l < c->n_layers; l++) {
            ckv_compress_score_inputs(src, l, L, &in);
            in.arena = &cz->arena;
            in.given = cz->replay_scores + (size_t)l * (size_t)p->n_kv_local * (size_t)L;
            CKV_TRY(ckv_model_select_score(cz->cfg, &in, cz->model, sel));
        }
    } else {
        ckv_compress_score_inputs(src, layer, L, &in);
        in.arena = &cz->arena;
        CKV_TRY(ckv_model_select_score(cz->cfg, &in, cz->model, sel));
        cz->score_seconds += sel->score_seconds;
        if (layer < c->n_layers - 1) return CKV_STATUS_OK;
    }
    st = ckv_model_select_count(cz->cfg, cz->model);
    for (int l = 0; l < c->n_layers && st == CKV_STATUS_OK; l++) {
        const ckv_kv_layer *kl = &src->kv.layers[l];
        for (int h = 0; h < p->n_kv_local && st == CKV_STATUS_OK; h++)
            if (kl->len[h] != L)
                st = ckv_error(CKV_STATUS_ERR_INTERNAL, "layer %d head %d holds %d rows, expected %d", l, h, kl->len[h], L);
        ckv_compress_score_inputs(src, l, L, &in);
        in.arena = &cz->arena;
        if (st == CKV_STATUS_OK) st = ckv_model_select_layer(cz->model, l, p->kv_head0, sel);
        if (st == CKV_STATUS_OK) st = apply_layer(cz, dst, src, l, L, sel, &in, log_bytes);
    }
    cz->select_seconds += cz->model->select_seconds;
    release_model(cz);
    return st;
}

/* What a compressor keeps from one layer of a context to the next: the selection buffers, the
 * scorers' arena, a composed press's host rows and kvzip's context ids. */
static void release_context(ckv_compressor *cz) {
    ckv_selection_free(&cz->sel);
    ckv_score_arena_free(&cz->arena);
    free_composed(cz);
    ckv_free(cz->context_ids);
    cz->context_ids = NULL;
}

/* Everything a compressor holds between layers: release_context's buffers and the model-wide
 * buffers of a press that selects across layers. */
void ckv_compressor_release(ckv_compressor *cz) {
    if (!cz) return;
    release_context(cz);
    release_model(cz);
}

/* The compressor's selection buffers for a layer of L context rows: kept from the layer before when
 * they hold that many (the layers of one context all have L), else sized anew. */
static ckv_status compressor_selection(ckv_compressor *cz, ckv_model *m, int L) {
    ckv_selection *s = &cz->sel;
    if (s->be == m->be && s->n_kv_local == m->plan.n_kv_local && s->n_kv_heads == m->cfg.n_kv_heads && L <= s->cap_L)
        return ckv_selection_set_len(s, L);
    ckv_selection_free(s);
    return ckv_selection_init(s, m->be, m->plan.n_kv_local, m->cfg.n_kv_heads, L);
}

ckv_status ckv_compress_layer_from(ckv_compressor *cz, ckv_session *dst, const ckv_session *src, int layer, int L) {
    ckv_model *m = src->model;
    const ckv_model_config *c = &m->cfg;
    const ckv_shard_plan *p = &m->plan;
    if (!ckv_press_evicts(cz->cfg)) return CKV_STATUS_OK;
    CKV_TRY(ckv_press_check_layers(cz->cfg, c->n_layers));
    if (dst->n_past != 0) /* (src may hold its context already: its layer's rows are checked below) */
        return ckv_error(CKV_STATUS_ERR_ARG, "compression applies to the first prefill of a session (the context)");
    if (dst->model != m || dst->capacity < L)
        return ckv_error(CKV_STATUS_ERR_ARG, "compression into a session of another model or fewer than %d tokens", L);
    const ckv_kv_layer *kl = &src->kv.layers[layer];
    for (int h = 0; h < p->n_kv_local; h++)
        if (kl->len[h] != L) return ckv_error(CKV_STATUS_ERR_INTERNAL, "layer %d head %d holds %d rows, expected %d", layer, h, kl->len[h], L);
    CKV_TRY(compressor_selection(cz, m, L));
    ckv_selection *sel = &cz->sel;
    const unsigned long long bytes0 = comm_now(m);
    unsigned long long log_bytes = 0;
    ckv_status st;
    if (cz->cfg->alloc == CKV_ALLOC_MODEL) {
        st = model_layer(cz, dst, src, layer, L, sel, &log_bytes);
        if (st != CKV_STATUS_OK) release_model(cz);
    } else if (cz->cfg->composed) {
        st = composed_layer(cz, dst, src, layer, L, sel, &log_bytes);
    } else {
        ckv_score_inputs in;
        ckv_compress_score_inputs(src, layer, L, &in);
        in.arena = &cz->arena;
        ckv_head_budgets hb = {c->n_kv_heads, cz->headkv_budgets ? cz->headkv_budgets + (size_t)layer * c->n_kv_heads : NULL};
        st = ckv_evict_layer(cz->cfg, &in, cz->headkv_budgets ? &hb : NULL, sel);
        if (st == CKV_STATUS_OK) {
            cz->score_seconds += sel->score_seconds;
            cz->select_seconds += sel->select_seconds;
            st = apply_layer(cz, dst, src, layer, L, sel, &in, &log_bytes);
        }
    }
    cz->comm_bytes += comm_now(m) - bytes0 - log_bytes;
    if (st != CKV_STATUS_OK || layer == c->n_layers - 1) release_context(cz); /* the context is done */
    return st;
}

ckv_status ckv_compress_layer_hook(void *ctx, ckv_session *s, int layer, int n_prompt) {
    return ckv_compress_layer_from(ctx, s, s, layer, n_prompt);
}

const char *ckv_compress_skip_reason(const ckv_press_config *p, int L) {
    ckv_status st = ckv_press_check_context(p, L);
    ckv_error_clear();
    if (st != CKV_STATUS_OK) return L < 2 ? "the context is too short to compress" : "the context is not longer than the press window";
    if (p->alloc != CKV_ALLOC_HEADKV && ckv_press_n_kept(p, L) >= L) return "the budget keeps every token of the context";
    return NULL;
}

ckv_status ckv_compress_headkv_budgets(const ckv_press_config *pr, const ckv_model_config *mc, int L, int32_t **out) {
    *out = NULL;
    ckv_headkv_profile prof;
    CKV_TRY(ckv_headkv_load(&prof, pr->profile, mc->n_layers, mc->n_kv_heads));
    int head = 0, tail = 0; /* the tokens the base scorer protects are kept beside each head's share */
    ckv_press_protected(pr, L, &head, &tail);
    prof.window = head + tail;
    int32_t *b = malloc(sizeof *b * (size_t)mc->n_layers * (size_t)mc->n_kv_heads);
    ckv_status st = b ? ckv_headkv_budgets(&prof, L, ckv_press_n_kept(pr, L), b)
                      : ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for headkv budgets");
    ckv_headkv_free(&prof);
    if (st != CKV_STATUS_OK) {
        free(b);
        return st;
    }
    *out = b;
    return CKV_STATUS_OK;
}
