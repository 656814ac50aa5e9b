/* cli_press.c - press flags -> press configurations for every command, through the library's one
 * builder (evict/press.h): the spec checked for the mistake users make (options written into the
 * name), the budget flags that exclude each other, the press options handed over in command-line
 * order and refused, naming the flag, when no press of the command takes them (the registry says
 * which options a press takes). It knows no press by name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_press.h"

static const ckv_opt_id option_flags[] = {CKV_OPT_WINDOW, CKV_OPT_KERNEL, CKV_OPT_POOL,    CKV_OPT_ALPHA,
                                          CKV_OPT_EPS,    CKV_OPT_SAFEGUARD, CKV_OPT_PROFILE};
static const char *const option_keys[] = {"window", "kernel", "pool", "alpha", "eps", "safeguard", "profile"};
#define N_OPTION_FLAGS (sizeof option_flags / sizeof option_flags[0])

void ckv_cli_press_check_spec(const ckv_opts *o, const char *flag, const char *spec) {
    if (strchr(spec, '=') || strchr(spec, '('))
        ckv_cli_usage_error(o->cmd_name, "%s '%s': options are not part of the press name; give them as flags "
                            "(e.g. --window 4) or --press-opt KEY=VALUE", flag, spec);
}

static void split_kv(const ckv_opts *o, const char *kv, char *key, size_t cap, const char **value) {
    const char *eq = strchr(kv, '=');
    if (!eq || eq == kv) ckv_cli_usage_error(o->cmd_name, "--press-opt: expected KEY=VALUE, got '%s'", kv);
    snprintf(key, cap, "%.*s", (int)(eq - kv), kv);
    *value = eq + 1;
}

/* The press options of the command line, in order, as (key, value) pairs into kv[cap] (keys in keys[]). */
static int collect_options(const ckv_opts *o, ckv_press_option_value *kv, char (*keys)[64], int cap) {
    int n = 0;
    for (int i = 0; i < o->n && n < cap; i++) {
        for (size_t k = 0; k < N_OPTION_FLAGS; k++)
            if (o->occ[i].id == option_flags[k]) kv[n++] = (ckv_press_option_value){option_keys[k], o->occ[i].value};
        if (o->occ[i].id == CKV_OPT_PRESS_OPT) {
            const char *v = NULL;
            split_kv(o, o->occ[i].value, keys[n], sizeof keys[n], &v);
            kv[n] = (ckv_press_option_value){keys[n], v};
            n++;
        }
    }
    if (n == cap) ckv_cli_usage_error(o->cmd_name, "too many press options (at most %d)", cap - 1);
    return n;
}

static const ckv_budget_kind budget_kinds[] = {
    [CKV_CLI_BUDGET_NONE] = CKV_BUDGET_NONE, [CKV_CLI_BUDGET_FRACTION] = CKV_BUDGET_FRACTION,
    [CKV_CLI_BUDGET_RATIO] = CKV_BUDGET_RATIO, [CKV_CLI_BUDGET_TOKENS] = CKV_BUDGET_TOKENS};

/* The library's builder on the command line's spec, options and budget. */
static void build(const ckv_opts *o, const char *spec, const ckv_cli_budget *budget, int query_aware, unsigned flags,
                  ckv_press_config *c) {
    enum { MAX_OPTIONS = 64 };
    ckv_press_option_value kv[MAX_OPTIONS];
    char keys[MAX_OPTIONS][64];
    ckv_cli_press_check_spec(o, "--press", spec);
    ckv_press_request rq = {.spec = spec, .options = kv, .n_options = collect_options(o, kv, keys, MAX_OPTIONS),
                            .query_aware = query_aware, .flags = flags | CKV_PRESS_ANY_OPTIONS};
    if (budget) rq.budget = (ckv_press_budget){budget_kinds[budget->kind], budget->value};
    if (ckv_press_build(c, &rq, NULL) != CKV_STATUS_OK) ckv_cli_usage_error(o->cmd_name, "%s", ckv_error_message());
}

void ckv_cli_press_build(const ckv_opts *o, const char *spec, const ckv_cli_budget *budget, ckv_press_config *c) {
    build(o, spec, budget, 0, CKV_PRESS_NEED_FILES, c);
}

void ckv_cli_press_plan(const ckv_opts *o, const char *spec, const ckv_cli_budget *budget, ckv_press_config *c) {
    build(o, spec, budget, 0, 0, c);
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
        for (int c = 0; c < n && !taken; c++) taken = ckv_press_takes(&cfgs[c], key);
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
    (void)cmd; /* o->cmd_name names the command in errors */
    build(o, spec, &b, ckv_opt_has(o, CKV_OPT_QUERY_AWARE), CKV_PRESS_NEED_FILES | CKV_PRESS_NEED_BUDGET, c);
    ckv_decode_press dp;
    int n = 1;
    ckv_press_config both[2] = {*c};
    if (ckv_cli_decode_press(o, c, 1, &dp)) both[n++] = dp.press; /* its options count as taken */
    char what[700];
    snprintf(what, sizeof what, n > 1 ? "--press %s and --decode-press %s" : "--press %s", spec,
             ckv_opt_str(o, CKV_OPT_DECODE_PRESS, ""));
    ckv_cli_press_check_options(o, both, n, what);
}

int ckv_cli_decode_press(const ckv_opts *o, const ckv_press_config *prefill, int n_prefill, ckv_decode_press *dp) {
    static const ckv_opt_id ids[] = {CKV_OPT_DECODE_TARGET, CKV_OPT_DECODE_RATIO};
    ckv_opts_exclusive(o, ids, 2, "both set what a decode-time compression keeps");
    if (!ckv_opt_has(o, CKV_OPT_DECODE_PRESS)) {
        static const ckv_opt_id rest[] = {CKV_OPT_DECODE_INTERVAL, CKV_OPT_DECODE_TARGET, CKV_OPT_DECODE_RATIO};
        for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++)
            if (ckv_opt_has(o, rest[i]))
                ckv_cli_usage_error(o->cmd_name, "%s needs --decode-press SPEC (the press that compresses during "
                                    "generation)", ckv_opt_flag(rest[i]));
        return 0;
    }
    enum { MAX_OPTIONS = 64 };
    ckv_press_option_value kv[MAX_OPTIONS];
    char keys[MAX_OPTIONS][64];
    const char *spec = ckv_opt_str(o, CKV_OPT_DECODE_PRESS, "");
    ckv_cli_press_check_spec(o, "--decode-press", spec);
    int ratio_form = ckv_opt_has(o, CKV_OPT_DECODE_RATIO) > 0;
    ckv_status st = ckv_decode_press_build(
        dp, spec, (int)ckv_opt_long(o, CKV_OPT_DECODE_INTERVAL, CKV_DECODE_INTERVAL_DEFAULT),
        ratio_form ? 0 : (int)ckv_opt_long(o, CKV_OPT_DECODE_TARGET, CKV_DECODE_TARGET_DEFAULT),
        ratio_form ? ckv_opt_num(o, CKV_OPT_DECODE_RATIO, 0) : -1, kv, collect_options(o, kv, keys, MAX_OPTIONS));
    for (int i = 0; i < n_prefill && st == CKV_STATUS_OK; i++) st = ckv_decode_press_check_prefill(dp, &prefill[i]);
    if (st != CKV_STATUS_OK) ckv_cli_usage_error(o->cmd_name, "--decode-press: %s", ckv_error_message());
    return 1;
}
