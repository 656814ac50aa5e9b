/* press.c - parses and validates press specs ("critical_adakv:snapkv"), their options and the
 * budget, and writes the canonical spec string echoed in outputs. No scoring, no selection. */
#include "evict/press.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const scorer_names[CKV_SCORER_COUNT_] = {
    "none", "snapkv", "tova", "knorm", "streaming_llm", "observed_attention", "expected_attention",
    "pyramidkv", "random", "defensivekv",
};

const char *ckv_scorer_name(ckv_scorer_kind k) {
    return (int)k >= 0 && k < CKV_SCORER_COUNT_ ? scorer_names[k] : "?";
}

#define CKV_PRESS_KNOWN                                                                                        \
    "none, snapkv, snapkv_paper, pyramidkv, tova, knorm, streaming_llm, observed_attention, expected_attention, " \
    "random, defensivekv, optionally wrapped as critical:, adakv:, critical_adakv:, headkv:, critical_headkv: "  \
    "(e.g. critical_adakv:snapkv)"

static void press_defaults(ckv_press_config *c) {
    memset(c, 0, sizeof *c);
    c->window = 64;
    c->kernel = 5;
    c->pool = CKV_POOL_AVG;
    c->n_sink = 4;
    c->n_future = 512;
    c->beta = 20.0;
    c->use_covariance = 1;
    c->use_vnorm = 1;
    c->alpha = 0.5;
    c->eps = 1e-4;
    c->safeguard = 0.2;
    c->compression_ratio = 0.0;
}

static int parse_base(ckv_press_config *c, const char *name) {
    if (!strcmp(name, "snapkv_paper")) { /* the CriticalKV paper's SnapKV preset */
        c->scorer = CKV_SCORER_SNAPKV;
        c->window = 32;
        c->kernel = 7;
        c->pool = CKV_POOL_MAX;
        return 1;
    }
    for (int k = 0; k < CKV_SCORER_COUNT_; k++)
        if (!strcmp(name, scorer_names[k])) {
            c->scorer = (ckv_scorer_kind)k;
            return 1;
        }
    return 0;
}

ckv_status ckv_press_parse(ckv_press_config *c, const char *spec) {
    press_defaults(c);
    if (!spec || !*spec) return ckv_error(CKV_STATUS_ERR_ARG, "--press: empty press spec (known: " CKV_PRESS_KNOWN ")");
    char buf[256];
    if (strlen(spec) >= sizeof buf) return ckv_error(CKV_STATUS_ERR_ARG, "--press: spec '%.40s...' is too long", spec);
    strcpy(buf, spec);
    char *colon = strchr(buf, ':');
    const char *base = buf;
    if (colon) {
        *colon = '\0';
        base = colon + 1;
        const char *w = buf;
        if (!strcmp(w, "critical")) {
            c->critical = 1;
        } else if (!strcmp(w, "adakv")) {
            c->alloc = CKV_ALLOC_ADAKV;
        } else if (!strcmp(w, "critical_adakv")) {
            c->critical = 1;
            c->alloc = CKV_ALLOC_ADAKV;
        } else if (!strcmp(w, "headkv")) {
            c->alloc = CKV_ALLOC_HEADKV;
        } else if (!strcmp(w, "critical_headkv")) {
            c->critical = 1;
            c->alloc = CKV_ALLOC_HEADKV;
        } else {
            return ckv_error(CKV_STATUS_ERR_ARG, "--press '%s': unknown wrapper '%s' (known: " CKV_PRESS_KNOWN ")", spec, w);
        }
        if (strchr(base, ':'))
            return ckv_error(CKV_STATUS_ERR_ARG, "--press '%s': only one wrapper may be given", spec);
    }
    if (!parse_base(c, base))
        return ckv_error(CKV_STATUS_ERR_ARG, "--press '%s': unknown press '%s' (known: " CKV_PRESS_KNOWN ")", spec, base);
    if (colon && (c->scorer == CKV_SCORER_NONE || c->scorer == CKV_SCORER_DEFENSIVEKV || c->scorer == CKV_SCORER_PYRAMIDKV))
        return ckv_error(CKV_STATUS_ERR_ARG, "--press '%s': %s cannot be wrapped (its kept counts are its own)", spec, base);
    if (c->scorer == CKV_SCORER_DEFENSIVEKV) { /* DefensiveKV's defaults: window 32, avg pool, kernel 5 */
        c->alloc = CKV_ALLOC_GLOBAL;
        c->window = 32;
    }
    return CKV_STATUS_OK;
}

static ckv_status parse_int(const char *key, const char *v, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || end == v || *end) return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: expected an integer, got '%s'", key, v);
    if (x < lo || x > hi) return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: %ld is outside [%ld, %ld]", key, x, lo, hi);
    *out = x;
    return CKV_STATUS_OK;
}

static ckv_status parse_real(const char *key, const char *v, double lo, double hi, double *out) {
    char *end = NULL;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !isfinite(x))
        return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: expected a number, got '%s'", key, v);
    if (x < lo || x > hi) return ckv_error(CKV_STATUS_ERR_ARG, "press option %s: %g is outside [%g, %g]", key, x, lo, hi);
    *out = x;
    return CKV_STATUS_OK;
}

ckv_status ckv_press_set_option(ckv_press_config *c, const char *key, const char *v) {
    long i = 0;
    double d = 0;
    if (!strcmp(key, "window")) {
        CKV_TRY(parse_int(key, v, 1, 1 << 20, &i));
        c->window = (int)i;
    } else if (!strcmp(key, "kernel")) {
        CKV_TRY(parse_int(key, v, 1, 1 << 12, &i));
        if (i % 2 == 0) return ckv_error(CKV_STATUS_ERR_ARG, "press option kernel: %ld must be odd", i);
        c->kernel = (int)i;
    } else if (!strcmp(key, "pool")) {
        if (!strcmp(v, "avg")) c->pool = CKV_POOL_AVG;
        else if (!strcmp(v, "max")) c->pool = CKV_POOL_MAX;
        else return ckv_error(CKV_STATUS_ERR_ARG, "press option pool: '%s' is not avg or max", v);
    } else if (!strcmp(key, "alpha")) {
        CKV_TRY(parse_real(key, v, 0.0, 1.0, &c->alpha));
    } else if (!strcmp(key, "eps")) {
        CKV_TRY(parse_real(key, v, 0.0, 1e6, &c->eps));
    } else if (!strcmp(key, "safeguard")) {
        CKV_TRY(parse_real(key, v, 0.0, 1.0, &c->safeguard));
    } else if (!strcmp(key, "n_sink")) {
        CKV_TRY(parse_int(key, v, 0, 1 << 20, &i));
        c->n_sink = (int)i;
    } else if (!strcmp(key, "n_future")) {
        CKV_TRY(parse_int(key, v, 1, 1 << 24, &i));
        c->n_future = (int)i;
    } else if (!strcmp(key, "covariance")) {
        CKV_TRY(parse_int(key, v, 0, 1, &i));
        c->use_covariance = (int)i;
    } else if (!strcmp(key, "vnorm")) {
        CKV_TRY(parse_int(key, v, 0, 1, &i));
        c->use_vnorm = (int)i;
    } else if (!strcmp(key, "beta")) {
        CKV_TRY(parse_real(key, v, 1.0, 1e6, &c->beta));
    } else if (!strcmp(key, "epsilon")) { /* expected_attention's epsilon */
        CKV_TRY(parse_real(key, v, 0.0, 1e6, &c->epsilon_ea));
    } else if (!strcmp(key, "seed")) {
        CKV_TRY(parse_int(key, v, 0, 0x7fffffffL, &i));
        c->seed = (uint64_t)i;
    } else if (!strcmp(key, "profile")) {
        if (strlen(v) >= sizeof c->profile) return ckv_error(CKV_STATUS_ERR_ARG, "press option profile: path too long");
        strcpy(c->profile, v);
    } else {
        (void)d;
        return ckv_error(CKV_STATUS_ERR_ARG,
                         "unknown press option '%s' (known: window, kernel, pool, alpha, eps, safeguard, n_sink, "
                         "n_future, covariance, vnorm, epsilon, beta, seed, profile)", key);
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_press_set_budget(ckv_press_config *c, double b) {
    if (!(b > 0.0 && b <= 1.0)) return ckv_error(CKV_STATUS_ERR_ARG, "--budget: %g is outside (0, 1] (the kept fraction)", b);
    c->compression_ratio = 1.0 - b;
    c->budget_given_as_b = 1;
    c->budget_tokens = 0;
    return CKV_STATUS_OK;
}

ckv_status ckv_press_set_compression_ratio(ckv_press_config *c, double cr) {
    if (!(cr >= 0.0 && cr < 1.0))
        return ckv_error(CKV_STATUS_ERR_ARG, "--compression-ratio: %g is outside [0, 1) (the fraction removed)", cr);
    c->compression_ratio = cr;
    c->budget_given_as_b = 0;
    c->budget_tokens = 0;
    return CKV_STATUS_OK;
}

ckv_status ckv_press_set_budget_tokens(ckv_press_config *c, int n) {
    if (n < 1) return ckv_error(CKV_STATUS_ERR_ARG, "--budget-tokens: %d must be >= 1", n);
    c->budget_tokens = n;
    c->compression_ratio = 0.0;
    c->budget_given_as_b = 0;
    return CKV_STATUS_OK;
}

int ckv_press_n_kept(const ckv_press_config *c, int L) {
    if (c->budget_tokens > 0) return c->budget_tokens < L ? c->budget_tokens : L;
    double k = floor((double)L * (1.0 - c->compression_ratio));
    int n = (int)k;
    return n < 1 ? 1 : n > L ? L : n;
}

ckv_status ckv_press_finalize(ckv_press_config *c) {
    if (c->alloc == CKV_ALLOC_HEADKV && !c->profile[0])
        return ckv_error(CKV_STATUS_ERR_ARG, "--press headkv needs a head-importance profile (--profile FILE)");
    if (c->scorer == CKV_SCORER_NONE && (c->compression_ratio > 0 || c->budget_tokens > 0))
        return ckv_error(CKV_STATUS_ERR_ARG, "a budget was given but --press is none");
    char wrap[160] = "", base[200] = "", budget[120] = "";
    const char *wname = c->critical ? (c->alloc == CKV_ALLOC_ADAKV ? "critical_adakv" : c->alloc == CKV_ALLOC_HEADKV ? "critical_headkv" : "critical")
                                    : (c->alloc == CKV_ALLOC_ADAKV ? "adakv" : c->alloc == CKV_ALLOC_HEADKV ? "headkv" : NULL);
    if (wname) {
        int n = snprintf(wrap, sizeof wrap, "%s(", wname);
        if (c->critical) n += snprintf(wrap + n, sizeof wrap - (size_t)n, "alpha=%g,eps=%g%s", c->alpha, c->eps,
                                       c->alloc != CKV_ALLOC_UNIFORM ? "," : "");
        if (c->alloc == CKV_ALLOC_ADAKV) n += snprintf(wrap + n, sizeof wrap - (size_t)n, "safeguard=%g", c->safeguard);
        if (c->alloc == CKV_ALLOC_HEADKV) n += snprintf(wrap + n, sizeof wrap - (size_t)n, "profile=%s", c->profile);
        snprintf(wrap + n, sizeof wrap - (size_t)n, "):");
    }
    switch (c->scorer) {
    case CKV_SCORER_SNAPKV:
    case CKV_SCORER_DEFENSIVEKV:
        snprintf(base, sizeof base, "%s(window=%d,kernel=%d,pool=%s)", ckv_scorer_name(c->scorer), c->window, c->kernel,
                 c->pool == CKV_POOL_MAX ? "max" : "avg");
        break;
    case CKV_SCORER_PYRAMIDKV:
        snprintf(base, sizeof base, "pyramidkv(window=%d,kernel=%d,pool=%s,beta=%g)", c->window, c->kernel,
                 c->pool == CKV_POOL_MAX ? "max" : "avg", c->beta);
        break;
    case CKV_SCORER_STREAMING_LLM: snprintf(base, sizeof base, "streaming_llm(n_sink=%d)", c->n_sink); break;
    case CKV_SCORER_EXPECTED_ATTENTION:
        snprintf(base, sizeof base, "expected_attention(n_future=%d,n_sink=%d,covariance=%d,vnorm=%d,epsilon=%g)",
                 c->n_future, c->n_sink, c->use_covariance, c->use_vnorm, c->epsilon_ea);
        break;
    case CKV_SCORER_RANDOM: snprintf(base, sizeof base, "random(seed=%llu)", (unsigned long long)c->seed); break;
    default: snprintf(base, sizeof base, "%s", ckv_scorer_name(c->scorer)); break;
    }
    if (c->scorer == CKV_SCORER_NONE)
        snprintf(budget, sizeof budget, " full cache");
    else if (c->budget_tokens > 0)
        snprintf(budget, sizeof budget, " budget_tokens=%d per head", c->budget_tokens);
    else if (c->budget_given_as_b)
        snprintf(budget, sizeof budget, " budget=%g (cr=%.17g, kept=max(1,floor(L*(1-cr))))", 1.0 - c->compression_ratio,
                 c->compression_ratio);
    else
        snprintf(budget, sizeof budget, " cr=%g (kept=max(1,floor(L*(1-cr))))", c->compression_ratio);
    snprintf(c->spec, sizeof c->spec, "%s%s%s%s", wrap, base, budget, c->query_aware ? " query-aware" : " context-only");
    return CKV_STATUS_OK;
}

ckv_status ckv_press_check_context(const ckv_press_config *c, int L) {
    if ((c->scorer == CKV_SCORER_SNAPKV || c->scorer == CKV_SCORER_PYRAMIDKV || c->scorer == CKV_SCORER_DEFENSIVEKV) &&
        L <= c->window)
        return ckv_error(CKV_STATUS_ERR_ARG, "--window %d needs a context longer than %d tokens, got %d", c->window,
                         c->window, L);
    if (c->scorer != CKV_SCORER_NONE && L < 2)
        return ckv_error(CKV_STATUS_ERR_ARG, "a context of %d token cannot be compressed", L);
    return CKV_STATUS_OK;
}
