/* test_backend_cpu.c - every op of the CPU backend against a naive double-precision loop written
 * here, on random inputs with odd sizes: decode (n = 1) and prefill (n > 1) shapes, GQA group sizes
 * 1, 2, 4 and 7 (both attention kernels), ragged caches with different lengths per head and gaps in positions (as after
 * eviction), queries whose position hides some keys or all of them. RoPE is also checked against the
 * explicit rotate_half formula. Ops whose result must not depend on the thread count are run with 1
 * and 2 threads and compared bit for bit. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "core/alloc.h"
#include "core/status.h"
#include "core/threadpool.h"

/* ---- helpers --------------------------------------------------------------------------------- */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint32_t rng_u32(void) { return ckv_test_rng_u32(&rng_state); }

static float rng_uniform(float lo, float hi) { return ckv_test_uniform(&rng_state, lo, hi); }

static int rng_int(int lo, int hi) { return lo + (int)(rng_u32() % (uint32_t)(hi - lo + 1)); } /* inclusive */

#define xalloc ckv_test_calloc

static float *new_floats(size_t n) { return xalloc(n * sizeof(float)); }

static void fill_uniform(float *x, size_t n, float lo, float hi) {
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(lo, hi);
}

static void to_float(float *dst, const double *src, size_t n) {
    for (size_t i = 0; i < n; i++) dst[i] = (float)src[i];
}

/* Bitwise equality of the 1-thread and 2-thread results. */
static void check_same_bits(const char *what, const float *a, const float *b, size_t n) {
    size_t diff = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0) diff++;
    CHECK_MSG(diff == 0, "%s: %zu of %zu values differ between 1 and 2 threads", what, diff, n);
}

static ckv_backend *be1, *be2; /* 1 and 2 threads */

/* ---- backend object and memory ops ----------------------------------------------------------- */

static void test_memory(void) {
    CHECK(strcmp(be1->name, "cpu") == 0);
    CHECK(be1->device == CKV_DEVICE_HOST);
    CHECK(be1->n_threads == 1 && be2->n_threads == 2);

    ckv_backend *bed = NULL;
    CHECK_OK(ckv_backend_cpu_init(&bed, 0));
    CHECK(bed && bed->n_threads == ckv_cpu_count());
    ckv_backend_free(bed);
    ckv_backend_free(NULL);

    const size_t n = 1003;
    void *a = NULL, *b = NULL;
    CHECK_OK(be1->ops->alloc(be1, &a, n, "test buffer a"));
    CHECK_OK(be1->ops->alloc(be1, &b, n, "test buffer b"));
    CHECK(a && ((uintptr_t)a % 64) == 0);
    unsigned char host[1003], back[1003];
    for (size_t i = 0; i < n; i++) host[i] = (unsigned char)(i * 7 + 3);
    CHECK_OK(be1->ops->upload(be1, a, host, n));
    CHECK_OK(be1->ops->copy(be1, b, a, n));
    memset(back, 0, n);
    CHECK_OK(be1->ops->download(be1, back, b, n));
    CHECK(memcmp(host, back, n) == 0);
    CHECK_OK(be1->ops->upload(be1, NULL, NULL, 0));
    CHECK_FAILS(be1->ops->download(be1, NULL, b, 8), CKV_STATUS_ERR_ARG, "NULL");
    CHECK_OK(be1->ops->sync(be1));
    be1->ops->release(be1, a);
    be1->ops->release(be1, b);
    be1->ops->release(be1, NULL);

    void *z = NULL;
    CHECK_OK(be1->ops->alloc(be1, &z, 0, "empty buffer"));
    be1->ops->release(be1, z);
}

/* ---- embedding ------------------------------------------------------------------------------- */

static void test_embedding_case(int vocab, int dim, int n) {
    float *table = new_floats((size_t)vocab * dim); // [vocab, dim]
    int32_t *ids = xalloc((size_t)n * sizeof *ids); // [n]
    float *out1 = new_floats((size_t)n * dim), *out2 = new_floats((size_t)n * dim), *ref = new_floats((size_t)n * dim);
    fill_uniform(table, (size_t)vocab * dim, -1, 1);
    for (int i = 0; i < n; i++) ids[i] = i == 0 ? vocab - 1 : i == 1 ? 0 : rng_int(0, vocab - 1);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < dim; j++) ref[(size_t)i * dim + j] = table[(size_t)ids[i] * dim + j];
    ckv_weight tw = {table, CKV_DTYPE_F32, vocab, dim, (size_t)dim * sizeof(float)};
    be1->ops->embedding(be1, out1, &tw, ids, n);
    be2->ops->embedding(be2, out2, &tw, ids, n);
    char what[64];
    snprintf(what, sizeof what, "embedding n=%d dim=%d", n, dim);
    ckv_test_allclose(what, out1, ref, (size_t)n * dim, 0.0, 0.0);
    check_same_bits(what, out1, out2, (size_t)n * dim);
    /* the same table stored as BF16: rows widened exactly */
    uint16_t *tb = xalloc((size_t)vocab * dim * sizeof *tb);
    for (size_t i = 0; i < (size_t)vocab * dim; i++) tb[i] = ckv_f32_to_bf16(table[i]);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < dim; j++) ref[(size_t)i * dim + j] = ckv_bf16_to_f32(tb[(size_t)ids[i] * dim + j]);
    ckv_weight tbw = {tb, CKV_DTYPE_BF16, vocab, dim, (size_t)dim * sizeof *tb};
    be1->ops->embedding(be1, out1, &tbw, ids, n);
    snprintf(what, sizeof what, "embedding bf16 n=%d dim=%d", n, dim);
    ckv_test_allclose(what, out1, ref, (size_t)n * dim, 0.0, 0.0);
    free(tb);
    free(table), free(ids), free(out1), free(out2), free(ref);
}

/* ---- rmsnorm --------------------------------------------------------------------------------- */

static void test_rmsnorm_case(int n, int dim, float amp, float eps) {
    size_t sz = (size_t)n * dim;
    float *x = new_floats(sz), *w = new_floats((size_t)dim);
    float *out1 = new_floats(sz), *out2 = new_floats(sz), *inplace = new_floats(sz), *ref = new_floats(sz);
    fill_uniform(x, sz, -amp, amp);
    fill_uniform(w, (size_t)dim, -2, 2);
    for (int i = 0; i < n; i++) {
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)x[(size_t)i * dim + j] * x[(size_t)i * dim + j];
        double r = 1.0 / sqrt(ss / dim + eps);
        for (int j = 0; j < dim; j++) ref[(size_t)i * dim + j] = (float)(x[(size_t)i * dim + j] * r * w[j]);
    }
    be1->ops->rmsnorm(be1, out1, x, w, n, dim, eps);
    be2->ops->rmsnorm(be2, out2, x, w, n, dim, eps);
    memcpy(inplace, x, sz * sizeof(float));
    be2->ops->rmsnorm(be2, inplace, inplace, w, n, dim, eps);
    char what[80];
    snprintf(what, sizeof what, "rmsnorm n=%d dim=%d amp=%g", n, dim, amp);
    ckv_test_allclose(what, out1, ref, sz, 1e-6, 2e-6);
    check_same_bits(what, out1, out2, sz);
    check_same_bits("rmsnorm in place vs out of place", out1, inplace, sz);
    free(x), free(w), free(out1), free(out2), free(inplace), free(ref);
}

/* ---- matmul ---------------------------------------------------------------------------------- */

static void test_matmul_case(int n, int k, int m, int with_bias) {
    float *x = new_floats((size_t)n * k), *w = new_floats((size_t)m * k); // [n, k], [m, k]
    float *bias = with_bias ? new_floats((size_t)m) : NULL;                // [m]
    size_t sz = (size_t)n * m;
    float *out1 = new_floats(sz), *out2 = new_floats(sz), *ref = new_floats(sz); // [n, m]
    double *refd = xalloc(sz * sizeof(double));
    fill_uniform(x, (size_t)n * k, -1, 1);
    fill_uniform(w, (size_t)m * k, -1, 1);
    if (bias) fill_uniform(bias, (size_t)m, -1, 1);
    fill_uniform(out1, sz, -9, 9); /* garbage the op must overwrite */
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double s = bias ? bias[j] : 0.0;
            for (int l = 0; l < k; l++) s += (double)x[(size_t)i * k + l] * w[(size_t)j * k + l];
            refd[(size_t)i * m + j] = s;
        }
    to_float(ref, refd, sz);
    ckv_backend_matmul_f32(be1, out1, x, w, bias, n, k, m);
    ckv_backend_matmul_f32(be2, out2, x, w, bias, n, k, m);
    char what[80];
    snprintf(what, sizeof what, "matmul n=%d k=%d m=%d%s", n, k, m, bias ? " +bias" : "");
    /* fp32 sums of k terms of size <= 1: error grows about like k * eps at worst */
    double atol = 1e-6 + 4e-8 * k;
    ckv_test_allclose(what, out1, ref, sz, atol, 1e-5);
    /* OpenBLAS may split the work differently per thread count: closeness only. */
    snprintf(what, sizeof what, "matmul n=%d k=%d m=%d, 2 threads", n, k, m);
    ckv_test_allclose(what, out2, ref, sz, atol, 1e-5);
    free(x), free(w), free(bias), free(out1), free(out2), free(ref), free(refd);
}

/* ---- rope ------------------------------------------------------------------------------------ */

static void test_rope_case(int n, int n_heads, int hd, const int32_t *pos, float attn_scale, double base) {
    const int half = hd / 2;
    size_t sz = (size_t)n * n_heads * hd;
    float *x = new_floats(sz), *got1 = new_floats(sz), *got2 = new_floats(sz), *ref = new_floats(sz);
    float *inv_freq = new_floats((size_t)half);
    double *rh = xalloc((size_t)hd * sizeof(double)), *cosv = xalloc((size_t)hd * sizeof(double)),
           *sinv = xalloc((size_t)hd * sizeof(double));
    for (int i = 0; i < half; i++) inv_freq[i] = (float)(1.0 / pow(base, (2.0 * i) / hd));
    fill_uniform(x, sz, -1, 1);
    /* HF: emb = cat(freqs, freqs); out = x * cos(emb) * s + rotate_half(x) * sin(emb) * s, where
     * rotate_half(x) = cat(-x[half:], x[:half]) and freqs = (float)pos * inv_freq in fp32 */
    for (int t = 0; t < n; t++) {
        for (int d = 0; d < hd; d++) {
            float angle = (float)pos[t] * inv_freq[d % half];
            cosv[d] = cos((double)angle) * attn_scale;
            sinv[d] = sin((double)angle) * attn_scale;
        }
        for (int h = 0; h < n_heads; h++) {
            const float *xh = x + ((size_t)t * n_heads + h) * hd;
            for (int d = 0; d < hd; d++) rh[d] = d < half ? -(double)xh[d + half] : (double)xh[d - half];
            float *rf = ref + ((size_t)t * n_heads + h) * hd;
            for (int d = 0; d < hd; d++) rf[d] = (float)(xh[d] * cosv[d] + rh[d] * sinv[d]);
        }
    }
    memcpy(got1, x, sz * sizeof(float));
    memcpy(got2, x, sz * sizeof(float));
    be1->ops->rope(be1, got1, pos, n, n_heads, hd, inv_freq, attn_scale);
    be2->ops->rope(be2, got2, pos, n, n_heads, hd, inv_freq, attn_scale);
    char what[96];
    snprintf(what, sizeof what, "rope n=%d heads=%d hd=%d scale=%g", n, n_heads, hd, attn_scale);
    ckv_test_allclose(what, got1, ref, sz, 1e-6, 1e-6);
    check_same_bits(what, got1, got2, sz);
    free(x), free(got1), free(got2), free(ref), free(inv_freq), free(rh), free(cosv), free(sinv);
}

static void test_rope(void) {
    int32_t p1[1] = {131000};
    test_rope_case(1, 3, 64, p1, 1.0f, 1000000.0);
    int32_t p6[6] = {0, 1, 2, 7, 8, 40};
    test_rope_case(6, 2, 6, p6, 1.0f, 10000.0);
    test_rope_case(6, 1, 2, p6, 1.0f, 10000.0);
    int32_t p5[5] = {3, 900, 901, 4096, 32767};
    test_rope_case(5, 4, 128, p5, 1.2345f, 500000.0); /* YaRN-style cos/sin scale */
    test_rope_case(5, 3, 160, p5, 1.0f, 10000.0);     /* hd/2 = 80 pairs: more than one block */
    int32_t p200[200];
    for (int i = 0, p = 0; i < 200; i++) p200[i] = (p += rng_int(1, 5));
    test_rope_case(200, 4, 64, p200, 1.0f, 10000.0); /* large enough to use both threads */
}

/* ---- kv_store -------------------------------------------------------------------------------- */

static void test_kv_store_case(int n) {
    enum { NKV = 3, D = 5, ROWS = 30 };
    const int64_t off[NKV] = {2, 14, 20};
    const int32_t len[NKV] = {3, 0, 5};
    float *kp = new_floats((size_t)ROWS * D), *vp = new_floats((size_t)ROWS * D); // [rows, d]
    int32_t pp[ROWS];
    float *k = new_floats((size_t)n * NKV * D), *v = new_floats((size_t)n * NKV * D); // [n, n_kv, d]
    int32_t *pos = xalloc((size_t)n * sizeof *pos);
    fill_uniform(k, (size_t)n * NKV * D, -1, 1);
    fill_uniform(v, (size_t)n * NKV * D, -1, 1);
    for (int t = 0; t < n; t++) pos[t] = 100 + 3 * t;
    for (int i = 0; i < ROWS * D; i++) kp[i] = vp[i] = -7.0f;
    for (int i = 0; i < ROWS; i++) pp[i] = -1;
    ckv_backend *be = n % 2 ? be1 : be2;
    ckv_kv_seg segs[NKV];
    for (int g = 0; g < NKV; g++)
        segs[g] = (ckv_kv_seg){kp + off[g] * D, vp + off[g] * D, pp + off[g], len[g], (int32_t)(ROWS - off[g])};
    ckv_kv_seg *list[1] = {segs};
    ckv_kv_batch b = {.dtype = CKV_DTYPE_F32, .head_dim = D, .n_kv_heads = NKV, .n_seq = 1, .segs = list,
                      .max_len = 5 + n};
    be->ops->kv_store(be, &b, k, v, pos, n);
    int bad = 0;
    for (int g = 0; g < NKV; g++) bad += segs[g].len != len[g] + n;
    for (int r = 0; r < ROWS; r++) {
        int owner = -1, t = -1;
        for (int g = 0; g < NKV; g++)
            if (r >= off[g] + len[g] && r < off[g] + len[g] + n) owner = g, t = (int)(r - off[g] - len[g]);
        for (int d = 0; d < D; d++) {
            float ek = owner < 0 ? -7.0f : k[((size_t)t * NKV + owner) * D + d];
            float ev = owner < 0 ? -7.0f : v[((size_t)t * NKV + owner) * D + d];
            if (kp[r * D + d] != ek || vp[r * D + d] != ev) bad++;
        }
        if (pp[r] != (owner < 0 ? -1 : pos[t])) bad++;
    }
    CHECK_MSG(bad == 0, "kv_store n=%d: %d pool values wrong", n, bad);
    if (!bad) fprintf(stderr, "ok   kv_store n=%d: rows appended after each head's length, other rows untouched\n", n);
    free(kp), free(vp), free(k), free(v), free(pos);
}

/* ---- attention ------------------------------------------------------------------------------- */

enum { TEST_MAX_KV = 8 };

typedef struct {
    int n_kv, hd, rows;
    float *k, *v;   // [rows, hd]
    int32_t *pos;   // [rows]
    int64_t off[TEST_MAX_KV];
    int32_t len[TEST_MAX_KV];
} test_cache;

/* Head g holds ctx_len[g] context keys at increasing positions with random gaps (as after eviction;
 * positions start at first_pos[g]), followed by the n query tokens' own keys at qpos. Slack rows
 * between heads hold NaN: reading one, even with weight 0, would show. */
static void test_cache_build(test_cache *c, int n_kv, int hd, const int *ctx_len, const int *first_pos, int max_gap,
                             const int32_t *qpos, int n) {
    c->n_kv = n_kv;
    c->hd = hd;
    int64_t row = 1;
    for (int g = 0; g < n_kv; g++) {
        c->off[g] = row;
        c->len[g] = ctx_len[g] + n;
        row += c->len[g] + 3;
    }
    c->rows = (int)row;
    c->k = new_floats((size_t)c->rows * hd);
    c->v = new_floats((size_t)c->rows * hd);
    c->pos = xalloc((size_t)c->rows * sizeof *c->pos);
    for (size_t i = 0; i < (size_t)c->rows * hd; i++) c->k[i] = c->v[i] = NAN;
    for (int i = 0; i < c->rows; i++) c->pos[i] = -1000;
    for (int g = 0; g < n_kv; g++) {
        int32_t p = first_pos[g];
        for (int i = 0; i < ctx_len[g]; i++) {
            c->pos[c->off[g] + i] = p;
            p += rng_int(1, max_gap);
        }
        for (int t = 0; t < n; t++) c->pos[c->off[g] + ctx_len[g] + t] = qpos[t];
        fill_uniform(c->k + (size_t)c->off[g] * hd, (size_t)c->len[g] * hd, -1, 1);
        fill_uniform(c->v + (size_t)c->off[g] * hd, (size_t)c->len[g] * hd, -1, 1);
    }
}

static void test_cache_free(test_cache *c) { free(c->k), free(c->v), free(c->pos); }

/* softmax(q.k * scale) v over the rows of head h / group whose pos <= qpos[t], scanning every row
 * (no reliance on sorting); a query that sees no key gets 0. */
static void attention_ref(float *out, const float *q, const int32_t *qpos, const test_cache *c, int n, int n_heads,
                          float scale) {
    const int hd = c->hd, group = n_heads / c->n_kv;
    double *s = xalloc((size_t)c->rows * sizeof(double)), *acc = xalloc((size_t)hd * sizeof(double));
    for (int t = 0; t < n; t++)
        for (int h = 0; h < n_heads; h++) {
            const int g = h / group;
            const float *qh = q + ((size_t)t * n_heads + h) * hd;
            double mx = -INFINITY;
            for (int i = 0; i < c->len[g]; i++) {
                size_t r = (size_t)c->off[g] + i;
                if (c->pos[r] > qpos[t]) continue;
                double d = 0;
                for (int e = 0; e < hd; e++) d += (double)qh[e] * c->k[r * hd + e];
                s[i] = d * scale;
                if (s[i] > mx) mx = s[i];
            }
            double den = 0;
            for (int e = 0; e < hd; e++) acc[e] = 0;
            for (int i = 0; i < c->len[g]; i++) {
                size_t r = (size_t)c->off[g] + i;
                if (c->pos[r] > qpos[t]) continue;
                double wgt = exp(s[i] - mx);
                den += wgt;
                for (int e = 0; e < hd; e++) acc[e] += wgt * c->v[r * hd + e];
            }
            float *o = out + ((size_t)t * n_heads + h) * hd;
            for (int e = 0; e < hd; e++) o[e] = den > 0 ? (float)(acc[e] / den) : 0.0f;
        }
    free(s), free(acc);
}

typedef struct {
    const char *what;
    int n_heads, n_kv, hd;
    int ctx_len[TEST_MAX_KV];
    int first_pos[TEST_MAX_KV];
    int max_gap;
    int n;          /* query tokens */
    int qpos0;      /* position of the first query token */
    int qpos_step;  /* gap between query tokens */
    int own_keys;   /* 1: the queries' own keys are in the cache (prefill/decode after kv_store) */
    float scale;    /* 0: 1/sqrt(hd) */
} attn_case;

static void test_attention_case(const attn_case *ac) {
    const int n = ac->n, H = ac->n_heads, hd = ac->hd;
    int32_t *qpos = xalloc((size_t)n * sizeof *qpos);
    for (int t = 0; t < n; t++) qpos[t] = ac->qpos0 + t * ac->qpos_step;
    test_cache c;
    test_cache_build(&c, ac->n_kv, hd, ac->ctx_len, ac->first_pos, ac->max_gap, qpos, ac->own_keys ? n : 0);
    ckv_kv_seg segs[TEST_MAX_KV];
    for (int g = 0; g < c.n_kv; g++)
        segs[g] = (ckv_kv_seg){c.k + c.off[g] * hd, c.v + c.off[g] * hd, c.pos + c.off[g], c.len[g], c.len[g]};
    ckv_kv_seg *list[1] = {segs};
    ckv_kv_batch view = {.dtype = CKV_DTYPE_F32, .head_dim = hd, .n_kv_heads = c.n_kv, .n_seq = 1, .segs = list};
    float scale = ac->scale > 0 ? ac->scale : 1.0f / sqrtf((float)hd);

    size_t sz = (size_t)n * H * hd;
    float *q = new_floats(sz), *out1 = new_floats(sz), *out2 = new_floats(sz), *ref = new_floats(sz);
    fill_uniform(q, sz, -1, 1);
    fill_uniform(out1, sz, -5, 5); /* garbage the op must overwrite */
    attention_ref(ref, q, qpos, &c, n, H, scale);
    be1->ops->attention(be1, out1, &(ckv_attention_params){q, qpos, &view, n, H, scale});
    be2->ops->attention(be2, out2, &(ckv_attention_params){q, qpos, &view, n, H, scale});
    char what[160];
    snprintf(what, sizeof what, "attention %s (H=%d Hkv=%d hd=%d n=%d)", ac->what, H, ac->n_kv, hd, n);
    ckv_test_allclose(what, out1, ref, sz, 2e-6, 1e-5);
    check_same_bits(what, out1, out2, sz);
    free(q), free(out1), free(out2), free(ref), free(qpos);
    test_cache_free(&c);
}

static void test_attention(void) {
    const attn_case cases[] = {
        /* what, H, Hkv, hd, ctx_len, first_pos, max_gap, n, qpos0, step, own, scale */
        {"group 1 prefill, ragged, one empty head context", 3, 3, 19, {0, 37, 70}, {0, 2, 0}, 3, 5, 300, 1, 1, 0},
        {"group 2 decode", 4, 2, 64, {100, 33}, {0, 5}, 4, 1, 500, 1, 1, 0},
        {"group 4 prefill with gaps", 8, 2, 64, {129, 64}, {1, 0}, 2, 7, 400, 3, 1, 0},
        {"group 4 decode, query hides later keys", 8, 2, 80, {200, 150}, {0, 100}, 3, 1, 250, 1, 0, 0},
        {"group 7 prefill, sharp softmax", 14, 2, 64, {300, 250}, {0, 3}, 2, 3, 800, 2, 1, 2.0f},
        {"group 7 decode, Qwen2.5-0.5B shape", 14, 2, 64, {1000, 777}, {0, 0}, 2, 1, 3000, 1, 1, 0},
        {"query before every key of one head", 2, 2, 8, {0, 20}, {0, 50}, 2, 2, 10, 5, 0, 0},
        {"group 4 prefill, both threads", 8, 2, 64, {500, 700}, {0, 0}, 2, 33, 1500, 1, 1, 0},
        {"group 1, head_dim 1", 2, 2, 1, {40, 9}, {0, 0}, 3, 4, 130, 1, 1, 0},
        {"group 1 decode, ragged", 5, 5, 64, {90, 0, 33, 64, 1}, {0, 0, 7, 1, 0}, 4, 1, 400, 1, 1, 0},
        {"group 2 prefill, head_dim 288", 4, 2, 288, {70, 45}, {0, 0}, 2, 6, 200, 1, 1, 0},
        {"group 2 prefill, long ragged context", 4, 2, 128, {1000, 333}, {0, 9}, 3, 20, 4000, 2, 1, 0},
        /* decode with long heads: keys split into ranges attended separately, then merged */
        {"split-K decode, long heads", 8, 2, 64, {5000, 3000}, {0, 0}, 2, 1, 20000, 1, 1, 0},
        {"split-K decode, query hides most of one head", 8, 2, 64, {3000, 2000}, {0, 2500}, 2, 1, 3000, 1, 0, 0},
        {"split-K decode, query before every key of one head", 2, 2, 64, {600, 700}, {0, 5000}, 2, 1, 1500, 1, 0, 0},
        {"split-K, 2 tokens x group 7", 14, 2, 64, {1500, 900}, {0, 0}, 2, 2, 5000, 1, 1, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) test_attention_case(&cases[i]);

    /* heads that do not divide into KV groups: a caller bug, answered with NaN rather than numbers */
    float k[4] = {0}, v[4] = {0}, q[6] = {0}, out[6] = {0};
    int32_t pos[2] = {0, 0}, qpos[1] = {0};
    ckv_kv_seg segs[2] = {{k, v, pos, 1, 1}, {k + 2, v + 2, pos + 1, 0, 1}};
    ckv_kv_seg *list[1] = {segs};
    ckv_kv_batch bad = {.dtype = CKV_DTYPE_F32, .head_dim = 2, .n_kv_heads = 2, .n_seq = 1, .segs = list};
    be1->ops->attention(be1, out, &(ckv_attention_params){q, qpos, &bad, 1, 3, 1.0f});
    CHECK(isnan(out[0]) && isnan(out[5]));
}


/* ---- batched attention and low-precision caches ----------------------------------------------- */

/* Three sequences of different lengths and token counts in one call must give exactly (bit for bit)
 * what each gives alone: a sequence's tiling depends on its own shape only. */
static void test_attention_batch(void) {
    enum { NSEQ = 3, NKV = 2, H = 6, HD = 64 };
    const int ctx[NSEQ][NKV] = {{40, 33}, {1300, 120}, {7, 0}}; /* sequence 1 decodes split-K */
    const int ntok[NSEQ] = {1, 2, 2};
    test_cache c[NSEQ];
    ckv_kv_seg segs[NSEQ][NKV];
    ckv_kv_seg *list[NSEQ];
    int32_t seq_of[16], seq_start[NSEQ + 1], qpos[16];
    int n = 0;
    for (int s = 0; s < NSEQ; s++) {
        int32_t qp[8];
        for (int t = 0; t < ntok[s]; t++) qp[t] = 1000 + 10 * s + t;
        int first[NKV] = {0, 3};
        test_cache_build(&c[s], NKV, HD, ctx[s], first, 3, qp, ntok[s]);
        for (int g = 0; g < NKV; g++)
            segs[s][g] = (ckv_kv_seg){c[s].k + c[s].off[g] * HD, c[s].v + c[s].off[g] * HD, c[s].pos + c[s].off[g],
                                      c[s].len[g], c[s].len[g]};
        list[s] = segs[s];
        seq_start[s] = n;
        for (int t = 0; t < ntok[s]; t++, n++) seq_of[n] = s, qpos[n] = qp[t];
    }
    seq_start[NSEQ] = n;
    size_t sz = (size_t)n * H * HD;
    float *q = new_floats(sz), *out = new_floats(sz), *alone = new_floats(sz);
    fill_uniform(q, sz, -1, 1);
    ckv_kv_batch b = {.dtype = CKV_DTYPE_F32, .head_dim = HD, .n_kv_heads = NKV, .n_seq = NSEQ, .segs = list,
                      .seq_of = seq_of, .seq_start = seq_start};
    be2->ops->attention(be2, out, &(ckv_attention_params){q, qpos, &b, n, H, 0.125f});
    for (int s = 0; s < NSEQ; s++) {
        ckv_kv_batch one = {.dtype = CKV_DTYPE_F32, .head_dim = HD, .n_kv_heads = NKV, .n_seq = 1, .segs = &list[s]};
        size_t at = (size_t)seq_start[s] * H * HD;
        be1->ops->attention(be1, alone + at,
                            &(ckv_attention_params){q + at, qpos + seq_start[s], &one, ntok[s], H, 0.125f});
    }
    check_same_bits("attention: 3 sequences batched vs each alone", out, alone, sz);
    free(q), free(out), free(alone);
    for (int s = 0; s < NSEQ; s++) test_cache_free(&c[s]);
}

/* An F16 or BF16 cache: the op must equal fp32 attention over the rounded keys and values. */
static void test_attention_lowp(ckv_dtype dt) {
    enum { NKV = 2, H = 8, HD = 64, N = 4 };
    int ctx[NKV] = {150, 77}, first[NKV] = {0, 2};
    int32_t qpos[N] = {900, 901, 902, 903};
    test_cache c;
    test_cache_build(&c, NKV, HD, ctx, first, 3, qpos, N);
    uint16_t *kh = xalloc((size_t)c.rows * HD * 2), *vh = xalloc((size_t)c.rows * HD * 2);
    ckv_convert_from_f32(kh, c.k, dt, (size_t)c.rows * HD);
    ckv_convert_from_f32(vh, c.v, dt, (size_t)c.rows * HD);
    ckv_convert_to_f32(c.k, kh, dt, (size_t)c.rows * HD); /* the reference sees the rounded values */
    ckv_convert_to_f32(c.v, vh, dt, (size_t)c.rows * HD);
    ckv_kv_seg segs[NKV];
    for (int g = 0; g < NKV; g++)
        segs[g] = (ckv_kv_seg){kh + c.off[g] * HD, vh + c.off[g] * HD, c.pos + c.off[g], c.len[g], c.len[g]};
    ckv_kv_seg *list[1] = {segs};
    ckv_kv_batch b = {.dtype = dt, .head_dim = HD, .n_kv_heads = NKV, .n_seq = 1, .segs = list};
    size_t sz = (size_t)N * H * HD;
    float *q = new_floats(sz), *out = new_floats(sz), *ref = new_floats(sz);
    fill_uniform(q, sz, -1, 1);
    attention_ref(ref, q, qpos, &c, N, H, 0.125f);
    be2->ops->attention(be2, out, &(ckv_attention_params){q, qpos, &b, N, H, 0.125f});
    char what[64];
    snprintf(what, sizeof what, "attention over a %s cache", ckv_dtype_name(dt));
    ckv_test_allclose(what, out, ref, sz, 2e-6, 1e-5);
    free(q), free(out), free(ref), free(kh), free(vh);
    test_cache_free(&c);
}

/* kv_gather: kept rows of every head land, in order, at the start of the new segments. */
static void test_kv_gather(ckv_dtype dt) {
    enum { NKV = 3, HD = 7, CAP = 20 };
    const size_t es = ckv_dtype_size(dt);
    unsigned char *ks = xalloc((size_t)NKV * CAP * HD * es), *vs = xalloc((size_t)NKV * CAP * HD * es);
    unsigned char *kd = xalloc((size_t)NKV * CAP * HD * es), *vd = xalloc((size_t)NKV * CAP * HD * es);
    int32_t ps[NKV * CAP], pd[NKV * CAP];
    float tmp[CAP * HD];
    for (int i = 0; i < NKV * CAP; i++) ps[i] = 3 * i + 1, pd[i] = -1;
    for (int g = 0; g < NKV; g++) {
        fill_uniform(tmp, (size_t)CAP * HD, -1, 1);
        ckv_convert_from_f32(ks + (size_t)g * CAP * HD * es, tmp, dt, (size_t)CAP * HD);
        fill_uniform(tmp, (size_t)CAP * HD, -1, 1);
        ckv_convert_from_f32(vs + (size_t)g * CAP * HD * es, tmp, dt, (size_t)CAP * HD);
    }
    memset(kd, 0xff, (size_t)NKV * CAP * HD * es);
    memset(vd, 0xff, (size_t)NKV * CAP * HD * es);
    ckv_kv_seg src[NKV], dst[NKV];
    for (int g = 0; g < NKV; g++) {
        src[g] = (ckv_kv_seg){ks + (size_t)g * CAP * HD * es, vs + (size_t)g * CAP * HD * es, ps + g * CAP, CAP, CAP};
        dst[g] = (ckv_kv_seg){kd + (size_t)g * CAP * HD * es, vd + (size_t)g * CAP * HD * es, pd + g * CAP, 0, CAP};
    }
    const int32_t keep[NKV * CAP] = {0, 1, 2, 7, 19, [CAP] = 5, [CAP + 1] = 6, [2 * CAP] = 0};
    const int32_t n_keep[NKV] = {5, 2, 0};
    be1->ops->kv_gather(be1, &(ckv_kv_gather_params){dt, HD, NKV, dst, src, keep, CAP, n_keep});
    int bad = 0;
    for (int g = 0; g < NKV; g++) {
        bad += dst[g].len != n_keep[g];
        for (int i = 0; i < n_keep[g]; i++) {
            int r = keep[g * CAP + i];
            bad += dst[g].pos[i] != src[g].pos[r];
            bad += memcmp((char *)dst[g].k + (size_t)i * HD * es, (char *)src[g].k + (size_t)r * HD * es, HD * es) != 0;
            bad += memcmp((char *)dst[g].v + (size_t)i * HD * es, (char *)src[g].v + (size_t)r * HD * es, HD * es) != 0;
        }
        bad += n_keep[g] < CAP && dst[g].pos[n_keep[g]] != -1; /* nothing written past the kept rows */
    }
    CHECK_MSG(bad == 0, "kv_gather %s: %d wrong rows or lengths", ckv_dtype_name(dt), bad);
    if (!bad) fprintf(stderr, "ok   kv_gather %s: kept rows packed in order, lengths set\n", ckv_dtype_name(dt));
    free(ks), free(vs), free(kd), free(vd);
}

/* kv_rerotate: each kept key rotated by (i - pos[i]) * inv_freq against a double-precision rotation of
 * the same fp32 key (within the dtype's rounding), each kept row's position then its index; values,
 * lengths and rows past len untouched. The backend keeps a table of the angles from call to call:
 * calls at other frequencies (theta) and at offsets past what the table holds (positions shifted by
 * `shift`, computed per row) must read none of a previous call's angles. */
static void test_kv_rerotate(ckv_dtype dt, float theta, int32_t shift) {
    enum { NKV = 2, HD = 8, CAP = 12 };
    const size_t es = ckv_dtype_size(dt), plane = (size_t)CAP * HD;
    unsigned char *k = xalloc(NKV * plane * es), *v = xalloc(NKV * plane * es), *k0 = xalloc(NKV * plane * es),
                  *v0 = xalloc(NKV * plane * es);
    float tmp[CAP * HD], inv[HD / 2];
    int32_t pos[NKV * CAP];
    for (int j = 0; j < HD / 2; j++) inv[j] = powf(theta, -2.0f * (float)j / HD);
    for (int g = 0; g < NKV; g++) {
        fill_uniform(tmp, plane, -2, 2);
        ckv_convert_from_f32(k + g * plane * es, tmp, dt, plane);
        fill_uniform(tmp, plane, -2, 2);
        ckv_convert_from_f32(v + g * plane * es, tmp, dt, plane);
        for (int i = 0; i < CAP; i++) pos[g * CAP + i] = shift + 5 * i + 3 * g + (i > 4 ? 200 : 0); /* kept, with gaps */
    }
    memcpy(k0, k, NKV * plane * es), memcpy(v0, v, NKV * plane * es);
    int32_t pos0[NKV * CAP];
    memcpy(pos0, pos, sizeof pos0);
    const int lens[NKV] = {CAP - 2, 5};
    ckv_kv_seg segs[NKV];
    for (int g = 0; g < NKV; g++)
        segs[g] = (ckv_kv_seg){k + g * plane * es, v + g * plane * es, pos + g * CAP, lens[g], CAP};
    ckv_kv_seg *list[1] = {segs};
    const ckv_kv_batch b = {.dtype = dt, .head_dim = HD, .n_kv_heads = NKV, .n_seq = 1, .segs = list, .max_len = CAP};
    be1->ops->kv_rerotate(be1, &b, inv);
    const double tol = dt == CKV_DTYPE_F32 ? 1e-5 : 3.0 / 256; /* |x| <= 2.9: one bf16 ulp, fp32's few */
    int bad = 0;
    double worst = 0;
    for (int g = 0; g < NKV; g++) {
        float x[CAP * HD], y[CAP * HD];
        ckv_convert_to_f32(x, k0 + g * plane * es, dt, plane);
        ckv_convert_to_f32(y, k + g * plane * es, dt, plane);
        for (int i = 0; i < CAP; i++)
            for (int j = 0; j < HD / 2; j++) {
                const double a = (double)(float)((float)(i - pos0[g * CAP + i]) * inv[j]);
                const double x0 = x[i * HD + j], x1 = x[i * HD + j + HD / 2];
                const double w0 = i < lens[g] ? x0 * cos(a) - x1 * sin(a) : x0, w1 = i < lens[g] ? x1 * cos(a) + x0 * sin(a) : x1;
                const double e = fmax(fabs(y[i * HD + j] - w0), fabs(y[i * HD + j + HD / 2] - w1));
                worst = fmax(worst, e);
                if (e > tol && bad++ < 5)
                    fprintf(stderr, "  kv_rerotate %s (theta %g, shift %d): head %d row %d pair %d off by %.3g\n",
                            ckv_dtype_name(dt), theta, shift, g, i, j, e);
            }
    }
    bad += memcmp(v, v0, NKV * plane * es) != 0;
    for (int g = 0; g < NKV; g++) {
        bad += segs[g].len != lens[g];
        for (int i = 0; i < CAP; i++) bad += pos[g * CAP + i] != (i < lens[g] ? i : pos0[g * CAP + i]); /* row i at i */
    }
    CHECK_MSG(bad == 0, "kv_rerotate %s (theta %g, shift %d): %d wrong keys, values or lengths (max error %.3g)",
              ckv_dtype_name(dt), theta, shift, bad, worst);
    if (!bad)
        fprintf(stderr, "ok   kv_rerotate %s (theta %g, shift %d): max error %.3g against the double rotation\n",
                ckv_dtype_name(dt), theta, shift, worst);
    free(k), free(v), free(k0), free(v0);
}

static void test_count_nonfinite(void) {
    float x[1000];
    fill_uniform(x, 1000, -1e30f, 1e30f);
    size_t bad = 99;
    CHECK_OK(be1->ops->count_nonfinite(be1, x, 1000, &bad));
    CHECK_MSG(bad == 0, "count_nonfinite: %zu in finite data", bad);
    x[0] = NAN, x[500] = INFINITY, x[999] = -INFINITY;
    CHECK_OK(be1->ops->count_nonfinite(be1, x, 1000, &bad));
    CHECK_MSG(bad == 3, "count_nonfinite: %zu instead of 3", bad);
}

/* ---- swiglu, add ----------------------------------------------------------------------------- */

static void test_swiglu_case(size_t n, int sweep) {
    float *gate = new_floats(n), *up = new_floats(n), *out1 = new_floats(n), *out2 = new_floats(n),
          *alias = new_floats(n), *ref = new_floats(n);
    if (sweep) {
        /* every exponent the silu of a finite activation can need */
        for (size_t i = 0; i < n; i++) gate[i] = -87.0f + 174.0f * (float)i / (float)(n - 1);
    } else {
        fill_uniform(gate, n, -20, 20);
        const float special[] = {0.0f, -100.0f, 100.0f, 88.5f, -88.5f, 1e-8f, -1e-8f};
        for (size_t i = 0; i < sizeof special / sizeof special[0] && i < n; i++) gate[n - 1 - i] = special[i];
    }
    fill_uniform(up, n, -2, 2);
    for (size_t i = 0; i < n; i++) {
        double g = gate[i];
        ref[i] = (float)(g / (1.0 + exp(-g)) * up[i]);
    }
    be1->ops->swiglu(be1, out1, gate, up, n);
    be2->ops->swiglu(be2, out2, gate, up, n);
    memcpy(alias, gate, n * sizeof(float));
    be2->ops->swiglu(be2, alias, alias, up, n);
    char what[64];
    snprintf(what, sizeof what, "swiglu n=%zu%s", n, sweep ? " exp sweep" : "");
    ckv_test_allclose(what, out1, ref, n, 1e-30, 1e-6);
    check_same_bits(what, out1, out2, n);
    check_same_bits("swiglu out aliasing gate", out1, alias, n);
    free(gate), free(up), free(out1), free(out2), free(alias), free(ref);
}

static void test_add_case(size_t n) {
    float *x = new_floats(n), *y = new_floats(n), *x1 = new_floats(n), *x2 = new_floats(n), *ref = new_floats(n);
    fill_uniform(x, n, -3, 3);
    fill_uniform(y, n, -3, 3);
    for (size_t i = 0; i < n; i++) ref[i] = (float)((double)x[i] + (double)y[i]);
    memcpy(x1, x, n * sizeof(float));
    memcpy(x2, x, n * sizeof(float));
    be1->ops->add(be1, x1, y, n);
    be2->ops->add(be2, x2, y, n);
    char what[64];
    snprintf(what, sizeof what, "add n=%zu", n);
    ckv_test_allclose(what, x1, ref, n, 0.0, 0.0);
    check_same_bits(what, x1, x2, n);
    free(x), free(y), free(x1), free(x2), free(ref);
}

int main(void) {
    CHECK_OK(ckv_backend_cpu_init(&be1, 1));
    CHECK_OK(ckv_backend_cpu_init(&be2, 2));
    if (!be1 || !be2) return ckv_test_finish("test_backend_cpu");

    test_memory();

    test_embedding_case(37, 19, 1);
    test_embedding_case(37, 19, 9);
    test_embedding_case(5, 1, 4);

    test_rmsnorm_case(1, 1, 1.0f, 1e-6f);
    test_rmsnorm_case(1, 7, 1.0f, 1e-5f);
    test_rmsnorm_case(3, 899, 1.0f, 1e-6f);
    test_rmsnorm_case(40, 899, 1.0f, 1e-6f);   /* both threads */
    test_rmsnorm_case(2, 4096, 300.0f, 1e-6f); /* large activations */
    test_rmsnorm_case(2, 33, 1e-3f, 1e-6f);    /* eps matters */

    test_matmul_case(1, 1, 1, 1);
    test_matmul_case(1, 37, 13, 0);
    test_matmul_case(1, 37, 13, 1);
    test_matmul_case(5, 33, 17, 1);
    test_matmul_case(17, 130, 61, 0);
    test_matmul_case(64, 257, 129, 1);
    test_matmul_case(1, 896, 131, 1);
    test_matmul_case(3, 0, 5, 1); /* empty sum: bias only */

    test_rope();

    test_kv_store_case(1);
    test_kv_store_case(4);

    test_attention();
    test_attention_batch();
    test_attention_lowp(CKV_DTYPE_BF16);
    test_attention_lowp(CKV_DTYPE_F16);
    test_kv_gather(CKV_DTYPE_F32);
    test_kv_gather(CKV_DTYPE_BF16);
    test_kv_rerotate(CKV_DTYPE_F32, 10000.0f, 0);
    test_kv_rerotate(CKV_DTYPE_BF16, 10000.0f, 0);   /* the table's angles again */
    test_kv_rerotate(CKV_DTYPE_F32, 500000.0f, 0);   /* other frequencies: the table starts over */
    test_kv_rerotate(CKV_DTYPE_F32, 500000.0f, 40);  /* larger offsets: it grows */
    test_kv_rerotate(CKV_DTYPE_F32, 500000.0f, 3000000); /* offsets past its bytes: angles per row */
    test_kv_rerotate(CKV_DTYPE_BF16, 10000.0f, 7);
    test_count_nonfinite();

    test_swiglu_case(1, 0);
    test_swiglu_case(1001, 0);
    test_swiglu_case(40000, 0);
    test_swiglu_case(40001, 1);

    test_add_case(1);
    test_add_case(1001);
    test_add_case(70000);

    ckv_backend_free(be1);
    ckv_backend_free(be2);
    CHECK(ckv_alloc_live_bytes() == 0);
    return ckv_test_finish("test_backend_cpu");
}
