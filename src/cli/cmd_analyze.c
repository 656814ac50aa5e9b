/* cmd_analyze.c - `ckv analyze`: for one prompt and budget, the attention-output perturbation
 * ||o - o^||_1 of every (layer, query head) under two presses, with the CriticalKV paper's bounds
 * (docs/presses.md, "Perturbation analysis"). Prints a summary on stdout (rank 0) and writes one JSON
 * line per head with --out. It does not generate tokens or compress a cache for later use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/cli_agree.h"
#include "cli/cli_opts.h"
#include "cli/cli_press.h"
#include "comm/comm.h"
#include "core/json.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "engine/analyze.h"
#include "engine/compress.h"
#include "engine/request.h"
#include "evict/headkv.h"
#include "model/model.h"

static const ckv_cli_command analyze_cmd = {
    CKV_CMD_ANALYZE, "analyze", "-m DIR (--prompt-ids 1,2,3 | --prompt-ids-file F) --budget B [flags]",
    "Per (layer, query head): ||o - o^||_1 of the attention output of the first decode input under\n"
    "press A and press B, the bound theta (CriticalKV Theorem 3.3) and the attention-weight-only bound.\n"
    "Press options and the budget apply to both presses."};

typedef struct {
    const char *model, *prompt_ids, *prompt_file, *question, *out;
    const char *spec[CKV_ANALYZE_PRESSES];
    ckv_press_config press[CKV_ANALYZE_PRESSES];
} analyze_args;

static void parse_args(analyze_args *a, ckv_opts *o, int argc, char **argv) {
    ckv_opts_parse(o, &analyze_cmd, argc, argv);
    memset(a, 0, sizeof *a);
    a->model = ckv_opt_str(o, CKV_OPT_MODEL, NULL);
    a->prompt_ids = ckv_opt_str(o, CKV_OPT_PROMPT_IDS, NULL);
    a->prompt_file = ckv_opt_str(o, CKV_OPT_PROMPT_IDS_FILE, NULL);
    a->question = ckv_opt_str(o, CKV_OPT_QUESTION_IDS, NULL);
    a->out = ckv_opt_str(o, CKV_OPT_OUT, NULL);
    a->spec[0] = ckv_opt_str(o, CKV_OPT_PRESS_A, "snapkv");
    a->spec[1] = ckv_opt_str(o, CKV_OPT_PRESS_B, "critical:snapkv");
    if (!a->model) ckv_cli_usage_error("analyze", "--model is required");
    if (!a->prompt_ids == !a->prompt_file)
        ckv_cli_usage_error("analyze", "give exactly one of --prompt-ids and --prompt-ids-file");
    ckv_cli_budget b;
    ckv_cli_press_budget(o, &b);
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
        char flag[16];
        snprintf(flag, sizeof flag, "--press-%c", 'a' + p);
        ckv_cli_press_check_spec(o, flag, a->spec[p]);
        ckv_cli_check(ckv_press_parse(&a->press[p], a->spec[p]));
        if (a->press[p].scorer == CKV_SCORER_NONE)
            ckv_cli_usage_error("analyze", "--press-%c none: the analysis compares two presses that evict (the full "
                                "cache is the reference)", 'a' + p);
    }
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) ckv_cli_press_build(o, a->spec[p], &b, &a->press[p]);
    if (b.kind == CKV_CLI_BUDGET_NONE)
        ckv_cli_usage_error("analyze", "needs a budget: --budget B, --compression-ratio R or --budget-tokens N");
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) ckv_cli_check(ckv_press_finalize(&a->press[p]));
    char what[300];
    snprintf(what, sizeof what, "--press-a %s and --press-b %s", a->spec[0], a->spec[1]);
    ckv_cli_press_check_options(o, a->press, CKV_ANALYZE_PRESSES, what);
}

/* A headkv press's kept rows per (layer, KV head) from its profile. */
static int32_t *headkv_budgets(ckv_comm *world, const ckv_model *m, const ckv_press_config *pr, int L) {
    int32_t *b = NULL;
    ckv_cli_check_comm(world, ckv_compress_headkv_budgets(pr, &m->cfg, L, &b));
    return b;
}

static int32_t *read_prompt(const analyze_args *a, int *n) {
    if (!a->prompt_file) return ckv_cli_parse_ids(a->prompt_ids, n, "--prompt-ids");
    char *text = NULL;
    ckv_cli_check(ckv_read_file(a->prompt_file, &text, NULL));
    int32_t *ids = ckv_cli_parse_ids(text, n, a->prompt_file);
    free(text);
    return ids;
}

/* Also declared in cli.h with the other subcommands; repeated here so this file builds on its own. */

int ckv_cmd_analyze(int argc, char **argv) {
    analyze_args a;
    ckv_opts opts;
    parse_args(&a, &opts, argc, argv);
    int n_ctx = 0, n_q = 0;
    int32_t *ctx = read_prompt(&a, &n_ctx);
    int32_t *q = a.question ? ckv_cli_parse_ids(a.question, &n_q, "--question-ids") : NULL;
    if (!q) { /* the last context token is fed again as the first decode input */
        n_q = 1;
        q = malloc(sizeof *q);
        if (!q) ckv_cli_die("out of memory");
        q[0] = ctx[n_ctx - 1];
    }
    int n = n_ctx + n_q;
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    if (!ids) ckv_cli_die("out of memory");
    memcpy(ids, ctx, sizeof *ids * (size_t)n_ctx);
    memcpy(ids + n_ctx, q, sizeof *ids * (size_t)n_q);

    ckv_cli_agreement ag;
    ckv_cli_agree_init(&ag, &opts, a.model);
    ckv_cli_agree_add(&ag, CKV_AGREE_PROMPT, ids, sizeof *ids * (size_t)n);
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) ckv_cli_agree_add(&ag, CKV_AGREE_PRESS, a.press[p].spec, strlen(a.press[p].spec));
    ckv_comm *world = ckv_cli_world(&ag, &argc, &argv);
    FILE *out = NULL;
    if (a.out && world->rank == 0 && !(out = fopen(a.out, "w")))
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--out: cannot write '%s'", a.out));
    ckv_engine_config ec;
    ckv_cli_engine_config(&opts, world, &ec);
    /* on the cpu backend the analysis is of the f32 model unless told otherwise (every matrix dequantised
     * at load, the parity reference); a device backend keeps its default (bf16 on cuda), which the
     * measurement converts to fp32 */
    if (!ckv_opt_has(&opts, CKV_OPT_WEIGHTS_DTYPE) && !strcmp(ec.backend, "cpu")) ec.weights_dtype = CKV_WEIGHTS_DTYPE_F32;
    ckv_engine eng;
    ckv_cli_check_comm(world, ckv_engine_init(&eng, &ec, world));
    ckv_model *m = eng.model;
    const ckv_model_config *c = &m->cfg;
    if (n > c->max_context)
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_RANGE,
                               "context (%d) + question (%d) tokens exceed the context window of %d tokens "
                               "(max_position_embeddings) of %s", n_ctx, n_q, c->max_context, a.model));
    ckv_analyzer an;
    ckv_cli_check_comm(world, ckv_analyzer_init(&an, m, &a.press[0], &a.press[1], n_ctx, n_q, ec.threads));
    int32_t *budgets[CKV_ANALYZE_PRESSES] = {NULL};
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++)
        if (a.press[p].alloc == CKV_ALLOC_HEADKV) an.head_budgets[p] = budgets[p] = headkv_budgets(world, m, &a.press[p], n_ctx);
    /* one full-cache prefill of context + question with the analysis as the layer hook */
    ckv_prepare_params pp = {.ids = ids, .n = n, .hook = ckv_analyze_layer_hook, .hook_ctx = &an};
    ckv_prepared pc;
    ckv_cli_check_comm(world, ckv_engine_prepare(&eng, &pp, &pc));
    ckv_analyze_summary sum;
    ckv_cli_check_comm(world, ckv_analyze_summarize(&an, &sum));

    if (world->rank == 0) {
        if (out) {
            ckv_cli_check_comm(world, ckv_analyze_write_jsonl(&an, out, a.out));
            if (fclose(out) != 0) ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--out: error writing '%s'", a.out));
        }
        const char *bname[CKV_ANALYZE_PRESSES];
        for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) bname[p] = a.press[p].critical ? "theta" : "attention-only bound";
        printf("press A: %s\n", a.press[0].spec);
        printf("press B: %s\n", a.press[1].spec);
        printf("context %d tokens, question %d token%s; %d layers x %d query heads = %d heads\n", n_ctx, n_q,
               n_q == 1 ? "" : "s", c->n_layers, c->n_heads, sum.n_heads);
        printf("B perturbs less than A in %d of %d heads (%.1f%%); equal in %d\n", sum.n_b_less, sum.n_heads,
               100.0 * sum.n_b_less / (sum.n_heads ? sum.n_heads : 1), sum.n_equal);
        printf("mean ||o - o^||_1: A %.6g, B %.6g", sum.mean_perturbation[0], sum.mean_perturbation[1]);
        if (sum.mean_perturbation[0] > 0) printf(" (B/A %.4g)", sum.mean_perturbation[1] / sum.mean_perturbation[0]);
        printf("\n");
        printf("mean bound ratio (bound / perturbation):");
        for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
            if (sum.n_ratio[p]) printf(" %c %.4g (%s, %d heads)", 'A' + p, sum.mean_bound_ratio[p], bname[p], sum.n_ratio[p]);
            else printf(" %c n/a (%s, no head perturbed)", 'A' + p, bname[p]);
            printf(p + 1 < CKV_ANALYZE_PRESSES ? ";" : "\n");
        }
        if (sum.n_theta_ratio) printf("mean theta B / theta A: %.4g (%d heads)\n", sum.mean_theta_ratio, sum.n_theta_ratio);
        else printf("mean theta B / theta A: n/a (theta A is 0 in every head)\n");
        fflush(stdout);
        if (sum.n_bound_violations)
            ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_INTERNAL, "%d (head, press) pairs break perturbation <= theta <= "
                                   "attention-only bound beyond rounding (see --out)", sum.n_bound_violations));
        printf("bounds: perturbation <= theta <= attention-only bound in every head (max perturbation / theta %.4g)\n",
               sum.max_pert_over_theta);
        fflush(stdout);
        fprintf(stderr, "ckv: analyzed %d tokens in %.3f s (selection %.3f s, measurement %.3f s)\n", n,
                pc.sess.prefill_seconds, an.select_seconds, an.measure_seconds);
    }
    ckv_prepared_free(&pc);
    ckv_analyzer_free(&an);
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) free(budgets[p]);
    ckv_engine_free(&eng);
    ckv_comm_free(world);
    free(ctx);
    free(q);
    free(ids);
    return 0;
}
