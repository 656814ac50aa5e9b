/* source.c - opens a model path as a weight source: safetensors directories here, GGUF files via
 * gguf.c. */
#include "model/source.h"

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
