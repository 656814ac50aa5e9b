/* gguf_file.h - the GGUF file parser (versions 2 and 3): the header, the metadata key/values, the tensor
 * table and the data section of a memory-mapped file, every count, length, type, extent and offset
 * checked against the file size when it is opened; typed look-ups of metadata values for other modules
 * (ckv_gguf_meta_*, e.g. the tokenizer.ggml.* keys that src/engine turns into a tokenizer).
 * It knows nothing of ckv's model: tensor names are GGUF's own, no value is interpreted (general.alignment
 * aside), and nothing is dequantised; the weight source over a parsed file is gguf.h. Never writes GGUF. */
#ifndef CKV_MODEL_GGUF_FILE_H
#define CKV_MODEL_GGUF_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define CKV_GGUF_MAX_DIMS 4

/* ggml tensor types ckv reads (the parser knows the sizes of all the others too) */
enum {
    CKV_GGUF_TYPE_F32 = 0,
    CKV_GGUF_TYPE_F16 = 1,
    CKV_GGUF_TYPE_Q4_0 = 2,
    CKV_GGUF_TYPE_Q4_1 = 3,
    CKV_GGUF_TYPE_Q5_0 = 6,
    CKV_GGUF_TYPE_Q5_1 = 7,
    CKV_GGUF_TYPE_Q8_0 = 8,
    CKV_GGUF_TYPE_Q4_K = 12,
    CKV_GGUF_TYPE_Q5_K = 13,
    CKV_GGUF_TYPE_Q6_K = 14,
    CKV_GGUF_TYPE_BF16 = 30,
    CKV_GGUF_TYPE_COUNT = 40
};

typedef struct {
    const char *name; /* NULL: no such type (never assigned, or retired from ggml) */
    uint32_t block;   /* elements per block */
    uint32_t bytes;   /* bytes per block */
    int readable;     /* ckv dequantises it */
} ckv_gguf_type_info;

/* The type's name and block layout; NULL for a type ggml does not define. Every tensor of an opened
 * file has a known type. */
const ckv_gguf_type_info *ckv_gguf_type_find(uint32_t t);

/* metadata value types */
enum {
    CKV_GGUF_V_U8 = 0,
    CKV_GGUF_V_I8,
    CKV_GGUF_V_U16,
    CKV_GGUF_V_I16,
    CKV_GGUF_V_U32,
    CKV_GGUF_V_I32,
    CKV_GGUF_V_F32,
    CKV_GGUF_V_BOOL,
    CKV_GGUF_V_STRING,
    CKV_GGUF_V_ARRAY,
    CKV_GGUF_V_U64,
    CKV_GGUF_V_I64,
    CKV_GGUF_V_F64,
    CKV_GGUF_V_COUNT
};

const char *ckv_gguf_value_type_name(uint32_t t); /* "uint8" ... "float64"; "unknown" out of range */
size_t ckv_gguf_value_type_size(uint32_t t);      /* bytes of a fixed-size value; 0 for string, array, unknown */
/* An integer-typed value (any integer type, or bool) at p as int64; 0 when not one (or a uint64 above
 * INT64_MAX). */
int ckv_gguf_value_int(uint32_t type, const uint8_t *p, int64_t *out);

typedef struct {
    char *key;
    uint32_t type;
    uint32_t elem_type; /* arrays */
    uint64_t count;     /* arrays: element count */
    const uint8_t *val; /* scalars: the value; strings: the length field; arrays: the first element */
} ckv_gguf_kv;

typedef struct {
    char *name;
    int ndim;
    int64_t ne[CKV_GGUF_MAX_DIMS]; /* ne[0] varies fastest */
    uint32_t type;
    uint64_t offset; /* relative to the data section */
    const uint8_t *data;
    size_t nbytes;
} ckv_gguf_tensor;

typedef struct {
    int *slots; /* entry index, -1 when empty */
    size_t mask;
} ckv_gguf_index;

/* An opened file: read-only; the index fields are the parser's own. */
typedef struct {
    char path[1024];
    uint8_t *map;
    size_t size;
    uint32_t version;
    size_t alignment;
    size_t data_start;
    ckv_gguf_kv *kvs;
    int n_kv;
    ckv_gguf_tensor *tensors;
    int n_tensors;
    ckv_gguf_index kv_index, tensor_index;
} ckv_gguf_file;

/* Maps and validates a GGUF file. Errors are one line naming the file and the problem (bad magic,
 * version, counts or offsets past the end, unknown value or tensor type, misaligned or overlapping
 * tensors, duplicate keys or names). */
ckv_status ckv_gguf_file_open(ckv_gguf_file **out, const char *path);
void ckv_gguf_file_close(ckv_gguf_file *f); /* NULL and half-parsed files are fine */
/* Look-ups by exact key / GGUF tensor name; NULL when absent. */
const ckv_gguf_kv *ckv_gguf_file_find_kv(const ckv_gguf_file *f, const char *key);
const ckv_gguf_tensor *ckv_gguf_file_find_tensor(const ckv_gguf_file *f, const char *name);

/* ---- metadata access for other modules --------------------------------------------------------- */

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
