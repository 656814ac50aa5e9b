/* safetensors.c - memory-mapped safetensors reader: one file, or the shards of a
 * model.safetensors.index.json. A file is an 8-byte little-endian header length N, N bytes of JSON
 * ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {string: string}}) and the data
 * region, offsets being relative to its start (8 + N). Every header is checked before any tensor is
 * handed out: length, JSON (a single object, nothing after it), dtype, shape, the byte size the shape
 * implies against the offsets, offsets inside the file and not overlapping, the last tensor ending
 * where the file ends, names unique; for an index, shard names that are plain file names and every
 * listed tensor present in its shard. Holes between tensors are tolerated (they cannot make a read go
 * astray). Only F32, F16 and BF16 convert to fp32; other dtypes are listed but refused by read_f32,
 * and a slice read that holds NaN or infinity is refused naming the tensor. This file knows no model
 * and does no sharding arithmetic; it assumes a little-endian host, as the format does. */
#define _DEFAULT_SOURCE /* madvise / MADV_DONTNEED */
#include "model/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fastmath.h"
#include "core/json.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

#define ST_MAX_HEADER ((uint64_t)100 * 1000 * 1000) /* the reference implementation's limit */
#define ST_MAX_JSON_INT 9007199254740992.0          /* 2^53: larger JSON integers are not exact */
#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_SINGLE_NAME "model.safetensors"

/* ---- dtypes ------------------------------------------------------------------------------------ */

typedef struct {
    const char *name;
    int bits;
    ckv_dtype dtype; /* CKV_DTYPE_COUNT_ when ckv has no such element type */
} st_dtype_info;

static const st_dtype_info st_dtypes[] = {
    {"F32", 32, CKV_DTYPE_F32},          {"F16", 16, CKV_DTYPE_F16},
    {"BF16", 16, CKV_DTYPE_BF16},        {"I32", 32, CKV_DTYPE_I32},
    {"I64", 64, CKV_DTYPE_I64},          {"F64", 64, CKV_DTYPE_COUNT_},
    {"BOOL", 8, CKV_DTYPE_COUNT_},       {"U8", 8, CKV_DTYPE_COUNT_},
    {"I8", 8, CKV_DTYPE_COUNT_},         {"I16", 16, CKV_DTYPE_COUNT_},
    {"U16", 16, CKV_DTYPE_COUNT_},       {"U32", 32, CKV_DTYPE_COUNT_},
    {"U64", 64, CKV_DTYPE_COUNT_},       {"C64", 64, CKV_DTYPE_COUNT_},
    {"F8_E4M3", 8, CKV_DTYPE_COUNT_},    {"F8_E5M2", 8, CKV_DTYPE_COUNT_},
    {"F8_E8M0", 8, CKV_DTYPE_COUNT_},    {"F6_E2M3", 6, CKV_DTYPE_COUNT_},
    {"F6_E3M2", 6, CKV_DTYPE_COUNT_},    {"F4", 4, CKV_DTYPE_COUNT_},
};

static const st_dtype_info *st_dtype_find(const char *name) {
    for (size_t i = 0; i < sizeof st_dtypes / sizeof st_dtypes[0]; i++)
        if (strcmp(st_dtypes[i].name, name) == 0) return &st_dtypes[i];
    return NULL;
}

/* ---- name index (open addressing, FNV-1a) ------------------------------------------------------ */

typedef struct {
    int *slots; /* tensor index, -1 when empty */
    size_t mask;
} st_index;

static uint64_t st_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Builds the index over tensors[0..n); on a duplicate name returns its second position in *dup. */
static ckv_status st_index_build(st_index *ix, const ckv_st_tensor *tensors, int n, int *dup) {
    size_t cap = 16;
    while (cap < (size_t)n * 2) cap *= 2;
    ix->slots = malloc(cap * sizeof *ix->slots);
    if (!ix->slots) return ckv_error(CKV_STATUS_ERR_NOMEM, "safetensors: out of memory for the name index");
    ix->mask = cap - 1;
    for (size_t i = 0; i < cap; i++) ix->slots[i] = -1;
    *dup = -1;
    for (int i = 0; i < n; i++) {
        size_t h = (size_t)st_hash(tensors[i].name) & ix->mask;
        while (ix->slots[h] >= 0) {
            if (strcmp(tensors[ix->slots[h]].name, tensors[i].name) == 0) {
                *dup = i;
                return CKV_STATUS_OK;
            }
            h = (h + 1) & ix->mask;
        }
        ix->slots[h] = i;
    }
    return CKV_STATUS_OK;
}

static int st_index_find(const st_index *ix, const ckv_st_tensor *tensors, const char *name) {
    if (!ix->slots) return -1;
    size_t h = (size_t)st_hash(name) & ix->mask;
    while (ix->slots[h] >= 0) {
        if (strcmp(tensors[ix->slots[h]].name, name) == 0) return ix->slots[h];
        h = (h + 1) & ix->mask;
    }
    return -1;
}

/* ---- one mapped file --------------------------------------------------------------------------- */

typedef struct {
    char *path;
    void *map;
    size_t size;
    int n;
    ckv_st_tensor *tensors;   /* [n], names in `names` */
    const char **dtype_names; /* [n], the file's dtype string */
    char *names;
    st_index index;
} st_file;

struct ckv_safetensors {
    char *source; /* the file or the index named in messages about the whole checkpoint */
    int n_files;
    st_file *files;
    int n;
    ckv_st_tensor *tensors;   /* [n] */
    const char **dtype_names; /* [n] */
    st_index index;
};

static void st_file_free(st_file *f) {
    if (f->map) munmap(f->map, f->size);
    free(f->path);
    free(f->tensors);
    free(f->dtype_names);
    free(f->names);
    free(f->index.slots);
    memset(f, 0, sizeof *f);
}

/* A JSON integer in [0, 2^53]. */
static int st_json_uint(const ckv_json *v, uint64_t *out) {
    if (!ckv_json_is_number(v)) return 0;
    double d = ckv_json_number(v);
    if (!(d >= 0.0 && d <= ST_MAX_JSON_INT) || d != (double)(uint64_t)d) return 0;
    *out = (uint64_t)d;
    return 1;
}

static void st_format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, cap - k, "[");
    for (int i = 0; i < ndim && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%" PRId64, i ? ", " : "", shape[i]);
    if (k < cap) snprintf(buf + k, cap - k, "]");
}

typedef struct {
    uint64_t begin, end;
    int i;
} st_span;

static int st_span_cmp(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Validates one header entry into t (name set by the caller) and its span. */
static ckv_status st_parse_entry(const char *path, const char *name, const ckv_json *e, size_t data_size,
                                 const unsigned char *data, ckv_st_tensor *t, const char **dtype_name,
                                 st_span *span) {
    if (!ckv_json_is_object(e))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': header entry is not an object", path, name);
    const char *ds = ckv_json_string(ckv_json_get(e, "dtype"));
    if (!ds) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': missing or non-string dtype", path, name);
    const st_dtype_info *dt = st_dtype_find(ds);
    if (!dt)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: tensor '%.200s': unknown dtype '%.40s'", path, name, ds);
    t->dtype = dt->dtype;
    *dtype_name = dt->name;

    const ckv_json *sh = ckv_json_get(e, "shape");
    if (!ckv_json_is_array(sh))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': missing or non-list shape", path, name);
    int ndim = ckv_json_array_size(sh);
    if (ndim > CKV_TENSOR_MAX_DIMS)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: tensor '%.200s': %d dimensions (ckv reads at most %d)", path,
                         name, ndim, CKV_TENSOR_MAX_DIMS);
    t->ndim = ndim;
    uint64_t numel = 1;
    int overflow = 0;
    for (int d = 0; d < ndim; d++) {
        const ckv_json *v = ckv_json_array_at(sh, d);
        uint64_t n;
        if (!st_json_uint(v, &n)) {
            if (ckv_json_is_number(v) && ckv_json_number(v) < 0)
                return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': shape[%d] is negative (%g)", path, name,
                                 d, ckv_json_number(v));
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': shape[%d] is not a non-negative integer",
                             path, name, d);
        }
        t->shape[d] = (int64_t)n;
        if (n != 0 && numel > UINT64_MAX / n) overflow = 1;
        numel *= n;
    }
    for (int d = ndim; d < CKV_TENSOR_MAX_DIMS; d++) t->shape[d] = 1;
    char shape_s[128];
    st_format_shape(shape_s, sizeof shape_s, ndim, t->shape);

    const ckv_json *off = ckv_json_get(e, "data_offsets");
    uint64_t b, en;
    if (!ckv_json_is_array(off) || ckv_json_array_size(off) != 2 || !st_json_uint(ckv_json_array_at(off, 0), &b) ||
        !st_json_uint(ckv_json_array_at(off, 1), &en))
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: tensor '%.200s': data_offsets must be two non-negative integers [begin, end]", path,
                         name);
    if (b > en)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64
                         "] end before they begin", path, name, b, en);
    if (overflow || numel > UINT64_MAX / (uint64_t)dt->bits)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': shape %s overflows", path, name, shape_s);
    uint64_t bits = numel * (uint64_t)dt->bits;
    if (bits % 8 != 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': shape %s of %s is not a whole number of bytes",
                         path, name, shape_s, dt->name);
    if (bits / 8 != en - b)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: tensor '%.200s': shape %s of %s needs %" PRIu64 " bytes but data_offsets [%" PRIu64
                         ", %" PRIu64 "] hold %" PRIu64,
                         path, name, shape_s, dt->name, bits / 8, b, en, en - b);
    if (en > (uint64_t)data_size)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64
                         "] past end of file (%zu bytes of data after the header)",
                         path, name, b, en, data_size);
    t->data = data + b;
    t->nbytes = (size_t)(en - b);
    span->begin = b;
    span->end = en;
    return CKV_STATUS_OK;
}

/* Parses the header at map[8 .. 8 + hlen) into f's tensors. */
static ckv_status st_parse_header(st_file *f, const char *hdr, size_t hlen) {
    const char *path = f->path;
    if (memchr(hdr, '\0', hlen))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: header contains a NUL byte", path);
    ckv_json *root = NULL;
    st_span *spans = NULL;
    ckv_status s = ckv_json_parse_buffer(&root, hdr, hlen, path);
    if (s != CKV_STATUS_OK) return s;
    if (!ckv_json_is_object(root)) {
        s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: header is not a JSON object", path);
        goto done;
    }
    int n = 0;
    size_t name_bytes = 0;
    for (const ckv_json *c = ckv_json_first_child(root); c; c = ckv_json_next(c)) {
        const char *key = ckv_json_key(c);
        if (strcmp(key, "__metadata__") == 0) {
            if (!ckv_json_is_object(c)) {
                s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: __metadata__ is not an object", path);
                goto done;
            }
            for (const ckv_json *m = ckv_json_first_child(c); m; m = ckv_json_next(m))
                if (!ckv_json_is_string(m)) {
                    s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: __metadata__ value '%.200s' is not a string", path,
                                  ckv_json_key(m));
                    goto done;
                }
            continue;
        }
        n++;
        name_bytes += strlen(key) + 1;
    }

    f->tensors = calloc(n ? (size_t)n : 1, sizeof *f->tensors);
    f->dtype_names = calloc(n ? (size_t)n : 1, sizeof *f->dtype_names);
    f->names = malloc(name_bytes ? name_bytes : 1);
    spans = calloc(n ? (size_t)n : 1, sizeof *spans);
    if (!f->tensors || !f->dtype_names || !f->names || !spans) {
        s = ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory for %d tensor descriptors", path, n);
        goto done;
    }
    const unsigned char *data = (const unsigned char *)f->map + 8 + hlen;
    size_t data_size = f->size - 8 - hlen;
    char *np = f->names;
    int i = 0;
    for (const ckv_json *c = ckv_json_first_child(root); c; c = ckv_json_next(c)) {
        const char *key = ckv_json_key(c);
        if (strcmp(key, "__metadata__") == 0) continue;
        size_t len = strlen(key) + 1;
        memcpy(np, key, len);
        ckv_st_tensor *t = &f->tensors[i];
        t->name = np;
        t->file = 0;
        np += len;
        spans[i].i = i;
        CKV_TRY_GOTO(s, st_parse_entry(path, key, c, data_size, data, t, &f->dtype_names[i], &spans[i]), done);
        i++;
        f->n = i;
    }
    f->n = n;

    int dup = -1;
    CKV_TRY_GOTO(s, st_index_build(&f->index, f->tensors, n, &dup), done);
    if (dup >= 0) {
        s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': duplicate name in the header", path,
                      f->tensors[dup].name);
        goto done;
    }

    qsort(spans, (size_t)n, sizeof *spans, st_span_cmp);
    int prev = -1; /* the non-empty span reaching furthest so far */
    for (int k = 0; k < n; k++) {
        if (spans[k].begin == spans[k].end) continue;
        if (prev >= 0 && spans[k].begin < spans[prev].end) {
            const st_span *a = &spans[prev], *b = &spans[k];
            s = ckv_error(CKV_STATUS_ERR_FORMAT,
                          "%s: tensor '%.200s': data_offsets [%" PRIu64 ", %" PRIu64
                          "] overlap tensor '%.200s' [%" PRIu64 ", %" PRIu64 "]",
                          path, f->tensors[b->i].name, b->begin, b->end, f->tensors[a->i].name, a->begin, a->end);
            goto done;
        }
        if (prev < 0 || spans[k].end > spans[prev].end) prev = k;
    }
    /* the data region ends with the last tensor (as the reference reader demands): a header length
     * one byte off still parses when the JSON is padded, but shifts every tensor */
    uint64_t reach = prev >= 0 ? spans[prev].end : 0;
    if (reach != (uint64_t)data_size) {
        s = ckv_error(CKV_STATUS_ERR_FORMAT,
                      "%s: %" PRIu64 " bytes of data after the header, but the tensors end at byte %" PRIu64
                      " (wrong header length or data_offsets)", path, (uint64_t)data_size, reach);
        goto done;
    }
    s = CKV_STATUS_OK;
done:
    free(spans);
    ckv_json_free(root);
    return s;
}

static ckv_status st_file_open(st_file *f, const char *path, int file_index) {
    memset(f, 0, sizeof *f);
    f->path = strdup(path);
    if (!f->path) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", path);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: not a regular file", path);
    }
    if (sb.st_size < 8) {
        close(fd);
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: file is %lld bytes, shorter than the 8-byte header length", path,
                         (long long)sb.st_size);
    }
    if ((uint64_t)sb.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: file too large to map", path);
    }
    size_t size = (size_t)sb.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (map == MAP_FAILED)
        return ckv_error(CKV_STATUS_ERR_IO, "%s: mmap of %zu bytes failed: %s", path, size, strerror(e));
    f->map = map;
    f->size = size;

    const unsigned char *p = map;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen > (uint64_t)size - 8)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: header length %" PRIu64 " runs past end of file (%zu bytes)", path,
                         hlen, size);
    if (hlen > ST_MAX_HEADER)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: header length %" PRIu64 " is absurd (limit %" PRIu64 " bytes)",
                         path, hlen, ST_MAX_HEADER);
    CKV_TRY(st_parse_header(f, (const char *)p + 8, (size_t)hlen));
    for (int i = 0; i < f->n; i++) f->tensors[i].file = file_index;
    return CKV_STATUS_OK;
}

/* ---- public ------------------------------------------------------------------------------------ */

void ckv_safetensors_close(ckv_safetensors *st) {
    if (!st) return;
    if (st->files)
        for (int i = 0; i < st->n_files; i++) st_file_free(&st->files[i]);
    free(st->files);
    free(st->tensors);
    free(st->dtype_names);
    free(st->index.slots);
    free(st->source);
    free(st);
}

static ckv_status st_new(ckv_safetensors **out, const char *source, int n_files) {
    ckv_safetensors *st = calloc(1, sizeof *st);
    if (!st) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", source);
    *out = st;
    st->source = strdup(source);
    st->files = calloc((size_t)n_files, sizeof *st->files);
    if (!st->source || !st->files) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", source);
    st->n_files = n_files;
    return CKV_STATUS_OK;
}

/* Builds the checkpoint-wide list from file 0 (single-file case). */
static ckv_status st_adopt_single(ckv_safetensors *st) {
    const st_file *f = &st->files[0];
    size_t n = f->n ? (size_t)f->n : 1;
    st->tensors = malloc(n * sizeof *st->tensors);
    st->dtype_names = malloc(n * sizeof *st->dtype_names);
    if (!st->tensors || !st->dtype_names) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", f->path);
    if (f->n) {
        memcpy(st->tensors, f->tensors, (size_t)f->n * sizeof *st->tensors);
        memcpy(st->dtype_names, f->dtype_names, (size_t)f->n * sizeof *st->dtype_names);
    }
    st->n = f->n;
    int dup;
    return st_index_build(&st->index, st->tensors, st->n, &dup); /* no duplicates: checked per file */
}

ckv_status ckv_safetensors_open_file(ckv_safetensors **out, const char *path) {
    if (!out || !path) return ckv_error(CKV_STATUS_ERR_ARG, "safetensors: NULL argument");
    *out = NULL;
    ckv_safetensors *st = NULL;
    ckv_status s;
    CKV_TRY_GOTO(s, st_new(&st, path, 1), fail);
    CKV_TRY_GOTO(s, st_file_open(&st->files[0], path, 0), fail);
    CKV_TRY_GOTO(s, st_adopt_single(st), fail);
    *out = st;
    return CKV_STATUS_OK;
fail:
    ckv_safetensors_close(st);
    return s;
}

static int st_plain_file_name(const char *s) {
    return s[0] != '\0' && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..");
}

static ckv_status st_open_index(ckv_safetensors **out, const char *dir, const char *index_path) {
    ckv_json *root = NULL;
    ckv_safetensors *st = NULL;
    const char **shards = NULL; /* unique shard names, first-appearance order */
    int *entry_shard = NULL;
    char *shard_path = NULL;
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_json_parse_file(&root, index_path), fail);
    const ckv_json *wm = ckv_json_get(root, "weight_map");
    if (!ckv_json_is_object(wm)) {
        s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing or non-object 'weight_map'", index_path);
        goto fail;
    }
    int n = 0;
    for (const ckv_json *c = ckv_json_first_child(wm); c; c = ckv_json_next(c)) n++;
    if (n == 0) {
        s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: 'weight_map' is empty", index_path);
        goto fail;
    }
    shards = calloc((size_t)n, sizeof *shards);
    entry_shard = calloc((size_t)n, sizeof *entry_shard);
    if (!shards || !entry_shard) {
        s = ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", index_path);
        goto fail;
    }
    int n_shards = 0, i = 0;
    size_t longest = 0;
    for (const ckv_json *c = ckv_json_first_child(wm); c; c = ckv_json_next(c), i++) {
        const char *file = ckv_json_string(c);
        if (!file) {
            s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': shard name is not a string", index_path,
                          ckv_json_key(c));
            goto fail;
        }
        if (!st_plain_file_name(file)) {
            s = ckv_error(CKV_STATUS_ERR_FORMAT,
                          "%s: tensor '%.200s': shard '%.200s' is not a plain file name in the model directory",
                          index_path, ckv_json_key(c), file);
            goto fail;
        }
        int k = 0;
        while (k < n_shards && strcmp(shards[k], file) != 0) k++;
        if (k == n_shards) {
            shards[n_shards++] = file;
            if (strlen(file) > longest) longest = strlen(file);
        }
        entry_shard[i] = k;
    }

    CKV_TRY_GOTO(s, st_new(&st, index_path, n_shards), fail);
    size_t cap = strlen(dir) + longest + 2;
    shard_path = malloc(cap);
    st->tensors = malloc((size_t)n * sizeof *st->tensors);
    st->dtype_names = malloc((size_t)n * sizeof *st->dtype_names);
    if (!shard_path || !st->tensors || !st->dtype_names) {
        s = ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", index_path);
        goto fail;
    }
    for (int k = 0; k < n_shards; k++) {
        snprintf(shard_path, cap, "%s/%s", dir, shards[k]);
        CKV_TRY_GOTO(s, st_file_open(&st->files[k], shard_path, k), fail);
    }
    i = 0;
    for (const ckv_json *c = ckv_json_first_child(wm); c; c = ckv_json_next(c), i++) {
        const st_file *f = &st->files[entry_shard[i]];
        int j = st_index_find(&f->index, f->tensors, ckv_json_key(c));
        if (j < 0) {
            s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': not found in its shard %s", index_path,
                          ckv_json_key(c), f->path);
            goto fail;
        }
        st->tensors[i] = f->tensors[j];
        st->dtype_names[i] = f->dtype_names[j];
        st->n = i + 1;
    }
    int dup = -1;
    CKV_TRY_GOTO(s, st_index_build(&st->index, st->tensors, st->n, &dup), fail);
    if (dup >= 0) {
        s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': listed twice in 'weight_map'", index_path,
                      st->tensors[dup].name);
        goto fail;
    }
    free(shards);
    free(entry_shard);
    free(shard_path);
    ckv_json_free(root);
    *out = st;
    return CKV_STATUS_OK;
fail:
    free(shards);
    free(entry_shard);
    free(shard_path);
    ckv_json_free(root);
    ckv_safetensors_close(st);
    return s;
}

ckv_status ckv_safetensors_open_dir(ckv_safetensors **out, const char *dir) {
    if (!out || !dir) return ckv_error(CKV_STATUS_ERR_ARG, "safetensors: NULL argument");
    *out = NULL;
    size_t cap = strlen(dir) + sizeof "/" ST_INDEX_NAME;
    char *path = malloc(cap);
    if (!path) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", dir);
    ckv_status s;
    struct stat sb;
    snprintf(path, cap, "%s/%s", dir, ST_INDEX_NAME);
    if (stat(path, &sb) == 0) {
        s = st_open_index(out, dir, path);
    } else {
        snprintf(path, cap, "%s/%s", dir, ST_SINGLE_NAME);
        if (stat(path, &sb) == 0)
            s = ckv_safetensors_open_file(out, path);
        else
            s = ckv_error(CKV_STATUS_ERR_IO, "%s: neither %s nor %s found", dir, ST_INDEX_NAME, ST_SINGLE_NAME);
    }
    free(path);
    return s;
}

int ckv_safetensors_count(const ckv_safetensors *st) { return st ? st->n : 0; }

const ckv_st_tensor *ckv_safetensors_at(const ckv_safetensors *st, int i) {
    if (!st || i < 0 || i >= st->n) return NULL;
    return &st->tensors[i];
}

const ckv_st_tensor *ckv_safetensors_find(const ckv_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    int i = st_index_find(&st->index, st->tensors, name);
    return i < 0 ? NULL : &st->tensors[i];
}

const char *ckv_safetensors_file_path(const ckv_safetensors *st, int file) {
    if (!st || file < 0 || file >= st->n_files) return NULL;
    return st->files[file].path;
}

/* Converts n elements at src (any alignment) to fp32. */
static void st_convert(float *dst, const unsigned char *src, ckv_dtype t, size_t n) {
    size_t esize = ckv_dtype_size(t);
    if (t == CKV_DTYPE_F32 || ((uintptr_t)src % esize) == 0) {
        ckv_convert_to_f32(dst, src, t, n); /* F32 goes through memcpy */
        return;
    }
    uint16_t bounce[1024]; /* [chunk] aligned copy of a misaligned half-precision run */
    while (n) {
        size_t k = n < 1024 ? n : 1024;
        memcpy(bounce, src, k * esize);
        ckv_convert_to_f32(dst, bounce, t, k);
        dst += k;
        src += k * esize;
        n -= k;
    }
}

/* Refuses a tensor slice that holds NaN or infinity: such a checkpoint is corrupt and would only
 * produce garbage (or all-zero tokens) later. */
static ckv_status st_check_finite(const char *path, const char *name, const float *x, size_t n) {
    int64_t bad = ckv_find_nonfinite_f32(x, n);
    if (bad < 0) return CKV_STATUS_OK;
    return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': element %" PRId64 " of the slice read is %s (corrupt "
                     "weights)", path, name, bad, x[bad] != x[bad] ? "NaN" : "infinite");
}

/* Tells the OS the mapped pages of a tensor that was just converted are not needed any more, so
 * loading a checkpoint does not hold the file's pages and our converted copy resident at once. */
static void st_drop_pages(const ckv_st_tensor *t) {
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || t->nbytes == 0) return;
    uintptr_t a = (uintptr_t)t->data & ~((uintptr_t)page - 1);
    uintptr_t b = (uintptr_t)t->data + t->nbytes;
    madvise((void *)a, b - a, MADV_DONTNEED);
}

ckv_status ckv_safetensors_read_f32(const ckv_safetensors *st, const char *name, int ndim, const int64_t *shape,
                                    int64_t row0, int64_t row1, int64_t col0, int64_t col1, float *dst) {
    if (!st || !name || !dst) return ckv_error(CKV_STATUS_ERR_ARG, "safetensors: NULL argument reading '%.200s'",
                                               name ? name : "(null)");
    int i = st_index_find(&st->index, st->tensors, name);
    if (i < 0) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s': not in the checkpoint", st->source, name);
    const ckv_st_tensor *t = &st->tensors[i];
    const char *path = st->files[t->file].path;
    if (t->dtype != CKV_DTYPE_F32 && t->dtype != CKV_DTYPE_F16 && t->dtype != CKV_DTYPE_BF16)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: tensor '%.200s': dtype %s cannot be read as F32 (only F32, "
                         "F16 and BF16)", path, name, st->dtype_names[i]);
    if (shape) {
        int same = ndim == t->ndim;
        for (int d = 0; same && d < ndim; d++) same = shape[d] == t->shape[d];
        if (!same) {
            char want[128], have[128];
            if (ndim < 0 || ndim > CKV_TENSOR_MAX_DIMS)
                snprintf(want, sizeof want, "(%d dimensions)", ndim);
            else
                st_format_shape(want, sizeof want, ndim, shape);
            st_format_shape(have, sizeof have, t->ndim, t->shape);
            return ckv_error(CKV_STATUS_ERR_SHAPE, "%s: tensor '%.200s': shape %s in the file, expected %s", path,
                             name, have, want);
        }
    }
    size_t esize = ckv_dtype_size(t->dtype);
    const unsigned char *src = t->data;
    if (row1 < 0 && col1 < 0) {
        if (row0 != 0 || col0 != 0)
            return ckv_error(CKV_STATUS_ERR_ARG, "%s: tensor '%.200s': row0/col0 must be 0 when reading it whole",
                             path, name);
        st_convert(dst, src, t->dtype, t->nbytes / esize);
        st_drop_pages(t);
        return st_check_finite(path, name, dst, t->nbytes / esize);
    }
    if (t->ndim != 2)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s: tensor '%.200s': a row/column slice needs a 2-D tensor (it has %d "
                         "dimensions)", path, name, t->ndim);
    int64_t R = t->shape[0], C = t->shape[1];
    int64_t r1 = row1 < 0 ? R : row1, c1 = col1 < 0 ? C : col1;
    if (row1 < 0 && row0 != 0) r1 = -1; /* "all rows" starts at 0 */
    if (col1 < 0 && col0 != 0) c1 = -1;
    if (row0 < 0 || r1 < row0 || r1 > R || col0 < 0 || c1 < col0 || c1 > C)
        return ckv_error(CKV_STATUS_ERR_RANGE,
                         "%s: tensor '%.200s': slice rows [%" PRId64 ", %" PRId64 ") cols [%" PRId64 ", %" PRId64
                         ") outside its shape [%" PRId64 ", %" PRId64 "]",
                         path, name, row0, row1, col0, col1, R, C);
    size_t w = (size_t)(c1 - col0);
    if (col0 == 0 && c1 == C) {
        st_convert(dst, src + (size_t)row0 * (size_t)C * esize, t->dtype, (size_t)(r1 - row0) * w);
        st_drop_pages(t);
        return st_check_finite(path, name, dst, (size_t)(r1 - row0) * w);
    }
    for (int64_t r = row0; r < r1; r++)
        st_convert(dst + (size_t)(r - row0) * w, src + ((size_t)r * (size_t)C + (size_t)col0) * esize, t->dtype, w);
    st_drop_pages(t);
    return st_check_finite(path, name, dst, (size_t)(r1 - row0) * w);
}

void ckv_safetensors_release_pages(ckv_safetensors *st) {
    if (!st || !st->files) return;
    for (int i = 0; i < st->n_files; i++)
        if (st->files[i].map) madvise(st->files[i].map, st->files[i].size, MADV_DONTNEED);
}
