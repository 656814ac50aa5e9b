/* source.h - where a model's weights come from: a table of functions that read a tensor (named as
 * in Hugging Face checkpoints, e.g. "model.layers.0.self_attn.q_proj.weight"), or a row/column slice
 * of a 2-D tensor, as fp32 in HF layout. Implementations: a safetensors model directory
 * (source.c) and a GGUF file (gguf.c, which maps the names and undoes GGUF's layouts). The model
 * loader reads through this table and knows no file format. */
#ifndef CKV_MODEL_SOURCE_H
#define CKV_MODEL_SOURCE_H

#include <stdint.h>

#include "core/status.h"
#include "model/config.h"

typedef struct {
    void *ctx;
    char path[1024];
    /* As ckv_safetensors_read_f32: whole tensor when r1 = c1 = -1; shape checked. */
    ckv_status (*read_f32)(void *ctx, const char *name, int ndim, const int64_t *shape, int64_t r0, int64_t r1,
                           int64_t c0, int64_t c1, float *dst);
    int (*has)(void *ctx, const char *name);
    void (*release_pages)(void *ctx); /* after loading; may be NULL */
    void (*close)(void *ctx);         /* accepts partial objects */
} ckv_weight_source;

/* Opens `path` and reads its configuration into *cfg: a directory (config.json +
 * safetensors), or a .gguf file (configuration from its metadata). */
ckv_status ckv_source_open(ckv_weight_source *src, ckv_model_config *cfg, const char *path);
void ckv_source_close(ckv_weight_source *src); /* accepts partial and zeroed objects */

/* Random weights (source_random.c): cfg from dir/config.json (nothing else is read), every tensor
 * drawn deterministically from (seed, name, element index), scaled so activations stay bounded. */
ckv_status ckv_source_open_random(ckv_weight_source *src, ckv_model_config *cfg, const char *dir, uint64_t seed);

/* The safetensors implementation (a model directory; cfg from its config.json). */
ckv_status ckv_source_open_safetensors(ckv_weight_source *src, ckv_model_config *cfg, const char *dir);

#endif
