/* test_gguf_fixture.c - a fixture checkpoint (tests/fixtures/models/mistral_gqa, a llama-shaped
 * model with default rope) converted to GGUF the way the HF -> GGUF conversion does (names mapped,
 * q/k rows permuted, extents reversed; tests/common/gguf_writer.h) reads back tensor for tensor,
 * slice for slice, equal to the safetensors source, and the forward over it gives bit-identical
 * logits. */
#include <math.h>
#include <stdint.h>

#include "ckv_test.h"
#include "common/gguf_writer.h"
#include "core/quant.h"
#include "core/tensor.h"
#include "engine/session.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/source.h"

/* ---- a fixture checkpoint converted to GGUF ---------------------------------------------------- */

static const struct {
    const char *hf, *gguf;
    int perm; /* 1: q heads, 2: kv heads */
} conv_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},     {"self_attn.q_proj.weight", "attn_q.weight", 1},
    {"self_attn.k_proj.weight", "attn_k.weight", 2},       {"self_attn.v_proj.weight", "attn_v.weight", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0},  {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
    {"mlp.gate_proj.weight", "ffn_gate.weight", 0},        {"mlp.up_proj.weight", "ffn_up.weight", 0},
    {"mlp.down_proj.weight", "ffn_down.weight", 0},
};

/* Writes the F32 safetensors checkpoint in `dir` (a llama-shaped model) as a GGUF file the way the
 * HF -> GGUF conversion does: names mapped, q/k rows permuted, extents reversed. */
static const char *convert_fixture(const char *dir, const ckv_model_config *c) {
    ckv_safetensors *st = NULL;
    CHECK_OK(ckv_safetensors_open_dir(&st, dir));
    if (!st) return NULL;
    ckv_gw_file f;
    ckv_gw_file_init(&f, 3);
    ckv_gw_kv_str(&f, "general.architecture", "llama");
    ckv_gw_kv_str(&f, "general.name", "fixture");
    ckv_gw_kv_u32(&f, "llama.context_length", (uint32_t)c->max_position_embeddings);
    ckv_gw_kv_u32(&f, "llama.embedding_length", (uint32_t)c->hidden_size);
    ckv_gw_kv_u32(&f, "llama.block_count", (uint32_t)c->n_layers);
    ckv_gw_kv_u32(&f, "llama.feed_forward_length", (uint32_t)c->intermediate_size);
    ckv_gw_kv_u32(&f, "llama.attention.head_count", (uint32_t)c->n_heads);
    ckv_gw_kv_u32(&f, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    ckv_gw_kv_u32(&f, "llama.attention.key_length", (uint32_t)c->head_dim);
    ckv_gw_kv_u32(&f, "llama.attention.value_length", (uint32_t)c->head_dim);
    ckv_gw_kv_f32(&f, "llama.attention.layer_norm_rms_epsilon", (float)c->rms_norm_eps);
    ckv_gw_kv_f32(&f, "llama.rope.freq_base", (float)c->rope.theta);
    ckv_gw_kv_u32(&f, "llama.rope.dimension_count", (uint32_t)c->head_dim);
    ckv_gw_kv_u32(&f, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_token_id);
    ckv_gw_kv_u32(&f, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_ids[0]);
    ckv_gw_add_tokens(&f, c->vocab_size);
    for (int i = 0; i < ckv_safetensors_count(st); i++) {
        const ckv_st_tensor *t = ckv_safetensors_at(st, i);
        char gname[128] = "";
        int perm = 0;
        if (!strcmp(t->name, "model.embed_tokens.weight")) snprintf(gname, sizeof gname, "token_embd.weight");
        if (!strcmp(t->name, "model.norm.weight")) snprintf(gname, sizeof gname, "output_norm.weight");
        if (!strcmp(t->name, "lm_head.weight")) snprintf(gname, sizeof gname, "output.weight");
        int layer = -1, off = 0;
        if (sscanf(t->name, "model.layers.%d.%n", &layer, &off) == 1 && off > 0) {
            for (size_t k = 0; k < sizeof conv_names / sizeof conv_names[0]; k++)
                if (!strcmp(t->name + off, conv_names[k].hf)) {
                    snprintf(gname, sizeof gname, "blk.%d.%s", layer, conv_names[k].gguf);
                    perm = conv_names[k].perm;
                }
        }
        CHECK_MSG(gname[0] && t->dtype == CKV_DTYPE_F32, "cannot convert %s", t->name);
        if (!gname[0]) continue;
        int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
        float *g = malloc(t->nbytes);
        ckv_gw_to_gguf_rows(t->data, g, rows, cols, perm == 1 ? c->n_heads : perm == 2 ? c->n_kv_heads : 0);
        ckv_gw_file_tensor(&f, gname, t->ndim, (uint64_t)cols, (uint64_t)rows, CKV_GW_T_F32, g, t->nbytes);
        free(g);
    }
    ckv_safetensors_close(st);
    const char *path = ckv_gw_file_write(&f, "fixture_mistral_gqa");
    ckv_gw_file_free(&f);
    return path;
}

static void compare_sources(ckv_weight_source *a, ckv_weight_source *b, const char *name, int64_t R, int64_t C,
                            int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    int64_t shape[2] = {R, C};
    int ndim = C > 0 ? 2 : 1;
    size_t n = r1 < 0 ? (size_t)(R * (C > 0 ? C : 1)) : (size_t)ckv_gw_read_size(r0, r1, c0, c1);
    float *x = calloc(n, 4), *y = calloc(n, 4);
    CHECK_OK(a->read_f32(a->ctx, name, ndim, shape, r0, r1, c0, c1, x));
    CHECK_OK(b->read_f32(b->ctx, name, ndim, shape, r0, r1, c0, c1, y));
    CHECK_MSG(memcmp(x, y, n * 4) == 0, "%s rows [%lld, %lld) cols [%lld, %lld): GGUF differs from safetensors", name,
              (long long)r0, (long long)r1, (long long)c0, (long long)c1);
    free(x);
    free(y);
}

static void test_fixture_conversion(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/mistral_gqa", CKV_FIXTURES);
    ckv_weight_source st_src, g_src;
    ckv_model_config sc, gc;
    ckv_status s = ckv_source_open(&st_src, &sc, dir);
    CHECK_MSG(s == CKV_STATUS_OK, "%s", ckv_error_message());
    if (s != CKV_STATUS_OK) return;
    const char *path = convert_fixture(dir, &sc);
    s = path ? ckv_source_open(&g_src, &gc, path) : CKV_STATUS_ERR_IO;
    CHECK_MSG(s == CKV_STATUS_OK, "%s", ckv_error_message());
    if (s != CKV_STATUS_OK) {
        ckv_source_close(&st_src);
        return;
    }
    CHECK(gc.hidden_size == sc.hidden_size && gc.n_layers == sc.n_layers && gc.n_heads == sc.n_heads);
    CHECK(gc.n_kv_heads == sc.n_kv_heads && gc.head_dim == sc.head_dim && gc.vocab_size == sc.vocab_size);
    CHECK(gc.intermediate_size == sc.intermediate_size && gc.rope.theta == sc.rope.theta);
    CHECK(gc.tie_word_embeddings == sc.tie_word_embeddings && gc.bos_token_id == sc.bos_token_id);
    int64_t D = sc.hidden_size, d = sc.head_dim, F = sc.intermediate_size, V = sc.vocab_size;
    int64_t Q = sc.n_heads * d, K = sc.n_kv_heads * d;
    compare_sources(&st_src, &g_src, "model.embed_tokens.weight", V, D, 0, -1, 0, -1);
    compare_sources(&st_src, &g_src, "lm_head.weight", V, D, 100, 300, 0, D);
    compare_sources(&st_src, &g_src, "model.norm.weight", D, 0, 0, -1, 0, -1);
    for (int l = 0; l < sc.n_layers; l++) {
        char n[160];
        snprintf(n, sizeof n, "model.layers.%d.self_attn.q_proj.weight", l);
        compare_sources(&st_src, &g_src, n, Q, D, 0, -1, 0, -1);
        compare_sources(&st_src, &g_src, n, Q, D, 2 * d, 4 * d, 0, D); /* tp 2, rank 1 */
        snprintf(n, sizeof n, "model.layers.%d.self_attn.k_proj.weight", l);
        compare_sources(&st_src, &g_src, n, K, D, 0, -1, 0, -1);
        snprintf(n, sizeof n, "model.layers.%d.self_attn.o_proj.weight", l);
        compare_sources(&st_src, &g_src, n, D, Q, 0, D, d, 3 * d);
        snprintf(n, sizeof n, "model.layers.%d.mlp.down_proj.weight", l);
        compare_sources(&st_src, &g_src, n, D, F, 0, D, F / 2, F);
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate_proj.weight", l);
        compare_sources(&st_src, &g_src, n, F, D, 0, F / 2, 0, D);
    }
    ckv_source_close(&st_src);
    ckv_source_close(&g_src);

    /* the forward over both gives identical logits */
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 2));
    ckv_model *ms = NULL, *mg = NULL;
    CHECK_OK(ckv_model_load(&ms, dir, be, NULL));
    CHECK_OK(ckv_model_load(&mg, path, be, NULL));
    if (ms && mg) {
        enum { P = 40 };
        int32_t ids[P];
        for (int i = 0; i < P; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
        float *a = malloc(sizeof(float) * P * (size_t)V), *b = malloc(sizeof(float) * P * (size_t)V);
        ckv_session ss, sg;
        const float *last = NULL;
        CHECK_OK(ckv_session_init(&ss, ms, P, 16, 0));
        CHECK_OK(ckv_session_init(&sg, mg, P, 16, 0));
        CHECK_OK(ckv_session_prefill(&ss, ids, P, a, &last));
        CHECK_OK(ckv_session_prefill(&sg, ids, P, b, &last));
        CHECK_MSG(memcmp(a, b, sizeof(float) * P * (size_t)V) == 0, "GGUF forward differs from safetensors forward");
        ckv_test_allclose("GGUF vs safetensors prefill logits", b, a, (size_t)P * (size_t)V, 0, 0);
        ckv_session_free(&ss);
        ckv_session_free(&sg);
        free(a);
        free(b);
    }
    ckv_model_free(ms);
    ckv_model_free(mg);
    ckv_backend_free(be);
}

int main(void) {
    test_fixture_conversion();
    return ckv_test_finish("test_gguf_fixture");
}
