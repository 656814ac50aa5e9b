/* test_gguf.c - the GGUF reader (model/gguf.c) on files this test writes into CKV_TEST_TMP
 * (tests/common/gguf_writer.h):
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
 *    embeddings, dtype).
 * Malformed files are test_gguf_malformed.c's, a fixture checkpoint converted to GGUF is
 * test_gguf_fixture.c's; llama.cpp agreement on a real model is tests/cli/test_gguf_parity.sh's. */
#include <math.h>
#include <stdint.h>

#include "ckv_test.h"
#include "common/gguf_writer.h"
#include "core/quant.h"
#include "core/tensor.h"
#include "engine/session.h"
#include "model/gguf.h"
#include "model/model.h"
#include "model/safetensors.h"
#include "model/source.h"

/* ---- reference quantisers: bytes of blocks, the value each code stands for, and the error bound -- */

static float h2f(uint16_t h) { return ckv_f16_to_f32(h); }
static uint16_t f2h(float f) { return ckv_f32_to_f16(f); }

/* Rounds a scale up to the next fp16 value at least as large (so ranges still cover the data). */
static uint16_t f2h_up(float f) {
    uint16_t h = f2h(f);
    while (h2f(h) < f) h++;
    return h;
}

static void q8_0_block(const float *x, ckv_gw_buf *o, float *rec, float *bnd) {
    float amax = 0;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i]));
    uint16_t h = f2h(amax / 127.0f);
    float d = h2f(h);
    ckv_gw_buf_u16(o, h);
    for (int i = 0; i < 32; i++) {
        int q = d > 0 ? (int)lrintf(x[i] / d) : 0;
        q = q < -127 ? -127 : q > 127 ? 127 : q;
        ckv_gw_buf_u8(o, (uint8_t)(int8_t)q);
        rec[i] = d * (float)q;
        bnd[i] = 0.5f * d;
    }
}

static void q4_0_block(const float *x, ckv_gw_buf *o, float *rec, float *bnd) {
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
    ckv_gw_buf_u16(o, h);
    for (int i = 0; i < 16; i++) ckv_gw_buf_u8(o, (uint8_t)((q[i] + 8) | ((q[i + 16] + 8) << 4)));
}

static void q4_1_block(const float *x, ckv_gw_buf *o, float *rec, float *bnd) {
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
    ckv_gw_buf_u16(o, hd);
    ckv_gw_buf_u16(o, hm);
    for (int i = 0; i < 16; i++) ckv_gw_buf_u8(o, (uint8_t)(q[i] | (q[i + 16] << 4)));
}

/* Q5_0 / Q5_1 storage of 32 codes 0..31: 4 bytes of fifth bits (bit i: element i), then nibbles as in
 * Q4_0 (byte i: element i low, element i + 16 high). */
static void q5_put_codes(ckv_gw_buf *o, const int *u) {
    uint32_t h = 0;
    for (int i = 0; i < 32; i++) h |= (uint32_t)(u[i] >> 4) << i;
    ckv_gw_buf_u32(o, h);
    for (int i = 0; i < 16; i++) ckv_gw_buf_u8(o, (uint8_t)((u[i] & 15) | ((u[i + 16] & 15) << 4)));
}

static void q5_0_block(const float *x, ckv_gw_buf *o, float *rec, float *bnd) {
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
    ckv_gw_buf_u16(o, h);
    q5_put_codes(o, u);
}

static void q5_1_block(const float *x, ckv_gw_buf *o, float *rec, float *bnd) {
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
    ckv_gw_buf_u16(o, hd);
    ckv_gw_buf_u16(o, hm);
    q5_put_codes(o, u);
}

/* Q4_K / Q5_K (levels 15 / 31): 8 sub-blocks of 32, each with a 6-bit scale and 6-bit minimum under
 * fp16 d and dmin. The minimum and scale are rounded up so the representable range covers the
 * sub-block. Q5_K stores the fifth bits (qh: bit 2g of byte l for element l of sub-block 2g, bit 2g + 1
 * for sub-block 2g + 1) between the scales and the nibbles. */
static void k_quant_block(const float *x, ckv_gw_buf *o, float *rec, float *bnd, int levels) {
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
    ckv_gw_buf_u16(o, hd);
    ckv_gw_buf_u16(o, hmin);
    ckv_gw_buf_put(o, s, 12);
    if (levels == 31) {
        uint8_t qh[32] = {0};
        for (int g = 0; g < 4; g++)
            for (int l = 0; l < 32; l++)
                qh[l] |= (uint8_t)(((q[64 * g + l] >> 4) << (2 * g)) | ((q[64 * g + 32 + l] >> 4) << (2 * g + 1)));
        ckv_gw_buf_put(o, qh, 32);
    }
    for (int g = 0; g < 4; g++)
        for (int l = 0; l < 32; l++) ckv_gw_buf_u8(o, (uint8_t)((q[64 * g + l] & 15) | ((q[64 * g + 32 + l] & 15) << 4)));
}

/* Q6_K: 16 sub-blocks of 16 with an int8 scale under fp16 d; codes -32..31 stored as 0..63 split into a
 * low nibble (ql) and two high bits (qh). */
static void q6_k_block(const float *x, ckv_gw_buf *o, float *rec, float *bnd) {
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
    ckv_gw_buf_put(o, ql, 128);
    ckv_gw_buf_put(o, qh, 64);
    for (int j = 0; j < 16; j++) ckv_gw_buf_u8(o, (uint8_t)(int8_t)sc[j]);
    ckv_gw_buf_u16(o, hd);
}

static int type_block(uint32_t type) {
    switch (type) {
    case CKV_GW_T_Q4_0: case CKV_GW_T_Q4_1: case CKV_GW_T_Q5_0: case CKV_GW_T_Q5_1: case CKV_GW_T_Q8_0: return 32;
    case CKV_GW_T_Q4_K: case CKV_GW_T_Q5_K: case CKV_GW_T_Q6_K: return 256;
    default: return 1;
    }
}

static const char *type_name(uint32_t type) {
    switch (type) {
    case CKV_GW_T_F32: return "F32";
    case CKV_GW_T_F16: return "F16";
    case CKV_GW_T_BF16: return "BF16";
    case CKV_GW_T_Q8_0: return "Q8_0";
    case CKV_GW_T_Q4_0: return "Q4_0";
    case CKV_GW_T_Q4_1: return "Q4_1";
    case CKV_GW_T_Q5_0: return "Q5_0";
    case CKV_GW_T_Q5_1: return "Q5_1";
    case CKV_GW_T_Q4_K: return "Q4_K";
    case CKV_GW_T_Q5_K: return "Q5_K";
    case CKV_GW_T_Q6_K: return "Q6_K";
    default: return "?";
    }
}

/* Quantises n values (n a multiple of the block size) into o; rec and bnd as above. */
static void quantise(uint32_t type, const float *x, size_t n, ckv_gw_buf *o, float *rec, float *bnd) {
    int B = type_block(type);
    for (size_t i = 0; i < n; i += (size_t)B) {
        switch (type) {
        case CKV_GW_T_F32:
            ckv_gw_buf_f32(o, x[i]), rec[i] = x[i], bnd[i] = 0;
            break;
        case CKV_GW_T_F16: {
            uint16_t h = f2h(x[i]);
            ckv_gw_buf_u16(o, h), rec[i] = h2f(h), bnd[i] = fabsf(x[i]) * 0x1p-11f + 0x1p-25f;
            break;
        }
        case CKV_GW_T_BF16: {
            uint16_t h = ckv_f32_to_bf16(x[i]);
            ckv_gw_buf_u16(o, h), rec[i] = ckv_bf16_to_f32(h), bnd[i] = fabsf(x[i]) * 0x1p-8f;
            break;
        }
        case CKV_GW_T_Q8_0: q8_0_block(x + i, o, rec + i, bnd + i); break;
        case CKV_GW_T_Q4_0: q4_0_block(x + i, o, rec + i, bnd + i); break;
        case CKV_GW_T_Q4_1: q4_1_block(x + i, o, rec + i, bnd + i); break;
        case CKV_GW_T_Q5_0: q5_0_block(x + i, o, rec + i, bnd + i); break;
        case CKV_GW_T_Q5_1: q5_1_block(x + i, o, rec + i, bnd + i); break;
        case CKV_GW_T_Q4_K: k_quant_block(x + i, o, rec + i, bnd + i, 15); break;
        case CKV_GW_T_Q5_K: k_quant_block(x + i, o, rec + i, bnd + i, 31); break;
        case CKV_GW_T_Q6_K: q6_k_block(x + i, o, rec + i, bnd + i); break;
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


/* Checks rows [r0, r1) x cols [c0, c1) of tensor `hf_name` ([R, C] in HF layout) against rec (exact
 * up to fp32 rounding) and orig (within bnd). */
static void check_read(ckv_weight_source *src, const char *what, const char *hf_name, int64_t R, int64_t C,
                       int64_t r0, int64_t r1, int64_t c0, int64_t c1, const float *orig, const float *rec,
                       const float *bnd) {
    int64_t shape[2] = {R, C};
    int64_t n = r1 < 0 ? R * C : ckv_gw_read_size(r0, r1, c0, c1);
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
    case CKV_GW_T_F16: return CKV_DTYPE_F16;
    case CKV_GW_T_BF16: return CKV_DTYPE_BF16;
    case CKV_GW_T_Q8_0: return CKV_DTYPE_Q8_0;
    case CKV_GW_T_Q4_0: return CKV_DTYPE_Q4_0;
    case CKV_GW_T_Q4_1: return CKV_DTYPE_Q4_1;
    case CKV_GW_T_Q5_0: return CKV_DTYPE_Q5_0;
    case CKV_GW_T_Q5_1: return CKV_DTYPE_Q5_1;
    case CKV_GW_T_Q4_K: return CKV_DTYPE_Q4_K;
    case CKV_GW_T_Q5_K: return CKV_DTYPE_Q5_K;
    case CKV_GW_T_Q6_K: return CKV_DTYPE_Q6_K;
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
    } cases[] = {{"model.layers.0.self_attn.q_proj.weight", CKV_GW_TH * CKV_GW_THD, CKV_GW_TD, 0, CKV_GW_TH * CKV_GW_THD, 0, CKV_GW_TD},
                 {"model.layers.0.self_attn.q_proj.weight", CKV_GW_TH * CKV_GW_THD, CKV_GW_TD, CKV_GW_THD, 3 * CKV_GW_THD, 0, CKV_GW_TD},
                 {"model.embed_tokens.weight", CKV_GW_TV, CKV_GW_TD, 2, 6, B == 256 ? 0 : 32, B == 256 ? CKV_GW_TD : 96}};
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
        const int64_t shape[2] = {CKV_GW_TV, CKV_GW_TD};
        uint8_t raw[4096];
        CHECK_FAILS(src->read_raw(src->ctx, "model.embed_tokens.weight", shape, 0, 1, 1, B, raw), CKV_STATUS_ERR_ARG,
                    "are not whole blocks");
    }
}

/* One file per type: token_embd [V, D] and attn_q / attn_k (permuted) of that type, plus F32 norms. */
static void test_type(uint32_t type, uint32_t version) {
    char what[160], fname[64];
    snprintf(fname, sizeof fname, "type_%s_v%u", type_name(type), version);
    size_t ne = (size_t)CKV_GW_TV * CKV_GW_TD, nq = (size_t)CKV_GW_TH * CKV_GW_THD * CKV_GW_TD, nk = (size_t)CKV_GW_THKV * CKV_GW_THD * CKV_GW_TD;
    float *x = malloc(ne * 4), *rec = malloc(ne * 4), *bnd = malloc(ne * 4);
    float *qx = malloc(nq * 4), *qg = malloc(nq * 4), *qrec_g = malloc(nq * 4), *qbnd_g = malloc(nq * 4);
    float *qrec = malloc(nq * 4), *qbnd = malloc(nq * 4), *qorig = malloc(nq * 4);
    float *kx = malloc(nk * 4), *kg = malloc(nk * 4), *krec_g = malloc(nk * 4), *kbnd_g = malloc(nk * 4);
    float *krec = malloc(nk * 4), *kbnd = malloc(nk * 4), *korig = malloc(nk * 4);
    make_values(x, ne, type);
    make_values(qx, nq, type + 100);
    make_values(kx, nk, type + 200);
    ckv_gw_file f;
    ckv_gw_file_init(&f, version);
    ckv_gw_add_llama_kvs(&f, CKV_GW_TD, CKV_GW_TL, CKV_GW_TF, CKV_GW_TH, CKV_GW_THKV, CKV_GW_TV, NULL);
    ckv_gw_buf b = {0};
    quantise(type, x, ne, &b, rec, bnd);
    ckv_gw_file_tensor(&f, "token_embd.weight", 2, CKV_GW_TD, CKV_GW_TV, type, b.p, b.n);
    free(b.p);
    /* q: HF rows -> GGUF order, quantised in that order; the expectation is mapped back */
    ckv_gw_to_gguf_rows(qx, qg, CKV_GW_TH * CKV_GW_THD, CKV_GW_TD, CKV_GW_TH);
    memset(&b, 0, sizeof b);
    quantise(type, qg, nq, &b, qrec_g, qbnd_g);
    ckv_gw_file_tensor(&f, "blk.0.attn_q.weight", 2, CKV_GW_TD, CKV_GW_TH * CKV_GW_THD, type, b.p, b.n);
    free(b.p);
    ckv_gw_to_gguf_rows(kx, kg, CKV_GW_THKV * CKV_GW_THD, CKV_GW_TD, CKV_GW_THKV);
    memset(&b, 0, sizeof b);
    quantise(type, kg, nk, &b, krec_g, kbnd_g);
    ckv_gw_file_tensor(&f, "blk.0.attn_k.weight", 2, CKV_GW_TD, CKV_GW_THKV * CKV_GW_THD, type, b.p, b.n);
    free(b.p);
    for (int64_t r = 0; r < CKV_GW_TH * CKV_GW_THD; r++) {
        int64_t g = ckv_gw_permuted_row(r, CKV_GW_THD);
        memcpy(qrec + r * CKV_GW_TD, qrec_g + g * CKV_GW_TD, CKV_GW_TD * 4);
        memcpy(qbnd + r * CKV_GW_TD, qbnd_g + g * CKV_GW_TD, CKV_GW_TD * 4);
        memcpy(qorig + r * CKV_GW_TD, qg + g * CKV_GW_TD, CKV_GW_TD * 4);
    }
    for (int64_t r = 0; r < CKV_GW_THKV * CKV_GW_THD; r++) {
        int64_t g = ckv_gw_permuted_row(r, CKV_GW_THD);
        memcpy(krec + r * CKV_GW_TD, krec_g + g * CKV_GW_TD, CKV_GW_TD * 4);
        memcpy(kbnd + r * CKV_GW_TD, kbnd_g + g * CKV_GW_TD, CKV_GW_TD * 4);
        memcpy(korig + r * CKV_GW_TD, kg + g * CKV_GW_TD, CKV_GW_TD * 4);
    }
    CHECK(memcmp(qorig, qx, nq * 4) == 0); /* the test's own permutation round-trips */
    const char *path = ckv_gw_file_write(&f, fname);
    ckv_gw_file_free(&f);

    ckv_weight_source src;
    ckv_model_config cfg;
    ckv_status s = ckv_gguf_open_source(&src, &cfg, path);
    CHECK_MSG(s == CKV_STATUS_OK, "%s: %s", fname, ckv_error_message());
    if (s == CKV_STATUS_OK) {
        snprintf(what, sizeof what, "%s embed whole", fname);
        check_read(&src, what, "model.embed_tokens.weight", CKV_GW_TV, CKV_GW_TD, 0, -1, 0, -1, x, rec, bnd);
        snprintf(what, sizeof what, "%s embed rows [2,6) cols [40,200)", fname);
        check_read(&src, what, "model.embed_tokens.weight", CKV_GW_TV, CKV_GW_TD, 2, 6, 40, 200, x, rec, bnd);
        snprintf(what, sizeof what, "%s embed rows [1,3) cols [32,64)", fname);
        check_read(&src, what, "model.embed_tokens.weight", CKV_GW_TV, CKV_GW_TD, 1, 3, 32, 64, x, rec, bnd);
        snprintf(what, sizeof what, "%s embed rows [7,8) cols [255,256)", fname);
        check_read(&src, what, "model.embed_tokens.weight", CKV_GW_TV, CKV_GW_TD, 7, 8, 255, 256, x, rec, bnd);
        snprintf(what, sizeof what, "%s q_proj whole (unpermuted)", fname);
        check_read(&src, what, "model.layers.0.self_attn.q_proj.weight", CKV_GW_TH * CKV_GW_THD, CKV_GW_TD, 0, -1, 0, -1, qx, qrec, qbnd);
        snprintf(what, sizeof what, "%s q_proj heads 1-2", fname);
        check_read(&src, what, "model.layers.0.self_attn.q_proj.weight", CKV_GW_TH * CKV_GW_THD, CKV_GW_TD, CKV_GW_THD, 3 * CKV_GW_THD, 0, CKV_GW_TD, qx, qrec,
                   qbnd);
        snprintf(what, sizeof what, "%s k_proj whole (unpermuted, %d heads)", fname, CKV_GW_THKV);
        check_read(&src, what, "model.layers.0.self_attn.k_proj.weight", CKV_GW_THKV * CKV_GW_THD, CKV_GW_TD, 0, -1, 0, -1, kx, krec, kbnd);
        snprintf(what, sizeof what, "%s k_proj head 1 cols [100,130)", fname);
        check_read(&src, what, "model.layers.0.self_attn.k_proj.weight", CKV_GW_THKV * CKV_GW_THD, CKV_GW_TD, CKV_GW_THD, 2 * CKV_GW_THD, 100, 130, kx,
                   krec, kbnd);
        check_raw(&src, fname, type);
        CHECK(cfg.tie_word_embeddings == 1);
        CHECK(src.has(src.ctx, "model.layers.0.self_attn.q_proj.weight"));
        CHECK(!src.has(src.ctx, "lm_head.weight"));
        CHECK(!src.has(src.ctx, "model.layers.0.self_attn.v_proj.weight"));
        CHECK(cfg.dtype == (type == CKV_GW_T_F16 ? CKV_DTYPE_F16 : type == CKV_GW_T_BF16 ? CKV_DTYPE_BF16 : CKV_DTYPE_F32));
    }
    ckv_source_close(&src);
    free(x), free(rec), free(bnd);
    free(qx), free(qg), free(qrec_g), free(qbnd_g), free(qrec), free(qbnd), free(qorig);
    free(kx), free(kg), free(krec_g), free(kbnd_g), free(krec), free(kbnd), free(korig);
}

/* Metadata of every value type and array element type, the config mapping, alignment and padding. */
static void test_metadata_and_alignment(size_t alignment, int write_alignment, uint32_t version) {
    ckv_gw_file f;
    ckv_gw_file_init(&f, version);
    f.align = alignment;
    if (write_alignment) ckv_gw_kv_u32(&f, "general.alignment", (uint32_t)alignment);
    ckv_gw_add_llama_kvs(&f, CKV_GW_TD, CKV_GW_TL, CKV_GW_TF, CKV_GW_TH, CKV_GW_THKV, CKV_GW_TV, NULL);
    ckv_gw_kv_key(&f, "x.u8", CKV_GW_V_U8), ckv_gw_buf_u8(&f.kv, 200);
    ckv_gw_kv_key(&f, "x.i8", CKV_GW_V_I8), ckv_gw_buf_u8(&f.kv, (uint8_t)-5);
    ckv_gw_kv_key(&f, "x.u16", CKV_GW_V_U16), ckv_gw_buf_u16(&f.kv, 60000);
    ckv_gw_kv_key(&f, "x.i16", CKV_GW_V_I16), ckv_gw_buf_u16(&f.kv, (uint16_t)-300);
    ckv_gw_kv_u32(&f, "x.u32", 4000000000u);
    ckv_gw_kv_i32(&f, "x.i32", -7);
    ckv_gw_kv_f32(&f, "x.f32", 1.5f);
    ckv_gw_kv_key(&f, "x.bool", CKV_GW_V_BOOL), ckv_gw_buf_u8(&f.kv, 1);
    ckv_gw_kv_str(&f, "x.string", "h\xc3\xa9llo");
    ckv_gw_kv_str(&f, "x.empty_string", "");
    ckv_gw_kv_u64(&f, "x.u64", 1ull << 40);
    ckv_gw_kv_key(&f, "x.i64", CKV_GW_V_I64), ckv_gw_buf_u64(&f.kv, (uint64_t)-9);
    ckv_gw_kv_key(&f, "x.f64", CKV_GW_V_F64), ckv_gw_buf_f64(&f.kv, 2.25);
    static const uint32_t elem[] = {CKV_GW_V_U8, CKV_GW_V_I8, CKV_GW_V_U16, CKV_GW_V_I16, CKV_GW_V_U32, CKV_GW_V_I32, CKV_GW_V_F32, CKV_GW_V_BOOL, CKV_GW_V_U64, CKV_GW_V_I64, CKV_GW_V_F64};
    static const int esize[] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 8, 8};
    for (size_t i = 0; i < sizeof elem / sizeof elem[0]; i++) {
        char key[32];
        snprintf(key, sizeof key, "x.array%zu", i);
        ckv_gw_kv_key(&f, key, CKV_GW_V_ARR);
        ckv_gw_buf_u32(&f.kv, elem[i]);
        ckv_gw_buf_u64(&f.kv, 3);
        for (int k = 0; k < 3; k++) {
            uint8_t v[8] = {0};
            v[0] = (uint8_t)(k & 1);
            ckv_gw_buf_put(&f.kv, v, (size_t)esize[i]);
        }
    }
    ckv_gw_kv_key(&f, "x.empty_array", CKV_GW_V_ARR), ckv_gw_buf_u32(&f.kv, CKV_GW_V_U32), ckv_gw_buf_u64(&f.kv, 0);
    ckv_gw_kv_key(&f, "x.string_array", CKV_GW_V_ARR), ckv_gw_buf_u32(&f.kv, CKV_GW_V_STR), ckv_gw_buf_u64(&f.kv, 2);
    ckv_gw_buf_str(&f.kv, "a"), ckv_gw_buf_str(&f.kv, "");
    /* per-layer head counts as a uniform array */
    ckv_gw_kv_f32(&f, "llama.rope.scaling.factor", 4.0f);
    ckv_gw_kv_str(&f, "llama.rope.scaling.type", "linear");
    ckv_gw_kv_u32(&f, "tokenizer.ggml.eot_token_id", 5);

    size_t ne = (size_t)CKV_GW_TV * CKV_GW_TD;
    float *x = malloc(ne * 4), *rec = malloc(ne * 4), *bnd = malloc(ne * 4), *n1 = malloc(CKV_GW_TD * 4);
    make_values(x, ne, 3);
    for (int i = 0; i < CKV_GW_TD; i++) n1[i] = 1.0f + (float)i / 256.0f;
    ckv_gw_buf b = {0};
    quantise(CKV_GW_T_Q8_0, x, ne, &b, rec, bnd);
    /* a 1-element F32 tensor first, so the next one must be padded to the alignment */
    float one = 3.0f;
    ckv_gw_file_tensor(&f, "x.scalar", 1, 1, 0, CKV_GW_T_F32, &one, 4);
    ckv_gw_file_tensor(&f, "token_embd.weight", 2, CKV_GW_TD, CKV_GW_TV, CKV_GW_T_Q8_0, b.p, b.n);
    ckv_gw_tensor *nt = ckv_gw_file_tensor(&f, "output_norm.weight", 1, CKV_GW_TD, 0, CKV_GW_T_F32, n1, CKV_GW_TD * 4);
    nt->offset = (int64_t)ckv_gw_align_up(64 * 1024, alignment); /* a gap before it */
    ckv_gw_file_tensor(&f, "output.weight", 2, CKV_GW_TD, CKV_GW_TV, CKV_GW_T_Q8_0, b.p, b.n);
    free(b.p);
    char name[64];
    snprintf(name, sizeof name, "meta_align%zu_%d_v%u", alignment, write_alignment, version);
    const char *path = ckv_gw_file_write(&f, name);
    ckv_gw_file_free(&f);

    ckv_weight_source src;
    ckv_model_config c;
    ckv_status s = ckv_gguf_open_source(&src, &c, path);
    CHECK_MSG(s == CKV_STATUS_OK, "%s: %s", name, ckv_error_message());
    if (s == CKV_STATUS_OK) {
        CHECK(c.arch == CKV_ARCH_LLAMA && !strcmp(c.arch_name, "LlamaForCausalLM"));
        CHECK(c.hidden_size == CKV_GW_TD && c.n_layers == CKV_GW_TL && c.intermediate_size == CKV_GW_TF);
        CHECK(c.n_heads == CKV_GW_TH && c.n_kv_heads == CKV_GW_THKV && c.head_dim == CKV_GW_TD / CKV_GW_TH);
        CHECK(c.vocab_size == CKV_GW_TV && c.max_position_embeddings == 2048 && c.max_context == 2048);
        CHECK(fabs(c.rms_norm_eps - 1e-5) < 1e-10);
        CHECK(c.rope.theta == 50000.0 && c.rope.type == CKV_ROPE_TYPE_LINEAR && c.rope.factor == 4.0);
        CHECK(c.bos_token_id == 1 && c.n_eos == 2 && c.eos_ids[0] == 2 && c.eos_ids[1] == 5);
        CHECK(c.tie_word_embeddings == 0 && c.attention_bias == 0 && c.sliding_window == 0);
        CHECK(src.has(src.ctx, "lm_head.weight"));
        snprintf(name, sizeof name, "align %zu lm_head", alignment);
        check_read(&src, name, "lm_head.weight", CKV_GW_TV, CKV_GW_TD, 0, -1, 0, -1, x, rec, bnd);
        float got[CKV_GW_TD];
        int64_t D = CKV_GW_TD;
        CHECK_OK(src.read_f32(src.ctx, "model.norm.weight", 1, &D, 0, -1, 0, -1, got));
        CHECK(memcmp(got, n1, sizeof got) == 0);
    }
    ckv_source_close(&src);
    free(x), free(rec), free(bnd), free(n1);
}

/* q/k biases are permuted like the rows of their weights. */
static void test_bias_and_config(void) {
    ckv_gw_file f;
    ckv_gw_file_init(&f, 3);
    ckv_gw_add_llama_kvs(&f, CKV_GW_TD, CKV_GW_TL, CKV_GW_TF, CKV_GW_TH, CKV_GW_THKV, CKV_GW_TV, NULL);
    ckv_gw_kv_str(&f, "llama.rope.scaling.type", "yarn");
    ckv_gw_kv_f32(&f, "llama.rope.scaling.factor", 4.0f);
    ckv_gw_kv_u32(&f, "llama.rope.scaling.original_context_length", 512);
    ckv_gw_kv_f32(&f, "llama.rope.scaling.yarn_beta_fast", 16.0f);
    float e[CKV_GW_TV * CKV_GW_TD] = {0};
    ckv_gw_file_tensor(&f, "token_embd.weight", 2, CKV_GW_TD, CKV_GW_TV, CKV_GW_T_F32, e, sizeof e);
    float qb[CKV_GW_TH * CKV_GW_THD], qbg[CKV_GW_TH * CKV_GW_THD], kb[CKV_GW_THKV * CKV_GW_THD], kbg[CKV_GW_THKV * CKV_GW_THD], ob[CKV_GW_TD];
    for (int i = 0; i < CKV_GW_TH * CKV_GW_THD; i++) qb[i] = (float)i;
    for (int i = 0; i < CKV_GW_THKV * CKV_GW_THD; i++) kb[i] = -(float)i;
    for (int i = 0; i < CKV_GW_TD; i++) ob[i] = 0.5f * (float)i;
    ckv_gw_to_gguf_rows(qb, qbg, CKV_GW_TH * CKV_GW_THD, 1, CKV_GW_TH);
    ckv_gw_to_gguf_rows(kb, kbg, CKV_GW_THKV * CKV_GW_THD, 1, CKV_GW_THKV);
    ckv_gw_file_tensor(&f, "blk.0.attn_q.bias", 1, CKV_GW_TH * CKV_GW_THD, 0, CKV_GW_T_F32, qbg, sizeof qbg);
    ckv_gw_file_tensor(&f, "blk.0.attn_k.bias", 1, CKV_GW_THKV * CKV_GW_THD, 0, CKV_GW_T_F32, kbg, sizeof kbg);
    ckv_gw_file_tensor(&f, "blk.0.attn_v.bias", 1, CKV_GW_THKV * CKV_GW_THD, 0, CKV_GW_T_F32, kbg, sizeof kbg);
    ckv_gw_file_tensor(&f, "blk.0.attn_output.bias", 1, CKV_GW_TD, 0, CKV_GW_T_F32, ob, sizeof ob);
    const char *path = ckv_gw_file_write(&f, "bias");
    ckv_gw_file_free(&f);
    ckv_weight_source src;
    ckv_model_config c;
    ckv_status s = ckv_gguf_open_source(&src, &c, path);
    CHECK_MSG(s == CKV_STATUS_OK, "bias: %s", ckv_error_message());
    if (s == CKV_STATUS_OK) {
        CHECK(c.attention_bias == 1);
        CHECK(c.rope.type == CKV_ROPE_TYPE_YARN && c.rope.factor == 4.0 && c.rope.original_max_position == 512);
        CHECK(c.rope.beta_fast == 16.0 && c.rope.beta_slow == 1.0 && c.rope.attention_factor == 0.0);
        CHECK(c.max_context == 2048); /* 512 * 4 = 2048 = context_length */
        float got[CKV_GW_TH * CKV_GW_THD];
        int64_t n = CKV_GW_TH * CKV_GW_THD;
        CHECK_OK(src.read_f32(src.ctx, "model.layers.0.self_attn.q_proj.bias", 1, &n, 0, -1, 0, -1, got));
        CHECK(memcmp(got, qb, sizeof qb) == 0);
        n = CKV_GW_THKV * CKV_GW_THD;
        CHECK_OK(src.read_f32(src.ctx, "model.layers.0.self_attn.k_proj.bias", 1, &n, 0, -1, 0, -1, got));
        CHECK(memcmp(got, kb, sizeof kb) == 0);
        CHECK_OK(src.read_f32(src.ctx, "model.layers.0.self_attn.v_proj.bias", 1, &n, 0, -1, 0, -1, got));
        CHECK(memcmp(got, kbg, sizeof kbg) == 0); /* v is not permuted */
        n = CKV_GW_TD;
        CHECK_OK(src.read_f32(src.ctx, "model.layers.0.self_attn.o_proj.bias", 1, &n, 0, -1, 0, -1, got));
        CHECK(memcmp(got, ob, sizeof ob) == 0);
        /* read errors */
        int64_t bad[2] = {CKV_GW_TV, CKV_GW_TD + 1};
        CHECK_FAILS(src.read_f32(src.ctx, "model.embed_tokens.weight", 2, bad, 0, -1, 0, -1, got),
                    CKV_STATUS_ERR_SHAPE, "shape [8, 256] in the file, expected [8, 257]");
        int64_t good[2] = {CKV_GW_TV, CKV_GW_TD};
        CHECK_FAILS(src.read_f32(src.ctx, "model.embed_tokens.weight", 2, good, 0, 9, 0, CKV_GW_TD, got), CKV_STATUS_ERR_RANGE,
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
    ckv_gw_file f;
    ckv_gw_file_init(&f, 3);
    ckv_gw_kv_str(&f, "general.architecture", "qwen2");
    ckv_gw_kv_u32(&f, "qwen2.context_length", 32768);
    ckv_gw_kv_u32(&f, "qwen2.embedding_length", CKV_GW_TD);
    ckv_gw_kv_u32(&f, "qwen2.block_count", CKV_GW_TL);
    ckv_gw_kv_u32(&f, "qwen2.feed_forward_length", CKV_GW_TF);
    ckv_gw_kv_u32(&f, "qwen2.attention.head_count", CKV_GW_TH);
    ckv_gw_kv_u32(&f, "qwen2.attention.head_count_kv", CKV_GW_THKV);
    ckv_gw_kv_f32(&f, "qwen2.attention.layer_norm_rms_epsilon", 1e-6f);
    ckv_gw_kv_f32(&f, "qwen2.rope.freq_base", 1000000.0f);
    ckv_gw_kv_u32(&f, "tokenizer.ggml.eos_token_id", 3);
    ckv_gw_add_tokens(&f, CKV_GW_TV);
    float e[CKV_GW_TV * CKV_GW_TD] = {0};
    ckv_gw_file_tensor(&f, "token_embd.weight", 2, CKV_GW_TD, CKV_GW_TV, CKV_GW_T_F32, e, sizeof e);
    ckv_gw_file_tensor(&f, "output.weight", 2, CKV_GW_TD, CKV_GW_TV, CKV_GW_T_F32, e, sizeof e);
    for (int i = 0; i < CKV_GW_TH * CKV_GW_THD * CKV_GW_TD; i++) qw[i] = (float)(i % 977) - 300.0f;
    ckv_gw_file_tensor(&f, "blk.0.attn_q.weight", 2, CKV_GW_TD, CKV_GW_TH * CKV_GW_THD, CKV_GW_T_F32, qw, sizeof(float) * CKV_GW_TH * CKV_GW_THD * CKV_GW_TD);
    float b[CKV_GW_TD] = {0};
    if (bias) {
        ckv_gw_file_tensor(&f, "blk.0.attn_q.bias", 1, CKV_GW_TH * CKV_GW_THD, 0, CKV_GW_T_F32, b, sizeof(float) * CKV_GW_TH * CKV_GW_THD);
        ckv_gw_file_tensor(&f, "blk.0.attn_k.bias", 1, CKV_GW_THKV * CKV_GW_THD, 0, CKV_GW_T_F32, b, sizeof(float) * CKV_GW_THKV * CKV_GW_THD);
        ckv_gw_file_tensor(&f, "blk.0.attn_v.bias", 1, CKV_GW_THKV * CKV_GW_THD, 0, CKV_GW_T_F32, b, sizeof(float) * CKV_GW_THKV * CKV_GW_THD);
    }
    if (bias == 2) ckv_gw_file_tensor(&f, "blk.0.attn_output.bias", 1, CKV_GW_TD, 0, CKV_GW_T_F32, b, sizeof b);
    const char *path = ckv_gw_file_write(&f, name);
    ckv_gw_file_free(&f);
    return path;
}

static void test_qwen2(void) {
    float *qw = malloc(sizeof(float) * CKV_GW_TH * CKV_GW_THD * CKV_GW_TD), *got = malloc(sizeof(float) * CKV_GW_TH * CKV_GW_THD * CKV_GW_TD);
    ckv_weight_source src;
    ckv_model_config c;
    ckv_status s = ckv_gguf_open_source(&src, &c, qwen2_file("qwen2", 1, qw));
    CHECK_MSG(s == CKV_STATUS_OK, "qwen2: %s", ckv_error_message());
    if (s == CKV_STATUS_OK) {
        CHECK(c.arch == CKV_ARCH_QWEN2 && !strcmp(c.arch_name, "Qwen2ForCausalLM"));
        CHECK(c.hidden_size == CKV_GW_TD && c.n_heads == CKV_GW_TH && c.n_kv_heads == CKV_GW_THKV && c.head_dim == CKV_GW_THD);
        CHECK(c.max_position_embeddings == 32768 && c.max_context == 32768);
        CHECK(c.rope.theta == 1e6 && c.rope.type == CKV_ROPE_TYPE_DEFAULT);
        CHECK(fabs(c.rms_norm_eps - 1e-6) < 1e-12 && c.attention_bias == 1 && c.tie_word_embeddings == 0);
        CHECK(c.n_eos == 1 && c.eos_ids[0] == 3 && c.bos_token_id == -1);
        int64_t shape[2] = {CKV_GW_TH * CKV_GW_THD, CKV_GW_TD};
        CHECK_OK(src.read_f32(src.ctx, "model.layers.0.self_attn.q_proj.weight", 2, shape, 0, -1, 0, -1, got));
        CHECK_MSG(memcmp(got, qw, sizeof(float) * CKV_GW_TH * CKV_GW_THD * CKV_GW_TD) == 0, "qwen2: q_proj rows are read as stored");
        ckv_source_close(&src);
    }
    CHECK_FAILS(ckv_gguf_open_source(&src, &c, qwen2_file("qwen2_nobias", 0, qw)), CKV_STATUS_ERR_UNSUPPORTED,
                "architecture qwen2 needs q/k/v biases");
    CHECK_FAILS(ckv_gguf_open_source(&src, &c, qwen2_file("qwen2_obias", 2, qw)), CKV_STATUS_ERR_UNSUPPORTED,
                "this file has an attn_output bias");
    free(qw), free(got);
}

int main(void) {
    static const uint32_t types[] = {CKV_GW_T_F32,  CKV_GW_T_F16,  CKV_GW_T_BF16, CKV_GW_T_Q8_0, CKV_GW_T_Q4_0, CKV_GW_T_Q4_1,
                                     CKV_GW_T_Q5_0, CKV_GW_T_Q5_1, CKV_GW_T_Q4_K, CKV_GW_T_Q5_K, CKV_GW_T_Q6_K};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) test_type(types[i], i % 2 ? 2 : 3);
    test_metadata_and_alignment(32, 0, 3);
    test_metadata_and_alignment(32, 1, 2);
    test_metadata_and_alignment(64, 1, 3);
    test_metadata_and_alignment(256, 1, 2);
    test_bias_and_config();
    test_qwen2();
    return ckv_test_finish("test_gguf");
}

