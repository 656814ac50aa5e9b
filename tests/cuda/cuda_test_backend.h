/* cuda_test_backend.h - how the CUDA tests open the backend they check, from their first argument:
 * "cuda-emu" (the kernels on the CPU execution layer; the default) or "cuda" (a GPU: skipped, with
 * the reason, in a build without CUDA or on a machine without a GPU), how they move test data to
 * and from a backend's memory (any backend: the CPU reference too), and the sampling comparison two
 * of them share. Tests only. */
#ifndef CKV_CUDA_TEST_BACKEND_H
#define CKV_CUDA_TEST_BACKEND_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_emu.h"
#include "ckv_test.h"
#include "engine/sampler.h"

/* Returns -1 with *dev open, or the exit code main should return (skip, usage, failure). */
static inline int cuda_test_open(int argc, char **argv, const char *test, ckv_backend **dev) {
    const char *which = argc > 1 ? argv[1] : "cuda-emu";
    ckv_status s;
    *dev = NULL;
    if (strcmp(which, "cuda-emu") == 0) {
        s = ckv_backend_cuda_emu_init(dev, 0);
    } else if (strcmp(which, "cuda") == 0) {
        if (!ckv_backend_cuda_available()) return ckv_test_skip("this build has no CUDA backend (nvcc not found)");
        s = ckv_backend_init(dev, "cuda", 0);
        if (s == CKV_STATUS_ERR_DEVICE && strstr(ckv_error_message(), "no CUDA GPU"))
            return ckv_test_skip(ckv_error_message());
    } else {
        fprintf(stderr, "usage: %s cuda-emu|cuda\n", test);
        return 2;
    }
    if (s != CKV_STATUS_OK) {
        fprintf(stderr, "FAIL: %s backend: %s\n", which, ckv_error_message());
        return 1;
    }
    return -1;
}

/* A buffer of `bytes` on `be` holding `host` (4 bytes when bytes is 0). Exits the test on failure. */
static inline void *cuda_test_upload(ckv_backend *be, const void *host, size_t bytes) {
    void *d = NULL;
    ckv_status s = be->ops->alloc(be, &d, bytes ? bytes : 4, "test buffer");
    if (s == CKV_STATUS_OK && bytes) s = be->ops->upload(be, d, host, bytes);
    if (s != CKV_STATUS_OK) {
        fprintf(stderr, "FAIL %s: cannot allocate/upload %zu bytes: %s\n", be->name, bytes, ckv_error_message());
        exit(1);
    }
    return d;
}

/* `bytes` of `dev` into `host` after the backend's queued work: a failure counts and is printed. */
static inline void cuda_test_download(ckv_backend *be, void *host, const void *dev, size_t bytes) {
    ckv_status s = be->ops->sync(be);
    if (s == CKV_STATUS_OK) s = be->ops->download(be, host, dev, bytes);
    CHECK_MSG(s == CKV_STATUS_OK, "%s: %s", be->name, ckv_error_message());
}

/* The sample op of dev (into got) and of ref (into want) on rows x [rows, V] (host, rows <= 16) with
 * draws u [rows] (host); the outputs are poisoned first. */
static inline void cuda_test_sample_pair(ckv_backend *dev, ckv_backend *ref, const float *x, int rows, int V,
                                         float temperature, int top_k, float top_p, const double *u, int32_t *got,
                                         int32_t *want) {
    enum { MAX_ROWS = 16 };
    int32_t poison[MAX_ROWS];
    CHECK_MSG(rows <= MAX_ROWS, "sample: %d rows (at most %d)", rows, MAX_ROWS);
    for (int r = 0; r < MAX_ROWS; r++) poison[r] = -7;
    ckv_backend *bes[2] = {dev, ref};
    int32_t *outs[2] = {got, want};
    for (int w = 0; w < 2 && rows <= MAX_ROWS; w++) {
        ckv_backend *be = bes[w];
        float *xd = (float *)cuda_test_upload(be, x, sizeof(float) * (size_t)rows * V);
        double *ud = (double *)cuda_test_upload(be, u, sizeof(double) * (size_t)rows);
        int32_t *od = (int32_t *)cuda_test_upload(be, poison, sizeof(int32_t) * (size_t)rows);
        be->ops->sample(be, od, xd, rows, V, temperature, top_k, top_p, ud);
        cuda_test_download(be, outs[w], od, sizeof(int32_t) * (size_t)rows);
        be->ops->release(be, xd), be->ops->release(be, ud), be->ops->release(be, od);
    }
}

/* Samples the rows x [rows, V] (host) with the engine's sampler (seed) and with the sample op of dev
 * and of ref, each given the uniform the engine drew for the row: every row's three tokens must be
 * equal. Prints the rows that differ, or the tokens (up to 4) when all agree; counts a failure. */
static inline void cuda_test_sample_agree(ckv_backend *dev, ckv_backend *ref, const float *x, int rows, int V,
                                          float temperature, int top_k, float top_p, uint32_t seed) {
    enum { MAX_ROWS = 16 };
    ckv_sampler_config cfg = {temperature, top_k, top_p, seed, 0.0f};
    ckv_sampler smp;
    if (rows > MAX_ROWS || ckv_sampler_init(&smp, &cfg, V) != CKV_STATUS_OK) {
        CHECK_MSG(0, "sample V=%d: %d rows (at most %d) or no sampler: %s", V, rows, MAX_ROWS, ckv_error_message());
        return;
    }
    double u[MAX_ROWS];
    int32_t want[MAX_ROWS], got[MAX_ROWS], cpu[MAX_ROWS];
    for (int r = 0; r < rows; r++) {
        ckv_sampler peek = smp;
        u[r] = temperature > 0.0f ? ckv_sampler_uniform(&peek) : 0.0;
        want[r] = ckv_sampler_sample(&smp, x + (size_t)r * V);
    }
    cuda_test_sample_pair(dev, ref, x, rows, V, temperature, top_k, top_p, u, got, cpu);
    int bad = 0;
    char toks[64] = "";
    for (int r = 0, n = 0; r < rows; r++) {
        if (got[r] != cpu[r] || cpu[r] != want[r]) {
            fprintf(stderr, "  row %d: %s token %d, cpu op %d, engine sampler %d\n", r, dev->name, got[r], cpu[r],
                    want[r]);
            bad++;
        }
        if (r < 4) n += snprintf(toks + n, sizeof toks - (size_t)n, " %d", got[r]);
    }
    CHECK_MSG(bad == 0, "%s sample V=%d T=%g top_k=%d top_p=%g: %d of %d rows differ", dev->name, V, temperature,
              top_k, top_p, bad, rows);
    if (!bad)
        fprintf(stderr, "ok   %s sample V=%d T=%g top_k=%d top_p=%g: %d rows, tokens%s identical to the cpu op and "
                "the engine sampler\n", dev->name, V, temperature, top_k, top_p, rows, toks);
    ckv_sampler_free(&smp);
}

#endif
