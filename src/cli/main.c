/* main.c - the `ckv` command: dispatches to a subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static void print_usage(FILE *f) {
    fprintf(f,
            "ckv %s - long-context LLM inference with KV-cache eviction\n"
            "\n"
            "usage: ckv <command> [flags]\n"
            "\n"
            "commands:\n"
            "  generate   run a prompt through a model and generate tokens\n"
            "  inspect    print a model's configuration, size and memory needs\n"
            "  tokenize   turn text into token ids (or ids into text with --decode)\n"
            "  analyze    per-head attention-output perturbation of two presses (CriticalKV analysis)\n"
            "  eval       score presses x budgets on RULER-style tasks or a JSONL dataset (resumable)\n"
            "  fidelity   KL divergence and top-1 agreement of compressed vs full cache on long text\n"
            "  serve      an OpenAI-compatible HTTP server with per-request eviction and context reuse\n"
            "  profile-heads  score every head's retrieval-and-copy ability: the profile of the headkv presses\n"
            "\n"
            "'ckv <command> --help' lists a command's flags.\n",
            CKV_VERSION);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "ckv: error: no command given (usage: ckv <generate|inspect|tokenize|analyze|eval|fidelity> [flags]; see 'ckv --help')\n");
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "--help") || !strcmp(cmd, "-h") || !strcmp(cmd, "help")) {
        print_usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version")) {
        printf("ckv %s\n", CKV_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "generate")) return ckv_cmd_generate(argc - 1, argv + 1);
    if (!strcmp(cmd, "inspect")) return ckv_cmd_inspect(argc - 1, argv + 1);
    if (!strcmp(cmd, "tokenize")) return ckv_cmd_tokenize(argc - 1, argv + 1);
    if (!strcmp(cmd, "analyze")) return ckv_cmd_analyze(argc - 1, argv + 1);
    if (!strcmp(cmd, "eval")) return ckv_cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "fidelity")) return ckv_cmd_fidelity(argc - 1, argv + 1);
    if (!strcmp(cmd, "serve")) return ckv_cmd_serve(argc - 1, argv + 1);
    if (!strcmp(cmd, "profile-heads")) return ckv_cmd_profile_heads(argc - 1, argv + 1);
    fprintf(stderr, "ckv: error: unknown command '%s' (expected generate, inspect, tokenize, analyze, eval or fidelity; see 'ckv --help')\n", cmd);
    return 2;
}
