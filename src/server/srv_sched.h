/* srv_sched.h - the engine thread of `ckv serve`: the only thread that touches the model. It owns a
 * bounded queue of submitted jobs and up to max_batch slots; each turn of its loop is a sequence of
 * steps (a context prepare or store restore for one new job, then ONE batched decode step feeding the
 * next token of every running sequence), so running streams get a token after every prepare, and
 * also between the layers of a long prefill (a decode step whenever they waited interleave_s). The
 * steps themselves run through srv_step.h, which broadcasts each one to the other ranks of a
 * tensor-parallel group before running it. Sampling, stop ids and stop strings, detokenisation into
 * each job's preallocated text and the gauges of /metrics live here (rank 0 only). It does not parse
 * HTTP or JSON. */
#ifndef CKV_SRV_SCHED_H
#define CKV_SRV_SCHED_H

#include <pthread.h>

#include "engine/grammar.h"
#include "engine/request.h"
#include "server/srv_job.h"
#include "server/srv_metrics.h"
#include "server/srv_step.h"

typedef struct ckv_srv_slot ckv_srv_slot;

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
    int running;                /* jobs in slots */
    ckv_srv_slot *slots;        /* [max_batch] */
    ckv_grammar_vocab grammar;  /* the vocabulary's bytes for response_format json_object (built at init) */
    unsigned long admit_seq;
    int32_t *step_tok;          /* [max_batch] the decode step's tokens */
    int *step_slot;             /* [max_batch] */
    ckv_srv_slot *preparing;    /* the slot whose context is being prepared (NULL: none) */
    double t_last_decode;       /* when the last decode step began */
    double interleave_s;        /* a prefill pauses for a decode step after a layer ending this long after it */
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
