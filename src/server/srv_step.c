/* srv_step.c - the server's engine steps, run alike on every rank of the group (see srv_step.h): the
 * message format (a fixed header, then a payload whose size the header gives), the leader's send, the
 * followers' loop and the one executor both call. */
#define _POSIX_C_SOURCE 200809L
#include "server/srv_step.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/log.h"
#include "core/timer.h"

typedef enum {
    STEP_NOP = 0, STEP_PREPARE, STEP_ADVANCE, STEP_QUESTION, STEP_DECODE, STEP_REWIND, STEP_RELEASE, STEP_PREFILL, STEP_QUIT
} step_kind;

static const char *const step_names[] = {"heartbeat", "prepare", "advance", "question", "decode", "rewind", "release",
                                         "prefill", "quit"};

typedef struct {
    int32_t kind, slot;
    int32_t n;              /* ids (prepare, question) or sequences (decode, prefill) */
    int32_t reserve, chunk; /* prepare; reserve of a question: 1 keeps every position's logits (score) */
    int32_t failed;         /* quit: the leader stopped because of an error */
    uint64_t payload;       /* bytes that follow */
    int32_t answers;        /* prepare: the answers the lane gives */
    int32_t question_rows;  /* prepare: the last ids that are a question compressed with the context */
} step_head;

static int multi(const ckv_srv_steps *s) { return s->group && s->group->size > 1; }

ckv_status ckv_srv_steps_init(ckv_srv_steps *s, ckv_engine *e, int max_batch, int max_batch_tokens, size_t cache_bytes,
                              const char *cache_dir) {
    memset(s, 0, sizeof *s);
    /* the same on every rank, so it fails alike everywhere */
    if (max_batch < 1 || max_batch > CKV_LOGITS_ROWS)
        return ckv_error(CKV_STATUS_ERR_RANGE, "--max-batch %d: expected 1..%d", max_batch, CKV_LOGITS_ROWS);
    if (max_batch_tokens < 0) return ckv_error(CKV_STATUS_ERR_RANGE, "--max-batch-tokens %d: expected >= 0", max_batch_tokens);
    s->max_batch_tokens = max_batch_tokens;
    s->engine = e;
    s->group = e->tp;
    s->leader = !s->group || s->group->rank == 0;
    s->max_batch = max_batch;
    /* a heartbeat well inside the followers' timeout (and at least every second) */
    s->heartbeat_s = s->group && s->group->timeout_s > 0 && s->group->timeout_s / 4 < 1.0 ? s->group->timeout_s / 4 : 1.0;
    int ctx_max = e->model->cfg.max_context;
    s->msg_cap = sizeof(ckv_press_config) + sizeof(ckv_decode_press) +
                 sizeof(int32_t) * (size_t)(ctx_max > 2 * max_batch ? ctx_max : 2 * max_batch);
    ckv_status st = ckv_srv_store_init(&s->store, e, cache_bytes, cache_dir);
    if (st == CKV_STATUS_OK) {
        s->lanes = calloc((size_t)max_batch, sizeof *s->lanes);
        s->step_sess = calloc((size_t)max_batch, sizeof *s->step_sess);
        s->step_tok = calloc((size_t)max_batch, sizeof *s->step_tok);
        s->step_pc = calloc((size_t)max_batch, sizeof *s->step_pc);
        s->status_all = calloc(s->group ? (size_t)s->group->size : 1, sizeof *s->status_all);
        s->stats_all = calloc(4 * (s->group ? (size_t)s->group->size : 1), sizeof *s->stats_all);
        s->decode_stats = calloc((size_t)max_batch, sizeof *s->decode_stats);
        if (!s->lanes || !s->step_sess || !s->step_tok || !s->step_pc || !s->status_all || !s->stats_all || !s->decode_stats)
            st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the server's engine steps");
    }
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&s->msg, s->msg_cap, "server step messages");
    if (st == CKV_STATUS_OK)
        st = ckv_alloc((void **)&s->score_logits, sizeof(float) * CKV_LOGITS_ROWS * (size_t)e->model->cfg.vocab_size,
                       "scored question logits");
    if (st == CKV_STATUS_OK) st = ckv_decode_batch_init(&s->batch, e->model, max_batch);
    if (st == CKV_STATUS_OK && max_batch_tokens > 0) /* as many sequences as slots, at least a token each */
        st = ckv_prefill_batch_init(&s->prefill, e->model, max_batch_tokens, max_batch < max_batch_tokens ? max_batch : max_batch_tokens);
    if (multi(s)) { /* every rank starts, or none does */
        int32_t ok = st == CKV_STATUS_OK, self = ok;
        ckv_status cs = s->group->ops->allreduce_i32(s->group, (int *)&ok, 1, CKV_COMM_OP_MIN);
        if (cs != CKV_STATUS_OK) st = cs;
        else if (self && !ok)
            st = ckv_error(CKV_STATUS_ERR_ARG, "another rank of the tensor-parallel group could not start serving (its log says why)");
    }
    if (st != CKV_STATUS_OK) ckv_srv_steps_free(s);
    return st;
}

static void lane_free(ckv_srv_lane *l) {
    ckv_decode_state_free(&l->ds);
    ckv_srv_entry_free(l->copy);
    ckv_prepared_free(&l->pc);
    free(l->ids);
    memset(l, 0, sizeof *l);
}

void ckv_srv_steps_free(ckv_srv_steps *s) {
    if (!s) return;
    for (int i = 0; s->lanes && i < s->max_batch; i++) lane_free(&s->lanes[i]);
    ckv_decode_batch_free(&s->batch);
    ckv_prefill_batch_free(&s->prefill);
    ckv_srv_store_free(&s->store);
    free(s->lanes);
    free(s->step_sess);
    free(s->step_tok);
    free(s->step_pc);
    free(s->status_all);
    free(s->stats_all);
    free(s->decode_stats);
    ckv_free(s->msg);
    ckv_free(s->score_logits);
    memset(s, 0, sizeof *s);
}

/* ---- messages ---------------------------------------------------------------------------------------- */

/* Leader: the step's header and payload to every follower. A failed broadcast ends the job (the
 * communicator's timeout names the operation); its status is returned for completeness. */
static ckv_status send_step(ckv_srv_steps *s, step_head *h, const void *payload) {
    if (!multi(s)) return CKV_STATUS_OK;
    s->t_last_sent = ckv_time_now();
    CKV_TRY(s->group->ops->bcast(s->group, h, sizeof *h, 0));
    if (h->payload > 0) CKV_TRY(s->group->ops->bcast(s->group, (void *)payload, (size_t)h->payload, 0));
    return CKV_STATUS_OK;
}

/* Every rank: the step's status on each rank; returns st, or (when st is OK but another rank failed)
 * an error naming that rank and the step. */
static ckv_status agree(ckv_srv_steps *s, ckv_status st, int kind) {
    if (!multi(s)) return st;
    int32_t mine = (int32_t)st;
    ckv_status cs = s->group->ops->allgather(s->group, &mine, s->status_all, sizeof mine);
    if (cs != CKV_STATUS_OK) return cs;
    if (st != CKV_STATUS_OK) return st;
    for (int r = 0; r < s->group->size; r++)
        if (s->status_all[r] != CKV_STATUS_OK)
            return ckv_error((ckv_status)s->status_all[r], "the %s step failed on rank %d of the tensor-parallel group (its "
                             "log says why)", step_names[kind], r);
    return CKV_STATUS_OK;
}

static int valid_slot(const ckv_srv_steps *s, int slot) { return slot >= 0 && slot < s->max_batch; }

typedef enum { LANE_EMPTY = 0, LANE_PREPARING, LANE_READY } lane_state;

static lane_state lane_of(const ckv_srv_steps *s, int slot) {
    const ckv_prepared *pc = &s->lanes[slot].pc;
    return !pc->engine ? LANE_EMPTY : pc->ready ? LANE_READY : LANE_PREPARING;
}

/* 1 when step `kind` may run on lane `slot` (decode: each of its lanes), on every rank alike. */
static int step_fits(const ckv_srv_steps *s, int kind, int slot) {
    switch ((step_kind)kind) {
    case STEP_NOP:
    case STEP_QUIT: return 1;
    case STEP_PREPARE:
    case STEP_RELEASE: return valid_slot(s, slot);
    case STEP_ADVANCE:
    case STEP_PREFILL: return valid_slot(s, slot) && lane_of(s, slot) == LANE_PREPARING;
    case STEP_QUESTION:
    case STEP_DECODE:
    case STEP_REWIND: return valid_slot(s, slot) && lane_of(s, slot) == LANE_READY;
    }
    return 0;
}

/* ---- the executor (every rank) ------------------------------------------------------------------------ */

/* The decode-time compression state of the lane's next answer, sized for its session as it is now
 * (the pools keep their size until the answer ends). */
static ckv_status answer_begin(ckv_srv_lane *l) {
    ckv_decode_state_free(&l->ds);
    return ckv_decode_state_init(&l->ds, &l->decode, &l->pc.sess, 0, NULL);
}

/* A lane's context became ready: it goes into the store (a prefilled one) and the group's entries
 * and bytes are summed for its usage. */
static ckv_status lane_ready(ckv_srv_steps *s, int slot) {
    ckv_srv_lane *l = &s->lanes[slot];
    const char *spec = l->press.scorer == CKV_SCORER_NONE ? "none" : l->press.spec;
    if (l->ids && ckv_srv_store_put(&s->store, spec, l->ids, l->n, &l->pc) != CKV_STATUS_OK) {
        CKV_LOG_WARN("context store: %s", ckv_error_message());
        ckv_error_clear();
    }
    free(l->ids);
    l->ids = NULL;
    const ckv_request_stats *rs = &l->pc.stats;
    int64_t mine[4] = {rs->kept_entries, rs->total_entries, (int64_t)rs->kv_bytes_full, (int64_t)rs->kv_bytes_kept};
    int64_t sum[4] = {mine[0], mine[1], mine[2], mine[3]};
    if (multi(s)) { /* usage reports the whole group's entries and bytes */
        CKV_TRY(s->group->ops->allgather(s->group, mine, s->stats_all, sizeof mine));
        for (int k = 0; k < 4; k++) sum[k] = 0;
        for (int r = 0; r < s->group->size; r++)
            for (int k = 0; k < 4; k++) sum[k] += s->stats_all[4 * r + k];
        int rep = s->engine->model->plan.kv_replicas > 1 ? s->engine->model->plan.kv_replicas : 1;
        for (int k = 0; k < 4; k++) sum[k] /= rep; /* a KV head held by several ranks counts once */
    }
    ckv_sched_prepared *in = &l->info;
    in->compressed = rs->compressed;
    in->uncompressed_reason = l->press.scorer == CKV_SCORER_NONE ? NULL : rs->uncompressed_reason;
    in->kept_entries = (long)sum[0];
    in->total_entries = (long)sum[1];
    in->kv_bytes_full = (size_t)sum[2];
    in->kv_bytes_kept = (size_t)sum[3];
    if (!l->decode.interval) return CKV_STATUS_OK;
    /* the context as prepared, for an answer after one that cut it (every rank decides alike) */
    ckv_status st = l->answers > 1 ? ckv_srv_store_copy(&s->store, &l->pc, &l->copy) : CKV_STATUS_OK;
    if (st == CKV_STATUS_OK) st = answer_begin(l);
    return agree(s, st, STEP_PREPARE);
}

static ckv_status exec_prepare(ckv_srv_steps *s, int slot, const ckv_press_config *press, const ckv_decode_press *decode,
                               int answers, const int32_t *ids, int n, int question_rows, int reserve, int chunk, int *ready) {
    ckv_srv_lane *l = &s->lanes[slot];
    lane_free(l);
    l->press = *press;
    l->press.spec[sizeof l->press.spec - 1] = l->press.profile[sizeof l->press.profile - 1] = '\0';
    if (decode) {
        l->decode = *decode;
        l->decode.spec[sizeof l->decode.spec - 1] = '\0';
        l->decode.press.spec[sizeof l->decode.press.spec - 1] = l->decode.press.profile[sizeof l->decode.press.profile - 1] = '\0';
    }
    l->answers = answers;
    l->reserve = reserve;
    l->chunk = chunk;
    s->decode_stats[slot] = (ckv_srv_decode_stats){0, 0};
    const char *spec = l->press.scorer == CKV_SCORER_NONE ? "none" : l->press.spec;
    ckv_srv_lookup lk = {0};
    ckv_status st = ckv_srv_store_get(&s->store, spec, ids, n, reserve, chunk, &l->pc, &lk);
    if (st == CKV_STATUS_OK && lk.hit) l->pc.ready = 1; /* a restored context is marked and answers at once */
    if (st == CKV_STATUS_OK && !lk.hit) { /* the ids stay for the store until the prefill is done */
        l->ids = malloc(sizeof(int32_t) * (size_t)n);
        if (!l->ids) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for a context of %d ids", n);
        else memcpy(l->ids, ids, sizeof(int32_t) * (size_t)n);
        l->n = n;
        ckv_prepare_params pp = {0};
        pp.ids = ids;
        pp.n = n;
        pp.question_rows = question_rows; /* a query-aware context: saved with its question inside, as generate's */
        pp.press = &l->press;
        pp.reserve = reserve;
        if (st == CKV_STATUS_OK) st = ckv_engine_prepare_begin(s->engine, &pp, &l->pc);
    }
    st = agree(s, st, STEP_PREPARE);
    l->info.hit = lk.hit;
    l->info.from_disk = lk.from_disk;
    *ready = st == CKV_STATUS_OK && l->pc.ready;
    if (st == CKV_STATUS_OK && *ready) st = lane_ready(s, slot);
    if (st != CKV_STATUS_OK) lane_free(l);
    return st;
}

static ckv_status exec_advance(ckv_srv_steps *s, int slot, int *ready) {
    ckv_srv_lane *l = &s->lanes[slot];
    ckv_status st = agree(s, ckv_prepared_advance(&l->pc, ready), STEP_ADVANCE);
    if (st == CKV_STATUS_OK && *ready) st = lane_ready(s, slot);
    if (st != CKV_STATUS_OK) lane_free(l);
    return st;
}

static ckv_status exec_prefill(ckv_srv_steps *s, const int32_t *slots, int n) {
    ckv_status st = s->max_batch_tokens > 0 ? CKV_STATUS_OK
                                            : ckv_error(CKV_STATUS_ERR_ARG, "prefill step: the server has no batched prefill");
    for (int i = 0; i < n; i++) s->step_pc[i] = &s->lanes[slots[i]].pc;
    if (st == CKV_STATUS_OK) st = ckv_prepared_advance_batch(s->step_pc, n, &s->prefill);
    st = agree(s, st, STEP_PREFILL);
    for (int i = 0; i < n && st == CKV_STATUS_OK; i++) st = lane_ready(s, slots[i]);
    if (st != CKV_STATUS_OK)
        for (int i = 0; i < n; i++) lane_free(&s->lanes[slots[i]]);
    return st;
}

static ckv_status exec_question(ckv_srv_steps *s, int slot, const int32_t *ids, int n, int score, const float **logits) {
    ckv_status st = score && n > CKV_LOGITS_ROWS ? ckv_error(CKV_STATUS_ERR_ARG, "score step: %d ids", n)
                                                 : ckv_session_prefill(&s->lanes[slot].pc.sess, ids, n, score ? s->score_logits : NULL, logits);
    if (score) *logits = s->score_logits;
    return agree(s, st, STEP_QUESTION);
}

/* After a decode step of lanes slots[n]: each lane with a decode press counts the step and, when its
 * interval is due, is cut (the same on every rank: the same lanes, steps and rows). */
static ckv_status decode_compress(ckv_srv_steps *s, const int32_t *slots, int n) {
    for (int i = 0; i < n; i++) {
        ckv_srv_lane *l = &s->lanes[slots[i]];
        if (!l->decode.interval) continue;
        long before = l->ds.evicted_entries;
        int evicted = 0;
        CKV_TRY(ckv_decode_state_step(&l->ds, &evicted));
        ckv_srv_decode_stats *ds = &s->decode_stats[slots[i]];
        ds->compressions += evicted;
        ds->evicted_entries += l->ds.evicted_entries - before; /* rows x KV heads of the model */
    }
    return CKV_STATUS_OK;
}

static ckv_status exec_decode(ckv_srv_steps *s, const int32_t *slots, const int32_t *tokens, int n, const float **logits) {
    for (int i = 0; i < n; i++) {
        s->step_sess[i] = &s->lanes[slots[i]].pc.sess;
        s->step_tok[i] = tokens[i];
    }
    ckv_status st = ckv_decode_batch_step(&s->batch, s->step_sess, s->step_tok, n, logits);
    if (st == CKV_STATUS_OK) st = decode_compress(s, slots, n);
    return agree(s, st, STEP_DECODE);
}

/* A decode step sampled on the device (picks and ids NULL on a follower: its logits stay there). */
static ckv_status exec_decode_ids(ckv_srv_steps *s, const int32_t *slots, const int32_t *tokens, int n,
                                  const ckv_batch_pick *picks, int32_t *ids) {
    for (int i = 0; i < n; i++) {
        s->step_sess[i] = &s->lanes[slots[i]].pc.sess;
        s->step_tok[i] = tokens[i];
    }
    ckv_status st = ckv_decode_batch_step_ids(&s->batch, s->step_sess, s->step_tok, n, picks, ids);
    if (st == CKV_STATUS_OK) st = decode_compress(s, slots, n);
    return agree(s, st, STEP_DECODE);
}

/* Back to the context for the next answer: rewound, or (an answer's decode-time compression cut the
 * context's rows) restored from the lane's copy; then the next answer's decode state. */
static ckv_status exec_rewind(ckv_srv_steps *s, int slot) {
    ckv_srv_lane *l = &s->lanes[slot];
    ckv_status st = CKV_STATUS_OK;
    if (l->decode.interval && l->ds.compressions > 0) {
        ckv_decode_state_free(&l->ds);
        ckv_prepared_free(&l->pc);
        st = l->copy ? ckv_srv_store_restore(&s->store, l->copy, l->reserve, l->chunk, &l->pc)
                     : ckv_error(CKV_STATUS_ERR_INTERNAL, "slot %d: decode-time compression cut the context and no copy "
                                 "of it was kept", slot);
    } else {
        st = ckv_session_rewind(&l->pc.sess);
    }
    if (st == CKV_STATUS_OK && l->decode.interval) st = answer_begin(l);
    return agree(s, st, STEP_REWIND);
}

/* ---- the leader's side --------------------------------------------------------------------------------- */

static ckv_status misfit(const ckv_srv_steps *s, int kind, int slot) {
    return ckv_error(CKV_STATUS_ERR_ARG, "%s step on slot %d: the lane is %s", step_names[kind], slot,
                     !valid_slot(s, slot) ? "out of range" : (const char *[]){"empty", "being prepared", "ready"}[lane_of(s, slot)]);
}

ckv_status ckv_srv_step_prepare(ckv_srv_steps *s, int slot, const ckv_press_config *press, const ckv_decode_press *decode,
                                int answers, const int32_t *ids, int n, int question_rows, int reserve, int chunk,
                                int *ready) {
    *ready = 0;
    const size_t dsz = sizeof(ckv_decode_press);
    size_t payload = sizeof *press + dsz + sizeof(int32_t) * (size_t)n;
    if (!step_fits(s, STEP_PREPARE, slot) || n < 1 || payload > s->msg_cap || answers < 1 || (decode && decode->interval < 1))
        return ckv_error(CKV_STATUS_ERR_ARG, "prepare step: slot %d, %d context ids (window %d), %d answers", slot, n,
                         s->engine->model->cfg.max_context, answers);
    if (multi(s)) { /* press | decode press (zeroed: none) | ids */
        step_head h = {STEP_PREPARE, slot, n, reserve, chunk, 0, payload, answers, question_rows};
        memcpy(s->msg, press, sizeof *press);
        if (decode) memcpy(s->msg + sizeof *press, decode, dsz);
        else memset(s->msg + sizeof *press, 0, dsz);
        memcpy(s->msg + sizeof *press + dsz, ids, sizeof(int32_t) * (size_t)n);
        CKV_TRY(send_step(s, &h, s->msg));
    }
    return exec_prepare(s, slot, press, decode, answers, ids, n, question_rows, reserve, chunk, ready);
}

ckv_status ckv_srv_step_advance(ckv_srv_steps *s, int slot, int *ready) {
    *ready = 0;
    if (!step_fits(s, STEP_ADVANCE, slot)) return misfit(s, STEP_ADVANCE, slot);
    if (multi(s)) {
        step_head h = {STEP_ADVANCE, slot, 0, 0, 0, 0, 0, 0, 0};
        CKV_TRY(send_step(s, &h, NULL));
    }
    return exec_advance(s, slot, ready);
}

ckv_status ckv_srv_step_prefill(ckv_srv_steps *s, const int *slots, int n) {
    if (n < 1 || n > s->max_batch) return ckv_error(CKV_STATUS_ERR_ARG, "prefill step: %d contexts (batch %d)", n, s->max_batch);
    int32_t *msg = (int32_t *)(void *)s->msg; // [n] slots
    for (int i = 0; i < n; i++) {
        if (!step_fits(s, STEP_PREFILL, slots[i])) return misfit(s, STEP_PREFILL, slots[i]);
        msg[i] = slots[i];
    }
    if (multi(s)) {
        step_head h = {STEP_PREFILL, 0, n, 0, 0, 0, sizeof(int32_t) * (size_t)n, 0, 0};
        CKV_TRY(send_step(s, &h, msg));
    }
    return exec_prefill(s, msg, n);
}

static ckv_status step_question(ckv_srv_steps *s, int slot, const int32_t *ids, int n, int score, const float **logits) {
    size_t payload = sizeof(int32_t) * (size_t)n;
    if (!step_fits(s, STEP_QUESTION, slot)) return misfit(s, STEP_QUESTION, slot);
    if (n < 1 || payload > s->msg_cap || (score && n > CKV_LOGITS_ROWS))
        return ckv_error(CKV_STATUS_ERR_ARG, "question step: slot %d, %d ids", slot, n);
    if (multi(s)) {
        step_head h = {STEP_QUESTION, slot, n, score, 0, 0, payload, 0, 0};
        CKV_TRY(send_step(s, &h, ids));
    }
    return exec_question(s, slot, ids, n, score, logits);
}

ckv_status ckv_srv_step_question(ckv_srv_steps *s, int slot, const int32_t *ids, int n, const float **logits) {
    return step_question(s, slot, ids, n, 0, logits);
}

ckv_status ckv_srv_step_score(ckv_srv_steps *s, int slot, const int32_t *ids, int n, const float **rows) {
    return step_question(s, slot, ids, n, 1, rows);
}

/* Checks a decode step, packs it into s->msg ([2, n] slots, then tokens) and sends it to the group
 * (reserve 1: sampled on the device). */
static ckv_status send_decode(ckv_srv_steps *s, const int *slots, const int32_t *tokens, int n, int device) {
    if (n < 1 || n > s->max_batch) return ckv_error(CKV_STATUS_ERR_ARG, "decode step: %d sequences (batch %d)", n, s->max_batch);
    int32_t *msg = (int32_t *)(void *)s->msg; // [2, n] slots, then tokens
    for (int i = 0; i < n; i++) {
        if (!step_fits(s, STEP_DECODE, slots[i])) return misfit(s, STEP_DECODE, slots[i]);
        msg[i] = slots[i];
        msg[n + i] = tokens[i];
    }
    if (!multi(s)) return CKV_STATUS_OK;
    step_head h = {STEP_DECODE, 0, n, device, 0, 0, sizeof(int32_t) * 2 * (size_t)n, 0, 0};
    return send_step(s, &h, msg);
}

ckv_status ckv_srv_step_decode(ckv_srv_steps *s, const int *slots, const int32_t *tokens, int n, const float **logits) {
    CKV_TRY(send_decode(s, slots, tokens, n, 0));
    const int32_t *msg = (const int32_t *)(const void *)s->msg;
    return exec_decode(s, msg, msg + n, n, logits);
}

ckv_status ckv_srv_step_decode_ids(ckv_srv_steps *s, const int *slots, const int32_t *tokens, int n,
                                   const ckv_batch_pick *picks, int32_t *ids) {
    CKV_TRY(send_decode(s, slots, tokens, n, 1));
    const int32_t *msg = (const int32_t *)(const void *)s->msg;
    return exec_decode_ids(s, msg, msg + n, n, picks, ids);
}

ckv_status ckv_srv_step_rewind(ckv_srv_steps *s, int slot) {
    if (!step_fits(s, STEP_REWIND, slot)) return misfit(s, STEP_REWIND, slot);
    if (multi(s)) {
        step_head h = {STEP_REWIND, slot, 0, 0, 0, 0, 0, 0, 0};
        CKV_TRY(send_step(s, &h, NULL));
    }
    return exec_rewind(s, slot);
}

void ckv_srv_step_release(ckv_srv_steps *s, int slot) {
    if (!step_fits(s, STEP_RELEASE, slot)) return;
    if (multi(s)) {
        step_head h = {STEP_RELEASE, slot, 0, 0, 0, 0, 0, 0, 0};
        if (send_step(s, &h, NULL) != CKV_STATUS_OK) ckv_error_clear();
    }
    lane_free(&s->lanes[slot]);
}

void ckv_srv_step_idle(ckv_srv_steps *s) {
    if (!multi(s) || ckv_time_now() - s->t_last_sent < s->heartbeat_s) return;
    step_head h = {STEP_NOP, 0, 0, 0, 0, 0, 0, 0, 0};
    if (send_step(s, &h, NULL) != CKV_STATUS_OK) ckv_error_clear();
}

void ckv_srv_step_quit(ckv_srv_steps *s, int failed) {
    if (!multi(s)) return;
    step_head h = {STEP_QUIT, 0, 0, 0, 0, failed != 0, 0, 0, 0};
    if (send_step(s, &h, NULL) != CKV_STATUS_OK) ckv_error_clear();
}

/* ---- the scheduler's executor ----------------------------------------------------------------------------- */

static ckv_status x_prepare(void *ctx, int slot, const ckv_press_config *press, const ckv_decode_press *decode, int answers,
                            const int32_t *ids, int n, int question_rows, int reserve, int chunk, int *ready) {
    return ckv_srv_step_prepare(ctx, slot, press, decode, answers, ids, n, question_rows, reserve, chunk, ready);
}
static ckv_status x_advance(void *ctx, int slot, int *ready) { return ckv_srv_step_advance(ctx, slot, ready); }
static void x_prepared(void *ctx, int slot, ckv_sched_prepared *out) { *out = ((ckv_srv_steps *)ctx)->lanes[slot].info; }
static const float *x_context_logits(void *ctx, int slot) { return ((ckv_srv_steps *)ctx)->lanes[slot].pc.logits; }
static ckv_status x_question(void *ctx, int slot, const int32_t *ids, int n, const float **logits) {
    return ckv_srv_step_question(ctx, slot, ids, n, logits);
}
static ckv_status x_score(void *ctx, int slot, const int32_t *ids, int n, const float **rows) {
    return ckv_srv_step_score(ctx, slot, ids, n, rows);
}
static ckv_status x_decode(void *ctx, const int *slots, const int32_t *tokens, int n, const float **logits) {
    return ckv_srv_step_decode(ctx, slots, tokens, n, logits);
}
static ckv_status x_decode_ids(void *ctx, const int *slots, const int32_t *tokens, int n, const ckv_batch_pick *picks,
                               int32_t *ids) {
    return ckv_srv_step_decode_ids(ctx, slots, tokens, n, picks, ids);
}
static ckv_status x_prefill(void *ctx, const int *slots, int n) { return ckv_srv_step_prefill(ctx, slots, n); }
static ckv_status x_rewind(void *ctx, int slot) { return ckv_srv_step_rewind(ctx, slot); }
static void x_release(void *ctx, int slot) { ckv_srv_step_release(ctx, slot); }

void ckv_srv_steps_exec(ckv_srv_steps *s, ckv_sched_exec *out) {
    *out = (ckv_sched_exec){x_prepare, x_advance, x_prepared, x_context_logits, x_question, x_decode, x_rewind, x_release, s,
                            x_score, s->max_batch_tokens > 0 ? x_prefill : NULL, x_decode_ids};
}

/* ---- the followers' side -------------------------------------------------------------------------------- */

ckv_status ckv_srv_steps_follow(ckv_srv_steps *s) {
    if (!multi(s) || s->leader) return ckv_error(CKV_STATUS_ERR_ARG, "only a follower rank of a tensor-parallel group follows steps");
    for (;;) {
        step_head h;
        CKV_TRY(s->group->ops->bcast(s->group, &h, sizeof h, 0));
        int bad = h.kind < STEP_NOP || h.kind > STEP_QUIT || h.payload > s->msg_cap ||
                  (h.kind == STEP_DECODE   ? h.n < 1 || h.n > s->max_batch || h.payload != sizeof(int32_t) * 2 * (size_t)h.n
                   : h.kind == STEP_PREFILL ? h.n < 1 || h.n > s->max_batch || h.payload != sizeof(int32_t) * (size_t)h.n
                                            : !step_fits(s, h.kind, h.slot)) ||
                  (h.kind == STEP_QUESTION && (h.n < 1 || h.payload != sizeof(int32_t) * (size_t)h.n));
        if (bad)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "a server step from rank 0 out of order or malformed (%s, slot %d, %d items)",
                             h.kind >= STEP_NOP && h.kind <= STEP_QUIT ? step_names[h.kind] : "unknown", h.slot, h.n);
        if (h.payload > 0) CKV_TRY(s->group->ops->bcast(s->group, s->msg, (size_t)h.payload, 0));
        ckv_status st = CKV_STATUS_OK;
        const float *lg = NULL;
        int ready = 0;
        switch ((step_kind)h.kind) {
        case STEP_NOP: break;
        case STEP_QUIT:
            if (h.failed) return ckv_error(CKV_STATUS_ERR_ARG, "rank 0 of the tensor-parallel group stopped serving with an error");
            return CKV_STATUS_OK;
        case STEP_PREPARE: {
            ckv_press_config press;
            ckv_decode_press decode;
            memcpy(&press, s->msg, sizeof press);
            memcpy(&decode, s->msg + sizeof press, sizeof decode);
            if (h.payload != sizeof press + sizeof decode + sizeof(int32_t) * (size_t)h.n || h.n < 1 || h.answers < 1 ||
                decode.interval < 0)
                return ckv_error(CKV_STATUS_ERR_FORMAT, "a server prepare step from rank 0 of %d ids in %llu bytes", h.n,
                                 (unsigned long long)h.payload);
            st = exec_prepare(s, h.slot, &press, decode.interval > 0 ? &decode : NULL, h.answers,
                              (const int32_t *)(const void *)(s->msg + sizeof press + sizeof decode), h.n, h.question_rows,
                              h.reserve, h.chunk, &ready);
            break;
        }
        case STEP_ADVANCE: st = exec_advance(s, h.slot, &ready); break;
        case STEP_QUESTION: st = exec_question(s, h.slot, (const int32_t *)(const void *)s->msg, h.n, h.reserve != 0, &lg); break;
        case STEP_DECODE: {
            const int32_t *m = (const int32_t *)(const void *)s->msg;
            for (int i = 0; i < h.n; i++)
                if (!step_fits(s, STEP_DECODE, m[i]))
                    return ckv_error(CKV_STATUS_ERR_FORMAT, "a server decode step from rank 0 names slot %d", m[i]);
            st = h.reserve ? exec_decode_ids(s, m, m + h.n, h.n, NULL, NULL) : exec_decode(s, m, m + h.n, h.n, &lg);
            break;
        }
        case STEP_PREFILL: {
            const int32_t *m = (const int32_t *)(const void *)s->msg;
            for (int i = 0; i < h.n; i++)
                if (!step_fits(s, STEP_PREFILL, m[i]))
                    return ckv_error(CKV_STATUS_ERR_FORMAT, "a server prefill step from rank 0 names slot %d", m[i]);
            st = exec_prefill(s, m, h.n);
            break;
        }
        case STEP_REWIND: st = exec_rewind(s, h.slot); break;
        case STEP_RELEASE: lane_free(&s->lanes[h.slot]); break;
        }
        if (st != CKV_STATUS_OK) { /* the leader fails the request and releases the lane */
            CKV_LOG_WARN("server %s step on slot %d: %s", step_names[h.kind], h.slot, ckv_error_message());
            ckv_error_clear();
        }
    }
}
