/* test_backend_ops.c - every op of a device backend against the CPU backend (the reference, fp32 or
 * better), in the spirit of ggml's test-backend-ops: fresh random inputs for each case (never
 * zeros), the backend's outputs poisoned with NaN before the op runs, the same inputs given to both
 * backends (bf16 weights and caches rounded once, so both compute on identical values), results
 * compared against per-dtype error bounds stated next to each case, the first mismatches and the
 * max error printed. Shapes are small (the emulated backend runs the kernels on fibers) but cover
 * decode and prefill, GQA groups, several sequences in one batch, compacted caches with gaps in
 * their positions, queries that see nothing, both attention kernels (tensor-core prefill and
 * split-KV decode), bf16 and f32 caches and weights.
 *   test_backend_ops cuda-emu   the CUDA kernels on the CPU execution layer (label cuda-emu), plus
 *                               its error paths: no GPU, old GPU, bad device, kernel fault
 *   test_backend_ops cuda       the CUDA backend on a GPU (label cuda); skips without one */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_emu.h"
#include "ckv_test.h"
#include "cuda_test_backend.h"
#include "core/status.h"
#include "core/tensor.h"

static ckv_backend *tb;  /* the backend under test */
static ckv_backend *ref; /* the CPU backend */
static const char *tb_name;

/* ---- random inputs ---------------------------------------------------------------------------- */

static uint64_t rng_state = 0x243F6A8885A308D3ull;

static uint32_t rng_u32(void) { return ckv_test_rng_u32(&rng_state); }

/* uniform in [lo, hi), never exactly 0 */
static float rng_uniform(float lo, float hi) {
    float x = ckv_test_uniform(&rng_state, lo, hi);
    return x == 0.0f ? 0.5f * hi : x;
}

static int rng_int(int lo, int hi) { return lo + (int)(rng_u32() % (uint32_t)(hi - lo + 1)); }

#define xalloc ckv_test_calloc

static float *rand_floats(size_t n, float lo, float hi) {
    float *x = xalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(lo, hi);
    return x;
}

/* Rounds x to the values `t` can hold (in place): what both backends then compute on. */
static void round_to(float *x, size_t n, ckv_dtype t) {
    for (size_t i = 0; i < n; i++)
        if (t == CKV_DTYPE_BF16) x[i] = ckv_bf16_to_f32(ckv_f32_to_bf16(x[i]));
}

/* ---- device buffers on both backends ---------------------------------------------------------- */

/* n floats of NaN: an output the op must overwrite */
static float *dev_poison(ckv_backend *be, size_t n) {
    float *h = xalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    float *d = cuda_test_upload(be, h, n * sizeof(float));
    free(h);
    return d;
}

/* Typed copy of fp32 values (F32 or BF16) for upload. */
static void *typed(const float *x, size_t n, ckv_dtype t) {
    void *h = xalloc(n * ckv_dtype_size(t));
    ckv_convert_from_f32(h, x, t, n);
    return h;
}

/* ---- comparison ------------------------------------------------------------------------------- */

static void compare(const char *op, const char *cas, const float *got, const float *want, size_t n, double atol,
                    double rtol) {
    char what[160];
    snprintf(what, sizeof what, "%s %s %s", tb_name, op, cas);
    ckv_test_allclose(what, got, want, n, atol, rtol);
}

/* Downloads n floats of `dt` (test backend) and `dr` (reference) and compares them. */
static void compare_dev(const char *op, const char *cas, const float *dt, const float *dr, size_t n, double atol,
                        double rtol) {
    float *a = xalloc(n * sizeof(float)), *b = xalloc(n * sizeof(float));
    cuda_test_download(tb, a, dt, n * sizeof(float));
    cuda_test_download(ref, b, dr, n * sizeof(float));
    compare(op, cas, a, b, n, atol, rtol);
    free(a);
    free(b);
}

static void release2(void *t, void *r) {
    tb->ops->release(tb, t);
    ref->ops->release(ref, r);
}

/* ---- element-wise and row-wise ops ------------------------------------------------------------ */

/* Embedding gathers exactly: bf16 -> fp32 is exact. Bound 0. */
static void test_embedding(ckv_dtype t) {
    const int rows = 37, cols = 70, n = 9;
    float *table = rand_floats((size_t)rows * cols, -2.0f, 2.0f);
    round_to(table, (size_t)rows * cols, t);
    int32_t ids[9];
    for (int i = 0; i < n; i++) ids[i] = rng_int(0, rows - 1);
    void *ht = typed(table, (size_t)rows * cols, t);
    ckv_weight wt = {cuda_test_upload(tb, ht, (size_t)rows * cols * ckv_dtype_size(t)), t, rows, cols,
                     (size_t)cols * ckv_dtype_size(t)};
    ckv_weight wr = {cuda_test_upload(ref, table, (size_t)rows * cols * sizeof(float)), CKV_DTYPE_F32, rows, cols,
                     (size_t)cols * sizeof(float)};
    int32_t *it = cuda_test_upload(tb, ids, sizeof ids), *ir = cuda_test_upload(ref, ids, sizeof ids);
    float *ot = dev_poison(tb, (size_t)n * cols), *orf = dev_poison(ref, (size_t)n * cols);
    tb->ops->embedding(tb, ot, &wt, it, n);
    ref->ops->embedding(ref, orf, &wr, ir, n);
    compare_dev("embedding", ckv_dtype_name(t), ot, orf, (size_t)n * cols, 0.0, 0.0);
    release2(ot, orf);
    release2(it, ir);
    release2(wt.data, wr.data);
    free(ht);
    free(table);
}

/* fp32 sums of squares in a different order than the CPU's double sum: a few ulp. */
static void test_rmsnorm(int n, int dim, int in_place) {
    float *x = rand_floats((size_t)n * dim, -3.0f, 3.0f), *w = rand_floats((size_t)dim, 0.5f, 1.5f);
    float *xt = cuda_test_upload(tb, x, (size_t)n * dim * 4), *xr = cuda_test_upload(ref, x, (size_t)n * dim * 4);
    float *wt = cuda_test_upload(tb, w, (size_t)dim * 4), *wr = cuda_test_upload(ref, w, (size_t)dim * 4);
    float *ot = in_place ? xt : dev_poison(tb, (size_t)n * dim), *orf = in_place ? xr : dev_poison(ref, (size_t)n * dim);
    tb->ops->rmsnorm(tb, ot, xt, wt, n, dim, 1e-6f);
    ref->ops->rmsnorm(ref, orf, xr, wr, n, dim, 1e-6f);
    char cas[64];
    snprintf(cas, sizeof cas, "n=%d dim=%d%s", n, dim, in_place ? " in place" : "");
    compare_dev("rmsnorm", cas, ot, orf, (size_t)n * dim, 1e-6, 4e-6);
    if (!in_place) release2(ot, orf);
    release2(xt, xr);
    release2(wt, wr);
    free(x);
    free(w);
}

/* Same fp32 angle on both; CUDA's sinf/cosf are within 2 ulp over the full range: |x| <= 4, so 4e-6
 * absolute after the rotation (positions up to 1e5 exercise the range reduction). */
static void test_rope(int n, int n_heads, int hd, float attn_scale, int variant) {
    float *x = rand_floats((size_t)n * n_heads * hd, -4.0f, 4.0f);
    float *inv = xalloc((size_t)(hd / 2) * sizeof(float));
    for (int i = 0; i < hd / 2; i++) {
        inv[i] = powf(10000.0f, -2.0f * (float)i / (float)hd); /* default */
        if (variant == 1 && i >= hd / 4) inv[i] /= 8.0f;      /* llama3 / YaRN style: low frequencies scaled */
    }
    int32_t *pos = xalloc((size_t)n * sizeof(int32_t));
    for (int t = 0; t < n; t++) pos[t] = variant == 1 ? rng_int(0, 100000) : t + 3;
    float *xt = cuda_test_upload(tb, x, (size_t)n * n_heads * hd * 4),
          *xr = cuda_test_upload(ref, x, (size_t)n * n_heads * hd * 4);
    float *ft = cuda_test_upload(tb, inv, (size_t)(hd / 2) * 4), *fr = cuda_test_upload(ref, inv, (size_t)(hd / 2) * 4);
    int32_t *pt = cuda_test_upload(tb, pos, (size_t)n * 4), *pr = cuda_test_upload(ref, pos, (size_t)n * 4);
    tb->ops->rope(tb, xt, pt, n, n_heads, hd, ft, attn_scale);
    ref->ops->rope(ref, xr, pr, n, n_heads, hd, fr, attn_scale);
    char cas[80];
    snprintf(cas, sizeof cas, "n=%d heads=%d hd=%d scale=%g %s", n, n_heads, hd, attn_scale,
             variant ? "scaled freqs, far positions" : "default");
    compare_dev("rope", cas, xt, xr, (size_t)n * n_heads * hd, 4e-6 * attn_scale * 4.0, 1e-6);
    release2(xt, xr);
    release2(ft, fr);
    release2(pt, pr);
    free(x);
    free(inv);
    free(pos);
}

/* swiglu: expf within 1-2 ulp on both sides; add: exact. */
static void test_elementwise(size_t n) {
    float *g = rand_floats(n, -8.0f, 8.0f), *u = rand_floats(n, -2.0f, 2.0f);
    float *gt = cuda_test_upload(tb, g, n * 4), *gr = cuda_test_upload(ref, g, n * 4);
    float *ut = cuda_test_upload(tb, u, n * 4), *ur = cuda_test_upload(ref, u, n * 4);
    float *ot = dev_poison(tb, n), *orf = dev_poison(ref, n);
    tb->ops->swiglu(tb, ot, gt, ut, n);
    ref->ops->swiglu(ref, orf, gr, ur, n);
    char cas[32];
    snprintf(cas, sizeof cas, "n=%zu", n);
    compare_dev("swiglu", cas, ot, orf, n, 1e-6, 4e-6);
    tb->ops->add(tb, gt, ut, n);
    ref->ops->add(ref, gr, ur, n);
    compare_dev("add", cas, gt, gr, n, 0.0, 0.0);
    release2(ot, orf);
    release2(gt, gr);
    release2(ut, ur);
    free(g);
    free(u);
}

/* Exact count. */
static void test_count_nonfinite(size_t n) {
    float *x = rand_floats(n, -1.0f, 1.0f);
    size_t planted = 0;
    for (size_t i = 0; i < n; i += 1 + rng_u32() % 97, planted++) x[i] = (planted % 3 == 0) ? NAN : (planted % 3 == 1) ? INFINITY : -INFINITY;
    float *xt = cuda_test_upload(tb, x, n * 4);
    size_t bad = 12345;
    CHECK_OK(tb->ops->count_nonfinite(tb, xt, n, &bad));
    CHECK_MSG(bad == planted, "%s count_nonfinite n=%zu: counted %zu, planted %zu", tb_name, n, bad, planted);
    if (bad == planted) fprintf(stderr, "ok   %s count_nonfinite n=%zu: %zu non-finite values found\n", tb_name, n, bad);
    tb->ops->release(tb, xt);
    free(x);
}

/* ---- matmul ----------------------------------------------------------------------------------
 * bf16 weights: the reference computes on the same bf16 values in fp32; the backend also rounds x to
 * bf16 (relative 2^-9 each), so |error| <= 2^-8 * max over outputs of sum |x_l w_l| (plus fp32
 * accumulation). f32 weights: fp32 accumulation in any order, 1e-6 * k * that sum. */
static void test_matmul(ckv_dtype t, int n, int k, int m, int with_bias) {
    float *x = rand_floats((size_t)n * k, -1.0f, 1.0f), *w = rand_floats((size_t)m * k, -0.5f, 0.5f);
    float *b = rand_floats((size_t)m, -1.0f, 1.0f);
    round_to(w, (size_t)m * k, t);
    double worst = 0.0; /* max_i,j sum_l |x_il w_jl| */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = 0.0;
            for (int l = 0; l < k; l++) s += fabs((double)x[(size_t)i * k + l] * (double)w[(size_t)j * k + l]);
            worst = s > worst ? s : worst;
        }
    void *hw = typed(w, (size_t)m * k, t);
    ckv_weight wt = {cuda_test_upload(tb, hw, (size_t)m * k * ckv_dtype_size(t)), t, m, k,
                     (size_t)k * ckv_dtype_size(t)};
    ckv_weight wr = {cuda_test_upload(ref, w, (size_t)m * k * 4), CKV_DTYPE_F32, m, k, (size_t)k * 4};
    float *xt = cuda_test_upload(tb, x, (size_t)n * k * 4), *xr = cuda_test_upload(ref, x, (size_t)n * k * 4);
    float *bt = cuda_test_upload(tb, b, (size_t)m * 4), *br = cuda_test_upload(ref, b, (size_t)m * 4);
    float *ot = dev_poison(tb, (size_t)n * m), *orf = dev_poison(ref, (size_t)n * m);
    tb->ops->matmul(tb, ot, xt, &wt, with_bias ? bt : NULL, n);
    ref->ops->matmul(ref, orf, xr, &wr, with_bias ? br : NULL, n);
    const double atol = t == CKV_DTYPE_BF16 ? worst / 256.0 + 1e-5 : 1e-6 * k * worst + 1e-6;
    char cas[96];
    snprintf(cas, sizeof cas, "%s n=%d k=%d m=%d%s (bound %.2g)", ckv_dtype_name(t), n, k, m,
             with_bias ? " +bias" : "", atol);
    compare_dev("matmul", cas, ot, orf, (size_t)n * m, atol, 0.0);
    release2(ot, orf);
    release2(xt, xr);
    release2(bt, br);
    release2(wt.data, wr.data);
    free(hw);
    free(x);
    free(w);
    free(b);
}

/* ---- KV segments ------------------------------------------------------------------------------
 * A layer's cache for n_seq sequences x n_kv heads, built identically on one backend: per segment
 * k, v [cap, hd] in the cache dtype, pos [cap]; the descriptor arrays and the per-sequence pointer
 * array live in device memory, as the model keeps them. */
#define KV_MAX_SEQ 4
#define KV_MAX_HEADS 4

typedef struct {
    ckv_backend *be;
    ckv_dtype dtype;
    int n_seq, n_kv, hd, cap;
    void *k[KV_MAX_SEQ][KV_MAX_HEADS], *v[KV_MAX_SEQ][KV_MAX_HEADS];
    int32_t *pos[KV_MAX_SEQ][KV_MAX_HEADS];
    ckv_kv_seg *segs[KV_MAX_SEQ]; /* device: [n_kv] each */
    ckv_kv_seg **list;            /* device: [n_seq] */
} test_kv;

/* host content: hk, hv [n_seq][n_kv][cap * hd] (already rounded to dtype), hp [n_seq][n_kv][cap], len */
typedef struct {
    float *hk[KV_MAX_SEQ][KV_MAX_HEADS], *hv[KV_MAX_SEQ][KV_MAX_HEADS];
    int32_t *hp[KV_MAX_SEQ][KV_MAX_HEADS];
    int len[KV_MAX_SEQ][KV_MAX_HEADS];
} test_kv_host;

static void kv_build(test_kv *c, ckv_backend *be, ckv_dtype dt, int n_seq, int n_kv, int hd, int cap,
                     const test_kv_host *h) {
    memset(c, 0, sizeof *c);
    c->be = be, c->dtype = dt, c->n_seq = n_seq, c->n_kv = n_kv, c->hd = hd, c->cap = cap;
    ckv_kv_seg *ptrs[KV_MAX_SEQ];
    for (int s = 0; s < n_seq; s++) {
        ckv_kv_seg segs[KV_MAX_HEADS];
        for (int g = 0; g < n_kv; g++) {
            void *tk = typed(h->hk[s][g], (size_t)cap * hd, dt), *tv = typed(h->hv[s][g], (size_t)cap * hd, dt);
            c->k[s][g] = cuda_test_upload(be, tk, (size_t)cap * hd * ckv_dtype_size(dt));
            c->v[s][g] = cuda_test_upload(be, tv, (size_t)cap * hd * ckv_dtype_size(dt));
            c->pos[s][g] = cuda_test_upload(be, h->hp[s][g], (size_t)cap * 4);
            segs[g] = (ckv_kv_seg){c->k[s][g], c->v[s][g], c->pos[s][g], h->len[s][g], cap};
            free(tk);
            free(tv);
        }
        c->segs[s] = cuda_test_upload(be, segs, sizeof(ckv_kv_seg) * (size_t)n_kv);
        ptrs[s] = c->segs[s];
    }
    c->list = cuda_test_upload(be, ptrs, sizeof(ckv_kv_seg *) * (size_t)n_seq);
}

static void kv_free(test_kv *c) {
    for (int s = 0; s < c->n_seq; s++) {
        for (int g = 0; g < c->n_kv; g++) {
            c->be->ops->release(c->be, c->k[s][g]);
            c->be->ops->release(c->be, c->v[s][g]);
            c->be->ops->release(c->be, c->pos[s][g]);
        }
        c->be->ops->release(c->be, c->segs[s]);
    }
    c->be->ops->release(c->be, c->list);
}

static ckv_kv_batch kv_batch(const test_kv *c, const int32_t *seq_of, const int32_t *seq_start, int max_len) {
    ckv_kv_batch b = {c->dtype, c->hd, c->n_kv, c->n_seq, (ckv_kv_seg *const *)c->list, seq_of, seq_start, max_len};
    return b;
}

/* Random host content: segment (s, g) holds len[s][g] rows with ascending positions; gaps > 0 leave
 * random holes (a compacted cache). Rows past len are random too (must never be read). */
static void kv_host_random(test_kv_host *h, ckv_dtype dt, int n_seq, int n_kv, int hd, int cap, const int *lens,
                           int gaps) {
    memset(h, 0, sizeof *h);
    for (int s = 0; s < n_seq; s++)
        for (int g = 0; g < n_kv; g++) {
            h->hk[s][g] = rand_floats((size_t)cap * hd, -1.0f, 1.0f);
            h->hv[s][g] = rand_floats((size_t)cap * hd, -1.0f, 1.0f);
            round_to(h->hk[s][g], (size_t)cap * hd, dt);
            round_to(h->hv[s][g], (size_t)cap * hd, dt);
            h->hp[s][g] = xalloc((size_t)cap * 4);
            int p = 0;
            for (int i = 0; i < cap; i++) {
                p += gaps ? rng_int(0, gaps) : 0;
                h->hp[s][g][i] = p++;
            }
            h->len[s][g] = lens[s * n_kv + g];
        }
}

static void kv_host_free(test_kv_host *h) {
    for (int s = 0; s < KV_MAX_SEQ; s++)
        for (int g = 0; g < KV_MAX_HEADS; g++) {
            free(h->hk[s][g]);
            free(h->hv[s][g]);
            free(h->hp[s][g]);
        }
}

/* Downloads every segment's descriptor, rows [0, cap) of k, v (as fp32) and pos. */
static void kv_fetch(const test_kv *c, float *k, float *v, int32_t *pos, int *len) {
    const size_t rows = (size_t)c->cap * c->hd, es = ckv_dtype_size(c->dtype);
    void *tmp = xalloc(rows * es);
    for (int s = 0; s < c->n_seq; s++) {
        ckv_kv_seg segs[KV_MAX_HEADS];
        cuda_test_download(c->be, segs, c->segs[s], sizeof(ckv_kv_seg) * (size_t)c->n_kv);
        for (int g = 0; g < c->n_kv; g++) {
            const size_t at = (size_t)(s * c->n_kv + g);
            len[at] = segs[g].len;
            cuda_test_download(c->be, tmp, c->k[s][g], rows * es);
            ckv_convert_to_f32(k + at * rows, tmp, c->dtype, rows);
            cuda_test_download(c->be, tmp, c->v[s][g], rows * es);
            ckv_convert_to_f32(v + at * rows, tmp, c->dtype, rows);
            cuda_test_download(c->be, pos + at * (size_t)c->cap, c->pos[s][g], (size_t)c->cap * 4);
        }
    }
    free(tmp);
}

/* Compares the caches of both backends: lengths, and rows [0, len) of k, v, pos, exactly (a store
 * converts fp32 -> dtype with round to nearest even on both sides; a gather copies). */
static void kv_compare(const char *op, const char *cas, const test_kv *a, const test_kv *b) {
    const size_t nseg = (size_t)a->n_seq * a->n_kv, rows = (size_t)a->cap * a->hd;
    float *ka = xalloc(nseg * rows * 4), *va = xalloc(nseg * rows * 4), *kb = xalloc(nseg * rows * 4),
          *vb = xalloc(nseg * rows * 4);
    int32_t *pa = xalloc(nseg * (size_t)a->cap * 4), *pb = xalloc(nseg * (size_t)a->cap * 4);
    int la[KV_MAX_SEQ * KV_MAX_HEADS], lb[KV_MAX_SEQ * KV_MAX_HEADS];
    kv_fetch(a, ka, va, pa, la);
    kv_fetch(b, kb, vb, pb, lb);
    int bad_len = 0;
    size_t used = 0;
    for (size_t i = 0; i < nseg; i++) {
        if (la[i] != lb[i]) {
            if (bad_len++ < 5) fprintf(stderr, "  segment %zu: len %d, expected %d\n", i, la[i], lb[i]);
            continue;
        }
        /* pack the used rows of every segment, then compare them as one array */
        memmove(ka + used * a->hd, ka + i * rows, (size_t)la[i] * a->hd * 4);
        memmove(va + used * a->hd, va + i * rows, (size_t)la[i] * a->hd * 4);
        memmove(kb + used * a->hd, kb + i * rows, (size_t)la[i] * a->hd * 4);
        memmove(vb + used * a->hd, vb + i * rows, (size_t)la[i] * a->hd * 4);
        for (int r = 0; r < la[i]; r++) {
            CHECK_MSG(pa[i * a->cap + r] == pb[i * a->cap + r], "%s %s %s: segment %zu row %d: pos %d, expected %d",
                      tb_name, op, cas, i, r, pa[i * a->cap + r], pb[i * a->cap + r]);
            if (pa[i * a->cap + r] != pb[i * a->cap + r]) break;
        }
        used += (size_t)la[i];
    }
    CHECK_MSG(bad_len == 0, "%s %s %s: %d segment lengths differ", tb_name, op, cas, bad_len);
    char what[96];
    snprintf(what, sizeof what, "%s k", cas);
    compare(op, what, ka, kb, used * a->hd, 0.0, 0.0);
    snprintf(what, sizeof what, "%s v", cas);
    compare(op, what, va, vb, used * a->hd, 0.0, 0.0);
    free(ka), free(va), free(kb), free(vb), free(pa), free(pb);
}

/* Appends tokens of n_seq sequences (token counts cnt[s]) to caches of different lengths. */
static void test_kv_store(ckv_dtype dt, int n_seq, const int *cnt) {
    const int n_kv = 2, hd = 24, cap = 40;
    int lens[KV_MAX_SEQ * KV_MAX_HEADS], n = 0;
    int32_t seq_start[KV_MAX_SEQ + 1], seq_of[64];
    for (int s = 0; s < n_seq; s++) {
        seq_start[s] = n;
        for (int i = 0; i < cnt[s]; i++) seq_of[n++] = s;
        for (int g = 0; g < n_kv; g++) lens[s * n_kv + g] = rng_int(0, cap - cnt[s]);
    }
    seq_start[n_seq] = n;
    test_kv_host h;
    kv_host_random(&h, dt, n_seq, n_kv, hd, cap, lens, 2);
    float *k = rand_floats((size_t)n * n_kv * hd, -2.0f, 2.0f), *v = rand_floats((size_t)n * n_kv * hd, -2.0f, 2.0f);
    int32_t pos[64];
    for (int t = 0; t < n; t++) pos[t] = 1000 + t;
    test_kv ct, cr;
    kv_build(&ct, tb, dt, n_seq, n_kv, hd, cap, &h);
    kv_build(&cr, ref, dt, n_seq, n_kv, hd, cap, &h);
    const size_t nb = (size_t)n * n_kv * hd * 4;
    float *kt = cuda_test_upload(tb, k, nb), *kr = cuda_test_upload(ref, k, nb), *vt = cuda_test_upload(tb, v, nb),
          *vr = cuda_test_upload(ref, v, nb);
    int32_t *pt = cuda_test_upload(tb, pos, (size_t)n * 4), *pr = cuda_test_upload(ref, pos, (size_t)n * 4);
    int32_t *sot = NULL, *sor = NULL, *sst = NULL, *ssr = NULL;
    if (n_seq > 1) {
        sot = cuda_test_upload(tb, seq_of, (size_t)n * 4), sor = cuda_test_upload(ref, seq_of, (size_t)n * 4);
        sst = cuda_test_upload(tb, seq_start, (size_t)(n_seq + 1) * 4),
        ssr = cuda_test_upload(ref, seq_start, (size_t)(n_seq + 1) * 4);
    }
    ckv_kv_batch bt = kv_batch(&ct, sot, sst, cap), br = kv_batch(&cr, sor, ssr, cap);
    tb->ops->kv_store(tb, &bt, kt, vt, pt, n);
    ref->ops->kv_store(ref, &br, kr, vr, pr, n);
    char cas[64];
    snprintf(cas, sizeof cas, "%s seqs=%d tokens=%d", ckv_dtype_name(dt), n_seq, n);
    kv_compare("kv_store", cas, &ct, &cr);
    release2(kt, kr), release2(vt, vr), release2(pt, pr), release2(sot, sor), release2(sst, ssr);
    kv_free(&ct), kv_free(&cr);
    kv_host_free(&h);
    free(k), free(v);
}

/* Compacts the 3 segments of a sequence to random ascending subsets (one of them empty). */
static void test_kv_gather(ckv_dtype dt) {
    const int n_kv = 3, hd = 20, cap = 30, stride = 32;
    int lens[3] = {30, 17, 9};
    test_kv_host h;
    kv_host_random(&h, dt, 1, n_kv, hd, cap, lens, 3);
    int32_t keep[3 * 32], n_keep[3];
    for (int g = 0; g < n_kv; g++) {
        n_keep[g] = 0;
        for (int r = 0; r < lens[g]; r++)
            if (g != 2 && rng_int(0, 2) > 0) keep[g * stride + n_keep[g]++] = r;
        for (int i = n_keep[g]; i < stride; i++) keep[g * stride + i] = -1; /* never read */
    }
    test_kv st, sr, dt_, dr;
    kv_build(&st, tb, dt, 1, n_kv, hd, cap, &h);
    kv_build(&sr, ref, dt, 1, n_kv, hd, cap, &h);
    test_kv_host h2;
    kv_host_random(&h2, dt, 1, n_kv, hd, cap, lens, 0);
    kv_build(&dt_, tb, dt, 1, n_kv, hd, cap, &h2);
    kv_build(&dr, ref, dt, 1, n_kv, hd, cap, &h2);
    int32_t *kt = cuda_test_upload(tb, keep, sizeof keep), *kr = cuda_test_upload(ref, keep, sizeof keep);
    int32_t *nt = cuda_test_upload(tb, n_keep, sizeof n_keep), *nr = cuda_test_upload(ref, n_keep, sizeof n_keep);
    tb->ops->kv_gather(tb, &(ckv_kv_gather_params){dt, hd, n_kv, dt_.segs[0], st.segs[0], kt, stride, nt});
    ref->ops->kv_gather(ref, &(ckv_kv_gather_params){dt, hd, n_kv, dr.segs[0], sr.segs[0], kr, stride, nr});
    char cas[64];
    snprintf(cas, sizeof cas, "%s kept %d/%d/%d", ckv_dtype_name(dt), n_keep[0], n_keep[1], n_keep[2]);
    kv_compare("kv_gather", cas, &dt_, &dr);
    release2(kt, kr), release2(nt, nr);
    kv_free(&st), kv_free(&sr), kv_free(&dt_), kv_free(&dr);
    kv_host_free(&h), kv_host_free(&h2);
}

/* ---- attention -------------------------------------------------------------------------------
 * Both backends attend over identical caches (bf16 values already rounded) in fp32. Bounds: the
 * split-KV kernel computes in fp32 from fp32 queries: 2e-5, and so does the tensor-core prefill on
 * an f32 cache (three-term bf16 splits, products to about 2^-25). On a bf16 cache the prefill kernel
 * rounds q and the softmax weights to bf16 (relative 2^-9 each): with |q|, |k|, |v| <= 1 a score
 * moves by at most 2^-8 * scale * sum |q_d k_d| and the output by about that much again: 1e-2. */
typedef struct {
    const char *name;
    ckv_dtype dt;
    int n_seq, n_kv, group, hd;
    int tokens[KV_MAX_SEQ]; /* query tokens per sequence */
    int lens[KV_MAX_SEQ];   /* cache rows per sequence before the queries (before their own keys) */
    int gaps;               /* 0: positions 0, 1, ...; > 0: a compacted cache with holes */
    int early;              /* 1: some queries sit before the first cached position (see nothing) */
} attn_case;

static void test_attention(const attn_case *ac) {
    const int n_kv = ac->n_kv, hd = ac->hd, n_heads = n_kv * ac->group;
    int n = 0, cap = 0, lens[KV_MAX_SEQ * KV_MAX_HEADS];
    int32_t seq_start[KV_MAX_SEQ + 1], seq_of[256];
    for (int s = 0; s < ac->n_seq; s++) {
        seq_start[s] = n;
        for (int i = 0; i < ac->tokens[s]; i++) seq_of[n++] = s;
        const int rows = ac->lens[s] + ac->tokens[s]; /* the queries' own keys are in the cache */
        cap = rows > cap ? rows : cap;
        for (int g = 0; g < n_kv; g++) lens[s * n_kv + g] = rows - (g == 1 && rows > 3 ? 3 : 0); /* ragged heads */
    }
    seq_start[ac->n_seq] = n;
    test_kv_host h;
    kv_host_random(&h, ac->dt, ac->n_seq, n_kv, hd, cap, lens, ac->gaps);
    /* query positions: the positions of the sequence's last `tokens` cache rows of head 0, or for
     * `early` a spread that starts before the first cached position */
    int32_t *qpos = xalloc((size_t)n * 4);
    for (int s = 0; s < ac->n_seq; s++)
        for (int i = 0; i < ac->tokens[s]; i++) {
            const int row = lens[s * n_kv] - ac->tokens[s] + i;
            qpos[seq_start[s] + i] = ac->early ? h.hp[s][0][0] - 2 + i * 3 : h.hp[s][0][row];
        }
    float *q = rand_floats((size_t)n * n_heads * hd, -1.0f, 1.0f);
    const float scale = 1.0f / sqrtf((float)hd);
    test_kv ct, cr;
    kv_build(&ct, tb, ac->dt, ac->n_seq, n_kv, hd, cap, &h);
    kv_build(&cr, ref, ac->dt, ac->n_seq, n_kv, hd, cap, &h);
    const size_t nq = (size_t)n * n_heads * hd;
    float *qt = cuda_test_upload(tb, q, nq * 4), *qr = cuda_test_upload(ref, q, nq * 4);
    int32_t *pt = cuda_test_upload(tb, qpos, (size_t)n * 4), *pr = cuda_test_upload(ref, qpos, (size_t)n * 4);
    int32_t *sot = NULL, *sor = NULL, *sst = NULL, *ssr = NULL;
    if (ac->n_seq > 1) {
        sot = cuda_test_upload(tb, seq_of, (size_t)n * 4), sor = cuda_test_upload(ref, seq_of, (size_t)n * 4);
        sst = cuda_test_upload(tb, seq_start, (size_t)(ac->n_seq + 1) * 4);
        ssr = cuda_test_upload(ref, seq_start, (size_t)(ac->n_seq + 1) * 4);
    }
    ckv_kv_batch bt = kv_batch(&ct, sot, sst, cap), br = kv_batch(&cr, sor, ssr, cap);
    float *ot = dev_poison(tb, nq), *orf = dev_poison(ref, nq);
    tb->ops->attention(tb, ot, &(ckv_attention_params){qt, pt, &bt, n, n_heads, scale});
    ref->ops->attention(ref, orf, &(ckv_attention_params){qr, pr, &br, n, n_heads, scale});
    const int prefill = n > 4 * ac->n_seq && (hd == 16 || hd == 32 || hd == 64 || hd == 80 || hd == 96 || hd == 128);
    const int rounded = prefill && ac->dt == CKV_DTYPE_BF16; /* f32 caches: fp32-class products */
    char cas[160];
    snprintf(cas, sizeof cas, "%s (%s, %s kv, %d seq, %d tokens, heads %d/%d, hd %d)", ac->name,
             prefill ? "tensor-core prefill" : "split-KV", ckv_dtype_name(ac->dt), ac->n_seq, n, n_heads, n_kv, hd);
    compare_dev("attention", cas, ot, orf, nq, rounded ? 1e-2 : 2e-5, rounded ? 0.0 : 1e-4);
    release2(ot, orf), release2(qt, qr), release2(pt, pr), release2(sot, sor), release2(sst, ssr);
    kv_free(&ct), kv_free(&cr);
    kv_host_free(&h);
    free(q), free(qpos);
}

static void test_attention_all(void) {
    static const attn_case cases[] = {
        /* name             dtype          seq kv  G  hd  tokens          lens           gaps early */
        {"prefill",        CKV_DTYPE_BF16, 1, 2, 2, 32, {40},           {0},           0, 0},
        {"prefill chunk",  CKV_DTYPE_BF16, 1, 1, 4, 16, {24},           {50},          0, 0},
        {"prefill gaps",   CKV_DTYPE_BF16, 1, 2, 2, 64, {20},           {30},          3, 0},
        {"prefill early",  CKV_DTYPE_F32,  1, 2, 1, 32, {18},           {10},          2, 1},
        {"prefill 2 seqs", CKV_DTYPE_BF16, 2, 2, 2, 16, {13, 70},       {5, 0},        1, 0},
        {"prefill hd128",  CKV_DTYPE_BF16, 1, 1, 1, 128, {17},          {0},           0, 0},
        {"prefill f32",    CKV_DTYPE_F32,  1, 2, 2, 64, {21},           {3},           0, 0},
        {"f32 hd128 tiles", CKV_DTYPE_F32, 1, 1, 4, 128, {70},          {45},          0, 0},
        {"f32 hd 80 2 seqs", CKV_DTYPE_F32, 2, 2, 2, 80, {66, 9},       {40, 3},       1, 0},
        {"f32 hd 96 gaps", CKV_DTYPE_F32,  1, 1, 2, 96, {36},           {30},          2, 0},
        {"prefill hd 80",  CKV_DTYPE_BF16, 2, 2, 2, 80, {70, 9},        {60, 3},       1, 0},
        {"prefill hd 96",  CKV_DTYPE_BF16, 1, 1, 4, 96, {66},           {70},          0, 0},
        {"decode",         CKV_DTYPE_BF16, 1, 2, 4, 64, {1},            {140},         0, 0},
        {"decode batch",   CKV_DTYPE_BF16, 3, 2, 3, 32, {1, 1, 1},      {70, 4, 129},  2, 0},
        {"decode early",   CKV_DTYPE_F32,  2, 1, 2, 16, {1, 2},         {20, 9},       2, 1},
        {"long, hd 48",    CKV_DTYPE_F32,  1, 2, 2, 48, {12},           {7},           1, 0},
        {"decode hd 256",  CKV_DTYPE_BF16, 1, 1, 2, 256, {1},           {40},          0, 0},
        /* the bandwidth decode kernel: several splits (>= 256 keys each), every head dim and group
         * the supported models use, f32 caches, a few tokens per sequence, ragged segments */
        {"decode splits",  CKV_DTYPE_BF16, 1, 2, 4, 128, {1},           {1500},        0, 0},
        {"decode f32 hd80", CKV_DTYPE_F32, 2, 2, 5, 80, {1, 1},         {700, 300},    2, 0},
        {"decode hd 96",   CKV_DTYPE_BF16, 2, 1, 8, 96, {1, 1},         {600, 90},     0, 0},
        {"decode 3 tokens", CKV_DTYPE_BF16, 2, 2, 2, 64, {3, 1},        {520, 33},     1, 0},
        {"decode f32 128", CKV_DTYPE_F32,  1, 1, 1, 128, {1},           {900},         0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_attention(&cases[i]);
}

/* ---- eviction ops -----------------------------------------------------------------------------
 * One sequence, 2 KV heads of 40 rows, 4 local query heads (group 2), head dim 32. Bounds: exact
 * where both sides do the same fp32 / double operations per element (fills, pooling, sums, norms,
 * finish, random, selections); 1e-6 relative (plus 1e-7) where fp32 dot products or GEMMs sum in
 * another order (attention weights, value norms, moments, expected-attention logits). */
#define EV_L 40
#define EV_KV 2
#define EV_HQ 4
#define EV_D 32

typedef struct {
    test_kv_host h;
    test_kv ct, cr;
    ckv_kv_batch bt, br;
} ev_cache;

static void ev_cache_init(ev_cache *e, ckv_dtype dt) {
    const int lens[EV_KV] = {EV_L, EV_L};
    kv_host_random(&e->h, dt, 1, EV_KV, EV_D, EV_L, lens, 0);
    kv_build(&e->ct, tb, dt, 1, EV_KV, EV_D, EV_L, &e->h);
    kv_build(&e->cr, ref, dt, 1, EV_KV, EV_D, EV_L, &e->h);
    e->bt = kv_batch(&e->ct, NULL, NULL, EV_L);
    e->br = kv_batch(&e->cr, NULL, NULL, EV_L);
}

static void ev_cache_free(ev_cache *e) {
    kv_free(&e->ct), kv_free(&e->cr);
    kv_host_free(&e->h);
}

/* cudaMalloc calls made so far (cuda-emu: the CPU execution layer counts them; 0 on a GPU). After
 * evict_reserve for a test's shapes, the eviction ops under test must not allocate: TB_EVICT wraps
 * an op call of the backend under test and adds what it allocated to evict_op_allocs. */
static unsigned long long tb_allocs(void) { return strcmp(tb_name, "cuda-emu") == 0 ? ckv_cuda_emu_alloc_calls() : 0; }
static unsigned long long evict_op_allocs;
#define TB_EVICT(call)                                         \
    do {                                                       \
        const unsigned long long a0_ = tb_allocs();            \
        call;                                                  \
        evict_op_allocs += tb_allocs() - a0_;                  \
    } while (0)

static void ev_reserve(int rows, int query_rows, int n_kv_all, ckv_dtype kv, int hidden) {
    const ckv_evict_shape sh = {rows, query_rows, EV_HQ, EV_KV, n_kv_all, EV_D, hidden, kv, CKV_DTYPE_BF16};
    CHECK(ckv_backend_supports(tb, CKV_BACKEND_CAP_EVICT_RESERVE));
    if (ckv_backend_supports(tb, CKV_BACKEND_CAP_EVICT_RESERVE)) CHECK_OK(tb->ops->evict_reserve(tb, &sh));
}

/* Compares n doubles as floats after download. */
static void compare_dev_f64(const char *op, const char *cas, const double *dt, const double *dr, size_t n, double atol,
                            double rtol) {
    double *a = xalloc(n * 8), *b = xalloc(n * 8);
    float *fa = xalloc(n * 4), *fb = xalloc(n * 4);
    cuda_test_download(tb, a, dt, n * 8);
    cuda_test_download(ref, b, dr, n * 8);
    for (size_t i = 0; i < n; i++) fa[i] = (float)a[i], fb[i] = (float)b[i];
    compare(op, cas, fa, fb, n, atol, rtol);
    free(a), free(b), free(fa), free(fb);
}

static void compare_dev_i32(const char *op, const char *cas, const int32_t *dt, const int32_t *dr, size_t n) {
    int32_t *a = xalloc(n * 4), *b = xalloc(n * 4);
    cuda_test_download(tb, a, dt, n * 4);
    cuda_test_download(ref, b, dr, n * 4);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        if (a[i] != b[i] && bad++ < 5) fprintf(stderr, "  %s %s[%zu]: %d, expected %d\n", op, cas, i, a[i], b[i]);
    CHECK_MSG(bad == 0, "%s %s %s: %zu of %zu integers differ", tb_name, op, cas, bad, n);
    if (!bad) fprintf(stderr, "ok   %s %s %s: %zu integers identical\n", tb_name, op, cas, n);
    free(a), free(b);
}

static void test_evict_attention(ckv_dtype dt) {
    ev_cache e;
    ev_cache_init(&e, dt);
    const int n_q = 8, q_row0 = EV_L - n_q, ld = EV_L + 4, n_cols = EV_L - 3;
    /* CriticalKV value norms below: a bf16 o_proj [D, EV_HQ * EV_D], D with a tail of 4 columns
     * after the 16-lane groups */
    const int D = 52, cols = EV_HQ * EV_D;
    ev_reserve(EV_L, n_q, EV_KV, dt, D);
    float *q = rand_floats((size_t)n_q * EV_HQ * EV_D, -1.0f, 1.0f);
    float *qt = cuda_test_upload(tb, q, sizeof(float) * n_q * EV_HQ * EV_D),
          *qr = cuda_test_upload(ref, q, sizeof(float) * n_q * EV_HQ * EV_D);
    const float scale = 1.0f / sqrtf((float)EV_D);
    for (int per_kv = 0; per_kv < 2; per_kv++) {
        const int n_out = per_kv ? EV_KV : EV_HQ;
        double *ct = (double *)dev_poison(tb, (size_t)n_out * n_cols * 2), *cr = (double *)dev_poison(ref, (size_t)n_out * n_cols * 2);
        /* two query blocks into one sum: the second adds to the first */
        const ckv_evict_colsum_rows rows = per_kv ? CKV_EVICT_PER_KV_HEAD : CKV_EVICT_PER_QUERY_HEAD;
        const ckv_evict_attn_params at1 = {qt, 4, q_row0, &e.bt, EV_HQ, 0, 2, scale, CKV_EVICT_LOGITS_MUL},
                                    ar1 = {qr, 4, q_row0, &e.br, EV_HQ, 0, 2, scale, CKV_EVICT_LOGITS_MUL};
        const ckv_evict_attn_params at2 = {qt + 4 * EV_HQ * EV_D, 4, q_row0 + 4, &e.bt, EV_HQ, 0, 2, 1.0f / scale,
                                           CKV_EVICT_LOGITS_DIV},
                                    ar2 = {qr + 4 * EV_HQ * EV_D, 4, q_row0 + 4, &e.br, EV_HQ, 0, 2, 1.0f / scale,
                                           CKV_EVICT_LOGITS_DIV};
        TB_EVICT(CHECK_OK(tb->ops->evict_attn_colsum(tb, ct, n_cols, &at1, rows, CKV_EVICT_ZERO_FIRST)));
        CHECK_OK(ref->ops->evict_attn_colsum(ref, cr, n_cols, &ar1, rows, CKV_EVICT_ZERO_FIRST));
        TB_EVICT(CHECK_OK(tb->ops->evict_attn_colsum(tb, ct, n_cols, &at2, rows, CKV_EVICT_ADD)));
        CHECK_OK(ref->ops->evict_attn_colsum(ref, cr, n_cols, &ar2, rows, CKV_EVICT_ADD));
        compare_dev_f64("evict_attn_colsum", per_kv ? "per kv head" : "per query head", ct, cr, (size_t)n_out * n_cols,
                        1e-7, 1e-6);
        /* finish: divided by the count of queries that see each column */
        float *ft = dev_poison(tb, (size_t)n_out * ld), *fr = dev_poison(ref, (size_t)n_out * ld);
        const ckv_evict_denom den = per_kv ? CKV_EVICT_DENOM_MINUS_COL : CKV_EVICT_DENOM_FIXED;
        tb->ops->evict_colsum_finish(tb, ft, ld, ct, n_cols, n_out, n_cols, 57.0, den);
        ref->ops->evict_colsum_finish(ref, fr, ld, cr, n_cols, n_out, n_cols, 57.0, den);
        float *a = xalloc(sizeof(float) * n_out * ld), *b = xalloc(sizeof(float) * n_out * ld);
        cuda_test_download(tb, a, ft, sizeof(float) * n_out * ld);
        cuda_test_download(ref, b, fr, sizeof(float) * n_out * ld);
        for (int r = 0; r < n_out; r++) memmove(a + r * n_cols, a + r * ld, sizeof(float) * n_cols), memmove(b + r * n_cols, b + r * ld, sizeof(float) * n_cols);
        compare("evict_colsum_finish", per_kv ? "minus_col" : "plain", a, b, (size_t)n_out * n_cols, 1e-7, 1e-6);
        free(a), free(b);
        release2(ft, fr), release2(ct, cr);
    }
    float *pt = dev_poison(tb, (size_t)EV_HQ * n_q * ld), *pr = dev_poison(ref, (size_t)EV_HQ * n_q * ld);
    const ckv_evict_attn_params apt = {qt, n_q, q_row0, &e.bt, EV_HQ, 0, 2, scale, CKV_EVICT_LOGITS_MUL},
                                apr = {qr, n_q, q_row0, &e.br, EV_HQ, 0, 2, scale, CKV_EVICT_LOGITS_MUL};
    TB_EVICT(CHECK_OK(tb->ops->evict_attn_probs(tb, pt, ld, &apt)));
    CHECK_OK(ref->ops->evict_attn_probs(ref, pr, ld, &apr));
    compare_dev("evict_attn_probs", ckv_dtype_name(dt), pt, pr, (size_t)EV_HQ * n_q * ld, 1e-7, 1e-6);
    release2(pt, pr);
    float *wo = rand_floats((size_t)D * cols, -0.5f, 0.5f);
    round_to(wo, (size_t)D * cols, CKV_DTYPE_BF16);
    void *hw = typed(wo, (size_t)D * cols, CKV_DTYPE_BF16);
    ckv_weight wt = {cuda_test_upload(tb, hw, (size_t)D * cols * 2), CKV_DTYPE_BF16, D, cols, (size_t)cols * 2};
    ckv_weight wr = {cuda_test_upload(ref, hw, (size_t)D * cols * 2), CKV_DTYPE_BF16, D, cols, (size_t)cols * 2};
    float *init = rand_floats((size_t)EV_KV * ld, 0.0f, 1.0f);
    float *vt = cuda_test_upload(tb, init, sizeof(float) * EV_KV * ld),
          *vr = cuda_test_upload(ref, init, sizeof(float) * EV_KV * ld);
    TB_EVICT(CHECK_OK(tb->ops->evict_value_norm(tb, vt, ld, &e.bt, EV_L, &wt, EV_HQ, 0, 2)));
    CHECK_OK(ref->ops->evict_value_norm(ref, vr, ld, &e.br, EV_L, &wr, EV_HQ, 0, 2));
    compare_dev("evict_value_norm", ckv_dtype_name(dt), vt, vr, (size_t)EV_KV * ld, 1e-6, 1e-6);
    /* value norms, expected-attention logits */
    tb->ops->evict_row_norm(tb, vt, ld, &e.bt, EV_L, CKV_EVICT_VALUES, -1.0f);
    ref->ops->evict_row_norm(ref, vr, ld, &e.br, EV_L, CKV_EVICT_VALUES, -1.0f);
    compare_dev("evict_row_norm", "values", vt, vr, (size_t)EV_KV * ld, 0.0, 0.0);
    float *mu = rand_floats(EV_D, -1.0f, 1.0f), *cov = rand_floats((size_t)EV_D * EV_D, -0.2f, 0.2f);
    for (int a = 0; a < EV_D; a++)
        for (int c = 0; c < a; c++) cov[a * EV_D + c] = cov[c * EV_D + a]; /* symmetric */
    float *mt = cuda_test_upload(tb, mu, EV_D * 4), *mr = cuda_test_upload(ref, mu, EV_D * 4);
    float *cvt = cuda_test_upload(tb, cov, EV_D * EV_D * 4), *cvr = cuda_test_upload(ref, cov, EV_D * EV_D * 4);
    float *lt = dev_poison(tb, 30), *lr = dev_poison(ref, 30);
    CHECK_OK(tb->ops->evict_ea_logits(tb, lt, &e.bt, 1, 5, 30, mt, cvt, sqrtf((float)EV_D)));
    CHECK_OK(ref->ops->evict_ea_logits(ref, lr, &e.br, 1, 5, 30, mr, cvr, sqrtf((float)EV_D)));
    compare_dev("evict_ea_logits", "with covariance", lt, lr, 30, 1e-6, 1e-6);
    /* moments of the query block, accumulated twice */
    float *shift = rand_floats((size_t)EV_HQ * EV_D, -0.3f, 0.3f);
    float *st = cuda_test_upload(tb, shift, sizeof(float) * EV_HQ * EV_D),
          *sr = cuda_test_upload(ref, shift, sizeof(float) * EV_HQ * EV_D);
    double *s1t = (double *)dev_poison(tb, EV_HQ * EV_D * 2), *s1r = (double *)dev_poison(ref, EV_HQ * EV_D * 2);
    double *s2t = (double *)dev_poison(tb, EV_HQ * EV_D * EV_D * 2), *s2r = (double *)dev_poison(ref, EV_HQ * EV_D * EV_D * 2);
    CHECK_OK(tb->ops->evict_moments(tb, s1t, s2t, qt, st, n_q, EV_HQ, EV_D, CKV_EVICT_ZERO_FIRST));
    CHECK_OK(ref->ops->evict_moments(ref, s1r, s2r, qr, sr, n_q, EV_HQ, EV_D, CKV_EVICT_ZERO_FIRST));
    CHECK_OK(tb->ops->evict_moments(tb, s1t, s2t, qt, st, 3, EV_HQ, EV_D, CKV_EVICT_ADD));
    CHECK_OK(ref->ops->evict_moments(ref, s1r, s2r, qr, sr, 3, EV_HQ, EV_D, CKV_EVICT_ADD));
    compare_dev_f64("evict_moments", "s1", s1t, s1r, EV_HQ * EV_D, 1e-6, 1e-6);
    compare_dev_f64("evict_moments", "s2", s2t, s2r, EV_HQ * EV_D * EV_D, 1e-6, 1e-6);
    release2(s1t, s1r), release2(s2t, s2r), release2(st, sr), release2(lt, lr), release2(mt, mr), release2(cvt, cvr);
    release2(vt, vr), release2(wt.data, wr.data), release2(qt, qr);
    free(shift), free(mu), free(cov), free(init), free(hw), free(wo), free(q);
    ev_cache_free(&e);
}

/* The selections over rows of several tiles (the CUDA op splits a row into blocks of 2,048 entries):
 * scores on a coarse grid so that exact ties straddle the tiles, NaNs, cuts inside a tie run;
 * exact against the CPU (kept columns, and each row's count of the cross-row top-k). */
static void test_evict_select_tiles(void) {
    enum { ROWS = 3, N = 5000, LD = 5003 };
    float *x = rand_floats((size_t)ROWS * LD, -1.0f, 1.0f);
    for (int i = 0; i < ROWS * LD; i++) x[i] = roundf(x[i] * 16.0f) / 16.0f; /* 33 values: runs of ~450 ties */
    for (int i = 11; i < ROWS * LD; i += 997) x[i] = NAN;
    float *xt = cuda_test_upload(tb, x, sizeof(float) * ROWS * LD),
          *xr = cuda_test_upload(ref, x, sizeof(float) * ROWS * LD);
    const int32_t k[ROWS] = {1234, 0, N};
    int32_t *kt = cuda_test_upload(tb, k, sizeof k), *kr = cuda_test_upload(ref, k, sizeof k);
    int32_t *it = (int32_t *)dev_poison(tb, (size_t)ROWS * N), *ir = (int32_t *)dev_poison(ref, (size_t)ROWS * N);
    ev_reserve(N, 1, ROWS, CKV_DTYPE_BF16, 16);
    TB_EVICT(CHECK_OK(tb->ops->evict_topk(tb, it, N, xt, LD, ROWS, N, kt)));
    CHECK_OK(ref->ops->evict_topk(ref, ir, N, xr, LD, ROWS, N, kr));
    /* only the first k[r] of row r are defined */
    int32_t *a = xalloc(sizeof(int32_t) * ROWS * N), *b = xalloc(sizeof(int32_t) * ROWS * N);
    cuda_test_download(tb, a, it, sizeof(int32_t) * ROWS * N);
    cuda_test_download(ref, b, ir, sizeof(int32_t) * ROWS * N);
    size_t bad = 0, n_cmp = 0;
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < k[r]; i++, n_cmp++)
            if (a[r * N + i] != b[r * N + i] && bad++ < 5)
                fprintf(stderr, "  evict_topk row %d [%d]: column %d, expected %d\n", r, i, a[r * N + i], b[r * N + i]);
    CHECK_MSG(bad == 0, "%s evict_topk 3 x 5000 with tie runs across tiles: %zu of %zu columns differ", tb_name, bad, n_cmp);
    if (!bad) fprintf(stderr, "ok   %s evict_topk 3 x 5000 with tie runs across tiles: %zu columns identical\n", tb_name, n_cmp);
    int32_t *cntt = cuda_test_upload(tb, k, sizeof k), *cntr = cuda_test_upload(ref, k, sizeof k);
    const int64_t totals[4] = {0, 1, 7777, (int64_t)ROWS * N};
    for (int i = 0; i < 4; i++) {
        TB_EVICT(CHECK_OK(tb->ops->evict_topk_counts(tb, cntt, xt, LD, ROWS, N, totals[i])));
        CHECK_OK(ref->ops->evict_topk_counts(ref, cntr, xr, LD, ROWS, N, totals[i]));
        char cas[48];
        snprintf(cas, sizeof cas, "3 x 5000 total %lld", (long long)totals[i]);
        compare_dev_i32("evict_topk_counts", cas, cntt, cntr, ROWS);
    }
    release2(cntt, cntr), release2(it, ir), release2(kt, kr), release2(xt, xr);
    free(a), free(b), free(x);
}

/* DefensiveKV's window aggregation: double sums in the op's order on both sides, so exact. */
static void test_evict_defensive(void) {
    const int w = 6, n = 37, ld = 41, heads = EV_HQ, n_kv = EV_KV;
    ev_reserve(n, w, n_kv, CKV_DTYPE_BF16, 16);
    float *p = rand_floats((size_t)heads * w * ld, 0.0f, 0.05f);
    float *pt = cuda_test_upload(tb, p, sizeof(float) * heads * w * ld),
          *pr = cuda_test_upload(ref, p, sizeof(float) * heads * w * ld);
    double *at = (double *)dev_poison(tb, (size_t)n_kv * n * 2), *ar = (double *)dev_poison(ref, (size_t)n_kv * n * 2);
    float *mt = dev_poison(tb, (size_t)n_kv * n), *mr = dev_poison(ref, (size_t)n_kv * n);
    double *bt = (double *)dev_poison(tb, 2), *br = (double *)dev_poison(ref, 2);
    for (int pass = 0; pass < 2; pass++) { /* the second pass accumulates */
        const ckv_evict_accum acc = pass == 0 ? CKV_EVICT_ZERO_FIRST : CKV_EVICT_ADD;
        const ckv_evict_defensive_params dt_ = {pt, ld, w, n, heads, 0, 2, 5, n_kv, at, mt, bt, acc},
                                         dr_ = {pr, ld, w, n, heads, 0, 2, 5, n_kv, ar, mr, br, acc};
        TB_EVICT(CHECK_OK(tb->ops->evict_defensive_rows(tb, &dt_)));
        CHECK_OK(ref->ops->evict_defensive_rows(ref, &dr_));
    }
    compare_dev_f64("evict_defensive_rows", "ave", at, ar, (size_t)n_kv * n, 0.0, 0.0);
    compare_dev("evict_defensive_rows", "dmax", mt, mr, (size_t)n_kv * n, 0.0, 0.0);
    compare_dev_f64("evict_defensive_rows", "bias", bt, br, 1, 0.0, 0.0);
    release2(pt, pr), release2(at, ar), release2(mt, mr), release2(bt, br);
    free(p);
}

static void test_evict_rows(void) {
    enum { ROWS = 3, N = 45, LD = 50 };
    float *x = rand_floats((size_t)ROWS * LD, -2.0f, 2.0f);
    for (int i = 0; i < ROWS * LD; i += 7) x[i] = roundf(x[i]); /* exact ties */
    x[3] = NAN, x[LD + 10] = NAN;
    float *xt = cuda_test_upload(tb, x, sizeof(float) * ROWS * LD),
          *xr = cuda_test_upload(ref, x, sizeof(float) * ROWS * LD);
    float *yt = dev_poison(tb, (size_t)ROWS * LD), *yr = dev_poison(ref, (size_t)ROWS * LD);
    /* selections first, on the NaN-bearing scores */
    const int32_t k[ROWS] = {5, 0, N};
    int32_t *kt = cuda_test_upload(tb, k, sizeof k), *kr = cuda_test_upload(ref, k, sizeof k);
    int32_t fill_idx[ROWS * LD];
    for (int i = 0; i < ROWS * LD; i++) fill_idx[i] = -1;
    int32_t *it = cuda_test_upload(tb, fill_idx, sizeof fill_idx),
            *ir = cuda_test_upload(ref, fill_idx, sizeof fill_idx);
    ev_reserve(N, 1, ROWS, CKV_DTYPE_BF16, 16);
    TB_EVICT(CHECK_OK(tb->ops->evict_topk(tb, it, LD, xt, LD, ROWS, N, kt)));
    CHECK_OK(ref->ops->evict_topk(ref, ir, LD, xr, LD, ROWS, N, kr));
    compare_dev_i32("evict_topk", "k 5/0/45 with ties and NaN", it, ir, (size_t)ROWS * LD);
    int32_t *cntt = cuda_test_upload(tb, k, sizeof k), *cntr = cuda_test_upload(ref, k, sizeof k);
    const int64_t totals[3] = {0, 31, ROWS * N};
    for (int i = 0; i < 3; i++) {
        TB_EVICT(CHECK_OK(tb->ops->evict_topk_counts(tb, cntt, xt, LD, ROWS, N, totals[i])));
        CHECK_OK(ref->ops->evict_topk_counts(ref, cntr, xr, LD, ROWS, N, totals[i]));
        char cas[32];
        snprintf(cas, sizeof cas, "total %lld", (long long)totals[i]);
        compare_dev_i32("evict_topk_counts", cas, cntt, cntr, ROWS);
    }
    /* NaN-free rows for the rest */
    for (int i = 0; i < ROWS * LD; i++) x[i] = x[i] != x[i] ? 0.25f : x[i];
    CHECK_OK(tb->ops->upload(tb, xt, x, sizeof(float) * ROWS * LD));
    CHECK_OK(ref->ops->upload(ref, xr, x, sizeof(float) * ROWS * LD));
    tb->ops->evict_scatter(tb, xt, LD, ROWS, it, LD, kt, -5.0f);
    ref->ops->evict_scatter(ref, xr, LD, ROWS, ir, LD, kr, -5.0f);
    compare_dev("evict_scatter", "", xt, xr, (size_t)ROWS * LD, 0.0, 0.0);
    float *mt = dev_poison(tb, 1), *mr = dev_poison(ref, 1);
    tb->ops->evict_max(tb, mt, xt, ROWS, LD, 2, N);
    ref->ops->evict_max(ref, mr, xr, ROWS, LD, 2, N);
    compare_dev("evict_max", "", mt, mr, 1, 0.0, 0.0);
    for (int max = 0; max < 2; max++) {
        const ckv_evict_pool_kind kind = max ? CKV_EVICT_POOL_MAX : CKV_EVICT_POOL_AVG;
        tb->ops->evict_pool(tb, yt, xt, ROWS, N, LD, 5, kind);
        ref->ops->evict_pool(ref, yr, xr, ROWS, N, LD, 5, kind);
        tb->ops->evict_fill(tb, yt, ROWS, LD, N, LD, CKV_EVICT_FILL_VALUE, 0.0f); /* the unused tail, on both */
        ref->ops->evict_fill(ref, yr, ROWS, LD, N, LD, CKV_EVICT_FILL_VALUE, 0.0f);
        compare_dev("evict_pool", max ? "max" : "avg", yt, yr, (size_t)ROWS * LD, 0.0, 0.0);
    }
    tb->ops->evict_add_mul(tb, yt, yt, xt, ROWS, N, LD, 0.125f);
    ref->ops->evict_add_mul(ref, yr, yr, xr, ROWS, N, LD, 0.125f);
    tb->ops->evict_div(tb, yt, (size_t)ROWS * LD, 3.0f);
    ref->ops->evict_div(ref, yr, (size_t)ROWS * LD, 3.0f);
    compare_dev("evict_add_mul + evict_div", "", yt, yr, (size_t)ROWS * LD, 0.0, 0.0);
    float *dt = dev_poison(tb, (size_t)2 * LD), *dr = dev_poison(ref, (size_t)2 * LD);
    tb->ops->evict_fill(tb, dt, 2, LD, 0, LD, CKV_EVICT_FILL_INDEX, 0.0f);
    ref->ops->evict_fill(ref, dr, 2, LD, 0, LD, CKV_EVICT_FILL_INDEX, 0.0f);
    tb->ops->evict_head_sum(tb, dt, LD, yt, LD, ROWS, N, 1, 2);
    ref->ops->evict_head_sum(ref, dr, LD, yr, LD, ROWS, N, 1, 2);
    compare_dev("evict_fill + evict_head_sum", "", dt, dr, (size_t)2 * LD, 0.0, 0.0);
    tb->ops->evict_random(tb, yt, ROWS, N, LD, 1234567ull, 3, 2);
    ref->ops->evict_random(ref, yr, ROWS, N, LD, 1234567ull, 3, 2);
    compare_dev("evict_random", "", yt, yr, (size_t)ROWS * LD, 0.0, 0.0);
    float *ot = dev_poison(tb, N), *orf = dev_poison(ref, N);
    tb->ops->evict_fill(tb, ot, 1, N, 0, N, CKV_EVICT_FILL_VALUE, 0.5f);
    ref->ops->evict_fill(ref, orf, 1, N, 0, N, CKV_EVICT_FILL_VALUE, 0.5f);
    tb->ops->evict_softmax_add(tb, ot, xt, N);
    ref->ops->evict_softmax_add(ref, orf, xr, N);
    compare_dev("evict_softmax_add", "", ot, orf, N, 1e-7, 1e-6);
    release2(ot, orf), release2(dt, dr), release2(mt, mr), release2(cntt, cntr), release2(it, ir), release2(kt, kr);
    release2(yt, yr), release2(xt, xr);
    free(x);
}

/* ---- sampling ---------------------------------------------------------------------------------
 * Exact: the same token as the CPU op and as engine/sampler.c (fed the same uniform draw) for every
 * row; all three measure top-p over the whole softmax, or over the top-k candidates when top_k > 0.
 * Rows of distinct logits and rows of many exact ties (logits on a grid of 0.5). */
static void test_sample(float temperature, int top_k, float top_p) {
    enum { ROWS = 4, V = 300 };
    float *x = rand_floats((size_t)ROWS * V, -4.0f, 4.0f);
    for (int i = 2 * V; i < ROWS * V; i++) x[i] = roundf(x[i] * 2.0f) * 0.5f; /* rows 2, 3: ties */
    cuda_test_sample_agree(tb, ref, x, ROWS, V, temperature, top_k, top_p, rng_u32());
    free(x);
}

/* ---- error paths of the emulated device -------------------------------------------------------- */

static void test_emu_errors(void) {
    ckv_backend *be = NULL;
    ckv_cuda_emu_set_devices(0, 9, 0);
    CHECK_FAILS(ckv_backend_cuda_emu_init(&be, 0), CKV_STATUS_ERR_DEVICE, "no CUDA GPU");
    ckv_cuda_emu_set_devices(1, 7, 5);
    CHECK_FAILS(ckv_backend_cuda_emu_init(&be, 0), CKV_STATUS_ERR_UNSUPPORTED, "compute capability 7.5");
    ckv_cuda_emu_set_devices(2, 9, 0);
    CHECK_FAILS(ckv_backend_cuda_emu_init(&be, 5), CKV_STATUS_ERR_ARG, "--device 5");
    ckv_cuda_emu_set_devices(1, 8, 0);
    CHECK_OK(ckv_backend_cuda_emu_init(&be, -1));
    if (!be) return;
    /* a kernel fault surfaces from sync() and names the op */
    const int n = 4, dim = 64;
    float *x = rand_floats((size_t)n * dim, -1.0f, 1.0f);
    float *xd = cuda_test_upload(be, x, sizeof(float) * n * dim), *wd = cuda_test_upload(be, x, sizeof(float) * dim);
    ckv_cuda_emu_inject_fault("rmsnorm_kernel");
    be->ops->rmsnorm(be, xd, xd, wd, n, dim, 1e-6f);
    CHECK_FAILS(be->ops->sync(be), CKV_STATUS_ERR_DEVICE, "rmsnorm: ckv-emu: injected fault");
    ckv_backend_free(be);
    ckv_cuda_emu_reset();
    /* an invalid call of a void op is reported by sync(), naming the op */
    CHECK_OK(ckv_backend_cuda_emu_init(&be, 0));
    ckv_kv_batch bad = {CKV_DTYPE_BF16, 16, 3, 1, NULL, NULL, NULL, 1};
    be->ops->attention(be, NULL, &(ckv_attention_params){NULL, NULL, &bad, 1, 4, 1.0f});
    CHECK_FAILS(be->ops->sync(be), CKV_STATUS_ERR_UNSUPPORTED, "attention: 4 query heads over 3 KV heads");
    CHECK_OK(be->ops->sync(be)); /* reported once */
    /* an upload to memory that is not a device buffer fails (no host pointer where a device one is meant) */
    CHECK_FAILS(be->ops->upload(be, x, x, 16), CKV_STATUS_ERR_DEVICE, "upload");
    ckv_backend_free(be);
    ckv_cuda_emu_reset();
    free(x);
}

/* ---- main ------------------------------------------------------------------------------------- */

int main(int argc, char **argv) {
    tb_name = argc > 1 ? argv[1] : "cuda-emu";
    if (strcmp(tb_name, "cuda-emu") == 0) test_emu_errors();
    const int rc = cuda_test_open(argc, argv, "test_backend_ops", &tb);
    if (rc >= 0) return rc;
    CHECK_OK(ckv_backend_cpu_init(&ref, 1));
    CHECK(tb->weight_dtype == CKV_DTYPE_BF16 && tb->kv_dtype == CKV_DTYPE_BF16);
    CHECK(tb->ops->weight_dtype_ok(tb, CKV_DTYPE_BF16) && tb->ops->kv_dtype_ok(tb, CKV_DTYPE_BF16));

    test_embedding(CKV_DTYPE_BF16);
    test_embedding(CKV_DTYPE_F32);
    test_rmsnorm(3, 96, 0);
    test_rmsnorm(2, 1000, 1);
    test_rope(5, 3, 32, 1.0f, 0);
    test_rope(4, 2, 64, 1.1f, 1);
    test_elementwise(1000);
    test_count_nonfinite(3000);
    test_matmul(CKV_DTYPE_BF16, 1, 64, 40, 0);
    test_matmul(CKV_DTYPE_BF16, 7, 96, 33, 1);
    test_matmul(CKV_DTYPE_F32, 5, 48, 20, 1);
    const int one[1] = {5}, three[3] = {3, 1, 6};
    test_kv_store(CKV_DTYPE_BF16, 1, one);
    test_kv_store(CKV_DTYPE_F32, 3, three);
    test_kv_gather(CKV_DTYPE_BF16);
    test_kv_gather(CKV_DTYPE_F32);
    test_attention_all();
    test_evict_attention(CKV_DTYPE_BF16);
    test_evict_attention(CKV_DTYPE_F32);
    test_evict_rows();
    test_evict_select_tiles();
    test_evict_defensive();
    test_sample(0.0f, 0, 1.0f);
    test_sample(1.0f, 0, 1.0f);
    test_sample(0.7f, 20, 1.0f);
    test_sample(1.3f, 0, 0.9f);
    test_sample(1.0f, 50, 0.8f);
    test_sample(0.5f, 3, 0.5f);
    CHECK_OK(tb->ops->sync(tb));
    CHECK_MSG(evict_op_allocs == 0, "%s: the eviction ops allocated %llu times after evict_reserve", tb_name,
              evict_op_allocs);
    if (strcmp(tb_name, "cuda-emu") == 0 && evict_op_allocs == 0)
        fprintf(stderr, "ok   cuda-emu: no eviction op allocated after evict_reserve\n");
    CHECK_FAILS(tb->ops->evict_reserve(tb, NULL), CKV_STATUS_ERR_ARG, "evict_reserve");

    ckv_backend_free(tb);
    ckv_backend_free(ref);
    return ckv_test_finish("test_backend_ops");
}
