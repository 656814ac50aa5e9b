/* emu_exec.cpp - how the CPU execution layer runs device work: the device thread (the one OS
 * thread that executes queued work, so every launch sees one set of __shared__ variables, its
 * static TLS block, and host threads never race on them), and the fiber scheduler that runs a
 * launch block by block, one fiber per CUDA thread, collectives as rendezvous, in the thread and
 * block order of CKV_EMU_SCHEDULE; deadlocks and the checks' findings are launch failures naming
 * the kernel and block. The warp shuffle lives here too. The runtime API is ckv_emu.cpp, the
 * checks emu_check.cpp. */
#include "emu_internal.h"

#include <link.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <condition_variable>

namespace ckv_emu {

/* ---- the device thread ------------------------------------------------------------------------- */

namespace {

struct device_thread {
    std::mutex m;
    std::condition_variable cv;
    const std::function<void()> *job = NULL;
    bool done = false;
    pthread_t id;
    bool started = false;
};

device_thread &dthread() {
    static device_thread *t = new device_thread; /* never destroyed: the thread outlives main */
    return *t;
}

/* The executable (the first object; it links the layer): its static TLS block in the calling
 * thread, where the __shared__ variables (static thread_local) live, and its read-only segments,
 * where constant tables of kernel code live (constant memory on a device). */
int find_segments(struct dl_phdr_info *info, size_t, void *out) {
    ranges *r = (ranges *)out;
    int n_const = 0;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) &ph = info->dlpi_phdr[i];
        if (ph.p_type == PT_TLS && info->dlpi_tls_data) {
            r->shared_lo = (uintptr_t)info->dlpi_tls_data;
            r->shared_hi = r->shared_lo + ph.p_memsz;
        }
        if (ph.p_type == PT_LOAD && !(ph.p_flags & PF_W) && n_const < 4) {
            r->const_lo[n_const] = info->dlpi_addr + ph.p_vaddr;
            r->const_hi[n_const] = r->const_lo[n_const] + ph.p_memsz;
            n_const++;
        }
    }
    return 1;
}

void *device_main(void *) {
    device_thread &t = dthread();
    dl_iterate_phdr(find_segments, &g_ranges);
    std::unique_lock<std::mutex> l(t.m);
    for (;;) {
        t.cv.wait(l, [&] { return t.job != NULL; });
        (*t.job)();
        t.job = NULL;
        t.done = true;
        t.cv.notify_all();
    }
    return NULL;
}

} // namespace

ranges g_ranges;
thread_ctx *g_running = NULL;
pthread_t g_device_tid;

bool on_device_thread(void) {
    device_thread &t = dthread();
    return t.started && pthread_equal(t.id, pthread_self());
}

void device_exec(const std::function<void()> &fn) {
    device_thread &t = dthread();
    if (on_device_thread()) {
        fn();
        return;
    }
    std::unique_lock<std::mutex> l(t.m);
    if (!t.started) {
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setstacksize(&at, 8u << 20);
        if (pthread_create(&t.id, &at, device_main, NULL) != 0) {
            fprintf(stderr, "ckv-emu: cannot start the device thread\n");
            abort(); /* no device: nothing can run */
        }
        pthread_attr_destroy(&at);
        pthread_detach(t.id);
        g_device_tid = t.id;
        t.started = true;
    }
    t.job = &fn;
    t.done = false;
    t.cv.notify_all();
    t.cv.wait(l, [&] { return t.done; });
}

/* ---- fibers ----------------------------------------------------------------------------------- */

namespace {

/* A fiber's saved context. On x86-64 a switch saves the callee-saved registers on the fiber's own
 * stack and swaps stack pointers: a few ns, against ~150 ns for glibc's swapcontext, which also
 * saves the signal mask through a system call. Elsewhere (and under AddressSanitizer) ucontext.
 * Fibers share the device thread's floating-point environment and TLS. */
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
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

enum fiber_state { F_READY, F_BARRIER, F_WARP, F_DONE, F_FAULT };

struct fiber {
    context ctx;
    ckv_emu_thread self;
    thread_ctx tc;
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
    void (*tramp)(void *) = NULL;
    void *args = NULL;
    char *stacks = NULL; /* MAX_THREADS x (guard page + stack), mapped once */
    size_t slot = 0;
    ckv_emu_thread host; /* what a call from outside a kernel sees */
    std::string kill_message;
    cudaError_t kill_error = cudaSuccess;
    uint32_t serial = 0; /* barrier intervals so far (all launches) */
    uint64_t launches = 0;
    const char *kernel = NULL;
};

scheduler &sched() {
    static scheduler *s = new scheduler;
    return *s;
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
    s.tramp(s.args);
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
    *--sp = NULL;                           /* fiber_entry's return address: it never returns */
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
    g_ranges.stacks_lo = (uintptr_t)p;
    g_ranges.stacks_hi = (uintptr_t)p + s.slot * MAX_THREADS;
    g_ranges.self_lo = (uintptr_t)&s.fibers[0];
    g_ranges.self_hi = (uintptr_t)&s.fibers[MAX_THREADS];
    return true;
}

/* xorshift64*: the seeded random schedule */
uint64_t next_random(uint64_t *x) {
    *x ^= *x >> 12, *x ^= *x << 25, *x ^= *x >> 27;
    return *x * 2685821657736338717ull;
}

/* The order in which n items run this round. */
void schedule_order(int *order, int n, uint64_t *rng) {
    const settings &c = config();
    for (int i = 0; i < n; i++) order[i] = c.schedule == SCHED_REVERSE ? n - 1 - i : i;
    if (c.schedule == SCHED_RANDOM)
        for (int i = n - 1; i > 0; i--) {
            int j = (int)(next_random(rng) % (uint64_t)(i + 1));
            int t = order[i];
            order[i] = order[j], order[j] = t;
        }
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
            /* the lanes of the mask (all, or part of the warp) are ordered with each other from here on,
             * no others: join their vector clocks, then each advances its own epoch */
            uint16_t join[32] = {};
            for (int m = 0; m < 32; m++)
                if (mask >> m & 1u)
                    for (int j = 0; j < 32; j++) {
                        const uint16_t e = s.fibers[base + m].tc.wvc[j];
                        if ((int16_t)(uint16_t)(e - join[j]) > 0) join[j] = e;
                    }
            for (int m = 0; m < 32; m++)
                if (mask >> m & 1u) {
                    thread_ctx &tc = s.fibers[base + m].tc;
                    s.fibers[base + m].state = F_READY;
                    memcpy(tc.wvc, join, sizeof join);
                    tc.wsync = ++tc.wvc[m];
                }
            check_collective(s.kernel, s.fibers[0].tc.block_linear, (unsigned)w, f.fn, mask);
            done_groups |= mask;
            released++;
        }
    }
    return released;
}

/* Runs one block; returns false (message in *bad) when its threads cannot all finish. */
bool run_block(scheduler &s, std::string *bad, uint64_t *rng) {
    int order[MAX_THREADS];
    const uint32_t first = ++s.serial;
    for (int i = 0; i < s.n; i++) {
        fiber &f = s.fibers[i];
        context_init(&f.ctx, s.stacks + (size_t)i * s.slot + (s.slot - STACK_BYTES), STACK_BYTES, &s.main);
        f.state = F_READY;
        f.tc.serial = f.tc.block_first = first;
        memset(f.tc.wvc, 0, sizeof f.tc.wvc);
        f.tc.wsync = f.tc.wvc[i % 32] = 1;
        f.tc.seq = 0;
    }
    for (;;) {
        schedule_order(order, s.n, rng);
        for (int k = 0; k < s.n; k++) {
            fiber &f = s.fibers[order[k]];
            if (f.state != F_READY) continue;
            s.cur = &f;
            g_running = &f.tc;
            switch_to(&s.main, &f.ctx);
            s.cur = NULL;
            g_running = NULL;
            if (f.state == F_FAULT) {
                *bad = s.kill_message;
                return false;
            }
        }
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
            const uint32_t next = ++s.serial;
            for (int i = 0; i < s.n; i++) s.fibers[i].state = F_READY, s.fibers[i].tc.serial = next;
            check_collective(s.kernel, s.fibers[0].tc.block_linear, (unsigned)s.n, NULL, 0);
            continue;
        }
        *bad = "threads cannot proceed: " + std::to_string(barrier) + " at __syncthreads, " + std::to_string(warp) +
               " in warp collectives, " + std::to_string(done) + " exited";
        return false;
    }
}

} // namespace

void kill_running(cudaError_t e, const std::string &message) {
    scheduler &s = sched();
    fiber *f = s.cur;
    s.kill_error = e;
    s.kill_message = message;
    f->state = F_FAULT;
    switch_to(&f->ctx, &s.main); /* never resumed */
    abort();
}

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

/* Lanes form groups of `width`; a source outside the group gives the caller's own value; a source
 * outside the mask is undefined on the device (PTX ISA, shfl.sync): poisoned with NaN here. */
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

/* ---- launches --------------------------------------------------------------------------------- */

void exec_launch(int device, const char *kernel, dim3 grid, dim3 block, void (*tramp)(void *), void *args,
                 size_t args_bytes, const void *const *ptrs, int n_ptrs) {
    device_state &d = mach().devs[device];
    scheduler &s = sched();
    if (d.sticky) return;
    if (!d.inject.empty() && d.inject == kernel) {
        d.inject.clear();
        d.fault_pending = true;
        d.message = std::string("ckv-emu: injected fault: an illegal memory access in kernel ") + kernel;
        return;
    }
    if (s.cur || !map_stacks(s)) {
        fault(device, cudaErrorLaunchFailure, "ckv-emu: cannot launch %s (%s)", kernel,
              s.cur ? "launch from device code" : "no memory for fiber stacks");
        return;
    }
    const settings &c = config();
    std::string bad;
    if (c.check && !check_pointer_args(device, kernel, ptrs, n_ptrs, &bad)) {
        fault(device, cudaErrorIllegalAddress, "ckv-emu: kernel %s: memcheck: %s", kernel, bad.c_str());
        return;
    }
    const uint64_t launch = ++s.launches;
    const unsigned threads = block.x * block.y * block.z;
    const size_t n_blocks = (size_t)grid.x * grid.y * grid.z;
    s.n = (int)threads;
    s.tramp = tramp;
    s.args = args;
    s.kernel = kernel;
    g_ranges.args_lo = (uintptr_t)args, g_ranges.args_hi = (uintptr_t)args + args_bytes;
    uint64_t rng = (c.seed + 0x9e3779b97f4a7c15ull) * (launch | 1);
    std::vector<size_t> blocks(n_blocks);
    for (size_t i = 0; i < n_blocks; i++) blocks[i] = c.schedule == SCHED_REVERSE ? n_blocks - 1 - i : i;
    if (c.schedule == SCHED_RANDOM)
        for (size_t i = n_blocks; i > 1; i--) {
            size_t j = (size_t)(next_random(&rng) % i), t = blocks[i - 1];
            blocks[i - 1] = blocks[j], blocks[j] = t;
        }
    check_launch_begin(kernel, launch, grid, block);
    const uint32_t launch_first = s.serial + 1;
    const bool poison_shared = c.check && !instrumented() && g_ranges.shared_hi > g_ranges.shared_lo;
    for (size_t k = 0; k < n_blocks; k++) {
        const size_t b = blocks[k];
        const unsigned bx = (unsigned)(b % grid.x), by = (unsigned)(b / grid.x % grid.y),
                       bz = (unsigned)(b / ((size_t)grid.x * grid.y));
        for (int i = 0; i < s.n; i++) {
            fiber &f = s.fibers[i];
            ckv_emu_thread &t = f.self;
            t.thread_idx = {(unsigned)i % block.x, (unsigned)i / block.x % block.y, (unsigned)i / (block.x * block.y)};
            t.block_idx = {bx, by, bz};
            t.block_dim = block;
            t.grid_dim = grid;
            thread_ctx &tc = f.tc;
            tc.kernel = kernel;
            tc.launch = launch;
            tc.device = device;
            tc.block = t.block_idx;
            tc.thread = t.thread_idx;
            tc.block_linear = (unsigned)b;
            tc.tid = (unsigned)i;
            tc.threads = threads;
            tc.gtid = (uint32_t)(b * threads + (size_t)i + 1);
            tc.launch_first = launch_first;
        }
        /* without instrumentation, initcheck is by poison: results must not depend on the pattern */
        if (poison_shared) memset((void *)g_ranges.shared_lo, c.poison, g_ranges.shared_hi - g_ranges.shared_lo);
        if (!run_block(s, &bad, &rng)) {
            fault(device, s.kill_error ? s.kill_error : cudaErrorLaunchFailure, "ckv-emu: kernel %s, block (%u,%u,%u): %s",
                  kernel, bx, by, bz, bad.c_str());
            s.kill_error = cudaSuccess;
            break;
        }
    }
    s.n = 0;
    s.tramp = NULL;
    s.args = NULL;
    g_ranges.args_lo = g_ranges.args_hi = 0;
    check_launch_end(kernel, launch);
    if (c.check) check_red_zones(device, kernel);
    s.kernel = NULL;
}

} // namespace ckv_emu
