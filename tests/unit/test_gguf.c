/* test_gguf.c - the GGUF reader (model/gguf.c) on files this test writes into CKV_TEST_TMP:
 *  - each tensor type (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) quantised here by a plain
 *    reference quantiser written from the published block layouts; what ckv dequantises must equal the
 *    value the quantiser's codes stand for (up to fp32 rounding) and lie within the format's error of
 *    the original; whole tensors, row slices and column slices that cut quant blocks; GGUF v2 and v3;
 *  - the q/k rotary row permutation of the HF -> GGUF conversion is undone (weights and biases);
 *  - the stored bytes (read_raw) of whole tensors and row / whole-block column slices, dequantised,
 *    equal read_f32; stored_dtype names each type;
 *  - a qwen2 file maps its metadata (qwen2.* keys, biases) and keeps q/k rows as stored;
 *  - metadata of every value type and array element type; alignment 32 (default), 64 and 256 with
 *    padding and gaps; config mapping (sizes in assorted integer types, rope scaling, bos/eos, tied
 *    embeddings, dtype);
 *  - a fixture checkpoint (tests/fixtures/models/mistral_gqa, a llama-shaped model with default rope)
 *    converted to GGUF reads back tensor for tensor, slice for slice, equal to the safetensors source,
 *    and the forward over it gives bit-identical logits;
 *  - malformed files each fail with the right status and a message naming the problem.
 * It does not test llama.cpp agreement on a real model (tests/cli/test_gguf_parity.sh does). */
#include <math.h>
#include <stdint.h>

#include "ckv_test.h"
#include "core/quant.h"
#include "core/tensor.h"
#include "engine/session.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/source.h"

/* ---- a GGUF writer ----------------------------------------------------------------------------- */

typedef struct {
    uint8_t *p;
    size_t n, cap;
} tbuf;

static void tb_put(tbuf *b, const void *src, size_t n) {
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
static void tb_u8(tbuf *b, uint8_t v) { tb_put(b, &v, 1); }
static void tb_u16(tbuf *b, uint16_t v) { tb_put(b, &v, 2); }
static void tb_u32(tbuf *b, uint32_t v) { tb_put(b, &v, 4); }
static void tb_u64(tbuf *b, uint64_t v) { tb_put(b, &v, 8); }
static void tb_f32(tbuf *b, float v) { tb_put(b, &v, 4); }
static void tb_f64(tbuf *b, double v) { tb_put(b, &v, 8); }
static void tb_str(tbuf *b, const char *s) {
    tb_u64(b, strlen(s));
    tb_put(b, s, strlen(s));
}

enum { V_U8, V_I8, V_U16, V_I16, V_U32, V_I32, V_F32, V_BOOL, V_STR, V_ARR, V_U64, V_I64, V_F64 };
enum {
    T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8, T_Q2_K = 10, T_Q4_K = 12,
    T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30
};

typedef struct {
    char name[96];
    int ndim;
    uint64_t ne[4];
    uint32_t type;
    tbuf data;
    int64_t offset; /* -1: the next aligned slot */
} ttensor;

typedef struct {
    uint32_t version;
    tbuf kv;
    uint64_t n_kv;
    ttensor t[48];
    int nt;
    size_t align; /* where tensors go (general.alignment is written separately, or not) */
} tfile;

static void tf_init(tfile *f, uint32_t version) {
    memset(f, 0, sizeof *f);
    f->version = version;
    f->align = 32;
}
static void tf_free(tfile *f) {
    free(f->kv.p);
    for (int i = 0; i < f->nt; i++) free(f->t[i].data.p);
    memset(f, 0, sizeof *f);
}
static void kv_key(tfile *f, const char *key, uint32_t type) {
    tb_str(&f->kv, key);
    tb_u32(&f->kv, type);
    f->n_kv++;
}
static void kv_u32(tfile *f, const char *k, uint32_t v) { kv_key(f, k, V_U32), tb_u32(&f->kv, v); }
static void kv_i32(tfile *f, const char *k, int32_t v) { kv_key(f, k, V_I32), tb_u32(&f->kv, (uint32_t)v); }
static void kv_u64(tfile *f, const char *k, uint64_t v) { kv_key(f, k, V_U64), tb_u64(&f->kv, v); }
static void kv_f32(tfile *f, const char *k, float v) { kv_key(f, k, V_F32), tb_f32(&f->kv, v); }
static void kv_str(tfile *f, const char *k, const char *v) { kv_key(f, k, V_STR), tb_str(&f->kv, v); }

/* Adds a tensor with GGUF extents ne (ne[0] fastest) and its raw bytes. */
static ttensor *tf_tensor(tfile *f, const char *name, int ndim, uint64_t ne0, uint64_t ne1, uint32_t type,
                          const void *data, size_t nbytes) {
    ttensor *t = &f->t[f->nt++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->ne[0] = ne0;
    t->ne[1] = ne1;
    t->type = type;
    t->offset = -1;
    tb_put(&t->data, data, nbytes);
    return t;
}

static uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Serialises the file: header, metadata, tensor table, padding, data. */
static void tf_build(tfile *f, tbuf *out) {
    memset(out, 0, sizeof *out);
    uint64_t cur = 0, end = 0, offs[48];
    for (int i = 0; i < f->nt; i++) {
        offs[i] = f->t[i].offset >= 0 ? (uint64_t)f->t[i].offset : align_up(cur, f->align);
        cur = offs[i] + f->t[i].data.n;
        if (cur > end) end = cur;
    }
    tb_put(out, "GGUF", 4);
    tb_u32(out, f->version);
    tb_u64(out, (uint64_t)f->nt);
    tb_u64(out, f->n_kv);
    tb_put(out, f->kv.p, f->kv.n);
    for (int i = 0; i < f->nt; i++) {
        const ttensor *t = &f->t[i];
        tb_str(out, t->name);
        tb_u32(out, (uint32_t)t->ndim);
        for (int d = 0; d < t->ndim; d++) tb_u64(out, d < 4 ? t->ne[d] : 1);
        tb_u32(out, t->type);
        tb_u64(out, offs[i]);
    }
    while (out->n % f->align) tb_u8(out, 0);
    size_t base = out->n;
    static const uint8_t zero[4096];
    for (uint64_t k = 0; k < end;) {
        size_t m = end - k > sizeof zero ? sizeof zero : (size_t)(end - k);
        tb_put(out, zero, m);
        k += m;
    }
    for (int i = 0; i < f->nt; i++) memcpy(out->p + base + offs[i], f->t[i].data.p, f->t[i].data.n);
}

static const char *tmp_path(const char *name) {
    static char paths[8][1024];
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 1024, "%s/gguf_%s.gguf", CKV_TEST_TMP, name);
    return p;
}

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *fp = fopen(path, "wb");
    if (!fp || fwrite(p, 1, n, fp) != n) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
    fclose(fp);
}

static const char *tf_write(tfile *f, const char *name) {
    tbuf b;
    tf_build(f, &b);
    const char *path = tmp_path(name);
    write_bytes(path, b.p, b.n);
    free(b.p);
    return path;
}

/* ---- reference quantisers: bytes of blocks, the value each code stands for, and the error bound -- */

static float h2f(uint16_t h) { return ckv_f16_to_f32(h); }
static uint16_t f2h(float f) { return ckv_f32_to_f16(f); }

/* Rounds a scale up to the next fp16 value at least as large (so ranges still cover the data). */
static uint16_t f2h_up(float f) {
    uint16_t h = f2h(f);
    while (h2f(h) < f) h++;
    return h;
}

static void q8_0_block(const float *x, tbuf *o, float *rec, float *bnd) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    uint16_t h = f2h(amax / 127.0f);
    float d = h2f(h);
    tb_u16(o, h);
    for (int i = 0; i < 32; i++) {
        int q = d > 0 ? (int)lrintf(x[i] / d) : 0;
        q = q < -127 ? -127 : q > 127 ? 127 : q;
        tb_u8(o, (uint8_t)(int8_t)q);
        rec[i] = d * (float)q;
        bnd[i] = 0.5f * d;
    }
}

static void q4_0_block(const float *x, tbuf *o, float *rec, float *bnd) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    uint16_t h = f2h(amax / 7.0f);
    float d = h2f(h);
    int q[32];
    for (int i = 0; i < 32; i++) {
        q[i] = d > 0 ? (int)lrintf(x[i] / d) : 0;
        q[i] = q[i] < -8 ? -8 : q[i] > 7 ? 7 : q[i];
        rec[i] = d * (float)q[i];
        bnd[i] = 0.5f * d;
    }
    tb_u16(o, h);
    for (int i = 0; i < 16; i++) tb_u8(o, (uint8_t)((q[i] + 8) | ((q[i + 16] + 8) << 4)));
}

static void q4_1_block(const float *x, tbuf *o, float *rec, float *bnd) {
    float mn = x[0], mx = x[0];
    for (int i = 1; i < 32; i++) mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]);
    uint16_t hd = f2h_up((mx - mn) / 15.0f), hm = f2h(mn);
    float d = h2f(hd), m = h2f(hm);
    int q[32];
    for (int i = 0; i < 32; i++) {
        q[i] = d > 0 ? (int)lrintf((x[i] - m) / d) : 0;
        q[i] = q[i] < 0 ? 0 : q[i] > 15 ? 15 : q[i];
        rec[i] = d * (float)q[i] + m;
        bnd[i] = 0.5f * d + fabsf(mn - m) + 1e-6f * fabsf(m) + 1e-7f;
    }
    tb_u16(o, hd);
    tb_u16(o, hm);
    for (int i = 0; i < 16; i++) tb_u8(o, (uint8_t)(q[i] | (q[i + 16] << 4)));
}

/* Q5_0 / Q5_1 storage of 32 codes 0..31: 4 bytes of fifth bits (bit i: element i), then nibbles as in
 * Q4_0 (byte i: element i low, element i + 16 high). */
static void q5_put_codes(tbuf *o, const int *u) {
    uint32_t h = 0;
    for (int i = 0; i < 32; i++) h |= (uint32_t)(u[i] >> 4) << i;
    tb_u32(o, h);
    for (int i = 0; i < 16; i++) tb_u8(o, (uint8_t)((u[i] & 15) | ((u[i + 16] & 15) << 4)));
}

static void q5_0_block(const float *x, tbuf *o, float *rec, float *bnd) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    uint16_t h = f2h_up(amax / 15.0f);
    float d = h2f(h);
    int u[32];
    for (int i = 0; i < 32; i++) {
        int q = d > 0 ? (int)lrintf(x[i] / d) : 0;
        q = q < -16 ? -16 : q > 15 ? 15 : q;
        u[i] = q + 16;
        rec[i] = d * (float)q;
        bnd[i] = 0.5f * d;
    }
    tb_u16(o, h);
    q5_put_codes(o, u);
}

static void q5_1_block(const float *x, tbuf *o, float *rec, float *bnd) {
    float mn = x[0], mx = x[0];
    for (int i = 1; i < 32; i++) mn = fminf(mn, x[i]), mx = fmaxf(mx, x[i]);
    uint16_t hd = f2h_up((mx - mn) / 31.0f), hm = f2h(mn);
    float d = h2f(hd), m = h2f(hm);
    int u[32];
    for (int i = 0; i < 32; i++) {
        u[i] = d > 0 ? (int)lrintf((x[i] - m) / d) : 0;
        u[i] = u[i] < 0 ? 0 : u[i] > 31 ? 31 : u[i];
        rec[i] = d * (float)u[i] + m;
        bnd[i] = 0.5f * d + fabsf(mn - m) + 1e-6f * fabsf(m) + 1e-7f;
    }
    tb_u16(o, hd);
    tb_u16(o, hm);
    q5_put_codes(o, u);
}

/* Q4_K / Q5_K (levels 15 / 31): 8 sub-blocks of 32, each with a 6-bit scale and 6-bit minimum under
 * fp16 d and dmin. The minimum and scale are rounded up so the representable range covers the
 * sub-block. Q5_K stores the fifth bits (qh: bit 2g of byte l for element l of sub-block 2g, bit 2g + 1
 * for sub-block 2g + 1) between the scales and the nibbles. */
static void k_quant_block(const float *x, tbuf *o, float *rec, float *bnd, int levels) {
    float smin[8], smax[8], need[8];
    float mmax = 0;
    for (int j = 0; j < 8; j++) {
        smin[j] = 0, smax[j] = 0;
        for (int l = 0; l < 32; l++) smin[j] = fminf(smin[j], x[32 * j + l]), smax[j] = fmaxf(smax[j], x[32 * j + l]);
        mmax = fmaxf(mmax, -smin[j]);
    }
    uint16_t hmin = f2h_up(mmax / 63.0f);
    float dmin = h2f(hmin);
    int sc[8], mn[8];
    float nmax = 0;
    for (int j = 0; j < 8; j++) {
        mn[j] = dmin > 0 ? (int)ceilf(-smin[j] / dmin) : 0;
        if (mn[j] > 63) mn[j] = 63;
        need[j] = (smax[j] + dmin * (float)mn[j]) / (float)levels;
        nmax = fmaxf(nmax, need[j]);
    }
    uint16_t hd = f2h_up(nmax / 63.0f);
    float d = h2f(hd);
    for (int j = 0; j < 8; j++) {
        sc[j] = d > 0 ? (int)ceilf(need[j] / d) : 0;
        if (sc[j] > 63) sc[j] = 63;
    }
    uint8_t s[12] = {0};
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            s[j] |= (uint8_t)sc[j];
            s[j + 4] |= (uint8_t)mn[j];
        } else {
            s[j + 4] = (uint8_t)((sc[j] & 15) | ((mn[j] & 15) << 4));
            s[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            s[j] |= (uint8_t)((mn[j] >> 4) << 6);
        }
    }
    int q[256];
    for (int j = 0; j < 8; j++) {
        float ds = d * (float)sc[j], ms = dmin * (float)mn[j];
        for (int l = 0; l < 32; l++) {
            int e = 32 * j + l;
            q[e] = ds > 0 ? (int)lrintf((x[e] + ms) / ds) : 0;
            q[e] = q[e] < 0 ? 0 : q[e] > levels ? levels : q[e];
            rec[e] = ds * (float)q[e] - ms;
            bnd[e] = 0.5f * ds + 1e-6f * (ds + ms) + 1e-7f;
        }
    }
    tb_u16(o, hd);
    tb_u16(o, hmin);
    tb_put(o, s, 12);
    if (levels == 31) {
        uint8_t qh[32] = {0};
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                qh[l] |= (uint8_t)(((q[64 * g + l] >> 4) << (2 * g)) | ((q[64 * g + 32 + l] >> 4) << (2 * g + 1)));
        tb_put(o, qh, 32);
    }
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) tb_u8(o, (uint8_t)((q[64 * g + l] & 15) | ((q[64 * g + 32 + l] & 15) << 4)));
}

/* Q6_K: 16 sub-blocks of 16 with an int8 scale under fp16 d; codes -32..31 stored as 0..63 split into a
 * low nibble (ql) and two high bits (qh). */
static void q6_k_block(const float *x, tbuf *o, float *rec, float *bnd) {
    float amax[16], top = 0;
    for (int j = 0; j < 16; j++) {
        amax[j] = 0;
        for (int l = 0; l < 16; l++) amax[j] = fmaxf(amax[j], fabsf(x[16 * j + l]));
        top = fmaxf(top, amax[j] / 31.0f);
    }
    uint16_t hd = f2h_up(top / 127.0f);
    float d = h2f(hd);
    int sc[16], q[256];
    for (int j = 0; j < 16; j++) {
        sc[j] = d > 0 ? (int)ceilf(amax[j] / 31.0f / d) : 0;
        if (sc[j] > 127) sc[j] = 127;
        float ds = d * (float)sc[j];
        for (int l = 0; l < 16; l++) {
            int e = 16 * j + l;
            q[e] = ds > 0 ? (int)lrintf(x[e] / ds) : 0;
            q[e] = q[e] < -32 ? -32 : q[e] > 31 ? 31 : q[e];
            rec[e] = ds * (float)q[e];
            bnd[e] = 0.5f * ds + 1e-6f * ds * 32.0f + 1e-7f;
        }
    }
    uint8_t ql[128] = {0}, qh[64] = {0};
    for (int e = 0; e < 256; e++) {
        int u = q[e] + 32, half = e / 128, l = e % 32, quarter = (e % 128) / 32;
        int li = 64 * half + l + (quarter & 1) * 32; /* quarters 1 and 3 use ql[l + 32] */
        if (quarter < 2)
            ql[li] |= (uint8_t)(u & 15);
        else
            ql[li] |= (uint8_t)((u & 15) << 4);
        qh[32 * half + l] |= (uint8_t)((u >> 4) << (2 * quarter));
    }
    tb_put(o, ql, 128);
    tb_put(o, qh, 64);
    for (int j = 0; j < 16; j++) tb_u8(o, (uint8_t)(int8_t)sc[j]);
    tb_u16(o, hd);
}

static int type_block(uint32_t type) {
    switch (type) {
    case T_Q4_0: case T_Q4_1: case T_Q5_0: case T_Q5_1: case T_Q8_0: return 32;
    case T_Q4_K: case T_Q5_K: case T_Q6_K: return 256;
    default: return 1;
    }
}

static const char *type_name(uint32_t type) {
    switch (type) {
    case T_F32: return "F32";
    case T_F16: return "F16";
    case T_BF16: return "BF16";
    case T_Q8_0: return "Q8_0";
    case T_Q4_0: return "Q4_0";
    case T_Q4_1: return "Q4_1";
    case T_Q5_0: return "Q5_0";
    case T_Q5_1: return "Q5_1";
    case T_Q4_K: return "Q4_K";
    case T_Q5_K: return "Q5_K";
    case T_Q6_K: return "Q6_K";
    default: return "?";
    }
}

/* Quantises n values (n a multiple of the block size) into o; rec and bnd as above. */
static void quantise(uint32_t type, const float *x, size_t n, tbuf *o, float *rec, float *bnd) {
    int B = type_block(type);
    for (size_t i = 0; i < n; i += (size_t)B) {
        switch (type) {
        case T_F32:
            tb_f32(o, x[i]), rec[i] = x[i], bnd[i] = 0;
            break;
        case T_F16: {
            uint16_t h = f2h(x[i]);
            tb_u16(o, h), rec[i] = h2f(h), bnd[i] = fabsf(x[i]) * 0x1p-11f + 0x1p-25f;
            break;
        }
        case T_BF16: {
            uint16_t h = ckv_f32_to_bf16(x[i]);
            tb_u16(o, h), rec[i] = ckv_bf16_to_f32(h), bnd[i] = fabsf(x[i]) * 0x1p-8f;
            break;
        }
        case T_Q8_0: q8_0_block(x + i, o, rec + i, bnd + i); break;
        case T_Q4_0: q4_0_block(x + i, o, rec + i, bnd + i); break;
        case T_Q4_1: q4_1_block(x + i, o, rec + i, bnd + i); break;
        case T_Q5_0: q5_0_block(x + i, o, rec + i, bnd + i); break;
        case T_Q5_1: q5_1_block(x + i, o, rec + i, bnd + i); break;
        case T_Q4_K: k_quant_block(x + i, o, rec + i, bnd + i, 15); break;
        case T_Q5_K: k_quant_block(x + i, o, rec + i, bnd + i, 31); break;
        case T_Q6_K: q6_k_block(x + i, o, rec + i, bnd + i); break;
        default: break;
        }
    }
}

/* Test values with a different character per 32-block: scale, sign bias, an all-zero block, a block
 * of one sign, a wide dynamic range. */
static void make_values(float *x, size_t n, unsigned seed) {
    static const float scale[] = {1.0f, 0.01f, 5.0f, 0.0f, 0.3f, 2.0f, 0.05f, 1.5f, 40.0f};
    static const float bias[] = {0.0f, 0.4f, -0.3f, 0.0f, 0.7f, -0.6f, 0.1f, 0.0f, -0.2f};
    for (size_t i = 0; i < n; i++) {
        size_t b = (i / 32 + seed) % 9;
        double r = sin((double)(i + 1) * 12.9898 + seed * 78.233) * 43758.5453;
        r -= floor(r);
        x[i] = scale[b] * ((float)r - 0.5f + bias[b]);
        if (b == 8 && i % 7 == 0) x[i] *= 0.001f; /* tiny values next to large ones */
    }
}

/* ---- llama files ------------------------------------------------------------------------------- */

enum { TD = 256, TV = 8, TH = 4, THKV = 2, THD = 64, TL = 1, TF = 256 };

static void add_tokens(tfile *f, int n) {
    kv_key(f, "tokenizer.ggml.tokens", V_ARR);
    tb_u32(&f->kv, V_STR);
    tb_u64(&f->kv, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        char t[32];
        snprintf(t, sizeof t, "tok%d", i);
        tb_str(&f->kv, t);
    }
}

/* The llama keys, in assorted integer types (the reader takes any). */
static void add_llama_kvs(tfile *f, int D, int L, int F, int H, int Hkv, int V, const char *skip) {
    if (!skip || strcmp(skip, "general.architecture")) kv_str(f, "general.architecture", "llama");
    if (!skip || strcmp(skip, "llama.context_length")) kv_u32(f, "llama.context_length", 2048);
    if (!skip || strcmp(skip, "llama.embedding_length")) kv_u64(f, "llama.embedding_length", (uint64_t)D);
    if (!skip || strcmp(skip, "llama.block_count")) kv_key(f, "llama.block_count", V_U8), tb_u8(&f->kv, (uint8_t)L);
    if (!skip || strcmp(skip, "llama.feed_forward_length")) kv_i32(f, "llama.feed_forward_length", F);
    if (!skip || strcmp(skip, "llama.attention.head_count"))
        kv_key(f, "llama.attention.head_count", V_I16), tb_u16(&f->kv, (uint16_t)H);
    if (!skip || strcmp(skip, "llama.attention.head_count_kv"))
        kv_key(f, "llama.attention.head_count_kv", V_U16), tb_u16(&f->kv, (uint16_t)Hkv);
    if (!skip || strcmp(skip, "llama.attention.layer_norm_rms_epsilon"))
        kv_f32(f, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (!skip || strcmp(skip, "llama.rope.freq_base")) kv_f32(f, "llama.rope.freq_base", 50000.0f);
    if (!skip || strcmp(skip, "llama.rope.dimension_count"))
        kv_u32(f, "llama.rope.dimension_count", (uint32_t)(D / H));
    if (!skip || strcmp(skip, "tokenizer.ggml.bos_token_id")) kv_u32(f, "tokenizer.ggml.bos_token_id", 1);
    if (!skip || strcmp(skip, "tokenizer.ggml.eos_token_id")) kv_u32(f, "tokenizer.ggml.eos_token_id", 2);
    if (!skip || strcmp(skip, "tokenizer.ggml.tokens")) add_tokens(f, V);
}

/* GGUF row order of a q/k projection: per head the rows (a, j) -> (j, a). */
static int64_t permuted_row(int64_t r, int64_t d) {
    int64_t h = r / d, w = r % d, a = w / (d / 2), j = w % (d / 2);
    return h * d + 2 * j + a;
}

/* HF matrix [rows, cols] -> GGUF storage order (rows permuted when heads > 0). */
static void to_gguf_rows(const float *hf, float *g, int64_t rows, int64_t cols, int heads) {
    for (int64_t r = 0; r < rows; r++) {
        int64_t gr = heads > 0 ? permuted_row(r, rows / heads) : r;
        memcpy(g + gr * cols, hf + r * cols, sizeof(float) * (size_t)cols);
    }
}

static int64_t read_size(int64_t r0, int64_t r1, int64_t c0, int64_t c1) { return (r1 - r0) * (c1 - c0); }

/* Checks rows [r0, r1) x cols [c0, c1) of tensor `hf_name` ([R, C] in HF layout) against rec (exact
 * up to fp32 rounding) and orig (within bnd). */
static void check_read(ckv_weight_source *src, const char *what, const char *hf_name, int64_t R, int64_t C,
                       int64_t r0, int64_t r1, int64_t c0, int64_t c1, const float *orig, const float *rec,
                       const float *bnd) {
    int64_t shape[2] = {R, C};
    int64_t n = r1 < 0 ? R * C : read_size(r0, r1, c0, c1);
    float *got = calloc((size_t)n, sizeof *got);
    ckv_status s = src->read_f32(src->ctx, hf_name, 2, shape, r0, r1, c0, c1, got);
    CHECK_MSG(s == CKV_STATUS_OK, "%s: %s", what, ckv_error_message());
    if (r1 < 0) r0 = 0, r1 = R, c0 = 0, c1 = C;
    int64_t bad_exact = 0, bad_bound = 0;
    double max_exact = 0, max_ratio = 0;
    for (int64_t r = r0; r < r1; r++) {
        for (int64_t c = c0; c < c1; c++) {
            size_t i = (size_t)(r * C + c);
            float g = got[(r - r0) * (c1 - c0) + (c - c0)];
            /* fp32 rounding of scale * code + offset: relative to the magnitudes in the 32-group */
            double gmax = 0;
            for (int64_t k = c & ~(int64_t)31; k < (c | 31) + 1 && k < C; k++) gmax = fmax(gmax, fabs(orig[r * C + k]));
            double e = fabs((double)g - rec[i]);
            max_exact = fmax(max_exact, e);
            if (!(e <= 2e-6 * fabs(rec[i]) + 5e-7 * gmax)) {
                if (bad_exact++ < 3)
                    fprintf(stderr, "  %s[%lld, %lld]: got %.9g, the code stands for %.9g\n", what, (long long)r,
                            (long long)c, g, rec[i]);
            }
            double eb = fabs((double)g - orig[i]);
            if (bnd[i] > 0) max_ratio = fmax(max_ratio, eb / bnd[i]);
            if (!(eb <= bnd[i] * (1 + 1e-5) + 1e-12)) {
                if (bad_bound++ < 3)
                    fprintf(stderr, "  %s[%lld, %lld]: got %.9g for %.9g, error %.3g above the bound %.3g\n", what,
                            (long long)r, (long long)c, g, orig[i], eb, bnd[i]);
            }
        }
    }
    CHECK_MSG(bad_exact == 0, "%s: %lld values differ from their codes", what, (long long)bad_exact);
    CHECK_MSG(bad_bound == 0, "%s: %lld values outside the format's error", what, (long long)bad_bound);
    if (!bad_exact && !bad_bound && s == CKV_STATUS_OK)
        fprintf(stderr, "ok   %s: %lld values, max |diff| to codes %.2g, worst error / bound %.3f\n", what,
                (long long)n, max_exact, max_ratio);
    free(got);
}

static ckv_dtype ckv_type_of(uint32_t type) {
    switch (type) {
    case T_F16: return CKV_DTYPE_F16;
    case T_BF16: return CKV_DTYPE_BF16;
    case T_Q8_0: return CKV_DTYPE_Q8_0;
    case T_Q4_0: return CKV_DTYPE_Q4_0;
    case T_Q4_1: return CKV_DTYPE_Q4_1;
    case T_Q5_0: return CKV_DTYPE_Q5_0;
    case T_Q5_1: return CKV_DTYPE_Q5_1;
    case T_Q4_K: return CKV_DTYPE_Q4_K;
    case T_Q5_K: return CKV_DTYPE_Q5_K;
    case T_Q6_K: return CKV_DTYPE_Q6_K;
    default: return CKV_DTYPE_F32;
    }
}

/* The stored bytes (read_raw) of q_proj, whole and heads 1-2, and of a whole-block column slice of the
 * embedding, dequantised, equal read_f32 of the same slice bit for bit; stored_dtype names the type;
 * a column slice that cuts a block is refused. */
static void check_raw(ckv_weight_source *src, const char *fname, uint32_t type) {
    const ckv_dtype t = ckv_type_of(type);
    CHECK_MSG(src->stored_dtype(src->ctx, "model.layers.0.self_attn.q_proj.weight") == t, "%s: stored_dtype", fname);
    CHECK(src->stored_dtype(src->ctx, "model.layers.0.mlp.up_proj.weight") == CKV_DTYPE_F32); /* absent */
    const int B = type_block(type);
    struct {
        const char *name;
        int64_t R, C, r0, r1, c0, c1;
    } cases[] = {{"model.layers.0.self_attn.q_proj.weight", TH * THD, TD, 0, TH * THD, 0, TD},
                 {"model.layers.0.self_attn.q_proj.weight", TH * THD, TD, THD, 3 * THD, 0, TD},
                 {"model.embed_tokens.weight", TV, TD, 2, 6, B == 256 ? 0 : 32, B == 256 ? TD : 96}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const int64_t shape[2] = {cases[c].R, cases[c].C}, rows = cases[c].r1 - cases[c].r0,
                      cols = cases[c].c1 - cases[c].c0;
        const size_t rb = ckv_dtype_row_bytes(t, cols), n = (size_t)(rows * cols);
        uint8_t *raw = malloc(rb * (size_t)rows);
        float *deq = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float));
        CHECK_OK(src->read_raw(src->ctx, cases[c].name, shape, cases[c].r0, cases[c].r1, cases[c].c0, cases[c].c1, raw));
        CHECK_OK(src->read_f32(src->ctx, cases[c].name, 2, shape, cases[c].r0, cases[c].r1, cases[c].c0, cases[c].c1,
                               want));
        for (int64_t r = 0; r < rows; r++) ckv_dequant_row(t, raw + (size_t)r * rb, deq + (size_t)(r * cols), (size_t)cols);
        CHECK_MSG(memcmp(deq, want, n * sizeof(float)) == 0, "%s: read_raw of %s rows [%lld, %lld) cols [%lld, %lld) "
                  "dequantised differs from read_f32", fname, cases[c].name, (long long)cases[c].r0,
                  (long long)cases[c].r1, (long long)cases[c].c0, (long long)cases[c].c1);
        free(raw), free(deq), free(want);
    }
    if (B > 1) {
        const int64_t shape[2] = {TV, TD};
        uint8_t raw[4096];
        CHECK_FAILS(src->read_raw(src->ctx, "model.embed_tokens.weight", shape, 0, 1, 1, B, raw), CKV_STATUS_ERR_ARG,
                    "are not whole blocks");
    }
}

/* One file per type: token_embd [V, D] and attn_q / attn_k (permuted) of that type, plus F32 norms. */
static void test_type(uint32_t type, uint32_t version) {
    char what[160], fname[64];
    snprintf(fname, sizeof fname, "type_%s_v%u", type_name(type), version);
    size_t ne = (size_t)TV * TD, nq = (size_t)TH * THD * TD, nk = (size_t)THKV * THD * TD;
    float *x = malloc(ne * 4), *rec = malloc(ne * 4), *bnd = malloc(ne * 4);
    float *qx = malloc(nq * 4), *qg = malloc(nq * 4), *qrec_g = malloc(nq * 4), *qbnd_g = malloc(nq * 4);
    float *qrec = malloc(nq * 4), *qbnd = malloc(nq * 4), *qorig = malloc(nq * 4);
    float *kx = malloc(nk * 4), *kg = malloc(nk * 4), *krec_g = malloc(nk * 4), *kbnd_g = malloc(nk * 4);
    float *krec = malloc(nk * 4), *kbnd = malloc(nk * 4), *korig = malloc(nk * 4);
    make_values(x, ne, type);
    make_values(qx, nq, type + 100);
    make_values(kx, nk, type + 200);
    tfile f;
    tf_init(&f, version);
    add_llama_kvs(&f, TD, TL, TF, TH, THKV, TV, NULL);
    tbuf b = {0};
    quantise(type, x, ne, &b, rec, bnd);
    tf_tensor(&f, "token_embd.weight", 2, TD, TV, type, b.p, b.n);
    free(b.p);
    /* q: HF rows -> GGUF order, quantised in that order; the expectation is mapped back */
    to_gguf_rows(qx, qg, TH * THD, TD, TH);
    memset(&b, 0, sizeof b);
    quantise(type, qg, nq, &b, qrec_g, qbnd_g);
    tf_tensor(&f, "blk.0.attn_q.weight", 2, TD, TH * THD, type, b.p, b.n);
    free(b.p);
    to_gguf_rows(kx, kg, THKV * THD, TD, THKV);
    memset(&b, 0, sizeof b);
    quantise(type, kg, nk, &b, krec_g, kbnd_g);
    tf_tensor(&f, "blk.0.attn_k.weight", 2, TD, THKV * THD, type, b.p, b.n);
    free(b.p);
    for (int64_t r = 0; r < TH * THD; r++) {
        int64_t g = permuted_row(r, THD);
        memcpy(qrec + r * TD, qrec_g + g * TD, TD * 4);
        memcpy(qbnd + r * TD, qbnd_g + g * TD, TD * 4);
        memcpy(qorig + r * TD, qg + g * TD, TD * 4);
    }
    for (int64_t r = 0; r < THKV * THD; r++) {
        int64_t g = permuted_row(r, THD);
        memcpy(krec + r * TD, krec_g + g * TD, TD * 4);
        memcpy(kbnd + r * TD, kbnd_g + g * TD, TD * 4);
        memcpy(korig + r * TD, kg + g * TD, TD * 4);
    }
    CHECK(memcmp(qorig, qx, nq * 4) == 0); /* the test's own permutation round-trips */
    const char *path = tf_write(&f, fname);
    tf_free(&f);

    ckv_weight_source src;
    ckv_model_config cfg;
    ckv_status s = ckv_gguf_open_source(&src, &cfg, path);
    CHECK_MSG(s == CKV_STATUS_OK, "%s: %s", fname, ckv_error_message());
    if (s == CKV_STATUS_OK) {
        snprintf(what, sizeof what, "%s embed whole", fname);
        check_read(&src, what, "model.embed_tokens.weight", TV, TD, 0, -1, 0, -1, x, rec, bnd);
        snprintf(what, sizeof what, "%s embed rows [2,6) cols [40,200)", fname);
        check_read(&src, what, "model.embed_tokens.weight", TV, TD, 2, 6, 40, 200, x, rec, bnd);
        snprintf(what, sizeof what, "%s embed rows [1,3) cols [32,64)", fname);
        check_read(&src, what, "model.embed_tokens.weight", TV, TD, 1, 3, 32, 64, x, rec, bnd);
        snprintf(what, sizeof what, "%s embed rows [7,8) cols [255,256)", fname);
        check_read(&src, what, "model.embed_tokens.weight", TV, TD, 7, 8, 255, 256, x, rec, bnd);
        snprintf(what, sizeof what, "%s q_proj whole (unpermuted)", fname);
        check_read(&src, what, "model.layers.0.self_attn.q_proj.weight", TH * THD, TD, 0, -1, 0, -1, qx, qrec, qbnd);
        snprintf(what, sizeof what, "%s q_proj heads 1-2", fname);
        check_read(&src, what, "model.layers.0.self_attn.q_proj.weight", TH * THD, TD, THD, 3 * THD, 0, TD, qx, qrec,
                   qbnd);
        snprintf(what, sizeof what, "%s k_proj whole (unpermuted, %d heads)", fname, THKV);
        check_read(&src, what, "model.layers.0.self_attn.k_proj.weight", THKV * THD, TD, 0, -1, 0, -1, kx, krec, kbnd);
        snprintf(what, sizeof what, "%s k_proj head 1 cols [100,130)", fname);
        check_read(&src, what, "model.layers.0.self_attn.k_proj.weight", THKV * THD, TD, THD, 2 * THD, 100, 130, kx,
                   krec, kbnd);
        check_raw(&src, fname, type);
        CHECK(cfg.tie_word_embeddings == 1);
        CHECK(src.has(src.ctx, "model.layers.0.self_attn.q_proj.weight"));
        CHECK(!src.has(src.ctx, "lm_head.weight"));
        CHECK(!src.has(src.ctx, "model.layers.0.self_attn.v_proj.weight"));
        CHECK(cfg.dtype == (type == T_F16 ? CKV_DTYPE_F16 : type == T_BF16 ? CKV_DTYPE_BF16 : CKV_DTYPE_F32));
    }
    ckv_source_close(&src);
    free(x), free(rec), free(bnd);
    free(qx), free(qg), free(qrec_g), free(qbnd_g), free(qrec), free(qbnd), free(qorig);
    free(kx), free(kg), free(krec_g), free(kbnd_g), free(krec), free(kbnd), free(korig);
}

/* Metadata of every value type and array element type, the config mapping, alignment and padding. */
static void test_metadata_and_alignment(size_t alignment, int write_alignment, uint32_t version) {
    tfile f;
    tf_init(&f, version);
    f.align = alignment;
    if (write_alignment) kv_u32(&f, "general.alignment", (uint32_t)alignment);
    add_llama_kvs(&f, TD, TL, TF, TH, THKV, TV, NULL);
    kv_key(&f, "x.u8", V_U8), tb_u8(&f.kv, 200);
    kv_key(&f, "x.i8", V_I8), tb_u8(&f.kv, (uint8_t)-5);
    kv_key(&f, "x.u16", V_U16), tb_u16(&f.kv, 60000);
    kv_key(&f, "x.i16", V_I16), tb_u16(&f.kv, (uint16_t)-300);
    kv_u32(&f, "x.u32", 4000000000u);
    kv_i32(&f, "x.i32", -7);
    kv_f32(&f, "x.f32", 1.5f);
    kv_key(&f, "x.bool", V_BOOL), tb_u8(&f.kv, 1);
    kv_str(&f, "x.string", "h\xc3\xa9llo");
    kv_str(&f, "x.empty_string", "");
    kv_u64(&f, "x.u64", 1ull << 40);
    kv_key(&f, "x.i64", V_I64), tb_u64(&f.kv, (uint64_t)-9);
    kv_key(&f, "x.f64", V_F64), tb_f64(&f.kv, 2.25);
    static const uint32_t elem[] = {V_U8, V_I8, V_U16, V_I16, V_U32, V_I32, V_F32, V_BOOL, V_U64, V_I64, V_F64};
    static const int esize[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 8, 8};
    for (size_t i = 0; i < sizeof elem / sizeof elem[0]; i++) {
        char key[32];
        snprintf(key, sizeof key, "x.array%zu", i);
        kv_key(&f, key, V_ARR);
        tb_u32(&f.kv, elem[i]);
        tb_u64(&f.kv, 3);
        for (int k = 0; k < 3; k++) {
            uint8_t v[8] = {0};
            v[0] = (uint8_t)(k & 1);
            tb_put(&f.kv, v, (size_t)esize[i]);
        }
    }
    kv_key(&f, "x.empty_array", V_ARR), tb_u32(&f.kv, V_U32), tb_u64(&f.kv, 0);
    kv_key(&f, "x.string_array", V_ARR), tb_u32(&f.kv, V_STR), tb_u64(&f.kv, 2);
    tb_str(&f.kv, "a"), tb_str(&f.kv, "");
    /* per-layer head counts as a uniform array */
    kv_f32(&f, "llama.rope.scaling.factor", 4.0f);
    kv_str(&f, "llama.rope.scaling.type", "linear");
    kv_u32(&f, "tokenizer.ggml.eot_token_id", 5);

    size_t ne = (size_t)TV * TD;
    float *x = malloc(ne * 4), *rec = malloc(ne * 4), *bnd = malloc(ne * 4), *n1 = malloc(TD * 4);
    make_values(x, ne, 3);
    for (int i = 0; i < TD; i++) n1[i] = 1.0f + (float)i / 256.0f;
    tbuf b = {0};
    quantise(T_Q8_0, x, ne, &b, rec, bnd);
    /* a 1-element F32 tensor first, so the next one must be padded to the alignment */
    float one = 3.0f;
    tf_tensor(&f, "x.scalar", 1, 1, 0, T_F32, &one, 4);
    tf_tensor(&f, "token_embd.weight", 2, TD, TV, T_Q8_0, b.p, b.n);
    ttensor *nt = tf_tensor(&f, "output_norm.weight", 1, TD, 0, T_F32, n1, TD * 4);
    nt->offset = (int64_t)align_up(64 * 1024, alignment); /* a gap before it */
    tf_tensor(&f, "output.weight", 2, TD, TV, T_Q8_0, b.p, b.n);
    free(b.p);
    char name[64];
    snprintf(name, sizeof name, "meta_align%zu_%d_v%u", alignment, write_alignment, version);
    const char *path = tf_write(&f, name);
    tf_free(&f);

    ckv_weight_source src;
    ckv_model_config c;
    ckv_status s = ckv_gguf_open_source(&src, &c, path);
    CHECK_MSG(s == CKV_STATUS_OK, "%s: %s", name, ckv_error_message());
    if (s == CKV_STATUS_OK) {
        CHECK(c.arch == CKV_ARCH_LLAMA && !strcmp(c.arch_name, "LlamaForCausalLM"));
        CHECK(c.hidden_size == TD && c.n_layers == TL && c.intermediate_size == TF);
        CHECK(c.n_heads == TH && c.n_kv_heads == THKV && c.head_dim == TD / TH);
        CHECK(c.vocab_size == TV && c.max_position_embeddings == 2048 && c.max_context == 2048);
        CHECK(fabs(c.rms_norm_eps - 1e-5) < 1e-10);
        CHECK(c.rope.theta == 50000.0 && c.rope.type == CKV_ROPE_TYPE_LINEAR && c.rope.factor == 4.0);
        CHECK(c.bos_token_id == 1 && c.n_eos == 2 && c.eos_ids[0] == 2 && c.eos_ids[1] == 5);
        CHECK(c.tie_word_embeddings == 0 && c.attention_bias == 0 && c.sliding_window == 0);
        CHECK(src.has(src.ctx, "lm_head.weight"));
        snprintf(name, sizeof name, "align %zu lm_head", alignment);
        check_read(&src, name, "lm_head.weight", TV, TD, 0, -1, 0, -1, x, rec, bnd);
        float got[TD];
        int64_t D = TD;
        CHECK_OK(src.read_f32(src.ctx, "model.norm.weight", 1, &D, 0, -1, 0, -1, got));
        CHECK(memcmp(got, n1, sizeof got) == 0);
    }
    ckv_source_close(&src);
    free(x), free(rec), free(bnd), free(n1);
}

/* q/k biases are permuted like the rows of their weights. */
static void test_bias_and_config(void) {
    tfile f;
    tf_init(&f, 3);
    add_llama_kvs(&f, TD, TL, TF, TH, THKV, TV, NULL);
    kv_str(&f, "llama.rope.scaling.type", "yarn");
    kv_f32(&f, "llama.rope.scaling.factor", 4.0f);
    kv_u32(&f, "llama.rope.scaling.original_context_length", 512);
    kv_f32(&f, "llama.rope.scaling.yarn_beta_fast", 16.0f);
    float e[TV * TD] = {0};
    tf_tensor(&f, "token_embd.weight", 2, TD, TV, T_F32, e, sizeof e);
    float qb[TH * THD], qbg[TH * THD], kb[THKV * THD], kbg[THKV * THD], ob[TD];
    for (int i = 0; i < TH * THD; i++) qb[i] = (float)i;
    for (int i = 0; i < THKV * THD; i++) kb[i] = -(float)i;
    for (int i = 0; i < TD; i++) ob[i] = 0.5f * (float)i;
    to_gguf_rows(qb, qbg, TH * THD, 1, TH);
    to_gguf_rows(kb, kbg, THKV * THD, 1, THKV);
    tf_tensor(&f, "blk.0.attn_q.bias", 1, TH * THD, 0, T_F32, qbg, sizeof qbg);
    tf_tensor(&f, "blk.0.attn_k.bias", 1, THKV * THD, 0, T_F32, kbg, sizeof kbg);
    tf_tensor(&f, "blk.0.attn_v.bias", 1, THKV * THD, 0, T_F32, kbg, sizeof kbg);
    tf_tensor(&f, "blk.0.attn_output.bias", 1, TD, 0, T_F32, ob, sizeof ob);
    const char *path = tf_write(&f, "bias");
    tf_free(&f);
    ckv_weight_source src;
    ckv_model_config c;
    ckv_status s = ckv_gguf_open_source(&src, &c, path);
    CHECK_MSG(s == CKV_STATUS_OK, "bias: %s", ckv_error_message());
    if (s == CKV_STATUS_OK) {
        CHECK(c.attention_bias == 1);
        CHECK(c.rope.type == CKV_ROPE_TYPE_YARN && c.rope.factor == 4.0 && c.rope.original_max_position == 512);
        CHECK(c.rope.beta_fast == 16.0 && c.rope.beta_slow == 1.0 && c.rope.attention_factor == 0.0);
        CHECK(c.max_context == 2048); /* 512 * 4 = 2048 = context_length */
        float got[TH * THD];
        int64_t n = TH * THD;
        CHECK_OK(src.read_f32(src.ctx, "model.layers.0.self_attn.q_proj.bias", 1, &n, 0, -1, 0, -1, got));
        CHECK(memcmp(got, qb, sizeof qb) == 0);
        n = THKV * THD;
        CHECK_OK(src.read_f32(src.ctx, "model.layers.0.self_attn.k_proj.bias", 1, &n, 0, -1, 0, -1, got));
        CHECK(memcmp(got, kb, sizeof kb) == 0);
        CHECK_OK(src.read_f32(src.ctx, "model.layers.0.self_attn.v_proj.bias", 1, &n, 0, -1, 0, -1, got));
        CHECK(memcmp(got, kbg, sizeof kbg) == 0); /* v is not permuted */
        n = TD;
        CHECK_OK(src.read_f32(src.ctx, "model.layers.0.self_attn.o_proj.bias", 1, &n, 0, -1, 0, -1, got));
        CHECK(memcmp(got, ob, sizeof ob) == 0);
        /* read errors */
        int64_t bad[2] = {TV, TD + 1};
        CHECK_FAILS(src.read_f32(src.ctx, "model.embed_tokens.weight", 2, bad, 0, -1, 0, -1, got),
                    CKV_STATUS_ERR_SHAPE, "shape [8, 256] in the file, expected [8, 257]");
        int64_t good[2] = {TV, TD};
        CHECK_FAILS(src.read_f32(src.ctx, "model.embed_tokens.weight", 2, good, 0, 9, 0, TD, got), CKV_STATUS_ERR_RANGE,
                    "outside its shape");
        CHECK_FAILS(src.read_f32(src.ctx, "model.layers.0.mlp.up_proj.weight", 2, good, 0, -1, 0, -1, got),
                    CKV_STATUS_ERR_FORMAT, "(GGUF 'blk.0.ffn_up.weight') is not in the file");
        CHECK_FAILS(src.read_f32(src.ctx, "model.layers.x.mlp.up_proj.weight", 2, good, 0, -1, 0, -1, got),
                    CKV_STATUS_ERR_FORMAT, "has no GGUF counterpart");
    }
    ckv_source_close(&src);
}

/* ---- qwen2 files ------------------------------------------------------------------------------- */

/* The qwen2 keys; `bias` = 0 leaves out the q/k/v biases, 2 adds an attn_output bias as well. */
static const char *qwen2_file(const char *name, int bias, float *qw) {
    tfile f;
    tf_init(&f, 3);
    kv_str(&f, "general.architecture", "qwen2");
    kv_u32(&f, "qwen2.context_length", 32768);
    kv_u32(&f, "qwen2.embedding_length", TD);
    kv_u32(&f, "qwen2.block_count", TL);
    kv_u32(&f, "qwen2.feed_forward_length", TF);
    kv_u32(&f, "qwen2.attention.head_count", TH);
    kv_u32(&f, "qwen2.attention.head_count_kv", THKV);
    kv_f32(&f, "qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
    kv_f32(&f, "qwen2.rope.freq_base", 1000000.0f);
    kv_u32(&f, "tokenizer.ggml.eos_token_id", 3);
    add_tokens(&f, TV);
    float e[TV * TD] = {0};
    tf_tensor(&f, "token_embd.weight", 2, TD, TV, T_F32, e, sizeof e);
    tf_tensor(&f, "output.weight", 2, TD, TV, T_F32, e, sizeof e);
    for (int i = 0; i < TH * THD * TD; i++) qw[i] = (float)(i % 977) - 300.0f;
    tf_tensor(&f, "blk.0.attn_q.weight", 2, TD, TH * THD, T_F32, qw, sizeof(float) * TH * THD * TD);
    float b[TD] = {0};
    if (bias) {
        tf_tensor(&f, "blk.0.attn_q.bias", 1, TH * THD, 0, T_F32, b, sizeof(float) * TH * THD);
        tf_tensor(&f, "blk.0.attn_k.bias", 1, THKV * THD, 0, T_F32, b, sizeof(float) * THKV * THD);
        tf_tensor(&f, "blk.0.attn_v.bias", 1, THKV * THD, 0, T_F32, b, sizeof(float) * THKV * THD);
    }
    if (bias == 2) tf_tensor(&f, "blk.0.attn_output.bias", 1, TD, 0, T_F32, b, sizeof b);
    const char *path = tf_write(&f, name);
    tf_free(&f);
    return path;
}

static void test_qwen2(void) {
    float *qw = malloc(sizeof(float) * TH * THD * TD), *got = malloc(sizeof(float) * TH * THD * TD);
    ckv_weight_source src;
    ckv_model_config c;
    ckv_status s = ckv_gguf_open_source(&src, &c, qwen2_file("qwen2", 1, qw));
    CHECK_MSG(s == CKV_STATUS_OK, "qwen2: %s", ckv_error_message());
    if (s == CKV_STATUS_OK) {
        CHECK(c.arch == CKV_ARCH_QWEN2 && !strcmp(c.arch_name, "Qwen2ForCausalLM"));
        CHECK(c.hidden_size == TD && c.n_heads == TH && c.n_kv_heads == THKV && c.head_dim == THD);
        CHECK(c.max_position_embeddings == 32768 && c.max_context == 32768);
        CHECK(c.rope.theta == 1e6 && c.rope.type == CKV_ROPE_TYPE_DEFAULT);
        CHECK(fabs(c.rms_norm_eps - 1e-6) < 1e-12 && c.attention_bias == 1 && c.tie_word_embeddings == 0);
        CHECK(c.n_eos == 1 && c.eos_ids[0] == 3 && c.bos_token_id == -1);
        int64_t shape[2] = {TH * THD, TD};
        CHECK_OK(src.read_f32(src.ctx, "model.layers.0.self_attn.q_proj.weight", 2, shape, 0, -1, 0, -1, got));
        CHECK_MSG(memcmp(got, qw, sizeof(float) * TH * THD * TD) == 0, "qwen2: q_proj rows are read as stored");
        ckv_source_close(&src);
    }
    CHECK_FAILS(ckv_gguf_open_source(&src, &c, qwen2_file("qwen2_nobias", 0, qw)), CKV_STATUS_ERR_UNSUPPORTED,
                "architecture qwen2 needs q/k/v biases");
    CHECK_FAILS(ckv_gguf_open_source(&src, &c, qwen2_file("qwen2_obias", 2, qw)), CKV_STATUS_ERR_UNSUPPORTED,
                "this file has an attn_output bias");
    free(qw), free(got);
}

/* ---- malformed files --------------------------------------------------------------------------- */

/* A small valid llama file as bytes; `mutate` is applied to the tfile before building. */
static void small_file(tbuf *out, uint32_t version, void (*mutate)(tfile *)) {
    tfile f;
    tf_init(&f, version);
    add_llama_kvs(&f, 64, 1, 128, 4, 2, 4, NULL);
    float e[4 * 64];
    for (int i = 0; i < 4 * 64; i++) e[i] = (float)i;
    tf_tensor(&f, "token_embd.weight", 2, 64, 4, T_F32, e, sizeof e);
    tf_tensor(&f, "output_norm.weight", 1, 64, 0, T_F32, e, 64 * 4);
    if (mutate) mutate(&f);
    tf_build(&f, out);
    tf_free(&f);
}

static ckv_status open_bytes(const char *name, const void *p, size_t n) {
    const char *path = tmp_path(name);
    write_bytes(path, p, n);
    ckv_weight_source src;
    ckv_model_config c;
    ckv_status s = ckv_gguf_open_source(&src, &c, path);
    if (s == CKV_STATUS_OK) ckv_source_close(&src);
    return s;
}

static ckv_status open_small(const char *name, void (*mutate)(tfile *)) {
    tbuf b;
    small_file(&b, 3, mutate);
    ckv_status s = open_bytes(name, b.p, b.n);
    free(b.p);
    return s;
}

static void m_unknown_type(tfile *f) { f->t[1].type = 99; }
static void m_retired_type(tfile *f) { f->t[1].type = 4; }
static void m_misaligned(tfile *f) { f->t[1].offset = 1024 + 4; }
static void m_overlap(tfile *f) {
    f->t[0].offset = 0;
    f->t[1].offset = 512;
}
static void m_duplicate_name(tfile *f) { snprintf(f->t[1].name, sizeof f->t[1].name, "token_embd.weight"); }
static void m_duplicate_key(tfile *f) { kv_u32(f, "llama.block_count", 1); }
static void m_five_dims(tfile *f) { f->t[1].ndim = 5, f->t[1].ne[1] = f->t[1].ne[2] = f->t[1].ne[3] = 1; }
static void m_zero_extent(tfile *f) { f->t[1].ndim = 2, f->t[1].ne[1] = 0; }
static void m_not_block_multiple(tfile *f) { f->t[1].type = T_Q8_0; } /* 64 elements of F32 bytes: fine */
static void m_block_ragged(tfile *f) {
    f->t[1].type = T_Q8_0;
    f->t[1].ne[0] = 48;
}
static void m_bad_alignment(tfile *f) { kv_u32(f, "general.alignment", 48); }
static void m_alignment_string(tfile *f) { kv_str(f, "general.alignment", "32"); }
static void m_unknown_value_type(tfile *f) { kv_key(f, "x.bad", 13), tb_u32(&f->kv, 0); }
static void m_nested_array(tfile *f) { kv_key(f, "x.nested", V_ARR), tb_u32(&f->kv, V_ARR), tb_u64(&f->kv, 0); }
static void m_bad_bool(tfile *f) { kv_key(f, "x.bool", V_BOOL), tb_u8(&f->kv, 7); }
static void m_gemma(tfile *f) {
    tf_free(f); /* drops the llama keys and tensors */
    tf_init(f, 3);
    kv_str(f, "general.architecture", "gemma");
}
static void m_experts(tfile *f) { kv_u32(f, "llama.expert_count", 8); }
static void m_embd_rows(tfile *f) { f->t[0].ne[1] = 2; }
static void m_rope_freqs(tfile *f) {
    float ones[32] = {1};
    tf_tensor(f, "rope_freqs.weight", 1, 32, 0, T_F32, ones, sizeof ones);
}
static void m_longrope(tfile *f) {
    kv_str(f, "llama.rope.scaling.type", "longrope");
    kv_f32(f, "llama.rope.scaling.factor", 2.0f);
}

/* Opens a small file whose llama keys lack `skip`, after `extra` added its own keys. */
static ckv_status open_without(const char *skip, void (*extra)(tfile *)) {
    tfile f;
    tf_init(&f, 3);
    if (extra) extra(&f);
    add_llama_kvs(&f, 64, 1, 128, 4, 2, 4, skip);
    float e[4 * 64] = {0};
    tf_tensor(&f, "token_embd.weight", 2, 64, 4, T_F32, e, sizeof e);
    tbuf b;
    tf_build(&f, &b);
    tf_free(&f);
    ckv_status s = open_bytes("without", b.p, b.n);
    free(b.p);
    return s;
}

static void missing_key(const char *key) {
    char needle[128];
    snprintf(needle, sizeof needle, "missing metadata key '%s'", key);
    CHECK_FAILS(open_without(key, NULL), CKV_STATUS_ERR_FORMAT, needle);
}

static void x_partial_rotary(tfile *f) { kv_u32(f, "llama.rope.dimension_count", 8); }
static void x_block_count_string(tfile *f) { kv_str(f, "llama.block_count", "thirty"); }

static void test_malformed(void) {
    tbuf b;
    small_file(&b, 3, NULL);
    CHECK_OK(open_bytes("good", b.p, b.n));
    uint8_t *p = malloc(b.n);
    size_t n = b.n;
#define MUTATED(name, code, needle, stmt)                  \
    do {                                                   \
        memcpy(p, b.p, n);                                 \
        size_t len_ = n;                                   \
        stmt;                                              \
        CHECK_FAILS(open_bytes(name, p, len_), code, needle); \
    } while (0)
    MUTATED("magic", CKV_STATUS_ERR_FORMAT, "bad magic", p[0] = 'X');
    MUTATED("version1", CKV_STATUS_ERR_UNSUPPORTED, "GGUF version 1 is not supported", p[4] = 1);
    MUTATED("version4", CKV_STATUS_ERR_UNSUPPORTED, "GGUF version 4 is not supported", p[4] = 4);
    MUTATED("bigendian", CKV_STATUS_ERR_UNSUPPORTED, "big-endian", (p[4] = 0, p[7] = 3));
    MUTATED("tensor_count", CKV_STATUS_ERR_FORMAT, "tensor count 1099511627776 runs past the end",
            (memset(p + 8, 0, 8), p[13] = 1));
    MUTATED("kv_count", CKV_STATUS_ERR_FORMAT, "metadata count 4294967296 runs past the end",
            (memset(p + 16, 0, 8), p[20] = 1));
    MUTATED("kv_count_plus_one", CKV_STATUS_ERR_FORMAT, "runs past the end", p[16] = (uint8_t)(p[16] + 1));
    /* the first key's length: huge */
    MUTATED("string_length", CKV_STATUS_ERR_FORMAT,
            "metadata key 0 of the header: string length 72057594037927956 at offset 32 runs past the end",
            p[24 + 7] = 1);
    MUTATED("truncated_header", CKV_STATUS_ERR_FORMAT, "runs past the end of the file", len_ = 200);
    MUTATED("truncated_data", CKV_STATUS_ERR_FORMAT, "runs past the end of the file", len_ = n - 4);
    MUTATED("too_short", CKV_STATUS_ERR_FORMAT, "too short", len_ = 10);
    /* the offset field of the last tensor (output_norm.weight, 1-D): the 8 bytes before the padding */
    size_t info_end = 0;
    for (size_t k = 0; k + 18 <= n; k++)
        if (!memcmp(p + k, "output_norm.weight", 18)) info_end = k + 18 + 4 + 8 + 4 + 8;
    MUTATED("offset_past_end", CKV_STATUS_ERR_FORMAT,
            "tensor 'output_norm.weight': data [1048576, +256) runs past the end of the file",
            (memset(p + info_end - 8, 0, 8), p[info_end - 6] = 16));
    MUTATED("empty", CKV_STATUS_ERR_FORMAT, "too short", len_ = 0);
#undef MUTATED
    free(p);
    free(b.p);

    /* a string value whose length runs past the end */
    tbuf s = {0};
    tb_put(&s, "GGUF", 4), tb_u32(&s, 2), tb_u64(&s, 0), tb_u64(&s, 1);
    tb_str(&s, "general.name"), tb_u32(&s, V_STR), tb_u64(&s, 1000), tb_put(&s, "short", 5);
    CHECK_FAILS(open_bytes("value_length", s.p, s.n), CKV_STATUS_ERR_FORMAT,
                "metadata key 'general.name': string length 1000");
    /* an array whose count cannot fit */
    s.n = 0;
    tb_put(&s, "GGUF", 4), tb_u32(&s, 3), tb_u64(&s, 0), tb_u64(&s, 1);
    tb_str(&s, "a"), tb_u32(&s, V_ARR), tb_u32(&s, V_U64), tb_u64(&s, 1ull << 60), tb_u64(&s, 0);
    CHECK_FAILS(open_bytes("array_count", s.p, s.n), CKV_STATUS_ERR_FORMAT,
                "array of 1152921504606846976 uint64 values runs past the end");
    free(s.p);

    CHECK_FAILS(open_small("unknown_type", m_unknown_type), CKV_STATUS_ERR_FORMAT,
                "tensor 'output_norm.weight': unknown type 99");
    CHECK_FAILS(open_small("retired_type", m_retired_type), CKV_STATUS_ERR_FORMAT, "unknown type 4");
    CHECK_FAILS(open_small("misaligned", m_misaligned), CKV_STATUS_ERR_FORMAT,
                "offset 1028 is not a multiple of the alignment 32");
    CHECK_FAILS(open_small("overlap", m_overlap), CKV_STATUS_ERR_FORMAT,
                "tensors 'token_embd.weight' and 'output_norm.weight' overlap");
    CHECK_FAILS(open_small("duplicate_name", m_duplicate_name), CKV_STATUS_ERR_FORMAT,
                "duplicate tensor name 'token_embd.weight'");
    CHECK_FAILS(open_small("duplicate_key", m_duplicate_key), CKV_STATUS_ERR_FORMAT,
                "duplicate metadata key 'llama.block_count'");
    CHECK_FAILS(open_small("five_dims", m_five_dims), CKV_STATUS_ERR_FORMAT, "5 dimensions (GGUF allows 1 to 4)");
    CHECK_FAILS(open_small("zero_extent", m_zero_extent), CKV_STATUS_ERR_FORMAT, "extent 0 of dimension 1 is zero");
    CHECK_OK(open_small("q8_in_f32_bytes", m_not_block_multiple)); /* 2 Q8_0 blocks = 68 bytes fit in 256 */
    CHECK_FAILS(open_small("ragged_block", m_block_ragged), CKV_STATUS_ERR_FORMAT,
                "first extent 48 is not a multiple of the Q8_0 block size 32");
    CHECK_FAILS(open_small("bad_alignment", m_bad_alignment), CKV_STATUS_ERR_FORMAT,
                "general.alignment 48 is not a power of two");
    CHECK_FAILS(open_small("alignment_string", m_alignment_string), CKV_STATUS_ERR_FORMAT,
                "'general.alignment' must be an integer (it is string)");
    CHECK_FAILS(open_small("unknown_value_type", m_unknown_value_type), CKV_STATUS_ERR_FORMAT,
                "metadata key 'x.bad': unknown value type 13");
    CHECK_FAILS(open_small("nested_array", m_nested_array), CKV_STATUS_ERR_UNSUPPORTED, "arrays of arrays");
    CHECK_FAILS(open_small("bad_bool", m_bad_bool), CKV_STATUS_ERR_FORMAT, "bool value 7 is neither 0 nor 1");
    CHECK_FAILS(open_small("gemma", m_gemma), CKV_STATUS_ERR_UNSUPPORTED,
                "general.architecture is 'gemma' (ckv reads GGUF files of architecture 'llama' or 'qwen2')");
    CHECK_FAILS(open_small("experts", m_experts), CKV_STATUS_ERR_UNSUPPORTED, "mixture-of-experts");
    CHECK_FAILS(open_small("embd_rows", m_embd_rows), CKV_STATUS_ERR_SHAPE,
                "tensor 'token_embd.weight' has extents (64, 2), expected (64, 4)");
    CHECK_FAILS(open_small("rope_freqs", m_rope_freqs), CKV_STATUS_ERR_UNSUPPORTED, "rope_freqs.weight");
    CHECK_FAILS(open_small("longrope", m_longrope), CKV_STATUS_ERR_UNSUPPORTED, "is 'longrope'");
    CHECK_FAILS(open_without("llama.rope.dimension_count", x_partial_rotary), CKV_STATUS_ERR_UNSUPPORTED,
                "partial rotary");
    missing_key("llama.block_count");
    missing_key("llama.embedding_length");
    missing_key("llama.attention.head_count");
    missing_key("llama.attention.layer_norm_rms_epsilon");
    missing_key("llama.context_length");
    missing_key("general.architecture");

    CHECK_FAILS(open_without("llama.block_count", x_block_count_string), CKV_STATUS_ERR_FORMAT,
                "metadata key 'llama.block_count' must be an integer (it is string)");

    /* a known type ckv does not dequantise: the file opens, the read is refused */
    tfile f;
    tf_init(&f, 3);
    add_llama_kvs(&f, 256, 1, 128, 4, 2, 4, NULL);
    uint8_t raw[4 * 84] = {0};
    tf_tensor(&f, "token_embd.weight", 2, 256, 4, T_Q2_K, raw, sizeof raw);
    const char *path = tf_write(&f, "q2k");
    tf_free(&f);
    ckv_weight_source src;
    ckv_model_config c;
    CHECK_OK(ckv_gguf_open_source(&src, &c, path));
    float out[4 * 256];
    CHECK_FAILS(src.read_f32(src.ctx, "model.embed_tokens.weight", 0, NULL, 0, -1, 0, -1, out),
                CKV_STATUS_ERR_UNSUPPORTED, "has type Q2_K, which ckv cannot dequantise");
    ckv_source_close(&src);
    CHECK_FAILS(ckv_gguf_open_source(&src, &c, tmp_path("does_not_exist")), CKV_STATUS_ERR_IO, "cannot open");
}

/* ---- a fixture checkpoint converted to GGUF ---------------------------------------------------- */

static const struct {
    const char *hf, *gguf;
    int perm; /* 1: q heads, 2: kv heads */
} conv_names[] = {
    {"input_layernorm.weight", "attn_norm.weight", 0},     {"self_attn.q_proj.weight", "attn_q.weight", 1},
    {"self_attn.k_proj.weight", "attn_k.weight", 2},       {"self_attn.v_proj.weight", "attn_v.weight", 0},
    {"self_attn.o_proj.weight", "attn_output.weight", 0},  {"post_attention_layernorm.weight", "ffn_norm.weight", 0},
    {"mlp.gate_proj.weight", "ffn_gate.weight", 0},        {"mlp.up_proj.weight", "ffn_up.weight", 0},
    {"mlp.down_proj.weight", "ffn_down.weight", 0},
};

/* Writes the F32 safetensors checkpoint in `dir` (a llama-shaped model) as a GGUF file the way the
 * HF -> GGUF conversion does: names mapped, q/k rows permuted, extents reversed. */
static const char *convert_fixture(const char *dir, const ckv_model_config *c) {
    ckv_safetensors *st = NULL;
    CHECK_OK(ckv_safetensors_open_dir(&st, dir));
    if (!st) return NULL;
    tfile f;
    tf_init(&f, 3);
    kv_str(&f, "general.architecture", "llama");
    kv_str(&f, "general.name", "fixture");
    kv_u32(&f, "llama.context_length", (uint32_t)c->max_position_embeddings);
    kv_u32(&f, "llama.embedding_length", (uint32_t)c->hidden_size);
    kv_u32(&f, "llama.block_count", (uint32_t)c->n_layers);
    kv_u32(&f, "llama.feed_forward_length", (uint32_t)c->intermediate_size);
    kv_u32(&f, "llama.attention.head_count", (uint32_t)c->n_heads);
    kv_u32(&f, "llama.attention.head_count_kv", (uint32_t)c->n_kv_heads);
    kv_u32(&f, "llama.attention.key_length", (uint32_t)c->head_dim);
    kv_u32(&f, "llama.attention.value_length", (uint32_t)c->head_dim);
    kv_f32(&f, "llama.attention.layer_norm_rms_epsilon", (float)c->rms_norm_eps);
    kv_f32(&f, "llama.rope.freq_base", (float)c->rope.theta);
    kv_u32(&f, "llama.rope.dimension_count", (uint32_t)c->head_dim);
    kv_u32(&f, "tokenizer.ggml.bos_token_id", (uint32_t)c->bos_token_id);
    kv_u32(&f, "tokenizer.ggml.eos_token_id", (uint32_t)c->eos_ids[0]);
    add_tokens(&f, c->vocab_size);
    for (int i = 0; i < ckv_safetensors_count(st); i++) {
        const ckv_st_tensor *t = ckv_safetensors_at(st, i);
        char gname[128] = "";
        int perm = 0;
        if (!strcmp(t->name, "model.embed_tokens.weight")) snprintf(gname, sizeof gname, "token_embd.weight");
        if (!strcmp(t->name, "model.norm.weight")) snprintf(gname, sizeof gname, "output_norm.weight");
        if (!strcmp(t->name, "lm_head.weight")) snprintf(gname, sizeof gname, "output.weight");
        int layer = -1, off = 0;
        if (sscanf(t->name, "model.layers.%d.%n", &layer, &off) == 1 && off > 0) {
            for (size_t k = 0; k < sizeof conv_names / sizeof conv_names[0]; k++)
                if (!strcmp(t->name + off, conv_names[k].hf)) {
                    snprintf(gname, sizeof gname, "blk.%d.%s", layer, conv_names[k].gguf);
                    perm = conv_names[k].perm;
                }
        }
        CHECK_MSG(gname[0] && t->dtype == CKV_DTYPE_F32, "cannot convert %s", t->name);
        if (!gname[0]) continue;
        int64_t rows = t->ndim == 2 ? t->shape[0] : 1, cols = t->ndim == 2 ? t->shape[1] : t->shape[0];
        float *g = malloc(t->nbytes);
        to_gguf_rows(t->data, g, rows, cols, perm == 1 ? c->n_heads : perm == 2 ? c->n_kv_heads : 0);
        tf_tensor(&f, gname, t->ndim, (uint64_t)cols, (uint64_t)rows, T_F32, g, t->nbytes);
        free(g);
    }
    ckv_safetensors_close(st);
    const char *path = tf_write(&f, "fixture_mistral_gqa");
    tf_free(&f);
    return path;
}

static void compare_sources(ckv_weight_source *a, ckv_weight_source *b, const char *name, int64_t R, int64_t C,
                            int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    int64_t shape[2] = {R, C};
    int ndim = C > 0 ? 2 : 1;
    size_t n = r1 < 0 ? (size_t)(R * (C > 0 ? C : 1)) : (size_t)read_size(r0, r1, c0, c1);
    float *x = calloc(n, 4), *y = calloc(n, 4);
    CHECK_OK(a->read_f32(a->ctx, name, ndim, shape, r0, r1, c0, c1, x));
    CHECK_OK(b->read_f32(b->ctx, name, ndim, shape, r0, r1, c0, c1, y));
    CHECK_MSG(memcmp(x, y, n * 4) == 0, "%s rows [%lld, %lld) cols [%lld, %lld): GGUF differs from safetensors", name,
              (long long)r0, (long long)r1, (long long)c0, (long long)c1);
    free(x);
    free(y);
}

static void test_fixture_conversion(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/models/mistral_gqa", CKV_FIXTURES);
    ckv_weight_source st_src, g_src;
    ckv_model_config sc, gc;
    ckv_status s = ckv_source_open(&st_src, &sc, dir);
    CHECK_MSG(s == CKV_STATUS_OK, "%s", ckv_error_message());
    if (s != CKV_STATUS_OK) return;
    const char *path = convert_fixture(dir, &sc);
    s = path ? ckv_source_open(&g_src, &gc, path) : CKV_STATUS_ERR_IO;
    CHECK_MSG(s == CKV_STATUS_OK, "%s", ckv_error_message());
    if (s != CKV_STATUS_OK) {
        ckv_source_close(&st_src);
        return;
    }
    CHECK(gc.hidden_size == sc.hidden_size && gc.n_layers == sc.n_layers && gc.n_heads == sc.n_heads);
    CHECK(gc.n_kv_heads == sc.n_kv_heads && gc.head_dim == sc.head_dim && gc.vocab_size == sc.vocab_size);
    CHECK(gc.intermediate_size == sc.intermediate_size && gc.rope.theta == sc.rope.theta);
    CHECK(gc.tie_word_embeddings == sc.tie_word_embeddings && gc.bos_token_id == sc.bos_token_id);
    int64_t D = sc.hidden_size, d = sc.head_dim, F = sc.intermediate_size, V = sc.vocab_size;
    int64_t Q = sc.n_heads * d, K = sc.n_kv_heads * d;
    compare_sources(&st_src, &g_src, "model.embed_tokens.weight", V, D, 0, -1, 0, -1);
    compare_sources(&st_src, &g_src, "lm_head.weight", V, D, 100, 300, 0, D);
    compare_sources(&st_src, &g_src, "model.norm.weight", D, 0, 0, -1, 0, -1);
    for (int l = 0; l < sc.n_layers; l++) {
        char n[160];
        snprintf(n, sizeof n, "model.layers.%d.self_attn.q_proj.weight", l);
        compare_sources(&st_src, &g_src, n, Q, D, 0, -1, 0, -1);
        compare_sources(&st_src, &g_src, n, Q, D, 2 * d, 4 * d, 0, D); /* tp 2, rank 1 */
        snprintf(n, sizeof n, "model.layers.%d.self_attn.k_proj.weight", l);
        compare_sources(&st_src, &g_src, n, K, D, 0, -1, 0, -1);
        snprintf(n, sizeof n, "model.layers.%d.self_attn.o_proj.weight", l);
        compare_sources(&st_src, &g_src, n, D, Q, 0, D, d, 3 * d);
        snprintf(n, sizeof n, "model.layers.%d.mlp.down_proj.weight", l);
        compare_sources(&st_src, &g_src, n, D, F, 0, D, F / 2, F);
        snprintf(n, sizeof n, "model.layers.%d.mlp.gate_proj.weight", l);
        compare_sources(&st_src, &g_src, n, F, D, 0, F / 2, 0, D);
    }
    ckv_source_close(&st_src);
    ckv_source_close(&g_src);

    /* the forward over both gives identical logits */
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 2));
    ckv_model *ms = NULL, *mg = NULL;
    CHECK_OK(ckv_model_load(&ms, dir, be, NULL));
    CHECK_OK(ckv_model_load(&mg, path, be, NULL));
    if (ms && mg) {
        enum { P = 40 };
        int32_t ids[P];
        for (int i = 0; i < P; i++) ids[i] = (int32_t)((i * 37 + 11) % V);
        float *a = malloc(sizeof(float) * P * (size_t)V), *b = malloc(sizeof(float) * P * (size_t)V);
        ckv_session ss, sg;
        const float *last = NULL;
        CHECK_OK(ckv_session_init(&ss, ms, P, 16, 0));
        CHECK_OK(ckv_session_init(&sg, mg, P, 16, 0));
        CHECK_OK(ckv_session_prefill(&ss, ids, P, a, &last));
        CHECK_OK(ckv_session_prefill(&sg, ids, P, b, &last));
        CHECK_MSG(memcmp(a, b, sizeof(float) * P * (size_t)V) == 0, "GGUF forward differs from safetensors forward");
        ckv_test_allclose("GGUF vs safetensors prefill logits", b, a, (size_t)P * (size_t)V, 0, 0);
        ckv_session_free(&ss);
        ckv_session_free(&sg);
        free(a);
        free(b);
    }
    ckv_model_free(ms);
    ckv_model_free(mg);
    ckv_backend_free(be);
}

int main(void) {
    static const uint32_t types[] = {T_F32,  T_F16,  T_BF16, T_Q8_0, T_Q4_0, T_Q4_1,
                                     T_Q5_0, T_Q5_1, T_Q4_K, T_Q5_K, T_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) test_type(types[i], i % 2 ? 2 : 3);
    test_metadata_and_alignment(32, 0, 3);
    test_metadata_and_alignment(32, 1, 2);
    test_metadata_and_alignment(64, 1, 3);
    test_metadata_and_alignment(256, 1, 2);
    test_bias_and_config();
    test_qwen2();
    test_malformed();
    test_fixture_conversion();
    return ckv_test_finish("test_gguf");
}
