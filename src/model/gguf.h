/* gguf.h - reader for GGUF files (v2 and v3): metadata, tensor table, alignment, and tensors of
 * type F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K dequantised to fp32 at load.
 * For llama- and qwen2-architecture files it provides a ckv_weight_source that maps Hugging Face
 * tensor names ("model.layers.0.self_attn.q_proj.weight") to GGUF names ("blk.0.attn_q.weight"),
 * undoes the rotary row permutation the llama conversion applies to q/k, and a ckv_model_config from
 * the metadata. */
#ifndef CKV_MODEL_GGUF_H
#define CKV_MODEL_GGUF_H

#include "model/source.h"

/* Opens a GGUF file as a weight source and fills *cfg from its metadata. Errors name the file and
 * what is wrong (bad magic, version, counts or offsets past the end, unknown tensor type, missing
 * metadata key, unsupported architecture). */
ckv_status ckv_gguf_open_source(ckv_weight_source *src, ckv_model_config *cfg, const char *path);

/* ---- metadata access (e.g. the tokenizer.ggml.* keys, which src/engine turns into a tokenizer) --- */

typedef struct ckv_gguf_meta ckv_gguf_meta;

/* Opens and validates a GGUF file for metadata look-ups (the tensors are not read). */
ckv_status ckv_gguf_meta_open(ckv_gguf_meta **out, const char *path);
void ckv_gguf_meta_close(ckv_gguf_meta *m); /* NULL is fine */

/* A string value (not NUL-terminated; *len bytes), or NULL when the key is absent or not a string. */
const char *ckv_gguf_meta_string(const ckv_gguf_meta *m, const char *key, uint64_t *len);
/* An integer or bool value into *out; 0 when absent or not an integer. */
int ckv_gguf_meta_int(const ckv_gguf_meta *m, const char *key, int64_t *out);
/* An array of strings: *n elements, strs[i] (not NUL-terminated) of lens[i] bytes, pointing into the
 * mapped file; strs and lens are malloc'd (free with free()). ERR_FORMAT naming the key when the value
 * is not an array of strings; *n = 0 and NULL arrays when the key is absent. */
ckv_status ckv_gguf_meta_strings(const ckv_gguf_meta *m, const char *key, int64_t *n, const char ***strs,
                                 uint64_t **lens);
/* An array of numbers converted to float (float32 arrays) or int32 (any integer arrays); malloc'd;
 * *n = 0 and NULL when the key is absent; ERR_FORMAT when the element type does not fit. */
ckv_status ckv_gguf_meta_f32s(const ckv_gguf_meta *m, const char *key, int64_t *n, float **out);
ckv_status ckv_gguf_meta_i32s(const ckv_gguf_meta *m, const char *key, int64_t *n, int32_t **out);

#endif
