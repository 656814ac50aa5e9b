/* cmd_inspect.c - `ckv inspect`: a model's configuration, parameter count, checkpoint dtype and the
 * memory one rank needs for a tensor-parallel degree, a context length and a press budget
 * (weights, KV cache full and compressed, the peak of layer-major prefill, activations). Reads
 * only the configuration (config.json, or a GGUF file's metadata); no weights are loaded. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_agree.h"
#include "cli/cli_opts.h"
#include "cli/cli_press.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "engine/sweep.h"
#include "evict/press.h"
#include "model/config.h"
#include "model/model.h"
#include "model/plan.h"
#include "model/source.h"
#include "shard/shard.h"

static const ckv_cli_command inspect_cmd = {
    CKV_CMD_INSPECT, "inspect",
    "-m PATH [--tp N] [-c L] [--new-tokens N] [--chunk N] [--press SPEC --budget B] [--backend cuda [--gpu-mem-limit B]]",
    "Prints a model's configuration and the memory one rank needs (only config.json, or a GGUF file's\n"
    "metadata, is read)."};

static const char *rope_name(ckv_rope_type t) {
    switch (t) {
    case CKV_ROPE_TYPE_LINEAR: return "linear";
    case CKV_ROPE_TYPE_LLAMA3: return "llama3";
    case CKV_ROPE_TYPE_YARN: return "yarn";
    default: return "default";
    }
}

static const char *fmt(double bytes, char *buf, size_t cap) { return ckv_format_bytes(bytes, buf, cap); }

int ckv_cmd_inspect(int argc, char **argv) {
    ckv_opts opts;
    ckv_opts_parse(&opts, &inspect_cmd, argc, argv);
    const char *model = ckv_opt_str(&opts, CKV_OPT_MODEL, NULL), *press_spec = ckv_opt_str(&opts, CKV_OPT_PRESS, "none");
    int tp = (int)ckv_opt_long(&opts, CKV_OPT_TP, 1), chunk = (int)ckv_opt_long(&opts, CKV_OPT_CHUNK, 512);
    long context = ckv_opt_long(&opts, CKV_OPT_CONTEXT, -1), new_tokens = ckv_opt_long(&opts, CKV_OPT_NEW_TOKENS, 256);
    if (!model) ckv_cli_usage_error("inspect", "--model is required");
    ckv_cli_budget b;
    ckv_cli_press_budget(&opts, &b);
    ckv_press_config press;
    ckv_cli_press_plan(&opts, press_spec, &b, &press);
    if (press.scorer != CKV_SCORER_NONE && b.kind == CKV_CLI_BUDGET_NONE)
        ckv_cli_usage_error("inspect", "--press %s needs a budget: --budget B, --compression-ratio R or --budget-tokens N", press_spec);
    ckv_cli_agreement ag; /* one process; under mpirun every rank must run the same */
    ckv_cli_agree_init(&ag, &opts, model);
    if (ckv_comm_launched_by_mpi()) ckv_comm_free(ckv_cli_world(&ag, &argc, &argv));

    ckv_model_config c;
    ckv_cli_check(ckv_engine_read_config(model, &c));
    if (context < 0) context = c.max_context - new_tokens > 0 ? c.max_context - new_tokens : c.max_context;
    if (context + new_tokens > c.max_context)
        ckv_cli_die("--context %ld + --new-tokens %ld exceed the model's context window of %d tokens", context, new_tokens,
                    c.max_context);
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
    printf("context          %d tokens (max_position_embeddings %d); rope %s, theta %g, factor %g\n", c.max_context,
           c.max_position_embeddings,
           rope_name(c.rope.type), c.rope.theta, c.rope.factor);
    printf("attention bias   %s\n", c.attention_bias ? "yes" : "no");
    printf("checkpoint dtype %s (computed in F32 on the CPU)\n", ckv_dtype_name(c.dtype));
    printf("parameters       %lld (%.3f B)\n", ckv_config_param_count(&c), (double)ckv_config_param_count(&c) / 1e9);
    printf("eos ids         ");
    for (int i = 0; i < c.n_eos; i++) printf(" %d", c.eos_ids[i]);
    printf("\n");

    /* per rank, F32 (CPU backend) and BF16 (what a GPU run stores) */
    size_t w32 = ckv_model_weight_bytes(&c, &p);
    size_t kv_row = (size_t)c.head_dim * 2; /* K and V elements of one token of one head */
    size_t heads_layers = (size_t)c.n_layers * (size_t)p.n_kv_local;
    size_t L = (size_t)context, room = (size_t)new_tokens;
    size_t kv_full = heads_layers * (L + room) * kv_row;                      /* elements */
    int compress = press.scorer != CKV_SCORER_NONE;
    size_t kept = compress ? (size_t)ckv_press_n_kept(&press, (int)context) : L;
    size_t kv_kept = heads_layers * (kept + room) * kv_row;
    size_t kv_peak = compress ? kv_kept + (size_t)p.n_kv_local * (L + room) * kv_row : kv_full; /* + one full layer */
    size_t hidden = L * (size_t)c.hidden_size * (compress ? 2 : 1);           /* x (+ xn for scorers) */
    size_t n = (size_t)(chunk < context ? chunk : context), D = (size_t)c.hidden_size, d = (size_t)c.head_dim;
    size_t nl = n < CKV_LOGITS_ROWS ? n : CKV_LOGITS_ROWS;
    size_t act = n * (2 * D + 2 * (size_t)p.n_q_local * d + 2 * (size_t)p.n_kv_local * d + 2 * (size_t)p.n_ff_local) +
                 nl * ((size_t)p.n_vocab_local + (size_t)c.vocab_size);
    printf("\nper rank: tp %d, %d query heads, %d KV heads%s, MLP rows %d, vocab rows %d\n", tp, p.n_q_local, p.n_kv_local,
           p.kv_replicas > 1 ? " (replicated)" : "", p.n_ff_local, p.n_vocab_local);
    printf("context %ld tokens + %ld new tokens; press %s\n", context, new_tokens, press.spec);
    if (compress) printf("kept per head    %zu of %zu context tokens (mean; cross-head presses vary per head)\n", kept, L);
    printf("                 %14s %14s\n", "F32 (CPU)", "BF16 (GPU)");
    printf("weights          %14s %14s\n", fmt((double)w32, b1, sizeof b1), fmt((double)w32 / 2, b2, sizeof b2));
    printf("KV full          %14s %14s\n", fmt((double)kv_full * 4, b1, sizeof b1), fmt((double)kv_full * 2, b2, sizeof b2));
    if (compress) {
        printf("KV compressed    %14s %14s\n", fmt((double)kv_kept * 4, b1, sizeof b1), fmt((double)kv_kept * 2, b2, sizeof b2));
        printf("KV prefill peak  %14s %14s  (compressed layers + one full layer)\n", fmt((double)kv_peak * 4, b1, sizeof b1),
               fmt((double)kv_peak * 2, b2, sizeof b2));
    }
    printf("hidden states    %14s %14s\n", fmt((double)hidden * 4, b1, sizeof b1), fmt((double)hidden * 2, b2, sizeof b2));
    printf("chunk buffers    %14s %14s  (--chunk %zu)\n", fmt((double)act * 4, b1, sizeof b1), fmt((double)act * 2, b2, sizeof b2), n);
    size_t total32 = w32 + kv_peak * 4 + hidden * 4 + act * 4;
    printf("peak total       %14s %14s\n", fmt((double)total32, b3, sizeof b3), fmt((double)total32 / 2, b4, sizeof b4));
    if (compress) { /* eval, fidelity and analyze sweeps: one prefill serves every press x budget (engine/sweep.h) */
        size_t xn_rows = L - (size_t)ckv_sweep_xn_first(&press, (int)context);
        size_t inputs = (size_t)c.n_layers * xn_rows * D;               /* kept attention inputs */
        size_t sweep_hidden = (L + room) * D * 2;                        /* the full session's x and xn */
        size_t sweep32 = w32 + (kv_full + kv_kept) * 4 + (inputs + sweep_hidden + room * D) * 4 + act * 8;
        printf("sweep of presses (one prefill per context; eval, fidelity, analyze):\n");
        printf("  full cache     %14s %14s\n", fmt((double)kv_full * 4, b1, sizeof b1), fmt((double)kv_full * 2, b2, sizeof b2));
        printf("  one compressed %14s %14s  (one press at a time)\n", fmt((double)kv_kept * 4, b1, sizeof b1),
               fmt((double)kv_kept * 2, b2, sizeof b2));
        printf("  attn inputs    %14s %14s  (%zu rows x %d layers the scorer reads; F32)\n", fmt((double)inputs * 4, b1, sizeof b1),
               fmt((double)inputs * 4, b2, sizeof b2), xn_rows, c.n_layers);
        printf("  peak total     %14s %14s\n", fmt((double)sweep32, b3, sizeof b3),
               fmt((double)sweep32 / 2 + (double)inputs * 2, b4, sizeof b4));
    }
    /* ---- GPU memory plan (model/plan.h): printed per rank, checked against --gpu-mem-limit ---- */
    const char *backend = ckv_opt_str(&opts, CKV_OPT_BACKEND, "cpu");
    double gpu_limit = ckv_opt_num(&opts, CKV_OPT_GPU_MEM_LIMIT, 0);
    if (gpu_limit > 0 && strcmp(backend, "cuda")) ckv_cli_usage_error("inspect", "--gpu-mem-limit needs --backend cuda");
    if (!strcmp(backend, "cuda")) {
        int windowed = ckv_press_takes(&press, "window");
        ckv_plan_params gp = {.tp = tp, .context = context, .new_tokens = new_tokens, .chunk = chunk,
                              .weight_dtype = CKV_DTYPE_BF16, .kv_dtype = CKV_DTYPE_BF16,
                              .kept = compress ? (long)kept : 0, .window = windowed ? press.window : 0, .nccl = tp > 1};
        printf("\n");
        ckv_cli_check(ckv_plan_print(stdout, &c, &gp));
        for (int r = 0; r < tp && gpu_limit > 0; r++) {
            ckv_plan plan;
            ckv_cli_check(ckv_plan_init(&plan, &c, &gp, r));
            ckv_cli_check(ckv_plan_check(&plan, (size_t)gpu_limit));
        }
    }
    return 0;
}
