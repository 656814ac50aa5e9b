/* test_cpu_gemm.c - the CPU matmul (backend/cpu/cpu_gemm*.c) against a double-precision loop written
 * here: every kernel set this CPU can run (portable, AVX2, AVX-512), odd sizes around the tile edges
 * (n = 1 .. 700, k not a multiple of the vector width or of the k block, m around the panel width),
 * with and without bias, unaligned pointers, k = 0; results must not depend on the thread count (1, 2
 * and 3 threads and no pool, compared bit for bit) and must not write outside out. Also runs the
 * backend's matmul op, which must use the best kernel set, and the linked BLAS (OpenBLAS or BLIS,
 * the op's path on CPUs without vector kernels) when the build has one. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_gemm.h"
#include "ckv_test.h"
#include "core/alloc.h"
#include "core/threadpool.h"

static uint64_t rng_state = 0x2545F4914F6CDD1Dull;


static float rng_uniform(float lo, float hi) { return ckv_test_uniform(&rng_state, lo, hi); }

#define xalloc ckv_test_calloc

static void fill_uniform(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(lo, hi);
}

#define GUARD 19 /* floats before and after out that must keep their value */
#define GUARD_VALUE 12345.0f

static const ckv_gemm_arch *archs[3];
static int n_archs;
static ckv_threadpool *pool1, *pool2, *pool3;

/* One shape on every kernel set; `offset` shifts x, w and out off their 64-byte alignment. */
static void gemm_case(int n, int k, int m, int with_bias, int offset) {
    const size_t sz = (size_t)n * (size_t)m;
    float *xb = xalloc(((size_t)n * k + 16) * sizeof(float)), *wb = xalloc(((size_t)m * k + 16) * sizeof(float));
    float *x = xb + offset, *w = wb + offset; // [n, k], [m, k]
    float *bias = with_bias ? xalloc((size_t)m * sizeof(float)) : NULL;
    float *ref = xalloc(sz * sizeof(float));
    float *outs[4];
    for (int t = 0; t < 4; t++) outs[t] = xalloc((sz + 2 * GUARD + 16) * sizeof(float));
    fill_uniform(x, (size_t)n * k, -1, 1);
    fill_uniform(w, (size_t)m * k, -1, 1);
    if (bias) fill_uniform(bias, (size_t)m, -1, 1);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = bias ? bias[j] : 0.0;
            for (int l = 0; l < k; l++) s += (double)x[(size_t)i * k + l] * w[(size_t)j * k + l];
            ref[(size_t)i * m + j] = (float)s;
        }
    /* fp32 sums of k products of size <= 1 */
    const double atol = 1e-6 + 4e-8 * k;
    for (int a = 0; a < n_archs; a++) {
        ckv_threadpool *pools[4] = {NULL, pool1, pool2, pool3};
        for (int t = 0; t < 4; t++) {
            float *o = outs[t];
            for (size_t i = 0; i < sz + 2 * GUARD + 16; i++) o[i] = GUARD_VALUE;
            ckv_cpu_gemm(pools[t], archs[a], o + GUARD + offset, x, w, bias, n, k, m);
        }
        char what[128];
        snprintf(what, sizeof what, "gemm %s n=%d k=%d m=%d%s%s", archs[a]->name, n, k, m, bias ? " +bias" : "",
                 offset ? " unaligned" : "");
        ckv_test_allclose(what, outs[1] + GUARD + offset, ref, sz, atol, 1e-5);
        size_t guard_bad = 0, diff = 0;
        for (int t = 0; t < 4; t++) {
            const float *o = outs[t];
            for (size_t i = 0; i < (size_t)GUARD + (size_t)offset; i++) guard_bad += o[i] != GUARD_VALUE;
            for (size_t i = GUARD + (size_t)offset + sz; i < sz + 2 * GUARD + 16; i++) guard_bad += o[i] != GUARD_VALUE;
            if (t > 0)
                for (size_t i = 0; i < sz; i++)
                    diff += memcmp(&o[GUARD + offset + i], &outs[0][GUARD + offset + i], sizeof(float)) != 0;
        }
        CHECK_MSG(guard_bad == 0, "%s: %zu values written outside out", what, guard_bad);
        CHECK_MSG(diff == 0, "%s: %zu values differ between thread counts", what, diff);
    }
    free(xb), free(wb), free(bias), free(ref);
    for (int t = 0; t < 4; t++) free(outs[t]);
}

/* Weights packed once (ckv_gemm_pack_all): ckv_gemm_packed_rows on the first m_use columns and
 * ckv_gemm_packed_l1 must give, bit for bit, the products of ckv_cpu_gemm (n > 1) and the 16-lane L1
 * sums of its rows (lane c % 16 over columns ascending, the last m % 16 columns as |y|); a set's dots
 * (w read in place) the same products. */
static void packed_case(int n, int k, int m, int m_use) {
    float *x = xalloc((size_t)n * k * sizeof(float)), *w = xalloc((size_t)m * k * sizeof(float));
    float *ref = xalloc((size_t)n * m * sizeof(float)), *out = xalloc((size_t)n * m * sizeof(float));
    float *lanes = xalloc((size_t)n * 16 * sizeof(float)), *tail = xalloc((size_t)n * 15 * sizeof(float));
    fill_uniform(x, (size_t)n * k, -1, 1);
    fill_uniform(w, (size_t)m * k, -1, 1);
    for (int a = 0; a < n_archs; a++) {
        float *bp = NULL;
        CHECK_OK(ckv_alloc((void **)&bp, ckv_gemm_packed_floats(archs[a], k, m) * sizeof(float), "test panels"));
        ckv_gemm_pack_all(archs[a], bp, w, k, m);
        ckv_cpu_gemm(pool2, archs[a], ref, x, w, NULL, n, k, m);
        for (size_t i = 0; i < (size_t)n * m; i++) out[i] = GUARD_VALUE;
        ckv_gemm_packed_rows(archs[a], out, (size_t)m, x, (size_t)k, bp, n, k, m_use);
        size_t diff = 0, guard_bad = 0;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) {
                const float o = out[(size_t)i * m + j];
                if (j < m_use) diff += memcmp(&o, &ref[(size_t)i * m + j], sizeof o) != 0;
                else guard_bad += o != GUARD_VALUE;
            }
        CHECK_MSG(diff == 0, "packed rows %s n=%d k=%d m=%d of %d: %zu values differ from ckv_cpu_gemm", archs[a]->name,
                  n, k, m_use, m, diff);
        CHECK_MSG(guard_bad == 0, "packed rows %s n=%d k=%d m=%d of %d: %zu columns past m written", archs[a]->name, n,
                  k, m_use, m, guard_bad);
        if (archs[a]->dots) { /* the same products with w's rows read in place */
            for (size_t i = 0; i < (size_t)n * m; i++) out[i] = GUARD_VALUE;
            archs[a]->dots(n, k, x, (size_t)k, w, (size_t)k, m_use, out, (size_t)m);
            size_t dd = 0, dg = 0;
            for (int i = 0; i < n; i++)
                for (int j = 0; j < m; j++) {
                    const float o = out[(size_t)i * m + j], r = ref[(size_t)i * m + j];
                    if (j >= m_use) {
                        dg += o != GUARD_VALUE;
                    } else if (memcmp(&o, &r, sizeof o) != 0 && dd++ < 3) {
                        fprintf(stderr, "  dots %s [%d, %d] = %.9g, product %.9g\n", archs[a]->name, i, j, o, r);
                    }
                }
            CHECK_MSG(dd == 0, "dots %s n=%d k=%d m=%d: %zu values differ from ckv_cpu_gemm", archs[a]->name, n, k, m_use,
                      dd);
            CHECK_MSG(dg == 0, "dots %s n=%d k=%d m=%d of %d: %zu columns past m written", archs[a]->name, n, k, m_use, m,
                      dg);
        }
        memset(lanes, 0, (size_t)n * 16 * sizeof(float));
        ckv_gemm_packed_l1(archs[a], lanes, m % 16 ? tail : NULL, x, (size_t)k, bp, n, k, m);
        size_t l1_diff = 0;
        for (int i = 0; i < n; i++) {
            float ln[16] = {0};
            const float *y = ref + (size_t)i * m;
            int j = 0;
            for (; j + 16 <= m; j += 16)
                for (int l = 0; l < 16; l++) ln[l] += fabsf(y[j + l]);
            for (int l = 0; l < 16; l++) l1_diff += memcmp(&ln[l], &lanes[(size_t)i * 16 + l], sizeof(float)) != 0;
            for (int c = 0; j < m; j++, c++) {
                const float t = fabsf(y[j]);
                l1_diff += memcmp(&t, &tail[(size_t)i * 15 + c], sizeof t) != 0;
            }
        }
        CHECK_MSG(l1_diff == 0, "packed L1 %s n=%d k=%d m=%d: %zu lanes or tails differ from the product's", archs[a]->name,
                  n, k, m, l1_diff);
        ckv_free(bp);
    }
    free(x), free(w), free(ref), free(out), free(lanes), free(tail);
}

/* The linked BLAS (the op's path on CPUs without vector kernels), when the build has one. */
static void blas_case(int n, int k, int m, int with_bias) {
    const size_t sz = (size_t)n * (size_t)m;
    float *x = xalloc(((size_t)n * k + 1) * sizeof(float)), *w = xalloc(((size_t)m * k + 1) * sizeof(float));
    float *bias = with_bias ? xalloc((size_t)m * sizeof(float)) : NULL;
    float *ref = xalloc(sz * sizeof(float)), *o = xalloc(sz * sizeof(float));
    fill_uniform(x, (size_t)n * k, -1, 1);
    fill_uniform(w, (size_t)m * k, -1, 1);
    if (bias) fill_uniform(bias, (size_t)m, -1, 1);
    fill_uniform(o, sz, -9, 9);
    if (ckv_cpu_blas_matmul(2, o, x, w, bias, n, k, m)) {
        for (int i = 0; i < n; i++)
            for (int j = 0; j < m; j++) {
                double s = bias ? bias[j] : 0.0;
                for (int l = 0; l < k; l++) s += (double)x[(size_t)i * k + l] * w[(size_t)j * k + l];
                ref[(size_t)i * m + j] = (float)s;
            }
        char what[96];
        snprintf(what, sizeof what, "blas matmul n=%d k=%d m=%d%s", n, k, m, bias ? " +bias" : "");
        ckv_test_allclose(what, o, ref, sz, 1e-6 + 4e-8 * k, 1e-5);
    }
    free(x), free(w), free(bias), free(ref), free(o);
}

/* The backend op: same contract, best kernel set, 1 and 2 threads bit for bit. */
static void backend_case(ckv_backend *b1, ckv_backend *b2, int n, int k, int m) {
    const size_t sz = (size_t)n * (size_t)m;
    float *x = xalloc((size_t)n * k * sizeof(float)), *w = xalloc((size_t)m * k * sizeof(float));
    float *bias = xalloc((size_t)m * sizeof(float)), *ref = xalloc(sz * sizeof(float));
    float *o1 = xalloc(sz * sizeof(float)), *o2 = xalloc(sz * sizeof(float)), *o3 = xalloc(sz * sizeof(float));
    fill_uniform(x, (size_t)n * k, -1, 1);
    fill_uniform(w, (size_t)m * k, -1, 1);
    fill_uniform(bias, (size_t)m, -1, 1);
    ckv_backend_matmul_f32(b1, o1, x, w, bias, n, k, m);
    ckv_backend_matmul_f32(b2, o2, x, w, bias, n, k, m);
    ckv_cpu_gemm(NULL, ckv_gemm_best_arch(), o3, x, w, bias, n, k, m);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = bias[j];
            for (int l = 0; l < k; l++) s += (double)x[(size_t)i * k + l] * w[(size_t)j * k + l];
            ref[(size_t)i * m + j] = (float)s;
        }
    char what[96];
    snprintf(what, sizeof what, "backend matmul n=%d k=%d m=%d", n, k, m);
    ckv_test_allclose(what, o2, ref, sz, 1e-6 + 4e-8 * k, 1e-5);
    CHECK_MSG(memcmp(o1, o2, sz * sizeof(float)) == 0, "%s: 1 and 2 threads differ", what);
    CHECK_MSG(memcmp(o1, o3, sz * sizeof(float)) == 0, "%s: not the best kernel set's result", what);
    free(x), free(w), free(bias), free(ref), free(o1), free(o2), free(o3);
}

int main(void) {
    archs[n_archs++] = &ckv_gemm_arch_generic;
    if (ckv_gemm_avx2_supported()) archs[n_archs++] = &ckv_gemm_arch_avx2;
    if (ckv_gemm_avx512_supported()) archs[n_archs++] = &ckv_gemm_arch_avx512;
    fprintf(stderr, "kernel sets: %d, best %s\n", n_archs, ckv_gemm_best_arch()->name);
    CHECK(ckv_gemm_best_arch() == archs[n_archs - 1]);
    for (int a = 0; a < n_archs; a++) {
        CHECK(archs[a]->mr >= 1 && archs[a]->mr <= CKV_GEMM_MR_MAX);
        CHECK(archs[a]->nr >= 1 && archs[a]->nr <= CKV_GEMM_NR_MAX);
    }
    CHECK_OK(ckv_threadpool_init(&pool1, 1));
    CHECK_OK(ckv_threadpool_init(&pool2, 2));
    CHECK_OK(ckv_threadpool_init(&pool3, 3));

    /* one token (GEMV): k around the vector widths, m around the row groups */
    gemm_case(1, 1, 1, 1, 0);
    gemm_case(1, 7, 5, 0, 0);
    gemm_case(1, 16, 4, 1, 0);
    gemm_case(1, 17, 67, 1, 1);
    gemm_case(1, 300, 129, 0, 3);
    gemm_case(1, 903, 131, 1, 0);
    /* several tokens: rows around MR (4, 6, 14), columns around NR (16, 32), k around KC (256) */
    static const int ns[] = {2, 3, 5, 6, 7, 13, 14, 15, 29, 33};
    static const int ks[] = {1, 15, 16, 17, 255, 256, 257, 513};
    static const int ms[] = {1, 8, 15, 16, 17, 31, 32, 33, 47, 100};
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++)
        for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++) {
            const int m = ms[(i * 3 + j) % (sizeof ms / sizeof ms[0])];
            gemm_case(ns[i], ks[j], m, (int)((i + j) & 1), (int)((i + 2 * j) % 3));
        }
    for (size_t j = 0; j < sizeof ms / sizeof ms[0]; j++) gemm_case(9, 40, ms[j], 1, 1);
    /* prefill-like: many rows, few panels (row blocks) and many panels */
    gemm_case(100, 131, 7, 1, 0);
    gemm_case(129, 896, 131, 1, 0);
    gemm_case(512, 67, 256, 0, 2);
    gemm_case(700, 33, 65, 1, 1);
    /* empty sum: bias only (or 0) */
    gemm_case(3, 0, 5, 1, 0);
    gemm_case(17, 0, 40, 0, 0);
    gemm_case(1, 0, 9, 1, 0);
    /* weights packed once: rows, columns and k around MR, NR, 16 and KC */
    packed_case(2, 64, 24, 24);
    packed_case(15, 64, 896, 870);
    packed_case(29, 17, 47, 33);
    packed_case(128, 80, 200, 200);
    packed_case(33, 300, 100, 65);
    packed_case(3, 64, 40, 37);  /* dots: a group of 4 rows, a partial column block */
    packed_case(9, 257, 20, 19); /* dots: 8 rows and 1, k past KC with a tail */
    packed_case(2, 7, 16, 5);

    if (ckv_cpu_blas_matmul(1, NULL, NULL, NULL, NULL, 0, 0, 0)) {
        blas_case(1, 37, 13, 1);
        blas_case(19, 300, 45, 0);
        blas_case(64, 257, 129, 1);
        blas_case(3, 0, 5, 1);
    } else {
        fprintf(stderr, "no BLAS linked: the portable kernels serve CPUs without vector kernels\n");
    }

    ckv_backend *b1 = NULL, *b2 = NULL;
    CHECK_OK(ckv_backend_cpu_init(&b1, 1));
    CHECK_OK(ckv_backend_cpu_init(&b2, 2));
    if (b1 && b2) {
        backend_case(b1, b2, 1, 896, 136);
        backend_case(b1, b2, 31, 300, 70);
        backend_case(b1, b2, 200, 129, 97);
    }
    ckv_backend_free(b1);
    ckv_backend_free(b2);
    ckv_threadpool_free(pool1);
    ckv_threadpool_free(pool2);
    ckv_threadpool_free(pool3);
    CHECK(ckv_alloc_live_bytes() == 0);
    return ckv_test_finish("test_cpu_gemm");
}
