/* test_safetensors.c - the safetensors reader on files written at run time under CKV_TEST_TMP:
 * exact values of F32, F16 and BF16 tensors read whole and as 2-D row/column slices (from aligned
 * and deliberately misaligned data), the descriptor fields, a sharded checkpoint with its index, and
 * one malformed file or index per check, each required to fail with the right status and a message
 * naming the file and the tensor or field at fault; the weight source's stored bytes (read_raw,
 * stored_dtype) on the BF16 and F32 fixture checkpoints. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckv_test.h"
#include "core/status.h"
#include "model/safetensors.h"
#include "model/source.h"

static char tmp_dir[512];

static const char *tmp_path(const char *name) {
    static char buf[4][1024];
    static int k = 0;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", tmp_dir, name);
    return buf[k];
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot write %s", path);
    if (!f) return;
    if (n) CHECK(fwrite(p, 1, n, f) == n);
    fclose(f);
}

/* Writes a safetensors file: the header length (hlen, or strlen(header) when hlen is UINT64_MAX),
 * `pad` spaces after the header text (counted in the length), then the data. */
static void write_st(const char *path, const char *header, int pad, uint64_t hlen, const void *data, size_t n) {
    size_t hl = strlen(header);
    unsigned char *buf = malloc(8 + hl + (size_t)pad + n + 1);
    uint64_t len = hlen == UINT64_MAX ? (uint64_t)(hl + (size_t)pad) : hlen;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(len >> (8 * i));
    memcpy(buf + 8, header, hl);
    memset(buf + 8 + hl, ' ', (size_t)pad);
    if (n) memcpy(buf + 8 + hl + pad, data, n);
    write_bytes(path, buf, 8 + hl + (size_t)pad + n);
    free(buf);
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[1024];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
            remove_tree(path);
        else
            unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* ---- the valid file ---------------------------------------------------------------------------- */

/* Tensors (data region, 160 bytes, deliberately not in header order):
 *   w   F32  [3, 4]     offsets [0, 48]     values 0.5 * i - 2
 *   h   F16  [2, 3]     offsets [48, 60]
 *   b   BF16 [2, 2]     offsets [60, 68]
 *   i   I64  [2]        offsets [68, 84]
 *   u   U8   [3]        offsets [84, 87]
 *   s   F32  []         offsets [88, 92]    (a 1-byte hole before it is tolerated)
 *   e   F32  [0, 4]     offsets [92, 92]
 *   t3  F32  [2, 2, 2]  offsets [92, 124]
 *   r   F16  [4, 3]     offsets [124, 148]
 *   z   F32  [3]        offsets [148, 160] */
static const char valid_header[] =
    "{\"__metadata__\": {\"format\": \"pt\"},"
    " \"t3\": {\"dtype\": \"F32\", \"shape\": [2, 2, 2], \"data_offsets\": [92, 124]},"
    " \"w\": {\"dtype\": \"F32\", \"shape\": [3, 4], \"data_offsets\": [0, 48]},"
    " \"h\": {\"dtype\": \"F16\", \"shape\": [2, 3], \"data_offsets\": [48, 60]},"
    " \"b\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [60, 68]},"
    " \"i\": {\"dtype\": \"I64\", \"shape\": [2], \"data_offsets\": [68, 84]},"
    " \"u\": {\"dtype\": \"U8\", \"shape\": [3], \"data_offsets\": [84, 87]},"
    " \"s\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [88, 92]},"
    " \"e\": {\"dtype\": \"F32\", \"shape\": [0, 4], \"data_offsets\": [92, 92]},"
    " \"r\": {\"dtype\": \"F16\", \"shape\": [4, 3], \"data_offsets\": [124, 148]},"
    " \"z\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [148, 160]}}";

static const uint16_t h_bits[6] = {0x3C00, 0xC100, 0x3800, 0x7BFF, 0x0400, 0x0001};
static const float h_vals[6] = {1.0f, -2.5f, 0.5f, 65504.0f, 6.103515625e-05f, 5.9604644775390625e-08f};
static const uint16_t b_bits[4] = {0x3F80, 0xC020, 0x4049, 0x7F7F};
static const float b_vals[4] = {1.0f, -2.5f, 3.140625f, 3.3895313892515355e+38f};
/* r: F16 bits 0x3C00 + k * 0x0400 for k = 0..11 are 1, 2, 4, ..., 2048 */
static float r_val(int k) { return ldexpf(1.0f, k); }

static unsigned char valid_data[160];

static void build_valid_data(void) {
    memset(valid_data, 0, sizeof valid_data);
    for (int k = 0; k < 12; k++) {
        float v = 0.5f * (float)k - 2.0f;
        memcpy(valid_data + 4 * k, &v, 4);
    }
    memcpy(valid_data + 48, h_bits, sizeof h_bits);
    memcpy(valid_data + 60, b_bits, sizeof b_bits);
    int64_t iv[2] = {7, -9};
    memcpy(valid_data + 68, iv, sizeof iv);
    valid_data[84] = 1;
    valid_data[85] = 2;
    valid_data[86] = 3;
    float s = 42.25f;
    memcpy(valid_data + 88, &s, 4);
    for (int k = 0; k < 8; k++) {
        float v = 100.0f + (float)k;
        memcpy(valid_data + 92 + 4 * k, &v, 4);
    }
    for (int k = 0; k < 12; k++) {
        uint16_t bits = (uint16_t)(0x3C00 + k * 0x0400);
        memcpy(valid_data + 124 + 2 * k, &bits, 2);
    }
    float z[3] = {-1.0f, 0.0f, 1.0f};
    memcpy(valid_data + 148, z, sizeof z);
}

static int same_floats(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof *a) == 0;
}

/* Checks every value of the valid file through st (whatever its alignment). */
static void check_valid(ckv_safetensors *st, const char *path) {
    CHECK(ckv_safetensors_count(st) == 10);
    const ckv_st_tensor *t = ckv_safetensors_find(st, "w");
    CHECK(t && t->dtype == CKV_DTYPE_F32 && t->ndim == 2 && t->shape[0] == 3 && t->shape[1] == 4);
    CHECK(t && t->nbytes == 48 && t->file == 0);
    CHECK(ckv_safetensors_find(st, "nope") == NULL);
    CHECK(ckv_safetensors_find(st, "__metadata__") == NULL);
    CHECK(ckv_safetensors_at(st, -1) == NULL && ckv_safetensors_at(st, 10) == NULL);
    int seen_t3 = 0;
    for (int i = 0; i < ckv_safetensors_count(st); i++) seen_t3 |= strcmp(ckv_safetensors_at(st, i)->name, "t3") == 0;
    CHECK(seen_t3);
    CHECK(strcmp(ckv_safetensors_file_path(st, 0), path) == 0);
    CHECK(ckv_safetensors_file_path(st, 1) == NULL);
    t = ckv_safetensors_find(st, "u");
    CHECK(t && t->ndim == 1 && t->shape[0] == 3 && t->nbytes == 3 && ((const unsigned char *)t->data)[2] == 3);
    t = ckv_safetensors_find(st, "i");
    CHECK(t && t->dtype == CKV_DTYPE_I64 && t->nbytes == 16);
    t = ckv_safetensors_find(st, "s");
    CHECK(t && t->ndim == 0 && t->nbytes == 4);
    t = ckv_safetensors_find(st, "h");
    CHECK(t && t->dtype == CKV_DTYPE_F16);
    t = ckv_safetensors_find(st, "b");
    CHECK(t && t->dtype == CKV_DTYPE_BF16);

    float out[32], ref[32];
    const int64_t w_shape[2] = {3, 4};
    CHECK_OK(ckv_safetensors_read_f32(st, "w", 2, w_shape, 0, -1, 0, -1, out));
    for (int k = 0; k < 12; k++) ref[k] = 0.5f * (float)k - 2.0f;
    CHECK(same_floats(out, ref, 12));
    /* rows [1, 3) */
    CHECK_OK(ckv_safetensors_read_f32(st, "w", 2, w_shape, 1, 3, 0, 4, out));
    CHECK(same_floats(out, ref + 4, 8));
    /* columns [1, 3) of every row */
    CHECK_OK(ckv_safetensors_read_f32(st, "w", 2, w_shape, 0, 3, 1, 3, out));
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 2; c++) CHECK(out[r * 2 + c] == ref[r * 4 + 1 + c]);
    /* rows [0, 2) x columns [2, 4) */
    CHECK_OK(ckv_safetensors_read_f32(st, "w", 2, w_shape, 0, 2, 2, 4, out));
    CHECK(out[0] == ref[2] && out[1] == ref[3] && out[2] == ref[6] && out[3] == ref[7]);
    /* all rows given as -1, columns [3, 4) */
    CHECK_OK(ckv_safetensors_read_f32(st, "w", 2, w_shape, 0, -1, 3, 4, out));
    CHECK(out[0] == ref[3] && out[1] == ref[7] && out[2] == ref[11]);
    /* an empty slice writes nothing */
    out[0] = 123.0f;
    CHECK_OK(ckv_safetensors_read_f32(st, "w", 2, w_shape, 1, 1, 0, 4, out));
    CHECK(out[0] == 123.0f);
    /* no shape check when shape is NULL */
    CHECK_OK(ckv_safetensors_read_f32(st, "w", 0, NULL, 0, -1, 0, -1, out));
    CHECK(same_floats(out, ref, 12));

    const int64_t h_shape[2] = {2, 3};
    CHECK_OK(ckv_safetensors_read_f32(st, "h", 2, h_shape, 0, -1, 0, -1, out));
    CHECK(same_floats(out, h_vals, 6));
    CHECK_OK(ckv_safetensors_read_f32(st, "h", 2, h_shape, 0, 2, 1, 3, out));
    CHECK(out[0] == h_vals[1] && out[1] == h_vals[2] && out[2] == h_vals[4] && out[3] == h_vals[5]);
    CHECK_OK(ckv_safetensors_read_f32(st, "h", 2, h_shape, 1, 2, 0, 3, out));
    CHECK(same_floats(out, h_vals + 3, 3));

    const int64_t b_shape[2] = {2, 2};
    CHECK_OK(ckv_safetensors_read_f32(st, "b", 2, b_shape, 0, -1, 0, -1, out));
    CHECK(same_floats(out, b_vals, 4));
    CHECK_OK(ckv_safetensors_read_f32(st, "b", 2, b_shape, 0, 2, 1, 2, out));
    CHECK(out[0] == b_vals[1] && out[1] == b_vals[3]);

    const int64_t r_shape[2] = {4, 3};
    CHECK_OK(ckv_safetensors_read_f32(st, "r", 2, r_shape, 0, -1, 0, -1, out));
    for (int k = 0; k < 12; k++) CHECK_MSG(out[k] == r_val(k), "r[%d] = %g", k, (double)out[k]);
    CHECK_OK(ckv_safetensors_read_f32(st, "r", 2, r_shape, 1, 4, 2, 3, out));
    CHECK(out[0] == r_val(5) && out[1] == r_val(8) && out[2] == r_val(11));

    CHECK_OK(ckv_safetensors_read_f32(st, "s", 0, NULL, 0, -1, 0, -1, out));
    CHECK(out[0] == 42.25f);
    const int64_t e_shape[2] = {0, 4};
    CHECK_OK(ckv_safetensors_read_f32(st, "e", 2, e_shape, 0, -1, 0, -1, out));
    const int64_t t3_shape[3] = {2, 2, 2};
    CHECK_OK(ckv_safetensors_read_f32(st, "t3", 3, t3_shape, 0, -1, 0, -1, out));
    for (int k = 0; k < 8; k++) CHECK(out[k] == 100.0f + (float)k);

    /* refusals on a valid file */
    const int64_t wrong[2] = {4, 3};
    CHECK_FAILS(ckv_safetensors_read_f32(st, "w", 2, wrong, 0, -1, 0, -1, out), CKV_STATUS_ERR_SHAPE,
                "tensor 'w': shape [3, 4] in the file, expected [4, 3]");
    CHECK(strstr(ckv_error_message(), path) != NULL);
    CHECK_FAILS(ckv_safetensors_read_f32(st, "w", 1, w_shape, 0, -1, 0, -1, out), CKV_STATUS_ERR_SHAPE,
                "shape [3, 4] in the file, expected [3]");
    CHECK_FAILS(ckv_safetensors_read_f32(st, "missing.weight", 0, NULL, 0, -1, 0, -1, out), CKV_STATUS_ERR_FORMAT,
                "tensor 'missing.weight': not in the checkpoint");
    const int64_t i_shape[1] = {2};
    CHECK_FAILS(ckv_safetensors_read_f32(st, "i", 1, i_shape, 0, -1, 0, -1, out), CKV_STATUS_ERR_UNSUPPORTED,
                "tensor 'i': dtype I64 cannot be read as F32");
    CHECK_FAILS(ckv_safetensors_read_f32(st, "u", 0, NULL, 0, -1, 0, -1, out), CKV_STATUS_ERR_UNSUPPORTED,
                "tensor 'u': dtype U8 cannot be read as F32");
    CHECK_FAILS(ckv_safetensors_read_f32(st, "w", 2, w_shape, 0, 4, 0, 4, out), CKV_STATUS_ERR_RANGE,
                "tensor 'w': slice rows [0, 4) cols [0, 4) outside its shape [3, 4]");
    CHECK_FAILS(ckv_safetensors_read_f32(st, "w", 2, w_shape, 0, 3, 3, 2, out), CKV_STATUS_ERR_RANGE,
                "tensor 'w': slice rows [0, 3) cols [3, 2)");
    CHECK_FAILS(ckv_safetensors_read_f32(st, "w", 2, w_shape, -1, 2, 0, 4, out), CKV_STATUS_ERR_RANGE,
                "tensor 'w': slice");
    CHECK_FAILS(ckv_safetensors_read_f32(st, "w", 2, w_shape, 1, -1, 0, 2, out), CKV_STATUS_ERR_RANGE,
                "tensor 'w': slice");
    CHECK_FAILS(ckv_safetensors_read_f32(st, "w", 2, w_shape, 1, -1, 0, -1, out), CKV_STATUS_ERR_ARG,
                "tensor 'w': row0/col0 must be 0");
    CHECK_FAILS(ckv_safetensors_read_f32(st, "t3", 3, t3_shape, 0, 1, 0, -1, out), CKV_STATUS_ERR_ARG,
                "tensor 't3': a row/column slice needs a 2-D tensor (it has 3 dimensions)");
    CHECK_FAILS(ckv_safetensors_read_f32(st, "w", 2, w_shape, 0, -1, 0, -1, NULL), CKV_STATUS_ERR_ARG, "NULL");

    /* pages given back are read again from the file */
    ckv_safetensors_release_pages(st);
    CHECK_OK(ckv_safetensors_read_f32(st, "w", 2, w_shape, 0, -1, 0, -1, out));
    CHECK(same_floats(out, ref, 12));
    CHECK_OK(ckv_safetensors_read_f32(st, "h", 2, h_shape, 0, -1, 0, -1, out));
    CHECK(same_floats(out, h_vals, 6));
}

static void test_valid(void) {
    build_valid_data();
    /* aligned: 8 + header padded to a multiple of 8 */
    size_t hl = strlen(valid_header);
    int pad = (int)((8 - hl % 8) % 8);
    const char *p1 = tmp_path("valid.safetensors");
    write_st(p1, valid_header, pad, UINT64_MAX, valid_data, sizeof valid_data);
    ckv_safetensors *st = NULL;
    CHECK_OK(ckv_safetensors_open_file(&st, p1));
    if (st) {
        CHECK(((uintptr_t)ckv_safetensors_find(st, "w")->data) % 8 == 0);
        check_valid(st, p1);
    }
    ckv_safetensors_close(st);

    /* misaligned: an odd data start puts every F16/BF16 element on an odd address */
    const char *p2 = tmp_path("odd.safetensors");
    write_st(p2, valid_header, pad + 1, UINT64_MAX, valid_data, sizeof valid_data);
    st = NULL;
    CHECK_OK(ckv_safetensors_open_file(&st, p2));
    if (st) {
        CHECK(((uintptr_t)ckv_safetensors_find(st, "h")->data) % 2 == 1);
        check_valid(st, p2);
    }
    ckv_safetensors_close(st);

    /* a directory holding model.safetensors */
    const char *d = tmp_path("single");
    CHECK(mkdir(d, 0755) == 0);
    char p3[1100];
    snprintf(p3, sizeof p3, "%s/model.safetensors", d);
    write_st(p3, valid_header, pad, UINT64_MAX, valid_data, sizeof valid_data);
    st = NULL;
    CHECK_OK(ckv_safetensors_open_dir(&st, d));
    if (st) check_valid(st, p3);
    ckv_safetensors_close(st);

    /* a file with no tensors at all */
    const char *p4 = tmp_path("empty.safetensors");
    write_st(p4, "{\"__metadata__\": {}}", 0, UINT64_MAX, NULL, 0);
    st = NULL;
    CHECK_OK(ckv_safetensors_open_file(&st, p4));
    CHECK(ckv_safetensors_count(st) == 0 && ckv_safetensors_find(st, "w") == NULL);
    ckv_safetensors_close(st);

    ckv_safetensors_close(NULL);
    CHECK(ckv_safetensors_count(NULL) == 0);
}

/* ---- malformed single files -------------------------------------------------------------------- */

static int n_bad = 0;

/* Writes a file with `header` and `ndata` zero bytes, opens it and checks the failure. */
static void bad_header(const char *header, size_t ndata, ckv_status code, const char *needle, int line) {
    char name[64];
    snprintf(name, sizeof name, "bad%02d.safetensors", ++n_bad);
    const char *path = tmp_path(name);
    unsigned char zeros[256] = {0};
    write_st(path, header, 0, UINT64_MAX, zeros, ndata);
    ckv_safetensors *st = (ckv_safetensors *)&n_bad;
    ckv_error_clear();
    ckv_status s = ckv_safetensors_open_file(&st, path);
    const char *msg = ckv_error_message();
    if (s != code || !strstr(msg, needle) || !strstr(msg, name) || st != NULL || strchr(msg, '\n')) {
        fprintf(stderr, "FAIL line %d: %s -> %s '%s' (expected %s, '%s', naming the file)\n", line, name,
                ckv_status_string(s), msg, ckv_status_string(code), needle);
        ckv_test_failures++;
    }
    if (s == CKV_STATUS_OK) ckv_safetensors_close(st);
}

#define BAD(header, ndata, code, needle) bad_header(header, ndata, code, needle, __LINE__)

static void bad_raw(const char *name, const void *bytes, size_t n, ckv_status code, const char *needle) {
    const char *path = tmp_path(name);
    write_bytes(path, bytes, n);
    ckv_safetensors *st = NULL;
    CHECK_FAILS(ckv_safetensors_open_file(&st, path), code, needle);
    CHECK(st == NULL);
    CHECK(strstr(ckv_error_message(), name) != NULL);
}

static void test_malformed(void) {
    const ckv_status F = CKV_STATUS_ERR_FORMAT, U = CKV_STATUS_ERR_UNSUPPORTED;
    /* length field */
    bad_raw("zero.safetensors", "", 0, F, "file is 0 bytes, shorter than the 8-byte header length");
    bad_raw("five.safetensors", "\x02\0\0\0\0", 5, F, "file is 5 bytes, shorter than the 8-byte header length");
    {
        unsigned char b[8 + 2] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
        bad_raw("longhdr.safetensors", b, sizeof b, F, "header length 100 runs past end of file (10 bytes)");
        unsigned char h[8 + 2] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
        bad_raw("hugehdr.safetensors", h, sizeof h, F, "header length 18446744073709551615 runs past end of file");
        unsigned char z[8 + 2] = {0, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
        bad_raw("nohdr.safetensors", z, sizeof z, F, "invalid JSON");
    }
    {   /* an absurd length inside a (sparse) file big enough to hold it */
        const char *path = tmp_path("absurd.safetensors");
        unsigned char b[8] = {0x01, 0xe1, 0xf5, 0x05, 0, 0, 0, 0}; /* 100000001 */
        write_bytes(path, b, 8);
        CHECK(truncate(path, 8 + 100000001 + 16) == 0);
        ckv_safetensors *st = NULL;
        CHECK_FAILS(ckv_safetensors_open_file(&st, path), F, "header length 100000001 is absurd");
        CHECK(strstr(ckv_error_message(), "absurd.safetensors") != NULL);
        unlink(path);
    }

    /* JSON */
    BAD("{\"w\": {\"dtype\": \"F32\", ", 0, F, "invalid JSON");
    BAD("[1, 2]", 0, F, "header is not a JSON object");
    BAD("{} trailing", 0, F, "unexpected bytes after the JSON value");
    BAD("{}{}", 0, F, "unexpected bytes after the JSON value");
    {
        const char hdr[] = "{\"a\0\": 1}";
        const char *path = tmp_path("nul.safetensors");
        unsigned char b[8 + sizeof hdr - 1] = {(unsigned char)(sizeof hdr - 1)};
        memcpy(b + 8, hdr, sizeof hdr - 1);
        write_bytes(path, b, sizeof b);
        ckv_safetensors *st = NULL;
        CHECK_FAILS(ckv_safetensors_open_file(&st, path), F, "nul.safetensors: header contains a NUL byte");
    }
    BAD("{\"__metadata__\": [1]}", 0, F, "__metadata__ is not an object");
    BAD("{\"__metadata__\": {\"format\": 1}}", 0, F, "__metadata__ value 'format' is not a string");

    /* entries */
    BAD("{\"w\": 5}", 0, F, "tensor 'w': header entry is not an object");
    BAD("{\"w\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4, F, "tensor 'w': missing or non-string dtype");
    BAD("{\"w\": {\"dtype\": 32, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, F,
        "tensor 'w': missing or non-string dtype");
    BAD("{\"w\": {\"dtype\": \"F99\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4, U,
        "tensor 'w': unknown dtype 'F99'");
    BAD("{\"w\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4, F, "tensor 'w': missing or non-list shape");
    BAD("{\"w\": {\"dtype\": \"F32\", \"shape\": [-1, 4], \"data_offsets\": [0, 4]}}", 4, F,
        "tensor 'w': shape[0] is negative (-1)");
    BAD("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 1.5], \"data_offsets\": [0, 12]}}", 12, F,
        "tensor 'w': shape[1] is not a non-negative integer");
    BAD("{\"w\": {\"dtype\": \"F32\", \"shape\": [\"2\"], \"data_offsets\": [0, 8]}}", 8, F,
        "tensor 'w': shape[0] is not a non-negative integer");
    BAD("{\"w\": {\"dtype\": \"F32\", \"shape\": [1, 1, 1, 1, 1], \"data_offsets\": [0, 4]}}", 4, U,
        "tensor 'w': 5 dimensions (ckv reads at most 4)");
    BAD("{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4294967296], \"data_offsets\": [0, 0]}}", 0,
        F, "tensor 'w': shape [4294967296, 4294967296, 4294967296] overflows");
    BAD("{\"w\": {\"dtype\": \"F4\", \"shape\": [3], \"data_offsets\": [0, 2]}}", 2, F,
        "tensor 'w': shape [3] of F4 is not a whole number of bytes");
    BAD("{\"model.layers.0.mlp.up_proj.weight\":"
        " {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 12]}}",
        16, F,
        "tensor 'model.layers.0.mlp.up_proj.weight': shape [2, 2] of F32 needs 16 bytes but data_offsets [0, 12]"
        " hold 12");
    BAD("{\"w\": {\"dtype\": \"BF16\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8, F,
        "tensor 'w': shape [3] of BF16 needs 6 bytes");
    BAD("{\"model.layers.0.mlp.up_proj.weight\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
        8, F,
        "tensor 'model.layers.0.mlp.up_proj.weight': data_offsets [4, 12] past end of file (8 bytes of data");
    BAD("{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [9, 9]}}", 8, F,
        "tensor 'w': data_offsets [9, 9] past end of file");
    BAD("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 4]}}", 8, F,
        "tensor 'w': data_offsets [8, 4] end before they begin");
    BAD("{\"w\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4, F, "tensor 'w': data_offsets must be two");
    BAD("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0]}}", 4, F,
        "tensor 'w': data_offsets must be two");
    BAD("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4, 8]}}", 8, F,
        "tensor 'w': data_offsets must be two");
    BAD("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}", 4, F,
        "tensor 'w': data_offsets must be two non-negative integers");
    BAD("{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, \"4\"]}}", 4, F,
        "tensor 'w': data_offsets must be two");
    BAD("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
        " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
        12, F, "tensor 'b': data_offsets [4, 12] overlap tensor 'a' [0, 8]");
    BAD("{\"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]},"
        " \"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
        " \"c\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 8]}}",
        16, F, "tensor 'b': data_offsets [4, 8] overlap tensor 'a' [0, 16]");
    BAD("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
        " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
        8, F, "duplicate key 'a' in one object");

    /* not a file */
    ckv_safetensors *st = NULL;
    CHECK_FAILS(ckv_safetensors_open_file(&st, tmp_path("does-not-exist.safetensors")), CKV_STATUS_ERR_IO,
                "does-not-exist.safetensors: No such file");
    CHECK_FAILS(ckv_safetensors_open_file(&st, tmp_dir), CKV_STATUS_ERR_IO, "not a regular file");
    CHECK(st == NULL);
}

/* ---- sharded checkpoints ----------------------------------------------------------------------- */

/* shard 1: a F32 [2, 2] = 1..4, b BF16 [2] = {1, -2.5}; shard 2: c F16 [3] = {1, 0.5, -2.5}, x F32 [1] */
static void write_shards(const char *dir) {
    char p[1100];
    float a[4] = {1, 2, 3, 4};
    uint16_t b[2] = {0x3F80, 0xC020};
    unsigned char d1[20];
    memcpy(d1, a, 16);
    memcpy(d1 + 16, b, 4);
    snprintf(p, sizeof p, "%s/model-00001-of-00002.safetensors", dir);
    write_st(p,
             "{\"a\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]},"
             " \"b\": {\"dtype\": \"BF16\", \"shape\": [2], \"data_offsets\": [16, 20]}}",
             0, UINT64_MAX, d1, sizeof d1);
    uint16_t c[3] = {0x3C00, 0x3800, 0xC100};
    float x = 9.0f;
    unsigned char d2[12];
    memcpy(d2, &x, 4);
    memcpy(d2 + 4, c, 6);
    snprintf(p, sizeof p, "%s/model-00002-of-00002.safetensors", dir);
    write_st(p,
             "{\"x\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
             " \"c\": {\"dtype\": \"F16\", \"shape\": [3], \"data_offsets\": [4, 10]}}",
             3, UINT64_MAX, d2, 10);
}

static void write_index(const char *dir, const char *text) {
    char p[1100];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    write_bytes(p, text, strlen(text));
}

static const char good_index[] =
    "{\"metadata\": {\"total_size\": 30}, \"weight_map\": {"
    "\"a\": \"model-00001-of-00002.safetensors\", \"c\": \"model-00002-of-00002.safetensors\","
    " \"b\": \"model-00001-of-00002.safetensors\"}}";

static void test_sharded(void) {
    const char *dir = tmp_path("sharded");
    CHECK(mkdir(dir, 0755) == 0);
    write_shards(dir);
    write_index(dir, good_index);

    ckv_safetensors *st = NULL;
    CHECK_OK(ckv_safetensors_open_dir(&st, dir));
    if (st) {
        CHECK(ckv_safetensors_count(st) == 3);
        CHECK(ckv_safetensors_find(st, "x") == NULL); /* in a shard but not in the index */
        const ckv_st_tensor *a = ckv_safetensors_find(st, "a"), *b = ckv_safetensors_find(st, "b"),
                            *c = ckv_safetensors_find(st, "c");
        CHECK(a && b && c && a->file == 0 && b->file == 0 && c->file == 1);
        CHECK(c && c->dtype == CKV_DTYPE_F16 && c->nbytes == 6);
        CHECK(strstr(ckv_safetensors_file_path(st, 0), "sharded/model-00001-of-00002.safetensors") != NULL);
        CHECK(strstr(ckv_safetensors_file_path(st, 1), "sharded/model-00002-of-00002.safetensors") != NULL);
        CHECK(ckv_safetensors_file_path(st, 2) == NULL);
        float out[4];
        const int64_t as[2] = {2, 2}, bs[1] = {2}, cs[1] = {3};
        CHECK_OK(ckv_safetensors_read_f32(st, "a", 2, as, 1, 2, 0, 2, out));
        CHECK(out[0] == 3.0f && out[1] == 4.0f);
        CHECK_OK(ckv_safetensors_read_f32(st, "b", 1, bs, 0, -1, 0, -1, out));
        CHECK(out[0] == 1.0f && out[1] == -2.5f);
        CHECK_OK(ckv_safetensors_read_f32(st, "c", 1, cs, 0, -1, 0, -1, out));
        CHECK(out[0] == 1.0f && out[1] == 0.5f && out[2] == -2.5f);
        CHECK_FAILS(ckv_safetensors_read_f32(st, "c", 1, bs, 0, -1, 0, -1, out), CKV_STATUS_ERR_SHAPE,
                    "model-00002-of-00002.safetensors: tensor 'c': shape [3] in the file, expected [2]");
        CHECK_FAILS(ckv_safetensors_read_f32(st, "x", 0, NULL, 0, -1, 0, -1, out), CKV_STATUS_ERR_FORMAT,
                    "model.safetensors.index.json: tensor 'x': not in the checkpoint");
        ckv_safetensors_release_pages(st);
        CHECK_OK(ckv_safetensors_read_f32(st, "c", 1, cs, 0, -1, 0, -1, out));
        CHECK(out[2] == -2.5f);
    }
    ckv_safetensors_close(st);

    /* the index wins over a model.safetensors next to it */
    char p[1100];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    write_st(p, "{}", 0, UINT64_MAX, NULL, 0);
    st = NULL;
    CHECK_OK(ckv_safetensors_open_dir(&st, dir));
    CHECK(ckv_safetensors_count(st) == 3);
    ckv_safetensors_close(st);
    unlink(p);

    /* malformed indexes */
    struct {
        const char *index;
        ckv_status code;
        const char *needle;
    } bad[] = {
        {"{\"weight_map\": {\"a\": ", CKV_STATUS_ERR_FORMAT, "model.safetensors.index.json: invalid JSON"},
        {"{\"metadata\": {}}", CKV_STATUS_ERR_FORMAT,
         "model.safetensors.index.json: missing or non-object 'weight_map'"},
        {"{\"weight_map\": [\"a\"]}", CKV_STATUS_ERR_FORMAT, "missing or non-object 'weight_map'"},
        {"{\"weight_map\": {}}", CKV_STATUS_ERR_FORMAT, "model.safetensors.index.json: 'weight_map' is empty"},
        {"{\"weight_map\": {\"a\": 1}}", CKV_STATUS_ERR_FORMAT,
         "model.safetensors.index.json: tensor 'a': shard name is not a string"},
        {"{\"weight_map\": {\"a\": \"../model-00001-of-00002.safetensors\"}}", CKV_STATUS_ERR_FORMAT,
         "tensor 'a': shard '../model-00001-of-00002.safetensors' is not a plain file name"},
        {"{\"weight_map\": {\"a\": \"sub/model.safetensors\"}}", CKV_STATUS_ERR_FORMAT,
         "tensor 'a': shard 'sub/model.safetensors' is not a plain file name"},
        {"{\"weight_map\": {\"a\": \"/etc/passwd\"}}", CKV_STATUS_ERR_FORMAT, "is not a plain file name"},
        {"{\"weight_map\": {\"a\": \"..\"}}", CKV_STATUS_ERR_FORMAT, "is not a plain file name"},
        {"{\"weight_map\": {\"a\": \"\"}}", CKV_STATUS_ERR_FORMAT, "is not a plain file name"},
        {"{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\","
         " \"zz\": \"model-00002-of-00002.safetensors\"}}",
         CKV_STATUS_ERR_FORMAT, "model.safetensors.index.json: tensor 'zz': not found in its shard"},
        {"{\"weight_map\": {\"c\": \"model-00001-of-00002.safetensors\"}}", CKV_STATUS_ERR_FORMAT,
         "tensor 'c': not found in its shard"},
        {"{\"weight_map\": {\"a\": \"model-00003-of-00003.safetensors\"}}", CKV_STATUS_ERR_IO,
         "model-00003-of-00003.safetensors: No such file"},
        {"{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"a\": \"model-00001-of-00002.safetensors\"}}",
         CKV_STATUS_ERR_FORMAT, "model.safetensors.index.json: duplicate key 'a' in one object"},
        {"{\"weight_map\": {\"a\": \"broken.safetensors\"}}", CKV_STATUS_ERR_UNSUPPORTED,
         "broken.safetensors: tensor 'q': unknown dtype"},
    };
    snprintf(p, sizeof p, "%s/broken.safetensors", dir);
    write_st(p, "{\"q\": {\"dtype\": \"Q4\", \"shape\": [1], \"data_offsets\": [0, 1]}}", 0, UINT64_MAX, "\0", 1);
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        write_index(dir, bad[k].index);
        st = (ckv_safetensors *)&n_bad;
        ckv_error_clear();
        ckv_status s = ckv_safetensors_open_dir(&st, dir);
        if (s != bad[k].code || !strstr(ckv_error_message(), bad[k].needle) || st != NULL) {
            fprintf(stderr, "FAIL index case %zu: -> %s '%s' (expected %s, '%s')\n", k, ckv_status_string(s),
                    ckv_error_message(), ckv_status_string(bad[k].code), bad[k].needle);
            ckv_test_failures++;
        }
        if (s == CKV_STATUS_OK) ckv_safetensors_close(st);
    }

    /* a directory with neither file */
    const char *empty = tmp_path("nothing");
    CHECK(mkdir(empty, 0755) == 0);
    CHECK_FAILS(ckv_safetensors_open_dir(&st, empty), CKV_STATUS_ERR_IO,
                "neither model.safetensors.index.json nor model.safetensors found");
}

/* Issue 13: a header length one byte off (the JSON padded with spaces still parses, every tensor
 * shifts), bytes left after the last tensor, and NaN / infinity in F32, F16 and BF16 weights. */
static void test_corrupt_values(void) {
    const char hdr[] = "{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 2], \"data_offsets\": [0, 16]}}";
    float w[4] = {1, 2, 3, 4};
    float out[4];
    int64_t shape[2] = {2, 2};
    ckv_safetensors *st = NULL;
    const char *p = tmp_path("off_by_one.safetensors");
    { /* header padded with 8 spaces, length one short: the last space joins the data */
        size_t hl = strlen(hdr);
        unsigned char buf[256];
        uint64_t len = hl + 7;
        for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(len >> (8 * i));
        memcpy(buf + 8, hdr, hl);
        memset(buf + 8 + hl, ' ', 8);
        memcpy(buf + 8 + hl + 8, w, sizeof w);
        write_bytes(p, buf, 8 + hl + 8 + sizeof w);
    }
    CHECK_FAILS(ckv_safetensors_open_file(&st, p), CKV_STATUS_ERR_FORMAT, "17 bytes of data after the header, but the "
                "tensors end at byte 16");
    ckv_safetensors_close(st);
    st = NULL;
    unsigned char data[20];
    memcpy(data, w, sizeof w);
    memset(data + 16, 0, 4);
    p = tmp_path("tail.safetensors");
    write_st(p, hdr, 0, UINT64_MAX, data, 20);
    CHECK_FAILS(ckv_safetensors_open_file(&st, p), CKV_STATUS_ERR_FORMAT, "wrong header length or data_offsets");
    ckv_safetensors_close(st);
    st = NULL;

    /* NaN in F32, read whole and as a slice that holds it / does not hold it */
    float wn[4] = {1, 2, NAN, 4};
    p = tmp_path("nan.safetensors");
    write_st(p, hdr, 0, UINT64_MAX, wn, sizeof wn);
    CHECK_OK(ckv_safetensors_open_file(&st, p));
    if (st) {
        CHECK_FAILS(ckv_safetensors_read_f32(st, "w", 2, shape, 0, -1, 0, -1, out), CKV_STATUS_ERR_FORMAT,
                    "tensor 'w': element 2 of the slice read is NaN (corrupt weights)");
        CHECK_FAILS(ckv_safetensors_read_f32(st, "w", 2, shape, 1, 2, 0, 2, out), CKV_STATUS_ERR_FORMAT, "is NaN");
        CHECK_FAILS(ckv_safetensors_read_f32(st, "w", 2, shape, 0, 2, 0, 1, out), CKV_STATUS_ERR_FORMAT, "is NaN");
        CHECK_OK(ckv_safetensors_read_f32(st, "w", 2, shape, 0, 1, 0, 2, out));
        CHECK_OK(ckv_safetensors_read_f32(st, "w", 2, shape, 0, 2, 1, 2, out));
    }
    ckv_safetensors_close(st);
    st = NULL;
    /* +inf in F16 (0x7C00) and NaN in BF16 (0x7FC0) */
    const char *h16[2] = {"{\"w\": {\"dtype\": \"F16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]}}",
                          "{\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 2], \"data_offsets\": [0, 8]}}"};
    const uint16_t bits[2][4] = {{0x3C00, 0x7C00, 0x3C00, 0x3C00}, {0x3F80, 0x3F80, 0x3F80, 0x7FC0}};
    const char *want[2] = {"element 1 of the slice read is infinite", "element 3 of the slice read is NaN"};
    for (int k = 0; k < 2; k++) {
        p = tmp_path(k ? "nan_bf16.safetensors" : "inf_f16.safetensors");
        write_st(p, h16[k], 0, UINT64_MAX, bits[k], sizeof bits[k]);
        CHECK_OK(ckv_safetensors_open_file(&st, p));
        if (st) CHECK_FAILS(ckv_safetensors_read_f32(st, "w", 2, shape, 0, -1, 0, -1, out), CKV_STATUS_ERR_FORMAT, want[k]);
        ckv_safetensors_close(st);
        st = NULL;
    }
}

/* The weight source over a model directory: stored_dtype and read_raw (the stored bytes of 2-D
 * slices) on the BF16 and F32 fixture checkpoints; widened, the bytes equal read_f32 exactly. */
static void test_source_raw(const char *model, ckv_dtype want) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/%s", CKV_FIXTURES, model);
    ckv_weight_source src;
    ckv_model_config cfg;
    CHECK_OK(ckv_source_open(&src, &cfg, dir));
    const char *name = "model.layers.0.self_attn.q_proj.weight";
    const int64_t R = (int64_t)cfg.n_heads * cfg.head_dim, C = cfg.hidden_size, shape[2] = {R, C};
    CHECK_MSG(src.stored_dtype(src.ctx, name) == want, "%s: stored_dtype of %s", model, name);
    CHECK(src.stored_dtype(src.ctx, "no.such.tensor") == CKV_DTYPE_F32);
    const int64_t sl[3][4] = {{0, R, 0, C}, {1, R - 1, 3, C - 5}, {2, 3, 0, 1}};
    for (int c = 0; c < 3; c++) {
        const int64_t rows = sl[c][1] - sl[c][0], cols = sl[c][3] - sl[c][2];
        const size_t n = (size_t)(rows * cols);
        void *raw = malloc(n * ckv_dtype_size(want));
        float *got = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
        CHECK_OK(src.read_raw(src.ctx, name, shape, sl[c][0], sl[c][1], sl[c][2], sl[c][3], raw));
        CHECK_OK(src.read_f32(src.ctx, name, 2, shape, sl[c][0], sl[c][1], sl[c][2], sl[c][3], ref));
        ckv_convert_to_f32(got, raw, want, n);
        CHECK_MSG(memcmp(got, ref, n * sizeof(float)) == 0, "%s: read_raw slice %d widened differs from read_f32",
                  model, c);
        free(raw), free(got), free(ref);
    }
    uint8_t small[16];
    CHECK_FAILS(src.read_raw(src.ctx, name, shape, 0, R + 1, 0, C, small), CKV_STATUS_ERR_RANGE, "outside its shape");
    const int64_t wrong[2] = {R, C + 1};
    CHECK_FAILS(src.read_raw(src.ctx, name, wrong, 0, 1, 0, 1, small), CKV_STATUS_ERR_SHAPE, "q_proj.weight");
    ckv_source_close(&src);
}

int main(void) {
    snprintf(tmp_dir, sizeof tmp_dir, "%s/test_safetensors.%ld", CKV_TEST_TMP, (long)getpid());
    remove_tree(tmp_dir);
    if (mkdir(tmp_dir, 0755) != 0) {
        fprintf(stderr, "cannot create %s\n", tmp_dir);
        return 1;
    }
    test_valid();
    test_malformed();
    test_sharded();
    test_corrupt_values();
    test_source_raw("llama_gqa_bf16", CKV_DTYPE_BF16);
    test_source_raw("llama_gqa", CKV_DTYPE_F32);
    int rc = ckv_test_finish("test_safetensors");
    if (rc == 0) remove_tree(tmp_dir);
    return rc;
}
