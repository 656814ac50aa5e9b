/* scorer.h - per-token importance scores of one layer, one score per (local KV head, context
 * token), exactly as docs/spec-eviction.md defines each scorer. A scorer sees the layer's attention
 * input, its KV segments, its weights and the rope tables, all in the backend's device memory; it
 * drives the backend's eviction ops (backend.h) for the arithmetic and uses the communicators it is
 * given for what crosses ranks (replica groups when tp > Hkv, TOVA's mean over all heads). Only
 * counts and scalars come back to the host, except where a scorer's comment says it stages more
 * (expected_attention, defensivekv). Protected tokens (window, sinks) are reported, not scored: the
 * caller gives them the layer-wide max + 1 after the cross-head reduction. It does not choose what
 * to keep. */
#ifndef CKV_EVICT_SCORER_H
#define CKV_EVICT_SCORER_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/status.h"
#include "evict/press.h"

/* Device scratch that outlives one scorer call: the layers of a context (or the compressions of a
 * decode press) carve their scorers' buffers out of it as a stack, so once it has grown to the
 * largest need no layer allocates device memory (a call that does not fit allocates its own buffers
 * and the arena grows to that need when the call ends). Zeroed = empty; ckv_score_arena_free. */
typedef struct {
    ckv_backend *be;
    char *base;             /* [cap] bytes (device) */
    size_t cap, top;        /* top: bytes in use by live ckv_score_dev objects */
    size_t need;            /* the most that was in use at once (it grows to this) */
} ckv_score_arena;
void ckv_score_arena_free(ckv_score_arena *a); /* accepts zeroed objects */

typedef struct {
    int layer, n_layers;
    int L;                  /* context tokens scored; they sit at rows 0..L-1 of every local head */
    int D, head_dim;
    int n_heads, n_kv_heads;        /* whole model */
    int n_q_local, n_kv_local;      /* this rank */
    int q_head0, kv_head0;          /* global index of the first local head */
    int kv_replicas;                /* ranks holding the same KV heads (the shard plan's; 0 or 1: one) */
    const float *xn;        /* [L, D] attention input (post input-RMSNorm) of the context tokens (device) */
    ckv_kv_batch kv;        /* the layer's segments (one sequence, n_kv_local heads): rows 0 .. L-1 of each
                             * are the context, post-RoPE keys and values in the batch dtype (device) */
    const int32_t *pos;     /* [L] positions of the context tokens (device) */
    const ckv_weight *wq;   /* [n_q_local * d, D] q_proj rows of the local heads */
    const float *bq;        /* [n_q_local * d] or NULL (device) */
    const ckv_weight *wo;   /* [D, n_q_local * d] o_proj columns of the local heads */
    const float *inv_freq;  /* [d / 2] (device) */
    float rope_scale;
    ckv_backend *be;        /* every op runs here */
    ckv_comm *replica;      /* ranks holding the same KV heads (size 1 unless tp > Hkv); NULL = none */
    ckv_comm *tp;           /* the whole tensor-parallel group; NULL = one rank */
    ckv_score_arena *arena; /* the scorers' device scratch (NULL: allocated per call) */
    const float *given;     /* [n_kv_local, L] scores computed before the layer's hook (kvzip's replay), or NULL (device) */
    const float *q_tail;    /* [q_tail_rows, n_q_local * head_dim] the roped queries the forward computed for context
                             * rows L - q_tail_rows .. L - 1, or NULL: a window scorer whose window fits reads
                             * them, any other recomputes its queries from xn (device) */
    int q_tail_rows;
} ckv_score_inputs;

typedef struct {
    int protect_head;       /* tokens 0 .. protect_head - 1 get the protected score */
    int protect_tail;       /* tokens L - protect_tail .. L - 1 get the protected score */
} ckv_score_info;

/* Writes scores [n_kv_local, L] (device, higher = keep) for cfg->scorer. The KV-head scores are means over
 * the group's query heads (replica partial sums already reduced). Entries of protected tokens are
 * left as computed (any finite value) and reported in *info. Errors: L <= window for windowed
 * scorers ("window 64 needs a context longer than 64 tokens, got 50"). */
ckv_status ckv_score_layer(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores,
                           ckv_score_info *info);

/* CriticalKV's value norm: N[h, t] = mean over the local query heads h' of KV head h of
 * || V[h, t] W_O^{h'} ||_1 where W_O^{h'} is the d x D block of o_proj for head h' (the columns of
 * wo that head's output passes through). Blockwise: never materialises [L, D]. Replica partial
 * sums reduced over in->replica. out [n_kv_local, L] (device). */
ckv_status ckv_critical_value_norm(const ckv_score_inputs *in, float *out);

/* PyramidKV's kept count for `layer` (kvpress PyramidKVPress formula, Python banker's rounding,
 * falling back to round(L * (1 - cr)) when the schedule is infeasible); ckv_press_layer_kept's rule
 * for pyramidkv. */
int ckv_pyramidkv_n_kept(int layer, int n_layers, int L, double compression_ratio, int window, double beta);

/* ---- internal to src/evict: the scorer families behind ckv_score_layer and their shared helpers.
 * Same contract as ckv_score_layer (scores [n_kv_local, L], protected entries left finite); each
 * validates its own options. Not for use outside src/evict. ---- */

/* Checks the shared inputs (shapes, head mapping, segments); `who` names the scorer. */
ckv_status ckv_score_check_inputs(const ckv_score_inputs *in, const char *who);
/* Local KV index (0 .. n_kv_local - 1) of local query head j; -1 when outside this rank's KV heads. */
int ckv_score_local_kv(const ckv_score_inputs *in, int j);
/* The ops' head mapping: local query head j reads local KV head (ckv_score_head0(in) + j) / group. */
int ckv_score_head0(const ckv_score_inputs *in);
/* The attention ops' parameters for this layer's local heads and segments: queries q
 * [n_q, n_q_local, head_dim] (device) at context rows q_row0 .., logits (q . k) * or / scale. */
ckv_evict_attn_params ckv_score_attn_params(const ckv_score_inputs *in, const float *q, int n_q, int q_row0,
                                            float scale, ckv_evict_logits logits);
/* q [w, n_q_local * head_dim] (device): the roped queries of the last w context rows, in->q_tail's last
 * w rows when it holds that many (nothing computed; the result points into it), else computed into
 * `scratch` [w, n_q_local * head_dim] from xn (q_proj + bias, RoPE at their positions), as the forward does. */
const float *ckv_score_window_queries(const ckv_score_inputs *in, int w, float *scratch);
/* The first global KV head of rank `rank` of the group, from the shard layout the inputs carry (every
 * rank holds n_kv_local heads; kv_replicas consecutive ranks hold the same ones). */
int ckv_score_rank_kv_head0(const ckv_score_inputs *in, int rank);
/* scores [n_kv_local, L] (device) hold this rank's sums over its query heads: all-reduce them over
 * in->replica (when size > 1) and divide by the group size n_heads / n_kv_heads. */
ckv_status ckv_score_group_mean(const ckv_score_inputs *in, float *scores);
/* Device scratch of a scorer call: ckv_score_dev_alloc takes buffers from the inputs' arena (or, when
 * there is none or it is full, allocates up to CKV_SCORE_DEV_MAX of them); ckv_score_dev_free gives
 * them all back together (LIFO with the other live ones of the same arena). */
#define CKV_SCORE_DEV_MAX 12
typedef struct {
    ckv_backend *be;
    void *p[CKV_SCORE_DEV_MAX]; /* the buffers allocated outside the arena */
    int n;
    ckv_score_arena *arena;
    size_t mark, used;          /* the arena's top when this began; bytes taken since (in it or not) */
} ckv_score_dev;
ckv_score_dev ckv_score_dev_begin(const ckv_score_inputs *in);
ckv_status ckv_score_dev_alloc(ckv_score_dev *d, void **out, size_t bytes, const char *what);
void ckv_score_dev_free(ckv_score_dev *d);

/* The one place where eviction data crosses ranks. `buf` is device memory when on_device, else host
 * memory; c is a device communicator (engine/comm_backend.h: the engine hands every press its
 * group's), which moves device buffers itself (directly, NCCL, or staged through host memory); host
 * buffers take its host collectives. Nothing happens for a NULL or one-rank comm. */
ckv_status ckv_evict_allreduce(ckv_backend *be, ckv_comm *c, float *buf, size_t n, ckv_comm_op op, int on_device);
/* recv [size * bytes] gets every rank's send [bytes], in rank order; both device memory. */
ckv_status ckv_evict_allgather(ckv_backend *be, ckv_comm *c, const void *send, void *recv, size_t bytes);
/* A host view of a device buffer for the scorers that keep host bookkeeping: *host = dev on a host
 * backend, else a downloaded copy (ckv_evict_host_release frees it; with write_back it first uploads
 * the host copy into dev). */
ckv_status ckv_evict_host_view(ckv_backend *be, const void *dev, size_t bytes, void **host);
ckv_status ckv_evict_host_release(ckv_backend *be, void *dev, void *host, size_t bytes, int write_back);

/* The scorer families (registered in press_table.c), one signature: scores [n_kv_local, L] (device).
 * snapkv / pyramidkv: window queries, pooled (kernel 1 = none); errors when L <= window. */
ckv_status ckv_score_snapkv(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* finch: snapkv's window means with the question (cfg->question_rows) as the window, no pooling, each
 * query row first multiplied by its count of earlier rows (normalize_scores); errors without a question. */
ckv_status ckv_score_finch(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* tova: the last token's attention averaged over all query heads of the layer (in->tp). */
ckv_status ckv_score_tova(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* knorm: -||k||_2. */
ckv_status ckv_score_knorm(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* streaming_llm: score = position index (later tokens rank higher); the caller protects n_sink. */
ckv_status ckv_score_streaming_llm(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* random: uniform [0, 1) from (seed, layer, global KV head, token), independent of tp. */
ckv_status ckv_score_random(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* observed_attention: causal attention column sums over all L queries / (L - j), blockwise. */
ckv_status ckv_score_observed_attention(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* expected_attention: kvpress ExpectedAttentionPress; entries 0 .. n_sink - 1 are left 0. */
ckv_status ckv_score_expected_attention(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* keydiff: -cos(k, mean normalised key of the head) (kvpress KeyDiffPress); needs evict_keydiff. */
ckv_status ckv_score_keydiff(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* lagkv: kvpress LagKVPress's lag-relative scores; needs evict_lagkv. */
ckv_status ckv_score_lagkv(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* cur: kvpress CURPress's deterministic leverage of keys and values; needs evict_cur. */
ckv_status ckv_score_cur(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* leverage: kvpress LeverageScorePress (z-scored leverage of the pre-RoPE keys); needs evict_leverage. */
ckv_status ckv_score_leverage(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* The z-scored leverage of rows row0 .. row0 + n - 1 of every local head into out [n_kv_local, ld]
 * (statistics over those rows of every KV head of the model, across in->tp). */
ckv_status ckv_score_leverage_rows(const ckv_score_inputs *in, int k, uint64_t seed, int row0, int n, float *out,
                                   int ld);
/* compactor: kvpress CompactorPress (leverage blended with chunked non-causal attention; its sinks
 * score the layer's maximum); needs evict_chunk_colsum, evict_row_stats and the leverage ops. */
ckv_status ckv_score_compactor(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);
/* z-scores x [n_kv_local, ld] (columns 0 .. n - 1) over every KV head of the model: stats_dev
 * [n_kv_local, 2] (device) holds each local head's sum and sum of squares; they are all-gathered over
 * in->tp and added in global head order, each head once (the same bits on every rank count); then
 * x = (x - mean) / max(std, 1e-6), the std unbiased (torch.std). */
ckv_status ckv_score_zscore(const ckv_score_inputs *in, float *x, int ld, int n, const double *stats_dev);
/* The sketch of (layer, global KV head): phi [d, k] = N(0, 1) / sqrt(k) from splitmix64 counters and
 * Box-Muller (docs/spec-eviction.md gives the formula; tools/oracle replays it in kvpress). */
void ckv_leverage_sketch(float *phi, int d, int k, uint64_t seed, int layer, int head);

#endif
