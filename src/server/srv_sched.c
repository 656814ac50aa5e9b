/* srv_sched.c - the engine thread (see srv_sched.h): admission, the prepare / question / decode
 * steps, sampling and stops, cancellation, drain. */
#define _POSIX_C_SOURCE 200809L
#include "server/srv_sched.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"

typedef enum { SLOT_FREE = 0, SLOT_PREPARE, SLOT_DECODE } slot_phase;

struct ckv_srv_slot {
    slot_phase phase;
    ckv_srv_job *job;
    unsigned long seq;      /* admission order (the oldest prepare runs first) */
    int choice;             /* the choice being generated */
    ckv_sampler sampler;
    int sampler_ready;
    ckv_detok_stream ds;
    char *piece;            /* [piece_cap] one token's text */
    int32_t next;           /* the token the next decode step feeds */
    double t_last;          /* when the previous token came */
    size_t kv_full, kv_kept;
};

static int sched_between_layers(void *ctx, int layer);

static void timespec_in(struct timespec *ts, double seconds) {
    clock_gettime(CLOCK_REALTIME, ts);
    long ns = ts->tv_nsec + (long)(seconds * 1e9);
    ts->tv_sec += ns / 1000000000L;
    ts->tv_nsec = ns % 1000000000L;
}

ckv_status ckv_srv_sched_init(ckv_srv_sched *s, ckv_engine *e, ckv_srv_metrics *m, int max_batch, int max_queue,
                              size_t cache_bytes, const char *cache_dir) {
    memset(s, 0, sizeof *s);
    /* first what every rank of the group runs */
    ckv_status st = ckv_srv_steps_init(&s->steps, e, max_batch, cache_bytes, cache_dir);
    if (st != CKV_STATUS_OK) return st;
    s->steps.between_layers = sched_between_layers;
    s->steps.between_ctx = s;
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
    if (st == CKV_STATUS_OK) {
        s->piece_cap = ckv_detok_stream_cap(s->tok);
        s->queue = calloc((size_t)max_queue, sizeof *s->queue);
        s->slots = calloc((size_t)max_batch, sizeof *s->slots);
        s->step_tok = calloc((size_t)max_batch, sizeof *s->step_tok);
        s->step_slot = calloc((size_t)max_batch, sizeof *s->step_slot);
        if (!s->queue || !s->slots || !s->step_tok || !s->step_slot)
            st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the scheduler");
    }
    for (int i = 0; st == CKV_STATUS_OK && i < max_batch; i++)
        st = ckv_alloc((void **)&s->slots[i].piece, s->piece_cap, "token text");
    if (st != CKV_STATUS_OK) {
        ckv_srv_step_quit(&s->steps, 1);
        ckv_srv_sched_free(s);
    }
    return st;
}

void ckv_srv_sched_free(ckv_srv_sched *s) {
    if (!s) return;
    for (int i = 0; s->slots && i < s->max_batch; i++) {
        if (s->slots[i].sampler_ready) ckv_sampler_free(&s->slots[i].sampler);
        ckv_free(s->slots[i].piece);
    }
    ckv_srv_steps_free(&s->steps);
    free(s->queue);
    free(s->slots);
    free(s->step_tok);
    free(s->step_slot);
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

/* ---- emitting tokens ------------------------------------------------------------------------------ */

static int job_cancelled(ckv_srv_job *j) {
    pthread_mutex_lock(&j->mu);
    int c = j->cancelled;
    pthread_mutex_unlock(&j->mu);
    return c;
}

static int is_engine_stop(const ckv_engine *e, int32_t t) {
    for (int i = 0; i < e->n_stop_ids; i++)
        if (e->stop_ids[i] == t) return 1;
    return 0;
}

/* Searches the stop strings in the text after `from`; returns the offset of the first match or -1. */
static long find_stop(const ckv_srv_job *j, const ckv_srv_choice *ch, size_t from) {
    long best = -1;
    for (int i = 0; i < j->n_stop; i++) {
        size_t l = strlen(j->stop[i]);
        for (size_t o = from; o + l <= ch->text_len; o++)
            if (!memcmp(ch->text + o, j->stop[i], l)) {
                if (best < 0 || (long)o < best) best = (long)o;
                break;
            }
    }
    return best;
}

static int slot_index(const ckv_srv_sched *s, const ckv_srv_slot *sl) { return (int)(sl - s->slots); }

static ckv_prepared *slot_lane(ckv_srv_sched *s, const ckv_srv_slot *sl) { return &s->steps.lanes[slot_index(s, sl)]; }

static void slot_release(ckv_srv_sched *s, ckv_srv_slot *sl) {
    ckv_srv_step_release(&s->steps, slot_index(s, sl));
    if (sl->sampler_ready) ckv_sampler_free(&sl->sampler);
    sl->sampler_ready = 0;
    ckv_srv_job_release(sl->job);
    sl->job = NULL;
    sl->phase = SLOT_FREE;
    pthread_mutex_lock(&s->mu);
    s->running--;
    pthread_mutex_unlock(&s->mu);
}

static void begin_choice(ckv_srv_sched *s, ckv_srv_slot *sl);

/* Ends the slot's current choice; starts the next one or completes the job. */
static void finish_choice(ckv_srv_sched *s, ckv_srv_slot *sl, ckv_finish_reason why) {
    ckv_srv_job *j = sl->job;
    ckv_srv_choice *ch = &j->choices[sl->choice];
    size_t n = 0;
    pthread_mutex_lock(&j->mu);
    if (why != CKV_FINISH_STOP && ckv_detok_stream_flush(&sl->ds, sl->piece, s->piece_cap, &n) == CKV_STATUS_OK &&
        ch->text_len + n < ch->text_cap) {
        memcpy(ch->text + ch->text_len, sl->piece, n);
        ch->text_len += n;
    }
    ch->text[ch->text_len] = '\0';
    ch->safe_len = ch->text_len;
    ch->finish = why;
    j->completion_tokens += ch->n_ids;
    int last = sl->choice + 1 >= j->n_choices || why == CKV_FINISH_CANCELLED;
    if (last) {
        for (int c = sl->choice + 1; c < j->n_choices; c++) j->choices[c].finish = CKV_FINISH_CANCELLED;
        j->done = 1;
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    ckv_error_clear();
    ckv_srv_metrics *m = s->metrics;
    pthread_mutex_lock(&m->mu);
    m->completion_tokens += ch->n_ids;
    if (why == CKV_FINISH_CANCELLED) m->requests_cancelled++;
    pthread_mutex_unlock(&m->mu);
    if (last) {
        if (why != CKV_FINISH_CANCELLED) ckv_srv_metrics_observe(m, &m->e2e, ckv_time_now() - j->t_submit);
        slot_release(s, sl);
        return;
    }
    ckv_status st = ckv_srv_step_rewind(&s->steps, slot_index(s, sl));
    if (st != CKV_STATUS_OK) {
        ckv_srv_job_fail(j, st);
        slot_release(s, sl);
        return;
    }
    sl->choice++;
    begin_choice(s, sl);
}

/* Records a sampled token; returns 1 when it ended the choice (finish_choice was called). */
static int emit_token(ckv_srv_sched *s, ckv_srv_slot *sl, int32_t tok) {
    ckv_srv_job *j = sl->job;
    ckv_srv_choice *ch = &j->choices[sl->choice];
    ckv_srv_metrics *m = s->metrics;
    double now = ckv_time_now();
    if (j->t_first == 0) {
        j->t_first = now;
        ckv_srv_metrics_observe(m, &m->ttft, now - j->t_submit);
    } else if (ch->n_ids > 0 || sl->choice > 0) {
        ckv_srv_metrics_observe(m, &m->itl, now - sl->t_last);
    }
    sl->t_last = now;
    if (!j->ignore_eos && is_engine_stop(s->engine, tok)) {
        finish_choice(s, sl, CKV_FINISH_EOS);
        return 1;
    }
    size_t n = 0;
    if (ckv_detok_stream_push(&sl->ds, tok, sl->piece, s->piece_cap, &n) != CKV_STATUS_OK) {
        ckv_error_clear();
        n = 0;
    }
    int stop = 0;
    pthread_mutex_lock(&j->mu);
    ch->ids[ch->n_ids++] = tok;
    size_t before = ch->text_len;
    if (ch->text_len + n < ch->text_cap) {
        memcpy(ch->text + ch->text_len, sl->piece, n);
        ch->text_len += n;
    }
    if (j->n_stop) {
        size_t from = before > j->stop_max_len ? before - j->stop_max_len : 0;
        long at = find_stop(j, ch, from);
        if (at >= 0) {
            ch->text_len = (size_t)at; /* the stop string is not part of the answer */
            stop = 1;
        }
    }
    size_t hold = j->stop_max_len > 0 ? j->stop_max_len - 1 : 0;
    size_t safe = ch->text_len > hold ? ch->text_len - hold : 0;
    if (safe > ch->safe_len) ch->safe_len = safe;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    if (stop) {
        finish_choice(s, sl, CKV_FINISH_STOP);
        return 1;
    }
    if (ch->n_ids >= j->max_tokens) {
        finish_choice(s, sl, CKV_FINISH_LENGTH);
        return 1;
    }
    sl->next = tok;
    return 0;
}

/* ---- steps --------------------------------------------------------------------------------------- */

/* Step: feed the question of the slot's job (if any) and sample the first token of a choice. */
static void begin_choice(ckv_srv_sched *s, ckv_srv_slot *sl) {
    ckv_srv_job *j = sl->job;
    ckv_detok_stream_init(&sl->ds, s->tok, CKV_DETOKENIZE_SKIP_SPECIAL);
    if (j->max_tokens == 0) {
        finish_choice(s, sl, CKV_FINISH_LENGTH);
        return;
    }
    const float *lg = slot_lane(s, sl)->logits;
    if (j->n_q > 0) {
        ckv_status st = ckv_srv_step_question(&s->steps, slot_index(s, sl), j->q_ids, j->n_q);
        if (st != CKV_STATUS_OK) {
            ckv_srv_job_fail(j, st);
            slot_release(s, sl);
            return;
        }
        lg = s->steps.logits;
    }
    sl->phase = SLOT_DECODE;
    emit_token(s, sl, ckv_sampler_sample(&sl->sampler, lg));
}

static void step_decode(ckv_srv_sched *s);

static int grace_over(ckv_srv_sched *s) {
    pthread_mutex_lock(&s->mu);
    int c = s->cancel_all;
    pthread_mutex_unlock(&s->mu);
    return c;
}

/* The between-layers callback of a prepare (srv_step.h): a decode step for the running streams when
 * they have waited long enough; non-zero cancels the prepare (its client left, or the grace period
 * of a drain is over). */
static int sched_between_layers(void *ctx, int layer) {
    (void)layer;
    ckv_srv_sched *s = ctx;
    if ((s->preparing && job_cancelled(s->preparing->job)) || grace_over(s)) return 1;
    if (ckv_time_now() - s->t_last_decode >= s->interleave_s) step_decode(s);
    return 0;
}

/* Prefill tokens a turn of the loop may spend before the running sequences get their next token (the
 * engine's prefill chunk). */
static int prefill_budget(const ckv_srv_sched *s) { return s->engine->cfg.chunk > 0 ? s->engine->cfg.chunk : 512; }

/* Step: restore the job's context from the store or prepare (prefill + compress) it; returns the
 * tokens it prefilled. */
static int step_prepare(ckv_srv_sched *s, ckv_srv_slot *sl) {
    ckv_srv_job *j = sl->job;
    ckv_engine *e = s->engine;
    /* finish_choice and slot_release may drop the last reference to j: read what is returned first */
    const int n_ctx = j->n_ctx, n_q = j->n_q;
    int reserve = j->n_q + j->max_tokens;
    ckv_status st = ckv_sampler_init(&sl->sampler, &j->sampling, e->model->cfg.vocab_size);
    sl->sampler_ready = st == CKV_STATUS_OK;
    /* a restored context only prefills its question: activation buffers for that many rows */
    int chunk = j->n_q < 1 ? 1 : j->n_q < prefill_budget(s) ? j->n_q : prefill_budget(s);
    s->preparing = sl;
    if (st == CKV_STATUS_OK) st = ckv_srv_step_prepare(&s->steps, slot_index(s, sl), &j->press, j->ctx_ids, j->n_ctx, reserve, chunk);
    s->preparing = NULL;
    const ckv_srv_lookup lk = s->steps.lookup;
    if (st == CKV_STATUS_ERR_CANCELLED) { /* stopped between two layers of its prefill */
        ckv_error_clear();
        ckv_detok_stream_init(&sl->ds, s->tok, CKV_DETOKENIZE_SKIP_SPECIAL);
        finish_choice(s, sl, CKV_FINISH_CANCELLED);
        return n_ctx;
    }
    if (st != CKV_STATUS_OK) {
        ckv_srv_job_fail(j, st);
        slot_release(s, sl);
        return n_ctx;
    }
    const ckv_request_stats *rs = &slot_lane(s, sl)->stats;
    const ckv_srv_steps *g = &s->steps; /* entries and bytes of the whole tensor-parallel group */
    pthread_mutex_lock(&j->mu);
    j->cache_hit = lk.hit;
    j->prompt_tokens = j->n_ctx + j->n_q;
    j->reused_tokens = lk.hit ? j->n_ctx : 0;
    j->compressed = rs->compressed;
    j->uncompressed_reason = j->press.scorer == CKV_SCORER_NONE ? NULL : rs->uncompressed_reason;
    j->kept_entries = g->group_kept_entries;
    j->total_entries = g->group_total_entries;
    j->kv_bytes_full = g->group_kv_bytes_full;
    j->kv_bytes_kept = g->group_kv_bytes_kept;
    pthread_mutex_unlock(&j->mu);
    sl->kv_full = g->group_kv_bytes_full;
    sl->kv_kept = g->group_kv_bytes_kept;
    ckv_srv_metrics *m = s->metrics;
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += lk.hit ? j->n_q : j->n_ctx + j->n_q;
    m->reused_tokens += lk.hit ? j->n_ctx : 0;
    if (lk.hit) m->cache_hits++;
    else m->cache_misses++;
    if (lk.from_disk) m->cache_disk_hits++;
    if (!lk.hit && sl->kv_full > sl->kv_kept) m->kv_bytes_saved_total += sl->kv_full - sl->kv_kept;
    pthread_mutex_unlock(&m->mu);
    sl->choice = 0;
    begin_choice(s, sl);
    return lk.hit ? n_q : n_ctx + n_q;
}

/* Step: one forward for the next token of every decoding slot. */
static void step_decode(ckv_srv_sched *s) {
    int n = 0;
    for (int i = 0; i < s->max_batch; i++)
        if (s->slots[i].phase == SLOT_DECODE) {
            s->step_tok[n] = s->slots[i].next;
            s->step_slot[n++] = i;
        }
    s->t_last_decode = ckv_time_now();
    if (n == 0) return;
    ckv_status st = ckv_srv_step_decode(&s->steps, s->step_slot, s->step_tok, n);
    const float *logits = s->steps.logits; // [n, V]
    int V = s->engine->model->cfg.vocab_size;
    for (int r = 0; r < n; r++) {
        ckv_srv_slot *sl = &s->slots[s->step_slot[r]];
        if (st != CKV_STATUS_OK) {
            ckv_srv_job_fail(sl->job, st);
            slot_release(s, sl);
            continue;
        }
        emit_token(s, sl, ckv_sampler_sample(&sl->sampler, logits + (size_t)r * V));
    }
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
        ckv_srv_slot *sl = &s->slots[i];
        if (sl->phase != SLOT_DECODE) continue;
        /* this rank's share times the group (the ranks hold equal shares of the heads) */
        used += ckv_kv_cache_bytes_used(&s->steps.lanes[i].sess.kv) * (size_t)ranks;
        if (sl->kv_full > sl->kv_kept) saved += sl->kv_full - sl->kv_kept;
    }
    ckv_srv_metrics *m = s->metrics;
    pthread_mutex_lock(&m->mu);
    m->kv_bytes_in_use = used;
    m->kv_bytes_saved = saved;
    m->store_bytes = s->steps.store.bytes;
    m->store_entries = s->steps.store.n_entries;
    pthread_mutex_unlock(&m->mu);
}

static void *engine_main(void *arg) {
    ckv_srv_sched *s = arg;
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
        for (int i = 0; i < s->max_batch && s->q_len > 0; i++) {
            if (s->slots[i].phase != SLOT_FREE) continue;
            ckv_srv_slot *sl = &s->slots[i];
            sl->job = s->queue[s->q_head];
            s->q_head = (s->q_head + 1) % s->max_queue;
            s->q_len--;
            sl->phase = SLOT_PREPARE;
            sl->choice = 0;
            sl->seq = s->admit_seq++;
            s->running++;
        }
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
        /* cancellations: the client went away, or the grace period is over */
        for (int i = 0; i < s->max_batch; i++) {
            ckv_srv_slot *sl = &s->slots[i];
            if (sl->phase == SLOT_FREE) continue;
            if (cancel || job_cancelled(sl->job)) {
                if (sl->phase == SLOT_PREPARE) ckv_detok_stream_init(&sl->ds, s->tok, CKV_DETOKENIZE_SKIP_SPECIAL);
                finish_choice(s, sl, CKV_FINISH_CANCELLED);
            }
        }
        /* prepare steps, oldest admitted job first, until one prefill chunk of tokens was spent (a
         * context restored from the store costs only its question), then one decode step */
        for (int spent = 0; spent < prefill_budget(s);) {
            ckv_srv_slot *oldest = NULL;
            for (int i = 0; i < s->max_batch; i++)
                if (s->slots[i].phase == SLOT_PREPARE && (!oldest || s->slots[i].seq < oldest->seq)) oldest = &s->slots[i];
            if (!oldest) break;
            spent += 1 + step_prepare(s, oldest);
        }
        step_decode(s);
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
