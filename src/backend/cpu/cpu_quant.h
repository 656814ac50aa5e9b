/* cpu_quant.h - private to backend/cpu: the matrix multiply over weights kept in the format they are
 * stored in, out[n, m] = x[n, k] @ W[m, k]^T (+ bias[m]), for the GGUF block types (Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) and for F16 / BF16. With few rows of x (decode), block-type weights
 * meet activations rounded to 8 bits per block (like llama.cpp's CPU path): 32-element blocks for the
 * 32-element weight types, 256-element blocks with 16-element sums for the K types; F16 / BF16
 * weights are widened to fp32 on the fly and meet the fp32 activations. With many rows (prefill) the
 * fp32 GEMM runs over weight panels dequantised on the fly. cpu_quant.c holds the driver (activation rounding, threading
 * over output columns), the portable kernels and the kernel choice; cpu_quant_avx2.c the vector
 * kernels (also used on AVX-512 CPUs). Every output element is one dot product summed in an order
 * fixed by the kernel set and k alone, so results do not depend on the thread count. Nothing here
 * allocates: rounded activations live in a fixed-size stack buffer. Included by nothing outside
 * backend/cpu but its unit test (tests/unit/test_cpu_quant.c). */
#ifndef CKV_CPU_QUANT_H
#define CKV_CPU_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"
#include "core/threadpool.h"

/* From this many rows of x on, the fp32 GEMM over dequantised weight panels. */
#define CKV_QUANT_GEMM_ROWS 8

/* An activation block of 32: x[i] ~= d * q[i]; s = d * sum(q). */
typedef struct {
    float d, s;
    int8_t q[32];
} ckv_q8x32;

/* An activation block of 256: x[i] ~= d * q[i]; bsum[j] = sum of q[16 j .. 16 j + 15]. */
typedef struct {
    float d;
    int16_t bsum[16];
    int8_t q[256];
} ckv_q8x256;

/* dot of one weight row with one activation row: nb weight blocks at w (for F16 / BF16: nb = k
 * elements) against the matching activation blocks at xq (ckv_q8x32 or ckv_q8x256; for F16 / BF16 the
 * fp32 row). */
typedef float (*ckv_qdot_fn)(int nb, const void *w, const void *xq);

typedef struct {
    const char *name;
    ckv_qdot_fn dot[CKV_DTYPE_COUNT_]; /* NULL: not a type this set computes */
} ckv_quant_arch;

/* The kernel sets; ckv_quant_*_supported() is 0 when the CPU (or the compiler) lacks their features. */
extern const ckv_quant_arch ckv_quant_arch_generic;
extern const ckv_quant_arch ckv_quant_arch_avx2;
int ckv_quant_avx2_supported(void);

/* The kernel set ckv_cpu_quant_matmul uses on this CPU (chosen once, thread-safe). */
const ckv_quant_arch *ckv_quant_best_arch(void);

/* 1 when ckv_cpu_quant_matmul computes weights of type t (the block types, F16, BF16). */
int ckv_quant_dtype_ok(ckv_dtype t);

/* Rounds k activations (k a multiple of 32 / 256) to 8-bit blocks (the portable rounding every kernel
 * set shares, so all sets see the same codes). */
void ckv_quant_x32(const float *x, int k, ckv_q8x32 *y);
void ckv_quant_x256(const float *x, int k, ckv_q8x256 *y);

/* out [n, m] = x [n, k] @ w^T (+ bias [m]) for the weights w [m rows of row_bytes] of type t (a type
 * ckv_quant_dtype_ok accepts, k a multiple of its block size), with `arch`'s dot kernels (NULL: the
 * best one) below CKV_QUANT_GEMM_ROWS rows and the best fp32 GEMM kernels from there on, over the
 * pool's threads (pool may be NULL: the caller's thread alone). */
void ckv_cpu_quant_matmul(ckv_threadpool *pool, const ckv_quant_arch *arch, float *out, const float *x,
                          const void *w, ckv_dtype t, size_t row_bytes, const float *bias, int n, int k, int m);

#endif
