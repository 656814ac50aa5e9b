/* backend.h - the compute backend: a table of function pointers over device buffers plus a context
 * pointer. Every tensor op the model, the KV cache and the presses need goes through this table, so
 * the CPU backend (the reference) and the CUDA backend are interchangeable. Every pointer an op
 * takes lives on the backend's device (the CPU backend's device is the host) unless its comment
 * says "host". Activations are fp32; weights are typed (ckv_weight); the KV cache has a dtype.
 * Shapes are row-major. Ops that cannot fail return void; a device backend reports asynchronous
 * failures from sync(), naming the op. This header includes no CUDA header and knows nothing of
 * models, files or communication. */
#ifndef CKV_BACKEND_H
#define CKV_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

typedef struct ckv_backend ckv_backend;

/* A weight matrix in HF (out, in) layout: `rows` output features of `cols` inputs, stored as dtype
 * (F32, F16, BF16, or a GGUF block type: each row is cols / block_elems blocks). Row r starts at
 * data + r * row_bytes. 1-D weights (norms, biases) are plain fp32 device arrays, not ckv_weight. */
typedef struct {
    void *data;        /* device */
    ckv_dtype dtype;
    int64_t rows, cols;
    size_t row_bytes;
} ckv_weight;

/* One (sequence, KV head) segment of the KV cache as the device sees it: the head's rows are
 * k/v/pos[0 .. len), sorted by original position; cap rows are reserved. Lives in device memory;
 * the KV cache keeps it in step with its host bookkeeping (kv/kv_cache.h). */
typedef struct {
    void *k;        /* [cap, head_dim] post-RoPE keys, in the batch's dtype */
    void *v;        /* [cap, head_dim] values */
    int32_t *pos;   /* [cap] original token position of each row */
    int32_t len;    /* rows in use */
    int32_t cap;    /* rows reserved */
} ckv_kv_seg;

/* A batch of token rows over the KV segments of one layer of n_seq sequences. Token t of the batch
 * belongs to sequence seq_of[t]; the tokens of sequence s are the contiguous rows
 * seq_start[s] .. seq_start[s + 1] - 1, in position order. Query head h of a token reads KV head
 * h / (n_heads / n_kv_heads) of its sequence. With one sequence (n_seq = 1) seq_of and seq_start
 * may be NULL: every token belongs to it. All arrays are device memory. */
typedef struct {
    ckv_dtype dtype;           /* of every segment's k and v: F32, F16 or BF16 */
    int head_dim;
    int n_kv_heads;            /* KV heads of each sequence held by this rank */
    int n_seq;
    ckv_kv_seg *const *segs;   /* [n_seq] device array; segs[s] -> [n_kv_heads] segments (device) */
    const int32_t *seq_of;     /* [n tokens] sequence of each token, or NULL (one sequence) */
    const int32_t *seq_start;  /* [n_seq + 1] first token row of each sequence, or NULL */
    int max_len;               /* host-known bound on every segment's len after the op (launch sizing) */
} ckv_kv_batch;

/* The inputs of the attention op (one struct, as FlashInfer's attention params): n query tokens of
 * the batch's sequences. */
typedef struct {
    const float *q;         /* [n, n_heads, kv->head_dim] fp32 queries, RoPE'd (device) */
    const int32_t *qpos;    /* [n] position of each query token (device) */
    const ckv_kv_batch *kv; /* the layer's segments of every sequence; token t belongs to kv->seq_of[t] */
    int n;                  /* query tokens */
    int n_heads;            /* query heads held by this rank */
    float scale;            /* logits = (q . k) * scale */
} ckv_attention_params;

/* The inputs of kv_gather: the segments of one sequence compacted to their kept rows. */
typedef struct {
    ckv_dtype dtype;        /* of every segment's k and v */
    int head_dim;
    int n_kv;               /* segments (KV heads) of the sequence */
    ckv_kv_seg *dst;        /* [n_kv] destination segments (device) */
    const ckv_kv_seg *src;  /* [n_kv] source segments (device), not overlapping dst's rows */
    const int32_t *keep;    /* [n_kv, stride] ascending source rows of each segment (device) */
    int stride;             /* row stride of keep */
    const int32_t *n_keep;  /* [n_kv] rows kept per segment (device) */
} ckv_kv_gather_params;

/* The largest calls the eviction ops of one layer will see (evict_reserve). */
typedef struct {
    int rows;                  /* context rows scored (L) */
    int query_rows;            /* query rows of one attention op call (a window, a block of queries) */
    int n_heads_local;         /* local query heads */
    int n_kv_local;            /* local KV heads (the segments of the layer's batch) */
    int n_kv_all;              /* KV heads of the whole model (cross-head top-k over all of them) */
    int head_dim;
    int hidden;                /* o_proj rows (CriticalKV's value norms) */
    ckv_dtype kv_dtype, wo_dtype;
    int sketch;                /* evict_leverage's sketch columns k over `rows` rows (0: no leverage op) */
} ckv_evict_shape;

/* ---- parameters of the wide eviction ops (one struct per op family; semantics at the ops) ---- */

/* How a logit is formed from a dot product: (q . k) * scale, or (q . k) / scale. */
typedef enum { CKV_EVICT_LOGITS_MUL = 0, CKV_EVICT_LOGITS_DIV } ckv_evict_logits;
/* Whether an accumulating op adds to its output or sets it to 0 first. */
typedef enum { CKV_EVICT_ADD = 0, CKV_EVICT_ZERO_FIRST } ckv_evict_accum;
/* The rows of a column sum: one per local query head, or one per local KV head (its group summed). */
typedef enum { CKV_EVICT_PER_QUERY_HEAD = 0, CKV_EVICT_PER_KV_HEAD } ckv_evict_colsum_rows;
/* evict_colsum_finish's divisor: the same for every column, or minus the column index. */
typedef enum { CKV_EVICT_DENOM_FIXED = 0, CKV_EVICT_DENOM_MINUS_COL } ckv_evict_denom;
/* evict_pool's window reduction. */
typedef enum { CKV_EVICT_POOL_AVG = 0, CKV_EVICT_POOL_MAX } ckv_evict_pool_kind;
/* Which rows of a segment an op reads: its keys or its values. */
typedef enum { CKV_EVICT_KEYS = 0, CKV_EVICT_VALUES } ckv_evict_kv_part;
/* What evict_fill writes: a value, or each column's index. */
typedef enum { CKV_EVICT_FILL_VALUE = 0, CKV_EVICT_FILL_INDEX } ckv_evict_fill_kind;
/* evict_lagkv's score of a row: its rank in its partition / lag, or (cross) its softmax weight. */
typedef enum { CKV_EVICT_LAGKV_RANK = 0, CKV_EVICT_LAGKV_CROSS } ckv_evict_lagkv_score;
/* evict_cur's row score: key norms, value norms, their mean, or their product (kvpress leverage_type). */
typedef enum { CKV_EVICT_CUR_KEYS = 0, CKV_EVICT_CUR_VALUES, CKV_EVICT_CUR_MEAN, CKV_EVICT_CUR_PRODUCT } ckv_evict_cur_kind;
/* A "lane sum" over a row's d channels (evict_row_norm, evict_keydiff, evict_lagkv, evict_cur): the
 * terms in double, CKV_EVICT_LANES partial sums, lane l adding the terms of channels l, l + 8, l + 16,
 * ... in ascending order, then the lanes added as ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
 * One fixed order on every backend and thread count; a CPU computes the lanes as one vector. A term
 * that is a product is added to its lane with one rounding (fused multiply-add: the CUDA kernels, the
 * CPU's AVX-512 lanes, and its plain C lanes where the build targets a CPU with FMA). Squares of fp32
 * inputs are exact in double either way; a dot with a double operand or a squared deviation may
 * differ in the last bit in a build for a CPU without FMA (CKV_NATIVE off). */
enum { CKV_EVICT_LANES = 8 };

/* The attention of a block of context query rows to one sequence's segments: the inputs of
 * evict_attn_colsum, evict_attn_probs and evict_chunk_colsum. Query i sits at context row
 * q_row0 + i; local query head j (global head head0 + j) reads segment (head0 + j) / group. */
typedef struct {
    const float *q;          /* [n_q, n_heads_local, kv->head_dim] fp32, RoPE'd (device) */
    int n_q;                 /* query rows */
    int q_row0;              /* context row of query 0 */
    const ckv_kv_batch *kv;  /* ONE sequence: segs[0] -> kv->n_kv_heads segments */
    int n_heads_local;       /* local query heads */
    int head0;               /* global index of local query head 0 */
    int group;               /* query heads per KV head */
    float scale;
    ckv_evict_logits logits; /* (q . k) * scale or / scale (evict_chunk_colsum: MUL only) */
} ckv_evict_attn_params;

/* KVzip's scores of one replayed chunk (evict_kvzip): the n_q replayed queries sit at segment rows
 * ctx .. ctx + n_q - 1 (after the ctx context rows); query i of local query head j attends to the
 * first `sink` rows, the chunk's rows start .. end - 1 and the replayed rows ctx .. ctx + i. */
typedef struct {
    const float *q;          /* [n_q, n_heads_local, kv->head_dim] fp32 replayed queries, RoPE'd (device) */
    int n_q;                 /* replayed rows */
    int ctx;                 /* context rows L: the segment row of replayed query 0 */
    int start, end;          /* the chunk's context rows [start, end), sink <= start < end <= ctx */
    int sink;                /* rows 0 .. sink - 1 every query also sees */
    const ckv_kv_batch *kv;  /* ONE sequence: segs[0] -> kv->n_kv_heads segments of >= ctx + n_q rows */
    int n_heads_local;       /* local query heads */
    int head0;               /* global index of local query head 0, as ckv_evict_attn_params' */
    int group;               /* query heads per KV head */
    float scale;             /* logits = (q . k) / scale (kvpress divides by sqrt(head_dim)) */
    const float *hinv;       /* KVzip+: [n_q] 1 / ||h|| of each replayed attention input (device), or NULL */
    const float *vn;         /* KVzip+: [n_heads_local, ld_vn] ||v W_O^j|| of chunk row start + c at column c
                              * (device), or NULL; both or neither */
    int ld_vn;
} ckv_evict_kvzip_params;

/* KVzip+'s norms of one replayed chunk (evict_kvzip_norms), the inputs evict_kvzip's hinv and vn. */
typedef struct {
    const float *wot;        /* [n_heads_local * kv->head_dim, hidden] o_proj's local input columns,
                              * transposed: row j d + a is the column query head j's dim a feeds (device) */
    const float *x;          /* [n_q, hidden] the replay's attention inputs (device) */
    int n_q;                 /* replayed rows */
    int hidden;              /* o_proj's output rows */
    const ckv_kv_batch *kv;  /* ONE sequence: segs[0] -> kv->n_kv_heads segments; values of rows start .. end - 1 read */
    int start, end;          /* the chunk's context rows [start, end) */
    int n_heads_local;       /* local query heads */
    int head0;               /* global index of local query head 0, as ckv_evict_kvzip_params' */
    int group;               /* query heads per KV head */
    float *hinv;             /* out: [n_q] 1 / ||x_i|| (device) */
    float *vn;               /* out: [n_heads_local, ld_vn] ||W_O^j v|| of chunk row start + c at column c (device) */
    int ld_vn;
} ckv_evict_kvzip_norms_params;

/* DefensiveKV's window aggregation (evict_defensive_rows): inputs and outputs. */
typedef struct {
    const float *p;        /* [n_heads_local, w, ld] attention weights (evict_attn_probs' output) */
    int ld;                /* row stride of p */
    int w;                 /* window rows per head */
    int n;                 /* context columns before the window */
    int n_heads_local;     /* local query heads */
    int head0;             /* global index of local query head 0 */
    int group;             /* query heads per KV head */
    int kernel;            /* odd width of the box filter */
    int n_kv;              /* local KV heads: rows of ave and dmax */
    double *ave;           /* [n_kv, n] double, accumulated */
    float *dmax;           /* [n_kv, n] fp32, running max */
    double *bias;          /* [1] double, accumulated */
    ckv_evict_accum accum; /* ZERO_FIRST: ave, dmax and *bias set to 0 first */
} ckv_evict_defensive_params;

/* Optional op families: what a backend may offer beyond the ops every backend has. A backend
 * declares the families it offers in its table's `caps` (CKV_BACKEND_CAP_BIT of each); callers ask
 * ckv_backend_supports instead of looking at op pointers. The ops of a family are non-NULL exactly
 * when the family is declared (ckv_backend_check_ops). */
typedef enum {
    CKV_BACKEND_CAP_STREAM = 0,    /* stream: a device queue to order other device work behind */
    CKV_BACKEND_CAP_DEVICE_ID,     /* device_id: a name of the physical device */
    CKV_BACKEND_CAP_EVICT_RESERVE, /* evict_reserve: eviction scratch kept between calls, sized ahead */
    CKV_BACKEND_CAP_KEYDIFF,       /* evict_keydiff */
    CKV_BACKEND_CAP_LAGKV,         /* evict_lagkv */
    CKV_BACKEND_CAP_CUR,           /* evict_cur */
    CKV_BACKEND_CAP_LEVERAGE,      /* evict_leverage */
    CKV_BACKEND_CAP_CHUNK_COLSUM,  /* evict_chunk_colsum and evict_row_stats (Compactor's non-causal attention) */
    CKV_BACKEND_CAP_GRAPHS,        /* graph_begin, graph_end, graph_release: a repeated step recorded once and replayed */
    CKV_BACKEND_CAP_KVZIP,         /* evict_kvzip (KVzip's replayed attention maxima), evict_kvzip_norms (KVzip+) */
    CKV_BACKEND_CAP_CHUNK_RANK,    /* evict_chunk_rank (ChunkKV's chunk selection) */
    CKV_BACKEND_CAP_MEM_USAGE,     /* mem_usage: the device memory the backend allocated */
    CKV_BACKEND_CAP_COUNT
} ckv_backend_cap;

#define CKV_BACKEND_CAP_BIT(cap) (1u << (unsigned)(cap))

/* The sample op's id for a row of logits holding a non-finite value. */
#define CKV_SAMPLE_NONFINITE (-1)

/* The sample op's integer sums, the same on every backend (order-free, so any grid gives the same
 * bits): the softmax's sum adds each term exp(x / T - max) (at most 1) times 2^ckv_sample_exp_shift
 * (vocab), truncated, the largest shift that leaves a bit of headroom in 63 bits; a candidate's mass
 * is its p times CKV_SAMPLE_MASS_ONE, truncated. */
#define CKV_SAMPLE_MASS_ONE 2305843009213693952.0 /* 2^61 */
static inline int ckv_sample_exp_shift(int vocab) {
    int s = 62;
    while (s > 0 && (unsigned long long)vocab > (1ull << (62 - s))) s--;
    return s;
}

/* A backend's device memory (mem_usage). */
typedef struct {
    size_t live_bytes;                /* allocated now */
    size_t peak_bytes;                /* the most allocated at once */
    size_t device_used_at_peak_bytes; /* the device's used memory when peak_bytes was reached, or 0 */
    int sms, cc_major;                /* the device's SMs and compute capability (the fixed workspaces'
                                       * sizes, backend/gpu_workspace.h) */
} ckv_backend_mem;

typedef struct {
    /* the optional op families this table offers: CKV_BACKEND_CAP_BIT(cap) of each */
    uint32_t caps;
    /* lifetime */
    void (*free)(ckv_backend *be);
    /* memory: device buffers and host<->device copies (the CPU backend's device is the host) */
    ckv_status (*alloc)(ckv_backend *be, void **ptr, size_t bytes, const char *what);
    /* The same, contents undefined (alloc zeroes on the CPU backend, where clearing is a pass over
     * host memory; CUDA's alloc and alloc_raw are one cudaMalloc): for a buffer whose unwritten bytes
     * nothing reads, such as a compacted KV pool (rows past a segment's length are never read). */
    ckv_status (*alloc_raw)(ckv_backend *be, void **ptr, size_t bytes, const char *what);
    void (*release)(ckv_backend *be, void *ptr); /* NULL is fine */
    /* upload: src_host may be reused as soon as it returns; it need not wait for the device (the
     * CUDA backend stages small copies through page-locked memory and queues them). download waits
     * for the work queued before it and reports the first failure of a void op, as sync() does. */
    ckv_status (*upload)(ckv_backend *be, void *dst_dev, const void *src_host, size_t bytes);
    ckv_status (*download)(ckv_backend *be, void *dst_host, const void *src_dev, size_t bytes);
    ckv_status (*copy)(ckv_backend *be, void *dst_dev, const void *src_dev, size_t bytes);
    ckv_status (*sync)(ckv_backend *be);
    /* The queue the backend's device work runs on, as an opaque handle for code that must order its
     * own device work behind the backend's kernels without waiting on the host (a device
     * communicator enqueuing collectives: engine/comm_backend.c). The CUDA backend returns its
     * compute stream (a cudaStream_t; on cuda-emu the CPU execution layer's stream, meaningful only
     * to that layer). Family CKV_BACKEND_CAP_STREAM: absent on the CPU backend (whose ops complete
     * before they return); absent or NULL returned: no queue. Owned by the backend: valid until it
     * is freed; the user must not synchronise, destroy or reconfigure it. Every op above that hands
     * data to the host (download, count_nonfinite) runs on it and waits for it, so host reads stay
     * ordered after the kernels. */
    void *(*stream)(ckv_backend *be);
    /* (family CKV_BACKEND_CAP_DEVICE_ID) id [cap] names the physical device, equal for two backends
     * exactly when they share it (a GPU's PCI bus id; the emulated GPU of cuda-emu, host memory of each
     * process, names one pretend device for all); absent on the CPU backend. Device communicators use
     * it to pick their path. */
    ckv_status (*device_id)(ckv_backend *be, char *id, size_t cap);
    /* (family CKV_BACKEND_CAP_MEM_USAGE) the device memory this backend allocated: its buffers (alloc)
     * and its own workspaces, live now and at their peak since it started, and the device's used
     * memory when that peak was reached (every process and the runtime included; 0 when unknown).
     * Absent on the CPU backend, whose buffers are host memory (ckv_alloc_peak_bytes counts them). */
    void (*mem_usage)(ckv_backend *be, ckv_backend_mem *out);
    /* 1 when matmul and embedding compute weights stored as `t` directly. */
    int (*weight_dtype_ok)(const ckv_backend *be, ckv_dtype t);
    /* 1 when the KV cache may be stored as `t` (F32, F16, BF16). */
    int (*kv_dtype_ok)(const ckv_backend *be, ckv_dtype t);

    /* out[i, :] = table[ids[i], :] in fp32      out [n, table->cols], ids [n] */
    void (*embedding)(ckv_backend *be, float *out, const ckv_weight *table, const int32_t *ids, int n);
    /* out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * w   x, out [n, dim] (out may be x), w [dim] */
    void (*rmsnorm)(ckv_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps);
    /* out = x @ w^T (+ bias), fp32 accumulation   x [n, w->cols], bias [w->rows] or NULL,
     * out [n, w->rows] */
    void (*matmul)(ckv_backend *be, float *out, const float *x, const ckv_weight *w, const float *bias, int n);
    /* In-place rotary embedding, HF "rotate_half" layout: for pair i < hd/2 of each head,
     * angle = (float)pos[t] * inv_freq[i]; (x[i], x[i + hd/2]) rotated by angle, both scaled by
     * attn_scale (1 unless YaRN).   x [n, n_heads, hd], pos [n], inv_freq [hd/2] */
    void (*rope)(ckv_backend *be, float *x, const int32_t *pos, int n, int n_heads, int hd, const float *inv_freq,
                 float attn_scale);
    /* Appends the batch's n tokens: token t (sequence s = seq_of[t], i = t - seq_start[s]) goes to
     * row segs[s][g].len + i of every KV head g (k[t, g, :], v[t, g, :] converted to the batch's
     * dtype, pos[t]); then every segment's len grows by its sequence's token count. The caller has
     * checked the capacities.   k, v [n, n_kv_heads, head_dim] fp32, pos [n] */
    void (*kv_store)(ckv_backend *be, const ckv_kv_batch *kv, const float *k, const float *v, const int32_t *pos,
                     int n);
    /* Causal attention of the a->n query tokens (ckv_attention_params): query head h of token t reads
     * KV head h / (n_heads / n_kv_heads) of its sequence and sees the rows whose pos <= qpos[t];
     * softmax(q.k * scale) v computed in fp32; a row that sees nothing is 0.
     * out [n, n_heads, head_dim] fp32 */
    void (*attention)(ckv_backend *be, float *out, const ckv_attention_params *a);
    /* out[i] = silu(gate[i]) * up[i]   [n] (out may alias gate) */
    void (*swiglu)(ckv_backend *be, float *out, const float *gate, const float *up, size_t n);
    /* x[i] += y[i]   [n] */
    void (*add)(ckv_backend *be, float *x, const float *y, size_t n);
    /* *n_bad (host) = number of non-finite values in x [n]; synchronises. */
    ckv_status (*count_nonfinite)(ckv_backend *be, const float *x, size_t n, size_t *n_bad);
    /* Compacts every segment of one sequence in one call (ckv_kv_gather_params g): segment s of
     * g->dst receives rows keep[s * stride + i], i < n_keep[s] (ascending row indices into segment s
     * of g->src), of k, v and pos; dst[s].len = n_keep[s]. Source and destination do not overlap. */
    void (*kv_gather)(ckv_backend *be, const ckv_kv_gather_params *g);
    /* Re-rotates the cached keys of every segment of every sequence of kv in place (kvpress's
     * KeyRerotationPress): row i < len of a segment, cached at pos[i] (post-RoPE), has each pair
     * (j, j + hd/2) rotated by a = (float)(i - pos[i]) * inv_freq[j], x * cosf(a) + rotate_half(x) * sinf(a)
     * in fp32, and is stored back in the cache's dtype (round to nearest even); then pos[i] = i (the
     * row's new position). Values and lengths are unchanged.   inv_freq [hd/2] (device) */
    void (*kv_rerotate)(ckv_backend *be, const ckv_kv_batch *kv, const float *inv_freq);

    /* ---- eviction ops (evict/ drives them; see evict/ for their callers) ----
     * Conventions: "scores" are fp32 device arrays [rows, ld] (row r at x + r * ld); kv is a batch of
     * ONE sequence (segs[0] -> n_kv_heads segments) whose segments hold at least the rows an op
     * reads; a context row's index is its token index (rows 0 .. L-1 are the context in position
     * order). Query head j of the local query heads reads segment (head0 + j) / group. Top-k order
     * everywhere: descending score, NaN after every number, then ascending index (SPEC tie rule).
     * Ops returning ckv_status may allocate scratch (the CPU backend does; all of it is freed before
     * they return) and report running out of memory; the others cannot fail. Where a result must be
     * bit-stable across thread counts and ranks, the comment fixes the summation order. */

    /* Causal attention column sums of a->n_q query rows (ckv_evict_attn_params): query i at context
     * row r = q_row0 + i sees rows 0 .. r of its segment. logit_t = (q . k_t) * scale, or / scale with
     * CKV_EVICT_LOGITS_DIV (fp32 dot products); p = softmax over the r + 1 visible logits in fp32
     * (e_t = exp(logit_t - max), sum of e in double, inv = (float)(1 / sum), p_t = e_t * inv in fp32);
     * then colsum[o, t] += (double)p_t for t < min(r + 1, n_cols), o = (head0 + j) / group with
     * CKV_EVICT_PER_KV_HEAD, else o = j. Accumulation order: heads j ascending, then queries i
     * ascending (deterministic). With CKV_EVICT_ZERO_FIRST the op first sets colsum to 0 (all n_out
     * rows), else it adds to what is there (several query blocks).
     * colsum [n_out, n_cols] double, n_out = kv->n_kv_heads per KV head, else n_heads_local. */
    ckv_status (*evict_attn_colsum)(ckv_backend *be, double *colsum, int n_cols, const ckv_evict_attn_params *a,
                                    ckv_evict_colsum_rows rows, ckv_evict_accum accum);
    /* The same attention weights written out: p[(j * n_q + i) * ld + t] = p_t (fp32, as above) for
     * t <= r, 0 for r < t < ld. p [n_heads_local, n_q, ld], ld >= q_row0 + n_q. */
    ckv_status (*evict_attn_probs)(ckv_backend *be, float *p, int ld, const ckv_evict_attn_params *a);
    /* out[r * ld_out + t] = (float)(colsum[r * ld_in + t] / den), den = denom - t with
     * CKV_EVICT_DENOM_MINUS_COL, else denom (double division).   r < rows, t < n */
    void (*evict_colsum_finish)(ckv_backend *be, float *out, int ld_out, const double *colsum, int ld_in, int rows,
                                int n, double denom, ckv_evict_denom minus_col);
    /* 1-D pooling along each row, stride 1, window t - kernel/2 .. t + kernel/2 clipped to 0 .. n-1:
     * CKV_EVICT_POOL_MAX (padding ignored) or AVG = fp32 sum in ascending order / (float)kernel (zero padding counted
     * in the divisor, torch's count_include_pad).   x, y [rows, ld] (y != x), t < n, kernel odd */
    void (*evict_pool)(ckv_backend *be, float *y, const float *x, int rows, int n, int ld, int kernel,
                       ckv_evict_pool_kind max);
    /* dst[(head0 + j) / group, t] += src[j, t] in fp32, j ascending (the sum over a group's query
     * heads).   src [n_src, ld_src], dst [.., ld_dst], t < n */
    void (*evict_head_sum)(ckv_backend *be, float *dst, int ld_dst, const float *src, int ld_src, int n_src, int n,
                           int head0, int group);
    /* x[i] = x[i] / div in fp32.   x [n] */
    void (*evict_div)(ckv_backend *be, float *x, size_t n, float div);
    /* out[g * ld + t] = sign * (float)sqrt(sum_a (double)x[a]^2) (a lane sum), x = row t of segment g's
     * keys (or its values with CKV_EVICT_VALUES), read in the batch's dtype.   g < n_kv_heads, t < n_rows */
    void (*evict_row_norm)(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows,
                           ckv_evict_kv_part values, float sign);
    /* out[r * ld + t] = (s[r * ld + t] + eps) * m[r * ld + t] in fp32 (out may be s or m).   r < rows, t < n */
    void (*evict_add_mul)(ckv_backend *be, float *out, const float *s, const float *m, int rows, int n, int ld,
                          float eps);
    /* CriticalKV's value norms, accumulated: out[(head0 + j) / group, t] += (float)||V_t W_O^j||_1 for
     * every local query head j (ascending) and row t < n_rows, V_t row t of the head's segment values
     * (batch dtype, computed in fp32), W_O^j^T = columns j*d .. (j+1)*d - 1 of wo ([D, n_heads_local * d],
     * any dtype the backend's matmul takes). The product is formed by GEMMs over blocks of rows
     * (never [n_rows, D] at once) with fp32 products and accumulation; the L1 norm of a
     * row sums |y| in 16 fp32 lanes (lane l takes columns l, l + 16, ...) added in double in lane order,
     * then the tail columns in double (a device backend may sum in another fixed order, independent
     * of scheduling: CUDA's fused kernel, docs/gpu.md §5a).   out [n_kv_heads, ld] */
    ckv_status (*evict_value_norm)(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows,
                                   const ckv_weight *wo, int n_heads_local, int head0, int group);
    /* x[r * ld + t] = value (CKV_EVICT_FILL_VALUE) or (float)t (CKV_EVICT_FILL_INDEX) for r < rows,
     * t0 <= t < t1.   x [rows, ld] */
    void (*evict_fill)(ckv_backend *be, float *x, int rows, int ld, int t0, int t1, ckv_evict_fill_kind kind,
                       float value);
    /* Seeded uniform scores in [0, 1), independent of the head split: x[r * ld + t] =
     * (float)(mix(kr + t * 0xD1B54A32D192ED03) >> 40) / 2^24 with kl = mix(mix(seed) ^ (uint32_t)layer),
     * kr = mix(kl ^ ((uint64_t)(uint32_t)(head0 + r) << 32)) (head0 + r: the global KV head), mix the
     * splitmix64 finaliser (x += 0x9E3779B97F4A7C15; x = (x ^ x >> 30) * 0xBF58476D1CE4E5B9;
     * x = (x ^ x >> 27) * 0x94D049BB133111EB; x ^ x >> 31), all in uint64.   r < rows, t < n */
    void (*evict_random)(ckv_backend *be, float *x, int rows, int n, int ld, uint64_t seed, int layer, int head0);
    /* *out (device) = max(-FLT_MAX, every x[r * ld + t], r < rows, t0 <= t < t1) by fmaxf (NaN ignored). */
    void (*evict_max)(ckv_backend *be, float *out, const float *x, int rows, int ld, int t0, int t1);
    /* Per-row top-k: idx[r * ld_idx + i], i < k[r], = the k[r] best columns of s[r, 0 .. n) (top-k order
     * above), written in ascending column order.   s [rows, ld], idx [rows, ld_idx], k [rows] device,
     * 0 <= k[r] <= n */
    ckv_status (*evict_topk)(ckv_backend *be, int32_t *idx, int ld_idx, const float *s, int ld, int rows, int n,
                             const int32_t *k);
    /* x[r * ld + idx[r * ld_idx + i]] = value for i < k[r].   k [rows] device */
    void (*evict_scatter)(ckv_backend *be, float *x, int ld, int rows, const int32_t *idx, int ld_idx,
                          const int32_t *k, float value);
    /* Cross-head top-k: the `total` best entries of the flattened s (entry (r, t) has flat index
     * r * n + t; top-k order above) and counts[r] = how many of them lie in row r.
     * s [rows, ld], t < n, counts [rows] device, 0 <= total <= rows * n */
    ckv_status (*evict_topk_counts)(ckv_backend *be, int32_t *counts, const float *s, int ld, int rows, int n,
                                    int64_t total);
    /* Shifted moments of a block of n query rows, accumulated per local query head j (expected
     * attention's statistics): x_i = q[i, j, :] - shift[j, :] in fp32; s1[j, a] += (double)x_i[a], i
     * ascending; with s2 != NULL, s2[j, a, b] += (double)o[a, b] where o = X^T X of the block's
     * [n, d] rows X, an fp32 GEMM (k = n). With CKV_EVICT_ZERO_FIRST s1 (and s2) are set to 0 first.
     * q [n, n_heads_local * d], shift [n_heads_local * d], s1 [n_heads_local, d],
     * s2 [n_heads_local, d, d] double */
    ckv_status (*evict_moments)(ckv_backend *be, double *s1, double *s2, const float *q, const float *shift, int n,
                                int n_heads_local, int d, ckv_evict_accum zero);
    /* Expected-attention logits of the n key rows row0 .. row0 + n - 1 of segment g (batch dtype, read
     * as fp32): logit[t] = (float)(sum_a (double)mu[a] * k[a]) / sqrt_d, plus, when cov != NULL,
     * (float)(sum_a (double)kc[a] * k[a]) / (float)d / 2 in fp32, kc = k @ cov^T by an fp32 GEMM over
     * blocks of rows (cov [d, d] symmetric).   mu [d], logit [n] */
    ckv_status (*evict_ea_logits)(ckv_backend *be, float *logit, const ckv_kv_batch *kv, int g, int row0, int n,
                                  const float *mu, const float *cov, float sqrt_d);
    /* DefensiveKV's window aggregation (ckv_evict_defensive_params d) over the attention weights d->p
     * on the n context columns before the window: for local query head j (ascending), g =
     * (head0 + j) / group, and window row i (ascending), row = p[j, i, 0 .. n):
     *   ave[g, t] += (double)row[t];  *bias += (double)row[t] for max(0, n - w) <= t < n;
     *   pooled[t] = (float)(box[t] / kernel), box[t] = sum in double of row[t - kernel/2 .. t + kernel/2]
     *   clipped to 0 .. n-1; mass, psum = sums in double of row[0 .. n) and of pooled;
     *   dmax[g, t] = max(dmax[g, t], (float)(pooled[t] * (psum > 0 ? mass / psum : 0))).
     * With CKV_EVICT_ZERO_FIRST, ave and dmax (n_kv rows) and *bias are set to 0 first. */
    ckv_status (*evict_defensive_rows)(ckv_backend *be, const ckv_evict_defensive_params *d);
    /* Softmax of one row, accumulated: x <- exp(x - max x) in fp32 (x may be rewritten), sum in double,
     * inv = (float)(1 / sum); dst[t] += x[t] * inv in fp32.   x, dst [n], n >= 1 */
    void (*evict_softmax_add)(ckv_backend *be, float *dst, float *x, int n);
    /* KeyDiff (kvpress KeyDiffPress): per segment g, the anchor a = mean over rows t < n_rows of
     * k_t * (1 / max(||k_t||_2, 1e-12)), then out[g * ld + t] = (float)(-(k_t . a) / (max(||k_t||, 1e-8) *
     * max(||a||, 1e-8))), everything in double from the keys read in the batch's dtype; ||k_t||^2 and
     * k_t . a are lane sums.
     * out [n_kv_heads, ld]; errors when head_dim > 1024. Family CKV_BACKEND_CAP_KEYDIFF. */
    ckv_status (*evict_keydiff)(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows);
    /* LagKV (kvpress LagKVPress) on n_rows rows, per segment g, lag = lag_size. When n_rows < n_sink +
     * 2 lag: out[t] = (t - n_sink) / (n_rows - n_sink) for t >= n_sink. Else the P = (n_rows - n_sink) / lag
     * partitions from row n_sink: for partition p < P - 1 and x = keys (then values), with lo[a], hi[a]
     * the min and max of channel a over partition p + 1, s_t = the unbiased standard deviation over a
     * of (x_t[a] - lo[a]) / (hi[a] - lo[a]) (fp32 differences and quotient, the rest in double; its
     * mean and its squared deviations from the mean lane sums), then
     * the softmax of s over the partition's rows; r_t = (r_keys + r_values) / 2; out[t] = r_t when
     * score CROSS, else (RANK) (the number of rows u of the partition with r_u < r_t, or r_u == r_t and
     * u < t) / lag.
     * Sinks and the rows after partition P - 2 get 1 (kvpress's "always keep" score; every other
     * score is below 1).
     * out [n_kv_heads, ld]; errors when head_dim > 1024. Family CKV_BACKEND_CAP_LAGKV. */
    ckv_status (*evict_lagkv)(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows, int n_sink,
                              int lag, ckv_evict_lagkv_score score);
    /* CUR (kvpress CURPress, deterministic leverage): per segment g and row t < n_rows, k2_t = ||k_t||^2 and
     * v2_t = ||v_t||^2; when window > 0 each is divided by its sum over the window of `window` rows
     * holding t (windows start at row 0; the last may be short); s_t = k2_t (KEYS), v2_t (VALUES),
     * (k2_t + v2_t) / 2 (MEAN) or k2_t * v2_t (PRODUCT); out[t] = (float)(s_t / sum over all rows of s),
     * everything in double from the rows read in the batch's dtype (k2_t, v2_t: lane sums, then
     * sqrt and squared); rows t < n_sink get 1 (kvpress's
     * sink score; every other score is at most 1). out [n_kv_heads, ld]. Family CKV_BACKEND_CAP_CUR. */
    ckv_status (*evict_cur)(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows, int n_sink,
                            ckv_evict_cur_kind kind, int window);
    /* Approximate leverage (kvpress LeverageScorePress's compute_leverage_scores) of rows row0 ..
     * row0 + n - 1 of every segment g, on pre-RoPE keys: each cached key is rotated back, x1 =
     * (y1 c + y2 s) / (c^2 + s^2), x2 = (y2 c - y1 s) / (c^2 + s^2) for pair (i, i + d/2), with c =
     * cosf(a) * rope_scale, s = sinf(a) * rope_scale, a = (float)pos[row] * inv_freq[i] with pos segment
     * g's own positions (its heads may hold different rows after a compression; the rope op's rotation,
     * inverted), and stored as fp32. Then in double: the rows centred on their mean, x_t =
     * their product with the sketch phi[g] [d, k] (fp32), G = sum_t x_t x_t^T, C = the Cholesky factor
     * of G + j I with j = 1e-2, else 1e-1, 1, 10, 100 (the first that factors; all fail: an error),
     * out[g * ld + t] = (float)max(0, ||C^-1 x_t||^2) (= x_t^T (G + j I)^-1 x_t), and stats[g] =
     * {sum_t out, sum_t out^2} over the fp32 scores, t ascending.
     * out [n_kv_heads, ld], inv_freq [d / 2], phi [n_kv_heads, d, k],
     * stats [n_kv_heads, 2] double; errors when head_dim > 1024 or k > 256. Family CKV_BACKEND_CAP_LEVERAGE. */
    ckv_status (*evict_leverage)(ckv_backend *be, float *out, int ld, double *stats, const ckv_kv_batch *kv, int row0,
                                 int n, const float *inv_freq, float rope_scale, const float *phi,
                                 int k);
    /* x[r * ld + t] = (x[r * ld + t] - sub) / div in fp32, t < n.   x [rows, ld] */
    void (*evict_affine)(ckv_backend *be, float *x, int rows, int n, int ld, float sub, float div);
    /* Sizes the eviction ops' scratch for layers of `shape`, so that the ops of such a layer neither
     * allocate nor wait for the device (evict/select.c calls it as each layer's scoring starts: only
     * the first layer of the largest context allocates). Ops called with larger shapes still grow
     * their scratch. Family CKV_BACKEND_CAP_EVICT_RESERVE: absent on backends whose ops keep no scratch
     * between calls (cpu). */
    ckv_status (*evict_reserve)(ckv_backend *be, const ckv_evict_shape *shape);
    /* Non-causal attention column sums of one chunk (kvpress NonCausalAttnPress, inside Compactor): the
     * a->n_q queries (ckv_evict_attn_params, logits MUL) of rows q_row0 .. q_row0 + n_q - 1 attend to
     * the keys of the same rows of their segment with logits (q . k) * scale (fp32 dot products) and
     * to n_pad padding keys with logit -1e-9 (kvpress pads the last chunk with zero rows and fills
     * their logits with -1e-9, not -inf); p = softmax over the n_q + n_pad logits as in
     * evict_attn_colsum; the n_pad padding queries (logit 0 on every real key, -1e-9 on the padding)
     * are counted too. colsum[o, q_row0 + t] += (double)p_t, t < n_q, o = (head0 + j) / group:
     * heads j ascending, then the real queries ascending, then the padding queries. With
     * CKV_EVICT_ZERO_FIRST colsum [kv->n_kv_heads, n_cols] is first set to 0. Errors on logits DIV.
     * Family CKV_BACKEND_CAP_CHUNK_COLSUM. */
    ckv_status (*evict_chunk_colsum)(ckv_backend *be, double *colsum, int n_cols, const ckv_evict_attn_params *a,
                                     int n_pad, ckv_evict_accum accum);
    /* stats[r] = {sum_t x[r * ld + t], sum_t x[r * ld + t]^2} in double over t < n ascending.
     * x [rows, ld], stats [rows, 2]. Family CKV_BACKEND_CAP_CHUNK_COLSUM. */
    void (*evict_row_stats)(ckv_backend *be, double *stats, const float *x, int rows, int n, int ld);
    /* KVzip's scores of one replayed chunk (kvpress KVzipPress.score_kvzip; ckv_evict_kvzip_params z),
     * as running maxima: for local query head j, o = (head0 + j) / group, and replayed query i, the
     * logits over its n = sink + C + i + 1 columns (C = end - start; the sink rows, the chunk's rows,
     * the replayed rows ctx .. ctx + i, in that order) are (q . k) / scale, q . k in fp32; p = the
     * softmax of the row in fp32 (the max subtracted, ckv's fast exp, the sum in double over four
     * partial sums of columns t mod 4 (the tail in the first), p = (float)((double)e * (1 / sum)));
     * with KVzip+ p_c = p_c * hinv[i] * vn[j * ld_vn + c] in fp32 (in that order); then
     * out[o * ld + start + c] = max(out[o * ld + start + c], p_c) for c < C, NaN ignored. The CPU
     * computes q . k in 16 fp32 lanes (lane u takes dims u, u + 16, ...) added pairwise; a device
     * backend forms logits and exponentials its own way (fp32-class: CUDA's tensor-core tiles, docs/gpu.md
     * §5d); maxima do not depend on their order, so the result does not depend on scheduling.
     * out [kv->n_kv_heads, ld]. Errors on inconsistent rows (a row range outside the segments) or
     * KVzip+ with only one of hinv, vn; a device backend refuses shapes its kernels do not cover
     * (CUDA: head dims 16, 32, 64, 80, 96, 128). Family CKV_BACKEND_CAP_KVZIP. */
    ckv_status (*evict_kvzip)(ckv_backend *be, float *out, int ld, const ckv_evict_kvzip_params *z);
    /* KVzip+'s norms (kvpress KVzipPress._compute_value_output_norm; ckv_evict_kvzip_norms_params n):
     * hinv[i] = (float)(1 / (float)sqrt(sum_c x[i, c]^2)), the sum in double over c ascending; for
     * local query head j, o = (head0 + j) / group, its o_proj block W_j = wot rows j d .. j d + d - 1
     * and its Gram matrix G_j[a, b] = sum_c W_j[a, c] W_j[b, c] in double (c ascending), and for chunk
     * row r = start + c with values v (fp32 from the cache's dtype) of segment o:
     * vn[j * ld_vn + c] = (float)sqrt(max(0, sum_a v_a (sum_b G_j[a, b] v_b))), the sums in double
     * over a and b ascending (the L2 norm of W_O^j v). A device backend sums in double in its own
     * order. Errors on rows outside the segments or the context; a device backend refuses head dims
     * over 256. Scratch (the Gram blocks): the eviction workspace on a device backend (evict_reserve
     * counts n_heads_local head_dim^2 doubles). Family CKV_BACKEND_CAP_KVZIP. */
    ckv_status (*evict_kvzip_norms)(ckv_backend *be, const ckv_evict_kvzip_norms_params *n);
    /* ChunkKV's selection (kvpress ChunkKVPress) from a layer's scores s [H, ld] (every KV head of the
     * layer): chunk c holds rows [c C, min((c + 1) C, n)); its score is the sum over its rows t
     * ascending, in double, of (float)(s[0, t] + s[1, t] + ... + s[H - 1, t]) (fp32, heads ascending),
     * divided by its row count; the `keep` best chunks (top-k order above) are kept. rows[r * ld_rows
     * + i] = their rows ascending, i < *n_kept, for every r < n_rows; *n_kept (device) their count.
     * Errors unless 1 <= C <= n and 1 <= keep <= the chunk count. Family CKV_BACKEND_CAP_CHUNK_RANK. */
    ckv_status (*evict_chunk_rank)(ckv_backend *be, int32_t *rows, int ld_rows, int n_rows, int32_t *n_kept,
                                   const float *s, int ld, int H, int n, int C, int keep);

    /* ---- sampling on the device (CPU reference: cpu/cpu_sample.c) ----
     * out[r] = the next token of logits row r, chosen as engine/sampler.c chooses it:
     * temperature 0: argmax (lowest index on ties); else p = softmax(logits / temperature) (fp32
     * exp, the sum and the masses as integers: ckv_sample_exp_shift above), candidates in the order descending p, then ascending index; the first
     * top_k of them (0 = all); then the shortest prefix whose mass reaches top_p of theirs (1 = off);
     * then the first candidate at which the running mass of that prefix exceeds u[r] * its mass
     * (the last one if rounding never gets there).
     * A row holding a non-finite value (NaN, +-Inf) samples nothing: out[r] = CKV_SAMPLE_NONFINITE,
     * so a caller learns it from the ids it downloads anyway, without a check of its own.
     * out [n] (device), logits [n, vocab], u [n] uniform draws in [0, 1) (device; from the caller's
     * seeded generator, so every backend and rank picks the same tokens) */
    void (*sample)(ckv_backend *be, int32_t *out, const float *logits, int n, int vocab, float temperature, int top_k,
                   float top_p, const double *u);

    /* ---- recorded steps (family CKV_BACKEND_CAP_GRAPHS: the CUDA backend's CUDA graphs) ----
     * A caller that queues the same device work step after step (the same ops, arguments and
     * buffers; what changes between steps lives in device buffers it uploads before the step)
     * brackets the work with graph_begin and graph_end, under key [key_bytes]: bytes naming
     * everything the work's host arguments depend on (sizes, bounds, settings), kept by owner (the
     * caller's object, which releases them with graph_release before it frees its buffers; the
     * backend's free releases the rest).
     * graph_begin sets *replayed = 1 when it queued the work recorded earlier under (owner, key): the
     * caller then queues none of the step's device work, only its host bookkeeping, and does not call
     * graph_end. Else *replayed = 0: the caller queues the work and then calls graph_end with the
     * status of queueing it; graph_end returns that status, or its own failure. Between the two the
     * work may be recorded instead of run (graph_end then queues it), so it must not upload from
     * host memory, wait for the device or allocate (a void op's failure inside a recording is
     * graph_end's error). A key's first step runs unrecorded, its second is recorded, later ones
     * replay (docs/gpu.md §7). With recording off (CUDA: CKV_CUDA_GRAPHS=0, CKV_CUDA_SYNC=1) every
     * step runs unrecorded. */
    ckv_status (*graph_begin)(ckv_backend *be, const void *owner, const void *key, size_t key_bytes, int *replayed);
    ckv_status (*graph_end)(ckv_backend *be, ckv_status step);
    void (*graph_release)(ckv_backend *be, const void *owner);
} ckv_backend_ops;

struct ckv_backend {
    const ckv_backend_ops *ops;
    void *ctx;          /* the backend's own state */
    const char *name;   /* "cpu", "cuda" */
    ckv_device device;
    int n_threads;      /* host threads the backend uses */
    ckv_dtype weight_dtype; /* the float type weights are converted to when not computed as stored */
    ckv_dtype kv_dtype;     /* the KV cache's default dtype on this backend */
};

/* What a backend is created with. */
typedef struct {
    const char *name;   /* "cpu" (default when NULL) or "cuda" */
    int n_threads;      /* <= 0: all available cores */
    int device;         /* GPU index; < 0: device 0 (callers under MPI pass their node-local rank) */
} ckv_backend_params;

/* Creates the backend called `name` ("cpu" or "cuda"). n_threads <= 0 means all available cores. */
ckv_status ckv_backend_init(ckv_backend **out, const char *name, int n_threads);
ckv_status ckv_backend_init_params(ckv_backend **out, const ckv_backend_params *p);
void ckv_backend_free(ckv_backend *be); /* NULL is fine */

/* out [n, m] = x [n, k] @ w^T (+ bias) for an fp32 matrix w [m, k] held in a plain device buffer
 * (keys, statistics, staged blocks): the matmul op over an F32 view of it. */
static inline void ckv_backend_matmul_f32(ckv_backend *be, float *out, const float *x, const float *w,
                                          const float *bias, int n, int k, int m) {
    ckv_weight wt = {(void *)w, CKV_DTYPE_F32, m, k, (size_t)k * sizeof(float)};
    be->ops->matmul(be, out, x, &wt, bias, n);
}

/* 1 when be offers the op family `cap`, else 0 (also for NULL be or a cap out of range). */
int ckv_backend_supports(const ckv_backend *be, ckv_backend_cap cap);
/* The family's name as errors print it ("keydiff", "evict_reserve", ...); "?" out of range. */
const char *ckv_backend_cap_name(ckv_backend_cap cap);
/* Checks be's table: every op every backend has is set, and the ops of each optional family are set
 * exactly when `caps` declares it. The error names the backend and the op. Backend init runs it. */
ckv_status ckv_backend_check_ops(const ckv_backend *be);

/* be's compute queue (the stream op), or NULL when it has none. */
static inline void *ckv_backend_stream(ckv_backend *be) {
    return ckv_backend_supports(be, CKV_BACKEND_CAP_STREAM) ? be->ops->stream(be) : NULL;
}

/* Backend-specific constructors (backend.c dispatches to these). */
ckv_status ckv_backend_cpu_init(ckv_backend **out, int n_threads);
/* The CUDA backend lives in the GPU module (core/gpu_module.h), loaded on first use: available is 1
 * when it loads here (a GPU may still be missing: init says so); init's errors name what is missing
 * (no CUDA in this build, the module, a GPU). */
int ckv_backend_cuda_available(void);
ckv_status ckv_backend_cuda_init(ckv_backend **out, int device_index);

#endif
