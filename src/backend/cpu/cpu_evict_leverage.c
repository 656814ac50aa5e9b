/* cpu_evict_leverage.c - the approximate-leverage op on the CPU (backend.h evict_leverage): the
 * cached keys rotated back to pre-RoPE keys, centred on their mean, sketched by the caller's Gaussian
 * matrix, their Gram matrix factored by Cholesky (kvpress's jitter schedule) and each row's leverage
 * x^T (G + jI)^-1 x as ||C^-1 x||^2, the factor's inverse applied as a product; plus the per-row sums
 * any z-scoring scorer hands to its cross-head statistics (evict_row_stats) and the affine map it
 * applies after them (evict_affine).
 * Precision: the three products (the sketch X = P phi, the Gram matrix X^T X, X C^-T) are fp32
 * through the GEMM kernels' register tiles (cpu_gemm.h), as kvpress computes them in fp32; the
 * rotation, the mean, the sum of the blocks' Gram matrices, the factor, its inverse and each
 * leverage's sum of squares are in double, rounded to fp32 where a product reads them.
 * Work: the KV heads go through in groups (all of them when their buffers fit in LEV_GROUP_BYTES,
 * else as many as fit, at least LEV_GROUP: the scratch stays bounded whatever the head count); each
 * group's rows are cut into blocks of LEV_BLOCK spread over the backend's pool in three phases
 * (rotation and column sums; centring, sketch and the block's Gram matrix; the solve), with a phase
 * of one unit per head between them (the mean and the packed sketch; the factor and its inverse). Every sum has
 * a fixed order, so the scores are the same bits on any thread count and rank count. The rotary
 * angles are computed once per row for every head at segment 0's positions and kept by the backend
 * for the next call at the same positions (the next layer). Scratch taken once per call from the
 * eviction scratch, not zeroed (every byte read is written first). It does not draw the sketch,
 * normalise across heads or select. */
#include <math.h>
#include <string.h>

#include "cpu_backend.h"
#include "cpu_gemm.h"

#define LEV_MAX_DIM 1024
#define LEV_MAX_K 256
#define LEV_GROUP 2    /* KV heads whose buffers the scratch holds at once, at least */
#define LEV_GROUP_BYTES ((size_t)64 << 20) /* more heads at once while their buffers fit in this */
#define LEV_BLOCK 126  /* rows of a unit of each phase: whole register tiles of the AVX-512 (14) and AVX2 (6) kernels */
#define LEV_ROUND16(x) (((x) + 15) & ~(size_t)15)

typedef struct {
    float *out;
    int ld, row0, n, k, d, g0, nh; /* the group: KV heads g0 .. g0 + nh - 1 */
    const ckv_kv_batch *kv;
    const float *inv_freq, *phi;
    float rope_scale;
    const ckv_gemm_arch *arch;
    float *rot;    // [n, 2 (d/2)] segment 0's rotary cos and sin per row (rope_angles; lev_angles)
    float *pre;    // [group, n, d] the group's pre-RoPE keys
    double *psum;  // [group, nb_rows, d] their column sums per block of rows, then [group, d] means
    float *bphi;   // [group, pk_phi] each head's phi^T packed for the GEMM (ckv_gemm_pack_all)
    float *x;      // [group, n, k] the sketched centred rows X
    float *part;   // [group, nb_rows, k, k] X^T X of each block of rows
    float *bw;     // [group, pk_w] each head's inverse Cholesky factor packed for the GEMM
    float *wk;     // [threads, wk_floats] each worker's block buffers (lev_work_floats)
    double *fac;   // [group, n_fac] each head's G [k, k], C [k, k] and col [k] (factor_units)
    float *tw;     // [group, n_tw] each head's phi^T [k, d], then its C^-1 [k, k] (mean_units, factor_units)
    int *bad;      // [group] 1 where a head's Gram matrix stayed indefinite (factor_units)
    size_t pk_phi, pk_w, wk_floats; /* floats of a packed phi^T and C^-1 (multiples of 16) and of a worker's buffers */
    size_t n_fac, n_tw;            /* doubles and floats of a head's fac and tw (multiples of 16) */
    int nb_rows;   /* blocks of rows per head */
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
        const double c = (double)cs[i], s = (double)cs[half + i], ir = 1.0 / (c * c + s * s);
        x[i] = (float)(((double)y[i] * c + (double)y[i + half] * s) * ir);
        x[i + half] = (float)(((double)y[i + half] * c - (double)y[i] * s) * ir);
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

/* Lower Cholesky factor C of G + jitter I ([k, k], G read from its lower triangle); 0 when not
 * positive definite. */
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

/* W [k, k] = C^-1 in fp32 (zero above the diagonal), column by column in double: W_jj = 1 / C_jj,
 * W_ij = -(sum_{j<=m<i} C_im W_mj) / C_ii for i > j. col [k] is scratch. */
static void invert_lower(const double *C, int k, double *col, float *W) {
    for (int j = 0; j < k; j++) {
        for (int i = 0; i < j; i++) W[(size_t)i * k + j] = 0.0f;
        col[j] = 1.0 / C[(size_t)j * k + j];
        for (int i = j + 1; i < k; i++) {
            double s = 0.0;
            for (int m = j; m < i; m++) s += C[(size_t)i * k + m] * col[m];
            col[i] = -s / C[(size_t)i * k + i];
        }
        for (int i = j; i < k; i++) W[(size_t)i * k + j] = (float)col[i];
    }
}

/* Runs fn over units [0, n) on the backend's pool (inline on one thread). */
static void lev_run(ckv_backend *be, int n, ckv_parallel_fn fn, lev_job *jb) {
    ckv_threadpool *pool = ckv_cpu_pool(be);
    if (pool && ckv_threadpool_size(pool) > 1 && n > 1)
        ckv_threadpool_for(pool, n, 1, fn, jb);
    else
        fn(jb, 0, n, 0);
}

/* A worker's block buffers (floats, 64-byte aligned): the centred rows [LEV_BLOCK, d] (the solve's
 * products [LEV_BLOCK, k] after), the block's X packed as GEMM weights (its X^T, panel by panel of NR
 * rows) and the block's X in the GEMM's packed layout of X^T as weights ([ceil(k / NR), LEV_BLOCK, NR]). */
static size_t lev_work_floats(const ckv_gemm_arch *arch, int d, int k) {
    const size_t rows = (size_t)LEV_BLOCK * (size_t)(d > k ? d : k);
    return LEV_ROUND16(rows) + LEV_ROUND16(ckv_gemm_packed_floats(arch, k, LEV_BLOCK)) +
           LEV_ROUND16(ckv_gemm_packed_floats(arch, LEV_BLOCK, k));
}

/* part [k, k] (rows k apart) = the lower triangle of Xb^T Xb for Xb [nr, k] (rows k apart) by the GEMM
 * kernel's register tiles, the tiles wholly above the diagonal skipped: each element the sum over
 * the rows in panels of NR (the kernel's fp32 sums, added in order). tpk, xpk: worker buffers
 * (lev_work_floats). */
static void gram_block(const ckv_gemm_arch *arch, float *part, const float *xb, int nr, int k, float *tpk, float *xpk) {
    const int NR = arch->nr, MR = arch->mr, nq = (nr + NR - 1) / NR;
    ckv_gemm_pack_all(arch, tpk, xb, k, nr); /* panel q: [k, NR], X^T of rows q NR .. */
    for (int c0 = 0; c0 < k; c0 += NR) { /* panel c0 / NR of X^T as weights: [nr, NR] = X's columns c0 .. */
        const int nc = k - c0 < NR ? k - c0 : NR;
        float *dst = xpk + (size_t)(c0 / NR) * LEV_BLOCK * (size_t)NR;
        for (int t = 0; t < nr; t++) {
            memcpy(dst + (size_t)t * NR, xb + (size_t)t * k + c0, (size_t)nc * sizeof(float));
            memset(dst + (size_t)t * NR + nc, 0, (size_t)(NR - nc) * sizeof(float));
        }
    }
    for (int i0 = 0; i0 < k; i0 += MR) {
        const int mr = k - i0 < MR ? k - i0 : MR;
        for (int c0 = 0; c0 < i0 + mr; c0 += NR)
            for (int q = 0; q < nq; q++)
                arch->ukernel(nr - q * NR < NR ? nr - q * NR : NR, tpk + ((size_t)q * k + (size_t)i0) * (size_t)NR,
                              (size_t)NR, mr, xpk + ((size_t)(c0 / NR) * LEV_BLOCK + (size_t)q * NR) * (size_t)NR,
                              part + (size_t)i0 * k + c0, (size_t)k, k - c0 < NR ? k - c0 : NR, NULL, q == 0);
    }
}

/* yb [nr, k] = xb [nr, k] @ W^T for W [k, k] lower triangular, packed in bw (ckv_gemm_pack_all): each
 * panel of columns c0 .. c0 + NR - 1 sums only the first min(k, c0 + NR) entries of each row (the
 * rest of its row of W is zero), one register tile at a time. */
static void solve_block(const ckv_gemm_arch *arch, float *yb, const float *xb, int nr, int k, const float *bw) {
    const int NR = arch->nr, MR = arch->mr;
    for (int c0 = 0; c0 < k; c0 += NR)
        for (int i = 0; i < nr; i += MR)
            arch->ukernel(k < c0 + NR ? k : c0 + NR, xb + (size_t)i * k, (size_t)k, nr - i < MR ? nr - i : MR,
                          bw + (size_t)c0 * (size_t)k, yb + (size_t)i * k + c0, (size_t)k, k - c0 < NR ? k - c0 : NR,
                          NULL, 1);
}

/* Unit (g, block): the block's rows of the group's head g rotated back to pre-RoPE keys, and their
 * column sums (double, rows ascending). */
static void rotate_units(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const lev_job *jb = ctx;
    const int d = jb->d;
    for (int u = begin; u < end; u++) {
        const int g = u / jb->nb_rows, b = u % jb->nb_rows, t0 = b * LEV_BLOCK;
        const int nr = jb->n - t0 < LEV_BLOCK ? jb->n - t0 : LEV_BLOCK;
        float *pre = jb->pre + ((size_t)g * (size_t)jb->n + (size_t)t0) * (size_t)d;
        prerope_rows(jb, jb->g0 + g, t0, nr, pre);
        double *sum = jb->psum + ((size_t)g * (size_t)jb->nb_rows + (size_t)b) * (size_t)d;
        for (int a = 0; a < d; a++) sum[a] = 0.0;
        for (int t = 0; t < nr; t++)
            for (int a = 0; a < d; a++) sum[a] += (double)pre[(size_t)t * d + a];
    }
}

/* Unit (g, block): the block's rows of the group's head g centred on the head's mean (rounded to
 * fp32), sketched (X rows = the GEMM of them and phi^T) and the lower triangle of the block's X^T X
 * (gram_block). */
static void sketch_units(void *ctx, int begin, int end, int tid) {
    const lev_job *jb = ctx;
    const int n = jb->n, d = jb->d, k = jb->k;
    float *cb = jb->wk + (size_t)tid * jb->wk_floats;
    float *tpk = cb + LEV_ROUND16((size_t)LEV_BLOCK * (size_t)(d > k ? d : k));
    float *xpk = tpk + LEV_ROUND16(ckv_gemm_packed_floats(jb->arch, k, LEV_BLOCK));
    for (int u = begin; u < end; u++) {
        const int g = u / jb->nb_rows, b = u % jb->nb_rows, t0 = b * LEV_BLOCK;
        const int nr = n - t0 < LEV_BLOCK ? n - t0 : LEV_BLOCK;
        const float *pre = jb->pre + ((size_t)g * (size_t)n + (size_t)t0) * (size_t)d;
        const double *mean = jb->psum + (size_t)g * (size_t)jb->nb_rows * (size_t)d;
        for (int t = 0; t < nr; t++)
            for (int a = 0; a < d; a++) cb[(size_t)t * d + a] = (float)((double)pre[(size_t)t * d + a] - mean[a]);
        float *x = jb->x + ((size_t)g * (size_t)n + (size_t)t0) * (size_t)k;
        ckv_gemm_packed_rows(jb->arch, x, (size_t)k, cb, (size_t)d, jb->bphi + (size_t)g * jb->pk_phi, nr, d, k);
        gram_block(jb->arch, jb->part + ((size_t)g * (size_t)jb->nb_rows + (size_t)b) * (size_t)k * (size_t)k, x, nr, k,
                   tpk, xpk);
    }
}

/* sum_j y_j^2 in double over y [k]: 8 lanes (lane j % 8, j ascending), then the lanes in order. */
static double lev_sumsq(const float *y, int k) {
    double lane[8] = {0.0};
    int j = 0;
    for (; j + 8 <= k; j += 8)
        for (int l = 0; l < 8; l++) lane[l] += (double)y[j + l] * (double)y[j + l];
    for (int l = 0; j < k; j++, l++) lane[l] += (double)y[j] * (double)y[j];
    double s = 0.0;
    for (int l = 0; l < 8; l++) s += lane[l];
    return s;
}

/* Unit (g, block): out[t] = ||C^-1 x_t||^2 (lev_sumsq)
 * for the block's rows of the group's head g: the rows of X times the packed C^-1 (every entry the
 * GEMM kernel's fp32 sum) into the worker's buffer. */
static void solve_units(void *ctx, int begin, int end, int tid) {
    const lev_job *jb = ctx;
    const int n = jb->n, k = jb->k;
    float *yb = jb->wk + (size_t)tid * jb->wk_floats;
    for (int u = begin; u < end; u++) {
        const int g = u / jb->nb_rows, t0 = (u % jb->nb_rows) * LEV_BLOCK;
        const int nr = n - t0 < LEV_BLOCK ? n - t0 : LEV_BLOCK;
        const float *x = jb->x + ((size_t)g * (size_t)n + (size_t)t0) * (size_t)k;
        solve_block(jb->arch, yb, x, nr, k, jb->bw + (size_t)g * jb->pk_w);
        float *dst = jb->out + (size_t)(jb->g0 + g) * (size_t)jb->ld + t0;
        for (int t = 0; t < nr; t++) dst[t] = (float)lev_sumsq(yb + (size_t)t * k, k);
    }
}

/* Unit (g): head g's mean (its block sums added in block order, over n) into psum's first d
 * entries for the head, and its phi^T packed (through tw). */
static void mean_units(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const lev_job *jb = ctx;
    const int d = jb->d, k = jb->k, nb = jb->nb_rows;
    for (int g = begin; g < end; g++) {
        float *pt = jb->tw + (size_t)g * jb->n_tw;
        double *ps = jb->psum + (size_t)g * (size_t)nb * (size_t)d;
        for (int b = 1; b < nb; b++)
            for (int a = 0; a < d; a++) ps[a] += ps[(size_t)b * d + a];
        for (int a = 0; a < d; a++) ps[a] /= (double)jb->n;
        const float *phi = jb->phi + (size_t)(jb->g0 + g) * (size_t)d * (size_t)k;
        for (int a = 0; a < d; a++)
            for (int j = 0; j < k; j++) pt[(size_t)j * d + a] = phi[(size_t)a * k + j];
        ckv_gemm_pack_all(jb->arch, jb->bphi + (size_t)g * jb->pk_phi, pt, d, k);
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

/* Unit (g): head g's Gram matrix (its block parts added in double in block order), its Cholesky
 * factor (kvpress's jitter schedule: 1e-2, then x10 up to 100), inverted and packed for the solve's
 * GEMM; bad[g] = 1 when no jitter made it positive definite. */
static void factor_units(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const lev_job *jb = ctx;
    const int k = jb->k, nb = jb->nb_rows;
    const size_t kk = (size_t)k * (size_t)k;
    for (int g = begin; g < end; g++) {
        double *G = jb->fac + (size_t)g * jb->n_fac, *C = G + kk, *col = C + kk;
        float *W = jb->tw + (size_t)g * jb->n_tw;
        const float *part = jb->part + (size_t)g * (size_t)nb * kk;
        for (size_t e = 0; e < kk; e++) G[e] = 0.0;
        for (int b = 0; b < nb; b++)
            for (int i = 0; i < k; i++)
                for (int j = 0; j <= i; j++) G[(size_t)i * k + j] += (double)part[(size_t)b * kk + (size_t)i * k + j];
        double jitter = 1e-2;
        int ok = 0;
        for (int tries = 0; tries < 5 && !(ok = cholesky(G, jitter, k, C)); tries++) jitter *= 10.0;
        jb->bad[g] = !ok;
        if (!ok) continue;
        invert_lower(C, k, col, W);
        ckv_gemm_pack_all(jb->arch, jb->bw + (size_t)g * jb->pk_w, W, k, k);
    }
}

ckv_status ckv_cpu_evict_leverage(ckv_backend *be, float *out, int ld, double *stats, const ckv_kv_batch *kv, int row0,
                                  int n, const float *inv_freq, float rope_scale, const float *phi, int k) {
    const int d = kv->head_dim, H = kv->n_kv_heads;
    if (d < 2 || d > LEV_MAX_DIM || k < 1 || k > LEV_MAX_K)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "evict_leverage: head_dim %d outside 2..%d or sketch %d outside 1..%d",
                         d, LEV_MAX_DIM, k, LEV_MAX_K);
    if (n < 1 || row0 < 0) return ckv_error(CKV_STATUS_ERR_ARG, "evict_leverage: %d rows from row %d", n, row0);
    if (H < 1) return CKV_STATUS_OK;
    ckv_threadpool *pool = ckv_cpu_pool(be);
    const ckv_gemm_arch *arch = ckv_gemm_best_arch();
    const size_t nn = (size_t)n, dd = (size_t)d, kk = (size_t)k, nb = (size_t)ckv_cpu_blocks(nn, LEV_BLOCK);
    const size_t threads = (size_t)(pool ? ckv_threadpool_size(pool) : 1), wk = lev_work_floats(arch, d, k);
    const size_t pk_phi = LEV_ROUND16(ckv_gemm_packed_floats(arch, d, k)), pk_w = LEV_ROUND16(ckv_gemm_packed_floats(arch, k, k));
    const size_t n_fac = LEV_ROUND16(2 * kk * kk + kk), n_tw = LEV_ROUND16(kk * (kk > dd ? kk : dd));
    /* a head's share of the scratch, in bytes: its pre-RoPE keys, X, the block parts, the block sums */
    const size_t head_b = (nn * dd + nn * kk + nb * kk * kk) * sizeof(float) + nb * dd * sizeof(double);
    size_t gh = LEV_GROUP_BYTES / head_b;
    gh = gh < LEV_GROUP ? LEV_GROUP : gh;
    gh = gh > (size_t)H ? (size_t)H : gh;
    const size_t n_psum = LEV_ROUND16(gh * nb * dd), n_dbl = gh * n_fac, n_bad = LEV_ROUND16(gh); /* doubles first: aligned */
    const size_t n_pre = LEV_ROUND16(gh * nn * dd), n_x = LEV_ROUND16(gh * nn * kk), n_part = LEV_ROUND16(gh * nb * kk * kk);
    const size_t floats = n_pre + n_x + n_part + gh * (pk_phi + pk_w + n_tw) + threads * wk;
    double *ws = NULL;
    CKV_TRY(ckv_cpu_evict_scratch_raw(be, (n_psum + n_dbl + n_bad) * sizeof(double) + floats * sizeof(float), (void **)&ws));
    float *fs = (float *)(void *)(ws + n_psum + n_dbl + n_bad);
    lev_job jb = {.out = out, .ld = ld, .row0 = row0, .n = n, .k = k, .d = d, .kv = kv, .inv_freq = inv_freq,
                  .phi = phi, .rope_scale = rope_scale, .arch = arch, .psum = ws, .fac = ws + n_psum,
                  .bad = (int *)(void *)(ws + n_psum + n_dbl), .pre = fs, .x = fs + n_pre, .part = fs + n_pre + n_x,
                  .bphi = fs + n_pre + n_x + n_part, .bw = fs + n_pre + n_x + n_part + gh * pk_phi,
                  .tw = fs + n_pre + n_x + n_part + gh * (pk_phi + pk_w),
                  .wk = fs + n_pre + n_x + n_part + gh * (pk_phi + pk_w + n_tw), .pk_phi = pk_phi, .pk_w = pk_w,
                  .wk_floats = wk, .n_fac = n_fac, .n_tw = n_tw, .nb_rows = (int)nb};
    CKV_TRY(lev_angles(be, &jb));
    for (int g0 = 0; g0 < H; g0 += (int)gh) {
        jb.g0 = g0;
        jb.nh = H - g0 < (int)gh ? H - g0 : (int)gh;
        lev_run(be, jb.nh * jb.nb_rows, rotate_units, &jb);
        lev_run(be, jb.nh, mean_units, &jb);
        lev_run(be, jb.nh * jb.nb_rows, sketch_units, &jb);
        lev_run(be, jb.nh, factor_units, &jb);
        for (int g = 0; g < jb.nh; g++)
            if (jb.bad[g])
                return ckv_error(CKV_STATUS_ERR_NUMERIC, "evict_leverage: the sketched Gram matrix of KV head %d is "
                                 "not positive definite even with jitter 100", g0 + g);
        lev_run(be, jb.nh * jb.nb_rows, solve_units, &jb);
    }
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
