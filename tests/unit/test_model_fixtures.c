/* test_model_fixtures.c - the forward pass equals Hugging Face transformers: for every model under
 * tests/fixtures/models (written by tools/oracle/regen.sh) the logits of all 240 prompt positions
 * and of 8 greedy decode steps match the recorded ones, and layer-major chunked prefill gives the
 * same logits as one-shot prefill.
 * Tolerances: fp32 checkpoints (HF computes in fp32): |diff| <= 1e-4; both sides compute in fp32 and
 * differ only in summation order. bf16 checkpoints are checked twice: (1) against HF loading the same
 * bf16 weights with dtype=float32 (exact upcast, fp32 compute, which is what ckv's CPU backend does):
 * |diff| <= 1e-4, stricter than the 2e-2 the issue allows; (2) against HF computing in bf16 as a user
 * loads it: identical greedy tokens, and |diff| <= 0.25. That bound is the bf16 arithmetic of the
 * reference, not ours: every HF activation is rounded to 8 mantissa bits (relative 2^-9), ~10
 * roundings per layer on logits of std ~3 give a typical error of a few 1e-2 and a tail near 0.15
 * (measured up to 0.185 over the three fixtures; the oracle's own bf16 incremental-vs-full self-check
 * differs by up to 0.06). */
#include "backend/backend.h"
#include "ckv_test.h"
#include "common/fixture.h"
#include "model/model.h"

/* Compares rows [row0, row0 + n) of a reference with got [n, V]. */
static void compare_rows(const char *what, const float *got, const float *ref, int row0, int n, int V, double atol) {
    ckv_test_allclose(what, got, ref + (size_t)row0 * V, (size_t)n * V, atol, 0.0);
}

static void check_model(const char *dir, ckv_backend *be) {
    ckv_fixture_ref *r = ckv_fixture_ref_new(dir);
    if (!r) {
        ckv_test_failures++;
        return;
    }
    ckv_model *m = NULL;
    CHECK_OK(ckv_model_load(&m, dir, be, NULL));
    if (!m) {
        ckv_fixture_ref_delete(r);
        return;
    }
    CHECK(m->cfg.vocab_size == r->vocab);
    int V = r->vocab, P = r->n_prompt, D = r->n_decode;
    /* strict reference: HF in fp32 (for bf16 checkpoints: bf16 weights upcast to fp32) */
    const float *strict = ckv_fixture_ref_strict(r);
    float *full = malloc(sizeof(float) * (size_t)r->rows * V), *chunked = malloc(sizeof(float) * (size_t)r->rows * V);
    const int chunks[] = {P, 64, 17};
    for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
        float *dst = ci == 0 ? full : chunked; /* [P + D, V]: prefill rows, then one per decode step */
        int32_t greedy[CKV_FIXTURE_MAX_GREEDY];
        int last_same = 0;
        CHECK_OK(ckv_fixture_run(m, r, chunks[ci], dst, greedy, &last_same));
        char what[1500];
        snprintf(what, sizeof what, "%s prefill logits, chunk %d, vs HF fp32", dir, chunks[ci]);
        compare_rows(what, dst, strict, 0, P, V, 1e-4);
        if (ci > 0) {
            snprintf(what, sizeof what, "%s chunk %d vs one-shot prefill", dir, chunks[ci]);
            ckv_test_allclose(what, chunked, full, (size_t)P * V, 1e-5, 1e-5);
        }
        CHECK(last_same);
        /* greedy decode, fed the reference tokens: each row and the chosen token */
        CHECK_MSG(greedy[0] == r->greedy[0], "%s: first greedy token %d, expected %d", dir, greedy[0], r->greedy[0]);
        for (int t = 0; t < D; t++)
            CHECK_MSG(greedy[t + 1] == r->greedy[t + 1], "%s: greedy token %d is %d, expected %d", dir, t + 1,
                      greedy[t + 1], r->greedy[t + 1]);
        snprintf(what, sizeof what, "%s decode logits, chunk %d, vs HF fp32", dir, chunks[ci]);
        compare_rows(what, dst + (size_t)P * V, strict, P, D, V, 1e-4);
        if (r->bf16) {
            snprintf(what, sizeof what, "%s prefill logits, chunk %d, vs HF computing in bf16", dir, chunks[ci]);
            compare_rows(what, dst, r->logits, 0, P, V, 0.25);
            snprintf(what, sizeof what, "%s decode logits, chunk %d, vs HF computing in bf16", dir, chunks[ci]);
            compare_rows(what, dst + (size_t)P * V, r->logits, P, D, V, 0.25);
        }
    }
    free(full);
    free(chunked);
    ckv_model_free(m);
    ckv_fixture_ref_delete(r);
}

int main(void) {
    static ckv_fixture_models ms;
    if (ckv_fixture_models_list(&ms, CKV_FIXTURES) != CKV_STATUS_OK) {
        fprintf(stderr, "FAIL: %s\n", ckv_error_message());
        return 1;
    }
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 2));
    for (int i = 0; i < ms.n && be; i++) check_model(ms.dir[i], be);
    CHECK_MSG(ms.n >= 6, "expected >= 6 fixture models (3 architectures x F32/BF16), found %d", ms.n);
    ckv_backend_free(be);
    return ckv_test_finish("test_model_fixtures");
}
