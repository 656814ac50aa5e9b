/* cpu_matmul.c - the CPU matmul op: out = x @ w^T (+ bias) with w in HF (out, in) layout. On CPUs with
 * AVX2 + FMA or AVX-512 it runs ckv's own kernels (cpu_gemm*.c: packed weight panels, register-tiled
 * micro-kernels, a bandwidth-bound GEMV for one token) on the backend's thread pool; they were
 * measured faster than the Debian OpenBLAS and BLIS builds on the shapes of the models we run, and need
 * no environment variable to pick their code path. Elsewhere it calls the BLAS the build linked
 * (CMake option CKV_BLAS: CKV_BLAS_OPENBLAS or CKV_BLAS_BLIS defined for this file), or the portable
 * C kernels when there is none. No quantised or low-precision weights. */
#include "cpu_backend.h"
#include "cpu_gemm.h"

#if defined(CKV_BLAS_OPENBLAS) || defined(CKV_BLAS_BLIS)
#include <cblas.h>
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

#ifdef CKV_HAVE_BLAS
/* The linked BLAS, for CPUs where ckv has no vector kernels. */
static void ckv_matmul_blas(const ckv_cpu_ctx *ctx, float *out, const float *x, const float *w, const float *bias,
                            int n, int k, int m) {
#ifdef CKV_BLAS_OPENBLAS
    /* The OpenBLAS thread count is process-wide: put back ours if another backend changed it. */
    if (openblas_get_num_threads() != ctx->n_threads) openblas_set_num_threads(ctx->n_threads);
#else
    bli_thread_set_num_threads(ctx->n_threads);
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
}
#endif

void ckv_cpu_matmul(ckv_backend *be, float *out, const float *x, const float *w, const float *bias, int n, int k,
                    int m) {
    if (n <= 0 || m <= 0) return;
    const ckv_gemm_arch *arch = ckv_gemm_best_arch();
#ifdef CKV_HAVE_BLAS
    if (arch == &ckv_gemm_arch_generic && k > 0) {
        ckv_matmul_blas(be->ctx, out, x, w, bias, n, k, m);
        return;
    }
#endif
    ckv_cpu_gemm(ckv_cpu_pool(be), arch, out, x, w, bias, n, k, m);
}
