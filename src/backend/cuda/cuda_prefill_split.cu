/* cuda_prefill_split.cu - the split-K plan of the prefill attention kernel (docs/gpu.md §3b): when
 * the (query block, head, sequence) blocks of a prefill fill less than a wave of the SMs (a chunk
 * of a few hundred query rows over a long cached prefix, a tensor-parallel rank with few heads),
 * each block's keys are cut into splits that run as blocks of their own and write unnormalised
 * partials, merged by the split-KV merge (cuda_decode.cu). Here: how many splits, how many keys
 * each, and the bound on the partials' bytes reserved at init. The kernel's key range and partial
 * epilogue are in cuda_attention.cu; the merge and the split-count heuristic in cuda_decode.cu. */
#include <limits.h>

#include "ckv_qk_tile.h" /* FA_BM, FA_BLOCKS_PER_SM, FA_HD_MAX */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr int PS_MIN_CHUNK = 1024; /* keys per split at least: a split's partials (64 rows of hd + 2
                                      floats) are under 7% of its K/V tile bytes */
constexpr int PS_WAVES = CKV_GPU_PREFILL_SPLIT_WAVES; /* split blocks at most: waves of the resident blocks */
constexpr int PS_KEY_ALIGN = 64;   /* split boundaries on whole key tiles (bf16 64 keys, f32 32) */

} // namespace

/* Bounds the plan: at most PS_WAVES waves of blocks of FA_BM rows at the largest head dim
 * (backend/gpu_workspace.h, which the memory plan counts). */
size_t prefill_split_bytes(int sms) { return ckv_gpu_split_partials_bytes(sms); }

prefill_split prefill_split_plan(const ctx *c, const ckv_kv_batch *kv, int n, int n_heads) {
    const prefill_split off = {NULL, 1, INT_MAX};
    const int hd = kv->head_dim, max_len = kv->max_len > 1 ? kv->max_len : 1;
    if (hd > FA_HD_MAX || c->prefill_splits == 1) return off;
    /* blocks holding query rows: the row blocks of every sequence (sum of ceil(tokens / FA_BM) is
     * at most (n + (FA_BM - 1) n_seq) / FA_BM) times the heads */
    const long row_blocks = ((long)n + (long)(FA_BM - 1) * kv->n_seq) / FA_BM;
    const long items = row_blocks * n_heads;
    const int wave = c->sms * FA_BLOCKS_PER_SM;
    /* the partials fit the reserved bytes; the split blocks stay within PS_WAVES waves */
    const size_t row_bytes = (size_t)n * (size_t)n_heads * (size_t)(hd + 2) * sizeof(float);
    const size_t by_bytes = prefill_split_bytes(c->sms) / row_bytes;
    long cap = ((long)PS_WAVES * wave + items - 1) / items;
    cap = cap < (long)by_bytes ? cap : (long)by_bytes;
    cap = cap < MERGE_MAX_SPLITS ? cap : MERGE_MAX_SPLITS;
    int want;
    if (c->prefill_splits > 1) /* forced (tests, measurements): within the partials' bound */
        want = c->prefill_splits < cap ? c->prefill_splits : (int)cap;
    else
        want = items >= wave ? 1 : plan_splits((int)items, wave, max_len, PS_MIN_CHUNK, (int)cap);
    if (want <= 1) return off;
    const int chunk = ((max_len + want - 1) / want + PS_KEY_ALIGN - 1) / PS_KEY_ALIGN * PS_KEY_ALIGN;
    const int n_splits = (max_len + chunk - 1) / chunk;
    if (n_splits <= 1) return off;
    return prefill_split{c->part, n_splits, chunk};
}

} // namespace CKV_CUDA_NS
