/* gguf.c - memory-mapped GGUF reader (versions 2 and 3) and the weight source over it.
 *
 * A GGUF file is: "GGUF", a uint32 version, uint64 tensor and metadata counts, the metadata
 * (key string, uint32 value type, value; strings are a uint64 length and bytes, arrays a uint32 element
 * type, a uint64 count and the elements), the tensor table (name, uint32 n_dims, n_dims uint64 extents
 * ne[] with ne[0] the fastest-varying, uint32 ggml type, uint64 offset), padding to the alignment
 * (general.alignment, default 32), then the data section the offsets are relative to. Everything is
 * checked against the file size before any tensor is handed out: counts and string lengths that cannot
 * fit, value and tensor types, dimensions, offsets that are misaligned, past the end or overlapping,
 * duplicate keys and names. Each error is one line naming the file and the problem.
 *
 * Dequantisation to fp32: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K, following
 * the published ggml block layouts (other known types are listed with their sizes, so such files parse, but are
 * refused when read). A 2-D GGUF tensor with extents (ne0, ne1) is the row-major [ne1, ne0] matrix
 * of Hugging Face's (out, in) layout, quantised along rows; slices dequantise only the rows asked for
 * and only the blocks that cover the columns asked for.
 *
 * The llama and qwen2 architectures: metadata (keys prefixed with the architecture's name) maps onto
 * ckv_model_config, Hugging Face tensor names map onto GGUF names, and for llama the rotary row
 * permutation that the HF -> GGUF conversion applies to q_proj and k_proj (per head, rows (2, d/2)
 * transposed to (d/2, 2)) is undone on read, so ckv's rotate_half RoPE applies (qwen2 files keep
 * Hugging Face's order). Other architectures, mixture-of-experts files and per-dimension rope frequency
 * factors are refused by name; a read whose values dequantise to NaN or infinity is refused naming the
 * tensor. No tokenizer is built here (tokenizer/ reads the vocabulary); this file
 * never writes GGUF. Assumes a little-endian host, as GGUF files are (big-endian ones are refused). */
#define _DEFAULT_SOURCE /* madvise / MADV_DONTNEED */
#include "model/gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fastmath.h"
#include "core/quant.h"
#include "core/tensor.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf.c assumes a little-endian host"
#endif

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_KEY_LEN 65535u   /* the format's limit on key length */
#define GGUF_MAX_NAME_LEN 65535u  /* names are short in practice (ggml allows 63 bytes) */
#define GGUF_HEADER_MIN 24        /* magic, version, two counts */
#define GGUF_KV_MIN_BYTES 13      /* empty key (8) + type (4) + a 1-byte value */
#define GGUF_TENSOR_MIN_BYTES 32  /* empty name (8) + n_dims (4) + one extent (8) + type (4) + offset (8) */

/* ---- ggml tensor types ------------------------------------------------------------------------- */

enum {
    GGUF_TYPE_F32 = 0,
    GGUF_TYPE_F16 = 1,
    GGUF_TYPE_Q4_0 = 2,
    GGUF_TYPE_Q4_1 = 3,
    GGUF_TYPE_Q5_0 = 6,
    GGUF_TYPE_Q5_1 = 7,
    GGUF_TYPE_Q8_0 = 8,
    GGUF_TYPE_Q4_K = 12,
    GGUF_TYPE_Q5_K = 13,
    GGUF_TYPE_Q6_K = 14,
    GGUF_TYPE_BF16 = 30,
    GGUF_TYPE_COUNT = 40
};

typedef struct {
    const char *name; /* NULL: no such type (never assigned, or retired from ggml) */
    uint32_t block;   /* elements per block */
    uint32_t bytes;   /* bytes per block */
    int readable;     /* ckv dequantises it */
} gguf_type_info;

static const gguf_type_info gguf_types[GGUF_TYPE_COUNT] = {
    [0] = {"F32", 1, 4, 1},         [1] = {"F16", 1, 2, 1},         [2] = {"Q4_0", 32, 18, 1},
    [3] = {"Q4_1", 32, 20, 1},      [6] = {"Q5_0", 32, 22, 1},      [7] = {"Q5_1", 32, 24, 1},
    [8] = {"Q8_0", 32, 34, 1},      [9] = {"Q8_1", 32, 36, 0},      [10] = {"Q2_K", 256, 84, 0},
    [11] = {"Q3_K", 256, 110, 0},   [12] = {"Q4_K", 256, 144, 1},   [13] = {"Q5_K", 256, 176, 1},
    [14] = {"Q6_K", 256, 210, 1},   [15] = {"Q8_K", 256, 292, 0},   [16] = {"IQ2_XXS", 256, 66, 0},
    [17] = {"IQ2_XS", 256, 74, 0},  [18] = {"IQ3_XXS", 256, 98, 0}, [19] = {"IQ1_S", 256, 50, 0},
    [20] = {"IQ4_NL", 32, 18, 0},   [21] = {"IQ3_S", 256, 110, 0},  [22] = {"IQ2_S", 256, 82, 0},
    [23] = {"IQ4_XS", 256, 136, 0}, [24] = {"I8", 1, 1, 0},         [25] = {"I16", 1, 2, 0},
    [26] = {"I32", 1, 4, 0},        [27] = {"I64", 1, 8, 0},        [28] = {"F64", 1, 8, 0},
    [29] = {"IQ1_M", 256, 56, 0},   [30] = {"BF16", 1, 2, 1},       [34] = {"TQ1_0", 256, 54, 0},
    [35] = {"TQ2_0", 256, 66, 0},   [39] = {"MXFP4", 32, 17, 0},
};

static const gguf_type_info *gguf_type_find(uint32_t t) {
    return t < GGUF_TYPE_COUNT && gguf_types[t].name ? &gguf_types[t] : NULL;
}

/* ---- metadata value types ---------------------------------------------------------------------- */

enum {
    GGUF_V_U8 = 0,
    GGUF_V_I8,
    GGUF_V_U16,
    GGUF_V_I16,
    GGUF_V_U32,
    GGUF_V_I32,
    GGUF_V_F32,
    GGUF_V_BOOL,
    GGUF_V_STRING,
    GGUF_V_ARRAY,
    GGUF_V_U64,
    GGUF_V_I64,
    GGUF_V_F64,
    GGUF_V_COUNT
};

static const char *const gguf_vtype_names[GGUF_V_COUNT] = {"uint8",  "int8",  "uint16", "int16", "uint32",
                                                          "int32",  "float32", "bool", "string", "array",
                                                          "uint64", "int64", "float64"};
static const uint8_t gguf_vtype_sizes[GGUF_V_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

static const char *gguf_vtype_name(uint32_t t) { return t < GGUF_V_COUNT ? gguf_vtype_names[t] : "unknown"; }

/* ---- the parsed file --------------------------------------------------------------------------- */

typedef struct {
    char *key;
    uint32_t type;
    uint32_t elem_type;  /* arrays */
    uint64_t count;      /* arrays: element count */
    const uint8_t *val;  /* scalars: the value; strings: the length field; arrays: the first element */
} gguf_kv;

typedef struct {
    char *name;
    int ndim;
    int64_t ne[GGUF_MAX_DIMS]; /* ne[0] varies fastest */
    uint32_t type;
    uint64_t offset;           /* relative to the data section */
    const uint8_t *data;
    size_t nbytes;
} gguf_tensor;

typedef struct {
    int *slots; /* entry index, -1 when empty */
    size_t mask;
} gguf_index;

typedef struct {
    char path[1024];
    uint8_t *map;
    size_t size;
    uint32_t version;
    size_t alignment;
    size_t data_start;
    gguf_kv *kvs;
    int n_kv;
    gguf_tensor *tensors;
    int n_tensors;
    gguf_index kv_index, tensor_index;
} gguf_file;

/* ---- name index (open addressing, FNV-1a) ------------------------------------------------------ */

static uint64_t gguf_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The i-th string of an array of gguf_kv (stride = sizeof(gguf_kv)) or gguf_tensor. */
typedef const char *(*gguf_name_fn)(const void *base, int i);
static const char *gguf_kv_name(const void *base, int i) { return ((const gguf_kv *)base)[i].key; }
static const char *gguf_tensor_name(const void *base, int i) { return ((const gguf_tensor *)base)[i].name; }

/* Builds the index; on a duplicate stores the second occurrence in *dup (else -1). */
static ckv_status gguf_index_build(gguf_index *ix, const void *base, int n, gguf_name_fn name, int *dup,
                                   const char *path) {
    *dup = -1;
    size_t cap = 16;
    while (cap < (size_t)n * 2) cap *= 2;
    ix->slots = malloc(cap * sizeof *ix->slots);
    if (!ix->slots) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory for a name index", path);
    ix->mask = cap - 1;
    for (size_t i = 0; i < cap; i++) ix->slots[i] = -1;
    for (int i = 0; i < n; i++) {
        const char *s = name(base, i);
        size_t h = (size_t)gguf_hash(s) & ix->mask;
        while (ix->slots[h] >= 0) {
            if (strcmp(name(base, ix->slots[h]), s) == 0) {
                *dup = i;
                return CKV_STATUS_OK;
            }
            h = (h + 1) & ix->mask;
        }
        ix->slots[h] = i;
    }
    return CKV_STATUS_OK;
}

static int gguf_index_find(const gguf_index *ix, const void *base, gguf_name_fn name, const char *s) {
    if (!ix->slots) return -1;
    size_t h = (size_t)gguf_hash(s) & ix->mask;
    while (ix->slots[h] >= 0) {
        if (strcmp(name(base, ix->slots[h]), s) == 0) return ix->slots[h];
        h = (h + 1) & ix->mask;
    }
    return -1;
}

/* ---- bounded reading --------------------------------------------------------------------------- */

typedef struct {
    const uint8_t *base;
    size_t size, pos;
    const char *path;
} gguf_cursor;

static ckv_status gguf_past_end(const gguf_cursor *c, const char *what, uint64_t need) {
    return ckv_error(CKV_STATUS_ERR_FORMAT,
                     "%s: %s (%" PRIu64 " bytes at offset %zu) runs past the end of the file (%zu bytes)", c->path,
                     what, need, c->pos, c->size);
}

static ckv_status gguf_read(gguf_cursor *c, void *out, size_t n, const char *what) {
    if (n > c->size - c->pos) return gguf_past_end(c, what, n);
    memcpy(out, c->base + c->pos, n);
    c->pos += n;
    return CKV_STATUS_OK;
}

static ckv_status gguf_u32(gguf_cursor *c, uint32_t *v, const char *what) { return gguf_read(c, v, 4, what); }
static ckv_status gguf_u64(gguf_cursor *c, uint64_t *v, const char *what) { return gguf_read(c, v, 8, what); }

/* A length-prefixed string: *s points into the map (not terminated). */
static ckv_status gguf_string(gguf_cursor *c, const uint8_t **s, uint64_t *len, const char *what) {
    CKV_TRY(gguf_u64(c, len, what));
    if (*len > c->size - c->pos)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: %s: string length %" PRIu64 " at offset %zu runs past the end of the file (%zu bytes)",
                         c->path, what, *len, c->pos, c->size);
    *s = c->base + c->pos;
    c->pos += (size_t)*len;
    return CKV_STATUS_OK;
}

/* A key or tensor name: non-empty, at most `max` bytes, no NUL; copied to a terminated string. */
static ckv_status gguf_name(gguf_cursor *c, char **out, uint64_t max, const char *what) {
    const uint8_t *s = NULL;
    uint64_t len = 0;
    CKV_TRY(gguf_string(c, &s, &len, what));
    if (len == 0) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: %s is empty", c->path, what);
    if (len > max)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: %s is %" PRIu64 " bytes long (at most %" PRIu64 ")", c->path,
                         what, len, max);
    for (uint64_t i = 0; i < len; i++)
        if (s[i] < 0x20 || s[i] == 0x7f) /* keeps every message that names it on one line */
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: %s contains the control character 0x%02x", c->path, what,
                             s[i]);
    *out = malloc((size_t)len + 1);
    if (!*out) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory for %s", c->path, what);
    memcpy(*out, s, (size_t)len);
    (*out)[len] = 0;
    return CKV_STATUS_OK;
}

/* Skips one value of type `t` (not an array), checking it fits. */
static ckv_status gguf_skip_value(gguf_cursor *c, uint32_t t, const char *key) {
    char what[320];
    if (t == GGUF_V_STRING) {
        const uint8_t *s = NULL;
        uint64_t len = 0;
        snprintf(what, sizeof what, "metadata key '%.200s'", key);
        return gguf_string(c, &s, &len, what);
    }
    size_t n = gguf_vtype_sizes[t];
    if (n > c->size - c->pos) {
        snprintf(what, sizeof what, "metadata key '%.200s': %s value", key, gguf_vtype_names[t]);
        return gguf_past_end(c, what, n);
    }
    if (t == GGUF_V_BOOL && c->base[c->pos] > 1)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%.200s': bool value %u is neither 0 nor 1", c->path,
                         key, c->base[c->pos]);
    c->pos += n;
    return CKV_STATUS_OK;
}

static ckv_status gguf_parse_kv(gguf_cursor *c, gguf_kv *kv, uint64_t i) {
    char what[96];
    snprintf(what, sizeof what, "metadata key %" PRIu64 " of the header", i);
    CKV_TRY(gguf_name(c, &kv->key, GGUF_MAX_KEY_LEN, what));
    snprintf(what, sizeof what, "metadata key '%.60s': value type", kv->key);
    CKV_TRY(gguf_u32(c, &kv->type, what));
    if (kv->type >= GGUF_V_COUNT)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%.200s': unknown value type %u", c->path, kv->key,
                         kv->type);
    if (kv->type != GGUF_V_ARRAY) {
        kv->val = c->base + c->pos;
        return gguf_skip_value(c, kv->type, kv->key);
    }
    snprintf(what, sizeof what, "metadata key '%.60s': array header", kv->key);
    CKV_TRY(gguf_u32(c, &kv->elem_type, what));
    CKV_TRY(gguf_u64(c, &kv->count, what));
    if (kv->elem_type >= GGUF_V_COUNT)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%.200s': unknown array element type %u", c->path,
                         kv->key, kv->elem_type);
    if (kv->elem_type == GGUF_V_ARRAY)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: metadata key '%.200s': arrays of arrays are not supported",
                         c->path, kv->key);
    /* every element takes at least its fixed size (a string at least its 8-byte length) */
    uint64_t min_elem = kv->elem_type == GGUF_V_STRING ? 8 : gguf_vtype_sizes[kv->elem_type];
    if (kv->count > (c->size - c->pos) / min_elem)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: metadata key '%.200s': array of %" PRIu64 " %s values runs past the end of the file "
                         "(%zu bytes)",
                         c->path, kv->key, kv->count, gguf_vtype_names[kv->elem_type], c->size);
    kv->val = c->base + c->pos;
    if (kv->elem_type == GGUF_V_STRING || kv->elem_type == GGUF_V_BOOL) {
        for (uint64_t k = 0; k < kv->count; k++) CKV_TRY(gguf_skip_value(c, kv->elem_type, kv->key));
    } else {
        c->pos += (size_t)(kv->count * min_elem);
    }
    return CKV_STATUS_OK;
}

static ckv_status gguf_parse_tensor(gguf_cursor *c, gguf_tensor *t, uint64_t i) {
    char what[96];
    snprintf(what, sizeof what, "tensor %" PRIu64 "'s name", i);
    CKV_TRY(gguf_name(c, &t->name, GGUF_MAX_NAME_LEN, what));
    snprintf(what, sizeof what, "tensor '%.60s': header", t->name);
    uint32_t nd = 0;
    CKV_TRY(gguf_u32(c, &nd, what));
    if (nd < 1 || nd > GGUF_MAX_DIMS)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': %u dimensions (GGUF allows 1 to %d)", c->path,
                         t->name, nd, GGUF_MAX_DIMS);
    t->ndim = (int)nd;
    uint64_t nelem = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t ne = 0;
        CKV_TRY(gguf_u64(c, &ne, what));
        if (ne == 0 || ne > (uint64_t)INT64_MAX / nelem)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': extent %" PRIu64 " of dimension %d is %s",
                             c->path, t->name, ne, d, ne == 0 ? "zero" : "too large");
        t->ne[d] = (int64_t)ne;
        nelem *= ne;
    }
    CKV_TRY(gguf_u32(c, &t->type, what));
    CKV_TRY(gguf_u64(c, &t->offset, what));
    const gguf_type_info *ti = gguf_type_find(t->type);
    if (!ti) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': unknown type %u", c->path, t->name, t->type);
    if ((uint64_t)t->ne[0] % ti->block != 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: tensor '%.200s': first extent %" PRId64 " is not a multiple of the %s block size %u",
                         c->path, t->name, t->ne[0], ti->name, ti->block);
    uint64_t blocks = nelem / ti->block;
    if (blocks > (uint64_t)SIZE_MAX / ti->bytes || blocks * ti->bytes > c->size)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: tensor '%.200s': %" PRIu64 " %s elements are larger than the file (%zu bytes)", c->path,
                         t->name, nelem, ti->name, c->size);
    t->nbytes = (size_t)(blocks * ti->bytes);
    return CKV_STATUS_OK;
}

typedef struct {
    uint64_t begin, end;
    int idx;
} gguf_span;

static int gguf_span_cmp(const void *a, const void *b) {
    const gguf_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->idx - y->idx;
}

static const gguf_kv *gguf_find_kv(const gguf_file *f, const char *key) {
    int i = gguf_index_find(&f->kv_index, f->kvs, gguf_kv_name, key);
    return i < 0 ? NULL : &f->kvs[i];
}

static const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    int i = gguf_index_find(&f->tensor_index, f->tensors, gguf_tensor_name, name);
    return i < 0 ? NULL : &f->tensors[i];
}

/* An integer-typed value (any integer type, or bool) as int64; 0 when not one. */
static int gguf_scalar_int(uint32_t type, const uint8_t *p, int64_t *out) {
    switch (type) {
    case GGUF_V_U8: *out = *p; return 1;
    case GGUF_V_I8: *out = (int8_t)*p; return 1;
    case GGUF_V_BOOL: *out = *p; return 1;
    case GGUF_V_U16: { uint16_t v; memcpy(&v, p, 2); *out = v; return 1; }
    case GGUF_V_I16: { int16_t v; memcpy(&v, p, 2); *out = v; return 1; }
    case GGUF_V_U32: { uint32_t v; memcpy(&v, p, 4); *out = v; return 1; }
    case GGUF_V_I32: { int32_t v; memcpy(&v, p, 4); *out = v; return 1; }
    case GGUF_V_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)v;
        return 1;
    }
    case GGUF_V_I64: { int64_t v; memcpy(&v, p, 8); *out = v; return 1; }
    default: return 0;
    }
}

static ckv_status gguf_parse(gguf_file *f) {
    gguf_cursor c = {f->map, f->size, 0, f->path};
    if (f->size < GGUF_HEADER_MIN)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: the file is too short (%zu bytes) to be a GGUF file", f->path,
                         f->size);
    if (memcmp(f->map, "GGUF", 4) != 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: bad magic (the file does not start with 'GGUF')", f->path);
    c.pos = 4;
    CKV_TRY(gguf_u32(&c, &f->version, "the version"));
    if (f->version != 2 && f->version != 3) {
        uint32_t v = f->version;
        uint32_t swapped = (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (ckv reads versions 2 and 3%s)",
                         f->path, v, swapped >= 1 && swapped <= 3 ? "; this looks like a big-endian file" : "");
    }
    uint64_t n_tensors = 0, n_kv = 0;
    CKV_TRY(gguf_u64(&c, &n_tensors, "the tensor count"));
    CKV_TRY(gguf_u64(&c, &n_kv, "the metadata count"));
    size_t left = f->size - c.pos;
    if (n_kv > left / GGUF_KV_MIN_BYTES || n_kv > INT32_MAX)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: metadata count %" PRIu64 " runs past the end of the file (%zu bytes)", f->path, n_kv,
                         f->size);
    if (n_tensors > (left - n_kv * GGUF_KV_MIN_BYTES) / GGUF_TENSOR_MIN_BYTES || n_tensors > INT32_MAX)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: tensor count %" PRIu64 " runs past the end of the file (%zu bytes)", f->path, n_tensors,
                         f->size);

    f->kvs = calloc(n_kv ? (size_t)n_kv : 1, sizeof *f->kvs);
    f->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *f->tensors);
    if (!f->kvs || !f->tensors) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory for the header", f->path);
    for (uint64_t i = 0; i < n_kv; i++) {
        f->n_kv = (int)i + 1; /* so close() frees the key even when parsing it fails half-way */
        CKV_TRY(gguf_parse_kv(&c, &f->kvs[i], i));
    }
    int dup;
    CKV_TRY(gguf_index_build(&f->kv_index, f->kvs, f->n_kv, gguf_kv_name, &dup, f->path));
    if (dup >= 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: duplicate metadata key '%.200s'", f->path, f->kvs[dup].key);

    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *al = gguf_find_kv(f, "general.alignment");
    if (al) {
        int64_t a = 0;
        if (al->type == GGUF_V_ARRAY || al->type == GGUF_V_BOOL || !gguf_scalar_int(al->type, al->val, &a))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key 'general.alignment' must be an integer (it is %s)",
                             f->path, gguf_vtype_name(al->type));
        if (a <= 0 || a > (1 << 30) || (a & (a - 1)) != 0)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: general.alignment %" PRId64 " is not a power of two", f->path,
                             a);
        f->alignment = (size_t)a;
    }

    for (uint64_t i = 0; i < n_tensors; i++) {
        f->n_tensors = (int)i + 1;
        CKV_TRY(gguf_parse_tensor(&c, &f->tensors[i], i));
    }
    CKV_TRY(gguf_index_build(&f->tensor_index, f->tensors, f->n_tensors, gguf_tensor_name, &dup, f->path));
    if (dup >= 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: duplicate tensor name '%.200s'", f->path, f->tensors[dup].name);

    /* the data section starts at the next multiple of the alignment */
    size_t header_end = c.pos;
    f->data_start = (header_end + f->alignment - 1) / f->alignment * f->alignment;
    if (n_tensors == 0) return CKV_STATUS_OK;
    if (f->data_start > f->size)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: the data section (offset %zu after alignment to %zu) starts past the end of the file "
                         "(%zu bytes)",
                         f->path, f->data_start, f->alignment, f->size);
    size_t data_size = f->size - f->data_start;
    gguf_span *spans = malloc((size_t)n_tensors * sizeof *spans);
    if (!spans) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory checking tensor offsets", f->path);
    ckv_status s = CKV_STATUS_OK;
    for (int i = 0; i < f->n_tensors && s == CKV_STATUS_OK; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset % f->alignment != 0)
            s = ckv_error(CKV_STATUS_ERR_FORMAT,
                          "%s: tensor '%.200s': offset %" PRIu64 " is not a multiple of the alignment %zu", f->path,
                          t->name, t->offset, f->alignment);
        else if (t->offset > data_size || t->nbytes > data_size - t->offset)
            s = ckv_error(CKV_STATUS_ERR_FORMAT,
                          "%s: tensor '%.200s': data [%" PRIu64 ", +%zu) runs past the end of the file (data section "
                          "of %zu bytes)",
                          f->path, t->name, t->offset, t->nbytes, data_size);
        if (s != CKV_STATUS_OK) break;
        t->data = f->map + f->data_start + (size_t)t->offset;
        spans[i] = (gguf_span){t->offset, t->offset + t->nbytes, i};
    }
    if (s == CKV_STATUS_OK) {
        qsort(spans, (size_t)f->n_tensors, sizeof *spans, gguf_span_cmp);
        for (int i = 1; i < f->n_tensors && s == CKV_STATUS_OK; i++)
            if (spans[i].begin < spans[i - 1].end)
                s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensors '%.200s' and '%.200s' overlap", f->path,
                              f->tensors[spans[i - 1].idx].name, f->tensors[spans[i].idx].name);
    }
    free(spans);
    return s;
}

static void gguf_file_close(gguf_file *f) {
    if (!f) return;
    if (f->kvs)
        for (int i = 0; i < f->n_kv; i++) free(f->kvs[i].key);
    if (f->tensors)
        for (int i = 0; i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->kvs);
    free(f->tensors);
    free(f->kv_index.slots);
    free(f->tensor_index.slots);
    if (f->map) munmap(f->map, f->size);
    free(f);
}

static ckv_status gguf_file_open(gguf_file **out, const char *path) {
    *out = NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", path);
    snprintf(f->path, sizeof f->path, "%s", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        free(f);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        free(f);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: not a regular file", path);
    }
    f->size = (size_t)sb.st_size;
    if (f->size < GGUF_HEADER_MIN) {
        close(fd);
        free(f);
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: the file is too short (%jd bytes) to be a GGUF file", path,
                         (intmax_t)sb.st_size);
    }
    void *map = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED) {
        free(f);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, (size_t)sb.st_size,
                         strerror(e));
    }
    f->map = map;
    ckv_status s = gguf_parse(f);
    if (s != CKV_STATUS_OK) {
        gguf_file_close(f);
        return s;
    }
    *out = f;
    return CKV_STATUS_OK;
}

/* ---- dequantisation ---------------------------------------------------------------------------- */

/* The ckv dtype of a readable ggml type (core/quant.c dequantises them all). */
static ckv_dtype gguf_ckv_dtype(uint32_t type) {
    switch (type) {
    case GGUF_TYPE_F16: return CKV_DTYPE_F16;
    case GGUF_TYPE_BF16: return CKV_DTYPE_BF16;
    case GGUF_TYPE_Q8_0: return CKV_DTYPE_Q8_0;
    case GGUF_TYPE_Q4_0: return CKV_DTYPE_Q4_0;
    case GGUF_TYPE_Q4_1: return CKV_DTYPE_Q4_1;
    case GGUF_TYPE_Q5_0: return CKV_DTYPE_Q5_0;
    case GGUF_TYPE_Q5_1: return CKV_DTYPE_Q5_1;
    case GGUF_TYPE_Q4_K: return CKV_DTYPE_Q4_K;
    case GGUF_TYPE_Q5_K: return CKV_DTYPE_Q5_K;
    case GGUF_TYPE_Q6_K: return CKV_DTYPE_Q6_K;
    default: return CKV_DTYPE_F32;
    }
}

/* Dequantises `nblocks` consecutive blocks of type `type` at src into dst. */
static void gguf_dequant(uint32_t type, const uint8_t *src, size_t nblocks, float *dst) {
    ckv_dequant_row(gguf_ckv_dtype(type), src, dst, nblocks * gguf_types[type].block);
}

/* ---- the weight source ------------------------------------------------------------------------- */

typedef enum { GGUF_PERM_NONE = 0, GGUF_PERM_Q, GGUF_PERM_K } gguf_perm;

typedef struct {
    gguf_file *f;
    int n_head, n_head_kv; /* head counts of the q / k rows the conversion permuted (0: not permuted) */
} gguf_source;

/* Maps a Hugging Face llama / qwen2 tensor name to its GGUF name; 0 when there is none. */
static int gguf_map_name(const char *hf, char *out, size_t cap, gguf_perm *perm) {
    static const struct {
        const char *hf, *gguf;
        gguf_perm perm;
    } layer_names[] = {
        {"input_layernorm.weight", "attn_norm.weight", GGUF_PERM_NONE},
        {"self_attn.q_proj.weight", "attn_q.weight", GGUF_PERM_Q},
        {"self_attn.k_proj.weight", "attn_k.weight", GGUF_PERM_K},
        {"self_attn.v_proj.weight", "attn_v.weight", GGUF_PERM_NONE},
        {"self_attn.o_proj.weight", "attn_output.weight", GGUF_PERM_NONE},
        {"self_attn.q_proj.bias", "attn_q.bias", GGUF_PERM_Q},
        {"self_attn.k_proj.bias", "attn_k.bias", GGUF_PERM_K},
        {"self_attn.v_proj.bias", "attn_v.bias", GGUF_PERM_NONE},
        {"self_attn.o_proj.bias", "attn_output.bias", GGUF_PERM_NONE},
        {"post_attention_layernorm.weight", "ffn_norm.weight", GGUF_PERM_NONE},
        {"mlp.gate_proj.weight", "ffn_gate.weight", GGUF_PERM_NONE},
        {"mlp.up_proj.weight", "ffn_up.weight", GGUF_PERM_NONE},
        {"mlp.down_proj.weight", "ffn_down.weight", GGUF_PERM_NONE},
    };
    *perm = GGUF_PERM_NONE;
    if (!strcmp(hf, "model.embed_tokens.weight")) return snprintf(out, cap, "token_embd.weight") > 0;
    if (!strcmp(hf, "model.norm.weight")) return snprintf(out, cap, "output_norm.weight") > 0;
    if (!strcmp(hf, "lm_head.weight")) return snprintf(out, cap, "output.weight") > 0;
    const char *prefix = "model.layers.";
    size_t pl = strlen(prefix);
    if (strncmp(hf, prefix, pl) != 0) return 0;
    const char *p = hf + pl;
    char *end;
    errno = 0;
    unsigned long layer = strtoul(p, &end, 10);
    if (end == p || *end != '.' || errno || layer > 1000000 || *p == '+' || *p == '-' || *p == ' ') return 0;
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++) {
        if (!strcmp(end + 1, layer_names[i].hf)) {
            *perm = layer_names[i].perm;
            int n = snprintf(out, cap, "blk.%lu.%s", layer, layer_names[i].gguf);
            return n > 0 && (size_t)n < cap;
        }
    }
    return 0;
}

static void gguf_format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Tells the OS the mapped pages of a tensor just converted are not needed any more. */
static void gguf_drop_pages(const gguf_tensor *t) {
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || t->nbytes == 0) return;
    uintptr_t a = (uintptr_t)t->data & ~((uintptr_t)page - 1);
    uintptr_t b = (uintptr_t)t->data + t->nbytes;
    madvise((void *)a, b - a, MADV_DONTNEED);
}

/* The GGUF row that holds Hugging Face row r of a q/k projection split into n heads of d rows: GGUF
 * stores each head's rows (a, j), a in {0, 1}, j < d/2, in the order (j, a). */
static int64_t gguf_unpermute_row(int64_t r, int64_t d) {
    int64_t h = r / d, within = r % d, half = d / 2;
    int64_t a = within / half, j = within % half;
    return h * d + 2 * j + a;
}

/* A tensor slice located and checked: the tensor, its rows x cols view, the slice, and the head count
 * and head size of a permuted q/k tensor (0 when not permuted). */
typedef struct {
    const gguf_tensor *t;
    const gguf_type_info *ti;
    char gname[160];
    int64_t R, C, r0, r1, c0, c1;
    int64_t perm_heads, head_rows;
} gguf_slice;

/* Finds HF tensor `name`, checks its type is readable, its shape against shape[0..ndim) (shape may be
 * NULL) and the slice (whole tensor when row1 = col1 = -1) against the shape. */
static ckv_status gguf_src_locate(const gguf_source *src, const char *name, int ndim, const int64_t *shape,
                                  int64_t row0, int64_t row1, int64_t col0, int64_t col1, gguf_slice *sl) {
    const gguf_file *f = src->f;
    gguf_perm perm;
    char *gname = sl->gname;
    if (!gguf_map_name(name, gname, sizeof sl->gname, &perm))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s' has no GGUF counterpart", f->path, name);
    const gguf_tensor *t = gguf_find_tensor(f, gname);
    if (!t)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s' (GGUF '%s') is not in the file", f->path, name,
                         gname);
    const gguf_type_info *ti = &gguf_types[t->type];
    if (!ti->readable)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: tensor '%s' has type %s, which ckv cannot dequantise (it reads F32, F16, BF16, Q8_0, "
                         "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K)",
                         f->path, gname, ti->name);
    /* the Hugging Face shape is the GGUF extents reversed */
    int64_t hf[GGUF_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) hf[d] = t->ne[t->ndim - 1 - d];
    if (shape) {
        int same = ndim == t->ndim;
        for (int d = 0; same && d < ndim; d++) same = shape[d] == hf[d];
        if (!same) {
            char want[128], have[128];
            if (ndim < 0 || ndim > CKV_TENSOR_MAX_DIMS)
                snprintf(want, sizeof want, "(%d dimensions)", ndim);
            else
                gguf_format_shape(want, sizeof want, ndim, shape);
            gguf_format_shape(have, sizeof have, t->ndim, hf);
            return ckv_error(CKV_STATUS_ERR_SHAPE, "%s: tensor '%s' ('%.200s'): shape %s in the file, expected %s",
                             f->path, gname, name, have, want);
        }
    }
    /* as rows x cols: cols = ne[0] (the input dimension), rows = the rest */
    int64_t C = t->ne[0], R = 1;
    for (int d = 1; d < t->ndim; d++) R *= t->ne[d];
    int64_t r0 = row0, r1 = row1, c0 = col0, c1 = col1;
    if (row1 < 0 && col1 < 0) {
        if (row0 != 0 || col0 != 0)
            return ckv_error(CKV_STATUS_ERR_ARG, "%s: tensor '%s': row0/col0 must be 0 when reading it whole", f->path,
                             gname);
        r0 = 0, r1 = R, c0 = 0, c1 = C;
    } else {
        if (t->ndim != 2)
            return ckv_error(CKV_STATUS_ERR_ARG,
                             "%s: tensor '%s': a row/column slice needs a 2-D tensor (it has %d dimensions)", f->path,
                             gname, t->ndim);
        r1 = row1 < 0 ? (row0 == 0 ? R : -1) : row1;
        c1 = col1 < 0 ? (col0 == 0 ? C : -1) : col1;
        if (r0 < 0 || r1 < r0 || r1 > R || c0 < 0 || c1 < c0 || c1 > C)
            return ckv_error(CKV_STATUS_ERR_RANGE,
                             "%s: tensor '%s': slice rows [%" PRId64 ", %" PRId64 ") cols [%" PRId64 ", %" PRId64
                             ") outside its shape [%" PRId64 ", %" PRId64 "]",
                             f->path, gname, row0, row1, col0, col1, R, C);
    }
    /* the head count whose rotary layout the conversion permuted: rows for a weight, elements of a bias */
    int64_t perm_heads = perm == GGUF_PERM_Q ? src->n_head : perm == GGUF_PERM_K ? src->n_head_kv : 0;
    int64_t perm_len = t->ndim == 1 ? C : R, head_rows = 0;
    if (perm_heads > 0) {
        if (t->ndim > 2 || perm_len % perm_heads != 0 || (perm_len / perm_heads) % 2 != 0)
            return ckv_error(CKV_STATUS_ERR_SHAPE,
                             "%s: tensor '%s': %" PRId64 " rows do not split into %" PRId64 " heads of an even size",
                             f->path, gname, perm_len, perm_heads);
        head_rows = perm_len / perm_heads;
    }
    sl->t = t, sl->ti = ti;
    sl->R = R, sl->C = C, sl->r0 = r0, sl->r1 = r1, sl->c0 = c0, sl->c1 = c1;
    sl->perm_heads = perm_heads, sl->head_rows = head_rows;
    return CKV_STATUS_OK;
}

static ckv_status gguf_src_read(void *ctx, const char *name, int ndim, const int64_t *shape, int64_t row0,
                                int64_t row1, int64_t col0, int64_t col1, float *dst) {
    gguf_source *src = ctx;
    if (!src || !name || !dst)
        return ckv_error(CKV_STATUS_ERR_ARG, "gguf: NULL argument reading '%.200s'", name ? name : "(null)");
    const gguf_file *f = src->f;
    gguf_slice sl;
    CKV_TRY(gguf_src_locate(src, name, ndim, shape, row0, row1, col0, col1, &sl));
    const gguf_tensor *t = sl.t;
    const gguf_type_info *ti = sl.ti;
    const char *gname = sl.gname;
    const int64_t C = sl.C, r0 = sl.r0, r1 = sl.r1, c0 = sl.c0, c1 = sl.c1;
    const int64_t perm_heads = sl.perm_heads, head_rows = sl.head_rows;

    size_t B = ti->block, row_bytes = (size_t)(C / (int64_t)B) * ti->bytes;
    int64_t w = c1 - c0;
    int64_t b0 = c0 / (int64_t)B, b1 = (c1 + (int64_t)B - 1) / (int64_t)B; /* blocks covering [c0, c1) */
    int direct = c0 == b0 * (int64_t)B && (c1 == b1 * (int64_t)B);          /* no partial block at either end */
    float *scratch = NULL;
    if (!direct || (perm_heads > 0 && t->ndim == 1)) {
        size_t n = (size_t)(b1 - b0) * B;
        if (t->ndim == 1) n = (size_t)C;
        scratch = malloc((n ? n : 1) * sizeof *scratch);
        if (!scratch) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory reading tensor '%s'", f->path, gname);
    }
    if (perm_heads > 0 && t->ndim == 1) {
        /* a bias: undo the permutation element-wise */
        gguf_dequant(t->type, t->data, (size_t)C / B, scratch);
        for (int64_t e = 0; e < C; e++) dst[e] = scratch[gguf_unpermute_row(e, head_rows)];
    } else {
        for (int64_t r = r0; r < r1; r++) {
            int64_t sr = perm_heads > 0 ? gguf_unpermute_row(r, head_rows) : r;
            const uint8_t *p = t->data + (size_t)sr * row_bytes + (size_t)b0 * ti->bytes;
            float *out = dst + (size_t)(r - r0) * (size_t)w;
            if (direct) {
                gguf_dequant(t->type, p, (size_t)(b1 - b0), out);
            } else {
                gguf_dequant(t->type, p, (size_t)(b1 - b0), scratch);
                memcpy(out, scratch + (c0 - b0 * (int64_t)B), (size_t)w * sizeof *out);
            }
        }
    }
    free(scratch);
    gguf_drop_pages(t);
    /* corrupt weights (a flipped exponent byte) dequantise to NaN or infinity: refuse them here */
    int64_t bad = ckv_find_nonfinite_f32(dst, (size_t)(r1 - r0) * (size_t)w);
    if (bad >= 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%s': element %" PRId64 " of the slice read is %s (corrupt "
                         "weights)", f->path, gname, bad, dst[bad] != dst[bad] ? "NaN" : "infinite");
    return CKV_STATUS_OK;
}

static ckv_dtype gguf_src_stored_dtype(void *ctx, const char *name) {
    const gguf_source *src = ctx;
    char gname[160];
    gguf_perm perm;
    const gguf_tensor *t =
        src && name && gguf_map_name(name, gname, sizeof gname, &perm) ? gguf_find_tensor(src->f, gname) : NULL;
    return t && gguf_types[t->type].readable ? gguf_ckv_dtype(t->type) : CKV_DTYPE_F32;
}

static ckv_status gguf_src_read_raw(void *ctx, const char *name, const int64_t *shape, int64_t row0, int64_t row1,
                                    int64_t col0, int64_t col1, void *dst) {
    gguf_source *src = ctx;
    if (!src || !name || !dst)
        return ckv_error(CKV_STATUS_ERR_ARG, "gguf: NULL argument reading '%.200s'", name ? name : "(null)");
    gguf_slice sl;
    CKV_TRY(gguf_src_locate(src, name, 2, shape, row0, row1, col0, col1, &sl));
    const int64_t B = (int64_t)sl.ti->block;
    if (sl.t->ndim != 2 || sl.c0 % B != 0 || sl.c1 % B != 0)
        return ckv_error(CKV_STATUS_ERR_ARG,
                         "%s: tensor '%s': columns [%" PRId64 ", %" PRId64 ") of a %s tensor are not whole blocks of %"
                         PRId64 " (or it is not 2-D)",
                         src->f->path, sl.gname, sl.c0, sl.c1, sl.ti->name, B);
    const size_t row_bytes = (size_t)(sl.C / B) * sl.ti->bytes, out_bytes = (size_t)((sl.c1 - sl.c0) / B) * sl.ti->bytes;
    uint8_t *out = dst;
    for (int64_t r = sl.r0; r < sl.r1; r++) {
        const int64_t sr = sl.perm_heads > 0 ? gguf_unpermute_row(r, sl.head_rows) : r;
        memcpy(out + (size_t)(r - sl.r0) * out_bytes, sl.t->data + (size_t)sr * row_bytes + (size_t)(sl.c0 / B) * sl.ti->bytes,
               out_bytes);
    }
    gguf_drop_pages(sl.t);
    return CKV_STATUS_OK;
}

static int gguf_src_has(void *ctx, const char *name) {
    gguf_source *src = ctx;
    char gname[160];
    gguf_perm perm;
    return src && name && gguf_map_name(name, gname, sizeof gname, &perm) && gguf_find_tensor(src->f, gname);
}

static void gguf_src_release(void *ctx) {
    gguf_source *src = ctx;
    if (src && src->f && src->f->map) madvise(src->f->map, src->f->size, MADV_DONTNEED);
}

static void gguf_src_close(void *ctx) {
    gguf_source *src = ctx;
    if (!src) return;
    gguf_file_close(src->f);
    free(src);
}

/* ---- metadata -> ckv_model_config -------------------------------------------------------------- */

/* An integer key (any integer type; a uniform per-layer array is taken as its common value).
 * *present = 0 and *out = def when absent and not required. */
static ckv_status gguf_meta_int(const gguf_file *f, const char *key, int required, int64_t def, int64_t lo,
                                int64_t hi, int64_t *out, int *present) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (present) *present = kv != NULL;
    if (!kv) {
        if (required) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing metadata key '%s'", f->path, key);
        *out = def;
        return CKV_STATUS_OK;
    }
    int64_t v = 0;
    int ok = 0;
    if (kv->type == GGUF_V_ARRAY && kv->count > 0 && kv->elem_type != GGUF_V_BOOL) {
        size_t es = gguf_vtype_sizes[kv->elem_type];
        ok = es > 0 && gguf_scalar_int(kv->elem_type, kv->val, &v);
        for (uint64_t i = 1; ok && i < kv->count; i++) {
            int64_t x = 0;
            ok = gguf_scalar_int(kv->elem_type, kv->val + i * es, &x);
            if (ok && x != v)
                return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                                 "%s: metadata key '%s' differs between layers (ckv needs one value for all)", f->path,
                                 key);
        }
    } else if (kv->type != GGUF_V_BOOL) {
        ok = gguf_scalar_int(kv->type, kv->val, &v);
    }
    if (!ok)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s' must be an integer (it is %s)", f->path, key,
                         gguf_vtype_name(kv->type));
    if (v < lo || v > hi)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s' is %" PRId64 " (expected %" PRId64 " to %" PRId64
                         ")", f->path, key, v, lo, hi);
    *out = v;
    return CKV_STATUS_OK;
}

static ckv_status gguf_meta_pos_int(const gguf_file *f, const char *key, int required, int def, int *out,
                                    int *present) {
    int64_t v;
    CKV_TRY(gguf_meta_int(f, key, required, def, 1, INT32_MAX, &v, present));
    *out = (int)v;
    return CKV_STATUS_OK;
}

/* A floating-point key (float32, float64 or an integer type). */
static ckv_status gguf_meta_float(const gguf_file *f, const char *key, int required, double def, double *out,
                                  int *present) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    if (present) *present = kv != NULL;
    if (!kv) {
        if (required) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing metadata key '%s'", f->path, key);
        *out = def;
        return CKV_STATUS_OK;
    }
    int64_t iv;
    if (kv->type == GGUF_V_F32) {
        float v;
        memcpy(&v, kv->val, 4);
        *out = v;
    } else if (kv->type == GGUF_V_F64) {
        memcpy(out, kv->val, 8);
    } else if (kv->type != GGUF_V_BOOL && kv->type != GGUF_V_ARRAY && gguf_scalar_int(kv->type, kv->val, &iv)) {
        *out = (double)iv;
    } else {
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s' must be a number (it is %s)", f->path, key,
                         gguf_vtype_name(kv->type));
    }
    if (!isfinite(*out))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s' is not finite", f->path, key);
    return CKV_STATUS_OK;
}

/* A string key: *s (not terminated) and *len; *s = NULL when absent. */
static ckv_status gguf_meta_string(const gguf_file *f, const char *key, const char **s, size_t *len) {
    const gguf_kv *kv = gguf_find_kv(f, key);
    *s = NULL;
    *len = 0;
    if (!kv) return CKV_STATUS_OK;
    if (kv->type != GGUF_V_STRING)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s' must be a string (it is %s)", f->path, key,
                         gguf_vtype_name(kv->type));
    uint64_t n;
    memcpy(&n, kv->val, 8);
    *s = (const char *)kv->val + 8;
    *len = (size_t)n;
    return CKV_STATUS_OK;
}

/* A string value for a message: at most 64 bytes, control characters shown as '?'. */
static const char *gguf_printable(char *buf, size_t cap, const char *s, size_t len) {
    size_t n = len < cap - 1 ? len : cap - 1;
    if (n > 64) n = 64;
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    buf[n] = 0;
    return buf;
}

static int gguf_str_is(const char *s, size_t len, const char *lit) { return s && strlen(lit) == len && !memcmp(s, lit, len); }

static ckv_status gguf_add_eos(ckv_model_config *cfg, const gguf_file *f, const char *key) {
    int64_t id;
    int present;
    CKV_TRY(gguf_meta_int(f, key, 0, -1, 0, INT32_MAX, &id, &present));
    if (!present) return CKV_STATUS_OK;
    for (int k = 0; k < cfg->n_eos; k++)
        if (cfg->eos_ids[k] == id) return CKV_STATUS_OK;
    if (cfg->n_eos < CKV_MAX_EOS) cfg->eos_ids[cfg->n_eos++] = (int)id;
    return CKV_STATUS_OK;
}

/* "<ar>.<suffix>", the metadata key of an architecture-specific setting, in the caller's buffer key[96]. */
static const char *gguf_arch_key(char *buf, size_t cap, const char *ar, const char *suffix) {
    snprintf(buf, cap, "%s.%s", ar, suffix);
    return buf;
}
#define K(suffix) gguf_arch_key(key, sizeof key, ar, suffix)

static ckv_status gguf_config_rope(ckv_model_config *cfg, const gguf_file *f, const char *ar) {
    char key[96];
    ckv_rope_config *r = &cfg->rope;
    memset(r, 0, sizeof *r);
    r->type = CKV_ROPE_TYPE_DEFAULT;
    r->factor = 1.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    r->truncate = 1;
    CKV_TRY(gguf_meta_float(f, K("rope.freq_base"), 0, 10000.0, &r->theta, NULL));
    if (!(r->theta > 0.0))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s.rope.freq_base' must be positive (got %g)",
                         f->path, ar, r->theta);
    int rot;
    CKV_TRY(gguf_meta_pos_int(f, K("rope.dimension_count"), 0, cfg->head_dim, &rot, NULL));
    if (rot != cfg->head_dim)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: %s.rope.dimension_count %d differs from the head size %d (partial rotary is not "
                         "supported)",
                         f->path, ar, rot, cfg->head_dim);
    if (gguf_find_tensor(f, "rope_freqs.weight"))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: tensor 'rope_freqs.weight' (per-dimension rope frequency factors, Llama 3 style scaling) "
                         "is not supported",
                         f->path);

    const char *type;
    size_t tlen;
    CKV_TRY(gguf_meta_string(f, K("rope.scaling.type"), &type, &tlen));
    double factor = 0.0;
    int has_factor = 0;
    CKV_TRY(gguf_meta_float(f, K("rope.scaling.factor"), 0, 0.0, &factor, &has_factor));
    if (!has_factor) {
        /* the older key: a linear factor */
        CKV_TRY(gguf_meta_float(f, K("rope.scale_linear"), 0, 0.0, &factor, &has_factor));
        if (has_factor && !type) type = "linear", tlen = 6;
    }
    if (!type || gguf_str_is(type, tlen, "none") || (has_factor && factor == 1.0 && !gguf_str_is(type, tlen, "yarn")))
        return CKV_STATUS_OK;
    char shown[72];
    if (!has_factor || !(factor > 0.0))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s.rope.scaling.factor' must be positive for rope "
                         "scaling '%s'", f->path, ar, gguf_printable(shown, sizeof shown, type, tlen));
    r->factor = factor;
    if (gguf_str_is(type, tlen, "linear")) {
        r->type = CKV_ROPE_TYPE_LINEAR;
        return CKV_STATUS_OK;
    }
    if (!gguf_str_is(type, tlen, "yarn"))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: metadata key '%s.rope.scaling.type' is '%s' (ckv supports none, linear and yarn)",
                         f->path, ar, gguf_printable(shown, sizeof shown, type, tlen));
    r->type = CKV_ROPE_TYPE_YARN;
    CKV_TRY(gguf_meta_pos_int(f, K("rope.scaling.original_context_length"), 0, cfg->max_position_embeddings,
                              &r->original_max_position, NULL));
    CKV_TRY(gguf_meta_float(f, K("rope.scaling.yarn_beta_fast"), 0, 32.0, &r->beta_fast, NULL));
    CKV_TRY(gguf_meta_float(f, K("rope.scaling.yarn_beta_slow"), 0, 1.0, &r->beta_slow, NULL));
    if (!(r->beta_fast > 0.0) || !(r->beta_slow > 0.0))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: yarn beta_fast and beta_slow must be positive", f->path);
    double log_mul = 0.0;
    CKV_TRY(gguf_meta_float(f, K("rope.scaling.yarn_log_multiplier"), 0, 0.0, &log_mul, NULL));
    if (log_mul != 0.0)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: metadata key '%s.rope.scaling.yarn_log_multiplier' is not supported", f->path, ar);
    /* llama.cpp multiplies its own yarn magnitude scale (0.1 ln(factor) + 1) by attn_factor; the
     * Hugging Face attention_factor replaces that scale, so it is their product */
    double attn = 1.0;
    CKV_TRY(gguf_meta_float(f, K("rope.scaling.attn_factor"), 0, 1.0, &attn, NULL));
    if (!(attn > 0.0))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s.rope.scaling.attn_factor' must be positive",
                         f->path, ar);
    if (attn != 1.0) r->attention_factor = attn * (factor > 1.0 ? 0.1 * log(factor) + 1.0 : 1.0);
    return CKV_STATUS_OK;
}

static ckv_status gguf_config(ckv_model_config *cfg, const gguf_file *f, gguf_source *src) {
    memset(cfg, 0, sizeof *cfg);
    const char *arch;
    size_t alen;
    CKV_TRY(gguf_meta_string(f, "general.architecture", &arch, &alen));
    if (!arch) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing metadata key 'general.architecture'", f->path);
    char shown[72], key[96];
    const char *ar; /* the architecture, also the prefix of its metadata keys */
    if (gguf_str_is(arch, alen, "llama")) {
        ar = "llama";
        cfg->arch = CKV_ARCH_LLAMA;
        snprintf(cfg->arch_name, sizeof cfg->arch_name, "LlamaForCausalLM");
    } else if (gguf_str_is(arch, alen, "qwen2")) {
        ar = "qwen2";
        cfg->arch = CKV_ARCH_QWEN2;
        snprintf(cfg->arch_name, sizeof cfg->arch_name, "Qwen2ForCausalLM");
    } else {
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: general.architecture is '%s' (ckv reads GGUF files of architecture 'llama' or "
                         "'qwen2')",
                         f->path, gguf_printable(shown, sizeof shown, arch, alen));
    }

    int64_t experts = 0;
    CKV_TRY(gguf_meta_int(f, K("expert_count"), 0, 0, 0, INT32_MAX, &experts, NULL));
    if (experts > 0)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: %s.expert_count is %" PRId64 " (mixture-of-experts models are not supported)", f->path, ar,
                         experts);

    CKV_TRY(gguf_meta_pos_int(f, K("embedding_length"), 1, 0, &cfg->hidden_size, NULL));
    CKV_TRY(gguf_meta_pos_int(f, K("block_count"), 1, 0, &cfg->n_layers, NULL));
    CKV_TRY(gguf_meta_pos_int(f, K("feed_forward_length"), 1, 0, &cfg->intermediate_size, NULL));
    CKV_TRY(gguf_meta_pos_int(f, K("attention.head_count"), 1, 0, &cfg->n_heads, NULL));
    CKV_TRY(gguf_meta_pos_int(f, K("attention.head_count_kv"), 0, cfg->n_heads, &cfg->n_kv_heads, NULL));
    CKV_TRY(gguf_meta_pos_int(f, K("context_length"), 1, 0, &cfg->max_position_embeddings, NULL));
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: %s.attention.head_count_kv (%d) must divide %s.attention.head_count (%d)", f->path, ar,
                         cfg->n_kv_heads, ar, cfg->n_heads);
    int kl, vl, has_kl;
    CKV_TRY(gguf_meta_pos_int(f, K("attention.key_length"), 0, cfg->hidden_size / cfg->n_heads, &kl, &has_kl));
    CKV_TRY(gguf_meta_pos_int(f, K("attention.value_length"), 0, kl, &vl, NULL));
    if (kl != vl)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: %s.attention.key_length %d differs from value_length %d", f->path, ar, kl, vl);
    cfg->head_dim = kl;
    if (cfg->head_dim <= 0 || cfg->head_dim % 2 != 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: the head size must be positive and even (got %d%s)", f->path,
                         cfg->head_dim, has_kl ? "" : ", embedding_length / head_count");
    CKV_TRY(gguf_meta_float(f, K("attention.layer_norm_rms_epsilon"), 1, 0.0, &cfg->rms_norm_eps, NULL));
    if (!(cfg->rms_norm_eps > 0.0))
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: metadata key '%s.attention.layer_norm_rms_epsilon' must be positive (got %g)", f->path, ar,
                         cfg->rms_norm_eps);

    /* vocabulary: the tokenizer's token list, else <arch>.vocab_size, else the embedding's rows */
    const gguf_kv *tokens = gguf_find_kv(f, "tokenizer.ggml.tokens");
    const gguf_tensor *embd = gguf_find_tensor(f, "token_embd.weight");
    if (tokens) {
        if (tokens->type != GGUF_V_ARRAY || tokens->elem_type != GGUF_V_STRING)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key 'tokenizer.ggml.tokens' must be an array of "
                             "strings", f->path);
        if (tokens->count < 1 || tokens->count > INT32_MAX)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key 'tokenizer.ggml.tokens' holds %" PRIu64 " tokens",
                             f->path, tokens->count);
        cfg->vocab_size = (int)tokens->count;
    } else {
        int present;
        CKV_TRY(gguf_meta_pos_int(f, K("vocab_size"), 0, 0, &cfg->vocab_size, &present));
        if (!present && embd && embd->ndim == 2 && embd->ne[1] <= INT32_MAX) cfg->vocab_size = (int)embd->ne[1];
        if (!cfg->vocab_size)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing metadata key 'tokenizer.ggml.tokens' (the vocabulary)",
                             f->path);
    }
    if (!embd) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor 'token_embd.weight' is not in the file", f->path);
    if (embd->ndim != 2 || embd->ne[0] != cfg->hidden_size || embd->ne[1] != cfg->vocab_size)
        return ckv_error(CKV_STATUS_ERR_SHAPE,
                         "%s: tensor 'token_embd.weight' has extents (%" PRId64 ", %" PRId64 "), expected (%d, %d) "
                         "from embedding_length and the vocabulary",
                         f->path, embd->ne[0], embd->ndim > 1 ? embd->ne[1] : 1, cfg->hidden_size, cfg->vocab_size);

    cfg->tie_word_embeddings = gguf_find_tensor(f, "output.weight") == NULL;
    cfg->attention_bias = gguf_find_tensor(f, "blk.0.attn_q.bias") != NULL;
    const int o_bias = gguf_find_tensor(f, "blk.0.attn_output.bias") != NULL;
    if (cfg->arch == CKV_ARCH_LLAMA && cfg->attention_bias && !o_bias)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: q/k/v biases without an attn_output bias are not supported for architecture llama",
                         f->path);
    /* Qwen2 has q/k/v biases and no o_proj bias */
    if (cfg->arch == CKV_ARCH_QWEN2 && (!cfg->attention_bias || o_bias))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: architecture qwen2 needs q/k/v biases (tensor 'blk.0.attn_q.bias') and no attn_output "
                         "bias (this file has %s)",
                         f->path, o_bias ? "an attn_output bias" : "no attn_q bias");
    if (gguf_find_tensor(f, "blk.0.ffn_gate.bias") || gguf_find_tensor(f, "blk.0.ffn_up.bias") ||
        gguf_find_tensor(f, "blk.0.ffn_down.bias"))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: MLP biases are not supported (ckv has none)", f->path);
    cfg->sliding_window = 0;

    CKV_TRY(gguf_config_rope(cfg, f, ar));
    cfg->max_context = cfg->max_position_embeddings;
    if (cfg->rope.type == CKV_ROPE_TYPE_YARN) {
        double stretched = (double)cfg->rope.original_max_position * cfg->rope.factor;
        if (stretched > cfg->max_context && stretched < 2147483647.0) cfg->max_context = (int)stretched;
    }

    /* what the weights are stored as: F16 / BF16 files keep that dtype, quantised ones are F32 to ckv */
    const gguf_tensor *wq = gguf_find_tensor(f, "blk.0.attn_q.weight");
    cfg->dtype = CKV_DTYPE_F32;
    if (wq && wq->type == GGUF_TYPE_F16) cfg->dtype = CKV_DTYPE_F16;
    if (wq && wq->type == GGUF_TYPE_BF16) cfg->dtype = CKV_DTYPE_BF16;

    int64_t bos;
    CKV_TRY(gguf_meta_int(f, "tokenizer.ggml.bos_token_id", 0, -1, 0, INT32_MAX, &bos, NULL));
    cfg->bos_token_id = (int)bos;
    cfg->n_eos = 0;
    /* end of sequence, and llama.cpp's other end-of-generation ids (end of turn, end of message) */
    CKV_TRY(gguf_add_eos(cfg, f, "tokenizer.ggml.eos_token_id"));
    CKV_TRY(gguf_add_eos(cfg, f, "tokenizer.ggml.eot_token_id"));
    CKV_TRY(gguf_add_eos(cfg, f, "tokenizer.ggml.eom_token_id"));

    /* the llama conversion permutes the rotary rows of q/k; the qwen2 one keeps Hugging Face's order */
    src->n_head = cfg->arch == CKV_ARCH_LLAMA ? cfg->n_heads : 0;
    src->n_head_kv = cfg->arch == CKV_ARCH_LLAMA ? cfg->n_kv_heads : 0;
    return ckv_config_check(cfg, f->path);
}

ckv_status ckv_gguf_open_source(ckv_weight_source *src, ckv_model_config *cfg, const char *path) {
    if (!src || !cfg || !path) return ckv_error(CKV_STATUS_ERR_ARG, "gguf: NULL argument");
    memset(src, 0, sizeof *src);
    snprintf(src->path, sizeof src->path, "%s", path);
    gguf_source *g = calloc(1, sizeof *g);
    if (!g) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", path);
    ckv_status s = gguf_file_open(&g->f, path);
    if (s == CKV_STATUS_OK) s = gguf_config(cfg, g->f, g);
    if (s != CKV_STATUS_OK) {
        gguf_src_close(g);
        return s;
    }
    src->ctx = g;
    src->read_f32 = gguf_src_read;
    src->has = gguf_src_has;
    src->stored_dtype = gguf_src_stored_dtype;
    src->read_raw = gguf_src_read_raw;
    src->release_pages = gguf_src_release;
    src->close = gguf_src_close;
    return CKV_STATUS_OK;
}

/* ---- metadata access ------------------------------------------------------------------------------ */

struct ckv_gguf_meta {
    gguf_file *f;
};

ckv_status ckv_gguf_meta_open(ckv_gguf_meta **out, const char *path) {
    *out = NULL;
    ckv_gguf_meta *m = calloc(1, sizeof *m);
    if (!m) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", path);
    ckv_status s = gguf_file_open(&m->f, path);
    if (s != CKV_STATUS_OK) {
        free(m);
        return s;
    }
    *out = m;
    return CKV_STATUS_OK;
}

void ckv_gguf_meta_close(ckv_gguf_meta *m) {
    if (!m) return;
    gguf_file_close(m->f);
    free(m);
}

const char *ckv_gguf_meta_string(const ckv_gguf_meta *m, const char *key, uint64_t *len) {
    const gguf_kv *kv = gguf_find_kv(m->f, key);
    if (!kv || kv->type != GGUF_V_STRING) return NULL;
    memcpy(len, kv->val, 8); /* the string's length field, then its bytes (validated at parse) */
    return (const char *)kv->val + 8;
}

int ckv_gguf_meta_int(const ckv_gguf_meta *m, const char *key, int64_t *out) {
    const gguf_kv *kv = gguf_find_kv(m->f, key);
    return kv && kv->type != GGUF_V_ARRAY && gguf_scalar_int(kv->type, kv->val, out);
}

/* The array stored under key, checked for its element type; NULL (and *n = 0) when absent. */
static ckv_status meta_array(const ckv_gguf_meta *m, const char *key, const gguf_kv **out, int64_t *n) {
    *out = NULL;
    *n = 0;
    const gguf_kv *kv = gguf_find_kv(m->f, key);
    if (!kv) return CKV_STATUS_OK;
    if (kv->type != GGUF_V_ARRAY)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata '%s' is a %s, expected an array", m->f->path, key,
                         gguf_vtype_name(kv->type));
    if (kv->count > (uint64_t)INT32_MAX)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata '%s' has %llu elements", m->f->path, key,
                         (unsigned long long)kv->count);
    *out = kv;
    *n = (int64_t)kv->count;
    return CKV_STATUS_OK;
}

ckv_status ckv_gguf_meta_strings(const ckv_gguf_meta *m, const char *key, int64_t *n, const char ***strs,
                                 uint64_t **lens) {
    const gguf_kv *kv;
    *strs = NULL;
    *lens = NULL;
    CKV_TRY(meta_array(m, key, &kv, n));
    if (!kv) return CKV_STATUS_OK;
    if (kv->elem_type != GGUF_V_STRING)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata '%s' holds %s, expected strings", m->f->path, key,
                         gguf_vtype_name(kv->elem_type));
    const char **s = malloc(sizeof *s * (size_t)(*n > 0 ? *n : 1));
    uint64_t *l = malloc(sizeof *l * (size_t)(*n > 0 ? *n : 1));
    if (!s || !l) {
        free(s);
        free(l);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory reading '%s'", m->f->path, key);
    }
    const uint8_t *p = kv->val; /* each element: u64 length then bytes (bounds checked at parse) */
    for (int64_t i = 0; i < *n; i++) {
        memcpy(&l[i], p, 8);
        s[i] = (const char *)p + 8;
        p += 8 + l[i];
    }
    *strs = s;
    *lens = l;
    return CKV_STATUS_OK;
}

ckv_status ckv_gguf_meta_f32s(const ckv_gguf_meta *m, const char *key, int64_t *n, float **out) {
    const gguf_kv *kv;
    *out = NULL;
    CKV_TRY(meta_array(m, key, &kv, n));
    if (!kv) return CKV_STATUS_OK;
    if (kv->elem_type != GGUF_V_F32)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata '%s' holds %s, expected float32", m->f->path, key,
                         gguf_vtype_name(kv->elem_type));
    float *v = malloc(sizeof *v * (size_t)(*n > 0 ? *n : 1));
    if (!v) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory reading '%s'", m->f->path, key);
    memcpy(v, kv->val, sizeof *v * (size_t)*n);
    *out = v;
    return CKV_STATUS_OK;
}

ckv_status ckv_gguf_meta_i32s(const ckv_gguf_meta *m, const char *key, int64_t *n, int32_t **out) {
    const gguf_kv *kv;
    *out = NULL;
    CKV_TRY(meta_array(m, key, &kv, n));
    if (!kv) return CKV_STATUS_OK;
    uint32_t t = kv->elem_type;
    size_t es = t < GGUF_V_COUNT ? gguf_vtype_sizes[t] : 0;
    if (es == 0 || t == GGUF_V_F32 || t == GGUF_V_F64 || t == GGUF_V_STRING)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata '%s' holds %s, expected integers", m->f->path, key,
                         gguf_vtype_name(t));
    int32_t *v = malloc(sizeof *v * (size_t)(*n > 0 ? *n : 1));
    if (!v) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory reading '%s'", m->f->path, key);
    for (int64_t i = 0; i < *n; i++) {
        int64_t x = 0;
        gguf_scalar_int(t, kv->val + (size_t)i * es, &x);
        v[i] = (int32_t)x;
    }
    *out = v;
    return CKV_STATUS_OK;
}
