/* cpu_evict_leverage.c - the approximate-leverage op on the CPU (backend.h evict_leverage): the
 * cached keys rotated back to pre-RoPE keys, centred, sketched by the caller's Gaussian matrix,
 * their Gram matrix factored by Cholesky (with kvpress's jitter schedule) and each row's leverage
 * x^T (G + jI)^-1 x by one forward substitution; plus the per-row sums any z-scoring scorer hands to
 * its cross-head statistics (evict_row_stats) and the affine map it applies after them (evict_affine).
 * Double arithmetic after the fp32 pre-RoPE keys. Every KV head's work is cut into units that keep
 * each sum's order (blocks of rows for the rotation, the sketch and the substitution; blocks of
 * dimensions for the mean; pairs of 4-row bands of the Gram matrix), spread over the backend's pool
 * phase by phase, so the bits do not depend on the thread count; the rotary angles are computed once
 * per row for every head at segment 0's positions and kept by the backend for the next call at the
 * same positions (the next layer); Cholesky and the per-head sums run on the calling
 * thread. Register tiles (4 rows x 16 columns) for the sketch and the Gram matrix, 32 rows side by
 * side in the substitution. Scratch taken once per call from the eviction scratch, not zeroed (every
 * byte read is written first). It does not draw the sketch, normalise across heads or select. */
#include <math.h>
#include <string.h>

#include "cpu_backend.h"

#define LEV_MAX_DIM 1024
#define LEV_MAX_K 256
#define LEV_TILE 16    /* columns of a sketch / Gram register tile; kp, the padded sketch width, is a multiple */
#define LEV_ROWS 4     /* rows of a register tile (the kernels name them a0 .. a3) */
#define LEV_LANES 32   /* rows through one forward substitution side by side */
#define LEV_BLOCK 128  /* rows of a rotation / sketch unit */
#define LEV_DIMS 16    /* dimensions of a mean unit */
#define LEV_TBLOCK 64  /* rows of X one Gram pass keeps in L1 */

typedef struct {
    float *out;
    int ld, row0, n, k, kp, d, H;
    const ckv_kv_batch *kv;
    const float *inv_freq, *phi;
    float rope_scale;
    float *pre;   // [H, n, d] pre-RoPE keys
    float *rot;   // [n, 2 (d/2)] segment 0's rotary cos and sin per row (rope_angles; lev_angles)
    double *mean; // [H, d] their means
    double *ph;   // [H, d, kp] the sketch in double, columns k.. kp-1 zero
    double *X;    // [H, n, kp] the centred, sketched rows (columns k.. zero)
    double *G;    // [H, k, k] lower triangle of X^T X
    double *C;    // [H, k, k] Cholesky factors
    double *Y;    // [threads, kp, LEV_LANES] substitution lanes of each worker
    int nb_rows, nb_dims, nb_gram, nb_lanes; /* units per head of each phase */
} lev_job;

/* cs [2, d/2]: cos and sin of position p's rotary angles times rope_scale, in fp32 as the rope op
 * forms them. */
static void rope_angles(float p, const float *inv_freq, float rope_scale, int half, float *cs) {
    for (int i = 0; i < half; i++) {
        const float a = p * inv_freq[i];
        cs[i] = cosf(a) * rope_scale;
        cs[half + i] = sinf(a) * rope_scale;
    }
}

/* x [d] = the key y [d] rotated back by the angles cs [2, d/2] (rope_angles), in double. */
static void unrotate_row(const float *restrict y, const float *restrict cs, int d, float *restrict x) {
    const int half = d / 2;
    for (int i = 0; i < half; i++) {
        const double c = (double)cs[i], s = (double)cs[half + i], r = c * c + s * s;
        x[i] = (float)(((double)y[i] * c + (double)y[i + half] * s) / r);
        x[i + half] = (float)(((double)y[i + half] * c - (double)y[i] * s) / r);
    }
    if (d % 2) x[d - 1] = y[d - 1];
}

/* Rows t0 .. t0 + n - 1 (from the op's row0) of segment g's keys rotated back to pre-RoPE keys at the
 * segment's own positions: pre [n, d] fp32. A row whose position is segment 0's takes its angles from
 * rot [rows, d] (segment 0's, rope_angles), any other row computes them. */
static void prerope_rows(const lev_job *jb, int g, int t0, int n, float *pre) {
    const ckv_kv_batch *kv = jb->kv;
    const int32_t *pos = kv->segs[0][g].pos + jb->row0, *pos0 = kv->segs[0][0].pos + jb->row0;
    const int d = kv->head_dim, half = d / 2;
    const size_t rowb = (size_t)d * ckv_dtype_size(kv->dtype);
    float buf[LEV_MAX_DIM], own[LEV_MAX_DIM];
    for (int t = t0; t < t0 + n; t++) {
        const char *row = (const char *)kv->segs[0][g].k + (size_t)(jb->row0 + t) * rowb;
        const float *y = (const float *)(const void *)row, *cs = jb->rot + (size_t)t * (size_t)(2 * half);
        if (kv->dtype != CKV_DTYPE_F32) {
            ckv_convert_to_f32(buf, row, kv->dtype, (size_t)d);
            y = buf;
        }
        if (pos[t] != pos0[t]) {
            rope_angles((float)pos[t], jb->inv_freq, jb->rope_scale, half, own);
            cs = own;
        }
        unrotate_row(y, cs, d, pre + (size_t)(t - t0) * (size_t)d);
    }
}

/* Unit (block): segment 0's rotary angles of the block's rows (rope_angles) into rot. */
static void angle_units(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const lev_job *jb = ctx;
    const int half = jb->d / 2;
    const int32_t *pos0 = jb->kv->segs[0][0].pos + jb->row0;
    for (int u = begin; u < end; u++)
        for (int t = u * LEV_BLOCK; t < jb->n && t < (u + 1) * LEV_BLOCK; t++)
            rope_angles((float)pos0[t], jb->inv_freq, jb->rope_scale, half, jb->rot + (size_t)t * (size_t)(2 * half));
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


/* Runs fn over units [0, n) on the backend's pool (inline on one thread). */
static void lev_run(ckv_backend *be, int n, ckv_parallel_fn fn, lev_job *jb) {
    ckv_threadpool *pool = ckv_cpu_pool(be);
    if (pool && ckv_threadpool_size(pool) > 1 && n > 1)
        ckv_threadpool_for(pool, n, 1, fn, jb);
    else
        fn(jb, 0, n, 0);
}

/* Unit (g, block): the block's rows of head g rotated back to pre-RoPE keys. */
static void rotate_units(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const lev_job *jb = ctx;
    for (int u = begin; u < end; u++) {
        const int g = u / jb->nb_rows, t0 = (u % jb->nb_rows) * LEV_BLOCK;
        const int nr = jb->n - t0 < LEV_BLOCK ? jb->n - t0 : LEV_BLOCK;
        prerope_rows(jb, g, t0, nr, jb->pre + ((size_t)g * (size_t)jb->n + (size_t)t0) * (size_t)jb->d);
    }
}

/* Unit (g, dims): the mean of those dimensions of head g's pre-RoPE keys (each summed over the rows
 * in ascending order from 0) and those rows of its sketch widened to double, padded to kp columns. */
static void mean_units(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const lev_job *jb = ctx;
    const int n = jb->n, d = jb->d, k = jb->k, kp = jb->kp;
    for (int u = begin; u < end; u++) {
        const int g = u / jb->nb_dims, a0 = (u % jb->nb_dims) * LEV_DIMS, na = d - a0 < LEV_DIMS ? d - a0 : LEV_DIMS;
        const float *pre = jb->pre + (size_t)g * (size_t)n * (size_t)d + a0;
        double m[LEV_DIMS] = {0.0};
        for (int t = 0; t < n; t++)
            for (int a = 0; a < na; a++) m[a] += (double)pre[(size_t)t * d + a];
        for (int a = 0; a < na; a++) {
            const size_t ga = (size_t)g * (size_t)d + (size_t)(a0 + a);
            jb->mean[ga] = m[a] / (double)n;
            for (int j = 0; j < kp; j++) jb->ph[ga * kp + j] = j < k ? (double)jb->phi[ga * k + j] : 0.0;
        }
    }
}

/* Unit (g, block): x_t [kp] = (pre_t - mean) @ phi for the block's rows of head g, each x_tj summed
 * over the dimensions in ascending order from 0; LEV_ROWS rows x LEV_TILE columns per register tile. */
static void sketch_units(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const lev_job *jb = ctx;
    const int n = jb->n, d = jb->d, kp = jb->kp;
    double c[LEV_ROWS][LEV_MAX_DIM]; /* [LEV_ROWS, d] the centred rows of a tile */
    for (int u = begin; u < end; u++) {
        const int g = u / jb->nb_rows, t0 = (u % jb->nb_rows) * LEV_BLOCK;
        const int nr = n - t0 < LEV_BLOCK ? n - t0 : LEV_BLOCK;
        const float *pre = jb->pre + ((size_t)g * (size_t)n + (size_t)t0) * (size_t)d;
        const double *mean = jb->mean + (size_t)g * (size_t)d, *ph = jb->ph + (size_t)g * (size_t)d * (size_t)kp;
        double *X = jb->X + ((size_t)g * (size_t)n + (size_t)t0) * (size_t)kp;
        for (int r0 = 0; r0 < nr; r0 += LEV_ROWS) {
            const int m = nr - r0 < LEV_ROWS ? nr - r0 : LEV_ROWS;
            for (int r = 0; r < LEV_ROWS; r++)
                for (int a = 0; a < d; a++) c[r][a] = r < m ? (double)pre[(size_t)(r0 + r) * d + a] - mean[a] : 0.0;
            for (int j0 = 0; j0 < kp; j0 += LEV_TILE) {
                double a0[LEV_TILE] = {0.0}, a1[LEV_TILE] = {0.0}, a2[LEV_TILE] = {0.0}, a3[LEV_TILE] = {0.0};
                for (int a = 0; a < d; a++) {
                    const double *pa = ph + (size_t)a * (size_t)kp + j0;
                    const double c0 = c[0][a], c1 = c[1][a], c2 = c[2][a], c3 = c[3][a];
                    for (int l = 0; l < LEV_TILE; l++) {
                        a0[l] += c0 * pa[l];
                        a1[l] += c1 * pa[l];
                        a2[l] += c2 * pa[l];
                        a3[l] += c3 * pa[l];
                    }
                }
                const double *acc[LEV_ROWS] = {a0, a1, a2, a3};
                for (int r = 0; r < m; r++) memcpy(X + (size_t)(r0 + r) * kp + j0, acc[r], sizeof a0);
            }
        }
    }
}

/* acc [LEV_ROWS, kp] += the rows i0 .. i0 + LEV_ROWS - 1 of Xb^T Xb over Xb's nt rows [nt, kp], columns
 * 0 .. i0 + LEV_ROWS - 1 rounded up to a tile: each element summed over the rows in ascending order. */
static void gram_band(const double *Xb, int nt, int kp, int i0, double *acc) {
    for (int j0 = 0; j0 < i0 + LEV_ROWS; j0 += LEV_TILE) {
        double a0[LEV_TILE], a1[LEV_TILE], a2[LEV_TILE], a3[LEV_TILE];
        memcpy(a0, acc + j0, sizeof a0);
        memcpy(a1, acc + (size_t)kp + j0, sizeof a1);
        memcpy(a2, acc + 2 * (size_t)kp + j0, sizeof a2);
        memcpy(a3, acc + 3 * (size_t)kp + j0, sizeof a3);
        for (int t = 0; t < nt; t++) {
            const double *x = Xb + (size_t)t * (size_t)kp, x0 = x[i0], x1 = x[i0 + 1], x2 = x[i0 + 2], x3 = x[i0 + 3];
            for (int l = 0; l < LEV_TILE; l++) {
                a0[l] += x0 * x[j0 + l];
                a1[l] += x1 * x[j0 + l];
                a2[l] += x2 * x[j0 + l];
                a3[l] += x3 * x[j0 + l];
            }
        }
        memcpy(acc + j0, a0, sizeof a0);
        memcpy(acc + (size_t)kp + j0, a1, sizeof a1);
        memcpy(acc + 2 * (size_t)kp + j0, a2, sizeof a2);
        memcpy(acc + 3 * (size_t)kp + j0, a3, sizeof a3);
    }
}

/* Unit (g, b): bands b and nbands - 1 - b (LEV_ROWS rows each, equal work together) of the lower
 * triangle of head g's X^T X, the rows of X taken LEV_TBLOCK at a time. */
static void gram_units(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const lev_job *jb = ctx;
    const int n = jb->n, k = jb->k, kp = jb->kp, nbands = (k + LEV_ROWS - 1) / LEV_ROWS;
    double acc[2][LEV_ROWS * LEV_MAX_K]; /* [2 bands, LEV_ROWS, kp] */
    for (int u = begin; u < end; u++) {
        const int g = u / jb->nb_gram, b = u % jb->nb_gram, band[2] = {b, nbands - 1 - b};
        const int nbnd = band[0] == band[1] ? 1 : 2;
        const double *X = jb->X + (size_t)g * (size_t)n * (size_t)kp;
        memset(acc, 0, sizeof acc);
        for (int t0 = 0; t0 < n; t0 += LEV_TBLOCK)
            for (int q = 0; q < nbnd; q++)
                gram_band(X + (size_t)t0 * kp, n - t0 < LEV_TBLOCK ? n - t0 : LEV_TBLOCK, kp, band[q] * LEV_ROWS, acc[q]);
        double *G = jb->G + (size_t)g * (size_t)k * (size_t)k;
        for (int q = 0; q < nbnd; q++)
            for (int r = 0; r < LEV_ROWS && band[q] * LEV_ROWS + r < k; r++) {
                const int i = band[q] * LEV_ROWS + r;
                for (int j = 0; j <= i; j++) G[(size_t)i * k + j] = acc[q][(size_t)r * kp + j];
            }
    }
}

/* Unit (g, block): out[t] = ||C^-1 x_t||^2 for the block's LEV_LANES rows of head g, side by side
 * (each lane's sums in the order one row's take), C head g's lower Cholesky factor. */
static void solve_units(void *ctx, int begin, int end, int tid) {
    const lev_job *jb = ctx;
    const int n = jb->n, k = jb->k, kp = jb->kp;
    double *y = jb->Y + (size_t)tid * (size_t)kp * LEV_LANES; /* [k, LEV_LANES] */
    for (int u = begin; u < end; u++) {
        const int g = u / jb->nb_lanes, t0 = (u % jb->nb_lanes) * LEV_LANES;
        const int nb = n - t0 < LEV_LANES ? n - t0 : LEV_LANES;
        const double *C = jb->C + (size_t)g * (size_t)k * (size_t)k;
        const double *X = jb->X + ((size_t)g * (size_t)n + (size_t)t0) * (size_t)kp;
        double lev[LEV_LANES];
        for (int l = 0; l < LEV_LANES; l++) {
            lev[l] = 0.0;
            for (int i = 0; i < k; i++) y[(size_t)i * LEV_LANES + l] = l < nb ? X[(size_t)l * kp + i] : 0.0;
        }
        for (int i = 0; i < k; i++) { /* y_i = (x_i - sum_{m<i} C_im y_m) / C_ii, lev += y_i^2 */
            const double *ci = C + (size_t)i * k;
            double s[LEV_LANES];
            for (int l = 0; l < LEV_LANES; l++) s[l] = y[(size_t)i * LEV_LANES + l];
            for (int m = 0; m < i; m++)
                for (int l = 0; l < LEV_LANES; l++) s[l] -= ci[m] * y[(size_t)m * LEV_LANES + l];
            for (int l = 0; l < LEV_LANES; l++) {
                const double yi = s[l] / ci[i];
                y[(size_t)i * LEV_LANES + l] = yi;
                lev[l] += yi * yi;
            }
        }
        float *dst = jb->out + (size_t)g * (size_t)jb->ld + t0;
        for (int l = 0; l < nb; l++) dst[l] = (float)(lev[l] > 0.0 ? lev[l] : 0.0);
    }
}

/* jb->rot <- segment 0's rotary angles of the op's rows: the backend's kept copy when the positions,
 * frequencies and scale are those it was computed for (every layer of a prefill), else computed
 * (angle_units) into it. The kept buffer is [rows] positions, [half] frequencies, [rows, 2 half] angles. */
static ckv_status lev_angles(ckv_backend *be, lev_job *jb) {
    ckv_cpu_ctx *ctx = be->ctx;
    const int n = jb->n, half = jb->d / 2;
    const size_t pos_b = (size_t)n * sizeof(int32_t), freq_b = (size_t)half * sizeof(float);
    const size_t bytes = pos_b + freq_b + (size_t)n * (size_t)(2 * half) * sizeof(float);
    const int32_t *pos0 = jb->kv->segs[0][0].pos + jb->row0;
    char *kept = ctx->lev_angles;
    if (ctx->lev_rows == n && ctx->lev_half == half && !memcmp(&ctx->lev_scale, &jb->rope_scale, sizeof(float)) &&
        !memcmp(kept, pos0, pos_b) && !memcmp(kept + pos_b, jb->inv_freq, freq_b)) {
        jb->rot = (float *)(void *)(kept + pos_b + freq_b);
        return CKV_STATUS_OK;
    }
    ctx->lev_rows = 0;
    CKV_TRY(ckv_cpu_grow(&ctx->lev_angles, &ctx->lev_angles_bytes, bytes, "the leverage op's rotary angles"));
    kept = ctx->lev_angles;
    memcpy(kept, pos0, pos_b);
    memcpy(kept + pos_b, jb->inv_freq, freq_b);
    jb->rot = (float *)(void *)(kept + pos_b + freq_b);
    lev_run(be, jb->nb_rows, angle_units, jb);
    ctx->lev_rows = n;
    ctx->lev_half = half;
    ctx->lev_scale = jb->rope_scale;
    return CKV_STATUS_OK;
}

ckv_status ckv_cpu_evict_leverage(ckv_backend *be, float *out, int ld, double *stats, const ckv_kv_batch *kv, int row0,
                                  int n, const float *inv_freq, float rope_scale, const float *phi, int k) {
    const int d = kv->head_dim, H = kv->n_kv_heads;
    if (d < 2 || d > LEV_MAX_DIM || k < 1 || k > LEV_MAX_K)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "evict_leverage: head_dim %d outside 2..%d or sketch %d outside 1..%d",
                         d, LEV_MAX_DIM, k, LEV_MAX_K);
    if (n < 1 || row0 < 0) return ckv_error(CKV_STATUS_ERR_ARG, "evict_leverage: %d rows from row %d", n, row0);
    if (H < 1) return CKV_STATUS_OK;
    const int kp = (k + LEV_TILE - 1) / LEV_TILE * LEV_TILE;
    ckv_threadpool *pool = ckv_cpu_pool(be);
    const size_t threads = (size_t)(pool ? ckv_threadpool_size(pool) : 1), h = (size_t)H, nn = (size_t)n;
    const size_t n_mean = h * (size_t)d, n_ph = n_mean * (size_t)kp, n_x = h * nn * (size_t)kp;
    const size_t n_g = h * (size_t)k * (size_t)k, n_y = threads * (size_t)kp * LEV_LANES;
    const size_t n_pre = h * nn * (size_t)d;
    const size_t doubles = n_mean + n_ph + n_x + 2 * n_g + n_y, floats = n_pre; /* doubles first: aligned */
    double *ws = NULL;
    CKV_TRY(ckv_cpu_evict_scratch_raw(be, doubles * sizeof(double) + floats * sizeof(float), (void **)&ws));
    lev_job jb = {.out = out, .ld = ld, .row0 = row0, .n = n, .k = k, .kp = kp, .d = d, .H = H, .kv = kv,
                  .inv_freq = inv_freq, .phi = phi, .rope_scale = rope_scale,
                  .mean = ws, .ph = ws + n_mean, .X = ws + n_mean + n_ph, .G = ws + n_mean + n_ph + n_x,
                  .C = ws + n_mean + n_ph + n_x + n_g, .Y = ws + n_mean + n_ph + n_x + 2 * n_g,
                  .pre = (float *)(void *)(ws + doubles),
                  .nb_rows = ckv_cpu_blocks(nn, LEV_BLOCK), .nb_dims = ckv_cpu_blocks((size_t)d, LEV_DIMS),
                  .nb_gram = ((k + LEV_ROWS - 1) / LEV_ROWS + 1) / 2, .nb_lanes = ckv_cpu_blocks(nn, LEV_LANES)};
    CKV_TRY(lev_angles(be, &jb));
    lev_run(be, H * jb.nb_rows, rotate_units, &jb);
    lev_run(be, H * jb.nb_dims, mean_units, &jb);
    lev_run(be, H * jb.nb_rows, sketch_units, &jb);
    lev_run(be, H * jb.nb_gram, gram_units, &jb);
    for (int g = 0; g < H; g++) {
        const double *G = jb.G + (size_t)g * (size_t)k * (size_t)k;
        double *C = jb.C + (size_t)g * (size_t)k * (size_t)k, jitter = 1e-2;
        int ok = 0;
        for (int tries = 0; tries < 5 && !(ok = cholesky(G, jitter, k, C)); tries++) jitter *= 10.0;
        if (!ok)
            return ckv_error(CKV_STATUS_ERR_NUMERIC, "evict_leverage: the sketched Gram matrix of KV head %d is not "
                             "positive definite even with jitter 100", g);
    }
    lev_run(be, H * jb.nb_lanes, solve_units, &jb);
    for (int g = 0; g < H; g++) {
        const float *dst = out + (size_t)g * (size_t)ld;
        double s1 = 0.0, s2 = 0.0;
        for (int t = 0; t < n; t++) {
            s1 += (double)dst[t];
            s2 += (double)dst[t] * (double)dst[t];
        }
        stats[2 * g] = s1;
        stats[2 * g + 1] = s2;
    }
    return CKV_STATUS_OK;
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
