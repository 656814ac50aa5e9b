/* json.h - a thin wrapper over cJSON: parse a file or a buffer with errors that name the file, and
 * typed look-ups. It does not know any particular schema (config.json is model/'s business). */
#ifndef CKV_JSON_H
#define CKV_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "status.h"

typedef struct cJSON ckv_json;

/* Parses `path`; on failure the message names the file (and the offset of a syntax error). */
ckv_status ckv_json_parse_file(ckv_json **out, const char *path);
/* Parses `len` bytes; `what` names the source in errors. Strict JSON: only whitespace may follow
 * the value, no object may repeat a key, no raw NUL byte. A "\u0000" escape is accepted (a
 * tokenizer may need it); readers whose strings become C strings check with the function below. */
ckv_status ckv_json_parse_buffer(ckv_json **out, const char *buf, size_t len, const char *what);
void ckv_json_free(ckv_json *j); /* NULL is fine */
/* Refuses JSON text with a \u0000 escape inside a string (cJSON would cut the string there). */
ckv_status ckv_json_check_no_nul(const char *buf, size_t len, const char *what);

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

/* The most bytes one input may bring into memory (ckv_read_file and every reader built on it: model
 * and tokenizer JSON, --data, --prompt-file, --text-file, --haystack, --profile): 256 MiB, or the
 * environment variable CKV_MAX_INPUT_BYTES (a byte count, optionally with K, M or G: "2G"); an
 * unparsable value is an error. */
ckv_status ckv_input_limit(size_t *limit);

/* Reads a whole file into a NUL-terminated heap buffer (free with free()); refuses directories and
 * stops with an error once more than ckv_input_limit() bytes arrive (so /dev/zero or an endless
 * pipe ends quickly). */
ckv_status ckv_read_file(const char *path, char **out, size_t *len);

/* The same for an open stream (e.g. stdin), with an explicit limit; `what` names it in errors. */
ckv_status ckv_read_stream(FILE *f, const char *what, size_t limit, char **out, size_t *len);

#endif
