/* weights_digest.c - per-file digests of a model path, sampled or full (see weights_digest.h). */
#define _POSIX_C_SOURCE 200809L
#include "model/weights_digest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model/gguf_file.h"
#include "model/safetensors.h"

#define SEED 0x636b762d64696731ull /* the shared sampling seed: every rank draws the same offsets */
#define MAX_FILES 4096

static uint64_t mix(uint64_t h, uint64_t w) {
    h ^= w;
    h *= 0x9e3779b97f4a7c15ull;
    return h ^ (h >> 29);
}

/* n bytes of p into h, 8 at a time (the length too, so a shorter block never equals a longer one) */
static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = mix(h, w);
    }
    uint64_t w = 0;
    memcpy(&w, b + i, n - i);
    return mix(mix(h, w), (uint64_t)n);
}

static uint64_t splitmix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* The block of data[nbytes] starting at off (clamped to the tensor), with its offset. */
static uint64_t hash_block(uint64_t h, const unsigned char *data, size_t nbytes, int64_t off, uint64_t *read) {
    if (nbytes == 0) return h;
    if (off < 0) off = 0;
    if ((size_t)off >= nbytes) off = (int64_t)nbytes - 1;
    size_t len = nbytes - (size_t)off < CKV_DIGEST_BLOCK ? nbytes - (size_t)off : CKV_DIGEST_BLOCK;
    *read += len;
    return hash_bytes(mix(h, (uint64_t)off), data + off, len);
}

/* The sampled blocks of one tensor of rows x (nbytes / rows) bytes. */
static uint64_t hash_tensor(uint64_t h, const char *name, const unsigned char *data, size_t nbytes, int64_t rows, int parts,
                            uint64_t *read) {
    const int64_t blk = CKV_DIGEST_BLOCK, n = (int64_t)nbytes;
    h = hash_bytes(h, name, strlen(name));
    h = mix(h, (uint64_t)nbytes);
    h = hash_block(h, data, nbytes, 0, read);
    h = hash_block(h, data, nbytes, n - blk, read);
    uint64_t s = hash_bytes(SEED, name, strlen(name)) ^ (uint64_t)nbytes;
    for (int k = 0; k < 4 && nbytes; k++) h = hash_block(h, data, nbytes, (int64_t)(splitmix(s + (uint64_t)k) % nbytes), read);
    if (rows < 1 || n % rows) rows = 1;
    int64_t row = n / rows;
    for (int r = 0; r < parts && parts > 1; r++) {
        int64_t r0 = rows * r / parts, r1 = rows * (r + 1) / parts; /* rows of part r */
        int64_t c0 = row * r / parts, c1 = row * (r + 1) / parts;   /* bytes of part r in each row */
        h = hash_block(h, data, nbytes, r0 * row, read);
        h = hash_block(h, data, nbytes, r1 * row - blk, read);
        h = hash_block(h, data, nbytes, c0, read);                         /* its first row */
        h = hash_block(h, data, nbytes, (rows - 1) * row + c1 - blk, read); /* its last row */
        h = hash_block(h, data, nbytes, (rows - 1) * row + c0, read);
        h = hash_block(h, data, nbytes, c1 - blk, read);
    }
    return h;
}

/* Up to cap bytes from offset off of path into h (cap = SIZE_MAX: the whole file). */
static ckv_status hash_file_range(uint64_t *h, const char *path, uint64_t off, uint64_t cap, uint64_t *read) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: cannot open it to digest it: %s", path, strerror(errno));
    static const size_t chunk = 1 << 20; /* a multiple of 8: the same words on every rank */
    unsigned char *buf = malloc(chunk);
    ckv_status st = buf ? CKV_STATUS_OK : ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory digesting %s", path);
    uint64_t done = 0;
    while (st == CKV_STATUS_OK && done < cap) {
        size_t want = cap - done < chunk ? (size_t)(cap - done) : chunk;
        ssize_t got = pread(fd, buf, want, (off_t)(off + done));
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) st = ckv_error(CKV_STATUS_ERR_IO, "%s: read error while digesting it: %s", path, strerror(errno));
        if (got <= 0) break;
        *h = hash_bytes(*h, buf, (size_t)got);
        done += (uint64_t)got;
    }
    *read += done;
    free(buf);
    close(fd);
    return st;
}

static ckv_status sample_gguf(uint64_t *h, const char *path, int parts, uint64_t *read) {
    ckv_gguf_file *f = NULL;
    CKV_TRY(ckv_gguf_file_open(&f, path));
    *h = hash_bytes(*h, f->map, f->data_start); /* header, metadata, tensor table */
    *read += f->data_start;
    for (int i = 0; i < f->n_tensors; i++) {
        const ckv_gguf_tensor *t = &f->tensors[i];
        int64_t rows = 1;
        for (int d = 1; d < t->ndim; d++) rows *= t->ne[d]; /* ne[0] varies fastest: one row */
        *h = hash_tensor(*h, t->name, t->data, t->nbytes, rows, parts, read);
    }
    ckv_gguf_file_close(f);
    return CKV_STATUS_OK;
}

static ckv_status sample_safetensors(uint64_t *h, const char *path, int parts, uint64_t *read) {
    unsigned char len8[8];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t got = fd >= 0 ? pread(fd, len8, 8, 0) : -1;
    if (fd >= 0) close(fd);
    if (got != 8) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: too short for a safetensors header", path);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    ckv_safetensors *st = NULL;
    CKV_TRY(ckv_safetensors_open_file(&st, path)); /* validates the header (and its length) */
    ckv_status s = hash_file_range(h, path, 0, 8 + hlen, read);
    for (int i = 0; s == CKV_STATUS_OK && i < ckv_safetensors_count(st); i++) {
        const ckv_st_tensor *t = ckv_safetensors_at(st, i);
        *h = hash_tensor(*h, t->name, t->data, t->nbytes, t->ndim >= 2 ? t->shape[0] : 1, parts, read);
    }
    ckv_safetensors_close(st);
    return s;
}

static int ends_with(const char *s, const char *suffix) {
    size_t l = strlen(s), k = strlen(suffix);
    return l > k && !strcmp(s + l - k, suffix);
}

static int cmp_names(const void *a, const void *b) { return strcmp((const char *)a, (const char *)b); }

static ckv_status add_file(ckv_weights_digest *d, const char *path, const char *name, int is_gguf, ckv_digest_mode mode,
                           int parts) {
    struct stat sb;
    if (stat(path, &sb) != 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: cannot digest it: %s", path, strerror(errno));
    uint64_t h = mix(SEED, (uint64_t)sb.st_size);
    ckv_status st;
    if (mode == CKV_DIGEST_FULL || (!is_gguf && !ends_with(name, ".safetensors")))
        st = hash_file_range(&h, path, 0, UINT64_MAX, &d->bytes_read);
    else if (is_gguf)
        st = sample_gguf(&h, path, parts, &d->bytes_read);
    else
        st = sample_safetensors(&h, path, parts, &d->bytes_read);
    if (st != CKV_STATUS_OK) return st;
    snprintf(d->names[d->n], CKV_DIGEST_NAME, "%s", name);
    d->digest[d->n++] = h;
    return CKV_STATUS_OK;
}

ckv_status ckv_weights_digest_compute(ckv_weights_digest *d, const char *model_path, ckv_digest_mode mode, int parts) {
    memset(d, 0, sizeof *d);
    if (mode == CKV_DIGEST_NONE) return CKV_STATUS_OK;
    if (parts < 1) parts = 1;
    if (parts > CKV_DIGEST_MAX_PARTS) parts = CKV_DIGEST_MAX_PARTS;
    struct stat sb;
    if (stat(model_path, &sb) != 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: no such model file or directory", model_path);
    d->names = calloc(MAX_FILES, sizeof *d->names);
    d->digest = calloc(MAX_FILES, sizeof *d->digest);
    if (!d->names || !d->digest) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory digesting %s", model_path);
    if (!S_ISDIR(sb.st_mode)) {
        const char *base = strrchr(model_path, '/');
        return add_file(d, model_path, base ? base + 1 : model_path, 1, mode, parts);
    }
    DIR *dir = opendir(model_path);
    if (!dir) return ckv_error(CKV_STATUS_ERR_IO, "%s: cannot list the model directory: %s", model_path, strerror(errno));
    char (*shards)[CKV_DIGEST_NAME] = calloc(MAX_FILES, sizeof *shards);
    int n = 0, too_many = 0;
    struct dirent *e;
    while (shards && (e = readdir(dir)) != NULL) {
        if (!ends_with(e->d_name, ".safetensors") || strlen(e->d_name) >= CKV_DIGEST_NAME) continue;
        if (n + 2 >= MAX_FILES) too_many = 1;
        else snprintf(shards[n++], CKV_DIGEST_NAME, "%s", e->d_name);
    }
    closedir(dir);
    if (!shards) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory digesting %s", model_path);
    ckv_status st = too_many ? ckv_error(CKV_STATUS_ERR_RANGE, "%s: more than %d safetensors files", model_path, MAX_FILES - 2)
                             : CKV_STATUS_OK;
    qsort(shards, (size_t)n, sizeof *shards, cmp_names);
    char path[4096 + CKV_DIGEST_NAME];
    static const char *const meta[] = {"config.json", "model.safetensors.index.json"};
    for (int i = 0; i < 2 && st == CKV_STATUS_OK; i++) {
        snprintf(path, sizeof path, "%s/%s", model_path, meta[i]);
        if (i == 0 || access(path, F_OK) == 0) st = add_file(d, path, meta[i], 0, mode, parts);
    }
    for (int i = 0; i < n && st == CKV_STATUS_OK; i++) {
        snprintf(path, sizeof path, "%s/%s", model_path, shards[i]);
        st = add_file(d, path, shards[i], 0, mode, parts);
    }
    free(shards);
    return st;
}

void ckv_weights_digest_free(ckv_weights_digest *d) {
    if (!d) return;
    free(d->names);
    free(d->digest);
    memset(d, 0, sizeof *d);
}

int ckv_digest_mode_parse(const char *s) {
    if (!s) return -1;
    if (!strcmp(s, "none")) return CKV_DIGEST_NONE;
    if (!strcmp(s, "sample")) return CKV_DIGEST_SAMPLE;
    if (!strcmp(s, "full")) return CKV_DIGEST_FULL;
    return -1;
}
