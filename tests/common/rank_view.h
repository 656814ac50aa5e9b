/* rank_view.h - the eviction tests' synthetic layer: one layer's random problem for the whole model
 * (attention input, q_proj and o_proj, a KV pool per head, rope tables) and one rank's view of it as
 * scorer inputs (query heads q0 .. q0+nq-1, KV heads kv0 .. kv0+nkv-1, its o_proj columns), on a
 * backend whose device memory is the host's. It asserts nothing. Tests only. */
#ifndef CKV_TEST_RANK_VIEW_H
#define CKV_TEST_RANK_VIEW_H

#include <stdint.h>

#include "evict/scorer.h"

typedef struct {
    int L, D, d, H, Hkv;
    float rope_scale;
    float *xn;       // [L, D]
    float *wq, *bq;  // [H * d, D], [H * d]
    float *wo;       // [D, H * d]
    float *k, *v;    // [Hkv * L, d] pools, head g at rows g * L
    float *inv_freq; // [d / 2]
    int32_t *pos;    // [L]
    int32_t *ppool;  // [Hkv * L]
} ckv_test_prob;

/* Draws a problem from *rng (ckv_test_fill); `sharp` scales q_proj (larger logits: attention
 * concentrated on few tokens; 1: none). Positions are 0 .. L-1 in every pool. */
ckv_test_prob ckv_test_prob_make(int L, int D, int d, int H, int Hkv, float rope_scale, double sharp, uint64_t *rng);
void ckv_test_prob_free(ckv_test_prob *p);

typedef struct {
    ckv_score_inputs in;
    float *wo;               // [D, nq * d] this rank's o_proj columns
    ckv_weight wq, wo_w;     // typed views of the q_proj rows and o_proj columns
    ckv_kv_seg segs[8];      // [nkv] the local KV heads' segments (host memory is the cpu backend's device)
    ckv_kv_seg *seg_list[1]; // the one sequence
} ckv_test_rank_view;

/* The view of query heads q0 .. q0+nq-1 and KV heads kv0 .. kv0+nkv-1 (nkv <= 8) of layer 3 of 8,
 * with the replica and tensor-parallel communicators given (NULL: one rank). */
void ckv_test_view_make(ckv_test_rank_view *r, const ckv_test_prob *p, ckv_backend *be, int q0, int nq, int kv0, int nkv,
                        ckv_comm *replica, ckv_comm *tp);
void ckv_test_view_free(ckv_test_rank_view *r);

#endif
