/* cpu_evict_kvzip.c - the CPU backend's evict_kvzip: KVzip's attention maxima of one replayed chunk
 * (semantics in backend.h), the reference the device backends are tested against. Logits are fp32
 * dot products in 16 lanes added pairwise, four key rows at a time, in tiles of KVZIP_TILE keys that
 * serve a block of KVZIP_QB queries while they are in cache; each query's softmax is computed whole
 * by one thread (ckv's fast exp, the sum in double over four partial sums), and maxima do not depend
 * on their order, so the result is the same for any thread count. Work items are (local query head,
 * block of queries) over the backend's pool; each worker keeps its own logits and maxima, merged
 * after the loop. Keys of F16/BF16 caches are converted to fp32 scratch first (the rows the chunk
 * reads: the sinks, the chunk, the replay); scratch is allocated per call and freed before it
 * returns. It selects nothing and computes no KVzip+ norms (they arrive as inputs). */
#include <math.h>

#include "core/alloc.h"
#include "core/quant.h"
#include "cpu_backend.h"

enum { KVZIP_QB = 8, KVZIP_TILE = 64 }; /* queries scored together; key rows per tile (16 KiB at d 64: in L1) */
enum { KVZIP_LANES = 16 };

/* One query's softmax over its columns logit[n] in fp32: the max subtracted, ckv's fast exp, the sum
 * in double over 4 partial sums. */
static void kvzip_softmax_row(float *x, int n) {
    float mx = -INFINITY;
    for (int t = 0; t < n; t++) mx = x[t] > mx ? x[t] : mx;
    for (int t = 0; t < n; t++) x[t] = ckv_fast_expf(x[t] - mx);
    double part[4] = {0, 0, 0, 0};
    int t = 0;
    for (; t + 4 <= n; t += 4)
        for (int u = 0; u < 4; u++) part[u] += (double)x[t + u];
    for (; t < n; t++) part[0] += (double)x[t];
    const double inv = 1.0 / ((part[0] + part[1]) + (part[2] + part[3]));
    for (t = 0; t < n; t++) x[t] = (float)((double)x[t] * inv);
}

/* The 16 fp32 lanes of a dot product added pairwise. */
static float kvzip_lanes_sum(const float *a) {
    float h[8];
    for (int u = 0; u < 8; u++) h[u] = a[u] + a[u + 8];
    return ((h[0] + h[4]) + (h[1] + h[5])) + ((h[2] + h[6]) + (h[3] + h[7]));
}

/* out[r] = (q . k_r) / scale for the n rows k [n, d]: lane u of each dot sums the terms j = u mod 16
 * in order, then the lanes pairwise; four rows at a time, so four independent chains (each
 * statement one vector multiply-add). */
static void kvzip_dots(const float *q, const float *k, int n, int d, float scale, float *out) {
    const size_t sd = (size_t)d;
    int r = 0;
    for (; r + 4 <= n; r += 4) {
        float a0[KVZIP_LANES] = {0}, a1[KVZIP_LANES] = {0}, a2[KVZIP_LANES] = {0}, a3[KVZIP_LANES] = {0};
        const float *k0 = k + (size_t)r * sd, *k1 = k0 + sd, *k2 = k1 + sd, *k3 = k2 + sd;
        int j = 0;
        for (; j + KVZIP_LANES <= d; j += KVZIP_LANES)
            for (int u = 0; u < KVZIP_LANES; u++) {
                a0[u] += q[j + u] * k0[j + u];
                a1[u] += q[j + u] * k1[j + u];
                a2[u] += q[j + u] * k2[j + u];
                a3[u] += q[j + u] * k3[j + u];
            }
        for (; j < d; j++) {
            a0[0] += q[j] * k0[j];
            a1[0] += q[j] * k1[j];
            a2[0] += q[j] * k2[j];
            a3[0] += q[j] * k3[j];
        }
        out[r] = kvzip_lanes_sum(a0) / scale;
        out[r + 1] = kvzip_lanes_sum(a1) / scale;
        out[r + 2] = kvzip_lanes_sum(a2) / scale;
        out[r + 3] = kvzip_lanes_sum(a3) / scale;
    }
    for (; r < n; r++) {
        float a0[KVZIP_LANES] = {0};
        const float *k0 = k + (size_t)r * sd;
        int j = 0;
        for (; j + KVZIP_LANES <= d; j += KVZIP_LANES)
            for (int u = 0; u < KVZIP_LANES; u++) a0[u] += q[j + u] * k0[j + u];
        for (; j < d; j++) a0[0] += q[j] * k0[j];
        out[r] = kvzip_lanes_sum(a0) / scale;
    }
}

/* logit[x * ld + c0 + r] for the block's nq queries and key rows k [n, d], tile by tile, so that each
 * tile of keys serves every query of the block while it is in cache. */
static void kvzip_block_dots(const float *const *qs, int nq, const float *k, int n, int d, float scale, float *logit,
                             size_t ld, int c0) {
    for (int t0 = 0; t0 < n; t0 += KVZIP_TILE) {
        const int tn = n - t0 < KVZIP_TILE ? n - t0 : KVZIP_TILE;
        for (int x = 0; x < nq; x++)
            kvzip_dots(qs[x], k + (size_t)t0 * (size_t)d, tn, d, scale, logit + (size_t)x * ld + c0 + t0);
    }
}

/* One call: its parameters, the fp32 rows of every segment and each worker's scratch. */
typedef struct {
    const ckv_evict_kvzip_params *z;
    int C, nb, nkv;
    size_t ld;                  /* columns of one query: sink + C + n_q */
    const float *const *rows;   /* [nkv][3]: fp32 sink rows [sink, d], chunk rows [C, d], replayed rows [n_q, d] */
    float *logit;               /* [workers, KVZIP_QB, ld] */
    float *part;                /* [workers, nkv, C] each worker's maxima over its queries */
} kvzip_job;

/* Items [b, e): blocks of up to KVZIP_QB queries i0 .. of local query head j; query i attends to its
 * columns (the sinks, the chunk, the replay up to itself), the chunk's probabilities raise the
 * worker's maxima of its KV head. */
static void kvzip_items(void *ctx, int b, int e, int tid) {
    const kvzip_job *jb = ctx;
    const ckv_evict_kvzip_params *z = jb->z;
    const int d = z->kv->head_dim, C = jb->C, hq = z->n_heads_local * d;
    float *logit = jb->logit + (size_t)tid * KVZIP_QB * jb->ld;
    for (int it = b; it < e; it++) {
        const int j = it / jb->nb, i0 = it % jb->nb * KVZIP_QB, nq = z->n_q - i0 < KVZIP_QB ? z->n_q - i0 : KVZIP_QB;
        const int h = (z->head0 + j) / z->group;
        const float *qs[KVZIP_QB];
        for (int x = 0; x < nq; x++) qs[x] = z->q + (size_t)(i0 + x) * (size_t)hq + (size_t)j * (size_t)d;
        const float *const *r = jb->rows + (size_t)h * 3;
        kvzip_block_dots(qs, nq, r[0], z->sink, d, z->scale, logit, jb->ld, 0);
        kvzip_block_dots(qs, nq, r[1], C, d, z->scale, logit, jb->ld, z->sink);
        kvzip_block_dots(qs, nq, r[2], i0 + nq, d, z->scale, logit, jb->ld, z->sink + C);
        float *mx = jb->part + ((size_t)tid * (size_t)jb->nkv + (size_t)h) * (size_t)C;
        for (int x = 0; x < nq; x++) {
            float *row = logit + (size_t)x * jb->ld + z->sink;
            kvzip_softmax_row(row - z->sink, z->sink + C + i0 + x + 1); /* causal: the replay up to query i0 + x */
            if (z->vn) { /* KVzip+: / ||h|| by row, x ||v W_O^j|| by column */
                const float hinv = z->hinv[i0 + x], *vn = z->vn + (size_t)j * (size_t)z->ld_vn;
                for (int c = 0; c < C; c++) row[c] = row[c] * hinv * vn[c];
            }
            for (int c = 0; c < C; c++) mx[c] = row[c] > mx[c] ? row[c] : mx[c];
        }
    }
}

/* fp32 view of rows [r0, r0 + n) of segment g's keys: the segment itself for F32 caches, else
 * converted into scratch [n, d]. */
static const float *kvzip_keys_f32(const ckv_kv_batch *kv, int g, int r0, int n, float *scratch) {
    const size_t d = (size_t)kv->head_dim;
    const char *src = (const char *)kv->segs[0][g].k + (size_t)r0 * d * ckv_dtype_size(kv->dtype);
    if (kv->dtype == CKV_DTYPE_F32) return (const float *)(const void *)src;
    ckv_convert_to_f32(scratch, src, kv->dtype, (size_t)n * d);
    return scratch;
}

ckv_status ckv_cpu_evict_kvzip(ckv_backend *be, float *out, int ld, const ckv_evict_kvzip_params *z) {
    if (!z || !z->kv || z->n_q < 1 || z->sink < 0 || z->sink > z->start || z->start >= z->end || z->end > z->ctx ||
        z->end > ld || z->group < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "evict_kvzip: rows out of order (sink %d, chunk %d..%d, context %d, %d "
                         "replayed, ld %d)", z ? z->sink : 0, z ? z->start : 0, z ? z->end : 0, z ? z->ctx : 0,
                         z ? z->n_q : 0, ld);
    if ((z->hinv == NULL) != (z->vn == NULL))
        return ckv_error(CKV_STATUS_ERR_ARG, "evict_kvzip: KVzip+ needs both the row norms and the value norms");
    const ckv_kv_batch *kv = z->kv;
    const int nkv = kv->n_kv_heads, d = kv->head_dim, C = z->end - z->start;
    for (int g = 0; g < nkv; g++)
        if (kv->segs[0][g].len < z->ctx + z->n_q)
            return ckv_error(CKV_STATUS_ERR_ARG, "evict_kvzip: segment %d holds %d rows, the replay reads %d", g,
                             kv->segs[0][g].len, z->ctx + z->n_q);
    ckv_threadpool *pool = ckv_cpu_pool(be);
    const int workers = pool ? ckv_threadpool_size(pool) : 1;
    const size_t cols = (size_t)z->sink + (size_t)C + (size_t)z->n_q, sd = (size_t)d;
    float *logit = NULL, *part = NULL, *keys = NULL; // [workers, QB, cols], [workers, nkv, C], [nkv, cols, d]
    const float **rows = NULL;                        // [nkv, 3]
    ckv_status s = ckv_alloc((void **)&logit, (size_t)workers * KVZIP_QB * cols * sizeof(float), "kvzip logits");
    if (s == CKV_STATUS_OK)
        s = ckv_alloc((void **)&part, (size_t)workers * (size_t)nkv * (size_t)C * sizeof(float), "kvzip maxima");
    if (s == CKV_STATUS_OK) s = ckv_alloc((void **)&rows, (size_t)nkv * 3 * sizeof(float *), "kvzip key rows");
    if (s == CKV_STATUS_OK && kv->dtype != CKV_DTYPE_F32)
        s = ckv_alloc((void **)&keys, (size_t)nkv * cols * sd * sizeof(float), "kvzip fp32 keys");
    if (s == CKV_STATUS_OK) {
        for (int g = 0; g < nkv; g++) {
            float *kg = keys ? keys + (size_t)g * cols * sd : NULL;
            rows[g * 3] = kvzip_keys_f32(kv, g, 0, z->sink, kg);
            rows[g * 3 + 1] = kvzip_keys_f32(kv, g, z->start, C, kg ? kg + (size_t)z->sink * sd : NULL);
            rows[g * 3 + 2] = kvzip_keys_f32(kv, g, z->ctx, z->n_q, kg ? kg + (size_t)(z->sink + C) * sd : NULL);
        }
        for (size_t e = 0; e < (size_t)workers * (size_t)nkv * (size_t)C; e++) part[e] = 0.0f;
        kvzip_job jb = {z, C, (z->n_q + KVZIP_QB - 1) / KVZIP_QB, nkv, cols, (const float *const *)rows, logit, part};
        const int items = z->n_heads_local * jb.nb;
        if (pool)
            ckv_threadpool_for(pool, items, 1, kvzip_items, &jb);
        else
            kvzip_items(&jb, 0, items, 0);
        for (int th = 0; th < workers; th++)
            for (int g = 0; g < nkv; g++) {
                const float *mx = part + ((size_t)th * (size_t)nkv + (size_t)g) * (size_t)C;
                float *row = out + (size_t)g * (size_t)ld + (size_t)z->start;
                for (int c = 0; c < C; c++) row[c] = mx[c] > row[c] ? mx[c] : row[c];
            }
    }
    ckv_free(logit);
    ckv_free(part);
    ckv_free(rows);
    ckv_free(keys);
    return s;
}
