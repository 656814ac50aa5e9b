/* ckv_emu.h - ckv's CPU execution layer for its CUDA sources: exactly the CUDA runtime, device and
 * cuBLAS constructs that the kernels of src/backend/cuda use, implemented on the host so that the
 * same .cu files compile with the host C++ compiler (CKV_CUDA_EMU defined) and run in CI without a
 * GPU, and a compute-sanitizer for them (docs/architecture.md, "The CPU execution layer"). A block
 * runs as one cooperatively scheduled fiber per thread; every collective (__syncthreads,
 * __syncwarp, shuffles, the mma wrapper) is a rendezvous: a fiber runs until it reaches one and
 * waits there until every thread the collective names has arrived, which is a legal schedule of
 * independent thread scheduling (docs/gpu.md, section 2). Threads between two collectives run in
 * the order CKV_EMU_SCHEDULE names (forward, reverse, random:SEED), blocks too. A barrier that can
 * never complete is a launch failure, never a hang. Work queued on a stream (launches,
 * asynchronous copies and memsets, GEMMs, event records and waits) runs on the layer's device
 * thread when the host forces it (a stream, event or device synchronisation, a copy to pageable
 * host memory, a free), not at the call, so a missing cudaStreamWaitEvent gives wrong data as on a
 * GPU. Device memory is host memory in exact-sized allocations between red zones; the current
 * device is per host thread. CKV_EMU_CHECK=1 turns on the checks: racecheck, memcheck and
 * initcheck on every load and store of kernel code built with the CKV_EMU_INSTRUMENT CMake option
 * (the accesses reach the layer through the ThreadSanitizer call ABI, see emu_check.cpp), and
 * without it the pointer arguments of every launch, red-zone canaries and poisoned memory; a
 * finding is a failed launch naming the kernel, the address, the block and the thread. cuBLAS
 * GEMM is a plain CPU GEMM with fp32 products summed in double. It models no timing and no memory
 * hierarchy. Everything lives in namespace ckv_emu, so it never clashes with the real CUDA runtime
 * linked into the same program. Included only through cuda/cuda_rt.h. */
#ifndef CKV_EMU_H
#define CKV_EMU_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <type_traits>

namespace ckv_emu {

/* ---- types of the runtime API ------------------------------------------------------------------ */

struct uint3 {
    unsigned x, y, z;
};
struct float2 {
    float x, y;
};
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
/* The read-only global load: a plain load here, of the 16-byte types as one 16-byte access (the
 * host compiler would split a struct copy into its members; the GPU makes it one LDG.E.128). */
typedef unsigned ckv_emu_v16 __attribute__((vector_size(16), may_alias));
template <typename T> static inline T __ldg(const T *p) {
    if constexpr (sizeof(T) == 16 && alignof(T) == 16) {
        union {
            ckv_emu_v16 v;
            T t;
        } u;
        u.v = *(const ckv_emu_v16 *)p;
        return u.t;
    } else {
        return *p;
    }
}
struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

enum cudaError_t {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorInvalidDevice = 101,
    cudaErrorNoDevice = 100,
    cudaErrorInvalidResourceHandle = 400,
    cudaErrorIllegalState = 401,
    cudaErrorNotReady = 600,
    cudaErrorIllegalAddress = 700,
    cudaErrorLaunchFailure = 719,
    cudaErrorStreamCaptureUnsupported = 900,
    cudaErrorStreamCaptureInvalidated = 901,
    cudaErrorStreamCaptureUnmatched = 903,
    cudaErrorStreamCaptureIsolation = 905,
};
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};
enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaFuncAttribute {
    cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
};
struct ckv_emu_stream;
typedef ckv_emu_stream *cudaStream_t;
struct ckv_emu_event;
typedef ckv_emu_event *cudaEvent_t;
#define cudaStreamDefault 0x00
#define cudaStreamNonBlocking 0x01
#define cudaEventDefault 0x00
#define cudaEventDisableTiming 0x02

cudaError_t cudaGetDeviceCount(int *count);
cudaError_t cudaSetDevice(int device); /* per host thread, as in CUDA */
cudaError_t cudaGetDevice(int *device);
/* The emulated GPUs live in each process's host memory: every one (of every rank) names the same
 * pretend bus, so device communicators over them take the staged path, never NCCL. */
cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes);
cudaError_t cudaMalloc(void **ptr, size_t bytes);
cudaError_t cudaFree(void *ptr);
/* Page-locked host memory: a copy from it reads it when the copy runs (not at the call), a copy into
 * it does not wait, as in CUDA; so a host write before the copy ran is a bug the results show. */
cudaError_t cudaMallocHost(void **ptr, size_t bytes);
cudaError_t cudaFreeHost(void *ptr);
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s);
cudaError_t cudaMemset(void *dst, int value, size_t bytes);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags);
cudaError_t cudaStreamDestroy(cudaStream_t s);
cudaError_t cudaStreamSynchronize(cudaStream_t s);
cudaError_t cudaStreamQuery(cudaStream_t s); /* runs the stream's work (a polling host loop ends) */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags);
cudaError_t cudaEventCreate(cudaEvent_t *e);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t e);
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s);
cudaError_t cudaEventSynchronize(cudaEvent_t e);
cudaError_t cudaEventQuery(cudaEvent_t e); /* runs the work before the event */
cudaError_t cudaDeviceSynchronize(void);
cudaError_t cudaGetLastError(void);
cudaError_t cudaPeekAtLastError(void);
const char *cudaGetErrorString(cudaError_t e); /* for a launch failure: the emulator's own message */
const char *cudaGetErrorName(cudaError_t e);

/* Stream capture and graphs (emu_graph.cpp; docs/gpu.md §7): between cudaStreamBeginCapture and
 * cudaStreamEndCapture the launches, copies, memsets, GEMMs and event records queued on the stream
 * (and on streams that joined it by waiting on an event recorded inside the capture) are recorded
 * with their arguments instead of run; cudaGraphLaunch queues them, in capture order, as one piece
 * of work. While any capture is open a call that would make the host wait (a synchronisation,
 * a synchronous or pageable copy, cudaMalloc, cudaFree and their host forms) fails with
 * cudaErrorStreamCaptureUnsupported and invalidates the capture, whose end then fails with
 * cudaErrorStreamCaptureInvalidated, as in CUDA's global capture mode. */
struct ckv_emu_graph;
typedef ckv_emu_graph *cudaGraph_t;
struct ckv_emu_graph_exec;
typedef ckv_emu_graph_exec *cudaGraphExec_t;
enum cudaStreamCaptureMode {
    cudaStreamCaptureModeGlobal = 0,
    cudaStreamCaptureModeThreadLocal = 1,
    cudaStreamCaptureModeRelaxed = 2,
};
enum cudaStreamCaptureStatus {
    cudaStreamCaptureStatusNone = 0,
    cudaStreamCaptureStatusActive = 1,
    cudaStreamCaptureStatusInvalidated = 2,
};
cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode); /* the global mode only */
cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *graph);
cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus *status);
cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags); /* CUDA 12 */
cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s);
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec);
cudaError_t cudaGraphDestroy(cudaGraph_t graph);

/* ---- bf16 ------------------------------------------------------------------------------------- */

struct __nv_bfloat16 {
    uint16_t x; /* the bits */
};
/* Round to nearest even; NaN stays a (quiet) NaN. */
static inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    __nv_bfloat16 h;
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        h.x = (uint16_t)((u >> 16) | 0x40u);
    } else {
        h.x = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return h;
}
static inline float __bfloat162float(__nv_bfloat16 h) {
    uint32_t u = (uint32_t)h.x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- device math the kernels call ------------------------------------------------------------- */

static inline uint32_t __float_as_uint(float f);
#if defined(CKV_EMU_DEVICE_MATH)
/* The device maths modelled (CMake CKV_EMU_DEVICE_MATH; docs/gpu.md, "Device maths"): the kernel
 * translation units are built with -ffp-contract=fast -mfma, so a*b+c contracts to one FMA as nvcc
 * contracts it by default (--fmad=true); the device's expf, rsqrtf and the fast intrinsics are within
 * 2 ulp of the exact result where the host's libm is within 1, and their exact bits are not public,
 * so each returns the host's result moved by a deterministic -2..+2 ulp chosen by a hash of its
 * input (exact results such as expf(0) = 1, 0 and infinities kept): whatever a comparison of the
 * device with the CPU backend decides must hold for any implementation within the documented error.
 * __expf is ex2.approx of x * log2(e) with the product rounded to fp32; __fdividef(a, b) is
 * a * (1 / b) (an approximate reciprocal, then a multiply). */
static inline float ckv_emu_device_ulps(float r, float x) {
    if (x == 0.0f || !(r > 0.0f) || r == INFINITY) return r;
    uint32_t u;
    memcpy(&u, &r, sizeof u);
    const int d = (int)((__float_as_uint(x) * 0x9E3779B1u) >> 29) % 5 - 2; /* -2 .. 2 */
    if (u <= 2u || u >= 0x7f7ffffdu) return r;
    u = (uint32_t)((int64_t)u + d);
    memcpy(&r, &u, sizeof r);
    return r;
}
static inline float ckv_emu_expf(float x) { return ckv_emu_device_ulps(::expf(x), x); }
static inline float ckv_emu_exp2f(float x) { return ckv_emu_device_ulps(::exp2f(x), x); }
static inline float rsqrtf(float x) { return ckv_emu_device_ulps(1.0f / sqrtf(x), x); }
static inline float __expf(float x) { return ckv_emu_device_ulps(::exp2f(x * 1.44269504088896341f), x); }
static inline float __fdividef(float a, float b) { return a * ckv_emu_device_ulps(1.0f / b, b); }
#else
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static inline float __expf(float x) { return expf(x); }
static inline float __fdividef(float a, float b) { return a / b; }
#endif
static inline uint32_t __float_as_uint(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}
static inline float __uint_as_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---- the execution model ---------------------------------------------------------------------- */

/* What a fiber sees as its CUDA built-in variables. */
struct ckv_emu_thread {
    uint3 thread_idx, block_idx;
    dim3 block_dim, grid_dim;
};
const ckv_emu_thread *ckv_emu_self(void);

/* A warp collective: every lane of `mask` calls it with the same `fn` and its own `data`; once all
 * have arrived, fn(data of lanes 0..31 (NULL where absent), mask) runs once and they continue. */
typedef void (*ckv_emu_warp_fn)(void *lanes[32], unsigned mask);
void ckv_emu_warp_collective(ckv_emu_warp_fn fn, void *data, unsigned mask);
void ckv_emu_syncthreads(void);
unsigned ckv_emu_lane(void);

/* Queues a launch on stream s (the launch of CKV_LAUNCH): `tramp(args)` runs one thread's kernel
 * call; `args` (args_bytes, freed by `destroy`) holds the kernel and its parameters; `ptrs` are the
 * pointer parameters, checked against live device memory when the launch runs. A bad configuration
 * sets cudaErrorInvalidConfiguration; a fault of the kernel (a collective that cannot complete, a
 * finding of the checks) is cudaErrorLaunchFailure or cudaErrorIllegalAddress, sticky as on a
 * device and surfaced by the next synchronising call. */
void ckv_emu_submit(const char *kernel, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                    void (*tramp)(void *), void *args, size_t args_bytes, void (*destroy)(void *),
                    const void *const *ptrs, int n_ptrs);
/* cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes): the kernel's
 * opt-in, on the current device, to more than the default 48 KiB of dynamic shared memory per block
 * (at most cudaDevAttrMaxSharedMemoryPerBlockOptin); a launch asking for more than its opt-in is
 * refused (cudaErrorInvalidConfiguration), as on a device. The kernels' dynamic shared memory is
 * static per-block storage here (CKV_SHARED_DYN, cuda_rt.h), so only the launch's size is checked. */
cudaError_t ckv_emu_func_set_attribute(const void *fn, cudaFuncAttribute attr, int value);
template <typename... P> cudaError_t cudaFuncSetAttribute(void (*fn)(P...), cudaFuncAttribute attr, int value) {
    return ckv_emu_func_set_attribute((const void *)fn, attr, value);
}

template <typename K, typename Tuple> struct ckv_emu_args {
    K kernel;
    Tuple params;
};
template <typename A> static void ckv_emu_tramp(void *p) {
    A *a = (A *)p;
    std::apply(a->kernel, a->params);
}
template <typename A> static void ckv_emu_destroy(void *p) { delete (A *)p; }
template <typename T> static inline void ckv_emu_ptr_arg(const T &v, const void **out, int *n) {
    if constexpr (std::is_pointer<T>::value) out[(*n)++] = (const void *)v;
    else (void)v, (void)out, (void)n;
}

template <typename... P, typename... A>
void ckv_emu_launch(const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t s, void (*kernel)(P...),
                    A &&...args) {
    typedef std::tuple<typename std::decay<P>::type...> tuple_t;
    typedef ckv_emu_args<void (*)(P...), tuple_t> args_t;
    args_t *a = new args_t{kernel, tuple_t(std::forward<A>(args)...)};
    const void *ptrs[sizeof...(P) + 1];
    int n = 0;
    std::apply([&](const auto &...v) { (ckv_emu_ptr_arg(v, ptrs, &n), ...); }, a->params);
    ckv_emu_submit(name, (const void *)kernel, grid, block, smem, s, ckv_emu_tramp<args_t>, a, sizeof *a,
                   ckv_emu_destroy<args_t>, ptrs, n);
}

/* ---- warp shuffles (docs/gpu.md §2): 4-byte types ----------------------------------------------- */

enum ckv_emu_shfl_kind { CKV_EMU_SHFL_IDX, CKV_EMU_SHFL_UP, CKV_EMU_SHFL_DOWN, CKV_EMU_SHFL_XOR };
struct ckv_emu_shfl_lane {
    uint32_t in, out;
    int kind, arg, width;
};
uint32_t ckv_emu_shfl(unsigned mask, uint32_t v, int kind, int arg, int width);

/* 4-byte values in one shuffle, 8-byte ones in two (as on the device) */
template <typename T>
static inline T ckv_emu_shfl_t(unsigned mask, T v, int kind, int arg, int width) {
    static_assert(sizeof(T) == 4 || sizeof(T) == 8, "ckv_emu: shuffles of 4- and 8-byte types only");
    uint32_t u[sizeof(T) / 4];
    memcpy(u, &v, sizeof(T));
    for (size_t i = 0; i < sizeof(T) / 4; i++) u[i] = ckv_emu_shfl(mask, u[i], kind, arg, width);
    T r;
    memcpy(&r, u, sizeof(T));
    return r;
}
template <typename T> static inline T __shfl_sync(unsigned mask, T v, int src, int width = 32) {
    return ckv_emu_shfl_t(mask, v, CKV_EMU_SHFL_IDX, src, width);
}
template <typename T> static inline T __shfl_up_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return ckv_emu_shfl_t(mask, v, CKV_EMU_SHFL_UP, (int)d, width);
}
template <typename T> static inline T __shfl_down_sync(unsigned mask, T v, unsigned d, int width = 32) {
    return ckv_emu_shfl_t(mask, v, CKV_EMU_SHFL_DOWN, (int)d, width);
}
template <typename T> static inline T __shfl_xor_sync(unsigned mask, T v, int m, int width = 32) {
    return ckv_emu_shfl_t(mask, v, CKV_EMU_SHFL_XOR, m, width);
}
void __syncwarp(unsigned mask = 0xffffffffu);

/* ---- atomics: threads of a launch never interleave inside a call, so a plain update is atomic.
 * Not instrumented (an atomic is no race); the checks see it through ckv_emu_atomic_access. ---- */

void ckv_emu_atomic_access(const void *p, unsigned bytes);
template <typename T> __attribute__((no_sanitize("thread"))) static inline T atomicAdd(T *p, T v) {
    ckv_emu_atomic_access(p, sizeof(T));
    T old = *p;
    *p = old + v;
    return old;
}

/* ---- cuBLAS (GEMM only) ----------------------------------------------------------------------- */

enum cublasStatus_t {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_STATUS_NOT_INITIALIZED = 1,
    CUBLAS_STATUS_INVALID_VALUE = 7,
    CUBLAS_STATUS_NOT_SUPPORTED = 15,
};
enum cublasOperation_t { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 };
enum cudaDataType_t { CUDA_R_32F = 0, CUDA_R_16BF = 14 };
enum cublasComputeType_t { CUBLAS_COMPUTE_32F = 68 };
enum cublasGemmAlgo_t { CUBLAS_GEMM_DEFAULT = -1 };
struct ckv_emu_cublas;
typedef ckv_emu_cublas *cublasHandle_t;

cublasStatus_t cublasCreate(cublasHandle_t *h);
cublasStatus_t cublasDestroy(cublasHandle_t h);
cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes);
/* Column-major C = alpha op(A) op(B) + beta C, A/B/C F32 or BF16, fp32 compute (alpha, beta float). */
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo);
/* The same for batch matrices X_i = X + i * strideX elements (strides >= 0). */
cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                                          int k, const void *alpha, const void *A, cudaDataType_t at, int lda,
                                          long long sa, const void *B, cudaDataType_t bt, int ldb, long long sb,
                                          const void *beta, void *C, cudaDataType_t ct, int ldc, long long sc,
                                          int batch, cublasComputeType_t compute, cublasGemmAlgo_t algo);
const char *cublasGetStatusString(cublasStatus_t s);

/* ---- test hooks (not CUDA): the simulated device and injected faults --------------------------- */

/* count devices of compute capability major.minor (default: 1 device, 9.0, 132 SMs as an H200). */
void ckv_emu_set_devices(int count, int major, int minor);
/* The SM count every device reports (cudaDevAttrMultiProcessorCount; 0: CKV_EMU_SMS, default 132),
 * read by a backend at init: the launch plans that follow it (split-KV decode, the prefill's rows
 * per block) take their other branches on a small device. */
void ckv_emu_set_sms(int sms);
/* The next launch of the kernel named `kernel` (as written in CKV_LAUNCH) fails like an illegal
 * address; NULL cancels. */
void ckv_emu_inject_fault(const char *kernel);
/* Clears the sticky errors, drops queued work and frees every device allocation (cudaDeviceReset). */
void ckv_emu_reset(void);
/* How many cudaMalloc calls have allocated so far (tests: no op allocates once its scratch is reserved). */
unsigned long long ckv_emu_alloc_calls(void);
/* How often the host has waited for device work so far: stream, event and device synchronisations,
 * copies into pageable host memory, synchronous copies and memsets, cudaFree and cudaFreeHost (each
 * drains the device as on a GPU). Tests: the host waits of a decode step. */
unsigned long long ckv_emu_host_waits(void);
/* Kernels launched and cuBLAS GEMM calls queued so far (either may be NULL), outside graphs: a
 * launch or GEMM recorded by a capture, and those a graph launch replays, are not counted. */
void ckv_emu_launches(unsigned long long *kernels, unsigned long long *gemms);
/* Captures ended with a graph, and cudaGraphLaunch calls queued outside a capture, so far (either
 * may be NULL). */
void ckv_emu_graph_counts(unsigned long long *captures, unsigned long long *launches);
/* The thread and block order from now on, as CKV_EMU_SCHEDULE spells it (forward, reverse,
 * random:SEED); -1 (nothing changed) for anything else. */
int ckv_emu_set_schedule(const char *spec);

/* ---- observing kernels (not CUDA) ----------------------------------------------------------------
 * The per-access interface the checks are built on, open to tools such as memory-traffic counters.
 * With the CKV_EMU_INSTRUMENT build every load and store of kernel code (global and __shared__
 * memory; locals on the thread's stack are not reported) reaches `access` before it happens, on
 * the device thread, one emulated thread at a time. The lanes of a warp run one after the other
 * between collectives, so a warp-wide access is the lanes' accesses with equal (launch, block,
 * warp, site, seq): `site` is the instrumented instruction (the same in every lane) and `seq` the
 * thread's count of accesses so far (equal in lanes that took the same path). */
enum ckv_emu_space { CKV_EMU_SPACE_GLOBAL, CKV_EMU_SPACE_SHARED };
enum ckv_emu_access_kind { CKV_EMU_READ, CKV_EMU_WRITE, CKV_EMU_ATOMIC };
struct ckv_emu_access {
    const char *kernel;   /* as written in CKV_LAUNCH */
    uint64_t launch;      /* serial number of the launch in this process */
    uint3 block, thread;  /* blockIdx, threadIdx */
    unsigned warp, lane;  /* linear thread index in the block / 32, % 32 */
    const void *addr;
    unsigned size;        /* bytes: 1, 2, 4, 8 or 16 */
    ckv_emu_access_kind kind;
    ckv_emu_space space;
    uintptr_t site;       /* return address of the instrumentation call in the kernel's code */
    uint64_t seq;         /* accesses this thread made before this one */
};
struct ckv_emu_observer {
    void *user;
    void (*launch_begin)(void *user, const char *kernel, uint64_t launch, dim3 grid, dim3 block);
    void (*launch_end)(void *user, const char *kernel, uint64_t launch);
    void (*access)(void *user, const ckv_emu_access *a);
    /* a completed collective of block `block_linear`: a warp one (fn as passed to
     * ckv_emu_warp_collective, e.g. ckv_mma_16816_fn for an mma; index = the warp) or
     * __syncthreads (fn NULL, index = the number of threads) */
    void (*collective)(void *user, const char *kernel, unsigned block_linear, unsigned index, ckv_emu_warp_fn fn,
                       unsigned mask);
};
/* [p, p + bytes) read or written by kernel code outside the instrumentation (memcpy, memmove and
 * memset in kernels; see the end of this header): checked and observed like the loads and stores
 * it stands for, in pieces of up to 8 bytes. A no-op in host code. */
void ckv_emu_range_access(const void *p, size_t bytes, ckv_emu_access_kind k);
/* The copy and fill behind them, outside the instrumentation (move: overlapping ranges). */
void *ckv_emu_copy(void *d, const void *s, size_t n, int move);
void *ckv_emu_fill(void *d, int c, size_t n);
/* Installs an observer (NULL removes it); it must outlive its use. Any member may be NULL. */
void ckv_emu_observe(const ckv_emu_observer *o);
/* 1 when the kernels were built with the instrumentation (CKV_EMU_INSTRUMENT), so `access` and
 * the racecheck / memcheck / initcheck of every access are available. */
int ckv_emu_instrumented(void);

} // namespace ckv_emu

/* The built-in variables and qualifiers, as the kernels spell them. */
#define threadIdx (::ckv_emu::ckv_emu_self()->thread_idx)
#define blockIdx (::ckv_emu::ckv_emu_self()->block_idx)
#define blockDim (::ckv_emu::ckv_emu_self()->block_dim)
#define gridDim (::ckv_emu::ckv_emu_self()->grid_dim)
#define warpSize 32
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
/* Blocks run one at a time: per-block storage. Each declaration is preceded by a 256-byte gap
 * variable that no kernel names (the compiler lays it out beside the variable): memcheck reports an
 * access there as an index past the end of a __shared__ array (emu_check.cpp). */
#define CKV_EMU_SHARED_GAP_(n) \
    [[maybe_unused]] static thread_local __attribute__((used)) unsigned char ckv_emu_shared_gap_##n[256];
#define CKV_EMU_SHARED_GAP(n) CKV_EMU_SHARED_GAP_(n)
#define __shared__ CKV_EMU_SHARED_GAP(__COUNTER__) static thread_local
#define __syncthreads() ::ckv_emu::ckv_emu_syncthreads()

using namespace ckv_emu; /* the kernels name the runtime unqualified, as with cuda_runtime.h */

/* memcpy, memmove and memset in kernel code, seen by the checks: the compiler expands a call of
 * constant size inline and calls libc otherwise, and neither reaches the instrumentation (GCC only
 * instruments constant copies of up to 16 bytes, as a read and a write range, and no memset). So in
 * the translation units that include this header they report their ranges through
 * ckv_emu_range_access (a no-op outside kernels and with the checks off), then copy. */
static inline void *ckv_emu_memcpy(void *d, const void *s, size_t n) {
    if (__builtin_constant_p(n) && n <= 16) return __builtin_memcpy(d, s, n); /* instrumented as ranges */
    ::ckv_emu::ckv_emu_range_access(s, n, ::ckv_emu::CKV_EMU_READ);
    ::ckv_emu::ckv_emu_range_access(d, n, ::ckv_emu::CKV_EMU_WRITE);
    return ::ckv_emu::ckv_emu_copy(d, s, n, 0);
}
static inline void *ckv_emu_memmove(void *d, const void *s, size_t n) {
    ::ckv_emu::ckv_emu_range_access(s, n, ::ckv_emu::CKV_EMU_READ);
    ::ckv_emu::ckv_emu_range_access(d, n, ::ckv_emu::CKV_EMU_WRITE);
    return ::ckv_emu::ckv_emu_copy(d, s, n, 1);
}
static inline void *ckv_emu_memset(void *d, int c, size_t n) {
    ::ckv_emu::ckv_emu_range_access(d, n, ::ckv_emu::CKV_EMU_WRITE);
    return ::ckv_emu::ckv_emu_fill(d, c, n);
}
#if defined(CKV_EMU_DEVICE_MATH)
#define expf ckv_emu_expf
#define exp2f ckv_emu_exp2f
#endif
#define memcpy ckv_emu_memcpy
#define memmove ckv_emu_memmove
#define memset ckv_emu_memset

#endif
