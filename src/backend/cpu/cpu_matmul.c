/* cpu_matmul.c - the CPU matmul: out = x @ w^T (+ bias) with w in HF (out, in) layout, through
 * OpenBLAS (sgemm for prefill, sgemv for one token), bias added after. It does no threading of its
 * own (OpenBLAS has its own threads) and no quantised or low-precision weights. */
#include <cblas.h>

#include "cpu_backend.h"

/* Declared here as well in case the cblas.h found is not OpenBLAS's own (identical prototypes). */
void openblas_set_num_threads(int num_threads);
int openblas_get_num_threads(void);

void ckv_cpu_matmul(ckv_backend *be, float *out, const float *x, const float *w, const float *bias, int n, int k,
                    int m) {
    if (n <= 0 || m <= 0) return;
    /* The OpenBLAS thread count is process-wide: put back ours if another backend changed it. */
    const ckv_cpu_ctx *ctx = be->ctx;
    if (openblas_get_num_threads() != ctx->n_threads) openblas_set_num_threads(ctx->n_threads);

    if (k <= 0) {
        /* an empty sum; BLAS would reject lda = 0 */
        memset(out, 0, (size_t)n * (size_t)m * sizeof *out);
    } else if (n == 1) {
        /* out [m] = w [m, k] @ x [k] */
        cblas_sgemv(CblasRowMajor, CblasNoTrans, m, k, 1.0f, w, k, x, 1, 0.0f, out, 1);
    } else {
        /* out [n, m] = x [n, k] @ w^T [k, m] */
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, m, k, 1.0f, x, k, w, k, 0.0f, out, m);
    }
    if (bias) {
        for (int i = 0; i < n; i++) {
            float *restrict row = out + (size_t)i * (size_t)m; // [m]
            const float *restrict b = bias;                    // [m]
            for (int j = 0; j < m; j++) row[j] += b[j];
        }
    }
}
