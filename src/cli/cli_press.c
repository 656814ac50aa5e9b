/* cli_press.c - press flags -> press configurations for every command: the spec checked for the
 * mistakes users make (options written into the name), the budget flags that exclude each other,
 * the press options applied in command-line order and refused when no press of the command takes
 * them (derived from the canonical spec, which lists exactly the options a press uses). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_press.h"

static const ckv_opt_id option_flags[] = {CKV_OPT_WINDOW, CKV_OPT_KERNEL, CKV_OPT_POOL,    CKV_OPT_ALPHA,
                                          CKV_OPT_EPS,    CKV_OPT_SAFEGUARD, CKV_OPT_PROFILE};
static const char *const option_keys[] = {"window", "kernel", "pool", "alpha", "eps", "safeguard", "profile"};
#define N_OPTION_FLAGS (sizeof option_flags / sizeof option_flags[0])

static int is_scorer_name(const char *s, size_t n) {
    for (int k = 1; k < CKV_SCORER_COUNT_; k++) {
        const char *name = ckv_scorer_name((ckv_scorer_kind)k);
        if (strlen(name) == n && !strncmp(name, s, n)) return 1;
    }
    return n == 12 && !strncmp(s, "snapkv_paper", 12);
}

void ckv_cli_press_check_spec(const ckv_opts *o, const char *flag, const char *spec) {
    const char *colon = strrchr(spec, ':');
    if (strchr(spec, '=') || strchr(spec, '('))
        ckv_cli_usage_error(o->cmd_name, "%s '%s': options are not part of the press name; give them as flags "
                            "(e.g. --window 4) or --press-opt KEY=VALUE", flag, spec);
    if (colon) {
        const char *first = strchr(spec, ':');
        if (is_scorer_name(spec, (size_t)(first - spec)))
            ckv_cli_usage_error(o->cmd_name, "%s '%s': '%.*s' is a press, not a wrapper; wrappers (critical, adakv, "
                                "critical_adakv, headkv, critical_headkv) come first, as in critical:snapkv", flag, spec,
                                (int)(first - spec), spec);
    }
}

/* 1 when the finalised press uses option `key` (its canonical spec lists it). */
static int press_takes(const ckv_press_config *c, const char *key) {
    char pat[40];
    snprintf(pat, sizeof pat, "(%s=", key);
    if (strstr(c->spec, pat)) return 1;
    snprintf(pat, sizeof pat, ",%s=", key);
    return strstr(c->spec, pat) != NULL;
}

static void split_kv(const ckv_opts *o, const char *kv, char *key, size_t cap, const char **value) {
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) ckv_cli_usage_error(o->cmd_name, "--press-opt: expected KEY=VALUE, got '%s'", kv);
    snprintf(key, cap, "%.*s", (int)(eq - kv), kv);
    *value = eq + 1;
}

void ckv_cli_press_build(const ckv_opts *o, const char *spec, const ckv_cli_budget *budget, ckv_press_config *c) {
    ckv_cli_press_check_spec(o, "--press", spec);
    ckv_cli_check(ckv_press_parse(c, spec));
    for (int i = 0; i < o->n; i++) { /* options in command-line order */
        for (size_t k = 0; k < N_OPTION_FLAGS; k++)
            if (o->occ[i].id == option_flags[k]) ckv_cli_check(ckv_press_set_option(c, option_keys[k], o->occ[i].value));
        if (o->occ[i].id == CKV_OPT_PRESS_OPT) {
            char key[64];
            const char *v = NULL;
            split_kv(o, o->occ[i].value, key, sizeof key, &v);
            ckv_cli_check(ckv_press_set_option(c, key, v));
        }
    }
    if (budget && budget->kind == CKV_CLI_BUDGET_FRACTION) ckv_cli_check(ckv_press_set_budget(c, budget->value));
    if (budget && budget->kind == CKV_CLI_BUDGET_RATIO) ckv_cli_check(ckv_press_set_compression_ratio(c, budget->value));
    if (budget && budget->kind == CKV_CLI_BUDGET_TOKENS) ckv_cli_check(ckv_press_set_budget_tokens(c, (int)budget->value));
}

void ckv_cli_press_budget(const ckv_opts *o, ckv_cli_budget *b) {
    static const ckv_opt_id ids[] = {CKV_OPT_BUDGET, CKV_OPT_COMPRESSION_RATIO, CKV_OPT_BUDGET_TOKENS};
    ckv_opts_exclusive(o, ids, 3, "both set the budget");
    b->kind = CKV_CLI_BUDGET_NONE;
    b->value = 0;
    if (ckv_opt_has(o, CKV_OPT_BUDGET)) b->kind = CKV_CLI_BUDGET_FRACTION, b->value = ckv_opt_num(o, CKV_OPT_BUDGET, 0);
    if (ckv_opt_has(o, CKV_OPT_COMPRESSION_RATIO))
        b->kind = CKV_CLI_BUDGET_RATIO, b->value = ckv_opt_num(o, CKV_OPT_COMPRESSION_RATIO, 0);
    if (ckv_opt_has(o, CKV_OPT_BUDGET_TOKENS)) b->kind = CKV_CLI_BUDGET_TOKENS, b->value = (double)ckv_opt_long(o, CKV_OPT_BUDGET_TOKENS, 0);
}

void ckv_cli_press_check_options(const ckv_opts *o, const ckv_press_config *cfgs, int n, const char *what) {
    for (int i = 0; i < o->n; i++) {
        const char *key = NULL, *flag = NULL;
        char kbuf[64], fbuf[96];
        for (size_t k = 0; k < N_OPTION_FLAGS; k++)
            if (o->occ[i].id == option_flags[k]) key = option_keys[k], flag = ckv_opt_flag(option_flags[k]);
        if (o->occ[i].id == CKV_OPT_PRESS_OPT) {
            const char *v = NULL;
            split_kv(o, o->occ[i].value, kbuf, sizeof kbuf, &v);
            key = kbuf;
            snprintf(fbuf, sizeof fbuf, "--press-opt %s", o->occ[i].value);
            flag = fbuf;
        }
        if (!key) continue;
        int taken = 0;
        for (int c = 0; c < n && !taken; c++) taken = cfgs[c].scorer == CKV_SCORER_NONE ? 0 : press_takes(&cfgs[c], key);
        if (!taken && n == 1)
            ckv_cli_usage_error(o->cmd_name, "%s does not take %s (its options are those its spec lists: %s)", what, flag,
                                cfgs[0].spec);
        if (!taken)
            ckv_cli_usage_error(o->cmd_name, "none of the presses of %s takes %s", what, flag);
    }
}

void ckv_cli_press_single(const ckv_opts *o, const char *cmd, ckv_press_config *c) {
    ckv_cli_budget b;
    ckv_cli_press_budget(o, &b);
    const char *spec = ckv_opt_str(o, CKV_OPT_PRESS, "none");
    ckv_cli_press_build(o, spec, &b, c);
    c->query_aware = ckv_opt_has(o, CKV_OPT_QUERY_AWARE);
    if (c->scorer != CKV_SCORER_NONE && b.kind == CKV_CLI_BUDGET_NONE)
        ckv_cli_usage_error(cmd, "--press %s needs a budget: --budget B, --compression-ratio R or --budget-tokens N", spec);
    ckv_cli_check(ckv_press_finalize(c));
    char what[160];
    snprintf(what, sizeof what, "--press %s", spec);
    ckv_cli_press_check_options(o, c, 1, what);
}
