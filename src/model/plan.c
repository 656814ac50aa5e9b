/* plan.c - the per-rank device memory plan (plan.h): the byte count of every part a GPU run
 * allocates, from the configuration, the shard plan and the run's sizes; printing and checking it.
 * The formulas restate what the loader (model.c), the session (engine/session.c), the KV cache and
 * the scorers allocate; tests/unit/test_plan.c checks them by hand for two real shapes. */
#include "model/plan.h"

#include <string.h>

#include "backend/gpu_workspace.h"
#include "core/alloc.h"
#include "model/model.h"

static const char *const part_names[CKV_PLAN_PARTS_] = {
    "weights", "KV cache", "hidden states", "chunk workspace", "eviction scratch", "collectives", "backend workspaces", "CUDA runtime",
};

const char *ckv_plan_part_name(ckv_plan_part p) { return p < CKV_PLAN_PARTS_ ? part_names[p] : "?"; }

static size_t padded_vocab(const ckv_model_config *c, int tp) { return (size_t)((c->vocab_size + tp - 1) / tp); }

size_t ckv_plan_comm_workspace_bytes(const ckv_model_config *c, int tp) {
    if (tp <= 1) return 0;
    /* [rows, pad] send + [tp, rows, pad] receive, fp32 */
    return (size_t)CKV_LOGITS_ROWS * padded_vocab(c, tp) * (size_t)(tp + 1) * sizeof(float);
}

ckv_status ckv_plan_init(ckv_plan *plan, const ckv_model_config *c, const ckv_plan_params *p, int rank) {
    memset(plan, 0, sizeof *plan);
    if (p->tp < 1 || rank < 0 || rank >= p->tp) return ckv_error(CKV_STATUS_ERR_ARG, "plan: rank %d of tp %d", rank, p->tp);
    if (p->context < 1 || p->new_tokens < 0 || p->chunk < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "plan: context %ld, new tokens %ld, chunk %d", p->context, p->new_tokens,
                         p->chunk);
    if (!ckv_dtype_size(p->kv_dtype) || !ckv_dtype_size(p->weight_dtype))
        return ckv_error(CKV_STATUS_ERR_ARG, "plan: weight dtype %s / KV dtype %s have no element size",
                         ckv_dtype_name(p->weight_dtype), ckv_dtype_name(p->kv_dtype));
    CKV_TRY(ckv_shard_plan_init(&plan->shard, p->tp, rank, c->n_heads, c->n_kv_heads, c->head_dim, c->intermediate_size,
                                c->vocab_size));
    const ckv_shard_plan *s = &plan->shard;
    plan->rank = rank;
    const size_t L = (size_t)p->context, room = (size_t)p->new_tokens, D = (size_t)c->hidden_size;
    const size_t d = (size_t)c->head_dim, nl_kv = (size_t)s->n_kv_local, layers = (size_t)c->n_layers;
    plan->compress = p->kept > 0 && p->kept < p->context;
    const size_t kept = plan->compress ? (size_t)p->kept : L;
    /* one token of one KV head: K and V in kv_dtype + its int32 position */
    const size_t row = 2 * d * ckv_dtype_size(p->kv_dtype) + sizeof(int32_t);
    plan->kv_full = layers * nl_kv * (L + room) * row;
    plan->kv_kept = layers * nl_kv * (kept + room) * row;
    plan->kv_peak = plan->compress ? plan->kv_kept + nl_kv * (L + room) * row : plan->kv_full;

    plan->part[CKV_PLAN_WEIGHTS] = ckv_model_weight_bytes_dtype(c, s, p->weight_dtype);
    plan->part[CKV_PLAN_KV] = plan->kv_peak;
    /* x [L, D] for the whole context, and the scorers' input xn [L, D] when compressing (fp32) */
    plan->part[CKV_PLAN_HIDDEN] = L * D * sizeof(float) * (plan->compress ? 2 : 1);
    /* ckv_model_scratch: xn, proj [n, D]; q, att [n, qd]; k, v [n, kd]; gate, up [n, ff]; pos, ids
     * [n] int32; logits [rows, n_vocab_local] */
    const size_t n = (size_t)(p->chunk < p->context ? p->chunk : p->context);
    const size_t qd = (size_t)s->n_q_local * d, kd = nl_kv * d, ff = (size_t)s->n_ff_local;
    const size_t rows = n < CKV_LOGITS_ROWS ? n : CKV_LOGITS_ROWS;
    plan->part[CKV_PLAN_WORKSPACE] = (n * (2 * D + 2 * qd + 2 * kd + 2 * ff) + rows * (size_t)s->n_vocab_local) *
                                     sizeof(float) + 2 * n * sizeof(int32_t);
    if (plan->compress) {
        /* per local row: score, value norm (fp32), kept row index (int32); the layer's gathered
         * scores of every head [H, L] and the all-gather buffer [tp, n_kv_local, L]; the window
         * logits of every local query head [n_q_local, w, L] */
        size_t ev = nl_kv * L * 3 * 4 + (size_t)c->n_kv_heads * L * 4;
        if (p->tp > 1) ev += (size_t)p->tp * nl_kv * L * 4;
        ev += (size_t)s->n_q_local * (size_t)p->window * L * 4;
        plan->part[CKV_PLAN_EVICT] = ev;
    }
    if (p->tp > 1)
        plan->part[CKV_PLAN_COMM] = ckv_plan_comm_workspace_bytes(c, p->tp) +
                                    (p->nccl ? (size_t)(p->tp - 1) * CKV_PLAN_NCCL_PER_PEER : 0);
    /* the widest matmul input of a chunk: hidden (q/k/v, gate/up), the local heads (o_proj), the
     * local MLP rows (down) */
    size_t widest = D > qd ? D : qd;
    widest = widest > ff ? widest : ff;
    plan->part[CKV_PLAN_BACKEND] =
        ckv_gpu_fixed_workspace_bytes(p->sms > 0 ? p->sms : CKV_PLAN_DEFAULT_SMS,
                                      p->cc_major > 0 ? p->cc_major : CKV_PLAN_DEFAULT_CC_MAJOR, n, widest);
    plan->part[CKV_PLAN_RUNTIME] = CKV_PLAN_RUNTIME_RESERVE;
    for (int i = 0; i < CKV_PLAN_PARTS_; i++) plan->total += plan->part[i];
    /* host: gathered logits [rows, V], gather staging [rows, pad * tp], all-reduce staging [n, D] */
    plan->host_bytes = rows * (size_t)c->vocab_size * 4;
    if (p->tp > 1) plan->host_bytes += rows * padded_vocab(c, p->tp) * (size_t)p->tp * 4 + n * D * 4;
    return CKV_STATUS_OK;
}

static const char *fmt(size_t bytes, char *buf, size_t cap) { return ckv_format_bytes((double)bytes, buf, cap); }

ckv_status ckv_plan_print(FILE *f, const ckv_model_config *c, const ckv_plan_params *p) {
    enum { MAXCOL = 8 };
    ckv_plan plans[MAXCOL];
    const int ncol = p->tp < MAXCOL ? p->tp : MAXCOL;
    for (int r = 0; r < ncol; r++) CKV_TRY(ckv_plan_init(&plans[r], c, p, r));
    /* ranks past the columns: the last column shows the largest of them */
    for (int r = MAXCOL; r < p->tp; r++) {
        ckv_plan q;
        CKV_TRY(ckv_plan_init(&q, c, p, r));
        if (q.total > plans[MAXCOL - 1].total) plans[MAXCOL - 1] = q;
    }
    char b[32];
    fprintf(f, "GPU memory plan per rank: tp %d, context %ld + %ld new tokens, chunk %d, weights %s, KV %s", p->tp,
            p->context, p->new_tokens, p->chunk, ckv_dtype_name(p->weight_dtype), ckv_dtype_name(p->kv_dtype));
    if (p->kept > 0 && p->kept < p->context) fprintf(f, ", %ld kept per head", p->kept);
    fprintf(f, "%s; a GPU of %d SMs, compute capability %d\n", p->tp > 1 ? (p->nccl ? ", NCCL" : ", staged collectives") : "",
            p->sms > 0 ? p->sms : CKV_PLAN_DEFAULT_SMS, p->cc_major > 0 ? p->cc_major : CKV_PLAN_DEFAULT_CC_MAJOR);
    fprintf(f, "%-22s", "rank");
    for (int r = 0; r < ncol; r++) fprintf(f, " %12d", plans[r].rank);
    fprintf(f, "\n");
    for (int i = 0; i < CKV_PLAN_PARTS_; i++) {
        fprintf(f, "%-22s", ckv_plan_part_name((ckv_plan_part)i));
        for (int r = 0; r < ncol; r++) fprintf(f, " %12s", fmt(plans[r].part[i], b, sizeof b));
        if (i == CKV_PLAN_KV)
            fprintf(f, "  (%s)", plans[0].compress ? "prefill peak: compressed layers + one full layer" : "full");
        if (i == CKV_PLAN_RUNTIME || (i == CKV_PLAN_COMM && p->tp > 1 && p->nccl)) fprintf(f, "  (estimate)");
        fprintf(f, "\n");
    }
    fprintf(f, "%-22s", "total");
    for (int r = 0; r < ncol; r++) fprintf(f, " %12s", fmt(plans[r].total, b, sizeof b));
    fprintf(f, "\n");
    if (plans[0].compress) {
        fprintf(f, "%-22s", "  KV full (no press)");
        for (int r = 0; r < ncol; r++) fprintf(f, " %12s", fmt(plans[r].kv_full, b, sizeof b));
        fprintf(f, "\n%-22s", "  KV kept (decode)");
        for (int r = 0; r < ncol; r++) fprintf(f, " %12s", fmt(plans[r].kv_kept, b, sizeof b));
        fprintf(f, "\n");
    }
    fprintf(f, "%-22s", "host (not in total)");
    for (int r = 0; r < ncol; r++) fprintf(f, " %12s", fmt(plans[r].host_bytes, b, sizeof b));
    fprintf(f, "\n");
    return CKV_STATUS_OK;
}

ckv_status ckv_plan_check(const ckv_plan *plan, size_t limit) {
    if (plan->total <= limit) return CKV_STATUS_OK;
    size_t sum = 0;
    int i = 0;
    for (; i < CKV_PLAN_PARTS_; i++) {
        sum += plan->part[i];
        if (sum > limit) break;
    }
    char b1[32], b2[32], b3[32], b4[32];
    return ckv_error(CKV_STATUS_ERR_NOMEM,
                     "rank %d does not fit in GPU memory: part '%s' (%s) does not fit after %s of earlier parts; the plan "
                     "needs %s in all, the limit is %s (ckv inspect --backend cuda prints the plan; lower --context, "
                     "--budget or --chunk, or raise --tp)",
                     plan->rank, ckv_plan_part_name((ckv_plan_part)i), fmt(plan->part[i], b1, sizeof b1),
                     fmt(sum - plan->part[i], b2, sizeof b2), fmt(plan->total, b3, sizeof b3), fmt(limit, b4, sizeof b4));
}
