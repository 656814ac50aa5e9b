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
} ckv_cpu_ctx;

static inline ckv_threadpool *ckv_cpu_pool(const ckv_backend *be) { return ((const ckv_cpu_ctx *)be->ctx)->pool; }

/* Kernels: semantics exactly as the matching ckv_backend_ops entry in backend.h. */
void ckv_cpu_matmul(ckv_backend *be, float *out, const float *x, const float *w, const float *bias, int n, int k,
                    int m);
void ckv_cpu_attention(ckv_backend *be, float *out, const float *q, const int32_t *qpos, const ckv_attn_cache *cache,
                       int n, int n_heads, float scale);
void ckv_cpu_embedding(ckv_backend *be, float *out, const float *table, const int32_t *ids, int n, int dim);
void ckv_cpu_rmsnorm(ckv_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps);
void ckv_cpu_rope(ckv_backend *be, float *x, const int32_t *pos, int n, int n_heads, int hd, const float *inv_freq,
                  float attn_scale);
void ckv_cpu_kv_store(ckv_backend *be, float *kpool, float *vpool, int32_t *ppool, const int64_t *off,
                      const int32_t *len, const float *k, const float *v, const int32_t *pos, int n, int n_kv, int d);
void ckv_cpu_swiglu(ckv_backend *be, float *out, const float *gate, const float *up, size_t n);
void ckv_cpu_add(ckv_backend *be, float *x, const float *y, size_t n);

/* exp(x) in fp32: the project's one fast exp (core/fastmath.h: branch-free, vectorisable, defined
 * for every input including NaN and +-inf). */
static inline float ckv_cpu_expf(float x) { return ckv_fast_expf(x); }

/* Number of contiguous work items of `block` elements covering n elements (for ckv_threadpool_for,
 * which counts in int). */
static inline int ckv_cpu_blocks(size_t n, size_t block) { return (int)((n + block - 1) / block); }

#endif
