/* cpu_evict_kvzip_norms.c - the CPU backend's evict_kvzip_norms: KVzip+'s row norms 1 / ||x|| of the
 * replay's attention inputs and, per local query head j, ||W_O^j v|| of the chunk's value rows as
 * sqrt(v^T G_j v) with G_j = W_O^j^T W_O^j (semantics in backend.h), every sum in double in the
 * order backend.h gives, so it is the reference the device backends are tested against. The query
 * heads are split over the backend's pool (each head's sums by one thread: the same bits for any
 * thread count); each worker's scratch (a Gram block, fp32 values of F16/BF16 caches) comes from the
 * backend's eviction scratch (ckv_cpu_evict_scratch). It scores nothing (evict_kvzip takes these norms as inputs). */
#include <math.h>

#include "core/quant.h"
#include "cpu_backend.h"

/* g [d, d] = W W^T of the rows w [d, D], in double over the D columns ascending. */
static void kvzip_gram(const float *w, int d, size_t D, double *g) {
    for (int a = 0; a < d; a++)
        for (int b = 0; b <= a; b++) {
            const float *ra = w + (size_t)a * D, *rb = w + (size_t)b * D;
            double acc = 0.0;
            for (size_t c = 0; c < D; c++) acc += (double)ra[c] * (double)rb[c];
            g[a * d + b] = g[b * d + a] = acc;
        }
}

/* sqrt(v^T g v) of one row v [d], in double (0 for a rounding below 0). */
static float kvzip_quad_norm(const double *g, const float *v, int d) {
    double acc = 0.0;
    for (int a = 0; a < d; a++) {
        double ga = 0.0;
        for (int b = 0; b < d; b++) ga += g[a * d + b] * (double)v[b];
        acc += (double)v[a] * ga;
    }
    return (float)sqrt(acc > 0.0 ? acc : 0.0);
}

/* One call: its parameters and each worker's scratch. */
typedef struct {
    const ckv_evict_kvzip_norms_params *n;
    double *gram; /* [workers, d, d] */
    float *vals;  /* [workers, C, d] fp32 values of F16/BF16 caches, or NULL */
} kvzip_norms_job;

/* Query heads [b, e): each head's Gram block, then its norms over the chunk's value rows. */
static void kvzip_norms_heads(void *ctx, int b, int e, int tid) {
    const kvzip_norms_job *jb = ctx;
    const ckv_evict_kvzip_norms_params *n = jb->n;
    const ckv_kv_batch *kv = n->kv;
    const int d = kv->head_dim, C = n->end - n->start;
    const size_t D = (size_t)n->hidden, sd = (size_t)d;
    double *gram = jb->gram + (size_t)tid * sd * sd;
    float *vals = jb->vals ? jb->vals + (size_t)tid * (size_t)C * sd : NULL;
    int converted = -1; /* the segment whose values vals holds */
    for (int j = b; j < e; j++) {
        const int o = (n->head0 + j) / n->group;
        const char *src = (const char *)kv->segs[0][o].v + (size_t)n->start * sd * ckv_dtype_size(kv->dtype);
        const float *v = (const float *)(const void *)src;
        if (vals) {
            if (converted != o) ckv_convert_to_f32(vals, src, kv->dtype, (size_t)C * sd);
            converted = o;
            v = vals;
        }
        kvzip_gram(n->wot + (size_t)j * sd * D, d, D, gram);
        float *out = n->vn + (size_t)j * (size_t)n->ld_vn;
        for (int c = 0; c < C; c++) out[c] = kvzip_quad_norm(gram, v + (size_t)c * sd, d);
    }
}

ckv_status ckv_cpu_evict_kvzip_norms(ckv_backend *be, const ckv_evict_kvzip_norms_params *n) {
    if (!n || !n->kv || !n->wot || !n->x || !n->hinv || !n->vn || n->n_q < 1 || n->hidden < 1 || n->start < 0 ||
        n->start >= n->end || n->end - n->start > n->ld_vn || n->group < 1 || n->n_heads_local < 1 || n->head0 < 0 ||
        (n->head0 + n->n_heads_local - 1) / n->group >= n->kv->n_kv_heads)
        return ckv_error(CKV_STATUS_ERR_ARG, "evict_kvzip_norms: rows or heads out of range (chunk %d..%d, ld_vn %d, "
                         "%d replayed, heads %d+%d of group %d)", n ? n->start : 0, n ? n->end : 0, n ? n->ld_vn : 0,
                         n ? n->n_q : 0, n ? n->head0 : 0, n ? n->n_heads_local : 0, n ? n->group : 0);
    const ckv_kv_batch *kv = n->kv;
    const int d = kv->head_dim, C = n->end - n->start;
    const size_t D = (size_t)n->hidden, sd = (size_t)d;
    for (int g = 0; g < kv->n_kv_heads; g++)
        if (kv->segs[0][g].len < n->end)
            return ckv_error(CKV_STATUS_ERR_ARG, "evict_kvzip_norms: segment %d holds %d rows, the chunk reads %d", g,
                             kv->segs[0][g].len, n->end);
    for (int i = 0; i < n->n_q; i++) {
        const float *xi = n->x + (size_t)i * D;
        double ss = 0.0;
        for (size_t c = 0; c < D; c++) ss += (double)xi[c] * (double)xi[c];
        n->hinv[i] = 1.0f / (float)sqrt(ss);
    }
    ckv_threadpool *pool = ckv_cpu_pool(be);
    const size_t workers = pool ? (size_t)ckv_threadpool_size(pool) : 1;
    kvzip_norms_job jb = {n, NULL, NULL};
    const size_t n_gram = workers * sd * sd, n_vals = kv->dtype != CKV_DTYPE_F32 ? workers * (size_t)C * sd : 0;
    CKV_TRY(ckv_cpu_evict_scratch(be, n_gram * sizeof(double) + n_vals * sizeof(float), (void **)&jb.gram));
    jb.vals = n_vals ? (float *)(void *)(jb.gram + n_gram) : NULL;
    if (pool)
        ckv_threadpool_for(pool, n->n_heads_local, 1, kvzip_norms_heads, &jb);
    else
        kvzip_norms_heads(&jb, 0, n->n_heads_local, 0);
    return CKV_STATUS_OK;
}
