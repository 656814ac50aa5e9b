/* srv_step.h - the engine work of `ckv serve` as steps that every rank of the tensor-parallel group
 * runs in the same order: begin preparing a context (store restore, or the start of a prefill), the
 * next layer of a context being prepared, the whole prefill of several begun contexts in one forward,
 * feed a question, one batched decode step (then each lane's decode-time compression when its interval
 * is due), rewind (restoring a context that decode-time compression cut), release.
 * Each slot of the scheduler has a lane here (its prepared context) on every rank; a lane is empty,
 * preparing (layers left) or ready, and every step names what it needs (a question only on a ready
 * lane, a layer only on a preparing one), checked on every rank. On rank 0 (the leader, which owns
 * HTTP and the scheduler) each step is first broadcast to the group (a small header, then the ids it
 * needs) and then run; the other ranks (followers) receive steps in ckv_srv_steps_follow, one flat
 * loop, and run the same function. After every step that computes, the ranks exchange their status,
 * so a failure on any rank fails the step everywhere and the scheduler fails the request; the ranks
 * never diverge. With one rank nothing is sent. While idle the leader sends a heartbeat step, so that
 * the followers' waits never reach the communicator's timeout. ckv_srv_steps_exec is this work as
 * the engine scheduler's executor (engine/sched.h). It does not sample, detokenise or know about
 * HTTP jobs; it does not choose what runs. */
#ifndef CKV_SRV_STEP_H
#define CKV_SRV_STEP_H

#include <stdint.h>

#include "engine/batch.h"
#include "engine/request.h"
#include "engine/sched.h"
#include "server/srv_store.h"

typedef struct {
    ckv_prepared pc;        /* zeroed: empty; pc.ready: questions may follow */
    ckv_press_config press; /* the press the prepare runs (pc refers to it) */
    int32_t *ids;           /* [n] the context while it is prepared (for the store) */
    int n;
    ckv_sched_prepared info; /* ready: store lookup, entries and bytes summed over the group */
    /* decode-time compression of the lane's answers (decode.interval 0: none) */
    ckv_decode_press decode;
    ckv_decode_state ds;    /* the running answer's, sized when it starts (ready, rewind) */
    ckv_srv_entry *copy;    /* the context as prepared, for the next answer after one that cut it
                             * (kept only with a decode press and more than one answer) */
    int answers, reserve, chunk; /* of the prepare step (a re-preparation restores with the same) */
} ckv_srv_lane;

/* Decode-time compression of one slot's request since its prepare step, over the whole group. */
typedef struct {
    int compressions;       /* compressions that evicted rows, summed over the request's answers */
    long evicted_entries;   /* rows x KV heads of the model they evicted */
} ckv_srv_decode_stats;

typedef struct {
    ckv_engine *engine;
    ckv_comm *group;        /* the engine's tensor-parallel group (host collectives); NULL: one rank */
    int leader;             /* 1 on rank 0 of the group (or with one rank) */
    int max_batch;
    ckv_srv_lane *lanes;    /* [max_batch] */
    ckv_srv_store store;
    ckv_decode_batch batch;
    ckv_prefill_batch prefill; /* sized for max_batch_tokens (unused with 0) */
    int max_batch_tokens;
    ckv_prepared **step_pc; /* [max_batch] */
    ckv_session **step_sess; /* [max_batch] */
    int32_t *step_tok;      /* [max_batch] */
    unsigned char *msg;     /* [msg_cap] a step's payload as sent / received */
    float *score_logits;    /* [CKV_LOGITS_ROWS, V] every position's logits of a scored question step */
    size_t msg_cap;
    ckv_srv_decode_stats *decode_stats; /* [max_batch] per slot, reset by its prepare step (read by the leader) */
    int32_t *status_all;    /* [group size] every rank's status of the last step */
    int64_t *stats_all;     /* [group size, 4] every rank's context entries and bytes (prepare) */
    double t_last_sent;     /* when the leader last sent a step (heartbeats) */
    double heartbeat_s;     /* the leader sends a heartbeat after this long without a step */
} ckv_srv_steps;

/* Sizes lanes, the decode batch and the message buffer for `max_batch` slots and contexts up to the
 * model's window, and the batched prefill for max_batch_tokens context tokens (0: none); opens the
 * store. Every rank of the group calls it; the ranks agree on the result (one rank's failure fails it
 * on all). */
ckv_status ckv_srv_steps_init(ckv_srv_steps *s, ckv_engine *e, int max_batch, int max_batch_tokens, size_t cache_bytes,
                              const char *cache_dir);
void ckv_srv_steps_free(ckv_srv_steps *s); /* accepts zeroed and partial objects; frees every lane */

/* ---- steps (the leader calls these; followers run them from ckv_srv_steps_follow) ---- */

/* Lane `slot` gets the context ids [n] with `press` (the last question_rows of them a question compressed
 * with the context, query-aware: a cache file in the store records it as ckv generate's does): restored
 * from the store when it holds it (ready at once), else its prefill begins; `reserve` tokens of room for question and answer, questions
 * prefilled in chunks of `chunk`. *ready: the lane is ready (lanes[slot].info says how). `decode`
 * (NULL: none) compresses each of its `answers` answers inside the decode steps, every `interval`
 * steps of that answer; the stored context is the one prepared, and a rewind after an answer that
 * cut the context restores the lane's own copy of it. */
ckv_status ckv_srv_step_prepare(ckv_srv_steps *s, int slot, const ckv_press_config *press, const ckv_decode_press *decode,
                                int answers, const int32_t *ids, int n, int question_rows, int reserve, int chunk,
                                int *ready);
/* The next layer of the preparing lane `slot` (with its compression); after the last one the context
 * is stored and the lane is ready. */
ckv_status ckv_srv_step_advance(ckv_srv_steps *s, int slot, int *ready);
/* The preparing lanes slots[n] (prefill begun, no layer run) prefilled in one forward, each with its
 * own press; after it every one is ready and stored (on an error every one is freed). */
ckv_status ckv_srv_step_prefill(ckv_srv_steps *s, const int *slots, int n);
/* Feeds the question ids [n] (n >= 1) to ready lane `slot`; *logits: the last position's [V]. */
ckv_status ckv_srv_step_question(ckv_srv_steps *s, int slot, const int32_t *ids, int n, const float **logits);
/* The same for n <= CKV_LOGITS_ROWS ids keeping every position's logits: *rows [n, V] (row t follows
 * ids[t]; scoring a prompt: echo with logprobs). */
ckv_status ckv_srv_step_score(ckv_srv_steps *s, int slot, const int32_t *ids, int n, const float **rows);
/* One forward feeding tokens[i] to ready lane slots[i] (i < n); *logits: [n, V] (host, until the next step).
 * Then each of those lanes with a decode press whose interval is due is compressed (the logits are
 * the forward's, from before the cut, as in ckv_prepared_answer). */
ckv_status ckv_srv_step_decode(ckv_srv_steps *s, const int *slots, const int32_t *tokens, int n, const float **logits);
/* The same with lane slots[i]'s next id sampled on the device as picks[i] says: ids[i] (host); the
 * logits never leave the device (the followers keep theirs there too). */
ckv_status ckv_srv_step_decode_ids(ckv_srv_steps *s, const int *slots, const int32_t *tokens, int n,
                                   const ckv_batch_pick *picks, int32_t *ids);
/* Drops what ready lane `slot` holds after its context (the next choice starts from the context; after
 * an answer whose decode-time compression cut the context, the lane's copy is restored). */
ckv_status ckv_srv_step_rewind(ckv_srv_steps *s, int slot);
/* Frees lane `slot` in any state (an empty lane is fine). */
void ckv_srv_step_release(ckv_srv_steps *s, int slot);
/* Leader, idle: sends a heartbeat when none was sent for heartbeat_s (nothing with one rank). */
void ckv_srv_step_idle(ckv_srv_steps *s);
/* Leader, last step: the followers leave ckv_srv_steps_follow, returning OK when `failed` is 0. */
void ckv_srv_step_quit(ckv_srv_steps *s, int failed);

/* The steps as the engine scheduler's executor (ctx = s). */
void ckv_srv_steps_exec(ckv_srv_steps *s, ckv_sched_exec *out);

/* Follower: runs the leader's steps until it quits. Returns OK, or an error when the leader quit
 * because it failed or a step could not be received. */
ckv_status ckv_srv_steps_follow(ckv_srv_steps *s);

#endif
