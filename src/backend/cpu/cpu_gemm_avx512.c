/* cpu_gemm_avx512.c - the AVX-512 kernel set of the CPU matmul (see cpu_gemm.h for the contracts):
 * a 14 x 32 register-tile micro-kernel (28 zmm accumulators; per step of k it loads 2 vectors of the
 * packed weight panel and broadcasts 14 activations straight from the rows of x, which need no
 * packing), the packing of a weight panel into k-major order, a 4-rows-at-a-time GEMV for one
 * token, and the micro-kernel's products for a few rows against unpacked weights (dots: 16 weight
 * rows at a time through the pack's in-register transpose). Every function carries a target
 * attribute, so this file builds without -mavx512f and its code only runs after
 * ckv_gemm_avx512_supported() said yes. It does no threading and no blocking (cpu_gemm.c does) and
 * handles fp32 only. */
#include <stdint.h>

#include "cpu_gemm.h"

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>

#define CKV_AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma")))
#define CKV_MR 14
#define CKV_NR 32

int ckv_gemm_avx512_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
}

/* Lanes [0, n) of a 16-lane vector, n in [0, 16]. */
static inline CKV_AVX512 __mmask16 ckv_mask16(int n) {
    return n >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n < 0 ? 0 : n)) - 1u);
}

/* Stores (first) or adds (not first) one accumulator row of the tile, bias added when first. */
static inline CKV_AVX512 void ckv_store_row(float *c, __m512 v0, __m512 v1, __mmask16 k0, __mmask16 k1,
                                            __m512 b0, __m512 b1, int first) {
    if (first) {
        v0 = _mm512_add_ps(v0, b0);
        v1 = _mm512_add_ps(v1, b1);
    } else {
        v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(k0, c));
        v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(k1, c + 16));
    }
    _mm512_mask_storeu_ps(c, k0, v0);
    _mm512_mask_storeu_ps(c + 16, k1, v1);
}

static CKV_AVX512 void ckv_avx512_ukernel(int kc, const float *a, size_t lda, int mr, const float *bp, float *c,
                                          size_t ldc, int nr, const float *bias, int first) {
    /* Rows r = 3g + {0, 1, 2} are read at ag + {0, lda, 2 lda}: five moving pointers instead of 14.
     * Rows past mr read row 0 again (valid memory) and are never stored. */
    const float *a0 = a;
    const float *a1 = a + (size_t)(3 < mr ? 3 : 0) * lda;
    const float *a2 = a + (size_t)(6 < mr ? 6 : 0) * lda;
    const float *a3 = a + (size_t)(9 < mr ? 9 : 0) * lda;
    const float *a4 = a + (size_t)(12 < mr ? 12 : 0) * lda;
    /* within a group, a row past mr reuses the group's first row (offset 0) */
    const size_t o1[5] = {1 < mr ? lda : 0, 4 < mr ? lda : 0, 7 < mr ? lda : 0, 10 < mr ? lda : 0, 13 < mr ? lda : 0};
    const size_t o2[4] = {2 < mr ? 2 * lda : 0, 5 < mr ? 2 * lda : 0, 8 < mr ? 2 * lda : 0, 11 < mr ? 2 * lda : 0};
    const size_t l01 = o1[0], l02 = o2[0], l11 = o1[1], l12 = o2[1], l21 = o1[2], l22 = o2[2], l31 = o1[3],
                 l32 = o2[3], l41 = o1[4];

    __m512 c00 = _mm512_setzero_ps(), c01 = _mm512_setzero_ps(), c10 = _mm512_setzero_ps(),
           c11 = _mm512_setzero_ps(), c20 = _mm512_setzero_ps(), c21 = _mm512_setzero_ps(),
           c30 = _mm512_setzero_ps(), c31 = _mm512_setzero_ps(), c40 = _mm512_setzero_ps(),
           c41 = _mm512_setzero_ps(), c50 = _mm512_setzero_ps(), c51 = _mm512_setzero_ps(),
           c60 = _mm512_setzero_ps(), c61 = _mm512_setzero_ps(), c70 = _mm512_setzero_ps(),
           c71 = _mm512_setzero_ps(), c80 = _mm512_setzero_ps(), c81 = _mm512_setzero_ps(),
           c90 = _mm512_setzero_ps(), c91 = _mm512_setzero_ps(), ca0 = _mm512_setzero_ps(),
           ca1 = _mm512_setzero_ps(), cb0 = _mm512_setzero_ps(), cb1 = _mm512_setzero_ps(),
           cc0 = _mm512_setzero_ps(), cc1 = _mm512_setzero_ps(), cd0 = _mm512_setzero_ps(),
           cd1 = _mm512_setzero_ps();
#define CKV_ROW(acc0, acc1, ptr, off)                                                                            \
    do {                                                                                                         \
        __m512 av_ = _mm512_set1_ps((ptr)[off]);                                                                 \
        acc0 = _mm512_fmadd_ps(av_, b0, acc0);                                                                   \
        acc1 = _mm512_fmadd_ps(av_, b1, acc1);                                                                   \
    } while (0)
    for (int p = 0; p < kc; p++) {
        const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
        bp += CKV_NR;
        CKV_ROW(c00, c01, a0, 0);
        CKV_ROW(c10, c11, a0, l01);
        CKV_ROW(c20, c21, a0, l02);
        CKV_ROW(c30, c31, a1, 0);
        CKV_ROW(c40, c41, a1, l11);
        CKV_ROW(c50, c51, a1, l12);
        CKV_ROW(c60, c61, a2, 0);
        CKV_ROW(c70, c71, a2, l21);
        CKV_ROW(c80, c81, a2, l22);
        CKV_ROW(c90, c91, a3, 0);
        CKV_ROW(ca0, ca1, a3, l31);
        CKV_ROW(cb0, cb1, a3, l32);
        CKV_ROW(cc0, cc1, a4, 0);
        CKV_ROW(cd0, cd1, a4, l41);
        a0++;
        a1++;
        a2++;
        a3++;
        a4++;
    }
#undef CKV_ROW
    const __mmask16 k0 = ckv_mask16(nr), k1 = ckv_mask16(nr - 16);
    const __m512 b0 = bias && first ? _mm512_maskz_loadu_ps(k0, bias) : _mm512_setzero_ps();
    const __m512 b1 = bias && first ? _mm512_maskz_loadu_ps(k1, bias + 16) : _mm512_setzero_ps();
    ckv_store_row(c, c00, c01, k0, k1, b0, b1, first);
    if (mr > 1) ckv_store_row(c + ldc, c10, c11, k0, k1, b0, b1, first);
    if (mr > 2) ckv_store_row(c + 2 * ldc, c20, c21, k0, k1, b0, b1, first);
    if (mr > 3) ckv_store_row(c + 3 * ldc, c30, c31, k0, k1, b0, b1, first);
    if (mr > 4) ckv_store_row(c + 4 * ldc, c40, c41, k0, k1, b0, b1, first);
    if (mr > 5) ckv_store_row(c + 5 * ldc, c50, c51, k0, k1, b0, b1, first);
    if (mr > 6) ckv_store_row(c + 6 * ldc, c60, c61, k0, k1, b0, b1, first);
    if (mr > 7) ckv_store_row(c + 7 * ldc, c70, c71, k0, k1, b0, b1, first);
    if (mr > 8) ckv_store_row(c + 8 * ldc, c80, c81, k0, k1, b0, b1, first);
    if (mr > 9) ckv_store_row(c + 9 * ldc, c90, c91, k0, k1, b0, b1, first);
    if (mr > 10) ckv_store_row(c + 10 * ldc, ca0, ca1, k0, k1, b0, b1, first);
    if (mr > 11) ckv_store_row(c + 11 * ldc, cb0, cb1, k0, k1, b0, b1, first);
    if (mr > 12) ckv_store_row(c + 12 * ldc, cc0, cc1, k0, k1, b0, b1, first);
    if (mr > 13) ckv_store_row(c + 13 * ldc, cd0, cd1, k0, k1, b0, b1, first);
}

/* t[c] = column c of the 16 x 16 block whose row i is r[i] (r is overwritten). */
static inline CKV_AVX512 void ckv_transpose16(__m512 r[16], __m512 t[16]) {
    /* 32-bit, then 64-bit interleaves inside 128-bit lanes, then lane shuffles */
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        r[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        r[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* r[4q + s], 128-bit lane L: column 4L + s of rows 4q .. 4q + 3. Gather lane L of the four quads
     * into one vector: 128-bit shuffles of quads (0, 1) and (2, 3), then of those. */
    for (int s = 0; s < 4; s++) {
        __m512 q0 = r[s], q1 = r[4 + s], q2 = r[8 + s], q3 = r[12 + s];
        __m512 u0 = _mm512_shuffle_f32x4(q0, q1, 0x88); /* lanes 0, 2 of q0, then 0, 2 of q1 */
        __m512 u1 = _mm512_shuffle_f32x4(q0, q1, 0xDD); /* lanes 1, 3 of q0, then 1, 3 of q1 */
        __m512 u2 = _mm512_shuffle_f32x4(q2, q3, 0x88);
        __m512 u3 = _mm512_shuffle_f32x4(q2, q3, 0xDD);
        t[s] = _mm512_shuffle_f32x4(u0, u2, 0x88);      /* lane 0 of q0..q3 */
        t[s + 4] = _mm512_shuffle_f32x4(u1, u3, 0x88);  /* lane 1 */
        t[s + 8] = _mm512_shuffle_f32x4(u0, u2, 0xDD);  /* lane 2 */
        t[s + 12] = _mm512_shuffle_f32x4(u1, u3, 0xDD); /* lane 3 */
    }
}

/* bp [kc, 32] = w [nr rows, kc]^T, zero columns past nr. Full panels go 16 x 16 blocks at a time
 * through an in-register transpose. */
static CKV_AVX512 void ckv_avx512_pack(int kc, const float *w, size_t ldw, int nr, float *bp) {
    int c0 = 0;
    for (; c0 + 16 <= nr; c0 += 16) {
        const float *wr = w + (size_t)c0 * ldw;
        int p = 0;
        for (; p + 16 <= kc; p += 16) {
            __m512 r[16], t[16];
            for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(wr + (size_t)i * ldw + p);
            ckv_transpose16(r, t);
            /* t[4L + s]: column 4L + s of rows 0 .. 15 */
            for (int col = 0; col < 16; col++) _mm512_store_ps(bp + (size_t)(p + col) * CKV_NR + c0, t[col]);
        }
        for (; p < kc; p++)
            for (int i = 0; i < 16; i++) bp[(size_t)p * CKV_NR + c0 + i] = wr[(size_t)i * ldw + p];
    }
    for (; c0 < CKV_NR; c0++) {
        float *dst = bp + c0;
        if (c0 < nr) {
            const float *wr = w + (size_t)c0 * ldw;
            for (int p = 0; p < kc; p++) dst[(size_t)p * CKV_NR] = wr[p];
        } else {
            for (int p = 0; p < kc; p++) dst[(size_t)p * CKV_NR] = 0.0f;
        }
    }
}

/* Rows r0 .. r0 + R of ckv_avx512_dots for the 16 columns whose rows of w are wr[0 .. 16) (R a
 * constant after inlining: its accumulators stay in registers; rows past n read x's row 0 and are
 * not stored): per KC block an fma chain over p from zero, each column of w brought into one
 * vector by the pack's transpose, then added to the previous blocks' sum, as the micro-kernel does. */
static inline __attribute__((always_inline)) CKV_AVX512 void ckv_dots_rows(int R, int n, int r0, int k, const float *x,
                                                                            size_t ldx, const float *const wr[16],
                                                                            float *out, size_t ldo, __mmask16 km) {
    const float *xr[8];
    for (int r = 0; r < R; r++) xr[r] = x + (size_t)(r0 + r < n ? r0 + r : 0) * ldx;
    __m512 tot[8]; /* 0 + the first block's chain is the micro-kernel's store of it (bias 0) */
    for (int r = 0; r < R; r++) tot[r] = _mm512_setzero_ps();
    for (int p0 = 0; p0 < k; p0 += CKV_GEMM_KC) {
        const int pe = k - p0 < CKV_GEMM_KC ? k : p0 + CKV_GEMM_KC;
        __m512 acc[8];
        for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
        int p = p0;
        for (; p + 16 <= pe; p += 16) {
            __m512 rw[16], t[16];
            for (int i = 0; i < 16; i++) rw[i] = _mm512_loadu_ps(wr[i] + p);
            ckv_transpose16(rw, t);
            for (int j = 0; j < 16; j++)
                for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(xr[r][p + j]), t[j], acc[r]);
        }
        for (; p < pe; p++) {
            float col[16] __attribute__((aligned(64)));
            for (int i = 0; i < 16; i++) col[i] = wr[i][p];
            const __m512 cv = _mm512_load_ps(col);
            for (int r = 0; r < R; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(xr[r][p]), cv, acc[r]);
        }
        for (int r = 0; r < R; r++) tot[r] = _mm512_add_ps(acc[r], tot[r]);
    }
    for (int r = 0; r < R && r0 + r < n; r++) _mm512_mask_storeu_ps(out + (size_t)(r0 + r) * ldo, km, tot[r]);
}

/* out [n, m] = x [n, k] @ w [m, k]^T with w's rows read in place, 16 columns at a time (columns past
 * m read w's last row and are not stored); each column block's rows in groups of up to 8. */
static CKV_AVX512 void ckv_avx512_dots(int n, int k, const float *x, size_t ldx, const float *w, size_t ldw, int m,
                                       float *out, size_t ldo) {
    for (int c0 = 0; c0 < m; c0 += 16) {
        const int nc = m - c0 < 16 ? m - c0 : 16;
        const float *wr[16];
        for (int i = 0; i < 16; i++) wr[i] = w + (size_t)(c0 + (i < nc ? i : nc - 1)) * ldw;
        /* the next 16 rows of w into the cache while these are used: with k 64 they are the next 4 KiB
         * page, which the hardware prefetcher does not enter (w is a cache read from memory once) */
        for (int i = c0 + 16; i < c0 + 32 && i < m; i++)
            for (int p = 0; p < k; p += 16) __builtin_prefetch(w + (size_t)i * ldw + p);
        const __mmask16 km = ckv_mask16(nc);
        for (int r0 = 0; r0 < n; r0 += 8) {
            const int nr = n - r0;
            if (nr <= 1)
                ckv_dots_rows(1, n, r0, k, x, ldx, wr, out + c0, ldo, km);
            else if (nr <= 2)
                ckv_dots_rows(2, n, r0, k, x, ldx, wr, out + c0, ldo, km);
            else if (nr <= 4)
                ckv_dots_rows(4, n, r0, k, x, ldx, wr, out + c0, ldo, km);
            else
                ckv_dots_rows(8, n, r0, k, x, ldx, wr, out + c0, ldo, km);
        }
    }
}

static inline CKV_AVX512 float ckv_hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

static CKV_AVX512 void ckv_avx512_gemv(int rows, int k, const float *w, size_t ldw, const float *x, const float *bias,
                                       float *out) {
    int j = 0;
    const int kv = k & ~15;
    const __mmask16 kt = ckv_mask16(k - kv);
    for (; j + 4 <= rows; j += 4) {
        const float *w0 = w + (size_t)j * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(),
               s3 = _mm512_setzero_ps();
        for (int p = 0; p < kv; p += 16) {
            const __m512 xv = _mm512_loadu_ps(x + p);
            s0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + p), xv, s0);
            s1 = _mm512_fmadd_ps(_mm512_loadu_ps(w1 + p), xv, s1);
            s2 = _mm512_fmadd_ps(_mm512_loadu_ps(w2 + p), xv, s2);
            s3 = _mm512_fmadd_ps(_mm512_loadu_ps(w3 + p), xv, s3);
        }
        if (kt) {
            const __m512 xv = _mm512_maskz_loadu_ps(kt, x + kv);
            s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(kt, w0 + kv), xv, s0);
            s1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(kt, w1 + kv), xv, s1);
            s2 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(kt, w2 + kv), xv, s2);
            s3 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(kt, w3 + kv), xv, s3);
        }
        out[j] = ckv_hsum(s0) + (bias ? bias[j] : 0.0f);
        out[j + 1] = ckv_hsum(s1) + (bias ? bias[j + 1] : 0.0f);
        out[j + 2] = ckv_hsum(s2) + (bias ? bias[j + 2] : 0.0f);
        out[j + 3] = ckv_hsum(s3) + (bias ? bias[j + 3] : 0.0f);
    }
    for (; j < rows; j++) {
        const float *w0 = w + (size_t)j * ldw;
        __m512 s0 = _mm512_setzero_ps();
        for (int p = 0; p < kv; p += 16) s0 = _mm512_fmadd_ps(_mm512_loadu_ps(w0 + p), _mm512_loadu_ps(x + p), s0);
        if (kt) s0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(kt, w0 + kv), _mm512_maskz_loadu_ps(kt, x + kv), s0);
        out[j] = ckv_hsum(s0) + (bias ? bias[j] : 0.0f);
    }
}

const ckv_gemm_arch ckv_gemm_arch_avx512 = {
    .name = "avx512", .mr = CKV_MR, .nr = CKV_NR, .ukernel = ckv_avx512_ukernel, .pack = ckv_avx512_pack,
    .gemv = ckv_avx512_gemv, .dots = ckv_avx512_dots};

#else /* not x86 or not a GCC-compatible compiler: the set exists but is never chosen */

int ckv_gemm_avx512_supported(void) { return 0; }
const ckv_gemm_arch ckv_gemm_arch_avx512 = {.name = "avx512 (not built)"};

#endif
