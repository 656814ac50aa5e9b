/* cpu_gemm.h - private to backend/cpu: ckv's own fp32 matrix multiply for weights in HF (out, in)
 * layout, out[n, m] = x[n, k] @ w[m, k]^T (+ bias[m]). cpu_gemm.c holds the driver (blocking, packing
 * of weight panels, threading over the backend's pool, choice of kernels by the CPU's features at run
 * time) and a portable kernel set; cpu_gemm_avx512.c and cpu_gemm_avx2.c hold the vector kernel sets.
 * Nothing here allocates: the packed weight panels live in fixed-size stack buffers. Included by
 * nothing outside backend/cpu but its unit test (tests/unit/test_cpu_gemm.c). */
#ifndef CKV_CPU_GEMM_H
#define CKV_CPU_GEMM_H

#include <stddef.h>

#include "core/threadpool.h"

/* Depth of one k block: a packed weight panel holds CKV_GEMM_KC x NR floats. */
#ifndef CKV_GEMM_KC
#define CKV_GEMM_KC 256
#endif
/* Largest NR of any kernel set (the packed panel buffer is sized for it). */
#define CKV_GEMM_NR_MAX 32
/* Largest MR of any kernel set. */
#define CKV_GEMM_MR_MAX 16

/* One architecture's kernels.
 *
 * ukernel: the MR x NR register tile of out at rows [0, mr) of a (mr <= MR) and columns [0, nr) of
 *   bp (nr <= NR):  acc = sum over p < kc of a[r * lda + p] * bp[p * NR + c]; then
 *   c[r * ldc + c] = acc + (bias ? bias[c] : 0) when first, else c[r * ldc + c] += acc.
 *   a points at x[i0, p0] (rows lda floats apart), bp at a packed panel, c at out[i0, j0].
 * pack: bp[p * NR + c] = w[c * ldw + p] for p < kc, c < nr, and 0 for nr <= c < NR.
 * gemv: out[j] = dot(w[j * ldw .. + k), x) (+ bias[j]) for j in [0, rows); a fixed order of
 *   summation over k that depends on k only.
 * dots (NULL in a set without it): out[r * ldo + c] = x[r] . w[c] for r < n, c < m, x [n, k] (rows
 *   ldx apart) and w [m, k] read in place (rows ldw apart, no packing), every element the sum the
 *   micro-kernel forms for it (an fma chain over p from zero within each CKV_GEMM_KC block, the
 *   blocks added in order): ckv_gemm_packed_rows' results for a few rows without packing w. */
typedef struct {
    const char *name;
    int mr, nr;
    void (*ukernel)(int kc, const float *a, size_t lda, int mr, const float *bp, float *c, size_t ldc, int nr,
                    const float *bias, int first);
    void (*pack)(int kc, const float *w, size_t ldw, int nr, float *bp);
    void (*gemv)(int rows, int k, const float *w, size_t ldw, const float *x, const float *bias, float *out);
    void (*dots)(int n, int k, const float *x, size_t ldx, const float *w, size_t ldw, int m, float *out, size_t ldo);
} ckv_gemm_arch;

/* The kernel sets; ckv_gemm_*_supported() is 0 when the CPU (or the compiler) lacks a set's features. */
extern const ckv_gemm_arch ckv_gemm_arch_generic;
extern const ckv_gemm_arch ckv_gemm_arch_avx2;
extern const ckv_gemm_arch ckv_gemm_arch_avx512;
int ckv_gemm_avx2_supported(void);
int ckv_gemm_avx512_supported(void);

/* The kernel set ckv_cpu_gemm uses on this CPU (chosen once, thread-safe). */
const ckv_gemm_arch *ckv_gemm_best_arch(void);

/* out [n, m] = x [n, k] @ w [m, k]^T (+ bias [m]) with `arch`'s kernels (NULL: the best one), over the
 * pool's threads (pool may be NULL: the caller's thread alone). Results do not depend on the number
 * of threads. n, k, m >= 0; k == 0 gives out = bias (or 0). */
void ckv_cpu_gemm(ckv_threadpool *pool, const ckv_gemm_arch *arch, float *out, const float *x, const float *w,
                  const float *bias, int n, int k, int m);

/* Weights produced panel by panel instead of read from an fp32 matrix: rows(ctx, j0, nr, p0, kc, dst)
 * writes dst [nr, kc] = w[j0 .. j0 + nr, p0 .. p0 + kc) in fp32 (p0 a multiple of CKV_GEMM_KC). The
 * stored-format matmul (cpu_quant.c) dequantises its blocks this way. */
typedef struct {
    void (*rows)(const void *ctx, int j0, int nr, int p0, int kc, float *dst);
    const void *ctx;
} ckv_gemm_wsrc;

/* ckv_cpu_gemm with the weights from `src`: the same blocking, order of summation and results as
 * ckv_cpu_gemm over the fp32 matrix src describes (for n > 1; n == 1 goes through the same tiles). */
void ckv_cpu_gemm_wsrc(ckv_threadpool *pool, const ckv_gemm_arch *arch, float *out, const float *x,
                       const ckv_gemm_wsrc *src, const float *bias, int n, int k, int m);

/* Weights packed once and reused by many products (an op's keys for every query strip, o_proj for
 * every block of values): bp holds w [m, k] as ceil(m / NR) panels, panel q at bp + q * k * NR laid
 * out [k, NR] (column c of the panel is w row q * NR + c, zero past m), the layout ckv_cpu_gemm packs
 * block by block, so its CKV_GEMM_KC slices are the same panels. bp must be 64-byte aligned. */
size_t ckv_gemm_packed_floats(const ckv_gemm_arch *arch, int k, int m);
void ckv_gemm_pack_all(const ckv_gemm_arch *arch, float *bp, const float *w, int k, int m);

/* out [n, m] (rows ldo apart) = x [n, k] (rows ldx apart) @ w^T from the packed bp of w [m_all, k]
 * (m <= m_all: the first m columns only), on the calling thread: every element is the sum the
 * micro-kernel forms in ckv_cpu_gemm for n > 1 (k blocks of CKV_GEMM_KC, in order). */
void ckv_gemm_packed_rows(const ckv_gemm_arch *arch, float *out, size_t ldo, const float *x, size_t ldx,
                          const float *bp, int n, int k, int m);

/* The L1 norms of the rows of y = x [n, k] @ w^T (the packed bp of w [m, k]) without writing y: each
 * register tile goes through an L1-resident buffer into lanes [n, 16] += |y[i, c]| for c < m - m % 16
 * (lane c % 16, columns ascending, the order of a 16-lane sum over the row), and the last m % 16
 * columns are written as |y| to tail [n, 15] (NULL when m % 16 == 0). y's elements are the sums of
 * ckv_gemm_packed_rows. The calling thread only. */
void ckv_gemm_packed_l1(const ckv_gemm_arch *arch, float *lanes, float *tail, const float *x, size_t ldx,
                        const float *bp, int n, int k, int m);

/* cpu_matmul.c: out = x @ w^T (+ bias) through the BLAS the build linked (CMake option CKV_BLAS) on
 * n_threads threads; the op uses it on CPUs without vector kernels. Returns 0, doing nothing, when the
 * build has no BLAS. */
int ckv_cpu_blas_matmul(int n_threads, float *out, const float *x, const float *w, const float *bias, int n, int k,
                        int m);

#endif
