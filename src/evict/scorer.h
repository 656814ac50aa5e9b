/* scorer.h - per-token importance scores of one layer, one score per (local KV head, context
 * token), exactly as SPEC-eviction.md defines each scorer. A scorer sees the layer's attention
 * input, its keys and values, its weights and the rope tables; it computes this rank's part and
 * uses the communicators it is given for what crosses ranks (replica groups when tp > Hkv, TOVA's
 * mean over all heads). Protected tokens (window, sinks) are reported, not scored: the caller gives
 * them the layer-wide max + 1 after the cross-head reduction. It does not choose what to keep. */
#ifndef CKV_EVICT_SCORER_H
#define CKV_EVICT_SCORER_H

#include <stdint.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "core/status.h"
#include "evict/press.h"

/* One layer's ragged KV cache as the host scorers read it (F32 keys and values in host memory):
 * head g owns rows [off[g], off[g] + len[g]), sorted by original position. */
typedef struct {
    const float *k;     /* [rows, head_dim] post-RoPE keys */
    const float *v;     /* [rows, head_dim] values */
    const int32_t *pos; /* [rows] original token position of each row */
    const int64_t *off; /* [n_kv_heads] first row of each head */
    const int32_t *len; /* [n_kv_heads] rows in use */
    int n_kv_heads;
    int head_dim;
} ckv_attn_cache;

typedef struct {
    int layer, n_layers;
    int L;                  /* context tokens scored; they sit at rows 0..L-1 of every local head */
    int D, head_dim;
    int n_heads, n_kv_heads;        /* whole model */
    int n_q_local, n_kv_local;      /* this rank */
    int q_head0, kv_head0;          /* global index of the first local head */
    const float *xn;        /* [L, D] attention input (post input-RMSNorm) of the context tokens */
    ckv_attn_cache cache;   /* keys (post-RoPE) and values: head h rows off[h] .. off[h] + L - 1 */
    const int32_t *pos;     /* [L] positions of the context tokens */
    const ckv_weight *wq;   /* [n_q_local * d, D] q_proj rows of the local heads */
    const float *bq;        /* [n_q_local * d] or NULL */
    const ckv_weight *wo;   /* [D, n_q_local * d] o_proj columns of the local heads */
    const float *inv_freq;  /* [d / 2] */
    float rope_scale;
    ckv_backend *be;        /* for matmuls (host memory on the CPU backend) */
    ckv_comm *replica;      /* ranks holding the same KV heads (size 1 unless tp > Hkv); NULL = none */
    ckv_comm *tp;           /* the whole tensor-parallel group; NULL = one rank */
} ckv_score_inputs;

typedef struct {
    int protect_head;       /* tokens 0 .. protect_head - 1 get the protected score */
    int protect_tail;       /* tokens L - protect_tail .. L - 1 get the protected score */
} ckv_score_info;

/* Writes scores [n_kv_local, L] (higher = keep) for cfg->scorer. The KV-head scores are means over
 * the group's query heads (replica partial sums already reduced). Entries of protected tokens are
 * left as computed (any finite value) and reported in *info. Errors: L <= window for windowed
 * scorers ("--window 64 needs a context longer than 64 tokens, got 50"). */
ckv_status ckv_score_layer(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores,
                           ckv_score_info *info);

/* CriticalKV's value norm: N[h, t] = mean over the local query heads h' of KV head h of
 * || V[h, t] W_O^{h'} ||_1 where W_O^{h'} is the d x D block of o_proj for head h' (the columns of
 * wo that head's output passes through). Blockwise: never materialises [L, D]. Replica partial
 * sums reduced over in->replica. out [n_kv_local, L]. */
ckv_status ckv_critical_value_norm(const ckv_score_inputs *in, float *out);

/* PyramidKV's kept count for `layer` (kvpress PyramidKVPress formula, Python banker's rounding,
 * falling back to round(L * (1 - cr)) when the schedule is infeasible). */
int ckv_pyramidkv_n_kept(int layer, int n_layers, int L, double compression_ratio, int window, double beta);

/* ---- internal to src/evict: the scorer families behind ckv_score_layer and their shared helpers.
 * Same contract as ckv_score_layer (scores [n_kv_local, L], protected entries left finite); each
 * validates its own options. Not for use outside src/evict. ---- */

/* Checks the shared inputs (shapes, head mapping, host buffers, cache rows); `who` names the scorer. */
ckv_status ckv_score_check_inputs(const ckv_score_inputs *in, const char *who);
/* Local KV index (0 .. n_kv_local - 1) of local query head j; -1 when outside this rank's KV heads. */
int ckv_score_local_kv(const ckv_score_inputs *in, int j);
/* scores [n_kv_local, L] hold this rank's sums over its query heads: all-reduce them over
 * in->replica (when size > 1) and divide by the group size n_heads / n_kv_heads. */
ckv_status ckv_score_group_mean(const ckv_score_inputs *in, float *scores);
/* x[0..n) <- exp(x - max x) in fp32 (n >= 1); returns 1 / sum (the sum accumulated in double), the
 * factor that turns the row into softmax weights. */
float ckv_score_exp_row(float *x, int n);
/* sum of |x[i]| over n floats (fp32 lanes, combined in double). */
double ckv_score_l1(const float *x, int n);

/* snapkv / pyramidkv: window queries, pooled (kernel 1 = none); errors when L <= window. */
ckv_status ckv_score_snapkv(const ckv_score_inputs *in, int window, int kernel, ckv_pool_kind pool, float *scores);
/* tova: the last token's attention averaged over all query heads of the layer (in->tp). */
ckv_status ckv_score_tova(const ckv_score_inputs *in, float *scores);
/* knorm: -||k||_2. */
ckv_status ckv_score_knorm(const ckv_score_inputs *in, float *scores);
/* streaming_llm: score = position index (later tokens rank higher); the caller protects n_sink. */
ckv_status ckv_score_streaming_llm(const ckv_score_inputs *in, int n_sink, float *scores);
/* random: uniform [0, 1) from (seed, layer, global KV head, token), independent of tp. */
ckv_status ckv_score_random(const ckv_score_inputs *in, uint64_t seed, float *scores);
/* observed_attention: causal attention column sums over all L queries / (L - j), blockwise. */
ckv_status ckv_score_observed_attention(const ckv_score_inputs *in, float *scores);
/* expected_attention: kvpress ExpectedAttentionPress; entries 0 .. n_sink - 1 are left 0. */
ckv_status ckv_score_expected_attention(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores);

#endif
