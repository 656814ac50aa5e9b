/* cpu_evict_attn.c - the CPU backend's eviction ops that multiply: window / observed attention column
 * sums and weights (evict_attn_colsum, evict_attn_probs), chunked non-causal attention column sums
 * (evict_chunk_colsum), one-row softmax (evict_softmax_add) and
 * CriticalKV's value norms ||V W_O^h||_1 (evict_value_norm). Semantics as in backend.h. Logits and
 * projections go through the CPU GEMM (ckv_cpu_matmul_f32) with the same shapes the scorers used
 * before they moved behind the op table, so scores are bit-for-bit what they were; keys and values
 * of F16/BF16 caches and non-F32 o_proj blocks are converted to fp32 scratch first. Loops are
 * sequential in a fixed order (only the GEMM is threaded, and it is bitwise stable across thread
 * counts). Scratch is allocated per call and freed before returning. It selects nothing. */
#include <math.h>

#include "core/alloc.h"
#include "cpu_backend.h"
#include "core/quant.h"

/* x[0..n) <- exp(x - max x) in fp32 (n >= 1); returns (float)(1 / sum), the sum in double. */
static float evict_exp_row(float *x, int n) {
    float ml[16]; /* independent lanes so that the reductions vectorise without reassociation */
    for (int l = 0; l < 16; l++) ml[l] = x[0];
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) ml[l] = x[i + l] > ml[l] ? x[i + l] : ml[l];
    float m = ml[0];
    for (int l = 1; l < 16; l++) m = ml[l] > m ? ml[l] : m;
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    for (i = 0; i < n; i++) x[i] = ckv_cpu_expf(x[i] - m); /* arguments <= 0 */
    double sl[8] = {0};
    for (i = 0; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) sl[l] += x[i + l];
    double sum = ((sl[0] + sl[4]) + (sl[1] + sl[5])) + ((sl[2] + sl[6]) + (sl[3] + sl[7]));
    for (; i < n; i++) sum += x[i];
    return (float)(1.0 / sum);
}

/* sum of |x[i]| over n floats: 16 fp32 lanes, combined in double, then the tail in double. */
static double evict_l1(const float *x, int n) {
    float lane[16] = {0};
    int i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) lane[l] += fabsf(x[i + l]);
    double s = 0.0;
    for (int l = 0; l < 16; l++) s += lane[l];
    for (; i < n; i++) s += fabsf(x[i]);
    return s;
}

/* fp32 view of rows [0, n) of segment g's keys (values): the segment itself for F32 caches, else
 * converted into scratch [n, d]. */
static const float *evict_seg_f32(const ckv_kv_batch *kv, int g, int n, int values, float *scratch) {
    const ckv_kv_seg *sg = &kv->segs[0][g];
    const void *src = values ? sg->v : sg->k;
    if (kv->dtype == CKV_DTYPE_F32) return src;
    ckv_convert_to_f32(scratch, src, kv->dtype, (size_t)n * (size_t)kv->head_dim);
    return scratch;
}

/* Scratch of the attention ops: one head's queries, logits, softmax scales and (non-F32 caches) keys. */
typedef struct {
    float *qh;     // [n_q, d]
    float *logits; // [n_q, n_keys]
    float *inv;    // [n_q] 1 / sum of each row's exponentials
    float *keys;   // [n_keys, d] fp32 keys of one segment (F16/BF16 caches only)
} evict_attn_ws;

static void evict_attn_ws_free(evict_attn_ws *w) {
    ckv_free(w->qh);
    ckv_free(w->logits);
    ckv_free(w->inv);
    ckv_free(w->keys);
}

static ckv_status evict_attn_ws_init(evict_attn_ws *w, const ckv_kv_batch *kv, int n_q, int n_keys) {
    memset(w, 0, sizeof *w);
    const size_t d = (size_t)kv->head_dim;
    ckv_status s = ckv_alloc((void **)&w->qh, (size_t)n_q * d * sizeof(float), "eviction head queries");
    if (s == CKV_STATUS_OK)
        s = ckv_alloc((void **)&w->logits, (size_t)n_q * (size_t)n_keys * sizeof(float), "eviction logits");
    if (s == CKV_STATUS_OK) s = ckv_alloc((void **)&w->inv, (size_t)n_q * sizeof(float), "eviction softmax scales");
    if (s == CKV_STATUS_OK && kv->dtype != CKV_DTYPE_F32)
        s = ckv_alloc((void **)&w->keys, (size_t)n_keys * d * sizeof(float), "eviction fp32 keys");
    if (s != CKV_STATUS_OK) evict_attn_ws_free(w);
    return s;
}

/* Softmax weights of local query head j's n_q queries into w->logits ([n_q, n_keys], row i valid for
 * columns 0 .. q_row0 + i), scaled by w->inv[i] (weight = logits[i, t] * inv[i]). */
static void evict_head_weights(ckv_backend *be, evict_attn_ws *w, const float *q, int n_q, int q_row0,
                               const ckv_kv_batch *kv, int n_heads_local, int j, int g, float scale, int divide) {
    const int d = kv->head_dim, hq = n_heads_local * d, n_keys = q_row0 + n_q;
    const float *K = evict_seg_f32(kv, g, n_keys, 0, w->keys); // [n_keys, d]
    for (int i = 0; i < n_q; i++)
        memcpy(w->qh + (size_t)i * d, q + (size_t)i * hq + (size_t)j * d, (size_t)d * sizeof(float));
    ckv_cpu_matmul_f32(be, w->logits, w->qh, K, NULL, n_q, d, n_keys); /* [n_q, n_keys] */
    for (int i = 0; i < n_q; i++) {
        float *row = w->logits + (size_t)i * (size_t)n_keys;
        const int n_vis = q_row0 + i + 1;
        if (divide)
            for (int t = 0; t < n_vis; t++) row[t] = row[t] / scale;
        else
            for (int t = 0; t < n_vis; t++) row[t] *= scale;
        w->inv[i] = evict_exp_row(row, n_vis);
    }
}

ckv_status ckv_cpu_evict_attn_colsum(ckv_backend *be, double *colsum, int n_cols, const float *q, int n_q, int q_row0,
                                     const ckv_kv_batch *kv, int n_heads_local, int head0, int group, float scale,
                                     int divide, int per_kv, int zero) {
    if (zero) {
        const int n_out = per_kv ? kv->n_kv_heads : n_heads_local;
        memset(colsum, 0, (size_t)n_out * (size_t)n_cols * sizeof(double));
    }
    if (n_q < 1) return CKV_STATUS_OK;
    const int n_keys = q_row0 + n_q;
    evict_attn_ws w;
    CKV_TRY(evict_attn_ws_init(&w, kv, n_q, n_keys));
    for (int j = 0; j < n_heads_local; j++) {
        const int g = (head0 + j) / group;
        evict_head_weights(be, &w, q, n_q, q_row0, kv, n_heads_local, j, g, scale, divide);
        double *restrict cs = colsum + (size_t)(per_kv ? g : j) * (size_t)n_cols;
        for (int i = 0; i < n_q; i++) {
            const float *row = w.logits + (size_t)i * (size_t)n_keys;
            const int n_vis = q_row0 + i + 1, nc = n_vis < n_cols ? n_vis : n_cols;
            const float f = w.inv[i];
            for (int t = 0; t < nc; t++) cs[t] += (double)(row[t] * f);
        }
    }
    evict_attn_ws_free(&w);
    return CKV_STATUS_OK;
}

ckv_status ckv_cpu_evict_attn_probs(ckv_backend *be, float *p, int ld, const float *q, int n_q, int q_row0,
                                    const ckv_kv_batch *kv, int n_heads_local, int head0, int group, float scale,
                                    int divide) {
    if (n_q < 1) return CKV_STATUS_OK;
    const int n_keys = q_row0 + n_q;
    evict_attn_ws w;
    CKV_TRY(evict_attn_ws_init(&w, kv, n_q, n_keys));
    for (int j = 0; j < n_heads_local; j++) {
        evict_head_weights(be, &w, q, n_q, q_row0, kv, n_heads_local, j, (head0 + j) / group, scale, divide);
        for (int i = 0; i < n_q; i++) {
            const float *row = w.logits + (size_t)i * (size_t)n_keys;
            float *dst = p + ((size_t)j * (size_t)n_q + (size_t)i) * (size_t)ld;
            const int n_vis = q_row0 + i + 1;
            const float f = w.inv[i];
            for (int t = 0; t < n_vis; t++) dst[t] = row[t] * f;
            for (int t = n_vis; t < ld; t++) dst[t] = 0.0f;
        }
    }
    evict_attn_ws_free(&w);
    return CKV_STATUS_OK;
}

ckv_status ckv_cpu_evict_chunk_colsum(ckv_backend *be, double *colsum, int n_cols, const float *q, int n_q, int q_row0,
                                      int n_pad, const ckv_kv_batch *kv, int n_heads_local, int head0, int group,
                                      float scale, int zero) {
    if (zero) memset(colsum, 0, (size_t)kv->n_kv_heads * (size_t)n_cols * sizeof(double));
    if (n_q < 1) return CKV_STATUS_OK;
    const int d = kv->head_dim, hq = n_heads_local * d, n_keys = n_q + n_pad;
    const size_t esz = ckv_dtype_size(kv->dtype);
    evict_attn_ws w;
    CKV_TRY(evict_attn_ws_init(&w, kv, n_keys + 1, n_keys)); /* logits: n_q rows of n_q, then one of n_keys */
    for (int j = 0; j < n_heads_local; j++) {
        const int g = (head0 + j) / group;
        const char *src = (const char *)kv->segs[0][g].k + (size_t)q_row0 * (size_t)d * esz;
        const float *K = (const float *)(const void *)src; // [n_q, d]
        if (kv->dtype != CKV_DTYPE_F32) {
            ckv_convert_to_f32(w.keys, src, kv->dtype, (size_t)n_q * (size_t)d);
            K = w.keys;
        }
        for (int i = 0; i < n_q; i++)
            memcpy(w.qh + (size_t)i * d, q + (size_t)i * hq + (size_t)j * d, (size_t)d * sizeof(float));
        ckv_cpu_matmul_f32(be, w.logits, w.qh, K, NULL, n_q, d, n_q); /* [n_q, n_q] */
        double *restrict cs = colsum + (size_t)g * (size_t)n_cols + q_row0;
        float *row = w.logits + (size_t)n_q * (size_t)n_q; /* past the GEMM's rows: one row of n_keys */
        for (int i = 0; i <= n_q; i++) { /* the real queries, then (i = n_q) one padding query */
            if (i == n_q && n_pad == 0) break;
            for (int t = 0; t < n_q; t++) row[t] = i < n_q ? w.logits[(size_t)i * n_q + t] * scale : 0.0f;
            for (int t = n_q; t < n_keys; t++) row[t] = -1e-9f;
            const float f = evict_exp_row(row, n_keys);
            for (int rep = 0; rep < (i < n_q ? 1 : n_pad); rep++) /* every padding query weighs the same */
                for (int t = 0; t < n_q; t++) cs[t] += (double)(row[t] * f);
        }
    }
    evict_attn_ws_free(&w);
    return CKV_STATUS_OK;
}

void ckv_cpu_evict_softmax_add(ckv_backend *be, float *dst, float *x, int n) {
    (void)be;
    const float inv = evict_exp_row(x, n);
    for (int t = 0; t < n; t++) dst[t] += x[t] * inv;
}

#define CKV_CPU_VNORM_BLOCK 256 /* value rows projected per GEMM */

ckv_status ckv_cpu_evict_value_norm(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows,
                                    const ckv_weight *wo, int n_heads_local, int head0, int group) {
    const int d = kv->head_dim, D = (int)wo->rows;
    const int blocks = ckv_dtype_is_block(wo->dtype); /* GGUF blocks: dequantised whole, once per call */
    if (wo->dtype != CKV_DTYPE_F32 && wo->dtype != CKV_DTYPE_F16 && wo->dtype != CKV_DTYPE_BF16 && !blocks)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "cpu evict_value_norm: o_proj stored as %s",
                         ckv_dtype_name(wo->dtype));
    if (wo->cols < (int64_t)n_heads_local * d)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "cpu evict_value_norm: o_proj has %lld columns, %d heads x %d need more",
                         (long long)wo->cols, n_heads_local, d);
    float *wh = NULL, *proj = NULL, *vals = NULL, *wfull = NULL; // [D, d], [B, D], [B, d], [D, cols]
    ckv_status s = ckv_alloc((void **)&wh, (size_t)D * (size_t)d * sizeof(float), "critical o_proj block");
    if (s == CKV_STATUS_OK && blocks)
        s = ckv_alloc((void **)&wfull, (size_t)D * (size_t)wo->cols * sizeof(float), "critical o_proj (dequantised)");
    for (int r = 0; r < D && s == CKV_STATUS_OK && blocks; r++)
        ckv_dequant_row(wo->dtype, (const char *)wo->data + (size_t)r * wo->row_bytes, wfull + (size_t)r * (size_t)wo->cols,
                        (size_t)wo->cols);
    if (s == CKV_STATUS_OK)
        s = ckv_alloc((void **)&proj, (size_t)CKV_CPU_VNORM_BLOCK * (size_t)D * sizeof(float), "critical projected values");
    if (s == CKV_STATUS_OK && kv->dtype != CKV_DTYPE_F32)
        s = ckv_alloc((void **)&vals, (size_t)CKV_CPU_VNORM_BLOCK * (size_t)d * sizeof(float), "critical fp32 values");
    const size_t esz = ckv_dtype_size(wo->dtype), vsz = ckv_dtype_size(kv->dtype);
    for (int j = 0; j < n_heads_local && s == CKV_STATUS_OK; j++) {
        /* wh[r, :] = wo[r, j*d : (j+1)*d]: (W_O^j)^T in the (out, in) layout the GEMM takes */
        for (int r = 0; r < D; r++) {
            const char *src = (const char *)wo->data + (size_t)r * wo->row_bytes + (size_t)j * (size_t)d * esz;
            if (blocks)
                memcpy(wh + (size_t)r * d, wfull + (size_t)r * (size_t)wo->cols + (size_t)j * (size_t)d,
                       (size_t)d * sizeof(float));
            else if (wo->dtype == CKV_DTYPE_F32)
                memcpy(wh + (size_t)r * d, src, (size_t)d * sizeof(float));
            else
                ckv_convert_to_f32(wh + (size_t)r * d, src, wo->dtype, (size_t)d);
        }
        const int g = (head0 + j) / group;
        const char *V = kv->segs[0][g].v; // [n_rows, d] in the batch dtype
        float *dst = out + (size_t)g * (size_t)ld;
        for (int t0 = 0; t0 < n_rows; t0 += CKV_CPU_VNORM_BLOCK) {
            const int nb = n_rows - t0 < CKV_CPU_VNORM_BLOCK ? n_rows - t0 : CKV_CPU_VNORM_BLOCK;
            const float *vb = (const float *)(const void *)(V + (size_t)t0 * (size_t)d * vsz);
            if (kv->dtype != CKV_DTYPE_F32) {
                ckv_convert_to_f32(vals, V + (size_t)t0 * (size_t)d * vsz, kv->dtype, (size_t)nb * (size_t)d);
                vb = vals;
            }
            ckv_cpu_matmul_f32(be, proj, vb, wh, NULL, nb, d, D); /* [nb, D] */
            for (int i = 0; i < nb; i++) dst[t0 + i] += (float)evict_l1(proj + (size_t)i * D, D);
        }
    }
    ckv_free(wh);
    ckv_free(proj);
    ckv_free(vals);
    ckv_free(wfull);
    return s;
}
