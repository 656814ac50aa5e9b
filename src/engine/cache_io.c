/* cache_io.c - session cache files (see cache_io.h). */
#include "engine/cache_io.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"
#include "kv/kv_file.h"

static void shard_path(const ckv_session *s, const char *path, char *out, size_t cap) {
    const ckv_comm *tp = s->model->tp;
    if (tp && tp->size > 1)
        snprintf(out, cap, "%s.rank%d", path, tp->rank);
    else
        snprintf(out, cap, "%s", path);
}

/* JSON-escapes a press spec (it contains no quotes or backslashes, but be safe). */
static void json_escape(const char *in, char *out, size_t cap) {
    size_t j = 0;
    for (size_t i = 0; in[i] && j + 2 < cap; i++) {
        if (in[i] == '"' || in[i] == '\\') out[j++] = '\\';
        out[j++] = (char)((unsigned char)in[i] < 0x20 ? ' ' : in[i]);
    }
    out[j] = '\0';
}

ckv_status ckv_session_save_cache(ckv_session *s, const char *path, const char *press_spec, const float *logits,
                                  int question_inside) {
    if (question_inside && !logits) return ckv_error(CKV_STATUS_ERR_ARG, "%s: a query-aware context saved without its logits", path);
    char fp[17], file[4096], spec[1100], meta[2048];
    CKV_TRY(ckv_model_fingerprint(s->model, fp));
    shard_path(s, path, file, sizeof file);
    json_escape(press_spec ? press_spec : "none", spec, sizeof spec);
    const ckv_shard_plan *p = &s->model->plan;
    snprintf(meta, sizeof meta,
             "{\"format\": \"ckv kv cache\", \"model_fingerprint\": \"%s\", \"architecture\": \"%s\", \"tp\": %d, "
             "\"rank\": %d, \"context_len\": %d, \"press\": \"%s\", \"last_logits\": %s, \"question_inside\": %s}",
             fp, s->model->cfg.arch_name, p->tp, p->rank, s->n_past, spec, logits ? "true" : "false",
             question_inside ? "true" : "false");
    return ckv_kv_cache_save(&s->kv, file, meta, logits, logits ? (uint32_t)s->model->cfg.vocab_size : 0);
}

/* An integer member of the cache header in [lo, hi] (a corrupt header may hold anything). */
static ckv_status meta_int(const ckv_json *j, const char *key, const char *file, int lo, int hi, int *out) {
    const ckv_json *v = ckv_json_get(j, key);
    double x = ckv_json_number(v);
    if (!ckv_json_is_number(v) || !(x >= lo && x <= hi) || x != (double)(int)x)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: cache header key '%s' is missing or not an integer in [%d, %d]", file, key,
                         lo, hi);
    *out = (int)x;
    return CKV_STATUS_OK;
}

/* A boolean member of the cache header; absent (a file written before it existed) reads as false. */
static int meta_flag(const ckv_json *j, const char *key) {
    const ckv_json *v = ckv_json_get(j, key);
    return v && ckv_json_is_bool(v) && ckv_json_bool(v);
}

ckv_status ckv_session_load_cache(ckv_session *s, const char *path, char *press_spec, size_t cap, float *logits,
                                  int *has_logits, int *question_inside) {
    *has_logits = *question_inside = 0;
    if (s->n_past != 0) return ckv_error(CKV_STATUS_ERR_ARG, "--load-cache: the session already holds tokens");
    char fp[17], file[4096];
    CKV_TRY(ckv_model_fingerprint(s->model, fp));
    shard_path(s, path, file, sizeof file);
    /* check the header before reading megabytes of rows */
    char *meta = NULL;
    CKV_TRY(ckv_kv_file_read_meta(file, &meta));
    ckv_json *j = NULL;
    ckv_status st = ckv_json_parse_buffer(&j, meta, strlen(meta), file);
    free(meta);
    CKV_TRY(st);
    const char *mfp = ckv_json_string(ckv_json_get(j, "model_fingerprint"));
    int tp = 0, rank = 0, L = 0;
    const char *spec = ckv_json_string(ckv_json_get(j, "press"));
    const ckv_shard_plan *p = &s->model->plan;
    if (!ckv_json_is_object(j))
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: the cache header is not a JSON object", file);
    else if ((st = meta_int(j, "tp", file, 1, 1 << 16, &tp)) != CKV_STATUS_OK ||
             (st = meta_int(j, "rank", file, 0, (1 << 16) - 1, &rank)) != CKV_STATUS_OK ||
             (st = meta_int(j, "context_len", file, 1, INT32_MAX - 1, &L)) != CKV_STATUS_OK) {
        /* message recorded */
    } else if (!mfp || strcmp(mfp, fp) != 0)
        st = ckv_error(CKV_STATUS_ERR_ARG, "%s: the cache was made with another model (fingerprint %s, this model %s)",
                       file, mfp ? mfp : "missing", fp);
    else if (tp != p->tp || rank != p->rank)
        st = ckv_error(CKV_STATUS_ERR_ARG, "%s: the cache was made by rank %d of %d tensor-parallel ranks, this is rank %d of %d",
                       file, rank, tp, p->rank, p->tp);
    else if (L < 1 || L >= s->capacity)
        st = ckv_error(CKV_STATUS_ERR_RANGE, "%s: context of %d tokens leaves no room in a session of %d tokens", file, L,
                       s->capacity);
    else if (!spec)
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: the cache header names no press", file);
    else if (meta_flag(j, "question_inside") && !meta_flag(j, "last_logits"))
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: the cache header says its question is inside but it holds no logits", file);
    if (st == CKV_STATUS_OK && press_spec && cap) snprintf(press_spec, cap, "%s", spec);
    int full = st == CKV_STATUS_OK && strcmp(spec, "none") == 0; /* uncompressed: every head holds the whole context */
    int with_logits = meta_flag(j, "last_logits"), inside = meta_flag(j, "question_inside");
    ckv_json_free(j);
    CKV_TRY(st);
    char *meta2 = NULL;
    st = ckv_kv_cache_load(&s->kv, file, s->capacity - L, L, full, with_logits ? logits : NULL,
                           with_logits ? (uint32_t)s->model->cfg.vocab_size : 0, &meta2);
    free(meta2);
    CKV_TRY(st);
    s->n_past = L;
    *has_logits = with_logits;
    *question_inside = inside;
    return CKV_STATUS_OK;
}
