/* press_table.c - the press registry's tables (see press_registry.h): every option with its type,
 * default and range; every press with the options it takes, its own defaults, the wrappers that may
 * stack on it, what it protects, its kept-count rule and its scorer; every wrapper. Data and lookups
 * only: building, printing and counting are in press.c, dispatch in scorer.c. Defaults are kvpress
 * 0.5.5's (or the reference repository's where the press is not in kvpress). */
#include "evict/press_registry.h"

#include <stddef.h>
#include <string.h>

#include "evict/score_defensive.h"

#define F(field) offsetof(ckv_press_config, field)

const ckv_option_def ckv_press_option_table[] = {
    {"window", CKV_OPTION_INT, F(window), "64", 1, 1 << 20, 0, "observation window: the last w tokens' queries score", NULL},
    {"kernel", CKV_OPTION_INT, F(kernel), "5", 1, 1 << 12, 1, "pooling kernel along the tokens (odd, 1 = none)", NULL},
    {"pool", CKV_OPTION_CHOICE, F(pool), "avg", 0, 0, 0, "pooling: avg (kvpress) or max (the CriticalKV paper)",
     "avg|max"},
    {"beta", CKV_OPTION_REAL, F(beta), "20", 1, 1e6, 0, "PyramidKV: ratio of the largest to the smallest layer budget", NULL},
    {"n_sink", CKV_OPTION_INT, F(n_sink), "4", 0, 1 << 20, 0, "sink tokens kept at the start", NULL},
    {"n_future", CKV_OPTION_INT, F(n_future), "512", 1, 1 << 24, 0, "ExpectedAttention: future positions averaged", NULL},
    {"covariance", CKV_OPTION_BOOL, F(use_covariance), "1", 0, 1, 0, "ExpectedAttention: use the query covariance", NULL},
    {"vnorm", CKV_OPTION_BOOL, F(use_vnorm), "1", 0, 1, 0, "ExpectedAttention: rescale by the value norms", NULL},
    {"epsilon", CKV_OPTION_REAL, F(epsilon_ea), "0", 0, 1e6, 0, "ExpectedAttention: added to the scores", NULL},
    {"lag_size", CKV_OPTION_INT, F(lag_size), "128", 1, 1 << 16, 0, "LagKV: partition length", NULL},
    {"cross_scoring", CKV_OPTION_BOOL, F(cross_scoring), "0", 0, 1, 0, "LagKV: rank raw scores across partitions", NULL},
    {"leverage_type", CKV_OPTION_CHOICE, F(leverage_type), "kv_product", 0, 0, 0,
     "CUR: what scores: key or value leverage, their mean or their product", "key|value|kv_avg|kv_product"},
    {"use_local_approximation", CKV_OPTION_BOOL, F(use_local_approximation), "1", 0, 1, 0,
     "CUR: normalise the squared norms within windows of local_window_size tokens", NULL},
    {"local_window_size", CKV_OPTION_INT, F(local_window_size), "16", 1, 1 << 20, 0, "CUR: that window", NULL},
    {"sketch_dimension", CKV_OPTION_INT, F(sketch_dimension), "48", 1, 256, 0,
     "leverage: columns of the Gaussian sketch of the keys", NULL},
    {"seed", CKV_OPTION_SEED, F(seed), "0", 0, 0x7fffffff, 0, "random, leverage, compactor: generator seed", NULL},
    {"sink_size_start", CKV_OPTION_INT, F(sink_size_start), "8", 0, 1 << 20, 0, "compactor: sink tokens at the start",
     NULL},
    {"sink_size_end", CKV_OPTION_INT, F(sink_size_end), "4", 0, 1 << 20, 0, "compactor: sink tokens at the end", NULL},
    {"chunk_size", CKV_OPTION_INT, F(chunk_size), "256", 1, 1 << 16, 0,
     "compactor: chunk of its non-causal attention; kvzip: context tokens per replay", NULL},
    {"blending", CKV_OPTION_REAL, F(blending), "-1", -1, 1e6, 0,
     "compactor: weight of the leverage scores; -1: the compression ratio (kvpress's None)", NULL},
    {"layerwise", CKV_OPTION_BOOL, F(layerwise), "0", 0, 1, 0,
     "kvzip: every layer removes its share int(Hkv L cr) (0: one count over the model)", NULL},
    {"kvzip_plus_normalization", CKV_OPTION_BOOL, F(kvzip_plus_normalization), "0", 0, 1, 0,
     "kvzip: KVzip+: each replayed row's attention divided by ||h||, each column's times ||v W_O|| of the query head", NULL},
    {"repeat_ids", CKV_OPTION_IDS, F(repeat_ids), "", 0, 0x7fffffff, 0,
     "kvzip: token ids of \"\\n\\nRepeat the previous context exactly.\" in the model's vocabulary", NULL},
    {"repeat_next_ids", CKV_OPTION_IDS, F(repeat_next_ids), "", 0, 0x7fffffff, 0,
     "kvzip: token ids of \"\\n\\nRepeat the part of the previous context exactly, starting with\"", NULL},
    {"suffix_ids", CKV_OPTION_IDS, F(suffix_ids), "", 0, 0x7fffffff, 0,
     "kvzip: token ids after the prompt (\"\\n\" without a chat template; the template's turn end with one)", NULL},
    {"alpha", CKV_OPTION_REAL, F(alpha), "0.5", 0, 1, 0, "CriticalKV: first-stage share of the budget", NULL},
    {"eps", CKV_OPTION_REAL, F(eps), "0.0001", 0, 1e6, 0, "CriticalKV: epsilon added to the scores", NULL},
    {"safeguard", CKV_OPTION_REAL, F(safeguard), "0.2", 0, 1, 0, "AdaKV: share of a head's budget it keeps anyway", NULL},
    {"profile", CKV_OPTION_FILE, F(profile), "", 0, 0, 0, "HeadKV: head-importance profile (JSON file)", NULL},
    {"chunk_length", CKV_OPTION_INT, F(chunk_length), "20", 0, 1 << 20, 0,
     "ChunkKV: tokens per chunk (>= 1); finch: rows per selection chunk (0: one selection over the prompt)", NULL},
    {"normalize_scores", CKV_OPTION_BOOL, F(normalize_scores), "1", 0, 1, 0,
     "finch: each question row's attention times the number of rows before it", NULL},
    {"rerotate_keys", CKV_OPTION_BOOL, F(finch_rerotate), "1", 0, 1, 0,
     "finch: the kept keys re-rotated to positions 0 .. n_kept - 1 (as key_rerotation:)", NULL},
    {"compression_ratios", CKV_OPTION_REALS, F(layer_ratios), "", 0, 0.999999, 0,
     "per_layer: the compression ratio of each layer, one per layer (e.g. 0.25,0.5,0.75)", NULL},
    {"press_ratios", CKV_OPTION_REALS, F(press_ratios), "", 0, 0.999999, 0,
     "composed: the compression ratio of each press but per_layer: members, in order (e.g. 0.5,0.25)", NULL},
};
const int ckv_press_option_count = (int)(sizeof ckv_press_option_table / sizeof ckv_press_option_table[0]);

/* kvzip's layer scores are its replay's (engine/kvzip.h), handed over in in->given. */
static ckv_status score_kvzip(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    (void)cfg;
    if (!in->given)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "press kvzip scores by replaying the whole context after its prefill, "
                         "not one layer at a time (layer %d)", in->layer);
    return in->be->ops->copy(in->be, scores, in->given, (size_t)in->n_kv_local * (size_t)in->L * sizeof(float));
}

/* DefensiveKV through the generic signature (it reports the window it protects, as the registry says). */
static ckv_status score_defensivekv(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    ckv_score_info info;
    return ckv_score_defensivekv(in, cfg, scores, &info);
}

const ckv_press_def ckv_press_table[] = {
    {"none", CKV_SCORER_NONE, "", NULL, 0, CKV_ALLOC_UNIFORM, 0, CKV_PROTECT_NONE, CKV_KEPT_UNIFORM, NULL,
     "no compression: the full cache", CKV_READS_NONE},
    {"snapkv", CKV_SCORER_SNAPKV, "window,kernel,pool", NULL, 0, CKV_ALLOC_UNIFORM, CKV_WRAP_ALL, CKV_PROTECT_WINDOW,
     CKV_KEPT_UNIFORM, ckv_score_snapkv, "attention of the last window's queries, pooled", CKV_READS_WINDOW},
    {"snapkv_paper", CKV_SCORER_SNAPKV, "window,kernel,pool", "window=32,kernel=7,pool=max", 1, CKV_ALLOC_UNIFORM,
     CKV_WRAP_ALL, CKV_PROTECT_WINDOW, CKV_KEPT_UNIFORM, ckv_score_snapkv, "snapkv with the CriticalKV paper's preset", CKV_READS_WINDOW},
    {"pyramidkv", CKV_SCORER_PYRAMIDKV, "window,kernel,pool,beta", NULL, 0, CKV_ALLOC_UNIFORM, 0, CKV_PROTECT_WINDOW,
     CKV_KEPT_PYRAMID, ckv_score_snapkv, "snapkv's scores, budgets shrinking with depth", CKV_READS_WINDOW},
    {"tova", CKV_SCORER_TOVA, "", NULL, 0, CKV_ALLOC_UNIFORM, CKV_WRAP_ALL, CKV_PROTECT_LAST, CKV_KEPT_UNIFORM,
     ckv_score_tova, "the last token's attention, averaged over the layer's query heads", CKV_READS_LAST},
    {"knorm", CKV_SCORER_KNORM, "", NULL, 0, CKV_ALLOC_UNIFORM, CKV_WRAP_ALL, CKV_PROTECT_NONE, CKV_KEPT_UNIFORM,
     ckv_score_knorm, "minus the key norm", CKV_READS_NONE},
    {"streaming_llm", CKV_SCORER_STREAMING_LLM, "n_sink", NULL, 0, CKV_ALLOC_UNIFORM, CKV_WRAP_ALL & ~CKV_WRAP_CHUNKKV, CKV_PROTECT_SINKS,
     CKV_KEPT_UNIFORM, ckv_score_streaming_llm, "sinks and the most recent tokens", CKV_READS_NONE},
    {"observed_attention", CKV_SCORER_OBSERVED_ATTENTION, "", NULL, 0, CKV_ALLOC_UNIFORM, CKV_WRAP_ALL & ~CKV_WRAP_CHUNKKV, CKV_PROTECT_NONE,
     CKV_KEPT_UNIFORM, ckv_score_observed_attention, "mean attention received from every context query", CKV_READS_ALL},
    {"expected_attention", CKV_SCORER_EXPECTED_ATTENTION, "n_future,n_sink,covariance,vnorm,epsilon", NULL, 0,
     CKV_ALLOC_UNIFORM, CKV_WRAP_ALL, CKV_PROTECT_SINKS, CKV_KEPT_UNIFORM, ckv_score_expected_attention,
     "attention expected from future queries (their statistics)", CKV_READS_ALL},
    {"random", CKV_SCORER_RANDOM, "seed", NULL, 0, CKV_ALLOC_UNIFORM, CKV_WRAP_ALL, CKV_PROTECT_NONE, CKV_KEPT_UNIFORM,
     ckv_score_random, "uniform random scores", CKV_READS_NONE},
    {"defensivekv", CKV_SCORER_DEFENSIVEKV, "window,kernel,pool", "window=32", 0, CKV_ALLOC_GLOBAL, 0,
     CKV_PROTECT_WINDOW, CKV_KEPT_LAYER_FRACTION, score_defensivekv,
     "defensive aggregation of the window's attention, one top-k over the layer", CKV_READS_WINDOW},
    {"layer_defensivekv", CKV_SCORER_LAYER_DEFENSIVEKV, "window,kernel,pool", "window=32", 0, CKV_ALLOC_MODEL, 0,
     CKV_PROTECT_NONE, CKV_KEPT_MODEL_FRACTION, score_defensivekv,
     "defensivekv's scores, one top-k over every layer (the window at its layer's max)", CKV_READS_WINDOW},
    {"keydiff", CKV_SCORER_KEYDIFF, "", NULL, 0, CKV_ALLOC_UNIFORM, CKV_WRAP_ALL, CKV_PROTECT_NONE, CKV_KEPT_UNIFORM,
     ckv_score_keydiff, "minus the cosine of each key to its head's mean normalised key (attention-free)", CKV_READS_NONE},
    {"lagkv", CKV_SCORER_LAGKV, "n_sink,lag_size,cross_scoring", NULL, 0, CKV_ALLOC_UNIFORM, CKV_WRAP_ALL,
     CKV_PROTECT_NONE, CKV_KEPT_UNIFORM, ckv_score_lagkv,
     "spread of keys and values against the next partition's range, ranked per partition (attention-free)", CKV_READS_NONE},
    {"cur", CKV_SCORER_CUR, "n_sink,leverage_type,use_local_approximation,local_window_size", NULL, 0,
     CKV_ALLOC_UNIFORM, CKV_WRAP_ALL, CKV_PROTECT_NONE, CKV_KEPT_UNIFORM, ckv_score_cur,
     "squared key and value norms (CurDKV's deterministic leverage), windowed; sinks score 1 (attention-free)", CKV_READS_NONE},
    {"leverage", CKV_SCORER_LEVERAGE, "sketch_dimension,seed", NULL, 0, CKV_ALLOC_UNIFORM, CKV_WRAP_ALL, CKV_PROTECT_NONE,
     CKV_KEPT_UNIFORM, ckv_score_leverage,
     "leverage of the pre-RoPE keys under a Gaussian sketch, z-scored over the layer (attention-free)", CKV_READS_NONE},
    {"compactor", CKV_SCORER_COMPACTOR, "sink_size_start,sink_size_end,chunk_size,sketch_dimension,blending,seed", NULL, 0,
     CKV_ALLOC_UNIFORM, CKV_WRAP_ALL, CKV_PROTECT_NONE, CKV_KEPT_UNIFORM, ckv_score_compactor,
     "blending x leverage + chunked non-causal attention times value norms, z-scored; sinks score the max",
     CKV_READS_ALL},
    {"kvzip", CKV_SCORER_KVZIP, "n_sink,chunk_size,layerwise,kvzip_plus_normalization,repeat_ids,repeat_next_ids,suffix_ids", "chunk_size=2048", 0,
     CKV_ALLOC_MODEL, 0, CKV_PROTECT_NONE, CKV_KEPT_MODEL_REMOVED, score_kvzip,
     "max attention of a replay of the context onto it (reconstruction), one top-k over every layer", CKV_READS_NONE},
    {"finch", CKV_SCORER_FINCH, "chunk_length,normalize_scores,rerotate_keys", "chunk_length=0", 0, CKV_ALLOC_UNIFORM, 0,
     CKV_PROTECT_WINDOW, CKV_KEPT_CHUNKS, ckv_score_finch,
     "the question's attention (its rows the window), each row times its count of earlier rows (query-aware)",
     CKV_READS_WINDOW},
};
const int ckv_press_count = (int)(sizeof ckv_press_table / sizeof ckv_press_table[0]);

const ckv_wrapper_def ckv_wrapper_table[] = {
    {"critical", 1, CKV_ALLOC_UNIFORM, CKV_WRAP_CRITICAL, "alpha,eps", "CriticalKV two-stage selection", 0, 0, 0},
    {"adakv", 0, CKV_ALLOC_ADAKV, CKV_WRAP_ADAKV, "safeguard", "AdaKV cross-head budgets", 0, 0, 0},
    {"critical_adakv", 1, CKV_ALLOC_ADAKV, CKV_WRAP_CRITICAL | CKV_WRAP_ADAKV, "alpha,eps,safeguard",
     "CriticalKV selection within AdaKV budgets", 0, 0, 0},
    {"headkv", 0, CKV_ALLOC_HEADKV, CKV_WRAP_HEADKV, "profile", "HeadKV budgets from a head-importance profile", 0, 0, 0},
    {"critical_headkv", 1, CKV_ALLOC_HEADKV, CKV_WRAP_CRITICAL | CKV_WRAP_HEADKV, "alpha,eps,profile",
     "CriticalKV selection within HeadKV budgets", 0, 0, 0},
    {"chunkkv", 0, CKV_ALLOC_CHUNK, CKV_WRAP_CHUNKKV, "chunk_length",
     "ChunkKV: whole chunks, the same for every head of a layer, ranked by their mean score summed over the heads", 0, 0, 0},
    {"per_layer", 0, CKV_ALLOC_PER_LAYER, CKV_WRAP_PER_LAYER, "compression_ratios",
     "per-layer compression ratios in place of the budget", 0, 0, 0},
    {"key_rerotation", 0, CKV_ALLOC_UNIFORM, CKV_WRAP_REROTATE, "",
     "the kept keys re-rotated to positions 0 .. n_kept - 1 (RoPE), as if the context had been that long", 1, 0, 1},
    {"composed", 0, CKV_ALLOC_UNIFORM, CKV_WRAP_COMPOSED, "press_ratios",
     "presses applied in turn, each to the rows the previous one kept (PRESS+PRESS+...)", 0, 1, 0},
};
const int ckv_wrapper_count = (int)(sizeof ckv_wrapper_table / sizeof ckv_wrapper_table[0]);

static int name_is(const char *name, const char *s, size_t len) {
    return strlen(name) == len && !strncmp(name, s, len);
}

const ckv_press_def *ckv_press_def_find(const char *name, size_t len) {
    for (int i = 0; i < ckv_press_count; i++)
        if (name_is(ckv_press_table[i].name, name, len)) return &ckv_press_table[i];
    return NULL;
}

const ckv_press_def *ckv_press_def_of(ckv_scorer_kind k) {
    for (int i = 0; i < ckv_press_count; i++)
        if (ckv_press_table[i].scorer == k && !ckv_press_table[i].preset) return &ckv_press_table[i];
    return NULL;
}

const ckv_wrapper_def *ckv_wrapper_def_find(const char *name, size_t len) {
    for (int i = 0; i < ckv_wrapper_count; i++)
        if (name_is(ckv_wrapper_table[i].name, name, len)) return &ckv_wrapper_table[i];
    return NULL;
}

const ckv_wrapper_def *ckv_wrapper_def_of(int critical, ckv_alloc_kind alloc, int rerotate, int composed) {
    for (int i = 0; i < ckv_wrapper_count; i++)
        if (ckv_wrapper_table[i].critical == (critical != 0) && ckv_wrapper_table[i].alloc == alloc &&
            ckv_wrapper_table[i].rerotate == (rerotate != 0) && ckv_wrapper_table[i].composed == (composed != 0))
            return &ckv_wrapper_table[i];
    return NULL;
}

const ckv_option_def *ckv_option_def_find(const char *key, size_t len) {
    for (int i = 0; i < ckv_press_option_count; i++)
        if (name_is(ckv_press_option_table[i].key, key, len)) return &ckv_press_option_table[i];
    return NULL;
}

int ckv_option_listed(const char *keys, const char *key, size_t len) {
    for (const char *p = keys; p && *p;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && !strncmp(p, key, len)) return 1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}
