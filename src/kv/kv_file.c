/* kv_file.c - KV cache files (see kv_file.h). Layout, little-endian:
 *   "CKVCACHE" | u32 version | u32 meta_len | meta JSON | u32 n_layers | u32 n_kv | u32 head_dim |
 *   for each layer, for each head: u32 len | i32 pos[len] | f32 k[len][head_dim] | f32 v[len][head_dim] |
 *   u64 FNV-1a of all the bytes before it. */
#define _POSIX_C_SOURCE 200809L
#include "kv/kv_file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

static const char ckv_kv_magic[8] = {'C', 'K', 'V', 'C', 'A', 'C', 'H', 'E'};

typedef struct {
    FILE *f;
    const char *path;
    uint64_t hash;
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
    fnv(&s->hash, p, n);
    return CKV_STATUS_OK;
}

static ckv_status put_u32(kv_stream *s, uint32_t v) { return put(s, &v, 4); }

static ckv_status get_u32(kv_stream *s, uint32_t *v, const char *what) { return get(s, v, 4, what); }

static ckv_status write_all(const ckv_kv_cache *c, kv_stream *s, const char *meta) {
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
    if (st == CKV_STATUS_OK) {
        uint64_t h = s->hash;
        if (fwrite(&h, 1, 8, s->f) != 8) st = ckv_error(CKV_STATUS_ERR_IO, "%s: write failed", s->path);
    }
    return st;
}

ckv_status ckv_kv_cache_save(const ckv_kv_cache *c, const char *path, const char *meta_json) {
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return ckv_error(CKV_STATUS_ERR_ARG, "--save-cache: path too long");
    kv_stream s = {fopen(tmp, "wb"), path, 0xcbf29ce484222325ull};
    if (!s.f) return ckv_error(CKV_STATUS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    ckv_status st = write_all(c, &s, meta_json ? meta_json : "{}");
    if (fclose(s.f) != 0 && st == CKV_STATUS_OK) st = ckv_error(CKV_STATUS_ERR_IO, "%s: write failed", path);
    if (st == CKV_STATUS_OK && rename(tmp, path) != 0)
        st = ckv_error(CKV_STATUS_ERR_IO, "%s: cannot move the saved cache into place: %s", path, strerror(errno));
    if (st != CKV_STATUS_OK) remove(tmp);
    return st;
}

static ckv_status read_header(kv_stream *s, char **meta) {
    char magic[8];
    uint32_t version = 0, meta_len = 0;
    *meta = NULL;
    CKV_TRY(get(s, magic, 8, "the magic"));
    if (memcmp(magic, ckv_kv_magic, 8) != 0) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: not a ckv cache file (bad magic)", s->path);
    CKV_TRY(get_u32(s, &version, "the version"));
    if (version != CKV_KV_FILE_VERSION)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: cache file version %u, this ckv reads version %d", s->path, version,
                         CKV_KV_FILE_VERSION);
    CKV_TRY(get_u32(s, &meta_len, "the header length"));
    if (meta_len > (1u << 20)) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: header of %u bytes is implausible", s->path, meta_len);
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
    kv_stream s = {fopen(path, "rb"), path, 0xcbf29ce484222325ull};
    *meta_json = NULL;
    if (!s.f) return ckv_error(CKV_STATUS_ERR_IO, "%s: %s", path, strerror(errno));
    ckv_status st = read_header(&s, meta_json);
    fclose(s.f);
    return st;
}

static ckv_status read_body(ckv_kv_cache *c, kv_stream *s, int room) {
    uint32_t nl = 0, nkv = 0, hd = 0;
    CKV_TRY(get_u32(s, &nl, "the shape"));
    CKV_TRY(get_u32(s, &nkv, "the shape"));
    CKV_TRY(get_u32(s, &hd, "the shape"));
    if ((int)nl != c->n_layers || (int)nkv != c->n_kv || (int)hd != c->head_dim)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "%s: cache of %u layers x %u KV heads x %u dims, the model needs %d x %d x %d",
                         s->path, nl, nkv, hd, c->n_layers, c->n_kv, c->head_dim);
    size_t d = hd;
    ckv_status st = CKV_STATUS_OK;
    int32_t *lens = NULL;
    float *buf = NULL;
    size_t cap = 0;
    CKV_TRY(ckv_alloc((void **)&lens, (size_t)nkv * sizeof(int32_t), "cache load lengths"));
    for (int l = 0; l < c->n_layers && st == CKV_STATUS_OK; l++) {
        /* first pass over this layer's heads is not possible (stream), so read head by head into a
         * host staging buffer and place rows after reserving the layer from the first length */
        long start = ftell(s->f);
        uint64_t hash_at_start = s->hash;
        for (int h = 0; h < (int)nkv && st == CKV_STATUS_OK; h++) { /* lengths: skip over the rows */
            uint32_t n = 0;
            st = get_u32(s, &n, "a head length");
            if (st != CKV_STATUS_OK) break;
            if (n > (1u << 28)) st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: layer %d head %d length %u is implausible", s->path, l, h, n);
            lens[h] = (int32_t)n;
            if (st == CKV_STATUS_OK && fseek(s->f, (long)(n * (4 + 8 * d)), SEEK_CUR) != 0)
                st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: truncated cache file", s->path);
        }
        if (st != CKV_STATUS_OK) break;
        if (fseek(s->f, start, SEEK_SET) != 0) {
            st = ckv_error(CKV_STATUS_ERR_IO, "%s: cannot seek", s->path);
            break;
        }
        s->hash = hash_at_start;
        /* reserve a ragged pool: head h gets lens[h] + room rows */
        int32_t keep_n[1024];
        if (nkv > 1024) {
            st = ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: more than 1024 KV heads", s->path);
            break;
        }
        int maxlen = 0;
        for (int h = 0; h < (int)nkv; h++) maxlen = lens[h] > maxlen ? lens[h] : maxlen;
        st = ckv_kv_layer_reserve(c, l, maxlen > 0 ? maxlen : 1);
        for (int h = 0; h < (int)nkv && st == CKV_STATUS_OK; h++) {
            uint32_t n = 0;
            st = get_u32(s, &n, "a head length");
            size_t need = (size_t)n * d * sizeof(float);
            if (st == CKV_STATUS_OK && 2 * need + (size_t)n * sizeof(int32_t) > cap) {
                ckv_free(buf);
                buf = NULL;
                cap = 2 * need + (size_t)n * sizeof(int32_t);
                st = ckv_alloc((void **)&buf, cap, "cache load buffer");
            }
            float *kb = buf, *vb = buf + (size_t)n * d; // [n, d] each
            int32_t *pb = (int32_t *)(buf + 2 * (size_t)n * d); // [n]
            if (st == CKV_STATUS_OK) st = get(s, pb, (size_t)n * sizeof(int32_t), "positions");
            if (st == CKV_STATUS_OK) st = get(s, kb, need, "keys");
            if (st == CKV_STATUS_OK) st = get(s, vb, need, "values");
            if (st == CKV_STATUS_OK) st = ckv_kv_head_write(c, l, h, kb, vb, pb, (int)n);
            keep_n[h] = (int32_t)n;
        }
        if (st != CKV_STATUS_OK) break;
        /* shrink to exactly the rows + room (compact keeps every row of each head) */
        int32_t *all_rows = NULL; // [nkv, maxlen]
        const size_t stride = (size_t)(maxlen > 0 ? maxlen : 1);
        st = ckv_alloc((void **)&all_rows, (size_t)nkv * stride * sizeof(int32_t), "rows");
        for (size_t i = 0; st == CKV_STATUS_OK && i < (size_t)nkv * stride; i++) all_rows[i] = (int32_t)(i % stride);
        if (st == CKV_STATUS_OK) st = ckv_kv_layer_compact(c, l, all_rows, (int)stride, keep_n, room);
        ckv_free(all_rows);
    }
    if (st == CKV_STATUS_OK) {
        uint64_t want = s->hash, got = 0;
        if (fread(&got, 1, 8, s->f) != 8)
            st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: truncated cache file (no checksum)", s->path);
        else if (got != want)
            st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: checksum mismatch (the file is corrupted)", s->path);
        else if (fgetc(s->f) != EOF)
            st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: trailing bytes after the checksum", s->path);
    }
    ckv_free(buf);
    ckv_free(lens);
    return st;
}

ckv_status ckv_kv_cache_load(ckv_kv_cache *c, const char *path, int room, char **meta_json) {
    kv_stream s = {fopen(path, "rb"), path, 0xcbf29ce484222325ull};
    *meta_json = NULL;
    if (!s.f) return ckv_error(CKV_STATUS_ERR_IO, "%s: %s", path, strerror(errno));
    ckv_status st = read_header(&s, meta_json);
    if (st == CKV_STATUS_OK) st = read_body(c, &s, room);
    fclose(s.f);
    if (st != CKV_STATUS_OK) {
        free(*meta_json);
        *meta_json = NULL;
    }
    return st;
}
