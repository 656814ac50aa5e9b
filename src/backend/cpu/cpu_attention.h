/* cpu_attention.h - what the CPU attention kernels share (internal to src/backend/cpu): the work
 * item of one tile (query rows that read one KV head's keys) and the online-softmax block length.
 * The driver and the portable/AVX-512 kernels are cpu_attention.c; the AVX2 GQA decode kernel is
 * cpu_attention_avx2.c. */
#ifndef CKV_CPU_ATTENTION_H
#define CKV_CPU_ATTENTION_H

#include "core/tensor.h"

#define CKV_ATTN_BLOCK 32        /* keys per online-softmax step */
#define CKV_ATTN_TILE_ROWS 16    /* most query rows of a tile */
#define CKV_ATTN_GQA_ROWS 4      /* most rows of a tile the AVX2 GQA kernel takes (decode) */
#define CKV_ATTN_GQA_HD 256      /* largest head_dim it takes */

/* One work item: up to CKV_ATTN_TILE_ROWS query rows over the keys of one KV head. */
typedef struct {
    const void *k, *v;                      // [len, hd] the head's keys and values (dtype)
    ckv_dtype dtype;
    const float *q[CKV_ATTN_TILE_ROWS];     // each [hd]
    float *out[CKV_ATTN_TILE_ROWS];         // each [hd]
    int cnt[CKV_ATTN_TILE_ROWS];            /* visible keys of each row (0 for unused lanes) */
    float *ms[CKV_ATTN_TILE_ROWS];          /* split-K: each [2] receives (max, sum) and out[r] the unnormalised
                                               accumulator; NULL: out[r] gets the normalised row */
    int nr;                                 /* rows in use */
    int maxcnt;                             /* keys to visit: the largest cnt */
    int hd;
    float scale;
} ckv_attn_tile;

/* The tile through the AVX2 + FMA (+ F16C) kernel for a few rows that share each key (one decode
 * token's GQA group): keys and values are read once for all rows, F16/BF16 widened in registers,
 * scores and weights vectorised over head_dim. Returns 0 (and does nothing) where it does not apply:
 * no AVX2/FMA/F16C, an AVX-512 CPU (its lane kernel is used), nr > CKV_ATTN_GQA_ROWS, head_dim not a
 * multiple of 8 or above CKV_ATTN_GQA_HD. Each row's arithmetic depends on its own keys only. */
int ckv_attn_tile_gqa_avx2(const ckv_attn_tile *tl);

#endif
