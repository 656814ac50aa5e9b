/* test_emu_streams.cpp - asynchronous streams, events and per-thread devices of the CPU execution
 * layer, as a GPU has them: work queued on a stream runs only when the host forces it, so a
 * consumer on another stream without cudaStreamWaitEvent, or a synchronous copy of a non-blocking
 * stream's result before a sync, reads stale data here as on a GPU (and the correct programs read
 * the right data); the legacy stream orders blocking streams; cudaSetDevice is per host thread; a
 * launch on a stream of another device than the current one fails; the devices report 132 SMs
 * (an H200). Then the CUDA backend on device 1 driven from a thread whose current device is 0
 * (as the server's engine thread drives it): every op must still run on device 1. Last, backend
 * ops give identical bytes under the forward, reverse and random schedules. Built only for the
 * emulator (label cuda-emu). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "cuda_rt.h"

extern "C" {
#include "backend/cuda/cuda_emu.h"
#include "core/status.h"
}

#include "emu_test.h"

constexpr int N = 256;

__global__ void fill_kernel(float *x, float v) { x[blockIdx.x * blockDim.x + threadIdx.x] = v; }
__global__ void copy_kernel(float *y, const float *x) {
    const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    y[i] = x[i] + 1.0f;
}

static float *dev_floats() {
    void *p = NULL;
    if (cudaMalloc(&p, N * sizeof(float)) != cudaSuccess) abort();
    if (cudaMemset(p, 0, N * sizeof(float)) != cudaSuccess) abort();
    return (float *)p;
}

/* x filled with 41 on stream a, y = x + 1 on stream b (after a's event if wait_event): y[0] as the
 * host reads it from stream b. */
static float produce_consume(bool wait_event) {
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaEvent_t ev;
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    float *x = dev_floats(), *y = dev_floats();
    cudaDeviceSynchronize();
    CKV_LAUNCH(fill_kernel, dim3(N / 64), dim3(64), 0, a, x, 41.0f);
    cudaEventRecord(ev, a);
    if (wait_event) cudaStreamWaitEvent(b, ev, 0);
    CKV_LAUNCH(copy_kernel, dim3(N / 64), dim3(64), 0, b, y, (const float *)x);
    float host[N];
    cudaMemcpyAsync(host, y, sizeof host, cudaMemcpyDeviceToHost, b); /* pageable: returns when done */
    cudaDeviceSynchronize();
    cudaEventDestroy(ev);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaFree(x);
    cudaFree(y);
    return host[0];
}

static void test_stream_order() {
    const float missing = produce_consume(false), right = produce_consume(true);
    EXPECT(missing == 1.0f, "without cudaStreamWaitEvent the consumer read %g (the producer's 41 not yet written: 1 expected)", missing);
    EXPECT(right == 42.0f, "with cudaStreamWaitEvent the consumer read %g, expected 42", right);
    if (missing == 1.0f && right == 42.0f)
        fprintf(stderr, "ok   a missing cudaStreamWaitEvent reads stale data (%g), the wait gives %g\n", missing, right);

    /* a synchronous copy on the legacy stream does not wait for a non-blocking stream */
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float *x = dev_floats();
    cudaDeviceSynchronize();
    CKV_LAUNCH(fill_kernel, dim3(N / 64), dim3(64), 0, s, x, 7.0f);
    float early[N], late[N];
    cudaMemcpy(early, x, sizeof early, cudaMemcpyDeviceToHost);
    cudaStreamSynchronize(s);
    cudaMemcpy(late, x, sizeof late, cudaMemcpyDeviceToHost);
    EXPECT(early[0] == 0.0f && late[0] == 7.0f, "host read before the sync: %g (0 expected), after: %g (7 expected)",
           early[0], late[0]);
    if (early[0] == 0.0f && late[0] == 7.0f)
        fprintf(stderr, "ok   a host read before cudaStreamSynchronize sees the old data, after it the new\n");

    /* a blocking stream and the legacy stream are ordered both ways */
    cudaStream_t blk;
    cudaStreamCreateWithFlags(&blk, cudaStreamDefault);
    CKV_LAUNCH(fill_kernel, dim3(N / 64), dim3(64), 0, blk, x, 9.0f);
    cudaMemcpy(early, x, sizeof early, cudaMemcpyDeviceToHost);
    EXPECT(early[0] == 9.0f, "the legacy stream did not wait for a blocking stream: %g", early[0]);
    cudaStreamDestroy(blk);
    cudaStreamDestroy(s);
    cudaFree(x);
    EXPECT(cudaGetLastError() == cudaSuccess, "stream tests left an error");
}

/* ---- devices per host thread ------------------------------------------------------------------- */

struct thread_arg {
    int set, got, sms;
    cudaError_t launch;
};

static void *device_thread(void *p) {
    thread_arg *a = (thread_arg *)p;
    if (a->set >= 0) cudaSetDevice(a->set);
    cudaGetDevice(&a->got);
    cudaDeviceGetAttribute(&a->sms, cudaDevAttrMultiProcessorCount, a->got);
    return NULL;
}

static void test_devices() {
    ckv_emu_set_devices(2, 9, 0);
    cudaSetDevice(1);
    cudaStream_t s1;
    cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking);
    thread_arg other = {-1, -1, 0, cudaSuccess}, set0 = {0, -1, 0, cudaSuccess};
    pthread_t t;
    pthread_create(&t, NULL, device_thread, &other);
    pthread_join(t, NULL);
    pthread_create(&t, NULL, device_thread, &set0);
    pthread_join(t, NULL);
    int mine = -1;
    cudaGetDevice(&mine);
    EXPECT(mine == 1 && other.got == 0 && set0.got == 0,
           "current device: this thread %d (1 expected), a new thread %d (0), a thread that chose 0: %d", mine,
           other.got, set0.got);
    EXPECT(other.sms == 132, "%d SMs, 132 expected (an H200)", other.sms);
    /* a launch on device 1's stream while device 0 is current fails, as in CUDA */
    float *x = NULL;
    cudaMalloc((void **)&x, N * sizeof(float));
    cudaSetDevice(0);
    CKV_LAUNCH(fill_kernel, dim3(N / 64), dim3(64), 0, s1, x, 1.0f);
    EXPECT(cudaGetLastError() == cudaErrorInvalidResourceHandle, "a launch on another device's stream was accepted");
    cudaSetDevice(1);
    cudaStreamDestroy(s1);
    cudaFree(x);
    if (!failures)
        fprintf(stderr, "ok   cudaSetDevice per host thread, %d SMs, launches on another device's stream refused\n",
                other.sms);
    cudaSetDevice(0);
}

/* ---- the backend on device 1, used from another thread ------------------------------------------ */

struct backend_arg {
    ckv_backend *be;
    float *x;
    ckv_status st;
    float got[8];
    char msg[512];
};

static void *backend_thread(void *p) {
    backend_arg *a = (backend_arg *)p;
    const float y[8] = {1, 2, 3, 4, 5, 6, 7, 8}, x0[8] = {10, 20, 30, 40, 50, 60, 70, 80};
    float *dy = NULL;
    a->st = a->be->ops->alloc(a->be, (void **)&dy, sizeof y, "y");
    if (a->st == CKV_STATUS_OK) a->st = a->be->ops->upload(a->be, a->x, x0, sizeof x0);
    if (a->st == CKV_STATUS_OK) a->st = a->be->ops->upload(a->be, dy, y, sizeof y);
    if (a->st == CKV_STATUS_OK) a->be->ops->add(a->be, a->x, dy, 8);
    if (a->st == CKV_STATUS_OK) a->st = a->be->ops->sync(a->be);
    if (a->st == CKV_STATUS_OK) a->st = a->be->ops->download(a->be, a->got, a->x, sizeof a->got);
    if (a->st != CKV_STATUS_OK) snprintf(a->msg, sizeof a->msg, "%s", ckv_error_message());
    a->be->ops->release(a->be, dy);
    return NULL;
}

static void test_backend_other_thread() {
    ckv_cuda_emu_set_devices(2, 9, 0);
    ckv_backend *be = NULL;
    ckv_status st = ckv_backend_cuda_emu_init(&be, 1);
    EXPECT(st == CKV_STATUS_OK, "cuda-emu backend on device 1: %s", ckv_error_message());
    if (st != CKV_STATUS_OK) return;
    backend_arg a = {be, NULL, CKV_STATUS_OK, {0}, ""};
    st = be->ops->alloc(be, (void **)&a.x, 8 * sizeof(float), "x");
    EXPECT(st == CKV_STATUS_OK, "alloc: %s", ckv_error_message());
    cudaSetDevice(0); /* as a thread that never chose the device */
    pthread_t t;
    pthread_create(&t, NULL, backend_thread, &a);
    pthread_join(t, NULL);
    EXPECT(a.st == CKV_STATUS_OK, "ops from a thread whose current device is 0 failed: %s", a.msg);
    int bad = 0;
    for (int i = 0; i < 8; i++) bad += a.got[i] != (float)(11 * (i + 1));
    EXPECT(a.st != CKV_STATUS_OK || bad == 0, "x + y on device 1 from another thread: %d wrong (x[0] = %g, 11 expected)",
           bad, a.got[0]);
    if (a.st == CKV_STATUS_OK && bad == 0)
        fprintf(stderr, "ok   the backend on device 1 runs its ops there from a thread whose current device is 0\n");
    be->ops->release(be, a.x);
    be->ops->free(be);
    ckv_cuda_emu_reset();
    ckv_cuda_emu_set_devices(1, 9, 0);
}

/* ---- results identical under every schedule ------------------------------------------------------ */

/* rmsnorm (block reductions over shuffles and __shared__), softmax_add (one block), evict_max
 * (a grid-stride reduction) and evict_topk (per-row selection with ties) of fixed inputs, as bytes. */
static std::vector<unsigned char> run_ops(ckv_backend *be) {
    constexpr int ROWS = 3, DIM = 300;
    std::vector<float> x(ROWS * DIM), w(DIM);
    uint32_t r = 12345;
    for (float &v : x) r = r * 1664525u + 1013904223u, v = (float)(r >> 8) / 16777216.0f - 0.5f;
    for (int i = 0; i < DIM; i++) w[i] = 1.0f + 0.01f * (float)(i % 7);
    for (int i = 0; i < DIM; i += 10) x[DIM + i] = 0.25f; /* ties in row 1 */
    const int32_t k[ROWS] = {17, 40, 299};
    float *dx = NULL, *dw = NULL, *dout = NULL, *dsm = NULL, *dmax = NULL;
    int32_t *dk = NULL, *didx = NULL;
    std::vector<unsigned char> out;
    if (be->ops->alloc(be, (void **)&dx, x.size() * 4, "x") || be->ops->alloc(be, (void **)&dw, w.size() * 4, "w") ||
        be->ops->alloc(be, (void **)&dout, x.size() * 4, "out") || be->ops->alloc(be, (void **)&dsm, DIM * 4, "sm") ||
        be->ops->alloc(be, (void **)&dmax, 4, "max") || be->ops->alloc(be, (void **)&dk, sizeof k, "k") ||
        be->ops->alloc(be, (void **)&didx, ROWS * DIM * 4, "idx"))
        return out;
    be->ops->upload(be, dx, x.data(), x.size() * 4);
    be->ops->upload(be, dw, w.data(), w.size() * 4);
    be->ops->upload(be, dk, k, sizeof k);
    be->ops->upload(be, dsm, x.data(), DIM * 4);
    be->ops->rmsnorm(be, dout, dx, dw, ROWS, DIM, 1e-6f);
    be->ops->evict_softmax_add(be, dsm, dx + DIM, DIM);
    be->ops->evict_max(be, dmax, dx, ROWS, DIM, 3, DIM - 5);
    ckv_status st = be->ops->evict_topk(be, didx, DIM, dx, DIM, ROWS, DIM, dk);
    if (st == CKV_STATUS_OK) st = be->ops->sync(be);
    std::vector<float> o(x.size() + DIM + 1);
    std::vector<int32_t> idx(ROWS * DIM, -1);
    if (st == CKV_STATUS_OK) {
        be->ops->download(be, o.data(), dout, x.size() * 4);
        be->ops->download(be, o.data() + x.size(), dsm, DIM * 4);
        be->ops->download(be, o.data() + x.size() + DIM, dmax, 4);
        for (int row = 0; row < ROWS; row++)
            be->ops->download(be, idx.data() + row * DIM, didx + row * DIM, (size_t)k[row] * 4);
        out.resize(o.size() * 4 + idx.size() * 4);
        memcpy(out.data(), o.data(), o.size() * 4);
        memcpy(out.data() + o.size() * 4, idx.data(), idx.size() * 4);
    } else {
        fprintf(stderr, "  ops failed: %s\n", ckv_error_message());
    }
    for (void *p : {(void *)dx, (void *)dw, (void *)dout, (void *)dsm, (void *)dmax, (void *)dk, (void *)didx})
        be->ops->release(be, p);
    return out;
}

static void test_schedules() {
    ckv_backend *be = NULL;
    ckv_status st = ckv_backend_cuda_emu_init(&be, 0);
    EXPECT(st == CKV_STATUS_OK, "cuda-emu backend: %s", ckv_error_message());
    if (st != CKV_STATUS_OK) return;
    const char *schedules[] = {"forward", "reverse", "random:7", "random:12345"};
    std::vector<unsigned char> first;
    int same = 0;
    for (const char *sch : schedules) {
        EXPECT(ckv_emu_set_schedule(sch) == 0, "schedule %s refused", sch);
        std::vector<unsigned char> got = run_ops(be);
        EXPECT(!got.empty(), "schedule %s: the ops failed", sch);
        if (first.empty()) first = got;
        else if (got == first) same++;
        else {
            size_t i = 0;
            while (i < got.size() && got[i] == first[i]) i++;
            EXPECT(false, "schedule %s: results differ from forward's, first at byte %zu of %zu", sch, i, got.size());
        }
    }
    EXPECT(ckv_emu_set_schedule("sideways") == -1, "a bad schedule was accepted");
    ckv_emu_set_schedule("forward");
    if (same == 3) fprintf(stderr, "ok   rmsnorm, softmax, max, top-k: identical bytes under forward, reverse and 2 random schedules\n");
    be->ops->free(be);
    ckv_cuda_emu_reset();
}

int main() {
    test_stream_order();
    test_devices();
    test_backend_other_thread();
    test_schedules();
    if (failures) {
        fprintf(stderr, "test_emu_streams: %d check(s) FAILED\n", failures);
        return 1;
    }
    fprintf(stderr, "test_emu_streams: all checks passed\n");
    return 0;
}
