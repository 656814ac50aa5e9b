/* srv_sched.h - the engine thread of `ckv serve`: the only thread that touches the model. It owns a
 * bounded queue of submitted jobs, admits them into the engine scheduler's slots (engine/sched.h,
 * up to max_batch), turns the scheduler (one prefill layer, question or batched decode step per
 * turn, through srv_step.h, which broadcasts each step to the other ranks of a tensor-parallel
 * group) and turns its events into the jobs' progress: tokens and text (what a stream may send),
 * finish reasons, usage, failures, and the gauges of /metrics (rank 0 only). A job the engine thread
 * admitted is released exactly once, when the scheduler reports its request done. It does not parse
 * HTTP or JSON, and it does not sample or apply stops (the scheduler's answer state does). */
#ifndef CKV_SRV_SCHED_H
#define CKV_SRV_SCHED_H

#include <pthread.h>

#include "engine/grammar.h"
#include "engine/request.h"
#include "engine/sched.h"
#include "server/srv_job.h"
#include "server/srv_metrics.h"
#include "server/srv_step.h"

typedef struct {
    ckv_engine *engine;
    const ckv_tokenizer *tok;
    ckv_srv_metrics *metrics;
    ckv_srv_steps steps;        /* the engine work, on every rank of the group */
    int max_batch, max_queue;
    size_t piece_cap;           /* bytes one detokenised token may produce */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    ckv_srv_job **queue;        /* [max_queue] ring */
    int q_head, q_len;
    int accepting;              /* 0: submissions get 503 */
    int cancel_all;             /* grace period over: cancel everything */
    int quit;                   /* leave the loop once idle */
    int running;                /* jobs in the scheduler's slots */
    ckv_sched core;             /* the engine scheduler (engine thread only) */
    ckv_grammar_vocab grammar;  /* the vocabulary's bytes and tries for constrained decoding (built at init) */
    size_t *kv_full, *kv_kept;  /* [max_batch] each slot's context bytes before / after its press */
    double *t_last;             /* [max_batch] when each slot's previous token came */
    double interleave_s;        /* a decode step is due this long after the last one began, between two
                                 * layers of a prefill (set before ckv_srv_sched_start) */
    pthread_t thread;
    int started;
} ckv_srv_sched;

/* Every rank of the engine's group takes part (ckv_srv_steps_init); the other ranks then follow
 * (ckv_server_follow). */
ckv_status ckv_srv_sched_init(ckv_srv_sched *s, ckv_engine *e, ckv_srv_metrics *m, int max_batch, int max_queue,
                              size_t cache_bytes, const char *cache_dir);
ckv_status ckv_srv_sched_start(ckv_srv_sched *s);
/* Queues a job (the scheduler takes one reference): 0, or the HTTP status to answer: 429 (queue
 * full) or 503 (shutting down). */
int ckv_srv_sched_submit(ckv_srv_sched *s, ckv_srv_job *j);
/* Stops accepting, waits up to grace_seconds for queued and running jobs, cancels what is left,
 * stops the engine thread. The followers of a group are still following (ckv_srv_step_quit ends
 * them). */
void ckv_srv_sched_drain(ckv_srv_sched *s, double grace_seconds);
void ckv_srv_sched_free(ckv_srv_sched *s); /* accepts zeroed objects */

#endif
