/* source.c - opens a model path as a weight source: safetensors directories here (fp32 reads and the
 * stored bytes of F32 / F16 / BF16 slices), GGUF files via gguf.c. */
#include "model/source.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "model/gguf.h"
#include "model/safetensors.h"

static ckv_status st_read(void *ctx, const char *name, int ndim, const int64_t *shape, int64_t r0, int64_t r1,
                          int64_t c0, int64_t c1, float *dst) {
    return ckv_safetensors_read_f32(ctx, name, ndim, shape, r0, r1, c0, c1, dst);
}
static int st_has(void *ctx, const char *name) { return ckv_safetensors_find(ctx, name) != NULL; }
static ckv_dtype st_stored_dtype(void *ctx, const char *name) {
    const ckv_st_tensor *t = ckv_safetensors_find(ctx, name);
    return t && (t->dtype == CKV_DTYPE_F16 || t->dtype == CKV_DTYPE_BF16) ? t->dtype : CKV_DTYPE_F32;
}

/* The stored bytes of a row/column slice of a 2-D F32 / F16 / BF16 tensor (shape checked). */
static ckv_status st_read_raw(void *ctx, const char *name, const int64_t *shape, int64_t r0, int64_t r1, int64_t c0,
                              int64_t c1, void *dst) {
    const ckv_st_tensor *t = ckv_safetensors_find(ctx, name);
    if (!t) return ckv_error(CKV_STATUS_ERR_FORMAT, "tensor '%.200s': not in the checkpoint", name);
    const size_t es = t->dtype == CKV_DTYPE_F32 || t->dtype == CKV_DTYPE_F16 || t->dtype == CKV_DTYPE_BF16
                          ? ckv_dtype_size(t->dtype)
                          : 0;
    if (!es || t->ndim != 2 || (shape && (shape[0] != t->shape[0] || shape[1] != t->shape[1])))
        return ckv_error(CKV_STATUS_ERR_SHAPE, "%s: tensor '%.200s': not a 2-D F32/F16/BF16 tensor of shape [%" PRId64
                         ", %" PRId64 "]", ckv_safetensors_file_path(ctx, t->file), name, shape ? shape[0] : -1,
                         shape ? shape[1] : -1);
    const int64_t R = t->shape[0], C = t->shape[1];
    if (r1 < 0) r1 = R;
    if (c1 < 0) c1 = C;
    if (r0 < 0 || r1 < r0 || r1 > R || c0 < 0 || c1 < c0 || c1 > C)
        return ckv_error(CKV_STATUS_ERR_RANGE, "%s: tensor '%.200s': slice rows [%" PRId64 ", %" PRId64 ") cols [%"
                         PRId64 ", %" PRId64 ") outside its shape [%" PRId64 ", %" PRId64 "]",
                         ckv_safetensors_file_path(ctx, t->file), name, r0, r1, c0, c1, R, C);
    const size_t w = (size_t)(c1 - c0) * es;
    for (int64_t r = r0; r < r1; r++)
        memcpy((char *)dst + (size_t)(r - r0) * w, (const char *)t->data + ((size_t)r * (size_t)C + (size_t)c0) * es, w);
    return CKV_STATUS_OK;
}
static void st_release(void *ctx) { ckv_safetensors_release_pages(ctx); }
static void st_close(void *ctx) { ckv_safetensors_close(ctx); }

ckv_status ckv_source_open_safetensors(ckv_weight_source *src, ckv_model_config *cfg, const char *dir) {
    memset(src, 0, sizeof *src);
    snprintf(src->path, sizeof src->path, "%s", dir);
    CKV_TRY(ckv_config_load(cfg, dir));
    ckv_safetensors *st = NULL;
    CKV_TRY(ckv_safetensors_open_dir(&st, dir));
    src->ctx = st;
    src->read_f32 = st_read;
    src->has = st_has;
    src->stored_dtype = st_stored_dtype;
    src->read_raw = st_read_raw;
    src->release_pages = st_release;
    src->close = st_close;
    return CKV_STATUS_OK;
}

ckv_status ckv_source_open(ckv_weight_source *src, ckv_model_config *cfg, const char *path) {
    memset(src, 0, sizeof *src);
    struct stat sb;
    if (stat(path, &sb) != 0) return ckv_error(CKV_STATUS_ERR_IO, "%s: no such model file or directory", path);
    ckv_status st = S_ISDIR(sb.st_mode) ? ckv_source_open_safetensors(src, cfg, path) : ckv_gguf_open_source(src, cfg, path);
    if (st == CKV_STATUS_OK && cfg->max_context < cfg->max_position_embeddings) cfg->max_context = cfg->max_position_embeddings;
    return st;
}

void ckv_source_close(ckv_weight_source *src) {
    if (!src) return;
    if (src->ctx && src->close) src->close(src->ctx);
    memset(src, 0, sizeof *src);
}
