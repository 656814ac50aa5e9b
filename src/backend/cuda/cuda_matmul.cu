/* cuda_matmul.cu - the CUDA matmul op: out = x @ W^T (+ bias) through cuBLAS with fp32 accumulation.
 * bf16 weights: x (fp32 in the interface) is rounded to bf16 into the backend's workspace, then one
 * cublasGemmEx bf16 x bf16 -> fp32 (CUBLAS_COMPUTE_32F); fp32 weights: the same call in fp32. The
 * operand order is docs/gpu.md §5: the column-major view of y^T = W x^T. Bias is a second kernel. No
 * quantised weights (the loader converts them to the backend's weight dtype). */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr unsigned THREADS = 256;

__global__ void to_bf16_kernel(ckv_bf16 *dst, const float *src, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        dst[i] = __float2bfloat16(src[i]);
}

/* out [n, m] += bias [m] */
__global__ void bias_kernel(float *out, const float *bias, size_t n_rows, int m) {
    const size_t total = n_rows * (size_t)m;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x)
        out[i] += bias[i % (size_t)m];
}

} // namespace

void matmul(ckv_backend *be, float *out, const float *x, const ckv_weight *w, const float *bias, int n) {
    ctx *c = ctx_of(be);
    if (n <= 0 || w->rows <= 0) return;
    const int m = (int)w->rows, k = (int)w->cols;
    const float one = 1.0f, zero = 0.0f;
    if (w->dtype == CKV_DTYPE_BF16 && w->row_bytes % sizeof(ckv_bf16) == 0) {
        const size_t nx = (size_t)n * (size_t)k;
        ckv_status s = grow(c, (void **)&c->xbf, &c->xbf_cap, ckv_gpu_gemm_ws_bytes((size_t)n, (size_t)k),
                            "the GEMM activation workspace");
        if (s != CKV_STATUS_OK) {
            record(c, s);
            return;
        }
        if (nx) CKV_LAUNCH(to_bf16_kernel, dim3(blocks_for(nx, THREADS)), dim3(THREADS), 0, c->stream, c->xbf, x, nx);
        CKV_CUBLAS_OP_CHECK(c,
                            cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w->data, CUDA_R_16BF,
                                         (int)(w->row_bytes / sizeof(ckv_bf16)), c->xbf, CUDA_R_16BF, k > 0 ? k : 1,
                                         &zero, out, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                            "matmul");
    } else if (w->dtype == CKV_DTYPE_F32 && w->row_bytes % sizeof(float) == 0) {
        CKV_CUBLAS_OP_CHECK(c,
                            cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, w->data, CUDA_R_32F,
                                         (int)(w->row_bytes / sizeof(float)), x, CUDA_R_32F, k > 0 ? k : 1, &zero, out,
                                         CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                            "matmul");
    } else {
        record(c, ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                            "%s backend: matmul: weight dtype %s (row_bytes %zu) is not bf16 or f32 (convert on upload)",
                            CKV_CUDA_BACKEND_NAME, ckv_dtype_name(w->dtype), w->row_bytes));
        return;
    }
    if (bias) {
        const size_t total = (size_t)n * (size_t)m;
        CKV_LAUNCH(bias_kernel, dim3(blocks_for(total, THREADS)), dim3(THREADS), 0, c->stream, out, bias, (size_t)n, m);
    }
    op_done(c, "matmul");
}

} // namespace CKV_CUDA_NS
