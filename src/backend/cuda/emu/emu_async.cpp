/* emu_async.cpp - the CPU execution layer's side of cp.async and ldmatrix (the kernels call them
 * through ../ckv_async.h; semantics from the PTX ISA, docs/gpu.md §1 and §1a). cp.async: per
 * emulated thread of the running block, the copies issued since the last commit_group (the open
 * group) and the committed groups, oldest first, each copy holding the bytes its issue read;
 * wait_group N hands the copies of all but the N newest groups back to the kernel, which stores
 * them (so the instrumented store is where the checks and counters see the shared write). State
 * left by an earlier block or launch is dropped when a thread of a new one first issues. ldmatrix:
 * the warp collective that deals the rows the lanes read into fragments. It reads and writes no
 * kernel memory itself and is not instrumented. */
#include "../ckv_async.h"
#include "emu_internal.h"

#include <stdio.h>

#include <deque>
#include <vector>

namespace ckv_emu {

namespace {

struct copy {
    void *dst;
    unsigned bytes;
    unsigned char data[16];
};

struct thread_copies {
    uint64_t launch = 0;
    unsigned block = ~0u;
    std::vector<copy> open;
    std::deque<std::vector<copy>> groups; /* committed, oldest first */
};

std::vector<thread_copies> g_threads; /* by linear thread index of the running block */

thread_copies &mine(void) {
    thread_ctx *t = running();
    if (!t) kill_running(cudaErrorLaunchFailure, "cp.async outside a kernel");
    if (g_threads.size() < t->threads) g_threads.resize(t->threads);
    thread_copies &c = g_threads[t->tid];
    if (c.launch != t->launch || c.block != t->block_linear) {
        c.launch = t->launch, c.block = t->block_linear;
        c.open.clear();
        c.groups.clear();
    }
    return c;
}

bool in_shared(const void *p, unsigned bytes) {
    const ranges &r = exec_ranges();
    const uintptr_t a = (uintptr_t)p;
    return a >= r.shared_lo && a + bytes <= r.shared_hi;
}

[[noreturn]] void bad(const char *what, const void *dst, const void *src, unsigned bytes) {
    const thread_ctx *t = running();
    char buf[224];
    snprintf(buf, sizeof buf, "%s: %u bytes from %p to %p by thread (%u,%u,%u)", what, bytes, src, dst,
             t ? t->thread.x : 0u, t ? t->thread.y : 0u, t ? t->thread.z : 0u);
    kill_running(cudaErrorIllegalAddress, buf);
}

} // namespace

void ckv_emu_cp_async_check(const void *dst, const void *src, unsigned bytes) {
    if (bytes != 4 && bytes != 8 && bytes != 16) bad("cp.async: the size must be 4, 8 or 16 bytes", dst, src, bytes);
    if (((uintptr_t)dst | (uintptr_t)src) % bytes != 0)
        bad("cp.async: misaligned address (both must be aligned to the size)", dst, src, bytes);
    if (!in_shared(dst, bytes)) bad("cp.async: the destination is not __shared__ memory", dst, src, bytes);
}

void ckv_emu_cp_async_push(void *dst, const void *data, unsigned bytes) {
    copy c;
    c.dst = dst, c.bytes = bytes;
    if (data)
        memcpy(c.data, data, bytes);
    else
        memset(c.data, 0, sizeof c.data);
    mine().open.push_back(c);
}

void ckv_emu_cp_async_commit(void) {
    thread_copies &c = mine();
    c.groups.push_back(std::move(c.open)); /* an empty group is legal */
    c.open.clear();
}

int ckv_emu_cp_async_pop(int n, void **dst, void *data, unsigned *bytes) {
    thread_copies &c = mine();
    while ((int)c.groups.size() > n) {
        std::vector<copy> &g = c.groups.front();
        if (g.empty()) {
            c.groups.pop_front();
            continue;
        }
        const copy &x = g.front();
        *dst = x.dst, *bytes = x.bytes;
        memcpy(data, x.data, x.bytes);
        g.erase(g.begin());
        return 1;
    }
    return 0;
}

void ckv_emu_ldmatrix_check(const void *row) {
    if ((uintptr_t)row % 16 != 0) bad("ldmatrix: a row address is not 16-byte aligned", row, row, 16);
    if (!in_shared(row, 16)) bad("ldmatrix: a row address is not __shared__ memory", row, row, 16);
}

/* Matrix m's rows are the rows of lanes 8m..8m+7; element (i, j) is bf16 j of row i. Lane l gets
 * (l >> 2, 2(l & 3)) and (l >> 2, 2(l & 3) + 1), or with .trans (2(l & 3), l >> 2) and
 * (2(l & 3) + 1, l >> 2); the lower-indexed element in the low half. */
void ckv_emu_ldmatrix_fn(void *lanes[32], unsigned mask) {
    (void)mask; /* full: the rendezvous required every lane */
    const ckv_emu_ldmatrix_lane *l0 = (const ckv_emu_ldmatrix_lane *)lanes[0];
    uint16_t el[4][8][8];
    for (int m = 0; m < l0->x; m++)
        for (int i = 0; i < 8; i++) {
            const ckv_emu_ldmatrix_lane *src = (const ckv_emu_ldmatrix_lane *)lanes[8 * m + i];
            memcpy(el[m][i], src->row, 16);
        }
    for (int l = 0; l < 32; l++) {
        ckv_emu_ldmatrix_lane *me = (ckv_emu_ldmatrix_lane *)lanes[l];
        const int g = l >> 2, t = l & 3;
        for (int m = 0; m < l0->x; m++) {
            const uint16_t lo = l0->trans ? el[m][2 * t][g] : el[m][g][2 * t];
            const uint16_t hi = l0->trans ? el[m][2 * t + 1][g] : el[m][g][2 * t + 1];
            me->out[m] = (uint32_t)lo | (uint32_t)hi << 16;
        }
    }
}

} // namespace ckv_emu
