/* cpu_evict_keys.c - the attention-free key scorers' ops on the CPU (backend.h): KeyDiff's cosine
 * distance of each key to the head's mean normalised key. Double accumulation, keys converted from
 * the cache dtype row by row through a fixed buffer; no allocation. It scores only; selection is
 * evict_topk's. */
#include <math.h>

#include "cpu_backend.h"

#define KEYS_MAX_DIM 1024

/* Row t of segment g's keys as fp32 (a view of the cache for f32, else converted into buf). */
static const float *key_row(const ckv_kv_batch *kv, int g, int t, float *buf) {
    const size_t rowb = (size_t)kv->head_dim * ckv_dtype_size(kv->dtype);
    const char *row = (const char *)kv->segs[0][g].k + (size_t)t * rowb;
    if (kv->dtype == CKV_DTYPE_F32) return (const float *)(const void *)row;
    ckv_convert_to_f32(buf, row, kv->dtype, (size_t)kv->head_dim);
    return buf;
}

static double row_norm(const float *x, int d) {
    double ss = 0.0;
    for (int a = 0; a < d; a++) ss += (double)x[a] * (double)x[a];
    return sqrt(ss);
}

ckv_status ckv_cpu_evict_keydiff(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows) {
    (void)be;
    const int d = kv->head_dim;
    if (d < 1 || d > KEYS_MAX_DIM)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "evict_keydiff: head_dim %d outside 1..%d", d, KEYS_MAX_DIM);
    float buf[KEYS_MAX_DIM];
    double anchor[KEYS_MAX_DIM];
    for (int g = 0; g < kv->n_kv_heads; g++) {
        for (int a = 0; a < d; a++) anchor[a] = 0.0;
        for (int t = 0; t < n_rows; t++) { /* F.normalize(keys, p=2, dim=-1).mean(tokens) */
            const float *k = key_row(kv, g, t, buf);
            const double n = fmax(row_norm(k, d), 1e-12);
            for (int a = 0; a < d; a++) anchor[a] += (double)k[a] / n;
        }
        double an = 0.0;
        for (int a = 0; a < d; a++) {
            anchor[a] /= (double)n_rows;
            an += anchor[a] * anchor[a];
        }
        an = fmax(sqrt(an), 1e-8);
        float *dst = out + (size_t)g * (size_t)ld;
        for (int t = 0; t < n_rows; t++) { /* -F.cosine_similarity(keys, anchor) */
            const float *k = key_row(kv, g, t, buf);
            double dot = 0.0;
            for (int a = 0; a < d; a++) dot += (double)k[a] * anchor[a];
            dst[t] = (float)(-dot / (fmax(row_norm(k, d), 1e-8) * an));
        }
    }
    return CKV_STATUS_OK;
}
