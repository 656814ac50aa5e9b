/* utf8.c - UTF-8 validation, decoding and lossy repair (one U+FFFD per maximal invalid subpart, the
 * rule Python's errors="replace" and Rust's from_utf8_lossy follow), the few Unicode properties the
 * tokenizer needs (White_Space, numeric, word characters; categories come from utf8proc), and the
 * GPT-2 byte <-> char table of byte-level BPE. It does not normalize (normalize.c) or split. */
#include <pthread.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

/* Length of the well-formed sequence starting at s, or 0 when s[0..len) does not start with one.
 * *need receives how many bytes a complete sequence would take when the prefix is valid so far. */
static int utf8_probe(const uint8_t *s, size_t len, int *need) {
    uint8_t c = s[0];
    int n;
    uint8_t lo = 0x80, hi = 0xBF;
    if (c < 0x80) {
        *need = 1;
        return 1;
    } else if (c >= 0xC2 && c <= 0xDF) {
        n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        n = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        n = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *need = 0;
        return 0;
    }
    *need = n;
    for (int i = 1; i < n; i++) {
        if ((size_t)i >= len) return -i; /* valid so far, truncated after i bytes */
        uint8_t b = s[i];
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (b < l || b > h) {
            *need = 0;
            return -i; /* invalid: the maximal subpart is i bytes */
        }
    }
    return n;
}

int ckv_utf8_valid_len(const uint8_t *s, size_t len) {
    if (len == 0) return 0;
    int need;
    int r = utf8_probe(s, len, &need);
    return r > 0 ? r : 0;
}

int ckv_utf8_decode(const uint8_t *s, uint32_t *cp) {
    uint8_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    if (c < 0xE0) {
        *cp = ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
        return 2;
    }
    if (c < 0xF0) {
        *cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        return 3;
    }
    *cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
          (s[3] & 0x3F);
    return 4;
}

int ckv_utf8_encode(uint32_t cp, char *out) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t ckv_utf8_first_invalid(const uint8_t *s, size_t len) {
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int need;
        int r = utf8_probe(s + i, len - i, &need);
        if (r <= 0) return i;
        i += (size_t)r;
    }
    return len;
}

size_t ckv_utf8_next(const uint8_t *s, size_t len, int *valid) {
    int need;
    int r = utf8_probe(s, len, &need);
    if (r > 0) {
        *valid = 1;
        return (size_t)r;
    }
    *valid = 0;
    return r == 0 ? 1 : (size_t)(-r);
}

ckv_status ckv_utf8_append_lossy(ckv_tk_buf *out, const uint8_t *s, size_t len) {
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, run = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        int need;
        int r = utf8_probe(s + i, len - i, &need);
        if (r > 0) {
            i += (size_t)r;
            continue;
        }
        CKV_TRY(ckv_tk_buf_append(out, s + run, i - run));
        CKV_TRY(ckv_tk_buf_append(out, fffd, 3));
        i += r == 0 ? 1 : (size_t)(-r);
        run = i;
    }
    return ckv_tk_buf_append(out, s + run, len - run);
}

size_t ckv_utf8_incomplete_tail(const uint8_t *s, size_t len) {
    /* look at the last up-to-3 bytes for a lead byte whose sequence is truncated but valid so far */
    for (size_t k = 1; k <= 3 && k <= len; k++) {
        const uint8_t *p = s + len - k;
        if (*p >= 0x80 && *p < 0xC0) continue; /* continuation byte: keep looking back */
        int need;
        int r = utf8_probe(p, k, &need);
        if (r < 0 && need > 0 && (size_t)(-r) == k) return k; /* truncated, valid so far */
        return 0;
    }
    return 0;
}

int ckv_unicode_is_whitespace(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

int ckv_unicode_is_numeric(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

int ckv_unicode_is_word(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    if (c == 0x200C || c == 0x200D) return 1;
    switch (utf8proc_category((utf8proc_int32_t)c)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_PC:
        return 1;
    default:
        return 0;
    }
}

/* GPT-2's table: printable Latin-1 bytes map to themselves, the other 68 bytes to U+0100.. in
 * byte order. Built once; the tables are constant afterwards. */
static uint16_t g_byte_to_cp[256];
static int16_t g_cp_to_byte[324];
static pthread_once_t g_tables_once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
    uint16_t n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        g_byte_to_cp[b] = printable ? (uint16_t)b : (uint16_t)(256 + n++);
    }
    for (int i = 0; i < 324; i++) g_cp_to_byte[i] = -1;
    for (int b = 0; b < 256; b++) g_cp_to_byte[g_byte_to_cp[b]] = (int16_t)b;
}

void ckv_tk_bytelevel_tables(const uint16_t **byte_to_cp, const int16_t **cp_to_byte) {
    pthread_once(&g_tables_once, build_tables);
    if (byte_to_cp) *byte_to_cp = g_byte_to_cp;
    if (cp_to_byte) *cp_to_byte = g_cp_to_byte;
}
