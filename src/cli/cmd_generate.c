/* cmd_generate.c - `ckv generate`: load a model, prefill token ids, generate, print the ids as they
 * come (stdout, rank 0) and the speed and memory figures (stderr, optionally JSON). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/cli_agree.h"
#include "cli/cli_opts.h"
#include "cli/cli_press.h"
#include "comm/comm.h"
#include "core/alloc.h"
#include "core/json.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "engine/request.h"
#include "engine/text.h"
#include "model/model.h"

static const ckv_cli_command generate_cmd = {
    CKV_CMD_GENERATE, "generate",
    "-m PATH (-p TEXT | -f FILE | --prompt-ids 1,2,3 | --prompt-ids-file F) [flags]",
    "Runs a prompt through a model and prints the generated ids (or text, with a text prompt) on stdout,\n"
    "the speed and memory figures on stderr. With a press the prompt is the context: it is compressed\n"
    "once and every question is answered from the compressed cache."};

typedef struct {
    const char *model, *prompt_ids, *prompt_file, *stats_json, *dump_logits, *dump_kept, *save_cache, *load_cache;
    const char *prompt_text, *prompt_text_file, *template_name, *system;
    const char *qtext[64];
    int n_qtext, chat; /* chat: CKV_TEXT_CHAT, and CKV_TEXT_SPECIAL_IN_CONTENT with --special-in-content */
    int max_new, ignore_eos;
    ckv_sampler_config sampling;
    ckv_press_config press;
    ckv_decode_press decode;
    int has_decode; /* --decode-press */
    const char *questions[64];
    int n_questions;
} generate_args;

static void parse_args(generate_args *a, ckv_opts *o, int argc, char **argv) {
    ckv_opts_parse(o, &generate_cmd, argc, argv);
    memset(a, 0, sizeof *a);
    a->model = ckv_opt_str(o, CKV_OPT_MODEL, NULL);
    a->prompt_text = ckv_opt_str(o, CKV_OPT_PROMPT, NULL);
    a->prompt_text_file = ckv_opt_str(o, CKV_OPT_PROMPT_FILE, NULL);
    a->prompt_ids = ckv_opt_str(o, CKV_OPT_PROMPT_IDS, NULL);
    a->prompt_file = ckv_opt_str(o, CKV_OPT_PROMPT_IDS_FILE, NULL);
    a->n_qtext = ckv_opt_all(o, CKV_OPT_QUESTION, a->qtext, 64);
    a->n_questions = ckv_opt_all(o, CKV_OPT_QUESTION_IDS, a->questions, 64);
    a->template_name = ckv_opt_str(o, CKV_OPT_TEMPLATE, NULL);
    a->chat = ckv_opt_has(o, CKV_OPT_CHAT) || a->template_name ? CKV_TEXT_CHAT : 0;
    if (ckv_opt_has(o, CKV_OPT_SPECIAL_IN_CONTENT)) {
        if (!a->chat) ckv_cli_usage_error("generate", "--special-in-content needs --chat");
        a->chat |= CKV_TEXT_SPECIAL_IN_CONTENT;
    }
    a->system = ckv_opt_str(o, CKV_OPT_SYSTEM, NULL);
    a->max_new = (int)ckv_opt_long(o, CKV_OPT_MAX_NEW_TOKENS, 32);
    a->sampling.temperature = (float)ckv_opt_num(o, CKV_OPT_TEMPERATURE, 0.0);
    a->sampling.top_k = (int)ckv_opt_long(o, CKV_OPT_TOP_K, 0);
    a->sampling.top_p = (float)ckv_opt_num(o, CKV_OPT_TOP_P, 1.0);
    a->sampling.seed = (uint64_t)ckv_opt_long(o, CKV_OPT_SEED, 0);
    a->ignore_eos = ckv_opt_has(o, CKV_OPT_IGNORE_EOS);
    a->stats_json = ckv_opt_str(o, CKV_OPT_STATS_JSON, NULL);
    a->dump_logits = ckv_opt_str(o, CKV_OPT_DUMP_LOGITS, NULL);
    a->dump_kept = ckv_opt_str(o, CKV_OPT_DUMP_KEPT, NULL);
    a->save_cache = ckv_opt_str(o, CKV_OPT_SAVE_CACHE, NULL);
    a->load_cache = ckv_opt_str(o, CKV_OPT_LOAD_CACHE, NULL);
    if (!a->model) ckv_cli_usage_error("generate", "--model is required");
    static const ckv_opt_id prompts[] = {CKV_OPT_PROMPT, CKV_OPT_PROMPT_FILE, CKV_OPT_PROMPT_IDS, CKV_OPT_PROMPT_IDS_FILE,
                                         CKV_OPT_LOAD_CACHE};
    int n_prompts = !!a->prompt_ids + !!a->prompt_file + !!a->prompt_text + !!a->prompt_text_file;
    static const ckv_opt_id questions[] = {CKV_OPT_QUESTION, CKV_OPT_QUESTION_IDS};
    ckv_opts_exclusive(o, questions, 2, "both give the questions (text or ids)");
    if (a->load_cache) {
        if (n_prompts) ckv_cli_usage_error("generate", "--load-cache replaces the prompt: drop --prompt-ids");
        if (a->save_cache) ckv_cli_usage_error("generate", "--load-cache and --save-cache together");
        if (a->chat && a->n_qtext) ckv_cli_usage_error("generate", "--chat with --load-cache: the template was applied when the cache was made");
    } else if (n_prompts != 1) {
        if (n_prompts > 1) ckv_opts_exclusive(o, prompts, 5, "both give the prompt (exactly one of --prompt, --prompt-file, --prompt-ids and --prompt-ids-file)");
        ckv_cli_usage_error("generate", "give exactly one of --prompt, --prompt-file, --prompt-ids and --prompt-ids-file");
    }
    if (a->n_qtext && (a->prompt_ids || a->prompt_file))
        ckv_cli_usage_error("generate", "--question needs a text prompt (--prompt or --prompt-file); with ids use --question-ids");
    if (a->chat && (a->prompt_ids || a->prompt_file))
        ckv_cli_usage_error("generate", "--chat needs a text prompt (--prompt or --prompt-file)");
    /* the press */
    ckv_cli_press_single(o, "generate", &a->press);
    if (a->load_cache && a->press.scorer != CKV_SCORER_NONE)
        ckv_cli_usage_error("generate", "--load-cache uses the press the cache was made with: drop --press");
    if (a->press.query_aware && a->n_questions == 0 && a->n_qtext == 0)
        ckv_cli_usage_error("generate", "--query-aware needs at least one --question-ids");
    a->has_decode = ckv_cli_decode_press(o, &a->press, 1, &a->decode);
}

/* --stats-json: the speed and memory figures of the run as one JSON object. */
static void write_stats_json(const char *path, const ckv_request_stats *rs, const ckv_press_config *press, const ckv_comm *tpc,
                             const ckv_backend_mem *dev) {
    cJSON *o = cJSON_CreateObject();
    if (!o) ckv_cli_die("out of memory");
    double pre_s = rs->prefill_seconds, dec_s = rs->decode_seconds;
    cJSON_AddNumberToObject(o, "prefill_tokens", (double)rs->prefill_tokens);
    cJSON_AddNumberToObject(o, "prefill_s", pre_s);
    cJSON_AddNumberToObject(o, "prefill_tok_s", pre_s > 0 ? rs->prefill_tokens / pre_s : 0.0);
    cJSON_AddNumberToObject(o, "decode_tokens", (double)rs->decode_tokens);
    cJSON_AddNumberToObject(o, "decode_s", dec_s);
    cJSON_AddNumberToObject(o, "decode_tok_s", dec_s > 0 ? rs->decode_tokens / dec_s : 0.0);
    cJSON_AddNumberToObject(o, "ttft_s", rs->ttft_seconds);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)rs->prompt_tokens);
    cJSON_AddNumberToObject(o, "reused_tokens", (double)rs->reused_tokens);
    cJSON_AddNumberToObject(o, "peak_rss_bytes", (double)ckv_mem_peak_rss());
    cJSON_AddNumberToObject(o, "peak_alloc_bytes", (double)ckv_alloc_peak_bytes());
    cJSON_AddNumberToObject(o, "kv_bytes", (double)rs->kv_bytes_peak);
    if (dev) { /* a backend with device memory of its own */
        cJSON_AddNumberToObject(o, "device_peak_bytes", (double)dev->peak_bytes);
        cJSON_AddNumberToObject(o, "device_used_at_peak_bytes", (double)dev->device_used_at_peak_bytes);
    }
    cJSON_AddNumberToObject(o, "chunk", rs->chunk);
    cJSON_AddStringToObject(o, "press", press->spec);
    cJSON_AddBoolToObject(o, "compressed", rs->compressed);
    cJSON_AddNumberToObject(o, "decode_compressions", rs->decode_compressions);
    cJSON_AddNumberToObject(o, "decode_evicted_entries", (double)rs->decode_evicted_entries);
    if (rs->uncompressed_reason) cJSON_AddStringToObject(o, "uncompressed_reason", rs->uncompressed_reason);
    cJSON_AddNumberToObject(o, "kv_context_bytes_full", (double)rs->kv_bytes_full);
    cJSON_AddNumberToObject(o, "kv_context_bytes_kept", (double)rs->kv_bytes_kept);
    cJSON_AddNumberToObject(o, "kept_entries", (double)rs->kept_entries);
    cJSON_AddNumberToObject(o, "evict_s", rs->score_seconds + rs->select_seconds + rs->compact_seconds);
    cJSON_AddNumberToObject(o, "tp", tpc->size);
    cJSON_AddNumberToObject(o, "comm_bytes", (double)tpc->bytes);
    cJSON_AddNumberToObject(o, "comm_bytes_compression", (double)rs->comm_bytes_compression);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!s) ckv_cli_die("out of memory");
    FILE *f = fopen(path, "w");
    if (!f) ckv_cli_die("--stats-json: cannot write '%s'", path);
    fprintf(f, "%s\n", s);
    free(s);
    if (fclose(f) != 0) ckv_cli_die("--stats-json: error writing '%s'", path);
}

typedef struct {
    ckv_comm *world;
    const ckv_model_config *cfg;
    const ckv_tokenizer *tok; /* text output when not NULL */
    int stream;      /* print as tokens come (world rank 0, one group) */
    FILE *dump;
    const char *dump_path;
    char *piece;     /* [ckv_detok_stream_cap] streaming text buffer */
    size_t cap;
    ckv_detok_stream ds;
    int cur, printed; /* the answer being streamed, tokens printed of it */
    const int *index; /* request question -> command-line question */
    int32_t *answers; /* [n_items, stride] count, ids (the stopping id included) */
    size_t stride;
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

/* Token callback: --dump-logits and streaming output. */
static int on_token(void *ctx, int question, int32_t tok, int is_stop, const float *logits) {
    answer_ctx *a = ctx;
    if (a->dump && fwrite(logits, sizeof(float), (size_t)a->cfg->vocab_size, a->dump) != (size_t)a->cfg->vocab_size)
        ckv_cli_check_comm(a->world, ckv_error(CKV_STATUS_ERR_IO, "--dump-logits: error writing '%s'", a->dump_path));
    if (!a->stream) return 0;
    if (question != a->cur) {
        a->cur = question;
        a->printed = 0;
        if (a->tok) ckv_detok_stream_init(&a->ds, a->tok, CKV_DETOKENIZE_SKIP_SPECIAL);
    }
    size_t n = 0;
    if (!a->tok) {
        printf(a->printed++ ? " %d" : "%d", tok);
    } else if (!is_stop && ckv_detok_stream_push(&a->ds, tok, a->piece, a->cap, &n) == CKV_STATUS_OK) {
        fwrite(a->piece, 1, n, stdout);
        a->printed++;
    }
    fflush(stdout);
    return 0;
}

/* End of an answer: finish the streamed line; keep the ids (with the stopping one) for the gather. */
static void on_answer_end(void *ctx, int question, const ckv_answer *ans) {
    answer_ctx *a = ctx;
    if (a->stream) {
        if (question != a->cur) { /* no token was generated */
            a->cur = question;
            a->printed = 0;
            if (a->tok) ckv_detok_stream_init(&a->ds, a->tok, CKV_DETOKENIZE_SKIP_SPECIAL);
        }
        size_t n = 0;
        if (a->tok && ckv_detok_stream_flush(&a->ds, a->piece, a->cap, &n) == CKV_STATUS_OK) fwrite(a->piece, 1, n, stdout);
        if (a->printed || a->tok) printf("\n");
        fflush(stdout);
        a->cur = -1;
    }
    int32_t *out = a->answers + (size_t)a->index[question] * a->stride;
    out[0] = 0;
    for (int t = 0; t < ans->n; t++) out[1 + out[0]++] = ans->ids[t];
    if (ans->stop_id >= 0) out[1 + out[0]++] = ans->stop_id;
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
    ckv_opts opts;
    parse_args(&a, &opts, argc, argv);
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

    /* every rank must run the same work: compare before any collective */
    ckv_cli_agreement ag;
    ckv_cli_agree_init(&ag, &opts, a.model);
    if (ctx) ckv_cli_agree_add(&ag, CKV_AGREE_PROMPT, ctx, sizeof(int32_t) * (size_t)n_ctx);
    for (int i = 0; i < a.n_questions; i++) ckv_cli_agree_add(&ag, CKV_AGREE_QUESTIONS, q[i], sizeof(int32_t) * (size_t)n_q[i]);
    ckv_cli_agree_add(&ag, CKV_AGREE_PRESS, a.press.spec, strlen(a.press.spec));
    if (a.has_decode) ckv_cli_agree_add(&ag, CKV_AGREE_PRESS, a.decode.spec, strlen(a.decode.spec));
    ckv_comm *world = ckv_cli_world(&ag, &argc, &argv);
    int tp_size = (int)ckv_opt_long(&opts, CKV_OPT_TP, world->size);
    if (world->size % tp_size != 0)
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_ARG, "--tp %d does not divide the %d ranks of the job", tp_size, world->size));
    int n_groups = world->size / tp_size, group = world->rank / tp_size;
    ckv_comm *tpc = NULL;
    ckv_cli_check_comm(world, world->ops->split(world, group, world->rank, &tpc));
    ckv_engine_config ec;
    ckv_cli_engine_config(&opts, world, &ec);
    ec.tokenizer = tok;
    ckv_engine eng;
    ckv_cli_check_comm(world, ckv_engine_init(&eng, &ec, tpc));
    ckv_model *m = eng.model;
    const ckv_model_config *c = &m->cfg;

    /* the request: every question on every rank is checked; each group runs its share */
    ckv_question qs[64];
    for (int i = 0; i < a.n_questions; i++) qs[i] = (ckv_question){q[i], n_q[i], 0};
    ckv_request req = {0};
    req.context = ctx;
    req.n_context = n_ctx;
    req.questions = qs;
    req.n_questions = a.n_questions;
    req.press = &a.press;
    req.query_aware = a.press.query_aware;
    req.gen.sampling = a.sampling;
    req.gen.max_new_tokens = a.max_new;
    req.gen.ignore_eos = a.ignore_eos;
    req.gen.decode_press = a.has_decode ? &a.decode : NULL;
    req.cache_in = a.load_cache;
    req.cache_out = group == 0 ? a.save_cache : NULL;
    ckv_cli_check_comm(world, ckv_request_check(&eng, &req));
    int compress = a.press.scorer != CKV_SCORER_NONE;
    if (world->rank == 0 && compress) fprintf(stderr, "ckv: press %s\n", a.press.spec);
    if (world->rank == 0 && a.has_decode) fprintf(stderr, "ckv: decode press %s\n", a.decode.spec);
    req.dump_kept = a.dump_kept != NULL;
    if (a.dump_kept && world->rank == 0 && !(req.dump_file = fopen(a.dump_kept, "w")))
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--dump-kept: cannot write '%s'", a.dump_kept));

    /* answers of all work items: [n_items, 1 + max_new] (count, ids), summed over the world at the end */
    int n_items = a.n_questions ? a.n_questions : 1;
    size_t stride = (size_t)a.max_new + 1;
    int32_t *answers = calloc((size_t)n_items * stride, sizeof(int32_t));
    if (!answers) ckv_cli_die("out of memory");
    ckv_question mine[64];
    int index[64], n_mine = 0;
    for (int i = group; i < a.n_questions; i += n_groups) {
        index[n_mine] = i;
        mine[n_mine++] = qs[i];
    }
    if (a.n_questions == 0) index[0] = 0;
    answer_ctx ac;
    memset(&ac, 0, sizeof ac);
    ac.world = world;
    ac.cfg = c;
    ac.tok = tok;
    ac.stream = n_groups == 1 && world->rank == 0;
    ac.dump_path = a.dump_logits;
    ac.cur = -1;
    ac.index = index;
    ac.answers = answers;
    ac.stride = stride;
    if (tok) {
        ac.cap = ckv_detok_stream_cap(tok);
        ac.piece = malloc(ac.cap);
        if (!ac.piece) ckv_cli_die("out of memory");
    }
    if (a.dump_logits && world->rank == 0 && !(ac.dump = fopen(a.dump_logits, "wb")))
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--dump-logits: cannot write '%s'", a.dump_logits));
    req.questions = mine;
    req.n_questions = n_mine;
    req.gen.on_token = on_token;
    req.gen.on_answer_end = on_answer_end;
    req.gen.cb_ctx = &ac;
    ckv_result res;
    memset(&res, 0, sizeof res);
    if (a.n_questions > 0 ? n_mine > 0 : group == 0) /* one prompt: group 0 works, the others wait */
        ckv_cli_check_comm(world, ckv_engine_run(&eng, &req, &res));
    const ckv_request_stats *rs = &res.stats;
    if (world->rank == 0 && a.load_cache)
        fprintf(stderr, "ckv: loaded a context of %ld tokens compressed with %s\n", rs->context_tokens, res.cache_press);
    if (world->rank == 0 && compress && !rs->compressed && rs->uncompressed_reason)
        fprintf(stderr, "ckv: the context of %ld tokens stays uncompressed: %s (press %s)\n", rs->context_tokens,
                rs->uncompressed_reason, a.press.spec);
    /* gather the answers: only each group's rank 0 contributes, so a sum assembles them */
    if (tpc->rank != 0) memset(answers, 0, (size_t)n_items * stride * sizeof(int32_t));
    if (n_groups > 1) {
        ckv_cli_check_comm(world, world->ops->allreduce_i32(world, answers, (size_t)n_items * stride, CKV_COMM_OP_SUM));
        if (world->rank == 0)
            for (int i = 0; i < n_items; i++) print_answer(&ac, answers + (size_t)i * stride + 1, answers[(size_t)i * stride]);
    }
    free(answers);
    free(ac.piece);
    if (ac.dump && fclose(ac.dump) != 0)
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--dump-logits: error writing '%s'", a.dump_logits));
    if (req.dump_file && fclose(req.dump_file) != 0)
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--dump-kept: error writing '%s'", a.dump_kept));

    if (world->rank == 0) {
        long need = rs->context_tokens + max_q + a.max_new;
        double pre_s = rs->prefill_seconds, dec_s = rs->decode_seconds;
        long pre_tok = rs->prefill_tokens, dec_tok = rs->decode_tokens;
        double evict_s = rs->score_seconds + rs->select_seconds + rs->compact_seconds;
        char b1[32], b2[32], b3[32], b4[32], b5[32];
        if (tpc->size > 1) {
            double per_tok = (pre_tok + dec_tok) > 0 ? (double)(tpc->bytes - rs->comm_bytes_compression) / (double)(pre_tok + dec_tok) : 0.0;
            fprintf(stderr, "ckv: tensor parallel %d: this rank sent %s to collectives (%s per token through the model; "
                    "%s for compression)\n", tpc->size, ckv_format_bytes((double)tpc->bytes, b1, sizeof b1),
                    ckv_format_bytes(per_tok, b2, sizeof b2), ckv_format_bytes((double)rs->comm_bytes_compression, b3, sizeof b3));
        }
        fprintf(stderr, "ckv: prefill %ld tokens in %.3f s (%.1f tok/s); decode %ld tokens in %.3f s (%.2f tok/s)\n",
                pre_tok, pre_s, pre_s > 0 ? pre_tok / pre_s : 0.0, dec_tok, dec_s, dec_s > 0 ? dec_tok / dec_s : 0.0);
        if (rs->compressed) {
            fprintf(stderr,
                    "ckv: KV cache of the context %s -> %s on this rank (%.1f%% of entries kept); eviction %.3f s "
                    "(scoring %.3f, selection %.3f, compaction %.3f) = %.1f%% of prefill time\n",
                    ckv_format_bytes((double)rs->kv_bytes_full, b1, sizeof b1),
                    ckv_format_bytes((double)rs->kv_bytes_kept, b2, sizeof b2),
                    rs->total_entries ? 100.0 * (double)rs->kept_entries / (double)rs->total_entries : 100.0, evict_s,
                    rs->score_seconds, rs->select_seconds, rs->compact_seconds, pre_s > 0 ? 100.0 * evict_s / pre_s : 0.0);
        }
        if (a.has_decode)
            fprintf(stderr, "ckv: decode-time compression: %d compressions evicted %ld entries on this rank in %.3f s\n",
                    rs->decode_compressions, rs->decode_evicted_entries, rs->decode_compress_seconds);
        fprintf(stderr, "ckv: peak memory %s RSS; weights %s, KV cache %s in use; session buffers %s with --chunk %d (one-shot prefill: %s)\n",
                ckv_format_bytes((double)ckv_mem_peak_rss(), b1, sizeof b1),
                ckv_format_bytes((double)m->weight_bytes, b2, sizeof b2),
                ckv_format_bytes((double)rs->kv_bytes_peak, b3, sizeof b3),
                ckv_format_bytes((double)rs->session_bytes, b4, sizeof b4), rs->chunk ? rs->chunk : ec.chunk,
                ckv_format_bytes((double)ckv_session_bytes_for(m, (int)need, (int)need), b5, sizeof b5));
        ckv_backend_mem mu = {0};
        const int has_dev = ckv_backend_supports(m->be, CKV_BACKEND_CAP_MEM_USAGE);
        if (has_dev) {
            m->be->ops->mem_usage(m->be, &mu);
            fprintf(stderr, "ckv: device memory peak %s in ckv's buffers and workspaces (the device's used memory then: %s)\n",
                    ckv_format_bytes((double)mu.peak_bytes, b1, sizeof b1),
                    ckv_format_bytes((double)mu.device_used_at_peak_bytes, b2, sizeof b2));
        }
        if (a.stats_json) write_stats_json(a.stats_json, rs, &a.press, tpc, has_dev ? &mu : NULL);
    }
    ckv_result_free(&res);
    ckv_engine_free(&eng);
    ckv_comm_free(tpc);
    ckv_comm_free(world);
    ckv_tokenizer_free(tok);
    free(ctx);
    for (int i = 0; i < a.n_questions; i++) free(q[i]);
    return 0;
}
