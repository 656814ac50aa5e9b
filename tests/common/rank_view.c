/* rank_view.c - the eviction tests' synthetic layer and one rank's view of it (see rank_view.h). */
#include "common/rank_view.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ckv_test.h"

ckv_test_prob ckv_test_prob_make(int L, int D, int d, int H, int Hkv, float rope_scale, double sharp, uint64_t *rng) {
    ckv_test_prob p;
    memset(&p, 0, sizeof p);
    p.L = L, p.D = D, p.d = d, p.H = H, p.Hkv = Hkv, p.rope_scale = rope_scale;
    p.xn = ckv_test_calloc(sizeof(float) * (size_t)L * D);
    p.wq = ckv_test_calloc(sizeof(float) * (size_t)H * d * D);
    p.bq = ckv_test_calloc(sizeof(float) * (size_t)H * d);
    p.wo = ckv_test_calloc(sizeof(float) * (size_t)D * H * d);
    p.k = ckv_test_calloc(sizeof(float) * (size_t)Hkv * L * d);
    p.v = ckv_test_calloc(sizeof(float) * (size_t)Hkv * L * d);
    p.inv_freq = ckv_test_calloc(sizeof(float) * (size_t)(d / 2));
    p.pos = ckv_test_calloc(sizeof(int32_t) * (size_t)L);
    p.ppool = ckv_test_calloc(sizeof(int32_t) * (size_t)Hkv * L);
    ckv_test_fill(rng, p.xn, (size_t)L * D, -1.5, 1.5);
    ckv_test_fill(rng, p.wq, (size_t)H * d * D, -0.6 * sharp, 0.6 * sharp);
    ckv_test_fill(rng, p.bq, (size_t)H * d, -0.5, 0.5);
    ckv_test_fill(rng, p.wo, (size_t)D * H * d, -0.5, 0.5);
    ckv_test_fill(rng, p.k, (size_t)Hkv * L * d, -1.5, 1.5);
    ckv_test_fill(rng, p.v, (size_t)Hkv * L * d, -1.0, 1.0);
    for (int i = 0; i < d / 2; i++) p.inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)d);
    for (int t = 0; t < L; t++) p.pos[t] = t;
    for (int g = 0; g < Hkv; g++)
        for (int t = 0; t < L; t++) p.ppool[g * L + t] = t;
    return p;
}

void ckv_test_prob_free(ckv_test_prob *p) {
    free(p->xn), free(p->wq), free(p->bq), free(p->wo), free(p->k), free(p->v), free(p->inv_freq), free(p->pos),
        free(p->ppool);
    memset(p, 0, sizeof *p);
}

void ckv_test_view_make(ckv_test_rank_view *r, const ckv_test_prob *p, ckv_backend *be, int q0, int nq, int kv0, int nkv,
                        ckv_comm *replica, ckv_comm *tp) {
    memset(r, 0, sizeof *r);
    const int d = p->d, hq = nq * d;
    r->wo = ckv_test_calloc(sizeof(float) * (size_t)p->D * hq);
    for (int c = 0; c < p->D; c++)
        memcpy(r->wo + (size_t)c * hq, p->wo + (size_t)c * p->H * d + (size_t)q0 * d, sizeof(float) * (size_t)hq);
    for (int g = 0; g < nkv && g < 8; g++) {
        const size_t row0 = (size_t)(kv0 + g) * (size_t)p->L;
        r->segs[g] = (ckv_kv_seg){p->k + row0 * d, p->v + row0 * d, p->ppool + row0, p->L, p->L};
    }
    r->seg_list[0] = r->segs;
    ckv_score_inputs *in = &r->in;
    in->layer = 3, in->n_layers = 8, in->L = p->L, in->D = p->D, in->head_dim = d;
    in->n_heads = p->H, in->n_kv_heads = p->Hkv, in->n_q_local = nq, in->n_kv_local = nkv;
    in->q_head0 = q0, in->kv_head0 = kv0;
    in->kv_replicas = tp && tp->size > p->Hkv ? tp->size / p->Hkv : 1; /* the shard layout */
    in->xn = p->xn;
    in->kv = (ckv_kv_batch){.dtype = CKV_DTYPE_F32, .head_dim = d, .n_kv_heads = nkv, .n_seq = 1,
                            .segs = r->seg_list, .max_len = p->L};
    in->pos = p->pos;
    r->wq = (ckv_weight){p->wq + (size_t)q0 * d * p->D, CKV_DTYPE_F32, (int64_t)nq * d, p->D, (size_t)p->D * sizeof(float)};
    r->wo_w = (ckv_weight){r->wo, CKV_DTYPE_F32, p->D, (int64_t)nq * d, (size_t)nq * d * sizeof(float)};
    in->wq = &r->wq;
    in->bq = p->bq + (size_t)q0 * d;
    in->wo = &r->wo_w;
    in->inv_freq = p->inv_freq;
    in->rope_scale = p->rope_scale;
    in->be = be;
    in->replica = replica;
    in->tp = tp;
}

void ckv_test_view_free(ckv_test_rank_view *r) {
    free(r->wo);
    r->wo = NULL;
}
