/* tensor.h - element types, their sizes and conversions, and a small tensor descriptor
 * (dtype, shape, device). It owns no memory and knows nothing of files or backends. */
#ifndef CKV_TENSOR_H
#define CKV_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    /* not an element type: "the default" of whoever resolves it (the backend's weight or KV cache
     * dtype, a model's), in settings that may leave the choice open (engine/request.h, model opts) */
    CKV_DTYPE_DEFAULT = -1,
    CKV_DTYPE_F32 = 0,
    CKV_DTYPE_F16,
    CKV_DTYPE_BF16,
    CKV_DTYPE_I32,
    CKV_DTYPE_I64,
    /* GGUF block-quantised weights (ggml's layouts): a row of `cols` elements is cols / block_elems
     * blocks of block_bytes each. Only weights use them. */
    CKV_DTYPE_Q8_0,
    CKV_DTYPE_Q4_0,
    CKV_DTYPE_Q4_1,
    CKV_DTYPE_Q5_0,
    CKV_DTYPE_Q5_1,
    CKV_DTYPE_Q4_K,
    CKV_DTYPE_Q5_K,
    CKV_DTYPE_Q6_K,
    CKV_DTYPE_COUNT_
} ckv_dtype;

typedef enum { CKV_DEVICE_HOST = 0, CKV_DEVICE_GPU = 1 } ckv_device;

#define CKV_TENSOR_MAX_DIMS 4

typedef struct {
    void *data;
    ckv_dtype dtype;
    ckv_device device;
    int ndim;
    int64_t shape[CKV_TENSOR_MAX_DIMS];
} ckv_tensor;

size_t ckv_dtype_size(ckv_dtype t);         /* bytes per element; 0 for block types */
const char *ckv_dtype_name(ckv_dtype t);
int ckv_dtype_is_block(ckv_dtype t);        /* 1 for the GGUF block types */
int ckv_dtype_block_elems(ckv_dtype t);     /* elements per block (1 for plain types) */
size_t ckv_dtype_block_bytes(ckv_dtype t);  /* bytes per block (the element size for plain types) */
/* Bytes of a row of `cols` elements (cols a multiple of the block size); 0 when it is not. */
size_t ckv_dtype_row_bytes(ckv_dtype t, int64_t cols);
/* Parses "f32", "f16", "bf16" (any case) into *t; returns 0 when the name is none of them. */
int ckv_dtype_parse_float(const char *name, ckv_dtype *t);
int64_t ckv_tensor_numel(const ckv_tensor *t);

float ckv_bf16_to_f32(uint16_t h);
uint16_t ckv_f32_to_bf16(float f); /* round to nearest even */
float ckv_f16_to_f32(uint16_t h);
uint16_t ckv_f32_to_f16(float f); /* round to nearest even */

/* Converts n elements of type `t` at src into fp32 at dst (F32, F16, BF16 only). */
void ckv_convert_to_f32(float *dst, const void *src, ckv_dtype t, size_t n);
/* Converts n fp32 values into type `t` at dst (F32, F16, BF16 only; round to nearest even). */
void ckv_convert_from_f32(void *dst, const float *src, ckv_dtype t, size_t n);

#endif
