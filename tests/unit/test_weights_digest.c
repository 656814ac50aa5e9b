/* test_weights_digest.c - the per-file model digests the ranks of a job compare (model/weights_digest.h),
 * on a copy of the llama_gqa fixture: the same bytes give the same digests under any path; with
 * `parts` tensor-parallel ranks a flipped byte at either end of any rank's slice of a row-split
 * (q_proj) or column-split (o_proj) tensor changes the sampled digest, and so does a header byte; a
 * byte anywhere changes the full digest; sample mode reads a bounded number of bytes per tensor.
 * Errors name the file. With a model path as argument it also prints the cost of both modes on it. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckv_test.h"
#include "core/timer.h"
#include "model/safetensors.h"
#include "model/weights_digest.h"

static char dir[600], file[700];

static void flip(long long off) {
    FILE *f = fopen(file, "r+b");
    CHECK(f != NULL);
    if (!f) return;
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc(c ^ 0x10, f);
    fclose(f);
}

static uint64_t digest_of(ckv_digest_mode mode, int parts, const char *what) {
    ckv_weights_digest d;
    ckv_status st = ckv_weights_digest_compute(&d, dir, mode, parts);
    CHECK_MSG(st == CKV_STATUS_OK && d.n == 2, "%s: digest failed (%s), %d files", what, ckv_error_message(), d.n);
    uint64_t h = d.n == 2 ? d.digest[1] : 0; /* model.safetensors, after config.json */
    if (d.n == 2) CHECK_MSG(!strcmp(d.names[0], "config.json") && !strcmp(d.names[1], "model.safetensors"), "%s: files %s, %s", what,
                            d.names[0], d.names[1]);
    ckv_weights_digest_free(&d);
    return h;
}

/* offset in the file of element (row, col) of a 2-D F32 tensor */
static long long offset_of(const ckv_safetensors *st, const char *name, int64_t row, int64_t col, const unsigned char *map0) {
    const ckv_st_tensor *t = ckv_safetensors_find(st, name);
    CHECK_MSG(t != NULL, "no tensor %s", name);
    if (!t) return 0;
    return (long long)((const unsigned char *)t->data - map0) + (row * t->shape[1] + col) * 4;
}

static void time_model(const char *path) {
    for (int rep = 0; rep < 3; rep++)
        for (int m = CKV_DIGEST_SAMPLE; m <= CKV_DIGEST_FULL; m++) {
            ckv_weights_digest d;
            double t0 = ckv_time_now();
            ckv_status st = ckv_weights_digest_compute(&d, path, (ckv_digest_mode)m, 2);
            double ms = 1e3 * (ckv_time_now() - t0);
            CHECK_MSG(st == CKV_STATUS_OK, "%s: %s", path, ckv_error_message());
            printf("%s --verify-weights %s (2 parts): %d files, %.1f KiB hashed, %.2f ms\n", path,
                   m == CKV_DIGEST_SAMPLE ? "sample" : "full", d.n, (double)d.bytes_read / 1024, ms);
            ckv_weights_digest_free(&d);
        }
}

/* A tensor whose rows (4 KiB) are longer than a block, so each rank's columns lie inside the rows,
 * away from the tensor's first and last block: w [8, 1024] F32. */
static void wide_rows(void) {
    snprintf(dir, sizeof dir, "%s/digest_unit_wide", CKV_TEST_TMP);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cp '%s/models/llama_gqa/config.json' '%s/'", dir, dir, CKV_FIXTURES, dir);
    CHECK(system(cmd) == 0);
    char head[256];
    int hl = snprintf(head, sizeof head, "{\"w\":{\"dtype\":\"F32\",\"shape\":[8,1024],\"data_offsets\":[0,32768]}}");
    while (hl % 8) head[hl++] = ' ';
    FILE *f = fopen(file, "wb");
    CHECK(f != NULL);
    if (!f) return;
    uint64_t n = (uint64_t)hl;
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(n >> (8 * i));
    fwrite(len8, 1, 8, f);
    fwrite(head, 1, (size_t)hl, f);
    for (int i = 0; i < 8 * 1024; i++) {
        float v = (float)i * 0.25f;
        fwrite(&v, 4, 1, f);
    }
    fclose(f);
    long long data = 8 + hl;
    struct { int parts; int row, col; const char *what; } cases[] = {
        {2, 0, 512, "rank 1's first column in row 0"},   {2, 7, 1023, "rank 1's last column in the last row"},
        {2, 0, 511, "rank 0's last column in row 0"},    {2, 7, 512, "rank 1's first column in the last row"},
        {2, 4, 0, "rank 1's first row"},                 {2, 3, 1023, "rank 0's last row's end"},
        {4, 0, 256, "rank 1 of 4: its first column"},    {4, 7, 767, "rank 2 of 4: its last column in the last row"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t before = digest_of(CKV_DIGEST_SAMPLE, cases[i].parts, cases[i].what);
        long long off = data + ((long long)cases[i].row * 1024 + cases[i].col) * 4;
        flip(off);
        uint64_t after = digest_of(CKV_DIGEST_SAMPLE, cases[i].parts, cases[i].what);
        flip(off);
        CHECK_MSG(after != before, "wide rows, sample, %d parts: %s (file offset %lld) is not sampled", cases[i].parts,
                  cases[i].what, off);
    }
}

int main(int argc, char **argv) {
    snprintf(dir, sizeof dir, "%s/digest_unit_model", CKV_TEST_TMP);
    snprintf(file, sizeof file, "%s/model.safetensors", dir);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && mkdir -p '%s' && cp '%s/models/llama_gqa/config.json' '%s/models/llama_gqa/model.safetensors' '%s/'",
             dir, dir, CKV_FIXTURES, CKV_FIXTURES, dir);
    CHECK(system(cmd) == 0);

    uint64_t s2 = digest_of(CKV_DIGEST_SAMPLE, 2, "sample"), f0 = digest_of(CKV_DIGEST_FULL, 1, "full");
    CHECK(s2 == digest_of(CKV_DIGEST_SAMPLE, 2, "sample again") && f0 == digest_of(CKV_DIGEST_FULL, 1, "full again"));
    CHECK_MSG(s2 != digest_of(CKV_DIGEST_SAMPLE, 3, "3 parts"), "the parts are part of what is sampled");
    { /* the same digests from the fixture's own directory */
        ckv_weights_digest d;
        char orig[700];
        snprintf(orig, sizeof orig, "%s/models/llama_gqa", CKV_FIXTURES);
        CHECK_OK(ckv_weights_digest_compute(&d, orig, CKV_DIGEST_SAMPLE, 2));
        int shard = -1;
        for (int i = 0; i < d.n; i++)
            if (!strcmp(d.names[i], "model.safetensors")) shard = i;
        CHECK_MSG(shard >= 0 && d.digest[shard] == s2, "another path to the same bytes digests differently");
        ckv_weights_digest_free(&d);
    }
    ckv_safetensors *st = NULL;
    CHECK_OK(ckv_safetensors_open_file(&st, file));
    if (!st) return ckv_test_finish("test_weights_digest");
    /* the map's start: the first tensor's data minus its offset past the header */
    FILE *f = fopen(file, "rb");
    unsigned char len8[8] = {0};
    CHECK(f && fread(len8, 1, 8, f) == 8);
    if (f) fclose(f);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    const unsigned char *lowest = NULL;
    for (int i = 0; i < ckv_safetensors_count(st); i++) {
        const unsigned char *p = ckv_safetensors_at(st, i)->data;
        if (!lowest || p < lowest) lowest = p;
    }
    const unsigned char *map0 = lowest - 8 - hlen; /* safetensors data starts right after the header */

    struct { const char *name; int parts; int64_t row, col; const char *what; } cases[] = {
        /* o_proj [64, 64] is split by columns: part r of P owns columns [64 r / P, 64 (r + 1) / P) */
        {"model.layers.1.self_attn.o_proj.weight", 2, 0, 32, "o_proj: the first byte of rank 1's columns in row 0"},
        {"model.layers.1.self_attn.o_proj.weight", 2, 63, 63, "o_proj: the last byte of rank 1's columns in the last row"},
        {"model.layers.1.self_attn.o_proj.weight", 2, 63, 0, "o_proj: rank 0's columns in the last row"},
        {"model.layers.1.self_attn.o_proj.weight", 4, 0, 48, "o_proj: rank 3 of 4, its first column"},
        {"model.layers.1.self_attn.o_proj.weight", 4, 63, 31, "o_proj: rank 1 of 4, its last column in the last row"},
        /* q_proj [64, 64] is split by rows */
        {"model.layers.2.self_attn.q_proj.weight", 2, 32, 0, "q_proj: the first byte of rank 1's rows"},
        {"model.layers.2.self_attn.q_proj.weight", 2, 31, 63, "q_proj: the last byte of rank 0's rows"},
        {"model.layers.2.self_attn.q_proj.weight", 4, 48, 0, "q_proj: rank 3 of 4, its first row"},
        {"model.layers.0.mlp.down_proj.weight", 2, 0, 80, "down_proj [64, 160]: rank 1's first column"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint64_t before = digest_of(CKV_DIGEST_SAMPLE, cases[i].parts, cases[i].what);
        long long off = offset_of(st, cases[i].name, cases[i].row, cases[i].col, map0);
        flip(off);
        uint64_t after = digest_of(CKV_DIGEST_SAMPLE, cases[i].parts, cases[i].what);
        flip(off);
        CHECK_MSG(after != before, "sample, %d parts: %s (file offset %lld) is not sampled", cases[i].parts, cases[i].what, off);
        CHECK(digest_of(CKV_DIGEST_SAMPLE, cases[i].parts, "restored") == before);
    }
    /* full: a byte anywhere, here 7 of them spread over the data */
    FILE *g = fopen(file, "rb");
    long long size = 0;
    if (g && fseek(g, 0, SEEK_END) == 0) size = ftell(g);
    if (g) fclose(g);
    long long data = (long long)(8 + hlen);
    for (int k = 1; k <= 7; k++) {
        long long off = data + (size - data) * k / 8 + 1;
        flip(off);
        uint64_t after = digest_of(CKV_DIGEST_FULL, 1, "full");
        flip(off);
        CHECK_MSG(after != f0, "full: the byte at %lld is not digested", off);
    }
    /* inside the header's JSON: its metadata "pt" becomes "pd" (still a valid header) */
    char head[4096] = {0};
    g = fopen(file, "rb");
    size_t got = g ? fread(head, 1, sizeof head - 1, g) : 0;
    if (g) fclose(g);
    char *pt = NULL;
    for (size_t i = 8; i + 4 <= got && !pt; i++)
        if (!memcmp(head + i, "\"pt\"", 4)) pt = head + i;
    CHECK_MSG(pt != NULL, "no \"pt\" in the fixture's header");
    long long hoff = pt ? (long long)(pt - head) + 2 : 20;
    uint64_t before = digest_of(CKV_DIGEST_SAMPLE, 1, "header");
    flip(hoff);
    uint64_t after = digest_of(CKV_DIGEST_SAMPLE, 1, "header changed");
    flip(hoff);
    CHECK_MSG(after != before, "sample: a header byte is not digested");
    ckv_safetensors_close(st);

    /* sample mode reads a bounded amount: at most (6 + 6 parts) blocks per tensor plus the headers */
    ckv_weights_digest d;
    CHECK_OK(ckv_weights_digest_compute(&d, dir, CKV_DIGEST_SAMPLE, 2));
    CHECK_OK(ckv_safetensors_open_file(&st, file));
    uint64_t bound = (uint64_t)ckv_safetensors_count(st) * (6 + 6 * 2) * CKV_DIGEST_BLOCK + 8 + hlen + 4096;
    CHECK_MSG(d.bytes_read <= bound, "sample read %llu bytes, more than %llu", (unsigned long long)d.bytes_read,
              (unsigned long long)bound);
    ckv_safetensors_close(st);
    ckv_weights_digest_free(&d);

    /* errors name the file */
    snprintf(cmd, sizeof cmd, "%s/nowhere", dir);
    CHECK_FAILS(ckv_weights_digest_compute(&d, cmd, CKV_DIGEST_SAMPLE, 2), CKV_STATUS_ERR_IO, "nowhere");
    ckv_weights_digest_free(&d);
    CHECK(ckv_digest_mode_parse("sample") == CKV_DIGEST_SAMPLE && ckv_digest_mode_parse("full") == CKV_DIGEST_FULL &&
          ckv_digest_mode_parse("none") == CKV_DIGEST_NONE && ckv_digest_mode_parse("all") == -1);

    wide_rows();
    if (argc > 1) time_model(argv[1]);
    return ckv_test_finish("test_weights_digest");
}
