/* cpu_evict_leverage.c - the approximate-leverage op on the CPU (backend.h evict_leverage): the
 * cached keys rotated back to pre-RoPE keys, centred, sketched by the caller's Gaussian matrix,
 * their Gram matrix factored by Cholesky (with kvpress's jitter schedule) and each row's leverage
 * x^T (G + jI)^-1 x by one forward substitution (eight rows side by side, each in one row's order); plus the per-row sums any z-scoring scorer hands to
 * its cross-head statistics (evict_row_stats) and the affine map it applies after them (evict_affine).
 * Double arithmetic after the fp32 pre-RoPE keys; KV heads over the backend's pool
 * (ckv_cpu_evict_heads: each head on one thread, in one thread's order), scratch allocated once per
 * call. It does not draw the sketch, normalise across heads or select. */
#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "cpu_backend.h"

#define LEV_MAX_DIM 1024
#define LEV_MAX_K 256

/* Rows row0 .. row0 + n - 1 of segment g's keys rotated back to pre-RoPE keys at the segment's own
 * positions: pre [n, d] fp32. */
static void prerope_rows(const ckv_kv_batch *kv, int g, int row0, int n, const float *inv_freq, float rope_scale,
                         float *pre) {
    const int32_t *pos = kv->segs[0][g].pos;
    const int d = kv->head_dim, half = d / 2;
    const size_t rowb = (size_t)d * ckv_dtype_size(kv->dtype);
    float buf[LEV_MAX_DIM];
    for (int t = 0; t < n; t++) {
        const char *row = (const char *)kv->segs[0][g].k + (size_t)(row0 + t) * rowb;
        const float *y = (const float *)(const void *)row;
        if (kv->dtype != CKV_DTYPE_F32) {
            ckv_convert_to_f32(buf, row, kv->dtype, (size_t)d);
            y = buf;
        }
        float *x = pre + (size_t)t * (size_t)d;
        const float p = (float)pos[row0 + t];
        for (int i = 0; i < half; i++) {
            const float a = p * inv_freq[i]; /* fp32, as the rope op */
            const double c = (double)(cosf(a) * rope_scale), s = (double)(sinf(a) * rope_scale), r = c * c + s * s;
            x[i] = (float)(((double)y[i] * c + (double)y[i + half] * s) / r);
            x[i + half] = (float)(((double)y[i + half] * c - (double)y[i] * s) / r);
        }
        if (d % 2) x[d - 1] = y[d - 1];
    }
}

/* x [k] = (pre_t - mean) @ phi, phi [d, k] (widened to double): each x_j summed over a in ascending
 * order from 0, eight columns at a time in registers. c [d] scratch. */
static void sketch_row(const float *pre_t, const double *mean, const double *phi, int d, int k, double *c, double *x) {
    for (int a = 0; a < d; a++) c[a] = (double)pre_t[a] - mean[a];
    int j0 = 0;
    for (; j0 + 8 <= k; j0 += 8) {
        double acc[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
        for (int a = 0; a < d; a++) {
            const double *pa = phi + (size_t)a * (size_t)k + j0;
            for (int l = 0; l < 8; l++) acc[l] += c[a] * pa[l];
        }
        for (int l = 0; l < 8; l++) x[j0 + l] = acc[l];
    }
    for (int j = j0; j < k; j++) {
        double acc = 0.0;
        for (int a = 0; a < d; a++) acc += c[a] * phi[(size_t)a * (size_t)k + j];
        x[j] = acc;
    }
}

/* Lower Cholesky factor C of G + jitter I ([k, k]); 0 when not positive definite. */
static int cholesky(const double *G, double jitter, int k, double *C) {
    for (int i = 0; i < k; i++)
        for (int j = 0; j <= i; j++) {
            double s = G[(size_t)i * k + j] + (i == j ? jitter : 0.0);
            for (int m = 0; m < j; m++) s -= C[(size_t)i * k + m] * C[(size_t)j * k + m];
            if (i == j) {
                if (!(s > 0.0)) return 0;
                C[(size_t)i * k + i] = sqrt(s);
            } else {
                C[(size_t)i * k + j] = s / C[(size_t)j * k + j];
            }
        }
    return 1;
}

typedef struct {
    float *out;
    int ld, row0, n, k;
    double *stats;
    const ckv_kv_batch *kv;
    const float *inv_freq, *phi;
    float rope_scale;
} leverage_job;

/* Rows of one forward substitution pass: the rows are independent, so LEV_LANES of them go through
 * C^-1 side by side (each lane's sums in the order one row's take). */
#define LEV_LANES 8

/* out[t] = ||C^-1 x_t||^2 for the rows x_t of X [nb, k] (nb <= LEV_LANES), C lower [k, k]. */
static void leverage_rows(const double *C, const double *X, int nb, int k, float *out) {
    double y[LEV_MAX_K][LEV_LANES], lev[LEV_LANES];
    for (int l = 0; l < LEV_LANES; l++) {
        lev[l] = 0.0;
        for (int i = 0; i < k; i++) y[i][l] = l < nb ? X[(size_t)l * k + i] : 0.0;
    }
    for (int i = 0; i < k; i++) { /* y_i = (x_i - sum_{m<i} C_im y_m) / C_ii, lev += y_i^2 */
        const double *ci = C + (size_t)i * k;
        double s[LEV_LANES];
        for (int l = 0; l < LEV_LANES; l++) s[l] = y[i][l];
        for (int m = 0; m < i; m++)
            for (int l = 0; l < LEV_LANES; l++) s[l] -= ci[m] * y[m][l];
        for (int l = 0; l < LEV_LANES; l++) {
            y[i][l] = s[l] / ci[i];
            lev[l] += y[i][l] * y[i][l];
        }
    }
    for (int l = 0; l < nb; l++) out[l] = (float)(lev[l] > 0.0 ? lev[l] : 0.0);
}

static ckv_status leverage_head(void *ctx, int g, void *scratch) {
    const leverage_job *jb = ctx;
    const int d = jb->kv->head_dim, n = jb->n, k = jb->k;
    float *pre = scratch;                                              // [n, d] pre-RoPE keys of the head
    double *G = (double *)(void *)(pre + (((size_t)n * (size_t)d + 1) & ~(size_t)1)); // [k, k] Gram matrix
    double *C = G + (size_t)k * (size_t)k;                            // [k, k] its Cholesky factor
    double *X = C + (size_t)k * (size_t)k;                            // [n, k] the sketched rows
    double *ph = X + (size_t)n * (size_t)k;                           // [d, k] the head's sketch in double
    double mean[LEV_MAX_DIM], c[LEV_MAX_DIM];
    const float *phf = jb->phi + (size_t)g * (size_t)d * (size_t)k;
    for (size_t i = 0; i < (size_t)d * (size_t)k; i++) ph[i] = (double)phf[i];
    prerope_rows(jb->kv, g, jb->row0, n, jb->inv_freq, jb->rope_scale, pre);
    for (int a = 0; a < d; a++) mean[a] = 0.0;
    for (int t = 0; t < n; t++)
        for (int a = 0; a < d; a++) mean[a] += (double)pre[(size_t)t * d + a];
    for (int a = 0; a < d; a++) mean[a] /= (double)n;
    memset(G, 0, (size_t)k * (size_t)k * sizeof(double));
    for (int t = 0; t < n; t++) { /* lower triangle of X^T X */
        double *x = X + (size_t)t * k;
        sketch_row(pre + (size_t)t * d, mean, ph, d, k, c, x);
        for (int i = 0; i < k; i++)
            for (int j = 0; j <= i; j++) G[(size_t)i * k + j] += x[i] * x[j];
    }
    double jitter = 1e-2;
    int ok = 0;
    for (int tries = 0; tries < 5 && !(ok = cholesky(G, jitter, k, C)); tries++) jitter *= 10.0;
    if (!ok)
        return ckv_error(CKV_STATUS_ERR_NUMERIC, "evict_leverage: the sketched Gram matrix of KV head %d is not "
                         "positive definite even with jitter 100", g);
    float *dst = jb->out + (size_t)g * (size_t)jb->ld;
    for (int t = 0; t < n; t += LEV_LANES)
        leverage_rows(C, X + (size_t)t * k, n - t < LEV_LANES ? n - t : LEV_LANES, k, dst + t);
    double s1 = 0.0, s2 = 0.0;
    for (int t = 0; t < n; t++) {
        s1 += (double)dst[t];
        s2 += (double)dst[t] * (double)dst[t];
    }
    jb->stats[2 * g] = s1;
    jb->stats[2 * g + 1] = s2;
    return CKV_STATUS_OK;
}

ckv_status ckv_cpu_evict_leverage(ckv_backend *be, float *out, int ld, double *stats, const ckv_kv_batch *kv, int row0,
                                  int n, const float *inv_freq, float rope_scale, const float *phi, int k) {
    const int d = kv->head_dim;
    if (d < 2 || d > LEV_MAX_DIM || k < 1 || k > LEV_MAX_K)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "evict_leverage: head_dim %d outside 2..%d or sketch %d outside 1..%d",
                         d, LEV_MAX_DIM, k, LEV_MAX_K);
    if (n < 1 || row0 < 0) return ckv_error(CKV_STATUS_ERR_ARG, "evict_leverage: %d rows from row %d", n, row0);
    leverage_job jb = {out, ld, row0, n, k, stats, kv, inv_freq, phi, rope_scale};
    const size_t pre_floats = ((size_t)n * (size_t)d + 1) & ~(size_t)1; /* even: the doubles after it stay aligned */
    /* G, C, the sketched rows, the sketch in double */
    const size_t doubles = 2 * (size_t)k * (size_t)k + (size_t)n * (size_t)k + (size_t)d * (size_t)k;
    return ckv_cpu_evict_heads(be, kv->n_kv_heads, pre_floats * sizeof(float) + doubles * sizeof(double), leverage_head,
                               &jb);
}

void ckv_cpu_evict_row_stats(ckv_backend *be, double *stats, const float *x, int rows, int n, int ld) {
    (void)be;
    for (int r = 0; r < rows; r++) {
        double s1 = 0.0, s2 = 0.0;
        for (int t = 0; t < n; t++) {
            const double v = (double)x[(size_t)r * (size_t)ld + t];
            s1 += v;
            s2 += v * v;
        }
        stats[2 * r] = s1;
        stats[2 * r + 1] = s2;
    }
}

void ckv_cpu_evict_affine(ckv_backend *be, float *x, int rows, int n, int ld, float sub, float div) {
    (void)be;
    for (int r = 0; r < rows; r++)
        for (int t = 0; t < n; t++) x[(size_t)r * ld + t] = (x[(size_t)r * ld + t] - sub) / div;
}
