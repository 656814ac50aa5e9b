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
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "core/json.h"
#include "engine/compress.h"
#include "engine/session.h"
#include "evict/press.h"
#include "model/model.h"

typedef struct {
    int n_layers, n_kv, L;
    int32_t *n_keep; // [n_layers, n_kv]
    int32_t *pos;    // [n_layers, n_kv, L] kept positions, ascending
} kept_sets;

static void kept_free(kept_sets *k) {
    free(k->n_keep);
    free(k->pos);
}

/* Compresses ctx[L] with `spec` at cr 0.5 into a cache of `dt`; records the kept sets. */
static int run_press(ckv_model *m, const char *spec, ckv_dtype dt, const int32_t *ctx, int L, const int32_t *q, int nq,
                     kept_sets *out) {
    const ckv_model_config *c = &m->cfg;
    memset(out, 0, sizeof *out);
    ckv_press_config cfg;
    CHECK_OK(ckv_press_parse(&cfg, spec));
    CHECK_OK(ckv_press_set_compression_ratio(&cfg, 0.5));
    CHECK_OK(ckv_press_finalize(&cfg));
    ckv_compressor cz;
    memset(&cz, 0, sizeof cz);
    cz.cfg = &cfg;
    ckv_session s;
    ckv_status st = ckv_session_init_kv(&s, m, L + nq, 64, 1, dt);
    CHECK_OK(st);
    if (st != CKV_STATUS_OK) return 0;
    st = ckv_session_prefill_hook(&s, ctx, L, NULL, NULL, ckv_compress_layer_hook, &cz);
    CHECK_MSG(st == CKV_STATUS_OK, "%s on a %s cache: %s", spec, ckv_dtype_name(dt), ckv_error_message());
    out->n_layers = c->n_layers, out->n_kv = s.kv.n_kv, out->L = L;
    out->n_keep = calloc((size_t)c->n_layers * s.kv.n_kv, sizeof(int32_t));
    out->pos = calloc((size_t)c->n_layers * s.kv.n_kv * L, sizeof(int32_t));
    float *hk = malloc(sizeof(float) * (size_t)(L + nq) * c->head_dim); // [L + nq, d] scratch
    float *hv = malloc(sizeof(float) * (size_t)(L + nq) * c->head_dim);
    for (int l = 0; st == CKV_STATUS_OK && l < c->n_layers; l++)
        for (int h = 0; h < s.kv.n_kv; h++) {
            const int n = s.kv.layers[l].len[h];
            out->n_keep[l * s.kv.n_kv + h] = n;
            CHECK_OK(ckv_kv_head_read(&s.kv, l, h, hk, hv, out->pos + ((size_t)l * s.kv.n_kv + h) * L));
        }
    if (st == CKV_STATUS_OK && nq > 0) { /* the question against the compressed cache */
        float *logits = malloc(sizeof(float) * (size_t)nq * c->vocab_size);
        CHECK_OK(ckv_session_prefill(&s, q, nq, logits, NULL));
        int finite = 1;
        for (size_t i = 0; i < (size_t)nq * c->vocab_size; i++) finite &= isfinite(logits[i]) != 0;
        CHECK_MSG(finite, "%s on a %s cache: non-finite question logits", spec, ckv_dtype_name(dt));
        free(logits);
    }
    free(hk), free(hv);
    ckv_session_free(&s);
    return st == CKV_STATUS_OK;
}

/* Counts differing heads and kept positions of b relative to a (positions in a missing from b). */
static void compare_sets(const kept_sets *a, const kept_sets *b, int *heads_diff, long *pos_diff, long *pos_total,
                         int *count_mismatch) {
    *heads_diff = 0, *pos_diff = 0, *pos_total = 0, *count_mismatch = 0;
    for (int i = 0; i < a->n_layers * a->n_kv; i++) {
        const int32_t *pa = a->pos + (size_t)i * a->L, *pb = b->pos + (size_t)i * a->L;
        const int na = a->n_keep[i], nb = b->n_keep[i];
        *count_mismatch += na != nb;
        long common = 0;
        for (int x = 0, y = 0; x < na && y < nb;) { /* both ascending */
            if (pa[x] == pb[y]) common++, x++, y++;
            else if (pa[x] < pb[y]) x++;
            else y++;
        }
        *pos_total += na;
        *pos_diff += na - common;
        *heads_diff += !(na == nb && common == na);
    }
}

static int int_array(const ckv_json *a, int32_t *out, int cap) {
    int n = ckv_json_array_size(a);
    for (int i = 0; i < n && i < cap; i++) out[i] = (int32_t)ckv_json_number(ckv_json_array_at(a, i));
    return n < cap ? n : cap;
}

static void check_model(ckv_backend *be, const char *name, const char *const *presses, size_t n_presses) {
    char path[1024], model_dir[1024];
    snprintf(path, sizeof path, "%s/presses/%s/context.json", CKV_FIXTURES, name);
    snprintf(model_dir, sizeof model_dir, "%s/models/%s", CKV_FIXTURES, name);
    ckv_json *cj = NULL;
    CHECK_OK(ckv_json_parse_file(&cj, path));
    if (!cj) return;
    int32_t ctx[4096], q[64];
    const int L = int_array(ckv_json_get(cj, "context_ids"), ctx, 4096);
    const int nq = int_array(ckv_json_get(cj, "question_ids"), q, 64);
    ckv_json_free(cj);
    ckv_model *m = NULL;
    CHECK_OK(ckv_model_load(&m, model_dir, be, NULL));
    if (!m) return;
    const ckv_dtype dts[2] = {CKV_DTYPE_F16, CKV_DTYPE_BF16};
    for (size_t p = 0; p < n_presses; p++) {
        kept_sets ref, again;
        if (!run_press(m, presses[p], CKV_DTYPE_F32, ctx, L, q, nq, &ref)) continue;
        if (p < 2 && run_press(m, presses[p], CKV_DTYPE_F32, ctx, L, q, nq, &again)) { /* deterministic */
            int hd, cm;
            long pd, pt;
            compare_sets(&ref, &again, &hd, &pd, &pt, &cm);
            CHECK_MSG(hd == 0, "%s %s: two F32 runs differ in %d heads", name, presses[p], hd);
            kept_free(&again);
        }
        for (int k = 0; k < 2; k++) {
            kept_sets got;
            if (!run_press(m, presses[p], dts[k], ctx, L, q, nq, &got)) continue;
            int hd, cm;
            long pd, pt;
            compare_sets(&ref, &got, &hd, &pd, &pt, &cm);
            const int uniform = strchr(presses[p], ':') == NULL || !strncmp(presses[p], "critical:", 9);
            const int cross = !uniform || !strcmp(presses[p], "defensivekv");
            if (!cross) CHECK_MSG(cm == 0, "%s %s %s: %d heads keep another count than F32", name, presses[p],
                                  ckv_dtype_name(dts[k]), cm);
            long tot_ref = 0, tot_got = 0;
            for (int i = 0; i < ref.n_layers * ref.n_kv; i++) tot_ref += ref.n_keep[i], tot_got += got.n_keep[i];
            CHECK_MSG(tot_ref == tot_got, "%s %s %s: %ld kept entries, F32 %ld", name, presses[p],
                      ckv_dtype_name(dts[k]), tot_got, tot_ref);
            fprintf(stderr, "%-10s %-22s %-4s vs F32: %d of %d (layer, KV head) sets differ, %ld of %ld kept positions\n",
                    name, presses[p], ckv_dtype_name(dts[k]), hd, ref.n_layers * ref.n_kv, pd, pt);
            CHECK_MSG(pd * 100 <= 3 * pt, "%s %s %s: %ld of %ld kept positions differ from F32 (> 3%%)", name, presses[p],
                      ckv_dtype_name(dts[k]), pd, pt);
            kept_free(&got);
        }
        kept_free(&ref);
    }
    ckv_model_free(m);
}

int main(void) {
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 2));
    if (!be) return ckv_test_finish("test_evict_kv_dtype");
    /* every press family on one model, the cross-head and statistics-heavy ones on a second (biases) */
    static const char *const all[] = {
        "snapkv",        "snapkv_paper",       "pyramidkv",          "tova",   "knorm",
        "streaming_llm", "observed_attention", "expected_attention", "random", "critical:snapkv",
        "adakv:snapkv",  "critical_adakv:snapkv", "critical:knorm",  "defensivekv",
    };
    static const char *const some[] = {"critical_adakv:snapkv", "tova", "expected_attention", "defensivekv"};
    check_model(be, "llama_gqa", all, sizeof all / sizeof all[0]);
    check_model(be, "qwen2_bias", some, sizeof some / sizeof some[0]);
    ckv_backend_free(be);
    return ckv_test_finish("test_evict_kv_dtype");
}
