/* emu_check.cpp - the compute-sanitizer of the CPU execution layer: racecheck, memcheck and
 * initcheck on every load and store of kernel code, and the observer interface (ckv_emu.h) they
 * and other tools are built on. The accesses arrive through the call ABI of ThreadSanitizer's
 * compiler instrumentation: the kernels' translation units are compiled with -fsanitize=thread
 * (CMake option CKV_EMU_INSTRUMENT) but linked without its runtime; this file provides the
 * __tsan_* entry points instead, so each instrumented load or store calls in here with its address
 * and size. Outside a kernel (host code of the same files) and on any thread but the device
 * thread the calls return at once. Kernel accesses are classified as the thread's own stack
 * (ignored), the launch's arguments and built-in variables (ignored), __shared__ memory (the
 * device thread's static TLS block) or global memory, which must lie inside a live device
 * allocation of the launch's device.
 *   racecheck: per byte, the last write and a read since (thread, barrier interval, warp
 *     epoch): two accesses of different threads of a block in one interval, one a
 *     write, race unless a warp collective of both (a shuffle, a __syncwarp of any mask naming both
 *     lanes) separates them within one warp (per-lane vector clocks); in global memory
 *     any write and other access of different blocks of one launch race (atomics excepted).
 *   memcheck: an access outside every live device allocation (a host pointer, the red zone past
 *     an exact-sized allocation, a freed allocation, another device's memory) fails the launch, and
 *     so does a __shared__ access outside every __shared__ variable: the kernels' __shared__ macro
 *     (ckv_emu.h) declares a 256-byte gap variable beside each one, which the compiler lays out
 *     next to it (GCC and Clang place a function's static TLS variables in reverse declaration
 *     order, so each gap follows the variable declared after it); the gaps and the variables are
 *     read from the executable's symbol table, so an index past one array into the next lands in a
 *     gap and is reported. Without symbols this part is off.
 *   initcheck: a read of device memory never written since cudaMalloc, or of __shared__ memory
 *     not written by the block, fails the launch.
 * A finding stops the offending thread before the access happens (its fiber is abandoned) and
 * fails the launch naming the kernel, the address, the block and the thread. Without the
 * instrumentation, only the run-time parts remain: pointer arguments checked against live device
 * memory at launch, red-zone canaries checked after every launch and before a free, fresh memory
 * and (per block) __shared__ memory poisoned. Not itself instrumented. */
#include "emu_internal.h"

#include <cxxabi.h>
#include <elf.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

namespace ckv_emu {

namespace {

const ckv_emu_observer *g_observer = NULL;
bool g_instrumented = false;
bool g_active = false; /* checks or an observer: the access hook does work */
bool g_check = false;  /* CKV_EMU_CHECK */
bool g_in_observer = false; /* the observer's own (possibly instrumented) code runs */

struct launch_info {
    const char *kernel = NULL;
    dim3 grid, block;
};
launch_info g_launch;

std::vector<race_cell> g_shared_shadow; /* per byte of the device thread's static TLS block */

/* the allocation the previous access hit */
uintptr_t g_hit_lo = 0, g_hit_hi = 0;
alloc *g_hit = NULL;

void update_active() {
    g_check = config().check;
    g_active = g_check || (g_observer && g_observer->access);
}

const uint32_t MULTI = 0xffffffffu; /* several threads read in the interval */

std::string who(uint32_t gtid) {
    if (gtid == MULTI) return "several threads";
    const unsigned threads = g_launch.block.x * g_launch.block.y * g_launch.block.z;
    const unsigned g = gtid - 1, b = g / threads, t = g % threads;
    const dim3 &gr = g_launch.grid, &bl = g_launch.block;
    char buf[96];
    snprintf(buf, sizeof buf, "thread (%u,%u,%u) of block (%u,%u,%u)", t % bl.x, t / bl.x % bl.y, t / (bl.x * bl.y),
             b % gr.x, b / gr.x % gr.y, b / (gr.x * gr.y));
    return buf;
}

const char *verb(ckv_emu_access_kind k) { return k == CKV_EMU_READ ? "read" : k == CKV_EMU_WRITE ? "write" : "atomic"; }

[[noreturn]] void report(cudaError_t e, const char *tool, const thread_ctx *t, ckv_emu_access_kind k,
                         uintptr_t a, unsigned size, const std::string &where, const std::string &what) {
    char buf[640];
    snprintf(buf, sizeof buf, "%s: %s of %u bytes at %p%s by thread (%u,%u,%u): ", tool, verb(k), size, (void *)a,
             where.c_str(), t->thread.x, t->thread.y, t->thread.z);
    kill_running(e, buf + what);
}

std::string global_where(uintptr_t a, uintptr_t base, const alloc *al) {
    char buf[96];
    snprintf(buf, sizeof buf, " (offset %zu of a %zu-byte allocation at %p)", (size_t)(a - base), al->bytes,
             (void *)base);
    return buf;
}

/* Why [a, a + size) is no live device memory of this launch's device. */
std::string why_not_device(uintptr_t a, unsigned size) {
    std::map<uintptr_t, alloc> &m = mach().allocs;
    char buf[192];
    auto it = m.upper_bound(a + size);
    /* the allocation ending nearest below, and the one starting above */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 0 && it == m.begin()) continue;
        auto c = pass == 0 ? std::prev(it) : it;
        if (c == m.end()) continue;
        const uintptr_t lo = c->first, hi = lo + c->second.bytes;
        if (a + size > lo - RED_ZONE && a < hi + RED_ZONE) {
            if (!c->second.live)
                snprintf(buf, sizeof buf, "inside a freed %zu-byte device allocation at %p (used after cudaFree)",
                         c->second.bytes, (void *)lo);
            else if (a >= hi || a + size > hi)
                snprintf(buf, sizeof buf, "%zu bytes past the end of a %zu-byte device allocation at %p",
                         (size_t)(a + size - hi), c->second.bytes, (void *)lo);
            else
                snprintf(buf, sizeof buf, "%zu bytes before a %zu-byte device allocation at %p", (size_t)(lo - a),
                         c->second.bytes, (void *)lo);
            return buf;
        }
    }
    return "host memory, not a device allocation (a host pointer reached the kernel)";
}

/* A race found in one byte's shadow: with whom, and why they are unordered. */
struct race {
    const char *why = NULL;
    uint32_t other = 0;
    bool other_wrote = false;
};

/* One byte's race shadow against an access of thread t (and updated by it). `global`: blocks of
 * a launch share the memory. */
inline race race_byte(race_cell &c, const thread_ctx *t, ckv_emu_access_kind k, bool global) {
    const uint32_t me = t->gtid, floor = global ? t->launch_first : t->block_first;
    const unsigned warp = t->tid / 32;
    /* a warp collective of both lanes since thread g's access at its epoch e */
    auto warp_ordered = [&](uint32_t g, uint16_t e) {
        return g != MULTI && (g - 1) % t->threads / 32 == warp &&
               (int16_t)(uint16_t)(t->wvc[(g - 1) % t->threads % 32] - e) >= 0;
    };
    auto conflict = [&](uint32_t g, uint32_t serial, uint16_t wsync) -> const char * {
        if (serial < floor || g == me || g == 0) return NULL;
        if (serial < t->block_first) return "of another block of the same launch (blocks are not ordered)";
        if (serial != t->serial) return NULL; /* a __syncthreads between them */
        if (warp_ordered(g, wsync)) return NULL;
        return "in the same interval between __syncthreads";
    };
    race r;
    if ((r.why = conflict(c.w_gtid, c.w_serial, c.w_wsync))) {
        r.other = c.w_gtid, r.other_wrote = true;
        return r;
    }
    if (k == CKV_EMU_WRITE) {
        if ((r.why = conflict(c.r_gtid, c.r_serial, c.r_wsync))) {
            r.other = c.r_gtid;
            return r;
        }
        c.w_gtid = me, c.w_serial = t->serial, c.w_wsync = t->wsync;
    } else if (c.r_serial == t->serial && c.r_gtid != me && c.r_serial >= floor && !warp_ordered(c.r_gtid, c.r_wsync)) {
        c.r_gtid = MULTI;
    } else {
        c.r_gtid = me, c.r_serial = t->serial, c.r_wsync = t->wsync;
    }
    return r;
}

[[noreturn]] void report_race(const race &r, const thread_ctx *t, ckv_emu_access_kind k, uintptr_t a, unsigned size,
                              const std::string &where) {
    report(cudaErrorLaunchFailure, "racecheck", t, k, a, size, where,
           std::string("races with a ") + (r.other_wrote ? "write" : "read") + " by " + who(r.other) + " " + r.why);
}

/* The __shared__ variables (TLS symbols of the executable): offset in the TLS block -> size, name. */
struct tls_symbol {
    size_t size;
    std::string name;
};
std::map<size_t, tls_symbol> read_tls_symbols() {
    std::map<size_t, tls_symbol> out;
    FILE *f = fopen("/proc/self/exe", "rb");
    if (!f) return out;
    Elf64_Ehdr eh;
    std::vector<Elf64_Shdr> sh;
    if (fread(&eh, sizeof eh, 1, f) == 1 && memcmp(eh.e_ident, ELFMAG, SELFMAG) == 0 &&
        eh.e_ident[EI_CLASS] == ELFCLASS64 && eh.e_shentsize == sizeof(Elf64_Shdr)) {
        sh.resize(eh.e_shnum);
        if (fseek(f, (long)eh.e_shoff, SEEK_SET) != 0 || fread(sh.data(), sizeof(Elf64_Shdr), sh.size(), f) != sh.size())
            sh.clear();
    }
    for (const Elf64_Shdr &s : sh) {
        if (s.sh_type != SHT_SYMTAB || s.sh_link >= sh.size() || s.sh_entsize != sizeof(Elf64_Sym)) continue;
        const Elf64_Shdr &strs = sh[s.sh_link];
        std::vector<Elf64_Sym> syms(s.sh_size / sizeof(Elf64_Sym));
        std::vector<char> names(strs.sh_size + 1, '\0');
        if (fseek(f, (long)s.sh_offset, SEEK_SET) != 0 || fread(syms.data(), sizeof(Elf64_Sym), syms.size(), f) != syms.size() ||
            fseek(f, (long)strs.sh_offset, SEEK_SET) != 0 || fread(names.data(), 1, strs.sh_size, f) != strs.sh_size)
            break;
        for (const Elf64_Sym &y : syms) {
            if (ELF64_ST_TYPE(y.st_info) != STT_TLS || y.st_name >= strs.sh_size || y.st_size == 0) continue;
            const char *raw = names.data() + y.st_name;
            int status = 1;
            char *dem = abi::__cxa_demangle(raw, NULL, NULL, &status);
            out[y.st_value] = tls_symbol{y.st_size, status == 0 && dem ? dem : raw};
            free(dem);
        }
    }
    fclose(f);
    return out;
}

/* The gap the kernels' __shared__ macro puts beside every variable (ckv_emu.h): no variable's memory. */
bool is_gap_symbol(const std::string &name) { return name.find("ckv_emu_shared_gap_") != std::string::npos; }

/* The __shared__ variables, gaps dropped; and per byte of the TLS block, whether a variable owns it
 * (empty when the executable has no symbols: the bounds are then not checked). */
struct shared_layout {
    std::map<size_t, tls_symbol> vars;
    std::vector<uint8_t> owned;
};
const shared_layout &layout(void) {
    static const shared_layout l = [] {
        shared_layout o;
        const ranges &rg = exec_ranges();
        bool gaps = false;
        for (const auto &e : read_tls_symbols()) {
            if (is_gap_symbol(e.second.name)) {
                gaps = true;
                continue;
            }
            o.vars.insert(e);
        }
        if (!gaps || rg.shared_hi <= rg.shared_lo) return o; /* no gaps seen: nothing to tell apart */
        o.owned.assign(rg.shared_hi - rg.shared_lo, 0);
        for (const auto &e : o.vars)
            for (size_t i = e.first; i < e.first + e.second.size && i < o.owned.size(); i++) o.owned[i] = 1;
        return o;
    }();
    return l;
}

std::string shared_where(uintptr_t a) {
    const std::map<size_t, tls_symbol> &syms = layout().vars;
    const size_t off = (size_t)(a - exec_ranges().shared_lo);
    char where[512];
    auto it = syms.upper_bound(off);
    if (it != syms.begin() && off < std::prev(it)->first + std::prev(it)->second.size) {
        --it;
        snprintf(where, sizeof where, " (__shared__ %s, byte %zu of %zu)", it->second.name.c_str(), off - it->first,
                 it->second.size);
    } else if (it != syms.begin()) {
        --it;
        snprintf(where, sizeof where, " (__shared__ memory of no variable, %zu bytes past the end of %s of %zu bytes)",
                 off - (it->first + it->second.size), it->second.name.c_str(), it->second.size);
    } else {
        snprintf(where, sizeof where, " (__shared__, offset %zu of the block's static storage)", off);
    }
    return where;
}

void check_shared(const thread_ctx *t, uintptr_t a, unsigned size, ckv_emu_access_kind k) {
    const ranges &rg = exec_ranges();
    if (g_shared_shadow.empty()) g_shared_shadow.assign(rg.shared_hi - rg.shared_lo, race_cell{0, 0, 0, 0, 0, 0});
    const std::vector<uint8_t> &owned = layout().owned;
    for (unsigned i = 0; i < size && !owned.empty(); i++)
        if (!owned[a - rg.shared_lo + i])
            report(cudaErrorIllegalAddress, "memcheck", t, k, a, size, shared_where(a + i),
                   "outside every __shared__ variable (an index past the end of an array)");
    for (unsigned i = 0; i < size; i++) {
        race_cell &c = g_shared_shadow[a - rg.shared_lo + i];
        if (k == CKV_EMU_READ && c.w_serial < t->block_first)
            report(cudaErrorLaunchFailure, "initcheck", t, k, a, size, shared_where(a),
                   "byte " + std::to_string(i) + " was not written by this block (uninitialised __shared__ memory)");
        race r = race_byte(c, t, k, false);
        if (r.why) report_race(r, t, k, a, size, shared_where(a));
    }
}

void check_global(const thread_ctx *t, uintptr_t a, unsigned size, ckv_emu_access_kind k) {
    if (!(a >= g_hit_lo && a + size <= g_hit_hi && g_hit->live)) {
        uintptr_t base = 0;
        alloc *al = find_alloc((const void *)a, size, &base);
        if (!al) report(cudaErrorIllegalAddress, "memcheck", t, k, a, size, "", why_not_device(a, size));
        g_hit = al, g_hit_lo = base, g_hit_hi = base + al->bytes;
    }
    alloc *al = g_hit;
    if (al->device != t->device) {
        char buf[96];
        snprintf(buf, sizeof buf, "memory of device %d, but the launch runs on device %d", al->device, t->device);
        report(cudaErrorIllegalAddress, "memcheck", t, k, a, size, global_where(a, g_hit_lo, al), buf);
    }
    if (al->init.empty()) return; /* allocated before the checks were on */
    const size_t off = a - g_hit_lo;
    for (unsigned i = 0; i < size; i++) {
        const size_t o = off + i;
        uint8_t &bits = al->init[o >> 3];
        const uint8_t bit = (uint8_t)(1u << (o & 7));
        if (k != CKV_EMU_WRITE && !(bits & bit))
            report(cudaErrorLaunchFailure, "initcheck", t, k, a, size, global_where(a, g_hit_lo, al),
                   "byte " + std::to_string(i) + " was never written since cudaMalloc (uninitialised device memory)");
        if (k != CKV_EMU_READ) bits |= bit;
        if (k == CKV_EMU_ATOMIC) continue;
        race_cell *&page = al->shadow[o >> 12];
        if (!page) {
            page = (race_cell *)calloc(4096, sizeof(race_cell));
            if (!page) report(cudaErrorLaunchFailure, "racecheck", t, k, a, size, "", "no memory for the shadow");
        }
        race r = race_byte(page[o & 4095], t, k, true);
        if (r.why) report_race(r, t, k, a, size, global_where(a, g_hit_lo, al));
    }
}

inline void on_access(void *addr, unsigned size, ckv_emu_access_kind k, void *site) {
    if (!g_active || g_in_observer) return;
    thread_ctx *t = g_running;
    if (!t || !pthread_equal(pthread_self(), g_device_tid)) return; /* host code, or between fibers */
    const uintptr_t a = (uintptr_t)addr;
    const ranges &r = exec_ranges();
    if ((a >= r.stacks_lo && a < r.stacks_hi) || (a >= r.self_lo && a < r.self_hi) || (a >= r.args_lo && a < r.args_hi))
        return;
    for (int i = 0; i < 4; i++)
        if (a >= r.const_lo[i] && a < r.const_hi[i] && k == CKV_EMU_READ) return; /* constants */
    const bool shared = a >= r.shared_lo && a < r.shared_hi;
    if (g_observer && g_observer->access) {
        ckv_emu_access ev;
        ev.kernel = t->kernel;
        ev.launch = t->launch;
        ev.block = t->block;
        ev.thread = t->thread;
        ev.warp = t->tid / 32;
        ev.lane = t->tid % 32;
        ev.addr = addr;
        ev.size = size;
        ev.kind = k;
        ev.space = shared ? CKV_EMU_SPACE_SHARED : CKV_EMU_SPACE_GLOBAL;
        ev.site = (uintptr_t)site;
        ev.seq = t->seq;
        g_in_observer = true;
        g_observer->access(g_observer->user, &ev);
        g_in_observer = false;
    }
    t->seq++;
    if (!g_check) return;
    if (shared) check_shared(t, a, size, k);
    else check_global(t, a, size, k);
}

} // namespace

/* ---- the layer's side ------------------------------------------------------------------------- */

bool instrumented(void) { return g_instrumented; }

void check_launch_begin(const char *kernel, uint64_t launch, dim3 grid, dim3 block) {
    update_active();
    g_launch.kernel = kernel, g_launch.grid = grid, g_launch.block = block;
    g_hit = NULL, g_hit_lo = g_hit_hi = 0;
    if (g_observer && g_observer->launch_begin) g_observer->launch_begin(g_observer->user, kernel, launch, grid, block);
}

void check_launch_end(const char *kernel, uint64_t launch) {
    g_hit = NULL, g_hit_lo = g_hit_hi = 0;
    if (g_observer && g_observer->launch_end) g_observer->launch_end(g_observer->user, kernel, launch);
}

void check_collective(const char *kernel, unsigned block_linear, unsigned index, ckv_emu_warp_fn fn, unsigned mask) {
    if (g_observer && g_observer->collective) g_observer->collective(g_observer->user, kernel, block_linear, index, fn, mask);
}

void check_red_zones(int device, const char *kernel) {
    static const unsigned char CANARY = 0xcb;
    for (auto &e : mach().allocs) {
        const alloc &a = e.second;
        if (!a.live || a.device != device) continue;
        const unsigned char *p = (const unsigned char *)e.first;
        const size_t tail = ((RED_ZONE + a.bytes + RED_ZONE + 255) & ~(size_t)255) - RED_ZONE - a.bytes;
        for (size_t i = 0; i < RED_ZONE; i++)
            if (p[-1 - (long)i] != CANARY) {
                fault(device, cudaErrorIllegalAddress,
                      "ckv-emu: kernel %s: memcheck: a write at byte %zu before a %zu-byte device allocation at %p "
                      "(its red zone was overwritten)", kernel, i + 1, a.bytes, (const void *)p);
                return;
            }
        for (size_t i = 0; i < tail; i++)
            if (p[a.bytes + i] != CANARY) {
                fault(device, cudaErrorIllegalAddress,
                      "ckv-emu: kernel %s: memcheck: a write at byte %zu past the end of a %zu-byte device allocation "
                      "at %p (its red zone was overwritten)", kernel, i + 1, a.bytes, (const void *)p);
                return;
            }
    }
}

bool check_pointer_args(int device, const char *kernel, const void *const *ptrs, int n, std::string *bad) {
    (void)kernel;
    for (int i = 0; i < n; i++) {
        if (!ptrs[i]) continue;
        uintptr_t base = 0;
        alloc *a = find_alloc(ptrs[i], 0, &base);
        /* one past the end of an allocation is a valid (empty) range */
        if (!a) a = find_alloc((const char *)ptrs[i] - 1, 1, &base);
        char buf[256];
        if (!a) {
            snprintf(buf, sizeof buf, "pointer argument %d (%p) is %s", i + 1, ptrs[i],
                     why_not_device((uintptr_t)ptrs[i], 1).c_str());
            *bad = buf;
            return false;
        }
        if (a->device != device) {
            snprintf(buf, sizeof buf, "pointer argument %d (%p) is memory of device %d, but the launch runs on device %d",
                     i + 1, ptrs[i], a->device, device);
            *bad = buf;
            return false;
        }
    }
    return true;
}

void ckv_emu_atomic_access(const void *p, unsigned bytes) { on_access((void *)p, bytes, CKV_EMU_ATOMIC, __builtin_return_address(0)); }

void ckv_emu_range_access(const void *p, size_t bytes, ckv_emu_access_kind k) {
    if (!g_active) return;
    void *site = __builtin_return_address(0);
    for (size_t i = 0; i < bytes; i += 8) on_access((char *)p + i, bytes - i < 8 ? (unsigned)(bytes - i) : 8, k, site);
}

void *ckv_emu_copy(void *d, const void *s, size_t n, int move) { return move ? memmove(d, s, n) : memcpy(d, s, n); }

void *ckv_emu_fill(void *d, int c, size_t n) { return memset(d, c, n); }

void ckv_emu_observe(const ckv_emu_observer *o) {
    std::lock_guard<std::recursive_mutex> l(mach().lock);
    g_observer = o;
    update_active();
}

int ckv_emu_instrumented(void) { return g_instrumented; }

} // namespace ckv_emu

/* ---- the ThreadSanitizer call ABI (what -fsanitize=thread code calls) ---------------------------- */

using ckv_emu::CKV_EMU_READ;
using ckv_emu::CKV_EMU_WRITE;
using ckv_emu::on_access;

#define CKV_EMU_TSAN_RW(n)                                                                                   \
    extern "C" void __tsan_read##n(void *p) { on_access(p, n, CKV_EMU_READ, __builtin_return_address(0)); }  \
    extern "C" void __tsan_write##n(void *p) { on_access(p, n, CKV_EMU_WRITE, __builtin_return_address(0)); } \
    extern "C" void __tsan_unaligned_read##n(void *p) { on_access(p, n, CKV_EMU_READ, __builtin_return_address(0)); } \
    extern "C" void __tsan_unaligned_write##n(void *p) { on_access(p, n, CKV_EMU_WRITE, __builtin_return_address(0)); } \
    extern "C" void __tsan_volatile_read##n(void *p) { on_access(p, n, CKV_EMU_READ, __builtin_return_address(0)); } \
    extern "C" void __tsan_volatile_write##n(void *p) { on_access(p, n, CKV_EMU_WRITE, __builtin_return_address(0)); }
CKV_EMU_TSAN_RW(1)
CKV_EMU_TSAN_RW(2)
CKV_EMU_TSAN_RW(4)
CKV_EMU_TSAN_RW(8)
CKV_EMU_TSAN_RW(16)

extern "C" void __tsan_read_range(void *p, unsigned long n) {
    for (unsigned long i = 0; i < n; i += 8) on_access((char *)p + i, n - i < 8 ? (unsigned)(n - i) : 8, CKV_EMU_READ, __builtin_return_address(0));
}
extern "C" void __tsan_write_range(void *p, unsigned long n) {
    for (unsigned long i = 0; i < n; i += 8) on_access((char *)p + i, n - i < 8 ? (unsigned)(n - i) : 8, CKV_EMU_WRITE, __builtin_return_address(0));
}
/* Clang's instrumentation turns memcpy / memmove / memset in kernel code into these calls. */
extern "C" void *__tsan_memcpy(void *d, const void *s, unsigned long n) {
    ckv_emu::ckv_emu_range_access(s, n, CKV_EMU_READ);
    ckv_emu::ckv_emu_range_access(d, n, CKV_EMU_WRITE);
    return memcpy(d, s, n);
}
extern "C" void *__tsan_memmove(void *d, const void *s, unsigned long n) {
    ckv_emu::ckv_emu_range_access(s, n, CKV_EMU_READ);
    ckv_emu::ckv_emu_range_access(d, n, CKV_EMU_WRITE);
    return memmove(d, s, n);
}
extern "C" void *__tsan_memset(void *d, int c, unsigned long n) {
    ckv_emu::ckv_emu_range_access(d, n, CKV_EMU_WRITE);
    return memset(d, c, n);
}
extern "C" void __tsan_init(void) { ckv_emu::g_instrumented = true; }
extern "C" void __tsan_func_entry(void *) {}
extern "C" void __tsan_func_exit(void) {}
extern "C" void __tsan_vptr_update(void **, void *) {}
extern "C" void __tsan_vptr_read(void **) {}
