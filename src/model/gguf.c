/* gguf.c - the weight source over a parsed GGUF file (gguf_file.h) and ckv_model_config from its metadata.
 *
 * Dequantisation to fp32: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K, following
 * the published ggml block layouts (core/quant.c; other known types parse, but are refused when read).
 * A 2-D GGUF tensor with extents (ne0, ne1) is the row-major [ne1, ne0] matrix of Hugging Face's
 * (out, in) layout, quantised along rows; slices (a tensor-parallel shard's rows or columns) dequantise
 * only the rows asked for and only the blocks that cover the columns asked for; read_raw hands out the
 * stored blocks of whole-block column ranges for the typed-weight path, stored_dtype says their type.
 *
 * The llama and qwen2 architectures: metadata (keys prefixed with the architecture's name) maps onto
 * ckv_model_config, Hugging Face tensor names map onto GGUF names, and for llama the rotary row
 * permutation that the HF -> GGUF conversion applies to q_proj and k_proj (per head, rows (2, d/2)
 * transposed to (d/2, 2)) is undone on read, so ckv's rotate_half RoPE applies (qwen2 files keep
 * Hugging Face's order). Other architectures, mixture-of-experts files and per-dimension rope frequency
 * factors are refused by name; a read whose values dequantise to NaN or infinity is refused naming the
 * tensor.
 *
 * It does not parse or validate the file's layout (gguf_file.c does, before anything here sees it),
 * builds no tokenizer (tokenizer/ reads the vocabulary through ckv_gguf_meta_*) and never writes GGUF. */
#define _DEFAULT_SOURCE /* madvise / MADV_DONTNEED */
#include "model/gguf.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/fastmath.h"
#include "core/quant.h"
#include "core/tensor.h"
#include "model/gguf_file.h"

/* The ckv dtype of a readable ggml type (core/quant.c dequantises them all). */
static ckv_dtype gguf_ckv_dtype(uint32_t type) {
    switch (type) {
    case CKV_GGUF_TYPE_F16: return CKV_DTYPE_F16;
    case CKV_GGUF_TYPE_BF16: return CKV_DTYPE_BF16;
    case CKV_GGUF_TYPE_Q8_0: return CKV_DTYPE_Q8_0;
    case CKV_GGUF_TYPE_Q4_0: return CKV_DTYPE_Q4_0;
    case CKV_GGUF_TYPE_Q4_1: return CKV_DTYPE_Q4_1;
    case CKV_GGUF_TYPE_Q5_0: return CKV_DTYPE_Q5_0;
    case CKV_GGUF_TYPE_Q5_1: return CKV_DTYPE_Q5_1;
    case CKV_GGUF_TYPE_Q4_K: return CKV_DTYPE_Q4_K;
    case CKV_GGUF_TYPE_Q5_K: return CKV_DTYPE_Q5_K;
    case CKV_GGUF_TYPE_Q6_K: return CKV_DTYPE_Q6_K;
    default: return CKV_DTYPE_F32;
    }
}

/* Dequantises `nblocks` consecutive blocks of type `type` at src into dst. */
static void gguf_dequant(uint32_t type, const uint8_t *src, size_t nblocks, float *dst) {
    ckv_dequant_row(gguf_ckv_dtype(type), src, dst, nblocks * ckv_gguf_type_find(type)->block);
}

/* ---- the weight source ------------------------------------------------------------------------- */

typedef enum { GGUF_PERM_NONE = 0, GGUF_PERM_Q, GGUF_PERM_K } gguf_perm;

typedef struct {
    ckv_gguf_file *f;
    int n_head, n_head_kv; /* head counts of the q / k rows the conversion permuted (0: not permuted) */
} gguf_source;

/* Maps a Hugging Face llama / qwen2 tensor name to its GGUF name; 0 when there is none. */
static int gguf_map_name(const char *hf, char *out, size_t cap, gguf_perm *perm) {
    static const struct {
        const char *hf, *gguf;
        gguf_perm perm;
    } layer_names[] = {
        {"input_layernorm.weight", "attn_norm.weight", GGUF_PERM_NONE},
        {"self_attn.q_proj.weight", "attn_q.weight", GGUF_PERM_Q},
        {"self_attn.k_proj.weight", "attn_k.weight", GGUF_PERM_K},
        {"self_attn.v_proj.weight", "attn_v.weight", GGUF_PERM_NONE},
        {"self_attn.o_proj.weight", "attn_output.weight", GGUF_PERM_NONE},
        {"self_attn.q_proj.bias", "attn_q.bias", GGUF_PERM_Q},
        {"self_attn.k_proj.bias", "attn_k.bias", GGUF_PERM_K},
        {"self_attn.v_proj.bias", "attn_v.bias", GGUF_PERM_NONE},
        {"self_attn.o_proj.bias", "attn_output.bias", GGUF_PERM_NONE},
        {"post_attention_layernorm.weight", "ffn_norm.weight", GGUF_PERM_NONE},
        {"mlp.gate_proj.weight", "ffn_gate.weight", GGUF_PERM_NONE},
        {"mlp.up_proj.weight", "ffn_up.weight", GGUF_PERM_NONE},
        {"mlp.down_proj.weight", "ffn_down.weight", GGUF_PERM_NONE},
    };
    *perm = GGUF_PERM_NONE;
    if (!strcmp(hf, "model.embed_tokens.weight")) return snprintf(out, cap, "token_embd.weight") > 0;
    if (!strcmp(hf, "model.norm.weight")) return snprintf(out, cap, "output_norm.weight") > 0;
    if (!strcmp(hf, "lm_head.weight")) return snprintf(out, cap, "output.weight") > 0;
    const char *prefix = "model.layers.";
    size_t pl = strlen(prefix);
    if (strncmp(hf, prefix, pl) != 0) return 0;
    const char *p = hf + pl;
    char *end;
    errno = 0;
    unsigned long layer = strtoul(p, &end, 10);
    if (end == p || *end != '.' || errno || layer > 1000000 || *p == '+' || *p == '-' || *p == ' ') return 0;
    for (size_t i = 0; i < sizeof layer_names / sizeof layer_names[0]; i++) {
        if (!strcmp(end + 1, layer_names[i].hf)) {
            *perm = layer_names[i].perm;
            int n = snprintf(out, cap, "blk.%lu.%s", layer, layer_names[i].gguf);
            return n > 0 && (size_t)n < cap;
        }
    }
    return 0;
}

static void gguf_format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Tells the OS the mapped pages of a tensor just converted are not needed any more. */
static void gguf_drop_pages(const ckv_gguf_tensor *t) {
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0 || t->nbytes == 0) return;
    uintptr_t a = (uintptr_t)t->data & ~((uintptr_t)page - 1);
    uintptr_t b = (uintptr_t)t->data + t->nbytes;
    madvise((void *)a, b - a, MADV_DONTNEED);
}

/* The GGUF row that holds Hugging Face row r of a q/k projection split into n heads of d rows: GGUF
 * stores each head's rows (a, j), a in {0, 1}, j < d/2, in the order (j, a). */
static int64_t gguf_unpermute_row(int64_t r, int64_t d) {
    int64_t h = r / d, within = r % d, half = d / 2;
    int64_t a = within / half, j = within % half;
    return h * d + 2 * j + a;
}

/* A tensor slice located and checked: the tensor, its rows x cols view, the slice, and the head count
 * and head size of a permuted q/k tensor (0 when not permuted). */
typedef struct {
    const ckv_gguf_tensor *t;
    const ckv_gguf_type_info *ti;
    char gname[160];
    int64_t R, C, r0, r1, c0, c1;
    int64_t perm_heads, head_rows;
} gguf_slice;

/* Finds HF tensor `name`, checks its type is readable, its shape against shape[0..ndim) (shape may be
 * NULL) and the slice (whole tensor when row1 = col1 = -1) against the shape. */
static ckv_status gguf_src_locate(const gguf_source *src, const char *name, int ndim, const int64_t *shape,
                                  int64_t row0, int64_t row1, int64_t col0, int64_t col1, gguf_slice *sl) {
    const ckv_gguf_file *f = src->f;
    gguf_perm perm;
    char *gname = sl->gname;
    if (!gguf_map_name(name, gname, sizeof sl->gname, &perm))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s' has no GGUF counterpart", f->path, name);
    const ckv_gguf_tensor *t = ckv_gguf_file_find_tensor(f, gname);
    if (!t)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%.200s' (GGUF '%s') is not in the file", f->path, name,
                         gname);
    const ckv_gguf_type_info *ti = ckv_gguf_type_find(t->type);
    if (!ti->readable)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: tensor '%s' has type %s, which ckv cannot dequantise (it reads F32, F16, BF16, Q8_0, "
                         "Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K)",
                         f->path, gname, ti->name);
    /* the Hugging Face shape is the GGUF extents reversed */
    int64_t hf[CKV_GGUF_MAX_DIMS];
    for (int d = 0; d < t->ndim; d++) hf[d] = t->ne[t->ndim - 1 - d];
    if (shape) {
        int same = ndim == t->ndim;
        for (int d = 0; same && d < ndim; d++) same = shape[d] == hf[d];
        if (!same) {
            char want[128], have[128];
            if (ndim < 0 || ndim > CKV_TENSOR_MAX_DIMS)
                snprintf(want, sizeof want, "(%d dimensions)", ndim);
            else
                gguf_format_shape(want, sizeof want, ndim, shape);
            gguf_format_shape(have, sizeof have, t->ndim, hf);
            return ckv_error(CKV_STATUS_ERR_SHAPE, "%s: tensor '%s' ('%.200s'): shape %s in the file, expected %s",
                             f->path, gname, name, have, want);
        }
    }
    /* as rows x cols: cols = ne[0] (the input dimension), rows = the rest */
    int64_t C = t->ne[0], R = 1;
    for (int d = 1; d < t->ndim; d++) R *= t->ne[d];
    int64_t r0 = row0, r1 = row1, c0 = col0, c1 = col1;
    if (row1 < 0 && col1 < 0) {
        if (row0 != 0 || col0 != 0)
            return ckv_error(CKV_STATUS_ERR_ARG, "%s: tensor '%s': row0/col0 must be 0 when reading it whole", f->path,
                             gname);
        r0 = 0, r1 = R, c0 = 0, c1 = C;
    } else {
        if (t->ndim != 2)
            return ckv_error(CKV_STATUS_ERR_ARG,
                             "%s: tensor '%s': a row/column slice needs a 2-D tensor (it has %d dimensions)", f->path,
                             gname, t->ndim);
        r1 = row1 < 0 ? (row0 == 0 ? R : -1) : row1;
        c1 = col1 < 0 ? (col0 == 0 ? C : -1) : col1;
        if (r0 < 0 || r1 < r0 || r1 > R || c0 < 0 || c1 < c0 || c1 > C)
            return ckv_error(CKV_STATUS_ERR_RANGE,
                             "%s: tensor '%s': slice rows [%" PRId64 ", %" PRId64 ") cols [%" PRId64 ", %" PRId64
                             ") outside its shape [%" PRId64 ", %" PRId64 "]",
                             f->path, gname, row0, row1, col0, col1, R, C);
    }
    /* the head count whose rotary layout the conversion permuted: rows for a weight, elements of a bias */
    int64_t perm_heads = perm == GGUF_PERM_Q ? src->n_head : perm == GGUF_PERM_K ? src->n_head_kv : 0;
    int64_t perm_len = t->ndim == 1 ? C : R, head_rows = 0;
    if (perm_heads > 0) {
        if (t->ndim > 2 || perm_len % perm_heads != 0 || (perm_len / perm_heads) % 2 != 0)
            return ckv_error(CKV_STATUS_ERR_SHAPE,
                             "%s: tensor '%s': %" PRId64 " rows do not split into %" PRId64 " heads of an even size",
                             f->path, gname, perm_len, perm_heads);
        head_rows = perm_len / perm_heads;
    }
    sl->t = t, sl->ti = ti;
    sl->R = R, sl->C = C, sl->r0 = r0, sl->r1 = r1, sl->c0 = c0, sl->c1 = c1;
    sl->perm_heads = perm_heads, sl->head_rows = head_rows;
    return CKV_STATUS_OK;
}

static ckv_status gguf_src_read(void *ctx, const char *name, int ndim, const int64_t *shape, int64_t row0,
                                int64_t row1, int64_t col0, int64_t col1, float *dst) {
    gguf_source *src = ctx;
    if (!src || !name || !dst)
        return ckv_error(CKV_STATUS_ERR_ARG, "gguf: NULL argument reading '%.200s'", name ? name : "(null)");
    const ckv_gguf_file *f = src->f;
    gguf_slice sl;
    CKV_TRY(gguf_src_locate(src, name, ndim, shape, row0, row1, col0, col1, &sl));
    const ckv_gguf_tensor *t = sl.t;
    const ckv_gguf_type_info *ti = sl.ti;
    const char *gname = sl.gname;
    const int64_t C = sl.C, r0 = sl.r0, r1 = sl.r1, c0 = sl.c0, c1 = sl.c1;
    const int64_t perm_heads = sl.perm_heads, head_rows = sl.head_rows;

    size_t B = ti->block, row_bytes = (size_t)(C / (int64_t)B) * ti->bytes;
    int64_t w = c1 - c0;
    int64_t b0 = c0 / (int64_t)B, b1 = (c1 + (int64_t)B - 1) / (int64_t)B; /* blocks covering [c0, c1) */
    int direct = c0 == b0 * (int64_t)B && (c1 == b1 * (int64_t)B);          /* no partial block at either end */
    float *scratch = NULL;
    if (!direct || (perm_heads > 0 && t->ndim == 1)) {
        size_t n = (size_t)(b1 - b0) * B;
        if (t->ndim == 1) n = (size_t)C;
        scratch = malloc((n ? n : 1) * sizeof *scratch);
        if (!scratch) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory reading tensor '%s'", f->path, gname);
    }
    if (perm_heads > 0 && t->ndim == 1) {
        /* a bias: undo the permutation element-wise */
        gguf_dequant(t->type, t->data, (size_t)C / B, scratch);
        for (int64_t e = 0; e < C; e++) dst[e] = scratch[gguf_unpermute_row(e, head_rows)];
    } else {
        for (int64_t r = r0; r < r1; r++) {
            int64_t sr = perm_heads > 0 ? gguf_unpermute_row(r, head_rows) : r;
            const uint8_t *p = t->data + (size_t)sr * row_bytes + (size_t)b0 * ti->bytes;
            float *out = dst + (size_t)(r - r0) * (size_t)w;
            if (direct) {
                gguf_dequant(t->type, p, (size_t)(b1 - b0), out);
            } else {
                gguf_dequant(t->type, p, (size_t)(b1 - b0), scratch);
                memcpy(out, scratch + (c0 - b0 * (int64_t)B), (size_t)w * sizeof *out);
            }
        }
    }
    free(scratch);
    gguf_drop_pages(t);
    /* corrupt weights (a flipped exponent byte) dequantise to NaN or infinity: refuse them here */
    int64_t bad = ckv_find_nonfinite_f32(dst, (size_t)(r1 - r0) * (size_t)w);
    if (bad >= 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor '%s': element %" PRId64 " of the slice read is %s (corrupt "
                         "weights)", f->path, gname, bad, dst[bad] != dst[bad] ? "NaN" : "infinite");
    return CKV_STATUS_OK;
}

static ckv_dtype gguf_src_stored_dtype(void *ctx, const char *name) {
    const gguf_source *src = ctx;
    char gname[160];
    gguf_perm perm;
    const ckv_gguf_tensor *t =
        src && name && gguf_map_name(name, gname, sizeof gname, &perm) ? ckv_gguf_file_find_tensor(src->f, gname)
                                                                        : NULL;
    return t && ckv_gguf_type_find(t->type)->readable ? gguf_ckv_dtype(t->type) : CKV_DTYPE_F32;
}

static ckv_status gguf_src_read_raw(void *ctx, const char *name, const int64_t *shape, int64_t row0, int64_t row1,
                                    int64_t col0, int64_t col1, void *dst) {
    gguf_source *src = ctx;
    if (!src || !name || !dst)
        return ckv_error(CKV_STATUS_ERR_ARG, "gguf: NULL argument reading '%.200s'", name ? name : "(null)");
    gguf_slice sl;
    CKV_TRY(gguf_src_locate(src, name, 2, shape, row0, row1, col0, col1, &sl));
    const int64_t B = (int64_t)sl.ti->block;
    if (sl.t->ndim != 2 || sl.c0 % B != 0 || sl.c1 % B != 0)
        return ckv_error(CKV_STATUS_ERR_ARG,
                         "%s: tensor '%s': columns [%" PRId64 ", %" PRId64 ") of a %s tensor are not whole blocks of %"
                         PRId64 " (or it is not 2-D)",
                         src->f->path, sl.gname, sl.c0, sl.c1, sl.ti->name, B);
    const size_t row_bytes = (size_t)(sl.C / B) * sl.ti->bytes, out_bytes = (size_t)((sl.c1 - sl.c0) / B) * sl.ti->bytes;
    uint8_t *out = dst;
    for (int64_t r = sl.r0; r < sl.r1; r++) {
        const int64_t sr = sl.perm_heads > 0 ? gguf_unpermute_row(r, sl.head_rows) : r;
        memcpy(out + (size_t)(r - sl.r0) * out_bytes, sl.t->data + (size_t)sr * row_bytes + (size_t)(sl.c0 / B) * sl.ti->bytes,
               out_bytes);
    }
    gguf_drop_pages(sl.t);
    return CKV_STATUS_OK;
}

static int gguf_src_has(void *ctx, const char *name) {
    gguf_source *src = ctx;
    char gname[160];
    gguf_perm perm;
    return src && name && gguf_map_name(name, gname, sizeof gname, &perm) && ckv_gguf_file_find_tensor(src->f, gname);
}

static void gguf_src_release(void *ctx) {
    gguf_source *src = ctx;
    if (src && src->f && src->f->map) madvise(src->f->map, src->f->size, MADV_DONTNEED);
}

static void gguf_src_close(void *ctx) {
    gguf_source *src = ctx;
    if (!src) return;
    ckv_gguf_file_close(src->f);
    free(src);
}

/* ---- metadata -> ckv_model_config -------------------------------------------------------------- */

/* An integer key (any integer type; a uniform per-layer array is taken as its common value).
 * *present = 0 and *out = def when absent and not required. */
static ckv_status gguf_meta_int(const ckv_gguf_file *f, const char *key, int required, int64_t def, int64_t lo,
                                int64_t hi, int64_t *out, int *present) {
    const ckv_gguf_kv *kv = ckv_gguf_file_find_kv(f, key);
    if (present) *present = kv != NULL;
    if (!kv) {
        if (required) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing metadata key '%s'", f->path, key);
        *out = def;
        return CKV_STATUS_OK;
    }
    int64_t v = 0;
    int ok = 0;
    if (kv->type == CKV_GGUF_V_ARRAY && kv->count > 0 && kv->elem_type != CKV_GGUF_V_BOOL) {
        size_t es = ckv_gguf_value_type_size(kv->elem_type);
        ok = es > 0 && ckv_gguf_value_int(kv->elem_type, kv->val, &v);
        for (uint64_t i = 1; ok && i < kv->count; i++) {
            int64_t x = 0;
            ok = ckv_gguf_value_int(kv->elem_type, kv->val + i * es, &x);
            if (ok && x != v)
                return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                                 "%s: metadata key '%s' differs between layers (ckv needs one value for all)", f->path,
                                 key);
        }
    } else if (kv->type != CKV_GGUF_V_BOOL) {
        ok = ckv_gguf_value_int(kv->type, kv->val, &v);
    }
    if (!ok)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s' must be an integer (it is %s)", f->path, key,
                         ckv_gguf_value_type_name(kv->type));
    if (v < lo || v > hi)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s' is %" PRId64 " (expected %" PRId64 " to %" PRId64
                         ")", f->path, key, v, lo, hi);
    *out = v;
    return CKV_STATUS_OK;
}

static ckv_status gguf_meta_pos_int(const ckv_gguf_file *f, const char *key, int required, int def, int *out,
                                    int *present) {
    int64_t v;
    CKV_TRY(gguf_meta_int(f, key, required, def, 1, INT32_MAX, &v, present));
    *out = (int)v;
    return CKV_STATUS_OK;
}

/* A floating-point key (float32, float64 or an integer type). */
static ckv_status gguf_meta_float(const ckv_gguf_file *f, const char *key, int required, double def, double *out,
                                  int *present) {
    const ckv_gguf_kv *kv = ckv_gguf_file_find_kv(f, key);
    if (present) *present = kv != NULL;
    if (!kv) {
        if (required) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing metadata key '%s'", f->path, key);
        *out = def;
        return CKV_STATUS_OK;
    }
    int64_t iv;
    if (kv->type == CKV_GGUF_V_F32) {
        float v;
        memcpy(&v, kv->val, 4);
        *out = v;
    } else if (kv->type == CKV_GGUF_V_F64) {
        memcpy(out, kv->val, 8);
    } else if (kv->type != CKV_GGUF_V_BOOL && kv->type != CKV_GGUF_V_ARRAY &&
               ckv_gguf_value_int(kv->type, kv->val, &iv)) {
        *out = (double)iv;
    } else {
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s' must be a number (it is %s)", f->path, key,
                         ckv_gguf_value_type_name(kv->type));
    }
    if (!isfinite(*out))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s' is not finite", f->path, key);
    return CKV_STATUS_OK;
}

/* A string key: *s (not terminated) and *len; *s = NULL when absent. */
static ckv_status gguf_meta_string(const ckv_gguf_file *f, const char *key, const char **s, size_t *len) {
    const ckv_gguf_kv *kv = ckv_gguf_file_find_kv(f, key);
    *s = NULL;
    *len = 0;
    if (!kv) return CKV_STATUS_OK;
    if (kv->type != CKV_GGUF_V_STRING)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s' must be a string (it is %s)", f->path, key,
                         ckv_gguf_value_type_name(kv->type));
    uint64_t n;
    memcpy(&n, kv->val, 8);
    *s = (const char *)kv->val + 8;
    *len = (size_t)n;
    return CKV_STATUS_OK;
}

/* A string value for a message: at most 64 bytes, control characters shown as '?'. */
static const char *gguf_printable(char *buf, size_t cap, const char *s, size_t len) {
    size_t n = len < cap - 1 ? len : cap - 1;
    if (n > 64) n = 64;
    for (size_t i = 0; i < n; i++) buf[i] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
    buf[n] = 0;
    return buf;
}

static int gguf_str_is(const char *s, size_t len, const char *lit) { return s && strlen(lit) == len && !memcmp(s, lit, len); }

static ckv_status gguf_add_eos(ckv_model_config *cfg, const ckv_gguf_file *f, const char *key) {
    int64_t id = -1;
    int present = 0;
    CKV_TRY(gguf_meta_int(f, key, 0, -1, 0, INT32_MAX, &id, &present));
    if (!present) return CKV_STATUS_OK;
    for (int k = 0; k < cfg->n_eos; k++)
        if (cfg->eos_ids[k] == id) return CKV_STATUS_OK;
    if (cfg->n_eos < CKV_MAX_EOS) cfg->eos_ids[cfg->n_eos++] = (int)id;
    return CKV_STATUS_OK;
}

/* "<ar>.<suffix>", the metadata key of an architecture-specific setting, in the caller's buffer key[96]. */
static const char *gguf_arch_key(char *buf, size_t cap, const char *ar, const char *suffix) {
    snprintf(buf, cap, "%s.%s", ar, suffix);
    return buf;
}
#define K(suffix) gguf_arch_key(key, sizeof key, ar, suffix)

static ckv_status gguf_config_rope(ckv_model_config *cfg, const ckv_gguf_file *f, const char *ar) {
    char key[96];
    ckv_rope_config *r = &cfg->rope;
    memset(r, 0, sizeof *r);
    r->type = CKV_ROPE_TYPE_DEFAULT;
    r->factor = 1.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    r->truncate = 1;
    CKV_TRY(gguf_meta_float(f, K("rope.freq_base"), 0, 10000.0, &r->theta, NULL));
    if (!(r->theta > 0.0))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s.rope.freq_base' must be positive (got %g)",
                         f->path, ar, r->theta);
    int rot;
    CKV_TRY(gguf_meta_pos_int(f, K("rope.dimension_count"), 0, cfg->head_dim, &rot, NULL));
    if (rot != cfg->head_dim)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: %s.rope.dimension_count %d differs from the head size %d (partial rotary is not "
                         "supported)",
                         f->path, ar, rot, cfg->head_dim);
    if (ckv_gguf_file_find_tensor(f, "rope_freqs.weight"))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: tensor 'rope_freqs.weight' (per-dimension rope frequency factors, Llama 3 style scaling) "
                         "is not supported",
                         f->path);

    const char *type;
    size_t tlen;
    CKV_TRY(gguf_meta_string(f, K("rope.scaling.type"), &type, &tlen));
    double factor = 0.0;
    int has_factor = 0;
    CKV_TRY(gguf_meta_float(f, K("rope.scaling.factor"), 0, 0.0, &factor, &has_factor));
    if (!has_factor) {
        /* the older key: a linear factor */
        CKV_TRY(gguf_meta_float(f, K("rope.scale_linear"), 0, 0.0, &factor, &has_factor));
        if (has_factor && !type) type = "linear", tlen = 6;
    }
    if (!type || gguf_str_is(type, tlen, "none") || (has_factor && factor == 1.0 && !gguf_str_is(type, tlen, "yarn")))
        return CKV_STATUS_OK;
    char shown[72];
    if (!has_factor || !(factor > 0.0))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s.rope.scaling.factor' must be positive for rope "
                         "scaling '%s'", f->path, ar, gguf_printable(shown, sizeof shown, type, tlen));
    r->factor = factor;
    if (gguf_str_is(type, tlen, "linear")) {
        r->type = CKV_ROPE_TYPE_LINEAR;
        return CKV_STATUS_OK;
    }
    if (!gguf_str_is(type, tlen, "yarn"))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: metadata key '%s.rope.scaling.type' is '%s' (ckv supports none, linear and yarn)",
                         f->path, ar, gguf_printable(shown, sizeof shown, type, tlen));
    r->type = CKV_ROPE_TYPE_YARN;
    CKV_TRY(gguf_meta_pos_int(f, K("rope.scaling.original_context_length"), 0, cfg->max_position_embeddings,
                              &r->original_max_position, NULL));
    CKV_TRY(gguf_meta_float(f, K("rope.scaling.yarn_beta_fast"), 0, 32.0, &r->beta_fast, NULL));
    CKV_TRY(gguf_meta_float(f, K("rope.scaling.yarn_beta_slow"), 0, 1.0, &r->beta_slow, NULL));
    if (!(r->beta_fast > 0.0) || !(r->beta_slow > 0.0))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: yarn beta_fast and beta_slow must be positive", f->path);
    double log_mul = 0.0;
    CKV_TRY(gguf_meta_float(f, K("rope.scaling.yarn_log_multiplier"), 0, 0.0, &log_mul, NULL));
    if (log_mul != 0.0)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: metadata key '%s.rope.scaling.yarn_log_multiplier' is not supported", f->path, ar);
    /* llama.cpp multiplies its own yarn magnitude scale (0.1 ln(factor) + 1) by attn_factor; the
     * Hugging Face attention_factor replaces that scale, so it is their product */
    double attn = 1.0;
    CKV_TRY(gguf_meta_float(f, K("rope.scaling.attn_factor"), 0, 1.0, &attn, NULL));
    if (!(attn > 0.0))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key '%s.rope.scaling.attn_factor' must be positive",
                         f->path, ar);
    if (attn != 1.0) r->attention_factor = attn * (factor > 1.0 ? 0.1 * log(factor) + 1.0 : 1.0);
    return CKV_STATUS_OK;
}

static ckv_status gguf_config(ckv_model_config *cfg, const ckv_gguf_file *f, gguf_source *src) {
    memset(cfg, 0, sizeof *cfg);
    const char *arch;
    size_t alen;
    CKV_TRY(gguf_meta_string(f, "general.architecture", &arch, &alen));
    if (!arch) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing metadata key 'general.architecture'", f->path);
    char shown[72], key[96];
    const char *ar; /* the architecture, also the prefix of its metadata keys */
    if (gguf_str_is(arch, alen, "llama")) {
        ar = "llama";
        cfg->arch = CKV_ARCH_LLAMA;
        snprintf(cfg->arch_name, sizeof cfg->arch_name, "LlamaForCausalLM");
    } else if (gguf_str_is(arch, alen, "qwen2")) {
        ar = "qwen2";
        cfg->arch = CKV_ARCH_QWEN2;
        snprintf(cfg->arch_name, sizeof cfg->arch_name, "Qwen2ForCausalLM");
    } else {
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: general.architecture is '%s' (ckv reads GGUF files of architecture 'llama' or "
                         "'qwen2')",
                         f->path, gguf_printable(shown, sizeof shown, arch, alen));
    }

    int64_t experts = 0;
    CKV_TRY(gguf_meta_int(f, K("expert_count"), 0, 0, 0, INT32_MAX, &experts, NULL));
    if (experts > 0)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: %s.expert_count is %" PRId64 " (mixture-of-experts models are not supported)", f->path, ar,
                         experts);

    CKV_TRY(gguf_meta_pos_int(f, K("embedding_length"), 1, 0, &cfg->hidden_size, NULL));
    CKV_TRY(gguf_meta_pos_int(f, K("block_count"), 1, 0, &cfg->n_layers, NULL));
    CKV_TRY(gguf_meta_pos_int(f, K("feed_forward_length"), 1, 0, &cfg->intermediate_size, NULL));
    CKV_TRY(gguf_meta_pos_int(f, K("attention.head_count"), 1, 0, &cfg->n_heads, NULL));
    CKV_TRY(gguf_meta_pos_int(f, K("attention.head_count_kv"), 0, cfg->n_heads, &cfg->n_kv_heads, NULL));
    CKV_TRY(gguf_meta_pos_int(f, K("context_length"), 1, 0, &cfg->max_position_embeddings, NULL));
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: %s.attention.head_count_kv (%d) must divide %s.attention.head_count (%d)", f->path, ar,
                         cfg->n_kv_heads, ar, cfg->n_heads);
    int kl, vl, has_kl;
    CKV_TRY(gguf_meta_pos_int(f, K("attention.key_length"), 0, cfg->hidden_size / cfg->n_heads, &kl, &has_kl));
    CKV_TRY(gguf_meta_pos_int(f, K("attention.value_length"), 0, kl, &vl, NULL));
    if (kl != vl)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: %s.attention.key_length %d differs from value_length %d", f->path, ar, kl, vl);
    cfg->head_dim = kl;
    if (cfg->head_dim <= 0 || cfg->head_dim % 2 != 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: the head size must be positive and even (got %d%s)", f->path,
                         cfg->head_dim, has_kl ? "" : ", embedding_length / head_count");
    CKV_TRY(gguf_meta_float(f, K("attention.layer_norm_rms_epsilon"), 1, 0.0, &cfg->rms_norm_eps, NULL));
    if (!(cfg->rms_norm_eps > 0.0))
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: metadata key '%s.attention.layer_norm_rms_epsilon' must be positive (got %g)", f->path, ar,
                         cfg->rms_norm_eps);

    /* vocabulary: the tokenizer's token list, else <arch>.vocab_size, else the embedding's rows */
    const ckv_gguf_kv *tokens = ckv_gguf_file_find_kv(f, "tokenizer.ggml.tokens");
    const ckv_gguf_tensor *embd = ckv_gguf_file_find_tensor(f, "token_embd.weight");
    if (tokens) {
        if (tokens->type != CKV_GGUF_V_ARRAY || tokens->elem_type != CKV_GGUF_V_STRING)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key 'tokenizer.ggml.tokens' must be an array of "
                             "strings", f->path);
        if (tokens->count < 1 || tokens->count > INT32_MAX)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: metadata key 'tokenizer.ggml.tokens' holds %" PRIu64 " tokens",
                             f->path, tokens->count);
        cfg->vocab_size = (int)tokens->count;
    } else {
        int present;
        CKV_TRY(gguf_meta_pos_int(f, K("vocab_size"), 0, 0, &cfg->vocab_size, &present));
        if (!present && embd && embd->ndim == 2 && embd->ne[1] <= INT32_MAX) cfg->vocab_size = (int)embd->ne[1];
        if (!cfg->vocab_size)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing metadata key 'tokenizer.ggml.tokens' (the vocabulary)",
                             f->path);
    }
    if (!embd) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: tensor 'token_embd.weight' is not in the file", f->path);
    if (embd->ndim != 2 || embd->ne[0] != cfg->hidden_size || embd->ne[1] != cfg->vocab_size)
        return ckv_error(CKV_STATUS_ERR_SHAPE,
                         "%s: tensor 'token_embd.weight' has extents (%" PRId64 ", %" PRId64 "), expected (%d, %d) "
                         "from embedding_length and the vocabulary",
                         f->path, embd->ne[0], embd->ndim > 1 ? embd->ne[1] : 1, cfg->hidden_size, cfg->vocab_size);

    cfg->tie_word_embeddings = ckv_gguf_file_find_tensor(f, "output.weight") == NULL;
    cfg->attention_bias = ckv_gguf_file_find_tensor(f, "blk.0.attn_q.bias") != NULL;
    const int o_bias = ckv_gguf_file_find_tensor(f, "blk.0.attn_output.bias") != NULL;
    if (cfg->arch == CKV_ARCH_LLAMA && cfg->attention_bias && !o_bias)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: q/k/v biases without an attn_output bias are not supported for architecture llama",
                         f->path);
    /* Qwen2 has q/k/v biases and no o_proj bias */
    if (cfg->arch == CKV_ARCH_QWEN2 && (!cfg->attention_bias || o_bias))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: architecture qwen2 needs q/k/v biases (tensor 'blk.0.attn_q.bias') and no attn_output "
                         "bias (this file has %s)",
                         f->path, o_bias ? "an attn_output bias" : "no attn_q bias");
    if (ckv_gguf_file_find_tensor(f, "blk.0.ffn_gate.bias") || ckv_gguf_file_find_tensor(f, "blk.0.ffn_up.bias") ||
        ckv_gguf_file_find_tensor(f, "blk.0.ffn_down.bias"))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: MLP biases are not supported (ckv has none)", f->path);
    cfg->sliding_window = 0;

    CKV_TRY(gguf_config_rope(cfg, f, ar));
    cfg->max_context = cfg->max_position_embeddings;
    if (cfg->rope.type == CKV_ROPE_TYPE_YARN) {
        double stretched = (double)cfg->rope.original_max_position * cfg->rope.factor;
        if (stretched > cfg->max_context && stretched < 2147483647.0) cfg->max_context = (int)stretched;
    }

    /* what the weights are stored as: F16 / BF16 files keep that dtype, quantised ones are F32 to ckv */
    const ckv_gguf_tensor *wq = ckv_gguf_file_find_tensor(f, "blk.0.attn_q.weight");
    cfg->dtype = CKV_DTYPE_F32;
    if (wq && wq->type == CKV_GGUF_TYPE_F16) cfg->dtype = CKV_DTYPE_F16;
    if (wq && wq->type == CKV_GGUF_TYPE_BF16) cfg->dtype = CKV_DTYPE_BF16;

    int64_t bos;
    CKV_TRY(gguf_meta_int(f, "tokenizer.ggml.bos_token_id", 0, -1, 0, INT32_MAX, &bos, NULL));
    cfg->bos_token_id = (int)bos;
    cfg->n_eos = 0;
    /* end of sequence, and llama.cpp's other end-of-generation ids (end of turn, end of message) */
    CKV_TRY(gguf_add_eos(cfg, f, "tokenizer.ggml.eos_token_id"));
    CKV_TRY(gguf_add_eos(cfg, f, "tokenizer.ggml.eot_token_id"));
    CKV_TRY(gguf_add_eos(cfg, f, "tokenizer.ggml.eom_token_id"));

    /* the llama conversion permutes the rotary rows of q/k; the qwen2 one keeps Hugging Face's order */
    src->n_head = cfg->arch == CKV_ARCH_LLAMA ? cfg->n_heads : 0;
    src->n_head_kv = cfg->arch == CKV_ARCH_LLAMA ? cfg->n_kv_heads : 0;
    return ckv_config_check(cfg, f->path);
}

ckv_status ckv_gguf_open_source(ckv_weight_source *src, ckv_model_config *cfg, const char *path) {
    if (!src || !cfg || !path) return ckv_error(CKV_STATUS_ERR_ARG, "gguf: NULL argument");
    memset(src, 0, sizeof *src);
    snprintf(src->path, sizeof src->path, "%s", path);
    gguf_source *g = calloc(1, sizeof *g);
    if (!g) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", path);
    ckv_status s = ckv_gguf_file_open(&g->f, path);
    if (s == CKV_STATUS_OK) s = gguf_config(cfg, g->f, g);
    if (s != CKV_STATUS_OK) {
        gguf_src_close(g);
        return s;
    }
    src->ctx = g;
    src->read_f32 = gguf_src_read;
    src->has = gguf_src_has;
    src->stored_dtype = gguf_src_stored_dtype;
    src->read_raw = gguf_src_read_raw;
    src->release_pages = gguf_src_release;
    src->close = gguf_src_close;
    return CKV_STATUS_OK;
}
