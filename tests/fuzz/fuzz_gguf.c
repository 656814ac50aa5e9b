/* fuzz_gguf.c - libFuzzer target for the GGUF reader (model/gguf.c): every input is opened as a GGUF
 * weight source; when it opens, the llama tensors the model loader asks for are read whole and in
 * row/column slices. Invariants besides "no crash, no sanitizer report": a failure carries a
 * non-empty one-line printable message, and a success fills a config whose sizes are positive. It does not
 * check values (tests/unit/test_gguf.c does). Built only with clang and -DCKV_FUZZ=ON (see
 * tests/fuzz/README.md for how to run it; CTest replays its seeds in every build). */
#include "fuzz_input.h" /* first: it sets _GNU_SOURCE */
#include "model/gguf.h"

/* Reads `name` with the HF shape [R, C] (C = 0: 1-D [R]) whole and as the slices tensor parallelism
 * uses, when the shape is small enough to allocate. */
static void fuzz_read(ckv_weight_source *src, const char *name, int64_t R, int64_t C) {
    if (R <= 0 || C < 0 || R > (1 << 20) || C > (1 << 20) || R * (C ? C : 1) > (1 << 22)) return;
    int64_t shape[2] = {R, C};
    int ndim = C ? 2 : 1;
    float *dst = malloc(sizeof(float) * (size_t)(R * (C ? C : 1)));
    if (!dst) return;
    ckv_status s = src->read_f32(src->ctx, name, ndim, shape, 0, -1, 0, -1, dst);
    if (s != CKV_STATUS_OK) ckv_fuzz_check_message();
    if (C) {
        src->read_f32(src->ctx, name, ndim, shape, R / 2, R, 0, C, dst);
        src->read_f32(src->ctx, name, ndim, shape, 0, R, C / 3, C - C / 5, dst);
    }
    free(dst);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = ckv_fuzz_file(data, size);
    ckv_weight_source src;
    ckv_model_config c;
    ckv_error_clear();
    ckv_status s = ckv_gguf_open_source(&src, &c, path);
    if (s != CKV_STATUS_OK) {
        ckv_fuzz_check_message();
        return 0;
    }
    if (c.vocab_size <= 0 || c.hidden_size <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 || c.head_dim <= 0 ||
        c.n_layers <= 0 || c.intermediate_size <= 0)
        abort();
    int64_t D = c.hidden_size, V = c.vocab_size, F = c.intermediate_size;
    int64_t Q = (int64_t)c.n_heads * c.head_dim, K = (int64_t)c.n_kv_heads * c.head_dim;
    fuzz_read(&src, "model.embed_tokens.weight", V, D);
    fuzz_read(&src, "model.norm.weight", D, 0);
    if (src.has(src.ctx, "lm_head.weight")) fuzz_read(&src, "lm_head.weight", V, D);
    fuzz_read(&src, "model.layers.0.input_layernorm.weight", D, 0);
    fuzz_read(&src, "model.layers.0.self_attn.q_proj.weight", Q, D);
    fuzz_read(&src, "model.layers.0.self_attn.k_proj.weight", K, D);
    fuzz_read(&src, "model.layers.0.self_attn.v_proj.weight", K, D);
    fuzz_read(&src, "model.layers.0.self_attn.o_proj.weight", D, Q);
    fuzz_read(&src, "model.layers.0.self_attn.q_proj.bias", Q, 0);
    fuzz_read(&src, "model.layers.0.self_attn.k_proj.bias", K, 0);
    fuzz_read(&src, "model.layers.0.mlp.down_proj.weight", D, F);
    /* a wrong shape and a NULL destination are refused, not followed */
    fuzz_read(&src, "model.layers.0.mlp.up_proj.weight", F + 1, D);
    if (src.read_f32(src.ctx, "model.norm.weight", 1, &D, 0, -1, 0, -1, NULL) == CKV_STATUS_OK) abort();
    if (src.release_pages) src.release_pages(src.ctx);
    src.close(src.ctx); /* what ckv_source_close does, without linking source.c's safetensors side */
    return 0;
}
