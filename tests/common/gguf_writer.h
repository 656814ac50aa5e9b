/* gguf_writer.h - GGUF files written by the tests: a byte buffer, a file of metadata and tensors
 * (serialised with the alignment asked for, or with deliberate faults set by the caller), written
 * under CKV_TEST_TMP; the llama metadata and token list of the small test models, the HF -> GGUF
 * q/k row permutation. It checks nothing (the GGUF tests do). Tests only. */
#ifndef CKV_TEST_GGUF_WRITER_H
#define CKV_TEST_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint8_t *p;
    size_t n, cap;
} ckv_gw_buf;

/* metadata value types and tensor types as GGUF numbers them */
enum {
    CKV_GW_V_U8, CKV_GW_V_I8, CKV_GW_V_U16, CKV_GW_V_I16, CKV_GW_V_U32, CKV_GW_V_I32, CKV_GW_V_F32,
    CKV_GW_V_BOOL, CKV_GW_V_STR, CKV_GW_V_ARR, CKV_GW_V_U64, CKV_GW_V_I64, CKV_GW_V_F64
};

enum {
    CKV_GW_T_F32 = 0, CKV_GW_T_F16 = 1, CKV_GW_T_Q4_0 = 2, CKV_GW_T_Q4_1 = 3, CKV_GW_T_Q5_0 = 6, CKV_GW_T_Q5_1 = 7,
    CKV_GW_T_Q8_0 = 8, CKV_GW_T_Q2_K = 10, CKV_GW_T_Q4_K = 12, CKV_GW_T_Q5_K = 13, CKV_GW_T_Q6_K = 14, CKV_GW_T_BF16 = 30
};

typedef struct {
    char name[96];
    int ndim;
    uint64_t ne[4];
    uint32_t type;
    ckv_gw_buf data;
    int64_t offset; /* -1: the next aligned slot */
} ckv_gw_tensor;

typedef struct {
    uint32_t version;
    ckv_gw_buf kv;
    uint64_t n_kv;
    ckv_gw_tensor t[48];
    int nt;
    size_t align; /* where tensors go (general.alignment is written separately, or not) */
} ckv_gw_file;

/* the shape of the small llama test model */
enum { CKV_GW_TD = 256, CKV_GW_TV = 8, CKV_GW_TH = 4, CKV_GW_THKV = 2, CKV_GW_THD = 64, CKV_GW_TL = 1, CKV_GW_TF = 256 };

/* bytes appended to a growing buffer (the test exits when memory runs out) */
void ckv_gw_buf_put(ckv_gw_buf *b, const void *src, size_t n);
void ckv_gw_buf_u8(ckv_gw_buf *b, uint8_t v);
void ckv_gw_buf_u16(ckv_gw_buf *b, uint16_t v);
void ckv_gw_buf_u32(ckv_gw_buf *b, uint32_t v);
void ckv_gw_buf_u64(ckv_gw_buf *b, uint64_t v);
void ckv_gw_buf_f32(ckv_gw_buf *b, float v);
void ckv_gw_buf_f64(ckv_gw_buf *b, double v);
void ckv_gw_buf_str(ckv_gw_buf *b, const char *s);
/* a file: metadata pairs in the order added, tensors at the next aligned offset (or one set) */
void ckv_gw_file_init(ckv_gw_file *f, uint32_t version);
void ckv_gw_file_free(ckv_gw_file *f);
void ckv_gw_kv_key(ckv_gw_file *f, const char *key, uint32_t type);
void ckv_gw_kv_u32(ckv_gw_file *f, const char *k, uint32_t v);
void ckv_gw_kv_i32(ckv_gw_file *f, const char *k, int32_t v);
void ckv_gw_kv_u64(ckv_gw_file *f, const char *k, uint64_t v);
void ckv_gw_kv_f32(ckv_gw_file *f, const char *k, float v);
void ckv_gw_kv_str(ckv_gw_file *f, const char *k, const char *v);
ckv_gw_tensor *ckv_gw_file_tensor(ckv_gw_file *f, const char *name, int ndim, uint64_t ne0, uint64_t ne1, uint32_t type,
                                  const void *data, size_t nbytes);
uint64_t ckv_gw_align_up(uint64_t x, uint64_t a);
/* serialised into out (malloc'd), or written to CKV_TEST_TMP/gguf_NAME.gguf (the path returned) */
void ckv_gw_file_build(ckv_gw_file *f, ckv_gw_buf *out);
const char *ckv_gw_tmp_path(const char *name);
void ckv_gw_write_bytes(const char *path, const void *p, size_t n);
const char *ckv_gw_file_write(ckv_gw_file *f, const char *name);
/* llama metadata in assorted integer types, every key but `skip` (NULL: all); n token strings */
void ckv_gw_add_tokens(ckv_gw_file *f, int n);
void ckv_gw_add_llama_kvs(ckv_gw_file *f, int D, int L, int F, int H, int Hkv, int V, const char *skip);
/* the HF -> GGUF q/k row permutation (per head (a, j) -> (j, a)); a matrix in GGUF row order;
 * elements of a [r0, r1) x [c0, c1) read */
int64_t ckv_gw_permuted_row(int64_t r, int64_t d);
void ckv_gw_to_gguf_rows(const float *hf, float *g, int64_t rows, int64_t cols, int heads);
int64_t ckv_gw_read_size(int64_t r0, int64_t r1, int64_t c0, int64_t c1);

#endif
