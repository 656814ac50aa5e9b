/* emu_test.h - what the CPU execution layer's own tests share: a failure count, EXPECT (prints the
 * condition, the place and a message, counts it, goes on) and a device float allocation that aborts
 * on failure. Test-only; include after cuda_rt.h. */
#ifndef CKV_EMU_TEST_H
#define CKV_EMU_TEST_H

#include <stdio.h>
#include <stdlib.h>

static int failures = 0;

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
            failures++;                                                     \
        }                                                                   \
    } while (0)

[[maybe_unused]] static float *dev_floats(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) abort();
    return (float *)p;
}

#endif
