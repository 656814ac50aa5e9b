/* test_sched.c - the engine scheduler (engine/sched.h) on the llama_gqa fixture, through an executor
 * that runs the engine steps on this process and records them: answers equal ckv_engine_run on the
 * same requests (with and without a press, n choices); a long prefill advances one layer per turn
 * with decode steps of a running request between its layers (interleave 0); requests that end
 * inside their first unit (max_tokens 0 and 1, a first token that is an end id) report done exactly
 * once and free their slot and lane, three times over in the same slots; a request cancelled during
 * its context's prefill ends cancelled at the next turn without a token; a failing step fails the
 * request; short contexts waiting together are prefilled in one batched step within the token budget
 * (oldest first; a longer one alone by layers) with answers equal to ckv_engine_run's, and a failing
 * batched step fails each of its requests once with the step's message; sampled answers picked on the
 * device (the executor's decode_ids) equal the host sampler's; nothing leaks. The sanitizer build runs it too (lifetimes). */
#include <stdio.h>
#include <string.h>

#include "ckv_test.h"
#include "core/alloc.h"
#include "engine/batch.h"
#include "engine/sched.h"

#define NSLOT 3
#define NCTX 120

/* ---- an executor over lanes of this process, recording each step ---- */

typedef struct {
    ckv_engine *e;
    ckv_prepared lanes[NSLOT];
    ckv_press_config press[NSLOT];
    ckv_decode_batch batch;
    ckv_prefill_batch prefill;
    char log[4096];   /* one letter per step: P prepare, A advance, B batched prefill, Q question, D decode,
                       * R rewind, X release */
    size_t n_log;
    int live;         /* lanes holding a context */
    int fail_decode;  /* 1: the next decode step fails */
    int fail_prefill; /* 1: the next batched prefill fails */
    int batch_sizes[8], n_batches; /* contexts of each batched prefill */
    int device_steps; /* decode steps sampled on the device */
} local_exec;

static void note(local_exec *x, char c) {
    if (x->n_log + 1 < sizeof x->log) x->log[x->n_log++] = c;
    x->log[x->n_log] = '\0';
}

static ckv_status x_prepare(void *ctx, int slot, const ckv_press_config *press, const ckv_decode_press *decode, int answers,
                            const int32_t *ids, int n, int question_rows, int reserve, int chunk, int *ready) {
    (void)chunk;
    (void)answers;
    if (decode) return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "this executor has no decode-time compression");
    local_exec *x = ctx;
    note(x, 'P');
    x->press[slot] = *press;
    ckv_prepare_params pp = {.ids = ids, .n = n, .question_rows = question_rows, .press = &x->press[slot], .reserve = reserve};
    ckv_status st = ckv_engine_prepare_begin(x->e, &pp, &x->lanes[slot]);
    if (st == CKV_STATUS_OK) x->live++;
    *ready = x->lanes[slot].ready;
    return st;
}

static ckv_status x_advance(void *ctx, int slot, int *ready) {
    local_exec *x = ctx;
    note(x, 'A');
    ckv_status st = ckv_prepared_advance(&x->lanes[slot], ready);
    if (st != CKV_STATUS_OK) x->live--; /* the prepared context was freed */
    return st;
}

static void x_prepared(void *ctx, int slot, ckv_sched_prepared *out) {
    local_exec *x = ctx;
    const ckv_request_stats *rs = &x->lanes[slot].stats;
    *out = (ckv_sched_prepared){.compressed = rs->compressed, .uncompressed_reason = rs->uncompressed_reason,
                                .kept_entries = rs->kept_entries, .total_entries = rs->total_entries,
                                .kv_bytes_full = rs->kv_bytes_full, .kv_bytes_kept = rs->kv_bytes_kept};
}

static const float *x_context_logits(void *ctx, int slot) { return ((local_exec *)ctx)->lanes[slot].logits; }

static ckv_status x_question(void *ctx, int slot, const int32_t *ids, int n, const float **logits) {
    local_exec *x = ctx;
    note(x, 'Q');
    return ckv_session_prefill(&x->lanes[slot].sess, ids, n, NULL, logits);
}

static ckv_status x_decode(void *ctx, const int *slots, const int32_t *tokens, int n, const float **logits) {
    local_exec *x = ctx;
    note(x, 'D');
    if (x->fail_decode) {
        x->fail_decode = 0;
        return ckv_error(CKV_STATUS_ERR_INTERNAL, "decode step failed on purpose");
    }
    ckv_session *sess[NSLOT];
    for (int i = 0; i < n; i++) sess[i] = &x->lanes[slots[i]].sess;
    return ckv_decode_batch_step(&x->batch, sess, tokens, n, logits);
}

/* A decode step sampled on the device: logged 'D' as the host one is (counted in device_steps). */
static ckv_status x_decode_ids(void *ctx, const int *slots, const int32_t *tokens, int n, const ckv_batch_pick *picks,
                               int32_t *ids) {
    local_exec *x = ctx;
    note(x, 'D');
    x->device_steps++;
    if (x->fail_decode) {
        x->fail_decode = 0;
        return ckv_error(CKV_STATUS_ERR_INTERNAL, "decode step failed on purpose");
    }
    ckv_session *sess[NSLOT];
    for (int i = 0; i < n; i++) sess[i] = &x->lanes[slots[i]].sess;
    return ckv_decode_batch_step_ids(&x->batch, sess, tokens, n, picks, ids);
}

static ckv_status x_prefill(void *ctx, const int *slots, int n) {
    local_exec *x = ctx;
    note(x, 'B');
    if (x->n_batches < 8) x->batch_sizes[x->n_batches++] = n;
    ckv_prepared *pcs[NSLOT];
    for (int i = 0; i < n; i++) pcs[i] = &x->lanes[slots[i]];
    ckv_status st = x->fail_prefill ? ckv_error(CKV_STATUS_ERR_NOMEM, "batched prefill failed on purpose")
                                    : ckv_prepared_advance_batch(pcs, n, &x->prefill);
    if (st != CKV_STATUS_OK) { /* the prepared contexts were freed */
        for (int i = 0; i < n; i++) ckv_prepared_free(pcs[i]);
        x->live -= n;
        x->fail_prefill = 0;
    }
    return st;
}

static ckv_status x_rewind(void *ctx, int slot) {
    local_exec *x = ctx;
    note(x, 'R');
    return ckv_session_rewind(&x->lanes[slot].sess);
}

static void x_release(void *ctx, int slot) {
    local_exec *x = ctx;
    note(x, 'X');
    if (x->lanes[slot].engine) x->live--;
    ckv_prepared_free(&x->lanes[slot]);
}

static void exec_init(local_exec *x, ckv_engine *e, ckv_sched_exec *out) {
    memset(x, 0, sizeof *x);
    x->e = e;
    CHECK_OK(ckv_decode_batch_init(&x->batch, e->model, NSLOT));
    CHECK_OK(ckv_prefill_batch_init(&x->prefill, e->model, 128, NSLOT));
    *out = (ckv_sched_exec){x_prepare, x_advance, x_prepared, x_context_logits, x_question, x_decode, x_rewind, x_release, x,
                            NULL, x_prefill, x_decode_ids};
}

static void exec_free(local_exec *x) {
    for (int i = 0; i < NSLOT; i++) ckv_prepared_free(&x->lanes[i]);
    ckv_decode_batch_free(&x->batch);
    ckv_prefill_batch_free(&x->prefill);
}

/* A scheduler of NSLOT slots over a fresh recording executor. */
static void sched_setup(ckv_engine *e, local_exec *x, ckv_sched_exec *ex, ckv_sched *s, double interleave_s) {
    exec_init(x, e, ex);
    CHECK_OK(ckv_sched_init(s, e, ex, NSLOT, interleave_s));
}

/* ---- what a request received ---- */

typedef struct {
    int32_t ids[4][64];
    int n[4];
    ckv_finish_reason finish[4];
    int prepared, done, failed, tokens;
    ckv_status status;
} got;

static void take_events(ckv_sched *s) {
    for (int i = 0; i < s->n_events; i++) {
        const ckv_sched_event *ev = &s->events[i];
        got *g = ev->user;
        CHECK_MSG(g->done == 0, "an event after the request's done event (slot %d)", ev->slot);
        if (ev->kind == CKV_SCHED_PREPARED) g->prepared++;
        if (ev->kind == CKV_SCHED_ANSWER) {
            const ckv_answer_state *a = ev->answer;
            g->tokens += ev->token >= 0;
            g->n[ev->choice] = a->n_ids < 64 ? a->n_ids : 64;
            memcpy(g->ids[ev->choice], a->ids, sizeof(int32_t) * (size_t)g->n[ev->choice]);
            g->finish[ev->choice] = a->finish;
        }
        if (ev->kind == CKV_SCHED_FAILED) {
            g->failed++;
            g->status = ev->status;
        }
        g->done += ev->done;
    }
}

static void turn(ckv_sched *s) {
    ckv_sched_turn(s);
    take_events(s);
}

/* Turns until the scheduler holds nothing (bounded). */
static void run_all(ckv_sched *s) {
    for (int t = 0; t < 2000 && ckv_sched_busy(s) > 0; t++) {
        ckv_sched_turn(s);
        take_events(s);
    }
    CHECK_MSG(ckv_sched_busy(s) == 0, "%d requests still held after 2000 turns", ckv_sched_busy(s));
}

static ckv_sched_request request_of(const int32_t *ctx, int n_ctx, const int32_t *q, int n_q, const ckv_press_config *press,
                                    int max_tokens, int n_choices, got *g) {
    ckv_sched_request r = {.ctx_ids = ctx, .n_ctx = n_ctx, .q_ids = q, .n_q = n_q, .press = press, .max_tokens = max_tokens,
                           .n_choices = n_choices, .ignore_eos = 1, .user = g};
    r.sampling.top_p = 1.0f;
    memset(g, 0, sizeof *g);
    return r;
}

static void press_of(ckv_press_config *p, const char *spec, double budget) {
    CHECK_OK(ckv_press_parse(p, spec));
    if (budget > 0) CHECK_OK(ckv_press_set_budget(p, budget));
    CHECK_OK(ckv_press_finalize(p));
}

/* One test's scheduler over a fresh recording executor, with the two presses the tests use. */
typedef struct {
    ckv_press_config none, snap; /* the full cache; snapkv at budget 0.5 */
    local_exec x;
    ckv_sched_exec ex;
    ckv_sched s;
} sched_case;

static void case_setup(sched_case *c, ckv_engine *e, double interleave_s) {
    press_of(&c->none, "none", 0);
    press_of(&c->snap, "snapkv", 0.5);
    sched_setup(e, &c->x, &c->ex, &c->s, interleave_s);
}

/* Checks that the scheduler holds nothing and no lane a context, then frees both. */
static void case_free(sched_case *c) {
    CHECK_MSG(ckv_sched_busy(&c->s) == 0 && c->x.live == 0, "%d requests held, %d lanes still hold a context",
              ckv_sched_busy(&c->s), c->x.live);
    ckv_sched_free(&c->s);
    exec_free(&c->x);
}

/* The same request through ckv_engine_run: its greedy answer. */
static void reference(ckv_engine *e, const int32_t *ctx, int n_ctx, const int32_t *q, int n_q, const ckv_press_config *press,
                      int max_tokens, ckv_result *out) {
    ckv_question qs = {q, n_q, 0};
    ckv_request r = {.context = ctx, .n_context = n_ctx, .questions = n_q ? &qs : NULL, .n_questions = n_q ? 1 : 0,
                     .press = press};
    r.gen.max_new_tokens = max_tokens;
    r.gen.ignore_eos = 1;
    r.gen.sampling.top_p = 1.0f;
    CHECK_OK(ckv_engine_run(e, &r, out));
}

static void check_same(const char *what, const got *g, int choice, const ckv_answer *a) {
    int same = g->n[choice] == a->n && !memcmp(g->ids[choice], a->ids, sizeof(int32_t) * (size_t)a->n);
    CHECK_MSG(same, "%s: choice %d has %d ids, the engine's answer %d (first ids %d vs %d)", what, choice, g->n[choice], a->n,
              g->n[choice] ? g->ids[choice][0] : -1, a->n ? a->ids[0] : -1);
}

static void test_answers_and_interleaving(ckv_engine *e, const int32_t *ctx) {
    int32_t q[] = {9, 8, 7};
    sched_case sc;
    case_setup(&sc, e, 0.0);
    got a, b, c;
    ckv_sched_request ra = request_of(ctx, 40, NULL, 0, &sc.none, 12, 1, &a);
    ckv_sched_request rb = request_of(ctx + 10, NCTX - 10, q, 3, &sc.snap, 5, 2, &b);
    ckv_sched_request rc = request_of(ctx + 3, 60, q, 1, &sc.none, 6, 1, &c);
    int slot = -1;
    CHECK_OK(ckv_sched_admit(&sc.s, &ra, &slot));
    CHECK(slot == 0);
    /* a's context (3 layers) then its first token, then it decodes */
    for (int t = 0; t < 4; t++) turn(&sc.s);
    CHECK_MSG(a.prepared == 1 && a.tokens == 1, "a: prepared %d, %d tokens after four turns", a.prepared, a.tokens);
    CHECK_OK(ckv_sched_admit(&sc.s, &rb, &slot));
    CHECK_OK(ckv_sched_admit(&sc.s, &rc, &slot));
    size_t from = sc.x.n_log;
    run_all(&sc.s);
    /* b's prefill: a prepare and an advance per layer, a decode step of a between each two of them */
    const char *steps = sc.x.log + from;
    fprintf(stderr, "     steps after b and c were admitted: %.60s\n", steps);
    CHECK_MSG(!strncmp(steps, "DPDADADA", 8), "b's prefill interleaves with a's decode steps: %s", steps);
    ckv_result ref;
    reference(e, ctx, 40, NULL, 0, &sc.none, 12, &ref);
    check_same("a (no press, no question)", &a, 0, &ref.answers[0]);
    ckv_result_free(&ref);
    reference(e, ctx + 10, NCTX - 10, q, 3, &sc.snap, 5, &ref);
    check_same("b (snapkv, question), choice 0", &b, 0, &ref.answers[0]);
    check_same("b (snapkv, question), choice 1", &b, 1, &ref.answers[0]); /* greedy: each choice the same */
    ckv_result_free(&ref);
    reference(e, ctx + 3, 60, q, 1, &sc.none, 6, &ref);
    check_same("c", &c, 0, &ref.answers[0]);
    ckv_result_free(&ref);
    CHECK(a.done == 1 && b.done == 1 && c.done == 1 && a.finish[0] == CKV_FINISH_LENGTH && b.finish[1] == CKV_FINISH_LENGTH);
    CHECK_MSG(strchr(steps, 'R') != NULL, "b's second choice rewinds to the context: %s", steps);
    case_free(&sc);
}

static void test_short_answers(ckv_engine *e, const int32_t *ctx) {
    sched_case sc;
    case_setup(&sc, e, 0.05);
    ckv_result ref;
    reference(e, ctx, 5, NULL, 0, &sc.none, 1, &ref);
    int32_t first = ref.answers[0].n ? ref.answers[0].ids[0] : -1;
    ckv_result_free(&ref);
    for (int round = 0; round < 3; round++) { /* the same slots taken again and again */
        got g0, g1, g2, g3;
        ckv_sched_request r0 = request_of(ctx, 5, NULL, 0, &sc.none, 0, 1, &g0);
        ckv_sched_request r1 = request_of(ctx, 5, NULL, 0, &sc.none, 1, 1, &g1);
        ckv_sched_request r2 = request_of(ctx, 5, NULL, 0, &sc.none, 1, 3, &g2);
        int slot;
        CHECK_OK(ckv_sched_admit(&sc.s, &r0, &slot));
        CHECK_OK(ckv_sched_admit(&sc.s, &r1, &slot));
        CHECK_OK(ckv_sched_admit(&sc.s, &r2, &slot));
        ckv_sched_request r3 = request_of(ctx, 5, NULL, 0, &sc.none, 1, 1, &g3);
        CHECK_OK(ckv_sched_admit(&sc.s, &r3, &slot));
        CHECK_MSG(slot == -1, "a fourth request found a slot (%d) of three", slot);
        run_all(&sc.s);
        CHECK_MSG(g0.done == 1 && g0.tokens == 0 && g0.n[0] == 0 && g0.finish[0] == CKV_FINISH_LENGTH,
                  "max_tokens 0: done %d, %d tokens, finish %s", g0.done, g0.tokens, ckv_finish_reason_name(g0.finish[0]));
        CHECK_MSG(g1.done == 1 && g1.tokens == 1 && g1.n[0] == 1 && g1.ids[0][0] == first && g1.finish[0] == CKV_FINISH_LENGTH,
                  "max_tokens 1: done %d, %d tokens, first %d (want %d)", g1.done, g1.tokens, g1.n[0] ? g1.ids[0][0] : -1, first);
        CHECK_MSG(g2.done == 1 && g2.tokens == 3 && g2.finish[2] == CKV_FINISH_LENGTH, "max_tokens 1, n 3: done %d, %d tokens",
                  g2.done, g2.tokens);
    }
    /* a first token that is an end id ends the answer inside its first unit */
    int32_t saved[CKV_ENGINE_MAX_STOP_IDS];
    int n_saved = e->n_stop_ids;
    memcpy(saved, e->stop_ids, sizeof saved);
    e->stop_ids[0] = first;
    e->n_stop_ids = 1;
    for (int round = 0; round < 3; round++) {
        got g;
        ckv_sched_request r = request_of(ctx, 5, NULL, 0, &sc.none, 8, 2, &g);
        r.ignore_eos = 0;
        int slot;
        CHECK_OK(ckv_sched_admit(&sc.s, &r, &slot));
        run_all(&sc.s);
        CHECK_MSG(g.done == 1 && g.n[0] == 0 && g.finish[0] == CKV_FINISH_EOS && g.finish[1] == CKV_FINISH_EOS,
                  "first-token eos: done %d, %d ids, finish %s / %s", g.done, g.n[0], ckv_finish_reason_name(g.finish[0]),
                  ckv_finish_reason_name(g.finish[1]));
    }
    memcpy(e->stop_ids, saved, sizeof saved);
    e->n_stop_ids = n_saved;
    case_free(&sc);
}

static void test_cancel_and_failure(ckv_engine *e, const int32_t *ctx) {
    sched_case sc;
    case_setup(&sc, e, 0.05);
    for (int round = 0; round < 3; round++) { /* cancelled after its prepare, then after one layer */
        got g;
        ckv_sched_request r = request_of(ctx, NCTX, NULL, 0, &sc.snap, 4, 2, &g);
        int slot;
        CHECK_OK(ckv_sched_admit(&sc.s, &r, &slot));
        for (int t = 0; t < 1 + (round > 0); t++) turn(&sc.s);
        CHECK(g.prepared == 0 && g.done == 0);
        ckv_sched_cancel(&sc.s, slot);
        ckv_sched_turn(&sc.s);
        take_events(&sc.s);
        CHECK_MSG(g.done == 1 && g.tokens == 0 && g.finish[0] == CKV_FINISH_CANCELLED,
                  "cancelled during its prefill: done %d, %d tokens, finish %s", g.done, g.tokens,
                  ckv_finish_reason_name(g.finish[0]));
        CHECK(ckv_sched_busy(&sc.s) == 0 && sc.x.live == 0);
    }
    /* a decode step that fails fails every request in it, once */
    got g1, g2;
    ckv_sched_request r1 = request_of(ctx, 30, NULL, 0, &sc.snap, 6, 1, &g1);
    ckv_sched_request r2 = request_of(ctx + 1, 30, NULL, 0, &sc.snap, 6, 1, &g2);
    int slot;
    CHECK_OK(ckv_sched_admit(&sc.s, &r1, &slot));
    CHECK_OK(ckv_sched_admit(&sc.s, &r2, &slot));
    for (int t = 0; t < 40 && !(g1.tokens && g2.tokens); t++) turn(&sc.s);
    CHECK(g1.tokens >= 1 && g2.tokens >= 1 && !g1.done && !g2.done);
    sc.x.fail_decode = 1;
    run_all(&sc.s);
    CHECK_MSG(g1.failed == 1 && g2.failed == 1 && g1.done == 1 && g2.done == 1 && g1.status == CKV_STATUS_ERR_INTERNAL,
              "failed decode: failed %d / %d, done %d / %d", g1.failed, g2.failed, g1.done, g2.done);
    case_free(&sc);
}

static void test_batched_prefill(ckv_engine *e, const int32_t *ctx) {
    int32_t q[] = {9, 8, 7};
    sched_case sc;
    case_setup(&sc, e, 0.0);
    CHECK_FAILS(ckv_sched_batch_prefill(&sc.s, 100, 101), CKV_STATUS_ERR_RANGE, "expected 1 .. 100");
    ckv_sched_exec no_prefill = sc.ex;
    no_prefill.prefill = NULL;
    ckv_sched s2;
    CHECK_OK(ckv_sched_init(&s2, e, &no_prefill, NSLOT, 0.0));
    CHECK_FAILS(ckv_sched_batch_prefill(&s2, 100, 50), CKV_STATUS_ERR_ARG, "cannot prefill several");
    ckv_sched_free(&s2);
    CHECK_OK(ckv_sched_batch_prefill(&sc.s, 100, 60));
    /* a (40) and b (60, snapkv, a question) fill the budget: one batched step; c (30) waits for the next;
     * then d (120, over the threshold) prefills alone, one layer per turn */
    got a, b, c, d;
    ckv_sched_request ra = request_of(ctx, 40, NULL, 0, &sc.none, 6, 1, &a);
    ckv_sched_request rb = request_of(ctx + 10, 60, q, 3, &sc.snap, 5, 2, &b);
    ckv_sched_request rc = request_of(ctx + 3, 30, q, 1, &sc.none, 4, 1, &c);
    int slot;
    CHECK_OK(ckv_sched_admit(&sc.s, &ra, &slot));
    CHECK_OK(ckv_sched_admit(&sc.s, &rb, &slot));
    CHECK_OK(ckv_sched_admit(&sc.s, &rc, &slot));
    turn(&sc.s);
    CHECK_MSG(!strcmp(sc.x.log, "PPBQ"), "the first turn prepares a and b, prefills both in one step and asks b's question: %s", sc.x.log);
    CHECK_MSG(a.prepared == 1 && b.prepared == 1 && a.tokens == 1 && b.tokens == 1 && c.prepared == 0,
              "after the batched step: prepared %d %d %d, tokens %d %d", a.prepared, b.prepared, c.prepared, a.tokens, b.tokens);
    run_all(&sc.s);
    CHECK_MSG(sc.x.n_batches == 2 && sc.x.batch_sizes[0] == 2 && sc.x.batch_sizes[1] == 1, "%d batched steps of %d and %d contexts",
              sc.x.n_batches, sc.x.batch_sizes[0], sc.x.batch_sizes[1]);
    ckv_result ref;
    reference(e, ctx, 40, NULL, 0, &sc.none, 6, &ref);
    check_same("a (batched, no press)", &a, 0, &ref.answers[0]);
    ckv_result_free(&ref);
    reference(e, ctx + 10, 60, q, 3, &sc.snap, 5, &ref);
    check_same("b (batched, snapkv, question), choice 0", &b, 0, &ref.answers[0]);
    check_same("b (batched, snapkv, question), choice 1", &b, 1, &ref.answers[0]);
    ckv_result_free(&ref);
    reference(e, ctx + 3, 30, q, 1, &sc.none, 4, &ref);
    check_same("c (the second batch)", &c, 0, &ref.answers[0]);
    ckv_result_free(&ref);
    size_t from = sc.x.n_log;
    ckv_sched_request rd = request_of(ctx, NCTX, NULL, 0, &sc.snap, 3, 1, &d);
    CHECK_OK(ckv_sched_admit(&sc.s, &rd, &slot));
    run_all(&sc.s);
    CHECK_MSG(!strncmp(sc.x.log + from, "PAAA", 4) && sc.x.n_batches == 2, "a long context prefills alone by layers: %s", sc.x.log + from);
    reference(e, ctx, NCTX, NULL, 0, &sc.snap, 3, &ref);
    check_same("d (long, alone)", &d, 0, &ref.answers[0]);
    ckv_result_free(&ref);
    /* a failing batched step fails each of its requests once, with its message */
    got f1, f2;
    ckv_sched_request r1 = request_of(ctx, 20, NULL, 0, &sc.snap, 3, 1, &f1);
    ckv_sched_request r2 = request_of(ctx + 5, 20, NULL, 0, &sc.none, 3, 1, &f2);
    CHECK_OK(ckv_sched_admit(&sc.s, &r1, &slot));
    CHECK_OK(ckv_sched_admit(&sc.s, &r2, &slot));
    sc.x.fail_prefill = 1;
    ckv_sched_turn(&sc.s);
    int with_msg = 0;
    for (int i = 0; i < sc.s.n_events; i++) with_msg += sc.s.events[i].kind == CKV_SCHED_FAILED && strstr(sc.s.events[i].err, "on purpose");
    take_events(&sc.s);
    CHECK_MSG(f1.failed == 1 && f2.failed == 1 && f1.done == 1 && f2.done == 1 && f1.status == CKV_STATUS_ERR_NOMEM && with_msg == 2,
              "failed batched prefill: failed %d / %d, done %d / %d, %d messages", f1.failed, f2.failed, f1.done, f2.done, with_msg);
    case_free(&sc);
}

/* Sampled answers (temperature, top-k, top-p, a seed; two choices) are the same ids whether the device
 * sample op picks them (logprobs 0: every decode step on the device) or the host sampler does
 * (logprobs 1, or a logit bias: every step downloads its rows and the events carry them). */
static void test_device_sampling(ckv_engine *e, const int32_t *ctx) {
    int32_t q[] = {9, 8, 7};
    got g[3][2];
    int device_steps[3];
    ckv_logits_config bias = {.repetition_penalty = 1.0f, .n_bias = 1, .bias_ids = {5}, .bias = {0.0f}};
    for (int mode = 0; mode < 3; mode++) { /* 0: device, 1: logprobs, 2: a (zero) logit bias */
        sched_case sc;
        case_setup(&sc, e, 0.0);
        ckv_sched_request r[2];
        for (int k = 0; k < 2; k++) {
            r[k] = request_of(ctx + 7 * k, 50 + 20 * k, q, 3 - k, k ? &sc.snap : &sc.none, 10, 2, &g[mode][k]);
            r[k].sampling = (ckv_sampler_config){.temperature = 0.8f + 0.3f * (float)k, .top_k = k ? 0 : 40,
                                                 .top_p = k ? 0.9f : 0.95f, .seed = 11u + (unsigned)k};
            r[k].logprobs = mode == 1;
            if (mode == 2) r[k].logits = &bias;
            int slot = -1;
            CHECK_OK(ckv_sched_admit(&sc.s, &r[k], &slot));
        }
        run_all(&sc.s);
        device_steps[mode] = sc.x.device_steps;
        case_free(&sc);
    }
    CHECK_MSG(device_steps[0] > 0 && device_steps[1] == 0 && device_steps[2] == 0,
              "decode steps on the device: %d (plain), %d (logprobs), %d (logit bias); expected > 0, 0, 0",
              device_steps[0], device_steps[1], device_steps[2]);
    for (int mode = 1; mode < 3; mode++)
        for (int k = 0; k < 2; k++)
            for (int c = 0; c < 2; c++) {
                const got *a = &g[0][k], *b = &g[mode][k];
                int same = a->n[c] == b->n[c] && !memcmp(a->ids[c], b->ids[c], sizeof(int32_t) * (size_t)a->n[c]);
                int at = 0;
                while (at < a->n[c] && at < b->n[c] && a->ids[c][at] == b->ids[c][at]) at++;
                CHECK_MSG(same, "request %d choice %d: device-sampled answer (%d ids) differs from the host's (mode %d, %d ids) "
                          "at id %d", k, c, a->n[c], mode, b->n[c], at);
            }
}

int main(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/llama_gqa", CKV_FIXTURES);
    const size_t live0 = ckv_alloc_live_bytes();
    ckv_engine_config cfg = {.model_path = dir, .backend = "cpu", .threads = 2, .device = -1, .chunk = 32,
                             .kv_dtype = CKV_DTYPE_DEFAULT, .weights_dtype = CKV_DTYPE_DEFAULT};
    ckv_engine e;
    CHECK_OK(ckv_engine_init(&e, &cfg, NULL));
    if (!e.model) return ckv_test_finish("test_sched");
    int32_t ctx[NCTX];
    for (int i = 0; i < NCTX; i++) ctx[i] = 3 + (i * 53) % 480;
    test_answers_and_interleaving(&e, ctx);
    test_short_answers(&e, ctx);
    test_cancel_and_failure(&e, ctx);
    test_batched_prefill(&e, ctx);
    test_device_sampling(&e, ctx);
    ckv_engine_free(&e);
    CHECK_MSG(ckv_alloc_live_bytes() == live0, "%zu bytes live, %zu before", ckv_alloc_live_bytes(), live0);
    return ckv_test_finish("test_sched");
}
