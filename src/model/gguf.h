/* gguf.h - GGUF files (v2 and v3) as a weight source: tensors of type F32, F16, BF16, Q8_0, Q4_0, Q4_1,
 * Q5_0, Q5_1, Q4_K, Q5_K and Q6_K dequantised to fp32 at load (or handed out as stored). For llama- and
 * qwen2-architecture files it provides a ckv_weight_source that maps Hugging Face tensor names
 * ("model.layers.0.self_attn.q_proj.weight") to GGUF names ("blk.0.attn_q.weight"), undoes the rotary
 * row permutation the llama conversion applies to q/k, and a ckv_model_config from the metadata.
 * The file parser and metadata look-ups are gguf_file.h. */
#ifndef CKV_MODEL_GGUF_H
#define CKV_MODEL_GGUF_H

#include "model/source.h"

/* Opens a GGUF file as a weight source and fills *cfg from its metadata. Errors name the file and
 * what is wrong (bad magic, version, counts or offsets past the end, unknown tensor type, missing
 * metadata key, unsupported architecture). */
ckv_status ckv_gguf_open_source(ckv_weight_source *src, ckv_model_config *cfg, const char *path);

#endif
