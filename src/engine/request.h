/* request.h - the engine request API: the one path from token ids to generated ids that every command
 * (generate, eval, fidelity, analyze; later serve) takes. An engine is a loaded model on a backend
 * inside one tensor-parallel group, with its defaults (prefill chunk, stop ids). A request is a
 * context, questions, a press and budget, sampling, stops, a token limit and a token callback; its
 * result is the generated ids of every question with a finish reason, plus statistics.
 *
 * Compress once, ask many: ckv_engine_prepare prefills (and compresses) a context into a prepared
 * context (ckv_prepared) that keeps the compressed cache (or, resumable, ckv_engine_prepare_begin
 * and then one layer per ckv_prepared_advance, so a scheduler can run other work between layers); ckv_prepared_answer then answers any number
 * of questions from it, each rewound afterwards so the next one sees the same compressed cache.
 * ckv_engine_run does a whole request with those two calls (query-aware: one prepared context per
 * question, context + question compressed together).
 *
 * Short contexts are not an error: when the press cannot or need not compress a context (a windowed
 * scorer with L <= window, L < 2, or a budget that keeps every token), the context stays
 * uncompressed and the stats say so (compressed = 0, uncompressed_reason).
 *
 * Every rank of the tensor-parallel group must make the same calls with the same arguments (the
 * forward pass issues collectives). Errors are distinct status codes (CKV_STATUS_ERR_CONTEXT_TOO_LONG
 * for a request that does not fit the model's window), so callers never read message text.
 * It does not tokenise prompts, parse flags or print; it does not pick ranks or devices. */
#ifndef CKV_ENGINE_REQUEST_H
#define CKV_ENGINE_REQUEST_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "comm/comm.h"
#include "core/status.h"
#include "engine/answer.h"
#include "engine/batch.h"
#include "engine/compress.h"
#include "engine/decode_press.h"
#include "engine/prefill_batch.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "evict/press.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

#define CKV_ENGINE_MAX_STOP_IDS 32   /* default stop ids of an engine (model eos + tokenizer end-of-turn) */

/* ---- engine --------------------------------------------------------------------------------------- */

/* Everything that shapes how a model is loaded and run. This struct is the single place where the
 * command line hands the runtime settings over to the engine (ckv_engine_init reads nothing else). */
typedef struct {
    const char *model_path;         /* model directory or GGUF file */
    const char *backend;            /* "cpu" (NULL) or "cuda" */
    int threads;                    /* host threads (0: all cores) */
    int device;                     /* GPU index (-1: the node-local rank's; cuda only) */
    /* KV cache element type: F32, F16, BF16, or CKV_DTYPE_DEFAULT (the backend's: f32 on cpu, bf16 on
     * cuda). A zeroed config asks for F32: set DEFAULT to leave it to the backend. */
    ckv_dtype kv_dtype;
    /* weight element type: F32, BF16, F16 (every matrix converted to it), or CKV_DTYPE_DEFAULT (a
     * matrix the backend computes as stored stays so, the others take the backend's weight dtype) */
    ckv_dtype weights_dtype;
    int chunk;                      /* prefill chunk in tokens (0: 512) */
    int random_weights;             /* 1: weights drawn from random_seed (model_path needs only config.json) */
    uint64_t random_seed;
    const ckv_tokenizer *tokenizer; /* optional (not owned): its end-of-turn ids join the stop ids; needed
                                     * for stop strings */
} ckv_engine_config;

typedef struct {
    ckv_engine_config cfg;
    ckv_backend *be;        /* owned unless the engine wraps a model (ckv_engine_wrap) */
    ckv_model *model;
    ckv_comm *tp;           /* the tensor-parallel group (not owned; NULL: one rank) */
    ckv_comm *tp_dev;       /* owned: the group's device communicator (host memory moved directly, NCCL,
                             * or staged when ranks share a GPU) with more than one rank; the model and
                             * the presses use it */
    int owns;               /* 1: ckv_engine_free frees model and backend */
    int32_t stop_ids[CKV_ENGINE_MAX_STOP_IDS]; /* model eos ids, then the tokenizer's end-of-turn ids */
    int n_stop_ids;
} ckv_engine;

/* Creates the backend and loads this rank's share of the model for the group `tp` (NULL: one rank).
 * kv_dtype and weights_dtype other than CKV_DTYPE_DEFAULT that the backend cannot provide are refused
 * with ERR_UNSUPPORTED naming the flag. */
ckv_status ckv_engine_init(ckv_engine *e, const ckv_engine_config *cfg, ckv_comm *tp);
/* An engine over a model loaded elsewhere (not owned): tests and tools that hold a ckv_model. */
ckv_status ckv_engine_wrap(ckv_engine *e, ckv_model *m, int chunk, const ckv_tokenizer *tok);
void ckv_engine_free(ckv_engine *e); /* accepts zeroed and partial objects */

/* A model's configuration alone (config.json, or a GGUF file's metadata); no weights are read. */
ckv_status ckv_engine_read_config(const char *model_path, ckv_model_config *cfg);

/* ---- a prepared context (compress once, ask many) -------------------------------------------------- */

/* Called after each sampled token (on every rank of the group). question: the index in the request
 * (or the one passed to ckv_prepared_answer); is_stop: the token ends the answer (an eos or stop id;
 * it is not stored in the answer's ids); logits [V] the row it was sampled from (host). Return non-zero
 * to cancel: the answer ends with CKV_FINISH_CANCELLED (the callback must return the same on every
 * rank of a tensor-parallel group). */
typedef int (*ckv_token_callback)(void *ctx, int question, int32_t token, int is_stop, const float *logits);

typedef struct {
    const int32_t *ids;             /* the context [n] (NULL with cache_in) */
    int n;
    const ckv_press_config *press;  /* NULL or scorer none: the full cache */
    int question_rows;              /* query-aware: the last rows of ids that are the question (finch's window) */
    int reserve;                    /* tokens the session holds beyond the context: longest question + answer */
    const char *cache_in;           /* load the (compressed) context from this cache file instead of ids */
    const char *cache_out;          /* save the compressed context to this cache file (with question_rows: the question
                                       and the prompt's last logits too, so a load answers without a question) */
    int dump_kept;                  /* log kept positions (set on every rank; rank 0 writes to dump_file) */
    FILE *dump_file;
    /* analysis: a layer hook run instead of the press's (the session keeps the attention inputs) */
    ckv_layer_hook hook;
    void *hook_ctx;
} ckv_prepare_params;

typedef struct ckv_answer ckv_answer;

typedef struct {
    ckv_sampler_config sampling;    /* temperature 0: greedy */
    int max_new_tokens;             /* >= 0 */
    int ignore_eos;                 /* the engine's default stop ids do not end the answer */
    const int32_t *stop_ids;        /* extra ids that end the answer (finish STOP) */
    int n_stop_ids;
    const char *const *stop_strings; /* text that ends the answer once generated (needs the engine's tokenizer) */
    int n_stop_strings;
    ckv_token_callback on_token;    /* may be NULL */
    /* decode-time compression (NULL: none): every dp->interval decode steps the whole cache, context
     * included, is cut to the target (engine/decode_press.h); an answer that cut it leaves its prepared
     * context spent (the context rows are gone): ckv_engine_run prepares the context again for the
     * next question */
    const ckv_decode_press *decode_press;
    /* called once when an answer has ended (after its last on_token), may be NULL */
    void (*on_answer_end)(void *ctx, int question, const ckv_answer *a);
    void *cb_ctx;
} ckv_gen_params;

struct ckv_answer {
    int32_t *ids;                   /* [n] generated ids (malloc'd), without the stopping token */
    int n;
    int32_t stop_id;                /* the token that ended the answer (-1: none) */
    ckv_finish_reason finish;
    double seconds;                 /* question prefill + decode */
    double ttft_seconds;            /* question prefill + first sample */
};

void ckv_answer_free(ckv_answer *a); /* accepts zeroed objects */

typedef struct {
    long prompt_tokens;             /* tokens prefilled (contexts + questions) */
    long reused_tokens;             /* context tokens taken from a cache instead of prefilled */
    long context_tokens;            /* tokens of the (last) context */
    int compressed;                 /* 1: the press compressed the context(s) */
    const char *uncompressed_reason; /* why a press did not compress (static text), or NULL */
    long kept_entries, total_entries; /* context KV entries (rows x local heads) kept / before */
    size_t kv_bytes_full, kv_bytes_kept; /* context KV bytes on this rank before / after compression */
    size_t kv_bytes_peak;           /* most KV bytes in use at any point */
    size_t session_bytes;           /* buffers of the (last) session */
    int chunk;                      /* prefill chunk used */
    double prefill_seconds, decode_seconds, ttft_seconds;
    long prefill_tokens, decode_tokens;
    double score_seconds, select_seconds, compact_seconds;
    unsigned long long comm_bytes_compression; /* collective payload of the compression on this rank */
    int decode_compressions;        /* decode-time compressions that evicted rows (summed over answers) */
    long decode_evicted_entries;    /* rows x KV heads of the model they evicted */
    double decode_compress_seconds;
} ckv_request_stats;

typedef struct {
    ckv_engine *engine;
    ckv_session sess;
    ckv_compressor cz;
    int32_t *headkv;        /* [n_layers, n_kv_heads] headkv budgets or NULL */
    ckv_press_config press; /* the press as it runs on this prompt (ckv_press_with_question); cz.cfg */
    float *logits;          /* [V] host copy of the context's last logits (after cache_in: the file's, or NULL) */
    int question_inside;    /* 1: the question was compressed with the context (query-aware, or a cache file saved so):
                               answers start from logits and take no question of their own */
    int n_context;          /* positions the context occupies */
    int compressed;
    const char *uncompressed_reason;
    char cache_press[512];  /* the press recorded in cache_in's file */
    char cache_in[4096];    /* the cache file the context was loaded from ("" when prefilled), for its errors */
    double prepare_seconds;
    ckv_request_stats stats;
    /* the answers' decode steps where the backend records them (CKV_BACKEND_CAP_GRAPHS, tp 1): a batch of
     * this one session (engine/batch.h: a CUDA graph per key bound, replayed per token), made by the first
     * answer that decodes and freed with the context; NULL elsewhere (ckv_session_decode) */
    ckv_decode_batch *decoder;
    /* a prepare in progress (ckv_engine_prepare_begin .. the last ckv_prepared_advance) */
    int ready;              /* 1: prefilled (or loaded), compressed and marked: questions may follow */
    int spent;              /* 1: an answer's decode-time compression cut the context: no more questions */
    int dump_kept;          /* the prepare's dump_kept / dump_file, for decode-time compressions too */
    FILE *dump_file;
    ckv_layer_hook hook;    /* run after each layer of the context (the press's or the caller's) */
    void *hook_ctx;
    const char *cache_out;  /* the caller's (kept until the prepare is ready) */
    const char *press_spec;
} ckv_prepared;

/* Prefills (and compresses) a context into *pc (a fresh session of n + reserve tokens). The request
 * must fit the model: n + reserve > max_position_embeddings is ERR_CONTEXT_TOO_LONG. */
ckv_status ckv_engine_prepare(ckv_engine *e, const ckv_prepare_params *p, ckv_prepared *pc);

/* The same in steps: begin validates, sizes the session and embeds the context (p->ids are not read
 * afterwards; p->press, p->hook_ctx and p->cache_out must live until pc->ready); a context loaded
 * from cache_in is ready at once. Each ckv_prepared_advance then runs one layer of the context (and
 * its compression) and, after the last, the logits, cache_out and the mark: *ready = pc->ready.
 * A prepare that is not ready takes no question and no decode; ckv_prepared_free drops it at any
 * point. Every rank of the group must make the same calls. On an error *pc is freed. */
ckv_status ckv_engine_prepare_begin(ckv_engine *e, const ckv_prepare_params *p, ckv_prepared *pc);
ckv_status ckv_prepared_advance(ckv_prepared *pc, int *ready);

/* The prefills of several contexts begun with ckv_engine_prepare_begin (no layer advanced yet; each
 * with its own press) in one forward (engine/prefill_batch.h): each context ends ready as after its
 * own last ckv_prepared_advance, with the same kept rows and logits. On an error every one of them is
 * freed. Every rank of the group must make the same call. */
ckv_status ckv_prepared_advance_batch(ckv_prepared *const *pcs, int n, ckv_prefill_batch *b);

/* Answers one question (ids [n], n may be 0: continue from the context's last logits) from the
 * prepared context, then rewinds to it. `question` is passed to the callback. A question that does
 * not fit the session (n + max_new_tokens > reserve) is ERR_CONTEXT_TOO_LONG. With stop strings the
 * engine needs a tokenizer (ERR_ARG otherwise). The decode steps run as the server's batched step of
 * one row (pc->decoder: recorded and replayed, the logits downloaded for the host sampler) where the
 * backend records steps at tp 1, else as ckv_session_decode; ids and logits of either path do not
 * depend on whether a graph ran. */
ckv_status ckv_prepared_answer(ckv_prepared *pc, int question, const int32_t *ids, int n, const ckv_gen_params *g,
                               ckv_sampler *sampler, ckv_answer *out);

/* Teacher forcing: feeds ids [n] after the prepared context and writes every position's logits
 * [n, V] (host) to all_logits; then rewinds. */
ckv_status ckv_prepared_forward(ckv_prepared *pc, const int32_t *ids, int n, float *all_logits);

void ckv_prepared_free(ckv_prepared *pc); /* accepts zeroed and partial objects */

/* Fills pc->stats from a ready context: token counts (prefilled: the context was computed here, else
 * reused), compression and its costs, session and KV bytes. */
void ckv_prepared_fill_stats(ckv_prepared *pc, int prefilled);

/* ---- a whole request ------------------------------------------------------------------------------- */

typedef struct {
    const int32_t *ids;
    int n;
    int max_new_tokens;             /* 0: the request's */
} ckv_question;

typedef struct {
    const int32_t *context;         /* [n_context] (NULL with cache_in) */
    int n_context;
    const ckv_question *questions;  /* [n_questions]; none: one answer continuing the context */
    int n_questions;
    const ckv_press_config *press;  /* NULL: the full cache */
    int query_aware;                /* compress context + question together, one prepared context each */
    ckv_gen_params gen;             /* sampling, stops, limits, callback; one sampler seeded once runs the
                                     * questions in order */
    const char *cache_in, *cache_out; /* see ckv_prepare_params (context-only requests) */
    int dump_kept;
    FILE *dump_file;
} ckv_request;

typedef struct {
    ckv_answer *answers;            /* [n_answers] (max(1, n_questions)) */
    int n_answers;
    ckv_request_stats stats;
    char cache_press[512];          /* the press of cache_in's file */
} ckv_result;

/* Validates and runs a request on every rank of the engine's group. */
ckv_status ckv_engine_run(ckv_engine *e, const ckv_request *r, ckv_result *out);
void ckv_result_free(ckv_result *r); /* accepts zeroed objects */

/* The capacity check of a request without running it: ERR_CONTEXT_TOO_LONG when context + longest
 * question + max new tokens (query-aware: per question) exceed the model's window. */
ckv_status ckv_request_check(const ckv_engine *e, const ckv_request *r);

#endif
