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
#define _POSIX_C_SOURCE 200809L /* setenv */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_emu.h"
#include "backend_ops_harness.h"

ckv_backend *tb;
ckv_backend *ref;
const char *tb_name;
uint64_t rng_state = 0x243F6A8885A308D3ull;

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

/* kv_rerotate over the segments of 2 sequences (different lengths, positions with gaps): the same fp32
 * angles; CUDA's sinf/cosf are within 2 ulp, so f32 keys agree to 4e-6 (|x| <= 1) and a bf16 key may
 * round to the neighbouring value (one bf16 ulp); values, positions (each kept row's its index) and
 * lengths exactly. */
static void test_kv_rerotate(ckv_dtype dt) {
    const int n_seq = 2, n_kv = 3, hd = 16, cap = 40;
    int lens[2 * 3] = {40, 23, 0, 7, 31, 1};
    test_kv_host h;
    kv_host_random(&h, dt, n_seq, n_kv, hd, cap, lens, 4);
    float inv[8];
    for (int i = 0; i < hd / 2; i++) inv[i] = powf(500000.0f, -2.0f * (float)i / (float)hd);
    test_kv ct, cr;
    kv_build(&ct, tb, dt, n_seq, n_kv, hd, cap, &h);
    kv_build(&cr, ref, dt, n_seq, n_kv, hd, cap, &h);
    float *ft = cuda_test_upload(tb, inv, sizeof inv), *fr = cuda_test_upload(ref, inv, sizeof inv);
    ckv_kv_batch bt = kv_batch(&ct, NULL, NULL, cap), br = kv_batch(&cr, NULL, NULL, cap);
    tb->ops->kv_rerotate(tb, &bt, ft);
    ref->ops->kv_rerotate(ref, &br, fr);
    const size_t nseg = (size_t)n_seq * n_kv, rows = (size_t)cap * hd;
    float *ka = xalloc(nseg * rows * 4), *va = xalloc(nseg * rows * 4), *kb = xalloc(nseg * rows * 4),
          *vb = xalloc(nseg * rows * 4);
    int32_t *pa = xalloc(nseg * (size_t)cap * 4), *pb = xalloc(nseg * (size_t)cap * 4);
    int la[6], lb[6];
    kv_fetch(&ct, ka, va, pa, la);
    kv_fetch(&cr, kb, vb, pb, lb);
    int bad = memcmp(la, lb, sizeof la) != 0 || memcmp(va, vb, nseg * rows * 4) != 0 || memcmp(pa, pb, nseg * (size_t)cap * 4) != 0;
    for (size_t sg = 0; sg < nseg; sg++)
        for (int i = 0; i < la[sg]; i++) bad += pa[sg * (size_t)cap + (size_t)i] != i; /* each kept row at its index */
    double worst = 0;
    for (size_t i = 0; i < nseg * rows; i++) {
        const double e = fabs((double)ka[i] - kb[i]), bound = dt == CKV_DTYPE_F32 ? 4e-6 : fabs(kb[i]) / 128 + 1e-6;
        worst = fmax(worst, e);
        if (e > bound && bad++ < 5) fprintf(stderr, "  kv_rerotate key %zu: %.8g, expected %.8g\n", i, ka[i], kb[i]);
    }
    char cas[64];
    snprintf(cas, sizeof cas, "%s seqs=%d heads=%d", ckv_dtype_name(dt), n_seq, n_kv);
    CHECK_MSG(!bad, "kv_rerotate %s: keys, values, positions or lengths differ (max key error %.3g)", cas, worst);
    if (!bad) fprintf(stderr, "ok   kv_rerotate %s: max key error %.3g\n", cas, worst);
    free(ka), free(va), free(kb), free(vb), free(pa), free(pb);
    release2(ft, fr);
    kv_free(&ct), kv_free(&cr);
    kv_host_free(&h);
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

static unsigned long long attn_launches, attn_allocs; /* of the last op on the emulated device */
static int attn_repeat; /* 1: run the op twice and require identical outputs */

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
    unsigned long long k0 = 0, k1 = 0, a0 = 0;
    if (strcmp(tb_name, "cuda-emu") == 0) ckv_cuda_emu_launches(&k0, NULL), a0 = ckv_cuda_emu_alloc_calls();
    tb->ops->attention(tb, ot, &(ckv_attention_params){qt, pt, &bt, n, n_heads, scale});
    if (strcmp(tb_name, "cuda-emu") == 0) {
        ckv_cuda_emu_launches(&k1, NULL);
        attn_launches = k1 - k0, attn_allocs = ckv_cuda_emu_alloc_calls() - a0;
    }
    ref->ops->attention(ref, orf, &(ckv_attention_params){qr, pr, &br, n, n_heads, scale});
    const int prefill = n > 4 * ac->n_seq && (hd == 16 || hd == 32 || hd == 64 || hd == 80 || hd == 96 || hd == 128);
    const int rounded = prefill && ac->dt == CKV_DTYPE_BF16; /* f32 caches: fp32-class products */
    char cas[160];
    snprintf(cas, sizeof cas, "%s (%s, %s kv, %d seq, %d tokens, heads %d/%d, hd %d)", ac->name,
             prefill ? "tensor-core prefill" : "split-KV", ckv_dtype_name(ac->dt), ac->n_seq, n, n_heads, n_kv, hd);
    compare_dev("attention", cas, ot, orf, nq, rounded ? 1e-2 : 2e-5, rounded ? 0.0 : 1e-4);
    if (attn_repeat) { /* the same op again: the same bits (fixed split plan and merge order) */
        float *o2 = dev_poison(tb, nq), *a = xalloc(nq * 4), *b = xalloc(nq * 4);
        tb->ops->attention(tb, o2, &(ckv_attention_params){qt, pt, &bt, n, n_heads, scale});
        cuda_test_download(tb, a, ot, nq * 4);
        cuda_test_download(tb, b, o2, nq * 4);
        compare("attention repeated", cas, b, a, nq, 0.0, 0.0);
        tb->ops->release(tb, o2);
        free(a), free(b);
    }
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
        /* the split kernel's tile loads: 16-byte chunks (bf16 hd 40) and element loads (rows not
         * whole 16-byte chunks: bf16 hd 20, f32 hd 18) */
        {"long bf16 hd 40", CKV_DTYPE_BF16, 1, 2, 2, 40, {12},          {37},          1, 0},
        {"long bf16 hd 20", CKV_DTYPE_BF16, 2, 1, 3, 20, {10, 14},      {30, 5},       1, 0},
        {"long f32 hd 18", CKV_DTYPE_F32,  1, 1, 2, 18, {9},            {40},          0, 0},
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

/* Every case on a backend opened with VAR = each of modes (read at init), against the CPU op, named
 * "<case>, VAR=mode"; where launches[m] > 0, on the emulated device the op must launch that many
 * kernels and allocate nothing. Then the two bad values are refused at init, naming the variable. */
static void test_attention_modes(const attn_case *cases, size_t n_cases, const char *var, const char *const *modes,
                                 const unsigned long long *launches, size_t n_modes, const char *const bad[2]) {
    const int emu = strcmp(tb_name, "cuda-emu") == 0;
    ckv_backend *const keep = tb;
    for (size_t m = 0; m < n_modes; m++) {
        setenv(var, modes[m], 1);
        ckv_backend *be = NULL;
        CHECK_OK(emu ? ckv_backend_cuda_emu_init(&be, 0) : ckv_backend_init(&be, "cuda", 0));
        if (!be) continue;
        tb = be;
        for (size_t i = 0; i < n_cases; i++) {
            attn_case ac = cases[i];
            char name[64];
            snprintf(name, sizeof name, "%s, %s=%s", ac.name, var, modes[m]);
            ac.name = name;
            test_attention(&ac);
            if (emu && launches[m] && (attn_launches != launches[m] || attn_allocs != 0)) {
                fprintf(stderr, "FAIL %s: %llu kernel launches (expected %llu), %llu allocations (expected 0)\n", name,
                        attn_launches, launches[m], attn_allocs);
                ckv_test_failures++;
            }
        }
        CHECK_OK(tb->ops->sync(tb));
        ckv_backend_free(be);
        tb = keep;
    }
    if (emu)
        for (int b = 0; b < 2; b++) {
            ckv_backend *refused = NULL;
            char what[64];
            snprintf(what, sizeof what, "%s=%s", var, bad[b]);
            setenv(var, bad[b], 1);
            CHECK_FAILS(ckv_backend_cuda_emu_init(&refused, 0), CKV_STATUS_ERR_ARG, what);
        }
    unsetenv(var);
}

/* The tensor-core decode kernel (docs/gpu.md §4: bf16, 4-8 query rows per segment, head dims 64-128):
 * GQA 4, 5, 7, 8, one split and many, ragged segments, compacted caches, queries that see nothing or
 * one key, a segment of more rows than a pass (3 tokens of group 4 over 2 sequences); on the default
 * backend (that kernel) and on one opened with CKV_CUDA_DECODE_MMA=0 (the FMA kernel for the same
 * shapes), both at the decode bound. A value other than 0 or 1 is refused at init, naming it. */
static void test_attention_decode_mma(void) {
    static const attn_case cases[] = {
        /* name             dtype          seq kv  G  hd  tokens          lens           gaps early */
        {"mma G4 hd 64",   CKV_DTYPE_BF16, 1, 2, 4, 64, {1},            {40},          0, 0},
        {"mma G5 hd 80",   CKV_DTYPE_BF16, 2, 2, 5, 80, {1, 1},         {700, 37},     2, 0},
        {"mma G7 hd 128",  CKV_DTYPE_BF16, 1, 1, 7, 128, {1},           {2100},        1, 0},
        {"mma G8 hd 64",   CKV_DTYPE_BF16, 3, 1, 8, 64, {1, 1, 1},      {300, 5, 1030}, 2, 0},
        {"mma G8 hd 96",   CKV_DTYPE_BF16, 2, 2, 8, 96, {1, 1},         {20, 600},     2, 0},
        {"mma G4 early",   CKV_DTYPE_BF16, 2, 2, 4, 96, {2, 1},         {20, 600},     2, 1},
        {"mma G4 3 tokens", CKV_DTYPE_BF16, 2, 1, 4, 128, {3, 1},       {260, 70},     1, 0},
    };
    static const char *const modes[] = {"1", "0"}, *const bad[2] = {"2", "yes"};
    static const unsigned long long launches[] = {0, 0};
    test_attention_modes(cases, sizeof cases / sizeof cases[0], "CKV_CUDA_DECODE_MMA", modes, launches, 2, bad);
}

/* ---- prefill split-K (docs/gpu.md §3b) ---------------------------------------------------------
 * Query chunks over long cached prefixes: few blocks of query rows, so the planned split-K cuts
 * each block's keys into splits merged afterwards. Every case runs on backends with split-K forced
 * off (CKV_CUDA_PREFILL_SPLITS=1), planned (0) and forced to 3 and 7 splits (boundaries inside the
 * causal diagonal, splits a row sees nothing of, queries that see nothing at all), against the CPU
 * op at the prefill bounds above, and run twice with identical outputs. On the emulated device the
 * op must launch one kernel when off and two (the prefill kernel, the merge) otherwise, and
 * allocate nothing (the partials are reserved at init). */
static void test_attention_split_k(void) {
    static const attn_case cases[] = {
        /* name             dtype          seq kv  G  hd  tokens          lens           gaps early */
        {"chunk hd128",    CKV_DTYPE_BF16, 1, 1, 4, 128, {70},          {1500},        0, 0},
        {"chunk f32 128",  CKV_DTYPE_F32,  1, 1, 2, 128, {40},          {1200},        0, 0},
        {"chunk hd 64",    CKV_DTYPE_BF16, 1, 2, 2, 64, {40},           {2000},        3, 0},
        {"chunk f32 64",   CKV_DTYPE_F32,  1, 2, 1, 64, {20},           {1100},        0, 1},
        {"chunk hd 80",    CKV_DTYPE_BF16, 2, 2, 2, 80, {66, 9},        {1200, 700},   1, 0},
        {"chunk f32 80",   CKV_DTYPE_F32,  1, 1, 2, 80, {30},           {1300},        2, 0},
        {"chunk hd 96",    CKV_DTYPE_BF16, 1, 1, 2, 96, {24},           {1300},        0, 1},
        {"chunk f32 96",   CKV_DTYPE_F32,  2, 1, 2, 96, {9, 33},        {900, 1400},   0, 0},
    };
    static const char *const modes[] = {"1", "0", "3", "7"}, *const bad[2] = {"65", "two"};
    static const unsigned long long launches[] = {1, 2, 2, 2}; /* off: the kernel; else and the merge */
    attn_repeat = 1;
    test_attention_modes(cases, sizeof cases / sizeof cases[0], "CKV_CUDA_PREFILL_SPLITS", modes, launches, 4, bad);
    attn_repeat = 0;
}

/* The prefill's 8-warp blocks (128 query rows): the launch takes them for bf16 caches at head dims
 * 64-128 when their grid fills the SMs, which these shapes do on a simulated GPU of one SM (a
 * second backend, opened on it): partial and full row blocks, several row blocks over several key
 * tiles, compacted caches, two sequences, GQA. A GPU takes them at its own SM count: 64 heads of
 * 256 tokens (128 blocks of 128 rows) on 108-132 SMs. */
static void test_attention_wide(void) {
    static const attn_case cases[] = {
        /* name             dtype          seq kv  G  hd  tokens          lens           gaps early */
        {"wide hd128",     CKV_DTYPE_BF16, 1, 2, 2, 128, {200},         {90},          0, 0},
        {"wide gaps",      CKV_DTYPE_BF16, 1, 2, 2, 64, {140},          {30},          3, 0},
        {"wide hd 80",     CKV_DTYPE_BF16, 2, 2, 2, 80, {70, 131},      {60, 3},       1, 0},
        {"wide hd 96",     CKV_DTYPE_BF16, 1, 1, 4, 96, {66},           {70},          0, 0},
        {"wide early",     CKV_DTYPE_BF16, 1, 1, 2, 128, {130},         {10},          2, 1},
    };
    static const attn_case gpu_grid = {"wide, GPU grid", CKV_DTYPE_BF16, 1, 4, 16, 128, {256}, {300}, 1, 0};
    if (strcmp(tb_name, "cuda-emu") != 0) {
        test_attention(&gpu_grid);
        return;
    }
    ckv_backend *gpu = tb;
    ckv_cuda_emu_set_sms(1);
    CHECK_OK(ckv_backend_cuda_emu_init(&tb, 0));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_attention(&cases[i]);
    CHECK_OK(tb->ops->sync(tb));
    ckv_backend_free(tb);
    ckv_cuda_emu_set_sms(0);
    tb = gpu;
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

/* Rows over Qwen2.5's 152,064-token vocabulary (many blocks per row; every other row of many exact
 * ties), batch 1 or 16, the draws the engine's sampler takes. */
static void test_sample_vocab(int rows, float temperature, int top_k, float top_p) {
    enum { V = 152064 };
    float *x = rand_floats((size_t)rows * V, -4.0f, 4.0f);
    for (int r = 1; r < rows; r += 2)
        for (int i = 0; i < V; i++) x[(size_t)r * V + i] = roundf(x[(size_t)r * V + i] * 2.0f) * 0.5f;
    cuda_test_sample_agree(tb, ref, x, rows, V, temperature, top_k, top_p, rng_u32());
    free(x);
}

/* Draws at the ends of [0, 1): 0, 1e-12, 0.5 and the largest double below 1, on a row of distinct
 * logits and a row of ties; the same token as the CPU op (the largest draw may round beyond the
 * prefix's mass: then the prefix's last candidate). */
static void test_sample_draw_ends(int V, float temperature, int top_k, float top_p) {
    enum { ROWS = 8 };
    float *x = rand_floats((size_t)ROWS * V, -4.0f, 4.0f);
    for (int r = 4; r < ROWS; r++)
        for (int i = 0; i < V; i++) x[(size_t)r * V + i] = x[i % 29] >= 0.0f ? 1.5f : -0.5f; /* two values */
    const double ends[4] = {0.0, 1e-12, 0.5, nextafter(1.0, 0.0)};
    double u[ROWS];
    for (int r = 0; r < ROWS; r++) u[r] = ends[r % 4];
    int32_t got[2][ROWS];
    cuda_test_sample_pair(tb, ref, x, ROWS, V, temperature, top_k, top_p, u, got[0], got[1]);
    int bad = 0;
    for (int r = 0; r < ROWS; r++)
        if (got[0][r] != got[1][r] || got[1][r] < 0 || got[1][r] >= V)
            bad++, fprintf(stderr, "  row %d u %.17g: %s token %d, cpu op %d\n", r, u[r], tb->name, got[0][r], got[1][r]);
    CHECK_MSG(bad == 0, "sample V=%d T=%g top_k=%d top_p=%g at draws 0 .. 1-2^-53: %d of %d rows differ", V,
              temperature, top_k, top_p, bad, ROWS);
    if (!bad)
        fprintf(stderr, "ok   %s sample V=%d T=%g top_k=%d top_p=%g at draws 0 .. 1-2^-53: tokens %d %d %d %d | %d %d %d %d "
                "identical to the cpu op\n", tb->name, V, temperature, top_k, top_p, got[0][0], got[0][1], got[0][2],
                got[0][3], got[0][4], got[0][5], got[0][6], got[0][7]);
    free(x);
}

/* A row holding NaN, +Inf or -Inf samples CKV_SAMPLE_NONFINITE on both backends (greedy and
 * sampled); the finite row beside them is sampled as always. */
static void test_sample_nonfinite(int V, float temperature) {
    enum { ROWS = 4 };
    float *x = rand_floats((size_t)ROWS * V, -4.0f, 4.0f);
    x[1 * V + 17] = NAN;
    x[2 * V + V - 1] = INFINITY;
    x[3 * V + 0] = -INFINITY;
    const double u[ROWS] = {0.25, 0.5, 0.75, 0.125};
    int32_t got[2][ROWS];
    ckv_backend *bes[2] = {tb, ref};
    cuda_test_sample_pair(tb, ref, x, ROWS, V, temperature, 0, 1.0f, u, got[0], got[1]);
    int bad = 0;
    for (int w = 0; w < 2; w++) {
        if (got[w][0] < 0 || got[w][0] >= V) bad++, fprintf(stderr, "  %s row 0 (finite): id %d\n", bes[w]->name, got[w][0]);
        for (int r = 1; r < ROWS; r++)
            if (got[w][r] != CKV_SAMPLE_NONFINITE)
                bad++, fprintf(stderr, "  %s row %d (non-finite): id %d, expected %d\n", bes[w]->name, r, got[w][r],
                               CKV_SAMPLE_NONFINITE);
    }
    CHECK_MSG(bad == 0 && got[0][0] == got[1][0],
              "sample V=%d T=%g with non-finite rows: %d wrong ids, finite row %d vs cpu %d", V, temperature, bad,
              got[0][0], got[1][0]);
    free(x);
}

/* ---- uploads staged through page-locked memory -------------------------------------------------
 * 48 uploads of 256 KiB (12 MiB: three times the backend's 4 MiB ring) from one host buffer that is
 * rewritten after each call, into 48 device buffers: every buffer must hold what the host buffer
 * held at its call. The layer runs a copy from page-locked memory when the stream runs, so a ring
 * reused before its copies ran shows up as wrong bytes; and the ring must not wait for the device
 * more often than it fills (the 48 uploads may wait at most 3 times). */
static void test_upload_staging(void) {
    enum { N = 48, WORDS = 64 * 1024 };
    uint32_t *host = malloc(sizeof(uint32_t) * WORDS), *back = malloc(sizeof(uint32_t) * WORDS);
    uint32_t *dev[N];
    const unsigned long long w0 = ckv_cuda_emu_host_waits();
    for (int b = 0; b < N; b++) {
        CHECK_OK(tb->ops->alloc(tb, (void **)&dev[b], sizeof(uint32_t) * WORDS, "staging test"));
        for (int i = 0; i < WORDS; i++) host[i] = (uint32_t)b * 2654435761u + (uint32_t)i;
        CHECK_OK(tb->ops->upload(tb, dev[b], host, sizeof(uint32_t) * WORDS));
    }
    const unsigned long long waits = ckv_cuda_emu_host_waits() - w0;
    int wrong = 0;
    for (int b = 0; b < N; b++) {
        cuda_test_download(tb, back, dev[b], sizeof(uint32_t) * WORDS);
        for (int i = 0; i < WORDS; i++)
            if (back[i] != (uint32_t)b * 2654435761u + (uint32_t)i) {
                if (wrong++ < 3) fprintf(stderr, "  upload %d word %d: %u, expected %u\n", b, i, back[i],
                                         (uint32_t)b * 2654435761u + (uint32_t)i);
            }
        tb->ops->release(tb, dev[b]);
    }
    CHECK_MSG(wrong == 0, "staged uploads: %d words wrong (a staging buffer reused before its copy ran)", wrong);
    CHECK_MSG(waits <= 3, "48 staged uploads of 256 KiB waited for the device %llu times (at most 3: one per ring filled)",
              waits);
    if (!wrong && waits <= 3) fprintf(stderr, "ok   %s: 48 staged uploads of 256 KiB intact, %llu host waits\n", tb->name, waits);
    free(host);
    free(back);
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
    if (strcmp(tb_name, "cuda-emu") == 0) test_upload_staging(); /* counts the layer's host waits */
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
    test_kv_rerotate(CKV_DTYPE_BF16);
    test_kv_rerotate(CKV_DTYPE_F32);
    test_attention_all();
    test_attention_decode_mma();
    test_attention_split_k();
    test_attention_wide();
    ckv_test_failures += test_backend_evict_ops();
    test_sample(0.0f, 0, 1.0f);
    test_sample(1.0f, 0, 1.0f);
    test_sample(0.7f, 20, 1.0f);
    test_sample(1.3f, 0, 0.9f);
    test_sample(1.0f, 50, 0.8f);
    test_sample(0.5f, 3, 0.5f);
    test_sample_nonfinite(300, 0.0f);
    test_sample_nonfinite(300, 1.0f);
    test_sample_nonfinite(152064, 0.7f);
    test_sample_draw_ends(300, 1.0f, 0, 1.0f);
    test_sample_draw_ends(5000, 0.8f, 40, 0.9f);
    test_sample_vocab(1, 1.0f, 0, 1.0f);
    test_sample_vocab(1, 0.7f, 40, 0.9f);
    test_sample_vocab(1, 1.2f, 1, 1.0f);
    test_sample_vocab(1, 0.5f, 152064, 0.9f);
    test_sample_vocab(16, 0.7f, 40, 0.9f);
    CHECK_OK(tb->ops->sync(tb));

    ckv_backend_free(tb);
    ckv_backend_free(ref);
    return ckv_test_finish("test_backend_ops");
}
