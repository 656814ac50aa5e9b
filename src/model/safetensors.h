/* safetensors.h - memory-mapped reader for Hugging Face safetensors checkpoints: one
 * model.safetensors or shards listed in model.safetensors.index.json. Validates every header
 * (length, JSON, dtype, shape, offsets inside the file and not overlapping) and converts F32, F16 and
 * BF16 tensors, or a row/column slice of a 2-D tensor, to fp32. It knows no model; names are given
 * by the caller. */
#ifndef CKV_MODEL_SAFETENSORS_H
#define CKV_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"

typedef struct {
    const char *name;
    ckv_dtype dtype;
    int ndim;
    int64_t shape[CKV_TENSOR_MAX_DIMS];
    const void *data; /* points into the mapped file */
    size_t nbytes;
    int file;         /* index of the shard that holds it */
} ckv_st_tensor;

typedef struct ckv_safetensors ckv_safetensors;

/* Opens a model directory: model.safetensors.index.json (sharded) if present, else
 * model.safetensors. Errors name the file at fault. */
ckv_status ckv_safetensors_open_dir(ckv_safetensors **out, const char *dir);
/* Opens a single .safetensors file. */
ckv_status ckv_safetensors_open_file(ckv_safetensors **out, const char *path);
void ckv_safetensors_close(ckv_safetensors *st); /* NULL and partial objects are fine */

int ckv_safetensors_count(const ckv_safetensors *st);
const ckv_st_tensor *ckv_safetensors_at(const ckv_safetensors *st, int i);
/* NULL when absent. */
const ckv_st_tensor *ckv_safetensors_find(const ckv_safetensors *st, const char *name);
/* Path of shard i (for messages). */
const char *ckv_safetensors_file_path(const ckv_safetensors *st, int file);

/* Converts tensor `name` to fp32 into dst after checking its shape equals shape[0..ndim).
 * For a 2-D tensor [R, C] only rows [row0, row1) and columns [col0, col1) are read, dst being
 * [row1 - row0, col1 - col0]; pass row1 = col1 = -1 for the whole tensor (any ndim). row1 = -1 alone
 * (or col1 = -1 alone) means all rows (columns) and then needs row0 = 0 (col0 = 0). shape = NULL
 * skips the shape check.
 * Errors: missing tensor, dtype not F32/F16/BF16, shape mismatch (naming the tensor, the file and
 * both shapes). */
ckv_status ckv_safetensors_read_f32(const ckv_safetensors *st, const char *name, int ndim, const int64_t *shape,
                                    int64_t row0, int64_t row1, int64_t col0, int64_t col1, float *dst);

/* Tells the OS the mapped pages of every shard are no longer needed (after loading). */
void ckv_safetensors_release_pages(ckv_safetensors *st);

#endif
