/* decode_press.c - decode-time compression every N decode steps (see decode_press.h). */
#include "engine/decode_press.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"
#include "engine/compress.h"

/* The interval and either target (> 0) or ratio (>= 0), each error naming its field. */
static ckv_status check_counts(int interval, int target, double ratio) {
    if (interval < 1) return ckv_error(CKV_STATUS_ERR_ARG, "decode interval must be >= 1 decode steps, got %d", interval);
    int by_ratio = ratio >= 0;
    if (by_ratio && target > 0) return ckv_error(CKV_STATUS_ERR_ARG, "decode target and decode ratio exclude each other");
    if (by_ratio && !(ratio < 1)) return ckv_error(CKV_STATUS_ERR_ARG, "decode ratio must be in [0, 1), got %g", ratio);
    if (!by_ratio && target < 1) return ckv_error(CKV_STATUS_ERR_ARG, "decode target must be >= 1 entries per head, got %d", target);
    return CKV_STATUS_OK;
}

ckv_status ckv_decode_press_build(ckv_decode_press *dp, const char *spec, int interval, int target, double ratio,
                                  const ckv_press_option_value *options, int n_options) {
    memset(dp, 0, sizeof *dp);
    dp->ratio = -1;
    if (!spec || !*spec) return ckv_error(CKV_STATUS_ERR_ARG, "decode press: no press given");
    if (!strcmp(spec, "none")) return ckv_error(CKV_STATUS_ERR_ARG, "decode press: 'none' does not compress");
    CKV_TRY(check_counts(interval, target, ratio));
    int by_ratio = ratio >= 0;
    ckv_press_request rq = {.spec = spec, .budget = {CKV_BUDGET_TOKENS, by_ratio ? 1 : target}, .options = options,
                            .n_options = n_options, .query_aware = 0, .flags = CKV_PRESS_ANY_OPTIONS};
    ckv_press_error err;
    if (ckv_press_build(&dp->press, &rq, &err) != CKV_STATUS_OK) {
        char msg[600];
        snprintf(msg, sizeof msg, "%s", ckv_error_message());
        return ckv_error(CKV_STATUS_ERR_ARG, "decode press: %s", msg);
    }
    const ckv_press_config *c = &dp->press;
    if (!ckv_press_evicts(c)) return ckv_error(CKV_STATUS_ERR_ARG, "decode press: '%s' does not compress", spec);
    if (ckv_press_xn_first(c, 2) != 2) /* the scorer reads attention inputs (queries of a window, all rows) */
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "decode press '%s' scores with the attention input, which decoding does not keep; give an "
                         "attention-free press: knorm, keydiff, streaming_llm, random, lagkv, cur, leverage", spec);
    if (c->scorer == CKV_SCORER_KVZIP) /* reads no attention input, but replays the context through the model */
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "decode press 'kvzip' scores by replaying the whole context through the model after its "
                         "prefill, which a decode step does not do; give an attention-free press: knorm, keydiff, "
                         "streaming_llm, random, lagkv, cur, leverage");
    if (c->critical || c->alloc != CKV_ALLOC_UNIFORM)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "decode press '%s': wrappers and cross-head allocation are not decode presses (give a plain "
                         "press: knorm, keydiff, streaming_llm, random, lagkv, cur, leverage)", spec);
    return ckv_decode_press_set_counts(dp, interval, target, ratio);
}

ckv_status ckv_decode_press_set_counts(ckv_decode_press *dp, int interval, int target, double ratio) {
    CKV_TRY(check_counts(interval, target, ratio));
    int by_ratio = ratio >= 0;
    dp->interval = interval;
    dp->target = by_ratio ? 0 : target;
    dp->ratio = by_ratio ? ratio : -1;
    const ckv_press_config *c = &dp->press;
    int base = (int)strcspn(c->spec, " "); /* the press and its options, without the budget */
    if (by_ratio)
        snprintf(dp->spec, sizeof dp->spec, "%.*s interval=%d ratio=%g", base, c->spec, interval, ratio);
    else
        snprintf(dp->spec, sizeof dp->spec, "%.*s interval=%d target=%d", base, c->spec, interval, target);
    return CKV_STATUS_OK;
}

ckv_status ckv_decode_press_check_prefill(const ckv_decode_press *dp, const ckv_press_config *prefill) {
    if (!dp || !prefill || !ckv_press_evicts(prefill)) return CKV_STATUS_OK;
    if (prefill->alloc != CKV_ALLOC_UNIFORM)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "decode press %s after press %s: its heads keep different numbers of rows, and decode-time "
                         "compression cuts every head of a layer to the same target; use a press without cross-head "
                         "allocation", dp->spec, prefill->spec);
    return CKV_STATUS_OK;
}

int ckv_decode_press_target(const ckv_decode_press *dp, long n_seen) {
    if (dp->ratio < 0) return dp->target;
    double k = floor((double)n_seen * (1.0 - dp->ratio));
    return k < 1 ? 1 : k > 1e9 ? 1000000000 : (int)k;
}

ckv_status ckv_decode_state_init(ckv_decode_state *ds, const ckv_decode_press *dp, ckv_session *s, int dump,
                                 FILE *dump_file) {
    memset(ds, 0, sizeof *ds);
    ds->dp = dp;
    ds->s = s;
    ds->cfg = dp->press;
    ds->dump = dump;
    ds->dump_file = dump_file;
    const ckv_model *m = s->model;
    ckv_status st = ckv_selection_init(&ds->sel, m->be, m->plan.n_kv_local, m->cfg.n_kv_heads, s->capacity);
    if (st == CKV_STATUS_OK) st = ckv_kv_keep_ws_init(&ds->ws, &s->kv);
    size_t per = (size_t)m->plan.n_kv_local * ((size_t)s->capacity + 1);
    int size = m->tp ? m->tp->size : 1;
    if (st == CKV_STATUS_OK && dump) st = ckv_alloc((void **)&ds->dump_mine, per * sizeof(int32_t), "decode kept dump");
    if (st == CKV_STATUS_OK && dump)
        st = ckv_alloc((void **)&ds->dump_all, per * (size_t)size * sizeof(int32_t), "decode kept dump gather");
    if (st != CKV_STATUS_OK) ckv_decode_state_free(ds);
    return st;
}

void ckv_decode_state_free(ckv_decode_state *ds) {
    if (!ds) return;
    ckv_selection_free(&ds->sel);
    ckv_score_arena_free(&ds->arena);
    ckv_kv_keep_ws_free(&ds->ws);
    ckv_free(ds->dump_mine);
    ckv_free(ds->dump_all);
    memset(ds, 0, sizeof *ds);
}

/* Writes the kept positions of every KV head of the model after `layer` was cut: rank 0 gathers
 * every rank's heads (replicas hold the same head: written once). */
static ckv_status dump_layer(ckv_decode_state *ds, int layer, const ckv_score_inputs *in) {
    ckv_session *s = ds->s;
    ckv_model *m = s->model;
    ckv_comm *tp = m->tp;
    const ckv_kv_layer *kl = &s->kv.layers[layer];
    int nkv = s->kv.n_kv, size = tp ? tp->size : 1, cap = s->capacity;
    size_t per = (size_t)nkv * ((size_t)cap + 1);
    for (int h = 0; h < nkv; h++) {
        int32_t *row = ds->dump_mine + (size_t)h * (cap + 1);
        row[0] = kl->len[h];
        CKV_TRY(m->be->ops->download(m->be, row + 1, kl->pos + kl->off[h], (size_t)kl->len[h] * sizeof(int32_t)));
    }
    if (size > 1) CKV_TRY(tp->ops->allgather(tp, ds->dump_mine, ds->dump_all, per * sizeof(int32_t)));
    else memcpy(ds->dump_all, ds->dump_mine, per * sizeof(int32_t));
    if (!ds->dump_file) return CKV_STATUS_OK;
    int last = -1;
    for (int r = 0; r < size; r++) {
        int head0 = ckv_score_rank_kv_head0(in, r);
        for (int h = 0; h < nkv; h++) {
            if (head0 + h <= last) continue;
            last = head0 + h;
            const int32_t *row = ds->dump_all + (size_t)r * per + (size_t)h * (cap + 1);
            fprintf(ds->dump_file, "{\"step\": %d, \"layer\": %d, \"kv_head\": %d, \"n_kept\": %d, \"positions\": [",
                    ds->answer_steps, layer, last, row[0]);
            for (int i = 0; i < row[0]; i++) fprintf(ds->dump_file, i ? ", %d" : "%d", row[1 + i]);
            fprintf(ds->dump_file, "]}\n");
        }
    }
    return ferror(ds->dump_file) ? ckv_error(CKV_STATUS_ERR_IO, "--dump-kept: write error") : CKV_STATUS_OK;
}

/* Cuts one layer to `target` rows per head (its heads hold the same rows: a uniform cache). */
static ckv_status cut_layer(ckv_decode_state *ds, int layer, int target, int *evicted) {
    ckv_session *s = ds->s;
    const ckv_kv_layer *kl = &s->kv.layers[layer];
    const int nkv = s->kv.n_kv, L = kl->len[0];
    for (int h = 1; h < nkv; h++)
        if (kl->len[h] != L)
            return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "decode press: layer %d head %d holds %d rows, head 0 %d "
                             "(decode-time compression needs the same rows on every head)", layer, h, kl->len[h], L);
    if (L <= target) return CKV_STATUS_OK; /* kvpress: compression ratio 0, nothing removed */
    ds->cfg.budget_tokens = target;
    CKV_TRY(ckv_press_check_context(&ds->cfg, L));
    CKV_TRY(ckv_selection_set_len(&ds->sel, L));
    ckv_score_inputs in;
    ckv_compress_score_inputs(s, layer, L, &in);
    in.arena = &ds->arena;
    in.xn = NULL; /* the decode presses read keys and values only */
    CKV_TRY(ckv_evict_layer(&ds->cfg, &in, NULL, &ds->sel));
    CKV_TRY(ckv_kv_layer_keep(&s->kv, layer, ds->sel.rows, L, ds->sel.n_keep, &ds->ws));
    /* every head of the model is cut to the same target: the model's heads evict what this rank's head 0 does */
    ds->evicted_entries += (long)(L - ds->sel.n_keep[0]) * s->model->cfg.n_kv_heads;
    *evicted = 1;
    return ds->dump ? dump_layer(ds, layer, &in) : CKV_STATUS_OK;
}

ckv_status ckv_decode_state_step(ckv_decode_state *ds, int *evicted) {
    if (evicted) *evicted = 0;
    ckv_session *s = ds->s;
    ds->steps++;
    ds->answer_steps++;
    int target = ckv_decode_press_target(ds->dp, s->n_past); /* n_past: positions seen, the current token's included */
    if (ds->steps < ds->dp->interval && target > 1) return CKV_STATUS_OK; /* kvpress: step count or q_len >= target */
    ds->steps = 0;
    double t0 = ckv_time_now();
    int any = 0;
    for (int l = 0; l < s->model->cfg.n_layers; l++) CKV_TRY(cut_layer(ds, l, target, &any));
    if (any) ds->compressions++;
    ds->seconds += ckv_time_now() - t0;
    if (evicted) *evicted = any;
    return CKV_STATUS_OK;
}
