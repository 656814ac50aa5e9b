/* test_evict_kv_dtype.c - presses on F16 and BF16 KV caches: the whole eviction path runs on the
 * backend's ops over the cache segments, so a press compresses a cache of any dtype. On the fixture
 * models (tests/fixtures/presses/<model>/context.json), every press family (on llama_gqa; four of them
 * on qwen2_bias) compresses the context with an F32, an F16 and a BF16 cache; the test checks that
 * F32 is deterministic (two runs keep identical sets), that every head keeps the count its budget
 * asks (same counts per head as F32 for uniform presses, same total per layer for cross-head ones), that the question logits after the
 * compressed prefill are finite, and that the kept sets stay close to F32's: it prints, per press
 * and dtype, how many (layer, KV head) sets differ and how many kept positions differ, and fails
 * when more than 3% of the kept positions of a press differ (BF16 keys carry 8 mantissa bits, so
 * tokens near the cut may swap; F16 keeps 11). */
#include <stdint.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "common/fixture.h"
#include "model/model.h"

/* Compresses the context with `spec` at cr 0.5 into a cache of `dt`; the question logits after it
 * must be finite. Returns 1 with *out filled. */
static int run_press(ckv_model *m, const char *spec, ckv_dtype dt, const ckv_fixture_context *c,
                     ckv_fixture_kept *out) {
    const ckv_status st = ckv_fixture_run_press(m, spec, dt, c, out);
    CHECK_OK(st);
    if (st != CKV_STATUS_OK) return 0;
    int finite = 1;
    for (size_t i = 0; i < (size_t)c->nq * m->cfg.vocab_size; i++) finite &= isfinite(out->logits[i]) != 0;
    CHECK_MSG(finite, "%s on a %s cache: non-finite question logits", spec, ckv_dtype_name(dt));
    return 1;
}

static void check_model(ckv_backend *be, const char *name, const char *const *presses, size_t n_presses) {
    static ckv_fixture_context c;
    const ckv_status st = ckv_fixture_context_load(&c, CKV_FIXTURES, name);
    CHECK_OK(st);
    if (st != CKV_STATUS_OK) return;
    ckv_model *m = NULL;
    CHECK_OK(ckv_model_load(&m, c.model_dir, be, NULL));
    if (!m) return;
    const ckv_dtype dts[2] = {CKV_DTYPE_F16, CKV_DTYPE_BF16};
    for (size_t p = 0; p < n_presses; p++) {
        ckv_fixture_kept ref, again;
        if (!run_press(m, presses[p], CKV_DTYPE_F32, &c, &ref)) continue;
        if (p < 2 && run_press(m, presses[p], CKV_DTYPE_F32, &c, &again)) { /* deterministic */
            const ckv_fixture_kept_diff d = ckv_fixture_kept_compare(&ref, &again);
            CHECK_MSG(d.heads_diff == 0, "%s %s: two F32 runs differ in %d heads", name, presses[p], d.heads_diff);
            ckv_fixture_kept_free(&again);
        }
        for (int k = 0; k < 2; k++) {
            ckv_fixture_kept got;
            if (!run_press(m, presses[p], dts[k], &c, &got)) continue;
            const ckv_fixture_kept_diff d = ckv_fixture_kept_compare(&ref, &got);
            const int uniform = strchr(presses[p], ':') == NULL || !strncmp(presses[p], "critical:", 9);
            const int cross = !uniform || !strcmp(presses[p], "defensivekv");
            if (!cross) CHECK_MSG(d.count_mismatch == 0, "%s %s %s: %d heads keep another count than F32", name,
                                  presses[p], ckv_dtype_name(dts[k]), d.count_mismatch);
            long tot_ref = 0, tot_got = 0;
            for (int i = 0; i < ref.n_layers * ref.n_kv; i++) tot_ref += ref.n_keep[i], tot_got += got.n_keep[i];
            CHECK_MSG(tot_ref == tot_got, "%s %s %s: %ld kept entries, F32 %ld", name, presses[p],
                      ckv_dtype_name(dts[k]), tot_got, tot_ref);
            fprintf(stderr, "%-10s %-22s %-4s vs F32: %d of %d (layer, KV head) sets differ, %ld of %ld kept positions\n",
                    name, presses[p], ckv_dtype_name(dts[k]), d.heads_diff, ref.n_layers * ref.n_kv, d.pos_diff,
                    d.pos_total);
            CHECK_MSG(d.pos_diff * 100 <= 3 * d.pos_total,
                      "%s %s %s: %ld of %ld kept positions differ from F32 (> 3%%)", name, presses[p],
                      ckv_dtype_name(dts[k]), d.pos_diff, d.pos_total);
            ckv_fixture_kept_free(&got);
        }
        ckv_fixture_kept_free(&ref);
    }
    ckv_model_free(m);
}

int main(void) {
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 2));
    if (!be) return ckv_test_finish("test_evict_kv_dtype");
    /* every press family on one model, the cross-head and statistics-heavy ones on a second (biases) */
    static const char *const some[] = {"critical_adakv:snapkv", "tova", "expected_attention", "defensivekv"};
    check_model(be, "llama_gqa", ckv_fixture_presses, ckv_fixture_n_presses);
    check_model(be, "qwen2_bias", some, sizeof some / sizeof some[0]);
    ckv_backend_free(be);
    return ckv_test_finish("test_evict_kv_dtype");
}
