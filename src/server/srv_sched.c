/* srv_sched.c - the engine thread (see srv_sched.h): the queue, admission into the engine
 * scheduler, its events as job progress, cancellation, drain. */
#define _POSIX_C_SOURCE 200809L
#include "server/srv_sched.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"

static void timespec_in(struct timespec *ts, double seconds) {
    clock_gettime(CLOCK_REALTIME, ts);
    long ns = ts->tv_nsec + (long)(seconds * 1e9);
    ts->tv_sec += ns / 1000000000L;
    ts->tv_nsec = ns % 1000000000L;
}

ckv_status ckv_srv_sched_init(ckv_srv_sched *s, ckv_engine *e, ckv_srv_metrics *m, int max_batch, int max_queue,
                              int max_batch_tokens, int long_prompt, size_t cache_bytes, const char *cache_dir) {
    memset(s, 0, sizeof *s);
    /* first what every rank of the group runs */
    ckv_status st = ckv_srv_steps_init(&s->steps, e, max_batch, max_batch_tokens, cache_bytes, cache_dir);
    if (st != CKV_STATUS_OK) return st;
    s->engine = e;
    s->tok = e->cfg.tokenizer;
    s->metrics = m;
    s->max_batch = max_batch;
    s->max_queue = max_queue;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->accepting = 1;
    s->interleave_s = 0.05;
    if (max_queue < 1) st = ckv_error(CKV_STATUS_ERR_RANGE, "--max-queue %d: expected >= 1", max_queue);
    else if (!s->tok) st = ckv_error(CKV_STATUS_ERR_ARG, "ckv serve needs the model's tokenizer");
    ckv_sched_exec x;
    ckv_srv_steps_exec(&s->steps, &x);
    if (st == CKV_STATUS_OK) st = ckv_sched_init(&s->core, e, &x, max_batch, s->interleave_s);
    if (st == CKV_STATUS_OK) st = ckv_sched_batch_prefill(&s->core, max_batch_tokens, long_prompt);
    if (st == CKV_STATUS_OK) {
        s->piece_cap = ckv_detok_stream_cap(s->tok);
        s->queue = calloc((size_t)max_queue, sizeof *s->queue);
        s->kv_full = calloc((size_t)max_batch, sizeof *s->kv_full);
        s->kv_kept = calloc((size_t)max_batch, sizeof *s->kv_kept);
        s->t_last = calloc((size_t)max_batch, sizeof *s->t_last);
        if (!s->queue || !s->kv_full || !s->kv_kept || !s->t_last)
            st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the scheduler");
    }
    /* response_format json_object: the vocabulary's bytes, once (the leader samples) */
    if (st == CKV_STATUS_OK) st = ckv_grammar_vocab_init(&s->grammar, s->tok, e->model->cfg.vocab_size);
    if (st != CKV_STATUS_OK) {
        ckv_srv_step_quit(&s->steps, 1);
        ckv_srv_sched_free(s);
    }
    return st;
}

void ckv_srv_sched_free(ckv_srv_sched *s) {
    if (!s) return;
    ckv_sched_free(&s->core);
    ckv_srv_steps_free(&s->steps);
    ckv_grammar_vocab_free(&s->grammar);
    free(s->queue);
    free(s->kv_full);
    free(s->kv_kept);
    free(s->t_last);
    if (s->engine) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->cv);
    }
    memset(s, 0, sizeof *s);
}

int ckv_srv_sched_submit(ckv_srv_sched *s, ckv_srv_job *j) {
    pthread_mutex_lock(&s->mu);
    int code = 0;
    if (!s->accepting) code = 503;
    else if (s->q_len >= s->max_queue) code = 429;
    if (code == 0) {
        s->queue[(s->q_head + s->q_len) % s->max_queue] = j;
        s->q_len++;
        pthread_cond_signal(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return code;
}

/* ---- events into job progress -------------------------------------------------------------------------- */

static int job_cancelled(ckv_srv_job *j) {
    pthread_mutex_lock(&j->mu);
    int c = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    return c;
}

/* The engine side's reference is dropped: the job's request left the scheduler (or never entered). */
static void job_leaves(ckv_srv_sched *s, ckv_srv_job *j) {
    ckv_srv_job_release(j);
    pthread_mutex_lock(&s->mu);
    s->running--;
    pthread_mutex_unlock(&s->mu);
}

static void on_prepared(ckv_srv_sched *s, const ckv_sched_event *ev) {
    ckv_srv_job *j = ev->user;
    const ckv_sched_prepared *in = &ev->info;
    pthread_mutex_lock(&j->mu);
    j->cache_hit = in->hit;
    j->prompt_tokens = j->n_ctx + j->n_q;
    j->reused_tokens = in->hit ? j->n_ctx : 0;
    j->compressed = in->compressed;
    j->uncompressed_reason = in->uncompressed_reason;
    j->kept_entries = in->kept_entries;
    j->total_entries = in->total_entries;
    j->kv_bytes_full = in->kv_bytes_full;
    j->kv_bytes_kept = in->kv_bytes_kept;
    pthread_mutex_unlock(&j->mu);
    s->kv_full[ev->slot] = in->kv_bytes_full;
    s->kv_kept[ev->slot] = in->kv_bytes_kept;
    ckv_srv_metrics *m = s->metrics;
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += in->hit ? j->n_q : j->n_ctx + j->n_q;
    m->reused_tokens += in->hit ? j->n_ctx : 0;
    if (in->hit) m->cache_hits++;
    else m->cache_misses++;
    if (in->from_disk) m->cache_disk_hits++;
    m->prefill_batches += in->batch_first;
    m->prefill_batched_contexts += in->batch > 0;
    if (!in->hit && in->kv_bytes_full > in->kv_bytes_kept) m->kv_bytes_saved_total += in->kv_bytes_full - in->kv_bytes_kept;
    pthread_mutex_unlock(&m->mu);
}

/* The choice's ids, text and finish as the answer state has them now (its text only grows, or is cut
 * back where a stop string begins). */
static void on_answer(ckv_srv_sched *s, const ckv_sched_event *ev) {
    ckv_srv_job *j = ev->user;
    const ckv_answer_state *a = ev->answer;
    ckv_srv_choice *ch = &j->choices[ev->choice];
    ckv_srv_metrics *m = s->metrics;
    double now = ckv_time_now();
    if (ev->token >= 0) {
        if (j->t_first == 0) {
            j->t_first = now;
            ckv_srv_metrics_observe(m, &m->ttft, now - j->t_submit);
        } else {
            ckv_srv_metrics_observe(m, &m->itl, now - s->t_last[ev->slot]);
        }
        s->t_last[ev->slot] = now;
    }
    pthread_mutex_lock(&j->mu);
    if (j->logprobs && ev->token >= 0 && ev->logits && a->n_ids > ch->n_ids && a->n_ids <= j->max_tokens) {
        /* the new id's log-probability (of the model's row) and the text it ends at */
        size_t k = (size_t)j->top_logprobs, at = (size_t)a->n_ids - 1;
        ch->lp[at] = ckv_logprobs_row(ev->logits, s->engine->model->cfg.vocab_size, a->ids[at], (int)k, ch->top_ids + at * k,
                                      ch->top_lp + at * k);
        ch->tok_end[at] = (uint32_t)a->text_len;
    }
    if (a->n_ids > ch->n_ids) memcpy(ch->ids + ch->n_ids, a->ids + ch->n_ids, sizeof(int32_t) * (size_t)(a->n_ids - ch->n_ids));
    ch->n_ids = a->n_ids;
    size_t len = a->text_len < ch->text_cap ? a->text_len : ch->text_cap - 1;
    size_t from = ch->text_len < len ? ch->text_len : len;
    memcpy(ch->text + from, a->text + from, len - from);
    ch->text_len = len;
    ch->text[len] = '\0';
    ch->safe_len = a->safe_len < len ? a->safe_len : len;
    ckv_finish_reason fin = a->finish;
    const ckv_srv_decode_stats *dst = &s->steps.decode_stats[ev->slot]; /* the slot's until its next prepare */
    int new_compressions = dst->compressions - j->decode_compressions;
    long new_evicted = dst->evicted_entries - j->decode_evicted_entries;
    if (fin != CKV_FINISH_NONE) {
        ch->finish = fin;
        j->completion_tokens += ch->n_ids;
        j->decode_compressions = dst->compressions;
        j->decode_evicted_entries = dst->evicted_entries;
        if (ev->done) {
            for (int c = ev->choice + 1; c < j->n_choices; c++) j->choices[c].finish = CKV_FINISH_CANCELLED;
            j->done = 1;
        }
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (fin == CKV_FINISH_NONE) return;
    pthread_mutex_lock(&m->mu);
    m->completion_tokens += a->n_ids;
    m->decode_compressions += new_compressions;
    m->decode_evicted_entries += new_evicted;
    if (fin == CKV_FINISH_CANCELLED) m->requests_cancelled++;
    pthread_mutex_unlock(&m->mu);
    if (ev->done && fin != CKV_FINISH_CANCELLED) ckv_srv_metrics_observe(m, &m->e2e, now - j->t_submit);
}

static void on_event(ckv_srv_sched *s, const ckv_sched_event *ev) {
    ckv_srv_job *j = ev->user;
    switch (ev->kind) {
    case CKV_SCHED_PREPARED: on_prepared(s, ev); break;
    case CKV_SCHED_ANSWER: on_answer(s, ev); break;
    case CKV_SCHED_FAILED:
        pthread_mutex_lock(&j->mu);
        j->status = ev->status;
        snprintf(j->err, sizeof j->err, "%s", ev->err);
        j->done = 1;
        pthread_cond_broadcast(&j->cv);
        pthread_mutex_unlock(&j->mu);
        break;
    }
    if (ev->done) job_leaves(s, j);
}

/* ---- the loop ------------------------------------------------------------------------------------- */

static void cancel_job_unstarted(ckv_srv_sched *s, ckv_srv_job *j) {
    pthread_mutex_lock(&j->mu);
    for (int c = 0; c < j->n_choices; c++) j->choices[c].finish = CKV_FINISH_CANCELLED;
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    pthread_mutex_lock(&s->metrics->mu);
    s->metrics->requests_cancelled++;
    pthread_mutex_unlock(&s->metrics->mu);
    ckv_srv_job_release(j);
}

static void update_gauges(ckv_srv_sched *s) {
    size_t used = 0, saved = 0;
    int ranks = s->steps.group ? s->steps.group->size : 1;
    for (int i = 0; i < s->max_batch; i++) {
        if (s->core.slots[i].phase != CKV_SLOT_DECODE) continue;
        /* this rank's share times the group (the ranks hold equal shares of the heads) */
        used += ckv_kv_cache_bytes_used(&s->steps.lanes[i].pc.sess.kv) * (size_t)ranks;
        if (s->kv_full[i] > s->kv_kept[i]) saved += s->kv_full[i] - s->kv_kept[i];
    }
    ckv_srv_metrics *m = s->metrics;
    pthread_mutex_lock(&m->mu);
    m->kv_bytes_in_use = used;
    m->kv_bytes_saved = saved;
    m->store_bytes = s->steps.store.bytes;
    m->store_entries = s->steps.store.n_entries;
    pthread_mutex_unlock(&m->mu);
}

/* Moves queued jobs into free slots of the scheduler (with s->mu held; drops it around the admission).
 * A job whose request the scheduler refuses (sampling it cannot run) fails at once. */
static void admit_queued(ckv_srv_sched *s) {
    while (s->q_len > 0 && ckv_sched_busy(&s->core) < s->max_batch) {
        ckv_srv_job *j = s->queue[s->q_head];
        s->q_head = (s->q_head + 1) % s->max_queue;
        s->q_len--;
        s->running++;
        pthread_mutex_unlock(&s->mu);
        ckv_sched_request r = {.ctx_ids = j->ctx_ids, .n_ctx = j->n_ctx, .q_ids = j->q_ids, .n_q = j->n_q,
                               .ctx_question_rows = j->ctx_question_rows, .press = &j->press,
                               .decode_press = j->has_decode ? &j->decode : NULL,
                               .sampling = j->sampling, .max_tokens = j->max_tokens, .n_choices = j->n_choices,
                               .ignore_eos = j->ignore_eos, .stop_strings = (const char *const *)j->stop,
                               .n_stop_strings = j->n_stop, .logits = &j->logits, .grammar = &s->grammar,
                               .score = j->echo_scored ? &j->score : NULL, .logprobs = j->logprobs, .user = j};
        int slot = -1;
        ckv_status st = ckv_sched_admit(&s->core, &r, &slot);
        if (st == CKV_STATUS_OK && slot < 0) st = ckv_error(CKV_STATUS_ERR_INTERNAL, "no free slot for an admitted request");
        if (st != CKV_STATUS_OK) {
            ckv_srv_job_fail(j, st);
            job_leaves(s, j);
        } else {
            s->kv_full[slot] = s->kv_kept[slot] = 0;
            s->t_last[slot] = 0;
        }
        pthread_mutex_lock(&s->mu);
    }
}

static void *engine_main(void *arg) {
    ckv_srv_sched *s = arg;
    s->core.interleave_s = s->interleave_s;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        if (s->cancel_all) { /* grace period over */
            while (s->q_len > 0) {
                ckv_srv_job *j = s->queue[s->q_head];
                s->q_head = (s->q_head + 1) % s->max_queue;
                s->q_len--;
                pthread_mutex_unlock(&s->mu);
                cancel_job_unstarted(s, j);
                pthread_mutex_lock(&s->mu);
            }
        }
        admit_queued(s);
        int active = s->running, quit = s->quit, cancel = s->cancel_all;
        pthread_mutex_lock(&s->metrics->mu);
        s->metrics->queue_length = s->q_len;
        s->metrics->running = s->running;
        pthread_mutex_unlock(&s->metrics->mu);
        if (active == 0) {
            if (quit && s->q_len == 0) {
                pthread_mutex_unlock(&s->mu);
                break;
            }
            struct timespec ts;
            timespec_in(&ts, 0.05);
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
            pthread_mutex_unlock(&s->mu);
            ckv_srv_step_idle(&s->steps);
            update_gauges(s);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        /* cancellations: the client went away, or the grace period is over (also between two layers
         * of a prefill: each turn runs one) */
        for (int i = 0; i < s->max_batch; i++) {
            const ckv_sched_slot *sl = &s->core.slots[i];
            if (sl->phase != CKV_SLOT_FREE && (cancel || job_cancelled(sl->req.user))) ckv_sched_cancel(&s->core, i);
        }
        int n = ckv_sched_turn(&s->core);
        for (int i = 0; i < n; i++) on_event(s, &s->core.events[i]);
        update_gauges(s);
    }
    update_gauges(s);
    return NULL;
}

ckv_status ckv_srv_sched_start(ckv_srv_sched *s) {
    int rc = pthread_create(&s->thread, NULL, engine_main, s);
    if (rc != 0) return ckv_error(CKV_STATUS_ERR_INTERNAL, "cannot start the engine thread: %s", strerror(rc));
    s->started = 1;
    return CKV_STATUS_OK;
}

void ckv_srv_sched_drain(ckv_srv_sched *s, double grace) {
    if (!s->started) return;
    pthread_mutex_lock(&s->mu);
    s->accepting = 0;
    s->quit = 1;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    double t_end = ckv_time_now() + grace;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        int busy = s->running + s->q_len;
        pthread_mutex_unlock(&s->mu);
        if (busy == 0) break;
        if (ckv_time_now() >= t_end) {
            pthread_mutex_lock(&s->mu);
            s->cancel_all = 1;
            pthread_mutex_unlock(&s->mu);
            break;
        }
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    pthread_join(s->thread, NULL);
    s->started = 0;
}
