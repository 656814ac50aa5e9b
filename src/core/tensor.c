/* tensor.c - dtype table and half-precision conversions. */
#include "tensor.h"

#include <string.h>

size_t ckv_dtype_size(ckv_dtype t) {
    switch (t) {
    case CKV_DTYPE_F32: return 4;
    case CKV_DTYPE_F16: return 2;
    case CKV_DTYPE_BF16: return 2;
    case CKV_DTYPE_I32: return 4;
    case CKV_DTYPE_I64: return 8;
    default: return 0;
    }
}

const char *ckv_dtype_name(ckv_dtype t) {
    switch (t) {
    case CKV_DTYPE_F32: return "F32";
    case CKV_DTYPE_F16: return "F16";
    case CKV_DTYPE_BF16: return "BF16";
    case CKV_DTYPE_I32: return "I32";
    case CKV_DTYPE_I64: return "I64";
    case CKV_DTYPE_Q8_0: return "Q8_0";
    case CKV_DTYPE_Q4_0: return "Q4_0";
    case CKV_DTYPE_Q4_1: return "Q4_1";
    case CKV_DTYPE_Q5_0: return "Q5_0";
    case CKV_DTYPE_Q5_1: return "Q5_1";
    case CKV_DTYPE_Q4_K: return "Q4_K";
    case CKV_DTYPE_Q5_K: return "Q5_K";
    case CKV_DTYPE_Q6_K: return "Q6_K";
    case CKV_DTYPE_DEFAULT: return "default";
    default: return "?";
    }
}

int ckv_dtype_is_block(ckv_dtype t) { return t >= CKV_DTYPE_Q8_0 && t < CKV_DTYPE_COUNT_; }

int ckv_dtype_block_elems(ckv_dtype t) {
    switch (t) {
    case CKV_DTYPE_Q8_0:
    case CKV_DTYPE_Q4_0:
    case CKV_DTYPE_Q4_1:
    case CKV_DTYPE_Q5_0:
    case CKV_DTYPE_Q5_1: return 32;
    case CKV_DTYPE_Q4_K:
    case CKV_DTYPE_Q5_K:
    case CKV_DTYPE_Q6_K: return 256;
    default: return 1;
    }
}

size_t ckv_dtype_block_bytes(ckv_dtype t) {
    switch (t) { /* ggml's block structs: scales as f16, then quants */
    case CKV_DTYPE_Q8_0: return 2 + 32;
    case CKV_DTYPE_Q4_0: return 2 + 16;
    case CKV_DTYPE_Q4_1: return 4 + 16;
    case CKV_DTYPE_Q5_0: return 2 + 4 + 16;
    case CKV_DTYPE_Q5_1: return 4 + 4 + 16;
    case CKV_DTYPE_Q4_K: return 4 + 12 + 128;
    case CKV_DTYPE_Q5_K: return 4 + 12 + 32 + 128;
    case CKV_DTYPE_Q6_K: return 128 + 64 + 16 + 2;
    default: return ckv_dtype_size(t);
    }
}

size_t ckv_dtype_row_bytes(ckv_dtype t, int64_t cols) {
    int be = ckv_dtype_block_elems(t);
    if (cols < 0 || cols % be != 0) return 0;
    return (size_t)(cols / be) * ckv_dtype_block_bytes(t);
}

static int dtype_name_eq(const char *a, const char *b) {
    for (; *a && *b; a++, b++) {
        char c = *a >= 'A' && *a <= 'Z' ? (char)(*a - 'A' + 'a') : *a;
        if (c != *b) return 0;
    }
    return *a == *b;
}

int ckv_dtype_parse_float(const char *name, ckv_dtype *t) {
    if (!name) return 0;
    if (dtype_name_eq(name, "f32")) *t = CKV_DTYPE_F32;
    else if (dtype_name_eq(name, "f16")) *t = CKV_DTYPE_F16;
    else if (dtype_name_eq(name, "bf16")) *t = CKV_DTYPE_BF16;
    else return 0;
    return 1;
}

int64_t ckv_tensor_numel(const ckv_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

float ckv_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ckv_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float ckv_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400u)) {
                man <<= 1;
                exp--;
            }
            man &= 0x3ffu;
            u = sign | (exp << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t ckv_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000u;
    int32_t exp = (int32_t)((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffffu;
    if (((u >> 23) & 0xff) == 0xff) return (uint16_t)(sign | 0x7c00u | (man ? 0x200u : 0));
    if (exp >= 31) return (uint16_t)(sign | 0x7c00u);
    if (exp <= 0) {
        if (exp < -10) return (uint16_t)sign;
        man |= 0x800000u;
        uint32_t shift = (uint32_t)(14 - exp);
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t half = sign | ((uint32_t)exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1))) half++;
    return (uint16_t)half;
}

void ckv_convert_to_f32(float *dst, const void *src, ckv_dtype t, size_t n) {
    if (t == CKV_DTYPE_F32) {
        memcpy(dst, src, n * 4);
    } else if (t == CKV_DTYPE_BF16) {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = ckv_bf16_to_f32(s[i]);
    } else if (t == CKV_DTYPE_F16) {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = ckv_f16_to_f32(s[i]);
    }
}

void ckv_convert_from_f32(void *dst, const float *src, ckv_dtype t, size_t n) {
    if (t == CKV_DTYPE_F32) {
        memcpy(dst, src, n * 4);
    } else if (t == CKV_DTYPE_BF16) {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = ckv_f32_to_bf16(src[i]);
    } else if (t == CKV_DTYPE_F16) {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = ckv_f32_to_f16(src[i]);
    }
}
