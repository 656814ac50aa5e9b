/* cpu_matmul.c - the CPU matmul op: out = x @ w^T (+ bias) with w in HF (out, in) layout. On CPUs with
 * AVX2 + FMA or AVX-512 it runs ckv's own kernels (cpu_gemm*.c: packed weight panels, register-tiled
 * micro-kernels, a bandwidth-bound GEMV for one token) on the backend's thread pool; they were
 * measured faster than the Debian OpenBLAS and BLIS builds on the shapes of the models we run, and need
 * no environment variable to pick their code path. Elsewhere it calls the BLAS the build linked
 * (CMake option CKV_BLAS: CKV_BLAS_OPENBLAS or CKV_BLAS_BLIS defined for this file), or the portable
 * C kernels when there is none. ckv_cpu_matmul dispatches on the weight's dtype: this is the one
 * place that chooses the kernel for a stored format (GGUF block types, F16 and BF16 go to the
 * stored-format kernels of cpu_quant*.c). */
#ifdef CKV_BLAS_BLIS
#define _POSIX_C_SOURCE 200809L /* BLIS's cblas.h needs pthread barriers: before any system header */
#endif

#include "cpu_backend.h"
#include "cpu_gemm.h"
#include "cpu_quant.h"

#include <math.h>

#if defined(CKV_BLAS_OPENBLAS) || defined(CKV_BLAS_BLIS)
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function" /* static inline helpers of BLIS's cblas.h */
#endif
#include <cblas.h>
#if defined(__GNUC__) || defined(__clang__)
#pragma GCC diagnostic pop
#endif
#define CKV_HAVE_BLAS 1
#endif

#ifdef CKV_BLAS_OPENBLAS
/* Declared here as well in case the cblas.h found is not OpenBLAS's own (identical prototypes). */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);
#else
/* cpu_backend.c sets OpenBLAS's thread count at init; without OpenBLAS there is none to set. */
void openblas_set_num_threads(int num_threads);
void openblas_set_num_threads(int num_threads) { (void)num_threads; }
#endif
#ifdef CKV_BLAS_BLIS
void bli_thread_set_num_threads(long n_threads); /* blis.h, which cblas.h of BLIS does not include */
#endif

int ckv_cpu_blas_matmul(int n_threads, float *out, const float *x, const float *w, const float *bias, int n, int k,
                        int m) {
#ifndef CKV_HAVE_BLAS
    (void)n_threads, (void)out, (void)x, (void)w, (void)bias, (void)n, (void)k, (void)m;
    return 0;
#else
    if (n <= 0 || m <= 0) return 1;
    if (k <= 0) { /* an empty sum; BLAS would reject lda = 0 */
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) out[(size_t)i * (size_t)m + (size_t)j] = bias ? bias[j] : 0.0f;
        return 1;
    }
#ifdef CKV_BLAS_OPENBLAS
    /* The OpenBLAS thread count is process-wide: put back ours if another backend changed it. */
    if (openblas_get_num_threads() != n_threads) openblas_set_num_threads(n_threads);
#else
    bli_thread_set_num_threads(n_threads);
#endif
    if (n == 1) /* out [m] = w [m, k] @ x [k] */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, m, k, 1.0f, w, k, x, 1, 0.0f, out, 1);
    else /* out [n, m] = x [n, k] @ w^T [k, m] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, 1.0f, x, k, w, k, 0.0f, out, m);
    if (bias) {
        for (int i = 0; i < n; i++) {
            float *restrict row = out + (size_t)i * (size_t)m; // [m]
            const float *restrict b = bias;                    // [m]
            for (int j = 0; j < m; j++) row[j] += b[j];
        }
    }
    return 1;
#endif
}

void ckv_cpu_matmul_f32(ckv_backend *be, float *out, const float *x, const float *w, const float *bias, int n, int k,
                        int m) {
    if (n <= 0 || m <= 0) return;
    const ckv_gemm_arch *arch = ckv_gemm_best_arch();
    /* no vector kernels for this CPU: the linked BLAS if there is one */
    if (arch == &ckv_gemm_arch_generic && ckv_cpu_blas_matmul(be->n_threads, out, x, w, bias, n, k, m)) return;
    ckv_cpu_gemm(ckv_cpu_pool(be), arch, out, x, w, bias, n, k, m);
}

int ckv_cpu_weight_dtype_ok(const ckv_backend *be, ckv_dtype t) {
    (void)be;
    return t == CKV_DTYPE_F32 || ckv_quant_dtype_ok(t);
}

void ckv_cpu_matmul(ckv_backend *be, float *out, const float *x, const ckv_weight *w, const float *bias, int n) {
    switch (w->dtype) {
    case CKV_DTYPE_F32: ckv_cpu_matmul_f32(be, out, x, w->data, bias, n, (int)w->cols, (int)w->rows); return;
    default: break;
    }
    if (ckv_quant_dtype_ok(w->dtype)) { /* GGUF blocks, F16, BF16: computed as stored (cpu_quant*.c) */
        ckv_cpu_quant_matmul(ckv_cpu_pool(be), NULL, out, x, w->data, w->dtype, w->row_bytes, bias, n, (int)w->cols,
                             (int)w->rows);
        return;
    }
    /* a weight the loader should never have kept in this format (weight_dtype_ok said no): loud */
    for (size_t i = 0; i < (size_t)n * (size_t)w->rows; i++) out[i] = NAN;
}
