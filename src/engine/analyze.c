/* analyze.c - the output-perturbation analysis of two presses (see analyze.h and docs/presses.md,
 * "Perturbation analysis"). Per layer: both presses select on the full cache's context rows; the
 * analysed token's queries are recomputed from its attention input (q_proj + bias, RoPE at its
 * position, as the model does); per local query head, full-cache attention weights in double, the
 * values projected through the head's o_proj block in blocks of CKV_ANALYZE_BLOCK rows, and from the
 * same projections o - o^ of each press and the bounds. It never compacts or otherwise changes the
 * cache, prints nothing and allocates only in ckv_analyzer_init / ckv_analyze_ws_init (the per-layer
 * selections allocate their own sort scratch, as in compression, and reading a 16-bit cache its
 * staging). Any backend: what the measurement reads (queries, rows, o_proj) is downloaded to host
 * scratch unless the backend's memory is the host's. */
#include "engine/analyze.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/quant.h"
#include "core/timer.h"
#include "engine/compress.h"

/* ---- one head ------------------------------------------------------------------------------ */

ckv_status ckv_analyze_ws_init(ckv_analyze_ws *ws, int n_max, int d, int D) {
    memset(ws, 0, sizeof *ws);
    if (n_max < 1 || d < 1 || D < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "analysis scratch for %d rows, head_dim %d, hidden size %d", n_max, d, D);
    ws->n_max = n_max, ws->d = d, ws->D = D;
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->e, (size_t)n_max * sizeof(double), "analysis weights"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->wh, (size_t)D * (size_t)d * sizeof(float), "analysis o_proj block"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->proj, (size_t)CKV_ANALYZE_BLOCK * (size_t)D * sizeof(float),
                              "analysis projected values"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->delta, (size_t)CKV_ANALYZE_PRESSES * (size_t)D * sizeof(double),
                              "analysis output differences"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->out, (size_t)D * sizeof(double), "analysis output"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&ws->norm, (size_t)n_max * sizeof(double), "analysis value norms"), fail);
    CKV_TRY_GOTO(s, ckv_conc_ws_init(&ws->conc, n_max), fail);
    return CKV_STATUS_OK;
fail:
    ckv_analyze_ws_free(ws);
    return s;
}

void ckv_analyze_ws_free(ckv_analyze_ws *ws) {
    if (!ws) return;
    ckv_free(ws->e);
    ckv_free(ws->wh);
    ckv_free(ws->proj);
    ckv_free(ws->delta);
    ckv_free(ws->out);
    ckv_free(ws->norm);
    ckv_conc_ws_free(&ws->conc);
    memset(ws, 0, sizeof *ws);
}

ckv_status ckv_analyze_head_compute(const ckv_analyze_head_in *in, ckv_backend *be, ckv_analyze_ws *ws,
                                    ckv_analyze_head *out) {
    if (!in || !be || !ws || !out) return ckv_error(CKV_STATUS_ERR_ARG, "analysis: missing inputs");
    const int n = in->n_rows, L = in->n_ctx, d = in->d, D = in->D;
    if (n < 1 || L < 0 || L > n)
        return ckv_error(CKV_STATUS_ERR_ARG, "analysis: %d context rows out of %d attended rows", L, n);
    if (n > ws->n_max || d != ws->d || D != ws->D)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "analysis: %d rows, head_dim %d, hidden %d exceed the scratch (%d, %d, %d)",
                         n, d, D, ws->n_max, ws->d, ws->D);
    if (!in->q || !in->k || !in->v || !in->wo || in->wo_stride < d || !(in->scale > 0.0f))
        return ckv_error(CKV_STATUS_ERR_ARG, "analysis: needs a query, keys, values, o_proj columns and a scale");
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++)
        if (L > 0 && !in->keep[p]) return ckv_error(CKV_STATUS_ERR_ARG, "analysis: press %c has no kept set", 'A' + p);
    if (be->device != CKV_DEVICE_HOST)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "analysis needs a backend with host memory (got %s)", be->name);

    /* full-cache attention: e_i = exp(z_i - max z), weights A_i = e_i / E */
    double *e = ws->e; // [n]
    double mx = -INFINITY;
    for (int i = 0; i < n; i++) {
        const float *k = in->k + (size_t)i * d;
        double z = 0.0;
        for (int c = 0; c < d; c++) z += (double)in->q[c] * (double)k[c];
        e[i] = z * (double)in->scale;
        if (e[i] > mx) mx = e[i];
    }
    if (!isfinite(mx)) return ckv_error(CKV_STATUS_ERR_RANGE, "analysis: non-finite attention logits");
    double E = 0.0;
    for (int i = 0; i < n; i++) {
        e[i] = exp(e[i] - mx);
        E += e[i];
    }
    /* per press: kept and evicted exponential mass (1 - s = Ee / E without cancellation) */
    double Ek[CKV_ANALYZE_PRESSES], Ee[CKV_ANALYZE_PRESSES], fk[CKV_ANALYZE_PRESSES];
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
        double kept = 0.0, ev = 0.0;
        int nk = 0;
        for (int i = 0; i < n; i++) {
            if (i < L && !in->keep[p][i]) {
                ev += e[i];
            } else {
                kept += e[i];
                nk += i < L;
            }
        }
        if (!(kept > 0.0))
            return ckv_error(CKV_STATUS_ERR_ARG, "analysis: press %c keeps no attended row", 'A' + p);
        Ek[p] = kept, Ee[p] = ev;
        fk[p] = ev / (E * kept); /* o - o^ coefficient of a kept row: -e_i * fk (= A_i - A^_i) */
        out->n_kept[p] = nk;
    }

    /* W_O^h as [D, d] rows for the matmul: wh[r, c] = element (r, c) */
    for (int r = 0; r < D; r++) memcpy(ws->wh + (size_t)r * d, in->wo + (size_t)r * in->wo_stride, (size_t)d * sizeof(float));
    memset(ws->delta, 0, (size_t)CKV_ANALYZE_PRESSES * (size_t)D * sizeof(double));
    memset(ws->out, 0, (size_t)D * sizeof(double));
    double pmax = 0.0, ev_norm[CKV_ANALYZE_PRESSES] = {0}, kept_norm[CKV_ANALYZE_PRESSES] = {0};
    for (int t0 = 0; t0 < n; t0 += CKV_ANALYZE_BLOCK) {
        const int nb = n - t0 < CKV_ANALYZE_BLOCK ? n - t0 : CKV_ANALYZE_BLOCK;
        ckv_backend_matmul_f32(be, ws->proj, in->v + (size_t)t0 * d, ws->wh, NULL, nb, d, D); /* [nb, D] */
        for (int b = 0; b < nb; b++) {
            const int i = t0 + b;
            const float *y = ws->proj + (size_t)b * D; // [D] = V_i W_O^h
            double P = 0.0;
            for (int r = 0; r < D; r++) P += fabs((double)y[r]);
            if (P > pmax) pmax = P;
            ws->norm[i] = P;
            const double A = e[i] / E;
            double *o = ws->out;
            for (int r = 0; r < D; r++) o[r] += A * (double)y[r];
            for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
                double c;
                if (i < L && !in->keep[p][i]) {
                    ev_norm[p] += A * P;
                    c = A;
                } else {
                    kept_norm[p] += A * P;
                    c = -e[i] * fk[p];
                }
                if (c == 0.0) continue;
                double *dl = ws->delta + (size_t)p * D;
                for (int r = 0; r < D; r++) dl[r] += c * (double)y[r];
            }
        }
    }
    out->n_rows = n;
    out->max_norm = pmax;
    double ol = 0.0;
    for (int r = 0; r < D; r++) ol += fabs(ws->out[r]);
    out->out_l1 = ol;
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
        const double *dl = ws->delta + (size_t)p * D;
        double l1 = 0.0;
        for (int r = 0; r < D; r++) l1 += fabs(dl[r]);
        out->perturbation[p] = l1;
        out->kept_mass[p] = Ek[p] / E;
        /* Eq. 5 as sum_evicted A_i P_i + ((1 - s) / s) sum_kept A_i P_i, (1 - s) / s = Ee / Ek */
        out->theta[p] = ev_norm[p] + (Ee[p] / Ek[p]) * kept_norm[p];
        out->attn_bound[p] = 2.0 * (Ee[p] / E) * pmax;
    }
    if (L > 0) return ckv_conc_compute(e, in->score, ws->norm, L, &ws->conc, &out->conc);
    ckv_conc_stats *c = &out->conc;
    for (int t = 0; t < CKV_CONC_N_TOP; t++) c->top_k[t] = 0, c->top_share[t] = c->recall[t] = NAN;
    c->spearman = c->norm_spread = NAN;
    return CKV_STATUS_OK;
}

/* ---- the layer hook ------------------------------------------------------------------------ */

void ckv_analyzer_free(ckv_analyzer *a) {
    if (!a) return;
    ckv_free(a->heads);
    ckv_selection_free(&a->sel);
    ckv_free(a->rows);
    ckv_free(a->hk);
    ckv_free(a->hv);
    ckv_free(a->hpos);
    ckv_free(a->hscore);
    ckv_free(a->keep);
    if (a->q != a->dq) ckv_free(a->q);
    ckv_free(a->mine);
    ckv_free(a->all);
    ckv_analyze_ws_free(&a->ws);
    if (a->be) {
        a->be->ops->release(a->be, a->dq);
        a->be->ops->release(a->be, a->dpos);
    }
    ckv_free(a->hwo);
    ckv_free(a->wo_raw);
    if (a->owns_host_be) ckv_backend_free(a->host_be);
    memset(a, 0, sizeof *a);
}

/* The host scratch for o_proj: hwo unless every layer's o_proj is F32 in host memory, wo_raw for
 * typed weights that live on a device. */
static ckv_status analyzer_wo_init(ckv_analyzer *a, const ckv_model *m) {
    const int host = m->be->device == CKV_DEVICE_HOST;
    const size_t D = (size_t)m->cfg.hidden_size, hq = (size_t)m->plan.n_q_local * (size_t)m->cfg.head_dim;
    size_t raw = 0;
    int need = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const ckv_weight *w = &m->layers[l].wo;
        if ((size_t)w->rows != D || (size_t)w->cols != hq)
            return ckv_error(CKV_STATUS_ERR_SHAPE, "analysis: o_proj of layer %d is [%lld, %lld], expected [%zu, %zu]", l,
                             (long long)w->rows, (long long)w->cols, D, hq);
        need |= !host || w->dtype != CKV_DTYPE_F32;
        if (!host && w->dtype != CKV_DTYPE_F32 && D * w->row_bytes > raw) raw = D * w->row_bytes;
    }
    if (need) CKV_TRY(ckv_alloc((void **)&a->hwo, D * hq * sizeof(float), "analysis o_proj (fp32 host copy)"));
    if (raw) CKV_TRY(ckv_alloc(&a->wo_raw, raw, "analysis o_proj staging"));
    return CKV_STATUS_OK;
}

/* The layer's o_proj as fp32 [D, n_q_local * d] in host memory: in place (F32 on a host backend), else
 * converted (and first downloaded when the backend's memory is not the host's) into hwo. */
static ckv_status analyzer_wo_host(ckv_analyzer *a, const ckv_weight *w, const float **out) {
    ckv_backend *be = a->be;
    const int host = be->device == CKV_DEVICE_HOST;
    if (host && w->dtype == CKV_DTYPE_F32) {
        *out = w->data;
        return CKV_STATUS_OK;
    }
    const size_t rows = (size_t)w->rows, cols = (size_t)w->cols;
    if (w->dtype == CKV_DTYPE_F32) { /* a device: straight into the fp32 copy */
        CKV_TRY(be->ops->download(be, a->hwo, w->data, rows * cols * sizeof(float)));
    } else {
        const char *src = w->data;
        if (!host) {
            CKV_TRY(be->ops->download(be, a->wo_raw, w->data, rows * w->row_bytes));
            src = a->wo_raw;
        }
        for (size_t r = 0; r < rows; r++) ckv_dequant_row(w->dtype, src + r * w->row_bytes, a->hwo + r * cols, cols);
    }
    *out = a->hwo;
    return CKV_STATUS_OK;
}

ckv_status ckv_analyzer_init(ckv_analyzer *a, const ckv_model *m, const ckv_press_config *press_a,
                             const ckv_press_config *press_b, int n_ctx, int n_question, int n_threads) {
    memset(a, 0, sizeof *a);
    if (!m || !press_a || !press_b) return ckv_error(CKV_STATUS_ERR_ARG, "analysis: needs a model and two presses");
    if (n_ctx < 1 || n_question < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "analysis: %d context and %d question tokens (need >= 1 of each)", n_ctx,
                         n_question);
    const ckv_press_config *pr[CKV_ANALYZE_PRESSES] = {press_a, press_b};
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
        if (pr[p]->scorer == CKV_SCORER_NONE)
            return ckv_error(CKV_STATUS_ERR_ARG, "press %c is none: the analysis compares two presses that evict "
                             "(the full cache is the reference)", 'A' + p);
        if (pr[p]->query_aware)
            return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "press %c: the analysis is context-only (no query-aware)", 'A' + p);
        CKV_TRY(ckv_press_check_context(pr[p], n_ctx));
        a->press[p] = pr[p];
    }
    const ckv_model_config *c = &m->cfg;
    const ckv_shard_plan *pl = &m->plan;
    int tp = m->tp ? m->tp->size : 1;
    a->n_ctx = n_ctx, a->n_question = n_question;
    a->n_layers = c->n_layers, a->n_heads = c->n_heads;
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_alloc((void **)&a->heads, (size_t)c->n_layers * (size_t)c->n_heads * sizeof *a->heads,
                              "analysis results"), fail);
    CKV_TRY_GOTO(s, ckv_selection_init(&a->sel, m->be, pl->n_kv_local, c->n_kv_heads, n_ctx), fail);
    const size_t n_rows = (size_t)n_ctx + (size_t)n_question, kvd = (size_t)pl->n_kv_local * n_rows * c->head_dim;
    CKV_TRY_GOTO(s, ckv_alloc((void **)&a->rows, (size_t)pl->n_kv_local * (size_t)n_ctx * sizeof(int32_t),
                              "analysis kept rows"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&a->hk, kvd * sizeof(float), "analysis keys"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&a->hv, kvd * sizeof(float), "analysis values"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&a->hpos, n_rows * sizeof(int32_t), "analysis positions"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&a->hscore, (size_t)pl->n_kv_local * (size_t)n_ctx * sizeof(float),
                              "analysis scores of press A"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&a->keep, (size_t)CKV_ANALYZE_PRESSES * (size_t)pl->n_kv_local * (size_t)n_ctx,
                              "analysis kept sets"), fail);
    ckv_backend *be = m->be;
    const int host = be->device == CKV_DEVICE_HOST;
    const size_t qbytes = (size_t)pl->n_q_local * (size_t)c->head_dim * sizeof(float);
    a->be = be;
    CKV_TRY_GOTO(s, be->ops->alloc(be, (void **)&a->dq, qbytes, "analysis queries"), fail);
    CKV_TRY_GOTO(s, be->ops->alloc(be, (void **)&a->dpos, sizeof(int32_t), "analysis query position"), fail);
    if (host) {
        a->q = a->dq, a->host_be = be;
    } else {
        CKV_TRY_GOTO(s, ckv_alloc((void **)&a->q, qbytes, "analysis queries (host copy)"), fail);
        CKV_TRY_GOTO(s, ckv_backend_cpu_init(&a->host_be, n_threads), fail);
        a->owns_host_be = 1;
    }
    CKV_TRY_GOTO(s, analyzer_wo_init(a, m), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&a->mine, (size_t)pl->n_q_local * sizeof *a->mine, "analysis records"), fail);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&a->all, (size_t)tp * (size_t)pl->n_q_local * sizeof *a->all,
                              "analysis gathered records"), fail);
    CKV_TRY_GOTO(s, ckv_analyze_ws_init(&a->ws, n_ctx + n_question, c->head_dim, c->hidden_size), fail);
    return CKV_STATUS_OK;
fail:
    ckv_analyzer_free(a);
    return s;
}

ckv_status ckv_analyze_layer_hook(void *ctx, ckv_session *s, int layer, int n_prompt) {
    ckv_analyzer *a = ctx;
    ckv_model *m = s->model;
    ckv_backend *be = m->be;
    const ckv_model_config *c = &m->cfg;
    const ckv_shard_plan *pl = &m->plan;
    const int L = a->n_ctx, n = L + a->n_question, d = c->head_dim, D = c->hidden_size;
    const int nq = pl->n_q_local, nkv = pl->n_kv_local, hq = nq * d;
    if (n_prompt != n || s->n_past != 0 || !s->xn)
        return ckv_error(CKV_STATUS_ERR_ARG, "analysis: expects one prefill of %d context + %d question tokens into an "
                         "empty session with attention inputs kept (got %d tokens after %d)", L, a->n_question,
                         n_prompt, s->n_past);
    const ckv_kv_layer *kl = &s->kv.layers[layer];
    for (int g = 0; g < nkv; g++)
        if (kl->len[g] != n)
            return ckv_error(CKV_STATUS_ERR_INTERNAL, "analysis: layer %d head %d holds %d rows, expected %d", layer, g,
                             kl->len[g], n);

    /* both presses on the same full-cache inputs (context rows 0 .. L-1) */
    double t0 = ckv_time_now();
    ckv_score_inputs in;
    ckv_compress_score_inputs(s, layer, L, &in);
    memset(a->keep, 0, (size_t)CKV_ANALYZE_PRESSES * (size_t)nkv * (size_t)L);
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
        const int32_t *hb_row = a->head_budgets[p] ? a->head_budgets[p] + (size_t)layer * c->n_kv_heads : NULL;
        ckv_head_budgets hb = {c->n_kv_heads, hb_row};
        CKV_TRY(ckv_evict_layer(a->press[p], &in, hb_row ? &hb : NULL, &a->sel));
        CKV_TRY(ckv_selection_rows_host(&a->sel, a->rows));
        if (p == 0) /* press A's ranking, for the concentration statistics */
            CKV_TRY(be->ops->download(be, a->hscore, a->sel.scores, (size_t)nkv * (size_t)L * sizeof(float)));
        uint8_t *kp = a->keep + (size_t)p * nkv * L; // [nkv, L]
        for (int g = 0; g < nkv; g++)
            for (int i = 0; i < a->sel.n_keep[g]; i++) {
                int32_t r = a->rows[(size_t)g * L + i];
                if (r < 0 || r >= L) return ckv_error(CKV_STATUS_ERR_INTERNAL, "analysis: kept row %d outside 0..%d", r, L - 1);
                kp[(size_t)g * L + r] = 1;
            }
    }
    double t1 = ckv_time_now();
    a->select_seconds += t1 - t0;

    /* the analysed token's queries: q_proj (+ bias), RoPE at its position */
    const ckv_layer_weights *w = &m->layers[layer];
    CKV_TRY(be->ops->upload(be, a->dpos, &s->pos[n - 1], sizeof(int32_t)));
    be->ops->matmul(be, a->dq, s->xn + (size_t)(n - 1) * D, &w->wq, w->bq, 1);
    be->ops->rope(be, a->dq, a->dpos, 1, nq, d, m->inv_freq, m->rope_scale);
    if (a->q != a->dq) CKV_TRY(be->ops->download(be, a->q, a->dq, (size_t)hq * sizeof(float)));
    for (int g = 0; g < nkv; g++) /* fp32 host copies of the layer's rows (any KV dtype) */
        CKV_TRY(ckv_kv_head_read(&s->kv, layer, g, a->hk + (size_t)g * n * d, a->hv + (size_t)g * n * d, a->hpos));
    const float *wo = NULL; // [D, hq] fp32 host
    CKV_TRY(analyzer_wo_host(a, &w->wo, &wo));
    const int group = c->n_heads / c->n_kv_heads;
    for (int j = 0; j < nq; j++) {
        const int h = pl->q_head0 + j, g = h / group - pl->kv_head0;
        if (g < 0 || g >= nkv)
            return ckv_error(CKV_STATUS_ERR_INTERNAL, "analysis: query head %d has no local KV head", h);
        ckv_analyze_head_in hi = {
            .n_rows = n, .n_ctx = L, .d = d, .D = D, .q = a->q + (size_t)j * d,
            .k = a->hk + (size_t)g * n * d, .v = a->hv + (size_t)g * n * d,
            .wo = wo + (size_t)j * d, .wo_stride = hq, .scale = 1.0f / sqrtf((float)d),
            .score = a->hscore + (size_t)g * L,
        };
        for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) hi.keep[p] = a->keep + ((size_t)p * nkv + (size_t)g) * L;
        ckv_analyze_head *r = &a->mine[j];
        memset(r, 0, sizeof *r);
        CKV_TRY(ckv_analyze_head_compute(&hi, a->host_be, &a->ws, r));
        r->layer = layer, r->head = h, r->kv_head = pl->kv_head0 + g;
    }

    /* every rank gets every rank's records; query heads are distinct across ranks */
    ckv_comm *tp = m->tp;
    int size = tp ? tp->size : 1;
    if (size > 1)
        CKV_TRY(tp->ops->allgather(tp, a->mine, a->all, (size_t)nq * sizeof *a->mine));
    else
        memcpy(a->all, a->mine, (size_t)nq * sizeof *a->mine);
    for (int i = 0; i < size * nq; i++) {
        const ckv_analyze_head *r = &a->all[i];
        if (r->layer != layer || r->head < 0 || r->head >= a->n_heads)
            return ckv_error(CKV_STATUS_ERR_INTERNAL, "analysis: gathered record %d names layer %d head %d", i, r->layer,
                             r->head);
        a->heads[(size_t)layer * a->n_heads + r->head] = *r;
    }
    a->layers_done = layer + 1;
    a->measure_seconds += ckv_time_now() - t1;
    return CKV_STATUS_OK;
}

/* ---- results ------------------------------------------------------------------------------- */

double ckv_analyze_bound(const ckv_analyzer *a, const ckv_analyze_head *h, int p) {
    return a->press[p]->critical ? h->theta[p] : h->attn_bound[p];
}

ckv_status ckv_analyze_summarize(const ckv_analyzer *a, ckv_analyze_summary *out) {
    memset(out, 0, sizeof *out);
    if (a->layers_done != a->n_layers)
        return ckv_error(CKV_STATUS_ERR_ARG, "analysis: %d of %d layers measured", a->layers_done, a->n_layers);
    int n = a->n_layers * a->n_heads;
    out->n_heads = n;
    double ratio[CKV_ANALYZE_PRESSES] = {0}, theta_ratio = 0.0;
    for (int i = 0; i < n; i++) {
        const ckv_analyze_head *h = &a->heads[i];
        if (h->perturbation[1] < h->perturbation[0]) out->n_b_less++;
        else if (h->perturbation[1] == h->perturbation[0]) out->n_equal++;
        for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
            out->mean_perturbation[p] += h->perturbation[p];
            if (h->perturbation[p] > 0.0) {
                ratio[p] += ckv_analyze_bound(a, h, p) / h->perturbation[p];
                out->n_ratio[p]++;
            }
            if (h->theta[p] > 0.0) {
                double q = h->perturbation[p] / h->theta[p];
                if (q > out->max_pert_over_theta) out->max_pert_over_theta = q;
            }
            if (h->perturbation[p] > h->theta[p] * (1.0 + 1e-9) || h->theta[p] > h->attn_bound[p] * (1.0 + 1e-9))
                out->n_bound_violations++;
        }
        if (h->theta[0] > 0.0) {
            theta_ratio += h->theta[1] / h->theta[0];
            out->n_theta_ratio++;
        }
    }
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
        out->mean_perturbation[p] /= (double)(n > 0 ? n : 1);
        out->mean_bound_ratio[p] = out->n_ratio[p] ? ratio[p] / out->n_ratio[p] : 0.0;
    }
    out->mean_theta_ratio = out->n_theta_ratio ? theta_ratio / out->n_theta_ratio : 0.0;
    return CKV_STATUS_OK;
}

_Static_assert(CKV_CONC_N_TOP == 3, "the JSON lines write three top_k values");

/* ", KEY: v" (n == 0) or ", KEY: [v, ...]" with NaN written as null (JSON has no NaN). */
static void write_num_list(FILE *f, const char *key, const double *v, int n) {
    fprintf(f, ", \"%s\": %s", key, n ? "[" : "");
    for (int i = 0; i < (n ? n : 1); i++) {
        if (isfinite(v[i])) fprintf(f, "%s%.17g", i ? ", " : "", v[i]);
        else fprintf(f, "%snull", i ? ", " : "");
    }
    if (n) fputc(']', f);
}

ckv_status ckv_analyze_write_jsonl(const ckv_analyzer *a, FILE *f, const char *path) {
    if (a->layers_done != a->n_layers)
        return ckv_error(CKV_STATUS_ERR_ARG, "analysis: %d of %d layers measured", a->layers_done, a->n_layers);
    for (int i = 0; i < a->n_layers * a->n_heads; i++) {
        const ckv_analyze_head *h = &a->heads[i];
        if (a->budget > 0) fprintf(f, "{\"budget\": %.17g, ", a->budget);
        fprintf(f,
                "%s\"layer\": %d, \"head\": %d, \"kv_head\": %d, \"n_rows\": %d, \"kept_a\": %d, \"kept_b\": %d, "
                "\"mass_a\": %.17g, \"mass_b\": %.17g, \"out_l1\": %.17g, \"max_norm\": %.17g, "
                "\"perturbation_a\": %.17g, \"perturbation_b\": %.17g, \"theta_a\": %.17g, \"theta_b\": %.17g, "
                "\"attn_bound_a\": %.17g, \"attn_bound_b\": %.17g, \"bound_a\": %.17g, \"bound_b\": %.17g",
                a->budget > 0 ? "" : "{", h->layer, h->head, h->kv_head, h->n_rows, h->n_kept[0], h->n_kept[1], h->kept_mass[0], h->kept_mass[1],
                h->out_l1, h->max_norm, h->perturbation[0], h->perturbation[1], h->theta[0], h->theta[1],
                h->attn_bound[0], h->attn_bound[1], ckv_analyze_bound(a, h, 0), ckv_analyze_bound(a, h, 1));
        const ckv_conc_stats *c = &h->conc;
        fprintf(f, ", \"top_k\": [%d, %d, %d]", c->top_k[0], c->top_k[1], c->top_k[2]);
        write_num_list(f, "top_share", c->top_share, CKV_CONC_N_TOP);
        write_num_list(f, "recall", c->recall, CKV_CONC_N_TOP);
        write_num_list(f, "spearman", &c->spearman, 0);
        write_num_list(f, "norm_spread", &c->norm_spread, 0);
        fputs("}\n", f);
    }
    if (ferror(f)) return ckv_error(CKV_STATUS_ERR_IO, "--out: error writing '%s'", path ? path : "(stream)");
    return CKV_STATUS_OK;
}
