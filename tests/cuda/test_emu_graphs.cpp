/* test_emu_graphs.cpp - stream capture and graphs of the CPU execution layer, as CUDA has them:
 * a capture records launches, copies, memsets and GEMMs without running them (nothing written,
 * no launch counted); a replay runs them in order with the arguments frozen at capture, while
 * per-replay values staged in page-locked memory and copied on the stream are read at each replay;
 * a host wait during a capture (a stream or device synchronisation, a copy into pageable memory,
 * cudaMalloc, a GEMM whose handle has no workspace) fails with cudaErrorStreamCaptureUnsupported
 * and invalidates the capture, whose end then fails; a stream waiting on an event recorded in the
 * capture joins it, one waiting on an event from outside fails (isolation); the counters count
 * captures and graph launches. Built only for the emulator (label cuda-emu; also under
 * CKV_EMU_CHECK=1). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rt.h"

#include "emu_test.h"

constexpr int N = 128;

/* y[i] = x[i] * scale + *add (add: a per-replay value read from device memory) */
__global__ void axpb_kernel(float *y, const float *x, float scale, const float *add) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i] * scale + add[0];
}

static void fill_host(float *h, float v) {
    for (int i = 0; i < N; i++) h[i] = v + (float)i;
}

/* Captures: memset y, copy the pinned x and add in, y = x * scale + add, copy y to pinned out. */
static cudaGraphExec_t capture_step(cudaStream_t s, float *dx, float *dy, float *dadd, const float *px,
                                    const float *padd, float *pout, float scale) {
    unsigned long long k0 = 0, k1 = 0;
    ckv_emu_launches(&k0, NULL);
    EXPECT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal) == cudaSuccess, "begin capture failed");
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(s, &st);
    EXPECT(st == cudaStreamCaptureStatusActive, "capture status %d, active expected", (int)st);
    cudaMemsetAsync(dy, 0, N * sizeof(float), s);
    cudaMemcpyAsync(dx, px, N * sizeof(float), cudaMemcpyHostToDevice, s);
    cudaMemcpyAsync(dadd, padd, sizeof(float), cudaMemcpyHostToDevice, s);
    CKV_LAUNCH(axpb_kernel, dim3(N / 64), dim3(64), 0, s, dy, (const float *)dx, scale, (const float *)dadd);
    cudaMemcpyAsync(pout, dy, N * sizeof(float), cudaMemcpyDeviceToHost, s);
    cudaGraph_t g = NULL;
    EXPECT(cudaStreamEndCapture(s, &g) == cudaSuccess && g, "end capture failed");
    ckv_emu_launches(&k1, NULL);
    EXPECT(k1 == k0, "a captured launch was counted as launched (%llu launches during the capture)", k1 - k0);
    cudaGraphExec_t exec = NULL;
    EXPECT(cudaGraphInstantiate(&exec, g, 0) == cudaSuccess && exec, "instantiate failed");
    cudaGraphDestroy(g); /* the executable graph outlives its graph */
    return exec;
}

static void test_replay() {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float *dx = dev_floats(N), *dy = dev_floats(N), *dadd = dev_floats(1);
    float *px = NULL, *padd = NULL, *pout = NULL;
    cudaMallocHost((void **)&px, N * sizeof(float));
    cudaMallocHost((void **)&padd, sizeof(float));
    cudaMallocHost((void **)&pout, N * sizeof(float));
    cudaMemset(dy, 0x7f, N * sizeof(float));
    for (int i = 0; i < N; i++) pout[i] = -1.0f;
    fill_host(px, 1.0f);
    padd[0] = 0.5f;

    unsigned long long c0 = 0, l0 = 0, c1 = 0, l1 = 0, k0 = 0, k1 = 0;
    ckv_emu_graph_counts(&c0, &l0);
    float scale = 2.0f;
    cudaGraphExec_t exec = capture_step(s, dx, dy, dadd, px, padd, pout, scale);
    scale = 100.0f; /* frozen at capture: the replay still scales by 2 */
    cudaStreamSynchronize(s);
    float probe = 0.0f;
    cudaMemcpy(&probe, dy, sizeof probe, cudaMemcpyDeviceToHost);
    EXPECT(pout[0] == -1.0f && probe != 0.0f, "the capture ran its work (out[0] %g, y[0] %g)", pout[0], probe);

    ckv_emu_launches(&k0, NULL);
    const unsigned long long w0 = ckv_emu_host_waits();
    int bad = 0;
    float worst = 0.0f;
    for (int step = 0; step < 3; step++) {
        fill_host(px, 10.0f * (float)step); /* the per-step values: written to page-locked memory */
        padd[0] = (float)step + 0.25f;
        EXPECT(cudaGraphLaunch(exec, s) == cudaSuccess, "graph launch %d failed", step);
        EXPECT(cudaStreamSynchronize(s) == cudaSuccess, "replay %d failed", step);
        for (int i = 0; i < N; i++) {
            const float want = (10.0f * (float)step + (float)i) * 2.0f + (float)step + 0.25f;
            const float err = fabsf(pout[i] - want);
            if (err > worst) worst = err;
            if (err != 0.0f && bad++ < 4)
                fprintf(stderr, "  step %d y[%d] = %g, expected %g\n", step, i, pout[i], want);
        }
    }
    ckv_emu_launches(&k1, NULL);
    ckv_emu_graph_counts(&c1, &l1);
    const unsigned long long waits = ckv_emu_host_waits() - w0;
    EXPECT(bad == 0, "%d replayed values wrong, max error %g", bad, worst);
    EXPECT(c1 - c0 == 1 && l1 - l0 == 3, "%llu captures (1 expected), %llu graph launches (3 expected)", c1 - c0,
           l1 - l0);
    EXPECT(k1 == k0, "%llu kernels launched outside the graph during the replays (0 expected)", k1 - k0);
    EXPECT(waits == 3, "%llu host waits for 3 replays (one synchronisation each expected)", waits);
    if (bad == 0 && k1 == k0 && waits == 3)
        fprintf(stderr, "ok   3 replays read their per-step values, keep the captured scale, 1 wait and 0 launches each\n");
    cudaGraphExecDestroy(exec);
    cudaFreeHost(px);
    cudaFreeHost(padd);
    cudaFreeHost(pout);
    cudaFree(dx);
    cudaFree(dy);
    cudaFree(dadd);
    cudaStreamDestroy(s);
    EXPECT(cudaGetLastError() == cudaSuccess, "the replay test left an error");
}

/* Begins a capture on s, queues a launch, then `host_wait`: the wait must be refused and the end fail. */
static void expect_refused(const char *what, cudaError_t (*host_wait)(cudaStream_t, float *)) {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float *x = dev_floats(N);
    cudaMemset(x, 0, N * sizeof(float));
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    CKV_LAUNCH(axpb_kernel, dim3(N / 64), dim3(64), 0, s, x, (const float *)x, 1.0f, (const float *)x);
    const cudaError_t e = host_wait(s, x);
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    cudaStreamIsCapturing(s, &st);
    cudaGraph_t g = NULL;
    const cudaError_t end = cudaStreamEndCapture(s, &g);
    EXPECT(e == cudaErrorStreamCaptureUnsupported, "%s during a capture returned %s, not cudaErrorStreamCaptureUnsupported",
           what, cudaGetErrorName(e));
    EXPECT(st == cudaStreamCaptureStatusInvalidated, "%s left the capture status %d, not invalidated", what, (int)st);
    EXPECT(end == cudaErrorStreamCaptureInvalidated && !g, "the capture's end after %s returned %s", what,
           cudaGetErrorName(end));
    if (e == cudaErrorStreamCaptureUnsupported && end == cudaErrorStreamCaptureInvalidated)
        fprintf(stderr, "ok   %s during a capture is refused and invalidates it\n", what);
    cudaGetLastError(); /* the refused call's error */
    cudaStreamDestroy(s);
    cudaFree(x);
}

static cudaError_t wait_stream(cudaStream_t s, float *) { return cudaStreamSynchronize(s); }
static cudaError_t wait_device(cudaStream_t, float *) { return cudaDeviceSynchronize(); }
static cudaError_t wait_download(cudaStream_t s, float *x) {
    float h[N];
    return cudaMemcpyAsync(h, x, sizeof h, cudaMemcpyDeviceToHost, s); /* pageable: a host wait */
}
static cudaError_t wait_malloc(cudaStream_t, float *) {
    void *p = NULL;
    return cudaMalloc(&p, 64);
}
static cudaError_t wait_sync_copy(cudaStream_t, float *x) { return cudaMemset(x, 0, 4); }

static void test_refusals() {
    expect_refused("cudaStreamSynchronize", wait_stream);
    expect_refused("cudaDeviceSynchronize", wait_device);
    expect_refused("a copy into pageable memory", wait_download);
    expect_refused("cudaMalloc", wait_malloc);
    expect_refused("cudaMemset", wait_sync_copy);
}

/* cuBLAS in a capture: refused without a workspace; with one, the replay computes the product. */
static void test_gemm() {
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    cublasHandle_t h;
    cublasCreate(&h);
    cublasSetStream(h, s);
    float *A = dev_floats(4), *B = dev_floats(4), *C = dev_floats(4), *ws = dev_floats(64);
    const float ha[4] = {1, 2, 3, 4}, hb[4] = {1, 0, 0, 1}, one = 1.0f, zero = 0.0f;
    cudaMemcpy(A, ha, sizeof ha, cudaMemcpyHostToDevice);
    cudaMemcpy(B, hb, sizeof hb, cudaMemcpyHostToDevice);
    cudaGraph_t g = NULL;
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    const cublasStatus_t no_ws = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, A, CUDA_R_32F, 2, B, CUDA_R_32F,
                                              2, &zero, C, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    const cudaError_t end = cudaStreamEndCapture(s, &g);
    EXPECT(no_ws == CUBLAS_STATUS_NOT_SUPPORTED && end == cudaErrorStreamCaptureInvalidated,
           "a GEMM captured without a workspace: %s, end %s", cublasGetStatusString(no_ws), cudaGetErrorName(end));

    cublasSetWorkspace(h, ws, 64 * sizeof(float));
    unsigned long long g0 = 0, g1 = 0;
    ckv_emu_launches(NULL, &g0);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
    const cublasStatus_t with_ws = cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, A, CUDA_R_32F, 2, B,
                                                CUDA_R_32F, 2, &zero, C, CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                                                CUBLAS_GEMM_DEFAULT);
    EXPECT(cudaStreamEndCapture(s, &g) == cudaSuccess && g && with_ws == CUBLAS_STATUS_SUCCESS,
           "a GEMM captured with a workspace failed: %s", cublasGetStatusString(with_ws));
    ckv_emu_launches(NULL, &g1);
    cudaGraphExec_t exec = NULL;
    if (g) cudaGraphInstantiate(&exec, g, 0);
    float hc[4] = {0, 0, 0, 0};
    if (exec) cudaGraphLaunch(exec, s);
    cudaMemcpyAsync(hc, C, sizeof hc, cudaMemcpyDeviceToHost, s);
    EXPECT(hc[0] == 1 && hc[1] == 2 && hc[2] == 3 && hc[3] == 4 && g1 == g0,
           "replayed GEMM gave %g %g %g %g (1 2 3 4 expected), %llu GEMMs counted at capture", hc[0], hc[1], hc[2],
           hc[3], g1 - g0);
    if (no_ws == CUBLAS_STATUS_NOT_SUPPORTED && hc[3] == 4)
        fprintf(stderr, "ok   a GEMM needs cublasSetWorkspace to be captured, and replays with it\n");
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    cublasDestroy(h);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaFree(ws);
    cudaStreamDestroy(s);
    cudaGetLastError();
}

/* Fork and join through events: b joins the capture of a; waiting on an event from outside fails. */
static void test_fork_join() {
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaEvent_t fork, join, outside;
    cudaEventCreateWithFlags(&fork, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&join, cudaEventDisableTiming);
    cudaEventCreateWithFlags(&outside, cudaEventDisableTiming);
    float *x = dev_floats(N), *y = dev_floats(N), *one = dev_floats(1), *zero = dev_floats(1);
    const float hone = 1.0f, hzero = 0.0f;
    cudaMemcpy(one, &hone, sizeof hone, cudaMemcpyHostToDevice);
    cudaMemcpy(zero, &hzero, sizeof hzero, cudaMemcpyHostToDevice);
    cudaMemset(x, 0, N * sizeof(float));
    cudaEventRecord(outside, a);
    cudaStreamSynchronize(a);

    cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal);
    CKV_LAUNCH(axpb_kernel, dim3(N / 64), dim3(64), 0, a, x, (const float *)x, 0.0f, (const float *)one); /* x = 1 */
    cudaEventRecord(fork, a);
    cudaStreamWaitEvent(b, fork, 0);
    CKV_LAUNCH(axpb_kernel, dim3(N / 64), dim3(64), 0, b, y, (const float *)x, 3.0f, (const float *)zero); /* y = 3x */
    cudaEventRecord(join, b);
    cudaStreamWaitEvent(a, join, 0);
    cudaGraph_t g = NULL;
    const cudaError_t end = cudaStreamEndCapture(a, &g);
    cudaGraphExec_t exec = NULL;
    if (g) cudaGraphInstantiate(&exec, g, 0);
    if (exec) cudaGraphLaunch(exec, a);
    float hy[N];
    hy[0] = 0.0f;
    cudaMemcpyAsync(hy, y, sizeof hy, cudaMemcpyDeviceToHost, a);
    EXPECT(end == cudaSuccess && hy[0] == 3.0f, "fork/join capture: end %s, y[0] %g (3 expected)",
           cudaGetErrorName(end), hy[0]);

    cudaStreamBeginCapture(a, cudaStreamCaptureModeGlobal);
    const cudaError_t iso = cudaStreamWaitEvent(a, outside, 0);
    cudaGraph_t g2 = NULL;
    const cudaError_t end2 = cudaStreamEndCapture(a, &g2);
    EXPECT(iso == cudaErrorStreamCaptureIsolation && end2 == cudaErrorStreamCaptureInvalidated,
           "a wait on an event from outside the capture: %s, end %s", cudaGetErrorName(iso), cudaGetErrorName(end2));
    if (end == cudaSuccess && hy[0] == 3.0f && iso == cudaErrorStreamCaptureIsolation)
        fprintf(stderr, "ok   a stream waiting on a captured event joins the capture; an outside event is refused\n");
    cudaGetLastError();
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(g);
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaEventDestroy(outside);
    cudaFree(x);
    cudaFree(y);
    cudaFree(one);
    cudaFree(zero);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
}

int main() {
    test_replay();
    test_refusals();
    test_gemm();
    test_fork_join();
    return emu_test_finish("test_emu_graphs");
}
