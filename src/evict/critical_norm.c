/* critical_norm.c - CriticalKV's value norm N[g, t] = mean over the query heads h of KV head g of
 * || V[g, t] W_O^h ||_1, W_O^h the d x D block of o_proj that head h's output passes through
 * (kvpress CriticalKVPress.vwl1norm). Per local query head, the head's o_proj columns are copied
 * into a contiguous [D, d] block once, then the values are projected 256 tokens at a time
 * ([B, d] x [D, d]^T -> [B, D] through the backend's matmul) and reduced to L1 norms, so the
 * [L, D] product never exists. Sums over a rank's query heads are all-reduced over the replica group
 * when tp > Hkv, then divided by the full group size. It selects nothing. Host buffers only. */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/status.h"
#include "evict/scorer.h"

#define CKV_CRIT_BLOCK 256

ckv_status ckv_critical_value_norm(const ckv_score_inputs *in, float *out) {
    CKV_TRY(ckv_score_check_inputs(in, "critical value norm"));
    if (!in->wo || !out)
        return ckv_error(CKV_STATUS_ERR_ARG, "critical value norm: layer %d needs o_proj and an output buffer",
                         in->layer);
    if (in->wo->dtype != CKV_DTYPE_F32)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "critical value norm: o_proj stored as %s (needs F32 weights)",
                         ckv_dtype_name(in->wo->dtype));
    const float *wo = in->wo->data; // [D, n_q_local * d]
    const int L = in->L, d = in->head_dim, D = in->D, hq = in->n_q_local * d;
    ckv_backend *be = in->be;
    float *wh = NULL, *proj = NULL; // [D, d], [B, D]
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_alloc((void **)&wh, (size_t)D * (size_t)d * sizeof(float), "critical o_proj block"), done);
    CKV_TRY_GOTO(s, ckv_alloc((void **)&proj, (size_t)CKV_CRIT_BLOCK * (size_t)D * sizeof(float),
                              "critical projected values"), done);
    memset(out, 0, (size_t)in->n_kv_local * (size_t)L * sizeof(float));
    for (int j = 0; j < in->n_q_local; j++) {
        /* wh[n, :] = wo[n, j*d : (j+1)*d]: (W_O^h)^T in the (out, in) layout the matmul takes */
        for (int r = 0; r < D; r++)
            memcpy(wh + (size_t)r * d, wo + (size_t)r * hq + (size_t)j * d, (size_t)d * sizeof(float));
        const int g = ckv_score_local_kv(in, j);
        const float *V = in->cache.v + (size_t)in->cache.off[g] * (size_t)d; // [L, d]
        float *dst = out + (size_t)g * (size_t)L;                             // [L]
        for (int t0 = 0; t0 < L; t0 += CKV_CRIT_BLOCK) {
            const int nb = L - t0 < CKV_CRIT_BLOCK ? L - t0 : CKV_CRIT_BLOCK;
            ckv_backend_matmul_f32(be, proj, V + (size_t)t0 * d, wh, NULL, nb, d, D); /* [nb, D] */
            for (int i = 0; i < nb; i++) dst[t0 + i] += (float)ckv_score_l1(proj + (size_t)i * D, D);
        }
    }
    s = ckv_score_group_mean(in, out);
done:
    ckv_free(wh);
    ckv_free(proj);
    return s;
}
