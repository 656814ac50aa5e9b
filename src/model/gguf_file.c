/* gguf_file.c - the GGUF file parser (versions 2 and 3) over a read-only memory map.
 *
 * A GGUF file is: "GGUF", a uint32 version, uint64 tensor and metadata counts, the metadata
 * (key string, uint32 value type, value; strings are a uint64 length and bytes, arrays a uint32 element
 * type, a uint64 count and the elements), the tensor table (name, uint32 n_dims, n_dims uint64 extents
 * ne[] with ne[0] the fastest-varying, uint32 ggml type, uint64 offset), padding to the alignment
 * (general.alignment, default 32), then the data section the offsets are relative to. Everything is
 * checked against the file size before any tensor is handed out: counts and string lengths that cannot
 * fit, value and tensor types, dimensions, offsets that are misaligned, past the end or overlapping,
 * duplicate keys and names. Each error is one line naming the file and the problem. Keys and tensor
 * names are found through open-addressing hash indexes; ckv_gguf_meta_* reads typed metadata values.
 *
 * It does not know ckv's model: no Hugging Face names, no architectures, no configuration, no
 * dequantisation (all of that is the weight source, gguf.c); it never writes GGUF. Assumes a
 * little-endian host, as GGUF files are (big-endian ones are refused). */
#define _DEFAULT_SOURCE /* MAP_PRIVATE, O_CLOEXEC */
#include "model/gguf_file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gguf_file.c assumes a little-endian host"
#endif

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_KEY_LEN 65535u   /* the format's limit on key length */
#define GGUF_MAX_NAME_LEN 65535u  /* names are short in practice (ggml allows 63 bytes) */
#define GGUF_HEADER_MIN 24        /* magic, version, two counts */
#define GGUF_KV_MIN_BYTES 13      /* empty key (8) + type (4) + a 1-byte value */
#define GGUF_TENSOR_MIN_BYTES 32  /* empty name (8) + n_dims (4) + one extent (8) + type (4) + offset (8) */

/* ---- ggml tensor types ------------------------------------------------------------------------- */

static const ckv_gguf_type_info gguf_types[CKV_GGUF_TYPE_COUNT] = {
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

const ckv_gguf_type_info *ckv_gguf_type_find(uint32_t t) {
    return t < CKV_GGUF_TYPE_COUNT && gguf_types[t].name ? &gguf_types[t] : NULL;
}

/* ---- metadata value types ---------------------------------------------------------------------- */

static const char *const gguf_vtype_names[CKV_GGUF_V_COUNT] = {"uint8",  "int8",  "uint16", "int16", "uint32",
                                                          "int32",  "float32", "bool", "string", "array",
                                                          "uint64", "int64", "float64"};
static const uint8_t gguf_vtype_sizes[CKV_GGUF_V_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *ckv_gguf_value_type_name(uint32_t t) { return t < CKV_GGUF_V_COUNT ? gguf_vtype_names[t] : "unknown"; }
size_t ckv_gguf_value_type_size(uint32_t t) { return t < CKV_GGUF_V_COUNT ? gguf_vtype_sizes[t] : 0; }

/* ---- name index (open addressing, FNV-1a) ------------------------------------------------------ */

static uint64_t gguf_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The i-th string of an array of ckv_gguf_kv (stride = sizeof(ckv_gguf_kv)) or ckv_gguf_tensor. */
typedef const char *(*gguf_name_fn)(const void *base, int i);
static const char *gguf_kv_name(const void *base, int i) { return ((const ckv_gguf_kv *)base)[i].key; }
static const char *gguf_tensor_name(const void *base, int i) { return ((const ckv_gguf_tensor *)base)[i].name; }

/* Builds the index; on a duplicate stores the second occurrence in *dup (else -1). */
static ckv_status gguf_index_build(ckv_gguf_index *ix, const void *base, int n, gguf_name_fn name, int *dup,
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

static int gguf_index_find(const ckv_gguf_index *ix, const void *base, gguf_name_fn name, const char *s) {
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
    if (t == CKV_GGUF_V_STRING) {
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
    if (t == CKV_GGUF_V_BOOL && c->base[c->pos] > 1)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%.200s': bool value %u is neither 0 nor 1", c->path,
                         key, c->base[c->pos]);
    c->pos += n;
    return CKV_STATUS_OK;
}

static ckv_status gguf_parse_kv(gguf_cursor *c, ckv_gguf_kv *kv, uint64_t i) {
    char what[96];
    snprintf(what, sizeof what, "metadata key %" PRIu64 " of the header", i);
    CKV_TRY(gguf_name(c, &kv->key, GGUF_MAX_KEY_LEN, what));
    snprintf(what, sizeof what, "metadata key '%.60s': value type", kv->key);
    CKV_TRY(gguf_u32(c, &kv->type, what));
    if (kv->type >= CKV_GGUF_V_COUNT)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%.200s': unknown value type %u", c->path, kv->key,
                         kv->type);
    if (kv->type != CKV_GGUF_V_ARRAY) {
        kv->val = c->base + c->pos;
        return gguf_skip_value(c, kv->type, kv->key);
    }
    snprintf(what, sizeof what, "metadata key '%.60s': array header", kv->key);
    CKV_TRY(gguf_u32(c, &kv->elem_type, what));
    CKV_TRY(gguf_u64(c, &kv->count, what));
    if (kv->elem_type >= CKV_GGUF_V_COUNT)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%.200s': unknown array element type %u", c->path,
                         kv->key, kv->elem_type);
    if (kv->elem_type == CKV_GGUF_V_ARRAY)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: metadata key '%.200s': arrays of arrays are not supported",
                         c->path, kv->key);
    /* every element takes at least its fixed size (a string at least its 8-byte length) */
    uint64_t min_elem = kv->elem_type == CKV_GGUF_V_STRING ? 8 : ckv_gguf_value_type_size(kv->elem_type);
    if (kv->count > (c->size - c->pos) / min_elem)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: metadata key '%.200s': array of %" PRIu64 " %s values runs past the end of the file "
                         "(%zu bytes)",
                         c->path, kv->key, kv->count, gguf_vtype_names[kv->elem_type], c->size);
    kv->val = c->base + c->pos;
    if (kv->elem_type == CKV_GGUF_V_STRING || kv->elem_type == CKV_GGUF_V_BOOL) {
        for (uint64_t k = 0; k < kv->count; k++) CKV_TRY(gguf_skip_value(c, kv->elem_type, kv->key));
    } else {
        c->pos += (size_t)(kv->count * min_elem);
    }
    return CKV_STATUS_OK;
}

static ckv_status gguf_parse_tensor(gguf_cursor *c, ckv_gguf_tensor *t, uint64_t i) {
    char what[96];
    snprintf(what, sizeof what, "tensor %" PRIu64 "'s name", i);
    CKV_TRY(gguf_name(c, &t->name, GGUF_MAX_NAME_LEN, what));
    snprintf(what, sizeof what, "tensor '%.60s': header", t->name);
    uint32_t nd = 0;
    CKV_TRY(gguf_u32(c, &nd, what));
    if (nd < 1 || nd > CKV_GGUF_MAX_DIMS)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': %u dimensions (GGUF allows 1 to %d)", c->path,
                         t->name, nd, CKV_GGUF_MAX_DIMS);
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
    const ckv_gguf_type_info *ti = ckv_gguf_type_find(t->type);
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

const ckv_gguf_kv *ckv_gguf_file_find_kv(const ckv_gguf_file *f, const char *key) {
    int i = gguf_index_find(&f->kv_index, f->kvs, gguf_kv_name, key);
    return i < 0 ? NULL : &f->kvs[i];
}

const ckv_gguf_tensor *ckv_gguf_file_find_tensor(const ckv_gguf_file *f, const char *name) {
    int i = gguf_index_find(&f->tensor_index, f->tensors, gguf_tensor_name, name);
    return i < 0 ? NULL : &f->tensors[i];
}

int ckv_gguf_value_int(uint32_t type, const uint8_t *p, int64_t *out) {
    switch (type) {
    case CKV_GGUF_V_U8: *out = *p; return 1;
    case CKV_GGUF_V_I8: *out = (int8_t)*p; return 1;
    case CKV_GGUF_V_BOOL: *out = *p; return 1;
    case CKV_GGUF_V_U16: { uint16_t v; memcpy(&v, p, 2); *out = v; return 1; }
    case CKV_GGUF_V_I16: { int16_t v; memcpy(&v, p, 2); *out = v; return 1; }
    case CKV_GGUF_V_U32: { uint32_t v; memcpy(&v, p, 4); *out = v; return 1; }
    case CKV_GGUF_V_I32: { int32_t v; memcpy(&v, p, 4); *out = v; return 1; }
    case CKV_GGUF_V_U64: {
        uint64_t v;
        memcpy(&v, p, 8);
        if (v > (uint64_t)INT64_MAX) return 0;
        *out = (int64_t)v;
        return 1;
    }
    case CKV_GGUF_V_I64: { int64_t v; memcpy(&v, p, 8); *out = v; return 1; }
    default: return 0;
    }
}

static ckv_status gguf_parse(ckv_gguf_file *f) {
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
    const ckv_gguf_kv *al = ckv_gguf_file_find_kv(f, "general.alignment");
    if (al) {
        int64_t a = 0;
        if (al->type == CKV_GGUF_V_ARRAY || al->type == CKV_GGUF_V_BOOL || !ckv_gguf_value_int(al->type, al->val, &a))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key 'general.alignment' must be an integer (it is %s)",
                             f->path, ckv_gguf_value_type_name(al->type));
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
        ckv_gguf_tensor *t = &f->tensors[i];
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

void ckv_gguf_file_close(ckv_gguf_file *f) {
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

ckv_status ckv_gguf_file_open(ckv_gguf_file **out, const char *path) {
    *out = NULL;
    ckv_gguf_file *f = calloc(1, sizeof *f);
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
        ckv_gguf_file_close(f);
        return s;
    }
    *out = f;
    return CKV_STATUS_OK;
}

/* ---- dequantisation ---------------------------------------------------------------------------- */

/* ---- metadata access for other modules --------------------------------------------------------- */

struct ckv_gguf_meta {
    ckv_gguf_file *f;
};

ckv_status ckv_gguf_meta_open(ckv_gguf_meta **out, const char *path) {
    *out = NULL;
    ckv_gguf_meta *m = calloc(1, sizeof *m);
    if (!m) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", path);
    ckv_status s = ckv_gguf_file_open(&m->f, path);
    if (s != CKV_STATUS_OK) {
        free(m);
        return s;
    }
    *out = m;
    return CKV_STATUS_OK;
}

void ckv_gguf_meta_close(ckv_gguf_meta *m) {
    if (!m) return;
    ckv_gguf_file_close(m->f);
    free(m);
}

const char *ckv_gguf_meta_string(const ckv_gguf_meta *m, const char *key, uint64_t *len) {
    const ckv_gguf_kv *kv = ckv_gguf_file_find_kv(m->f, key);
    if (!kv || kv->type != CKV_GGUF_V_STRING) return NULL;
    memcpy(len, kv->val, 8); /* the string's length field, then its bytes (validated at parse) */
    return (const char *)kv->val + 8;
}

int ckv_gguf_meta_int(const ckv_gguf_meta *m, const char *key, int64_t *out) {
    const ckv_gguf_kv *kv = ckv_gguf_file_find_kv(m->f, key);
    return kv && kv->type != CKV_GGUF_V_ARRAY && ckv_gguf_value_int(kv->type, kv->val, out);
}

/* The array stored under key, checked for its element type; NULL (and *n = 0) when absent. */
static ckv_status meta_array(const ckv_gguf_meta *m, const char *key, const ckv_gguf_kv **out, int64_t *n) {
    *out = NULL;
    *n = 0;
    const ckv_gguf_kv *kv = ckv_gguf_file_find_kv(m->f, key);
    if (!kv) return CKV_STATUS_OK;
    if (kv->type != CKV_GGUF_V_ARRAY)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata '%s' is a %s, expected an array", m->f->path, key,
                         ckv_gguf_value_type_name(kv->type));
    if (kv->count > (uint64_t)INT32_MAX)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata '%s' has %llu elements", m->f->path, key,
                         (unsigned long long)kv->count);
    *out = kv;
    *n = (int64_t)kv->count;
    return CKV_STATUS_OK;
}

ckv_status ckv_gguf_meta_strings(const ckv_gguf_meta *m, const char *key, int64_t *n, const char ***strs,
                                 uint64_t **lens) {
    const ckv_gguf_kv *kv;
    *strs = NULL;
    *lens = NULL;
    CKV_TRY(meta_array(m, key, &kv, n));
    if (!kv) return CKV_STATUS_OK;
    if (kv->elem_type != CKV_GGUF_V_STRING)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata '%s' holds %s, expected strings", m->f->path, key,
                         ckv_gguf_value_type_name(kv->elem_type));
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
    const ckv_gguf_kv *kv;
    *out = NULL;
    CKV_TRY(meta_array(m, key, &kv, n));
    if (!kv) return CKV_STATUS_OK;
    if (kv->elem_type != CKV_GGUF_V_F32)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata '%s' holds %s, expected float32", m->f->path, key,
                         ckv_gguf_value_type_name(kv->elem_type));
    float *v = malloc(sizeof *v * (size_t)(*n > 0 ? *n : 1));
    if (!v) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory reading '%s'", m->f->path, key);
    memcpy(v, kv->val, sizeof *v * (size_t)*n);
    *out = v;
    return CKV_STATUS_OK;
}

ckv_status ckv_gguf_meta_i32s(const ckv_gguf_meta *m, const char *key, int64_t *n, int32_t **out) {
    const ckv_gguf_kv *kv;
    *out = NULL;
    CKV_TRY(meta_array(m, key, &kv, n));
    if (!kv) return CKV_STATUS_OK;
    uint32_t t = kv->elem_type;
    size_t es = t < CKV_GGUF_V_COUNT ? gguf_vtype_sizes[t] : 0;
    if (es == 0 || t == CKV_GGUF_V_F32 || t == CKV_GGUF_V_F64 || t == CKV_GGUF_V_STRING)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata '%s' holds %s, expected integers", m->f->path, key,
                         ckv_gguf_value_type_name(t));
    int32_t *v = malloc(sizeof *v * (size_t)(*n > 0 ? *n : 1));
    if (!v) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory reading '%s'", m->f->path, key);
    for (int64_t i = 0; i < *n; i++) {
        int64_t x = 0;
        ckv_gguf_value_int(t, kv->val + (size_t)i * es, &x);
        v[i] = (int32_t)x;
    }
    *out = v;
    return CKV_STATUS_OK;
}