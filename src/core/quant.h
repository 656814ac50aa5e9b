/* quant.h - dequantisation of weights to fp32: F32, F16, BF16 and the GGUF block types of core/tensor.h
 * (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) in ggml's published block layouts. The reference
 * for every reader and kernel that consumes such weights. No file formats, no SIMD, no threads. */
#ifndef CKV_QUANT_H
#define CKV_QUANT_H

#include <stddef.h>
#include <stdint.h>

#include "core/tensor.h"

/* dst[0 .. n) = the values of the n elements of type t at src (n a multiple of t's block size;
 * other dtypes than the float and block types leave dst untouched). */
void ckv_dequant_row(ckv_dtype t, const void *src, float *dst, size_t n);

/* The 6-bit scale *sc and minimum *mn of sub-block j (0..7) from the 12 packed bytes s of a Q4_K or
 * Q5_K block. */
void ckv_quant_k4_scale_min(const uint8_t *s, int j, int *sc, int *mn);

#endif
