/* score_leverage.c - the leverage scorer (kvpress LeverageScorePress): approximate statistical
 * leverage of each token's pre-RoPE key under a right Gaussian sketch, z-scored over the whole
 * layer (every KV head of the model). The sketch phi [d, k] of each (layer, global KV head) is drawn
 * here, on the host, from the press's seed by a counter-based generator (so it is the same on every
 * rank count and backend; kvpress draws it from torch's global generator); the leverage is one
 * backend op (evict_leverage), which also returns per-head sums of the scores and their squares;
 * those cross ranks by one all-gather of 2 doubles per head, are added in global head order (each
 * head once, replicas skipped) so the mean and the standard deviation are the same bits on 1 and N
 * ranks, and the affine map is a second op (evict_affine). Protects nothing; selects nothing. */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "evict/scorer.h"

static uint64_t lev_mix(uint64_t x) { /* the splitmix64 finaliser */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void ckv_leverage_sketch(float *phi, int d, int k, uint64_t seed, int layer, int head) {
    const uint64_t kh = lev_mix(lev_mix(lev_mix(seed) ^ (uint64_t)(uint32_t)layer) ^ ((uint64_t)(uint32_t)head << 32));
    const float scale = (float)(1.0 / sqrt((double)k));
    const double two_pi = 6.283185307179586;
    for (int e = 0; e < d * k; e++) {
        const uint64_t a = lev_mix(kh + (2 * (uint64_t)e) * 0xD1B54A32D192ED03ull);
        const uint64_t b = lev_mix(kh + (2 * (uint64_t)e + 1) * 0xD1B54A32D192ED03ull);
        const double u1 = ((double)(a >> 11) + 1.0) * 0x1p-53, u2 = (double)(b >> 11) * 0x1p-53;
        phi[e] = (float)(sqrt(-2.0 * log(u1)) * cos(two_pi * u2)) * scale;
    }
}

ckv_status ckv_score_leverage_rows(const ckv_score_inputs *in, int k, uint64_t seed, int row0, int n, float *out,
                                   int ld) {
    ckv_backend *be = in->be;
    if (!ckv_backend_supports(be, CKV_BACKEND_CAP_LEVERAGE))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "press leverage: the %s backend has no leverage op", be->name);
    const int d = in->head_dim, nkv = in->n_kv_local;
    const size_t phi_n = (size_t)nkv * (size_t)d * (size_t)k, st_bytes = 2 * (size_t)nkv * sizeof(double);
    ckv_score_dev dev = ckv_score_dev_begin(in);
    float *phi = NULL, *phi_d = NULL;
    double *stats_d = NULL;
    ckv_status s = CKV_STATUS_OK;
    CKV_TRY_GOTO(s, ckv_alloc((void **)&phi, phi_n * sizeof(float), "leverage sketch"), done);
    for (int g = 0; g < nkv; g++)
        ckv_leverage_sketch(phi + (size_t)g * (size_t)d * (size_t)k, d, k, seed, in->layer, in->kv_head0 + g);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&phi_d, phi_n * sizeof(float), "leverage sketch"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&stats_d, st_bytes, "leverage statistics"), done);
    CKV_TRY_GOTO(s, be->ops->upload(be, phi_d, phi, phi_n * sizeof(float)), done);
    CKV_TRY_GOTO(s, be->ops->evict_leverage(be, out, ld, stats_d, &in->kv, row0, n, in->inv_freq,
                                            in->rope_scale, phi_d, k), done);
    s = ckv_score_zscore(in, out, ld, n, stats_d);
done:
    ckv_score_dev_free(&dev);
    ckv_free(phi);
    return s;
}

ckv_status ckv_score_leverage(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "leverage"));
    return ckv_score_leverage_rows(in, cfg->sketch_dimension, cfg->seed, 0, in->L, scores, in->L);
}
