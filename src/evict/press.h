/* press.h - what a run compresses and how: the press configuration parsed from a spec string such
 * as "critical_adakv:snapkv" plus options, and its canonical form (echoed in every output). The
 * semantics of every scorer and wrapper are those of docs/spec-eviction.md. Parsing and
 * validation only; scoring is in scorer.h, selection in select.h. */
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
    CKV_SCORER_COUNT_
} ckv_scorer_kind;

typedef enum {
    CKV_ALLOC_UNIFORM = 0, /* every head keeps n_kept */
    CKV_ALLOC_ADAKV,       /* safeguard + one bottom-k across the heads of a layer (kvpress AdaKVPress) */
    CKV_ALLOC_HEADKV,      /* per-head budgets from an offline head-importance profile */
    CKV_ALLOC_GLOBAL       /* plain global top-k across the heads of a layer (defensivekv) */
} ckv_alloc_kind;

typedef enum { CKV_POOL_AVG = 0, CKV_POOL_MAX = 1 } ckv_pool_kind;

typedef struct {
    ckv_scorer_kind scorer;
    ckv_alloc_kind alloc;
    int critical;              /* CriticalKV two-stage selection on top */
    /* scorer options */
    int window;                /* snapkv/pyramidkv observation window w (kvpress 64, paper 32) */
    int kernel;                /* pooling kernel (kvpress 5, paper 7); 1 = none */
    ckv_pool_kind pool;        /* avg (kvpress) or max (paper) */
    int n_sink;                /* streaming_llm / expected_attention sinks (4) */
    int n_future;              /* expected_attention n_future_positions (512) */
    int use_covariance;        /* expected_attention (1) */
    int use_vnorm;             /* expected_attention (1) */
    double epsilon_ea;         /* expected_attention epsilon (0) */
    uint64_t seed;             /* random */
    double beta;               /* pyramidkv: ratio of the largest to the smallest layer budget (20) */
    /* wrapper options */
    double alpha;              /* critical first-stage ratio (0.5) */
    double eps;                /* critical epsilon (1e-4) */
    double safeguard;          /* adakv alpha_safeguard (0.2) */
    char profile[512];         /* headkv profile JSON path */
    /* budget: exactly one of compression_ratio (kvpress cr) and budget_tokens is in force */
    double compression_ratio;  /* fraction removed; kept = floor(L * (1 - cr)) */
    int budget_tokens;         /* > 0: fixed kept count per head */
    int budget_given_as_b;     /* the user wrote --budget b (cr = 1 - b); echoed with the formula */
    int query_aware;           /* compress context + question together */
    char spec[512];            /* canonical spec string, echoed in outputs */
} ckv_press_config;

/* Fills defaults for `spec` ("none", "snapkv", "snapkv_paper", "critical:snapkv",
 * "adakv:snapkv", "critical_adakv:snapkv", "headkv:snapkv", "critical_headkv:snapkv",
 * "pyramidkv", "tova", "knorm", "streaming_llm", "observed_attention", "expected_attention",
 * "random", "defensivekv", ...). Unknown names are an error naming the spec and the known names. */
ckv_status ckv_press_parse(ckv_press_config *cfg, const char *spec);

/* Sets one option by name ("window", "kernel", "pool", "alpha", "eps", "safeguard", "n_sink",
 * "n_future", "seed", "profile", ...); errors name the option and the value. */
ckv_status ckv_press_set_option(ckv_press_config *cfg, const char *key, const char *value);

/* Budget: --budget b in (0, 1] (cr = 1 - b), --compression-ratio cr in [0, 1), --budget-tokens N. */
ckv_status ckv_press_set_budget(ckv_press_config *cfg, double budget);
ckv_status ckv_press_set_compression_ratio(ckv_press_config *cfg, double cr);
ckv_status ckv_press_set_budget_tokens(ckv_press_config *cfg, int n);

/* Checks the options against each other and writes cfg->spec (canonical, with every option). */
ckv_status ckv_press_finalize(ckv_press_config *cfg);

/* Kept count per head for a uniform press on L tokens: kvpress's max(1, floor(L * (1 - cr))) in
 * double precision, or min(budget_tokens, L). */
int ckv_press_n_kept(const ckv_press_config *cfg, int L);

/* Checks the press can compress a context of L tokens (windowed scorers need L > window). */
ckv_status ckv_press_check_context(const ckv_press_config *cfg, int L);

const char *ckv_scorer_name(ckv_scorer_kind k);

#endif
