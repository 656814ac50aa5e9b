/* cpu_quant.c - the driver of the matrix multiply over stored-format weights (see cpu_quant.h), the
 * portable kernel set and the choice of kernel set by the CPU's features.
 *
 * Driver, from CKV_QUANT_GEMM_ROWS rows of x on: the fp32 GEMM of cpu_gemm.c, its weight panels
 * dequantised on the fly (prefill is compute-bound: widening each weight once per row part costs
 * little, and the register-tiled fp32 kernels beat per-row integer dots there; the results are those
 * of the fp32 path over the dequantised weights). Fewer rows (decode): the rows of x are taken in
 * tiles whose rounded activations fit a stack buffer; the
 * caller's thread rounds a tile (the same portable code for every kernel set), then the pool's
 * threads split the weight rows (output columns) into contiguous blocks and compute, for each weight
 * row and each row of the tile, one dot product. The weight row stays in L1 across the tile's rows.
 * Each output element is a single dot whose order of summation depends on the kernel set and k only.
 *
 * Portable kernels: integer sums within a block, one float multiply-add per block (per super-block
 * for the K types), in block order. The block layouts are those of core/quant.c (ggml's). */
#include "cpu_quant.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/quant.h"
#include "cpu_gemm.h"

/* ---- activation rounding ----------------------------------------------------------------------- */

/* The scale d = max |x| / 127 and its inverse of a block of n values (0 for an all-zero block). */
static float quant_block_scale(const float *x, int n, float *inv) {
    float amax = 0.0f;
    for (int i = 0; i < n; i++) amax = fmaxf(amax, fabsf(x[i]));
    const float d = amax / 127.0f;
    *inv = d > 0.0f ? 1.0f / d : 0.0f;
    return d;
}

static int8_t quant_round(float v) {
    long q = lrintf(v);
    return (int8_t)(q > 127 ? 127 : q < -127 ? -127 : q);
}

void ckv_quant_x32(const float *x, int k, ckv_q8x32 *y) {
    for (int b = 0; b < k / 32; b++, x += 32, y++) {
        float inv;
        y->d = quant_block_scale(x, 32, &inv);
        int sum = 0;
        for (int i = 0; i < 32; i++) {
            y->q[i] = quant_round(x[i] * inv);
            sum += y->q[i];
        }
        y->s = y->d * (float)sum;
    }
}

void ckv_quant_x256(const float *x, int k, ckv_q8x256 *y) {
    for (int b = 0; b < k / 256; b++, x += 256, y++) {
        float inv;
        y->d = quant_block_scale(x, 256, &inv);
        for (int j = 0; j < 16; j++) {
            int sum = 0;
            for (int i = 16 * j; i < 16 * j + 16; i++) {
                y->q[i] = quant_round(x[i] * inv);
                sum += y->q[i];
            }
            y->bsum[j] = (int16_t)sum;
        }
    }
}

/* ---- portable kernels -------------------------------------------------------------------------- */

static float gen_half(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return ckv_f16_to_f32(h);
}

static uint32_t gen_u32(const uint8_t *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* 32 signed codes of a 32-element weight block into c (Q8_0: as stored; Q4_0 / Q5_0: code - 8 / - 16;
 * Q4_1 / Q5_1: unsigned codes). */
static void gen_codes32(ckv_dtype t, const uint8_t *b, int *c) {
    switch (t) {
    case CKV_DTYPE_Q8_0:
        for (int i = 0; i < 32; i++) c[i] = ((const int8_t *)(b + 2))[i];
        return;
    case CKV_DTYPE_Q4_0:
    case CKV_DTYPE_Q4_1: {
        const uint8_t *q = b + (t == CKV_DTYPE_Q4_0 ? 2 : 4);
        const int off = t == CKV_DTYPE_Q4_0 ? 8 : 0;
        for (int i = 0; i < 16; i++) c[i] = (q[i] & 15) - off, c[i + 16] = (q[i] >> 4) - off;
        return;
    }
    default: { /* Q5_0, Q5_1 */
        const int o = t == CKV_DTYPE_Q5_0 ? 2 : 4, off = t == CKV_DTYPE_Q5_0 ? 16 : 0;
        const uint32_t h = gen_u32(b + o);
        const uint8_t *q = b + o + 4;
        for (int i = 0; i < 16; i++) {
            c[i] = (int)((q[i] & 15) | (((h >> i) & 1) << 4)) - off;
            c[i + 16] = (int)((q[i] >> 4) | (((h >> (i + 16)) & 1) << 4)) - off;
        }
        return;
    }
    }
}

/* The 32-element types: sum over blocks of d_w d_x sum(c q) (+ m_w s_x for the types with a minimum). */
static float gen_dot32(ckv_dtype t, int nb, const uint8_t *w, const ckv_q8x32 *x) {
    const size_t bb = ckv_dtype_block_bytes(t);
    const int has_min = t == CKV_DTYPE_Q4_1 || t == CKV_DTYPE_Q5_1;
    float acc = 0.0f;
    for (int b = 0; b < nb; b++, w += bb, x++) {
        int c[32], isum = 0;
        gen_codes32(t, w, c);
        for (int i = 0; i < 32; i++) isum += c[i] * x->q[i];
        acc += gen_half(w) * x->d * (float)isum;
        if (has_min) acc += gen_half(w + 2) * x->s;
    }
    return acc;
}

static float gen_dot_q8_0(int nb, const void *w, const void *x) { return gen_dot32(CKV_DTYPE_Q8_0, nb, w, x); }
static float gen_dot_q4_0(int nb, const void *w, const void *x) { return gen_dot32(CKV_DTYPE_Q4_0, nb, w, x); }
static float gen_dot_q4_1(int nb, const void *w, const void *x) { return gen_dot32(CKV_DTYPE_Q4_1, nb, w, x); }
static float gen_dot_q5_0(int nb, const void *w, const void *x) { return gen_dot32(CKV_DTYPE_Q5_0, nb, w, x); }
static float gen_dot_q5_1(int nb, const void *w, const void *x) { return gen_dot32(CKV_DTYPE_Q5_1, nb, w, x); }

/* Q4_K / Q5_K (fifth = 1): per super-block d_x (d sum_j sc_j sum(u q) - dmin sum_j mn_j bsum_j). */
static float gen_dot_k45(int nb, const uint8_t *w, const ckv_q8x256 *x, int fifth) {
    const size_t bb = ckv_dtype_block_bytes(fifth ? CKV_DTYPE_Q5_K : CKV_DTYPE_Q4_K);
    float acc = 0.0f;
    for (int b = 0; b < nb; b++, w += bb, x++) {
        const uint8_t *qh = w + 16, *q = w + (fifth ? 48 : 16);
        int sumi = 0, summ = 0;
        for (int j = 0; j < 8; j++) {
            int sc, mn;
            ckv_quant_k4_scale_min(w + 4, j, &sc, &mn);
            const int g = j / 2, shift = 4 * (j & 1);
            int isum = 0;
            for (int l = 0; l < 32; l++) {
                int u = (q[32 * g + l] >> shift) & 15;
                if (fifth) u |= ((qh[l] >> j) & 1) << 4;
                isum += u * x->q[32 * j + l];
            }
            sumi += sc * isum;
            summ += mn * (x->bsum[2 * j] + x->bsum[2 * j + 1]);
        }
        acc += x->d * (gen_half(w) * (float)sumi - gen_half(w + 2) * (float)summ);
    }
    return acc;
}

static float gen_dot_q4_k(int nb, const void *w, const void *x) { return gen_dot_k45(nb, w, x, 0); }
static float gen_dot_q5_k(int nb, const void *w, const void *x) { return gen_dot_k45(nb, w, x, 1); }

/* Q6_K: per super-block d d_x sum_s sc_s sum((u - 32) q), u the 6-bit code (layout: core/quant.c). */
static float gen_dot_q6_k(int nb, const void *wv, const void *xv) {
    const uint8_t *w = wv;
    const ckv_q8x256 *x = xv;
    float acc = 0.0f;
    for (int b = 0; b < nb; b++, w += 210, x++) {
        const int8_t *sc = (const int8_t *)(w + 192);
        int sumi = 0;
        for (int half = 0; half < 2; half++) {
            const uint8_t *L = w + 64 * half, *H = w + 128 + 32 * half;
            const int8_t *q = x->q + 128 * half;
            int part[8] = {0}; /* the 8 sub-blocks of 16 of this half */
            for (int l = 0; l < 32; l++) {
                const int s = l / 16;
                part[s] += ((int)((L[l] & 15) | ((H[l] & 3) << 4)) - 32) * q[l];
                part[2 + s] += ((int)((L[l + 32] & 15) | (((H[l] >> 2) & 3) << 4)) - 32) * q[l + 32];
                part[4 + s] += ((int)((L[l] >> 4) | (((H[l] >> 4) & 3) << 4)) - 32) * q[l + 64];
                part[6 + s] += ((int)((L[l + 32] >> 4) | (((H[l] >> 6) & 3) << 4)) - 32) * q[l + 96];
            }
            for (int s = 0; s < 8; s++) sumi += sc[8 * half + s] * part[s];
        }
        acc += gen_half(w + 208) * x->d * (float)sumi;
    }
    return acc;
}

/* F16 / BF16 weights against fp32 activations: 16 partial sums, combined pairwise at the end. */
static float gen_dot_half(int k, const uint16_t *w, const float *x, int bf16) {
    float acc[16] = {0};
    int p = 0;
    for (; p + 16 <= k; p += 16)
        for (int l = 0; l < 16; l++)
            acc[l] += (bf16 ? ckv_bf16_to_f32(w[p + l]) : ckv_f16_to_f32(w[p + l])) * x[p + l];
    for (int l = 0; p < k; p++, l++) acc[l] += (bf16 ? ckv_bf16_to_f32(w[p]) : ckv_f16_to_f32(w[p])) * x[p];
    for (int h = 8; h > 0; h >>= 1)
        for (int l = 0; l < h; l++) acc[l] += acc[l + h];
    return acc[0];
}

static float gen_dot_f16(int k, const void *w, const void *x) { return gen_dot_half(k, w, x, 0); }
static float gen_dot_bf16(int k, const void *w, const void *x) { return gen_dot_half(k, w, x, 1); }

const ckv_quant_arch ckv_quant_arch_generic = {
    .name = "generic",
    .dot = {[CKV_DTYPE_F16] = gen_dot_f16,
            [CKV_DTYPE_BF16] = gen_dot_bf16,
            [CKV_DTYPE_Q8_0] = gen_dot_q8_0,
            [CKV_DTYPE_Q4_0] = gen_dot_q4_0,
            [CKV_DTYPE_Q4_1] = gen_dot_q4_1,
            [CKV_DTYPE_Q5_0] = gen_dot_q5_0,
            [CKV_DTYPE_Q5_1] = gen_dot_q5_1,
            [CKV_DTYPE_Q4_K] = gen_dot_q4_k,
            [CKV_DTYPE_Q5_K] = gen_dot_q5_k,
            [CKV_DTYPE_Q6_K] = gen_dot_q6_k}};

/* ---- kernel choice ----------------------------------------------------------------------------- */

static _Atomic(const ckv_quant_arch *) ckv_quant_chosen;

const ckv_quant_arch *ckv_quant_best_arch(void) {
    const ckv_quant_arch *a = atomic_load_explicit(&ckv_quant_chosen, memory_order_acquire);
    if (a) return a;
    /* racing first calls all compute the same answer */
    if (ckv_quant_avx2_supported())
        a = &ckv_quant_arch_avx2;
    else
        a = &ckv_quant_arch_generic;
    atomic_store_explicit(&ckv_quant_chosen, a, memory_order_release);
    return a;
}

int ckv_quant_dtype_ok(ckv_dtype t) {
    return (t == CKV_DTYPE_F16 || t == CKV_DTYPE_BF16 || ckv_dtype_is_block(t)) && t < CKV_DTYPE_COUNT_ &&
           ckv_quant_arch_generic.dot[t] != NULL;
}

/* ---- driver ------------------------------------------------------------------------------------ */

#ifndef CKV_QUANT_X_BYTES
#define CKV_QUANT_X_BYTES (192u * 1024u) /* rounded activations of one tile of rows (stack) */
#endif
#define CKV_QUANT_ROWS 16 /* weight rows per work item */

typedef struct {
    ckv_qdot_fn dot;
    float *out;             // [rows, m] (row i at out + i * m)
    const uint8_t *w;       // [m, row_bytes], advanced to the k chunk
    const float *bias;      // [m] or NULL
    const uint8_t *xq;      // [rows, xq_stride] rounded activations (or fp32 rows of x)
    size_t row_bytes, xq_stride;
    int rows, nb, m;
    int first;              /* the first k chunk: out = bias + dot, later ones out += dot */
} ckv_quant_job;

static void ckv_quant_worker(void *arg, int begin, int end, int tid) {
    (void)tid;
    const ckv_quant_job *job = arg;
    const int j0 = begin * CKV_QUANT_ROWS, j1 = end * CKV_QUANT_ROWS < job->m ? end * CKV_QUANT_ROWS : job->m;
    for (int j = j0; j < j1; j++) {
        const uint8_t *wr = job->w + (size_t)j * job->row_bytes;
        const float b = job->bias ? job->bias[j] : 0.0f;
        for (int i = 0; i < job->rows; i++) {
            float *o = job->out + (size_t)i * (size_t)job->m + (size_t)j;
            const float d = job->dot(job->nb, wr, job->xq + (size_t)i * job->xq_stride);
            *o = job->first ? d + b : *o + d;
        }
    }
}

/* Several rows: the fp32 GEMM of cpu_gemm.c over panels dequantised on the fly (each weight element
 * is widened once per row part of the GEMM instead of once per row of x). */
typedef struct {
    const uint8_t *w; // [m, row_bytes]
    ckv_dtype t;
    size_t row_bytes, block_bytes;
    int block_elems;
} ckv_quant_panels;

static void ckv_quant_panel_rows(const void *ctx, int j0, int nr, int p0, int kc, float *dst) {
    const ckv_quant_panels *q = ctx;
    const size_t off = (size_t)(p0 / q->block_elems) * q->block_bytes;
    for (int r = 0; r < nr; r++)
        ckv_dequant_row(q->t, q->w + (size_t)(j0 + r) * q->row_bytes + off, dst + (size_t)r * (size_t)kc, (size_t)kc);
}

void ckv_cpu_quant_matmul(ckv_threadpool *pool, const ckv_quant_arch *arch, float *out, const float *x,
                          const void *w, ckv_dtype t, size_t row_bytes, const float *bias, int n, int k, int m) {
    if (n <= 0 || m <= 0) return;
    if (!arch) arch = ckv_quant_best_arch();
    /* the GEMM's k blocks must keep whole weight blocks; it also gives the empty sum of k = 0 */
    if ((n >= CKV_QUANT_GEMM_ROWS && CKV_GEMM_KC % ckv_dtype_block_elems(t) == 0) || k <= 0) {
        const ckv_quant_panels q = {.w = w, .t = t, .row_bytes = row_bytes, .block_bytes = ckv_dtype_block_bytes(t),
                                    .block_elems = ckv_dtype_block_elems(t)};
        const ckv_gemm_wsrc src = {.rows = ckv_quant_panel_rows, .ctx = &q};
        ckv_cpu_gemm_wsrc(pool, NULL, out, x, &src, bias, n, k, m);
        return;
    }
    const int items = (m + CKV_QUANT_ROWS - 1) / CKV_QUANT_ROWS;
    ckv_quant_job job = {.dot = arch->dot[t] ? arch->dot[t] : ckv_quant_arch_generic.dot[t],
                         .bias = bias,
                         .row_bytes = row_bytes,
                         .m = m,
                         .first = 1};
    if (t == CKV_DTYPE_F16 || t == CKV_DTYPE_BF16) { /* fp32 activations as they are */
        job.w = w;
        job.nb = k;
        job.xq = (const uint8_t *)x;
        job.xq_stride = (size_t)k * sizeof(float);
        job.rows = n;
        job.out = out;
        ckv_threadpool_for(pool, items, 1, ckv_quant_worker, &job);
        return;
    }
    _Alignas(64) uint8_t xq[CKV_QUANT_X_BYTES];
    const int be = ckv_dtype_block_elems(t), big = be == 256, nb = k / be;
    const size_t xb = big ? sizeof(ckv_q8x256) : sizeof(ckv_q8x32), wb = ckv_dtype_block_bytes(t);
    /* k chunks of cb blocks (all of k unless one row's activations would overflow the buffer), and
     * tiles of as many rows as the buffer holds */
    const int cb = (size_t)nb * xb <= sizeof xq ? nb : (int)(sizeof xq / xb);
    for (int c0 = 0; c0 < nb; c0 += cb) {
        job.nb = nb - c0 < cb ? nb - c0 : cb;
        job.xq_stride = (size_t)job.nb * xb;
        job.w = (const uint8_t *)w + (size_t)c0 * wb;
        job.xq = xq;
        job.first = c0 == 0;
        const int tile = (int)(sizeof xq / job.xq_stride);
        for (int i0 = 0; i0 < n; i0 += tile) {
            job.rows = n - i0 < tile ? n - i0 : tile;
            for (int i = 0; i < job.rows; i++) {
                const float *xr = x + (size_t)(i0 + i) * (size_t)k + (size_t)c0 * (size_t)be;
                if (big)
                    ckv_quant_x256(xr, job.nb * be, (ckv_q8x256 *)(void *)(xq + (size_t)i * job.xq_stride));
                else
                    ckv_quant_x32(xr, job.nb * be, (ckv_q8x32 *)(void *)(xq + (size_t)i * job.xq_stride));
            }
            job.out = out + (size_t)i0 * (size_t)m;
            ckv_threadpool_for(pool, items, 1, ckv_quant_worker, &job);
        }
    }
}
