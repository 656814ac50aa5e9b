/* select.c - protected tokens, kept counts, CriticalKV two-stage selection and cross-head
 * allocation (see select.h). The formulas follow SPEC-eviction.md; where kvpress evaluates a
 * budget in a particular order (b1 = int((1 - cr) * L * alpha)) that order is kept. */
#include "evict/select.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"

typedef struct {
    float s;
    int32_t i; /* flat index: head * L + row */
} ckv_scored;

/* descending score, NaN last, then ascending index */
static int scored_cmp(const void *a, const void *b) {
    const ckv_scored *x = a, *y = b;
    int xn = x->s != x->s, yn = y->s != y->s;
    if (xn != yn) return xn - yn;
    if (!xn && x->s != y->s) return x->s > y->s ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static int int_cmp(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Sorts n entries of s (with flat indices) best first into tmp. */
static ckv_status rank_all(const float *s, int n, ckv_scored **out) {
    ckv_scored *t = NULL;
    CKV_TRY(ckv_alloc((void **)&t, (size_t)(n > 0 ? n : 1) * sizeof *t, "score ranking"));
    for (int i = 0; i < n; i++) {
        t[i].s = s[i];
        t[i].i = i;
    }
    qsort(t, (size_t)n, sizeof *t, scored_cmp);
    *out = t;
    return CKV_STATUS_OK;
}

ckv_status ckv_topk_ascending(const float *s, int n, int k, int32_t *idx) {
    if (k < 0 || k > n) return ckv_error(CKV_STATUS_ERR_ARG, "top-%d of %d scores", k, n);
    ckv_scored *t = NULL;
    CKV_TRY(rank_all(s, n, &t));
    for (int i = 0; i < k; i++) idx[i] = t[i].i;
    ckv_free(t);
    qsort(idx, (size_t)k, sizeof *idx, int_cmp);
    return CKV_STATUS_OK;
}

ckv_status ckv_selection_init(ckv_selection *s, int n_kv_local, int L) {
    memset(s, 0, sizeof *s);
    if (n_kv_local < 1 || L < 1) return ckv_error(CKV_STATUS_ERR_ARG, "selection of %d heads x %d tokens", n_kv_local, L);
    s->n_kv_local = n_kv_local;
    s->L = L;
    size_t n = (size_t)n_kv_local * (size_t)L;
    ckv_status st = ckv_alloc((void **)&s->rows, n * sizeof(int32_t), "kept rows");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&s->n_keep, (size_t)n_kv_local * sizeof(int32_t), "kept counts");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&s->scores, n * sizeof(float), "scores");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&s->norms, n * sizeof(float), "value norms");
    if (st != CKV_STATUS_OK) ckv_selection_free(s);
    return st;
}

void ckv_selection_free(ckv_selection *s) {
    if (!s) return;
    ckv_free(s->rows);
    ckv_free(s->n_keep);
    ckv_free(s->scores);
    ckv_free(s->norms);
    memset(s, 0, sizeof *s);
}

/* Protected tokens get (max over the layer's unprotected scores, all heads and ranks) + 1. */
static ckv_status protect(const ckv_score_inputs *in, const ckv_score_info *info, float *scores) {
    int L = in->L, head = info->protect_head, tail = info->protect_tail;
    if (head <= 0 && tail <= 0) return CKV_STATUS_OK;
    if (head + tail >= L) { /* everything is protected: nothing to rank against */
        for (size_t i = 0; i < (size_t)in->n_kv_local * (size_t)L; i++) scores[i] = 1.0f;
        return CKV_STATUS_OK;
    }
    float mx = -FLT_MAX;
    for (int h = 0; h < in->n_kv_local; h++)
        for (int t = head; t < L - tail; t++) mx = fmaxf(mx, scores[(size_t)h * L + t]);
    if (in->tp && in->tp->size > 1) CKV_TRY(in->tp->ops->allreduce_f32(in->tp, &mx, 1, CKV_COMM_OP_MAX));
    float p = mx + 1.0f;
    for (int h = 0; h < in->n_kv_local; h++) {
        float *s = scores + (size_t)h * L;
        for (int t = 0; t < head; t++) s[t] = p;
        for (int t = L - tail; t < L; t++) s[t] = p;
    }
    return CKV_STATUS_OK;
}

/* CriticalKV on one head: the top-b1 of s are forced, the rest ranked by (s + eps) * N; keeps k. */
static ckv_status critical_head(const float *s, const float *N, int L, int b1, int k, float eps, int32_t *rows,
                                float *tmp) {
    ckv_scored *t = NULL;
    CKV_TRY(rank_all(s, L, &t));
    for (int i = 0; i < L; i++) tmp[i] = (s[i] + eps) * N[i];
    for (int i = 0; i < b1 && i < L; i++) tmp[t[i].i] = INFINITY; /* forced: above any finite product */
    ckv_free(t);
    return ckv_topk_ascending(tmp, L, k, rows);
}

/* First global KV head held by rank r of a tp-way group (shard/ plan, restated: evict must not
 * depend on shard/). */
static int rank_kv_head0(int r, int tp, int n_kv) {
    return tp <= n_kv ? r * (n_kv / tp) : r / (tp / n_kv);
}

/* All-gathers the local scores [n_kv_local, L] into all [n_kv_heads, L] (global head order). */
static ckv_status gather_heads(const ckv_score_inputs *in, const float *local, float *all) {
    size_t per = (size_t)in->n_kv_local * (size_t)in->L;
    if (!in->tp || in->tp->size == 1) {
        memcpy(all, local, per * sizeof(float));
        return CKV_STATUS_OK;
    }
    int tp = in->tp->size;
    float *buf = NULL;
    CKV_TRY(ckv_alloc((void **)&buf, per * (size_t)tp * sizeof(float), "score all-gather"));
    ckv_status st = in->tp->ops->allgather(in->tp, local, buf, per * sizeof(float));
    if (st == CKV_STATUS_OK)
        for (int r = 0; r < tp; r++)
            memcpy(all + (size_t)rank_kv_head0(r, tp, in->n_kv_heads) * in->L, buf + (size_t)r * per, per * sizeof(float));
    ckv_free(buf);
    return st;
}

/* Cross-head allocation over all heads of the layer: returns per-head budgets (global heads). */
static ckv_status allocate_budgets(const ckv_press_config *cfg, float *all, int n_kv, int L, int n_kept,
                                   int32_t *budget) {
    if (cfg->alloc == CKV_ALLOC_ADAKV) { /* safeguard: each head's top n_safe are forced */
        int n_safe = (int)((double)n_kept * cfg->safeguard);
        if (cfg->safeguard > 0 && n_safe < 1) n_safe = 1;
        int32_t *idx = NULL;
        CKV_TRY(ckv_alloc((void **)&idx, (size_t)(n_safe > 0 ? n_safe : 1) * sizeof *idx, "safeguard"));
        ckv_status st = CKV_STATUS_OK;
        for (int h = 0; h < n_kv && st == CKV_STATUS_OK; h++) {
            st = ckv_topk_ascending(all + (size_t)h * L, L, n_safe, idx);
            for (int i = 0; i < n_safe && st == CKV_STATUS_OK; i++) all[(size_t)h * L + idx[i]] = FLT_MAX;
        }
        ckv_free(idx);
        CKV_TRY(st);
    }
    ckv_scored *t = NULL;
    CKV_TRY(rank_all(all, n_kv * L, &t));
    for (int h = 0; h < n_kv; h++) budget[h] = 0;
    /* the layer's total: Hkv * n_kept, except DefensiveKV's own int(L * (1 - cr) * Hkv) */
    long total = cfg->alloc == CKV_ALLOC_GLOBAL && cfg->budget_tokens <= 0
                     ? (long)((double)L * (1.0 - cfg->compression_ratio) * (double)n_kv)
                     : (long)n_kv * n_kept;
    if (total > (long)n_kv * L) total = (long)n_kv * L;
    for (long i = 0; i < total; i++) budget[t[i].i / L]++;
    ckv_free(t);
    return CKV_STATUS_OK;
}

ckv_status ckv_evict_layer(const ckv_press_config *cfg, const ckv_score_inputs *in, const ckv_head_budgets *hb,
                           ckv_selection *out) {
    int L = in->L, nkv = in->n_kv_local;
    if (out->L != L || out->n_kv_local != nkv) return ckv_error(CKV_STATUS_ERR_ARG, "selection buffers do not fit the layer");
    double t0 = ckv_time_now();
    ckv_score_info info = {0, 0};
    CKV_TRY(ckv_score_layer(in, cfg, out->scores, &info));
    CKV_TRY(protect(in, &info, out->scores));
    int n_kept = cfg->scorer == CKV_SCORER_PYRAMIDKV
                     ? ckv_pyramidkv_n_kept(in->layer, in->n_layers, L, cfg->compression_ratio, cfg->window, cfg->beta)
                     : ckv_press_n_kept(cfg, L);
    if (n_kept > L) n_kept = L;
    out->n_kept = n_kept;
    if (cfg->critical) CKV_TRY(ckv_critical_value_norm(in, out->norms));
    double t1 = ckv_time_now();
    out->score_seconds = t1 - t0;

    float eps = (float)cfg->eps;
    float *tmp = NULL, *all = NULL;
    int32_t *budget = NULL;
    ckv_status st = ckv_alloc((void **)&tmp, (size_t)L * sizeof(float), "selection scratch");
    if (st == CKV_STATUS_OK && cfg->alloc == CKV_ALLOC_UNIFORM) {
        /* b1 in kvpress's evaluation order: int((1 - cr) * L * alpha), at least 1 */
        int b1 = cfg->budget_tokens > 0 ? (int)((double)n_kept * cfg->alpha)
                                        : (int)((1.0 - cfg->compression_ratio) * (double)L * cfg->alpha);
        if (cfg->alpha > 0 && b1 < 1) b1 = 1;
        if (b1 > n_kept) b1 = n_kept;
        for (int h = 0; h < nkv && st == CKV_STATUS_OK; h++) {
            const float *s = out->scores + (size_t)h * L;
            int32_t *rows = out->rows + (size_t)h * L;
            st = cfg->critical ? critical_head(s, out->norms + (size_t)h * L, L, b1, n_kept, eps, rows, tmp)
                               : ckv_topk_ascending(s, L, n_kept, rows);
            out->n_keep[h] = n_kept;
        }
    } else if (st == CKV_STATUS_OK) {
        int H = in->n_kv_heads;
        st = ckv_alloc((void **)&budget, (size_t)H * sizeof(int32_t), "head budgets");
        if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&all, (size_t)H * (size_t)L * sizeof(float), "layer scores");
        if (st == CKV_STATUS_OK) st = gather_heads(in, out->scores, all);
        if (st == CKV_STATUS_OK && cfg->alloc == CKV_ALLOC_HEADKV) {
            if (!hb || hb->n_kv_heads != H) st = ckv_error(CKV_STATUS_ERR_ARG, "headkv: no budgets for layer %d", in->layer);
            for (int h = 0; h < H && st == CKV_STATUS_OK; h++) budget[h] = hb->budget[h] < L ? hb->budget[h] : L;
        } else if (st == CKV_STATUS_OK) {
            st = allocate_budgets(cfg, all, H, L, n_kept, budget);
        }
        for (int h = 0; h < nkv && st == CKV_STATUS_OK; h++) {
            int g = in->kv_head0 + h, k = budget[g];
            const float *s = all + (size_t)g * L; /* safeguarded scores (adakv), else the base scores */
            int32_t *rows = out->rows + (size_t)h * L;
            if (cfg->critical) {
                int b1 = (int)((float)k * (float)cfg->alpha);
                st = critical_head(s, out->norms + (size_t)h * L, L, b1, k, eps, rows, tmp);
            } else {
                st = ckv_topk_ascending(s, L, k, rows);
            }
            out->n_keep[h] = k;
        }
    }
    ckv_free(tmp);
    ckv_free(all);
    ckv_free(budget);
    out->select_seconds = ckv_time_now() - t1;
    return st;
}
