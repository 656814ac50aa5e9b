/* cmd_inspect.c - `ckv inspect`: a model's configuration, parameter count, checkpoint dtype and the
 * memory one rank needs for a given tensor-parallel degree and context length. Reads only the
 * config files; no weights are loaded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/alloc.h"
#include "model/config.h"
#include "model/model.h"
#include "shard/shard.h"

static void inspect_usage(FILE *f) {
    fprintf(f,
            "usage: ckv inspect --model DIR [--tp N] [--context L]\n"
            "\n"
            "  --model DIR     Hugging Face model directory\n"
            "  --tp N          tensor-parallel ranks to plan for (default 1)\n"
            "  --context L     tokens to hold in the KV cache (default: max_position_embeddings)\n");
}

static const char *rope_name(ckv_rope_type t) {
    switch (t) {
    case CKV_ROPE_TYPE_LINEAR: return "linear";
    case CKV_ROPE_TYPE_LLAMA3: return "llama3";
    case CKV_ROPE_TYPE_YARN: return "yarn";
    default: return "default";
    }
}

int ckv_cmd_inspect(int argc, char **argv) {
    const char *model = NULL;
    int tp = 1;
    long context = -1;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            inspect_usage(stdout);
            return 0;
        } else if (!strcmp(f, "--model")) {
            model = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--tp")) {
            tp = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 4096);
        } else if (!strcmp(f, "--context")) {
            context = ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1L << 30);
        } else {
            ckv_cli_usage_error("inspect", "unknown flag '%s'", f);
        }
    }
    if (!model) ckv_cli_usage_error("inspect", "--model is required");
    ckv_model_config c;
    ckv_cli_check(ckv_config_load(&c, model));
    if (context < 0) context = c.max_position_embeddings;
    ckv_shard_plan p;
    ckv_cli_check(ckv_shard_plan_init(&p, tp, 0, c.n_heads, c.n_kv_heads, c.head_dim, c.intermediate_size, c.vocab_size));
    char b1[32], b2[32], b3[32], b4[32];
    printf("model            %s\n", model);
    printf("architecture     %s\n", c.arch_name);
    printf("layers           %d\n", c.n_layers);
    printf("hidden size      %d\n", c.hidden_size);
    printf("MLP size         %d\n", c.intermediate_size);
    printf("heads            %d query, %d KV (group %d), head_dim %d\n", c.n_heads, c.n_kv_heads,
           c.n_heads / c.n_kv_heads, c.head_dim);
    printf("vocabulary       %d%s\n", c.vocab_size, c.tie_word_embeddings ? " (tied embeddings)" : "");
    printf("context          %d max positions; rope %s, theta %g, factor %g\n", c.max_position_embeddings,
           rope_name(c.rope.type), c.rope.theta, c.rope.factor);
    printf("attention bias   %s\n", c.attention_bias ? "yes" : "no");
    printf("checkpoint dtype %s (computed in F32 on the CPU)\n", ckv_dtype_name(c.dtype));
    printf("parameters       %lld (%.3f B)\n", ckv_config_param_count(&c), (double)ckv_config_param_count(&c) / 1e9);
    printf("eos ids         ");
    for (int i = 0; i < c.n_eos; i++) printf(" %d", c.eos_ids[i]);
    printf("\n");
    size_t wbytes = ckv_model_weight_bytes(&c, &p);
    size_t kv_tok = (size_t)c.n_layers * (size_t)p.n_kv_local * (size_t)c.head_dim * 2 * sizeof(float);
    size_t kv = kv_tok * (size_t)context;
    size_t hidden = (size_t)context * (size_t)c.hidden_size * sizeof(float);
    printf("per rank (tp %d): %d query heads, %d KV heads, MLP rows %d, vocab rows %d\n", tp, p.n_q_local,
           p.n_kv_local, p.n_ff_local, p.n_vocab_local);
    printf("  weights        %s (F32)\n", ckv_format_bytes((double)wbytes, b1, sizeof b1));
    printf("  KV cache       %s at %ld tokens, full cache (%s per token, F32)\n",
           ckv_format_bytes((double)kv, b2, sizeof b2), context, ckv_format_bytes((double)kv_tok, b3, sizeof b3));
    printf("  total          %s (+ prefill hidden states %s)\n",
           ckv_format_bytes((double)(wbytes + kv), b4, sizeof b4), ckv_format_bytes((double)hidden, b1, sizeof b1));
    return 0;
}
