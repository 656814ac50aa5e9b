/* rope.h - rotary-embedding frequencies for the rope types of config.h, computed exactly as
 * Hugging Face transformers does (default, linear, llama3, yarn), in fp32. Pure functions. */
#ifndef CKV_MODEL_ROPE_H
#define CKV_MODEL_ROPE_H

#include "model/config.h"

/* Fills inv_freq[head_dim / 2] and *attn_scale (the cos/sin multiplier: 1 except YaRN). */
ckv_status ckv_rope_init_freqs(const ckv_rope_config *rope, int head_dim, int max_position_embeddings,
                               float *inv_freq, float *attn_scale);

#endif
