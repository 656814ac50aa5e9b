/* gguf_writer.c - GGUF files written by the tests (see gguf_writer.h). */
#include "common/gguf_writer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>



void ckv_gw_buf_put(ckv_gw_buf *b, const void *src, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        uint8_t *p = realloc(b->p, cap);
        if (!p) {
            fprintf(stderr, "out of memory\n");
            exit(1);
        }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, src, n);
    b->n += n;
}
void ckv_gw_buf_u8(ckv_gw_buf *b, uint8_t v) { ckv_gw_buf_put(b, &v, 1); }
void ckv_gw_buf_u16(ckv_gw_buf *b, uint16_t v) { ckv_gw_buf_put(b, &v, 2); }
void ckv_gw_buf_u32(ckv_gw_buf *b, uint32_t v) { ckv_gw_buf_put(b, &v, 4); }
void ckv_gw_buf_u64(ckv_gw_buf *b, uint64_t v) { ckv_gw_buf_put(b, &v, 8); }
void ckv_gw_buf_f32(ckv_gw_buf *b, float v) { ckv_gw_buf_put(b, &v, 4); }
void ckv_gw_buf_f64(ckv_gw_buf *b, double v) { ckv_gw_buf_put(b, &v, 8); }
void ckv_gw_buf_str(ckv_gw_buf *b, const char *s) {
    ckv_gw_buf_u64(b, strlen(s));
    ckv_gw_buf_put(b, s, strlen(s));
}




void ckv_gw_file_init(ckv_gw_file *f, uint32_t version) {
    memset(f, 0, sizeof *f);
    f->version = version;
    f->align = 32;
}
void ckv_gw_file_free(ckv_gw_file *f) {
    free(f->kv.p);
    for (int i = 0; i < f->nt; i++) free(f->t[i].data.p);
    memset(f, 0, sizeof *f);
}
void ckv_gw_kv_key(ckv_gw_file *f, const char *key, uint32_t type) {
    ckv_gw_buf_str(&f->kv, key);
    ckv_gw_buf_u32(&f->kv, type);
    f->n_kv++;
}
void ckv_gw_kv_u32(ckv_gw_file *f, const char *k, uint32_t v) { ckv_gw_kv_key(f, k, CKV_GW_V_U32), ckv_gw_buf_u32(&f->kv, v); }
void ckv_gw_kv_i32(ckv_gw_file *f, const char *k, int32_t v) { ckv_gw_kv_key(f, k, CKV_GW_V_I32), ckv_gw_buf_u32(&f->kv, (uint32_t)v); }
void ckv_gw_kv_u64(ckv_gw_file *f, const char *k, uint64_t v) { ckv_gw_kv_key(f, k, CKV_GW_V_U64), ckv_gw_buf_u64(&f->kv, v); }
void ckv_gw_kv_f32(ckv_gw_file *f, const char *k, float v) { ckv_gw_kv_key(f, k, CKV_GW_V_F32), ckv_gw_buf_f32(&f->kv, v); }
void ckv_gw_kv_str(ckv_gw_file *f, const char *k, const char *v) { ckv_gw_kv_key(f, k, CKV_GW_V_STR), ckv_gw_buf_str(&f->kv, v); }

/* Adds a tensor with GGUF extents ne (ne[0] fastest) and its raw bytes. */
ckv_gw_tensor *ckv_gw_file_tensor(ckv_gw_file *f, const char *name, int ndim, uint64_t ne0, uint64_t ne1, uint32_t type,
                          const void *data, size_t nbytes) {
    ckv_gw_tensor *t = &f->t[f->nt++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->type = type;
    t->offset = -1;
    ckv_gw_buf_put(&t->data, data, nbytes);
    return t;
}

uint64_t ckv_gw_align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Serialises the file: header, metadata, tensor table, padding, data. */
void ckv_gw_file_build(ckv_gw_file *f, ckv_gw_buf *out) {
    memset(out, 0, sizeof *out);
    uint64_t cur = 0, end = 0, offs[48];
    for (int i = 0; i < f->nt; i++) {
        offs[i] = f->t[i].offset >= 0 ? (uint64_t)f->t[i].offset : ckv_gw_align_up(cur, f->align);
        cur = offs[i] + f->t[i].data.n;
        if (cur > end) end = cur;
    }
    ckv_gw_buf_put(out, "GGUF", 4);
    ckv_gw_buf_u32(out, f->version);
    ckv_gw_buf_u64(out, (uint64_t)f->nt);
    ckv_gw_buf_u64(out, f->n_kv);
    ckv_gw_buf_put(out, f->kv.p, f->kv.n);
    for (int i = 0; i < f->nt; i++) {
        const ckv_gw_tensor *t = &f->t[i];
        ckv_gw_buf_str(out, t->name);
        ckv_gw_buf_u32(out, (uint32_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) ckv_gw_buf_u64(out, d < 4 ? t->ne[d] : 1);
        ckv_gw_buf_u32(out, t->type);
        ckv_gw_buf_u64(out, offs[i]);
    }
    while (out->n % f->align) ckv_gw_buf_u8(out, 0);
    size_t base = out->n;
    static const uint8_t zero[4096];
    for (uint64_t k = 0; k < end;) {
        size_t m = end - k > sizeof zero ? sizeof zero : (size_t)(end - k);
        ckv_gw_buf_put(out, zero, m);
        k += m;
    }
    for (int i = 0; i < f->nt; i++) memcpy(out->p + base + offs[i], f->t[i].data.p, f->t[i].data.n);
}

const char *ckv_gw_tmp_path(const char *name) {
    static char paths[8][1024];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 1024, "%s/gguf_%s.gguf", CKV_TEST_TMP, name);
    return p;
}

void ckv_gw_write_bytes(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(p, 1, n, fp) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(fp);
}

const char *ckv_gw_file_write(ckv_gw_file *f, const char *name) {
    ckv_gw_buf b;
    ckv_gw_file_build(f, &b);
    const char *path = ckv_gw_tmp_path(name);
    ckv_gw_write_bytes(path, b.p, b.n);
    free(b.p);
    return path;
}



void ckv_gw_add_tokens(ckv_gw_file *f, int n) {
    ckv_gw_kv_key(f, "tokenizer.ggml.tokens", CKV_GW_V_ARR);
    ckv_gw_buf_u32(&f->kv, CKV_GW_V_STR);
    ckv_gw_buf_u64(&f->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        char t[32];
        snprintf(t, sizeof t, "tok%d", i);
        ckv_gw_buf_str(&f->kv, t);
    }
}

/* The llama keys, in assorted integer types (the reader takes any). */
void ckv_gw_add_llama_kvs(ckv_gw_file *f, int D, int L, int F, int H, int Hkv, int V, const char *skip) {
    if (!skip || strcmp(skip, "general.architecture")) ckv_gw_kv_str(f, "general.architecture", "llama");
    if (!skip || strcmp(skip, "llama.context_length")) ckv_gw_kv_u32(f, "llama.context_length", 2048);
    if (!skip || strcmp(skip, "llama.embedding_length")) ckv_gw_kv_u64(f, "llama.embedding_length", (uint64_t)D);
    if (!skip || strcmp(skip, "llama.block_count")) ckv_gw_kv_key(f, "llama.block_count", CKV_GW_V_U8), ckv_gw_buf_u8(&f->kv, (uint8_t)L);
    if (!skip || strcmp(skip, "llama.feed_forward_length")) ckv_gw_kv_i32(f, "llama.feed_forward_length", F);
    if (!skip || strcmp(skip, "llama.attention.head_count"))
        ckv_gw_kv_key(f, "llama.attention.head_count", CKV_GW_V_I16), ckv_gw_buf_u16(&f->kv, (uint16_t)H);
    if (!skip || strcmp(skip, "llama.attention.head_count_kv"))
        ckv_gw_kv_key(f, "llama.attention.head_count_kv", CKV_GW_V_U16), ckv_gw_buf_u16(&f->kv, (uint16_t)Hkv);
    if (!skip || strcmp(skip, "llama.attention.layer_norm_rms_epsilon"))
        ckv_gw_kv_f32(f, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (!skip || strcmp(skip, "llama.rope.freq_base")) ckv_gw_kv_f32(f, "llama.rope.freq_base", 50000.0f);
    if (!skip || strcmp(skip, "llama.rope.dimension_count"))
        ckv_gw_kv_u32(f, "llama.rope.dimension_count", (uint32_t)(D / H));
    if (!skip || strcmp(skip, "tokenizer.ggml.bos_token_id")) ckv_gw_kv_u32(f, "tokenizer.ggml.bos_token_id", 1);
    if (!skip || strcmp(skip, "tokenizer.ggml.eos_token_id")) ckv_gw_kv_u32(f, "tokenizer.ggml.eos_token_id", 2);
    if (!skip || strcmp(skip, "tokenizer.ggml.tokens")) ckv_gw_add_tokens(f, V);
}

/* GGUF row order of a q/k projection: per head the rows (a, j) -> (j, a). */
int64_t ckv_gw_permuted_row(int64_t r, int64_t d) {
    int64_t h = r / d, w = r % d, a = w / (d / 2), j = w % (d / 2);
    return h * d + 2 * j + a;
}

/* HF matrix [rows, cols] -> GGUF storage order (rows permuted when heads > 0). */
void ckv_gw_to_gguf_rows(const float *hf, float *g, int64_t rows, int64_t cols, int heads) {
    for (int64_t r = 0; r < rows; r++) {
        int64_t gr = heads > 0 ? ckv_gw_permuted_row(r, rows / heads) : r;
        memcpy(g + gr * cols, hf + r * cols, sizeof(float) * (size_t)cols);
    }
}

int64_t ckv_gw_read_size(int64_t r0, int64_t r1, int64_t c0, int64_t c1) { return (r1 - r0) * (c1 - c0); }
