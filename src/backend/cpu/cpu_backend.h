/* cpu_backend.h - private to backend/cpu: the CPU backend's state, the entry points of its kernels
 * (one file per responsibility: cpu_matmul.c, cpu_attention.c, cpu_ops.c) and the small inline math
 * helpers the kernels share. It declares no public API (that is backend.h) and is included by
 * nothing outside backend/cpu. */
#ifndef CKV_CPU_BACKEND_H
#define CKV_CPU_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "core/fastmath.h"
#include "core/threadpool.h"

/* The most rotary frequencies (head_dim / 2) kv_rerotate keeps a table of angles for. */
#define CKV_CPU_RR_HALF_MAX 256

/* The backend's ctx. */
typedef struct {
    ckv_threadpool *pool; /* our own parallel loops (OpenBLAS keeps its own threads) */
    int n_threads;
    float *attn_ws;        /* [attn_ws_floats] split-K attention partials (cpu_attention.c) */
    size_t attn_ws_floats;
    void *evict_ws;        /* [evict_ws_bytes] the eviction ops' scratch (ckv_cpu_evict_scratch) */
    size_t evict_ws_bytes;
    void *lev_angles;      /* [lev_angles_bytes] the leverage op's rotary angles and their key (cpu_evict_leverage.c) */
    size_t lev_angles_bytes;
    int lev_rows, lev_half; /* the key's rows and angles per row (0 rows: nothing kept) */
    float lev_scale;
    void *rr_tab;          /* kv_rerotate's angle table and its fill list and flags (cpu_kv.c) */
    int rr_n_off, rr_half; /* its offsets and angles per offset */
    float rr_freq[CKV_CPU_RR_HALF_MAX]; /* the frequencies it holds the angles of */
} ckv_cpu_ctx;

/* Floats of the attention workspace allocated with the backend (4 MiB). */
#define CKV_CPU_ATTN_WS_FLOATS ((size_t)1 << 20)

static inline ckv_threadpool *ckv_cpu_pool(const ckv_backend *be) { return ((const ckv_cpu_ctx *)be->ctx)->pool; }

/* Kernels: semantics exactly as the matching ckv_backend_ops entry in backend.h. */
void ckv_cpu_matmul(ckv_backend *be, float *out, const float *x, const ckv_weight *w, const float *bias, int n);
/* The fp32-weight GEMM behind ckv_cpu_matmul: out [n, m] = x [n, k] @ w [m, k]^T (+ bias [m]). */
void ckv_cpu_matmul_f32(ckv_backend *be, float *out, const float *x, const float *w, const float *bias, int n, int k,
                        int m);
/* *p <- the eviction ops' scratch of at least `bytes` (64-byte aligned, zeroed), kept by the backend
 * between calls and grown when a call needs more: one op uses it
 * at a time, from its start to its return (the backend's ops run one after another), so a layer's
 * eviction allocates only while the sizes grow, i.e. at the first layers of a context. */
ckv_status ckv_cpu_evict_scratch(ckv_backend *be, size_t bytes, void **p);
/* *buf <- a buffer of at least `bytes` (the old one freed when smaller; *cap its size, 0 after a
 * failure). */
ckv_status ckv_cpu_grow(void **buf, size_t *cap, size_t bytes, const char *what);
/* The same scratch not zeroed (what a previous op left): for an op that writes every byte it reads. */
ckv_status ckv_cpu_evict_scratch_raw(ckv_backend *be, size_t bytes, void **p);
/* ss[t] = sum over a < d of (double)x_t[a]^2, a lane sum (backend.h, cpu_lanes.h), for n rows x_t of
 * x [n, d] fp32. */
void ckv_cpu_sumsq_rows(double *ss, const float *x, int n, int d);
/* The most workers whose private workspaces an op keeps on its stack (more threads share them out). */
#define CKV_CPU_MAX_TASK_WORKERS 256
void ckv_cpu_attention(ckv_backend *be, float *out, const ckv_attention_params *a);
void ckv_cpu_embedding(ckv_backend *be, float *out, const ckv_weight *table, const int32_t *ids, int n);
void ckv_cpu_rmsnorm(ckv_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps);
void ckv_cpu_rope(ckv_backend *be, float *x, const int32_t *pos, int n, int n_heads, int hd, const float *inv_freq,
                  float attn_scale);
void ckv_cpu_kv_store(ckv_backend *be, const ckv_kv_batch *kv, const float *k, const float *v, const int32_t *pos,
                      int n);
void ckv_cpu_kv_gather(ckv_backend *be, const ckv_kv_gather_params *g);
void ckv_cpu_kv_rerotate(ckv_backend *be, const ckv_kv_batch *kv, const float *inv_freq);
void ckv_cpu_swiglu(ckv_backend *be, float *out, const float *gate, const float *up, size_t n);
void ckv_cpu_add(ckv_backend *be, float *x, const float *y, size_t n);
/* cpu_sample.c */
void ckv_cpu_sample(ckv_backend *be, int32_t *out, const float *logits, int n, int vocab, float temperature, int top_k,
                    float top_p, const double *u);
ckv_status ckv_cpu_count_nonfinite(ckv_backend *be, const float *x, size_t n, size_t *n_bad);
/* 1 when the CPU matmul/embedding compute weights stored as t (see cpu_matmul.c). */
int ckv_cpu_weight_dtype_ok(const ckv_backend *be, ckv_dtype t);

/* Eviction ops (cpu_evict_attn.c, cpu_evict_rows.c, cpu_evict_stats.c). */
ckv_status ckv_cpu_evict_attn_colsum(ckv_backend *be, double *colsum, int n_cols, const ckv_evict_attn_params *a,
                                     ckv_evict_colsum_rows rows, ckv_evict_accum accum);
ckv_status ckv_cpu_evict_attn_probs(ckv_backend *be, float *p, int ld, const ckv_evict_attn_params *a);
void ckv_cpu_evict_colsum_finish(ckv_backend *be, float *out, int ld_out, const double *colsum, int ld_in, int rows,
                                 int n, double denom, ckv_evict_denom minus_col);
void ckv_cpu_evict_pool(ckv_backend *be, float *y, const float *x, int rows, int n, int ld, int kernel,
                        ckv_evict_pool_kind max);
void ckv_cpu_evict_head_sum(ckv_backend *be, float *dst, int ld_dst, const float *src, int ld_src, int n_src, int n,
                            int head0, int group);
void ckv_cpu_evict_div(ckv_backend *be, float *x, size_t n, float div);
ckv_status ckv_cpu_evict_keydiff(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows);
ckv_status ckv_cpu_evict_lagkv(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows, int n_sink,
                               int lag, ckv_evict_lagkv_score score);
ckv_status ckv_cpu_evict_cur(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows, int n_sink,
                             ckv_evict_cur_kind kind, int window);
ckv_status ckv_cpu_evict_leverage(ckv_backend *be, float *out, int ld, double *stats, const ckv_kv_batch *kv, int row0,
                                  int n, const float *inv_freq, float rope_scale, const float *phi, int k);
void ckv_cpu_evict_affine(ckv_backend *be, float *x, int rows, int n, int ld, float sub, float div);
ckv_status ckv_cpu_evict_chunk_colsum(ckv_backend *be, double *colsum, int n_cols, const ckv_evict_attn_params *a,
                                      int n_pad, ckv_evict_accum accum);
void ckv_cpu_evict_row_stats(ckv_backend *be, double *stats, const float *x, int rows, int n, int ld);
void ckv_cpu_evict_row_norm(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows,
                            ckv_evict_kv_part values, float sign);
void ckv_cpu_evict_add_mul(ckv_backend *be, float *out, const float *s, const float *m, int rows, int n, int ld,
                           float eps);
ckv_status ckv_cpu_evict_value_norm(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows,
                                    const ckv_weight *wo, int n_heads_local, int head0, int group);
void ckv_cpu_evict_fill(ckv_backend *be, float *x, int rows, int ld, int t0, int t1, ckv_evict_fill_kind kind,
                        float value);
void ckv_cpu_evict_random(ckv_backend *be, float *x, int rows, int n, int ld, uint64_t seed, int layer, int head0);
void ckv_cpu_evict_max(ckv_backend *be, float *out, const float *x, int rows, int ld, int t0, int t1);
ckv_status ckv_cpu_evict_topk(ckv_backend *be, int32_t *idx, int ld_idx, const float *s, int ld, int rows, int n,
                              const int32_t *k);
void ckv_cpu_evict_scatter(ckv_backend *be, float *x, int ld, int rows, const int32_t *idx, int ld_idx,
                           const int32_t *k, float value);
ckv_status ckv_cpu_evict_topk_counts(ckv_backend *be, int32_t *counts, const float *s, int ld, int rows, int n,
                                     int64_t total);
void ckv_cpu_evict_softmax_add(ckv_backend *be, float *dst, float *x, int n);
ckv_status ckv_cpu_evict_moments(ckv_backend *be, double *s1, double *s2, const float *q, const float *shift, int n,
                                 int n_heads_local, int d, ckv_evict_accum zero);
ckv_status ckv_cpu_evict_defensive_rows(ckv_backend *be, const ckv_evict_defensive_params *d);
ckv_status ckv_cpu_evict_chunk_rank(ckv_backend *be, int32_t *rows, int ld_rows, int n_rows, int32_t *n_kept,
                                    const float *s, int ld, int H, int n, int C, int keep);
ckv_status ckv_cpu_evict_kvzip(ckv_backend *be, float *out, int ld, const ckv_evict_kvzip_params *z);
ckv_status ckv_cpu_evict_kvzip_norms(ckv_backend *be, const ckv_evict_kvzip_norms_params *n);
ckv_status ckv_cpu_evict_ea_logits(ckv_backend *be, float *logit, const ckv_kv_batch *kv, int g, int row0, int n,
                                   const float *mu, const float *cov, float sqrt_d);

/* The per-unit loop of the attention-free scorers (cpu_evict_keys.c): fn(ctx, g, scratch) for every
 * unit g < n (a KV head, or LagKV's KV head x partition) over the backend's pool, the units split into
 * contiguous parts, each worker with its own
 * `scratch_bytes` of scratch (allocated once per call; 0: none). fn returns 0, or an error status
 * (the first failing head's is returned, heads after it in its worker are skipped). */
typedef ckv_status (*ckv_cpu_head_fn)(void *ctx, int g, void *scratch);
ckv_status ckv_cpu_evict_heads(ckv_backend *be, int n, size_t scratch_bytes, ckv_cpu_head_fn fn, void *ctx);

/* exp(x) in fp32: the project's one fast exp (core/fastmath.h: branch-free, vectorisable, defined
 * for every input including NaN and +-inf). */
static inline float ckv_cpu_expf(float x) { return ckv_fast_expf(x); }

/* Part w of [0, n) cut into `parts` contiguous parts whose sizes differ by at most one: [*begin, *end). */
static inline void ckv_cpu_part(int n, int parts, int w, int *begin, int *end) {
    const int base = n / parts, rem = n % parts;
    *begin = w * base + (w < rem ? w : rem);
    *end = *begin + base + (w < rem);
}

/* Unit u of (segment, row block) units, `blocks` blocks of `block` rows per segment over n rows:
 * its segment *g, block *b and rows [*t0, *t1) (empty past n). */
static inline void ckv_cpu_unit_rows(int u, int blocks, int block, int n, int *g, int *b, int *t0, int *t1) {
    *g = u / blocks;
    *b = u % blocks;
    *t0 = *b * block;
    *t1 = *t0 + block < n ? *t0 + block : n;
}

/* Number of contiguous work items of `block` elements covering n elements (for ckv_threadpool_for,
 * which counts in int). */
static inline int ckv_cpu_blocks(size_t n, size_t block) { return (int)((n + block - 1) / block); }

#endif
