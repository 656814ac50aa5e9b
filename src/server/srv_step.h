/* srv_step.h - the engine work of `ckv serve` as steps that every rank of the tensor-parallel group
 * runs in the same order: prepare a context (store restore or prefill + compress), feed a question,
 * one batched decode step, rewind, release. Each slot of the scheduler has a lane here (its prepared
 * context) on every rank. On rank 0 (the leader, which owns HTTP and the scheduler) each step is first
 * broadcast to the group (a small header, then the ids it needs) and then run; the other ranks
 * (followers) receive steps in ckv_srv_steps_follow and run the same function. After every step that
 * computes, the ranks exchange their status, so a failure on any rank fails the step everywhere and
 * the leader's scheduler fails the request; the ranks never diverge. With one rank nothing is sent.
 * While idle the leader sends a heartbeat step, so that the followers' waits never reach the
 * communicator's timeout. A context's prefill pauses after every layer: the leader's between-layers
 * callback may run other steps there (decode steps of the running streams), each broadcast as usual,
 * then a "continue" step (or "cancel") that lets the followers' prefill go on (or end) as the
 * leader's does. It does not sample, detokenise or know about HTTP jobs (srv_sched.c does);
 * it does not choose what runs. */
#ifndef CKV_SRV_STEP_H
#define CKV_SRV_STEP_H

#include <stdint.h>

#include "engine/batch.h"
#include "engine/request.h"
#include "server/srv_store.h"

typedef struct {
    ckv_engine *engine;
    ckv_comm *group;        /* the engine's tensor-parallel group (host collectives); NULL: one rank */
    int leader;             /* 1 on rank 0 of the group (or with one rank) */
    int max_batch;
    ckv_prepared *lanes;    /* [max_batch] each slot's prepared context (zeroed: empty) */
    ckv_srv_store store;
    ckv_decode_batch batch;
    ckv_session **step_sess; /* [max_batch] */
    int32_t *step_tok;      /* [max_batch] */
    unsigned char *msg;     /* [msg_cap] a step's payload as sent / received */
    size_t msg_cap;
    int32_t *status_all;    /* [group size] every rank's status of the last step */
    int64_t *stats_all;     /* [group size, 4] every rank's context entries and bytes (prepare) */
    double t_last_sent;     /* when the leader last sent a step (heartbeats) */
    double heartbeat_s;     /* the leader sends a heartbeat after this long without a step */
    /* leader: called after every layer of a prepare's prefill; may run steps (not a prepare); non-zero
     * cancels the prepare (ERR_CANCELLED on every rank). NULL: nothing runs between layers. */
    int (*between_layers)(void *ctx, int layer);
    void *between_ctx;
    int preparing;          /* the slot whose prepare is running (-1: none); no other step may name it */
    float *score_logits;    /* [CKV_LOGITS_ROWS, V] every position's logits of a scored question step */
    /* outputs of the last step (leader) */
    const float *logits;    /* question: [V]; decode: [n, V] (host, valid until the next step) */
    ckv_srv_lookup lookup;  /* prepare: whether the context came from the store */
    long group_kept_entries, group_total_entries; /* prepare: summed over the group */
    size_t group_kv_bytes_full, group_kv_bytes_kept;
} ckv_srv_steps;

/* Sizes lanes, the decode batch and the message buffer for `max_batch` slots and contexts up to the
 * model's window; opens the store. Every rank of the group calls it; the ranks agree on the result
 * (one rank's failure fails it on all). */
ckv_status ckv_srv_steps_init(ckv_srv_steps *s, ckv_engine *e, int max_batch, size_t cache_bytes, const char *cache_dir);
void ckv_srv_steps_free(ckv_srv_steps *s); /* accepts zeroed and partial objects; frees every lane */

/* ---- steps (the leader calls these; followers run them from ckv_srv_steps_follow) ---- */

/* Lane `slot` gets the context ids [n] with `press`, restored from the store when it holds it (then
 * s->lookup.hit), else prefilled and compressed and stored; `reserve` tokens of room for question
 * and answer, questions prefilled in chunks of `chunk`. On success s->group_* hold the context's
 * entries and bytes summed over the group; the lane's logits are the context's last. */
ckv_status ckv_srv_step_prepare(ckv_srv_steps *s, int slot, const ckv_press_config *press, const int32_t *ids, int n,
                                int reserve, int chunk);
/* Feeds the question ids [n] (n >= 1) to lane `slot`; s->logits: the last position's [V]. */
ckv_status ckv_srv_step_question(ckv_srv_steps *s, int slot, const int32_t *ids, int n);
/* The same for n <= CKV_LOGITS_ROWS ids, keeping every position's logits: s->score_logits [n, V]
 * (row t follows ids[t]), s->logits its last row (scoring a prompt: echo with logprobs). */
ckv_status ckv_srv_step_score(ckv_srv_steps *s, int slot, const int32_t *ids, int n);
/* One forward feeding tokens[i] to lane slots[i] (i < n); s->logits: [n, V]. */
ckv_status ckv_srv_step_decode(ckv_srv_steps *s, const int *slots, const int32_t *tokens, int n);
/* Drops what lane `slot` holds after its context (the next choice starts from the context). */
ckv_status ckv_srv_step_rewind(ckv_srv_steps *s, int slot);
/* Frees lane `slot` (empty lanes are fine). */
void ckv_srv_step_release(ckv_srv_steps *s, int slot);
/* Leader, idle: sends a heartbeat when none was sent for heartbeat_s (nothing with one rank). */
void ckv_srv_step_idle(ckv_srv_steps *s);
/* Leader, last step: the followers leave ckv_srv_steps_follow, returning OK when `failed` is 0. */
void ckv_srv_step_quit(ckv_srv_steps *s, int failed);

/* Follower: runs the leader's steps until it quits. Returns OK, or an error when the leader quit
 * because it failed or a step could not be received. */
ckv_status ckv_srv_steps_follow(ckv_srv_steps *s);

#endif
