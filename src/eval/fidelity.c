/* fidelity.c - teacher-forced comparison of a compressed cache with the full one (see fidelity.h). */
#include "eval/fidelity.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/request.h"
#include "engine/sweep.h"

double ckv_kl_logits(const float *p, const float *q, int V) {
    double mp = p[0], mq = q[0];
    for (int i = 1; i < V; i++) {
        if (p[i] > mp) mp = p[i];
        if (q[i] > mq) mq = q[i];
    }
    double zp = 0, zq = 0;
    for (int i = 0; i < V; i++) {
        zp += exp((double)p[i] - mp);
        zq += exp((double)q[i] - mq);
    }
    double lzp = log(zp) + mp, lzq = log(zq) + mq, kl = 0;
    for (int i = 0; i < V; i++) {
        double lp = (double)p[i] - lzp, lq = (double)q[i] - lzq;
        kl += exp(lp) * (lp - lq);
    }
    return kl > 0 ? kl : 0;
}

static double nll(const float *row, int V, int32_t target) {
    double mx = row[0], z = 0;
    for (int i = 1; i < V; i++)
        if (row[i] > mx) mx = row[i];
    for (int i = 0; i < V; i++) z += exp((double)row[i] - mx);
    return log(z) + mx - (double)row[target];
}

/* Prepares the context (compressed when a press is given) and feeds the continuation with all its
 * logits into out [n_cont, V] (engine/request.h). */
static ckv_status run(ckv_model *m, const ckv_press_config *press, const int32_t *ids, int n_ctx, int n_cont, int chunk,
                      float *out, ckv_fidelity *res) {
    ckv_engine e;
    CKV_TRY(ckv_engine_wrap(&e, m, chunk, NULL));
    ckv_prepare_params pp = {.ids = ids, .n = n_ctx, .press = press, .reserve = n_cont};
    ckv_prepared pc;
    ckv_status st = ckv_engine_prepare(&e, &pp, &pc);
    if (st == CKV_STATUS_OK) st = ckv_prepared_forward(&pc, ids + n_ctx, n_cont, out);
    if (st == CKV_STATUS_OK && res) {
        res->kv_kept_frac = pc.stats.total_entries ? (double)pc.stats.kept_entries / (double)pc.stats.total_entries : 1.0;
        res->prefill_s = pc.prepare_seconds;
        res->evict_s = pc.stats.score_seconds + pc.stats.select_seconds + pc.stats.compact_seconds;
        res->score_s = pc.stats.score_seconds;
        res->select_s = pc.stats.select_seconds;
    }
    ckv_prepared_free(&pc);
    ckv_engine_free(&e);
    return st;
}

ckv_status ckv_fidelity_reference(ckv_model *m, const int32_t *ids, int n_ctx, int n_cont, int chunk, float **out) {
    *out = NULL;
    if (n_ctx < 2 || n_cont < 2) return ckv_error(CKV_STATUS_ERR_ARG, "fidelity needs a context and a continuation of >= 2 tokens");
    float *rows = malloc(sizeof(float) * (size_t)n_cont * (size_t)m->cfg.vocab_size);
    if (!rows) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for %d rows of logits", n_cont);
    ckv_status st = run(m, NULL, ids, n_ctx, n_cont, chunk, rows, NULL);
    if (st != CKV_STATUS_OK) {
        free(rows);
        return st;
    }
    *out = rows;
    return CKV_STATUS_OK;
}

/* The comparison of a press's continuation rows with the reference rows [n_cont, V]. */
static void compare(const float *ref, const float *rows, const int32_t *ids, int n_ctx, int n_cont, int V, ckv_fidelity *out) {
    int n = n_cont - 1; /* row t predicts continuation token t + 1 */
    for (int t = 0; t < n; t++) {
        const float *p = ref + (size_t)t * V, *q = rows + (size_t)t * V;
        int32_t next = ids[n_ctx + t + 1];
        out->kl += ckv_kl_logits(p, q, V);
        out->top1 += ckv_argmax(p, V) == ckv_argmax(q, V);
        out->nll_full += nll(p, V, next);
        out->nll_press += nll(q, V, next);
    }
    out->n = n;
    out->kl /= n;
    out->top1 /= n;
    out->nll_full /= n;
    out->nll_press /= n;
}

ckv_status ckv_fidelity_measure(ckv_model *m, const ckv_press_config *press, const int32_t *ids, int n_ctx, int n_cont,
                                int chunk, const float *ref, ckv_fidelity *out) {
    memset(out, 0, sizeof *out);
    int V = m->cfg.vocab_size;
    float *rows = malloc(sizeof(float) * (size_t)n_cont * (size_t)V);
    if (!rows) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for %d rows of logits", n_cont);
    ckv_status st = run(m, press, ids, n_ctx, n_cont, chunk, rows, out);
    if (st == CKV_STATUS_OK) compare(ref, rows, ids, n_ctx, n_cont, V, out);
    free(rows);
    return st;
}

ckv_status ckv_fidelity_sweep(ckv_model *m, const ckv_press_config *const *presses, int n_presses, const int32_t *ids,
                              int n_ctx, int n_cont, int chunk, ckv_fidelity *out,
                              void (*on_result)(void *ctx, int i, const ckv_fidelity *r), void *cb_ctx) {
    if (n_ctx < 2 || n_cont < 2) return ckv_error(CKV_STATUS_ERR_ARG, "fidelity needs a context and a continuation of >= 2 tokens");
    int V = m->cfg.vocab_size, xn_first = n_ctx;
    for (int i = 0; i < n_presses; i++) {
        int f = ckv_sweep_xn_first(presses[i], n_ctx);
        if (f < xn_first) xn_first = f;
    }
    ckv_engine e;
    CKV_TRY(ckv_engine_wrap(&e, m, chunk, NULL));
    float *ref = malloc(sizeof(float) * (size_t)n_cont * (size_t)V * 2), *rows = ref + (size_t)n_cont * V;
    if (!ref) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for %d rows of logits", 2 * n_cont);
    ckv_sweep sw;
    ckv_status st = ckv_sweep_init(&sw, &e, ids, n_ctx, n_cont, xn_first);
    if (st == CKV_STATUS_OK) st = ckv_prepared_forward(&sw.full, ids + n_ctx, n_cont, ref);
    for (int i = 0; i < n_presses && st == CKV_STATUS_OK; i++) {
        memset(&out[i], 0, sizeof out[i]);
        ckv_prepared pc, *use = NULL;
        st = ckv_sweep_derive(&sw, presses[i], 0, NULL, &pc, &use);
        if (st == CKV_STATUS_OK) st = ckv_prepared_forward(use, ids + n_ctx, n_cont, rows);
        if (st == CKV_STATUS_OK) {
            const ckv_request_stats *rs = &use->stats;
            out[i].kv_kept_frac = rs->total_entries ? (double)rs->kept_entries / (double)rs->total_entries : 1.0;
            out[i].prefill_s = sw.prefill_seconds;
            out[i].evict_s = rs->score_seconds + rs->select_seconds + rs->compact_seconds;
            out[i].score_s = rs->score_seconds;
            out[i].select_s = rs->select_seconds;
            compare(ref, rows, ids, n_ctx, n_cont, V, &out[i]);
            if (on_result) on_result(cb_ctx, i, &out[i]);
        }
        ckv_sweep_release(&sw, &pc);
    }
    ckv_sweep_free(&sw);
    ckv_engine_free(&e);
    free(ref);
    return st;
}
