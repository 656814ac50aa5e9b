/* json.h - a thin wrapper over cJSON: parse a file or a buffer with errors that name the file, and
 * typed look-ups. It does not know any particular schema (config.json is model/'s business). */
#ifndef CKV_JSON_H
#define CKV_JSON_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct cJSON ckv_json;

/* Parses `path`; on failure the message names the file (and the offset of a syntax error). */
ckv_status ckv_json_parse_file(ckv_json **out, const char *path);
/* Parses `len` bytes; `what` names the source in errors. */
ckv_status ckv_json_parse_buffer(ckv_json **out, const char *buf, size_t len, const char *what);
void ckv_json_free(ckv_json *j); /* NULL is fine */

/* Member look-up (NULL when absent or j is NULL). */
ckv_json *ckv_json_get(const ckv_json *j, const char *key);
int ckv_json_is_null(const ckv_json *j);   /* absent counts as null */
int ckv_json_is_number(const ckv_json *j);
int ckv_json_is_string(const ckv_json *j);
int ckv_json_is_object(const ckv_json *j);
int ckv_json_is_array(const ckv_json *j);
int ckv_json_is_bool(const ckv_json *j);
double ckv_json_number(const ckv_json *j);
const char *ckv_json_string(const ckv_json *j); /* NULL when not a string */
int ckv_json_bool(const ckv_json *j);
int ckv_json_array_size(const ckv_json *j);
ckv_json *ckv_json_array_at(const ckv_json *j, int i);
/* Iteration over an object's members. */
ckv_json *ckv_json_first_child(const ckv_json *j);
ckv_json *ckv_json_next(const ckv_json *j);
const char *ckv_json_key(const ckv_json *j);

/* Reads a whole file into a NUL-terminated heap buffer (free with free()). */
ckv_status ckv_read_file(const char *path, char **out, size_t *len);

#endif
