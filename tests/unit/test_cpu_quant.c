/* test_cpu_quant.c - the stored-format matmul (backend/cpu/cpu_quant*.c) on random weights of every
 * type it computes (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, F16, BF16: random code bytes,
 * random finite scales), with every kernel set this CPU runs (portable, AVX2), against two references
 * computed here in double precision over the weights dequantised by core/quant.c:
 *  - exact: the weights times the activations as the kernels see them (rounded to 8 bits by
 *    ckv_quant_x32 / ckv_quant_x256; fp32 for F16 / BF16); the kernels may differ only by fp32
 *    rounding: |got - ref| <= (blocks + 16) * 2^-23 * S, S = sum |w| |x| (+ the row's largest |w|
 *    times sum |x| for the minimum terms);
 *  - fp32: the weights times the unrounded activations; the difference is then bounded by the
 *    activation rounding: sum_i |w_i| * d_x(i) / 2 (d_x = the activation block's max |x| / 127) plus
 *    the exact bound above.
 * From CKV_QUANT_GEMM_ROWS rows on the fp32 GEMM runs over dequantised panels: the exact reference
 * then uses the fp32 activations and k terms. Shapes cover one and few rows (dots), tiles of rows past
 * the activation buffer, k chunks past it, many rows (GEMM), m not a multiple of the work item.
 * Results must be bitwise equal with no pool, 1 and 2 threads. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu_quant.h"
#include "ckv_test.h"
#include "core/quant.h"
#include "core/threadpool.h"

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rng_u32(void) { return ckv_test_rng_u32(&rng_state); }
static float rng_uniform(float lo, float hi) { return ckv_test_uniform(&rng_state, lo, hi); }
#define xalloc ckv_test_calloc

static void put_half(uint8_t *p, float v) {
    uint16_t h = ckv_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* One row of random weights of type t: random bytes, then finite scales where the layout has them. */
static void random_row(ckv_dtype t, uint8_t *row, int k) {
    const size_t rb = ckv_dtype_row_bytes(t, k);
    for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)rng_u32();
    if (t == CKV_DTYPE_F16 || t == CKV_DTYPE_BF16) {
        for (int i = 0; i < k; i++) {
            float v = rng_uniform(-0.5f, 0.5f);
            uint16_t h = t == CKV_DTYPE_F16 ? ckv_f32_to_f16(v) : ckv_f32_to_bf16(v);
            memcpy(row + 2 * (size_t)i, &h, 2);
        }
        return;
    }
    const size_t bb = ckv_dtype_block_bytes(t);
    for (uint8_t *b = row; b < row + rb; b += bb) {
        const float d = rng_uniform(1e-3f, 2e-2f) * (rng_u32() & 1 ? 1.0f : -1.0f);
        switch (t) {
        case CKV_DTYPE_Q8_0:
        case CKV_DTYPE_Q4_0:
        case CKV_DTYPE_Q5_0: put_half(b, d); break;
        case CKV_DTYPE_Q4_1:
        case CKV_DTYPE_Q5_1: put_half(b, fabsf(d)), put_half(b + 2, rng_uniform(-0.3f, 0.1f)); break;
        case CKV_DTYPE_Q4_K:
        case CKV_DTYPE_Q5_K: put_half(b, fabsf(d) * 0.05f), put_half(b + 2, rng_uniform(0.0f, 1e-3f)); break;
        case CKV_DTYPE_Q6_K: put_half(b + 208, d * 0.05f); break;
        default: break;
        }
    }
}

static const ckv_quant_arch *archs[3];
static int n_archs;
static ckv_threadpool *pool1, *pool2;

/* x as the kernels of type t see it with n rows: rounded to 8-bit blocks, or fp32 for F16 / BF16 and
 * from CKV_QUANT_GEMM_ROWS rows on (the GEMM path); dx[i] = the rounding step of element i (0 for
 * fp32). */
static void seen_activations(ckv_dtype t, int n, const float *x, int k, double *xs, double *dx) {
    const int be = ckv_dtype_block_elems(t);
    if (be == 1 || n >= CKV_QUANT_GEMM_ROWS) {
        for (int i = 0; i < k; i++) xs[i] = x[i], dx[i] = 0;
        return;
    }
    if (be == 32) {
        ckv_q8x32 *q = xalloc((size_t)(k / 32) * sizeof *q);
        ckv_quant_x32(x, k, q);
        for (int i = 0; i < k; i++) xs[i] = (double)q[i / 32].d * q[i / 32].q[i % 32], dx[i] = q[i / 32].d;
        free(q);
    } else {
        ckv_q8x256 *q = xalloc((size_t)(k / 256) * sizeof *q);
        ckv_quant_x256(x, k, q);
        for (int i = 0; i < k; i++) xs[i] = (double)q[i / 256].d * q[i / 256].q[i % 256], dx[i] = q[i / 256].d;
        free(q);
    }
}

static void quant_case(ckv_dtype t, int n, int k, int m, int with_bias) {
    const size_t rb = ckv_dtype_row_bytes(t, k), sz = (size_t)n * (size_t)m;
    uint8_t *w = xalloc(rb * (size_t)m);
    float *x = xalloc((size_t)n * (size_t)k * sizeof(float)), *wf = xalloc((size_t)k * sizeof(float));
    float *bias = with_bias ? xalloc((size_t)m * sizeof(float)) : NULL;
    double *ref_exact = xalloc(sz * sizeof(double)), *ref_f32 = xalloc(sz * sizeof(double));
    double *tol_exact = xalloc(sz * sizeof(double)), *tol_f32 = xalloc(sz * sizeof(double));
    double *xs = xalloc((size_t)n * (size_t)k * sizeof(double)), *dx = xalloc((size_t)n * (size_t)k * sizeof(double));
    float *outs[3];
    for (int i = 0; i < 3; i++) outs[i] = xalloc(sz * sizeof(float));
    for (int j = 0; j < m; j++) random_row(t, w + (size_t)j * rb, k);
    for (int i = 0; i < n; i++) {
        const float scale = i % 3 == 2 ? 20.0f : 1.0f; /* rows of another magnitude */
        for (int p = 0; p < k; p++) x[(size_t)i * k + p] = scale * rng_uniform(-1, 1);
        x[(size_t)i * k + (size_t)(i % k)] *= 8.0f; /* an outlier that sets its block's scale */
    }
    if (bias)
        for (int j = 0; j < m; j++) bias[j] = rng_uniform(-1, 1);
    for (int i = 0; i < n; i++)
        seen_activations(t, n, x + (size_t)i * k, k, xs + (size_t)i * k, dx + (size_t)i * k);
    /* terms summed in sequence: blocks (dots), lane sums (F16 / BF16 dots), or k (the GEMM) */
    const int nb = n >= CKV_QUANT_GEMM_ROWS ? k : ckv_dtype_block_elems(t) == 1 ? k / 16 : k / ckv_dtype_block_elems(t);
    for (int j = 0; j < m; j++) {
        ckv_dequant_row(t, w + (size_t)j * rb, wf, (size_t)k);
        double wmax = 0;
        for (int p = 0; p < k; p++) wmax = fmax(wmax, fabs(wf[p]));
        for (int i = 0; i < n; i++) {
            const float *xr = x + (size_t)i * k;
            const double *xsr = xs + (size_t)i * k, *dxr = dx + (size_t)i * k;
            double se = bias ? bias[j] : 0, sf = se, S = fabs(se), act = 0;
            for (int p = 0; p < k; p++) {
                se += (double)wf[p] * xsr[p];
                sf += (double)wf[p] * xr[p];
                S += (fabs(wf[p]) + 2 * wmax) * fabs(xsr[p]);
                act += fabs(wf[p]) * 0.5 * dxr[p] * (1 + 1e-5);
            }
            const size_t o = (size_t)i * m + (size_t)j;
            ref_exact[o] = se, ref_f32[o] = sf;
            tol_exact[o] = (nb + 16) * 0x1p-23 * S + 1e-30;
            tol_f32[o] = act + tol_exact[o];
        }
    }
    for (int a = 0; a < n_archs; a++) {
        ckv_threadpool *pools[3] = {NULL, pool1, pool2};
        for (int p = 0; p < 3; p++) {
            memset(outs[p], 0xff, sz * sizeof(float)); /* NaN: every element must be written */
            ckv_cpu_quant_matmul(pools[p], archs[a], outs[p], x, w, t, rb, bias, n, k, m);
        }
        char what[160];
        snprintf(what, sizeof what, "%s %s n=%d k=%d m=%d%s", archs[a]->name, ckv_dtype_name(t), n, k, m,
                 bias ? " +bias" : "");
        int bad_e = 0, bad_f = 0;
        double worst_e = 0, worst_f = 0;
        for (size_t o = 0; o < sz; o++) {
            const double g = outs[0][o], ee = fabs(g - ref_exact[o]), ef = fabs(g - ref_f32[o]);
            worst_e = fmax(worst_e, ee / tol_exact[o]);
            worst_f = fmax(worst_f, ef / tol_f32[o]);
            if (!(ee <= tol_exact[o]) && bad_e++ < 3)
                fprintf(stderr, "  %s [%zu, %zu]: got %.9g, exact reference %.9g (|diff| %.3g > %.3g)\n", what,
                        o / (size_t)m, o % (size_t)m, g, ref_exact[o], ee, tol_exact[o]);
            if (!(ef <= tol_f32[o]) && bad_f++ < 3)
                fprintf(stderr, "  %s [%zu, %zu]: got %.9g, fp32 reference %.9g (|diff| %.3g > %.3g)\n", what,
                        o / (size_t)m, o % (size_t)m, g, ref_f32[o], ef, tol_f32[o]);
        }
        CHECK_MSG(bad_e == 0, "%s: %d outputs off the exact reference (worst |diff| / bound %.3f)", what, bad_e,
                  worst_e);
        CHECK_MSG(bad_f == 0, "%s: %d outputs off the fp32 reference (worst |diff| / bound %.3f)", what, bad_f,
                  worst_f);
        CHECK_MSG(memcmp(outs[0], outs[1], sz * sizeof(float)) == 0, "%s: 1 thread differs from no pool", what);
        CHECK_MSG(memcmp(outs[0], outs[2], sz * sizeof(float)) == 0, "%s: 2 threads differ from 1", what);
        if (!bad_e && !bad_f)
            fprintf(stderr, "ok   %s: worst |diff| / bound: exact %.3f, fp32 %.3f\n", what, worst_e, worst_f);
    }
    free(w), free(x), free(wf), free(bias), free(ref_exact), free(ref_f32), free(tol_exact), free(tol_f32);
    free(xs), free(dx);
    for (int i = 0; i < 3; i++) free(outs[i]);
}

int main(void) {
    archs[n_archs++] = &ckv_quant_arch_generic;
    if (ckv_quant_avx2_supported())
        archs[n_archs++] = &ckv_quant_arch_avx2;
    else
        fprintf(stderr, "note: this CPU lacks AVX2 + FMA + F16C; only the portable kernels are tested\n");
    CHECK_OK(ckv_threadpool_init(&pool1, 1));
    CHECK_OK(ckv_threadpool_init(&pool2, 2));
    CHECK(ckv_quant_best_arch() == archs[n_archs - 1]);

    static const ckv_dtype types[] = {CKV_DTYPE_Q8_0, CKV_DTYPE_Q4_0, CKV_DTYPE_Q4_1, CKV_DTYPE_Q5_0,
                                      CKV_DTYPE_Q5_1, CKV_DTYPE_Q4_K, CKV_DTYPE_Q5_K, CKV_DTYPE_Q6_K,
                                      CKV_DTYPE_F16,  CKV_DTYPE_BF16};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        const ckv_dtype t = types[i];
        CHECK(ckv_quant_dtype_ok(t));
        quant_case(t, 1, 256, 37, 0);
        quant_case(t, 5, 1024, 16, 1);
        quant_case(t, 3, 2816, 33, 1);
        quant_case(t, 7, 32768, 5, 0);  /* more rows than one activation tile holds (4 or 5 at this k) */
        quant_case(t, 70, 1536, 40, 1); /* the GEMM path */
        if (ckv_dtype_block_elems(t) == 32 || ckv_dtype_block_elems(t) == 1) quant_case(t, 2, 96, 19, 1);
        if (ckv_dtype_is_block(t)) quant_case(t, 2, 180224, 3, 1); /* one row's activations overflow the buffer */
    }
    CHECK(!ckv_quant_dtype_ok(CKV_DTYPE_F32));
    CHECK(!ckv_quant_dtype_ok(CKV_DTYPE_I32));

    ckv_threadpool_free(pool1);
    ckv_threadpool_free(pool2);
    return ckv_test_finish("test_cpu_quant");
}
