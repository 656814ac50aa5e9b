/* perturb.c - layer-wise perturbation of the hidden state against the full cache (see perturb.h). */
#include "eval/perturb.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "engine/sweep.h"

typedef struct {
    float *h;  // [n_layers, D] host: the last token's hidden state after each layer
    int D;
} capture;

/* The layer hook of the question prefill: the last row of the hidden states after `layer`. */
static ckv_status capture_layer(void *ctx, ckv_session *s, int layer, int n) {
    capture *c = ctx;
    ckv_backend *be = s->model->be;
    CKV_TRY(be->ops->sync(be));
    return be->ops->download(be, c->h + (size_t)layer * c->D, s->x + (size_t)(n - 1) * c->D, sizeof(float) * (size_t)c->D);
}

/* Feeds the question after the prepared context, capturing every layer, then rewinds. */
static ckv_status run_question(ckv_prepared *pc, const int32_t *q, int n_q, capture *c) {
    CKV_TRY(ckv_session_prefill_hook(&pc->sess, q, n_q, NULL, NULL, capture_layer, c));
    return ckv_session_rewind(&pc->sess);
}

ckv_status ckv_perturb_layerwise(ckv_engine *e, const int32_t *ctx, int n_ctx, const int32_t *q, int n_q,
                                 const ckv_press_config *const *presses, int n_presses, double *rel, double *kept) {
    if (n_q < 1 || !q) return ckv_error(CKV_STATUS_ERR_ARG, "layer-wise perturbation needs at least one question token");
    const int nl = e->model->cfg.n_layers, D = e->model->cfg.hidden_size;
    int xn_first = n_ctx;
    for (int i = 0; i < n_presses; i++) {
        int f = ckv_sweep_xn_first(presses[i], n_ctx);
        if (f < xn_first) xn_first = f;
    }
    capture full = {NULL, D}, comp = {NULL, D};
    ckv_status st = ckv_alloc((void **)&full.h, sizeof(float) * (size_t)nl * D * 2, "layer-wise hidden states");
    if (st != CKV_STATUS_OK) return st;
    comp.h = full.h + (size_t)nl * D;
    ckv_sweep sw;
    st = ckv_sweep_init(&sw, e, ctx, n_ctx, n_q, xn_first);
    if (st == CKV_STATUS_OK) st = run_question(&sw.full, q, n_q, &full);
    for (int i = 0; i < n_presses && st == CKV_STATUS_OK; i++) {
        ckv_prepared pc, *use = NULL;
        st = ckv_sweep_derive(&sw, presses[i], 0, NULL, &pc, &use);
        if (st == CKV_STATUS_OK) st = run_question(use, q, n_q, &comp);
        if (st == CKV_STATUS_OK) {
            for (int l = 0; l < nl; l++) {
                const float *a = full.h + (size_t)l * D, *b = comp.h + (size_t)l * D;
                double num = 0, den = 0;
                for (int k = 0; k < D; k++) {
                    double dlt = (double)b[k] - (double)a[k];
                    num += dlt * dlt;
                    den += (double)a[k] * (double)a[k];
                }
                rel[(size_t)i * nl + l] = den > 0 ? sqrt(num / den) : 0.0;
            }
            const ckv_request_stats *rs = &use->stats;
            if (kept) kept[i] = rs->total_entries ? (double)rs->kept_entries / (double)rs->total_entries : 1.0;
        }
        ckv_sweep_release(&sw, &pc);
    }
    ckv_sweep_free(&sw);
    ckv_free(full.h);
    return st;
}
