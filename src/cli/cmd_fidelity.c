#define _POSIX_C_SOURCE 200809L
/* cmd_fidelity.c - `ckv fidelity`: teacher-forced fidelity of compressed caches on long natural text:
 * for each press x budget, KL divergence from the full cache's next-token distributions, top-1
 * agreement and the log-likelihood of the true continuation (eval/fidelity.h). Prints a table and
 * optionally writes JSON lines. One process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "core/json.h"
#include "core/threadpool.h"
#include "engine/text.h"
#include "eval/fidelity.h"
#include "model/model.h"

static void fidelity_usage(FILE *f) {
    fprintf(f,
            "usage: ckv fidelity --model PATH --text-file F --press P1[,P2...] --budget B1[,B2...] [flags]\n"
            "\n"
            "Teacher-forced comparison with the full cache: the first --context tokens of the text are the\n"
            "(compressed) context, the next --continuation tokens are fed and their next-token distributions\n"
            "compared with the full cache's (KL divergence, top-1 agreement, NLL of the true next token).\n"
            "\n"
            "  --model PATH         model directory or GGUF file (with a tokenizer)\n"
            "  --text-file F        long natural text\n"
            "  --context L          context tokens (default 2048)\n"
            "  --continuation T     continuation tokens (default 256)\n"
            "  --press LIST         comma-separated press specs (see ckv generate --help)\n"
            "  --budget LIST        comma-separated kept fractions in (0, 1]\n"
            "  --chunk N --threads N\n"
            "  --out F              JSON lines, one per press x budget\n");
}

static int split_list(char *s, char **items, int cap) {
    int n = 0;
    for (char *tok = strtok(s, ","); tok && n < cap; tok = strtok(NULL, ",")) items[n++] = tok;
    return n;
}

int ckv_cmd_fidelity(int argc, char **argv) {
    const char *model = NULL, *text_file = NULL, *out_path = NULL;
    char *press_list = NULL, *budget_list = NULL;
    int n_ctx = 2048, n_cont = 256, chunk = 512, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            fidelity_usage(stdout);
            return 0;
        } else if (!strcmp(f, "--model")) {
            model = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--text-file")) {
            text_file = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--out")) {
            out_path = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--press")) {
            press_list = strdup(ckv_cli_value(argc, argv, &i));
        } else if (!strcmp(f, "--budget")) {
            budget_list = strdup(ckv_cli_value(argc, argv, &i));
        } else if (!strcmp(f, "--context")) {
            n_ctx = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 2, 1 << 24);
        } else if (!strcmp(f, "--continuation")) {
            n_cont = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 2, 1 << 20);
        } else if (!strcmp(f, "--chunk")) {
            chunk = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 24);
        } else if (!strcmp(f, "--threads")) {
            threads = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 4096);
        } else {
            ckv_cli_usage_error("fidelity", "unknown flag '%s'", f);
        }
    }
    if (!model || !text_file || !press_list || !budget_list)
        ckv_cli_usage_error("fidelity", "--model, --text-file, --press and --budget are required");
    char *presses[32], *budgets[32];
    int np = split_list(press_list, presses, 32), nb = split_list(budget_list, budgets, 32);
    if (np == 0 || nb == 0) ckv_cli_usage_error("fidelity", "empty --press or --budget list");
    ckv_press_config cfgs[32][32];
    for (int i = 0; i < np; i++)
        for (int j = 0; j < nb; j++) { /* validate every combination before any work */
            ckv_cli_check(ckv_press_parse(&cfgs[i][j], presses[i]));
            if (cfgs[i][j].scorer == CKV_SCORER_NONE) ckv_cli_die("--press: 'none' is the reference, list presses only");
            ckv_cli_check(ckv_press_set_budget(&cfgs[i][j], ckv_cli_parse_double("--budget", budgets[j], -1e300, 1e300)));
            ckv_cli_check(ckv_press_finalize(&cfgs[i][j]));
            ckv_cli_check(ckv_press_check_context(&cfgs[i][j], n_ctx));
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
    ckv_backend *be = NULL;
    ckv_cli_check(ckv_backend_init(&be, "cpu", threads ? threads : ckv_cpu_count()));
    ckv_model *m = NULL;
    ckv_cli_check(ckv_model_load(&m, model, be, NULL));
    if (n_ctx + n_cont > m->cfg.max_context)
        ckv_cli_die("--context %d + --continuation %d exceed the model's context window of %d tokens", n_ctx, n_cont,
                    m->cfg.max_context);
    FILE *out = NULL;
    if (out_path && !(out = fopen(out_path, "w"))) ckv_cli_die("--out: cannot write '%s'", out_path);
    float *ref = NULL;
    ckv_cli_check(ckv_fidelity_reference(m, ids, n_ctx, n_cont, chunk, &ref));
    printf("context %d tokens, continuation %d tokens of %s\n", n_ctx, n_cont, text_file);
    printf("%-28s %7s %10s %7s %9s %9s\n", "press", "budget", "KL (nats)", "top-1", "NLL full", "NLL press");
    for (int i = 0; i < np; i++)
        for (int j = 0; j < nb; j++) {
            ckv_fidelity r;
            ckv_cli_check(ckv_fidelity_measure(m, &cfgs[i][j], ids, n_ctx, n_cont, chunk, ref, &r));
            printf("%-28s %7s %10.4f %7.3f %9.4f %9.4f\n", presses[i], budgets[j], r.kl, r.top1, r.nll_full, r.nll_press);
            fflush(stdout);
            if (out)
                fprintf(out,
                        "{\"press\": \"%s\", \"budget\": %s, \"spec\": \"%s\", \"context\": %d, \"continuation\": %d, "
                        "\"kl\": %.6g, \"top1\": %.6g, \"nll_full\": %.6g, \"nll_press\": %.6g, \"kv_kept_frac\": %.6g}\n",
                        presses[i], budgets[j], cfgs[i][j].spec, n_ctx, n_cont, r.kl, r.top1, r.nll_full, r.nll_press,
                        r.kv_kept_frac);
        }
    if (out && fclose(out) != 0) ckv_cli_die("--out: error writing '%s'", out_path);
    free(ref);
    free(ids);
    ckv_model_free(m);
    ckv_backend_free(be);
    ckv_tokenizer_free(tok);
    free(press_list);
    free(budget_list);
    return 0;
}
