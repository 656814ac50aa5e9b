/* emu_profile.cpp - the per-kernel memory-traffic and tensor-core counters of emu_profile.h: an
 * observer of the CPU execution layer that buffers each warp's accesses until the warp's lanes meet
 * (a warp collective of that warp, a __syncthreads of its block, the end of the launch), then groups
 * them into warp-wide requests by (site, seq) and counts sectors, bank wavefronts and bytes. It
 * does not run kernels or touch their memory; the layer's checks are not here (emu_check.cpp). */
#include "emu_profile.h"

#include <stdlib.h>
#include <string.h>

#include <algorithm>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "ckv_async.h"
#include "ckv_mma.h"
#include "cuda_rt.h"

namespace ckv_emu {

namespace {

struct rec {
    uintptr_t site, addr;
    uint64_t seq;
    unsigned size;
    int kind, space;
};

/* accesses buffered per warp before they are counted without waiting for the lanes to meet (the
 * lanes not yet run are then counted as separate requests; the table says how often) */
constexpr size_t WARP_BUFFER_MAX = (size_t)1 << 22;

struct profiler {
    bool on = false, env_done = false;
    ckv_emu_observer obs = {};
    std::map<std::string, ckv_emu_profile_stats> kernels;
    /* the launch in flight */
    ckv_emu_profile_stats *cur = nullptr;
    dim3 grid;
    std::unordered_map<uint64_t, std::vector<rec>> warps; /* (block linear << 16 | warp) -> its accesses */
    FILE *out = nullptr;
};

profiler &prof() {
    static profiler p;
    return p;
}

/* Bytes of the union of [addr, addr + size) over the group (sorted by addr). */
uint64_t distinct_bytes(const std::vector<const rec *> &g) {
    uint64_t total = 0;
    uintptr_t end = 0;
    for (const rec *r : g) {
        const uintptr_t a = r->addr > end ? r->addr : end, b = r->addr + r->size;
        if (b > a) total += b - a;
        if (b > end) end = b;
    }
    return total;
}

/* One warp-wide request: the lanes' accesses at one (site, seq), sorted by address. */
void count_request(ckv_emu_profile_stats *s, const std::vector<const rec *> &g) {
    uint64_t bytes = 0;
    for (const rec *r : g) bytes += r->size;
    const uint64_t uniq = distinct_bytes(g);
    if (g[0]->space == CKV_EMU_SPACE_SHARED) {
        std::vector<uintptr_t> words;
        for (const rec *r : g)
            for (uintptr_t w = r->addr >> 2; w <= (r->addr + r->size - 1) >> 2; w++) words.push_back(w);
        std::sort(words.begin(), words.end());
        words.erase(std::unique(words.begin(), words.end()), words.end());
        unsigned per_bank[32] = {0}, most = 0;
        for (uintptr_t w : words) most = std::max(most, ++per_bank[w & 31]);
        s->sh_requests++;
        s->sh_bytes += bytes;
        s->sh_wavefronts += most;
        s->sh_ideal_wavefronts += (uniq + 127) / 128;
        return;
    }
    std::vector<uintptr_t> sectors;
    for (const rec *r : g)
        for (uintptr_t x = r->addr >> 5; x <= (r->addr + r->size - 1) >> 5; x++) sectors.push_back(x);
    std::sort(sectors.begin(), sectors.end());
    const uint64_t n = (uint64_t)(std::unique(sectors.begin(), sectors.end()) - sectors.begin());
    if (g[0]->kind == CKV_EMU_READ) {
        s->ld_requests++, s->ld_bytes += bytes, s->ld_sectors += n, s->ld_ideal_sectors += (uniq + 31) / 32;
    } else {
        s->st_requests++, s->st_bytes += bytes, s->st_sectors += n, s->st_ideal_sectors += (uniq + 31) / 32;
    }
}

void flush_warp(profiler &p, std::vector<rec> &v) {
    if (v.empty() || !p.cur) return;
    std::sort(v.begin(), v.end(), [](const rec &a, const rec &b) {
        if (a.site != b.site) return a.site < b.site;
        if (a.seq != b.seq) return a.seq < b.seq;
        if (a.space != b.space) return a.space < b.space;
        if (a.kind != b.kind) return a.kind < b.kind;
        return a.addr < b.addr;
    });
    std::vector<const rec *> g;
    for (size_t i = 0; i < v.size(); i++) {
        g.push_back(&v[i]);
        const bool last = i + 1 == v.size() || v[i + 1].site != v[i].site || v[i + 1].seq != v[i].seq ||
                          v[i + 1].space != v[i].space || v[i + 1].kind != v[i].kind;
        if (last) {
            count_request(p.cur, g);
            g.clear();
        }
    }
    v.clear();
}

void on_begin(void *u, const char *kernel, uint64_t, dim3 grid, dim3) {
    profiler &p = *(profiler *)u;
    p.cur = &p.kernels[kernel];
    p.cur->launches++;
    p.grid = grid;
}

void on_end(void *u, const char *, uint64_t) {
    profiler &p = *(profiler *)u;
    for (auto &w : p.warps) flush_warp(p, w.second);
    p.warps.clear();
    p.cur = nullptr;
}

void on_access(void *u, const ckv_emu_access *a) {
    profiler &p = *(profiler *)u;
    const uint64_t block = a->block.x + (uint64_t)p.grid.x * (a->block.y + (uint64_t)p.grid.y * a->block.z);
    std::vector<rec> &v = p.warps[block << 16 | a->warp];
    v.push_back(rec{a->site, (uintptr_t)a->addr, a->seq, a->size,
                    a->kind == CKV_EMU_READ ? CKV_EMU_READ : CKV_EMU_WRITE, (int)a->space});
    if (v.size() >= WARP_BUFFER_MAX) { /* a warp that runs long without meeting: count what is there */
        flush_warp(p, v);
        p.cur->partial_flushes++;
    }
}

void on_collective(void *u, const char *, unsigned block_linear, unsigned index, ckv_emu_warp_fn fn, unsigned) {
    profiler &p = *(profiler *)u;
    if (fn) {
        if (fn == ckv_mma_16816_fn && p.cur) p.cur->mma++;
        if (fn == ckv_emu_ldmatrix_fn && p.cur) p.cur->ldsm++;
        auto it = p.warps.find((uint64_t)block_linear << 16 | index);
        if (it != p.warps.end()) flush_warp(p, it->second);
        return;
    }
    for (auto &w : p.warps) /* __syncthreads: every warp of the block */
        if (w.first >> 16 == block_linear) flush_warp(p, w.second);
}

void print_at_exit() {
    profiler &p = prof();
    ckv_emu_profile_stop();
    ckv_emu_profile_print(p.out ? p.out : stderr);
    if (p.out) fclose(p.out);
    p.out = nullptr;
}

/* "measured% (ideal%)" of a request kind, or "-" when the kernel made none */
void efficiency(char *buf, size_t n, uint64_t requests, uint64_t bytes, uint64_t sectors, uint64_t ideal) {
    if (!requests)
        snprintf(buf, n, "-");
    else
        snprintf(buf, n, "%.1f%% (%.0f%%)", 100.0 * (double)bytes / (32.0 * (double)sectors),
                 100.0 * (double)bytes / (32.0 * (double)ideal));
}

void size_str(char *buf, size_t n, double bytes) {
    if (bytes >= 1e9)
        snprintf(buf, n, "%.2f GB", bytes / 1e9);
    else if (bytes >= 1e6)
        snprintf(buf, n, "%.2f MB", bytes / 1e6);
    else
        snprintf(buf, n, "%.1f kB", bytes / 1e3);
}

} // namespace

int ckv_emu_profile_start(void) {
    profiler &p = prof();
    p.kernels.clear();
    p.warps.clear();
    p.cur = nullptr;
    if (!ckv_emu_instrumented()) return 0;
    p.obs = {};
    p.obs.user = &p;
    p.obs.launch_begin = on_begin;
    p.obs.launch_end = on_end;
    p.obs.access = on_access;
    p.obs.collective = on_collective;
    ckv_emu_observe(&p.obs);
    p.on = true;
    return 1;
}

void ckv_emu_profile_stop(void) {
    profiler &p = prof();
    if (!p.on) return;
    cudaDeviceSynchronize(); /* queued work runs, and is counted, first */
    ckv_emu_observe(NULL);
    p.on = false;
}

int ckv_emu_profile_get(const char *kernel, ckv_emu_profile_stats *out) {
    const auto it = prof().kernels.find(kernel);
    if (it == prof().kernels.end()) {
        memset(out, 0, sizeof *out);
        return 0;
    }
    *out = it->second;
    return 1;
}

void ckv_emu_profile_print(FILE *f) {
    profiler &p = prof();
    fprintf(f, "cuda-emu profile: per kernel, measured (ideal for the same requests); sectors are 32 bytes, "
               "wavefronts the passes of 32 4-byte banks\n");
    fprintf(f, "%-40s %8s %9s %15s %9s %15s %9s %13s %21s %8s %8s\n", "kernel", "launches", "ld reqs", "ld efficiency",
            "st reqs", "st efficiency", "sh reqs", "sh ways", "global sectors", "mma", "ldsm");
    for (const auto &k : p.kernels) {
        const ckv_emu_profile_stats &s = k.second;
        char ld[32], st[32], sh[32], moved[24], ideal[24], mb[56];
        efficiency(ld, sizeof ld, s.ld_requests, s.ld_bytes, s.ld_sectors, s.ld_ideal_sectors);
        efficiency(st, sizeof st, s.st_requests, s.st_bytes, s.st_sectors, s.st_ideal_sectors);
        if (s.sh_requests)
            snprintf(sh, sizeof sh, "%.2f (1.00)", (double)s.sh_wavefronts / (double)s.sh_ideal_wavefronts);
        else
            snprintf(sh, sizeof sh, "-");
        size_str(moved, sizeof moved, 32.0 * (double)(s.ld_sectors + s.st_sectors));
        size_str(ideal, sizeof ideal, 32.0 * (double)(s.ld_ideal_sectors + s.st_ideal_sectors));
        snprintf(mb, sizeof mb, "%s (%s)", moved, ideal);
        fprintf(f, "%-40s %8llu %9llu %15s %9llu %15s %9llu %13s %21s %8llu %8llu%s\n", k.first.substr(0, 40).c_str(),
                (unsigned long long)s.launches, (unsigned long long)s.ld_requests, ld,
                (unsigned long long)s.st_requests, st, (unsigned long long)s.sh_requests, sh, mb,
                (unsigned long long)s.mma, (unsigned long long)s.ldsm,
                s.partial_flushes ? "  (some warps counted before their lanes met)" : "");
    }
    fflush(f);
}

void ckv_emu_profile_from_env(void) {
    profiler &p = prof();
    if (p.env_done) return;
    p.env_done = true;
    const char *v = getenv("CKV_EMU_PROFILE");
    if (!v || strcmp(v, "1") != 0) return;
    if (!ckv_emu_profile_start()) {
        fprintf(stderr, "cuda-emu: CKV_EMU_PROFILE=1 needs the instrumented kernels (CMake CKV_EMU_INSTRUMENT=ON): "
                        "nothing is counted\n");
        return;
    }
    const char *file = getenv("CKV_EMU_PROFILE_FILE");
    if (file && *file && !(p.out = fopen(file, "w")))
        fprintf(stderr, "cuda-emu: cannot write the profile to %s: printing it to stderr\n", file);
    atexit(print_at_exit);
}

} // namespace ckv_emu
