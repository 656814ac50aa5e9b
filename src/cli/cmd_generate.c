/* cmd_generate.c - `ckv generate`: load a model, prefill token ids, generate, print the ids as they
 * come (stdout, rank 0) and the speed and memory figures (stderr, optionally JSON). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "core/json.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "engine/cache_io.h"
#include "engine/compress.h"
#include "kv/kv_file.h"
#include "engine/sampler.h"
#include "engine/text.h"
#include "engine/session.h"
#include "model/model.h"

static void generate_usage(FILE *f) {
    fprintf(f,
            "usage: ckv generate --model PATH (--prompt TEXT | --prompt-file F | --prompt-ids 1,2,3 |\n"
            "                    --prompt-ids-file F) [flags]\n"
            "\n"
            "  --model PATH           Hugging Face model directory (config.json + *.safetensors) or GGUF file\n"
            "  --prompt TEXT          the prompt (the context when questions follow) as text\n"
            "  --prompt-file F        the same, read from a file\n"
            "  --question TEXT        a question about the prompt (repeatable), answered after it\n"
            "  --chat                 render prompt + question as a user turn in the model's chat template\n"
            "  --template NAME        chat template instead of the model's own (llama3, chatml, mistral, ...)\n"
            "  --system TEXT          a system turn for --chat\n"
            "  --prompt-ids LIST      prompt token ids, comma separated (no tokenizer needed)\n"
            "  --prompt-ids-file F    file with the prompt token ids (commas, spaces or newlines)\n"
            "  --max-new-tokens N     tokens to generate (default 32)\n"
            "  --temperature T        0 = greedy (default 0)\n"
            "  --top-k K              keep the K most likely tokens (default 0 = off)\n"
            "  --top-p P              nucleus sampling mass in (0, 1] (default 1 = off)\n"
            "  --seed S               sampling seed (default 0)\n"
            "  --ignore-eos           do not stop at end-of-sequence ids\n"
            "  --chunk N              prefill chunk length in tokens (default 512)\n"
            "  --threads N            CPU threads (default: all cores)\n"
            "  --backend NAME         cpu or cuda (default cpu)\n"
            "  --weights-dtype T      auto (default: weights the backend computes as stored are kept so, e.g.\n"
            "                         GGUF Q4_K or BF16 on the CPU; the rest in the backend's type), f32, f16\n"
            "                         or bf16 (every matrix converted to it at load)\n"
            "  --tp N                 tensor-parallel ranks per group (default: all ranks); the world is split\n"
            "                         into groups of N ranks that share the questions (data parallelism)\n"
            "  --stats-json F         write speed and memory figures to F as JSON\n"
            "  --dump-logits F        write the logits [new tokens, vocab] (float32) that chose each token\n"
            "\n"
            "KV-cache eviction (the prompt is the context; questions are answered from its compressed cache):\n"
            "  --press SPEC           none (default), snapkv, snapkv_paper, pyramidkv, tova, knorm, streaming_llm,\n"
            "                         observed_attention, expected_attention, random, defensivekv, optionally\n"
            "                         wrapped: critical:, adakv:, critical_adakv:, headkv:, critical_headkv:\n"
            "  --budget B             kept fraction in (0, 1] (compression ratio 1 - B)\n"
            "  --compression-ratio R  fraction removed in [0, 1) (kvpress's spelling)\n"
            "  --budget-tokens N      keep N tokens per head\n"
            "  --window N --kernel K --pool avg|max --alpha A --eps E --safeguard S --profile F\n"
            "  --press-opt KEY=VALUE  any press option (repeatable)\n"
            "  --question-ids LIST    a question fed after the compressed context (repeatable; each is\n"
            "                         answered from the same compressed context)\n"
            "  --query-aware          compress context + question together\n"
            "  --dump-kept F          JSON lines {layer, kv_head, positions} of what each head kept\n"
            "  --save-cache F         save the compressed context to F (with tp > 1: F.rank<r> per rank)\n"
            "  --load-cache F         answer --question-ids from a saved context instead of a prompt\n");
}

typedef struct {
    const char *model, *prompt_ids, *prompt_file, *backend, *stats_json, *dump_logits, *dump_kept, *save_cache, *load_cache;
    const char *prompt_text, *prompt_text_file, *template_name, *system;
    const char *qtext[64];
    int n_qtext, chat;
    int max_new, chunk, threads, ignore_eos, tp;
    ckv_model_opts model_opts; /* --weights-dtype */
    ckv_sampler_config sampling;
    ckv_press_config press;
    const char *questions[64];
    int n_questions;
} generate_args;

/* Press flags are parsed in two passes: --press first (it resets the options), then the rest. */
static void parse_press_args(generate_args *a, int argc, char **argv) {
    const char *spec = "none";
    for (int i = 1; i < argc - 1; i++)
        if (!strcmp(argv[i], "--press")) spec = argv[i + 1];
    ckv_cli_check(ckv_press_parse(&a->press, spec));
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        static const char *const opts[][2] = {{"--window", "window"}, {"--kernel", "kernel"}, {"--pool", "pool"},
                                              {"--alpha", "alpha"},   {"--eps", "eps"},       {"--safeguard", "safeguard"},
                                              {"--profile", "profile"}};
        for (size_t j = 0; j < sizeof opts / sizeof opts[0]; j++)
            if (!strcmp(f, opts[j][0])) ckv_cli_check(ckv_press_set_option(&a->press, opts[j][1], ckv_cli_value(argc, argv, &i)));
        if (!strcmp(f, "--press-opt")) {
            const char *kv = ckv_cli_value(argc, argv, &i);
            const char *eq = strchr(kv, '=');
            if (!eq || eq == kv) ckv_cli_die("--press-opt: expected KEY=VALUE, got '%s'", kv);
            char key[64];
            snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
            ckv_cli_check(ckv_press_set_option(&a->press, key, eq + 1));
        } else if (!strcmp(f, "--budget")) {
            ckv_cli_check(ckv_press_set_budget(&a->press, ckv_cli_parse_double(f, ckv_cli_value(argc, argv, &i), -1e300, 1e300)));
        } else if (!strcmp(f, "--compression-ratio")) {
            ckv_cli_check(ckv_press_set_compression_ratio(&a->press, ckv_cli_parse_double(f, ckv_cli_value(argc, argv, &i), -1e300, 1e300)));
        } else if (!strcmp(f, "--budget-tokens")) {
            ckv_cli_check(ckv_press_set_budget_tokens(&a->press, (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), -(1L << 30), 1L << 30)));
        } else if (!strcmp(f, "--query-aware")) {
            a->press.query_aware = 1;
        }
    }
    if (a->press.scorer != CKV_SCORER_NONE && a->press.compression_ratio == 0.0 && a->press.budget_tokens == 0)
        ckv_cli_die("--press %s needs a budget: --budget B, --compression-ratio R or --budget-tokens N", spec);
    ckv_cli_check(ckv_press_finalize(&a->press));
}

static void parse_args(generate_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->max_new = 32;
    a->chunk = 512;
    a->backend = "cpu";
    a->model_opts.weights_dtype = CKV_DTYPE_COUNT_;
    a->model_opts.as_stored = 1;
    a->sampling.top_p = 1.0f;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            generate_usage(stdout);
            exit(0);
        } else if (!strcmp(f, "--model")) {
            a->model = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--prompt")) {
            a->prompt_text = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--prompt-file")) {
            a->prompt_text_file = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--question")) {
            if (a->n_qtext == 64) ckv_cli_die("--question: at most 64 questions");
            a->qtext[a->n_qtext++] = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--chat")) {
            a->chat = 1;
        } else if (!strcmp(f, "--template")) {
            a->template_name = ckv_cli_value(argc, argv, &i);
            a->chat = 1;
        } else if (!strcmp(f, "--system")) {
            a->system = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--prompt-ids")) {
            a->prompt_ids = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--prompt-ids-file")) {
            a->prompt_file = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--max-new-tokens")) {
            a->max_new = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 0, 1 << 24);
        } else if (!strcmp(f, "--temperature")) {
            a->sampling.temperature = (float)ckv_cli_parse_double(f, ckv_cli_value(argc, argv, &i), 0.0, 1e6);
        } else if (!strcmp(f, "--top-k")) {
            a->sampling.top_k = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 0, 1 << 30);
        } else if (!strcmp(f, "--top-p")) {
            a->sampling.top_p = (float)ckv_cli_parse_double(f, ckv_cli_value(argc, argv, &i), 1e-9, 1.0);
        } else if (!strcmp(f, "--seed")) {
            a->sampling.seed = (uint64_t)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 0, 0x7fffffffffffffffL);
        } else if (!strcmp(f, "--ignore-eos")) {
            a->ignore_eos = 1;
        } else if (!strcmp(f, "--chunk")) {
            a->chunk = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 24);
        } else if (!strcmp(f, "--threads")) {
            a->threads = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 4096);
        } else if (!strcmp(f, "--tp")) {
            a->tp = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 20);
        } else if (!strcmp(f, "--backend")) {
            a->backend = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--weights-dtype")) {
            const char *v = ckv_cli_value(argc, argv, &i);
            a->model_opts.as_stored = !strcmp(v, "auto");
            a->model_opts.weights_dtype = CKV_DTYPE_COUNT_;
            if (!a->model_opts.as_stored && !ckv_dtype_parse_float(v, &a->model_opts.weights_dtype))
                ckv_cli_check(ckv_error(CKV_STATUS_ERR_ARG, "--weights-dtype '%s': expected auto, f32, f16 or bf16", v));
        } else if (!strcmp(f, "--press") || !strcmp(f, "--window") || !strcmp(f, "--kernel") || !strcmp(f, "--pool") ||
                   !strcmp(f, "--alpha") || !strcmp(f, "--eps") || !strcmp(f, "--safeguard") || !strcmp(f, "--profile") ||
                   !strcmp(f, "--press-opt") || !strcmp(f, "--budget") || !strcmp(f, "--compression-ratio") ||
                   !strcmp(f, "--budget-tokens")) {
            ckv_cli_value(argc, argv, &i); /* parsed by parse_press_args */
        } else if (!strcmp(f, "--query-aware")) {
        } else if (!strcmp(f, "--question-ids")) {
            if (a->n_questions == 64) ckv_cli_die("--question-ids: at most 64 questions");
            a->questions[a->n_questions++] = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--save-cache")) {
            a->save_cache = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--load-cache")) {
            a->load_cache = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--dump-kept")) {
            a->dump_kept = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--dump-logits")) {
            a->dump_logits = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--stats-json")) {
            a->stats_json = ckv_cli_value(argc, argv, &i);
        } else {
            ckv_cli_usage_error("generate", "unknown flag '%s'", f);
        }
    }
    if (!a->model) ckv_cli_usage_error("generate", "--model is required");
    int n_prompts = !!a->prompt_ids + !!a->prompt_file + !!a->prompt_text + !!a->prompt_text_file;
    if (a->n_qtext && a->n_questions) ckv_cli_usage_error("generate", "give questions as --question or as --question-ids, not both");
    if (a->load_cache) {
        if (n_prompts) ckv_cli_usage_error("generate", "--load-cache replaces the prompt: drop --prompt-ids");
        if (a->n_questions == 0 && a->n_qtext == 0) ckv_cli_usage_error("generate", "--load-cache needs at least one --question-ids");
        if (a->save_cache) ckv_cli_usage_error("generate", "--load-cache and --save-cache together");
        if (a->chat && a->n_qtext) ckv_cli_usage_error("generate", "--chat with --load-cache: the template was applied when the cache was made");
    } else if (n_prompts != 1) {
        ckv_cli_usage_error("generate", "give exactly one of --prompt, --prompt-file, --prompt-ids and --prompt-ids-file");
    }
    if (a->n_qtext && (a->prompt_ids || a->prompt_file))
        ckv_cli_usage_error("generate", "--question needs a text prompt (--prompt or --prompt-file); with ids use --question-ids");
    parse_press_args(a, argc, argv);
    if (a->save_cache && a->press.query_aware) ckv_cli_usage_error("generate", "--save-cache stores a context-only compression; drop --query-aware");
    if (a->load_cache && a->press.scorer != CKV_SCORER_NONE)
        ckv_cli_usage_error("generate", "--load-cache uses the press the cache was made with: drop --press");
    if (a->press.query_aware && a->n_questions == 0 && a->n_qtext == 0)
        ckv_cli_die("--query-aware needs at least one --question-ids");
}


typedef struct {
    ckv_comm *world;
    ckv_sampler *sampler;
    const ckv_model_config *cfg;
    const ckv_tokenizer *tok; /* text output when not NULL */
    int32_t stop[CKV_MAX_EOS + 16];
    int n_stop;
    int max_new, ignore_eos;
    int stream;      /* print as tokens come (world rank 0, one group) */
    FILE *dump;
    const char *dump_path;
    char *piece;     /* [ckv_detok_stream_cap] streaming text buffer */
} answer_ctx;

/* Prints one answer (ids or text) that was not streamed. */
static void print_answer(const answer_ctx *a, const int32_t *ids, int n) {
    if (!a->tok) {
        for (int t = 0; t < n; t++) printf(t ? " %d" : "%d", ids[t]);
        if (n) printf("\n");
        return;
    }
    char *textout = NULL;
    size_t len = 0;
    if (ckv_tokenizer_decode(a->tok, ids, (size_t)n, CKV_DETOKENIZE_SKIP_SPECIAL, &textout, &len) == CKV_STATUS_OK) {
        fwrite(textout, 1, len, stdout);
        printf("\n");
    }
    free(textout);
}

/* Samples up to max_new tokens starting from `logits`, feeding each back; streams them when asked
 * and stores them in out[0] = count, out[1..] = ids. */
static void answer(answer_ctx *a, ckv_session *sess, const float *logits, int32_t *out) {
    int printed = 0;
    out[0] = 0;
    ckv_detok_stream ds;
    if (a->tok) ckv_detok_stream_init(&ds, a->tok, CKV_DETOKENIZE_SKIP_SPECIAL);
    size_t cap = a->tok ? ckv_detok_stream_cap(a->tok) : 0, n = 0;
    for (int t = 0; t < a->max_new; t++) {
        int32_t tok = ckv_sampler_sample(a->sampler, logits);
        out[1 + out[0]++] = tok;
        if (a->dump && fwrite(logits, sizeof(float), (size_t)a->cfg->vocab_size, a->dump) != (size_t)a->cfg->vocab_size)
            ckv_cli_check_comm(a->world, ckv_error(CKV_STATUS_ERR_IO, "--dump-logits: error writing '%s'", a->dump_path));
        int is_eos = 0;
        for (int e = 0; e < a->n_stop; e++) is_eos |= tok == a->stop[e];
        if (a->stream) {
            if (!a->tok) {
                printf(printed++ ? " %d" : "%d", tok);
            } else if (!(is_eos && !a->ignore_eos) && ckv_detok_stream_push(&ds, tok, a->piece, cap, &n) == CKV_STATUS_OK) {
                fwrite(a->piece, 1, n, stdout);
                printed++;
            }
            fflush(stdout);
        }
        if ((is_eos && !a->ignore_eos) || t + 1 == a->max_new) break;
        ckv_cli_check_comm(a->world, ckv_session_decode(sess, tok, &logits));
    }
    if (a->stream) {
        if (a->tok && ckv_detok_stream_flush(&ds, a->piece, cap, &n) == CKV_STATUS_OK) fwrite(a->piece, 1, n, stdout);
        if (printed || a->tok) printf("\n");
        fflush(stdout);
    }
}

static int32_t *read_ids(const char *text_or_file, int is_file, int *n, const char *what) {
    if (!is_file) return ckv_cli_parse_ids(text_or_file, n, what);
    char *text = NULL;
    ckv_cli_check(ckv_read_file(text_or_file, &text, NULL));
    int32_t *ids = ckv_cli_parse_ids(text, n, text_or_file);
    free(text);
    return ids;
}

int ckv_cmd_generate(int argc, char **argv) {
    generate_args a;
    parse_args(&a, argc, argv);
    int n_ctx = 0, n_q[64] = {0}, max_q = 0;
    int32_t *ctx = NULL, *q[64] = {0};
    ckv_tokenizer *tok = NULL;
    int text = a.prompt_text || a.prompt_text_file || a.n_qtext;
    if (text) ckv_cli_check(ckv_text_open_tokenizer(&tok, a.model));
    if (a.prompt_text || a.prompt_text_file) { /* text: the context and each question, split as kvpress does */
        char *body = NULL;
        if (a.prompt_text_file) ckv_cli_check(ckv_read_file(a.prompt_text_file, &body, NULL));
        const char *context = body ? body : a.prompt_text;
        for (int i = 0; i < (a.n_qtext ? a.n_qtext : 1); i++) {
            int32_t *c_ids = NULL;
            int nc = 0;
            ckv_cli_check(ckv_text_encode_split(tok, context, a.n_qtext ? a.qtext[i] : NULL, a.chat, a.template_name,
                                                a.system, &c_ids, &nc, &q[i], &n_q[i]));
            if (i == 0) {
                ctx = c_ids;
                n_ctx = nc;
            } else {
                free(c_ids);
            }
            if (n_q[i] > max_q) max_q = n_q[i];
        }
        a.n_questions = a.n_qtext;
        free(body);
        if (n_ctx < 1) ckv_cli_die("the prompt encodes to no tokens");
    } else if (!a.load_cache) {
        ctx = read_ids(a.prompt_file ? a.prompt_file : a.prompt_ids, a.prompt_file != NULL, &n_ctx,
                       a.prompt_file ? a.prompt_file : "--prompt-ids");
    }
    if (a.load_cache) { /* the context length comes from the cache header */
        char *meta = NULL, shard0[4200];
        snprintf(shard0, sizeof shard0, "%s.rank0", a.load_cache); /* saved by several ranks */
        int sharded = access(a.load_cache, F_OK) != 0 && access(shard0, F_OK) == 0;
        ckv_cli_check(ckv_kv_file_read_meta(sharded ? shard0 : a.load_cache, &meta));
        const char *p = strstr(meta, "\"context_len\": ");
        n_ctx = p ? atoi(p + 15) : 0;
        free(meta);
        if (n_ctx < 1) ckv_cli_die("%s: cache header has no context length", a.load_cache);
    }
    for (int i = 0; i < (a.n_qtext ? a.n_qtext : a.n_questions) && !(a.prompt_text || a.prompt_text_file); i++) {
        if (a.n_qtext) { /* text questions over a loaded cache: plain continuations */
            int32_t *none = NULL;
            int nn = 0;
            ckv_cli_check(ckv_text_encode_split(tok, "", a.qtext[i], 0, NULL, NULL, &none, &nn, &q[i], &n_q[i]));
            free(none);
        } else {
            q[i] = ckv_cli_parse_ids(a.questions[i], &n_q[i], "--question-ids");
        }
        if (n_q[i] > max_q) max_q = n_q[i];
    }
    if (a.load_cache && a.n_qtext) a.n_questions = a.n_qtext;

    ckv_comm *world = NULL;
    ckv_cli_check(ckv_comm_init_world(&world, &argc, &argv));
    ckv_log_set_rank(world->rank, world->size);
    int threads = a.threads ? a.threads : ckv_cpu_count();
    if (world->size > 1 && !a.threads) threads = ckv_cpu_count() / world->size > 0 ? ckv_cpu_count() / world->size : 1;

    int tp_size = a.tp ? a.tp : world->size;
    if (world->size % tp_size != 0)
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_ARG, "--tp %d does not divide the %d ranks of the job", tp_size, world->size));
    int n_groups = world->size / tp_size, group = world->rank / tp_size;
    ckv_comm *tpc = NULL;
    ckv_cli_check_comm(world, world->ops->split(world, group, world->rank, &tpc));
    ckv_backend *be = NULL;
    ckv_cli_check_comm(world, ckv_backend_init(&be, a.backend, threads));
    ckv_model *m = NULL;
    ckv_cli_check_comm(world, ckv_model_load_opts(&m, a.model, be, tpc, &a.model_opts));
    const ckv_model_config *c = &m->cfg;
    long need = (long)n_ctx + max_q + a.max_new;
    if (n_ctx + max_q > c->max_context)
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_RANGE,
                               "the prompt has %d tokens, more than the context window of %d tokens (max_position_embeddings) of %s",
                               n_ctx + max_q, c->max_context, a.model));
    if (need > c->max_context)
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_RANGE,
                               "--max-new-tokens %d: prompt (%d) + new tokens exceed the context window of %d tokens "
                               "(max_position_embeddings)", a.max_new, n_ctx + max_q, c->max_context));
    int compress = a.press.scorer != CKV_SCORER_NONE;
    for (int i = 0; i < (a.press.query_aware ? a.n_questions : 1) && compress; i++)
        ckv_cli_check_comm(world, ckv_press_check_context(&a.press, n_ctx + (a.press.query_aware ? n_q[i] : 0)));
    if (world->rank == 0 && compress) fprintf(stderr, "ckv: press %s\n", a.press.spec);
    ckv_sampler sampler;
    ckv_cli_check_comm(world, ckv_sampler_init(&sampler, &a.sampling, c->vocab_size));

    ckv_compressor cz;
    memset(&cz, 0, sizeof cz);
    cz.cfg = &a.press;
    int32_t *headkv = NULL; /* per-head budgets from the profile (the context length is known now) */
    if (a.press.alloc == CKV_ALLOC_HEADKV) {
        if (a.press.query_aware && a.n_questions > 1)
            for (int i = 1; i < a.n_questions; i++)
                if (n_q[i] != n_q[0])
                    ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_ARG, "--query-aware with headkv needs questions of one length"));
        ckv_cli_check_comm(world, ckv_compress_headkv_budgets(&a.press, c, n_ctx + (a.press.query_aware ? n_q[0] : 0), &headkv));
        cz.headkv_budgets = headkv;
    }
    cz.dump = a.dump_kept != NULL;
    if (a.dump_kept && world->rank == 0 && !(cz.dump_kept = fopen(a.dump_kept, "w")))
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--dump-kept: cannot write '%s'", a.dump_kept));
    /* answers of all work items: [n_items, 1 + max_new] (count, ids), summed over the world at the end */
    int n_items = a.n_questions ? a.n_questions : 1;
    size_t stride = (size_t)a.max_new + 1;
    int32_t *answers = calloc((size_t)n_items * stride, sizeof(int32_t));
    if (!answers) ckv_cli_die("out of memory");
    answer_ctx ac;
    memset(&ac, 0, sizeof ac);
    ac.world = world;
    ac.sampler = &sampler;
    ac.cfg = c;
    ac.tok = tok;
    ac.max_new = a.max_new;
    ac.ignore_eos = a.ignore_eos;
    ac.stream = n_groups == 1 && world->rank == 0;
    ac.dump_path = a.dump_logits;
    for (int e = 0; e < c->n_eos; e++) ac.stop[ac.n_stop++] = c->eos_ids[e];
    if (tok) { /* the tokenizer's end-of-turn ids (e.g. <|im_end|>) stop a chat answer too */
        ac.n_stop += ckv_tokenizer_stop_ids(tok, ac.stop + ac.n_stop, (int)(sizeof ac.stop / sizeof ac.stop[0]) - ac.n_stop);
        ac.piece = malloc(ckv_detok_stream_cap(tok));
        if (!ac.piece) ckv_cli_die("out of memory");
    }
    if (a.dump_logits && world->rank == 0 && !(ac.dump = fopen(a.dump_logits, "wb")))
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--dump-logits: cannot write '%s'", a.dump_logits));

    ckv_session sess;
    const float *logits = NULL;
    double pre_s = 0, dec_s = 0;
    long pre_tok = 0, dec_tok = 0;
    size_t sess_bytes = 0, peak_kv = 0;
    int chunk_used = a.chunk;
    if (a.press.query_aware) { /* each question compresses context + question afresh */
        for (int i = group; i < a.n_questions; i += n_groups) {
            int n = n_ctx + n_q[i];
            int32_t *all = malloc(sizeof(int32_t) * (size_t)n);
            if (!all) ckv_cli_die("out of memory");
            memcpy(all, ctx, sizeof(int32_t) * (size_t)n_ctx);
            memcpy(all + n_ctx, q[i], sizeof(int32_t) * (size_t)n_q[i]);
            ckv_cli_check_comm(world, ckv_session_init(&sess, m, n + a.max_new, a.chunk, compress));
            ckv_cli_check_comm(world, ckv_session_prefill_hook(&sess, all, n, NULL, &logits, ckv_compress_layer_hook, &cz));
            answer(&ac, &sess, logits, answers + (size_t)i * stride);
            pre_s += sess.prefill_seconds, dec_s += sess.decode_seconds;
            pre_tok += sess.prefill_tokens, dec_tok += sess.decode_tokens;
            sess_bytes = ckv_session_bytes(&sess);
            chunk_used = sess.chunk;
            size_t kvb = ckv_kv_cache_bytes_used(&sess.kv);
            if (kvb > peak_kv) peak_kv = kvb;
            ckv_session_free(&sess);
            free(all);
        }
    } else if (a.n_questions > 0 || group == 0) { /* one prompt: group 0 works, the others wait */
        ckv_cli_check_comm(world, ckv_session_init(&sess, m, (int)need, a.chunk, compress || a.load_cache));
        if (a.load_cache) {
            char spec[512];
            ckv_cli_check_comm(world, ckv_session_load_cache(&sess, a.load_cache, spec, sizeof spec));
            if (world->rank == 0) fprintf(stderr, "ckv: loaded a context of %d tokens compressed with %s\n", sess.n_past, spec);
        } else {
            ckv_cli_check_comm(world, ckv_session_prefill_hook(&sess, ctx, n_ctx, NULL, &logits, compress ? ckv_compress_layer_hook : NULL, &cz));
        }
        if (a.save_cache && group == 0) ckv_cli_check_comm(world, ckv_session_save_cache(&sess, a.save_cache, a.press.spec));
        if (a.n_questions == 0) {
            answer(&ac, &sess, logits, answers);
        } else {
            ckv_cli_check_comm(world, ckv_session_mark(&sess));
            for (int i = group; i < a.n_questions; i += n_groups) {
                ckv_cli_check_comm(world, ckv_session_prefill(&sess, q[i], n_q[i], NULL, &logits));
                answer(&ac, &sess, logits, answers + (size_t)i * stride);
                size_t kvb = ckv_kv_cache_bytes_used(&sess.kv);
                if (kvb > peak_kv) peak_kv = kvb;
                ckv_cli_check_comm(world, ckv_session_rewind(&sess));
            }
        }
        size_t kvb = ckv_kv_cache_bytes_used(&sess.kv);
        if (kvb > peak_kv) peak_kv = kvb;
        pre_s = sess.prefill_seconds, dec_s = sess.decode_seconds;
        pre_tok = sess.prefill_tokens, dec_tok = sess.decode_tokens;
        sess_bytes = ckv_session_bytes(&sess);
        chunk_used = sess.chunk;
        ckv_session_free(&sess);
    }
    /* gather the answers: only each group's rank 0 contributes, so a sum assembles them */
    if (tpc->rank != 0) memset(answers, 0, (size_t)n_items * stride * sizeof(int32_t));
    if (n_groups > 1) {
        ckv_cli_check_comm(world, world->ops->allreduce_i32(world, answers, (size_t)n_items * stride, CKV_COMM_OP_SUM));
        if (world->rank == 0)
            for (int i = 0; i < n_items; i++) print_answer(&ac, answers + (size_t)i * stride + 1, answers[(size_t)i * stride]);
    }
    free(answers);
    free(headkv);
    free(ac.piece);
    if (ac.dump && fclose(ac.dump) != 0)
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--dump-logits: error writing '%s'", a.dump_logits));
    if (cz.dump_kept && fclose(cz.dump_kept) != 0)
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--dump-kept: error writing '%s'", a.dump_kept));

    if (world->rank == 0) {
        char b1[32], b2[32], b3[32], b4[32], b5[32];
        if (tpc->size > 1) {
            double per_tok = (pre_tok + dec_tok) > 0 ? (double)(tpc->bytes - cz.comm_bytes) / (double)(pre_tok + dec_tok) : 0.0;
            fprintf(stderr, "ckv: tensor parallel %d: this rank sent %s to collectives (%s per token through the model; "
                    "%s for compression)\n", tpc->size, ckv_format_bytes((double)tpc->bytes, b1, sizeof b1),
                    ckv_format_bytes(per_tok, b2, sizeof b2), ckv_format_bytes((double)cz.comm_bytes, b3, sizeof b3));
        }
        fprintf(stderr, "ckv: prefill %ld tokens in %.3f s (%.1f tok/s); decode %ld tokens in %.3f s (%.2f tok/s)\n",
                pre_tok, pre_s, pre_s > 0 ? pre_tok / pre_s : 0.0, dec_tok, dec_s, dec_s > 0 ? dec_tok / dec_s : 0.0);
        if (compress) {
            double sel = cz.score_seconds + cz.select_seconds + cz.compact_seconds;
            fprintf(stderr,
                    "ckv: KV cache of the context %s -> %s on this rank (%.1f%% of entries kept); eviction %.3f s "
                    "(scoring %.3f, selection %.3f, compaction %.3f) = %.1f%% of prefill time\n",
                    ckv_format_bytes((double)cz.kv_bytes_full, b1, sizeof b1),
                    ckv_format_bytes((double)cz.kv_bytes_kept, b2, sizeof b2),
                    cz.total_entries ? 100.0 * (double)cz.kept_entries / (double)cz.total_entries : 100.0, sel,
                    cz.score_seconds, cz.select_seconds, cz.compact_seconds, pre_s > 0 ? 100.0 * sel / pre_s : 0.0);
        }
        fprintf(stderr, "ckv: peak memory %s RSS; weights %s, KV cache %s in use; session buffers %s with --chunk %d (one-shot prefill: %s)\n",
                ckv_format_bytes((double)ckv_mem_peak_rss(), b1, sizeof b1),
                ckv_format_bytes((double)m->weight_bytes, b2, sizeof b2),
                ckv_format_bytes((double)peak_kv, b3, sizeof b3),
                ckv_format_bytes((double)sess_bytes, b4, sizeof b4), chunk_used,
                ckv_format_bytes((double)ckv_session_bytes_for(m, (int)need, (int)need), b5, sizeof b5));
        if (a.stats_json) {
            FILE *f = fopen(a.stats_json, "w");
            if (!f) ckv_cli_die("--stats-json: cannot write '%s'", a.stats_json);
            fprintf(f,
                    "{\"prefill_tokens\": %ld, \"prefill_s\": %.6f, \"prefill_tok_s\": %.3f, "
                    "\"decode_tokens\": %ld, \"decode_s\": %.6f, \"decode_tok_s\": %.3f, "
                    "\"peak_rss_bytes\": %zu, \"peak_alloc_bytes\": %zu, \"kv_bytes\": %zu, \"weight_bytes\": %zu, "
                    "\"chunk\": %d, "
                    "\"press\": \"%s\", \"kv_context_bytes_full\": %zu, \"kv_context_bytes_kept\": %zu, "
                    "\"evict_s\": %.6f, \"tp\": %d, \"comm_bytes\": %llu, \"comm_bytes_compression\": %llu}\n",
                    pre_tok, pre_s, pre_s > 0 ? pre_tok / pre_s : 0.0, dec_tok, dec_s, dec_s > 0 ? dec_tok / dec_s : 0.0,
                    ckv_mem_peak_rss(), ckv_alloc_peak_bytes(), peak_kv, m->weight_bytes, chunk_used, a.press.spec,
                    cz.kv_bytes_full,
                    cz.kv_bytes_kept, cz.score_seconds + cz.select_seconds + cz.compact_seconds, tpc->size, tpc->bytes,
                    cz.comm_bytes);
            if (fclose(f) != 0) ckv_cli_die("--stats-json: error writing '%s'", a.stats_json);
        }
    }
    ckv_sampler_free(&sampler);
    ckv_model_free(m);
    ckv_backend_free(be);
    ckv_comm_free(tpc);
    ckv_comm_free(world);
    ckv_tokenizer_free(tok);
    free(ctx);
    for (int i = 0; i < a.n_questions; i++) free(q[i]);
    return 0;
}
