/* strbuf.c - growable text buffer with sticky allocation failure, JSON and XML escaping. */
#include "eval/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ckv_strbuf_init(ckv_strbuf *b) { memset(b, 0, sizeof *b); }

void ckv_strbuf_free(ckv_strbuf *b) {
    free(b->s);
    memset(b, 0, sizeof *b);
}

void ckv_strbuf_reset(ckv_strbuf *b) {
    b->len = 0;
    if (b->s) b->s[0] = '\0';
}

static int grow(ckv_strbuf *b, size_t extra) {
    if (b->failed) return 0;
    if (b->len + extra + 1 <= b->cap) return 1;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (!s) {
        b->failed = 1;
        return 0;
    }
    b->s = s;
    b->cap = cap;
    return 1;
}

void ckv_strbuf_add(ckv_strbuf *b, const char *s, size_t n) {
    if (!grow(b, n)) return;
    if (n) memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

void ckv_strbuf_adds(ckv_strbuf *b, const char *s) { ckv_strbuf_add(b, s, strlen(s)); }

void ckv_strbuf_addc(ckv_strbuf *b, char c) { ckv_strbuf_add(b, &c, 1); }

void ckv_strbuf_printf(ckv_strbuf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char small[256];
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->failed = 1;
        return;
    }
    if ((size_t)n < sizeof small) {
        ckv_strbuf_add(b, small, (size_t)n);
        return;
    }
    if (!grow(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->s + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

/* Length of the valid UTF-8 sequence at s (0 when invalid). */
static size_t utf8_len(const unsigned char *s) {
    unsigned char c = s[0];
    size_t n;
    unsigned cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07;
    else return 0;
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((n == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
    return n;
}

void ckv_strbuf_json_string(ckv_strbuf *b, const char *str) {
    const unsigned char *s = (const unsigned char *)str;
    ckv_strbuf_addc(b, '"');
    while (*s) {
        unsigned char c = *s;
        if (c == '"' || c == '\\') {
            ckv_strbuf_addc(b, '\\');
            ckv_strbuf_addc(b, (char)c);
            s++;
        } else if (c < 0x20) {
            if (c == '\n') ckv_strbuf_adds(b, "\\n");
            else if (c == '\t') ckv_strbuf_adds(b, "\\t");
            else if (c == '\r') ckv_strbuf_adds(b, "\\r");
            else ckv_strbuf_printf(b, "\\u%04x", c);
            s++;
        } else if (c < 0x80) {
            ckv_strbuf_addc(b, (char)c);
            s++;
        } else {
            size_t n = utf8_len(s);
            if (n) {
                ckv_strbuf_add(b, (const char *)s, n);
                s += n;
            } else {
                ckv_strbuf_adds(b, "\xEF\xBF\xBD");
                s++;
            }
        }
    }
    ckv_strbuf_addc(b, '"');
}

void ckv_strbuf_xml(ckv_strbuf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '&') ckv_strbuf_adds(b, "&amp;");
        else if (*s == '<') ckv_strbuf_adds(b, "&lt;");
        else if (*s == '>') ckv_strbuf_adds(b, "&gt;");
        else if (*s == '"') ckv_strbuf_adds(b, "&quot;");
        else ckv_strbuf_addc(b, *s);
    }
}

ckv_status ckv_strbuf_status(const ckv_strbuf *b, const char *what) {
    return b->failed ? ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building %s", what) : CKV_STATUS_OK;
}

ckv_status ckv_strbuf_take(ckv_strbuf *b, char **out, const char *what) {
    *out = NULL;
    if (!b->s && !b->failed) ckv_strbuf_add(b, "", 0);
    ckv_status s = ckv_strbuf_status(b, what);
    if (s != CKV_STATUS_OK) {
        ckv_strbuf_free(b);
        return s;
    }
    *out = b->s;
    memset(b, 0, sizeof *b);
    return CKV_STATUS_OK;
}
