/* grammar_gbnf.c - a GBNF-style grammar text compiled into grammar rules (see ckv_grammar_init_gbnf):
 * rules "name ::= alternatives" (a rule runs until the next "name ::=" or the end; the root rule is
 * "root"), alternation |, grouping ( ), literals "..." with \n \r \t \\ \" \xHH \uHHHH escapes,
 * classes [a-z0-9_] and [^...] (ranges of ASCII; single characters beyond it), . (any character),
 * repetition ? * + {m} {m,} {m,n} on one item, # comments. Errors name the line and column. It does
 * not match (grammar_match.c). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_impl.h"

#define MAX_NAMES 1024
#define MAX_REPEAT 1024

typedef struct {
    char name[64];
    int rule;
    int defined;
    size_t ref_at; /* where it was first used (undefined rules are reported there) */
} gname;

typedef struct {
    ckv_gb *b;
    const char *src, *p;
    char *err;
    size_t errlen;
    gname *names;
    int n_names;
    int failed;
    int depth;
} gp;

static int fail_at(gp *g, const char *at, const char *fmt, ...) {
    if (g->failed) return -1;
    int line = 1, col = 1;
    for (const char *q = g->src; q < at && *q; q++) {
        if (*q == '\n') line++, col = 1;
        else col++;
    }
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(g->err, g->errlen, "line %d, column %d: %s", line, col, msg);
    g->failed = 1;
    return -1;
}

static void skip_space(gp *g) {
    for (;;) {
        while (*g->p == ' ' || *g->p == '\t' || *g->p == '\n' || *g->p == '\r') g->p++;
        if (*g->p != '#') return;
        while (*g->p && *g->p != '\n') g->p++;
    }
}

static int is_name(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }

static size_t name_len(const char *p) {
    size_t n = 0;
    while (is_name(p[n])) n++;
    return n;
}

/* p starts "name ::=" (a new rule) */
static int rule_start(const char *p) {
    size_t n = name_len(p);
    if (!n) return 0;
    p += n;
    while (*p == ' ' || *p == '\t') p++;
    return !strncmp(p, "::=", 3);
}

static int name_rule(gp *g, const char *at, size_t n, int root_rule) {
    if (n >= sizeof g->names[0].name) return fail_at(g, at, "rule name longer than %zu characters", sizeof g->names[0].name - 1);
    for (int i = 0; i < g->n_names; i++)
        if (strlen(g->names[i].name) == n && !strncmp(g->names[i].name, at, n)) return i;
    if (g->n_names >= MAX_NAMES) return fail_at(g, at, "more than %d rules", MAX_NAMES);
    gname *x = &g->names[g->n_names];
    memcpy(x->name, at, n);
    x->name[n] = '\0';
    x->rule = n == 4 && !strncmp(at, "root", 4) ? root_rule : ckv_gb_rule(g->b);
    x->defined = 0;
    x->ref_at = (size_t)(at - g->src);
    return g->n_names++;
}

static int hexval(char c) {
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One character of a literal or class (escapes decoded) as a code point; -1 on error. */
static long read_char(gp *g) {
    const char *at = g->p;
    unsigned char c = (unsigned char)*g->p;
    if (!c) return fail_at(g, at, "unterminated literal or class");
    if (c == '\\') {
        char e = g->p[1];
        g->p += 2;
        switch (e) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': return e;
        case 'x': case 'u': case 'U': {
            int len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            long v = 0;
            for (int i = 0; i < len; i++) {
                int h = hexval(*g->p);
                if (h < 0) return fail_at(g, g->p, "\\%c needs %d hex digits", e, len);
                v = v * 16 + h;
                g->p++;
            }
            if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return fail_at(g, at, "escape is not a Unicode scalar value");
            return v;
        }
        default: return fail_at(g, at, "unknown escape '\\%c'", e ? e : ' ');
        }
    }
    /* UTF-8 */
    int len = c < 0x80 ? 1 : c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
    if (!len) return fail_at(g, at, "invalid UTF-8");
    long v = len == 1 ? c : c & (0x3F >> (len - 1));
    for (int i = 1; i < len; i++) {
        unsigned char x = (unsigned char)g->p[i];
        if ((x & 0xC0) != 0x80) return fail_at(g, at, "invalid UTF-8");
        v = v << 6 | (x & 0x3F);
    }
    g->p += len;
    return v;
}

static int utf8_put(long v, char *out) {
    if (v < 0x80) return out[0] = (char)v, 1;
    if (v < 0x800) return out[0] = (char)(0xC0 | v >> 6), out[1] = (char)(0x80 | (v & 0x3F)), 2;
    if (v < 0x10000) return out[0] = (char)(0xE0 | v >> 12), out[1] = (char)(0x80 | (v >> 6 & 0x3F)), out[2] = (char)(0x80 | (v & 0x3F)), 3;
    out[0] = (char)(0xF0 | v >> 18), out[1] = (char)(0x80 | (v >> 12 & 0x3F)), out[2] = (char)(0x80 | (v >> 6 & 0x3F));
    out[3] = (char)(0x80 | (v & 0x3F));
    return 4;
}

static int next_is_postfix(const char *p) { return *p == '?' || *p == '*' || *p == '+' || *p == '{'; }

/* A literal: its bytes inline, or a rule of them when a repetition follows. */
static int literal(gp *g) {
    const char *at = g->p++;
    char buf[1024];
    size_t n = 0;
    while (*g->p != '"') {
        long v = read_char(g);
        if (v < 0) return -1;
        if (n + 4 > sizeof buf) return fail_at(g, at, "literal longer than %zu bytes", sizeof buf - 4);
        n += (size_t)utf8_put(v, buf + n);
    }
    g->p++;
    if (n == 0) return fail_at(g, at, "empty literal");
    if (n == 1 || !next_is_postfix(g->p)) {
        ckv_gb_lit(g->b, buf, n);
        return 0;
    }
    int r = ckv_gb_rule(g->b);
    ckv_gb_begin(g->b);
    ckv_gb_lit(g->b, buf, n);
    ckv_gb_end(g->b, r);
    ckv_gb_ref(g->b, r);
    return 0;
}

static int char_class(gp *g) {
    const char *at = g->p++;
    int neg = *g->p == '^';
    if (neg) g->p++;
    uint32_t set[8] = {0};
    long wide[64];
    int n_wide = 0;
    while (*g->p != ']') {
        const char *c_at = g->p;
        long lo = read_char(g), hi = lo;
        if (lo < 0) return -1;
        if (g->p[0] == '-' && g->p[1] != ']') {
            g->p++;
            if ((hi = read_char(g)) < 0) return -1;
            if (hi < lo) return fail_at(g, c_at, "range end is before its start");
        }
        if (hi >= 0x80) {
            if (neg || hi != lo) return fail_at(g, c_at, "non-ASCII ranges and negated non-ASCII characters are not supported");
            if (n_wide >= 64) return fail_at(g, c_at, "more than 64 non-ASCII characters in a class");
            wide[n_wide++] = lo;
            continue;
        }
        for (long c = lo; c <= hi; c++) set[c >> 5] |= 1u << (c & 31);
    }
    g->p++;
    if (neg) {
        for (int i = 0; i < 4; i++) set[i] = ~set[i];
        set[0] &= ~1u; /* never NUL */
        for (int i = 4; i < 8; i++) set[i] = 0;
    }
    int any = 0;
    for (int i = 0; i < 8; i++) any |= set[i] != 0;
    if (!neg && n_wide == 0) {
        if (!any) return fail_at(g, at, "empty class");
        ckv_gb_class(g->b, set);
        return 0;
    }
    int r = ckv_gb_rule(g->b); /* ASCII part | each wide character | (negated) any multi-byte character */
    if (any) {
        ckv_gb_begin(g->b);
        ckv_gb_class(g->b, set);
        ckv_gb_end(g->b, r);
    }
    for (int i = 0; i < n_wide; i++) {
        char u[4];
        ckv_gb_begin(g->b);
        ckv_gb_lit(g->b, u, (size_t)utf8_put(wide[i], u));
        ckv_gb_end(g->b, r);
    }
    if (neg) {
        ckv_gb_begin(g->b);
        ckv_gb_ref(g->b, ckv_gb_utf8_multibyte(g->b));
        ckv_gb_end(g->b, r);
    }
    ckv_gb_ref(g->b, r);
    return 0;
}

static int alternatives(gp *g, int rule, int root_rule);

static int read_uint(gp *g, uint32_t *out) {
    const char *at = g->p;
    unsigned long v = 0;
    if (*g->p < '0' || *g->p > '9') return fail_at(g, at, "expected a number");
    while (*g->p >= '0' && *g->p <= '9') {
        v = v * 10 + (unsigned long)(*g->p++ - '0');
        if (v > MAX_REPEAT) return fail_at(g, at, "repetition count over %d", MAX_REPEAT);
    }
    *out = (uint32_t)v;
    return 0;
}

/* One item and its repetition into the open alternative. */
static int item(gp *g, int root_rule) {
    ckv_gb *b = g->b;
    const char *at = g->p;
    uint32_t before = b->n_scr;
    char c = *g->p;
    if (c == '"') {
        if (literal(g)) return -1;
    } else if (c == '[') {
        if (char_class(g)) return -1;
    } else if (c == '.') {
        g->p++;
        uint32_t set[8] = {0};
        for (int i = 0; i < 4; i++) set[i] = 0xFFFFFFFFu;
        set[0] &= ~1u;
        int r = ckv_gb_rule(b);
        ckv_gb_begin(b);
        ckv_gb_class(b, set);
        ckv_gb_end(b, r);
        ckv_gb_begin(b);
        ckv_gb_ref(b, ckv_gb_utf8_multibyte(b));
        ckv_gb_end(b, r);
        ckv_gb_ref(b, r);
    } else if (c == '(') {
        if (++g->depth > 64) return fail_at(g, at, "groups nested deeper than 64");
        g->p++;
        int r = ckv_gb_rule(b);
        if (alternatives(g, r, root_rule)) return -1;
        if (*g->p != ')') return fail_at(g, g->p, "expected ')' to close the group opened at column %d", (int)(at - g->src) + 1);
        g->p++;
        g->depth--;
        ckv_gb_ref(b, r);
    } else if (is_name(c)) {
        size_t n = name_len(g->p);
        int k = name_rule(g, g->p, n, root_rule);
        if (k < 0) return -1;
        g->p += n;
        ckv_gb_ref(b, g->names[k].rule);
    } else {
        return fail_at(g, at, "unexpected '%c'", c);
    }
    if (b->oom) return fail_at(g, at, "the grammar is too large (over %u elements)", CKV_GB_MAX_ELS);
    if (!next_is_postfix(g->p)) return 0;
    if (b->n_scr != before + 1) return fail_at(g, g->p, "nothing to repeat");
    ckv_grammar_el x = b->scr[--b->n_scr];
    uint32_t m = 0, n = CKV_GRAMMAR_UNBOUNDED;
    const char *op = g->p++;
    if (*op == '?') n = 1;
    else if (*op == '+') m = 1;
    else if (*op == '{') {
        if (read_uint(g, &m)) return -1;
        n = m;
        if (*g->p == ',') {
            g->p++;
            n = CKV_GRAMMAR_UNBOUNDED;
            if (*g->p != '}' && read_uint(g, &n)) return -1;
        }
        if (*g->p != '}') return fail_at(g, g->p, "expected '}' to end the repetition");
        g->p++;
        if (n < m) return fail_at(g, op, "repetition {%u,%u}: the maximum is under the minimum", m, n);
    }
    ckv_gb_repeat(b, x, m, n);
    if (b->oom) return fail_at(g, op, "the grammar is too large (over %u elements)", CKV_GB_MAX_ELS);
    if (next_is_postfix(g->p)) return fail_at(g, g->p, "a repetition of a repetition (group it)");
    return 0;
}

static int alternatives(gp *g, int rule, int root_rule) {
    for (;;) {
        ckv_gb_begin(g->b);
        for (;;) {
            skip_space(g);
            char c = *g->p;
            if (!c || c == '|' || c == ')' || rule_start(g->p)) break;
            if (item(g, root_rule)) return -1;
        }
        ckv_gb_end(g->b, rule);
        if (*g->p != '|') return 0;
        g->p++;
    }
}

int ckv_gb_gbnf(ckv_gb *b, const char *text, int root_rule, int check_left, char *err, size_t errlen) {
    gp g = {.b = b, .src = text, .p = text, .err = err, .errlen = errlen};
    g.names = calloc(MAX_NAMES, sizeof *g.names);
    if (!g.names) {
        snprintf(err, errlen, "out of memory for the grammar");
        return -1;
    }
    int rc = 0;
    skip_space(&g);
    if (!*g.p) rc = fail_at(&g, g.p, "empty grammar");
    while (rc == 0 && *g.p) {
        const char *at = g.p;
        size_t n = name_len(g.p);
        if (!rule_start(g.p)) {
            rc = fail_at(&g, at, n ? "expected '::=' after the rule name" : "expected a rule name");
            break;
        }
        int k = name_rule(&g, g.p, n, root_rule);
        if (k < 0 || g.names[k].defined) {
            rc = k < 0 ? -1 : fail_at(&g, at, "rule '%s' is defined twice", g.names[k].name);
            break;
        }
        g.names[k].defined = 1;
        g.p = strstr(g.p, "::=") + 3;
        if (alternatives(&g, g.names[k].rule, root_rule)) rc = -1;
        else if (*g.p == ')') rc = fail_at(&g, g.p, "')' without a group to close");
        else if (*g.p == '|') rc = fail_at(&g, g.p, "unexpected '|'");
        skip_space(&g);
    }
    for (int i = 0; rc == 0 && i < g.n_names; i++)
        if (!g.names[i].defined) rc = fail_at(&g, g.src + g.names[i].ref_at, "rule '%s' is not defined", g.names[i].name);
    int has_root = 0;
    for (int i = 0; i < g.n_names; i++) has_root |= g.names[i].rule == root_rule && g.names[i].defined;
    if (rc == 0 && !has_root) rc = fail_at(&g, g.src, "no rule 'root'");
    int lr = rc == 0 && check_left ? ckv_gb_left_recursive(b) : -1;
    for (int i = 0; lr >= 0 && i < g.n_names; i++)
        if (g.names[i].rule == lr) rc = fail_at(&g, g.src + g.names[i].ref_at, "rule '%s' is left-recursive (it can reach itself before reading a character)", g.names[i].name);
    if (lr >= 0 && rc == 0) rc = fail_at(&g, g.src, "a group or repetition is left-recursive");
    free(g.names);
    return rc;
}
