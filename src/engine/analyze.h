/* analyze.h - the output-perturbation analysis of two presses (docs/presses.md, "Perturbation
 * analysis"; CriticalKV paper Definition 3.1, Theorem 3.3 / Eq. 5): for one prompt, at every layer,
 * both presses select on the same full-cache inputs; then, for the query of the last fed token, every
 * query head's attention output o over the full cache is compared with o^ over each press's kept
 * rows (plus the question rows, never evicted): ||o - o^||_1, the bound theta and the
 * attention-weight-only bound. It runs as the layer hook of one full-cache prefill of context +
 * question and never compacts the cache. Under tensor parallelism each rank measures its own query
 * heads and every rank receives all records (one all-gather per layer). It does not print, choose
 * presses or budgets, or generate tokens. It runs on any backend: the presses select through the
 * backend's eviction ops on the cache segments (any KV dtype); the analysed token's queries are
 * computed on the device; the measurement runs in double on fp32 host copies of the queries, the
 * rows and o_proj (any weight dtype), downloaded through the backend where its memory is not the
 * host's, with host matmuls on a private CPU backend then. On a host-memory backend it reads the
 * model's buffers in place (F32 o_proj directly, no copy). */
#ifndef CKV_ENGINE_ANALYZE_H
#define CKV_ENGINE_ANALYZE_H

#include <stdint.h>
#include <stdio.h>

#include "backend/backend.h"
#include "engine/analyze_stats.h"
#include "engine/session.h"
#include "evict/press.h"
#include "evict/select.h"

#define CKV_ANALYZE_PRESSES 2  /* press A, press B */
#define CKV_ANALYZE_BLOCK 256  /* rows projected through W_O^h per matmul */

/* One query head's measurements. Index p: press A (0) or B (1). */
typedef struct {
    int32_t layer, head, kv_head;  /* global query head and its KV head */
    int32_t n_rows;                /* rows the query attends: context + question */
    int32_t n_kept[CKV_ANALYZE_PRESSES];  /* context rows kept by each press */
    double kept_mass[CKV_ANALYZE_PRESSES];    /* s = sum of full-cache attention over kept rows */
    double perturbation[CKV_ANALYZE_PRESSES]; /* ||o - o^||_1 */
    double theta[CKV_ANALYZE_PRESSES];        /* paper Eq. 5 bound for this press's kept set */
    double attn_bound[CKV_ANALYZE_PRESSES];   /* 2 (1 - s) max_i ||V_i W_O^h||_1 */
    double out_l1;                 /* ||o||_1 */
    double max_norm;               /* max_i ||V_i W_O^h||_1 */
    ckv_conc_stats conc;           /* attention concentration over the context rows (press A's scores) */
} ckv_analyze_head;

/* Scratch for the per-head computation, sized once for up to n_max rows. */
typedef struct {
    int n_max, d, D;
    double *e;      // [n_max] exp(z - max z)
    float *wh;      // [D, d] W_O^h transposed into the matmul's (out, in) layout
    float *proj;    // [CKV_ANALYZE_BLOCK, D] projected values of one block of rows
    double *delta;  // [CKV_ANALYZE_PRESSES, D] o - o^ of each press
    double *out;    // [D] o
    double *norm;   // [n_max] ||V_i W_O^h||_1 of every row
    ckv_conc_ws conc;
} ckv_analyze_ws;

ckv_status ckv_analyze_ws_init(ckv_analyze_ws *ws, int n_max, int d, int D);
void ckv_analyze_ws_free(ckv_analyze_ws *ws); /* accepts partial objects */

/* The inputs of one query head (host memory). */
typedef struct {
    int n_rows;             /* rows attended: 0 .. n_ctx-1 evictable context rows, then question rows */
    int n_ctx;              /* 0 <= n_ctx <= n_rows */
    int d, D;
    const float *q;         /* [d] post-RoPE query */
    const float *k, *v;     /* [n_rows, d] post-RoPE keys and values, in position order */
    const float *wo;        /* W_O^h: element (n, c), n < D, c < d, at wo[n * wo_stride + c] */
    int wo_stride;
    float scale;            /* logit scale (the model's 1 / sqrt(d)) */
    const uint8_t *keep[CKV_ANALYZE_PRESSES]; /* [n_ctx] 1 = row kept by the press */
    const float *score;     /* [n_ctx] press A's scores as its selection ranked them, or NULL (no recall / Spearman) */
} ckv_analyze_head_in;

/* Measures one head: fills every field of *out except layer, head and kv_head (conc: NaN throughout
 * when n_ctx is 0). The projections
 * V_i W_O^h go through be->ops->matmul (host memory) in blocks; sums are in double. */
ckv_status ckv_analyze_head_compute(const ckv_analyze_head_in *in, ckv_backend *be, ckv_analyze_ws *ws,
                                    ckv_analyze_head *out);

/* The analysis of one prompt: pass ckv_analyze_layer_hook with a ckv_analyzer to
 * ckv_session_prefill_hook on a fresh session made with compress = 1 and capacity >= n_ctx + n_question,
 * feeding the n_ctx context ids followed by the n_question question ids in one call. */
typedef struct {
    const ckv_press_config *press[CKV_ANALYZE_PRESSES];
    /* headkv presses: kept rows per (layer, KV head), [n_layers, n_kv_heads] global heads, set by the
     * caller after ckv_analyzer_init (evict/headkv.h computes them); NULL for other presses */
    const int32_t *head_budgets[CKV_ANALYZE_PRESSES];
    int n_ctx, n_question;
    int n_layers, n_heads;
    double budget;            /* > 0: written as "budget" in every JSON line (a sweep of budgets) */
    ckv_analyze_head *heads;  /* [n_layers * n_heads] results (every rank), filled layer by layer */
    int layers_done;
    /* statistics */
    double select_seconds, measure_seconds;
    /* scratch (one layer) */
    ckv_selection sel;        /* [n_kv_local, n_ctx] */
    int32_t *rows;            /* [n_kv_local, n_ctx] the selection's kept rows, on the host */
    float *hk, *hv;           /* [n_kv_local, n_ctx + n_question, d] fp32 host copies of the layer's keys, values */
    int32_t *hpos;            /* [n_ctx + n_question] one head's positions */
    float *hscore;            /* [n_kv_local, n_ctx] press A's scores of the layer, on the host */
    uint8_t *keep;            /* [CKV_ANALYZE_PRESSES, n_kv_local, n_ctx] */
    float *q;                 /* [n_q_local * d] the analysed token's roped queries (host; = dq on a host backend) */
    ckv_analyze_head *mine;   /* [n_q_local] this rank's records of the layer */
    ckv_analyze_head *all;    /* [tp * n_q_local] gathered records */
    ckv_analyze_ws ws;
    /* the backends: be is the model's; host_be runs the measurement's matmuls on host buffers (be
     * itself when its memory is the host's, else a private CPU backend owned here) */
    ckv_backend *be, *host_be;
    int owns_host_be;
    float *dq;                /* [n_q_local * d] device: the queries as q_proj and RoPE write them */
    int32_t *dpos;            /* [1] device: the analysed token's position */
    float *hwo;               /* [D, n_q_local * d] fp32 host copy of the layer's o_proj, or NULL when
                               * every layer's o_proj is F32 in host memory (read in place) */
    void *wo_raw;             /* [D, row_bytes] the layer's typed o_proj downloaded before conversion, or NULL
                               * (host memory, or F32 weights downloaded straight into hwo) */
} ckv_analyzer;

/* Sizes everything for a prompt of n_ctx context and n_question question tokens (n_question >= 1)
 * on model m; checks both presses can compress n_ctx tokens. n_threads: host threads of the private
 * CPU backend when the model's backend memory is not the host's (<= 0: all cores); unused otherwise. */
ckv_status ckv_analyzer_init(ckv_analyzer *a, const ckv_model *m, const ckv_press_config *press_a,
                             const ckv_press_config *press_b, int n_ctx, int n_question, int n_threads);
void ckv_analyzer_free(ckv_analyzer *a); /* accepts partial objects */

/* The layer hook (ctx = a ckv_analyzer). */
ckv_status ckv_analyze_layer_hook(void *ctx, ckv_session *s, int layer, int n_prompt);

/* Aggregates over all heads of a finished analysis. */
typedef struct {
    int n_heads;                 /* heads measured (n_layers * n_heads) */
    int n_b_less, n_equal;       /* heads where B perturbs strictly less than A / exactly as much */
    double mean_perturbation[CKV_ANALYZE_PRESSES];
    double mean_bound_ratio[CKV_ANALYZE_PRESSES]; /* mean of bound / perturbation over heads with perturbation > 0 */
    int n_ratio[CKV_ANALYZE_PRESSES];             /* heads in that mean (0: undefined) */
    double mean_theta_ratio;     /* mean of theta_b / theta_a over heads with theta_a > 0 */
    int n_theta_ratio;
    double max_pert_over_theta;  /* max over heads and presses of perturbation / theta (<= 1: Theorem 3.3) */
    int n_bound_violations;      /* (head, press) pairs with perturbation > theta or theta > the attention-only
                                  * bound beyond a relative 1e-9 (rounding): 0 unless something is wrong */
} ckv_analyze_summary;

/* The press's own bound: theta for a critical press, the attention-weight-only bound otherwise. */
double ckv_analyze_bound(const ckv_analyzer *a, const ckv_analyze_head *h, int p);

ckv_status ckv_analyze_summarize(const ckv_analyzer *a, ckv_analyze_summary *out);

/* Writes one JSON line per (layer, query head) to f (docs/presses.md lists the fields). */
ckv_status ckv_analyze_write_jsonl(const ckv_analyzer *a, FILE *f, const char *path);

#endif
