/* cpu_gemm.c - ckv's own fp32 matrix multiply out[n, m] = x[n, k] @ w[m, k]^T (+ bias), the driver
 * around the kernel sets of cpu_gemm_avx512.c / cpu_gemm_avx2.c and the portable set defined here.
 *
 * Several tokens (n > 1): the columns of out are cut into panels of NR weight rows, and the panels
 * into groups whose slice of out fits in L2 (with fewer panels than threads, the rows are cut too);
 * the pool's threads claim groups one at a time. For each block of CKV_GEMM_KC along k, a thread
 * packs one panel of its group at a time into a k-major stack buffer (CKV_GEMM_KC x NR floats,
 * L1-sized) and runs the MR x NR micro-kernel down its rows of x, read in place. The first k block
 * writes out (with the bias), later ones add to it, so every output element is the same sum
 * in the same order whatever the thread count and whichever thread computed it.
 * One token (n == 1): a GEMV streaming each weight row once, the rows split into contiguous blocks
 * over the threads (memory-bound: it runs at memory bandwidth).
 *
 * The kernel set is chosen once by the CPU's features (AVX-512, else AVX2 + FMA, else portable C).
 * Nothing here allocates or fails; weights are used as loaded (no layout change, nothing cached), fp32
 * only, read from an fp32 matrix or produced panel by panel by the caller (ckv_cpu_gemm_wsrc: the
 * stored-format matmul dequantises its blocks into each panel). */
#include "cpu_gemm.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* ---- portable kernel set (any compiler, any CPU): 4 x 16 tiles, loops the compiler vectorises ----- */

#define CKV_GEN_MR 4
#define CKV_GEN_NR 16

static void ckv_gen_ukernel(int kc, const float *a, size_t lda, int mr, const float *bp, float *c, size_t ldc, int nr,
                            const float *bias, int first) {
    float acc[CKV_GEN_MR][CKV_GEN_NR];
    memset(acc, 0, sizeof acc);
    const float *ar[CKV_GEN_MR];
    for (int r = 0; r < CKV_GEN_MR; r++) ar[r] = a + (size_t)(r < mr ? r : 0) * lda;
    for (int p = 0; p < kc; p++) {
        const float *b = bp + (size_t)p * CKV_GEN_NR;
        for (int r = 0; r < CKV_GEN_MR; r++) {
            const float av = ar[r][p];
            for (int j = 0; j < CKV_GEN_NR; j++) acc[r][j] += av * b[j];
        }
    }
    for (int r = 0; r < mr; r++) {
        float *cr = c + (size_t)r * ldc;
        if (first)
            for (int j = 0; j < nr; j++) cr[j] = acc[r][j] + (bias ? bias[j] : 0.0f);
        else
            for (int j = 0; j < nr; j++) cr[j] += acc[r][j];
    }
}

static void ckv_gen_pack(int kc, const float *w, size_t ldw, int nr, float *bp) {
    for (int j = 0; j < CKV_GEN_NR; j++) {
        float *dst = bp + j;
        if (j < nr) {
            const float *wr = w + (size_t)j * ldw;
            for (int p = 0; p < kc; p++) dst[(size_t)p * CKV_GEN_NR] = wr[p];
        } else {
            for (int p = 0; p < kc; p++) dst[(size_t)p * CKV_GEN_NR] = 0.0f;
        }
    }
}

static void ckv_gen_gemv(int rows, int k, const float *w, size_t ldw, const float *x, const float *bias, float *out) {
    for (int j = 0; j < rows; j++) {
        const float *wr = w + (size_t)j * ldw;
        float acc[16] = {0};
        int p = 0;
        for (; p + 16 <= k; p += 16)
            for (int l = 0; l < 16; l++) acc[l] += wr[p + l] * x[p + l];
        for (int l = 0; p < k; p++, l++) acc[l] += wr[p] * x[p];
        for (int h = 8; h > 0; h >>= 1)
            for (int l = 0; l < h; l++) acc[l] += acc[l + h];
        out[j] = acc[0] + (bias ? bias[j] : 0.0f);
    }
}

const ckv_gemm_arch ckv_gemm_arch_generic = {
    .name = "generic", .mr = CKV_GEN_MR, .nr = CKV_GEN_NR, .ukernel = ckv_gen_ukernel, .pack = ckv_gen_pack,
    .gemv = ckv_gen_gemv};

_Static_assert(CKV_GEN_NR <= CKV_GEMM_NR_MAX && CKV_GEN_MR <= CKV_GEMM_MR_MAX, "generic tile within the maxima");

/* ---- kernel choice ------------------------------------------------------------------------------ */

static _Atomic(const ckv_gemm_arch *) ckv_gemm_chosen;

const ckv_gemm_arch *ckv_gemm_best_arch(void) {
    const ckv_gemm_arch *a = atomic_load_explicit(&ckv_gemm_chosen, memory_order_acquire);
    if (a) return a;
    /* racing first calls all compute the same answer */
    if (ckv_gemm_avx512_supported())
        a = &ckv_gemm_arch_avx512;
    else if (ckv_gemm_avx2_supported())
        a = &ckv_gemm_arch_avx2;
    else
        a = &ckv_gemm_arch_generic;
    atomic_store_explicit(&ckv_gemm_chosen, a, memory_order_release);
    return a;
}

/* ---- several tokens --------------------------------------------------------------------------- */

#ifndef CKV_GEMM_MC
#define CKV_GEMM_MC 512 /* most rows of x per work item: x [MC, KC] is 512 KiB, in L2 */
#endif
#ifndef CKV_GEMM_OUT_BYTES
#define CKV_GEMM_OUT_BYTES (512u * 1024u) /* slice of out a worker keeps in L2 across the k blocks */
#endif

typedef struct {
    const ckv_gemm_arch *arch;
    float *out;        // [n, m]
    const float *x;    // [n, k]
    const float *w;    // [m, k], or NULL when wsrc produces the panels
    const ckv_gemm_wsrc *wsrc;
    const float *bias; // [m] or NULL
    int n, k, m;
    int panels;       /* column panels of NR */
    int groups;       /* the panels are cut into this many groups (work items per row part) */
    int row_parts;    /* the rows are cut into this many parts (more than 1 only with few panels) */
    int n_items;      /* row_parts * groups */
    atomic_int next;  /* next work item to claim */
} ckv_gemm_job;

/* Start of part `i` of `parts` over `total` units: contiguous, sizes differing by at most one. */
static int ckv_gemm_split(int total, int parts, int i) { return (int)(((long long)total * i) / parts); }

/* One work item: rows [r0, r1) of out times panels [q0, q1). Loops: k block, panel, row tile. The rows
 * x k-block slice of x that the micro-kernel reads stays in this core's L2 cache while the item's
 * panels pass over it, the item's slice of out (about CKV_GEMM_OUT_BYTES) stays in L2 while the k
 * blocks pass, and the packed panel stays in L1 while the rows pass. */
static void ckv_gemm_block(const ckv_gemm_job *job, int r0, int r1, int q0, int q1) {
    const ckv_gemm_arch *a = job->arch;
    const size_t k = (size_t)job->k, m = (size_t)job->m;
    _Alignas(64) float bp[CKV_GEMM_KC * CKV_GEMM_NR_MAX]; /* the packed panel, [kc, NR] */
    _Alignas(64) float wp[CKV_GEMM_KC * CKV_GEMM_NR_MAX]; /* a panel produced by wsrc, [nr, kc] */
    for (int p0 = 0; p0 < job->k; p0 += CKV_GEMM_KC) {
        const int kc = job->k - p0 < CKV_GEMM_KC ? job->k - p0 : CKV_GEMM_KC;
        for (int q = q0; q < q1; q++) {
            const int j0 = q * a->nr, nr = job->m - j0 < a->nr ? job->m - j0 : a->nr;
            if (job->wsrc) {
                job->wsrc->rows(job->wsrc->ctx, j0, nr, p0, kc, wp);
                a->pack(kc, wp, (size_t)kc, nr, bp);
            } else {
                a->pack(kc, job->w + (size_t)j0 * k + (size_t)p0, k, nr, bp);
            }
            const float *bias = job->bias ? job->bias + j0 : NULL;
            for (int i = r0; i < r1; i += a->mr) {
                const int mr = r1 - i < a->mr ? r1 - i : a->mr;
                a->ukernel(kc, job->x + (size_t)i * k + (size_t)p0, k, mr, bp, job->out + (size_t)i * m + (size_t)j0,
                           m, nr, bias, p0 == 0);
            }
        }
    }
}

/* Workers claim items until none is left: a core slowed by something else takes fewer. */
static void ckv_gemm_worker(void *arg, int begin, int end, int tid) {
    (void)begin, (void)end, (void)tid;
    ckv_gemm_job *job = arg;
    const int mr = job->arch->mr, row_tiles = (job->n + mr - 1) / mr;
    for (;;) {
        const int item = atomic_fetch_add_explicit(&job->next, 1, memory_order_relaxed);
        if (item >= job->n_items) break;
        const int rp = item / job->groups, g = item % job->groups;
        const int r0 = ckv_gemm_split(row_tiles, job->row_parts, rp) * mr;
        int r1 = ckv_gemm_split(row_tiles, job->row_parts, rp + 1) * mr;
        if (r1 > job->n) r1 = job->n;
        const int q0 = ckv_gemm_split(job->panels, job->groups, g);
        const int q1 = ckv_gemm_split(job->panels, job->groups, g + 1);
        if (r1 > r0 && q1 > q0) ckv_gemm_block(job, r0, r1, q0, q1);
    }
}

/* ---- one token ---------------------------------------------------------------------------------- */

#define CKV_GEMV_ROWS 64 /* weight rows per work item */

typedef struct {
    const ckv_gemm_arch *arch;
    float *out;
    const float *x, *w, *bias;
    int k, m;
} ckv_gemv_job;

static void ckv_gemv_worker(void *arg, int begin, int end, int tid) {
    (void)tid;
    const ckv_gemv_job *job = arg;
    const int j0 = begin * CKV_GEMV_ROWS;
    const int j1 = end * CKV_GEMV_ROWS < job->m ? end * CKV_GEMV_ROWS : job->m;
    job->arch->gemv(j1 - j0, job->k, job->w + (size_t)j0 * (size_t)job->k, (size_t)job->k, job->x,
                    job->bias ? job->bias + j0 : NULL, job->out + j0);
}

/* ---- weights packed once ------------------------------------------------------------------------ */

size_t ckv_gemm_packed_floats(const ckv_gemm_arch *arch, int k, int m) {
    if (!arch) arch = ckv_gemm_best_arch();
    return (size_t)((m + arch->nr - 1) / arch->nr) * (size_t)k * (size_t)arch->nr;
}

void ckv_gemm_pack_all(const ckv_gemm_arch *arch, float *bp, const float *w, int k, int m) {
    const size_t panel = (size_t)k * (size_t)arch->nr;
    for (int q = 0, j0 = 0; j0 < m; q++, j0 += arch->nr)
        arch->pack(k, w + (size_t)j0 * (size_t)k, (size_t)k, m - j0 < arch->nr ? m - j0 : arch->nr, bp + q * panel);
}

/* The register tile at rows [i, i + mr) and panel q (columns j0 .. j0 + nr) into c (rows ldc apart):
 * the k blocks in order, the first writing, as ckv_gemm_block forms it. */
static void ckv_gemm_packed_tile(const ckv_gemm_arch *a, float *c, size_t ldc, const float *x, size_t ldx,
                                 const float *bpq, int mr, int nr, int k) {
    for (int p0 = 0; p0 < k; p0 += CKV_GEMM_KC) {
        const int kc = k - p0 < CKV_GEMM_KC ? k - p0 : CKV_GEMM_KC;
        a->ukernel(kc, x + p0, ldx, mr, bpq + (size_t)p0 * (size_t)a->nr, c, ldc, nr, NULL, p0 == 0);
    }
}

void ckv_gemm_packed_rows(const ckv_gemm_arch *arch, float *out, size_t ldo, const float *x, size_t ldx,
                          const float *bp, int n, int k, int m) {
    const size_t panel = (size_t)k * (size_t)arch->nr;
    for (int q = 0, j0 = 0; j0 < m; q++, j0 += arch->nr) { /* the panel stays in L1 while the rows pass */
        const int nr = m - j0 < arch->nr ? m - j0 : arch->nr;
        for (int i = 0; i < n; i += arch->mr)
            ckv_gemm_packed_tile(arch, out + (size_t)i * ldo + (size_t)j0, ldo, x + (size_t)i * ldx, ldx,
                                 bp + q * panel, n - i < arch->mr ? n - i : arch->mr, nr, k);
    }
}

void ckv_gemm_packed_l1(const ckv_gemm_arch *arch, float *lanes, float *tail, const float *x, size_t ldx,
                        const float *bp, int n, int k, int m) {
    _Alignas(64) float c[CKV_GEMM_MR_MAX * CKV_GEMM_NR_MAX]; /* one register tile, [MR, NR] */
    const size_t panel = (size_t)k * (size_t)arch->nr;
    const int full = m - m % 16;
    for (int i = 0; i < n; i += arch->mr) { /* the tile's rows of x stay in L1 while the panels pass */
        const int mr = n - i < arch->mr ? n - i : arch->mr;
        for (int q = 0, j0 = 0; j0 < m; q++, j0 += arch->nr) {
            const int nr = m - j0 < arch->nr ? m - j0 : arch->nr;
            ckv_gemm_packed_tile(arch, c, (size_t)arch->nr, x + (size_t)i * ldx, ldx, bp + q * panel, mr, nr, k);
            for (int r = 0; r < mr; r++) {
                float *restrict ln = lanes + (size_t)(i + r) * 16;
                const float *cr = c + (size_t)r * (size_t)arch->nr;
                int cc = 0;
                for (; cc + 16 <= nr && j0 + cc + 16 <= full; cc += 16) /* NR is a multiple of 16 */
                    for (int l = 0; l < 16; l++) ln[l] += fabsf(cr[cc + l]);
                for (; cc < nr; cc++) tail[(size_t)(i + r) * 15 + (size_t)(j0 + cc - full)] = fabsf(cr[cc]);
            }
        }
    }
}

/* ---- entry -------------------------------------------------------------------------------------- */

static void ckv_gemm_run(ckv_threadpool *pool, const ckv_gemm_arch *arch, float *out, const float *x, const float *w,
                         const ckv_gemm_wsrc *wsrc, const float *bias, int n, int k, int m);

/* out [n, m] = bias (or 0): the product over k = 0. */
static void ckv_gemm_empty(float *out, const float *bias, int n, int m) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) out[(size_t)i * (size_t)m + (size_t)j] = bias ? bias[j] : 0.0f;
}

void ckv_cpu_gemm(ckv_threadpool *pool, const ckv_gemm_arch *arch, float *out, const float *x, const float *w,
                  const float *bias, int n, int k, int m) {
    if (n <= 0 || m <= 0) return;
    if (!arch) arch = ckv_gemm_best_arch();
    if (k <= 0) { /* an empty sum */
        ckv_gemm_empty(out, bias, n, m);
        return;
    }
    if (n == 1) {
        ckv_gemv_job job = {.arch = arch, .out = out, .x = x, .w = w, .bias = bias, .k = k, .m = m};
        const int items = (m + CKV_GEMV_ROWS - 1) / CKV_GEMV_ROWS;
        ckv_threadpool_for(pool, items, 1, ckv_gemv_worker, &job);
        return;
    }
    ckv_gemm_run(pool, arch, out, x, w, NULL, bias, n, k, m);
}

void ckv_cpu_gemm_wsrc(ckv_threadpool *pool, const ckv_gemm_arch *arch, float *out, const float *x,
                       const ckv_gemm_wsrc *src, const float *bias, int n, int k, int m) {
    if (n <= 0 || m <= 0) return;
    if (!arch) arch = ckv_gemm_best_arch();
    if (k <= 0) { /* an empty sum */
        ckv_gemm_empty(out, bias, n, m);
        return;
    }
    ckv_gemm_run(pool, arch, out, x, NULL, src, bias, n, k, m);
}

/* The tiled product for n > 1 (and for produced panels at any n). */
static void ckv_gemm_run(ckv_threadpool *pool, const ckv_gemm_arch *arch, float *out, const float *x, const float *w,
                         const ckv_gemm_wsrc *wsrc, const float *bias, int n, int k, int m) {
    const int n_threads = ckv_threadpool_size(pool);
    ckv_gemm_job job = {.arch = arch, .out = out, .x = x, .w = w, .wsrc = wsrc, .bias = bias, .n = n, .k = k, .m = m};
    job.panels = (m + arch->nr - 1) / arch->nr;
    const int row_tiles = (n + arch->mr - 1) / arch->mr;
    /* Row parts of at most CKV_GEMM_MC rows, so that their slice of x stays in L2, and more when there are
     * fewer panels than threads (each row part packs the same panels again). */
    job.row_parts = (n + CKV_GEMM_MC - 1) / CKV_GEMM_MC;
    while (job.panels * job.row_parts < n_threads && job.row_parts < row_tiles) job.row_parts++;
    /* Groups of panels whose slice of out is about CKV_GEMM_OUT_BYTES, as many as threads at least and
     * a multiple of the thread count, so that the threads end together. */
    const size_t panel_bytes = (size_t)(n / job.row_parts + arch->mr) * (size_t)arch->nr * sizeof(float);
    int groups = (int)(((size_t)job.panels * panel_bytes + CKV_GEMM_OUT_BYTES - 1) / CKV_GEMM_OUT_BYTES);
    const int per = job.row_parts >= n_threads ? 1 : (n_threads + job.row_parts - 1) / job.row_parts;
    groups = (groups + per - 1) / per * per;
    job.groups = groups < job.panels ? groups : job.panels;
    job.n_items = job.row_parts * job.groups;
    atomic_init(&job.next, 0);
    ckv_threadpool_for(pool, job.n_items < n_threads ? job.n_items : n_threads, 1, ckv_gemm_worker, &job);
}
