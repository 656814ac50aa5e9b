/* sched.c - the serving loop's scheduler (see sched.h): admission into slots, the choice of the
 * next unit of work, the answer of each choice, cancellation and failure events. */
#define _POSIX_C_SOURCE 200809L
#include "engine/sched.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/timer.h"

#define DEFAULT_CHUNK 512

ckv_status ckv_sched_init(ckv_sched *s, ckv_engine *e, const ckv_sched_exec *exec, int max_slots, double interleave_s) {
    memset(s, 0, sizeof *s);
    if (max_slots < 1) return ckv_error(CKV_STATUS_ERR_RANGE, "scheduler of %d slots: expected >= 1", max_slots);
    if (!(interleave_s >= 0)) return ckv_error(CKV_STATUS_ERR_RANGE, "interleave of %g s: expected >= 0", interleave_s);
    s->engine = e;
    s->exec = *exec;
    s->max_slots = max_slots;
    s->chunk = e->cfg.chunk > 0 ? e->cfg.chunk : DEFAULT_CHUNK;
    s->interleave_s = interleave_s;
    s->slots = calloc((size_t)max_slots, sizeof *s->slots);
    s->events = calloc(2 * (size_t)max_slots + 2, sizeof *s->events);
    s->step_slot = calloc((size_t)max_slots, sizeof *s->step_slot);
    s->step_tok = calloc((size_t)max_slots, sizeof *s->step_tok);
    s->step_pick = calloc((size_t)max_slots, sizeof *s->step_pick);
    s->step_ids = calloc((size_t)max_slots, sizeof *s->step_ids);
    if (!s->slots || !s->events || !s->step_slot || !s->step_tok || !s->step_pick || !s->step_ids) {
        ckv_sched_free(s);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for a scheduler of %d slots", max_slots);
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_sched_batch_prefill(ckv_sched *s, int max_tokens, int long_prompt) {
    if (max_tokens < 0) return ckv_error(CKV_STATUS_ERR_RANGE, "batched prefill of %d tokens: expected >= 0", max_tokens);
    if (max_tokens > 0 && !s->exec.prefill)
        return ckv_error(CKV_STATUS_ERR_ARG, "this executor cannot prefill several contexts in one forward");
    if (max_tokens > 0 && (long_prompt < 1 || long_prompt > max_tokens))
        return ckv_error(CKV_STATUS_ERR_RANGE, "a batched prefill of %d tokens cannot take contexts of up to %d tokens "
                         "(expected 1 .. %d)", max_tokens, long_prompt, max_tokens);
    s->prefill_tokens = max_tokens;
    s->long_prompt = max_tokens > 0 ? long_prompt : 0;
    return CKV_STATUS_OK;
}

static void slot_clear(ckv_sched_slot *sl) {
    if (sl->sampler_ready) ckv_sampler_free(&sl->sampler);
    ckv_answer_state_free(&sl->answer);
    ckv_logits_free(&sl->lp);
    memset(sl, 0, sizeof *sl);
}

void ckv_sched_free(ckv_sched *s) {
    if (!s) return;
    for (int i = 0; s->slots && i < s->max_slots; i++) slot_clear(&s->slots[i]);
    free(s->slots);
    free(s->events);
    free(s->step_slot);
    free(s->step_tok);
    free(s->step_pick);
    free(s->step_ids);
    memset(s, 0, sizeof *s);
}

ckv_status ckv_sched_admit(ckv_sched *s, const ckv_sched_request *r, int *slot) {
    *slot = -1;
    if (r->n_ctx < 1 || !r->ctx_ids || r->n_q < 0 || (r->n_q > 0 && !r->q_ids) || r->n_choices < 1 || !r->press ||
        r->ctx_question_rows < 0 || r->ctx_question_rows >= r->n_ctx)
        return ckv_error(CKV_STATUS_ERR_ARG, "a request of %d context ids (%d of them a question), %d question ids and %d "
                         "choices", r->n_ctx, r->ctx_question_rows, r->n_q, r->n_choices);
    int free_slot = -1;
    for (int i = 0; i < s->max_slots && free_slot < 0; i++)
        if (s->slots[i].phase == CKV_SLOT_FREE) free_slot = i;
    if (free_slot < 0) return CKV_STATUS_OK;
    ckv_sched_slot *sl = &s->slots[free_slot];
    slot_clear(sl); /* the answer state of the slot's previous request */
    const ckv_engine *e = s->engine;
    ckv_answer_config ac = {.max_tokens = r->max_tokens, .eos_ids = e->stop_ids, .n_eos_ids = e->n_stop_ids,
                            .ignore_eos = r->ignore_eos, .stop_strings = r->stop_strings, .n_stop_strings = r->n_stop_strings,
                            .tok = e->cfg.tokenizer, .keep_text = 1};
    ckv_status st = ckv_sampler_init(&sl->sampler, &r->sampling, e->model->cfg.vocab_size);
    sl->sampler_ready = st == CKV_STATUS_OK;
    if (st == CKV_STATUS_OK) st = ckv_answer_state_init(&sl->answer, &ac);
    ckv_logits_config none = {.repetition_penalty = 1.0f};
    const ckv_logits_config *lc = r->logits ? r->logits : &none;
    if (st == CKV_STATUS_OK) st = ckv_logits_init(&sl->lp, lc, e->model->cfg.vocab_size);
    if (st == CKV_STATUS_OK && lc->grammar)
        st = r->grammar ? ckv_logits_grammar(&sl->lp, r->grammar, e->stop_ids, e->n_stop_ids)
                        : ckv_error(CKV_STATUS_ERR_ARG, "response_format needs the vocabulary's grammar");
    if (st == CKV_STATUS_OK && r->score && !s->exec.score)
        st = ckv_error(CKV_STATUS_ERR_ARG, "this executor cannot score a question (echo with logprobs)");
    if (st != CKV_STATUS_OK) {
        slot_clear(sl);
        return st;
    }
    ckv_logits_prompt(&sl->lp, r->ctx_ids, r->n_ctx);
    ckv_logits_prompt(&sl->lp, r->q_ids, r->n_q);
    sl->req = *r;
    sl->seq = s->admit_seq++;
    sl->phase = CKV_SLOT_PREPARE;
    *slot = free_slot;
    return CKV_STATUS_OK;
}

void ckv_sched_cancel(ckv_sched *s, int slot) {
    if (slot >= 0 && slot < s->max_slots && s->slots[slot].phase != CKV_SLOT_FREE) s->slots[slot].cancel = 1;
}

int ckv_sched_busy(const ckv_sched *s) {
    int n = 0;
    for (int i = 0; i < s->max_slots; i++) n += s->slots[i].phase != CKV_SLOT_FREE;
    return n;
}

/* ---- events ---------------------------------------------------------------------------------------- */

static ckv_sched_event *event_new(ckv_sched *s, ckv_sched_event_kind kind, int slot) {
    ckv_sched_event *ev = &s->events[s->n_events++];
    memset(ev, 0, sizeof *ev);
    ev->kind = kind;
    ev->slot = slot;
    ev->choice = s->slots[slot].choice;
    ev->user = s->slots[slot].req.user;
    ev->token = -1;
    return ev;
}

/* The slot's request is over: its lane is released and the slot is free (the answer state stays
 * readable until the slot is taken again). */
static void slot_end(ckv_sched *s, int slot) {
    s->exec.release(s->exec.ctx, slot);
    ckv_sched_slot *sl = &s->slots[slot];
    if (sl->sampler_ready) ckv_sampler_free(&sl->sampler);
    sl->sampler_ready = 0;
    sl->phase = CKV_SLOT_FREE;
    sl->cancel = 0;
}

static void slot_fail(ckv_sched *s, int slot, ckv_status st) {
    ckv_sched_event *ev = event_new(s, CKV_SCHED_FAILED, slot);
    ev->status = st;
    snprintf(ev->err, sizeof ev->err, "%s", ckv_error_message());
    ev->done = 1;
    ckv_error_clear();
    slot_end(s, slot);
}

/* Every slot of a batched step fails with the step's error (each event carries its message). */
static void slots_fail(ckv_sched *s, const int *slots, int n, ckv_status st) {
    char msg[sizeof s->events[0].err];
    snprintf(msg, sizeof msg, "%s", ckv_error_message());
    for (int i = 0; i < n; i++) {
        ckv_error(st, "%s", msg);
        slot_fail(s, slots[i], st);
    }
}

/* The answer of the slot's choice changed (token >= 0: it took that token); when it ended, the next
 * choice waits for a turn, or the request is done. */
static void answer_event(ckv_sched *s, int slot, int32_t token) {
    ckv_sched_slot *sl = &s->slots[slot];
    ckv_sched_event *ev = event_new(s, CKV_SCHED_ANSWER, slot);
    ev->token = token;
    ev->answer = &sl->answer;
    ckv_finish_reason fin = sl->answer.finish;
    if (fin == CKV_FINISH_NONE) {
        sl->phase = CKV_SLOT_DECODE;
        sl->next = token;
        return;
    }
    ev->done = sl->choice + 1 >= sl->req.n_choices || fin == CKV_FINISH_CANCELLED;
    if (ev->done) {
        slot_end(s, slot);
        return;
    }
    sl->choice++;
    sl->phase = CKV_SLOT_QUESTION;
}

/* The one place a request's next token is chosen: the model's row of logits [V] through the request's
 * logit processing (bias, penalties, the JSON mask), sampled and pushed into its answer; the event
 * carries the model's row (logprobs are of it). A constrained answer ends once its document is whole.
 * logits NULL: `tok` was sampled on the device from the unprocessed row (device_pick said it may be). */
static void take_token(ckv_sched *s, int slot, const float *logits, int32_t tok) {
    ckv_sched_slot *sl = &s->slots[slot];
    if (logits) ckv_answer_state_sample(&sl->answer, &sl->sampler, ckv_logits_apply(&sl->lp, logits), &tok);
    else ckv_answer_state_push(&sl->answer, tok);
    ckv_logits_accept(&sl->lp, tok);
    if (ckv_logits_grammar_finished(&sl->lp)) ckv_answer_state_end(&sl->answer, CKV_FINISH_EOS);
    answer_event(s, slot, tok);
    s->events[s->n_events - 1].logits = logits;
}

static void sample_token(ckv_sched *s, int slot, const float *logits) { take_token(s, slot, logits, -1); }

/* Whether the device sample op picks the slot's next token as the host path would: no log-probabilities
 * asked for, no logit processing (ckv_logits_apply would return the row itself) and no min_p; then
 * *pick holds its settings and the draw the host sampler would make (the sampler advances). */
static int device_pick(ckv_sched_slot *sl, ckv_batch_pick *pick) {
    const ckv_sampler_config *c = &sl->sampler.cfg;
    if (sl->req.logprobs || sl->lp.active || sl->lp.gv || c->min_p > 0.0f) return 0;
    pick->temperature = c->temperature;
    pick->top_k = c->top_k;
    pick->top_p = c->top_p;
    pick->u = 0.0;
    return 1;
}

/* Feeds the question scored (r->score: echo with logprobs) in steps of at most CKV_LOGITS_ROWS ids:
 * question id t's log-probability from the row before it; *last: the row after the question. */
static ckv_status score_question(ckv_sched *s, int slot, const float **last) {
    const ckv_sched_request *r = &s->slots[slot].req;
    const ckv_sched_score *sc = r->score;
    const int V = s->engine->model->cfg.vocab_size, k = sc->top;
    const float *prev = *last, *rows = NULL; /* prev predicts the next id */
    for (int t0 = 0; t0 < r->n_q; t0 += CKV_LOGITS_ROWS) {
        int n = r->n_q - t0 < CKV_LOGITS_ROWS ? r->n_q - t0 : CKV_LOGITS_ROWS;
        /* prev may live in the rows the step overwrites: the first id is scored before it */
        sc->lp[t0] = ckv_logprobs_row(prev, V, r->q_ids[t0], k, sc->top_ids + (size_t)t0 * k, sc->top_lp + (size_t)t0 * k);
        CKV_TRY(s->exec.score(s->exec.ctx, slot, r->q_ids + t0, n, &rows));
        for (int t = 1; t < n; t++) {
            size_t e = (size_t)(t0 + t);
            sc->lp[e] = ckv_logprobs_row(rows + (size_t)(t - 1) * V, V, r->q_ids[e], k, sc->top_ids + e * k, sc->top_lp + e * k);
        }
        prev = rows + (size_t)(n - 1) * V;
    }
    *last = prev;
    return CKV_STATUS_OK;
}

/* ---- units of work ------------------------------------------------------------------------------------ */

/* The question (if any) of the slot's choice and its first token. */
static void begin_choice(ckv_sched *s, int slot) {
    ckv_sched_slot *sl = &s->slots[slot];
    const ckv_sched_request *r = &sl->req;
    ckv_status st = CKV_STATUS_OK;
    if (sl->choice > 0 && (st = s->exec.rewind(s->exec.ctx, slot)) != CKV_STATUS_OK) {
        slot_fail(s, slot, st);
        return;
    }
    ckv_answer_state_reset(&sl->answer);
    ckv_logits_begin(&sl->lp);
    const int score = r->score && sl->choice == 0;
    if (r->max_tokens == 0 && !score) {
        ckv_answer_state_end(&sl->answer, CKV_FINISH_LENGTH);
        answer_event(s, slot, -1);
        return;
    }
    const float *lg = s->exec.context_logits(s->exec.ctx, slot);
    if (r->n_q > 0) {
        st = score ? score_question(s, slot, &lg) : s->exec.question(s->exec.ctx, slot, r->q_ids, r->n_q, &lg);
        if (st != CKV_STATUS_OK) {
            slot_fail(s, slot, st);
            return;
        }
    }
    if (r->max_tokens == 0) {
        ckv_answer_state_end(&sl->answer, CKV_FINISH_LENGTH);
        answer_event(s, slot, -1);
        return;
    }
    sample_token(s, slot, lg);
}

/* batch: contexts of the batched forward that prefilled it (0: none), first: the first of them. */
static void prepared(ckv_sched *s, int slot, int batch, int first) {
    ckv_sched_event *ev = event_new(s, CKV_SCHED_PREPARED, slot);
    s->exec.prepared(s->exec.ctx, slot, &ev->info);
    ev->info.batch = batch;
    ev->info.batch_first = first;
    s->slots[slot].phase = CKV_SLOT_QUESTION;
    begin_choice(s, slot); /* the first token right away: time to first token is prepare + question */
}

/* The slot's context is looked up or its prefill begun (exec.prepare); *ready: restored, nothing to prefill. */
static ckv_status prepare_begin(ckv_sched *s, int slot, int *ready) {
    ckv_sched_slot *sl = &s->slots[slot];
    const ckv_sched_request *r = &sl->req;
    /* a restored context only prefills its question: activation buffers for that many rows */
    int chunk = r->n_q < 1 ? 1 : r->n_q < s->chunk ? r->n_q : s->chunk;
    sl->phase = CKV_SLOT_PREFILL;
    return s->exec.prepare(s->exec.ctx, slot, r->press, r->decode_press, r->n_choices, r->ctx_ids, r->n_ctx,
                           r->ctx_question_rows, r->n_q + r->max_tokens, chunk, ready);
}

static void prepare_unit(ckv_sched *s, int slot) {
    int ready = 0;
    ckv_status st = s->slots[slot].phase == CKV_SLOT_PREPARE ? prepare_begin(s, slot, &ready)
                                                              : s->exec.advance(s->exec.ctx, slot, &ready);
    if (st != CKV_STATUS_OK) slot_fail(s, slot, st);
    else if (ready) prepared(s, slot, 0, 0);
}

static int batchable(const ckv_sched *s, const ckv_sched_slot *sl) {
    return s->prefill_tokens > 0 && sl->phase == CKV_SLOT_PREPARE && sl->req.n_ctx <= s->long_prompt;
}

/* The waiting short contexts, oldest first, as many as fit prefill_tokens, in one forward; a context
 * restored from the executor's store needs none and answers at once. */
static void batch_prefill_unit(ckv_sched *s) {
    int n = 0, tokens = 0;
    for (;;) {
        ckv_sched_slot *next = NULL; /* the oldest waiting short context that still fits */
        for (int i = 0; i < s->max_slots; i++) {
            ckv_sched_slot *sl = &s->slots[i];
            if (batchable(s, sl) && tokens + sl->req.n_ctx <= s->prefill_tokens && (!next || sl->seq < next->seq)) next = sl;
        }
        if (!next) break;
        int slot = (int)(next - s->slots), ready = 0;
        ckv_status st = prepare_begin(s, slot, &ready);
        if (st != CKV_STATUS_OK) {
            slot_fail(s, slot, st);
        } else if (ready) {
            prepared(s, slot, 0, 0);
        } else {
            s->step_slot[n++] = slot;
            tokens += next->req.n_ctx;
        }
    }
    if (n == 0) return;
    ckv_status st = s->exec.prefill(s->exec.ctx, s->step_slot, n);
    if (st != CKV_STATUS_OK) slots_fail(s, s->step_slot, n, st);
    else
        for (int i = 0; i < n; i++) prepared(s, s->step_slot[i], n, i == 0);
}

static void decode_unit(ckv_sched *s) {
    int n = 0;
    for (int i = 0; i < s->max_slots; i++)
        if (s->slots[i].phase == CKV_SLOT_DECODE) {
            s->step_slot[n] = i;
            s->step_tok[n++] = s->slots[i].next;
        }
    s->t_last_decode = ckv_time_now();
    int device = s->exec.decode_ids != NULL;
    for (int r = 0; r < n && device; r++) device = device_pick(&s->slots[s->step_slot[r]], &s->step_pick[r]);
    if (device) { /* the draws only once every lane is known to take them */
        for (int r = 0; r < n; r++) {
            ckv_sched_slot *sl = &s->slots[s->step_slot[r]];
            if (sl->sampler.cfg.temperature > 0.0f) s->step_pick[r].u = ckv_sampler_uniform(&sl->sampler);
        }
        ckv_status st = s->exec.decode_ids(s->exec.ctx, s->step_slot, s->step_tok, n, s->step_pick, s->step_ids);
        if (st != CKV_STATUS_OK) {
            slots_fail(s, s->step_slot, n, st);
            return;
        }
        s->device_steps++;
        for (int r = 0; r < n; r++) take_token(s, s->step_slot[r], NULL, s->step_ids[r]);
        return;
    }
    const float *logits = NULL; // [n, V]
    ckv_status st = s->exec.decode(s->exec.ctx, s->step_slot, s->step_tok, n, &logits);
    size_t V = (size_t)s->engine->model->cfg.vocab_size;
    if (st != CKV_STATUS_OK) slots_fail(s, s->step_slot, n, st);
    else
        for (int r = 0; r < n; r++) sample_token(s, s->step_slot[r], logits + (size_t)r * V);
}

int ckv_sched_turn(ckv_sched *s) {
    s->n_events = 0;
    for (int i = 0; i < s->max_slots; i++) {
        ckv_sched_slot *sl = &s->slots[i];
        if (sl->phase == CKV_SLOT_FREE || !sl->cancel) continue;
        if (sl->phase == CKV_SLOT_QUESTION) ckv_answer_state_reset(&sl->answer); /* it holds the previous choice */
        ckv_answer_state_end(&sl->answer, CKV_FINISH_CANCELLED);
        answer_event(s, i, -1);
    }
    ckv_sched_slot *oldest = NULL;
    int n_dec = 0;
    for (int i = 0; i < s->max_slots; i++) {
        ckv_sched_slot *sl = &s->slots[i];
        n_dec += sl->phase == CKV_SLOT_DECODE;
        if (sl->phase != CKV_SLOT_FREE && sl->phase != CKV_SLOT_DECODE && (!oldest || sl->seq < oldest->seq)) oldest = sl;
    }
    int decode = n_dec > 0 &&
                 (!oldest || (!s->last_was_decode && ckv_time_now() - s->t_last_decode >= s->interleave_s));
    if (decode) {
        decode_unit(s);
    } else if (oldest) {
        int slot = (int)(oldest - s->slots);
        if (oldest->phase == CKV_SLOT_QUESTION) begin_choice(s, slot);
        else if (batchable(s, oldest)) batch_prefill_unit(s);
        else prepare_unit(s, slot);
    }
    s->last_was_decode = decode;
    return s->n_events;
}
