/* cpu_ops.c - the CPU backend's element-wise and row-wise kernels: embedding gather, RMSNorm, RoPE,
 * SwiGLU, residual add and the non-finite count. Loops are written to auto-vectorise and run
 * on the backend's thread pool when large enough to pay for it. Matmul and attention are elsewhere
 * (cpu_matmul.c, cpu_attention.c); nothing here allocates. */
#include <math.h>

#include "core/quant.h"
#include "cpu_backend.h"

/* Elements per parallel work item of the element-wise ops: below this, one thread is faster. */
#define CKV_CPU_ELEMWISE_BLOCK 16384
/* Roughly how many elements a row-wise work item should cover before threading pays. */
#define CKV_CPU_ROW_WORK 16384

static int ckv_cpu_row_grain(size_t per_row) {
    size_t g = per_row ? CKV_CPU_ROW_WORK / per_row : 1;
    return g < 1 ? 1 : (int)g;
}

/* ---- embedding ------------------------------------------------------------------------------- */

void ckv_cpu_embedding(ckv_backend *be, float *out, const ckv_weight *table, const int32_t *ids, int n) {
    (void)be;
    const size_t dim = (size_t)table->cols;
    for (int i = 0; i < n; i++) { // out [dim] <- row ids[i] of the table, widened to fp32
        const char *row = (const char *)table->data + (size_t)ids[i] * table->row_bytes;
        ckv_dequant_row(table->dtype, row, out + (size_t)i * dim, dim);
    }
}

/* ---- rmsnorm --------------------------------------------------------------------------------- */

typedef struct {
    float *out;     // [n, dim]
    const float *x; // [n, dim]
    const float *w; // [dim]
    int dim;
    float eps;
} ckv_rmsnorm_job;

/* Sum of squares in double: each square is exact in double and the sum carries ~29 more bits than
 * fp32 needs, so the mean rounded to fp32 is (near-ties aside) the correctly rounded value whatever
 * dim, lane split or thread count. torch reduces in fp32 with a cascade sum that is nearly as
 * accurate, so the two agree to the last bit or one ulp, while a plain fp32 running sum would drift
 * by up to dim/2 ulp at dim 8192. Eight independent lanes let the compiler vectorise it; the cost is
 * negligible next to the matmuls around it. */
static double ckv_cpu_sum_squares(const float *x, int dim) {
    double acc[8] = {0};
    int j = 0;
    for (; j + 8 <= dim; j += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)x[j + l] * (double)x[j + l];
    double tail = 0.0;
    for (; j < dim; j++) tail += (double)x[j] * (double)x[j];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

static void ckv_cpu_scale_row(float *restrict out, const float *restrict x, const float *restrict w, float r,
                              int dim) {
    for (int j = 0; j < dim; j++) out[j] = w[j] * (x[j] * r);
}

static void ckv_cpu_scale_row_inplace(float *restrict x, const float *restrict w, float r, int dim) {
    for (int j = 0; j < dim; j++) x[j] = w[j] * (x[j] * r);
}

static void ckv_cpu_rmsnorm_rows(void *arg, int begin, int end, int tid) {
    (void)tid;
    const ckv_rmsnorm_job *job = arg;
    const int dim = job->dim;
    for (int i = begin; i < end; i++) {
        const float *x = job->x + (size_t)i * (size_t)dim; // [dim]
        float *out = job->out + (size_t)i * (size_t)dim;   // [dim]
        /* as HF: variance in fp32, x * rsqrt(variance + eps), then weight * that */
        float ms = (float)(ckv_cpu_sum_squares(x, dim) / (double)dim);
        float r = 1.0f / sqrtf(ms + job->eps);
        if (out == x)
            ckv_cpu_scale_row_inplace(out, job->w, r, dim);
        else
            ckv_cpu_scale_row(out, x, job->w, r, dim);
    }
}

void ckv_cpu_rmsnorm(ckv_backend *be, float *out, const float *x, const float *w, int n, int dim, float eps) {
    if (n <= 0 || dim <= 0) return;
    ckv_rmsnorm_job job = {out, x, w, dim, eps};
    ckv_threadpool_for(ckv_cpu_pool(be), n, ckv_cpu_row_grain((size_t)dim), ckv_cpu_rmsnorm_rows, &job);
}

/* ---- rope ------------------------------------------------------------------------------------ */

/* Rotation pairs whose cos/sin are computed at once (stack arrays; any head_dim works). */
#define CKV_ROPE_PAIRS 64

typedef struct {
    float *x;             // [n, n_heads, hd]
    const int32_t *pos;   // [n]
    const float *inv_freq; // [hd / 2]
    int n_heads, hd;
    float attn_scale;
} ckv_rope_job;

/* (a, b) <- (a cos - b sin, b cos + a sin) for one head's pairs [i0, i0 + np) */
static void ckv_cpu_rotate(float *restrict x1, float *restrict x2, const float *restrict c, const float *restrict s,
                           int np) {
    for (int i = 0; i < np; i++) {
        float a = x1[i], b = x2[i];
        x1[i] = a * c[i] - b * s[i];
        x2[i] = b * c[i] + a * s[i];
    }
}

static void ckv_cpu_rope_tokens(void *arg, int begin, int end, int tid) {
    (void)tid;
    const ckv_rope_job *job = arg;
    const int hd = job->hd, half = hd / 2;
    float c[CKV_ROPE_PAIRS], s[CKV_ROPE_PAIRS]; // [np]
    for (int t = begin; t < end; t++) {
        const float p = (float)job->pos[t];
        float *xt = job->x + (size_t)t * (size_t)job->n_heads * (size_t)hd; // [n_heads, hd]
        for (int i0 = 0; i0 < half; i0 += CKV_ROPE_PAIRS) {
            int np = half - i0 < CKV_ROPE_PAIRS ? half - i0 : CKV_ROPE_PAIRS;
            for (int i = 0; i < np; i++) {
                float angle = p * job->inv_freq[i0 + i]; /* fp32, as HF */
                c[i] = cosf(angle) * job->attn_scale;
                s[i] = sinf(angle) * job->attn_scale;
            }
            for (int h = 0; h < job->n_heads; h++) {
                float *x1 = xt + (size_t)h * (size_t)hd + i0;
                ckv_cpu_rotate(x1, x1 + half, c, s, np);
            }
        }
    }
}

void ckv_cpu_rope(ckv_backend *be, float *x, const int32_t *pos, int n, int n_heads, int hd, const float *inv_freq,
                  float attn_scale) {
    if (n <= 0 || n_heads <= 0 || hd < 2) return;
    ckv_rope_job job = {x, pos, inv_freq, n_heads, hd, attn_scale};
    ckv_threadpool_for(ckv_cpu_pool(be), n, ckv_cpu_row_grain((size_t)n_heads * (size_t)hd), ckv_cpu_rope_tokens,
                       &job);
}

/* ---- swiglu ---------------------------------------------------------------------------------- */

typedef struct {
    float *out;        // [n]
    const float *gate; // [n]
    const float *up;   // [n]
    size_t n;
} ckv_swiglu_job;

/* silu(g) * u = g / (1 + e^-g) * u, as torch computes silu in fp32 */
static void ckv_cpu_swiglu_span(float *restrict out, const float *restrict gate, const float *restrict up,
                                size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        out[i] = g / (1.0f + ckv_cpu_expf(-g)) * up[i];
    }
}

static void ckv_cpu_swiglu_span_inplace(float *restrict gate, const float *restrict up, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i];
        gate[i] = g / (1.0f + ckv_cpu_expf(-g)) * up[i];
    }
}

static void ckv_cpu_swiglu_blocks(void *arg, int begin, int end, int tid) {
    (void)tid;
    const ckv_swiglu_job *job = arg;
    size_t lo = (size_t)begin * CKV_CPU_ELEMWISE_BLOCK, hi = (size_t)end * CKV_CPU_ELEMWISE_BLOCK;
    if (hi > job->n) hi = job->n;
    if (job->out == job->gate)
        ckv_cpu_swiglu_span_inplace(job->out + lo, job->up + lo, hi - lo);
    else
        ckv_cpu_swiglu_span(job->out + lo, job->gate + lo, job->up + lo, hi - lo);
}

void ckv_cpu_swiglu(ckv_backend *be, float *out, const float *gate, const float *up, size_t n) {
    if (n == 0) return;
    ckv_swiglu_job job = {out, gate, up, n};
    ckv_threadpool_for(ckv_cpu_pool(be), ckv_cpu_blocks(n, CKV_CPU_ELEMWISE_BLOCK), 1, ckv_cpu_swiglu_blocks, &job);
}

/* ---- add ------------------------------------------------------------------------------------- */

typedef struct {
    float *x;       // [n]
    const float *y; // [n]
    size_t n;
} ckv_add_job;

static void ckv_cpu_add_span(float *restrict x, const float *restrict y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

static void ckv_cpu_add_blocks(void *arg, int begin, int end, int tid) {
    (void)tid;
    const ckv_add_job *job = arg;
    size_t lo = (size_t)begin * CKV_CPU_ELEMWISE_BLOCK, hi = (size_t)end * CKV_CPU_ELEMWISE_BLOCK;
    if (hi > job->n) hi = job->n;
    if (job->x == job->y) {
        for (size_t i = lo; i < hi; i++) job->x[i] += job->x[i];
    } else {
        ckv_cpu_add_span(job->x + lo, job->y + lo, hi - lo);
    }
}

void ckv_cpu_add(ckv_backend *be, float *x, const float *y, size_t n) {
    if (n == 0) return;
    ckv_add_job job = {x, y, n};
    ckv_threadpool_for(ckv_cpu_pool(be), ckv_cpu_blocks(n, CKV_CPU_ELEMWISE_BLOCK), 1, ckv_cpu_add_blocks, &job);
}

/* ---- count_nonfinite --------------------------------------------------------------------------- */

ckv_status ckv_cpu_count_nonfinite(ckv_backend *be, const float *x, size_t n, size_t *n_bad) {
    (void)be;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !isfinite(x[i]);
    *n_bad = bad;
    return CKV_STATUS_OK;
}
