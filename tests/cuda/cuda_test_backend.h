/* cuda_test_backend.h - how the CUDA tests open the backend they check, from their first argument:
 * "cuda-emu" (the kernels on the CPU execution layer; the default) or "cuda" (a GPU: skipped, with
 * the reason, in a build without CUDA or on a machine without a GPU), and how they move test data
 * to and from a backend's memory (any backend: the CPU reference too). Tests only. */
#ifndef CKV_CUDA_TEST_BACKEND_H
#define CKV_CUDA_TEST_BACKEND_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_emu.h"
#include "ckv_test.h"

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

#endif
