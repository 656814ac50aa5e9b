/* cmd_analyze.c - `ckv analyze`: for one prompt and budget, the attention-output perturbation
 * ||o - o^||_1 of every (layer, query head) under two presses, with the CriticalKV paper's bounds
 * (docs/presses.md, "Perturbation analysis"). Prints a summary on stdout (rank 0) and writes one JSON
 * line per head with --out. It does not generate tokens or compress a cache for later use. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "comm/comm.h"
#include "core/json.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "engine/analyze.h"
#include "engine/compress.h"
#include "engine/request.h"
#include "evict/headkv.h"
#include "model/model.h"

static void analyze_usage(FILE *f) {
    fprintf(f,
            "usage: ckv analyze --model DIR (--prompt-ids 1,2,3 | --prompt-ids-file F) --budget B [flags]\n"
            "\n"
            "Per (layer, query head): ||o - o^||_1 of the attention output of the first decode input under\n"
            "press A and press B, the bound theta (CriticalKV Theorem 3.3) and the attention-weight-only bound.\n"
            "\n"
            "  --model DIR            Hugging Face model directory (config.json + *.safetensors)\n"
            "  --prompt-ids LIST      the context token ids, comma separated\n"
            "  --prompt-ids-file F    file with the context token ids (commas, spaces or newlines)\n"
            "  --question-ids LIST    tokens fed after the context (never evicted); the query analysed is the\n"
            "                         last one's (default: the last context token, fed again)\n"
            "  --press-a SPEC         first press (default snapkv)\n"
            "  --press-b SPEC         second press (default critical:snapkv)\n"
            "  --budget B             kept fraction in (0, 1] (compression ratio 1 - B), both presses\n"
            "  --compression-ratio R  fraction removed in [0, 1)\n"
            "  --budget-tokens N      keep N tokens per head\n"
            "  --window N --kernel K --pool avg|max --alpha A --eps E --safeguard S --profile F\n"
            "  --press-opt KEY=VALUE  any press option (repeatable); options apply to both presses\n"
            "  --out F                write one JSON line per (layer, query head) to F\n"
            "  --chunk N              prefill chunk length in tokens (default 512)\n"
            "  --threads N            CPU threads (default: all cores)\n");
}

typedef struct {
    const char *model, *prompt_ids, *prompt_file, *question, *out;
    const char *spec[CKV_ANALYZE_PRESSES];
    int chunk, threads, has_budget;
    ckv_press_config press[CKV_ANALYZE_PRESSES];
} analyze_args;

static int is_press_flag(const char *f) {
    static const char *const flags[] = {"--press-a", "--press-b", "--window", "--kernel", "--pool", "--alpha",
                                        "--eps", "--safeguard", "--profile", "--press-opt", "--budget",
                                        "--compression-ratio", "--budget-tokens"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(f, flags[i])) return 1;
    return 0;
}

/* Parses both presses, then applies every option and the budget to both, in command-line order. */
static void parse_presses(analyze_args *a, int argc, char **argv) {
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
        ckv_cli_check(ckv_press_parse(&a->press[p], a->spec[p]));
        if (a->press[p].scorer == CKV_SCORER_NONE)
            ckv_cli_usage_error("analyze", "--press-%c none: the analysis compares two presses that evict (the full "
                                "cache is the reference)", 'a' + p);
    }
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        static const char *const opts[][2] = {{"--window", "window"}, {"--kernel", "kernel"}, {"--pool", "pool"},
                                              {"--alpha", "alpha"},   {"--eps", "eps"},       {"--safeguard", "safeguard"},
                                              {"--profile", "profile"}};
        int done = 0;
        for (size_t j = 0; j < sizeof opts / sizeof opts[0] && !done; j++)
            if (!strcmp(f, opts[j][0])) {
                const char *v = ckv_cli_value(argc, argv, &i);
                for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) ckv_cli_check(ckv_press_set_option(&a->press[p], opts[j][1], v));
                done = 1;
            }
        if (done) continue;
        if (!strcmp(f, "--press-opt")) {
            const char *kv = ckv_cli_value(argc, argv, &i);
            const char *eq = strchr(kv, '=');
            if (!eq || eq == kv) ckv_cli_die("--press-opt: expected KEY=VALUE, got '%s'", kv);
            char key[64];
            snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
            for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) ckv_cli_check(ckv_press_set_option(&a->press[p], key, eq + 1));
        } else if (!strcmp(f, "--budget")) {
            double b = ckv_cli_parse_double(f, ckv_cli_value(argc, argv, &i), -1e300, 1e300);
            for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) ckv_cli_check(ckv_press_set_budget(&a->press[p], b));
            a->has_budget = 1;
        } else if (!strcmp(f, "--compression-ratio")) {
            double cr = ckv_cli_parse_double(f, ckv_cli_value(argc, argv, &i), -1e300, 1e300);
            for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) ckv_cli_check(ckv_press_set_compression_ratio(&a->press[p], cr));
            a->has_budget = 1;
        } else if (!strcmp(f, "--budget-tokens")) {
            int n = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), -(1L << 30), 1L << 30);
            for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) ckv_cli_check(ckv_press_set_budget_tokens(&a->press[p], n));
            a->has_budget = 1;
        } else if (!strcmp(f, "--press-a") || !strcmp(f, "--press-b")) {
            ckv_cli_value(argc, argv, &i);
        }
    }
    if (!a->has_budget)
        ckv_cli_usage_error("analyze", "needs a budget: --budget B, --compression-ratio R or --budget-tokens N");
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) ckv_cli_check(ckv_press_finalize(&a->press[p]));
}

static void parse_args(analyze_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->chunk = 512;
    a->spec[0] = "snapkv";
    a->spec[1] = "critical:snapkv";
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            analyze_usage(stdout);
            exit(0);
        } else if (!strcmp(f, "--model")) {
            a->model = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--prompt-ids")) {
            a->prompt_ids = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--prompt-ids-file")) {
            a->prompt_file = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--question-ids")) {
            if (a->question) ckv_cli_usage_error("analyze", "--question-ids given twice (the analysis takes one question)");
            a->question = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--out")) {
            a->out = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--chunk")) {
            a->chunk = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 24);
        } else if (!strcmp(f, "--threads")) {
            a->threads = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 4096);
        } else if (is_press_flag(f)) {
            const char *v = ckv_cli_value(argc, argv, &i);
            if (!strcmp(f, "--press-a")) a->spec[0] = v;
            if (!strcmp(f, "--press-b")) a->spec[1] = v;
        } else {
            ckv_cli_usage_error("analyze", "unknown flag '%s'", f);
        }
    }
    if (!a->model) ckv_cli_usage_error("analyze", "--model is required");
    if (!a->prompt_ids == !a->prompt_file)
        ckv_cli_usage_error("analyze", "give exactly one of --prompt-ids and --prompt-ids-file");
    parse_presses(a, argc, argv);
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
    parse_args(&a, argc, argv);
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

    ckv_comm *world = NULL;
    ckv_cli_check(ckv_comm_init_world(&world, &argc, &argv));
    ckv_log_set_rank(world->rank, world->size);
    int threads = a.threads ? a.threads : ckv_cpu_count();
    if (world->size > 1 && !a.threads) threads = ckv_cpu_count() / world->size > 0 ? ckv_cpu_count() / world->size : 1;
    FILE *out = NULL;
    if (a.out && world->rank == 0 && !(out = fopen(a.out, "w")))
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--out: cannot write '%s'", a.out));
    ckv_engine_config ec = {.model_path = a.model, .backend = "cpu", .threads = threads, .device = -1, .chunk = a.chunk};
    ckv_engine eng;
    ckv_cli_check_comm(world, ckv_engine_init(&eng, &ec, world));
    ckv_model *m = eng.model;
    const ckv_model_config *c = &m->cfg;
    if (n > c->max_context)
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_RANGE,
                               "context (%d) + question (%d) tokens exceed the context window of %d tokens "
                               "(max_position_embeddings) of %s", n_ctx, n_q, c->max_context, a.model));
    ckv_analyzer an;
    ckv_cli_check_comm(world, ckv_analyzer_init(&an, m, &a.press[0], &a.press[1], n_ctx, n_q));
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
