/* source.h - where a model's weights come from: a table of functions that read a tensor (named as
 * in Hugging Face checkpoints, e.g. "model.layers.0.self_attn.q_proj.weight"), or a row/column slice
 * of a 2-D tensor, as fp32 in HF layout, or as the bytes it is stored as. Implementations: a safetensors model directory
 * (source.c) and a GGUF file (gguf.c, which maps the names and undoes GGUF's layouts). The model
 * loader reads through this table and knows no file format. */
#ifndef CKV_MODEL_SOURCE_H
#define CKV_MODEL_SOURCE_H

#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"
#include "model/config.h"

typedef struct {
    void *ctx;
    char path[1024];
    /* As ckv_safetensors_read_f32: whole tensor when r1 = c1 = -1; shape checked. */
    ckv_status (*read_f32)(void *ctx, const char *name, int ndim, const int64_t *shape, int64_t r0, int64_t r1,
                           int64_t c0, int64_t c1, float *dst);
    int (*has)(void *ctx, const char *name);
    /* Optional (NULL when the format keeps nothing but fp32-convertible tensors): the dtype `name` is
     * stored as (F32, F16, BF16 or a GGUF block type; F32 when absent or of another type). */
    ckv_dtype (*stored_dtype)(void *ctx, const char *name);
    /* Optional: the stored bytes of rows [r0, r1) x cols [c0, c1) of the 2-D tensor `name` (HF shape
     * checked as in read_f32), row after row into dst, ckv_dtype_row_bytes(stored, c1 - c0) bytes each,
     * in Hugging Face row order (GGUF q/k rows unpermuted). c0 and c1 must be multiples of the stored
     * block size (ERR_ARG naming the tensor otherwise). */
    ckv_status (*read_raw)(void *ctx, const char *name, const int64_t *shape, int64_t r0, int64_t r1, int64_t c0,
                           int64_t c1, void *dst);
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
