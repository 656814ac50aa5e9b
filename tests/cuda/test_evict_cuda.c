/* test_evict_cuda.c - every press family through the CUDA backend keeps what the CPU backend keeps.
 * On the press fixtures (tests/fixtures/presses/<model>/context.json) each press compresses the
 * context at ratio 0.5 on the CPU backend and on the CUDA backend, both with the fixture's fp32
 * weights and an fp32 KV cache (so both compute the same keys up to fp32 summation order); the
 * kept positions of every (layer, KV head) must be identical (the SPEC tie rule decides exact ties
 * on both), and the question logits after the compressed prefill must agree to 1e-3.
 *   test_evict_cuda cuda-emu   on the CPU execution layer (label cuda-emu)
 *   test_evict_cuda cuda       on a GPU (label cuda); skips without one */
#include <stdint.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "core/json.h"
#include "cuda_test_backend.h"
#include "engine/compress.h"
#include "engine/session.h"
#include "evict/press.h"
#include "model/model.h"

typedef struct {
    int cells;       /* n_layers * n_kv */
    int L;
    int32_t *n_keep; // [cells]
    int32_t *pos;    // [cells, L] kept positions, ascending
    float *logits;   // [nq, vocab] question logits after the compressed prefill
} kept;

static void kept_free(kept *k) {
    free(k->n_keep);
    free(k->pos);
    free(k->logits);
}

static int run_press(ckv_model *m, const char *spec, const int32_t *ctx, int L, const int32_t *q, int nq, kept *out) {
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
    ckv_status st = ckv_session_init_kv(&s, m, L + nq, 64, 1, CKV_DTYPE_F32);
    CHECK_OK(st);
    if (st != CKV_STATUS_OK) return 0;
    st = ckv_session_prefill_hook(&s, ctx, L, NULL, NULL, ckv_compress_layer_hook, &cz);
    CHECK_MSG(st == CKV_STATUS_OK, "%s on %s: %s", spec, m->be->name, ckv_error_message());
    out->cells = c->n_layers * s.kv.n_kv, out->L = L;
    out->n_keep = calloc((size_t)out->cells, sizeof(int32_t));
    out->pos = calloc((size_t)out->cells * L, sizeof(int32_t));
    out->logits = calloc((size_t)nq * c->vocab_size, sizeof(float));
    float *hk = malloc(sizeof(float) * (size_t)(L + nq) * c->head_dim), *hv = malloc(sizeof(float) * (size_t)(L + nq) * c->head_dim);
    for (int l = 0; st == CKV_STATUS_OK && l < c->n_layers; l++)
        for (int h = 0; h < s.kv.n_kv; h++) {
            out->n_keep[l * s.kv.n_kv + h] = s.kv.layers[l].len[h];
            CHECK_OK(ckv_kv_head_read(&s.kv, l, h, hk, hv, out->pos + ((size_t)l * s.kv.n_kv + h) * L));
        }
    if (st == CKV_STATUS_OK && nq > 0) CHECK_OK(ckv_session_prefill(&s, q, nq, out->logits, NULL));
    free(hk), free(hv);
    ckv_session_free(&s);
    return st == CKV_STATUS_OK;
}

static int int_array(const ckv_json *a, int32_t *out, int cap) {
    int n = ckv_json_array_size(a);
    for (int i = 0; i < n && i < cap; i++) out[i] = (int32_t)ckv_json_number(ckv_json_array_at(a, i));
    return n < cap ? n : cap;
}

static void check_model(ckv_backend *dev, ckv_backend *cpu, const char *name) {
    char path[1024], dir[1024];
    snprintf(path, sizeof path, "%s/presses/%s/context.json", CKV_FIXTURES, name);
    snprintf(dir, sizeof dir, "%s/models/%s", CKV_FIXTURES, name);
    ckv_json *cj = NULL;
    CHECK_OK(ckv_json_parse_file(&cj, path));
    if (!cj) return;
    static int32_t ctx[4096], q[64];
    const int L = int_array(ckv_json_get(cj, "context_ids"), ctx, 4096);
    const int nq = int_array(ckv_json_get(cj, "question_ids"), q, 64);
    ckv_json_free(cj);
    const ckv_model_opts f32 = {CKV_DTYPE_F32};
    ckv_model *md = NULL, *mc = NULL;
    CHECK_OK(ckv_model_load_opts(&md, dir, dev, NULL, &f32));
    CHECK_OK(ckv_model_load(&mc, dir, cpu, NULL));
    static const char *const presses[] = {
        "snapkv",        "snapkv_paper",       "pyramidkv",          "tova",   "knorm",
        "streaming_llm", "observed_attention", "expected_attention", "random", "critical:snapkv",
        "adakv:snapkv",  "critical_adakv:snapkv", "critical:knorm",  "defensivekv",
    };
    for (size_t p = 0; md && mc && p < sizeof presses / sizeof presses[0]; p++) {
        kept a, b;
        if (run_press(mc, presses[p], ctx, L, q, nq, &b) && run_press(md, presses[p], ctx, L, q, nq, &a)) {
            int heads = 0;
            long diff = 0, total = 0;
            for (int i = 0; i < a.cells; i++) {
                const int same = a.n_keep[i] == b.n_keep[i] &&
                                 !memcmp(a.pos + (size_t)i * L, b.pos + (size_t)i * L, sizeof(int32_t) * (size_t)a.n_keep[i]);
                heads += !same;
                total += b.n_keep[i];
                if (!same) {
                    for (int x = 0, y = 0; x < b.n_keep[i]; x++) { /* positions of the CPU set not kept on the device */
                        while (y < a.n_keep[i] && a.pos[(size_t)i * L + y] < b.pos[(size_t)i * L + x]) y++;
                        diff += !(y < a.n_keep[i] && a.pos[(size_t)i * L + y] == b.pos[(size_t)i * L + x]);
                    }
                }
            }
            CHECK_MSG(heads == 0, "%s %s: %d of %d (layer, KV head) kept sets differ from the cpu backend (%ld of %ld positions)",
                      name, presses[p], heads, a.cells, diff, total);
            if (!heads) fprintf(stderr, "ok   %s %s %s: %d kept sets (%ld positions) identical to the cpu backend\n", dev->name,
                                name, presses[p], a.cells, total);
            char what[160];
            snprintf(what, sizeof what, "%s %s %s: question logits vs cpu", dev->name, name, presses[p]);
            ckv_test_allclose(what, a.logits, b.logits, (size_t)nq * md->cfg.vocab_size, 1e-3, 0.0);
        }
        kept_free(&a);
        kept_free(&b);
    }
    ckv_model_free(md);
    ckv_model_free(mc);
}

int main(int argc, char **argv) {
    ckv_backend *dev = NULL, *cpu = NULL;
    const int rc = cuda_test_open(argc, argv, "test_evict_cuda", &dev);
    if (rc >= 0) return rc;
    CHECK_OK(ckv_backend_init(&cpu, "cpu", 1));
    if (cpu) {
        check_model(dev, cpu, "llama_gqa");
        check_model(dev, cpu, "qwen2_bias");
    }
    CHECK_OK(dev->ops->sync(dev));
    ckv_backend_free(dev);
    ckv_backend_free(cpu);
    return ckv_test_finish("test_evict_cuda");
}
