/* press_registry.h - the press registry, internal to src/evict: one table of options (key, type,
 * field, default, range), one entry per press (name, scorer, the options it takes in canonical
 * order, its own defaults, which wrappers may stack on it, what it protects, its kept-count rule,
 * its scorer) and one entry per wrapper (name, CriticalKV or not, allocation, options). The tables
 * are in press_table.c; press.c builds, validates, prints and counts from them, scorer.c dispatches
 * through them. Nothing else restates the list of presses. */
#ifndef CKV_EVICT_PRESS_REGISTRY_H
#define CKV_EVICT_PRESS_REGISTRY_H

#include <stddef.h>

#include "evict/press.h"
#include "evict/scorer.h"

typedef enum {
    CKV_OPTION_INT,  /* int field, integer in [lo, hi] */
    CKV_OPTION_REAL, /* double field, finite number in [lo, hi] */
    CKV_OPTION_BOOL, /* int field, 0 or 1 */
    CKV_OPTION_CHOICE, /* int-sized enum field: the index of the value in `choices` ("avg|max") */
    CKV_OPTION_SEED, /* uint64_t field, integer in [lo, hi] */
    CKV_OPTION_FILE, /* char[512] field, a path (CKV_PRESS_NEED_FILES: required when taken) */
    CKV_OPTION_IDS,  /* ckv_press_ids field: token ids in [lo, hi], comma-separated, optionally in [ ]
                      * (required when taken, as REALS) */
    CKV_OPTION_REALS /* ckv_press_ratios field: numbers in [lo, hi], comma-separated, optionally in [ ]
                      * (required when taken, CKV_PRESS_NEED_FILES or not: there is no default list) */
} ckv_option_type;

typedef struct {
    const char *key;      /* "window" */
    ckv_option_type type;
    size_t offset;        /* of the field in ckv_press_config */
    const char *dflt;     /* default, in the option's own syntax ("" for a file: none) */
    double lo, hi;        /* range of INT / REAL / SEED */
    int odd;              /* INT: must be odd */
    const char *what;     /* one line for errors and docs */
    const char *choices;  /* CHOICE: the values, '|'-separated, in enum order; else NULL */
} ckv_option_def;

/* What a scorer protects (selection ranks it above every other token). */
typedef enum {
    CKV_PROTECT_NONE,
    CKV_PROTECT_WINDOW, /* the last `window` tokens */
    CKV_PROTECT_LAST,   /* the last token */
    CKV_PROTECT_SINKS   /* the first `n_sink` tokens */
} ckv_protect_rule;

/* Which rows of the layer's attention input (xn) a scorer reads, so a shared prefill keeps only those. */
typedef enum {
    CKV_READS_ALL = 0, /* every context row (observed / expected attention) */
    CKV_READS_WINDOW,  /* the last `window` rows */
    CKV_READS_LAST,    /* the last row */
    CKV_READS_NONE     /* none: keys and values only (attention-free scorers) */
} ckv_reads_rule;

/* How a budget becomes kept counts. */
typedef enum {
    CKV_KEPT_UNIFORM,       /* every head max(1, floor(L * (1 - cr))) or min(budget_tokens, L) */
    CKV_KEPT_PYRAMID,       /* PyramidKV's per-layer schedule (pyramid.c) */
    CKV_KEPT_LAYER_FRACTION, /* one layer total int(L * (1 - cr) * Hkv) over all heads (DefensiveKV) */
    CKV_KEPT_MODEL_FRACTION, /* one model total int(L * (1 - cr) * Hkv * n_layers) over all layers and heads
                              * (Layer-DefensiveKV; ckv_press_model_kept) */
    CKV_KEPT_CHUNKS,         /* uniform; with chunk_length C > 0 every head keeps the sum over the chunks of C
                              * rows (a shorter last one) of max(1, floor(len * (1 - cr))) (finch) */
    CKV_KEPT_MODEL_REMOVED   /* the model's E = n_layers Hkv L entries less int(E * cr) removed, over all layers
                              * and heads, or each layer's Hkv L less int(Hkv L cr) with layerwise (kvzip) */
} ckv_kept_rule;

enum { CKV_WRAP_CRITICAL = 1u << 0, CKV_WRAP_ADAKV = 1u << 1, CKV_WRAP_HEADKV = 1u << 2,
       CKV_WRAP_CHUNKKV = 1u << 3,   /* kvpress ChunkKVPress: scorers whose scores need no attention weights */
       CKV_WRAP_PER_LAYER = 1u << 4, /* kvpress PerLayerCompressionPress: uniform kept counts */
       CKV_WRAP_REROTATE = 1u << 5,  /* kvpress KeyRerotationPress: uniform kept counts */
       CKV_WRAP_COMPOSED = 1u << 6,  /* kvpress ComposedPress: first of its presses (uniform kept counts); a
                                      * later one must also read keys and values only (CKV_READS_NONE) */
       CKV_WRAP_ALL = CKV_WRAP_CRITICAL | CKV_WRAP_ADAKV | CKV_WRAP_HEADKV | CKV_WRAP_CHUNKKV | CKV_WRAP_PER_LAYER |
                      CKV_WRAP_REROTATE | CKV_WRAP_COMPOSED };

/* scores [n_kv_local, L] (device) for the press of cfg; see ckv_score_layer. */
typedef ckv_status (*ckv_score_fn)(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);

typedef struct {
    const char *name;       /* as written in a spec */
    ckv_scorer_kind scorer;
    const char *options;    /* the option keys it takes, in canonical order ("window,kernel,pool") */
    const char *defaults;   /* its own defaults over the option table's ("window=32"); NULL: none */
    int preset;             /* 1: another name for the scorer's first entry with other defaults */
    ckv_alloc_kind alloc;   /* the allocation the press itself implies (defensivekv: global top-k) */
    unsigned wrappers;      /* CKV_WRAP_* that may stack on it */
    ckv_protect_rule protect;
    ckv_kept_rule kept;
    ckv_score_fn score;     /* NULL for none */
    const char *summary;    /* one line: what it scores */
    ckv_reads_rule reads;   /* the attention-input rows it reads */
} ckv_press_def;

typedef struct {
    const char *name;       /* "critical_adakv" */
    int critical;
    ckv_alloc_kind alloc;
    unsigned needs;         /* the CKV_WRAP_* bits the wrapped press must allow */
    const char *options;    /* in canonical order */
    const char *summary;
    int rerotate;           /* the kept keys are re-rotated to positions 0 .. n_kept - 1 after compaction */
    int composed;           /* its base is PRESS+PRESS+...: presses applied in turn (composed) */
    int over_critical;      /* 1: it may stack on critical: (WRAPPER:critical:PRESS; kvpress's CriticalKVPress is a
                             * ScorerPress, which this wrapper takes) */
} ckv_wrapper_def;

extern const ckv_option_def ckv_press_option_table[];
extern const int ckv_press_option_count;
extern const ckv_press_def ckv_press_table[];
extern const int ckv_press_count;
extern const ckv_wrapper_def ckv_wrapper_table[];
extern const int ckv_wrapper_count;

/* Lookups: NULL when unknown. ckv_press_def_of gives the scorer's first (canonical) entry. */
const ckv_press_def *ckv_press_def_find(const char *name, size_t len);
const ckv_press_def *ckv_press_def_of(ckv_scorer_kind k);
const ckv_wrapper_def *ckv_wrapper_def_find(const char *name, size_t len);
const ckv_wrapper_def *ckv_wrapper_def_of(int critical, ckv_alloc_kind alloc, int rerotate, int composed);
const ckv_option_def *ckv_option_def_find(const char *key, size_t len);
/* 1 when the comma-separated key list `keys` holds `key`. */
int ckv_option_listed(const char *keys, const char *key, size_t len);

#endif
