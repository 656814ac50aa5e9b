/* backend_caps.c - what a backend's op table offers: the capability query over its declared op
 * families (ckv_backend_supports), their names, and the check that a table sets every op every
 * backend has and the ops of exactly the families it declares. It picks no backend (backend.c) and
 * runs no op. */
#include "backend.h"

int ckv_backend_supports(const ckv_backend *be, ckv_backend_cap cap) {
    if (!be || !be->ops || (unsigned)cap >= (unsigned)CKV_BACKEND_CAP_COUNT) return 0;
    return (be->ops->caps & CKV_BACKEND_CAP_BIT(cap)) != 0;
}

const char *ckv_backend_cap_name(ckv_backend_cap cap) {
    static const char *const names[CKV_BACKEND_CAP_COUNT] = {
        [CKV_BACKEND_CAP_STREAM] = "stream",
        [CKV_BACKEND_CAP_DEVICE_ID] = "device_id",
        [CKV_BACKEND_CAP_EVICT_RESERVE] = "evict_reserve",
        [CKV_BACKEND_CAP_KEYDIFF] = "keydiff",
        [CKV_BACKEND_CAP_LAGKV] = "lagkv",
        [CKV_BACKEND_CAP_CUR] = "cur",
        [CKV_BACKEND_CAP_LEVERAGE] = "leverage",
        [CKV_BACKEND_CAP_CHUNK_COLSUM] = "chunk_colsum",
        [CKV_BACKEND_CAP_GRAPHS] = "graphs",
        [CKV_BACKEND_CAP_KVZIP] = "kvzip",
        [CKV_BACKEND_CAP_CHUNK_RANK] = "chunk_rank",
        [CKV_BACKEND_CAP_MEM_USAGE] = "mem_usage",
    };
    return (unsigned)cap < (unsigned)CKV_BACKEND_CAP_COUNT ? names[cap] : "?";
}

/* One op of the table: set or not, and its name for the error. */
typedef struct {
    int set;
    const char *name;
} op_slot;

#define SLOT(o, op) {(o)->op != NULL, #op}

static ckv_status check_family(const ckv_backend *be, ckv_backend_cap cap, const op_slot *slots, int n) {
    const int declared = ckv_backend_supports(be, cap);
    for (int i = 0; i < n; i++)
        if (slots[i].set != declared)
            return ckv_error(CKV_STATUS_ERR_INTERNAL, "backend %s: op %s is %s but the table %s capability %s",
                             be->name ? be->name : "?", slots[i].name, slots[i].set ? "set" : "missing",
                             declared ? "declares" : "does not declare", ckv_backend_cap_name(cap));
    return CKV_STATUS_OK;
}

ckv_status ckv_backend_check_ops(const ckv_backend *be) {
    if (!be || !be->ops) return ckv_error(CKV_STATUS_ERR_ARG, "backend check: no backend or no op table");
    const ckv_backend_ops *o = be->ops;
    if (o->caps >> CKV_BACKEND_CAP_COUNT)
        return ckv_error(CKV_STATUS_ERR_INTERNAL, "backend %s: capability mask 0x%x has bits beyond the %d known",
                         be->name ? be->name : "?", (unsigned)o->caps, (int)CKV_BACKEND_CAP_COUNT);
    const op_slot required[] = {
        SLOT(o, free), SLOT(o, alloc), SLOT(o, alloc_raw), SLOT(o, release), SLOT(o, upload), SLOT(o, download), SLOT(o, copy),
        SLOT(o, sync), SLOT(o, weight_dtype_ok), SLOT(o, kv_dtype_ok), SLOT(o, embedding), SLOT(o, rmsnorm),
        SLOT(o, matmul), SLOT(o, rope), SLOT(o, kv_store), SLOT(o, attention), SLOT(o, swiglu), SLOT(o, add),
        SLOT(o, count_nonfinite), SLOT(o, kv_gather), SLOT(o, kv_rerotate), SLOT(o, evict_attn_colsum), SLOT(o, evict_attn_probs),
        SLOT(o, evict_colsum_finish), SLOT(o, evict_pool), SLOT(o, evict_head_sum), SLOT(o, evict_div),
        SLOT(o, evict_row_norm), SLOT(o, evict_add_mul), SLOT(o, evict_value_norm), SLOT(o, evict_fill),
        SLOT(o, evict_random), SLOT(o, evict_max), SLOT(o, evict_topk), SLOT(o, evict_scatter),
        SLOT(o, evict_topk_counts), SLOT(o, evict_moments), SLOT(o, evict_ea_logits),
        SLOT(o, evict_defensive_rows), SLOT(o, evict_softmax_add), SLOT(o, evict_affine), SLOT(o, sample),
    };
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!required[i].set)
            return ckv_error(CKV_STATUS_ERR_INTERNAL, "backend %s: op table lacks %s, which every backend has",
                             be->name ? be->name : "?", required[i].name);
    const op_slot stream[] = {SLOT(o, stream)}, device_id[] = {SLOT(o, device_id)};
    const op_slot reserve[] = {SLOT(o, evict_reserve)}, keydiff[] = {SLOT(o, evict_keydiff)};
    const op_slot lagkv[] = {SLOT(o, evict_lagkv)}, cur[] = {SLOT(o, evict_cur)};
    const op_slot leverage[] = {SLOT(o, evict_leverage)};
    const op_slot chunk[] = {SLOT(o, evict_chunk_colsum), SLOT(o, evict_row_stats)};
    const op_slot graphs[] = {SLOT(o, graph_begin), SLOT(o, graph_end), SLOT(o, graph_release)};
    const op_slot kvzip[] = {SLOT(o, evict_kvzip), SLOT(o, evict_kvzip_norms)}, chunk_rank[] = {SLOT(o, evict_chunk_rank)};
    const op_slot mem_usage[] = {SLOT(o, mem_usage)};
    CKV_TRY(check_family(be, CKV_BACKEND_CAP_STREAM, stream, 1));
    CKV_TRY(check_family(be, CKV_BACKEND_CAP_DEVICE_ID, device_id, 1));
    CKV_TRY(check_family(be, CKV_BACKEND_CAP_EVICT_RESERVE, reserve, 1));
    CKV_TRY(check_family(be, CKV_BACKEND_CAP_KEYDIFF, keydiff, 1));
    CKV_TRY(check_family(be, CKV_BACKEND_CAP_LAGKV, lagkv, 1));
    CKV_TRY(check_family(be, CKV_BACKEND_CAP_CUR, cur, 1));
    CKV_TRY(check_family(be, CKV_BACKEND_CAP_LEVERAGE, leverage, 1));
    CKV_TRY(check_family(be, CKV_BACKEND_CAP_CHUNK_COLSUM, chunk, 2));
    CKV_TRY(check_family(be, CKV_BACKEND_CAP_GRAPHS, graphs, 3));
    CKV_TRY(check_family(be, CKV_BACKEND_CAP_KVZIP, kvzip, 2));
    CKV_TRY(check_family(be, CKV_BACKEND_CAP_CHUNK_RANK, chunk_rank, 1));
    CKV_TRY(check_family(be, CKV_BACKEND_CAP_MEM_USAGE, mem_usage, 1));
    return CKV_STATUS_OK;
}
