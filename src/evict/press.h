/* press.h - what a run compresses and how: the press configuration, built from a spec string such
 * as "critical_adakv:snapkv", options, a budget and defaults by ONE builder that every caller (the
 * command line, the server, eval) uses; its canonical form (echoed in every output); and the ONE
 * rule from a budget to kept counts. Which presses and wrappers exist, the options each takes (with
 * types, defaults and ranges), how they stack, what each protects and how it counts what it keeps
 * is the press registry (press_registry.h, press_table.c): adding a press adds its scorer kind
 * below, its registry entry and its scorer, nothing else. The semantics of every scorer and wrapper
 * are those of docs/spec-eviction.md. Parsing, validation and counting only; scoring is in scorer.h,
 * selection in select.h. Errors name the press, the option or the budget field, never a
 * command-line flag. */
#ifndef CKV_EVICT_PRESS_H
#define CKV_EVICT_PRESS_H

#include <stdint.h>

#include "core/status.h"

typedef enum {
    CKV_SCORER_NONE = 0,          /* no compression (full cache) */
    CKV_SCORER_SNAPKV,
    CKV_SCORER_TOVA,
    CKV_SCORER_KNORM,
    CKV_SCORER_STREAMING_LLM,
    CKV_SCORER_OBSERVED_ATTENTION,
    CKV_SCORER_EXPECTED_ATTENTION,
    CKV_SCORER_PYRAMIDKV,         /* snapkv scores, per-layer kept counts */
    CKV_SCORER_RANDOM,
    CKV_SCORER_DEFENSIVEKV,       /* defensive aggregation (FFY0/DefensiveKV); global top-k */
    CKV_SCORER_KEYDIFF,           /* kvpress KeyDiffPress (attention-free) */
    CKV_SCORER_LAGKV,             /* kvpress LagKVPress (attention-free) */
    CKV_SCORER_CUR,               /* kvpress CURPress (attention-free) */
    CKV_SCORER_LEVERAGE,          /* kvpress LeverageScorePress (attention-free) */
    CKV_SCORER_COMPACTOR,         /* kvpress CompactorPress (leverage + chunked non-causal attention) */
    CKV_SCORER_LAYER_DEFENSIVEKV, /* DefensiveKV's scores, one top-k over every layer (FFY0/DefensiveKV) */
    CKV_SCORER_KVZIP,             /* kvpress KVzipPress: attention of a context replay, one top-k over every layer */
    CKV_SCORER_FINCH,             /* kvpress FinchPress: the question's attention, count-normalised (query-aware) */
    CKV_SCORER_COUNT_
} ckv_scorer_kind;

typedef enum {
    CKV_ALLOC_UNIFORM = 0, /* every head keeps n_kept */
    CKV_ALLOC_ADAKV,       /* safeguard + one bottom-k across the heads of a layer (kvpress AdaKVPress) */
    CKV_ALLOC_HEADKV,      /* per-head budgets from an offline head-importance profile */
    CKV_ALLOC_GLOBAL,      /* plain global top-k across the heads of a layer (defensivekv) */
    CKV_ALLOC_CHUNK,       /* whole chunks shared by the layer's heads, ranked by mean score (kvpress ChunkKVPress) */
    CKV_ALLOC_PER_LAYER,   /* every head of layer l keeps max(1, floor(L * (1 - cr_l))) (kvpress PerLayerCompressionPress) */
    CKV_ALLOC_MODEL        /* one top-k across every layer and head of the model (layer_defensivekv; select_model.h) */
} ckv_alloc_kind;

/* per_layer's compression ratios, one per layer of the model, in layer order */
enum { CKV_PRESS_MAX_LAYERS = 256 };
typedef struct {
    int n;
    double cr[CKV_PRESS_MAX_LAYERS];
} ckv_press_ratios;

/* kvzip's replay prompts: token ids of the model's vocabulary */
enum { CKV_PRESS_MAX_IDS = 64 };
typedef struct {
    int n;
    int32_t id[CKV_PRESS_MAX_IDS];
} ckv_press_ids;

/* composed: the presses applied in turn, the first one's scorer being the press's own */
enum { CKV_PRESS_MAX_STAGES = 8 };

typedef enum { CKV_POOL_AVG = 0, CKV_POOL_MAX = 1 } ckv_pool_kind;
/* CUR's leverage_type, in kvpress's order of the option's values */
typedef enum { CKV_CUR_KEY = 0, CKV_CUR_VALUE, CKV_CUR_KV_AVG, CKV_CUR_KV_PRODUCT } ckv_cur_kind;

typedef struct {
    ckv_scorer_kind scorer;
    ckv_alloc_kind alloc;
    int critical;              /* CriticalKV two-stage selection on top */
    /* scorer options (defaults and ranges: the registry's option table) */
    int window;                /* snapkv/pyramidkv observation window w (kvpress 64, paper 32) */
    int kernel;                /* pooling kernel (kvpress 5, paper 7); 1 = none */
    ckv_pool_kind pool;        /* avg (kvpress) or max (paper) */
    int n_sink;                /* streaming_llm / expected_attention sinks (4) */
    int n_future;              /* expected_attention n_future_positions (512) */
    int use_covariance;        /* expected_attention (1) */
    int use_vnorm;             /* expected_attention (1) */
    double epsilon_ea;         /* expected_attention epsilon (0) */
    uint64_t seed;             /* random; leverage's sketch */
    double beta;               /* pyramidkv: ratio of the largest to the smallest layer budget (20) */
    int lag_size;              /* lagkv: partition length (128) */
    int cross_scoring;         /* lagkv: rank raw scores across partitions (0) */
    int leverage_type;         /* cur: ckv_cur_kind (kv_product) */
    int use_local_approximation; /* cur: normalise the norms per local window (1) */
    int local_window_size;     /* cur: that window (16) */
    int sketch_dimension;      /* leverage, compactor: columns of the Gaussian sketch (48) */
    int sink_size_start;       /* compactor: sink tokens at the start (8) */
    int sink_size_end;         /* compactor: sink tokens at the end (4) */
    int chunk_size;            /* compactor: chunk of the non-causal attention (256) */
    double blending;           /* compactor: weight of the leverage; < 0: the compression ratio (-1) */
    int kvzip_plus_normalization; /* kvzip: KVzip+ (attention / ||h|| x ||v W_O||) (0) */
    int layerwise;             /* kvzip: each layer removes int(Hkv L cr) entries instead of one count over the model (0) */
    ckv_press_ids repeat_ids;  /* kvzip: the prompt before the first replayed chunk ("Repeat the previous context exactly.") */
    ckv_press_ids repeat_next_ids; /* kvzip: the prompt before a later chunk ("... exactly, starting with") */
    ckv_press_ids suffix_ids;  /* kvzip: what follows the prompt before the chunk (the chat template's turn end) */
    int normalize_scores;      /* finch: each question row's attention times its count of earlier rows (1) */
    int finch_rerotate;        /* finch: its rerotate_keys option (1); the other presses store it unread */
    int question_rows;         /* finch: the question's rows at the end of the prompt (its window; 0: no question,
                                * set by ckv_press_with_question) */
    /* wrapper options */
    double alpha;              /* critical first-stage ratio (0.5) */
    double eps;                /* critical epsilon (1e-4) */
    double safeguard;          /* adakv alpha_safeguard (0.2) */
    char profile[512];         /* headkv profile JSON path */
    int rerotate_keys;         /* key_rerotation: kept keys re-rotated to positions 0 .. n_kept - 1 */
    int chunk_length;          /* chunkkv: tokens per chunk (20); finch: rows per selection chunk (0: none) */
    ckv_press_ratios layer_ratios; /* per_layer: compression ratio of each layer (required) */
    int composed;              /* composed: presses in turn, each on what the previous kept (kvpress ComposedPress) */
    int n_stages;              /* composed: how many presses (stages[0] == scorer) */
    ckv_scorer_kind stages[CKV_PRESS_MAX_STAGES]; /* composed: the presses, in order */
    /* composed: each press's own wrappers (kvpress: a wrapped press among ComposedPress's presses) */
    unsigned char stage_critical[CKV_PRESS_MAX_STAGES]; /* critical: (stage_critical[0] == critical) */
    unsigned char stage_chunk[CKV_PRESS_MAX_STAGES];    /* chunkkv: (chunk_length shared) */
    unsigned char stage_rerotate[CKV_PRESS_MAX_STAGES]; /* key_rerotation: */
    unsigned char stage_per_layer[CKV_PRESS_MAX_STAGES]; /* per_layer: (its ratios: layer_ratios, shared) */
    /* composed: each press's compression ratio, in order, but per_layer: members' (kvpress's
     * PerLayerCompressionPress takes no compression_ratio); required when a press takes one */
    ckv_press_ratios press_ratios;
    /* budget: exactly one of compression_ratio (kvpress cr) and budget_tokens is in force */
    double compression_ratio;  /* fraction removed; kept = floor(L * (1 - cr)) */
    int budget_tokens;         /* > 0: fixed kept count per head */
    int budget_given_as_b;     /* the budget was given as a kept fraction b (cr = 1 - b); echoed with the formula */
    int query_aware;           /* compress context + question together */
    char spec[512];            /* canonical spec string, echoed in outputs */
} ckv_press_config;

/* ---- the builder ---------------------------------------------------------------------------------- */

typedef enum {
    CKV_BUDGET_NONE = 0,
    CKV_BUDGET_FRACTION, /* kept fraction b in (0, 1]: cr = 1 - b ("budget") */
    CKV_BUDGET_RATIO,    /* kvpress's compression ratio cr in [0, 1) ("compression_ratio") */
    CKV_BUDGET_TOKENS    /* kept tokens per head, >= 1 ("budget_tokens") */
} ckv_budget_kind;

typedef struct {
    ckv_budget_kind kind;
    double value;
} ckv_press_budget;

typedef struct {
    const char *key, *value; /* "window", "32" */
} ckv_press_option_value;

enum {
    CKV_PRESS_NEED_BUDGET = 1u << 0,  /* a press that evicts must have a budget (given or from the defaults) */
    CKV_PRESS_NEED_FILES = 1u << 1,   /* options naming input files (headkv's profile) must be given */
    CKV_PRESS_ANY_OPTIONS = 1u << 2,  /* options this press does not take are validated and ignored (the
                                       * caller checks that some press of its set takes each) */
    CKV_PRESS_NO_FILE_OPTIONS = 1u << 3 /* options naming files are refused in rq->options (a server's
                                         * requests: the files are the server's to name) */
};

typedef struct {
    const ckv_press_config *defaults; /* what the request leaves out (NULL: the full cache, no budget) */
    const char *spec;                 /* NULL: the defaults' press; else a spec whose budget, when the
                                       * request gives none, is the defaults' (when they evict) */
    ckv_press_budget budget;          /* kind NONE: as above */
    const ckv_press_option_value *options; /* applied in order, after the press's own defaults */
    int n_options;
    int query_aware;                  /* -1: the defaults' (0 without defaults or with a spec) */
    unsigned flags;                   /* CKV_PRESS_NEED_* / CKV_PRESS_ANY_OPTIONS */
} ckv_press_request;

typedef struct {
    const char *field; /* what was wrong: "press", "budget", "compression_ratio", "budget_tokens",
                        * "query_aware" or an option key (static strings) */
    int missing;       /* 1: the field is required and absent, 0: its value is invalid */
    int option;        /* 1: the error is about one of the request's options (rq->options) */
} ckv_press_error;

/* Builds and finalises a press from a request: the spec (or the defaults' press), the press's own
 * defaults, the options in order, the budget (or the defaults'), query_aware, then the canonical
 * spec. On error *out is a valid "none" press, the message names the field and *err (may be NULL)
 * says which. */
ckv_status ckv_press_build(ckv_press_config *out, const ckv_press_request *rq, ckv_press_error *err);

/* The steps of the builder, for callers that change one thing of a built press. */
/* Fills the defaults of `spec` ("none", "snapkv", "snapkv_paper", "critical:snapkv", ...; see the
 * registry). Unknown names are an error naming the spec and the known names. */
ckv_status ckv_press_parse(ckv_press_config *cfg, const char *spec);
/* Sets one option by name; errors name the option and the value. Options the press does not take are
 * validated and stored (they have no effect). */
ckv_status ckv_press_set_option(ckv_press_config *cfg, const char *key, const char *value);
/* Budget: b in (0, 1] (cr = 1 - b), cr in [0, 1), N >= 1 tokens per head. */
ckv_status ckv_press_set_budget(ckv_press_config *cfg, double budget);
ckv_status ckv_press_set_compression_ratio(ckv_press_config *cfg, double cr);
ckv_status ckv_press_set_budget_tokens(ckv_press_config *cfg, int n);
/* Checks the options against each other and writes cfg->spec (canonical, with every option). */
ckv_status ckv_press_finalize(ckv_press_config *cfg);

/* 1 when the press of cfg (its scorer or its wrapper) takes option `key`. */
int ckv_press_takes(const ckv_press_config *cfg, const char *key);
/* 1 when `name` is a press (not a wrapper) of the registry. */
int ckv_press_is_press(const char *name, int len);
/* 1 when the press evicts (is not "none"). */
int ckv_press_evicts(const ckv_press_config *cfg);

/* ---- budget -> kept counts (the one rule) ------------------------------------------------------------ */

/* Kept count per head for a uniform press on L tokens: kvpress's max(1, floor(L * (1 - cr))) in
 * double precision, or min(budget_tokens, L); composed: that rule applied press after press, each to
 * the count before it; per_layer (alone or as a member): its largest layer's count (what a layer may
 * hold). */
int ckv_press_n_kept(const ckv_press_config *cfg, int L);
/* composed: how many values press_ratios takes (one per member but the per_layer: ones); else 0. */
int ckv_press_n_ratios(const ckv_press_config *cfg);

typedef struct {
    int per_head;     /* what one head keeps (uniform presses), the mean for cross-head allocation;
                       * pyramidkv: its layer's count */
    long layer_total; /* entries kept over the layer's n_kv_heads heads (cross-head allocation) */
    int first_stage;  /* CriticalKV's stage-1 count b1 of a head keeping per_head (uniform presses) */
    int safeguard;    /* AdaKV's per-head safeguard count (adakv presses), else 0 */
} ckv_press_kept;

/* The kept counts of `layer` (of n_layers) for a context of L tokens over n_kv_heads KV heads, in
 * the registry's kept-count rule of the press and kvpress's (or the reference's) evaluation order. */
void ckv_press_layer_kept(const ckv_press_config *cfg, int layer, int n_layers, int L, int n_kv_heads,
                          ckv_press_kept *out);
/* The entries kept over the whole model by a press that selects across layers (CKV_ALLOC_MODEL):
 * DefensiveKV's int(L * (1 - cr) * n_kv_heads * n_layers), left to right in double; kvzip's
 * E - int(E * cr) with E = n_layers * n_kv_heads * L (kvpress removes int(E * cr)); with budget_tokens
 * N, n_layers * n_kv_heads * min(N, L). At most n_layers * n_kv_heads * L. */
long ckv_press_model_kept(const ckv_press_config *cfg, int n_layers, int L, int n_kv_heads);
/* kvzip with layerwise: the entries one layer of L tokens over n_kv_heads KV heads keeps, E - int(E * cr)
 * with E = n_kv_heads * L (min(N, L) per head with budget_tokens N). */
long ckv_press_layerwise_kept(const ckv_press_config *cfg, int L, int n_kv_heads);
/* Press i (0 .. n_stages - 1) of a composed press as a plain press: its scorer, the shared options, its
 * own compression ratio (its entry of press_ratios, which per_layer: members skip) and its own wrappers
 * (critical:, chunkkv:, key_rerotation:, per_layer: with the shared compression_ratios), else uniform
 * kept counts. */
void ckv_press_stage(const ckv_press_config *cfg, int i, ckv_press_config *out);
/* CriticalKV's stage-1 count of a head whose budget was allocated across heads (k rows). */
int ckv_press_first_stage(const ckv_press_config *cfg, int k);

/* The press as it runs on a prompt whose last question_rows rows are the question (query-aware): finch's
 * window is the question; finch without a question (0 rows) is an error naming the press. Other presses
 * are copied unchanged. */
ckv_status ckv_press_with_question(const ckv_press_config *cfg, int question_rows, ckv_press_config *out);
/* 1 when the kept keys are re-rotated after compaction (key_rerotation:, finch's rerotate_keys) and the
 * question follows at n_kept; a composed press re-rotates in its stages (ckv_press_stage) and its
 * question follows at L, as kvpress's pipeline feeds a ComposedPress. */
int ckv_press_rerotates(const ckv_press_config *cfg);

/* The tokens the press's scorer protects on a context of L tokens: the first *head and the last
 * *tail (window, sinks, the last token). Selection ranks them above
 * every other token; HeadKV keeps them beside each head's share. */
void ckv_press_protected(const ckv_press_config *cfg, int L, int *head, int *tail);

/* The first row of a layer's attention input the press's scorer reads on a context of L tokens (L:
 * none), from the registry: a prefill that scores later keeps rows first .. L - 1 only. */
int ckv_press_xn_first(const ckv_press_config *cfg, int L);
/* Checks the press can compress a context of L tokens (windowed scorers need L > window). */
ckv_status ckv_press_check_context(const ckv_press_config *cfg, int L);
/* Checks the press fits a model of n_layers layers (per_layer, alone or as a composed member, gives one
 * ratio per layer). */
ckv_status ckv_press_check_layers(const ckv_press_config *cfg, int n_layers);

const char *ckv_scorer_name(ckv_scorer_kind k);

#endif
