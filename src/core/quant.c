/* quant.c - dequantisation of F32, F16, BF16 and the GGUF block types to fp32, one block at a time,
 * written from ggml's published block layouts (each function's comment states its layout). Plain C:
 * the reference the SIMD kernels of backend/cpu are tested against, and what loaders use when they
 * convert weights to fp32. */
#include "core/quant.h"

#include <stdint.h>
#include <string.h>

static float quant_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return ckv_f16_to_f32(h);
}

/* Q8_0: fp16 scale d, 32 int8 codes; x = d * q. */
static void quant_deq_q8_0(const uint8_t *b, float *y) {
    float d = quant_half(b);
    const int8_t *q = (const int8_t *)(b + 2);
    for (int i = 0; i < 32; i++) y[i] = d * (float)q[i];
}

/* Q4_0: fp16 scale d, 16 bytes of nibbles; element i is the low nibble of byte i, element i + 16 its
 * high nibble; x = d * (nibble - 8). */
static void quant_deq_q4_0(const uint8_t *b, float *y) {
    float d = quant_half(b);
    const uint8_t *q = b + 2;
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)((int)(q[i] & 15) - 8);
        y[i + 16] = d * (float)((int)(q[i] >> 4) - 8);
    }
}

/* Q4_1: fp16 scale d and minimum m, nibbles as in Q4_0; x = d * nibble + m. */
static void quant_deq_q4_1(const uint8_t *b, float *y) {
    float d = quant_half(b), m = quant_half(b + 2);
    const uint8_t *q = b + 4;
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)(q[i] & 15) + m;
        y[i + 16] = d * (float)(q[i] >> 4) + m;
    }
}

/* The fifth bits of a Q5_0 / Q5_1 block: a little-endian uint32, bit i belonging to element i. */
static uint32_t quant_q5_high(const uint8_t *p) {
    uint32_t h;
    memcpy(&h, p, 4);
    return h;
}

/* Q5_0: fp16 scale d, 4 bytes of fifth bits, 16 bytes of nibbles laid out as in Q4_0; the 5-bit code
 * of element i is its nibble plus bit i of the fifth bits times 16; x = d * (code - 16). */
static void quant_deq_q5_0(const uint8_t *b, float *y) {
    float d = quant_half(b);
    uint32_t h = quant_q5_high(b + 2);
    const uint8_t *q = b + 6;
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)((int)((q[i] & 15) | (((h >> i) & 1) << 4)) - 16);
        y[i + 16] = d * (float)((int)((q[i] >> 4) | (((h >> (i + 16)) & 1) << 4)) - 16);
    }
}

/* Q5_1: fp16 scale d and minimum m, fifth bits and nibbles as in Q5_0; x = d * code + m. */
static void quant_deq_q5_1(const uint8_t *b, float *y) {
    float d = quant_half(b), m = quant_half(b + 2);
    uint32_t h = quant_q5_high(b + 4);
    const uint8_t *q = b + 8;
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)((q[i] & 15) | (((h >> i) & 1) << 4)) + m;
        y[i + 16] = d * (float)((q[i] >> 4) | (((h >> (i + 16)) & 1) << 4)) + m;
    }
}

/* The 6-bit scale and minimum of sub-block j (0..7) packed in Q4_K's 12 bytes: sub-blocks 0-3 keep
 * theirs in the low 6 bits of bytes j (scale) and j + 4 (minimum); sub-blocks 4-7 have their low 4
 * bits in byte j + 4 (scale: low nibble, minimum: high nibble) and their top 2 bits in the spare top
 * bits of bytes j - 4 (scale) and j (minimum). */
void ckv_quant_k4_scale_min(const uint8_t *s, int j, int *sc, int *mn) {
    if (j < 4) {
        *sc = s[j] & 63;
        *mn = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q4_K: 256 elements in 8 sub-blocks of 32; fp16 d and dmin, 12 bytes of 6-bit scales and minimums,
 * 128 bytes of nibbles. Each 32-byte group of nibbles holds two sub-blocks: its low nibbles the first
 * (2g), its high nibbles the second (2g + 1); x = d * sc * q - dmin * mn.
 * Q5_K (fifth = 1): the same with 32 bytes of fifth bits (qh) before the nibbles: element l (< 32) of
 * sub-block 2g takes bit 2g of qh[l], element l of sub-block 2g + 1 bit 2g + 1; x = d * sc * (nibble +
 * 16 * bit) - dmin * mn. */
static inline void quant_deq_k45(const uint8_t *b, float *y, int fifth) {
    float d = quant_half(b), dmin = quant_half(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *q = b + (fifth ? 48 : 16);
    for (int g = 0; g < 4; g++) {
        int sc0, mn0, sc1, mn1;
        ckv_quant_k4_scale_min(scales, 2 * g, &sc0, &mn0);
        ckv_quant_k4_scale_min(scales, 2 * g + 1, &sc1, &mn1);
        float d0 = d * (float)sc0, m0 = dmin * (float)mn0, d1 = d * (float)sc1, m1 = dmin * (float)mn1;
        for (int l = 0; l < 32; l++) {
            int h0 = fifth ? ((qh[l] >> (2 * g)) & 1) << 4 : 0, h1 = fifth ? ((qh[l] >> (2 * g + 1)) & 1) << 4 : 0;
            y[64 * g + l] = d0 * (float)((q[32 * g + l] & 15) | h0) - m0;
            y[64 * g + 32 + l] = d1 * (float)((q[32 * g + l] >> 4) | h1) - m1;
        }
    }
}

static void quant_deq_q4_k(const uint8_t *b, float *y) { quant_deq_k45(b, y, 0); }
static void quant_deq_q5_k(const uint8_t *b, float *y) { quant_deq_k45(b, y, 1); }

/* Q6_K: 256 elements in 16 sub-blocks of 16; 128 bytes of low nibbles (ql), 64 bytes of 2-bit high
 * parts (qh), 16 int8 sub-block scales, fp16 d. Each half of 128 elements uses 64 bytes of ql and 32
 * of qh: for l in 0..31, element l takes the low nibble of ql[l] and bits 0-1 of qh[l], element l + 32
 * the low nibble of ql[l + 32] and bits 2-3, element l + 64 the high nibble of ql[l] and bits 4-5,
 * element l + 96 the high nibble of ql[l + 32] and bits 6-7; x = d * scale[element / 16] * (q - 32). */
static void quant_deq_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = quant_half(b + 208);
    for (int half = 0; half < 2; half++) {
        const uint8_t *L = ql + 64 * half, *H = qh + 32 * half;
        float *o = y + 128 * half;
        const int8_t *s = sc + 8 * half;
        for (int l = 0; l < 32; l++) {
            int q0 = (int)((L[l] & 15) | ((H[l] & 3) << 4)) - 32;
            int q1 = (int)((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4)) - 32;
            int q2 = (int)((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32;
            int q3 = (int)((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32;
            o[l] = d * (float)s[l / 16] * (float)q0;
            o[l + 32] = d * (float)s[2 + l / 16] * (float)q1;
            o[l + 64] = d * (float)s[4 + l / 16] * (float)q2;
            o[l + 96] = d * (float)s[6 + l / 16] * (float)q3;
        }
    }
}

typedef void (*quant_deq_fn)(const uint8_t *block, float *y);

void ckv_dequant_row(ckv_dtype t, const void *src, float *dst, size_t n) {
    quant_deq_fn fn = NULL;
    switch (t) {
    case CKV_DTYPE_F32: memcpy(dst, src, n * sizeof *dst); return;
    case CKV_DTYPE_F16:
    case CKV_DTYPE_BF16: ckv_convert_to_f32(dst, src, t, n); return;
    case CKV_DTYPE_Q8_0: fn = quant_deq_q8_0; break;
    case CKV_DTYPE_Q4_0: fn = quant_deq_q4_0; break;
    case CKV_DTYPE_Q4_1: fn = quant_deq_q4_1; break;
    case CKV_DTYPE_Q5_0: fn = quant_deq_q5_0; break;
    case CKV_DTYPE_Q5_1: fn = quant_deq_q5_1; break;
    case CKV_DTYPE_Q4_K: fn = quant_deq_q4_k; break;
    case CKV_DTYPE_Q5_K: fn = quant_deq_q5_k; break;
    case CKV_DTYPE_Q6_K: fn = quant_deq_q6_k; break;
    default: return;
    }
    const size_t be = (size_t)ckv_dtype_block_elems(t), bb = ckv_dtype_block_bytes(t);
    const uint8_t *p = src;
    for (size_t i = 0; i < n / be; i++) fn(p + i * bb, dst + i * be);
}
