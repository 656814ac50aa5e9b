/* test_gguf_malformed.c - malformed GGUF files (written by tests/common/gguf_writer.h) each fail to
 * open or read with the right status and a message naming the problem: unknown, retired and
 * unsupported tensor types, misaligned, overlapping and out-of-file data, duplicate names and keys,
 * too many dimensions, zero or ragged extents, bad alignment values, unknown or nested value types,
 * bad booleans, unsupported architectures and features, missing required keys, truncations. */
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

/* ---- malformed files --------------------------------------------------------------------------- */

/* A small valid llama file as bytes; `mutate` is applied to the ckv_gw_file before building. */
static void small_file(ckv_gw_buf *out, uint32_t version, void (*mutate)(ckv_gw_file *)) {
    ckv_gw_file f;
    ckv_gw_file_init(&f, version);
    ckv_gw_add_llama_kvs(&f, 64, 1, 128, 4, 2, 4, NULL);
    float e[4 * 64];
    for (int i = 0; i < 4 * 64; i++) e[i] = (float)i;
    ckv_gw_file_tensor(&f, "token_embd.weight", 2, 64, 4, CKV_GW_T_F32, e, sizeof e);
    ckv_gw_file_tensor(&f, "output_norm.weight", 1, 64, 0, CKV_GW_T_F32, e, 64 * 4);
    if (mutate) mutate(&f);
    ckv_gw_file_build(&f, out);
    ckv_gw_file_free(&f);
}

static ckv_status open_bytes(const char *name, const void *p, size_t n) {
    const char *path = ckv_gw_tmp_path(name);
    ckv_gw_write_bytes(path, p, n);
    ckv_weight_source src;
    ckv_model_config c;
    ckv_status s = ckv_gguf_open_source(&src, &c, path);
    if (s == CKV_STATUS_OK) ckv_source_close(&src);
    return s;
}

static ckv_status open_small(const char *name, void (*mutate)(ckv_gw_file *)) {
    ckv_gw_buf b;
    small_file(&b, 3, mutate);
    ckv_status s = open_bytes(name, b.p, b.n);
    free(b.p);
    return s;
}

static void m_unknown_type(ckv_gw_file *f) { f->t[1].type = 99; }
static void m_retired_type(ckv_gw_file *f) { f->t[1].type = 4; }
static void m_misaligned(ckv_gw_file *f) { f->t[1].offset = 1024 + 4; }
static void m_overlap(ckv_gw_file *f) {
    f->t[0].offset = 0;
    f->t[1].offset = 512;
}
static void m_duplicate_name(ckv_gw_file *f) { snprintf(f->t[1].name, sizeof f->t[1].name, "token_embd.weight"); }
static void m_duplicate_key(ckv_gw_file *f) { ckv_gw_kv_u32(f, "llama.block_count", 1); }
static void m_five_dims(ckv_gw_file *f) { f->t[1].ndim = 5, f->t[1].ne[1] = f->t[1].ne[2] = f->t[1].ne[3] = 1; }
static void m_zero_extent(ckv_gw_file *f) { f->t[1].ndim = 2, f->t[1].ne[1] = 0; }
static void m_not_block_multiple(ckv_gw_file *f) { f->t[1].type = CKV_GW_T_Q8_0; } /* 64 elements of F32 bytes: fine */
static void m_block_ragged(ckv_gw_file *f) {
    f->t[1].type = CKV_GW_T_Q8_0;
    f->t[1].ne[0] = 48;
}
static void m_bad_alignment(ckv_gw_file *f) { ckv_gw_kv_u32(f, "general.alignment", 48); }
static void m_alignment_string(ckv_gw_file *f) { ckv_gw_kv_str(f, "general.alignment", "32"); }
static void m_unknown_value_type(ckv_gw_file *f) { ckv_gw_kv_key(f, "x.bad", 13), ckv_gw_buf_u32(&f->kv, 0); }
static void m_nested_array(ckv_gw_file *f) { ckv_gw_kv_key(f, "x.nested", CKV_GW_V_ARR), ckv_gw_buf_u32(&f->kv, CKV_GW_V_ARR), ckv_gw_buf_u64(&f->kv, 0); }
static void m_bad_bool(ckv_gw_file *f) { ckv_gw_kv_key(f, "x.bool", CKV_GW_V_BOOL), ckv_gw_buf_u8(&f->kv, 7); }
static void m_gemma(ckv_gw_file *f) {
    ckv_gw_file_free(f); /* drops the llama keys and tensors */
    ckv_gw_file_init(f, 3);
    ckv_gw_kv_str(f, "general.architecture", "gemma");
}
static void m_experts(ckv_gw_file *f) { ckv_gw_kv_u32(f, "llama.expert_count", 8); }
static void m_embd_rows(ckv_gw_file *f) { f->t[0].ne[1] = 2; }
static void m_rope_freqs(ckv_gw_file *f) {
    float ones[32] = {1};
    ckv_gw_file_tensor(f, "rope_freqs.weight", 1, 32, 0, CKV_GW_T_F32, ones, sizeof ones);
}
static void m_longrope(ckv_gw_file *f) {
    ckv_gw_kv_str(f, "llama.rope.scaling.type", "longrope");
    ckv_gw_kv_f32(f, "llama.rope.scaling.factor", 2.0f);
}

/* Opens a small file whose llama keys lack `skip`, after `extra` added its own keys. */
static ckv_status open_without(const char *skip, void (*extra)(ckv_gw_file *)) {
    ckv_gw_file f;
    ckv_gw_file_init(&f, 3);
    if (extra) extra(&f);
    ckv_gw_add_llama_kvs(&f, 64, 1, 128, 4, 2, 4, skip);
    float e[4 * 64] = {0};
    ckv_gw_file_tensor(&f, "token_embd.weight", 2, 64, 4, CKV_GW_T_F32, e, sizeof e);
    ckv_gw_buf b;
    ckv_gw_file_build(&f, &b);
    ckv_gw_file_free(&f);
    ckv_status s = open_bytes("without", b.p, b.n);
    free(b.p);
    return s;
}

static void missing_key(const char *key) {
    char needle[128];
    snprintf(needle, sizeof needle, "missing metadata key '%s'", key);
    CHECK_FAILS(open_without(key, NULL), CKV_STATUS_ERR_FORMAT, needle);
}

static void x_partial_rotary(ckv_gw_file *f) { ckv_gw_kv_u32(f, "llama.rope.dimension_count", 8); }
static void x_block_count_string(ckv_gw_file *f) { ckv_gw_kv_str(f, "llama.block_count", "thirty"); }

static void test_malformed(void) {
    ckv_gw_buf b;
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
    ckv_gw_buf s = {0};
    ckv_gw_buf_put(&s, "GGUF", 4), ckv_gw_buf_u32(&s, 2), ckv_gw_buf_u64(&s, 0), ckv_gw_buf_u64(&s, 1);
    ckv_gw_buf_str(&s, "general.name"), ckv_gw_buf_u32(&s, CKV_GW_V_STR), ckv_gw_buf_u64(&s, 1000), ckv_gw_buf_put(&s, "short", 5);
    CHECK_FAILS(open_bytes("value_length", s.p, s.n), CKV_STATUS_ERR_FORMAT,
                "metadata key 'general.name': string length 1000");
    /* an array whose count cannot fit */
    s.n = 0;
    ckv_gw_buf_put(&s, "GGUF", 4), ckv_gw_buf_u32(&s, 3), ckv_gw_buf_u64(&s, 0), ckv_gw_buf_u64(&s, 1);
    ckv_gw_buf_str(&s, "a"), ckv_gw_buf_u32(&s, CKV_GW_V_ARR), ckv_gw_buf_u32(&s, CKV_GW_V_U64), ckv_gw_buf_u64(&s, 1ull << 60), ckv_gw_buf_u64(&s, 0);
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
    ckv_gw_file f;
    ckv_gw_file_init(&f, 3);
    ckv_gw_add_llama_kvs(&f, 256, 1, 128, 4, 2, 4, NULL);
    uint8_t raw[4 * 84] = {0};
    ckv_gw_file_tensor(&f, "token_embd.weight", 2, 256, 4, CKV_GW_T_Q2_K, raw, sizeof raw);
    const char *path = ckv_gw_file_write(&f, "q2k");
    ckv_gw_file_free(&f);
    ckv_weight_source src;
    ckv_model_config c;
    CHECK_OK(ckv_gguf_open_source(&src, &c, path));
    float out[4 * 256];
    CHECK_FAILS(src.read_f32(src.ctx, "model.embed_tokens.weight", 0, NULL, 0, -1, 0, -1, out),
                CKV_STATUS_ERR_UNSUPPORTED, "has type Q2_K, which ckv cannot dequantise");
    ckv_source_close(&src);
    CHECK_FAILS(ckv_gguf_open_source(&src, &c, ckv_gw_tmp_path("does_not_exist")), CKV_STATUS_ERR_IO, "cannot open");
}

int main(void) {
    test_malformed();
    return ckv_test_finish("test_gguf_malformed");
}
