/* backend_ops_harness.h - what the cases of test_backend_ops share: the backend under test and the
 * CPU reference, one seeded random stream, inputs rounded to what a dtype holds, device buffers
 * poisoned with NaN, comparisons that print the first mismatches and the max error, and a layer's KV
 * segments built identically on either backend. It runs no case. */
#ifndef CKV_TEST_BACKEND_OPS_HARNESS_H
#define CKV_TEST_BACKEND_OPS_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "core/status.h"
#include "core/tensor.h"
#include "cuda_test_backend.h"

extern ckv_backend *tb;  /* the backend under test */
extern ckv_backend *ref; /* the CPU backend */
extern const char *tb_name;

/* ---- random inputs ---------------------------------------------------------------------------- */

extern uint64_t rng_state; /* one stream for every case of the run */

static inline uint32_t rng_u32(void) { return ckv_test_rng_u32(&rng_state); }

/* uniform in [lo, hi), never exactly 0 */
static inline float rng_uniform(float lo, float hi) {
    float x = ckv_test_uniform(&rng_state, lo, hi);
    return x == 0.0f ? 0.5f * hi : x;
}

static inline int rng_int(int lo, int hi) { return lo + (int)(rng_u32() % (uint32_t)(hi - lo + 1)); }

#define xalloc ckv_test_calloc

static inline float *rand_floats(size_t n, float lo, float hi) {
    float *x = xalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(lo, hi);
    return x;
}

/* Rounds x to the values `t` can hold (in place): what both backends then compute on. */
static inline void round_to(float *x, size_t n, ckv_dtype t) {
    for (size_t i = 0; i < n; i++)
        if (t == CKV_DTYPE_BF16) x[i] = ckv_bf16_to_f32(ckv_f32_to_bf16(x[i]));
}

/* ---- device buffers on both backends ---------------------------------------------------------- */

/* n floats of NaN: an output the op must overwrite */
static inline float *dev_poison(ckv_backend *be, size_t n) {
    float *h = xalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    float *d = cuda_test_upload(be, h, n * sizeof(float));
    free(h);
    return d;
}

/* Typed copy of fp32 values (F32 or BF16) for upload. */
static inline void *typed(const float *x, size_t n, ckv_dtype t) {
    void *h = xalloc(n * ckv_dtype_size(t));
    ckv_convert_from_f32(h, x, t, n);
    return h;
}

/* ---- comparison ------------------------------------------------------------------------------- */

static inline void compare(const char *op, const char *cas, const float *got, const float *want, size_t n, double atol,
                    double rtol) {
    char what[160];
    snprintf(what, sizeof what, "%s %s %s", tb_name, op, cas);
    ckv_test_allclose(what, got, want, n, atol, rtol);
}

/* Downloads n floats of `dt` (test backend) and `dr` (reference) and compares them. */
static inline void compare_dev(const char *op, const char *cas, const float *dt, const float *dr, size_t n, double atol,
                        double rtol) {
    float *a = xalloc(n * sizeof(float)), *b = xalloc(n * sizeof(float));
    cuda_test_download(tb, a, dt, n * sizeof(float));
    cuda_test_download(ref, b, dr, n * sizeof(float));
    compare(op, cas, a, b, n, atol, rtol);
    free(a);
    free(b);
}

static inline void release2(void *t, void *r) {
    tb->ops->release(tb, t);
    ref->ops->release(ref, r);
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

static inline void kv_build(test_kv *c, ckv_backend *be, ckv_dtype dt, int n_seq, int n_kv, int hd, int cap,
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

static inline void kv_free(test_kv *c) {
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

static inline ckv_kv_batch kv_batch(const test_kv *c, const int32_t *seq_of, const int32_t *seq_start, int max_len) {
    ckv_kv_batch b = {c->dtype, c->hd, c->n_kv, c->n_seq, (ckv_kv_seg *const *)c->list, seq_of, seq_start, max_len};
    return b;
}

/* Random host content: segment (s, g) holds len[s][g] rows with ascending positions; gaps > 0 leave
 * random holes (a compacted cache). Rows past len are random too (must never be read). */
static inline void kv_host_random(test_kv_host *h, ckv_dtype dt, int n_seq, int n_kv, int hd, int cap, const int *lens,
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

static inline void kv_host_free(test_kv_host *h) {
    for (int s = 0; s < KV_MAX_SEQ; s++)
        for (int g = 0; g < KV_MAX_HEADS; g++) {
            free(h->hk[s][g]);
            free(h->hv[s][g]);
            free(h->hp[s][g]);
        }
}

/* Downloads every segment's descriptor, rows [0, cap) of k, v (as fp32) and pos. */
static inline void kv_fetch(const test_kv *c, float *k, float *v, int32_t *pos, int *len) {
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
static inline void kv_compare(const char *op, const char *cas, const test_kv *a, const test_kv *b) {
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

/* Compares n doubles as floats after download. */
static inline void compare_dev_f64(const char *op, const char *cas, const double *dt, const double *dr, size_t n, double atol,
                            double rtol) {
    double *a = xalloc(n * 8), *b = xalloc(n * 8);
    float *fa = xalloc(n * 4), *fb = xalloc(n * 4);
    cuda_test_download(tb, a, dt, n * 8);
    cuda_test_download(ref, b, dr, n * 8);
    for (size_t i = 0; i < n; i++) fa[i] = (float)a[i], fb[i] = (float)b[i];
    compare(op, cas, fa, fb, n, atol, rtol);
    free(a), free(b), free(fa), free(fb);
}

static inline void compare_dev_i32(const char *op, const char *cas, const int32_t *dt, const int32_t *dr, size_t n) {
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

/* The eviction-op cases (test_backend_ops_evict.c); returns the failures its checks counted (ckv_test.h
 * counts per source file: the caller adds them to its own). */
int test_backend_evict_ops(void);

#endif
