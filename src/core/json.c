/* json.c - cJSON wrapper with file-naming errors, strict about what cJSON lets through (bytes
 * after the value, duplicate keys, NUL characters), and the bounded whole-input reader. */
#define _POSIX_C_SOURCE 200809L /* fileno */
#include "json.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CKV_INPUT_LIMIT_DEFAULT ((size_t)256 << 20)

ckv_status ckv_input_limit(size_t *limit) {
    *limit = CKV_INPUT_LIMIT_DEFAULT;
    const char *v = getenv("CKV_MAX_INPUT_BYTES");
    if (!v || !v[0]) return CKV_STATUS_OK;
    char *end = NULL;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    unsigned shift = 0;
    if (end && (*end == 'k' || *end == 'K')) shift = 10, end++;
    else if (end && (*end == 'm' || *end == 'M')) shift = 20, end++;
    else if (end && (*end == 'g' || *end == 'G')) shift = 30, end++;
    if (errno || end == v || *end || v[0] == '-' || n == 0 || n > (ULLONG_MAX >> shift))
        return ckv_error(CKV_STATUS_ERR_ARG, "CKV_MAX_INPUT_BYTES='%.40s' is not a positive byte count (e.g. 512M)", v);
    n <<= shift;
    *limit = n > (unsigned long long)SIZE_MAX / 2 ? SIZE_MAX / 2 : (size_t)n;
    return CKV_STATUS_OK;
}

static ckv_status too_big(const char *what, size_t limit) {
    return ckv_error(CKV_STATUS_ERR_RANGE,
                     "%s: input larger than the limit of %zu bytes (set CKV_MAX_INPUT_BYTES to read more)", what, limit);
}

ckv_status ckv_read_stream(FILE *f, const char *what, size_t limit, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    size_t cap = 1 << 16, n = 0;
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size >= 0) {
        if ((uint64_t)sb.st_size > (uint64_t)limit) return too_big(what, limit);
        cap = (size_t)sb.st_size + 2; /* + NUL, + 1 so that the read sees the end */
    }
    char *buf = malloc(cap);
    while (buf) { /* read in blocks: works for pipes and special files too */
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (n > limit) {
            free(buf);
            return too_big(what, limit);
        }
        if (got == 0) break;
        if (n + 1 == cap) {
            size_t next = cap > limit / 2 + 2 ? limit + 2 : cap * 2; /* never beyond limit + 2 */
            char *bigger = next > cap ? realloc(buf, next) : NULL;
            if (!bigger) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = bigger;
            cap = next;
        }
    }
    if (!buf) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory reading the input", what);
    if (ferror(f)) {
        free(buf);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: read error (is it a directory?)", what);
    }
    buf[n] = '\0';
    *out = buf;
    if (len) *len = n;
    return CKV_STATUS_OK;
}

ckv_status ckv_read_file(const char *path, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    size_t limit;
    CKV_TRY(ckv_input_limit(&limit));
    FILE *f = fopen(path, "rb");
    if (!f) return ckv_error(CKV_STATUS_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fclose(f);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: is a directory, not a file", path);
    }
    ckv_status st = ckv_read_stream(f, path, limit, out, len);
    fclose(f);
    return st;
}

ckv_status ckv_json_check_no_nul(const char *s, size_t n, const char *what) {
    int in = 0;
    for (size_t i = 0; i < n; i++) {
        if (!in) {
            in = s[i] == '"';
        } else if (s[i] == '"') {
            in = 0;
        } else if (s[i] == '\\' && i + 1 < n) {
            if (s[i + 1] == 'u' && i + 5 < n && memcmp(s + i + 2, "0000", 4) == 0)
                return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: string with a \\u0000 (NUL) character at byte %zu", what, i);
            i++;
        }
    }
    return CKV_STATUS_OK;
}

static int json_key_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first key that appears twice in one object of the tree at j (NULL when none). cJSON keeps
 * both members and look-ups see only the first, so a duplicate would be silently ignored. */
static ckv_status json_find_duplicate(const cJSON *j, const char **dup) {
    *dup = NULL;
    for (const cJSON *c = j->child; c && !*dup; c = c->next) CKV_TRY(json_find_duplicate(c, dup));
    if (*dup || !cJSON_IsObject(j)) return CKV_STATUS_OK;
    size_t k = 0;
    for (const cJSON *c = j->child; c; c = c->next) k++;
    if (k < 2) return CKV_STATUS_OK;
    if (k <= 8) {
        for (const cJSON *a = j->child; a && !*dup; a = a->next)
            for (const cJSON *b = a->next; b && !*dup; b = b->next)
                if (strcmp(a->string, b->string) == 0) *dup = a->string;
        return CKV_STATUS_OK;
    }
    const char **keys = malloc(k * sizeof *keys);
    if (!keys) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory checking the keys of a JSON object");
    k = 0;
    for (const cJSON *c = j->child; c; c = c->next) keys[k++] = c->string;
    qsort(keys, k, sizeof *keys, json_key_cmp);
    for (size_t i = 1; i < k && !*dup; i++)
        if (strcmp(keys[i - 1], keys[i]) == 0) *dup = keys[i];
    free(keys);
    return CKV_STATUS_OK;
}

ckv_status ckv_json_parse_buffer(ckv_json **out, const char *buf, size_t len, const char *what) {
    *out = NULL;
    const char *nul = memchr(buf, '\0', len);
    if (nul)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: NUL byte at offset %zu (not JSON text)", what, (size_t)(nul - buf));
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(buf, len, &end, 0);
    if (!j) {
        size_t off = end ? (size_t)(end - buf) : 0;
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: invalid JSON near byte %zu", what, off);
    }
    size_t off = (size_t)(end - buf);
    while (off < len && (buf[off] == ' ' || buf[off] == '\t' || buf[off] == '\n' || buf[off] == '\r')) off++;
    ckv_status st = CKV_STATUS_OK;
    const char *dup = NULL;
    if (off < len)
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: unexpected bytes after the JSON value at byte %zu", what, off);
    else if ((st = json_find_duplicate(j, &dup)) == CKV_STATUS_OK && dup)
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: duplicate key '%.100s' in one object", what, dup);
    if (st != CKV_STATUS_OK) {
        cJSON_Delete(j);
        return st;
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
