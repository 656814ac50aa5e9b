/* json.c - cJSON wrapper with file-naming errors. */
#include "json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

ckv_status ckv_read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return ckv_error(CKV_STATUS_ERR_IO, "%s: %s", path, strerror(errno));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) { /* read in blocks: works for pipes and special files too */
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0) break;
        if (n + 1 == cap) {
            char *bigger = cap > ((size_t)1 << 40) ? NULL : realloc(buf, cap * 2);
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap *= 2;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!buf) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory reading the file", path);
    if (err) {
        free(buf);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: read error (is it a directory?)", path);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return CKV_STATUS_OK;
}

ckv_status ckv_json_parse_buffer(ckv_json **out, const char *buf, size_t len, const char *what) {
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!j) {
        size_t off = end ? (size_t)(end - buf) : 0;
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: invalid JSON near byte %zu", what, off);
    }
    *out = j;
    return CKV_STATUS_OK;
}

ckv_status ckv_json_parse_file(ckv_json **out, const char *path) {
    *out = NULL;
    char *buf;
    size_t len;
    CKV_TRY(ckv_read_file(path, &buf, &len));
    ckv_status s = ckv_json_parse_buffer(out, buf, len, path);
    free(buf);
    return s;
}

void ckv_json_free(ckv_json *j) {
    if (j) cJSON_Delete(j);
}

ckv_json *ckv_json_get(const ckv_json *j, const char *key) {
    if (!j || !cJSON_IsObject(j)) return NULL;
    return cJSON_GetObjectItemCaseSensitive(j, key);
}

int ckv_json_is_null(const ckv_json *j) { return !j || cJSON_IsNull(j); }
int ckv_json_is_number(const ckv_json *j) { return j && cJSON_IsNumber(j); }
int ckv_json_is_string(const ckv_json *j) { return j && cJSON_IsString(j); }
int ckv_json_is_object(const ckv_json *j) { return j && cJSON_IsObject(j); }
int ckv_json_is_array(const ckv_json *j) { return j && cJSON_IsArray(j); }
int ckv_json_is_bool(const ckv_json *j) { return j && cJSON_IsBool(j); }
double ckv_json_number(const ckv_json *j) { return j && cJSON_IsNumber(j) ? j->valuedouble : 0.0; }
const char *ckv_json_string(const ckv_json *j) { return j && cJSON_IsString(j) ? j->valuestring : NULL; }
int ckv_json_bool(const ckv_json *j) { return j && cJSON_IsTrue(j); }
int ckv_json_array_size(const ckv_json *j) { return j && cJSON_IsArray(j) ? cJSON_GetArraySize(j) : 0; }
ckv_json *ckv_json_array_at(const ckv_json *j, int i) { return j ? cJSON_GetArrayItem(j, i) : NULL; }
ckv_json *ckv_json_first_child(const ckv_json *j) { return j ? j->child : NULL; }
ckv_json *ckv_json_next(const ckv_json *j) { return j ? j->next : NULL; }
const char *ckv_json_key(const ckv_json *j) { return j ? j->string : NULL; }
