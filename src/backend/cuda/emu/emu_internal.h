/* emu_internal.h - private to the CPU execution layer (src/backend/cuda/emu): the state its files
 * share. ckv_emu.cpp owns the runtime API (devices, memory, streams, events, errors), emu_exec.cpp
 * the device thread and the fiber scheduler that runs launches, emu_check.cpp the checks
 * (racecheck, memcheck, initcheck) and the observer behind the instrumented kernels' loads and
 * stores, emu_blas.cpp the GEMM. Nothing here is seen by kernels or tests. */
#ifndef CKV_EMU_INTERNAL_H
#define CKV_EMU_INTERNAL_H

#include "ckv_emu.h"

/* the layer's own copies are its own, not kernel code: no range reports */
#undef memcpy
#undef memmove
#undef memset
#undef expf
#undef exp2f

#include <pthread.h>

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ckv_emu {

constexpr int MAX_DEVICES = 16;
constexpr size_t RED_ZONE = 256; /* bytes of canary before and after every device allocation */

/* ---- settings: read once from the environment -------------------------------------------------- */

enum schedule_kind { SCHED_FORWARD, SCHED_REVERSE, SCHED_RANDOM };
struct settings {
    bool check = false;         /* CKV_EMU_CHECK=1: every check below */
    schedule_kind schedule = SCHED_FORWARD;
    uint64_t seed = 0;          /* random:SEED */
    unsigned char poison = 0xff; /* fresh device memory and __shared__ at block start */
    int sms = 132;              /* CKV_EMU_SMS: SMs of every device (default an H200's) */
    std::string error;          /* a bad variable: every device reports it */
};
const settings &config(void);

/* ---- devices, memory ------------------------------------------------------------------------------ */

struct alloc {
    size_t bytes = 0;
    int device = 0;
    bool live = true;           /* false: freed (kept to name a use after free) */
    std::vector<uint8_t> init;  /* checks: bit per byte written since allocation */
    std::vector<struct race_cell *> shadow; /* checks: race shadow per 4 KiB page, lazily */
};

struct ckv_emu_event_rec;

struct device_state {
    int major = 9, minor = 0, sms = 132;
    cudaError_t sticky = cudaSuccess; /* a fault: every later call reports it */
    std::string message;              /* the emulator's words for the sticky error */
    std::string inject;               /* kernel whose next launch faults */
    bool fault_pending = false;       /* an injected fault not yet surfaced by a synchronising call */
    std::map<const void *, int> dyn_smem_optin; /* kernel -> cudaFuncAttributeMaxDynamicSharedMemorySize */
};

struct machine {
    std::recursive_mutex lock;        /* every API call; the device thread runs while a caller holds it */
    int count = 1;
    device_state devs[MAX_DEVICES];
    std::map<uintptr_t, alloc> allocs; /* user base -> allocation (freed ones too, until reused) */
    std::vector<ckv_emu_stream *> streams;
    ckv_emu_stream *legacy[MAX_DEVICES] = {}; /* the NULL stream of each device */
    std::map<uintptr_t, size_t> pinned; /* cudaMallocHost base -> bytes */
    unsigned long long host_waits = 0;  /* times the host waited for device work (ckv_emu_host_waits) */
    unsigned long long launches = 0;    /* kernels launched (ckv_emu_launches) */
    unsigned long long gemms = 0;       /* cuBLAS calls queued (ckv_emu_launches) */
};
machine &mach(void);
/* API calls hold the machine lock; work running on the device thread (its caller holds it) not. */
#define LOCKED                                                                       \
    std::unique_lock<std::recursive_mutex> lock_(mach().lock, std::defer_lock);      \
    if (!on_device_thread()) lock_.lock()
int current_device(void);

/* The allocation holding [p, p + bytes) on any device (live only), or NULL. */
alloc *find_alloc(const void *p, size_t bytes, uintptr_t *base);
/* Marks [p, p + bytes) of device memory as written (copies, memsets, GEMM). */
void mark_written(const void *p, size_t bytes);
/* Sets the sticky error of device `d` (the first one wins). */
void fault(int d, cudaError_t e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

bool on_device_thread(void);

/* ---- streams: work runs when the host forces it ----------------------------------------------- */

struct work {
    uint64_t seq;
    std::function<void()> fn;
};
struct capture;
struct ckv_emu_stream {
    int device;
    unsigned flags;
    bool legacy;
    capture *cap = NULL;         /* the open capture recording this stream's work (emu_graph.cpp) */
    std::deque<work> q;
    uint64_t next = 1, done = 0; /* seq of the next item; the last executed */
};
/* Runs (on the device thread) stream s's queued work up to and including seq `upto`. */
void stream_run(ckv_emu_stream *s, uint64_t upto);
/* Enqueues fn on s (NULL: the current device's legacy stream, ordered with its blocking streams);
 * returns its seq. */
uint64_t stream_push(cudaStream_t s, std::function<void()> fn);
ckv_emu_stream *stream_of(cudaStream_t s);

/* ---- stream capture (emu_graph.cpp) -------------------------------------------------------------- */

/* Records fn as the next node of s's open capture (s->cap set). */
void capture_record(ckv_emu_stream *s, std::function<void()> fn);
/* Called by each call that makes the host wait or allocates: while a capture is open, invalidates
 * every open capture and returns cudaErrorStreamCaptureUnsupported; cudaSuccess when none is open. */
cudaError_t capture_refuse(void);
/* The serial number of s's open capture (0: none; never reused, so an event recorded in a capture
 * that has ended names none). */
uint64_t capture_id(const ckv_emu_stream *s);
/* Stream s waits on an event recorded in the capture numbered `id` (0: outside any): s joins that
 * capture while it is open, or the wait of a capturing stream on an event from outside its capture
 * fails (cudaErrorStreamCaptureIsolation). */
cudaError_t capture_wait(ckv_emu_stream *s, uint64_t id);

/* ---- execution (emu_exec.cpp) ------------------------------------------------------------------ */

/* Runs fn on the device thread (the one OS thread that executes device work) and waits for it. */
void device_exec(const std::function<void()> &fn);
bool on_device_thread(void);
/* Executes one launch (called in stream order on the device thread). */
void exec_launch(int device, const char *kernel, dim3 grid, dim3 block, void (*tramp)(void *), void *args,
                 size_t args_bytes, const void *const *ptrs, int n_ptrs);

/* What the checks need of the running fiber. */
struct thread_ctx {
    const char *kernel;
    uint64_t launch;
    int device;
    uint3 block, thread;
    unsigned block_linear, tid, threads; /* linear thread index in the block, threads per block */
    uint32_t gtid;                       /* block_linear * threads + tid + 1 (0: nobody) */
    uint32_t serial;                     /* the block's current barrier interval (unique) */
    uint32_t block_first;                /* the block's first interval */
    uint32_t launch_first;               /* the launch's first interval */
    uint16_t wsync;                      /* this lane's warp epoch: 1 + its warp collectives in the block */
    uint16_t wvc[32];                    /* the latest epoch of each lane of the warp that this lane has
                                          * synchronised with (a vector clock; wvc[lane] = wsync): an access
                                          * of lane j at epoch e is ordered before this lane iff e <= wvc[j] */
    uint64_t seq;                        /* accesses made so far */
};
/* The running kernel thread, or NULL outside kernel code (host code, the scheduler); meaningful on
 * the device thread only (g_device_tid). Globals, not calls: the access hook reads them. */
extern thread_ctx *g_running;
extern pthread_t g_device_tid;
inline thread_ctx *running(void) { return g_running; }
/* Abandons the running fiber: the launch fails with e and message (never resumes the thread). */
[[noreturn]] void kill_running(cudaError_t e, const std::string &message);
/* Address ranges the access hook treats as the emulator's own (fiber stacks, built-in variables,
 * launch arguments) and as __shared__ (the device thread's static TLS block). */
struct ranges {
    uintptr_t stacks_lo = 0, stacks_hi = 0;
    uintptr_t self_lo = 0, self_hi = 0;
    uintptr_t args_lo = 0, args_hi = 0;
    uintptr_t shared_lo = 0, shared_hi = 0;
    uintptr_t const_lo[4] = {}, const_hi[4] = {}; /* the executable's read-only segments: constants */
};
extern ranges g_ranges;
inline ranges &exec_ranges(void) { return g_ranges; }

/* ---- checks (emu_check.cpp) -------------------------------------------------------------------- */

struct race_cell { /* per byte: the last write and a read since, of the current launch */
    uint32_t w_gtid, w_serial, r_gtid, r_serial;
    uint16_t w_wsync, r_wsync;
};
/* Launch begin / end for the checks and the observer. */
void check_launch_begin(const char *kernel, uint64_t launch, dim3 grid, dim3 block);
void check_launch_end(const char *kernel, uint64_t launch);
/* A completed collective (fn NULL: __syncthreads) for the observer. */
void check_collective(const char *kernel, unsigned block_linear, unsigned index, ckv_emu_warp_fn fn, unsigned mask);
/* Red zones of every allocation intact? Else faults naming the kernel just run. */
void check_red_zones(int device, const char *kernel);
/* Every pointer argument of a launch names live device memory of `device` (or is NULL). */
bool check_pointer_args(int device, const char *kernel, const void *const *ptrs, int n, std::string *bad);
bool instrumented(void);

} // namespace ckv_emu

#endif
