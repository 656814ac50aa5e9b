/* ckv_emu.cpp - the implementation of ckv_emu.h: the fiber scheduler that runs a launch block by
 * block (one fiber per thread, collectives as rendezvous, deadlocks reported as launch
 * failures), the warp shuffle, device memory as tracked host memory, the error state of the runtime
 * API (a launch failure is sticky, as a kernel fault is on a device) and the CPU GEMM behind
 * cublasGemmEx. The mma fragment arithmetic is not here (cuda/ckv_mma.h). Not thread-safe: one OS
 * thread drives the emulated device at a time. */
#include "ckv_emu.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

namespace ckv_emu {

/* ---- error state ------------------------------------------------------------------------------ */

namespace {

struct device_state {
    int count = 1, major = 9, minor = 0, sms = 4;
    int current = 0;
    cudaError_t sticky = cudaSuccess; /* a fault: every later call reports it */
    cudaError_t last = cudaSuccess;   /* the last non-sticky error (cleared by cudaGetLastError) */
    std::string message;              /* the emulator's words for the sticky error */
    std::string inject;               /* kernel whose next launch faults */
    bool fault_pending = false;       /* an injected fault not yet surfaced by a synchronising call */
    std::map<uintptr_t, size_t> allocs; /* device allocations: base -> bytes */
};

device_state &dev() {
    static device_state d;
    return d;
}

cudaError_t set_last(cudaError_t e) {
    if (e != cudaSuccess && dev().last == cudaSuccess) dev().last = e;
    return e;
}

void fault(cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void fault(cudaError_t e, const char *fmt, ...) {
    device_state &d = dev();
    if (d.sticky != cudaSuccess) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    d.sticky = e;
    d.message = buf;
}

/* What a synchronising call reports: surfaces a pending injected fault first. */
cudaError_t sync_status() {
    device_state &d = dev();
    if (d.fault_pending) {
        d.fault_pending = false;
        d.sticky = cudaErrorIllegalAddress;
    }
    return d.sticky;
}

/* 1 when [p, p + bytes) lies inside one device allocation. */
bool is_device(const void *p, size_t bytes) {
    const std::map<uintptr_t, size_t> &a = dev().allocs;
    uintptr_t u = (uintptr_t)p;
    auto it = a.upper_bound(u);
    if (it == a.begin()) return false;
    --it;
    return u >= it->first && u + bytes <= it->first + it->second && u + bytes >= u;
}

} // namespace

cudaError_t cudaGetDeviceCount(int *count) {
    *count = dev().count;
    return dev().count > 0 ? cudaSuccess : set_last(cudaErrorNoDevice);
}

cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device) {
    if (device < 0 || device >= dev().count) return set_last(cudaErrorInvalidDevice);
    if (len < 1) return set_last(cudaErrorInvalidValue);
    snprintf(id, (size_t)len, "cuda-emu (host memory)");
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    if (dev().count == 0) return set_last(cudaErrorNoDevice);
    if (device < 0 || device >= dev().count) return set_last(cudaErrorInvalidDevice);
    dev().current = device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
    if (device < 0 || device >= dev().count) return set_last(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = dev().sms; break;
    case cudaDevAttrComputeCapabilityMajor: *value = dev().major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = dev().minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; break;
    default: return set_last(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    *total_bytes = (size_t)pages * (size_t)page;
    *free_bytes = *total_bytes / 2;
    return dev().sticky;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
    *ptr = NULL;
    if (dev().sticky) return dev().sticky;
    if (bytes == 0) return cudaSuccess;
    size_t rounded = (bytes + 255) & ~(size_t)255;
    if (rounded < bytes) return set_last(cudaErrorMemoryAllocation);
    void *p = aligned_alloc(256, rounded);
    if (!p) return set_last(cudaErrorMemoryAllocation);
    memset(p, 0xff, rounded); /* fresh device memory is garbage: NaN in f32 and bf16 */
    dev().allocs[(uintptr_t)p] = bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    if (!ptr) return cudaSuccess;
    auto it = dev().allocs.find((uintptr_t)ptr);
    if (it == dev().allocs.end()) return set_last(cudaErrorInvalidValue);
    dev().allocs.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t s) {
    (void)s;
    if (dev().sticky) return dev().sticky;
    if (bytes == 0) return cudaSuccess;
    bool dst_dev = is_device(dst, bytes), src_dev = is_device(src, bytes);
    bool ok = true;
    switch (kind) {
    case cudaMemcpyHostToHost: ok = !dst_dev && !src_dev; break;
    case cudaMemcpyHostToDevice: ok = dst_dev && !src_dev; break;
    case cudaMemcpyDeviceToHost: ok = !dst_dev && src_dev; break;
    case cudaMemcpyDeviceToDevice: ok = dst_dev && src_dev; break;
    case cudaMemcpyDefault: ok = dst && src; break;
    }
    if (!ok || !dst || !src) return set_last(cudaErrorInvalidValue);
    memmove(dst, src, bytes);
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    cudaError_t e = sync_status();
    if (e) return e;
    return cudaMemcpyAsync(dst, src, bytes, kind, NULL);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s) {
    (void)s;
    if (dev().sticky) return dev().sticky;
    if (bytes == 0) return cudaSuccess;
    if (!is_device(dst, bytes)) return set_last(cudaErrorInvalidValue);
    memset(dst, value, bytes);
    return cudaSuccess;
}

struct ckv_emu_stream {
    unsigned flags;
};

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    *s = new ckv_emu_stream{flags};
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    (void)s;
    return sync_status();
}

cudaError_t cudaDeviceSynchronize(void) { return sync_status(); }

cudaError_t cudaGetLastError(void) {
    if (dev().sticky) return dev().sticky;
    cudaError_t e = dev().last;
    dev().last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return dev().sticky ? dev().sticky : dev().last; }

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    if (e == dev().sticky && !dev().message.empty()) return dev().message.c_str();
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    }
    return "unknown error";
}

void ckv_emu_set_devices(int count, int major, int minor) {
    dev().count = count;
    dev().major = major;
    dev().minor = minor;
}

void ckv_emu_inject_fault(const char *kernel) { dev().inject = kernel ? kernel : ""; }

void ckv_emu_reset(void) {
    device_state &d = dev();
    for (auto &a : d.allocs) free((void *)a.first);
    d.allocs.clear();
    d.sticky = d.last = cudaSuccess;
    d.message.clear();
    d.inject.clear();
    d.fault_pending = false;
}

/* ---- fibers ----------------------------------------------------------------------------------- */

namespace {

/* A fiber's saved context. On x86-64 (without sanitizers) a switch saves the callee-saved registers
 * on the fiber's own stack and swaps stack pointers: a few ns, against ~150 ns for glibc's
 * swapcontext, which also saves the signal mask through a system call (docs/gpu.md §9). Elsewhere
 * ucontext. Fibers share the OS thread's floating-point environment and TLS. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define CKV_EMU_FAST_SWITCH 1
extern "C" void ckv_emu_switch_x86_64(void **save_sp, void *load_sp);
asm(".text\n"
    ".globl ckv_emu_switch_x86_64\n"
    ".type ckv_emu_switch_x86_64, @function\n"
    "ckv_emu_switch_x86_64:\n"
    "    pushq %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    pushq %r13\n"
    "    pushq %r14\n"
    "    pushq %r15\n"
    "    movq %rsp, (%rdi)\n"
    "    movq %rsi, %rsp\n"
    "    popq %r15\n"
    "    popq %r14\n"
    "    popq %r13\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    "    ret\n"
    ".size ckv_emu_switch_x86_64, .-ckv_emu_switch_x86_64\n");
struct context {
    void *sp;
};
#else
struct context {
    ucontext_t uc;
};
#endif

enum fiber_state { F_READY, F_BARRIER, F_WARP, F_DONE };

struct fiber {
    context ctx;
    ckv_emu_thread self;
    fiber_state state;
    ckv_emu_warp_fn fn; /* F_WARP: the collective, this lane's data and mask */
    void *data;
    unsigned mask;
};

constexpr size_t STACK_BYTES = 128 * 1024; /* per fiber, plus a guard page below it */
constexpr int MAX_THREADS = 1024;

struct scheduler {
    context main;
    fiber fibers[MAX_THREADS];
    int n = 0;
    fiber *cur = NULL;
    const std::function<void()> *body = NULL;
    char *stacks = NULL; /* MAX_THREADS x (guard page + stack), mapped once */
    size_t slot = 0;
    ckv_emu_thread host; /* what a call from outside a kernel sees */
};

scheduler &sched() {
    static scheduler s;
    return s;
}

void switch_to(context *save, context *load) {
#if CKV_EMU_FAST_SWITCH
    ckv_emu_switch_x86_64(&save->sp, load->sp);
#else
    swapcontext(&save->uc, &load->uc);
#endif
}

void fiber_entry() {
    scheduler &s = sched();
    fiber *f = s.cur;
    (*s.body)();
    f->state = F_DONE;
    switch_to(&f->ctx, &s.main); /* never resumed */
    abort();
}

/* A fresh context that starts fiber_entry on the stack [lo, lo + bytes). */
void context_init(context *c, char *lo, size_t bytes, context *link) {
#if CKV_EMU_FAST_SWITCH
    (void)link;
    uintptr_t top = ((uintptr_t)(lo + bytes)) & ~(uintptr_t)15;
    void **sp = (void **)top;
    *--sp = NULL;                        /* fiber_entry's return address: it never returns */
    *--sp = (void *)(uintptr_t)fiber_entry; /* where the first switch's ret lands */
    for (int i = 0; i < 6; i++) *--sp = NULL; /* rbp rbx r12 r13 r14 r15 */
    c->sp = sp;
#else
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = lo;
    c->uc.uc_stack.ss_size = bytes;
    c->uc.uc_link = &link->uc;
    makecontext(&c->uc, fiber_entry, 0);
#endif
}

void yield(fiber *f) { switch_to(&f->ctx, &sched().main); }

bool map_stacks(scheduler &s) {
    if (s.stacks) return true;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    s.slot = STACK_BYTES + page;
    void *p = mmap(NULL, s.slot * MAX_THREADS, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) return false;
    s.stacks = (char *)p;
    for (int i = 0; i < MAX_THREADS; i++) mprotect(s.stacks + (size_t)i * s.slot, page, PROT_NONE);
    return true;
}

/* Resolves the warp collectives that every lane of their mask has reached. Returns how many groups
 * were released; sets *bad (with a message) when one can never complete. */
int resolve_warps(scheduler &s, std::string *bad) {
    int released = 0;
    for (int w = 0; w * 32 < s.n; w++) {
        int base = w * 32, lanes = s.n - base < 32 ? s.n - base : 32;
        unsigned done_groups = 0; /* lanes already handled this round */
        for (int l = 0; l < lanes; l++) {
            fiber &f = s.fibers[base + l];
            if (f.state != F_WARP || (done_groups >> l & 1u)) continue;
            unsigned mask = f.mask;
            bool complete = true;
            void *data[32] = {};
            for (int m = 0; m < 32; m++) {
                if (!(mask >> m & 1u)) continue;
                if (m >= lanes) {
                    *bad = "a warp collective's mask names lane " + std::to_string(m) + " beyond the block";
                    return released;
                }
                fiber &o = s.fibers[base + m];
                if (o.state == F_DONE) {
                    *bad = "a warp collective's mask names lane " + std::to_string(m) + ", which has exited";
                    return released;
                }
                if (o.state != F_WARP) {
                    complete = false;
                    continue;
                }
                if (o.mask != mask || o.fn != f.fn) {
                    *bad = "lanes " + std::to_string(l) + " and " + std::to_string(m) + " of warp " +
                           std::to_string(w) + " wait in different warp collectives";
                    return released;
                }
                data[m] = o.data;
            }
            if (!(mask >> l & 1u)) {
                *bad = "a warp collective's mask lacks the calling lane " + std::to_string(l);
                return released;
            }
            if (!complete) continue;
            f.fn(data, mask);
            for (int m = 0; m < 32; m++)
                if (mask >> m & 1u) s.fibers[base + m].state = F_READY;
            done_groups |= mask;
            released++;
        }
    }
    return released;
}

/* Runs one block; returns false (message in *bad) when its threads cannot all finish. */
bool run_block(scheduler &s, std::string *bad) {
    for (int i = 0; i < s.n; i++) {
        fiber &f = s.fibers[i];
        context_init(&f.ctx, s.stacks + (size_t)i * s.slot + (s.slot - STACK_BYTES), STACK_BYTES, &s.main);
        f.state = F_READY;
    }
    for (;;) {
        for (int i = 0; i < s.n; i++) {
            if (s.fibers[i].state != F_READY) continue;
            s.cur = &s.fibers[i];
            switch_to(&s.main, &s.fibers[i].ctx);
        }
        s.cur = NULL;
        int done = 0, barrier = 0, warp = 0;
        for (int i = 0; i < s.n; i++) {
            done += s.fibers[i].state == F_DONE;
            barrier += s.fibers[i].state == F_BARRIER;
            warp += s.fibers[i].state == F_WARP;
        }
        if (done == s.n) return true;
        if (warp && resolve_warps(s, bad)) continue;
        if (!bad->empty()) return false;
        if (barrier + done == s.n) {
            if (done) {
                *bad = "__syncthreads reached by " + std::to_string(barrier) + " of " + std::to_string(s.n) +
                       " threads; the others have exited";
                return false;
            }
            for (int i = 0; i < s.n; i++) s.fibers[i].state = F_READY;
            continue;
        }
        *bad = "threads cannot proceed: " + std::to_string(barrier) + " at __syncthreads, " + std::to_string(warp) +
               " in warp collectives, " + std::to_string(done) + " exited";
        return false;
    }
}

} // namespace

const ckv_emu_thread *ckv_emu_self(void) {
    scheduler &s = sched();
    return s.cur ? &s.cur->self : &s.host;
}

unsigned ckv_emu_lane(void) { return ckv_emu_self()->thread_idx.x & 31u; }

void ckv_emu_warp_collective(ckv_emu_warp_fn fn, void *data, unsigned mask) {
    fiber *f = sched().cur;
    if (!f) abort(); /* a device function called from host code: a bug in the caller */
    f->state = F_WARP;
    f->fn = fn;
    f->data = data;
    f->mask = mask;
    yield(f);
}

void ckv_emu_syncthreads(void) {
    fiber *f = sched().cur;
    if (!f) abort();
    f->state = F_BARRIER;
    yield(f);
}

static void syncwarp_fn(void *lanes[32], unsigned mask) { (void)lanes, (void)mask; }

void __syncwarp(unsigned mask) {
    int dummy = 0;
    ckv_emu_warp_collective(syncwarp_fn, &dummy, mask);
}

/* docs/gpu.md §2: lanes form groups of `width`; a source outside the group or the mask gives the
 * caller's own value (outside the mask the hardware value is undefined: we poison it with NaN). */
static void shfl_fn(void *lanes[32], unsigned mask) {
    uint32_t in[32] = {};
    for (int l = 0; l < 32; l++)
        if (lanes[l]) in[l] = ((ckv_emu_shfl_lane *)lanes[l])->in;
    for (int l = 0; l < 32; l++) {
        if (!lanes[l]) continue;
        ckv_emu_shfl_lane *me = (ckv_emu_shfl_lane *)lanes[l];
        int w = me->width, base = l & ~(w - 1), src = l;
        switch (me->kind) {
        case CKV_EMU_SHFL_IDX: src = base + (me->arg % w + w) % w; break;
        case CKV_EMU_SHFL_UP: src = l - me->arg >= base ? l - me->arg : l; break;
        case CKV_EMU_SHFL_DOWN: src = l + me->arg < base + w ? l + me->arg : l; break;
        case CKV_EMU_SHFL_XOR: src = (l ^ me->arg) < base + w ? (l ^ me->arg) : l; break;
        }
        me->out = (mask >> src & 1u) ? in[src] : 0x7fc00000u;
    }
}

uint32_t ckv_emu_shfl(unsigned mask, uint32_t v, int kind, int arg, int width) {
    if (width < 1 || width > 32 || (width & (width - 1))) width = 32;
    ckv_emu_shfl_lane me = {v, 0, kind, arg, width};
    ckv_emu_warp_collective(shfl_fn, &me, mask);
    return me.out;
}

void ckv_emu_run(const char *kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                 const std::function<void()> &body) {
    (void)st;
    device_state &d = dev();
    scheduler &s = sched();
    if (d.sticky) return;
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (threads == 0 || threads > MAX_THREADS || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
        grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 || smem > 48 * 1024) {
        set_last(cudaErrorInvalidConfiguration);
        return;
    }
    if (!d.inject.empty() && d.inject == kernel) {
        d.inject.clear();
        d.fault_pending = true;
        d.message = std::string("ckv-emu: injected fault: an illegal memory access in kernel ") + kernel;
        return;
    }
    if (s.cur || !map_stacks(s)) {
        fault(cudaErrorLaunchFailure, "ckv-emu: cannot launch %s (%s)", kernel,
              s.cur ? "launch from device code" : "no memory for fiber stacks");
        return;
    }
    s.n = (int)threads;
    s.body = &body;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                for (int i = 0; i < s.n; i++) {
                    ckv_emu_thread &t = s.fibers[i].self;
                    t.thread_idx = {(unsigned)i % block.x, (unsigned)i / block.x % block.y,
                                    (unsigned)i / (block.x * block.y)};
                    t.block_idx = {bx, by, bz};
                    t.block_dim = block;
                    t.grid_dim = grid;
                }
                std::string bad;
                if (!run_block(s, &bad)) {
                    fault(cudaErrorLaunchFailure, "ckv-emu: kernel %s, block (%u,%u,%u): %s", kernel, bx, by, bz,
                          bad.c_str());
                    s.n = 0;
                    return;
                }
            }
    s.n = 0;
    s.body = NULL;
}

/* ---- cuBLAS ----------------------------------------------------------------------------------- */

struct ckv_emu_cublas {
    cudaStream_t stream;
};

cublasStatus_t cublasCreate(cublasHandle_t *h) {
    if (dev().count == 0) return CUBLAS_STATUS_NOT_INITIALIZED;
    *h = new ckv_emu_cublas{NULL};
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
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && !is_device(ws, bytes)) return CUBLAS_STATUS_INVALID_VALUE;
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

cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType_t at, int lda, const void *B,
                            cudaDataType_t bt, int ldb, const void *beta, void *C, cudaDataType_t ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo) {
    (void)algo;
    if (!h) return CUBLAS_STATUS_NOT_INITIALIZED;
    if (m < 0 || n < 0 || k < 0) return CUBLAS_STATUS_INVALID_VALUE;
    const int ar = ta == CUBLAS_OP_N ? m : k, ac = ta == CUBLAS_OP_N ? k : m; /* stored A: ar x ac */
    const int br = tb == CUBLAS_OP_N ? k : n, bc = tb == CUBLAS_OP_N ? n : k;
    if (lda < (ar > 1 ? ar : 1) || ldb < (br > 1 ? br : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    if (compute != CUBLAS_COMPUTE_32F || at != bt || (ct != CUDA_R_32F && ct != CUDA_R_16BF))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    if (m == 0 || n == 0) return CUBLAS_STATUS_SUCCESS;
    if (!is_device(C, extent(m, n, ldc, ct)) || (k > 0 && (!is_device(A, extent(ar, ac, lda, at)) ||
                                                          !is_device(B, extent(br, bc, ldb, bt)))))
        return CUBLAS_STATUS_INVALID_VALUE; /* on a GPU: an illegal address */
    if (dev().sticky) return CUBLAS_STATUS_NOT_INITIALIZED;
    const float a = *(const float *)alpha, b = *(const float *)beta;
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
    return CUBLAS_STATUS_SUCCESS;
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
