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

/* The backend's ctx. */
typedef struct {
    ckv_threadpool *pool; /* our own parallel loops (OpenBLAS keeps its own threads) */
    int n_threads;
    float *attn_ws;        /* [attn_ws_floats] split-K attention partials (cpu_attention.c) */
    size_t attn_ws_floats;
} ckv_cpu_ctx;

/* Floats of the attention workspace allocated with the backend (4 MiB). */
#define CKV_CPU_ATTN_WS_FLOATS ((size_t)1 << 20)

static inline ckv_threadpool *ckv_cpu_pool(const ckv_backend *be) { return ((const ckv_cpu_ctx *)be->ctx)->pool; }

/* Kernels: semantics exactly as the matching ckv_backend_ops entry in backend.h. */
void ckv_cpu_matmul(ckv_backend *be, float *out, const float *x, const ckv_weight *w, const float *bias, int n);
/* The fp32-weight GEMM behind ckv_cpu_matmul: out [n, m] = x [n, k] @ w [m, k]^T (+ bias [m]). */
void ckv_cpu_matmul_f32(ckv_backend *be, float *out, const float *x, const float *w, const float *bias, int n, int k,
                        int m);
void ckv_cpu_attention(ckv_backend *be, float *out, const float *q, const int32_t *qpos, const ckv_kv_batch *kv, int n,
                       int n_heads, float scale);
void ckv_cpu_embedding(ckv_backend *be, float *out, const ckv_weight *table, const int32_t *ids, int n);
void ckv_cpu_rmsnorm(ckv_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps);
void ckv_cpu_rope(ckv_backend *be, float *x, const int32_t *pos, int n, int n_heads, int hd, const float *inv_freq,
                  float attn_scale);
void ckv_cpu_kv_store(ckv_backend *be, const ckv_kv_batch *kv, const float *k, const float *v, const int32_t *pos,
                      int n);
void ckv_cpu_kv_gather(ckv_backend *be, ckv_dtype dtype, int head_dim, int n_kv, ckv_kv_seg *dst,
                       const ckv_kv_seg *src, const int32_t *keep, int stride, const int32_t *n_keep);
void ckv_cpu_swiglu(ckv_backend *be, float *out, const float *gate, const float *up, size_t n);
void ckv_cpu_add(ckv_backend *be, float *x, const float *y, size_t n);
ckv_status ckv_cpu_count_nonfinite(ckv_backend *be, const float *x, size_t n, size_t *n_bad);
/* 1 when the CPU matmul/embedding compute weights stored as t (see cpu_matmul.c). */
int ckv_cpu_weight_dtype_ok(const ckv_backend *be, ckv_dtype t);

/* exp(x) in fp32: the project's one fast exp (core/fastmath.h: branch-free, vectorisable, defined
 * for every input including NaN and +-inf). */
static inline float ckv_cpu_expf(float x) { return ckv_fast_expf(x); }

/* Number of contiguous work items of `block` elements covering n elements (for ckv_threadpool_for,
 * which counts in int). */
static inline int ckv_cpu_blocks(size_t n, size_t block) { return (int)((n + block - 1) / block); }

#endif
