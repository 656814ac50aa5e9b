/* tensor.h - element types, their sizes and conversions, and a small tensor descriptor
 * (dtype, shape, device). It owns no memory and knows nothing of files or backends. */
#ifndef CKV_TENSOR_H
#define CKV_TENSOR_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    CKV_DTYPE_F32 = 0,
    CKV_DTYPE_F16,
    CKV_DTYPE_BF16,
    CKV_DTYPE_I32,
    CKV_DTYPE_I64,
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

size_t ckv_dtype_size(ckv_dtype t);
const char *ckv_dtype_name(ckv_dtype t);
int64_t ckv_tensor_numel(const ckv_tensor *t);

float ckv_bf16_to_f32(uint16_t h);
uint16_t ckv_f32_to_bf16(float f); /* round to nearest even */
float ckv_f16_to_f32(uint16_t h);
uint16_t ckv_f32_to_f16(float f); /* round to nearest even */

/* Converts n elements of type `t` at src into fp32 at dst (F32, F16, BF16 only). */
void ckv_convert_to_f32(float *dst, const void *src, ckv_dtype t, size_t n);

#endif
