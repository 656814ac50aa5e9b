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
    default: return "?";
    }
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
