/* graph_test.h - what the tests of recorded decode steps share: a pair of CUDA backends, one with
 * recorded steps off (CKV_CUDA_GRAPHS=0) and one with them on, and what the CPU execution layer
 * (cuda-emu) counts of a stretch of backend work: host waits, kernel and GEMM launches from the
 * host, device allocations, and CUDA graph captures and launches, read before and after it (the
 * layer's counters, backend/cuda/cuda_emu.h: on a GPU they stay 0). Tests only; include with
 * _POSIX_C_SOURCE 200809L defined (setenv). */
#ifndef CKV_GRAPH_TEST_H
#define CKV_GRAPH_TEST_H

#include <stdlib.h>

#include "backend/cuda/cuda_emu.h"
#include "cuda_test_backend.h"

/* Opens *off (CKV_CUDA_GRAPHS=0, read at init: every step unrecorded) and *on (recording on) as
 * cuda_test_open does: -1 with both open, or the exit code main should return (neither left open). */
static inline int graph_test_open(int argc, char **argv, const char *test, ckv_backend **off, ckv_backend **on) {
    setenv("CKV_CUDA_GRAPHS", "0", 1);
    int rc = cuda_test_open(argc, argv, test, off);
    unsetenv("CKV_CUDA_GRAPHS");
    if (rc >= 0) return rc;
    rc = cuda_test_open(argc, argv, test, on);
    if (rc >= 0) {
        ckv_backend_free(*off);
        *off = NULL;
    }
    return rc;
}

typedef struct {
    unsigned long long waits, kernels, gemms, allocs, captures, graph_launches;
} emu_counts;

static inline emu_counts emu_counts_now(void) {
    emu_counts c;
    c.waits = ckv_cuda_emu_host_waits();
    ckv_cuda_emu_launches(&c.kernels, &c.gemms);
    c.allocs = ckv_cuda_emu_alloc_calls();
    ckv_cuda_emu_graph_counts(&c.captures, &c.graph_launches);
    return c;
}

/* The counts of the work between two readings a and b (b later). */
static inline emu_counts emu_counts_between(emu_counts a, emu_counts b) {
    return (emu_counts){b.waits - a.waits, b.kernels - a.kernels, b.gemms - a.gemms, b.allocs - a.allocs,
                        b.captures - a.captures, b.graph_launches - a.graph_launches};
}

/* The counts of the work since a (emu_counts_now before it). */
static inline emu_counts emu_counts_since(emu_counts a) { return emu_counts_between(a, emu_counts_now()); }

#endif
