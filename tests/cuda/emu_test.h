/* emu_test.h - what the CPU execution layer's own tests share: a failure count, EXPECT (prints the
 * condition, the place and a message, counts it, goes on), the verdict and a device float
 * allocation that aborts on failure. Test-only; include after cuda_rt.h. */
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

/* The test's exit status, with its verdict on stderr. */
[[maybe_unused]] static int emu_test_finish(const char *name) {
    if (failures) fprintf(stderr, "%s: %d check(s) FAILED\n", name, failures);
    else fprintf(stderr, "%s: all checks passed\n", name);
    return failures ? 1 : 0;
}

[[maybe_unused]] static float *dev_floats(size_t n) {
    void *p = NULL;
    if (cudaMalloc(&p, n * sizeof(float)) != cudaSuccess) abort();
    return (float *)p;
}

#endif
