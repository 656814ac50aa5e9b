/* srv_job.h - one HTTP request as the engine thread sees it: the prompt already split into context and
 * question ids, the press, sampling and limits (fixed at submit), and its progress (generated ids and
 * text per choice, finish reasons, usage) that the engine thread writes and the HTTP thread reads
 * under the job's mutex. Every buffer the engine thread writes is sized at creation, so nothing is
 * allocated while decoding. Two references (HTTP side and engine side); the last release frees it.
 * It does not parse JSON (srv_api.c) or schedule (srv_sched.c). */
#ifndef CKV_SRV_JOB_H
#define CKV_SRV_JOB_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/logits.h"
#include "engine/request.h"
#include "engine/sched.h"
#include "engine/toolcall.h"
#include "evict/press.h"

#define CKV_SRV_MAX_STOP 4
#define CKV_SRV_MAX_CHOICES 8
#define CKV_SRV_MAX_TOOLS 128 /* tools of one request (OpenAI's limit) */

typedef struct {
    int32_t *ids;           /* [max_tokens] generated ids (without the stopping token) */
    int n_ids;
    char *text;             /* [text_cap] generated text */
    size_t text_len, text_cap;
    size_t safe_len;        /* text that can be streamed: no stop string can start before it */
    ckv_finish_reason finish; /* NONE while running */
    /* logprobs (NULL unless the request asked for them), one entry per generated id */
    float *lp;              /* [max_tokens] log-probability of each generated token */
    int32_t *top_ids;       /* [max_tokens, top_logprobs] the most likely tokens at each step */
    float *top_lp;          /* [max_tokens, top_logprobs] */
    uint32_t *tok_end;      /* [max_tokens] text_len after each token (which text a token's logprob goes with) */
} ckv_srv_choice;

typedef enum { CKV_SRV_COMPLETION = 0, CKV_SRV_CHAT } ckv_srv_kind;

typedef struct ckv_srv_job {
    /* the request (immutable after submit) */
    ckv_srv_kind kind;
    int32_t *ctx_ids;       /* [n_ctx] the context (what is compressed and reused) */
    int n_ctx;
    int32_t *q_ids;         /* [n_q] the question fed after the (compressed) context; may be empty */
    int n_q;
    int ctx_question_rows;  /* query_aware: the last rows of ctx_ids are the question, compressed with the context
                             * (0: none) */
    ckv_press_config press; /* scorer none: the full cache */
    ckv_decode_press decode; /* decode-time compression of every choice (has_decode) */
    int has_decode;
    ckv_sampler_config sampling;
    ckv_logits_config logits; /* logit_bias, penalties, and the grammar (logits.grammar: &grammar or NULL) */
    ckv_grammar grammar;    /* response_format / grammar compiled (zeroed when none) */
    int logprobs;           /* 1: report each token's log-probability (values: log-softmax of the model's row) */
    int top_logprobs;       /* 0..CKV_LOGPROBS_MAX_TOP most likely alternatives per token */
    int echo;               /* completions: the answer starts with the prompt (the "prompt" field) */
    int32_t *echo_ids;      /* [n_echo] the echoed prompt ids (a copy) */
    int n_echo;
    char *echo_text;        /* [echo_len] their text */
    size_t echo_len;
    int echo_scored;        /* the echoed ids are the question fed with all its logits (echo + logprobs) */
    float *echo_lp;         /* [n_echo] their log-probabilities (echo_scored; NaN: the first token of the prompt) */
    int32_t *echo_top_ids;  /* [n_echo, top_logprobs] */
    float *echo_top_lp;     /* [n_echo, top_logprobs] */
    ckv_sched_score score;  /* echo_scored: where the scheduler writes the question's (the echo after its
                             * first n_echo - n_q ids, which have none: NaN) */
    int max_tokens, n_choices, ignore_eos;
    char *stop[CKV_SRV_MAX_STOP];
    int n_stop;
    size_t stop_max_len;
    int stream, include_usage;
    /* tool calls (chat with "tools"): the syntax answers are parsed with (NULL: no parsing, as with
     * tool_choice "none"); one call at most unless parallel; the stream's parsers, one per choice,
     * owned by the HTTP side */
    const ckv_toolcall_syntax *tool_syntax;
    int parallel_tool_calls;
    ckv_toolcall_parser *tool_parsers; /* [n_choices] when streaming */
    char id[48];
    long created;
    double t_submit;
    /* progress, written by the engine thread under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ckv_srv_choice choices[CKV_SRV_MAX_CHOICES];
    int done;               /* every choice finished (or the job failed) */
    ckv_status status;      /* != OK: the job failed with err */
    char err[512];
    int cancelled;          /* set by the HTTP side (client gone, shutdown); read by the engine thread */
    double t_first;         /* first token produced (0: none yet) */
    /* usage */
    long prompt_tokens, reused_tokens, completion_tokens;
    long kept_entries, total_entries;
    size_t kv_bytes_full, kv_bytes_kept;
    int compressed, cache_hit;
    const char *uncompressed_reason;
    int decode_compressions;  /* decode-time compressions that evicted rows, summed over the choices */
    long decode_evicted_entries; /* rows x KV heads they evicted */
    int refs;
} ckv_srv_job;

/* A job for n_choices x max_tokens tokens whose text pieces are at most piece_cap bytes; ctx and q
 * are taken over (malloc'd arrays). stop strings are copied. */
ckv_status ckv_srv_job_create(ckv_srv_job **out, int max_tokens, int n_choices, size_t piece_cap);
/* Sizes the logprob buffers of every choice (top_logprobs alternatives per token) and, when
 * echo_scored, those of the n_echo echoed ids; sets j->logprobs. */
ckv_status ckv_srv_job_alloc_logprobs(ckv_srv_job *j, int top_logprobs);
void ckv_srv_job_release(ckv_srv_job *j); /* drops one reference; NULL is fine */

/* Marks the job failed with the current library error message (engine thread). */
void ckv_srv_job_fail(ckv_srv_job *j, ckv_status st);

#endif
