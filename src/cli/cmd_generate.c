/* cmd_generate.c - `ckv generate`: load a model, prefill token ids, generate, print the ids as they
 * come (stdout, rank 0) and the speed and memory figures (stderr, optionally JSON). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "core/json.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/model.h"

static void generate_usage(FILE *f) {
    fprintf(f,
            "usage: ckv generate --model DIR (--prompt-ids 1,2,3 | --prompt-ids-file F) [flags]\n"
            "\n"
            "  --model DIR            Hugging Face model directory (config.json + *.safetensors)\n"
            "  --prompt-ids LIST      prompt token ids, comma separated\n"
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
            "  --stats-json F         write speed and memory figures to F as JSON\n"
            "  --dump-logits F        write the logits [new tokens, vocab] (float32) that chose each token\n");
}

typedef struct {
    const char *model, *prompt_ids, *prompt_file, *backend, *stats_json, *dump_logits;
    int max_new, chunk, threads, ignore_eos;
    ckv_sampler_config sampling;
} generate_args;

static void parse_args(generate_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->max_new = 32;
    a->chunk = 512;
    a->backend = "cpu";
    a->sampling.top_p = 1.0f;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            generate_usage(stdout);
            exit(0);
        } else if (!strcmp(f, "--model")) {
            a->model = ckv_cli_value(argc, argv, &i);
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
        } else if (!strcmp(f, "--backend")) {
            a->backend = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--dump-logits")) {
            a->dump_logits = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--stats-json")) {
            a->stats_json = ckv_cli_value(argc, argv, &i);
        } else {
            ckv_cli_usage_error("generate", "unknown flag '%s'", f);
        }
    }
    if (!a->model) ckv_cli_usage_error("generate", "--model is required");
    if (!a->prompt_ids == !a->prompt_file) ckv_cli_usage_error("generate", "give exactly one of --prompt-ids and --prompt-ids-file");
}

/* Ends the job on an error: every rank's error is printed by that rank; MPI jobs abort as a whole. */
static void check(ckv_comm *comm, ckv_status s) {
    if (s == CKV_STATUS_OK) return;
    const char *msg = ckv_error_message();
    fprintf(stderr, "ckv: error: %s\n", msg[0] ? msg : ckv_status_string(s));
    fflush(stderr);
    if (comm && comm->size > 1) comm->ops->abort(comm, 1);
    exit(1);
}

static void write_stats(const char *path, const ckv_session *s, size_t peak_rss, size_t peak_alloc, size_t kv_bytes) {
    FILE *f = fopen(path, "w");
    if (!f) ckv_cli_die("--stats-json: cannot write '%s'", path);
    double pt = s->prefill_seconds, dt = s->decode_seconds;
    fprintf(f,
            "{\"prefill_tokens\": %ld, \"prefill_s\": %.6f, \"prefill_tok_s\": %.3f, "
            "\"decode_tokens\": %ld, \"decode_s\": %.6f, \"decode_tok_s\": %.3f, "
            "\"peak_rss_bytes\": %zu, \"peak_alloc_bytes\": %zu, \"kv_bytes\": %zu, \"chunk\": %d}\n",
            s->prefill_tokens, pt, pt > 0 ? (double)s->prefill_tokens / pt : 0.0, s->decode_tokens, dt,
            dt > 0 ? (double)s->decode_tokens / dt : 0.0, peak_rss, peak_alloc, kv_bytes, s->chunk);
    if (fclose(f) != 0) ckv_cli_die("--stats-json: error writing '%s'", path);
}

int ckv_cmd_generate(int argc, char **argv) {
    generate_args a;
    parse_args(&a, argc, argv);
    int n_prompt = 0;
    int32_t *ids = NULL;
    if (a.prompt_file) {
        char *text = NULL;
        ckv_cli_check(ckv_read_file(a.prompt_file, &text, NULL));
        ids = ckv_cli_parse_ids(text, &n_prompt, a.prompt_file);
        free(text);
    } else {
        ids = ckv_cli_parse_ids(a.prompt_ids, &n_prompt, "--prompt-ids");
    }

    ckv_comm *world = NULL;
    ckv_cli_check(ckv_comm_init_world(&world, &argc, &argv));
    ckv_log_set_rank(world->rank, world->size);
    int threads = a.threads ? a.threads : ckv_cpu_count();
    if (world->size > 1 && !a.threads) threads = ckv_cpu_count() / world->size > 0 ? ckv_cpu_count() / world->size : 1;

    ckv_backend *be = NULL;
    check(world, ckv_backend_init(&be, a.backend, threads));
    ckv_model *m = NULL;
    check(world, ckv_model_load(&m, a.model, be, world));
    const ckv_model_config *c = &m->cfg;
    if (n_prompt > c->max_position_embeddings)
        check(world, ckv_error(CKV_STATUS_ERR_RANGE, "the prompt has %d tokens, more than max_position_embeddings %d of %s",
                               n_prompt, c->max_position_embeddings, a.model));
    if ((long)n_prompt + a.max_new > c->max_position_embeddings)
        check(world, ckv_error(CKV_STATUS_ERR_RANGE,
                               "--max-new-tokens %d: prompt (%d) + new tokens exceed max_position_embeddings %d",
                               a.max_new, n_prompt, c->max_position_embeddings));
    ckv_sampler sampler;
    check(world, ckv_sampler_init(&sampler, &a.sampling, c->vocab_size));
    ckv_session sess;
    check(world, ckv_session_init(&sess, m, n_prompt + a.max_new, a.chunk));

    FILE *dump = NULL;
    if (a.dump_logits && world->rank == 0 && !(dump = fopen(a.dump_logits, "wb")))
        check(world, ckv_error(CKV_STATUS_ERR_IO, "--dump-logits: cannot write '%s'", a.dump_logits));
    const float *logits = NULL;
    check(world, ckv_session_prefill(&sess, ids, n_prompt, NULL, &logits));
    int printed = 0;
    for (int t = 0; t < a.max_new; t++) {
        int32_t tok = ckv_sampler_sample(&sampler, logits);
        if (dump && fwrite(logits, sizeof(float), (size_t)c->vocab_size, dump) != (size_t)c->vocab_size)
            check(world, ckv_error(CKV_STATUS_ERR_IO, "--dump-logits: error writing '%s'", a.dump_logits));
        if (world->rank == 0) {
            printf(printed++ ? " %d" : "%d", tok);
            fflush(stdout);
        }
        int is_eos = 0;
        for (int e = 0; e < c->n_eos; e++) is_eos |= tok == c->eos_ids[e];
        if ((is_eos && !a.ignore_eos) || t + 1 == a.max_new) break;
        check(world, ckv_session_decode(&sess, tok, &logits));
    }
    if (dump && fclose(dump) != 0)
        check(world, ckv_error(CKV_STATUS_ERR_IO, "--dump-logits: error writing '%s'", a.dump_logits));
    size_t kv_bytes = ckv_kv_cache_bytes_used(&sess.kv);
    if (world->rank == 0) {
        if (printed) printf("\n");
        char b1[32], b2[32], b3[32], b4[32], b5[32];
        double pt = sess.prefill_seconds, dt = sess.decode_seconds;
        fprintf(stderr, "ckv: prefill %ld tokens in %.3f s (%.1f tok/s); decode %ld tokens in %.3f s (%.2f tok/s)\n",
                sess.prefill_tokens, pt, pt > 0 ? sess.prefill_tokens / pt : 0.0, sess.decode_tokens, dt,
                dt > 0 ? sess.decode_tokens / dt : 0.0);
        fprintf(stderr, "ckv: peak memory %s RSS; weights %s, KV cache %s in use; session buffers %s with --chunk %d (one-shot prefill: %s)\n",
                ckv_format_bytes((double)ckv_mem_peak_rss(), b1, sizeof b1),
                ckv_format_bytes((double)m->weight_bytes, b2, sizeof b2),
                ckv_format_bytes((double)kv_bytes, b3, sizeof b3),
                ckv_format_bytes((double)ckv_session_bytes(&sess), b4, sizeof b4), sess.chunk,
                ckv_format_bytes((double)ckv_session_bytes_for(m, sess.capacity, sess.capacity), b5, sizeof b5));
        if (a.stats_json) write_stats(a.stats_json, &sess, ckv_mem_peak_rss(), ckv_alloc_peak_bytes(), kv_bytes);
    }
    ckv_session_free(&sess);
    ckv_sampler_free(&sampler);
    ckv_model_free(m);
    ckv_backend_free(be);
    ckv_comm_free(world);
    free(ids);
    return 0;
}
