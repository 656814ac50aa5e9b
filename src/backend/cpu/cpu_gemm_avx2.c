/* cpu_gemm_avx2.c - the AVX2 + FMA kernel set of the CPU matmul (see cpu_gemm.h for the contracts),
 * for x86 CPUs without AVX-512: a 6 x 16 register-tile micro-kernel (12 ymm accumulators, 2 vector
 * loads of the packed weight panel and 6 broadcasts from the rows of x per step of k), the packing of
 * a weight panel into k-major order, and a 4-rows-at-a-time GEMV for one token. Every function
 * carries a target attribute, so this file builds without -mavx2 and its code only runs after
 * ckv_gemm_avx2_supported() said yes. No threading, no blocking (cpu_gemm.c), fp32 only. */
#include <stdint.h>

#include "cpu_gemm.h"

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>

#define CKV_AVX2 __attribute__((target("avx2,fma")))
#define CKV_MR 6
#define CKV_NR 16

int ckv_gemm_avx2_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* Lanes [0, n) of an 8-lane vector as a vmaskmov mask, n in any range (clamped to [0, 8]). */
static inline CKV_AVX2 __m256i ckv_mask8(int n) {
    const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), idx);
}

static inline CKV_AVX2 void ckv_store_row(float *c, __m256 v0, __m256 v1, int nr, __m256i m0, __m256i m1, __m256 b0,
                                          __m256 b1, int first) {
    if (nr >= 16) {
        if (first) {
            v0 = _mm256_add_ps(v0, b0);
            v1 = _mm256_add_ps(v1, b1);
        } else {
            v0 = _mm256_add_ps(v0, _mm256_loadu_ps(c));
            v1 = _mm256_add_ps(v1, _mm256_loadu_ps(c + 8));
        }
        _mm256_storeu_ps(c, v0);
        _mm256_storeu_ps(c + 8, v1);
        return;
    }
    if (first) {
        v0 = _mm256_add_ps(v0, b0);
        v1 = _mm256_add_ps(v1, b1);
    } else {
        v0 = _mm256_add_ps(v0, _mm256_maskload_ps(c, m0));
        v1 = _mm256_add_ps(v1, _mm256_maskload_ps(c + 8, m1));
    }
    _mm256_maskstore_ps(c, m0, v0);
    _mm256_maskstore_ps(c + 8, m1, v1);
}

static CKV_AVX2 void ckv_avx2_ukernel(int kc, const float *a, size_t lda, int mr, const float *bp, float *c,
                                      size_t ldc, int nr, const float *bias, int first) {
    /* rows 3g + {0, 1, 2} at ag + {0, lda, 2 lda}; rows past mr read row 0 and are never stored */
    const float *a0 = a;
    const float *a1 = a + (size_t)(3 < mr ? 3 : 0) * lda;
    const size_t l01 = 1 < mr ? lda : 0, l02 = 2 < mr ? 2 * lda : 0, l11 = 4 < mr ? lda : 0,
                 l12 = 5 < mr ? 2 * lda : 0;
    __m256 c00 = _mm256_setzero_ps(), c01 = _mm256_setzero_ps(), c10 = _mm256_setzero_ps(),
           c11 = _mm256_setzero_ps(), c20 = _mm256_setzero_ps(), c21 = _mm256_setzero_ps(),
           c30 = _mm256_setzero_ps(), c31 = _mm256_setzero_ps(), c40 = _mm256_setzero_ps(),
           c41 = _mm256_setzero_ps(), c50 = _mm256_setzero_ps(), c51 = _mm256_setzero_ps();
#define CKV_ROW(acc0, acc1, ptr, off)                                                                            \
    do {                                                                                                         \
        __m256 av_ = _mm256_broadcast_ss((ptr) + (off));                                                         \
        acc0 = _mm256_fmadd_ps(av_, b0, acc0);                                                                   \
        acc1 = _mm256_fmadd_ps(av_, b1, acc1);                                                                   \
    } while (0)
    for (int p = 0; p < kc; p++) {
        const __m256 b0 = _mm256_load_ps(bp), b1 = _mm256_load_ps(bp + 8);
        bp += CKV_NR;
        CKV_ROW(c00, c01, a0, 0);
        CKV_ROW(c10, c11, a0, l01);
        CKV_ROW(c20, c21, a0, l02);
        CKV_ROW(c30, c31, a1, 0);
        CKV_ROW(c40, c41, a1, l11);
        CKV_ROW(c50, c51, a1, l12);
        a0++;
        a1++;
    }
#undef CKV_ROW
    const __m256i m0 = ckv_mask8(nr), m1 = ckv_mask8(nr - 8);
    __m256 b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps();
    if (bias && first) {
        b0 = nr >= 16 ? _mm256_loadu_ps(bias) : _mm256_maskload_ps(bias, m0);
        b1 = nr >= 16 ? _mm256_loadu_ps(bias + 8) : _mm256_maskload_ps(bias + 8, m1);
    }
    ckv_store_row(c, c00, c01, nr, m0, m1, b0, b1, first);
    if (mr > 1) ckv_store_row(c + ldc, c10, c11, nr, m0, m1, b0, b1, first);
    if (mr > 2) ckv_store_row(c + 2 * ldc, c20, c21, nr, m0, m1, b0, b1, first);
    if (mr > 3) ckv_store_row(c + 3 * ldc, c30, c31, nr, m0, m1, b0, b1, first);
    if (mr > 4) ckv_store_row(c + 4 * ldc, c40, c41, nr, m0, m1, b0, b1, first);
    if (mr > 5) ckv_store_row(c + 5 * ldc, c50, c51, nr, m0, m1, b0, b1, first);
}

/* bp [kc, 16] = w [nr rows, kc]^T, zero columns past nr. Full panels go 8 x 8 blocks at a time through
 * an in-register transpose. */
static CKV_AVX2 void ckv_avx2_pack(int kc, const float *w, size_t ldw, int nr, float *bp) {
    int c0 = 0;
    for (; c0 + 8 <= nr; c0 += 8) {
        const float *wr = w + (size_t)c0 * ldw;
        int p = 0;
        for (; p + 8 <= kc; p += 8) {
            __m256 r0 = _mm256_loadu_ps(wr + p), r1 = _mm256_loadu_ps(wr + ldw + p),
                   r2 = _mm256_loadu_ps(wr + 2 * ldw + p), r3 = _mm256_loadu_ps(wr + 3 * ldw + p),
                   r4 = _mm256_loadu_ps(wr + 4 * ldw + p), r5 = _mm256_loadu_ps(wr + 5 * ldw + p),
                   r6 = _mm256_loadu_ps(wr + 6 * ldw + p), r7 = _mm256_loadu_ps(wr + 7 * ldw + p);
            /* 8 x 8 transpose: 32-bit and 64-bit interleaves inside 128-bit lanes, then lane swaps */
            __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
            __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
            __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
            __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
            __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            /* s0..s3 (rows 0-3), s4..s7 (rows 4-7): lane L holds column 4L + {0, 1, 2, 3} */
            float *d = bp + (size_t)p * CKV_NR + c0;
            _mm256_store_ps(d + 0 * CKV_NR, _mm256_permute2f128_ps(s0, s4, 0x20));
            _mm256_store_ps(d + 1 * CKV_NR, _mm256_permute2f128_ps(s1, s5, 0x20));
            _mm256_store_ps(d + 2 * CKV_NR, _mm256_permute2f128_ps(s2, s6, 0x20));
            _mm256_store_ps(d + 3 * CKV_NR, _mm256_permute2f128_ps(s3, s7, 0x20));
            _mm256_store_ps(d + 4 * CKV_NR, _mm256_permute2f128_ps(s0, s4, 0x31));
            _mm256_store_ps(d + 5 * CKV_NR, _mm256_permute2f128_ps(s1, s5, 0x31));
            _mm256_store_ps(d + 6 * CKV_NR, _mm256_permute2f128_ps(s2, s6, 0x31));
            _mm256_store_ps(d + 7 * CKV_NR, _mm256_permute2f128_ps(s3, s7, 0x31));
        }
        for (; p < kc; p++)
            for (int i = 0; i < 8; i++) bp[(size_t)p * CKV_NR + c0 + i] = wr[(size_t)i * ldw + p];
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

static inline CKV_AVX2 float ckv_hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static CKV_AVX2 void ckv_avx2_gemv(int rows, int k, const float *w, size_t ldw, const float *x, const float *bias,
                                   float *out) {
    const int kv = k & ~7;
    const __m256i kt = ckv_mask8(k - kv);
    const int tail = k > kv;
    int j = 0;
    for (; j + 4 <= rows; j += 4) {
        const float *w0 = w + (size_t)j * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
        __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
               s3 = _mm256_setzero_ps();
        for (int p = 0; p < kv; p += 8) {
            const __m256 xv = _mm256_loadu_ps(x + p);
            s0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + p), xv, s0);
            s1 = _mm256_fmadd_ps(_mm256_loadu_ps(w1 + p), xv, s1);
            s2 = _mm256_fmadd_ps(_mm256_loadu_ps(w2 + p), xv, s2);
            s3 = _mm256_fmadd_ps(_mm256_loadu_ps(w3 + p), xv, s3);
        }
        if (tail) {
            const __m256 xv = _mm256_maskload_ps(x + kv, kt);
            s0 = _mm256_fmadd_ps(_mm256_maskload_ps(w0 + kv, kt), xv, s0);
            s1 = _mm256_fmadd_ps(_mm256_maskload_ps(w1 + kv, kt), xv, s1);
            s2 = _mm256_fmadd_ps(_mm256_maskload_ps(w2 + kv, kt), xv, s2);
            s3 = _mm256_fmadd_ps(_mm256_maskload_ps(w3 + kv, kt), xv, s3);
        }
        out[j] = ckv_hsum8(s0) + (bias ? bias[j] : 0.0f);
        out[j + 1] = ckv_hsum8(s1) + (bias ? bias[j + 1] : 0.0f);
        out[j + 2] = ckv_hsum8(s2) + (bias ? bias[j + 2] : 0.0f);
        out[j + 3] = ckv_hsum8(s3) + (bias ? bias[j + 3] : 0.0f);
    }
    for (; j < rows; j++) {
        const float *w0 = w + (size_t)j * ldw;
        __m256 s0 = _mm256_setzero_ps();
        for (int p = 0; p < kv; p += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(w0 + p), _mm256_loadu_ps(x + p), s0);
        if (tail) s0 = _mm256_fmadd_ps(_mm256_maskload_ps(w0 + kv, kt), _mm256_maskload_ps(x + kv, kt), s0);
        out[j] = ckv_hsum8(s0) + (bias ? bias[j] : 0.0f);
    }
}

const ckv_gemm_arch ckv_gemm_arch_avx2 = {
    .name = "avx2", .mr = CKV_MR, .nr = CKV_NR, .ukernel = ckv_avx2_ukernel, .pack = ckv_avx2_pack,
    .gemv = ckv_avx2_gemv};

#else /* not x86 or not a GCC-compatible compiler: the set exists but is never chosen */

int ckv_gemm_avx2_supported(void) { return 0; }
const ckv_gemm_arch ckv_gemm_arch_avx2 = {.name = "avx2 (not built)"};

#endif
