/* emu_blas.cpp - cuBLAS of the CPU execution layer: the handle (its stream and workspace) and
 * cublasGemmEx / cublasGemmStridedBatchedEx as a plain CPU GEMM with fp32 products summed in double, validated at the call and
 * run in stream order on the device thread like any other queued work. Nothing else of cuBLAS. */
#include "emu_internal.h"

namespace ckv_emu {

struct ckv_emu_cublas {
    cudaStream_t stream;
    bool workspace; /* cublasSetWorkspace gave one (a capture needs it: docs/gpu.md §7) */
};

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    LOCKED;
    if (mach().count == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
    *h = new ckv_emu_cublas{NULL, false};
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h) {
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s) {
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes) {
    LOCKED;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && !find_alloc(ws, bytes, NULL)) return CUBLAS_STATUS_INVALID_VALUE;
    h->workspace = bytes > 0;
    return CUBLAS_STATUS_SUCCESS;
}

static size_t type_size(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

static double load(const void *p, cudaDataType_t t, size_t i) {
    if (t == CUDA_R_32F) return ((const float *)p)[i];
    return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
}

/* Bytes spanned by a column-major rows x cols matrix with leading dimension ld. */
static size_t extent(int rows, int cols, int ld, cudaDataType_t t) {
    if (rows == 0 || cols == 0) return 0;
    return ((size_t)(cols - 1) * (size_t)ld + (size_t)rows) * type_size(t);
}

/* C = a op(A) op(B) + b C, column-major (run in stream order on the device thread). */
static void gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float a, const void *A,
                 cudaDataType_t at, int lda, const void *B, int ldb, float b, void *C, cudaDataType_t ct, int ldc) {
    const cudaDataType_t bt = at;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double acc = 0.0; /* each fp32 product is exact in double */
            for (int l = 0; l < k; l++) {
                size_t ai = ta == CUBLAS_OP_N ? (size_t)i + (size_t)l * lda : (size_t)l + (size_t)i * lda;
                size_t bi = tb == CUBLAS_OP_N ? (size_t)l + (size_t)j * ldb : (size_t)j + (size_t)l * ldb;
                acc += (double)(float)(load(A, at, ai) * load(B, bt, bi));
            }
            size_t ci = (size_t)i + (size_t)j * ldc;
            float r = a * (float)acc;
            if (b != 0.0f) r += b * (float)load(C, ct, ci);
            if (ct == CUDA_R_32F)
                ((float *)C)[ci] = r;
            else
                ((__nv_bfloat16 *)C)[ci] = __float2bfloat16(r);
        }
}

/* Validates one batch of C_i = a op(A_i) op(B_i) + b C_i (X_i = X + i * strideX elements) at the call
 * and queues it in stream order; cublasGemmEx is the batch of one. */
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                          long long sa, const void *B, cudaDataType_t bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType_t ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    LOCKED;
    (void)algo;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || sa < 0 || sb < 0 || sc < 0) return CUBLAS_STATUS_INVALID_VALUE;
    const int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m; /* stored A: ar x ac */
    const int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (compute != CUBLAS_COMPUTE_32F || at != bt || (ct != CUDA_R_32F && ct != CUDA_R_16BF))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0 || batch == 0) return CUBLAS_STATUS_SUCCESS;
    const size_t es_a = type_size(at), es_c = type_size(ct);
    for (int i = 0; i < batch; i++) { /* every matrix of the batch lies in one allocation */
        const char *Ai = (const char *)A + (size_t)i * (size_t)sa * es_a, *Bi = (const char *)B + (size_t)i * (size_t)sb * es_a;
        char *Ci = (char *)C + (size_t)i * (size_t)sc * es_c;
        if (!find_alloc(Ci, extent(m, n, ldc, ct), NULL) ||
            (k > 0 && (!find_alloc(Ai, extent(ar, ac, lda, at), NULL) || !find_alloc(Bi, extent(br, bc, ldb, bt), NULL))))
            return CUBLAS_STATUS_INVALID_VALUE; /* on a GPU: an illegal address */
    }
    const int d = stream_of(h->stream)->device;
    if (mach().devs[d].sticky) return CUBLAS_STATUS_NOT_INITIALIZED;
    const float a = *(const float *)alpha, b = *(const float *)beta; /* host pointers: read at the call */
    if (stream_of(h->stream)->cap && !h->workspace) {
        /* cuBLAS would allocate its workspace inside the capture */
        if (capture_refuse()) return CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (!stream_of(h->stream)->cap) mach().gemms++;
    stream_push(h->stream, [=] {
        if (mach().devs[d].sticky) return;
        for (int i = 0; i < batch; i++) {
            void *Ci = (char *)C + (size_t)i * (size_t)sc * es_c;
            gemm(ta, tb, m, n, k, a, (const char *)A + (size_t)i * (size_t)sa * es_a, at, lda,
                 (const char *)B + (size_t)i * (size_t)sb * es_a, ldb, b, Ci, ct, ldc);
            mark_written(Ci, extent(m, n, ldc, ct));
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    return cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, alpha, A, at, lda, 0, B, bt, ldb, 0, beta, C, ct, ldc, 0, 1,
                                      compute, algo);
}

const char *cublasGetStatusString(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

} // namespace ckv_emu
