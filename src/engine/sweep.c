/* sweep.c - one full-cache prefill per context, every press of a sweep derived from it (see sweep.h). */
#include "engine/sweep.h"

#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"

int ckv_sweep_xn_first(const ckv_press_config *p, int L) {
    return ckv_press_xn_first(p, L); /* the registry says which rows each scorer reads */
}

/* Floats of one layer's block of sw->q. */
static size_t sweep_q_floats(const ckv_sweep *sw, const ckv_model *m) {
    return (size_t)(sw->L - sw->xn_first) * (size_t)m->plan.n_q_local * (size_t)m->cfg.head_dim;
}

/* The layer hook of the shared prefill: keeps rows xn_first .. L-1 of the layer's attention input and
 * the forward's queries of the last q_rows of them (the window scorers of a derived press read what
 * they would read in a prefill of their own). */
static ckv_status keep_inputs(void *ctx, ckv_session *s, int layer, int n_prompt) {
    ckv_sweep *sw = ctx;
    const ckv_model *m = s->model;
    size_t D = (size_t)m->cfg.hidden_size, rows = (size_t)(n_prompt - sw->xn_first);
    if (!rows) return CKV_STATUS_OK;
    ckv_backend *be = m->be;
    CKV_TRY(be->ops->copy(be, sw->xn + (size_t)layer * rows * D, s->xn + (size_t)sw->xn_first * D, rows * D * sizeof(float)));
    const int q_rows = s->q_tail ? (s->q_tail_rows < (int)rows ? s->q_tail_rows : (int)rows) : 0;
    if (layer == 0 || q_rows < sw->q_rows) sw->q_rows = q_rows; /* the same every layer: the chunks are */
    const size_t hq = (size_t)m->plan.n_q_local * (size_t)m->cfg.head_dim, block = sweep_q_floats(sw, m);
    if (!sw->q_rows) return CKV_STATUS_OK;
    return be->ops->copy(be, sw->q + (size_t)layer * block + block - (size_t)sw->q_rows * hq,
                         s->q_tail + (size_t)(s->q_tail_rows - sw->q_rows) * hq, (size_t)sw->q_rows * hq * sizeof(float));
}

ckv_status ckv_sweep_init(ckv_sweep *sw, ckv_engine *e, const int32_t *ids, int n, int reserve, int xn_first) {
    memset(sw, 0, sizeof *sw);
    sw->engine = e;
    if (n < 1 || !ids) return ckv_error(CKV_STATUS_ERR_ARG, "empty context");
    if (xn_first < 0 || xn_first > n) return ckv_error(CKV_STATUS_ERR_ARG, "sweep: first kept row %d outside 0..%d", xn_first, n);
    const ckv_model *m = e->model;
    sw->L = n;
    sw->reserve = reserve;
    sw->xn_first = xn_first;
    size_t bytes = (size_t)m->cfg.n_layers * (size_t)(n - xn_first) * (size_t)m->cfg.hidden_size * sizeof(float);
    ckv_status st = CKV_STATUS_OK;
    if (bytes) st = m->be->ops->alloc(m->be, (void **)&sw->xn, bytes, "sweep attention inputs");
    bytes = (size_t)m->cfg.n_layers * sweep_q_floats(sw, m) * sizeof(float);
    if (bytes && st == CKV_STATUS_OK) st = m->be->ops->alloc(m->be, (void **)&sw->q, bytes, "sweep window queries");
    double t0 = ckv_time_now();
    ckv_prepare_params pp = {.ids = ids, .n = n, .reserve = reserve, .hook = keep_inputs, .hook_ctx = sw};
    if (st == CKV_STATUS_OK) st = ckv_engine_prepare(e, &pp, &sw->full);
    sw->prefill_seconds = ckv_time_now() - t0;
    if (st != CKV_STATUS_OK) ckv_sweep_free(sw);
    return st;
}

void ckv_sweep_free(ckv_sweep *sw) {
    if (!sw) return;
    ckv_prepared_free(&sw->full);
    ckv_kv_cache_free(&sw->spare);
    if (sw->engine && sw->engine->model) {
        sw->engine->model->be->ops->release(sw->engine->model->be, sw->xn);
        sw->engine->model->be->ops->release(sw->engine->model->be, sw->q);
    }
    memset(sw, 0, sizeof *sw);
}

ckv_status ckv_sweep_derive(ckv_sweep *sw, const ckv_press_config *press, int dump_kept, FILE *dump_file,
                            ckv_prepared *pc, ckv_prepared **use) {
    memset(pc, 0, sizeof *pc);
    *use = NULL;
    const int L = sw->L;
    if (press && !ckv_press_evicts(press)) press = NULL;
    if (press && press->scorer == CKV_SCORER_FINCH) /* a derived context is the shared prefill's: no question */
        return ckv_error(CKV_STATUS_ERR_ARG, "press finch compresses a context with its question; a sweep derives "
                         "contexts without one (prefill it on its own)");
    const char *why = press ? ckv_compress_skip_reason(press, L) : NULL;
    if (!press || why) { /* the full cache, as a separate run leaves it */
        sw->full.uncompressed_reason = why;
        sw->full.stats.uncompressed_reason = why;
        *use = &sw->full;
        return CKV_STATUS_OK;
    }
    if (ckv_sweep_xn_first(press, L) < sw->xn_first)
        return ckv_error(CKV_STATUS_ERR_ARG, "sweep: press %s reads attention inputs from row %d, the sweep kept them from row %d",
                         press->spec, ckv_sweep_xn_first(press, L), sw->xn_first);
    ckv_engine *e = sw->engine;
    ckv_model *m = e->model;
    const ckv_model_config *c = &m->cfg;
    ckv_session *src = &sw->full.sess;
    double t0 = ckv_time_now();
    pc->engine = e;
    pc->compressed = 1;
    pc->press_spec = press->spec;
    pc->cz.cfg = press;
    pc->cz.dump = dump_kept;
    pc->cz.dump_kept = dump_file;
    ckv_status st = CKV_STATUS_OK;
    if (press->alloc == CKV_ALLOC_HEADKV) {
        CKV_TRY_GOTO(st, ckv_compress_headkv_budgets(press, c, L, &pc->headkv), fail);
        pc->cz.headkv_budgets = pc->headkv;
    }
    CKV_TRY_GOTO(st, ckv_session_init_kv(&pc->sess, m, src->capacity, src->chunk, CKV_SESSION_DERIVED, src->kv.dtype), fail);
    if (sw->spare.layers) CKV_TRY_GOTO(st, ckv_kv_cache_move_pools(&pc->sess.kv, &sw->spare), fail);
    size_t D = (size_t)c->hidden_size, rows = (size_t)(L - sw->xn_first);
    const size_t block = sweep_q_floats(sw, m), hq = (size_t)m->plan.n_q_local * (size_t)c->head_dim;
    for (int l = 0; l < c->n_layers && st == CKV_STATUS_OK; l++) {
        if (rows) st = m->be->ops->copy(m->be, src->xn + (size_t)sw->xn_first * D, sw->xn + (size_t)l * rows * D,
                                        rows * D * sizeof(float));
        /* the layer's kept queries, as its hook saw the forward's */
        src->q_tail = sw->q_rows ? sw->q + (size_t)l * block + block - (size_t)sw->q_rows * hq : NULL;
        src->q_tail_rows = sw->q_rows;
        src->q_tail_end = L;
        src->q_tail_layer = l;
        if (st == CKV_STATUS_OK) st = ckv_compress_layer_from(&pc->cz, &pc->sess, src, l, L);
    }
    src->q_tail = NULL;
    CKV_TRY_GOTO(st, st, fail);
    CKV_TRY_GOTO(st, m->be->ops->sync(m->be), fail);
    pc->sess.n_past = L;
    pc->n_context = L;
    CKV_TRY_GOTO(st, ckv_compress_context_end(press, &pc->sess), fail);
    CKV_TRY_GOTO(st, ckv_alloc((void **)&pc->logits, sizeof(float) * (size_t)c->vocab_size, "context logits"), fail);
    memcpy(pc->logits, sw->full.logits, sizeof(float) * (size_t)c->vocab_size);
    CKV_TRY_GOTO(st, ckv_session_mark(&pc->sess), fail);
    pc->ready = 1;
    pc->prepare_seconds = ckv_time_now() - t0;
    ckv_prepared_fill_stats(pc, 0); /* prefilled once for the sweep: the context counts as reused */
    *use = pc;
    return CKV_STATUS_OK;
fail:
    ckv_prepared_free(pc);
    return st;
}

void ckv_sweep_release(ckv_sweep *sw, ckv_prepared *pc) {
    ckv_kv_cache *kv = &pc->sess.kv;
    if (kv->layers && !sw->spare.layers &&
        ckv_kv_cache_init(&sw->spare, kv->be, kv->n_layers, kv->n_kv, kv->head_dim, kv->dtype) != CKV_STATUS_OK)
        ckv_error_clear(); /* no spare: the next derive allocates its pools */
    if (kv->layers && sw->spare.layers && ckv_kv_cache_move_pools(&sw->spare, kv) != CKV_STATUS_OK) ckv_error_clear();
    ckv_prepared_free(pc);
}
