/* test_backend_ops_evict.c - the eviction ops of a device backend against the CPU backend (part of
 * test_backend_ops; the harness and its conventions: backend_ops_harness.h): window attention and
 * its column sums, Compactor's chunked non-causal attention, KVzip's replayed attention maxima, ChunkKV's chunk selection, the row ops, the tiled selection, DefensiveKV's rows, leverage, and that no
 * eviction op allocates device memory once evict_reserve has sized its scratch (leverage's too). */
#include "backend/cuda/cuda_emu.h"
#include "backend_ops_harness.h"

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

/* n_kv segments of `rows` random rows of head dim hd on both backends; gaps > 0: positions with
 * random holes, different per head */
static void ev_cache_init_shape(ev_cache *e, ckv_dtype dt, int n_kv, int hd, int rows, int gaps) {
    int lens[KV_MAX_HEADS];
    for (int g = 0; g < n_kv; g++) lens[g] = rows;
    kv_host_random(&e->h, dt, 1, n_kv, hd, rows, lens, gaps);
    kv_build(&e->ct, tb, dt, 1, n_kv, hd, rows, &e->h);
    kv_build(&e->cr, ref, dt, 1, n_kv, hd, rows, &e->h);
    e->bt = kv_batch(&e->ct, NULL, NULL, rows);
    e->br = kv_batch(&e->cr, NULL, NULL, rows);
}

static void ev_cache_init_gaps(ev_cache *e, ckv_dtype dt, int gaps) { ev_cache_init_shape(e, dt, EV_KV, EV_D, EV_L, gaps); }

static void ev_cache_init(ev_cache *e, ckv_dtype dt) { ev_cache_init_gaps(e, dt, 0); }

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

static void ev_reserve_k(int rows, int query_rows, int n_kv_all, ckv_dtype kv, int hidden, int sketch) {
    const ckv_evict_shape sh = {rows, query_rows, EV_HQ, EV_KV, n_kv_all, EV_D, hidden, kv, CKV_DTYPE_BF16, sketch};
    CHECK(ckv_backend_supports(tb, CKV_BACKEND_CAP_EVICT_RESERVE));
    if (ckv_backend_supports(tb, CKV_BACKEND_CAP_EVICT_RESERVE)) CHECK_OK(tb->ops->evict_reserve(tb, &sh));
}

static void ev_reserve(int rows, int query_rows, int n_kv_all, ckv_dtype kv, int hidden) {
    ev_reserve_k(rows, query_rows, n_kv_all, kv, hidden, 0);
}

/* Leverage of all rows and of a block of them (Compactor's chunks), sketch k = 96 (its scratch the
 * largest of the layer), keys rotated back at each segment's own positions (gapped, different per
 * head, as after a compression): scores within 1e-4 relative (CUDA's sketch, Gram matrix and solve in double,
 * the CPU's in fp32 GEMMs), statistics likewise; after evict_reserve with the sketch it allocates nothing. */
static void test_evict_leverage(ckv_dtype dt) {
    enum { K = 96 };
    ev_cache e;
    ev_cache_init_gaps(&e, dt, 3);
    ev_reserve_k(EV_L, 1, EV_KV, dt, 0, K); /* no value norms: leverage sizes the workspace */
    float invf[EV_D / 2];
    for (int i = 0; i < EV_D / 2; i++) invf[i] = powf(10000.0f, -2.0f * (float)i / EV_D);
    float *phi = rand_floats((size_t)EV_KV * EV_D * K, -1.0f, 1.0f);
    float *it = cuda_test_upload(tb, invf, sizeof invf), *ir = cuda_test_upload(ref, invf, sizeof invf);
    float *ft = cuda_test_upload(tb, phi, sizeof(float) * EV_KV * EV_D * K);
    float *fr = cuda_test_upload(ref, phi, sizeof(float) * EV_KV * EV_D * K);
    const struct { int row0, n; const char *cas; } cases[] = {{0, EV_L, "all rows"}, {8, 24, "rows 8..31"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float *ot = dev_poison(tb, (size_t)EV_KV * EV_L), *orf = dev_poison(ref, (size_t)EV_KV * EV_L);
        double *st = NULL, *sr = NULL;
        CHECK_OK(tb->ops->alloc(tb, (void **)&st, 2 * EV_KV * sizeof(double), "stats"));
        CHECK_OK(ref->ops->alloc(ref, (void **)&sr, 2 * EV_KV * sizeof(double), "stats"));
        TB_EVICT(CHECK_OK(tb->ops->evict_leverage(tb, ot, EV_L, st, &e.bt, cases[c].row0, cases[c].n, it, 1.0f, ft, K)));
        CHECK_OK(ref->ops->evict_leverage(ref, orf, EV_L, sr, &e.br, cases[c].row0, cases[c].n, ir, 1.0f, fr, K));
        char what[64];
        snprintf(what, sizeof what, "%s %s", ckv_dtype_name(dt), cases[c].cas);
        for (int g = 0; g < EV_KV; g++) /* the rows the op wrote (the rest stays poisoned on both) */
            compare_dev("evict_leverage", what, ot + (size_t)g * EV_L, orf + (size_t)g * EV_L, (size_t)cases[c].n, 1e-6, 1e-4);
        compare_dev_f64("evict_leverage stats", what, st, sr, 2 * EV_KV, 1e-6, 1e-4);
        release2(ot, orf), release2(st, sr);
    }
    release2(it, ir), release2(ft, fr);
    free(phi);
    ev_cache_free(&e);
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

/* The window scores at the shapes the tensor-core kernels take (cuda_evict_window.cu): head dims
 * 64/80/96/128, GQA 1/4/8 (one with the local heads a TP rank's slice, head0 > 0), windows
 * 16/32/64 (one of 24 rows: padded warp rows), key counts not a multiple of the 64 / 32-key tiles,
 * one over two 512-key chunks (pass 1's merge); colsum per KV head and per query head, two query
 * blocks into one sum, and the weights. Bounds as test_evict_attention's. */
static void test_evict_window_shapes(ckv_dtype dt) {
    static const struct { int hd, n_kv, group, n_heads, head0, n_q, len, n_cols; } cases[] = {
        {64, 2, 1, 2, 0, 16, 150, 150},  {80, 2, 4, 8, 0, 32, 203, 171},  {96, 1, 8, 8, 0, 64, 190, 190},
        {128, 2, 4, 4, 2, 64, 561, 497}, {64, 3, 2, 6, 0, 24, 77, 77},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int hd = cases[k].hd, n_kv = cases[k].n_kv, H = cases[k].n_heads, n_q = cases[k].n_q, L = cases[k].len;
        const int n_cols = cases[k].n_cols, q_row0 = L - n_q, group = cases[k].group, head0 = cases[k].head0;
        char what[96];
        snprintf(what, sizeof what, "%s hd %d group %d heads %d+%d window %d keys %d", ckv_dtype_name(dt), hd, group,
                 head0, H, n_q, L);
        ev_cache e;
        ev_cache_init_shape(&e, dt, n_kv, hd, L, 0);
        const ckv_kv_batch bt = e.bt, br = e.br;
        const ckv_evict_shape sh = {L, n_q, H, n_kv, n_kv, hd, 0, dt, CKV_DTYPE_BF16, 0};
        CHECK_OK(tb->ops->evict_reserve(tb, &sh));
        const size_t nqv = (size_t)n_q * H * hd;
        float *q = rand_floats(nqv, -1.0f, 1.0f);
        float *qt = cuda_test_upload(tb, q, sizeof(float) * nqv), *qr = cuda_test_upload(ref, q, sizeof(float) * nqv);
        const float scale = 1.0f / sqrtf((float)hd);
        const int n_a = n_q / 2; /* the first block's rows; the second starts at q_row0 + n_a */
        const ckv_evict_attn_params at1 = {qt, n_a, q_row0, &bt, H, head0, group, scale, CKV_EVICT_LOGITS_MUL},
                                    ar1 = {qr, n_a, q_row0, &br, H, head0, group, scale, CKV_EVICT_LOGITS_MUL};
        const ckv_evict_attn_params at2 = {qt + (size_t)n_a * H * hd, n_q - n_a, q_row0 + n_a, &bt, H, head0, group,
                                           1.0f / scale, CKV_EVICT_LOGITS_DIV},
                                    ar2 = {qr + (size_t)n_a * H * hd, n_q - n_a, q_row0 + n_a, &br, H, head0, group,
                                           1.0f / scale, CKV_EVICT_LOGITS_DIV};
        for (int per_kv = 0; per_kv < 2; per_kv++) {
            const int n_out = per_kv ? n_kv : H;
            const ckv_evict_colsum_rows rows = per_kv ? CKV_EVICT_PER_KV_HEAD : CKV_EVICT_PER_QUERY_HEAD;
            double *st = (double *)dev_poison(tb, (size_t)n_out * n_cols * 2),
                   *sr = (double *)dev_poison(ref, (size_t)n_out * n_cols * 2);
            TB_EVICT(CHECK_OK(tb->ops->evict_attn_colsum(tb, st, n_cols, &at1, rows, CKV_EVICT_ZERO_FIRST)));
            CHECK_OK(ref->ops->evict_attn_colsum(ref, sr, n_cols, &ar1, rows, CKV_EVICT_ZERO_FIRST));
            TB_EVICT(CHECK_OK(tb->ops->evict_attn_colsum(tb, st, n_cols, &at2, rows, CKV_EVICT_ADD)));
            CHECK_OK(ref->ops->evict_attn_colsum(ref, sr, n_cols, &ar2, rows, CKV_EVICT_ADD));
            char cas[160];
            snprintf(cas, sizeof cas, "%s %s", what, per_kv ? "per kv head" : "per query head");
            compare_dev_f64("evict_attn_colsum", cas, st, sr, (size_t)n_out * n_cols, 1e-7, 1e-6);
            release2(st, sr);
        }
        float *pt = dev_poison(tb, (size_t)H * n_q * L), *pr = dev_poison(ref, (size_t)H * n_q * L);
        const ckv_evict_attn_params apt = {qt, n_q, q_row0, &bt, H, head0, group, scale, CKV_EVICT_LOGITS_MUL},
                                    apr = {qr, n_q, q_row0, &br, H, head0, group, scale, CKV_EVICT_LOGITS_MUL};
        TB_EVICT(CHECK_OK(tb->ops->evict_attn_probs(tb, pt, L, &apt)));
        CHECK_OK(ref->ops->evict_attn_probs(ref, pr, L, &apr));
        compare_dev("evict_attn_probs", what, pt, pr, (size_t)H * n_q * L, 1e-7, 1e-6);
        release2(pt, pr), release2(qt, qr);
        free(q);
        ev_cache_free(&e);
    }
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

/* Compactor's chunked non-causal attention: the rows from `start` cut into chunks of `chunk` (the last
 * one padded to it, as the scorer pads it), summed into one colsum per plan; GQA groups of 2 from
 * head 0, of 2 from head 1 (2 local heads: one per KV head) and of 4 (KV head 1 read by no local
 * head: its row stays 0); scale 1 (Compactor's). Column sums within 4e-6 relative (fp32 dot products
 * in another order and the device's exp2: on an H200 one of 80 sums of the bf16 cases differed by
 * 1.1e-6 relative, 1.55e-6 absolute at 1.378); then evict_row_stats of the finished rows. Nothing allocated after the reserve. */
static void test_evict_chunk(ckv_dtype dt) {
    ev_cache e;
    ev_cache_init_gaps(&e, dt, 1);
    const struct {
        int start, chunk, n_heads, head0, group;
    } plans[] = {{3, 16, EV_HQ, 0, 2}, {0, 7, EV_HQ, 0, 2}, {2, 64, EV_HQ, 0, 2}, {3, 16, 2, 1, 2}, {1, 13, EV_HQ, 0, 4}};
    ev_reserve(EV_L, 64, EV_KV, dt, 0);
    float *q = rand_floats((size_t)EV_L * EV_HQ * EV_D, -1.0f, 1.0f);
    float *qt = cuda_test_upload(tb, q, sizeof(float) * EV_L * EV_HQ * EV_D),
          *qr = cuda_test_upload(ref, q, sizeof(float) * EV_L * EV_HQ * EV_D);
    const size_t n = (size_t)EV_KV * EV_L;
    double *ct = (double *)dev_poison(tb, 2 * n), *cr = (double *)dev_poison(ref, 2 * n);
    double *st = (double *)dev_poison(tb, 4 * EV_KV), *sr = (double *)dev_poison(ref, 4 * EV_KV);
    float *ft = dev_poison(tb, n), *fr = dev_poison(ref, n);
    for (size_t p = 0; p < sizeof plans / sizeof plans[0]; p++) {
        const int S = EV_L - plans[p].start;
        for (int c0 = 0; c0 < S; c0 += plans[p].chunk) {
            const int nb = S - c0 < plans[p].chunk ? S - c0 : plans[p].chunk, row = plans[p].start + c0;
            const size_t off = (size_t)c0 * plans[p].n_heads * EV_D; /* the chunk's queries [nb, n_heads, d] */
            const ckv_evict_attn_params at = {qt + off, nb, row, &e.bt, plans[p].n_heads, plans[p].head0,
                                              plans[p].group, 1.0f, CKV_EVICT_LOGITS_MUL},
                                        ar = {qr + off, nb, row, &e.br, plans[p].n_heads, plans[p].head0,
                                              plans[p].group, 1.0f, CKV_EVICT_LOGITS_MUL};
            const ckv_evict_accum acc = c0 == 0 ? CKV_EVICT_ZERO_FIRST : CKV_EVICT_ADD;
            TB_EVICT(CHECK_OK(tb->ops->evict_chunk_colsum(tb, ct, EV_L, &at, plans[p].chunk - nb, acc)));
            CHECK_OK(ref->ops->evict_chunk_colsum(ref, cr, EV_L, &ar, plans[p].chunk - nb, acc));
        }
        char what[96];
        snprintf(what, sizeof what, "%s from row %d chunk %d heads %d+%d group %d", ckv_dtype_name(dt), plans[p].start,
                 plans[p].chunk, plans[p].head0, plans[p].n_heads, plans[p].group);
        compare_dev_f64("evict_chunk_colsum", what, ct, cr, n, 1e-7, 4e-6);
        tb->ops->evict_colsum_finish(tb, ft, EV_L, ct, EV_L, EV_KV, EV_L, 1.0, CKV_EVICT_DENOM_FIXED);
        ref->ops->evict_colsum_finish(ref, fr, EV_L, cr, EV_L, EV_KV, EV_L, 1.0, CKV_EVICT_DENOM_FIXED);
        tb->ops->evict_row_stats(tb, st, ft + plans[p].start, EV_KV, S, EV_L);
        ref->ops->evict_row_stats(ref, sr, fr + plans[p].start, EV_KV, S, EV_L);
        compare_dev_f64("evict_row_stats", what, st, sr, 2 * EV_KV, 1e-7, 1e-6);
    }
    /* the row statistics alone, exactly: the same floats, sums in double */
    tb->ops->evict_row_stats(tb, st, qt, 2, 37, 64);
    ref->ops->evict_row_stats(ref, sr, qr, 2, 37, 64);
    compare_dev_f64("evict_row_stats", "of the queries", st, sr, 4, 0.0, 1e-12);
    const ckv_evict_attn_params ad = {qt, 4, 0, &e.bt, EV_HQ, 0, 2, 1.0f, CKV_EVICT_LOGITS_DIV};
    CHECK_FAILS(tb->ops->evict_chunk_colsum(tb, ct, EV_L, &ad, 0, CKV_EVICT_ADD), CKV_STATUS_ERR_ARG, "dividing");
    release2(ft, fr), release2(st, sr), release2(ct, cr), release2(qt, qr);
    free(q);
    ev_cache_free(&e);
}

/* KVzip's replayed attention maxima (evict_kvzip) at the head dims of the tensor-core kernels: GQA
 * 1/2/4/8, one TP slice (head0 > 0, the first KV head partial), chunks with and without sinks,
 * replays not a multiple of 16 rows, a chunk and a replay over 512 keys (pass 1's merge over chunks
 * of three key ranges), and KVzip+ (row and value norms). The scores start from random maxima, so
 * the op's raising is checked too. Bound: 1e-6 relative plus 1e-7 (fp32 logits in another order,
 * expf against ckv's fast exp); the max error is printed. */
static void test_evict_kvzip(ckv_dtype dt) {
    static const struct { int hd, n_kv, group, n_heads, head0, L, start, end, sink, n_q, plus; } cases[] = {
        {16, 2, 2, 4, 0, 60, 0, 60, 0, 30, 0},       {64, 2, 1, 2, 0, 300, 128, 256, 4, 150, 0},
        {128, 2, 4, 4, 2, 700, 4, 690, 4, 600, 1},   {80, 1, 8, 8, 0, 200, 100, 200, 4, 120, 0},
        {32, 3, 2, 6, 0, 100, 50, 100, 4, 77, 1},    {96, 2, 2, 4, 0, 90, 30, 61, 3, 45, 0},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int hd = cases[k].hd, n_kv = cases[k].n_kv, H = cases[k].n_heads, n_q = cases[k].n_q, L = cases[k].L;
        const int rows = L + n_q, C = cases[k].end - cases[k].start;
        char what[128];
        snprintf(what, sizeof what, "%s hd %d group %d heads %d+%d sink %d chunk %d..%d of %d replay %d%s",
                 ckv_dtype_name(dt), hd, cases[k].group, cases[k].head0, H, cases[k].sink, cases[k].start,
                 cases[k].end, L, n_q, cases[k].plus ? " KVzip+" : "");
        ev_cache e;
        ev_cache_init_shape(&e, dt, n_kv, hd, rows, 0);
        const ckv_evict_shape sh = {rows, n_q, H, n_kv, n_kv, hd, 0, dt, CKV_DTYPE_F32, 0};
        CHECK_OK(tb->ops->evict_reserve(tb, &sh));
        const size_t nqv = (size_t)n_q * H * hd, n_out = (size_t)n_kv * L, n_vn = (size_t)H * C;
        float *q = rand_floats(nqv, -1.5f, 1.5f), *init = rand_floats(n_out, 0.0f, 0.02f);
        float *hinv = rand_floats((size_t)n_q, 0.5f, 2.0f), *vn = rand_floats(n_vn, 0.1f, 3.0f);
        float *qt = cuda_test_upload(tb, q, sizeof(float) * nqv), *qr = cuda_test_upload(ref, q, sizeof(float) * nqv);
        float *ot = cuda_test_upload(tb, init, sizeof(float) * n_out), *oref = cuda_test_upload(ref, init, sizeof(float) * n_out);
        float *ht = cuda_test_upload(tb, hinv, sizeof(float) * n_q), *hr = cuda_test_upload(ref, hinv, sizeof(float) * n_q);
        float *vt = cuda_test_upload(tb, vn, sizeof(float) * n_vn), *vr = cuda_test_upload(ref, vn, sizeof(float) * n_vn);
        const int plus = cases[k].plus;
        const ckv_evict_kvzip_params zt = {qt, n_q, L, cases[k].start, cases[k].end, cases[k].sink, &e.bt, H, cases[k].head0,
                                           cases[k].group, sqrtf((float)hd), plus ? ht : NULL, plus ? vt : NULL, C},
                                     zr = {qr, n_q, L, cases[k].start, cases[k].end, cases[k].sink, &e.br, H, cases[k].head0,
                                           cases[k].group, sqrtf((float)hd), plus ? hr : NULL, plus ? vr : NULL, C};
        TB_EVICT(CHECK_OK(tb->ops->evict_kvzip(tb, ot, L, &zt)));
        CHECK_OK(ref->ops->evict_kvzip(ref, oref, L, &zr));
        compare_dev("evict_kvzip", what, ot, oref, n_out, 1e-7, 1e-6);
        if (k == 0) { /* KVzip+ needs both norms; a chunk past the context is refused */
            ckv_evict_kvzip_params bad = zt;
            bad.hinv = ht;
            CHECK_FAILS(tb->ops->evict_kvzip(tb, ot, L, &bad), CKV_STATUS_ERR_ARG, "both the row norms");
            bad = zt;
            bad.end = L + 1;
            CHECK_FAILS(tb->ops->evict_kvzip(tb, ot, L, &bad), CKV_STATUS_ERR_ARG, "rows out of order");
        }
        release2(qt, qr), release2(ot, oref), release2(ht, hr), release2(vt, vr);
        free(q), free(init), free(hinv), free(vn);
        ev_cache_free(&e);
    }
}

/* KVzip+'s norms (evict_kvzip_norms) at head dims 64 and 128, GQA 1 and 7, one TP slice (head0 > 0:
 * KV head 0 read by the slice's first heads only), hidden sizes not a multiple of the Gram tile,
 * chunks not a multiple of 8 rows, from a row > 0. Both backends sum in double (another order on the
 * device), so the fp32 norms agree within 1e-6 relative; the max error is printed. */
static void test_evict_kvzip_norms(ckv_dtype dt) {
    static const struct { int hd, n_kv, group, n_heads, head0, D, rows, start, end, n_q; } cases[] = {
        {64, 2, 1, 2, 0, 200, 90, 5, 70, 33},    {128, 1, 7, 7, 0, 448, 60, 0, 60, 17},
        {128, 2, 7, 7, 3, 300, 120, 64, 117, 9}, {64, 2, 7, 4, 9, 136, 50, 10, 11, 40},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const int hd = cases[k].hd, n_kv = cases[k].n_kv, H = cases[k].n_heads, D = cases[k].D, n_q = cases[k].n_q;
        const int C = cases[k].end - cases[k].start, ld_vn = C;
        char what[128];
        snprintf(what, sizeof what, "%s hd %d group %d heads %d+%d hidden %d chunk %d..%d replay %d", ckv_dtype_name(dt),
                 hd, cases[k].group, cases[k].head0, H, D, cases[k].start, cases[k].end, n_q);
        ev_cache e;
        ev_cache_init_shape(&e, dt, n_kv, hd, cases[k].rows, 0);
        const ckv_evict_shape sh = {cases[k].rows, n_q, H, n_kv, n_kv, hd, D, dt, CKV_DTYPE_F32, 0};
        CHECK_OK(tb->ops->evict_reserve(tb, &sh));
        const size_t nw = (size_t)H * hd * D, nx = (size_t)n_q * D, nv = (size_t)H * ld_vn;
        float *w = rand_floats(nw, -0.5f, 0.5f), *x = rand_floats(nx, -2.0f, 2.0f);
        float *wt = cuda_test_upload(tb, w, sizeof(float) * nw), *wr = cuda_test_upload(ref, w, sizeof(float) * nw);
        float *xt = cuda_test_upload(tb, x, sizeof(float) * nx), *xr = cuda_test_upload(ref, x, sizeof(float) * nx);
        float *ht = dev_poison(tb, (size_t)n_q), *hr = dev_poison(ref, (size_t)n_q);
        float *vt = dev_poison(tb, nv), *vr = dev_poison(ref, nv);
        const ckv_evict_kvzip_norms_params nt = {wt, xt, n_q, D, &e.bt, cases[k].start, cases[k].end, H, cases[k].head0,
                                                 cases[k].group, ht, vt, ld_vn},
                                           nr = {wr, xr, n_q, D, &e.br, cases[k].start, cases[k].end, H, cases[k].head0,
                                                 cases[k].group, hr, vr, ld_vn};
        TB_EVICT(CHECK_OK(tb->ops->evict_kvzip_norms(tb, &nt)));
        CHECK_OK(ref->ops->evict_kvzip_norms(ref, &nr));
        compare_dev("evict_kvzip_norms hinv", what, ht, hr, (size_t)n_q, 0.0, 1e-6);
        compare_dev("evict_kvzip_norms vn", what, vt, vr, nv, 0.0, 1e-6);
        if (k == 0) { /* a head past the segments, a chunk wider than its row */
            ckv_evict_kvzip_norms_params bad = nt;
            bad.head0 = n_kv * cases[k].group;
            CHECK_FAILS(tb->ops->evict_kvzip_norms(tb, &bad), CKV_STATUS_ERR_ARG, "out of range");
            bad = nt;
            bad.ld_vn = C - 1;
            CHECK_FAILS(tb->ops->evict_kvzip_norms(tb, &bad), CKV_STATUS_ERR_ARG, "out of range");
        }
        release2(wt, wr), release2(xt, xr), release2(ht, hr), release2(vt, vr);
        free(w), free(x);
        ev_cache_free(&e);
    }
}

/* ChunkKV's chunk selection (evict_chunk_rank): 4 heads of 203 rows whose scores sit on a coarse
 * grid (equal chunk means: ties to the lower chunk), chunks of 20 (a short last one), 7, 64 and
 * 203 (one chunk), keeping 1 .. all; one case with a NaN score (its chunk ranks last). Exact against
 * the CPU: the means are summed in the same order, so the kept rows and the count are identical. */
static void test_evict_chunk_rank(void) {
    enum { H = 4, N = 203, LD = 210, NR = 3 };
    ev_reserve(LD, 1, H, CKV_DTYPE_BF16, 0);
    float *sh = xalloc(sizeof(float) * H * LD);
    for (int i = 0; i < H * LD; i++) sh[i] = (float)rng_int(0, 3) * 0.25f;
    static const struct { int C, keep, nan; } cases[] = {{20, 5, 0}, {20, 11, 0}, {20, 1, 0}, {7, 15, 1},
                                                         {64, 2, 0}, {203, 1, 0}, {7, 29, 0}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        if (cases[k].nan) sh[LD + 30] = NAN;
        float *st = cuda_test_upload(tb, sh, sizeof(float) * H * LD), *sr = cuda_test_upload(ref, sh, sizeof(float) * H * LD);
        int32_t *rt = (int32_t *)dev_poison(tb, (size_t)NR * LD), *rr = (int32_t *)dev_poison(ref, (size_t)NR * LD);
        int32_t *nt = (int32_t *)dev_poison(tb, 1), *nr = (int32_t *)dev_poison(ref, 1);
        TB_EVICT(CHECK_OK(tb->ops->evict_chunk_rank(tb, rt, LD, NR, nt, st, LD, H, N, cases[k].C, cases[k].keep)));
        CHECK_OK(ref->ops->evict_chunk_rank(ref, rr, LD, NR, nr, sr, LD, H, N, cases[k].C, cases[k].keep));
        int32_t n_t = -1, n_r = -2;
        cuda_test_download(tb, &n_t, nt, sizeof n_t);
        cuda_test_download(ref, &n_r, nr, sizeof n_r);
        char what[96];
        snprintf(what, sizeof what, "chunks of %d keep %d%s: %d rows", cases[k].C, cases[k].keep,
                 cases[k].nan ? " (a NaN)" : "", n_r);
        CHECK_MSG(n_t == n_r, "%s evict_chunk_rank %s: count %d, the cpu op's %d", tb_name, what, n_t, n_r);
        for (int r = 0; r < NR && n_t == n_r; r++)
            compare_dev_i32("evict_chunk_rank", what, rt + (size_t)r * LD, rr + (size_t)r * LD, (size_t)n_r);
        release2(st, sr), release2(rt, rr), release2(nt, nr);
        if (cases[k].nan) sh[LD + 30] = 0.5f;
    }
    int32_t *rt = (int32_t *)dev_poison(tb, LD), *nt = (int32_t *)dev_poison(tb, 1);
    float *st = dev_poison(tb, (size_t)H * LD);
    CHECK_FAILS(tb->ops->evict_chunk_rank(tb, rt, LD, 1, nt, st, LD, H, N, 20, 12), CKV_STATUS_ERR_ARG, "keeping 12 of 11");
    tb->ops->release(tb, rt), tb->ops->release(tb, nt), tb->ops->release(tb, st);
    free(sh);
}

/* CriticalKV's value norms at the model head dims (the fused mma path for bf16, blocked GEMMs for
 * f32): 300 rows (two tiles of 128 and a tail), o_proj of D = 200 rows (three chunks of 64 and a
 * tail of 8), 4 local heads from head0 1 (KV heads 0-2, group 2: the first and last partial), values
 * in [-1, 1], o_proj in [-0.5, 0.5]. Bound: the one above (1e-6 relative plus 1e-7); the max
 * relative error is printed. */
static void test_evict_value_norm_dims(ckv_dtype dt) {
    enum { L = 300, KV = 3, HQ = 4, D = 200, HEAD0 = 1, GROUP = 2 };
    const int dims[] = {64, 80, 96, 128};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        const int d = dims[i], cols = (HEAD0 + HQ) * d, ld = L + 3;
        ev_cache e;
        ev_cache_init_shape(&e, dt, KV, d, L, 0);
        const ckv_kv_batch bt = e.bt, br = e.br;
        const ckv_evict_shape sh = {L, 1, HQ, KV, KV, d, D, dt, CKV_DTYPE_BF16, 0};
        CHECK_OK(tb->ops->evict_reserve(tb, &sh));
        /* o_proj [D, (HEAD0 + HQ) d]: the local heads' columns start at HEAD0 d */
        float *wo = rand_floats((size_t)D * cols, -0.5f, 0.5f);
        round_to(wo, (size_t)D * cols, CKV_DTYPE_BF16);
        void *hw = typed(wo, (size_t)D * cols, CKV_DTYPE_BF16);
        char *wt_all = cuda_test_upload(tb, hw, (size_t)D * cols * 2), *wr_all = cuda_test_upload(ref, hw, (size_t)D * cols * 2);
        const ckv_weight wt = {wt_all + (size_t)HEAD0 * d * 2, CKV_DTYPE_BF16, D, HQ * d, (size_t)cols * 2};
        const ckv_weight wr = {wr_all + (size_t)HEAD0 * d * 2, CKV_DTYPE_BF16, D, HQ * d, (size_t)cols * 2};
        float *init = rand_floats((size_t)KV * ld, 0.0f, 1.0f);
        float *vt = cuda_test_upload(tb, init, sizeof(float) * KV * ld), *vr = cuda_test_upload(ref, init, sizeof(float) * KV * ld);
        TB_EVICT(CHECK_OK(tb->ops->evict_value_norm(tb, vt, ld, &bt, L, &wt, HQ, HEAD0, GROUP)));
        CHECK_OK(ref->ops->evict_value_norm(ref, vr, ld, &br, L, &wr, HQ, HEAD0, GROUP));
        float *a = xalloc(sizeof(float) * KV * ld), *b = xalloc(sizeof(float) * KV * ld);
        cuda_test_download(tb, a, vt, sizeof(float) * KV * ld);
        cuda_test_download(ref, b, vr, sizeof(float) * KV * ld);
        double rel = 0.0;
        for (int x = 0; x < KV * ld; x++) {
            const double r = fabs((double)a[x] - b[x]) / (fabs((double)b[x]) > 1e-30 ? fabs((double)b[x]) : 1e-30);
            rel = r > rel ? r : rel;
        }
        char cas[64];
        snprintf(cas, sizeof cas, "%s head dim %d", ckv_dtype_name(dt), d);
        fprintf(stderr, "     evict_value_norm %s: max relative error %.3g\n", cas, rel);
        compare("evict_value_norm", cas, a, b, (size_t)KV * ld, 1e-7, 1e-6);
        free(a), free(b), free(init), free(wo), free(hw);
        release2(vt, vr), release2(wt_all, wr_all);
        ev_cache_free(&e);
    }
}

int test_backend_evict_ops(void) {
    test_evict_leverage(CKV_DTYPE_BF16); /* first: the eviction workspace holds only what its reserve sized */
    test_evict_leverage(CKV_DTYPE_F32);
    test_evict_attention(CKV_DTYPE_BF16);
    test_evict_attention(CKV_DTYPE_F32);
    test_evict_chunk(CKV_DTYPE_BF16);
    test_evict_chunk(CKV_DTYPE_F32);
    test_evict_value_norm_dims(CKV_DTYPE_BF16);
    test_evict_value_norm_dims(CKV_DTYPE_F32);
    test_evict_window_shapes(CKV_DTYPE_BF16);
    test_evict_window_shapes(CKV_DTYPE_F32);
    test_evict_kvzip(CKV_DTYPE_BF16);
    test_evict_kvzip(CKV_DTYPE_F32);
    test_evict_kvzip_norms(CKV_DTYPE_BF16);
    test_evict_kvzip_norms(CKV_DTYPE_F32);
    test_evict_chunk_rank();
    test_evict_rows();
    test_evict_select_tiles();
    test_evict_defensive();
    CHECK_OK(tb->ops->sync(tb));
    CHECK_MSG(evict_op_allocs == 0, "%s: the eviction ops allocated %llu times after evict_reserve", tb_name,
              evict_op_allocs);
    if (strcmp(tb_name, "cuda-emu") == 0 && evict_op_allocs == 0)
        fprintf(stderr, "ok   cuda-emu: no eviction op allocated after evict_reserve\n");
    CHECK_FAILS(tb->ops->evict_reserve(tb, NULL), CKV_STATUS_ERR_ARG, "evict_reserve");
    return ckv_test_failures;
}
