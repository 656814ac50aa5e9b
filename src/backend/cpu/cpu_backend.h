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

/* exp(x) in fp32, branch-free so that loops calling it auto-vectorise (libm's expf does not without
 * -ffast-math). Range reduction x = n ln2 + r with |r| <= ln2/2 (ln2 split in a high part exact in
 * fp32 and a low part), degree-7 Taylor polynomial for e^r (truncation < 0.1 ulp), then scaling by
 * 2^n built in the exponent bits. Measured on every 7th float of [-87, 88]: under 1 ulp from exp.
 * Inputs are clamped to [-87, 88]: below, the result is ~1.6e-38 instead of a denormal or 0 (harmless
 * for softmax and silu); above, ~1.6e38 instead of inf. NaN stays NaN. */
static inline float ckv_cpu_expf(float x) {
    x = x < -87.0f ? -87.0f : x;
    x = x > 88.0f ? 88.0f : x;
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer in the low bits */
    float kf = x * 1.44269504088896341f + magic;
    int32_t ki;
    memcpy(&ki, &kf, sizeof ki);
    ki -= 0x4B400000; /* bits of `magic`: what remains is round(x / ln2) */
    float nf = kf - magic;
    float r = x - nf * 0.693145751953125f;  /* ln2, high part (exact product) */
    r = r - nf * 1.42860676533018704e-06f; /* ln2, low part */
    float p = 1.0f / 5040.0f;
    p = p * r + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = (ki + 127) * (1 << 23); /* 2^n, n in [-126, 127] after the clamp */
    float two_n;
    memcpy(&two_n, &bits, sizeof two_n);
    return p * two_n;
}

/* Number of contiguous work items of `block` elements covering n elements (for ckv_threadpool_for,
 * which counts in int). */
static inline int ckv_cpu_blocks(size_t n, size_t block) { return (int)((n + block - 1) / block); }

#endif
