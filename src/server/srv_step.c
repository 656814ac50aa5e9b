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
    STEP_NOP = 0, STEP_PREPARE, STEP_QUESTION, STEP_DECODE, STEP_REWIND, STEP_RELEASE, STEP_CONTINUE, STEP_QUIT
} step_kind;

static const char *const step_names[] = {"heartbeat", "prepare", "question", "decode", "rewind", "release", "continue", "quit"};

typedef struct {
    int32_t kind, slot;
    int32_t n;              /* ids (prepare, question) or sequences (decode) */
    int32_t reserve, chunk; /* prepare; reserve of a question: 1 keeps every position's logits (score) */
    int32_t failed;         /* quit: the leader stopped because of an error; continue: cancel the prepare */
    uint64_t payload;       /* bytes that follow */
} step_head;

static int multi(const ckv_srv_steps *s) { return s->group && s->group->size > 1; }

ckv_status ckv_srv_steps_init(ckv_srv_steps *s, ckv_engine *e, int max_batch, size_t cache_bytes, const char *cache_dir) {
    memset(s, 0, sizeof *s);
    /* the same on every rank, so it fails alike everywhere */
    if (max_batch < 1 || max_batch > CKV_LOGITS_ROWS)
        return ckv_error(CKV_STATUS_ERR_RANGE, "--max-batch %d: expected 1..%d", max_batch, CKV_LOGITS_ROWS);
    s->engine = e;
    s->group = e->tp;
    s->leader = !s->group || s->group->rank == 0;
    s->max_batch = max_batch;
    s->preparing = -1;
    /* a heartbeat well inside the followers' timeout (and at least every second) */
    s->heartbeat_s = s->group && s->group->timeout_s > 0 && s->group->timeout_s / 4 < 1.0 ? s->group->timeout_s / 4 : 1.0;
    int ctx_max = e->model->cfg.max_context;
    s->msg_cap = sizeof(ckv_press_config) + sizeof(int32_t) * (size_t)(ctx_max > 2 * max_batch ? ctx_max : 2 * max_batch);
    ckv_status st = ckv_srv_store_init(&s->store, e, cache_bytes, cache_dir);
    if (st == CKV_STATUS_OK) {
        s->lanes = calloc((size_t)max_batch, sizeof *s->lanes);
        s->step_sess = calloc((size_t)max_batch, sizeof *s->step_sess);
        s->step_tok = calloc((size_t)max_batch, sizeof *s->step_tok);
        s->status_all = calloc(s->group ? (size_t)s->group->size : 1, sizeof *s->status_all);
        s->stats_all = calloc(4 * (s->group ? (size_t)s->group->size : 1), sizeof *s->stats_all);
        if (!s->lanes || !s->step_sess || !s->step_tok || !s->status_all || !s->stats_all)
            st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the server's engine steps");
    }
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&s->msg, s->msg_cap, "server step messages");
    if (st == CKV_STATUS_OK)
        st = ckv_alloc((void **)&s->score_logits, sizeof(float) * CKV_LOGITS_ROWS * (size_t)e->model->cfg.vocab_size,
                       "scored question logits");
    if (st == CKV_STATUS_OK) st = ckv_decode_batch_init(&s->batch, e->model, max_batch);
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

void ckv_srv_steps_free(ckv_srv_steps *s) {
    if (!s) return;
    for (int i = 0; s->lanes && i < s->max_batch; i++) ckv_prepared_free(&s->lanes[i]);
    ckv_decode_batch_free(&s->batch);
    ckv_srv_store_free(&s->store);
    free(s->lanes);
    free(s->step_sess);
    free(s->step_tok);
    free(s->status_all);
    free(s->stats_all);
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

/* ---- the executor (every rank) ------------------------------------------------------------------------ */

static int between_leader(void *ctx, int layer);
static int between_follower(void *ctx, int layer);

static ckv_status exec_prepare(ckv_srv_steps *s, int slot, const ckv_press_config *press, const int32_t *ids, int n,
                               int reserve, int chunk) {
    ckv_prepared *pc = &s->lanes[slot];
    ckv_prepared_free(pc);
    const char *spec = press->scorer == CKV_SCORER_NONE ? "none" : press->spec;
    ckv_srv_lookup lk = {0};
    ckv_status st = ckv_srv_store_get(&s->store, spec, ids, n, reserve, chunk, pc, &lk);
    if (st == CKV_STATUS_OK && !lk.hit) {
        ckv_prepare_params pp = {0};
        pp.ids = ids;
        pp.n = n;
        pp.press = press;
        pp.reserve = reserve;
        if (s->leader ? s->between_layers != NULL || multi(s) : 1) {
            pp.between_layers = s->leader ? between_leader : between_follower;
            pp.between_ctx = s;
        }
        s->preparing = slot;
        st = ckv_engine_prepare(s->engine, &pp, pc);
        s->preparing = -1;
        if (st == CKV_STATUS_OK && ckv_srv_store_put(&s->store, spec, ids, n, pc) != CKV_STATUS_OK) {
            CKV_LOG_WARN("context store: %s", ckv_error_message());
            ckv_error_clear();
        }
    }
    st = agree(s, st, STEP_PREPARE);
    s->lookup = lk;
    if (st != CKV_STATUS_OK) return st;
    const ckv_request_stats *rs = &pc->stats;
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
    s->group_kept_entries = (long)sum[0];
    s->group_total_entries = (long)sum[1];
    s->group_kv_bytes_full = (size_t)sum[2];
    s->group_kv_bytes_kept = (size_t)sum[3];
    return CKV_STATUS_OK;
}

static ckv_status exec_question(ckv_srv_steps *s, int slot, const int32_t *ids, int n, int score) {
    const float *lg = NULL;
    if (score && (n < 1 || n > CKV_LOGITS_ROWS)) return agree(s, ckv_error(CKV_STATUS_ERR_ARG, "score step: %d ids", n), STEP_QUESTION);
    ckv_status st = ckv_session_prefill(&s->lanes[slot].sess, ids, n, score ? s->score_logits : NULL, &lg);
    s->logits = lg;
    return agree(s, st, STEP_QUESTION);
}

static ckv_status exec_decode(ckv_srv_steps *s, const int32_t *slots, const int32_t *tokens, int n) {
    for (int i = 0; i < n; i++) {
        s->step_sess[i] = &s->lanes[slots[i]].sess;
        s->step_tok[i] = tokens[i];
    }
    const float *lg = NULL;
    ckv_status st = ckv_decode_batch_step(&s->batch, s->step_sess, s->step_tok, n, &lg);
    s->logits = lg;
    return agree(s, st, STEP_DECODE);
}

static ckv_status exec_rewind(ckv_srv_steps *s, int slot) {
    return agree(s, ckv_session_rewind(&s->lanes[slot].sess), STEP_REWIND);
}

/* ---- the leader's side --------------------------------------------------------------------------------- */

/* Between two layers of a prepare on the leader: the scheduler's steps, then continue (or cancel). */
static int between_leader(void *ctx, int layer) {
    ckv_srv_steps *s = ctx;
    int cancel = s->between_layers ? s->between_layers(s->between_ctx, layer) : 0;
    if (multi(s)) {
        step_head h = {STEP_CONTINUE, 0, 0, 0, 0, cancel != 0, 0};
        if (send_step(s, &h, NULL) != CKV_STATUS_OK) {
            ckv_error_clear();
            cancel = 1;
        }
    }
    return cancel;
}

ckv_status ckv_srv_step_prepare(ckv_srv_steps *s, int slot, const ckv_press_config *press, const int32_t *ids, int n,
                                int reserve, int chunk) {
    size_t payload = sizeof *press + sizeof(int32_t) * (size_t)n;
    if (!valid_slot(s, slot) || s->preparing >= 0 || n < 1 || payload > s->msg_cap)
        return ckv_error(CKV_STATUS_ERR_ARG, "prepare step: slot %d, %d context ids (window %d)", slot, n,
                         s->engine->model->cfg.max_context);
    if (multi(s)) {
        step_head h = {STEP_PREPARE, slot, n, reserve, chunk, 0, payload};
        memcpy(s->msg, press, sizeof *press);
        memcpy(s->msg + sizeof *press, ids, sizeof(int32_t) * (size_t)n);
        CKV_TRY(send_step(s, &h, s->msg));
    }
    return exec_prepare(s, slot, press, ids, n, reserve, chunk);
}

static ckv_status step_question(ckv_srv_steps *s, int slot, const int32_t *ids, int n, int score) {
    size_t payload = sizeof(int32_t) * (size_t)n;
    if (!valid_slot(s, slot) || slot == s->preparing || n < 1 || payload > s->msg_cap || (score && n > CKV_LOGITS_ROWS))
        return ckv_error(CKV_STATUS_ERR_ARG, "question step: slot %d, %d ids", slot, n);
    if (multi(s)) {
        step_head h = {STEP_QUESTION, slot, n, score, 0, 0, payload};
        CKV_TRY(send_step(s, &h, ids));
    }
    return exec_question(s, slot, ids, n, score);
}

ckv_status ckv_srv_step_question(ckv_srv_steps *s, int slot, const int32_t *ids, int n) { return step_question(s, slot, ids, n, 0); }

ckv_status ckv_srv_step_score(ckv_srv_steps *s, int slot, const int32_t *ids, int n) { return step_question(s, slot, ids, n, 1); }

ckv_status ckv_srv_step_decode(ckv_srv_steps *s, const int *slots, const int32_t *tokens, int n) {
    if (n < 1 || n > s->max_batch) return ckv_error(CKV_STATUS_ERR_ARG, "decode step: %d sequences (batch %d)", n, s->max_batch);
    int32_t *msg = (int32_t *)(void *)s->msg; // [2, n] slots, then tokens
    for (int i = 0; i < n; i++) {
        if (!valid_slot(s, slots[i]) || slots[i] == s->preparing) return ckv_error(CKV_STATUS_ERR_ARG, "decode step: slot %d", slots[i]);
        msg[i] = slots[i];
        msg[n + i] = tokens[i];
    }
    if (multi(s)) {
        step_head h = {STEP_DECODE, 0, n, 0, 0, 0, sizeof(int32_t) * 2 * (size_t)n};
        CKV_TRY(send_step(s, &h, msg));
    }
    return exec_decode(s, msg, msg + n, n);
}

ckv_status ckv_srv_step_rewind(ckv_srv_steps *s, int slot) {
    if (!valid_slot(s, slot) || slot == s->preparing) return ckv_error(CKV_STATUS_ERR_ARG, "rewind step: slot %d", slot);
    if (multi(s)) {
        step_head h = {STEP_REWIND, slot, 0, 0, 0, 0, 0};
        CKV_TRY(send_step(s, &h, NULL));
    }
    return exec_rewind(s, slot);
}

void ckv_srv_step_release(ckv_srv_steps *s, int slot) {
    if (!valid_slot(s, slot) || slot == s->preparing) return;
    if (multi(s)) {
        step_head h = {STEP_RELEASE, slot, 0, 0, 0, 0, 0};
        if (send_step(s, &h, NULL) != CKV_STATUS_OK) ckv_error_clear();
    }
    ckv_prepared_free(&s->lanes[slot]);
}

void ckv_srv_step_idle(ckv_srv_steps *s) {
    if (!multi(s) || ckv_time_now() - s->t_last_sent < s->heartbeat_s) return;
    step_head h = {STEP_NOP, 0, 0, 0, 0, 0, 0};
    if (send_step(s, &h, NULL) != CKV_STATUS_OK) ckv_error_clear();
}

void ckv_srv_step_quit(ckv_srv_steps *s, int failed) {
    if (!multi(s)) return;
    step_head h = {STEP_QUIT, 0, 0, 0, 0, failed != 0, 0};
    if (send_step(s, &h, NULL) != CKV_STATUS_OK) ckv_error_clear();
}

/* ---- the followers' side -------------------------------------------------------------------------------- */

/* Receives and runs the leader's steps until one of kind `until` (QUIT at the top, CONTINUE between
 * the layers of a prepare, where no prepare or quit may come); *failed gets that step's flag. */
static ckv_status follow_until(ckv_srv_steps *s, step_kind until, int *failed) {
    for (;;) {
        step_head h;
        CKV_TRY(s->group->ops->bcast(s->group, &h, sizeof h, 0));
        int nested = until == STEP_CONTINUE;
        if (h.kind < STEP_NOP || h.kind > STEP_QUIT || h.payload > s->msg_cap ||
            (h.kind != STEP_DECODE && h.kind != STEP_NOP && h.kind != STEP_QUIT && h.kind != STEP_CONTINUE &&
             !valid_slot(s, h.slot)) ||
            (h.kind == STEP_DECODE && (h.n < 1 || h.n > s->max_batch)) ||
            (nested ? h.kind == STEP_PREPARE || h.kind == STEP_QUIT : h.kind == STEP_CONTINUE) ||
            (h.kind != STEP_NOP && h.kind != STEP_QUIT && h.kind != STEP_CONTINUE && h.kind != STEP_DECODE &&
             h.slot == s->preparing))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "a server step from rank 0 out of order or malformed (%s, slot %d, %d items)",
                             h.kind >= STEP_NOP && h.kind <= STEP_QUIT ? step_names[h.kind] : "unknown", h.slot, h.n);
        if (h.payload > 0) CKV_TRY(s->group->ops->bcast(s->group, s->msg, (size_t)h.payload, 0));
        ckv_status st = CKV_STATUS_OK;
        switch ((step_kind)h.kind) {
        case STEP_NOP: break;
        case STEP_QUIT:
        case STEP_CONTINUE: *failed = h.failed; return CKV_STATUS_OK;
        case STEP_PREPARE: {
            ckv_press_config press;
            memcpy(&press, s->msg, sizeof press);
            press.spec[sizeof press.spec - 1] = press.profile[sizeof press.profile - 1] = '\0';
            st = exec_prepare(s, h.slot, &press, (const int32_t *)(const void *)(s->msg + sizeof press), h.n, h.reserve, h.chunk);
            break;
        }
        case STEP_QUESTION: st = exec_question(s, h.slot, (const int32_t *)(const void *)s->msg, h.n, h.reserve != 0); break;
        case STEP_DECODE: {
            const int32_t *m = (const int32_t *)(const void *)s->msg;
            for (int i = 0; i < h.n; i++)
                if (!valid_slot(s, m[i]) || m[i] == s->preparing)
                    return ckv_error(CKV_STATUS_ERR_FORMAT, "a server decode step from rank 0 names slot %d", m[i]);
            st = exec_decode(s, m, m + h.n, h.n);
            break;
        }
        case STEP_REWIND: st = exec_rewind(s, h.slot); break;
        case STEP_RELEASE: ckv_prepared_free(&s->lanes[h.slot]); break;
        }
        if (st != CKV_STATUS_OK) { /* the leader fails the request and releases the lane */
            CKV_LOG_WARN("server %s step on slot %d: %s", step_names[h.kind], h.slot, ckv_error_message());
            ckv_error_clear();
        }
    }
}

/* Between two layers of a prepare on a follower: the leader's steps until it says continue. */
static int between_follower(void *ctx, int layer) {
    (void)layer;
    ckv_srv_steps *s = ctx;
    int cancel = 0;
    if (follow_until(s, STEP_CONTINUE, &cancel) != CKV_STATUS_OK) {
        CKV_LOG_WARN("between layers of a prefill: %s", ckv_error_message());
        ckv_error_clear();
        return 1;
    }
    return cancel;
}

ckv_status ckv_srv_steps_follow(ckv_srv_steps *s) {
    if (!multi(s) || s->leader) return ckv_error(CKV_STATUS_ERR_ARG, "only a follower rank of a tensor-parallel group follows steps");
    int failed = 0;
    CKV_TRY(follow_until(s, STEP_QUIT, &failed));
    if (failed) return ckv_error(CKV_STATUS_ERR_ARG, "rank 0 of the tensor-parallel group stopped serving with an error");
    return CKV_STATUS_OK;
}
