/* test_source_random.c - the random-weights source: a directory with only config.json opens; the
 * same (seed, name, index) gives the same value in every read and any slice of a tensor equals the
 * matching part of the whole; another seed gives other values; norms are ones; matrices have
 * variance ~1 / fan_in; a model loaded from it gives finite, bounded logits identical across
 * loads (tp 2 equality: tests/mpi/comm_ranks.c). */
#include "ckv_test.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/model.h"
#include "model/source.h"

#define DIR CKV_FIXTURES "/random/tiny_qwen2"

static void test_values(void) {
    ckv_weight_source a, b;
    ckv_model_config c;
    CHECK_OK(ckv_source_open_random(&a, &c, DIR, 7));
    CHECK_OK(ckv_source_open_random(&b, &c, DIR, 8));
    if (!a.ctx || !b.ctx) return;
    CHECK(c.vocab_size == 509 && c.hidden_size == 96 && c.n_layers == 3);
    const char *q = "model.layers.1.self_attn.q_proj.weight";
    int64_t shape[2] = {(int64_t)c.n_heads * c.head_dim, c.hidden_size};
    size_t n = (size_t)shape[0] * (size_t)shape[1];
    float *w = malloc(n * sizeof(float)), *w2 = malloc(n * sizeof(float)), *o = malloc(n * sizeof(float));
    float slice[32 * 40];
    CHECK_OK(a.read_f32(a.ctx, q, 2, shape, 0, -1, 0, -1, w));
    CHECK_OK(a.read_f32(a.ctx, q, 2, shape, 0, -1, 0, -1, w2));
    CHECK(!memcmp(w, w2, n * sizeof(float)));
    CHECK_OK(b.read_f32(b.ctx, q, 2, shape, 0, -1, 0, -1, o));
    CHECK(memcmp(w, o, n * sizeof(float)) != 0);
    CHECK_OK(a.read_f32(a.ctx, q, 2, shape, 40, 72, 50, 90, slice));
    size_t bad = 0;
    for (int r = 0; r < 32; r++)
        for (int k = 0; k < 40; k++) bad += slice[r * 40 + k] != w[(size_t)(40 + r) * (size_t)shape[1] + 50 + (size_t)k];
    CHECK_MSG(bad == 0, "%zu slice values differ from the whole tensor", bad);
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++) {
        sum += w[i];
        sq += (double)w[i] * w[i];
    }
    double var = sq / (double)n - (sum / (double)n) * (sum / (double)n), want = 1.0 / (double)c.hidden_size;
    CHECK_MSG(fabs(var - want) < 0.05 * want, "variance %g, expected 1/fan_in = %g", var, want);
    float norm[96];
    int64_t D = c.hidden_size;
    CHECK_OK(a.read_f32(a.ctx, "model.layers.0.input_layernorm.weight", 1, &D, 0, -1, 0, -1, norm));
    bad = 0;
    for (int i = 0; i < 96; i++) bad += norm[i] != 1.0f;
    CHECK_MSG(bad == 0, "norm weights are not ones");
    CHECK(a.has(a.ctx, "lm_head.weight")); /* the fixture does not tie embeddings */
    CHECK_FAILS(a.read_f32(a.ctx, q, 2, shape, 0, shape[0] + 1, 0, 4, slice), CKV_STATUS_ERR_RANGE, "outside");
    free(w);
    free(w2);
    free(o);
    ckv_source_close(&a);
    ckv_source_close(&b);
    CHECK_FAILS(ckv_source_open_random(&a, &c, CKV_FIXTURES "/random/missing", 1), CKV_STATUS_ERR_IO, "missing");
    ckv_source_close(&a);
}

static void run(ckv_backend *be, float *out, int V, int P) {
    ckv_model *m = NULL;
    CHECK_OK(ckv_model_load_random(&m, DIR, be, NULL, NULL, 99));
    if (!m) return;
    int32_t ids[64];
    for (int i = 0; i < P; i++) ids[i] = (i * 31 + 5) % V;
    ckv_session s;
    CHECK_OK(ckv_session_init(&s, m, P + 1, 8, 0));
    CHECK_OK(ckv_session_prefill(&s, ids, P, out, NULL));
    ckv_session_free(&s);
    ckv_model_free(m);
}

static void test_model(void) {
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 1));
    if (!be) return;
    enum { V = 509, P = 20 };
    float *a = malloc(sizeof(float) * V * P), *b = malloc(sizeof(float) * V * P);
    run(be, a, V, P);
    run(be, b, V, P);
    ckv_test_allclose("random-weights logits, two loads", a, b, (size_t)V * P, 0, 0);
    double mx = 0;
    for (size_t i = 0; i < (size_t)V * P; i++) mx = fmax(mx, fabs(a[i]));
    CHECK_MSG(mx > 0.1 && mx < 100, "max |logit| %g: expected bounded, non-trivial logits", mx);
    free(a);
    free(b);
    ckv_backend_free(be);
}

int main(void) {
    test_values();
    test_model();
    return ckv_test_finish("test_source_random");
}
