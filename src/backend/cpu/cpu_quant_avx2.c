/* cpu_quant_avx2.c - the AVX2 + FMA dot products of the stored-format matmul (contracts in
 * cpu_quant.h): per 32 weights, the codes are widened to bytes in one register, multiplied with the
 * activation bytes in 16-bit pairs (vpmaddubsw; signed weights go through |w| and sign(x, w)), summed
 * to 32-bit lanes (vpmaddwd) and scaled into 8 fp32 accumulator lanes; the K types first weight each
 * sub-block's 32-bit sums by its scale and scale once per super-block. Lanes are added in a fixed tree
 * at the end. Every function carries a target attribute, so the file builds without -mavx2 and runs
 * only after ckv_quant_avx2_supported() said yes. No threading, no activation rounding (cpu_quant.c). */
#include <string.h>

#include "core/quant.h"
#include "cpu_quant.h"

#if (defined(__GNUC__) || defined(__clang__)) && (defined(__x86_64__) || defined(__i386__))
#include <immintrin.h>

#define CKV_AVX2 __attribute__((target("avx2,fma,f16c")))

int ckv_quant_avx2_supported(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

static inline CKV_AVX2 float q_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* The sum of 8 lanes: (0+4, 1+5, 2+6, 3+7), then pairs, then the last two. */
static inline CKV_AVX2 float q_hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* 32 bytes: the low nibbles of 16 bytes at q (elements 0..15), then their high nibbles (16..31). */
static inline CKV_AVX2 __m256i q_nibbles(const uint8_t *q) {
    const __m128i t = _mm_loadu_si128((const __m128i *)(const void *)q);
    const __m256i v = _mm256_set_m128i(_mm_srli_epi16(t, 4), t);
    return _mm256_and_si256(v, _mm256_set1_epi8(15));
}

/* 32 bytes, byte i 0x10 when bit i of the 32 bits at p is set, else 0. */
static inline CKV_AVX2 __m256i q_fifth_bits(const uint8_t *p) {
    uint32_t h;
    memcpy(&h, p, 4);
    /* byte i of the register gets byte i / 8 of h, then keeps bit i % 8 of it */
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)h), _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2,
                                                    2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

/* 8 int32 lanes: sums of products of unsigned bytes u (< 128) with signed bytes s, 4 per lane. */
static inline CKV_AVX2 __m256i q_dot_us(__m256i u, __m256i s) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

/* The same for signed bytes a (> -128) and b. */
static inline CKV_AVX2 __m256i q_dot_ss(__m256i a, __m256i b) {
    return q_dot_us(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
}

static inline CKV_AVX2 __m256i q_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }

/* ---- 32-element types ---- */

static CKV_AVX2 float avx2_dot_q8_0(int nb, const void *wv, const void *xv) {
    const uint8_t *w = wv;
    const ckv_q8x32 *x = xv;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, w += 34, x++) {
        const __m256i p = q_dot_ss(q_load(w + 2), q_load(x->q));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(q_half(w) * x->d), _mm256_cvtepi32_ps(p), acc);
    }
    return q_hsum(acc);
}

static CKV_AVX2 float avx2_dot_q4_0(int nb, const void *wv, const void *xv) {
    const uint8_t *w = wv;
    const ckv_q8x32 *x = xv;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, w += 18, x++) {
        const __m256i c = _mm256_sub_epi8(q_nibbles(w + 2), _mm256_set1_epi8(8));
        const __m256i p = q_dot_ss(c, q_load(x->q));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(q_half(w) * x->d), _mm256_cvtepi32_ps(p), acc);
    }
    return q_hsum(acc);
}

static CKV_AVX2 float avx2_dot_q4_1(int nb, const void *wv, const void *xv) {
    const uint8_t *w = wv;
    const ckv_q8x32 *x = xv;
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int b = 0; b < nb; b++, w += 20, x++) {
        const __m256i p = q_dot_us(q_nibbles(w + 4), q_load(x->q));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(q_half(w) * x->d), _mm256_cvtepi32_ps(p), acc);
        mins += q_half(w + 2) * x->s;
    }
    return q_hsum(acc) + mins;
}

static CKV_AVX2 float avx2_dot_q5_0(int nb, const void *wv, const void *xv) {
    const uint8_t *w = wv;
    const ckv_q8x32 *x = xv;
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, w += 22, x++) {
        const __m256i u = _mm256_or_si256(q_nibbles(w + 6), q_fifth_bits(w + 2));
        const __m256i p = q_dot_ss(_mm256_sub_epi8(u, _mm256_set1_epi8(16)), q_load(x->q));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(q_half(w) * x->d), _mm256_cvtepi32_ps(p), acc);
    }
    return q_hsum(acc);
}

static CKV_AVX2 float avx2_dot_q5_1(int nb, const void *wv, const void *xv) {
    const uint8_t *w = wv;
    const ckv_q8x32 *x = xv;
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int b = 0; b < nb; b++, w += 24, x++) {
        const __m256i u = _mm256_or_si256(q_nibbles(w + 8), q_fifth_bits(w + 4));
        const __m256i p = q_dot_us(u, q_load(x->q));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(q_half(w) * x->d), _mm256_cvtepi32_ps(p), acc);
        mins += q_half(w + 2) * x->s;
    }
    return q_hsum(acc) + mins;
}

/* ---- K types ---- */

/* Q4_K / Q5_K: for each group g of 64 elements, the low nibbles of 32 bytes are sub-block 2g and the
 * high nibbles sub-block 2g + 1 (plus, for Q5_K, bits 2g and 2g + 1 of the 32 qh bytes). */
static inline CKV_AVX2 float avx2_dot_k45(int nb, const uint8_t *w, const ckv_q8x256 *x, int fifth) {
    const size_t bb = fifth ? 176 : 144;
    const __m256i low4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    float mins = 0.0f;
    for (int b = 0; b < nb; b++, w += bb, x++) {
        int sc[8], mn[8], summ = 0;
        for (int j = 0; j < 8; j++) {
            ckv_quant_k4_scale_min(w + 4, j, &sc[j], &mn[j]);
            summ += mn[j] * (x->bsum[2 * j] + x->bsum[2 * j + 1]);
        }
        const uint8_t *q = w + (fifth ? 48 : 16);
        const __m256i hb = fifth ? q_load(w + 16) : _mm256_setzero_si256();
        __m256i sumi = _mm256_setzero_si256();
        for (int g = 0; g < 4; g++) {
            const __m256i q4 = q_load(q + 32 * g);
            __m256i lo = _mm256_and_si256(q4, low4), hi = _mm256_and_si256(_mm256_srli_epi16(q4, 4), low4);
            if (fifth) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g), one), 4));
                hi = _mm256_or_si256(hi,
                                     _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g + 1), one), 4));
            }
            const __m256i plo = _mm256_maddubs_epi16(lo, q_load(x->q + 64 * g));
            const __m256i phi = _mm256_maddubs_epi16(hi, q_load(x->q + 64 * g + 32));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(plo, _mm256_set1_epi16((short)sc[2 * g])));
            sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(phi, _mm256_set1_epi16((short)sc[2 * g + 1])));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(q_half(w) * x->d), _mm256_cvtepi32_ps(sumi), acc);
        mins += q_half(w + 2) * x->d * (float)summ;
    }
    return q_hsum(acc) - mins;
}

static CKV_AVX2 float avx2_dot_q4_k(int nb, const void *w, const void *x) { return avx2_dot_k45(nb, w, x, 0); }
static CKV_AVX2 float avx2_dot_q5_k(int nb, const void *w, const void *x) { return avx2_dot_k45(nb, w, x, 1); }

/* Q6_K: each half of 128 is four runs of 32 codes (ql low / high nibbles of bytes 0-31 and 32-63, two
 * qh bits each); a run covers sub-blocks 2r and 2r + 1, one per 128-bit lane of the 16-bit products.
 * The codes are unsigned (u = q + 32); the 32 sum(q) of each sub-block is taken off with bsum. */
static CKV_AVX2 float avx2_dot_q6_k(int nb, const void *wv, const void *xv) {
    const uint8_t *w = wv;
    const ckv_q8x256 *x = xv;
    const __m256i low4 = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++, w += 210, x++) {
        const int8_t *sc = (const int8_t *)(w + 192);
        int offset = 0;
        for (int s = 0; s < 16; s++) offset += sc[s] * x->bsum[s];
        __m256i sumi = _mm256_setzero_si256();
        for (int half = 0; half < 2; half++) {
            const __m256i l0 = q_load(w + 64 * half), l1 = q_load(w + 64 * half + 32);
            const __m256i h = q_load(w + 128 + 32 * half);
            const __m256i u[4] = {
                _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(h, two), 4)),
                _mm256_or_si256(_mm256_and_si256(l1, low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), two), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), two), 4)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                                _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), two), 4))};
            for (int r = 0; r < 4; r++) {
                const int s = 8 * half + 2 * r;
                const __m256i p = _mm256_maddubs_epi16(u[r], q_load(x->q + 128 * half + 32 * r));
                const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(sc[s + 1]), _mm_set1_epi16(sc[s]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, scale));
            }
        }
        /* sum (u - 32) q sc = sum u q sc - 32 sum sc bsum */
        sumi = _mm256_sub_epi32(sumi, _mm256_setr_epi32(32 * offset, 0, 0, 0, 0, 0, 0, 0));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(q_half(w + 208) * x->d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return q_hsum(acc);
}

/* ---- F16 / BF16 ---- */

static inline CKV_AVX2 __m256 q_widen(const uint16_t *p, int bf16) {
    const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)p);
    if (bf16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

static inline CKV_AVX2 float avx2_dot_half(int k, const uint16_t *w, const float *x, int bf16) {
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    int p = 0;
    for (; p + 32 <= k; p += 32) {
        a0 = _mm256_fmadd_ps(q_widen(w + p, bf16), _mm256_loadu_ps(x + p), a0);
        a1 = _mm256_fmadd_ps(q_widen(w + p + 8, bf16), _mm256_loadu_ps(x + p + 8), a1);
        a2 = _mm256_fmadd_ps(q_widen(w + p + 16, bf16), _mm256_loadu_ps(x + p + 16), a2);
        a3 = _mm256_fmadd_ps(q_widen(w + p + 24, bf16), _mm256_loadu_ps(x + p + 24), a3);
    }
    for (; p + 8 <= k; p += 8) a0 = _mm256_fmadd_ps(q_widen(w + p, bf16), _mm256_loadu_ps(x + p), a0);
    float tail = 0.0f;
    for (; p < k; p++) tail += (bf16 ? ckv_bf16_to_f32(w[p]) : ckv_f16_to_f32(w[p])) * x[p];
    return q_hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) + tail;
}

static CKV_AVX2 float avx2_dot_f16(int k, const void *w, const void *x) { return avx2_dot_half(k, w, x, 0); }
static CKV_AVX2 float avx2_dot_bf16(int k, const void *w, const void *x) { return avx2_dot_half(k, w, x, 1); }

const ckv_quant_arch ckv_quant_arch_avx2 = {
    .name = "avx2",
    .dot = {[CKV_DTYPE_F16] = avx2_dot_f16,
            [CKV_DTYPE_BF16] = avx2_dot_bf16,
            [CKV_DTYPE_Q8_0] = avx2_dot_q8_0,
            [CKV_DTYPE_Q4_0] = avx2_dot_q4_0,
            [CKV_DTYPE_Q4_1] = avx2_dot_q4_1,
            [CKV_DTYPE_Q5_0] = avx2_dot_q5_0,
            [CKV_DTYPE_Q5_1] = avx2_dot_q5_1,
            [CKV_DTYPE_Q4_K] = avx2_dot_q4_k,
            [CKV_DTYPE_Q5_K] = avx2_dot_q5_k,
            [CKV_DTYPE_Q6_K] = avx2_dot_q6_k}};

#else

int ckv_quant_avx2_supported(void) { return 0; }
const ckv_quant_arch ckv_quant_arch_avx2 = {.name = "avx2 (not built)"};

#endif
