/* cpu_evict_keys.c - the attention-free key scorers' ops on the CPU (backend.h): KeyDiff's cosine
 * distance of each key to the head's mean normalised key, LagKV's lag-relative spread of keys and
 * values ranked per partition, and CUR's (deterministic) leverage of keys and values normalised per
 * local window; and the per-unit loop LagKV and the leverage op run on (ckv_cpu_evict_heads: the
 * backend's pool takes units, KV heads or LagKV's KV heads x partitions, each unit computed by one
 * thread in the order one thread computes it, so scores do not depend on the thread count). KeyDiff
 * and CUR run over (KV head, row block) units in two passes, their whole-segment sums added from
 * per-block partial sums in block order. Sums over channels are lane sums (backend.h, cpu_lanes.h)
 * in double, over rows in double in row order; rows converted from the cache
 * dtype through fixed buffers; scratch from the backend's eviction scratch. It scores only; selection is
 * evict_topk's. */
#include <math.h>

#include "cpu_backend.h"
#include "cpu_lanes.h"

#define KEYS_MAX_DIM 1024

/* Rows t .. t + n - 1 of segment g's keys (values when values != 0) as fp32, row
 * stride head_dim (a view of the cache for f32, else converted into buf [n, head_dim]). */
static const float *seg_rows(const ckv_kv_batch *kv, int g, int t, int n, int values, float *buf) {
    const size_t rowb = (size_t)kv->head_dim * ckv_dtype_size(kv->dtype);
    const char *row = (const char *)(values ? kv->segs[0][g].v : kv->segs[0][g].k) + (size_t)t * rowb;
    if (kv->dtype == CKV_DTYPE_F32) return (const float *)(const void *)row;
    ckv_convert_to_f32(buf, row, kv->dtype, (size_t)n * (size_t)kv->head_dim);
    return buf;
}

typedef struct {
    ckv_cpu_head_fn fn;
    void *ctx;
    char *scratch; // [workers, bytes]
    size_t bytes;
    int n, workers;
    ckv_status *status; // [workers]
} heads_job;

static void heads_worker(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const heads_job *jb = ctx;
    for (int w = begin; w < end; w++) {
        int g0, g1;
        ckv_cpu_part(jb->n, jb->workers, w, &g0, &g1);
        for (int g = g0; g < g1 && jb->status[w] == CKV_STATUS_OK; g++)
            jb->status[w] = jb->fn(jb->ctx, g, jb->scratch ? jb->scratch + (size_t)w * jb->bytes : NULL);
    }
}

ckv_status ckv_cpu_evict_heads(ckv_backend *be, int n, size_t scratch_bytes, ckv_cpu_head_fn fn, void *ctx) {
    if (n < 1) return CKV_STATUS_OK;
    ckv_threadpool *pool = ckv_cpu_pool(be);
    int workers = pool ? ckv_threadpool_size(pool) : 1;
    if (workers > n) workers = n;
    if (workers > CKV_CPU_MAX_TASK_WORKERS) workers = CKV_CPU_MAX_TASK_WORKERS;
    ckv_status status[CKV_CPU_MAX_TASK_WORKERS];
    for (int w = 0; w < workers; w++) status[w] = CKV_STATUS_OK;
    heads_job jb = {fn, ctx, NULL, scratch_bytes, n, workers, status};
    if (scratch_bytes) CKV_TRY(ckv_cpu_evict_scratch(be, (size_t)workers * scratch_bytes, (void **)&jb.scratch));
    if (workers > 1)
        ckv_threadpool_for(pool, workers, 1, heads_worker, &jb);
    else
        heads_worker(&jb, 0, 1, 0);
    for (int w = 0; w < workers; w++)
        if (status[w] != CKV_STATUS_OK) return status[w];
    return CKV_STATUS_OK;
}

/* keydiff and cur run over (segment, block of BLOCK_ROWS rows) units in two passes: the first reads
 * each block's rows once and leaves one partial sum per block, the second adds a segment's partials
 * in block order (the same for any thread count) and writes the block's scores. */
enum { BLOCK_ROWS = 256, CONV_ROWS = 4 };

typedef struct {
    float *out;
    int ld, n_rows, blocks, pass;
    const ckv_kv_batch *kv;
    double *norm;   // [n_kv, n_rows] ||k_t||
    double *part;   // [n_kv, blocks, d] sum over the block's rows of k_t / max(||k_t||, 1e-12)
} keydiff_job;

static void keydiff_units(void *ctx, int u0, int u1, int tid) {
    (void)tid;
    const keydiff_job *jb = ctx;
    const ckv_kv_batch *kv = jb->kv;
    const int d = kv->head_dim;
    float buf[CONV_ROWS * KEYS_MAX_DIM];
    double anchor[KEYS_MAX_DIM];
    for (int u = u0; u < u1; u++) {
        int g, b, t0, t1;
        ckv_cpu_unit_rows(u, jb->blocks, BLOCK_ROWS, jb->n_rows, &g, &b, &t0, &t1);
        double *norm = jb->norm + (size_t)g * (size_t)jb->n_rows;
        if (jb->pass == 0) { /* F.normalize(keys, p=2, dim=-1), summed over the block */
            double *part = jb->part + ((size_t)g * (size_t)jb->blocks + (size_t)b) * (size_t)d;
            for (int a = 0; a < d; a++) part[a] = 0.0;
            for (int t = t0; t < t1; t += CONV_ROWS) {
                const int nr = t1 - t < CONV_ROWS ? t1 - t : CONV_ROWS;
                const float *k = seg_rows(kv, g, t, nr, 0, buf);
                ckv_cpu_sumsq_rows(norm + t, k, nr, d);
                for (int i = 0; i < nr; i++) {
                    norm[t + i] = sqrt(norm[t + i]);
                    const double inv = 1.0 / fmax(norm[t + i], 1e-12);
                    for (int a = 0; a < d; a++) part[a] += (double)k[(size_t)i * d + a] * inv;
                }
            }
            continue;
        }
        const double *part = jb->part + (size_t)g * (size_t)jb->blocks * (size_t)d;
        for (int a = 0; a < d; a++) anchor[a] = part[a];
        for (int c = 1; c < jb->blocks; c++)
            for (int a = 0; a < d; a++) anchor[a] += part[(size_t)c * d + a];
        double an = 0.0; /* .mean(tokens) */
        for (int a = 0; a < d; a++) {
            anchor[a] /= (double)jb->n_rows;
            an += anchor[a] * anchor[a];
        }
        an = fmax(sqrt(an), 1e-8);
        float *dst = jb->out + (size_t)g * (size_t)jb->ld;
        for (int t = t0; t < t1; t += CONV_ROWS) { /* -F.cosine_similarity(keys, anchor) */
            const int nr = t1 - t < CONV_ROWS ? t1 - t : CONV_ROWS;
            const float *k = seg_rows(kv, g, t, nr, 0, buf);
            const float *rows[CKV_CPU_LANE_ROWS];
            double dot[CKV_CPU_LANE_ROWS];
            ckv_cpu_lane_rows_of(rows, k, (size_t)d, nr);
            ckv_cpu_lanes_dot(dot, rows, anchor, d);
            for (int i = 0; i < nr; i++) dst[t + i] = (float)(-dot[i] / (fmax(norm[t + i], 1e-8) * an));
        }
    }
}

ckv_status ckv_cpu_evict_keydiff(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows) {
    const int d = kv->head_dim;
    if (d < 1 || d > KEYS_MAX_DIM)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "evict_keydiff: head_dim %d outside 1..%d", d, KEYS_MAX_DIM);
    if (n_rows < 1) return CKV_STATUS_OK;
    keydiff_job jb = {out, ld, n_rows, ckv_cpu_blocks((size_t)n_rows, BLOCK_ROWS), 0, kv, NULL, NULL};
    const size_t n_norm = (size_t)kv->n_kv_heads * (size_t)n_rows, n_part = (size_t)kv->n_kv_heads * (size_t)jb.blocks * (size_t)d;
    CKV_TRY(ckv_cpu_evict_scratch_raw(be, (n_norm + n_part) * sizeof(double), (void **)&jb.norm));
    jb.part = jb.norm + n_norm;
    for (jb.pass = 0; jb.pass < 2; jb.pass++)
        ckv_threadpool_for(ckv_cpu_pool(be), kv->n_kv_heads * jb.blocks, 1, keydiff_units, &jb);
    return CKV_STATUS_OK;
}

/* LagKV's softmax-normalised spread of partition rows t0 .. t0 + lag - 1 of segment g against the
 * channel range of the next partition, added (times 0.5) into r[lag]. LAG_ROWS rows at a time are
 * normalised into z (fp32, as the sums read it), their means and deviations lane sums of z while z
 * is in L1. */
enum { LAG_ROWS = CKV_CPU_LANE_ROWS };

/* lo[a] and rng[a] = hi[a] - lo[a] over rows t0 .. t0 + n - 1 of segment g (n >= 1). With AVX-512
 * and an fp32 cache, 64 channels at a time in registers down the rows (vminps / vmaxps: the same
 * x < lo ? x : lo as the loop below). */
static void lag_range(const ckv_kv_batch *kv, int g, int t0, int n, int values, float *buf, float *lo, float *rng) {
    const int d = kv->head_dim;
    int a0 = 0;
#if defined(__AVX512F__) && defined(__AVX512VL__) /* cpu_lanes.h's immintrin.h */
    if (kv->dtype == CKV_DTYPE_F32) {
        const float *x = seg_rows(kv, g, t0, n, values, buf); // [n, d]
        for (; a0 + 64 <= d; a0 += 64) {
            __m512 l[4], h[4];
            for (int c = 0; c < 4; c++) l[c] = h[c] = _mm512_loadu_ps(x + a0 + 16 * c);
            for (int t = 1; t < n; t++)
                for (int c = 0; c < 4; c++) {
                    const __m512 v = _mm512_loadu_ps(x + (size_t)t * d + a0 + 16 * c);
                    l[c] = _mm512_min_ps(v, l[c]);
                    h[c] = _mm512_max_ps(v, h[c]);
                }
            for (int c = 0; c < 4; c++) {
                _mm512_storeu_ps(lo + a0 + 16 * c, l[c]);
                _mm512_storeu_ps(rng + a0 + 16 * c, _mm512_sub_ps(h[c], l[c]));
            }
        }
        if (a0 == d) return;
    }
#endif
    const float *x0 = seg_rows(kv, g, t0, 1, values, buf);
    for (int a = a0; a < d; a++) lo[a] = rng[a] = x0[a]; /* rng: the max, then hi - lo */
    for (int t = t0 + 1; t < t0 + n; t++) {
        const float *x = seg_rows(kv, g, t, 1, values, buf);
        for (int a = a0; a < d; a++) {
            lo[a] = x[a] < lo[a] ? x[a] : lo[a];
            rng[a] = x[a] > rng[a] ? x[a] : rng[a];
        }
    }
    for (int a = a0; a < d; a++) rng[a] -= lo[a];
}

static void lag_spread(const ckv_kv_batch *kv, int g, int t0, int lag, int values, float *buf, float *lo, float *rng,
                       float *z, double *s, double *r) {
    const int d = kv->head_dim;
    lag_range(kv, g, t0 + lag, lag, values, buf, lo, rng);
    double mx = -INFINITY;
    for (int i0 = 0; i0 < lag; i0 += LAG_ROWS) {
        const int nr = lag - i0 < LAG_ROWS ? lag - i0 : LAG_ROWS;
        const float *x = seg_rows(kv, g, t0 + i0, nr, values, buf); // [nr, d]
        for (int i = 0; i < nr; i++)
            for (int a = 0; a < d; a++) z[(size_t)i * d + a] = (x[(size_t)i * d + a] - lo[a]) / rng[a];
        const float *rows[LAG_ROWS];
        double mean[LAG_ROWS], var[LAG_ROWS];
        ckv_cpu_lane_rows_of(rows, z, (size_t)d, nr);
        ckv_cpu_lanes_sum(mean, rows, d);
        for (int i = 0; i < LAG_ROWS; i++) mean[i] /= (double)d;
        ckv_cpu_lanes_sqdev(var, rows, mean, d);
        for (int i = 0; i < nr; i++) {
            s[i0 + i] = d > 1 ? sqrt(var[i] / (double)(d - 1)) : NAN; /* torch.std: unbiased */
            if (s[i0 + i] > mx) mx = s[i0 + i];
        }
    }
    double sum = 0.0;
    for (int i = 0; i < lag; i++) sum += (s[i] = exp(s[i] - mx));
    for (int i = 0; i < lag; i++) r[i] += 0.5 * (s[i] / sum);
}

typedef struct {
    float *out;
    int ld, n_rows, n_sink, lag, cross;
    const ckv_kv_batch *kv;
} lagkv_job;

/* One unit: partition p = u % (P - 1) of KV head g = u / (P - 1) (the last partition has no next one). */
static ckv_status lagkv_unit(void *ctx, int u, void *scratch) {
    const lagkv_job *jb = ctx;
    const int lag = jb->lag, P = (jb->n_rows - jb->n_sink) / lag, g = u / (P - 1), p = u % (P - 1);
    double *s = scratch, *r = s + lag; // [lag] each
    float buf[LAG_ROWS * KEYS_MAX_DIM], lo[KEYS_MAX_DIM], rng[KEYS_MAX_DIM], z[LAG_ROWS * KEYS_MAX_DIM];
    float *dst = jb->out + (size_t)g * (size_t)jb->ld;
    const int t0 = jb->n_sink + p * lag;
    for (int i = 0; i < lag; i++) r[i] = 0.0;
    lag_spread(jb->kv, g, t0, lag, 0, buf, lo, rng, z, s, r);
    lag_spread(jb->kv, g, t0, lag, 1, buf, lo, rng, z, s, r);
    for (int i = 0; i < lag; i++) {
        if (jb->cross) {
            dst[t0 + i] = (float)r[i];
            continue;
        }
        /* argsort of argsort: the row's place in ascending order, rows below it then the equal ones before it */
        const double ri = r[i];
        int rank = 0;
        for (int u2 = 0; u2 < lag; u2++) rank += r[u2] < ri;
        for (int u2 = 0; u2 < i; u2++) rank += r[u2] == ri;
        dst[t0 + i] = (float)rank / (float)lag;
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_cpu_evict_lagkv(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows, int n_sink,
                               int lag, ckv_evict_lagkv_score score) {
    const int cross = score == CKV_EVICT_LAGKV_CROSS;
    const int d = kv->head_dim;
    if (d < 1 || d > KEYS_MAX_DIM)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "evict_lagkv: head_dim %d outside 1..%d", d, KEYS_MAX_DIM);
    if (n_sink < 0 || lag < 1 || n_rows <= n_sink)
        return ckv_error(CKV_STATUS_ERR_ARG, "evict_lagkv: %d rows, %d sinks, lag %d", n_rows, n_sink, lag);
    /* sinks and the unscored tail: 1; when n_rows < n_sink + 2 lag (kvpress: no compression) the most
     * recent rows rank highest */
    const int ramp = n_rows < n_sink + 2 * lag, scored_end = ramp ? n_sink : n_sink + ((n_rows - n_sink) / lag - 1) * lag;
    for (int g = 0; g < kv->n_kv_heads; g++) {
        float *o = out + (size_t)g * (size_t)ld;
        for (int t = 0; t < n_sink; t++) o[t] = 1.0f;
        for (int t = scored_end; t < n_rows; t++) o[t] = ramp ? (float)(t - n_sink) / (float)(n_rows - n_sink) : 1.0f;
    }
    if (ramp) return CKV_STATUS_OK;
    lagkv_job jb = {out, ld, n_rows, n_sink, lag, cross, kv};
    const int units = kv->n_kv_heads * ((n_rows - n_sink) / lag - 1); /* KV heads x scored partitions */
    return ckv_cpu_evict_heads(be, units, 2 * (size_t)lag * sizeof(double), lagkv_unit, &jb);
}

typedef struct {
    float *out;
    int ld, n_rows, n_sink, kind, window, block, blocks, pass;
    const ckv_kv_batch *kv;
    double *s;     // [2, n_kv, n_rows] k2 then v2, normalised per window; s_t in the first
    double *part;  // [n_kv, blocks] sum of s_t over the block
} cur_job;

static void cur_units(void *ctx, int u0, int u1, int tid) {
    (void)tid;
    const cur_job *jb = ctx;
    const ckv_kv_batch *kv = jb->kv;
    const int d = kv->head_dim, n_rows = jb->n_rows, window = jb->window, kind = jb->kind;
    float buf[CONV_ROWS * KEYS_MAX_DIM];
    for (int u = u0; u < u1; u++) {
        int g, b, t0, t1;
        ckv_cpu_unit_rows(u, jb->blocks, jb->block, n_rows, &g, &b, &t0, &t1);
        double *s = jb->s + (size_t)g * (size_t)n_rows, *part = jb->part + (size_t)g * (size_t)jb->blocks;
        if (jb->pass == 1) {
            double total = 0.0;
            for (int c = 0; c < jb->blocks; c++) total += part[c];
            float *dst = jb->out + (size_t)g * (size_t)jb->ld;
            for (int t = t0; t < t1; t++) dst[t] = t < jb->n_sink ? 1.0f : (float)(s[t] / total);
            continue;
        }
        for (int values = 0; values < 2; values++) {
            double *x = s + (size_t)values * (size_t)kv->n_kv_heads * (size_t)n_rows;
            for (int t = t0; t < t1; t += CONV_ROWS) {
                const int nr = t1 - t < CONV_ROWS ? t1 - t : CONV_ROWS;
                ckv_cpu_sumsq_rows(x + t, seg_rows(kv, g, t, nr, values, buf), nr, d);
                for (int i = 0; i < nr; i++) {
                    const double n = sqrt(x[t + i]);
                    x[t + i] = n * n;
                }
            }
            for (int w0 = t0; window > 0 && w0 < t1; w0 += window) { /* the block holds whole windows */
                const int w1 = w0 + window < t1 ? w0 + window : t1;
                double sum = 0.0;
                for (int t = w0; t < w1; t++) sum += x[t];
                for (int t = w0; t < w1; t++) x[t] /= sum;
            }
        }
        const double *v2 = s + (size_t)kv->n_kv_heads * (size_t)n_rows;
        double sum = 0.0;
        for (int t = t0; t < t1; t++) {
            const double k2 = s[t];
            s[t] = kind == 0 ? k2 : kind == 1 ? v2[t] : kind == 2 ? (k2 + v2[t]) / 2.0 : k2 * v2[t];
            sum += s[t];
        }
        part[b] = sum;
    }
}

ckv_status ckv_cpu_evict_cur(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows, int n_sink,
                             ckv_evict_cur_kind kind, int window) {
    const int d = kv->head_dim;
    if (d < 1 || d > KEYS_MAX_DIM)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "evict_cur: head_dim %d outside 1..%d", d, KEYS_MAX_DIM);
    if (n_rows < 1 || kind < 0 || kind > 3 || window < 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "evict_cur: %d rows, kind %d, window %d", n_rows, kind, window);
    /* blocks of whole windows: BLOCK_ROWS rounded up to a multiple of the window */
    const int block = window > 0 ? (window >= BLOCK_ROWS ? window : (BLOCK_ROWS + window - 1) / window * window) : BLOCK_ROWS;
    cur_job jb = {out, ld, n_rows, n_sink, kind, window, block, ckv_cpu_blocks((size_t)n_rows, (size_t)block), 0, kv,
                  NULL, NULL};
    const size_t n_s = 2 * (size_t)kv->n_kv_heads * (size_t)n_rows, n_part = (size_t)kv->n_kv_heads * (size_t)jb.blocks;
    CKV_TRY(ckv_cpu_evict_scratch_raw(be, (n_s + n_part) * sizeof(double), (void **)&jb.s));
    jb.part = jb.s + n_s;
    for (jb.pass = 0; jb.pass < 2; jb.pass++)
        ckv_threadpool_for(ckv_cpu_pool(be), kv->n_kv_heads * jb.blocks, 1, cur_units, &jb);
    return CKV_STATUS_OK;
}
