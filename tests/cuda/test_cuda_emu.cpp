/* test_cuda_emu.cpp - the CPU execution layer itself (src/backend/cuda/emu), on kernels written
 * here: warp shuffles against the rules of docs/gpu.md §2 (widths, sources outside the group or the
 * mask), __syncthreads as a block barrier, per-block __shared__ storage, dynamic shared memory
 * past 48 KiB (refused without the cudaFuncSetAttribute opt-in, as on a device), the mma wrapper against a
 * naive product with fragments loaded by the PTX ISA layouts of docs/gpu.md §1, the cuBLAS GEMM
 * against a naive column-major product (both transposes, padded leading dimensions, bf16 and f32),
 * and the faults that must never hang: a divergent __syncthreads, a shuffle whose mask names an
 * exited lane, a bad launch configuration, copies that name host memory as device memory. Built
 * only for the emulator (label cuda-emu): on a GPU the fault kernels are undefined behaviour. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckv_mma.h"
#include "cuda_rt.h"

#include "emu_test.h"

/* ---- shuffles --------------------------------------------------------------------------------- */

/* out[kind * 32 + lane] for kinds idx (src lane + 3, width 8), up (2, width 16), down (5, width 32),
 * xor (3, width 4), and xor 16 within width 8 (a later group: own value; an earlier one is read). */
__global__ void shfl_kernel(int *out) {
    const int lane = (int)threadIdx.x, v = 100 + lane;
    out[0 * 32 + lane] = __shfl_sync(0xffffffffu, v, lane + 3, 8);
    out[1 * 32 + lane] = __shfl_up_sync(0xffffffffu, v, 2, 16);
    out[2 * 32 + lane] = __shfl_down_sync(0xffffffffu, v, 5);
    out[3 * 32 + lane] = __shfl_xor_sync(0xffffffffu, v, 3, 4);
    out[4 * 32 + lane] = __shfl_xor_sync(0xffffffffu, v, 16, 8);
}

static void test_shuffles() {
    int *d = NULL;
    cudaMalloc((void **)&d, 5 * 32 * sizeof(int));
    CKV_LAUNCH(shfl_kernel, dim3(1), dim3(32), 0, (cudaStream_t)NULL, d);
    int got[160];
    EXPECT(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    int bad = 0;
    for (int l = 0; l < 32; l++) {
        const int want[5] = {100 + (l & ~7) + (l + 3) % 8, 100 + ((l - 2) >= (l & ~15) ? l - 2 : l),
                             100 + (l + 5 < 32 ? l + 5 : l), 100 + (l ^ 3),
                             100 + ((l ^ 16) < (l & ~7) + 8 ? l ^ 16 : l)};
        for (int k = 0; k < 5; k++)
            if (got[k * 32 + l] != want[k]) {
                if (bad++ < 5) fprintf(stderr, "  shuffle kind %d lane %d: %d, expected %d\n", k, l, got[k * 32 + l], want[k]);
            }
    }
    EXPECT(bad == 0, "%d shuffle results wrong", bad);
    if (!bad) fprintf(stderr, "ok   shuffles: idx/up/down/xor with widths 4-32 follow docs/gpu.md §2\n");
    cudaFree(d);
}

/* ---- barriers and shared memory ---------------------------------------------------------------- */

/* Block b sums b * 1000 + thread over its 256 threads through shared memory. */
__global__ void block_sum_kernel(float *out) {
    __shared__ float buf[256];
    __shared__ int tag;
    if (threadIdx.x == 0) tag = (int)blockIdx.x;
    buf[threadIdx.x] = (float)(blockIdx.x * 1000 + threadIdx.x);
    __syncthreads();
    for (unsigned s = 128; s > 0; s >>= 1) {
        if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = tag == (int)blockIdx.x ? buf[0] : -1.0f;
}

static void test_barriers() {
    float *d = dev_floats(3);
    CKV_LAUNCH(block_sum_kernel, dim3(3), dim3(256), 0, (cudaStream_t)NULL, d);
    float got[3];
    EXPECT(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    int bad = 0;
    for (int b = 0; b < 3; b++) bad += got[b] != (float)(b * 1000 * 256 + 255 * 256 / 2);
    EXPECT(bad == 0, "block sums %g %g %g", got[0], got[1], got[2]);
    if (!bad) fprintf(stderr, "ok   __syncthreads tree reduction over 256 fibers, __shared__ per block\n");
    cudaFree(d);
}

/* Dynamic shared memory past 48 KiB (64 KiB: 16K floats): block b writes b + i into its 16K floats,
 * then thread t sums its 64 strided ones written by other threads. */
constexpr int DYN_FLOATS = 16 * 1024;
__global__ void dyn_shared_kernel(float *out) {
    CKV_SHARED_DYN(smem, DYN_FLOATS * sizeof(float));
    float *buf = (float *)smem;
    for (int i = (int)threadIdx.x; i < DYN_FLOATS; i += 256) buf[i] = (float)(blockIdx.x + i);
    __syncthreads();
    float s = 0.0f;
    for (int i = ((int)threadIdx.x + 1) % 256; i < DYN_FLOATS; i += 256) s += buf[i];
    out[blockIdx.x * 256 + threadIdx.x] = s;
}

static void test_dynamic_shared() {
    float *d = dev_floats(2 * 256);
    const size_t bytes = DYN_FLOATS * sizeof(float);
    CKV_LAUNCH(dyn_shared_kernel, dim3(2), dim3(256), bytes, (cudaStream_t)NULL, d);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "64 KiB of dynamic shared memory without the opt-in");
    EXPECT(cudaFuncSetAttribute(dyn_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 228 * 1024) ==
               cudaErrorInvalidValue,
           "an opt-in past 227 KiB accepted");
    (void)cudaGetLastError();
    EXPECT(cudaFuncSetAttribute(dyn_shared_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes) ==
               cudaSuccess,
           "opt-in to 64 KiB");
    CKV_LAUNCH(dyn_shared_kernel, dim3(2), dim3(256), bytes, (cudaStream_t)NULL, d);
    EXPECT(cudaGetLastError() == cudaSuccess, "64 KiB of dynamic shared memory after the opt-in");
    float got[2 * 256];
    EXPECT(cudaMemcpy(got, d, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    int bad = 0;
    for (int b = 0; b < 2; b++)
        for (int t = 0; t < 256; t++) {
            double want = 0.0; /* the 64 values b + i, i = (t + 1) % 256 + 256 k */
            for (int i = (t + 1) % 256; i < DYN_FLOATS; i += 256) want += (double)(b + i);
            bad += fabs(got[b * 256 + t] - want) > 1e-6 * want;
        }
    EXPECT(bad == 0, "%d dynamic shared memory sums wrong", bad);
    if (!bad) fprintf(stderr, "ok   64 KiB of dynamic shared memory per block: refused without the opt-in, then per block\n");
    cudaFree(d);
}

/* ---- mma -------------------------------------------------------------------------------------- */

/* A [16, 16], B [16, 8] (k, n) as bf16 bits, C [16, 8]: fragments loaded by the PTX layouts. */
__global__ void mma_kernel(float *d, const uint16_t *a, const uint16_t *b, const float *c) {
    const int lane = (int)threadIdx.x, g = lane >> 2, t = lane & 3;
    auto A = [&](int r, int k) { return (uint32_t)a[r * 16 + k]; };
    auto B = [&](int k, int n) { return (uint32_t)b[k * 8 + n]; };
    const uint32_t ra[4] = {A(g, 2 * t) | A(g, 2 * t + 1) << 16, A(g + 8, 2 * t) | A(g + 8, 2 * t + 1) << 16,
                            A(g, 2 * t + 8) | A(g, 2 * t + 9) << 16, A(g + 8, 2 * t + 8) | A(g + 8, 2 * t + 9) << 16};
    const uint32_t rb[2] = {B(2 * t, g) | B(2 * t + 1, g) << 16, B(2 * t + 8, g) | B(2 * t + 9, g) << 16};
    const float rc[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
    float rd[4];
    ckv_mma_bf16_16816(rd, ra, rb, rc);
    d[g * 8 + 2 * t] = rd[0], d[g * 8 + 2 * t + 1] = rd[1];
    d[(g + 8) * 8 + 2 * t] = rd[2], d[(g + 8) * 8 + 2 * t + 1] = rd[3];
}

static float bits_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_mma() {
    uint16_t a[256], b[128];
    float c[128], want[128], got[128];
    srand(7);
    for (int i = 0; i < 256; i++) a[i] = __float2bfloat16((float)(rand() % 2001 - 1000) / 250.0f).x;
    for (int i = 0; i < 128; i++) b[i] = __float2bfloat16((float)(rand() % 2001 - 1000) / 250.0f).x;
    for (int i = 0; i < 128; i++) c[i] = (float)(rand() % 200 - 100) / 8.0f;
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double s = c[r * 8 + n];
            for (int k = 0; k < 16; k++) s += (double)bits_to_f32(a[r * 16 + k]) * (double)bits_to_f32(b[k * 8 + n]);
            want[r * 8 + n] = (float)s;
        }
    uint16_t *da, *db;
    cudaMalloc((void **)&da, sizeof a);
    cudaMalloc((void **)&db, sizeof b);
    float *dc = dev_floats(128), *dd = dev_floats(128);
    cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
    cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
    cudaMemcpy(dc, c, sizeof c, cudaMemcpyHostToDevice);
    CKV_LAUNCH(mma_kernel, dim3(1), dim3(32), 0, (cudaStream_t)NULL, dd, (const uint16_t *)da, (const uint16_t *)db,
               (const float *)dc);
    EXPECT(cudaMemcpy(got, dd, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess, "copy");
    double max_err = 0.0;
    for (int i = 0; i < 128; i++) max_err = fmax(max_err, fabs((double)got[i] - want[i]));
    EXPECT(max_err <= 1e-5, "mma max |diff| %g", max_err);
    if (max_err <= 1e-5) fprintf(stderr, "ok   mma m16n8k16 bf16: D = A B + C by the PTX fragment layouts, max |diff| %.3g\n", max_err);
    cudaFree(da), cudaFree(db), cudaFree(dc), cudaFree(dd);
}

/* ---- cuBLAS GEMM ------------------------------------------------------------------------------ */

static void test_gemm(cublasOperation_t ta, cublasOperation_t tb, cudaDataType_t t) {
    const int m = 5, n = 4, k = 7, lda = 9, ldb = 8, ldc = 6;
    const int acols = ta == CUBLAS_OP_N ? k : m, bcols = tb == CUBLAS_OP_N ? n : k;
    const size_t es = t == CUDA_R_32F ? 4 : 2;
    float A[9 * 7], B[8 * 7], C[6 * 4], want[6 * 4];
    unsigned char hA[sizeof A], hB[sizeof B];
    for (int i = 0; i < lda * acols; i++) A[i] = bits_to_f32(__float2bfloat16((float)(i % 13) - 6.0f).x);
    for (int i = 0; i < ldb * bcols; i++) B[i] = bits_to_f32(__float2bfloat16((float)(i % 7) * 0.5f - 1.0f).x);
    for (int i = 0; i < ldc * n; i++) C[i] = (float)i;
    for (int i = 0; i < lda * acols; i++) {
        const __nv_bfloat16 h = __float2bfloat16(A[i]);
        memcpy(hA + es * i, t == CUDA_R_32F ? (const void *)&A[i] : (const void *)&h.x, es);
    }
    for (int i = 0; i < ldb * bcols; i++) {
        const __nv_bfloat16 h = __float2bfloat16(B[i]);
        memcpy(hB + es * i, t == CUDA_R_32F ? (const void *)&B[i] : (const void *)&h.x, es);
    }
    const float alpha = 1.5f, beta = 0.5f;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double s = 0;
            for (int l = 0; l < k; l++)
                s += (double)(ta == CUBLAS_OP_N ? A[i + l * lda] : A[l + i * lda]) *
                     (double)(tb == CUBLAS_OP_N ? B[l + j * ldb] : B[j + l * ldb]);
            want[i + j * ldc] = alpha * (float)s + beta * C[i + j * ldc];
        }
    void *dA, *dB;
    cudaMalloc(&dA, es * lda * acols);
    cudaMalloc(&dB, es * ldb * bcols);
    float *dC = dev_floats((size_t)ldc * n);
    cudaMemcpy(dA, hA, es * lda * acols, cudaMemcpyHostToDevice);
    cudaMemcpy(dB, hB, es * ldb * bcols, cudaMemcpyHostToDevice);
    cudaMemcpy(dC, C, sizeof C, cudaMemcpyHostToDevice);
    cublasHandle_t h;
    cublasCreate(&h);
    cublasStatus_t st = cublasGemmEx(h, ta, tb, m, n, k, &alpha, dA, t, lda, dB, t, ldb, &beta, dC, CUDA_R_32F, ldc,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    EXPECT(st == CUBLAS_STATUS_SUCCESS, "gemm: %s", cublasGetStatusString(st));
    float got[6 * 4];
    cudaMemcpy(got, dC, sizeof got, cudaMemcpyDeviceToHost);
    int bad = 0;
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) bad += fabsf(got[i + j * ldc] - want[i + j * ldc]) > 1e-4f;
    EXPECT(bad == 0, "gemm %c%c %s: %d of %d wrong", ta == CUBLAS_OP_N ? 'N' : 'T', tb == CUBLAS_OP_N ? 'N' : 'T',
           t == CUDA_R_32F ? "f32" : "bf16", bad, m * n);
    /* a leading dimension smaller than the rows is rejected */
    st = cublasGemmEx(h, ta, tb, m, n, k, &alpha, dA, t, 1, dB, t, ldb, &beta, dC, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT);
    EXPECT(st == CUBLAS_STATUS_INVALID_VALUE, "lda 1 accepted");
    cublasDestroy(h);
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
}

/* ---- faults ----------------------------------------------------------------------------------- */

__global__ void divergent_barrier_kernel(float *x) {
    if (threadIdx.x < 16) {
        x[threadIdx.x] = 1.0f;
        __syncthreads(); /* the other half has returned: never completes on a GPU */
    }
}

__global__ void exited_lane_kernel(float *x) {
    if (threadIdx.x == 31) return;
    x[threadIdx.x] = __shfl_down_sync(0xffffffffu, 1.0f, 1); /* lane 31 named but gone */
}

template <typename K> static void expect_fault(const char *what, K launch, const char *needle) {
    launch();
    cudaError_t e = cudaDeviceSynchronize();
    const char *msg = cudaGetErrorString(e);
    EXPECT(e == cudaErrorLaunchFailure && strstr(msg, needle), "%s: %s (%s)", what, cudaGetErrorName(e), msg);
    if (e == cudaErrorLaunchFailure && strstr(msg, needle)) fprintf(stderr, "ok   %s: %s\n", what, msg);
    /* sticky, as on a device, until reset */
    EXPECT(cudaGetLastError() == cudaErrorLaunchFailure, "%s: error not sticky", what);
    ckv_emu_reset();
}

static void test_faults() {
    float *d = dev_floats(32);
    expect_fault("divergent __syncthreads",
                 [&] { CKV_LAUNCH(divergent_barrier_kernel, dim3(2), dim3(32), 0, (cudaStream_t)NULL, d); },
                 "__syncthreads reached by 16 of 32 threads");
    d = dev_floats(32);
    expect_fault("shuffle naming an exited lane",
                 [&] { CKV_LAUNCH(exited_lane_kernel, dim3(1), dim3(32), 0, (cudaStream_t)NULL, d); },
                 "names lane 31, which has exited");
    d = dev_floats(32);
    CKV_LAUNCH(block_sum_kernel, dim3(1), dim3(2048), 0, (cudaStream_t)NULL, d);
    EXPECT(cudaGetLastError() == cudaErrorInvalidConfiguration, "2048 threads per block accepted");
    EXPECT(cudaGetLastError() == cudaSuccess, "a configuration error is not sticky");
    float host[4] = {1, 2, 3, 4};
    EXPECT(cudaMemcpy(host, d, 16, cudaMemcpyHostToDevice) == cudaErrorInvalidValue, "host memory taken as device memory");
    EXPECT(cudaMemcpy(d, host, 16, cudaMemcpyDeviceToHost) == cudaErrorInvalidValue, "host memory taken as device memory");
    EXPECT(cudaMemcpy(d + 30, host, 16, cudaMemcpyHostToDevice) == cudaErrorInvalidValue, "a copy past the allocation");
    (void)cudaGetLastError();
    ckv_emu_reset();
}

int main() {
    test_shuffles();
    test_barriers();
    test_dynamic_shared();
    test_mma();
    test_gemm(CUBLAS_OP_N, CUBLAS_OP_N, CUDA_R_32F);
    test_gemm(CUBLAS_OP_T, CUBLAS_OP_N, CUDA_R_16BF);
    test_gemm(CUBLAS_OP_N, CUBLAS_OP_T, CUDA_R_16BF);
    test_gemm(CUBLAS_OP_T, CUBLAS_OP_T, CUDA_R_32F);
    if (!failures) fprintf(stderr, "ok   cuBLAS GEMM: N/T x N/T, f32 and bf16, padded leading dimensions\n");
    test_faults();
    if (failures) {
        fprintf(stderr, "test_cuda_emu: %d check(s) FAILED\n", failures);
        return 1;
    }
    fprintf(stderr, "test_cuda_emu: all checks passed\n");
    return 0;
}
