#define _POSIX_C_SOURCE 200809L
/* cmd_fidelity.c - `ckv fidelity`: teacher-forced fidelity of compressed caches on long natural text:
 * for each press x budget, KL divergence from the full cache's next-token distributions, top-1
 * agreement and the log-likelihood of the true continuation (eval/fidelity.h). Prints a table and
 * optionally writes JSON lines. One process. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/cli_agree.h"
#include "cli/cli_opts.h"
#include "cli/cli_press.h"
#include "comm/comm.h"
#include "engine/request.h"
#include "core/json.h"
#include "core/threadpool.h"
#include "engine/text.h"
#include "eval/fidelity.h"
#include "model/model.h"

/* Presses, budgets, and press x budget combinations one run takes (a sweep may name a press several
 * times: each is evicted again from the same prefill). */
#define FIDELITY_MAX_LIST 256

static const ckv_cli_command fidelity_cmd = {
    CKV_CMD_FIDELITY, "fidelity", "-m PATH --text-file F --press P1[,P2...] --budget B1[,B2...] [flags]",
    "Teacher-forced comparison with the full cache: the first --context tokens of the text are the\n"
    "(compressed) context, the next --continuation tokens are fed and their next-token distributions\n"
    "compared with the full cache's (KL divergence, top-1 agreement, NLL of the true next token)."};

/* One --out line (JSON through cJSON). */
static void write_line(FILE *out, const char *press, double budget, const char *spec, int n_ctx, int n_cont,
                       const ckv_fidelity *r) {
    cJSON *o = cJSON_CreateObject();
    if (!o) ckv_cli_die("out of memory");
    cJSON_AddStringToObject(o, "press", press);
    cJSON_AddNumberToObject(o, "budget", budget);
    cJSON_AddStringToObject(o, "spec", spec);
    cJSON_AddNumberToObject(o, "context", n_ctx);
    cJSON_AddNumberToObject(o, "continuation", n_cont);
    cJSON_AddNumberToObject(o, "kl", r->kl);
    cJSON_AddNumberToObject(o, "top1", r->top1);
    cJSON_AddNumberToObject(o, "nll_full", r->nll_full);
    cJSON_AddNumberToObject(o, "nll_press", r->nll_press);
    cJSON_AddNumberToObject(o, "kv_kept_frac", r->kv_kept_frac);
    cJSON_AddNumberToObject(o, "prefill_s", r->prefill_s);
    cJSON_AddNumberToObject(o, "evict_s", r->evict_s);
    cJSON_AddNumberToObject(o, "score_s", r->score_s);
    cJSON_AddNumberToObject(o, "select_s", r->select_s);
    char *line = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!line) ckv_cli_die("out of memory");
    fprintf(out, "%s\n", line);
    cJSON_free(line);
}

typedef struct {
    FILE *out;
    char **presses, **budgets;
    int nb;
    ckv_press_config *cfgs; /* [presses][nb] */
    int n_ctx, n_cont;
} fidelity_printer;

/* One table row (and --out line) for press x budget k = i * nb + j. */
static void print_result(void *ctx, int k, const ckv_fidelity *r) {
    const fidelity_printer *p = ctx;
    int i = k / p->nb, j = k % p->nb;
    printf("%-28s %7s %10.4f %7.3f %9.4f %9.4f\n", p->presses[i], p->budgets[j], r->kl, r->top1, r->nll_full, r->nll_press);
    fflush(stdout);
    if (p->out) write_line(p->out, p->presses[i], strtod(p->budgets[j], NULL), p->cfgs[(size_t)i * p->nb + j].spec, p->n_ctx, p->n_cont, r);
}

/* The comma-separated items of s, in place; dies naming flag when there are more than
 * FIDELITY_MAX_LIST. */
static int split_list(const char *flag, char *s, char **items) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok; tok = strtok(NULL, ",")) {
        if (n == FIDELITY_MAX_LIST) ckv_cli_die("%s: more than %d items", flag, FIDELITY_MAX_LIST);
        items[n++] = tok;
    }
    return n;
}

int ckv_cmd_fidelity(int argc, char **argv) {
    ckv_opts opts;
    ckv_opts_parse(&opts, &fidelity_cmd, argc, argv);
    const char *model = ckv_opt_str(&opts, CKV_OPT_MODEL, NULL), *text_file = ckv_opt_str(&opts, CKV_OPT_TEXT_FILE, NULL);
    const char *out_path = ckv_opt_str(&opts, CKV_OPT_OUT, NULL);
    char *press_list = ckv_opt_has(&opts, CKV_OPT_PRESS) ? strdup(ckv_opt_str(&opts, CKV_OPT_PRESS, "")) : NULL;
    char *budget_list = ckv_opt_has(&opts, CKV_OPT_BUDGET) ? strdup(ckv_opt_str(&opts, CKV_OPT_BUDGET, "")) : NULL;
    int n_ctx = (int)ckv_opt_long(&opts, CKV_OPT_CONTEXT, 2048), n_cont = (int)ckv_opt_long(&opts, CKV_OPT_CONTINUATION, 256);
    if (!model || !text_file || !press_list || !budget_list)
        ckv_cli_usage_error("fidelity", "--model, --text-file, --press and --budget are required");
    char *presses[FIDELITY_MAX_LIST], *budgets[FIDELITY_MAX_LIST];
    int np = split_list("--press", press_list, presses), nb = split_list("--budget", budget_list, budgets);
    if (np == 0 || nb == 0) ckv_cli_usage_error("fidelity", "empty --press or --budget list");
    if (np * nb > FIDELITY_MAX_LIST)
        ckv_cli_die("--press x --budget: %d x %d combinations, more than %d", np, nb, FIDELITY_MAX_LIST);
    ckv_press_config *cfgs = calloc((size_t)np * nb, sizeof *cfgs);          /* [np][nb] */
    const ckv_press_config **flat = calloc((size_t)np * nb, sizeof *flat); /* [np * nb] */
    ckv_fidelity *res = calloc((size_t)np * nb, sizeof *res);               /* [np * nb] */
    if (!cfgs || !flat || !res) ckv_cli_die("out of memory for %d press configurations", np * nb);
    for (int i = 0; i < np; i++)
        for (int j = 0; j < nb; j++) { /* validate every combination before any work */
            ckv_cli_budget bud = {CKV_CLI_BUDGET_FRACTION, ckv_cli_parse_double("--budget", budgets[j], -1e300, 1e300)};
            if (!strcmp(presses[i], "none")) ckv_cli_die("--press: 'none' is the reference, list presses only");
            ckv_press_config *c = &cfgs[(size_t)i * nb + j];
            ckv_cli_press_build(&opts, presses[i], &bud, c);
            ckv_cli_check(ckv_press_finalize(c));
            ckv_cli_check(ckv_press_check_context(c, n_ctx));
        }
    {
        ckv_press_config *first = calloc((size_t)np, sizeof *first); /* [np]: every press at the first budget */
        if (!first) ckv_cli_die("out of memory for %d press configurations", np);
        for (int i = 0; i < np; i++) first[i] = cfgs[(size_t)i * nb];
        char what[300];
        snprintf(what, sizeof what, "--press %.280s", ckv_opt_str(&opts, CKV_OPT_PRESS, ""));
        ckv_cli_press_check_options(&opts, first, np, what);
        free(first);
    }
    ckv_tokenizer *tok = NULL;
    ckv_cli_check(ckv_text_open_tokenizer(&tok, model));
    char *text = NULL;
    ckv_cli_check(ckv_read_file(text_file, &text, NULL));
    int32_t *ids = NULL, *none = NULL;
    int n_ids = 0, n_none = 0;
    ckv_cli_check(ckv_text_encode_split(tok, text, NULL, 0, NULL, NULL, &ids, &n_ids, &none, &n_none));
    free(text);
    free(none);
    if (n_ids < n_ctx + n_cont)
        ckv_cli_die("%s: %d tokens, fewer than --context %d + --continuation %d", text_file, n_ids, n_ctx, n_cont);
    ckv_cli_agreement ag; /* one process; under mpirun every rank must run the same */
    ckv_cli_agree_init(&ag, &opts, model);
    if (ckv_comm_launched_by_mpi()) ckv_comm_free(ckv_cli_world(&ag, &argc, &argv));
    ckv_engine_config ec;
    ckv_cli_engine_config(&opts, NULL, &ec);
    ckv_engine eng;
    ckv_cli_check(ckv_engine_init(&eng, &ec, NULL));
    ckv_model *m = eng.model;
    int chunk = ec.chunk;
    if (n_ctx + n_cont > m->cfg.max_context)
        ckv_cli_die("--context %d + --continuation %d exceed the model's context window of %d tokens", n_ctx, n_cont,
                    m->cfg.max_context);
    FILE *out = NULL;
    if (out_path && !(out = fopen(out_path, "w"))) ckv_cli_die("--out: cannot write '%s'", out_path);
    printf("context %d tokens, continuation %d tokens of %s\n", n_ctx, n_cont, text_file);
    printf("%-28s %7s %10s %7s %9s %9s\n", "press", "budget", "KL (nats)", "top-1", "NLL full", "NLL press");
    fidelity_printer pr = {out, presses, budgets, nb, cfgs, n_ctx, n_cont};
    if (ckv_opt_has(&opts, CKV_OPT_SEPARATE_PREFILL)) { /* a prefill per press x budget */
        float *ref = NULL;
        ckv_cli_check(ckv_fidelity_reference(m, ids, n_ctx, n_cont, chunk, &ref));
        for (int i = 0; i < np; i++)
            for (int j = 0; j < nb; j++) {
                ckv_fidelity r;
                ckv_cli_check(ckv_fidelity_measure(m, &cfgs[(size_t)i * nb + j], ids, n_ctx, n_cont, chunk, ref, &r));
                print_result(&pr, i * nb + j, &r);
            }
        free(ref);
    } else { /* one prefill of the context serves them all */
        for (int k = 0; k < np * nb; k++) flat[k] = &cfgs[k];
        ckv_cli_check(ckv_fidelity_sweep(m, flat, np * nb, ids, n_ctx, n_cont, chunk, res, print_result, &pr));
    }
    if (out && fclose(out) != 0) ckv_cli_die("--out: error writing '%s'", out_path);
    free(ids);
    ckv_engine_free(&eng);
    ckv_tokenizer_free(tok);
    free(press_list);
    free(budget_list);
    free(cfgs);
    free(flat);
    free(res);
    return 0;
}
