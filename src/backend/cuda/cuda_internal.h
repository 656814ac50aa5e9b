/* cuda_internal.h - private to backend/cuda: the CUDA backend's state (device, the one compute
 * stream, the cuBLAS handle, workspaces), the check macros every CUDA and cuBLAS call goes through,
 * element load/store helpers shared by the kernels, and the host entry points of the kernel files
 * (cuda_ops.cu, cuda_matmul.cu, cuda_kv.cu, cuda_attention.cu, cuda_prefill_split.cu, cuda_decode.cu, cuda_sample.cu, cuda_evict_*.cu, cuda_score_*.cu). Everything is in namespace
 * CKV_CUDA_NS, so the GPU build and the emulated build (cuda_rt.h) can live in one program. */
#ifndef CKV_CUDA_INTERNAL_H
#define CKV_CUDA_INTERNAL_H

#include "cuda_rt.h"

extern "C" {
#include "backend/backend.h"
#include "backend/gpu_workspace.h"
}

namespace CKV_CUDA_NS {

/* The backend's ctx. Workspaces are allocated at init or grown by the first (prefill-sized) call
 * that needs more; decode steps of a fixed batch never allocate. */
struct ctx {
    int device;
    int sms, cc_major, cc_minor;
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;            /* cuBLAS workspace (docs/gpu.md §5) */
    size_t blas_ws_bytes;
    ckv_bf16 *xbf;            /* activations converted to bf16 for the GEMM */
    size_t xbf_cap;           /* bytes */
    float *part;              /* split-KV partials: per row and split, o [hd], m, l; at init at least
                                 prefill_split_bytes (the prefill's split-K never grows it) */
    size_t part_cap;          /* bytes */
    int prefill_splits;       /* CKV_CUDA_PREFILL_SPLITS: 0 plans the prefill's split-K, N > 0 forces N (1: off) */
    int decode_fma;           /* CKV_CUDA_DECODE_MMA=0: the FMA decode kernel where the tensor-core one fits */
    unsigned long long *count; /* [1] count_nonfinite's counter */
    void *evict_ws;           /* scratch of the eviction ops: one op at a time; sized by evict_reserve */
    size_t evict_ws_cap;      /* bytes */
    unsigned char *stage;     /* [stage_cap] page-locked ring the small uploads are staged through */
    size_t stage_cap, stage_off; /* bytes; the next free offset */
    size_t stage_used;        /* bytes staged since the host last waited for the stream (<= stage_cap) */
    ckv_status pending;       /* first error of a void op, reported by sync() */
    char pending_msg[320];
    const char *last_op;      /* the op launched last (named when an asynchronous fault surfaces) */
    int sync_each;            /* CKV_CUDA_SYNC=1: synchronise after every op (exact fault attribution);
                                 2: the same, and the op profile below */
    struct op_profile *prof;  /* CKV_CUDA_SYNC=2: per-op calls and wall times (cuda_profile.cu), else NULL */
    unsigned long long ws_gen; /* moves when grow() reallocates a workspace (a recorded graph holds the old address) */
    struct graph_cache *graphs; /* the recorded steps (cuda_graph.cu) */
    struct mem_ledger *ledger;  /* the device memory this backend allocated (cuda_ledger.cu); NULL before the first */
};

/* The backend's ctx, with the backend's device made current on the calling thread: the current
 * device is per host thread, and the backend may be driven from another thread than the one that
 * created it (the server's engine thread), which would otherwise allocate and launch on device 0. */
static inline ctx *ctx_of(ckv_backend *be) {
    ctx *c = (ctx *)be->ctx;
    int cur = -1;
    if (c && (cudaGetDevice(&cur) != cudaSuccess || cur != c->device)) (void)cudaSetDevice(c->device);
    return c;
}

/* One-line status for a failed CUDA / cuBLAS call made for `what`. */
ckv_status status_cuda(cudaError_t e, const char *what);
ckv_status status_cublas(cublasStatus_t e, const char *what);
/* Records the first failure of a void op (reported by sync()). */
void record(ctx *c, ckv_status s);
/* After an op's launches: records a launch error naming `op`; remembers `op` as the last one. */
void op_done(ctx *c, const char *op);
/* Waits on the host for the compute stream (every host wait of the backend goes through it: it
 * frees the staging ring). */
cudaError_t stream_wait(ctx *c);
/* Grows a device workspace to at least `bytes` (outside the decode loop: see ctx). */
ckv_status grow(ctx *c, void **buf, size_t *cap_bytes, size_t bytes, const char *what);
/* A CKV_CUDA_* setting read when the backend starts: unset or empty leaves *value as it is; otherwise
 * a decimal number from 0 to max, or a one-line ERR_ARG naming the variable, its value and
 * `expected` (what the values mean). */
ckv_status env_setting(const char *name, int max, const char *expected, int *value);
/* The first failure of a void op since the last report, as a status (cleared), or OK. */
ckv_status take_pending(ctx *c);
/* cuda_profile.cu (CKV_CUDA_SYNC=2): init starts c->prof; add counts op's call and the time since the
 * previous op ended (called by op_done after its wait; `entered`: when op_done began, which ends
 * the loading before the first op); free prints the table to stderr, then frees it (NULL: nothing). */
ckv_status op_profile_init(ctx *c);
/* cuda_ledger.cu: add records a device allocation of `bytes` at ptr named `what` (NULL ptr: nothing),
 * sub forgets ptr's (unknown or NULL: nothing); usage reports live and peak bytes; print writes the
 * peak and its largest parts to stderr; free drops the ledger. */
ckv_status ledger_add(ctx *c, void *ptr, size_t bytes, const char *what);
void ledger_sub(ctx *c, void *ptr);
void ledger_usage(ctx *c, ckv_backend_mem *out);
void ledger_print(ctx *c);
void ledger_free(ctx *c);
void op_profile_add(ctx *c, const char *op, double entered);
void op_profile_free(ctx *c);

/* Every CUDA / cuBLAS call of a function returning ckv_status. */
#define CKV_CUDA_CHECK(call, what)                                       \
    do {                                                                 \
        cudaError_t ckv_e_ = (call);                                     \
        if (ckv_e_ != cudaSuccess) return status_cuda(ckv_e_, (what));   \
    } while (0)
#define CKV_CUBLAS_CHECK(call, what)                                     \
    do {                                                                 \
        cublasStatus_t ckv_e_ = (call);                                  \
        if (ckv_e_ != CUBLAS_STATUS_SUCCESS) return status_cublas(ckv_e_, (what)); \
    } while (0)
/* ... and of a void op: the failure is recorded for sync(). */
#define CKV_CUDA_OP_CHECK(c, call, what)                                 \
    do {                                                                 \
        cudaError_t ckv_e_ = (call);                                     \
        if (ckv_e_ != cudaSuccess) record((c), status_cuda(ckv_e_, (what))); \
    } while (0)
#define CKV_CUBLAS_OP_CHECK(c, call, what)                               \
    do {                                                                 \
        cublasStatus_t ckv_e_ = (call);                                  \
        if (ckv_e_ != CUBLAS_STATUS_SUCCESS) record((c), status_cublas(ckv_e_, (what))); \
    } while (0)

/* ---- element access of typed buffers (fp32 arithmetic everywhere) ------------------------------ */

__device__ __forceinline__ float ld_f32(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float ld_f32(const ckv_bf16 *p, size_t i) { return __bfloat162float(p[i]); }
__device__ __forceinline__ void st_f32(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void st_f32(ckv_bf16 *p, size_t i, float v) { p[i] = __float2bfloat16(v); }

/* One 16-byte __shared__ access of 4 floats (p 16-byte aligned): LDS.128 / STS.128 on the GPU, and
 * one 16-byte access on the CPU execution layer too (a struct copy there would be four 4-byte ones,
 * which its profile would count with another bank pattern). */
#if defined(CKV_CUDA_EMU)
__device__ __forceinline__ float4 lds_f4(const float *p) { return __ldg((const float4 *)p); }
__device__ __forceinline__ void sts_f4(float *p, float4 v) {
    union {
        ckv_emu_v16 u;
        float4 f;
    } x;
    x.f = v;
    *(ckv_emu_v16 *)p = x.u;
}
#else
__device__ __forceinline__ float4 lds_f4(const float *p) { return *(const float4 *)p; }
__device__ __forceinline__ void sts_f4(float *p, float4 v) { *(float4 *)p = v; }
#endif

/* 16 bytes of a row of T at element `at` (16-byte aligned), unpacked to VEC fp32 values (zeros when !ok):
 * the K/V row loads of the decode and chunk-attention kernels. */
template <typename T> struct row_chunk;
template <> struct row_chunk<ckv_bf16> {
    static constexpr int VEC = 8;
    __device__ __forceinline__ static void load(float *x, const ckv_bf16 *p, size_t at, bool ok) {
        uint4 w = {0u, 0u, 0u, 0u};
        if (ok) w = __ldg((const uint4 *)(p + at));
        const uint32_t u[4] = {w.x, w.y, w.z, w.w};
CKV_UNROLL
        for (int i = 0; i < 4; i++) { /* bf16 -> fp32: the bits in the high half */
            x[2 * i] = __uint_as_float(u[i] << 16);
            x[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
        }
    }
};
template <> struct row_chunk<float> {
    static constexpr int VEC = 4;
    __device__ __forceinline__ static void load(float *x, const float *p, size_t at, bool ok) {
        uint4 w = {0u, 0u, 0u, 0u};
        if (ok) w = __ldg((const uint4 *)(p + at));
        x[0] = __uint_as_float(w.x), x[1] = __uint_as_float(w.y), x[2] = __uint_as_float(w.z), x[3] = __uint_as_float(w.w);
    }
};

/* One thread's lane sum (backend.h) over a row's d channels: sum over a < d of fx(a) * fy(a) in
 * double, each lane's terms added by fma in channel order, then the lanes' fixed tree, as the CPU's
 * vector lanes (cpu/cpu_lanes.h). A plain sum passes fy = 1 (fma(x, 1, l) is x + l). */
template <typename FX, typename FY> __device__ __forceinline__ double lane_sum(int d, FX fx, FY fy) {
    double l[CKV_EVICT_LANES];
CKV_UNROLL
    for (int i = 0; i < CKV_EVICT_LANES; i++) l[i] = 0.0;
    for (int a0 = 0; a0 < d; a0 += CKV_EVICT_LANES)
CKV_UNROLL
        for (int i = 0; i < CKV_EVICT_LANES; i++)
            if (a0 + i < d) l[i] = fma(fx(a0 + i), fy(a0 + i), l[i]);
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread must call it and
 * gets the total. red: [32] shared scratch. */
template <typename T> __device__ __forceinline__ T block_sum(T v, T *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, nw = (int)blockDim.x >> 5;
    __syncthreads(); /* red may still be read by a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : (T)0;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Exclusive scan over the block (blockDim.x a multiple of 32): returns the sum of v over the threads
 * before this one; *total gets the block's sum. wsum: [32] shared. Every thread must call it. */
template <typename T> __device__ __forceinline__ T block_scan_excl(T v, T *wsum, T *total) {
    const int lane = (int)threadIdx.x & 31, warp = (int)threadIdx.x >> 5, nw = (int)blockDim.x >> 5;
    T x = v; /* inclusive scan within the warp */
    for (int o = 1; o < 32; o <<= 1) {
        const T y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    __syncthreads(); /* wsum may still be read by a previous call */
    if (lane == 31) wsum[warp] = x;
    __syncthreads();
    T before = 0, all = 0;
    for (int w = 0; w < nw; w++) {
        before += w < warp ? wsum[w] : (T)0;
        all += wsum[w];
    }
    *total = all;
    return before + x - v;
}

/* Max (fmaxf: NaN ignored) over the block, as block_sum; every thread gets it. red: [32] shared. */
__device__ __forceinline__ float block_max(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, nw = (int)blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    v = lane < nw ? red[lane] : -INFINITY;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* The token rows [*tok0, *tok0 + *ntok) of sequence s of an attention batch of n tokens. */
__device__ __forceinline__ void seq_rows(const ckv_kv_batch &kv, int s, int n, int *tok0, int *ntok) {
    *tok0 = kv.seq_start ? __ldg(&kv.seq_start[s]) : 0; /* read-only loads: the table never changes in a launch */
    *ntok = kv.seq_start ? __ldg(&kv.seq_start[s + 1]) - *tok0 : n;
}

/* Blocks of `threads` covering n items, capped for grid-stride loops. */
static inline unsigned blocks_for(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* ---- host entry points of the kernel files (semantics: backend.h) ------------------------------ */

void embedding(ckv_backend *be, float *out, const ckv_weight *table, const int32_t *ids, int n);
void rmsnorm(ckv_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps);
void rope(ckv_backend *be, float *x, const int32_t *pos, int n, int n_heads, int hd, const float *inv_freq,
          float attn_scale);
void swiglu(ckv_backend *be, float *out, const float *gate, const float *up, size_t n);
void add(ckv_backend *be, float *x, const float *y, size_t n);
ckv_status count_nonfinite(ckv_backend *be, const float *x, size_t n, size_t *n_bad);
void matmul(ckv_backend *be, float *out, const float *x, const ckv_weight *w, const float *bias, int n);
void kv_store(ckv_backend *be, const ckv_kv_batch *kv, const float *k, const float *v, const int32_t *pos, int n);
void kv_gather(ckv_backend *be, const ckv_kv_gather_params *g);
void kv_rerotate(ckv_backend *be, const ckv_kv_batch *kv, const float *inv_freq);
void attention(ckv_backend *be, float *out, const ckv_attention_params *a);
/* cuda_decode.cu: split-KV attention (attention's checks done; records failures on c) */
constexpr int DECODE_HD_MAX = 256; /* largest head dim of attention */
void attention_split(ctx *c, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                     int n_heads, float scale);
/* The split plan and the merge the split-KV kernels and the prefill's split-K share (cuda_decode.cu,
 * docs/gpu.md §4): the split count of `items` blocks of work over max_len keys with `wave` blocks
 * resident at once (the smallest within 95% of the best wave efficiency, each split >= min_chunk
 * keys, at most cap), and the merge of the partials part [rows, n_splits, hd + 2] (o unnormalised,
 * m in base 2, l) into out [rows, hd], summed in split order. */
constexpr int MERGE_MAX_SPLITS = 64;
int plan_splits(int items, int wave, int max_len, int min_chunk, int cap);
void launch_merge(ctx *c, float *out, const float *part, int rows, int n_splits, int hd);
/* The decode kernels' split plan over the (sequence, KV head) segments at blocks_per_sm resident
 * blocks per SM, at least 256 keys per split, split boundaries on multiples of key_align; grows the
 * partials c->part to the plan's bound. False (recorded on c) when they cannot grow. */
bool decode_split_plan(ctx *c, const ckv_kv_batch *kv, int n, int n_heads, int blocks_per_sm, int key_align,
                       int *n_splits, int *chunk);
/* cuda_decode_mma.cu: the tensor-core decode kernel (bf16 caches, head dims 64, 80, 96, 128, at
 * most DECODE_MMA_ROWS query rows per segment) and its merge; decode_mma_fits says whether it
 * takes a batch whose segments hold at most `rows` query rows. */
constexpr int DECODE_MMA_ROWS = 8;
bool decode_mma_fits(const ckv_kv_batch *kv, int rows);
void launch_decode_mma(ctx *c, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                       int n_heads, float scale);
/* cuda_prefill_split.cu: split-K of the prefill kernel over long key ranges (docs/gpu.md §3b). A
 * plan of n_splits > 1 runs split sp of every block over keys [sp * chunk, +chunk) into part (rows
 * as launch_merge's), then the merge; n_splits 1 (part NULL) is the one-pass kernel. */
struct prefill_split {
    float *part;  /* [n * n_heads, n_splits, hd + 2] or NULL */
    int n_splits; /* >= 1 */
    int chunk;    /* keys per split (a multiple of 64); INT_MAX when n_splits is 1 */
};
prefill_split prefill_split_plan(const ctx *c, const ckv_kv_batch *kv, int n, int n_heads);
/* The partials' bytes the plan may use on a device of `sms` SMs (reserved at init). */
size_t prefill_split_bytes(int sms);
/* eviction ops: cuda_evict_rows.cu, cuda_evict_attn.cu */
ckv_status op_status(ctx *c, const char *op); /* op_done, then a launch error as the op's status */
/* The eviction workspace: bytes of n parts laid out 256-byte aligned (offsets in at, may be NULL),
 * and those parts in the workspace, grown if an op needs more than evict_reserve sized it for. */
size_t parts_total(const size_t *bytes, int n, size_t *at);
ckv_status scratch_parts(ctx *c, const size_t *bytes, void **parts, int n, const char *op);
/* An error naming `op` unless the KV dtype is one the eviction kernels read (bf16, f32). */
ckv_status kv_dtype_check(ckv_dtype t, const char *op);
ckv_status evict_attn_colsum(ckv_backend *be, double *colsum, int n_cols, const ckv_evict_attn_params *a,
                             ckv_evict_colsum_rows rows, ckv_evict_accum accum);
ckv_status evict_attn_probs(ckv_backend *be, float *p, int ld, const ckv_evict_attn_params *a);
void evict_colsum_finish(ckv_backend *be, float *out, int ld_out, const double *colsum, int ld_in, int rows, int n,
                         double denom, ckv_evict_denom minus_col);
void evict_pool(ckv_backend *be, float *y, const float *x, int rows, int n, int ld, int kernel,
                ckv_evict_pool_kind max);
void evict_head_sum(ckv_backend *be, float *dst, int ld_dst, const float *src, int ld_src, int n_src, int n, int head0,
                    int group);
void evict_div(ckv_backend *be, float *x, size_t n, float div);
void evict_row_norm(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows,
                    ckv_evict_kv_part values, float sign);
void evict_add_mul(ckv_backend *be, float *out, const float *s, const float *m, int rows, int n, int ld, float eps);
ckv_status evict_value_norm(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows,
                            const ckv_weight *wo, int n_heads_local, int head0, int group);
void evict_fill(ckv_backend *be, float *x, int rows, int ld, int t0, int t1, ckv_evict_fill_kind kind, float value);
void evict_random(ckv_backend *be, float *x, int rows, int n, int ld, uint64_t seed, int layer, int head0);
void evict_max(ckv_backend *be, float *out, const float *x, int rows, int ld, int t0, int t1);
ckv_status evict_topk(ckv_backend *be, int32_t *idx, int ld_idx, const float *s, int ld, int rows, int n,
                      const int32_t *k);
void evict_scatter(ckv_backend *be, float *x, int ld, int rows, const int32_t *idx, int ld_idx, const int32_t *k,
                   float value);
ckv_status evict_topk_counts(ckv_backend *be, int32_t *counts, const float *s, int ld, int rows, int n, int64_t total);
ckv_status evict_defensive_rows(ckv_backend *be, const ckv_evict_defensive_params *d);
ckv_status evict_moments(ckv_backend *be, double *s1, double *s2, const float *q, const float *shift, int n,
                         int n_heads_local, int d, ckv_evict_accum zero);
ckv_status evict_ea_logits(ckv_backend *be, float *logit, const ckv_kv_batch *kv, int g, int row0, int n,
                           const float *mu, const float *cov, float sqrt_d);
void evict_softmax_add(ckv_backend *be, float *dst, float *x, int n);
ckv_status evict_reserve(ckv_backend *be, const ckv_evict_shape *shape);
/* Compactor's chunked non-causal attention (cuda_evict_chunk.cu); scratch as attn_stats (evict_reserve). */
ckv_status evict_chunk_colsum(ckv_backend *be, double *colsum, int n_cols, const ckv_evict_attn_params *a, int n_pad,
                              ckv_evict_accum accum);
void evict_row_stats(ckv_backend *be, double *stats, const float *x, int rows, int n, int ld);
/* KVzip's replayed attention maxima (cuda_evict_kvzip.cu): window_stats_ranges, then a column-max
 * kernel over the chunk's key tiles; scratch as window_stats' (evict_reserve). */
ckv_status evict_kvzip(ckv_backend *be, float *out, int ld, const ckv_evict_kvzip_params *z);
/* KVzip+'s norms (cuda_evict_kvzip_norms.cu) and their scratch (the Gram blocks) for evict_reserve. */
ckv_status evict_kvzip_norms(ckv_backend *be, const ckv_evict_kvzip_norms_params *n);
size_t kvzip_norms_scratch_bytes(int n_heads_local, int d);
/* ChunkKV's chunk selection (cuda_evict_chunkkv.cu) and its workspace for n rows (evict_reserve). */
ckv_status evict_chunk_rank(ckv_backend *be, int32_t *rows, int ld_rows, int n_rows, int32_t *n_kept, const float *s,
                            int ld, int H, int n, int C, int keep);
size_t chunk_rank_scratch_bytes(int n);
/* Scratch bytes (eviction workspace) of the key scorers (KeyDiff, CUR) and of the selections (top-k
 * over `rows` rows of n entries), for evict_reserve. */
size_t keys_scratch_bytes(int n_kv, int d, int n_rows);
/* evict_leverage's workspace for n_kv heads of dim d, n rows and sketch k (cuda_score_leverage.cu). */
size_t leverage_scratch_bytes(int n_kv, int d, int n, int k);
size_t topk_scratch_bytes(int rows, int n);
/* cuda_evict_window.cu: the window scores of evict_attn_colsum / evict_attn_probs on tensor cores,
 * for the caches window_covers (bf16 or f32, head dims 16, 32, 64, 80, 96, 128). window_stats: each
 * row's softmax (max, 1 / sum) as stats [n_heads_local, n_q] in the workspace; window_colsum adds
 * the weights down the columns (rows per KV head with per_kv, else per local query head); the
 * workspace they need for query_rows window rows over `rows` keys (evict_reserve). */
bool window_covers(const ckv_kv_batch *kv);
size_t window_scratch_bytes(int query_rows, int n_heads_local, int rows);
ckv_status window_stats(ctx *c, float2 **stats, const float *q, int n_q, int q_row0, const ckv_kv_batch *kv,
                        int n_heads_local, int head0, int group, float scale, int divide, const char *op);
/* The key rows window_stats_ranges reads: n <= 3 ranges of segment rows [lo[r], hi[r]) (empty ones
 * allowed), each cut into 512-key chunks; chunk c of pass 1 is chunk c - first[r] of range r, first[n]
 * the total. window_stats is its one range [0, q_row0 + n_q); evict_kvzip passes the sinks, the chunk
 * and the replay. Key t is visible to query i when t <= q_row0 + i, as window_stats'. */
struct key_ranges {
    int n, lo[3], hi[3], first[4];
};
key_ranges key_ranges_of(int n, const int *lo, const int *hi);
ckv_status window_stats_ranges(ctx *c, float2 **stats, const key_ranges *kr, const float *q, int n_q, int q_row0,
                               const ckv_kv_batch *kv, int n_heads_local, int head0, int group, float scale,
                               int divide, const char *op);
void window_colsum(ctx *c, double *colsum, int n_cols, const float2 *stats, const float *q, int n_q, int q_row0,
                   const ckv_kv_batch *kv, int n_heads_local, int head0, int group, float scale, int divide,
                   int per_kv);
ckv_status evict_keydiff(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows);
ckv_status evict_lagkv(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows, int n_sink, int lag,
                       ckv_evict_lagkv_score score);
ckv_status evict_leverage(ckv_backend *be, float *out, int ld, double *stats, const ckv_kv_batch *kv, int row0, int n,
                          const float *inv_freq, float rope_scale, const float *phi, int k);
void evict_affine(ckv_backend *be, float *x, int rows, int n, int ld, float sub, float div);
ckv_status evict_cur(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows, int n_sink,
                     ckv_evict_cur_kind kind, int window);
void sample(ckv_backend *be, int32_t *out, const float *logits, int n, int vocab, float temperature, int top_k,
            float top_p, const double *u);
/* cuda_graph.cu: the recorded steps (init reads CKV_CUDA_GRAPHS; free destroys every graph) */
ckv_status graph_cache_init(ctx *c);
void graph_cache_free(ctx *c);
ckv_status graph_begin(ckv_backend *be, const void *owner, const void *key, size_t key_bytes, int *replayed);
ckv_status graph_end(ckv_backend *be, ckv_status step);
void graph_release(ckv_backend *be, const void *owner);

} // namespace CKV_CUDA_NS

#endif
