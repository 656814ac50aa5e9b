/* grammar_rules.c - building a grammar: the rule builder (alternatives assembled in a scratch stack,
 * since a nested group's rule is built while its parent's alternative is still open, then flattened
 * rule by rule), the JSON building blocks, and the grammar constructors of grammar.h. It does not
 * compile schemas or GBNF text (grammar_schema.c, grammar_gbnf.c) or match (grammar_match.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_impl.h"

static int grow(void **p, uint32_t *cap, uint32_t need, size_t size) {
    if (need <= *cap) return 0;
    uint32_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return -1;
    *p = q;
    *cap = c;
    return 0;
}

void ckv_gb_init(ckv_gb *b, ckv_grammar *g) {
    memset(b, 0, sizeof *b);
    memset(g, 0, sizeof *g);
    b->g = g;
    b->r_value = b->r_object = b->r_array = b->r_string = b->r_number = b->r_integer = b->r_sp = b->r_utf8 = -1;
}

void ckv_gb_free(ckv_gb *b) {
    free(b->pair_rule);
    free(b->pair_start);
    free(b->scr);
    b->pair_rule = b->pair_start = NULL;
    b->scr = NULL;
}

int ckv_gb_rule(ckv_gb *b) { return b->g->n_rules++; }

void ckv_gb_begin(ckv_gb *b) {
    if (b->n_open >= CKV_GB_MAX_OPEN) {
        b->oom = 1; /* reported as too deep by finish */
        return;
    }
    b->open[b->n_open++] = b->n_scr;
}

void ckv_gb_el(ckv_gb *b, ckv_grammar_el e) {
    if (b->oom || b->n_scr >= CKV_GB_MAX_ELS || grow((void **)&b->scr, &b->cap_scr, b->n_scr + 1, sizeof *b->scr)) {
        b->oom = 1;
        return;
    }
    b->scr[b->n_scr++] = e;
}

void ckv_gb_end(ckv_gb *b, int rule) {
    if (b->n_open == 0) return;
    uint32_t from = b->open[--b->n_open], n = b->n_scr - from;
    ckv_grammar *g = b->g;
    if (g->n_els + n + 1 > CKV_GB_MAX_ELS || grow((void **)&g->els, &b->cap_els, g->n_els + n + 1, sizeof *g->els) ||
        grow((void **)&b->pair_rule, &b->cap_pairs, b->n_pairs + 1, sizeof(uint32_t))) {
        b->oom = 1;
        b->n_scr = from;
        return;
    }
    uint32_t cap = b->cap_pairs; /* pair_start follows pair_rule's capacity */
    uint32_t *ps = realloc(b->pair_start, (size_t)cap * sizeof(uint32_t));
    if (!ps) {
        b->oom = 1;
        b->n_scr = from;
        return;
    }
    b->pair_start = ps;
    if (n > 0) /* an empty alternative: scr may still be NULL, and memcpy's arguments must not be */
        memcpy(g->els + g->n_els, b->scr + from, (size_t)n * sizeof *g->els);
    b->pair_rule[b->n_pairs] = (uint32_t)rule;
    b->pair_start[b->n_pairs++] = g->n_els;
    g->n_els += n;
    g->els[g->n_els++] = (ckv_grammar_el){.kind = CKV_GEL_END};
    b->n_scr = from;
}

void ckv_gb_byte(ckv_gb *b, uint8_t c) { ckv_gb_el(b, (ckv_grammar_el){.kind = CKV_GEL_BYTE, .byte = c}); }

void ckv_gb_lit(ckv_gb *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) ckv_gb_byte(b, (uint8_t)s[i]);
}

static int class_plain(const uint32_t set[8]) {
    for (int c = 0x20; c < 0xF5; c++) {
        if (c == '"' || c == '\\' || (c >= 0x80 && c < 0xC2)) continue;
        if (set[c >> 5] >> (c & 31) & 1) return 1;
    }
    return 0;
}

void ckv_gb_class(ckv_gb *b, const uint32_t set[8]) {
    ckv_grammar *g = b->g;
    uint32_t cap = (uint32_t)b->cap_classes, cap2 = cap;
    if (grow((void **)&g->classes, &cap, (uint32_t)g->n_classes + 1, sizeof *g->classes) ||
        grow((void **)&g->class_plain, &cap2, (uint32_t)g->n_classes + 1, 1)) {
        b->oom = 1;
        return;
    }
    b->cap_classes = (int)(cap < cap2 ? cap : cap2);
    memcpy(g->classes[g->n_classes], set, sizeof g->classes[0]);
    g->class_plain[g->n_classes] = (uint8_t)class_plain(set);
    ckv_gb_el(b, (ckv_grammar_el){.kind = CKV_GEL_CLASS, .arg = (uint32_t)g->n_classes++});
}

void ckv_gb_range(ckv_gb *b, uint8_t lo, uint8_t hi) {
    uint32_t set[8] = {0};
    for (int c = lo; c <= hi; c++) set[c >> 5] |= 1u << (c & 31);
    ckv_gb_class(b, set);
}

void ckv_gb_ref(ckv_gb *b, int rule) { ckv_gb_el(b, (ckv_grammar_el){.kind = CKV_GEL_REF, .arg = (uint32_t)rule}); }

void ckv_gb_str(ckv_gb *b, uint32_t lo, uint32_t hi) {
    ckv_gb_el(b, (ckv_grammar_el){.kind = CKV_GEL_STR, .arg = lo, .hi = hi});
}

void ckv_gb_empty(ckv_gb *b, int rule) {
    ckv_gb_begin(b);
    ckv_gb_end(b, rule);
}

void ckv_gb_repeat(ckv_gb *b, ckv_grammar_el x, uint32_t m, uint32_t n) {
    for (uint32_t i = 0; i < m && !b->oom; i++) ckv_gb_el(b, x);
    if (n == CKV_GRAMMAR_UNBOUNDED) { /* star ::= x star | "" (a tail call: the stack stays flat) */
        int star = ckv_gb_rule(b);
        ckv_gb_begin(b);
        ckv_gb_el(b, x);
        ckv_gb_ref(b, star);
        ckv_gb_end(b, star);
        ckv_gb_empty(b, star);
        ckv_gb_ref(b, star);
        return;
    }
    if (n <= m) return;
    int next = -1; /* opt_k ::= x opt_{k-1} | "" */
    for (uint32_t k = 0; k < n - m && !b->oom; k++) {
        int r = ckv_gb_rule(b);
        ckv_gb_begin(b);
        ckv_gb_el(b, x);
        if (next >= 0) ckv_gb_ref(b, next);
        ckv_gb_end(b, r);
        ckv_gb_empty(b, r);
        next = r;
    }
    ckv_gb_ref(b, next);
}

ckv_status ckv_gb_finish(ckv_gb *b, char *err, size_t errlen) {
    ckv_grammar *g = b->g;
    if (b->oom) {
        snprintf(err, errlen, "the grammar is too large (over %u elements) or nested deeper than %d", CKV_GB_MAX_ELS, CKV_GB_MAX_OPEN);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "%s", err);
    }
    g->rule_off = calloc((size_t)g->n_rules + 1, sizeof(uint32_t));
    g->alts = malloc(sizeof(uint32_t) * (b->n_pairs ? b->n_pairs : 1));
    if (!g->rule_off || !g->alts) {
        snprintf(err, errlen, "out of memory for the grammar");
        return ckv_error(CKV_STATUS_ERR_NOMEM, "%s", err);
    }
    for (uint32_t i = 0; i < b->n_pairs; i++) g->rule_off[b->pair_rule[i] + 1]++;
    for (int r = 0; r < g->n_rules; r++) g->rule_off[r + 1] += g->rule_off[r];
    uint32_t *fill = malloc(sizeof(uint32_t) * ((size_t)g->n_rules + 1));
    if (!fill) {
        snprintf(err, errlen, "out of memory for the grammar");
        return ckv_error(CKV_STATUS_ERR_NOMEM, "%s", err);
    }
    memcpy(fill, g->rule_off, sizeof(uint32_t) * ((size_t)g->n_rules + 1));
    for (uint32_t i = 0; i < b->n_pairs; i++) g->alts[fill[b->pair_rule[i]]++] = b->pair_start[i]; /* order kept */
    free(fill);
    for (int r = 0; r < g->n_rules; r++)
        if (g->rule_off[r] == g->rule_off[r + 1]) {
            snprintf(err, errlen, "grammar rule %d has no alternative", r);
            return ckv_error(CKV_STATUS_ERR_ARG, "%s", err);
        }
    return CKV_STATUS_OK;
}

/* nullable rules first, then the rules each can enter before its first byte, depth first */
int ckv_gb_left_recursive(const ckv_gb *b) {
    const ckv_grammar *g = b->g;
    int n = g->n_rules, found = -1;
    uint8_t *nullable = calloc((size_t)n + 1, 1), *color = calloc((size_t)n + 1, 1);
    int *stack = malloc(sizeof(int) * ((size_t)n + 1)), *edge = malloc(sizeof(int) * ((size_t)n + 1));
    uint32_t *off = calloc((size_t)n + 2, sizeof(uint32_t)), *by = malloc(sizeof(uint32_t) * ((size_t)b->n_pairs + 1));
    if (!nullable || !color || !stack || !edge || !off || !by) {
        free(nullable), free(color), free(stack), free(edge), free(off), free(by);
        return -1;
    }
    for (uint32_t p = 0; p < b->n_pairs; p++) off[b->pair_rule[p] + 2]++; /* alternatives grouped by rule */
    for (int r = 0; r < n; r++) off[r + 2] += off[r + 1];
    for (uint32_t p = 0; p < b->n_pairs; p++) by[off[b->pair_rule[p] + 1]++] = b->pair_start[p];
    for (int changed = 1; changed;) { /* nullable: some alternative of only nullable elements */
        changed = 0;
        for (uint32_t p = 0; p < b->n_pairs; p++) {
            if (nullable[b->pair_rule[p]]) continue;
            const ckv_grammar_el *e = g->els + b->pair_start[p];
            while (e->kind == CKV_GEL_REF ? nullable[e->arg] : e->kind == CKV_GEL_STR ? e->arg == 0 : 0) e++;
            if (e->kind == CKV_GEL_END) nullable[b->pair_rule[p]] = 1, changed = 1;
        }
    }
    /* depth-first over "r enters s before a byte" edges; grey on the stack means a cycle */
    for (int r0 = 0; r0 < n && found < 0; r0++) {
        if (color[r0]) continue;
        int sp = 0;
        stack[sp] = r0, edge[sp] = 0, color[r0] = 1;
        while (sp >= 0 && found < 0) {
            int r = stack[sp], k = edge[sp]++, target = -1, seen = 0;
            for (uint32_t p = off[r]; p < off[r + 1] && target < 0; p++) { /* the k-th leading reference of r */
                for (const ckv_grammar_el *e = g->els + by[p]; e->kind != CKV_GEL_END; e++) {
                    if (e->kind == CKV_GEL_REF && seen++ == k) {
                        target = (int)e->arg;
                        break;
                    }
                    if (!(e->kind == CKV_GEL_REF ? nullable[e->arg] : e->kind == CKV_GEL_STR && e->arg == 0)) break;
                }
            }
            if (target < 0) {
                color[r] = 2, sp--;
            } else if (color[target] == 1) {
                found = target;
            } else if (!color[target]) {
                sp++;
                stack[sp] = target, edge[sp] = 0, color[target] = 1;
            }
        }
    }
    free(nullable), free(color), free(stack), free(edge), free(off), free(by);
    return found;
}

/* ---- JSON building blocks ---------------------------------------------------------------------- */

int ckv_gb_sp(ckv_gb *b) {
    if (b->r_sp >= 0) return b->r_sp;
    b->r_sp = ckv_gb_rule(b);
    ckv_gb_empty(b, b->r_sp);
    ckv_gb_begin(b);
    ckv_gb_byte(b, ' ');
    ckv_gb_end(b, b->r_sp);
    return b->r_sp;
}

int ckv_gb_json_string(ckv_gb *b) {
    if (b->r_string >= 0) return b->r_string;
    b->r_string = ckv_gb_rule(b);
    ckv_gb_begin(b);
    ckv_gb_byte(b, '"');
    ckv_gb_str(b, 0, CKV_GRAMMAR_UNBOUNDED);
    ckv_gb_byte(b, '"');
    ckv_gb_end(b, b->r_string);
    return b->r_string;
}

static ckv_grammar_el class_el(ckv_gb *b, uint8_t lo, uint8_t hi) {
    ckv_gb_begin(b); /* made in a throwaway alternative, kept as an element to repeat */
    ckv_gb_range(b, lo, hi);
    ckv_grammar_el e = b->scr[b->n_scr - 1];
    b->n_scr = b->open[--b->n_open];
    return e;
}

/* "-"? ("0" | [1-9][0-9]{0,15}) into the open alternative */
static void int_part(ckv_gb *b) {
    int minus = ckv_gb_rule(b), digits = ckv_gb_rule(b);
    ckv_gb_empty(b, minus);
    ckv_gb_begin(b);
    ckv_gb_byte(b, '-');
    ckv_gb_end(b, minus);
    ckv_gb_begin(b);
    ckv_gb_byte(b, '0');
    ckv_gb_end(b, digits);
    ckv_gb_begin(b);
    ckv_gb_range(b, '1', '9');
    ckv_gb_repeat(b, class_el(b, '0', '9'), 0, 15);
    ckv_gb_end(b, digits);
    ckv_gb_ref(b, minus);
    ckv_gb_ref(b, digits);
}

int ckv_gb_json_integer(ckv_gb *b) {
    if (b->r_integer >= 0) return b->r_integer;
    b->r_integer = ckv_gb_rule(b);
    ckv_gb_begin(b);
    int_part(b);
    ckv_gb_end(b, b->r_integer);
    return b->r_integer;
}

int ckv_gb_json_number(ckv_gb *b) {
    if (b->r_number >= 0) return b->r_number;
    int r = b->r_number = ckv_gb_rule(b), frac = ckv_gb_rule(b), ex = ckv_gb_rule(b), sign = ckv_gb_rule(b);
    ckv_grammar_el digit = class_el(b, '0', '9');
    ckv_gb_empty(b, frac);
    ckv_gb_begin(b);
    ckv_gb_byte(b, '.');
    ckv_gb_repeat(b, digit, 1, 16);
    ckv_gb_end(b, frac);
    ckv_gb_empty(b, sign);
    ckv_gb_begin(b);
    ckv_gb_byte(b, '-');
    ckv_gb_end(b, sign);
    ckv_gb_begin(b);
    ckv_gb_byte(b, '+');
    ckv_gb_end(b, sign);
    ckv_gb_empty(b, ex);
    ckv_gb_begin(b);
    uint32_t e[8] = {0};
    e['e' >> 5] |= 1u << ('e' & 31);
    e['E' >> 5] |= 1u << ('E' & 31);
    ckv_gb_class(b, e);
    ckv_gb_ref(b, sign);
    ckv_gb_repeat(b, digit, 1, 3);
    ckv_gb_end(b, ex);
    ckv_gb_begin(b);
    int_part(b);
    ckv_gb_ref(b, frac);
    ckv_gb_ref(b, ex);
    ckv_gb_end(b, r);
    return r;
}

/* open "x" ("," sp x)* close, or open close */
static void json_list(ckv_gb *b, int rule, char open, char close, int item) {
    int more = ckv_gb_rule(b);
    ckv_gb_begin(b);
    ckv_gb_byte(b, (uint8_t)open);
    ckv_gb_byte(b, (uint8_t)close);
    ckv_gb_end(b, rule);
    ckv_gb_begin(b);
    ckv_gb_byte(b, (uint8_t)open);
    ckv_gb_ref(b, item);
    ckv_gb_ref(b, more);
    ckv_gb_byte(b, (uint8_t)close);
    ckv_gb_end(b, rule);
    ckv_gb_empty(b, more); /* more ::= "," sp item more | "" */
    ckv_gb_begin(b);
    ckv_gb_byte(b, ',');
    ckv_gb_ref(b, ckv_gb_sp(b));
    ckv_gb_ref(b, item);
    ckv_gb_ref(b, more);
    ckv_gb_end(b, more);
}

int ckv_gb_json_member(ckv_gb *b, int value_rule) {
    const int member = ckv_gb_rule(b);
    ckv_gb_begin(b);
    ckv_gb_ref(b, ckv_gb_json_string(b));
    ckv_gb_byte(b, ':');
    ckv_gb_ref(b, ckv_gb_sp(b));
    ckv_gb_ref(b, value_rule);
    ckv_gb_end(b, member);
    return member;
}

int ckv_gb_json_object(ckv_gb *b) {
    if (b->r_object >= 0) return b->r_object;
    b->r_object = ckv_gb_rule(b);
    json_list(b, b->r_object, '{', '}', ckv_gb_json_member(b, ckv_gb_json_value(b)));
    return b->r_object;
}

int ckv_gb_json_value(ckv_gb *b) {
    if (b->r_value >= 0) return b->r_value;
    int v = b->r_value = ckv_gb_rule(b);
    b->r_array = ckv_gb_rule(b);
    json_list(b, b->r_array, '[', ']', v);
    int parts[4] = {ckv_gb_json_object(b), b->r_array, ckv_gb_json_string(b), ckv_gb_json_number(b)};
    for (int i = 0; i < 4; i++) {
        ckv_gb_begin(b);
        ckv_gb_ref(b, parts[i]);
        ckv_gb_end(b, v);
    }
    static const char *const lits[3] = {"true", "false", "null"};
    for (int i = 0; i < 3; i++) {
        ckv_gb_begin(b);
        ckv_gb_lit(b, lits[i], strlen(lits[i]));
        ckv_gb_end(b, v);
    }
    return v;
}

int ckv_gb_utf8_multibyte(ckv_gb *b) {
    if (b->r_utf8 >= 0) return b->r_utf8;
    int r = b->r_utf8 = ckv_gb_rule(b);
    /* RFC 3629's well-formed sequences: lead range, second-byte range, continuation bytes after it */
    static const uint8_t seq[8][5] = {{0xC2, 0xDF, 0x80, 0xBF, 0}, {0xE0, 0xE0, 0xA0, 0xBF, 1}, {0xE1, 0xEC, 0x80, 0xBF, 1},
                                      {0xED, 0xED, 0x80, 0x9F, 1}, {0xEE, 0xEF, 0x80, 0xBF, 1}, {0xF0, 0xF0, 0x90, 0xBF, 2},
                                      {0xF1, 0xF3, 0x80, 0xBF, 2}, {0xF4, 0xF4, 0x80, 0x8F, 2}};
    for (int k = 0; k < 8; k++) {
        ckv_gb_begin(b);
        ckv_gb_range(b, seq[k][0], seq[k][1]);
        ckv_gb_range(b, seq[k][2], seq[k][3]);
        for (int i = 0; i < seq[k][4]; i++) ckv_gb_range(b, 0x80, 0xBF);
        ckv_gb_end(b, r);
    }
    return r;
}

/* ---- constructors ------------------------------------------------------------------------------- */

static ckv_status done(ckv_gb *b, int failed, char *err, size_t errlen) {
    ckv_status st = failed ? ckv_error(CKV_STATUS_ERR_ARG, "%s", err) : ckv_gb_finish(b, err, errlen);
    ckv_gb_free(b);
    return st;
}

ckv_status ckv_grammar_init_parts(ckv_grammar *g, const ckv_grammar_part *parts, int n_parts, char *err, size_t errlen) {
    ckv_gb b;
    ckv_gb_init(&b, g);
    int root = ckv_gb_rule(&b), failed = 0;
    ckv_gb_begin(&b);
    for (int i = 0; i < n_parts && !failed; i++) {
        if (parts[i].literal) ckv_gb_lit(&b, parts[i].literal, strlen(parts[i].literal));
        else if (!parts[i].schema) ckv_gb_ref(&b, ckv_gb_json_value(&b));
        else failed = ckv_gb_schema(&b, parts[i].schema, parts[i].strict, err, errlen) != 0;
    }
    ckv_gb_end(&b, root);
    if (!failed && !b.oom && ckv_gb_left_recursive(&b) >= 0) {
        snprintf(err, errlen, "$: a schema reaches itself through '$ref' / 'anyOf' before writing anything (left recursion)");
        failed = 1;
    }
    return done(&b, failed, err, errlen);
}

ckv_status ckv_grammar_init_schema(ckv_grammar *g, const cJSON *schema, int strict, char *err, size_t errlen) {
    ckv_grammar_part p = {.schema = schema, .strict = strict};
    if (!schema) {
        ckv_gb b;
        ckv_gb_init(&b, g);
        snprintf(err, errlen, "$: the schema is missing");
        return done(&b, 1, err, errlen);
    }
    return ckv_grammar_init_parts(g, &p, 1, err, errlen);
}

ckv_status ckv_grammar_init_json_object(ckv_grammar *g) {
    ckv_gb b;
    char err[128];
    ckv_gb_init(&b, g);
    int root = ckv_gb_rule(&b);
    ckv_gb_begin(&b);
    ckv_gb_ref(&b, ckv_gb_json_object(&b));
    ckv_gb_end(&b, root);
    return done(&b, 0, err, sizeof err);
}

ckv_status ckv_grammar_init_gbnf(ckv_grammar *g, const char *text, char *err, size_t errlen) {
    ckv_gb b;
    ckv_gb_init(&b, g);
    int root = ckv_gb_rule(&b);
    int failed = ckv_gb_gbnf(&b, text, root, 1, err, errlen) != 0;
    return done(&b, failed, err, errlen);
}

void ckv_grammar_free(ckv_grammar *g) {
    if (!g) return;
    free(g->els);
    free(g->alts);
    free(g->rule_off);
    free(g->classes);
    free(g->class_plain);
    memset(g, 0, sizeof *g);
}
