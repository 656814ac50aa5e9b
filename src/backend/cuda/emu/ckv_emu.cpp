/* ckv_emu.cpp - the runtime API of the CPU execution layer (ckv_emu.h): the simulated devices and
 * the current device of each host thread, device memory (exact-sized allocations between red
 * zones, fresh memory poisoned, freed allocations remembered to name a use after free), streams
 * and events whose work is queued and run on the device thread when the host forces it, and the
 * error state (per-thread last error, per-device sticky fault). The fiber scheduler is
 * emu_exec.cpp, the checks emu_check.cpp, cuBLAS emu_blas.cpp, stream capture and graphs
 * emu_graph.cpp (the calls here that wait or allocate ask capture_refuse first). Every call holds
 * the machine lock, so any number of host threads may use the layer. */
#include "emu_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

namespace ckv_emu {

/* ---- settings --------------------------------------------------------------------------------- */

static bool parse_schedule(const char *v, settings *c);

static settings parse_settings() {
    settings c;
    const char *v = getenv("CKV_EMU_CHECK");
    if (v && *v && strcmp(v, "0") != 0) {
        if (strcmp(v, "1") != 0) c.error = std::string("CKV_EMU_CHECK=") + v + ": expected 0 or 1";
        c.check = true;
        c.schedule = SCHED_RANDOM; /* unless CKV_EMU_SCHEDULE names another */
        c.seed = 1;
    }
    v = getenv("CKV_EMU_SCHEDULE");
    if (v && *v && !parse_schedule(v, &c))
        c.error = std::string("CKV_EMU_SCHEDULE=") + v + ": expected forward, reverse or random:SEED";
    v = getenv("CKV_EMU_POISON");
    if (v && *v) {
        char *end = NULL;
        unsigned long p = strtoul(v, &end, 0);
        if (*end || p > 255) c.error = std::string("CKV_EMU_POISON=") + v + ": expected a byte value (0-255, 0x00-0xff)";
        else c.poison = (unsigned char)p;
    }
    v = getenv("CKV_EMU_SMS");
    if (v && *v) {
        char *end = NULL;
        long n = strtol(v, &end, 10);
        if (*end || n < 1 || n > 1024) c.error = std::string("CKV_EMU_SMS=") + v + ": expected an SM count (1-1024)";
        else c.sms = (int)n;
    }
    return c;
}

static settings &mutable_config(void) {
    static settings c = parse_settings();
    return c;
}

const settings &config(void) { return mutable_config(); }

/* Parses forward | reverse | random:SEED into c; false when it is none of them. */
static bool parse_schedule(const char *v, settings *c) {
    char *end = NULL;
    if (strcmp(v, "forward") == 0) c->schedule = SCHED_FORWARD;
    else if (strcmp(v, "reverse") == 0) c->schedule = SCHED_REVERSE;
    else if (strncmp(v, "random:", 7) == 0 && v[7] && (c->seed = strtoull(v + 7, &end, 10), *end == '\0'))
        c->schedule = SCHED_RANDOM;
    else return false;
    return true;
}

int ckv_emu_set_schedule(const char *spec) {
    LOCKED;
    settings c = mutable_config();
    if (!spec || !parse_schedule(spec, &c)) return -1;
    mutable_config() = c;
    return 0;
}

/* ---- machine state ------------------------------------------------------------------------------ */

machine &mach(void) {
    static machine *m = [] {
        machine *n = new machine; /* never destroyed: the device thread may outlive main */
        for (int d = 0; d < MAX_DEVICES; d++) n->devs[d].sms = config().sms;
        return n;
    }();
    return *m;
}

static thread_local int tl_device = 0;                 /* cudaSetDevice is per host thread */
static thread_local cudaError_t tl_last = cudaSuccess; /* cudaGetLastError is per host thread */

int current_device(void) { return tl_device; }

static cudaError_t set_last(cudaError_t e) {
    if (e != cudaSuccess && tl_last == cudaSuccess) tl_last = e;
    return e;
}

static device_state &dev(int d) { return mach().devs[d]; }

void fault(int d, cudaError_t e, const char *fmt, ...) {
    device_state &s = dev(d);
    if (s.sticky != cudaSuccess) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    s.sticky = e;
    s.message = buf;
}

/* A bad setting is every device's error from the start (the first call names it). */
static cudaError_t settings_status(int d) {
    if (config().error.empty()) return cudaSuccess;
    fault(d, cudaErrorInvalidValue, "ckv-emu: %s", config().error.c_str());
    return cudaErrorInvalidValue;
}

/* What a synchronising call reports: surfaces a pending injected fault first. */
static cudaError_t sync_status(int d) {
    device_state &s = dev(d);
    if (s.fault_pending) {
        s.fault_pending = false;
        s.sticky = cudaErrorIllegalAddress;
    }
    return s.sticky;
}

alloc *find_alloc(const void *p, size_t bytes, uintptr_t *base) {
    std::map<uintptr_t, alloc> &a = mach().allocs;
    uintptr_t u = (uintptr_t)p;
    auto it = a.upper_bound(u);
    if (it == a.begin()) return NULL;
    --it;
    if (!it->second.live || u < it->first || u + bytes > it->first + it->second.bytes || u + bytes < u) return NULL;
    if (base) *base = it->first;
    return &it->second;
}

static bool is_device(const void *p, size_t bytes) { return find_alloc(p, bytes, NULL) != NULL; }

/* [p, p + bytes) inside one cudaMallocHost allocation */
static bool is_pinned(const void *p, size_t bytes) {
    const std::map<uintptr_t, size_t> &m = mach().pinned;
    auto it = m.upper_bound((uintptr_t)p);
    if (it == m.begin()) return false;
    --it;
    return (uintptr_t)p + bytes <= it->first + it->second;
}

void mark_written(const void *p, size_t bytes) {
    if (!config().check || bytes == 0) return;
    uintptr_t base = 0;
    alloc *a = find_alloc(p, bytes, &base);
    if (!a || a->init.empty()) return;
    for (size_t i = (uintptr_t)p - base, e = i + bytes; i < e; i++) a->init[i >> 3] |= (uint8_t)(1u << (i & 7));
}

/* ---- devices ---------------------------------------------------------------------------------- */

cudaError_t cudaGetDeviceCount(int *count) {
    LOCKED;
    *count = mach().count;
    return mach().count > 0 ? cudaSuccess : set_last(cudaErrorNoDevice);
}

cudaError_t cudaDeviceGetPCIBusId(char *id, int len, int device) {
    LOCKED;
    if (device < 0 || device >= mach().count) return set_last(cudaErrorInvalidDevice);
    if (len < 1) return set_last(cudaErrorInvalidValue);
    snprintf(id, (size_t)len, "cuda-emu (host memory)");
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
    LOCKED;
    if (mach().count == 0) return set_last(cudaErrorNoDevice);
    if (device < 0 || device >= mach().count) return set_last(cudaErrorInvalidDevice);
    if (settings_status(device)) return set_last(cudaErrorInvalidValue);
    tl_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device) {
    *device = tl_device;
    return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device) {
    LOCKED;
    if (device < 0 || device >= mach().count) return set_last(cudaErrorInvalidDevice);
    switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = dev(device).sms; break;
    case cudaDevAttrComputeCapabilityMajor: *value = dev(device).major; break;
    case cudaDevAttrComputeCapabilityMinor: *value = dev(device).minor; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; break;
    default: return set_last(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes) {
    LOCKED;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    *total_bytes = (size_t)pages * (size_t)page;
    *free_bytes = *total_bytes / 2;
    return dev(tl_device).sticky;
}

/* ---- memory ----------------------------------------------------------------------------------- */

static const unsigned char CANARY = 0xcb;
static unsigned long long alloc_calls; /* cudaMalloc calls that allocated (ckv_emu_alloc_calls) */

unsigned long long ckv_emu_alloc_calls(void) {
    LOCKED;
    return alloc_calls;
}

unsigned long long ckv_emu_host_waits(void) {
    LOCKED;
    return mach().host_waits;
}

void ckv_emu_launches(unsigned long long *kernels, unsigned long long *gemms) {
    LOCKED;
    if (kernels) *kernels = mach().launches;
    if (gemms) *gemms = mach().gemms;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
    LOCKED;
    *ptr = NULL;
    const int d = tl_device;
    if (capture_refuse()) return set_last(cudaErrorStreamCaptureUnsupported);
    if (settings_status(d)) return set_last(cudaErrorInvalidValue);
    if (dev(d).sticky) return dev(d).sticky;
    if (bytes == 0) return cudaSuccess;
    size_t total = (RED_ZONE + bytes + RED_ZONE + 255) & ~(size_t)255;
    if (total < bytes) return set_last(cudaErrorMemoryAllocation);
    unsigned char *raw = (unsigned char *)aligned_alloc(256, total);
    if (!raw) return set_last(cudaErrorMemoryAllocation);
    alloc_calls++;
    unsigned char *p = raw + RED_ZONE;
    memset(raw, CANARY, RED_ZONE);
    memset(p, config().poison, bytes); /* fresh device memory is garbage: NaN in f32 and bf16 by default */
    memset(p + bytes, CANARY, total - RED_ZONE - bytes);
    /* forget freed allocations the new one overlaps */
    std::map<uintptr_t, alloc> &a = mach().allocs;
    const uintptr_t lo = (uintptr_t)raw, hi = lo + total;
    auto it = a.lower_bound(lo > (1u << 30) ? lo - (1u << 30) : 0);
    while (it != a.end() && it->first < hi + RED_ZONE) {
        if (!it->second.live && it->first + it->second.bytes + RED_ZONE > lo) it = a.erase(it);
        else ++it;
    }
    alloc &rec = a[(uintptr_t)p];
    rec = alloc();
    rec.bytes = bytes;
    rec.device = d;
    if (config().check) {
        rec.init.assign((bytes + 7) / 8, 0);
        rec.shadow.assign((bytes + 4095) / 4096, NULL);
    }
    *ptr = p;
    return cudaSuccess;
}

static void drop_shadow(alloc &a) {
    for (race_cell *c : a.shadow) free(c);
    a.shadow.clear();
    a.shadow.shrink_to_fit();
    a.init.clear();
    a.init.shrink_to_fit();
}

static void drain_device(int d);

cudaError_t cudaMallocHost(void **ptr, size_t bytes) {
    LOCKED;
    *ptr = NULL;
    if (capture_refuse()) return set_last(cudaErrorStreamCaptureUnsupported);
    if (bytes == 0) return cudaSuccess;
    void *p = aligned_alloc(256, (bytes + 255) & ~(size_t)255);
    if (!p) return set_last(cudaErrorMemoryAllocation);
    mach().pinned[(uintptr_t)p] = bytes;
    *ptr = p;
    return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr) {
    LOCKED;
    if (!ptr) return cudaSuccess;
    if (capture_refuse()) return set_last(cudaErrorStreamCaptureUnsupported);
    auto it = mach().pinned.find((uintptr_t)ptr);
    if (it == mach().pinned.end()) return set_last(cudaErrorInvalidValue);
    for (int d = 0; d < mach().count; d++) drain_device(d); /* queued copies may still read it */
    mach().pinned.erase(it);
    free(ptr);
    return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
    LOCKED;
    if (!ptr) return cudaSuccess;
    if (capture_refuse()) return set_last(cudaErrorStreamCaptureUnsupported);
    auto it = mach().allocs.find((uintptr_t)ptr);
    if (it == mach().allocs.end() || !it->second.live) return set_last(cudaErrorInvalidValue);
    drain_device(it->second.device); /* as on a device: the work queued before the free completes */
    if (config().check) check_red_zones(it->second.device, "(before cudaFree)");
    it->second.live = false;
    drop_shadow(it->second);
    free((unsigned char *)ptr - RED_ZONE);
    return cudaSuccess;
}

/* ---- streams and events ------------------------------------------------------------------------ */

struct ckv_emu_event {
    int device;
    ckv_emu_stream *stream = NULL; /* of the last record; NULL: never recorded (complete) */
    uint64_t seq = 0;
    uint64_t capture = 0;          /* capture_id of the capture that recorded it last (0: none) */
};

static ckv_emu_stream *new_stream(int device, unsigned flags, bool legacy) {
    ckv_emu_stream *s = new ckv_emu_stream;
    s->device = device;
    s->flags = flags;
    s->legacy = legacy;
    mach().streams.push_back(s);
    return s;
}

ckv_emu_stream *stream_of(cudaStream_t s) {
    if (s) return s;
    const int d = tl_device;
    if (!mach().legacy[d]) mach().legacy[d] = new_stream(d, 0, true);
    return mach().legacy[d];
}

/* A stream another one waits on may have been destroyed since (after its work ran). */
static bool stream_alive(const ckv_emu_stream *s) {
    for (const ckv_emu_stream *o : mach().streams)
        if (o == s) return true;
    return false;
}

void stream_run(ckv_emu_stream *s, uint64_t upto) {
    while (!s->q.empty() && s->q.front().seq <= upto) {
        work w = std::move(s->q.front());
        s->q.pop_front();
        w.fn();
        s->done = w.seq;
    }
}

uint64_t stream_push(cudaStream_t st, std::function<void()> fn) {
    ckv_emu_stream *s = stream_of(st);
    if (s->cap) {
        capture_record(s, std::move(fn));
        return 0;
    }
    /* the legacy stream waits for the blocking streams of its device and they for it */
    std::vector<std::pair<ckv_emu_stream *, uint64_t>> deps;
    if (s->legacy) {
        for (ckv_emu_stream *b : mach().streams)
            if (b != s && b->device == s->device && !(b->flags & cudaStreamNonBlocking) && !b->q.empty())
                deps.push_back({b, b->next - 1});
    } else if (!(s->flags & cudaStreamNonBlocking)) {
        ckv_emu_stream *l = mach().legacy[s->device];
        if (l && !l->q.empty()) deps.push_back({l, l->next - 1});
    }
    if (!deps.empty()) {
        fn = [deps, f = std::move(fn)]() {
            for (auto &d : deps)
                if (stream_alive(d.first)) stream_run(d.first, d.second);
            f();
        };
    }
    const uint64_t seq = s->next++;
    s->q.push_back(work{seq, std::move(fn)});
    return seq;
}

static void run_stream_now(ckv_emu_stream *s, uint64_t upto) {
    mach().host_waits++;
    device_exec([&] { stream_run(s, upto); });
}

static void drain_device(int d) {
    mach().host_waits++;
    device_exec([&] {
        for (bool more = true; more;) {
            more = false;
            for (ckv_emu_stream *s : mach().streams)
                if (s->device == d && !s->q.empty()) stream_run(s, s->next - 1), more = true;
        }
    });
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    LOCKED;
    *s = new_stream(tl_device, flags, false);
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s) {
    LOCKED;
    if (!s) return set_last(cudaErrorInvalidResourceHandle);
    if (capture_refuse()) return set_last(cudaErrorStreamCaptureUnsupported);
    run_stream_now(s, s->next - 1); /* as CUDA: queued work completes, then the stream goes */
    std::vector<ckv_emu_stream *> &v = mach().streams;
    for (size_t i = 0; i < v.size(); i++)
        if (v[i] == s) v.erase(v.begin() + (long)i), i = v.size();
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t st) {
    LOCKED;
    if (capture_refuse()) return set_last(cudaErrorStreamCaptureUnsupported);
    ckv_emu_stream *s = stream_of(st);
    run_stream_now(s, s->next - 1);
    return sync_status(s->device);
}

cudaError_t cudaStreamQuery(cudaStream_t st) { return cudaStreamSynchronize(st); }

cudaError_t cudaDeviceSynchronize(void) {
    LOCKED;
    if (capture_refuse()) return set_last(cudaErrorStreamCaptureUnsupported);
    drain_device(tl_device);
    return sync_status(tl_device);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    LOCKED;
    (void)flags;
    *e = new ckv_emu_event;
    (*e)->device = tl_device;
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
    LOCKED;
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st) {
    LOCKED;
    if (!e) return set_last(cudaErrorInvalidResourceHandle);
    ckv_emu_stream *s = stream_of(st);
    if (s->device != e->device) return set_last(cudaErrorInvalidResourceHandle);
    if (dev(s->device).sticky) return dev(s->device).sticky;
    e->capture = capture_id(s);
    e->seq = stream_push(s, [] {});
    e->stream = s->cap ? NULL : s; /* recorded into a graph: nothing for the host to wait on */
    return cudaSuccess;
}

/* Work that completes event e (as recorded now). */
static void event_run(ckv_emu_stream *s, uint64_t seq) {
    if (s && stream_alive(s)) stream_run(s, seq);
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    LOCKED;
    if (!e) return set_last(cudaErrorInvalidResourceHandle);
    if (capture_refuse()) return set_last(cudaErrorStreamCaptureUnsupported);
    ckv_emu_stream *s = e->stream;
    uint64_t seq = e->seq;
    device_exec([&] { event_run(s, seq); });
    return sync_status(e->device);
}

cudaError_t cudaEventQuery(cudaEvent_t e) { return cudaEventSynchronize(e); }

cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t e, unsigned flags) {
    LOCKED;
    (void)flags;
    if (!e) return set_last(cudaErrorInvalidResourceHandle);
    if (e->stream || e->capture) /* recorded (an event never recorded is complete: no dependency) */
        if (cudaError_t c = capture_wait(stream_of(st), e->capture)) return set_last(c);
    ckv_emu_stream *s = e->stream;
    const uint64_t seq = e->seq;
    if (s) stream_push(st, [s, seq] { event_run(s, seq); });
    return dev(stream_of(st)->device).sticky;
}

/* ---- copies ---------------------------------------------------------------------------------- */

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind, cudaStream_t st) {
    LOCKED;
    ckv_emu_stream *s = stream_of(st);
    const int d = s->device;
    if (dev(d).sticky) return dev(d).sticky;
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
    if (s->cap && ((!src_dev && !is_pinned(src, bytes)) || (!dst_dev && !is_pinned(dst, bytes))) &&
        capture_refuse())
        return set_last(cudaErrorStreamCaptureUnsupported);
    const bool dst_pinned = !dst_dev && is_pinned(dst, bytes);
    if (!src_dev && is_pinned(src, bytes)) {
        /* page-locked host memory is read when the copy runs: the host must not touch it before */
        stream_push(s, [=] {
            if (dev(d).sticky) return;
            memcpy(dst, src, bytes);
            if (dst_dev) mark_written(dst, bytes);
        });
        if (!dst_dev && !dst_pinned) run_stream_now(s, s->next - 1);
        return cudaSuccess;
    }
    if (!src_dev) {
        /* pageable host memory is staged at the call (the host may reuse it at once) */
        std::shared_ptr<std::vector<unsigned char>> staged =
            std::make_shared<std::vector<unsigned char>>((const unsigned char *)src, (const unsigned char *)src + bytes);
        stream_push(s, [=] {
            if (dev(d).sticky) return;
            memcpy(dst, staged->data(), bytes);
            mark_written(dst, bytes);
        });
        if (!dst_dev && !dst_pinned) run_stream_now(s, s->next - 1);
        return cudaSuccess;
    }
    const uint64_t seq = stream_push(s, [=] {
        if (dev(d).sticky) return;
        memmove(dst, src, bytes);
        if (dst_dev) mark_written(dst, bytes);
    });
    /* into pageable host memory the call returns once the copy is done (so the stream's earlier work
     * is done too, and a fault it raised is this call's error); into page-locked memory it is queued
     * like any other work */
    if (!dst_dev && !dst_pinned) {
        run_stream_now(s, seq);
        return sync_status(d);
    }
    return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
    LOCKED;
    if (capture_refuse()) return set_last(cudaErrorStreamCaptureUnsupported);
    cudaError_t e = sync_status(tl_device);
    if (e) return e;
    e = cudaMemcpyAsync(dst, src, bytes, kind, NULL);
    if (e) return e;
    ckv_emu_stream *s = stream_of(NULL);
    run_stream_now(s, s->next - 1); /* synchronous: after the legacy stream's work */
    return sync_status(tl_device);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t st) {
    LOCKED;
    ckv_emu_stream *s = stream_of(st);
    const int d = s->device;
    if (dev(d).sticky) return dev(d).sticky;
    if (bytes == 0) return cudaSuccess;
    if (!is_device(dst, bytes)) return set_last(cudaErrorInvalidValue);
    stream_push(s, [=] {
        if (dev(d).sticky) return;
        memset(dst, value, bytes);
        mark_written(dst, bytes);
    });
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t bytes) {
    LOCKED;
    if (capture_refuse()) return set_last(cudaErrorStreamCaptureUnsupported);
    cudaError_t e = cudaMemsetAsync(dst, value, bytes, NULL);
    if (e) return e;
    ckv_emu_stream *s = stream_of(NULL);
    run_stream_now(s, s->next - 1);
    return sync_status(tl_device);
}

/* ---- launches ---------------------------------------------------------------------------------- */

cudaError_t ckv_emu_func_set_attribute(const void *fn, cudaFuncAttribute attr, int value) {
    LOCKED;
    if (fn == NULL) return set_last(cudaErrorInvalidValue);
    if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > 227 * 1024)
        return set_last(cudaErrorInvalidValue); /* beyond cudaDevAttrMaxSharedMemoryPerBlockOptin */
    dev(tl_device).dyn_smem_optin[fn] = value;
    return cudaSuccess;
}

void ckv_emu_submit(const char *kernel, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                    void (*tramp)(void *), void *args, size_t args_bytes, void (*destroy)(void *),
                    const void *const *ptrs, int n_ptrs) {
    LOCKED;
    ckv_emu_stream *s = stream_of(st);
    const int d = s->device;
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    const auto optin = dev(d).dyn_smem_optin.find(fn);
    const size_t smem_max = optin != dev(d).dyn_smem_optin.end() && optin->second > 48 * 1024 ? (size_t)optin->second
                                                                                                : 48 * 1024;
    cudaError_t bad = cudaSuccess;
    if (dev(d).sticky) bad = dev(d).sticky;
    else if (threads == 0 || threads > 1024 || block.z > 64 || grid.x == 0 || grid.y == 0 || grid.z == 0 ||
             grid.x > 0x7fffffffu || grid.y > 65535 || grid.z > 65535 || smem > smem_max)
        bad = set_last(cudaErrorInvalidConfiguration);
    else if (d != tl_device)
        bad = set_last(cudaErrorInvalidResourceHandle); /* a stream of another device than the current one */
    if (bad) {
        destroy(args);
        return;
    }
    std::vector<const void *> p(ptrs, ptrs + n_ptrs);
    if (!s->cap) mach().launches++;
    /* the arguments live as long as the work (a graph replays them) */
    std::shared_ptr<void> a(args, destroy);
    stream_push(s, [=] { exec_launch(d, kernel, grid, block, tramp, a.get(), args_bytes, p.data(), (int)p.size()); });
}

/* ---- errors ---------------------------------------------------------------------------------- */

cudaError_t cudaGetLastError(void) {
    LOCKED;
    if (dev(tl_device).sticky) return dev(tl_device).sticky;
    cudaError_t e = tl_last;
    tl_last = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) {
    LOCKED;
    return dev(tl_device).sticky ? dev(tl_device).sticky : tl_last;
}

const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e) {
    LOCKED;
    device_state &s = dev(tl_device);
    if (e != cudaSuccess && e == s.sticky && !s.message.empty()) return s.message.c_str();
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "capture was not initiated in this stream";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    }
    return "unknown error";
}

/* ---- test hooks ------------------------------------------------------------------------------ */

void ckv_emu_set_devices(int count, int major, int minor) {
    LOCKED;
    mach().count = count < 0 ? 0 : count > MAX_DEVICES ? MAX_DEVICES : count;
    for (int d = 0; d < MAX_DEVICES; d++) dev(d).major = major, dev(d).minor = minor;
}

void ckv_emu_set_sms(int sms) {
    LOCKED;
    for (int d = 0; d < MAX_DEVICES; d++) dev(d).sms = sms < 1 ? config().sms : sms;
}

void ckv_emu_inject_fault(const char *kernel) {
    LOCKED;
    dev(tl_device).inject = kernel ? kernel : "";
}

void ckv_emu_reset(void) {
    LOCKED;
    for (ckv_emu_stream *s : mach().streams) s->q.clear(), s->done = s->next - 1;
    for (auto &a : mach().allocs)
        if (a.second.live) {
            drop_shadow(a.second);
            free((unsigned char *)a.first - RED_ZONE);
        }
    mach().allocs.clear();
    for (int d = 0; d < MAX_DEVICES; d++) {
        device_state &s = dev(d);
        s.sticky = cudaSuccess;
        s.message.clear();
        s.inject.clear();
        s.fault_pending = false;
    }
    tl_last = cudaSuccess;
}

} // namespace ckv_emu
