/* ckv_mma.h - the one tensor-core wrapper of the CUDA backend: the warp-wide
 * mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (D = A B + C, A 16x16 and B 16x8 bf16, C and
 * D 16x8 fp32) and the bf16x2 packing its fragments use. Under nvcc it is inline PTX (with
 * ckv_async.h's copies and matrix loads, the only inline PTX of ckv); under the CPU execution
 * layer every lane hands its registers to a warp collective that gathers the fragments of the 32
 * lanes by the PTX ISA layouts (docs/gpu.md §1), multiplies and hands each lane its D registers.
 * With g = lane >> 2 and t = lane & 3, each 32-bit register holds two bf16, the lower column/row
 * index in the low half:
 *   A: a0 = (g, 2t..2t+1)  a1 = (g+8, 2t..2t+1)  a2 = (g, 2t+8..2t+9)  a3 = (g+8, 2t+8..2t+9)
 *   B (k, n): b0 = (2t..2t+1, g)  b1 = (2t+8..2t+9, g)
 *   C/D: c0 = (g, 2t) c1 = (g, 2t+1) c2 = (g+8, 2t) c3 = (g+8, 2t+1)
 * Every lane of the warp must call it (no divergence). Also the split of fp32 values into three
 * bf16 terms that the fp32-accurate products of an f32 cache use. Nothing else lives here. */
#ifndef CKV_MMA_H
#define CKV_MMA_H

#include "cuda_rt.h"

/* Bits of two bf16 values rounded from fp32 (round to nearest even): lo in bits 0-15. */
__device__ __forceinline__ uint32_t ckv_pack_bf16x2(float lo, float hi) {
#if defined(CKV_CUDA_EMU)
    return (uint32_t)__float2bfloat16(lo).x | ((uint32_t)__float2bfloat16(hi).x << 16);
#else
    return (uint32_t)__bfloat16_as_ushort(__float2bfloat16(lo)) |
           ((uint32_t)__bfloat16_as_ushort(__float2bfloat16(hi)) << 16);
#endif
}

/* The fp32 values of the low and high bf16 halves of a packed register. */
__device__ __forceinline__ float ckv_bf16x2_lo(uint32_t r) { return __uint_as_float(r << 16); }
__device__ __forceinline__ float ckv_bf16x2_hi(uint32_t r) { return __uint_as_float(r & 0xffff0000u); }

/* Two fp32 values as three packed bf16 terms, x = p[0] + p[1] + p[2] + e with |e| <= 2^-26 |x|
 * (each term rounds the remainder of the ones before it; the remainders are exact in fp32): with
 * the six mma products of terms i + j <= 2 (p0 q0, p0 q1, p1 q0, p1 q1, p0 q2, p2 q0) a product
 * x y keeps fp32 accuracy, the terms left out are below 2^-25 |x y| (docs/gpu.md §3a). */
__device__ __forceinline__ void ckv_split_bf16x2(float x0, float x1, uint32_t p[3]) {
    p[0] = ckv_pack_bf16x2(x0, x1);
    x0 -= ckv_bf16x2_lo(p[0]), x1 -= ckv_bf16x2_hi(p[0]);
    p[1] = ckv_pack_bf16x2(x0, x1);
    x0 -= ckv_bf16x2_lo(p[1]), x1 -= ckv_bf16x2_hi(p[1]);
    p[2] = ckv_pack_bf16x2(x0, x1);
}

#if defined(CKV_CUDA_EMU)
struct ckv_mma_lane {
    uint32_t a[4], b[2];
    float c[4], d[4];
};

static inline float ckv_mma_lo(uint32_t r) {
    __nv_bfloat16 h;
    h.x = (uint16_t)(r & 0xffffu);
    return __bfloat162float(h);
}
static inline float ckv_mma_hi(uint32_t r) {
    __nv_bfloat16 h;
    h.x = (uint16_t)(r >> 16);
    return __bfloat162float(h);
}

/* Gathers A [16, 16], B [16, 8] (k, n) and C [16, 8] from the lanes' registers, D = A B + C with the
 * fp32 products summed in double (the hardware's order and precision are unspecified), scatters D. */
inline void ckv_mma_16816_fn(void *lanes[32], unsigned mask) { /* inline: one address (emu_profile.cpp counts it) */
    (void)mask; /* full: the rendezvous required every lane */
    float A[16][16], B[16][8], C[16][8];
    for (int l = 0; l < 32; l++) {
        const ckv_mma_lane *r = (const ckv_mma_lane *)lanes[l];
        const int g = l >> 2, t = l & 3;
        A[g][2 * t] = ckv_mma_lo(r->a[0]), A[g][2 * t + 1] = ckv_mma_hi(r->a[0]);
        A[g + 8][2 * t] = ckv_mma_lo(r->a[1]), A[g + 8][2 * t + 1] = ckv_mma_hi(r->a[1]);
        A[g][2 * t + 8] = ckv_mma_lo(r->a[2]), A[g][2 * t + 9] = ckv_mma_hi(r->a[2]);
        A[g + 8][2 * t + 8] = ckv_mma_lo(r->a[3]), A[g + 8][2 * t + 9] = ckv_mma_hi(r->a[3]);
        B[2 * t][g] = ckv_mma_lo(r->b[0]), B[2 * t + 1][g] = ckv_mma_hi(r->b[0]);
        B[2 * t + 8][g] = ckv_mma_lo(r->b[1]), B[2 * t + 9][g] = ckv_mma_hi(r->b[1]);
        C[g][2 * t] = r->c[0], C[g][2 * t + 1] = r->c[1];
        C[g + 8][2 * t] = r->c[2], C[g + 8][2 * t + 1] = r->c[3];
    }
    float D[16][8];
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 8; j++) {
            double acc = 0.0;
            for (int k = 0; k < 16; k++) acc += (double)(A[i][k] * B[k][j]); /* exact products */
            D[i][j] = (float)(acc + (double)C[i][j]);
        }
    for (int l = 0; l < 32; l++) {
        ckv_mma_lane *r = (ckv_mma_lane *)lanes[l];
        const int g = l >> 2, t = l & 3;
        r->d[0] = D[g][2 * t], r->d[1] = D[g][2 * t + 1];
        r->d[2] = D[g + 8][2 * t], r->d[3] = D[g + 8][2 * t + 1];
    }
}
#endif

/* d = a b + c for one warp (d may alias c). */
__device__ __forceinline__ void ckv_mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2],
                                                    const float c[4]) {
#if defined(CKV_CUDA_EMU)
    ckv_mma_lane me;
    for (int i = 0; i < 4; i++) me.a[i] = a[i], me.c[i] = c[i];
    me.b[0] = b[0], me.b[1] = b[1];
    ckv_emu_warp_collective(ckv_mma_16816_fn, &me, 0xffffffffu);
    for (int i = 0; i < 4; i++) d[i] = me.d[i];
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n"
                 : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]),
                   "f"(c[2]), "f"(c[3]));
#endif
}

#endif
