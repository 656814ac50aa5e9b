/* grammar_pattern.c - a JSON schema "pattern" (an ECMA-262 regular expression) compiled into grammar
 * rules for a JSON string's content: literals, . (any character but a line break), classes [a-z]
 * [^...] with \d \w \s inside or outside, groups ( ) and (?: ), alternation |, quantifiers ? * + {m}
 * {m,} {m,n} (a lazy ? after one is accepted: it changes nothing here), anchors ^ and $ (without them
 * the pattern may match anywhere, as JSON Schema's search semantics say). Characters are written as
 * JSON needs them ('"', '\' and line breaks escaped). Back-references, look-arounds and \b are
 * refused naming them. It does not compile the rest of a schema (grammar_schema.c). */
#include <stdio.h>
#include <string.h>

#include "engine/grammar_impl.h"

#define MAX_REP 256 /* {m,n} bounds */

typedef struct {
    ckv_gb *b;
    const char *src, *p;
    char *err;
    size_t errlen;
    int failed, depth;
} rx;

static int rx_fail(rx *r, const char *what) {
    if (!r->failed) snprintf(r->err, r->errlen, "pattern at offset %d: %s", (int)(r->p - r->src), what);
    r->failed = 1;
    return -1;
}

typedef struct {
    uint32_t set[8]; /* ASCII characters (bits 0..127) */
    int neg;         /* negated: every character not in set, non-ASCII ones too */
    uint32_t wide[32]; /* non-ASCII characters (positive classes) */
    int n_wide;
} cls;

static void set_bit(cls *c, int ch) { c->set[ch >> 5] |= 1u << (ch & 31); }
static void set_range(cls *c, int lo, int hi) {
    for (int ch = lo; ch <= hi; ch++) set_bit(c, ch);
}

/* \d \w \s and their negations into c (inside a class: negations only as a whole class) */
static int shorthand(rx *r, char e, cls *c, int in_class) {
    cls x = {{0}, 0, {0}, 0};
    switch (e | 0x20) {
    case 'd': set_range(&x, '0', '9'); break;
    case 'w': set_range(&x, '0', '9'), set_range(&x, 'a', 'z'), set_range(&x, 'A', 'Z'), set_bit(&x, '_'); break;
    case 's': set_bit(&x, ' '), set_bit(&x, '\t'), set_bit(&x, '\n'), set_bit(&x, '\r'), set_bit(&x, '\f'), set_bit(&x, '\v'); break;
    default: return 0;
    }
    if (e >= 'a') {
        for (int i = 0; i < 8; i++) c->set[i] |= x.set[i];
        return 1;
    }
    if (in_class) return rx_fail(r, "a negated shorthand (\\D, \\W, \\S) inside a class is not supported") ? -1 : -1;
    *c = x;
    c->neg = 1;
    return 1;
}

/* UTF-8 decode one character at r->p */
static long utf8_char(rx *r) {
    const unsigned char *s = (const unsigned char *)r->p;
    int len = s[0] < 0x80 ? 1 : s[0] >= 0xC2 && s[0] <= 0xDF ? 2 : s[0] >= 0xE0 && s[0] <= 0xEF ? 3 : s[0] >= 0xF0 && s[0] <= 0xF4 ? 4 : 0;
    if (!len) return rx_fail(r, "invalid UTF-8");
    long v = len == 1 ? s[0] : s[0] & (0x3F >> (len - 1));
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return rx_fail(r, "invalid UTF-8");
        v = v << 6 | (s[i] & 0x3F);
    }
    r->p += len;
    return v;
}

static int hexv(char c) { return c >= '0' && c <= '9' ? c - '0' : (c | 0x20) >= 'a' && (c | 0x20) <= 'f' ? (c | 0x20) - 'a' + 10 : -1; }

/* An escaped character after '\' (not a shorthand): its code point, or -1. */
static long escape_char(rx *r) {
    char e = *r->p++;
    switch (e) {
    case 'n': return '\n';
    case 'r': return '\r';
    case 't': return '\t';
    case 'f': return '\f';
    case 'v': return '\v';
    case '0': return rx_fail(r, "\\0 (NUL) is not supported");
    case 'x': case 'u': {
        int n = e == 'x' ? 2 : 4;
        long v = 0;
        for (int i = 0; i < n; i++) {
            int h = hexv(*r->p);
            if (h < 0) return rx_fail(r, "bad \\x or \\u escape");
            v = v * 16 + h, r->p++;
        }
        return v;
    }
    case 'b': case 'B': return rx_fail(r, "word boundaries (\\b, \\B) are not supported");
    default:
        if (e >= '1' && e <= '9') return rx_fail(r, "back-references are not supported");
        if ((e >= 'a' && e <= 'z') || (e >= 'A' && e <= 'Z')) return rx_fail(r, "unknown escape");
        if (!e) return rx_fail(r, "a pattern ending in '\\'");
        return (unsigned char)e;
    }
}

static void put_utf8(ckv_gb *b, long v) {
    char o[4];
    int n;
    if (v < 0x80) o[0] = (char)v, n = 1;
    else if (v < 0x800) o[0] = (char)(0xC0 | v >> 6), o[1] = (char)(0x80 | (v & 0x3F)), n = 2;
    else if (v < 0x10000) o[0] = (char)(0xE0 | v >> 12), o[1] = (char)(0x80 | (v >> 6 & 0x3F)), o[2] = (char)(0x80 | (v & 0x3F)), n = 3;
    else o[0] = (char)(0xF0 | v >> 18), o[1] = (char)(0x80 | (v >> 12 & 0x3F)), o[2] = (char)(0x80 | (v >> 6 & 0x3F)),
         o[3] = (char)(0x80 | (v & 0x3F)), n = 4;
    ckv_gb_lit(b, o, (size_t)n);
}

/* One character as JSON writes it inside a string, into the open alternative. */
static void json_char(ckv_gb *b, long v) {
    static const char *const esc[32] = {[8] = "\\b", [9] = "\\t", [10] = "\\n", [12] = "\\f", [13] = "\\r"};
    char u[8];
    if (v == '"' || v == '\\') {
        ckv_gb_byte(b, '\\');
        ckv_gb_byte(b, (uint8_t)v);
    } else if (v < 0x20) {
        if (esc[v]) ckv_gb_lit(b, esc[v], 2);
        else snprintf(u, sizeof u, "\\u%04lx", v), ckv_gb_lit(b, u, 6);
    } else {
        put_utf8(b, v);
    }
}

/* A class as a rule: the ASCII characters JSON writes as themselves in one byte class, the others as
 * their escapes, and (negated) every multi-byte character, or the listed wide ones. */
static int class_rule(ckv_gb *b, const cls *c) {
    uint32_t set[8] = {0};
    for (int ch = 1; ch < 128; ch++) {
        int in = (int)(c->set[ch >> 5] >> (ch & 31) & 1) != c->neg;
        if (in) set[ch >> 5] |= 1u << (ch & 31);
    }
    int r = ckv_gb_rule(b), any = 0;
    uint32_t plain[8];
    memcpy(plain, set, sizeof plain);
    for (int ch = 0; ch < 32; ch++) plain[0] &= ~(1u << ch);
    plain['"' >> 5] &= ~(1u << ('"' & 31));
    plain['\\' >> 5] &= ~(1u << ('\\' & 31));
    for (int i = 0; i < 8; i++) any |= plain[i] != 0;
    if (any) {
        ckv_gb_begin(b);
        ckv_gb_class(b, plain);
        ckv_gb_end(b, r);
    }
    /* the escaped ones under one '\\' (a stack per character would crowd the matcher): the short
     * escapes as one class, the other control characters as \u00XX */
    uint32_t shortset[8] = {0};
    static const char shorts[][2] = {{'"', '"'}, {'\\', '\\'}, {8, 'b'}, {9, 't'}, {10, 'n'}, {12, 'f'}, {13, 'r'}};
    int n_esc = 0, all_ctl = 1;
    for (size_t i = 0; i < sizeof shorts / sizeof *shorts; i++)
        if (set[shorts[i][0] >> 5] >> (shorts[i][0] & 31) & 1) shortset[shorts[i][1] >> 5] |= 1u << (shorts[i][1] & 31), n_esc++;
    for (int ch = 1; ch < 0x20; ch++) all_ctl &= (int)(set[0] >> ch & 1);
    int other_ctl = 0;
    for (int ch = 1; ch < 0x20; ch++) other_ctl |= (set[0] >> ch & 1) && ch != 8 && ch != 9 && ch != 10 && ch != 12 && ch != 13;
    if (n_esc || other_ctl) {
        int esc = ckv_gb_rule(b);
        if (n_esc) {
            ckv_gb_begin(b);
            ckv_gb_class(b, shortset);
            ckv_gb_end(b, esc);
        }
        if (all_ctl) { /* u 00 01..1f */
            ckv_gb_begin(b);
            ckv_gb_lit(b, "u000", 4);
            ckv_gb_range(b, '1', '9');
            ckv_gb_end(b, esc);
            ckv_gb_begin(b);
            ckv_gb_lit(b, "u000", 4);
            ckv_gb_range(b, 'a', 'f');
            ckv_gb_end(b, esc);
            ckv_gb_begin(b);
            ckv_gb_lit(b, "u001", 4);
            uint32_t hex[8] = {0};
            for (int ch = '0'; ch <= '9'; ch++) hex[ch >> 5] |= 1u << (ch & 31);
            for (int ch = 'a'; ch <= 'f'; ch++) hex[ch >> 5] |= 1u << (ch & 31);
            ckv_gb_class(b, hex);
            ckv_gb_end(b, esc);
        } else {
            for (int ch = 1; ch < 0x20; ch++)
                if ((set[0] >> ch & 1) && ch != 8 && ch != 9 && ch != 10 && ch != 12 && ch != 13) {
                    char u[8];
                    snprintf(u, sizeof u, "u%04x", ch);
                    ckv_gb_begin(b);
                    ckv_gb_lit(b, u, 5);
                    ckv_gb_end(b, esc);
                }
        }
        ckv_gb_begin(b);
        ckv_gb_byte(b, '\\');
        ckv_gb_ref(b, esc);
        ckv_gb_end(b, r);
    }
    if (c->neg) {
        ckv_gb_begin(b);
        ckv_gb_ref(b, ckv_gb_utf8_multibyte(b));
        ckv_gb_end(b, r);
    }
    for (int i = 0; i < c->n_wide; i++) {
        ckv_gb_begin(b);
        put_utf8(b, (long)c->wide[i]);
        ckv_gb_end(b, r);
    }
    return r;
}

static int alts(rx *r, int rule);

/* A bracket class at r->p ('[' read). */
static int bracket(rx *r, cls *c) {
    memset(c, 0, sizeof *c);
    if (*r->p == '^') c->neg = 1, r->p++;
    int first = 1;
    while (*r->p != ']' || first) {
        first = 0;
        if (!*r->p) return rx_fail(r, "unterminated class");
        long lo;
        if (*r->p == '\\') {
            r->p++;
            int k = shorthand(r, *r->p, c, 1);
            if (k < 0) return -1;
            if (k) {
                r->p++;
                continue;
            }
            if ((lo = escape_char(r)) < 0) return -1;
        } else if ((lo = utf8_char(r)) < 0) {
            return -1;
        }
        long hi = lo;
        if (r->p[0] == '-' && r->p[1] && r->p[1] != ']') {
            r->p++;
            if (*r->p == '\\') {
                r->p++;
                if ((hi = escape_char(r)) < 0) return -1;
            } else if ((hi = utf8_char(r)) < 0) {
                return -1;
            }
            if (hi < lo) return rx_fail(r, "a class range whose end is before its start");
        }
        if (hi >= 0x80) {
            if (c->neg || hi != lo) return rx_fail(r, "non-ASCII ranges and negated non-ASCII characters are not supported");
            if (c->n_wide >= 32) return rx_fail(r, "more than 32 non-ASCII characters in a class");
            c->wide[c->n_wide++] = (uint32_t)lo;
            continue;
        }
        if (lo == 0) return rx_fail(r, "NUL is not supported");
        set_range(c, (int)lo, (int)hi);
    }
    r->p++;
    return 0;
}

/* One atom and its quantifier into the open alternative. */
static int atom(rx *r) {
    ckv_gb *b = r->b;
    cls c;
    int rule = -1;
    char ch = *r->p;
    if (ch == '(') {
        r->p++;
        if (r->p[0] == '?') {
            if (r->p[1] != ':') return rx_fail(r, "look-arounds and named groups are not supported");
            r->p += 2;
        }
        if (++r->depth > 64) return rx_fail(r, "groups nested deeper than 64");
        rule = ckv_gb_rule(b);
        if (alts(r, rule)) return -1;
        if (*r->p != ')') return rx_fail(r, "expected ')'");
        r->p++;
        r->depth--;
    } else if (ch == '[') {
        r->p++;
        if (bracket(r, &c)) return -1;
        rule = class_rule(b, &c);
    } else if (ch == '.') {
        r->p++;
        memset(&c, 0, sizeof c);
        set_bit(&c, '\n'), set_bit(&c, '\r');
        c.neg = 1;
        rule = class_rule(b, &c);
    } else if (ch == '\\') {
        r->p++;
        memset(&c, 0, sizeof c);
        int k = shorthand(r, *r->p, &c, 0);
        if (k < 0) return -1;
        if (k) {
            r->p++;
            rule = class_rule(b, &c);
        } else {
            long v = escape_char(r);
            if (v < 0) return -1;
            rule = ckv_gb_rule(b);
            ckv_gb_begin(b);
            json_char(b, v);
            ckv_gb_end(b, rule);
        }
    } else if (ch == '*' || ch == '+' || ch == '?' || ch == '{') {
        return rx_fail(r, "a quantifier with nothing to repeat");
    } else if (ch == '^' || ch == '$') {
        return rx_fail(r, "'^' and '$' are supported only at the start and the end");
    } else {
        long v = utf8_char(r);
        if (v < 0) return -1;
        if (v == 0) return rx_fail(r, "NUL is not supported");
        rule = ckv_gb_rule(b);
        ckv_gb_begin(b);
        json_char(b, v);
        ckv_gb_end(b, rule);
    }
    uint32_t m = 1, n = 1;
    ch = *r->p;
    if (ch == '?') m = 0, n = 1, r->p++;
    else if (ch == '*') m = 0, n = CKV_GRAMMAR_UNBOUNDED, r->p++;
    else if (ch == '+') m = 1, n = CKV_GRAMMAR_UNBOUNDED, r->p++;
    else if (ch == '{' && r->p[1] >= '0' && r->p[1] <= '9') {
        unsigned long a = 0, z;
        for (r->p++; *r->p >= '0' && *r->p <= '9'; r->p++) a = a * 10 + (unsigned long)(*r->p - '0');
        z = a;
        if (*r->p == ',') {
            r->p++;
            z = CKV_GRAMMAR_UNBOUNDED;
            if (*r->p != '}')
                for (z = 0; *r->p >= '0' && *r->p <= '9'; r->p++) z = z * 10 + (unsigned long)(*r->p - '0');
        }
        if (*r->p != '}') return rx_fail(r, "expected '}'");
        r->p++;
        if (a > MAX_REP || (z != CKV_GRAMMAR_UNBOUNDED && (z > MAX_REP || z < a))) return rx_fail(r, "a {m,n} over 256 or with n < m");
        m = (uint32_t)a, n = (uint32_t)z;
    }
    if (*r->p == '?' && !(m == 1 && n == 1)) r->p++; /* lazy: the same set of strings */
    ckv_gb_repeat(b, (ckv_grammar_el){.kind = CKV_GEL_REF, .arg = (uint32_t)rule}, m, n);
    return b->oom ? rx_fail(r, "the pattern's grammar is too large") : 0;
}

static int at_end(const rx *r) { return !*r->p || (*r->p == '$' && !r->p[1]); }

static int alts(rx *r, int rule) {
    for (;;) {
        ckv_gb_begin(r->b);
        while (!at_end(r) && *r->p != '|' && *r->p != ')')
            if (atom(r)) return -1;
        ckv_gb_end(r->b, rule);
        if (*r->p != '|') return 0;
        r->p++;
    }
}

/* The pattern's string content into the open alternative: 0, or -1 with err set. */
int ckv_gb_pattern(ckv_gb *b, const char *pattern, char *err, size_t errlen) {
    rx r = {.b = b, .src = pattern, .p = pattern, .err = err, .errlen = errlen};
    int start = *r.p == '^';
    if (start) r.p++;
    int rule = ckv_gb_rule(b);
    if (alts(&r, rule)) return -1;
    if (*r.p == ')') return rx_fail(&r, "')' without a group");
    int end = *r.p == '$';
    /* around an unanchored pattern: any string content (a string body, so the mask's plain-token
     * shortcut applies there) */
    if (!start) ckv_gb_str(b, 0, CKV_GRAMMAR_UNBOUNDED);
    ckv_gb_ref(b, rule);
    if (!end) ckv_gb_str(b, 0, CKV_GRAMMAR_UNBOUNDED);
    return b->oom ? rx_fail(&r, "the pattern's grammar is too large") : 0;
}
