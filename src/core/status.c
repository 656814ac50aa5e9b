/* status.c - status strings and the thread-local error message buffer. A recorded message is kept
 * on one line and harmless to print: control bytes (newline, escape, ...), DEL, C1 controls and bytes
 * that are not valid UTF-8 are written as \xNN, so a file name, tensor name or key quoted from an
 * untrusted input can neither break the one-line rule nor drive a terminal. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>

static const char *const ckv_status_strings[] = {
#define CKV_STATUS_STR_(name, str) str,
    CKV_STATUS_TABLE(CKV_STATUS_STR_)
#undef CKV_STATUS_STR_
};

static _Thread_local char ckv_error_buf[1024];

const char *ckv_status_string(ckv_status s) {
    if ((int)s < 0 || s >= CKV_STATUS_COUNT_) return "unknown status";
    return ckv_status_strings[s];
}

/* Length of the valid, printable UTF-8 sequence at s (lead byte >= 0x80), or 0 when it is invalid,
 * overlong, a surrogate, beyond U+10FFFF or a C1 control (U+0080 .. U+009F). */
static size_t utf8_printable_len(const unsigned char *s) {
    unsigned c = s[0];
    size_t n = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 && c < 0xE0 ? 2 : 0;
    if (c >= 0xF5) n = 0;
    if (!n) return 0;
    unsigned cp = c & (0x7Fu >> n);
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0; /* also stops at the terminating NUL */
        cp = cp << 6 | (s[i] & 0x3Fu);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) || (cp >= 0xD800 && cp <= 0xDFFF) ||
        cp < 0xA0)
        return 0;
    return n;
}

size_t ckv_escape_text(char *out, size_t cap, const char *in) {
    static const char hex[] = "0123456789abcdef";
    const unsigned char *s = (const unsigned char *)in;
    size_t j = 0;
    if (!cap) return 0;
    while (*s) {
        size_t n = *s >= 0x20 && *s < 0x7F ? 1 : *s >= 0x80 ? utf8_printable_len(s) : 0;
        if (n) {
            if (j + n >= cap) break;
            for (size_t i = 0; i < n; i++) out[j++] = (char)s[i];
            s += n;
        } else {
            if (j + 4 >= cap) break;
            out[j++] = '\\';
            out[j++] = 'x';
            out[j++] = hex[*s >> 4];
            out[j++] = hex[*s & 15];
            s++;
        }
    }
    out[j] = '\0';
    return j;
}

ckv_status ckv_error(ckv_status code, const char *fmt, ...) {
    char raw[sizeof ckv_error_buf]; /* the arguments may point into ckv_error_buf itself */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    ckv_escape_text(ckv_error_buf, sizeof ckv_error_buf, raw);
    return code;
}

const char *ckv_error_message(void) { return ckv_error_buf; }

void ckv_error_clear(void) { ckv_error_buf[0] = '\0'; }
