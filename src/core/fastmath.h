/* fastmath.h - the project's one fast fp32 exp (softmax, SiLU, scorers; a scalar and a vector form)
 * and a scan for non-finite floats (weights at load, cache files). Header-only and branch-free so
 * that the loops calling it auto-vectorise (libm's expf does not without -ffast-math). It holds no
 * other math and no state. */
#ifndef CKV_FASTMATH_H
#define CKV_FASTMATH_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* c ? a : b, blended in the integer domain. A plain ?: between floats lets GCC turn the select into
 * a branch (moving the arithmetic that feeds it into the arms) that it will not if-convert under the
 * default -ftrapping-math, and the calling loop stays scalar; this form vectorises. */
static inline float ckv_fast_select(int c, float a, float b) {
    uint32_t m = 0u - (uint32_t)(c != 0), ua, ub;
    memcpy(&ua, &a, sizeof ua);
    memcpy(&ub, &b, sizeof ub);
    ua = (ua & m) | (ub & ~m);
    memcpy(&a, &ua, sizeof a);
    return a;
}

/* a * b + c: rounded once where the target has fused multiply-adds (__FMA__: the call is one
 * instruction), twice elsewhere. Written out rather than left to the compiler's contraction, which
 * depends on the build's flags (-ffp-contract), so a debug build computes the same bits as a release
 * build of the same target, and the vector forms below can match the scalar one. */
static inline float ckv_fast_madd(float a, float b, float c) {
#if defined(__FMA__)
    return fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

/* The shared core of the exps below for xc in [-87.3, 89]: *n = round(xc / ln2) (in [-126, 129]) and
 * the polynomial p ~ e^r of r = xc - n ln2. */
static inline float ckv_fast_exp_core(float xc, int32_t *n) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer in the low bits */
    float kf = ckv_fast_madd(xc, 1.44269504088896341f, magic);
    int32_t ki;
    memcpy(&ki, &kf, sizeof ki);
    *n = ki - 0x4B400000;
    float nf = kf - magic;
    float r = ckv_fast_madd(-nf, 0.693145751953125f, xc); /* ln2, high part (exact product) */
    r = ckv_fast_madd(-nf, 1.42860676533018704e-06f, r); /* ln2, low part */
    float p = 1.0f / 5040.0f;
    p = ckv_fast_madd(p, r, 1.0f / 720.0f);
    p = ckv_fast_madd(p, r, 1.0f / 120.0f);
    p = ckv_fast_madd(p, r, 1.0f / 24.0f);
    p = ckv_fast_madd(p, r, 1.0f / 6.0f);
    p = ckv_fast_madd(p, r, 0.5f);
    p = ckv_fast_madd(p, r, 1.0f);
    p = ckv_fast_madd(p, r, 1.0f);
    return p;
}

/* exp(x) in fp32, defined for every input: range reduction x = n ln2 + r with |r| <= ln2/2 (ln2 in a
 * high part whose product with n is exact and a low part), degree-7 Taylor polynomial for e^r
 * (truncation < 0.1 ulp), times 2^n applied as 2^a * 2^b (a + b = n, both normal exponents, so the
 * top of the range reaches FLT_MAX without an infinite intermediate). All integer arithmetic stays in
 * [-200, 400]: no overflow, whatever x is. Branch-free: loops calling it vectorise (GCC -O3).
 *   x in [-87.3, 88.72]: within 1 ulp of exp with fused multiply-adds, 1.2 ulp without (tests/unit/test_fastmath.c sweeps it);
 *   x < -87.3: 0 (exp(x) < 1.22e-38 there; flushing avoids slow denormal arithmetic);
 *   x > 88.72283: +inf (also +inf itself); -inf: 0; NaN: NaN. */
static inline float ckv_fast_expf(float x) {
    float xc = ckv_fast_select(x > -87.3f, x, -87.3f); /* NaN lands on -87.3: its result is replaced below */
    xc = ckv_fast_select(xc < 89.0f, xc, 89.0f);
    int32_t n; /* round(xc / ln2), in [-126, 129] */
    const float p = ckv_fast_exp_core(xc, &n);
    int32_t a = ((n + 256) >> 1) - 256 / 2; /* floor(n / 2) without shifting a negative number */
    int32_t b = n - a;
    int32_t abits = (a + 127) * (1 << 23), bbits = (b + 127) * (1 << 23); /* a, b in [-63, 65] */
    float sa, sb;
    memcpy(&sa, &abits, sizeof sa);
    memcpy(&sb, &bbits, sizeof sb);
    float y = (p * sa) * sb;
    y = ckv_fast_select(x < -87.3f, 0.0f, y);
    return ckv_fast_select(x != x, x, y);
}

/* ckv_fast_expf(x) for x <= 0, -inf and NaN (a softmax's x - max), the same bits in fewer steps: no
 * clamp at the top, and 2^n (n in [-126, 0] here: a normal power of two) applied in one product. p
 * is in (0.7, 1.42), so p * 2^a is exact and (p * 2^a) * 2^b rounds the real number p * 2^n once,
 * as p * 2^n does (tests/unit/test_fastmath.c compares the two over the non-positive floats). */
static inline float ckv_fast_expf_nonpos(float x) {
    const float xc = ckv_fast_select(x > -87.3f, x, -87.3f); /* NaN lands on -87.3: replaced below */
    int32_t n;
    const float p = ckv_fast_exp_core(xc, &n);
    int32_t nbits = (n + 127) * (1 << 23);
    float sn;
    memcpy(&sn, &nbits, sizeof sn);
    float y = p * sn;
    y = ckv_fast_select(x < -87.3f, 0.0f, y);
    return ckv_fast_select(x != x, x, y);
}

/* The vector form: y[i] = ckv_fast_expf(x[i]) for i < n (y may be x), the same result lane by lane.
 * The loop is branch-free, so the vectoriser turns it into the SIMD code of the function it is inlined
 * into (a kernel compiled for AVX-512 gets 16-lane code) without any intrinsic here. */
static inline void ckv_fast_expf_n(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = ckv_fast_expf(x[i]);
}

/* The vector form of ckv_fast_expf_nonpos (x[i] <= 0, -inf or NaN), as ckv_fast_expf_n. */
static inline void ckv_fast_expf_nonpos_n(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = ckv_fast_expf_nonpos(x[i]);
}

#if defined(__AVX512F__) && !defined(__CUDACC__)
#include <immintrin.h>
/* ckv_fast_expf_nonpos of 16 lanes in AVX-512 intrinsics, the same bits lane by lane in fewer
 * instructions than the vectorised scalar code: the reduction and the polynomial as the fused
 * multiply-adds of ckv_fast_exp_core (AVX-512 targets have FMA), 2^n applied by vscalefps (p * 2^n rounded once, as p * 2^n in one product),
 * and no clamp: lanes below -87.3 (-inf included) are set to 0 and NaN lanes to x after the
 * arithmetic, whatever it gave there. tests/unit/test_fastmath.c compares it with the scalar form over
 * the same inputs as ckv_fast_expf_nonpos. */
static inline __m512 ckv_fast_expf_nonpos16(__m512 x) {
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    const __m512 kf = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic);
    const __m512 nf = _mm512_sub_ps(kf, magic);
    __m512 r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(nf, _mm512_set1_ps(1.42860676533018704e-06f), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(1.0f / 5040.0f), r, _mm512_set1_ps(1.0f / 720.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512 y = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3f), _CMP_GE_OQ),
                                         _mm512_scalef_ps(p, nf));
    return _mm512_mask_mov_ps(y, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}
#endif

/* Index of the first NaN or infinity among x[0 .. n), or -1 when all are finite. Scans in blocks
 * without a branch per element. */
static inline int64_t ckv_find_nonfinite_f32(const float *x, size_t n) {
    const size_t block = 1024;
    for (size_t i0 = 0; i0 < n; i0 += block) {
        size_t i1 = n - i0 < block ? n : i0 + block;
        uint32_t bad = 0;
        for (size_t i = i0; i < i1; i++) {
            uint32_t u;
            memcpy(&u, &x[i], sizeof u);
            bad |= (uint32_t)((u & 0x7F800000u) == 0x7F800000u);
        }
        if (bad)
            for (size_t i = i0; i < i1; i++) {
                uint32_t u;
                memcpy(&u, &x[i], sizeof u);
                if ((u & 0x7F800000u) == 0x7F800000u) return (int64_t)i;
            }
    }
    return -1;
}

#endif
