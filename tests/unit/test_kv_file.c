/* test_kv_file.c - cache files (kv/kv_file.c) and atomic writes (core/atomic_file.c): a ragged cache
 * saved and loaded back equals the original; the save refuses targets that are not regular files
 * (a symbolic link, a directory, a character device) and leaves no temporary behind, replacing a
 * regular file keeps its mode; the load refuses, with a message naming the file and the problem and
 * without allocating more than the context needs, files whose sizes, positions or values are wrong
 * even when their checksum has been recomputed to match (issue 13), and corrupted or truncated files.
 * The tail section (version 2: e.g. a query-aware context's last logits) comes back bit-exact, a
 * tail of the wrong length or with a NaN is refused, and a version 1 file (no tail) is still read. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "common/fixture.h"
#include "core/alloc.h"
#include "core/atomic_file.h"
#include "kv/kv_cache.h"
#include "kv/kv_file.h"

enum { NL = 2, NKV = 3, D = 4, NTOK = 6 };

static ckv_backend *be;
static char dir[512];
static unsigned char *orig; /* the saved file */
static size_t orig_len;

static const char *at(const char *name) {
    static char buf[4][700];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

/* Layer 0 full (6 rows per head), layer 1 compacted to 3, 1 and 4 rows. */
static void build(ckv_kv_cache *c) {
    CHECK_OK(ckv_kv_cache_init(c, be, NL, NKV, D, CKV_DTYPE_F32));
    float k[NTOK * NKV * D], v[NTOK * NKV * D]; /* [n, n_kv, d] */
    int32_t pos[NTOK];
    ckv_fixture_kv_rows(NTOK, NKV, D, k, v, pos);
    for (int l = 0; l < NL; l++) {
        CHECK_OK(ckv_kv_layer_reserve(c, l, NTOK));
        CHECK_OK(ckv_kv_layer_append(c, l, k, v, pos, NTOK));
    }
    int32_t keep[NKV * 4] = {0, 1, 5, 0, 2, 0, 0, 0, 1, 2, 3, 4}; /* [NKV, 4]: 3, 1 and 4 rows */
    int32_t nk[NKV] = {3, 1, 4};
    CHECK_OK(ckv_kv_layer_compact(c, 1, keep, 4, nk, 0));
}

static unsigned char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char *b = malloc(1 << 16);
    *len = b ? fread(b, 1, 1 << 16, f) : 0;
    fclose(f);
    return b;
}

/* Writes `bytes` to name; with fix, recomputes the FNV-1a trailer so only the structure is wrong. */
static const char *write_variant(const char *name, unsigned char *bytes, size_t len, int fix) {
    if (fix && len >= 8) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < len - 8; i++) h = (h ^ bytes[i]) * 0x100000001b3ull;
        memcpy(bytes + len - 8, &h, 8);
    }
    const char *p = at(name);
    FILE *f = fopen(p, "wb");
    CHECK(f != NULL);
    if (f) {
        CHECK(fwrite(bytes, 1, len, f) == len);
        fclose(f);
    }
    return p;
}

static ckv_status load(const char *path, int ctx_len, int full) {
    ckv_kv_cache c;
    char *meta = NULL;
    ckv_status st = ckv_kv_cache_init(&c, be, NL, NKV, D, CKV_DTYPE_F32);
    if (st == CKV_STATUS_OK) st = ckv_kv_cache_load(&c, path, 2, ctx_len, full, NULL, 0, &meta);
    CHECK(st == CKV_STATUS_OK || meta == NULL);
    if (st != CKV_STATUS_OK) CHECK_MSG(strchr(ckv_error_message(), '\n') == NULL, "two-line message");
    free(meta);
    ckv_kv_cache_free(&c);
    return st;
}

static void test_roundtrip(void) {
    ckv_kv_cache c, r;
    build(&c);
    char p[700];
    snprintf(p, sizeof p, "%s", at("ctx.ckv"));
    CHECK_OK(ckv_kv_cache_save(&c, p, "{\"context_len\": 6}", NULL, 0));
    orig = slurp(p, &orig_len);
    CHECK(orig && orig_len > 100);
    CHECK_OK(ckv_kv_cache_init(&r, be, NL, NKV, D, CKV_DTYPE_F32));
    char *meta = NULL;
    CHECK_OK(ckv_kv_cache_load(&r, p, 2, NTOK, 0, NULL, 0, &meta));
    CHECK(meta && strcmp(meta, "{\"context_len\": 6}") == 0);
    free(meta);
    size_t bad = 0;
    for (int l = 0; l < NL; l++)
        for (int h = 0; h < NKV; h++) {
            const ckv_kv_layer *a = &c.layers[l], *b = &r.layers[l];
            CHECK(a->len[h] == b->len[h] && b->cap[h] == b->len[h] + 2);
            for (int i = 0; i < a->len[h] && i < b->len[h]; i++) {
                bad += a->pos[a->off[h] + i] != b->pos[b->off[h] + i];
                const float *ak = a->kbuf, *bk = b->kbuf, *av = a->vbuf, *bv = b->vbuf; /* F32 caches */
                for (int j = 0; j < D; j++)
                    bad += ak[(a->off[h] + i) * D + j] != bk[(b->off[h] + i) * D + j] ||
                           av[(a->off[h] + i) * D + j] != bv[(b->off[h] + i) * D + j];
            }
        }
    CHECK_MSG(bad == 0, "%zu values differ after save + load", bad);
    ckv_kv_cache_free(&r);

    /* targets that are not regular files */
    CHECK(symlink(at("ctx.ckv"), at("link.ckv")) == 0);
    CHECK_FAILS(ckv_kv_cache_save(&c, at("link.ckv"), "{}", NULL, 0), CKV_STATUS_ERR_IO, "link.ckv is a symbolic link; ckv writes only regular files");
    struct stat sb;
    CHECK(lstat(at("link.ckv"), &sb) == 0 && S_ISLNK(sb.st_mode));
    CHECK(mkdir(at("sub"), 0755) == 0);
    CHECK_FAILS(ckv_kv_cache_save(&c, at("sub"), "{}", NULL, 0), CKV_STATUS_ERR_IO, "sub is a directory");
    CHECK_FAILS(ckv_kv_cache_save(&c, "/dev/null", "{}", NULL, 0), CKV_STATUS_ERR_IO, "--save-cache: /dev/null is a character device");
    CHECK(stat("/dev/null", &sb) == 0 && S_ISCHR(sb.st_mode));
    CHECK_FAILS(ckv_write_file_atomic("/dev/full", "x", 1, NULL), CKV_STATUS_ERR_IO, "/dev/full is a character device");
    CHECK_FAILS(ckv_atomic_file_check("/dev/full", "--save-cache"), CKV_STATUS_ERR_IO, "--save-cache: /dev/full is a character device");
    CHECK_FAILS(ckv_atomic_file_check(at("sub"), NULL), CKV_STATUS_ERR_IO, "is a directory");
    CHECK_OK(ckv_atomic_file_check(p, NULL));
    CHECK_OK(ckv_atomic_file_check(at("absent.ckv"), NULL));
    CHECK_FAILS(ckv_kv_cache_save(&c, at("nodir/x.ckv"), "{}", NULL, 0), CKV_STATUS_ERR_IO, "cannot create a temporary beside");
    /* a regular file is replaced with its mode kept */
    CHECK(chmod(p, 0640) == 0);
    CHECK_OK(ckv_kv_cache_save(&c, p, "{\"context_len\": 6}", NULL, 0));
    CHECK(stat(p, &sb) == 0 && (sb.st_mode & 0777) == 0640);
    CHECK_OK(ckv_write_file_atomic(at("plain.txt"), "hello\n", 6, "--out"));
    size_t n = 0;
    unsigned char *t = slurp(at("plain.txt"), &n);
    CHECK(t && n == 6 && memcmp(t, "hello\n", 6) == 0);
    free(t);
    /* no temporary left behind */
    DIR *d = opendir(dir);
    struct dirent *e;
    int tmps = 0;
    while (d && (e = readdir(d)) != NULL) tmps += strstr(e->d_name, ".tmp") != NULL;
    if (d) closedir(d);
    CHECK_MSG(tmps == 0, "%d temporary files left in %s", tmps, dir);
    ckv_kv_cache_free(&c);
}

/* Byte offset of layer l head h's length field in the saved file. */
static size_t head_off(int l, int h) {
    uint32_t meta_len;
    memcpy(&meta_len, orig + 12, 4);
    size_t off = 16 + meta_len + 12;
    for (int ll = 0; ll < NL; ll++)
        for (int hh = 0; hh < NKV; hh++) {
            if (ll == l && hh == h) return off;
            uint32_t n;
            memcpy(&n, orig + off, 4);
            off += 4 + (size_t)n * (4 + 8 * D);
        }
    return off;
}

static void test_bad_files(void) {
    if (!orig) return;
    unsigned char *b = malloc(orig_len + 64);
    if (!b) return;
    uint32_t u;
    int32_t i32;
    float nanf_ = NAN;
#define VARIANT(name, fix) write_variant(name, b, orig_len, fix)
#define RESET() memcpy(b, orig, orig_len)

    RESET();
    b[orig_len / 2] ^= 0x55;
    CHECK_FAILS(load(VARIANT("flip.ckv", 0), NTOK, 0), CKV_STATUS_ERR_FORMAT, "flip.ckv: checksum mismatch");
    RESET();
    CHECK_FAILS(load(write_variant("short.ckv", b, orig_len - 100, 0), NTOK, 0), CKV_STATUS_ERR_FORMAT, "short.ckv: truncated cache file");
    RESET();
    memset(b + orig_len, 0, 16);
    CHECK_FAILS(load(write_variant("tail.ckv", b, orig_len + 16, 1), NTOK, 0), CKV_STATUS_ERR_FORMAT, "16 unexpected bytes before the checksum");

    /* a huge head length with a valid checksum: refused before any allocation */
    RESET();
    u = 0x7FFFFFFF;
    memcpy(b + head_off(1, 1), &u, 4);
    ckv_alloc_reset_peak();
    size_t live = ckv_alloc_live_bytes();
    CHECK_FAILS(load(VARIANT("huge.ckv", 1), NTOK, 0), CKV_STATUS_ERR_FORMAT, "layer 1 head 1 holds 2147483647 rows, more than the 6-token context");
    CHECK_MSG(ckv_alloc_peak_bytes() - live < (1 << 20), "%zu bytes allocated for a bad file", ckv_alloc_peak_bytes() - live);
    /* a length that fits the context but not the file (the last head: 4 rows -> 5) */
    RESET();
    u = 5;
    memcpy(b + head_off(1, 2), &u, 4);
    CHECK_FAILS(load(VARIANT("len5.ckv", 1), NTOK, 0), CKV_STATUS_ERR_FORMAT,
                "truncated cache file (layer 1 head 2 needs 180 bytes, 148 left)");
    /* rows beyond the context the header claims */
    RESET();
    CHECK_FAILS(load(VARIANT("ctx3.ckv", 1), 3, 0), CKV_STATUS_ERR_FORMAT, "layer 0 head 0 holds 6 rows, more than the 3-token context");
    /* a compressed cache claimed as uncompressed */
    CHECK_FAILS(load(at("ctx3.ckv"), NTOK, 1), CKV_STATUS_ERR_FORMAT, "layer 1 head 0 holds 3 rows, but the uncompressed context has 6");
    CHECK_OK(load(at("ctx3.ckv"), NTOK, 0));
    /* positions: negative, beyond the context, unsorted */
    size_t p0 = head_off(1, 2) + 4; /* head 2 of layer 1 keeps positions 1, 2, 3, 4 */
    RESET();
    i32 = -1;
    memcpy(b + p0, &i32, 4);
    CHECK_FAILS(load(VARIANT("neg.ckv", 1), NTOK, 0), CKV_STATUS_ERR_FORMAT, "layer 1 head 2 row 0: position -1 is outside the context");
    RESET();
    i32 = 6;
    memcpy(b + p0 + 12, &i32, 4);
    CHECK_FAILS(load(VARIANT("pos6.ckv", 1), NTOK, 0), CKV_STATUS_ERR_FORMAT, "row 3: position 6 is outside the context");
    RESET();
    i32 = 1;
    memcpy(b + p0 + 8, &i32, 4);
    CHECK_FAILS(load(VARIANT("unsorted.ckv", 1), NTOK, 0), CKV_STATUS_ERR_FORMAT, "row 2: position 1 breaks the ascending order");
    /* a NaN key and an infinite value */
    RESET();
    memcpy(b + p0 + 16 + 4 * (D + 1), &nanf_, 4);
    CHECK_FAILS(load(VARIANT("nan.ckv", 1), NTOK, 0), CKV_STATUS_ERR_FORMAT, "layer 1 head 2 row 1: non-finite key");
    RESET();
    float inf = INFINITY;
    memcpy(b + p0 + 16 + 4 * 4 * D + 4 * (3 * D), &inf, 4);
    CHECK_FAILS(load(VARIANT("inf.ckv", 1), NTOK, 0), CKV_STATUS_ERR_FORMAT, "layer 1 head 2 row 3: non-finite value");
    /* a header length past the end, a wrong shape, not a regular file */
    RESET();
    u = 1u << 19;
    memcpy(b + 12, &u, 4);
    CHECK_FAILS(load(VARIANT("meta.ckv", 1), NTOK, 0), CKV_STATUS_ERR_FORMAT, "truncated cache file (header of 524288 bytes");
    ckv_kv_cache c;
    char *meta = NULL;
    CHECK_OK(ckv_kv_cache_init(&c, be, NL, NKV + 1, D, CKV_DTYPE_F32));
    CHECK_FAILS(ckv_kv_cache_load(&c, at("ctx3.ckv"), 0, NTOK, 0, NULL, 0, &meta), CKV_STATUS_ERR_SHAPE, "the model needs 2 x 4 x 4");
    ckv_kv_cache_free(&c);
    CHECK_FAILS(load("/dev/zero", NTOK, 0), CKV_STATUS_ERR_IO, "/dev/zero: not a regular file");
    CHECK_FAILS(load(dir, NTOK, 0), CKV_STATUS_ERR_IO, "not a regular file");
    CHECK_FAILS(ckv_kv_file_read_meta("/dev/zero", &meta), CKV_STATUS_ERR_IO, "not a regular file");
#undef VARIANT
#undef RESET
    free(b);
}

/* A tail [5] saved and loaded back bit-exact; the wrong expected length, a NaN in the tail, a
 * truncated tail and a future version are refused; the same rows as a version 1 file (no tail
 * length) still load with an empty tail. */
static void test_tail(void) {
    if (!orig) return;
    ckv_kv_cache c, r;
    build(&c);
    const float tail[5] = {0.5f, -1.25f, 3.0f, 1e-30f, -7.0f};
    float got[5] = {0};
    const char *p = at("tail5.ckv");
    CHECK_OK(ckv_kv_cache_save(&c, p, "{\"context_len\": 6}", tail, 5));
    CHECK_FAILS(ckv_kv_cache_save(&c, at("null.ckv"), "{}", NULL, 5), CKV_STATUS_ERR_ARG, "a tail of 5 values without data");
    char *meta = NULL;
    CHECK_OK(ckv_kv_cache_init(&r, be, NL, NKV, D, CKV_DTYPE_F32));
    CHECK_OK(ckv_kv_cache_load(&r, p, 2, NTOK, 0, got, 5, &meta));
    CHECK_MSG(memcmp(got, tail, sizeof tail) == 0, "tail differs after save + load: %g %g %g %g %g", got[0], got[1], got[2],
              got[3], got[4]);
    free(meta);
    ckv_kv_cache_free(&r);
    CHECK_FAILS(load(p, NTOK, 0), CKV_STATUS_ERR_FORMAT, "tail5.ckv: the file's tail holds 5 values, expected 0");
    size_t n = 0;
    unsigned char *b = slurp(p, &n);
    CHECK(b && n == orig_len + 20);
    if (b) {
        float nanf_ = NAN;
        memcpy(b + n - 8 - 8, &nanf_, 4); /* tail value 3 */
        CHECK_OK(ckv_kv_cache_init(&r, be, NL, NKV, D, CKV_DTYPE_F32));
        CHECK_FAILS(ckv_kv_cache_load(&r, write_variant("tailnan.ckv", b, n, 1), 2, NTOK, 0, got, 5, &meta), CKV_STATUS_ERR_FORMAT,
                    "tailnan.ckv: non-finite value 3 of the tail");
        ckv_kv_cache_free(&r);
        CHECK_OK(ckv_kv_cache_init(&r, be, NL, NKV, D, CKV_DTYPE_F32));
        CHECK_FAILS(ckv_kv_cache_load(&r, write_variant("tailshort.ckv", b, n - 12, 1), 2, NTOK, 0, got, 5, &meta),
                    CKV_STATUS_ERR_FORMAT, "tailshort.ckv: truncated cache file (a tail of 5 values, 8 bytes left)");
        ckv_kv_cache_free(&r);
        free(b);
    }
    /* version 1: the rows of orig without the tail length; version 3: refused */
    b = malloc(orig_len);
    if (b) {
        memcpy(b, orig, orig_len);
        uint32_t v = 1;
        memcpy(b + 8, &v, 4);
        memcpy(b + orig_len - 12, orig + orig_len - 8, 8);
        CHECK_OK(load(write_variant("v1.ckv", b, orig_len - 4, 1), NTOK, 0));
        v = CKV_KV_FILE_VERSION + 1;
        memcpy(b + 8, &v, 4);
        CHECK_FAILS(load(write_variant("v3.ckv", b, orig_len - 4, 1), NTOK, 0), CKV_STATUS_ERR_FORMAT,
                    "v3.ckv: cache file version 3, this ckv reads versions 1 to 2");
        free(b);
    }
    ckv_kv_cache_free(&c);
}

int main(void) {
    CHECK_OK(ckv_backend_init(&be, "cpu", 1));
    if (!be) return ckv_test_finish("test_kv_file");
    snprintf(dir, sizeof dir, "%s/test_kv_file.%ld", CKV_TEST_TMP, (long)getpid());
    CHECK(mkdir(dir, 0755) == 0);
    test_roundtrip();
    test_bad_files();
    test_tail();
    free(orig);
    ckv_backend_free(be);
    int rc = ckv_test_finish("test_kv_file");
    if (rc == 0) {
        char cmd[800];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    }
    return rc;
}
