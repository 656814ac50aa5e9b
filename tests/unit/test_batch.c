/* test_batch.c - batched decode: three sessions of different lengths (one of them compressed by a
 * press), with F32 and with BF16 KV caches, decoded together in one forward per step give the logits each
 * gives alone (within fp32 GEMM-vs-GEMV rounding) and the same greedy tokens; membership changes
 * between steps (a session leaves, comes back) are followed; misuse is refused. The key bound a step's
 * attention is planned for (ckv_decode_len_bound) holds every length, by at most 256 keys or 1/16 of
 * the length's power of two beyond it, and changes only at the bucket's edges. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckv_test.h"
#include "engine/batch.h"
#include "engine/compress.h"
#include "evict/press.h"

enum { NS = 3, STEPS = 6 };

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
    return b;
}

/* Prefills session i's prompt (length 30 + 25 i, ids from a fixed pattern); with `press`, session 1
 * is compressed by snapkv keeping 40%. */
static void prefill(ckv_session *s, ckv_model *m, int i, int press, int32_t *first) {
    const int n = 30 + 25 * i, V = m->cfg.vocab_size;
    int32_t ids[128];
    for (int t = 0; t < n; t++) ids[t] = (int32_t)((7 * t + 13 * i + 1) % V);
    const float *last = NULL;
    if (i == 1 && press) {
        ckv_press_config pc;
        CHECK_OK(ckv_press_parse(&pc, "snapkv"));
        CHECK_OK(ckv_press_set_option(&pc, "window", "8"));
        CHECK_OK(ckv_press_set_budget(&pc, 0.4));
        CHECK_OK(ckv_press_finalize(&pc));
        ckv_compressor cz = {.cfg = &pc};
        CHECK_OK(ckv_session_prefill_hook(s, ids, n, NULL, &last, ckv_compress_layer_hook, &cz));
    } else {
        CHECK_OK(ckv_session_prefill(s, ids, n, NULL, &last));
    }
    if (last) *first = argmax(last, V);
}

static void run(ckv_model *m, ckv_dtype dt) {
    const int V = m->cfg.vocab_size;
    ckv_session alone[NS], batched[NS];
    int32_t tok_a[NS], tok_b[NS];
    for (int i = 0; i < NS; i++) {
        const int press = i == 1 && dt == CKV_DTYPE_F32; /* the host scorers read F32 caches */
        CHECK_OK(ckv_session_init_kv(&alone[i], m, 160, 16, press, dt));
        CHECK_OK(ckv_session_init_kv(&batched[i], m, 160, 16, press, dt));
        prefill(&alone[i], m, i, press, &tok_a[i]);
        prefill(&batched[i], m, i, press, &tok_b[i]);
        CHECK(tok_a[i] == tok_b[i]);
    }
    ckv_decode_batch b;
    CHECK_OK(ckv_decode_batch_init(&b, m, 4));
    float *ref = malloc(sizeof(float) * (size_t)V * NS);
    double worst = 0;
    int mismatched = 0;
    for (int step = 0; step < STEPS; step++) {
        /* step 2 runs sessions 0 and 2 only (1 sits out), as a scheduler would */
        ckv_session *rows[NS];
        int32_t toks[NS];
        int idx[NS], n = 0;
        for (int i = 0; i < NS; i++)
            if (!(step == 2 && i == 1)) idx[n] = i, rows[n] = &batched[i], toks[n] = tok_b[i], n++;
        for (int r = 0; r < n; r++) {
            const float *lg = NULL;
            CHECK_OK(ckv_session_decode(&alone[idx[r]], tok_a[idx[r]], &lg));
            if (lg) memcpy(ref + (size_t)r * V, lg, sizeof(float) * (size_t)V);
        }
        const float *lg = NULL;
        CHECK_OK(ckv_decode_batch_step(&b, rows, toks, n, &lg));
        if (!lg) break;
        for (int r = 0; r < n; r++) {
            char what[64];
            snprintf(what, sizeof what, "step %d session %d logits", step, idx[r]);
            /* F32: the rows differ only by GEMM-vs-GEMV summation order (~1e-6). BF16: a key or value
             * that sits on a rounding boundary may round to the neighbouring bf16 value (2^-8
             * relative) in one run and not the other, so the bound is a few bf16 half-ulps. */
            const double tol = dt == CKV_DTYPE_F32 ? 1e-4 : 4e-3;
            double e = ckv_test_allclose(what, lg + (size_t)r * V, ref + (size_t)r * V, (size_t)V, tol, tol);
            worst = e > worst ? e : worst;
            tok_a[idx[r]] = argmax(ref + (size_t)r * V, V);
            tok_b[idx[r]] = argmax(lg + (size_t)r * V, V);
            mismatched += tok_a[idx[r]] != tok_b[idx[r]];
        }
    }
    CHECK_MSG(mismatched == 0, "batched decode: %d greedy tokens differ from decoding alone", mismatched);
    fprintf(stderr, "batched decode of %d sessions x %d steps, %s KV: max |logit diff| %.3g vs alone\n", NS, STEPS,
            ckv_dtype_name(dt), worst);
    for (int i = 0; i < NS; i++) CHECK(alone[i].n_past == batched[i].n_past);
    ckv_session *mixed[2] = {&batched[0], &batched[1]};
    int32_t t2[2] = {1, 2};
    const float *lg = NULL;
    ckv_session other;
    CHECK_OK(ckv_session_init_kv(&other, m, 160, 16, 0, dt == CKV_DTYPE_F32 ? CKV_DTYPE_BF16 : CKV_DTYPE_F32));
    int32_t one = 3;
    CHECK_OK(ckv_session_prefill(&other, &one, 1, NULL, NULL));
    mixed[1] = &other;
    CHECK_FAILS(ckv_decode_batch_step(&b, mixed, t2, 2, &lg), CKV_STATUS_ERR_ARG, "different dtypes");
    ckv_session_free(&other);
    ckv_session *dup[2] = {&batched[0], &batched[0]};
    CHECK_FAILS(ckv_decode_batch_step(&b, dup, t2, 2, &lg), CKV_STATUS_ERR_ARG, "twice");
    CHECK_FAILS(ckv_decode_batch_step(&b, dup, t2, 5, &lg), CKV_STATUS_ERR_ARG, "expected 1 .. 4");
    ckv_decode_batch_free(&b);
    ckv_decode_batch_free(&b);
    for (int i = 0; i < NS; i++) {
        ckv_session_free(&alone[i]);
        ckv_session_free(&batched[i]);
    }
    free(ref);
}

/* ckv_decode_len_bound over 1 .. 300,000: a bound >= len, within its bucket's width of len, and the
 * same for every length of one bucket (a CUDA graph recorded per bucket). */
static void check_len_bound(void) {
    int bad = 0, buckets = 0, prev = 0;
    for (int len = 1; len <= 300000; len++) {
        const int b = ckv_decode_len_bound(len);
        int p = 1;
        while (p * 2 <= len) p *= 2;
        const int width = p / 16 > 256 ? p / 16 : 256;
        const int ok = b >= len && b - len < width && b % width == 0 && (b == prev || len - 1 == prev);
        if (!ok && bad++ < 5) fprintf(stderr, "  ckv_decode_len_bound(%d) = %d (width %d, previous %d)\n", len, b, width, prev);
        buckets += b != prev;
        prev = b;
    }
    CHECK_MSG(bad == 0, "%d lengths got a bound outside their bucket", bad);
    fprintf(stderr, "%s key bounds of 1 .. 300000 keys: %d buckets\n", bad ? "FAIL" : "ok  ", buckets);
}

int main(void) {
    check_len_bound();
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/llama_gqa", CKV_FIXTURES);
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 2));
    ckv_model *m = NULL;
    CHECK_OK(ckv_model_load(&m, dir, be, NULL));
    if (!m) return ckv_test_finish("test_batch");
    run(m, CKV_DTYPE_F32);
    run(m, CKV_DTYPE_BF16);
    ckv_model_free(m);
    ckv_backend_free(be);
    return ckv_test_finish("test_batch");
}
