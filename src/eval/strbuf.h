/* strbuf.h - a growable byte buffer for building text (prompts, JSON lines, tables, SVG) in eval/:
 * append, printf-append and JSON string escaping. Allocation failures are sticky: the first one is
 * remembered and reported by ckv_strbuf_status, so callers may append freely and check once. */
#ifndef CKV_EVAL_STRBUF_H
#define CKV_EVAL_STRBUF_H

#include <stddef.h>

#include "core/status.h"

typedef struct {
    char *s;    /* NUL-terminated when len > 0 or after any append */
    size_t len, cap;
    int failed; /* an allocation failed */
} ckv_strbuf;

void ckv_strbuf_init(ckv_strbuf *b);
void ckv_strbuf_free(ckv_strbuf *b);
void ckv_strbuf_reset(ckv_strbuf *b); /* len = 0, keeps the memory */
void ckv_strbuf_add(ckv_strbuf *b, const char *s, size_t n);
void ckv_strbuf_adds(ckv_strbuf *b, const char *s);
void ckv_strbuf_addc(ckv_strbuf *b, char c);
void ckv_strbuf_printf(ckv_strbuf *b, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Appends s as a JSON string literal (quotes included); invalid UTF-8 bytes become U+FFFD. */
void ckv_strbuf_json_string(ckv_strbuf *b, const char *s);
/* Appends s with &, <, >, " escaped for XML/SVG text. */
void ckv_strbuf_xml(ckv_strbuf *b, const char *s);
/* CKV_STATUS_OK, or an out-of-memory error naming `what` when an append failed. */
ckv_status ckv_strbuf_status(const ckv_strbuf *b, const char *what);
/* Hands the text over (never NULL on success: "" for an empty buffer); the buffer is reset. */
ckv_status ckv_strbuf_take(ckv_strbuf *b, char **out, const char *what);

#endif
