/* sched.h - the scheduler of a serving loop: up to max_slots requests at once, each a context to
 * prepare (restore, or prefill + compress) followed by n choices of an answer. Each ckv_sched_turn
 * runs ONE unit of engine work: the next layer of the oldest request still being prepared (a
 * restored context is one unit), the question and first token of a choice, or one batched decode
 * step feeding every answering request. A decode step runs when answering requests have waited
 * interleave_s since the last one began and the previous unit was not a decode (so with
 * interleave_s 0 prefill layers and decode steps alternate), or when nothing is being prepared: the
 * running streams keep flowing during a long prefill, and no work runs inside another.
 *
 * Short contexts are prefilled together (ckv_sched_batch_prefill): when the oldest request being
 * prepared has a context of at most long_prompt tokens, that turn takes every waiting context that
 * short, oldest first, within prefill_tokens tokens in all, and prefills them in ONE forward (each
 * with its own press, exec.prefill); their first tokens follow in the same turn. A longer context
 * prefills alone, one layer per turn as above.
 *
 * The work goes through an executor (ckv_sched_exec: a table of the engine steps over the slots'
 * lanes), which a server implements by broadcasting each step to its tensor-parallel group before
 * running it, so every rank runs the same steps in the same order and none recurses. What a turn
 * produced comes back as events (a prepared context, an answer that changed, a failure) for the
 * caller to turn into responses; the scheduler never calls into its caller.
 *
 * Lifetimes are explicit: a request belongs to the scheduler from ckv_sched_admit until the event
 * with `done` set (then its slot is free and its lane released); the scheduler never reads a
 * request's `user` pointer, and the caller must keep the request's arrays alive until `done`.
 * Sampling happens in one place (take_token in sched.c: the request's logit processing, then
 * ckv_answer_state_sample on the slot's sampler and answer state); a decode step whose every lane
 * samples plainly (no log-probabilities, logit processing or min_p) draws the same uniforms from the
 * same samplers and has the device pick the same tokens (exec.decode_ids), so only ids leave it.
 * It does not own the queue of waiting requests, parse anything, or lock: one thread drives it. */
#ifndef CKV_ENGINE_SCHED_H
#define CKV_ENGINE_SCHED_H

#include <stddef.h>
#include <stdint.h>

#include "engine/batch.h"
#include "engine/answer.h"
#include "engine/logits.h"
#include "engine/request.h"
#include "engine/sampler.h"

/* What a prepared context reports (a server's store hit, entries and bytes of its group). */
typedef struct {
    int hit, from_disk;             /* restored instead of prefilled; the hit came from a file */
    int compressed;
    const char *uncompressed_reason; /* static text or NULL */
    long kept_entries, total_entries;
    size_t kv_bytes_full, kv_bytes_kept;
    int batch;                      /* contexts of the batched forward that prefilled it (0: alone, or restored) */
    int batch_first;                /* 1 on the first context of that forward */
} ckv_sched_prepared;

/* The engine steps over lanes 0 .. max_slots-1 (one prepared context each). */
typedef struct {
    /* lane `slot` starts preparing context ids [n] (the last question_rows of them a question compressed
     * with it, see ckv_prepare_params) with room for `reserve` tokens, questions
     * prefilled in chunks of `chunk`, for `answers` answers, each compressed while it decodes by
     * `decode` (NULL: none; the executor runs it inside its decode steps and prepares the context
     * again at the rewind after an answer that cut it); *ready when it needs no layer step (a
     * restored context) */
    ckv_status (*prepare)(void *ctx, int slot, const ckv_press_config *press, const ckv_decode_press *decode, int answers,
                          const int32_t *ids, int n, int question_rows, int reserve, int chunk, int *ready);
    ckv_status (*advance)(void *ctx, int slot, int *ready);         /* the next layer of lane `slot` */
    void (*prepared)(void *ctx, int slot, ckv_sched_prepared *out);  /* a ready lane's report */
    const float *(*context_logits)(void *ctx, int slot);            /* [V] after the context */
    ckv_status (*question)(void *ctx, int slot, const int32_t *ids, int n, const float **logits); /* [V] */
    ckv_status (*decode)(void *ctx, const int *slots, const int32_t *tokens, int n, const float **logits); /* [n, V] */
    ckv_status (*rewind)(void *ctx, int slot);                      /* back to the context */
    void (*release)(void *ctx, int slot);                           /* frees the lane */
    void *ctx;
    /* a question of n <= CKV_LOGITS_ROWS ids keeping every position's logits: *rows [n, V] (NULL: no
     * request may ask for scored questions) */
    ckv_status (*score)(void *ctx, int slot, const int32_t *ids, int n, const float **rows);
    /* the lanes slots[n], each begun by `prepare` and not ready, prefilled in one forward (all ready
     * after it; on an error all are dropped). NULL: contexts are prefilled one layer per turn only. */
    ckv_status (*prefill)(void *ctx, const int *slots, int n);
    /* as decode, but each lane's next id is sampled on the device (picks[n]) and only ids[n] come back
     * (NULL: every step downloads its logits rows). Used for a step whose every lane samples plainly
     * (see ckv_sched_request.logprobs). */
    ckv_status (*decode_ids)(void *ctx, const int *slots, const int32_t *tokens, int n, const ckv_batch_pick *picks,
                             int32_t *ids);
} ckv_sched_exec;

/* Where a scored question's log-probabilities go (echo with logprobs): entry t is question id t's,
 * from the row before it (the context's last logits for t = 0), with its `top` most likely ids. */
typedef struct {
    float *lp;                      /* [n_q] */
    int32_t *top_ids;               /* [n_q, top] */
    float *top_lp;                  /* [n_q, top] */
    int top;
} ckv_sched_score;

/* One request (the pointers must stay valid until its `done` event). */
typedef struct {
    const int32_t *ctx_ids;         /* [n_ctx] the context (compressed and reusable), n_ctx >= 1 */
    int n_ctx;
    int ctx_question_rows;          /* the last rows of ctx_ids that are a question compressed with the context
                                     * (query-aware; 0: none): it answers from the context's logits */
    const int32_t *q_ids;           /* [n_q] the question after the context (may be empty) */
    int n_q;
    const ckv_press_config *press;  /* scorer none: the full cache */
    const ckv_decode_press *decode_press; /* decode-time compression of every choice (NULL: none) */
    ckv_sampler_config sampling;    /* one sampler runs through the choices */
    int max_tokens, n_choices, ignore_eos;
    const char *const *stop_strings;
    int n_stop_strings;
    const ckv_logits_config *logits; /* logit_bias, penalties, grammar (NULL: none) */
    const ckv_grammar_vocab *grammar; /* the vocabulary's bytes when logits->grammar */
    const ckv_sched_score *score;   /* non-NULL: the first choice's question is fed scored (exec.score) */
    /* 1: every ANSWER event of a decoded token carries the model's row (event.logits, for
     * log-probabilities). 0: a decode step whose every lane has no logit processing (no bias, penalty
     * or grammar) and no min_p samples on the device (exec.decode_ids) and its events carry no row. */
    int logprobs;
    void *user;                     /* the caller's (never read) */
} ckv_sched_request;

typedef enum {
    CKV_SCHED_PREPARED = 1,         /* the context is ready (info) */
    CKV_SCHED_ANSWER,               /* the choice's answer changed: a token (token >= 0) and/or its end */
    CKV_SCHED_FAILED                /* the request failed (status, err); done */
} ckv_sched_event_kind;

typedef struct {
    ckv_sched_event_kind kind;
    int slot, choice;
    void *user;
    int32_t token;                  /* ANSWER: the sampled id (-1: the answer ended without one) */
    const float *logits;            /* ANSWER with a token: the model's row [V] that chose it (until the next
                                     * turn); NULL for a token sampled on the device (request.logprobs 0) */
    const ckv_answer_state *answer; /* ANSWER: valid until the next turn or admit */
    int done;                       /* the request is over: its slot is free */
    ckv_sched_prepared info;        /* PREPARED */
    ckv_status status;              /* FAILED */
    char err[400];
} ckv_sched_event;

typedef enum { CKV_SLOT_FREE = 0, CKV_SLOT_PREPARE, CKV_SLOT_PREFILL, CKV_SLOT_QUESTION, CKV_SLOT_DECODE } ckv_slot_phase;

typedef struct {
    ckv_slot_phase phase;
    ckv_sched_request req;
    unsigned long seq;              /* admission order: the oldest is prepared first */
    int choice;
    int cancel;                     /* ckv_sched_cancel was called */
    ckv_sampler sampler;
    int sampler_ready;
    ckv_answer_state answer;
    ckv_logits lp;                  /* the request's logit processing */
    int32_t next;                   /* the token the next decode step feeds */
} ckv_sched_slot;

typedef struct {
    ckv_engine *engine;
    ckv_sched_exec exec;
    int max_slots;
    int chunk;                      /* prefill chunk of a question after a restored context */
    double interleave_s;
    int prefill_tokens;             /* a batched prefill takes at most this many context tokens (0: none) */
    int long_prompt;                /* a longer context prefills alone, one layer per turn */
    ckv_sched_slot *slots;          /* [max_slots] */
    ckv_sched_event *events;        /* [2 * max_slots + 2] the last turn's */
    int n_events;
    int *step_slot;                 /* [max_slots] a decode step's lanes */
    int32_t *step_tok;              /* [max_slots] and tokens */
    ckv_batch_pick *step_pick;      /* [max_slots] how the device samples each lane (exec.decode_ids) */
    int32_t *step_ids;              /* [max_slots] and what it sampled */
    long device_steps;              /* decode steps sampled on the device (statistics) */
    unsigned long admit_seq;
    int last_was_decode;
    double t_last_decode;
} ckv_sched;

ckv_status ckv_sched_init(ckv_sched *s, ckv_engine *e, const ckv_sched_exec *exec, int max_slots, double interleave_s);
/* Short contexts of at most long_prompt tokens are prefilled together, at most max_tokens tokens in
 * one forward (see above; the executor's prefill must take that many); max_tokens 0: every context
 * prefills alone. Refused: long_prompt outside 1 .. max_tokens, or an executor without prefill. */
ckv_status ckv_sched_batch_prefill(ckv_sched *s, int max_tokens, int long_prompt);
/* Frees the slots (no events; the lanes are the executor's to free). Accepts zeroed and partial
 * objects. */
void ckv_sched_free(ckv_sched *s);

/* Takes a request into a free slot (*slot; -1 when none is free, nothing taken). Sampling or stop
 * strings the engine cannot use are an error (nothing taken). */
ckv_status ckv_sched_admit(ckv_sched *s, const ckv_sched_request *r, int *slot);
/* The request in `slot` ends (finish CANCELLED) at the start of the next turn. */
void ckv_sched_cancel(ckv_sched *s, int slot);
int ckv_sched_busy(const ckv_sched *s);  /* requests held */

/* Runs pending cancellations and one unit of work; returns the number of events (s->events),
 * 0 when there was nothing to do. */
int ckv_sched_turn(ckv_sched *s);

#endif
