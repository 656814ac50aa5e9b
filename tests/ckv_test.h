/* ckv_test.h - the tiny test harness every test executable uses: checks that count failures and
 * print where, array comparison that prints the first mismatches and the max error, skip (exit 77),
 * the one seeded generator of random test data and the one allocation helper.
 * Header-only; tests only. */
#ifndef CKV_TEST_H
#define CKV_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static int ckv_test_failures = 0;


#define CKV_SKIP_CODE 77

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
            ckv_test_failures++;                                                      \
        }                                                                             \
    } while (0)

#define CHECK_MSG(cond, ...)                                                          \
    do {                                                                              \
        if (!(cond)) {                                                                \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                             \
            fprintf(stderr, "\n");                                                    \
            ckv_test_failures++;                                                      \
        }                                                                             \
    } while (0)

/* Checks a call returning ckv_status succeeded; prints the library's message otherwise. */
#define CHECK_OK(expr)                                                                \
    do {                                                                              \
        ckv_status s_ = (expr);                                                       \
        if (s_ != CKV_STATUS_OK) {                                                    \
            fprintf(stderr, "FAIL %s:%d: %s -> %s: %s\n", __FILE__, __LINE__, #expr,  \
                    ckv_status_string(s_), ckv_error_message());                      \
            ckv_test_failures++;                                                      \
        }                                                                             \
    } while (0)

/* Checks a call fails with `code` and that its message contains `needle`. */
#define CHECK_FAILS(expr, code, needle)                                               \
    do {                                                                              \
        ckv_error_clear();                                                            \
        ckv_status s_ = (expr);                                                       \
        if (s_ != (code)) {                                                           \
            fprintf(stderr, "FAIL %s:%d: %s -> %s (%s), expected %s\n", __FILE__,     \
                    __LINE__, #expr, ckv_status_string(s_), ckv_error_message(),      \
                    ckv_status_string(code));                                         \
            ckv_test_failures++;                                                      \
        } else if (!strstr(ckv_error_message(), (needle))) {                          \
            fprintf(stderr, "FAIL %s:%d: %s: message '%s' lacks '%s'\n", __FILE__,    \
                    __LINE__, #expr, ckv_error_message(), (needle));                  \
            ckv_test_failures++;                                                      \
        }                                                                             \
    } while (0)

/* Compares got against ref: |got - ref| <= atol + rtol * |ref|. Prints the first 5 mismatches and
 * the max abs error; returns the max abs error and counts a failure on any mismatch. */
static inline double ckv_test_allclose(const char *what, const float *got, const float *ref, size_t n,
                                       double atol, double rtol) {
    double max_err = 0.0;
    size_t bad = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (!(d <= max_err) || d != d) {
            max_err = d != d ? INFINITY : d;
            worst = i;
        }
        if (!(d <= atol + rtol * fabs((double)ref[i]))) {
            if (bad < 5)
                fprintf(stderr, "  %s[%zu]: got %.8g, expected %.8g (diff %.3g)\n", what, i, got[i], ref[i], d);
            bad++;
        }
    }
    if (bad) {
        fprintf(stderr, "FAIL %s: %zu of %zu values differ; max |diff| %.3g at %zu (atol %g, rtol %g)\n", what,
                bad, n, max_err, worst, atol, rtol);
        ckv_test_failures++;
    } else {
        fprintf(stderr, "ok   %s: %zu values, max |diff| %.3g\n", what, n, max_err);
    }
    return max_err;
}

/* Ends main: prints a summary and returns the exit code. */
static inline int ckv_test_finish(const char *name) {
    if (ckv_test_failures) {
        fprintf(stderr, "%s: %d check(s) FAILED\n", name, ckv_test_failures);
        return 1;
    }
    fprintf(stderr, "%s: all checks passed\n", name);
    return 0;
}

/* The tests' one random generator: xorshift64 over *state (a non-zero seed); every draw below steps it
 * once, so a test's data is a fixed function of its seed. */
static inline uint64_t ckv_test_rng_next(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* The next 32 random bits. */
static inline uint32_t ckv_test_rng_u32(uint64_t *state) { return (uint32_t)(ckv_test_rng_next(state) >> 32); }

/* A uniform double in [0, 1) (53 bits). */
static inline double ckv_test_rng_double(uint64_t *state) {
    return (double)(ckv_test_rng_next(state) >> 11) * (1.0 / 9007199254740992.0);
}

/* x[i] uniform in [lo, hi), drawn in double precision. */
static inline void ckv_test_fill(uint64_t *state, float *x, size_t n, double lo, double hi) {
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * ckv_test_rng_double(state));
}

/* A uniform float in [lo, hi) from *state. */
static inline float ckv_test_uniform(uint64_t *state, float lo, float hi) {
    return lo + (hi - lo) * (float)(ckv_test_rng_u32(state) >> 8) * (1.0f / 16777216.0f);
}

/* Zeroed memory, or the test exits saying so. */
static inline void *ckv_test_calloc(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static inline int ckv_test_skip(const char *why) {
    fprintf(stderr, "SKIP: %s\n", why);
    return CKV_SKIP_CODE;
}

#endif
