/* press_kept.c - what a parsed press keeps: a budget turned into kept counts (per layer, per model,
 * layerwise), composed presses' stages, CriticalKV's stage-1 counts, the protected head and tail
 * tokens, and the checks a context or layer count must pass. It does not parse specs (press.c), score
 * or select. */
#include <math.h>

#include "evict/press.h"
#include "evict/press_registry.h"

/* max(1, floor(L * (1 - cr))), at most L */
static int kept_of_ratio(int L, double cr) {
    const int n = (int)floor((double)L * (1.0 - cr));
    return n < 1 ? 1 : n > L ? L : n;
}

/* per_layer: the ratio of `layer` (layers past the list, refused by ckv_press_check_layers: the last) */
static double layer_ratio(const ckv_press_config *c, int layer) {
    const int n = c->layer_ratios.n;
    return n < 1 ? 0.0 : c->layer_ratios.cr[layer < 0 ? 0 : layer < n ? layer : n - 1];
}

/* per_layer: the largest layer's count of n rows (what a layer may hold) */
static int most_kept_of_layers(const ckv_press_config *c, int n) {
    int most = 1;
    for (int l = 0; l < c->layer_ratios.n; l++) {
        const int k = kept_of_ratio(n, c->layer_ratios.cr[l]);
        most = k > most ? k : most;
    }
    return most;
}

/* composed: press i's entry of press_ratios (per_layer: members take none: -1) */
static int stage_ratio_index(const ckv_press_config *c, int i) {
    if (c->stage_per_layer[i]) return -1;
    int k = 0;
    for (int j = 0; j < i; j++) k += !c->stage_per_layer[j];
    return k;
}

int ckv_press_n_ratios(const ckv_press_config *c) {
    int n = 0;
    for (int i = 0; c->composed && i < c->n_stages; i++) n += !c->stage_per_layer[i];
    return n;
}

int ckv_press_n_kept(const ckv_press_config *c, int L) {
    if (c->composed) { /* each press keeps its share of what the one before kept */
        int n = L;
        for (int i = 0; i < c->n_stages; i++) {
            const int k = stage_ratio_index(c, i);
            n = k < 0 ? most_kept_of_layers(c, n) : k < c->press_ratios.n ? kept_of_ratio(n, c->press_ratios.cr[k]) : n;
        }
        return n;
    }
    if (c->budget_tokens > 0) return c->budget_tokens < L ? c->budget_tokens : L;
    const ckv_press_def *d = ckv_press_def_of(c->scorer);
    if (d && d->kept == CKV_KEPT_CHUNKS && c->chunk_length > 0) { /* finch: each chunk keeps its own share */
        int n = 0;
        for (int t0 = 0; t0 < L; t0 += c->chunk_length)
            n += kept_of_ratio(L - t0 < c->chunk_length ? L - t0 : c->chunk_length, c->compression_ratio);
        return n;
    }
    if (c->alloc == CKV_ALLOC_PER_LAYER) return most_kept_of_layers(c, L);
    return kept_of_ratio(L, c->compression_ratio);
}

ckv_status ckv_press_check_layers(const ckv_press_config *c, int n_layers) {
    int per_layer = c->alloc == CKV_ALLOC_PER_LAYER;
    for (int i = 0; c->composed && i < c->n_stages; i++) per_layer |= c->stage_per_layer[i];
    if (per_layer && c->layer_ratios.n != n_layers)
        return ckv_error(CKV_STATUS_ERR_ARG, "press per_layer: compression_ratios has %d values, the model has %d layers",
                         c->layer_ratios.n, n_layers);
    return CKV_STATUS_OK;
}

void ckv_press_layer_kept(const ckv_press_config *c, int layer, int n_layers, int L, int n_kv, ckv_press_kept *out) {
    const ckv_press_def *d = ckv_press_def_of(c->scorer);
    const ckv_kept_rule rule = d ? d->kept : CKV_KEPT_UNIFORM;
    int n = rule == CKV_KEPT_PYRAMID ? ckv_pyramidkv_n_kept(layer, n_layers, L, c->compression_ratio, c->window, c->beta)
            : c->alloc == CKV_ALLOC_PER_LAYER && c->budget_tokens <= 0 ? kept_of_ratio(L, layer_ratio(c, layer))
                                                                       : ckv_press_n_kept(c, L);
    if (n > L) n = L;
    out->per_head = n;
    /* the layer's total: Hkv * n_kept, except DefensiveKV's own int(L * (1 - cr) * Hkv) */
    long total = rule == CKV_KEPT_LAYER_FRACTION && c->budget_tokens <= 0
                     ? (long)((double)L * (1.0 - c->compression_ratio) * (double)n_kv)
                     : (long)n_kv * n;
    if (total > (long)n_kv * L) total = (long)n_kv * L;
    out->layer_total = total;
    /* b1 in kvpress's evaluation order: int((1 - cr) * L * alpha), at least 1 */
    int b = c->budget_tokens > 0 ? (int)((double)n * c->alpha) : (int)((1.0 - c->compression_ratio) * (double)L * c->alpha);
    if (c->alpha > 0 && b < 1) b = 1;
    out->first_stage = b > n ? n : b;
    int n_safe = 0;
    if (c->alloc == CKV_ALLOC_ADAKV) { /* each head's top n_safe are forced */
        n_safe = (int)((double)n * c->safeguard);
        if (c->safeguard > 0 && n_safe < 1) n_safe = 1;
        if (n_safe > L) n_safe = L;
    }
    out->safeguard = n_safe;
}

void ckv_press_stage(const ckv_press_config *c, int i, ckv_press_config *out) {
    *out = *c;
    out->composed = 0;
    out->n_stages = 0;
    out->scorer = c->composed && i >= 0 && i < c->n_stages ? c->stages[i] : c->scorer;
    const int k = c->composed && i >= 0 && i < c->n_stages ? i : -1; /* its own wrappers */
    out->alloc = k >= 0 && c->stage_chunk[k]       ? CKV_ALLOC_CHUNK
                 : k >= 0 && c->stage_per_layer[k] ? CKV_ALLOC_PER_LAYER
                                                   : CKV_ALLOC_UNIFORM;
    out->critical = k >= 0 ? c->stage_critical[k] : i == 0 && c->critical;
    out->rerotate_keys = k >= 0 && c->stage_rerotate[k];
    out->budget_tokens = 0;
    out->budget_given_as_b = 0;
    const int r = k >= 0 ? stage_ratio_index(c, k) : -1; /* per_layer: its layer's ratio (ckv_press_layer_kept) */
    out->compression_ratio = r >= 0 && r < c->press_ratios.n ? c->press_ratios.cr[r] : c->compression_ratio;
}

/* kvzip's count: n entries less int(n * cr) removed (kvpress's int of the product), or min(N, L) per head. */
static long kept_of_removed(const ckv_press_config *c, long n, long heads, int L) {
    if (c->budget_tokens > 0) return heads * (c->budget_tokens < L ? c->budget_tokens : L);
    return n - (long)((double)n * c->compression_ratio);
}

long ckv_press_model_kept(const ckv_press_config *c, int n_layers, int L, int n_kv) {
    const long all = (long)n_layers * n_kv * L;
    const ckv_press_def *d = ckv_press_def_of(c->scorer);
    long total = d && d->kept == CKV_KEPT_MODEL_REMOVED ? kept_of_removed(c, all, (long)n_layers * n_kv, L)
                 : c->budget_tokens > 0 ? (long)n_layers * n_kv * (c->budget_tokens < L ? c->budget_tokens : L)
                                        : (long)((double)L * (1.0 - c->compression_ratio) * (double)n_kv * (double)n_layers);
    return total < 0 ? 0 : total > all ? all : total;
}

long ckv_press_layerwise_kept(const ckv_press_config *c, int L, int n_kv) {
    const long all = (long)n_kv * L, total = kept_of_removed(c, all, n_kv, L);
    return total < 0 ? 0 : total > all ? all : total;
}

int ckv_press_first_stage(const ckv_press_config *c, int k) {
    return (int)((float)k * (float)c->alpha);
}

void ckv_press_protected(const ckv_press_config *c, int L, int *head, int *tail) {
    (void)L; /* every rule so far is a fixed count */
    const ckv_press_def *d = ckv_press_def_of(c->scorer);
    *head = 0;
    *tail = 0;
    switch (d ? d->protect : CKV_PROTECT_NONE) {
    case CKV_PROTECT_WINDOW: *tail = c->window; break;
    case CKV_PROTECT_LAST: *tail = 1; break;
    case CKV_PROTECT_SINKS: *head = c->n_sink; break;
    case CKV_PROTECT_NONE: break;
    }
}

int ckv_press_xn_first(const ckv_press_config *c, int L) {
    const ckv_press_def *d = c ? ckv_press_def_of(c->scorer) : NULL;
    int first = 0;
    switch (d ? d->reads : CKV_READS_ALL) {
    case CKV_READS_ALL: first = 0; break;
    case CKV_READS_WINDOW: first = L - c->window; break;
    case CKV_READS_LAST: first = L - 1; break;
    case CKV_READS_NONE: first = L; break;
    }
    if (!c || c->scorer == CKV_SCORER_NONE) first = L;
    return first < 0 ? 0 : first > L ? L : first;
}

static ckv_status finch_needs_question(void) {
    return ckv_error(CKV_STATUS_ERR_ARG, "press finch scores with the question's attention: it needs a question "
                     "compressed with the context (query_aware)");
}

ckv_status ckv_press_with_question(const ckv_press_config *c, int question_rows, ckv_press_config *out) {
    *out = *c;
    if (c->scorer != CKV_SCORER_FINCH || (question_rows < 1 && c->question_rows >= 1)) return CKV_STATUS_OK;
    if (question_rows < 1) return finch_needs_question();
    out->question_rows = question_rows;
    out->window = question_rows;
    return ckv_press_finalize(out); /* the spec names the question's length */
}

int ckv_press_rerotates(const ckv_press_config *c) {
    return c->rerotate_keys || (c->scorer == CKV_SCORER_FINCH && c->finch_rerotate);
}

ckv_status ckv_press_check_context(const ckv_press_config *c, int L) {
    if (c->scorer == CKV_SCORER_FINCH) { /* its window is the question (ckv_press_with_question) */
        const int w = c->question_rows;
        if (w < 1) return finch_needs_question();
        if (L <= w)
            return ckv_error(CKV_STATUS_ERR_ARG, "press finch: a question of %d tokens needs a context before it, the "
                             "prompt has %d tokens", w, L);
        /* kvpress asserts chunk_length > window / (1 - cr): every chunk keeps more than the question */
        if (c->chunk_length > 0 && c->budget_tokens <= 0 &&
            !((double)c->chunk_length > (double)w / (1.0 - c->compression_ratio)))
            return ckv_error(CKV_STATUS_ERR_ARG, "press finch: chunk_length %d must exceed question / (1 - cr) = "
                             "%d / (1 - %g)", c->chunk_length, w, c->compression_ratio);
    }
    if (ckv_press_takes(c, "window") && L <= c->window)
        return ckv_error(CKV_STATUS_ERR_ARG, "window %d needs a context longer than %d tokens, got %d", c->window,
                         c->window, L);
    if (ckv_press_evicts(c) && L < 2)
        return ckv_error(CKV_STATUS_ERR_ARG, "a context of %d token cannot be compressed", L);
    return CKV_STATUS_OK;
}
