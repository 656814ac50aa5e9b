/* score_compactor.c - the compactor scorer (kvpress CompactorPress, Chari & Van Durme 2025): between
 * sink_size_start tokens at the start and sink_size_end at the end, the z-scored leverage of the
 * pre-RoPE keys (score_leverage.c) times `blending` (the compression ratio when negative, kvpress's
 * None) plus NonCausalAttnPress's score: the context cut into chunks of chunk_size tokens (the last
 * one padded as kvpress pads it), each chunk's queries attending to its own keys without a causal
 * mask and without the 1/sqrt(d) scale, summed over the queries, averaged over the group's query
 * heads, times the value norm, pooled over 3 tokens (avg, zero padding counted) and z-scored over
 * every KV head of the layer. The sinks get the layer's largest score (kvpress pads with the max,
 * not max + 1), so the registry protects nothing for it. Queries are recomputed chunk by chunk from
 * the attention input (matmul, rope); every per-element step is a backend op. Selects nothing. */
#include "core/status.h"
#include "evict/scorer.h"

ckv_status ckv_score_compactor(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "compactor"));
    ckv_backend *be = in->be;
    if (!ckv_backend_supports(be, CKV_BACKEND_CAP_CHUNK_COLSUM) || !ckv_backend_supports(be, CKV_BACKEND_CAP_LEVERAGE))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "press compactor: the %s backend has no chunked non-causal "
                         "attention op", be->name);
    if (!in->xn || !in->wq || !in->pos || !in->inv_freq)
        return ckv_error(CKV_STATUS_ERR_ARG, "scorer compactor: layer %d needs the attention input, q_proj, positions "
                         "and rope tables", in->layer);
    const int L = in->L, d = in->head_dim, D = in->D, hq = in->n_q_local * d, nkv = in->n_kv_local;
    const int head = cfg->sink_size_start < L ? cfg->sink_size_start : L;
    const int rest = L - head, tail = cfg->sink_size_end < rest ? cfg->sink_size_end : rest, S = L - head - tail;
    if (S < 2)
        return ckv_error(CKV_STATUS_ERR_ARG, "press compactor: a context of %d tokens leaves %d between its %d + %d sink "
                         "tokens (at least 2 are needed)", L, S, head, tail);
    const int pad_to = cfg->chunk_size;
    /* queries of several chunks per matmul: about 1,024 rows, never more than the S rows scored */
    const int per = pad_to >= 1024 ? 1 : 1024 / pad_to;
    const int C = (long)per * pad_to < S ? per * pad_to : S;
    ckv_score_dev dev = ckv_score_dev_begin(in);
    float *q = NULL, *attn = NULL, *norm = NULL, *mx = NULL; // [C, hq], [nkv, L] x 2, [1]
    double *colsum = NULL, *stats = NULL;                    // [nkv, L], [nkv, 2]
    ckv_status s = CKV_STATUS_OK;
    const size_t nl = (size_t)nkv * (size_t)L;
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&q, (size_t)C * (size_t)hq * sizeof(float), "compactor queries"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&attn, nl * sizeof(float), "compactor attention"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&norm, nl * sizeof(float), "compactor value norms"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&mx, sizeof(float), "compactor max"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&colsum, nl * sizeof(double), "compactor column sums"), done);
    CKV_TRY_GOTO(s, ckv_score_dev_alloc(&dev, (void **)&stats, 2 * (size_t)nkv * sizeof(double), "compactor statistics"),
                 done);
    /* NonCausalAttnPress on rows head .. head + S - 1: chunks of chunk_size, the last padded to it */
    for (int q0 = 0; q0 < S; q0 += C) { /* the queries of rows head + q0 .. + nq, then their chunks */
        const int nq = S - q0 < C ? S - q0 : C;
        be->ops->matmul(be, q, in->xn + (size_t)(head + q0) * (size_t)D, in->wq, in->bq, nq);
        be->ops->rope(be, q, in->pos + head + q0, nq, in->n_q_local, d, in->inv_freq, in->rope_scale);
        for (int c0 = q0; c0 < q0 + nq; c0 += pad_to) {
            const int nb = S - c0 < pad_to ? S - c0 : pad_to, n_pad = pad_to - nb, row = head + c0;
            const ckv_evict_attn_params a = ckv_score_attn_params(in, q + (size_t)(c0 - q0) * (size_t)hq, nb, row, 1.0f,
                                                                  CKV_EVICT_LOGITS_MUL);
            CKV_TRY_GOTO(s, be->ops->evict_chunk_colsum(be, colsum, L, &a, n_pad,
                                                        c0 == 0 ? CKV_EVICT_ZERO_FIRST : CKV_EVICT_ADD), done);
        }
    }
    be->ops->evict_colsum_finish(be, attn, L, colsum, L, nkv, L, 1.0, CKV_EVICT_DENOM_FIXED);
    CKV_TRY_GOTO(s, ckv_score_group_mean(in, attn), done);
    be->ops->evict_row_norm(be, norm, L, &in->kv, L, CKV_EVICT_VALUES, 1.0f);
    be->ops->evict_add_mul(be, attn, attn, norm, nkv, L, L, 0.0f);
    be->ops->evict_pool(be, norm + head, attn + head, nkv, S, L, 3, CKV_EVICT_POOL_AVG); /* into norm's rows */
    be->ops->evict_row_stats(be, stats, norm + head, nkv, S, L);
    CKV_TRY_GOTO(s, ckv_score_zscore(in, norm + head, L, S, stats), done);
    /* blending * leverage + attention */
    const double b = cfg->blending < 0 ? cfg->compression_ratio : cfg->blending;
    CKV_TRY_GOTO(s, ckv_score_leverage_rows(in, cfg->sketch_dimension, cfg->seed, head, S, scores + head, L), done);
    if (b != 0.0)
        be->ops->evict_affine(be, scores + head, nkv, S, L, 0.0f, 1.0f / (float)b);
    else
        be->ops->evict_fill(be, scores, nkv, L, head, head + S, CKV_EVICT_FILL_VALUE, 0.0f);
    for (int r = 0; r < nkv; r++)
        be->ops->add(be, scores + (size_t)r * L + head, norm + (size_t)r * L + head, (size_t)S);
    /* the sinks: the layer's largest score, over every head and rank */
    be->ops->evict_max(be, mx, scores, nkv, L, head, head + S);
    CKV_TRY_GOTO(s, ckv_evict_allreduce(be, in->tp, mx, 1, CKV_COMM_OP_MAX, 1), done);
    float top = 0.0f;
    CKV_TRY_GOTO(s, be->ops->sync(be), done);
    CKV_TRY_GOTO(s, be->ops->download(be, &top, mx, sizeof top), done);
    be->ops->evict_fill(be, scores, nkv, L, 0, head, CKV_EVICT_FILL_VALUE, top);
    be->ops->evict_fill(be, scores, nkv, L, head + S, L, CKV_EVICT_FILL_VALUE, top);
done:
    ckv_score_dev_free(&dev);
    return s;
}
