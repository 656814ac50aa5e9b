/* kv_file.c - KV cache files (see kv_file.h). Layout, little-endian:
 *   "CKVCACHE" | u32 version | u32 meta_len | meta JSON | u32 n_layers | u32 n_kv | u32 head_dim |
 *   for each layer, for each head: u32 len | i32 pos[len] | f32 k[len][head_dim] | f32 v[len][head_dim] |
 *   u32 n_tail | f32 tail[n_tail] (version 2 on; absent in version 1) | u64 FNV-1a of all the bytes before it.
 * Loading distrusts the file: it must be a regular file; the header length, the shape and every
 * head length are checked against the file's size and the model before anything is allocated (a
 * walk over the lengths must end exactly at the checksum), the checksum is verified over the whole
 * file before rows are reserved, and then every row is checked (positions inside the context and
 * ascending per head, keys and values finite) before it is placed. Saving goes through
 * core/atomic_file (regular targets only, fsync of file and directory). */
#define _POSIX_C_SOURCE 200809L
#include "kv/kv_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/atomic_file.h"
#include "core/fastmath.h"

static const char ckv_kv_magic[8] = {'C', 'K', 'V', 'C', 'A', 'C', 'H', 'E'};

typedef struct {
    FILE *f;
    const char *path;
    uint64_t hash;
    uint64_t size;    /* of the file being read (0 when writing) */
    uint32_t version; /* of the file being read */
} kv_stream;

static void fnv(uint64_t *h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) *h = (*h ^ b[i]) * 0x100000001b3ull;
}

static ckv_status put(kv_stream *s, const void *p, size_t n) {
    if (n && fwrite(p, 1, n, s->f) != n) return ckv_error(CKV_STATUS_ERR_IO, "%s: write failed: %s", s->path, strerror(errno));
    fnv(&s->hash, p, n);
    return CKV_STATUS_OK;
}

static ckv_status get(kv_stream *s, void *p, size_t n, const char *what) {
    if (n && fread(p, 1, n, s->f) != n)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: truncated cache file (reading %s)", s->path, what);
    return CKV_STATUS_OK; /* the checksum of a file being read is verified in one pass (kv_verify_checksum) */
}

static ckv_status put_u32(kv_stream *s, uint32_t v) { return put(s, &v, 4); }

static ckv_status get_u32(kv_stream *s, uint32_t *v, const char *what) { return get(s, v, 4, what); }

static ckv_status write_all(const ckv_kv_cache *c, kv_stream *s, const char *meta, const float *tail, uint32_t n_tail) {
    size_t meta_len = strlen(meta);
    CKV_TRY(put(s, ckv_kv_magic, 8));
    CKV_TRY(put_u32(s, CKV_KV_FILE_VERSION));
    CKV_TRY(put_u32(s, (uint32_t)meta_len));
    CKV_TRY(put(s, meta, meta_len));
    CKV_TRY(put_u32(s, (uint32_t)c->n_layers));
    CKV_TRY(put_u32(s, (uint32_t)c->n_kv));
    CKV_TRY(put_u32(s, (uint32_t)c->head_dim));
    size_t d = (size_t)c->head_dim, maxlen = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int h = 0; h < c->n_kv; h++)
            if ((size_t)c->layers[l].len[h] > maxlen) maxlen = (size_t)c->layers[l].len[h];
    /* rows are written as fp32 whatever the cache stores (files move between backends) */
    float *kb = NULL, *vb = NULL; // [maxlen, d]
    int32_t *pb = NULL;           // [maxlen]
    ckv_status st = ckv_alloc((void **)&kb, (maxlen ? maxlen : 1) * d * sizeof(float), "cache save buffer");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&vb, (maxlen ? maxlen : 1) * d * sizeof(float), "cache save buffer");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&pb, (maxlen ? maxlen : 1) * sizeof(int32_t), "cache save buffer");
    for (int l = 0; l < c->n_layers && st == CKV_STATUS_OK; l++) {
        const ckv_kv_layer *kl = &c->layers[l];
        for (int h = 0; h < c->n_kv && st == CKV_STATUS_OK; h++) {
            size_t n = (size_t)kl->len[h];
            st = put_u32(s, (uint32_t)n);
            if (st == CKV_STATUS_OK) st = ckv_kv_head_read(c, l, h, kb, vb, pb);
            if (st == CKV_STATUS_OK) st = put(s, pb, n * sizeof(int32_t));
            if (st == CKV_STATUS_OK) st = put(s, kb, n * d * sizeof(float));
            if (st == CKV_STATUS_OK) st = put(s, vb, n * d * sizeof(float));
        }
    }
    ckv_free(kb);
    ckv_free(vb);
    ckv_free(pb);
    if (st == CKV_STATUS_OK) st = put_u32(s, n_tail);
    if (st == CKV_STATUS_OK) st = put(s, tail, (size_t)n_tail * sizeof(float));
    if (st == CKV_STATUS_OK) {
        uint64_t h = s->hash;
        if (fwrite(&h, 1, 8, s->f) != 8) st = ckv_error(CKV_STATUS_ERR_IO, "%s: write failed", s->path);
    }
    return st;
}

ckv_status ckv_kv_cache_save(const ckv_kv_cache *c, const char *path, const char *meta_json, const float *tail, uint32_t n_tail) {
    if (n_tail && !tail) return ckv_error(CKV_STATUS_ERR_ARG, "%s: a tail of %u values without data", path, n_tail);
    ckv_atomic_file af;
    CKV_TRY(ckv_atomic_file_open(&af, path, "--save-cache"));
    kv_stream s = {af.f, path, 0xcbf29ce484222325ull, 0, CKV_KV_FILE_VERSION};
    ckv_status st = write_all(c, &s, meta_json ? meta_json : "{}", tail, n_tail);
    if (st != CKV_STATUS_OK) {
        ckv_atomic_file_abort(&af);
        return st;
    }
    return ckv_atomic_file_commit(&af);
}

/* Opens path for reading only when it is a regular file: opened non-blocking and fstat'ed first, so
 * a FIFO, device or directory planted in its place is refused at once instead of blocking the reader
 * (blocking reads are restored for the file itself). */
static ckv_status open_regular(const char *path, FILE **out, uint64_t *size) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: not a regular file", path);
    }
    int fl = fcntl(fd, F_GETFL);
    FILE *f = fl >= 0 && fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) == 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        close(fd);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: %s", path, strerror(errno));
    }
    *out = f;
    *size = (uint64_t)sb.st_size;
    return CKV_STATUS_OK;
}

/* Opens a cache file for reading: a regular file of at least the fixed-size parts. */
static ckv_status kv_open(kv_stream *s, const char *path) {
    memset(s, 0, sizeof *s);
    s->path = path;
    s->hash = 0xcbf29ce484222325ull;
    return open_regular(path, &s->f, &s->size);
}

ckv_status ckv_kv_file_checksum(const char *path, uint64_t *sum) {
    FILE *f = NULL;
    uint64_t size = 0;
    *sum = 0;
    CKV_TRY(open_regular(path, &f, &size));
    int ok = size >= 8 && fseek(f, -8, SEEK_END) == 0 && fread(sum, 1, 8, f) == 8;
    fclose(f);
    return ok ? CKV_STATUS_OK : ckv_error(CKV_STATUS_ERR_FORMAT, "%s: truncated cache file (no checksum)", path);
}

/* Bytes between the stream's position and the checksum trailer. */
static uint64_t kv_left(const kv_stream *s) {
    long at = ftell(s->f);
    return at < 0 || (uint64_t)at + 8 > s->size ? 0 : s->size - 8 - (uint64_t)at;
}

/* Hashes the whole file before the trailer in blocks (nothing sized by the file's own counts) and
 * compares with the trailer; leaves the stream at `resume`. */
static ckv_status kv_verify_checksum(kv_stream *s, long resume) {
    unsigned char block[1 << 16];
    uint64_t h = 0xcbf29ce484222325ull, left = s->size - 8, got = 0;
    if (fseek(s->f, 0, SEEK_SET) != 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: cannot seek", s->path);
    while (left) {
        size_t k = left < sizeof block ? (size_t)left : sizeof block;
        if (fread(block, 1, k, s->f) != k) return ckv_error(CKV_STATUS_ERR_IO, "%s: read error", s->path);
        fnv(&h, block, k);
        left -= k;
    }
    if (fread(&got, 1, 8, s->f) != 8) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: truncated cache file (no checksum)", s->path);
    if (got != h) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: checksum mismatch (the file is corrupted)", s->path);
    if (fseek(s->f, resume, SEEK_SET) != 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: cannot seek", s->path);
    return CKV_STATUS_OK;
}

static ckv_status read_header(kv_stream *s, char **meta) {
    char magic[8];
    uint32_t version = 0, meta_len = 0;
    *meta = NULL;
    CKV_TRY(get(s, magic, 8, "the magic"));
    if (memcmp(magic, ckv_kv_magic, 8) != 0) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: not a ckv cache file (bad magic)", s->path);
    CKV_TRY(get_u32(s, &version, "the version"));
    if (version < 1 || version > CKV_KV_FILE_VERSION)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: cache file version %u, this ckv reads versions 1 to %d", s->path, version,
                         CKV_KV_FILE_VERSION);
    s->version = version;
    CKV_TRY(get_u32(s, &meta_len, "the header length"));
    if (meta_len > (1u << 20)) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: header of %u bytes is implausible", s->path, meta_len);
    if (meta_len > kv_left(s))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: truncated cache file (header of %u bytes, %llu left)", s->path, meta_len,
                         (unsigned long long)kv_left(s));
    char *m = malloc((size_t)meta_len + 1);
    if (!m) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", s->path);
    ckv_status st = get(s, m, meta_len, "the header");
    if (st != CKV_STATUS_OK) {
        free(m);
        return st;
    }
    m[meta_len] = '\0';
    *meta = m;
    return CKV_STATUS_OK;
}

ckv_status ckv_kv_file_read_meta(const char *path, char **meta_json) {
    kv_stream s;
    *meta_json = NULL;
    ckv_status st = kv_open(&s, path);
    if (st == CKV_STATUS_OK) st = read_header(&s, meta_json);
    if (s.f) fclose(s.f);
    return st;
}

/* Walks every head length from the stream's position to the checksum without reading rows: each
 * length at most `max_rows` and inside the file, then the tail (version 2 on) of exactly n_tail
 * values, the walk ending exactly at the trailer. */
static ckv_status walk_lengths(kv_stream *s, int n_layers, int n_kv, size_t d, int max_rows, uint32_t n_tail) {
    uint64_t row_bytes = 4 + 8 * (uint64_t)d;
    for (int l = 0; l < n_layers; l++)
        for (int h = 0; h < n_kv; h++) {
            uint32_t n = 0;
            if (kv_left(s) < 4 || fread(&n, 1, 4, s->f) != 4)
                return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: truncated cache file (layer %d head %d: no length)", s->path, l, h);
            if (n > (uint32_t)max_rows)
                return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: layer %d head %d holds %u rows, more than the %d-token context", s->path,
                                 l, h, n, max_rows);
            uint64_t need = (uint64_t)n * row_bytes;
            if (need > kv_left(s))
                return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: truncated cache file (layer %d head %d needs %llu bytes, %llu left)",
                                 s->path, l, h, (unsigned long long)need, (unsigned long long)kv_left(s));
            if (fseek(s->f, (long)need, SEEK_CUR) != 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: cannot seek", s->path);
        }
    uint32_t nt = 0;
    if (s->version >= 2 && (kv_left(s) < 4 || fread(&nt, 1, 4, s->f) != 4))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: truncated cache file (no tail length)", s->path);
    if (nt != n_tail)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: the file's tail holds %u values, expected %u", s->path, nt, n_tail);
    if ((uint64_t)nt * sizeof(float) > kv_left(s))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: truncated cache file (a tail of %u values, %llu bytes left)", s->path, nt,
                         (unsigned long long)kv_left(s));
    if (fseek(s->f, (long)((uint64_t)nt * sizeof(float)), SEEK_CUR) != 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: cannot seek", s->path);
    if (kv_left(s) != 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: %llu unexpected bytes before the checksum", s->path,
                         (unsigned long long)kv_left(s));
    return CKV_STATUS_OK;
}

/* Checks one head's rows as read: positions inside [0, ctx_len) and ascending (for a full cache,
 * exactly 0 .. ctx_len-1), keys and values finite. */
static ckv_status check_rows(const kv_stream *s, int l, int h, const int32_t *pos, const float *k, const float *v,
                             uint32_t n, size_t d, int ctx_len, int full) {
    if (full && n != (uint32_t)ctx_len)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: layer %d head %d holds %u rows, but the uncompressed context has %d tokens",
                         s->path, l, h, n, ctx_len);
    for (uint32_t i = 0; i < n; i++) {
        int32_t p = pos[i];
        if (p < 0 || p >= ctx_len || (i > 0 && p <= pos[i - 1]) || (full && p != (int32_t)i))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: layer %d head %d row %u: position %d %s", s->path, l, h, i, (int)p,
                             p < 0 || p >= ctx_len ? "is outside the context" : "breaks the ascending order");
    }
    int64_t bad = ckv_find_nonfinite_f32(k, n * d);
    if (bad >= 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: layer %d head %d row %lld: non-finite key", s->path, l, h, (long long)(bad / (int64_t)d));
    bad = ckv_find_nonfinite_f32(v, n * d);
    if (bad >= 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: layer %d head %d row %lld: non-finite value", s->path, l, h,
                         (long long)(bad / (int64_t)d));
    return CKV_STATUS_OK;
}

static ckv_status read_body(ckv_kv_cache *c, kv_stream *s, int room, int ctx_len, int full, float *tail, uint32_t n_tail) {
    uint32_t nl = 0, nkv = 0, hd = 0;
    CKV_TRY(get_u32(s, &nl, "the shape"));
    CKV_TRY(get_u32(s, &nkv, "the shape"));
    CKV_TRY(get_u32(s, &hd, "the shape"));
    if ((int64_t)nl != c->n_layers || (int64_t)nkv != c->n_kv || (int64_t)hd != c->head_dim)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "%s: cache of %u layers x %u KV heads x %u dims, the model needs %d x %d x %d",
                         s->path, nl, nkv, hd, c->n_layers, c->n_kv, c->head_dim);
    if (nkv > 1024) return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: more than 1024 KV heads", s->path);
    size_t d = hd;
    long body = ftell(s->f);
    if (body < 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: cannot tell the position", s->path);
    CKV_TRY(walk_lengths(s, (int)nl, (int)nkv, d, ctx_len, n_tail));
    CKV_TRY(kv_verify_checksum(s, body));
    /* from here on the counts are the writer's: the sizes were checked, rows are checked as read */
    ckv_status st = CKV_STATUS_OK;
    int32_t *lens = NULL, *pos = NULL, *all_rows = NULL;
    float *k = NULL, *v = NULL;
    size_t rows_cap = (size_t)(ctx_len > 0 ? ctx_len : 1);
    CKV_TRY_GOTO(st, ckv_alloc((void **)&lens, (size_t)nkv * sizeof(int32_t), "cache load lengths"), out);
    CKV_TRY_GOTO(st, ckv_alloc((void **)&pos, rows_cap * sizeof(int32_t), "cache load positions"), out);
    CKV_TRY_GOTO(st, ckv_alloc((void **)&k, rows_cap * d * sizeof(float), "cache load keys"), out);   // [ctx_len, d]
    CKV_TRY_GOTO(st, ckv_alloc((void **)&v, rows_cap * d * sizeof(float), "cache load values"), out); // [ctx_len, d]
    CKV_TRY_GOTO(st, ckv_alloc((void **)&all_rows, (size_t)nkv * rows_cap * sizeof(int32_t), "rows"), out); // [nkv, ctx_len]
    for (size_t i = 0; i < (size_t)nkv * rows_cap; i++) all_rows[i] = (int32_t)(i % rows_cap);
    for (int l = 0; l < c->n_layers && st == CKV_STATUS_OK; l++) {
        long start = ftell(s->f);
        int maxlen = 0;
        for (int h = 0; h < (int)nkv && st == CKV_STATUS_OK; h++) { /* lengths (checked by the walk) */
            uint32_t n = 0;
            st = get_u32(s, &n, "a head length");
            lens[h] = (int32_t)n;
            maxlen = lens[h] > maxlen ? lens[h] : maxlen;
            if (st == CKV_STATUS_OK && fseek(s->f, (long)((uint64_t)n * (4 + 8 * (uint64_t)d)), SEEK_CUR) != 0)
                st = ckv_error(CKV_STATUS_ERR_IO, "%s: cannot seek", s->path);
        }
        if (st == CKV_STATUS_OK && fseek(s->f, start, SEEK_SET) != 0) st = ckv_error(CKV_STATUS_ERR_IO, "%s: cannot seek", s->path);
        /* reserve a ragged pool (head h gets lens[h] + room rows after the compaction below) */
        if (st == CKV_STATUS_OK) st = ckv_kv_layer_reserve(c, l, maxlen > 0 ? maxlen : 1);
        int32_t keep_n[1024];
        for (int h = 0; h < (int)nkv && st == CKV_STATUS_OK; h++) {
            uint32_t n = 0;
            st = get_u32(s, &n, "a head length");
            if (st == CKV_STATUS_OK && n != (uint32_t)lens[h])
                st = ckv_error(CKV_STATUS_ERR_IO, "%s: the file changed while it was read", s->path);
            size_t bytes = (size_t)n * d * sizeof(float);
            if (st == CKV_STATUS_OK) st = get(s, pos, (size_t)n * sizeof(int32_t), "positions");
            if (st == CKV_STATUS_OK) st = get(s, k, bytes, "keys");
            if (st == CKV_STATUS_OK) st = get(s, v, bytes, "values");
            if (st == CKV_STATUS_OK) st = check_rows(s, l, h, pos, k, v, n, d, ctx_len, full);
            if (st == CKV_STATUS_OK) st = ckv_kv_head_write(c, l, h, k, v, pos, (int)n); /* converts to the cache dtype */
            keep_n[h] = (int32_t)n;
        }
        if (st != CKV_STATUS_OK) break;
        /* shrink to exactly the rows + room (compact keeps every row of each head) */
        st = ckv_kv_layer_compact(c, l, all_rows, (int)rows_cap, keep_n, room);
    }
    uint32_t nt = 0; /* the tail (its length checked by the walk) */
    if (st == CKV_STATUS_OK && s->version >= 2) st = get_u32(s, &nt, "the tail length");
    if (st == CKV_STATUS_OK && nt != n_tail) st = ckv_error(CKV_STATUS_ERR_IO, "%s: the file changed while it was read", s->path);
    if (st == CKV_STATUS_OK) st = get(s, tail, (size_t)n_tail * sizeof(float), "the tail");
    if (st == CKV_STATUS_OK && n_tail && ckv_find_nonfinite_f32(tail, n_tail) >= 0)
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: non-finite value %lld of the tail", s->path, (long long)ckv_find_nonfinite_f32(tail, n_tail));
out:
    ckv_free(all_rows);
    ckv_free(v);
    ckv_free(k);
    ckv_free(pos);
    ckv_free(lens);
    return st;
}

ckv_status ckv_kv_cache_load(ckv_kv_cache *c, const char *path, int room, int ctx_len, int full, float *tail, uint32_t n_tail,
                             char **meta_json) {
    kv_stream s;
    *meta_json = NULL;
    if (ctx_len < 1) return ckv_error(CKV_STATUS_ERR_ARG, "%s: context length %d", path, ctx_len);
    ckv_status st = kv_open(&s, path);
    if (st == CKV_STATUS_OK) st = read_header(&s, meta_json);
    if (st == CKV_STATUS_OK) st = read_body(c, &s, room, ctx_len, full, tail, n_tail);
    if (s.f) fclose(s.f);
    if (st != CKV_STATUS_OK) {
        free(*meta_json);
        *meta_json = NULL;
    }
    return st;
}
