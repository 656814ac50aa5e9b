/* cli_press.h - the press flags of every command (see cli_press.c): spec checks, the one budget flag,
 * press options in command-line order, and the check that some press takes each option given. */
#ifndef CKV_CLI_PRESS_H
#define CKV_CLI_PRESS_H

#include "cli/cli_opts.h"
#include "engine/decode_press.h"
#include "evict/press.h"

typedef enum { CKV_CLI_BUDGET_NONE, CKV_CLI_BUDGET_FRACTION, CKV_CLI_BUDGET_RATIO, CKV_CLI_BUDGET_TOKENS } ckv_cli_budget_kind;

typedef struct {
    ckv_cli_budget_kind kind;
    double value;
} ckv_cli_budget;

/* The one budget flag of --budget B, --compression-ratio R and --budget-tokens N (two: usage error
 * naming both). */
void ckv_cli_press_budget(const ckv_opts *o, ckv_cli_budget *b);

/* Refuses specs with options written into them ("snapkv:window=4"), naming `flag`. */
void ckv_cli_press_check_spec(const ckv_opts *o, const char *flag, const char *spec);

/* Builds `spec` with every press option flag in order and the budget (NULL: none) through the library's
 * builder (finalised; callers that change query_aware finalise again); options no press of the
 * command takes are left to ckv_cli_press_check_options. A bad spec, option or budget is a usage error. */
void ckv_cli_press_build(const ckv_opts *o, const char *spec, const ckv_cli_budget *budget, ckv_press_config *c);
/* The same for commands that only plan memory (inspect): options naming input files may be missing. */
void ckv_cli_press_plan(const ckv_opts *o, const char *spec, const ckv_cli_budget *budget, ckv_press_config *c);

/* After finalising: every press option flag given must be taken by at least one of cfgs[n]
 * (`what` names them in the error, e.g. "--press knorm"). */
void ckv_cli_press_check_options(const ckv_opts *o, const ckv_press_config *cfgs, int n, const char *what);

/* The one press of a command (--press, its options, the budget, --query-aware), finalised and checked:
 * a press without a budget or an option no press takes is a usage error of command `cmd`. */
void ckv_cli_press_single(const ckv_opts *o, const char *cmd, ckv_press_config *c);

/* The decode-time press of --decode-press with --decode-interval, --decode-target or --decode-ratio and
 * the press option flags (applied as to --press), checked against each of the prefill presses
 * prefill[n_prefill]; returns 0 (dp untouched) without --decode-press. Decode flags without it, or a
 * bad value, are usage errors. (Whether some press takes each option is the caller's check.) */
int ckv_cli_decode_press(const ckv_opts *o, const ckv_press_config *prefill, int n_prefill, ckv_decode_press *dp);

#endif
