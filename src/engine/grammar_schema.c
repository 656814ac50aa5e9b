/* grammar_schema.c - a JSON schema compiled into grammar rules (see ckv_grammar_init_schema): type
 * (and lists of types), properties in the schema's order with required / optional ones and
 * additionalProperties, items / prefixItems with minItems / maxItems, strings with minLength /
 * maxLength, a pattern (grammar_pattern.c) or the formats date, time, date-time and uuid, integers with minimum / maximum /
 * exclusiveMinimum / exclusiveMaximum (digit-range rules, as regular-expression generators for
 * numeric ranges build them), enum, const, anyOf, oneOf whose
 * alternatives cannot overlap, allOf of one schema, $ref to local definitions (recursive ones too:
 * the matcher is a pushdown automaton) and nullable. Annotations (title, description, default, ...)
 * are ignored; any other keyword is refused naming it and its JSON path. Compact output: at most one
 * space after ':' and ','. It does not match (grammar_match.c) or parse GBNF (grammar_gbnf.c). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/grammar_impl.h"

#define MAX_DEPTH 64    /* schema nesting compiled */
#define MAX_MEMO 256    /* $ref targets */
#define MAX_COUNT 4096  /* minItems / maxItems expanded into rules */

typedef struct {
    ckv_gb *b;
    const cJSON *root;
    int strict;
    char *err;
    size_t errlen;
    char path[512];
    const cJSON *memo_node[MAX_MEMO];
    int memo_rule[MAX_MEMO];
    int n_memo;
    int depth;
} sc;

static int fail(sc *c, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    snprintf(c->err, c->errlen, "%s: %s", c->path, msg);
    return -1;
}

/* Appends ".a" + b (or ".a[i]") to the path; returns the length to restore. */
static size_t path_push(sc *c, const char *a, const char *b) {
    size_t n = strlen(c->path);
    snprintf(c->path + n, sizeof c->path - n, ".%s%s", a, b);
    return n;
}
static size_t path_push_i(sc *c, const char *a, int i) {
    size_t n = strlen(c->path);
    snprintf(c->path + n, sizeof c->path - n, ".%s[%d]", a, i);
    return n;
}

static const char *const annotations[] = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", NULL};
static const char *const constraints[] = {"type", "properties", "required", "additionalProperties", "items", "prefixItems",
                                          "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "minItems", "maxItems",
                                          "minLength", "maxLength", "format", "nullable", "minimum", "maximum",
                                          "exclusiveMinimum", "exclusiveMaximum", "pattern", NULL};

static int listed(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

static int compile(sc *c, const cJSON *s, int *rule);
static int compile_into(sc *c, const cJSON *s, int rule);

/* A literal JSON value (enum, const) as one alternative of rule. */
static int literal_alt(sc *c, const cJSON *v, int rule) {
    char *txt = cJSON_PrintUnformatted(v);
    if (!txt) return fail(c, "out of memory");
    ckv_gb_begin(c->b);
    ckv_gb_lit(c->b, txt, strlen(txt));
    ckv_gb_end(c->b, rule);
    free(txt);
    return 0;
}

/* "name" as JSON writes it */
static void key_lit(ckv_gb *b, const char *name) {
    ckv_gb_byte(b, '"');
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) {
        char esc[8];
        if (*p == '"' || *p == '\\') {
            ckv_gb_byte(b, '\\');
            ckv_gb_byte(b, *p);
        } else if (*p < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", *p);
            ckv_gb_lit(b, esc, 6);
        } else {
            ckv_gb_byte(b, *p);
        }
    }
    ckv_gb_byte(b, '"');
}

/* A count keyword (dflt when absent); limit: the largest supported (item counts become rules). */
static int get_count(sc *c, const cJSON *s, const char *k, uint32_t dflt, double limit, uint32_t *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, k);
    *out = dflt;
    if (!v) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != (double)(long long)v->valuedouble)
        return fail(c, "'%s' must be a non-negative integer", k);
    if (v->valuedouble > limit) return fail(c, "'%s' over %.0f is not supported", k, limit);
    *out = (uint32_t)v->valuedouble;
    return 0;
}

/* ---- objects ----------------------------------------------------------------------------------- */

static int object_alt(sc *c, const cJSON *s, int rule) {
    ckv_gb *b = c->b;
    const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
    const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
    const cJSON *addl = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, "'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return fail(c, "'required' must be an array of property names");
    if (addl && !cJSON_IsBool(addl) && !cJSON_IsObject(addl)) return fail(c, "'additionalProperties' must be a boolean or a schema");
    if (c->strict && !cJSON_IsFalse(addl)) return fail(c, "strict: 'additionalProperties' must be false");
    const cJSON *r;
    cJSON_ArrayForEach(r, req) {
        if (!cJSON_IsString(r)) return fail(c, "'required' must be an array of property names");
        if (!cJSON_GetObjectItemCaseSensitive(props, r->valuestring))
            return fail(c, "'required' lists '%.60s', which is not in 'properties'", r->valuestring);
    }
    int n = props ? cJSON_GetArraySize(props) : 0;
    /* extra keys: when the schema allows them (absent additionalProperties with listed properties:
     * none are generated, which every such value also satisfies) */
    int extra_rule = -1;
    if (cJSON_IsTrue(addl) || (!addl && n == 0)) {
        extra_rule = ckv_gb_json_value(b);
    } else if (cJSON_IsObject(addl)) {
        size_t at = path_push(c, "additionalProperties", "");
        if (compile(c, addl, &extra_rule)) return -1;
        c->path[at] = '\0';
    }
    int *h = malloc(sizeof(int) * (size_t)(2 * n + 2)), *t = h ? h + n + 1 : NULL;
    if (!h) return fail(c, "out of memory");
    for (int i = 0; i <= n; i++) h[i] = ckv_gb_rule(b), t[i] = ckv_gb_rule(b);
    int i = 0, rc = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, props) {
        int required = 0;
        cJSON_ArrayForEach(r, req) required |= cJSON_IsString(r) && !strcmp(r->valuestring, p->string);
        if (c->strict && !required) {
            rc = fail(c, "strict: property '%.60s' must be listed in 'required'", p->string);
            break;
        }
        size_t at = path_push(c, "properties.", p->string);
        int value;
        rc = compile(c, p, &value);
        c->path[at] = '\0';
        if (rc) break;
        int kv = ckv_gb_rule(b); /* kv ::= "name" ":" sp value */
        ckv_gb_begin(b);
        key_lit(b, p->string);
        ckv_gb_byte(b, ':');
        ckv_gb_ref(b, ckv_gb_sp(b));
        ckv_gb_ref(b, value);
        ckv_gb_end(b, kv);
        ckv_gb_begin(b); /* H_i ::= kv T_{i+1} [| H_{i+1}]: nothing written yet */
        ckv_gb_ref(b, kv);
        ckv_gb_ref(b, t[i + 1]);
        ckv_gb_end(b, h[i]);
        ckv_gb_begin(b); /* T_i ::= "," sp kv T_{i+1} [| T_{i+1}]: something written */
        ckv_gb_byte(b, ',');
        ckv_gb_ref(b, ckv_gb_sp(b));
        ckv_gb_ref(b, kv);
        ckv_gb_ref(b, t[i + 1]);
        ckv_gb_end(b, t[i]);
        if (!required) {
            ckv_gb_begin(b);
            ckv_gb_ref(b, h[i + 1]);
            ckv_gb_end(b, h[i]);
            ckv_gb_begin(b);
            ckv_gb_ref(b, t[i + 1]);
            ckv_gb_end(b, t[i]);
        }
        i++;
    }
    if (rc == 0) {
        ckv_gb_empty(b, h[n]);
        ckv_gb_empty(b, t[n]);
        if (extra_rule >= 0) { /* extra ::= string ":" sp value; H_n ::= extra T_n; T_n ::= "," sp extra T_n */
            int extra = ckv_gb_json_member(b, extra_rule);
            ckv_gb_begin(b);
            ckv_gb_ref(b, extra);
            ckv_gb_ref(b, t[n]);
            ckv_gb_end(b, h[n]);
            ckv_gb_begin(b);
            ckv_gb_byte(b, ',');
            ckv_gb_ref(b, ckv_gb_sp(b));
            ckv_gb_ref(b, extra);
            ckv_gb_ref(b, t[n]);
            ckv_gb_end(b, t[n]);
        }
        ckv_gb_begin(b);
        ckv_gb_byte(b, '{');
        ckv_gb_ref(b, h[0]);
        ckv_gb_byte(b, '}');
        ckv_gb_end(b, rule);
    }
    free(h);
    return rc;
}

/* ---- arrays ------------------------------------------------------------------------------------ */

static int array_alt(sc *c, const cJSON *s, int rule) {
    ckv_gb *b = c->b;
    const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(s, "prefixItems");
    if (prefix && !cJSON_IsArray(prefix)) return fail(c, "'prefixItems' must be an array of schemas");
    if (items && !cJSON_IsBool(items) && !cJSON_IsObject(items)) return fail(c, "'items' must be a schema");
    uint32_t lo, hi;
    if (get_count(c, s, "minItems", 0, MAX_COUNT, &lo) || get_count(c, s, "maxItems", CKV_GRAMMAR_UNBOUNDED, MAX_COUNT, &hi)) return -1;
    int np = prefix ? cJSON_GetArraySize(prefix) : 0;
    if (cJSON_IsFalse(items) && (hi == CKV_GRAMMAR_UNBOUNDED || hi > (uint32_t)np)) hi = (uint32_t)np;
    if (hi < lo) return fail(c, "'minItems' %u is over the most items the schema allows (%u)", lo, hi);
    int *el = malloc(sizeof(int) * (size_t)(np + 1));
    if (!el) return fail(c, "out of memory");
    int rc = 0, k = 0;
    const cJSON *p;
    cJSON_ArrayForEach(p, prefix) {
        size_t at = path_push_i(c, "prefixItems", k);
        rc = compile(c, p, &el[k++]);
        c->path[at] = '\0';
        if (rc) break;
    }
    if (rc == 0 && !cJSON_IsFalse(items)) {
        size_t at = path_push(c, "items", "");
        if (items) rc = compile(c, items, &el[np]);
        else el[np] = ckv_gb_json_value(b);
        c->path[at] = '\0';
    }
    if (rc) {
        free(el);
        return -1;
    }
    /* A_i: i items written. A_i ::= "" (i >= lo) | sep el_i A_{i+1} (i < hi); past the prefix and the
     * minimum an unbounded list loops on itself. */
    uint32_t L = hi != CKV_GRAMMAR_UNBOUNDED ? hi : (uint32_t)np > lo ? (uint32_t)np : lo;
    int first = ckv_gb_rule(b), prev = first;
    for (uint32_t i = 0; i <= L; i++) {
        int a = prev, next = i < L ? ckv_gb_rule(b) : a;
        if (i >= lo) ckv_gb_empty(b, a);
        if (i < L || hi == CKV_GRAMMAR_UNBOUNDED) {
            ckv_gb_begin(b);
            if (i > 0) {
                ckv_gb_byte(b, ',');
                ckv_gb_ref(b, ckv_gb_sp(b));
            }
            ckv_gb_ref(b, el[i < (uint32_t)np ? i : (uint32_t)np]);
            if (i == L && L == 0) { /* the loop needs a separator from now on: A_0 ::= el more */
                int more = ckv_gb_rule(b);
                ckv_gb_ref(b, more);
                ckv_gb_end(b, a);
                ckv_gb_empty(b, more);
                ckv_gb_begin(b);
                ckv_gb_byte(b, ',');
                ckv_gb_ref(b, ckv_gb_sp(b));
                ckv_gb_ref(b, el[np]);
                ckv_gb_ref(b, more);
                ckv_gb_end(b, more);
            } else {
                ckv_gb_ref(b, next);
                ckv_gb_end(b, a);
            }
        }
        prev = next;
    }
    free(el);
    ckv_gb_begin(b);
    ckv_gb_byte(b, '[');
    ckv_gb_ref(b, first);
    ckv_gb_byte(b, ']');
    ckv_gb_end(b, rule);
    return 0;
}

/* ---- strings ----------------------------------------------------------------------------------- */

static const char *const formats[][2] = {
    {"date", "root ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01])"},
    {"time", "root ::= ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
             "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
    {"date-time", "root ::= [0-9]{4} \"-\" (\"0\" [1-9] | \"1\" [0-2]) \"-\" (\"0\" [1-9] | [12] [0-9] | \"3\" [01]) \"T\" "
                  "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] (\".\" [0-9]{1,6})? "
                  "(\"Z\" | [+-] ([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9])"},
    {"uuid", "root ::= h{8} \"-\" h{4} \"-\" h{4} \"-\" h{4} \"-\" h{12}\nh ::= [0-9a-f]"},
};

static int string_alt(sc *c, const cJSON *s, int rule) {
    ckv_gb *b = c->b;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
    uint32_t lo, hi;
    if (get_count(c, s, "minLength", 0, 0xFFFFFE, &lo) || get_count(c, s, "maxLength", CKV_GRAMMAR_UNBOUNDED, 0xFFFFFE, &hi))
        return -1;
    if (hi < lo) return fail(c, "'maxLength' %u is under 'minLength' %u", hi, lo);
    int body = -1;
    const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    if (pat) {
        if (!cJSON_IsString(pat)) return fail(c, "'pattern' must be a string");
        if (fmt || cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
            return fail(c, "'pattern' with 'format', 'minLength' or 'maxLength' is not supported");
        body = ckv_gb_rule(b);
        char e[160];
        ckv_gb_begin(b);
        int rc = ckv_gb_pattern(b, pat->valuestring, e, sizeof e);
        ckv_gb_end(b, body);
        if (rc) return fail(c, "%s", e);
    } else if (fmt) {
        if (!cJSON_IsString(fmt)) return fail(c, "'format' must be a string");
        const char *g = NULL;
        for (size_t i = 0; i < sizeof formats / sizeof *formats; i++)
            if (!strcmp(formats[i][0], fmt->valuestring)) g = formats[i][1];
        if (!g) return fail(c, "unsupported format '%.40s' (supported: date, time, date-time, uuid)", fmt->valuestring);
        if (cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength"))
            return fail(c, "'format' with 'minLength' or 'maxLength' is not supported");
        body = ckv_gb_rule(b);
        char e[128];
        if (ckv_gb_gbnf(b, g, body, 0, e, sizeof e)) return fail(c, "format '%s': %s", fmt->valuestring, e);
    }
    ckv_gb_begin(b);
    ckv_gb_byte(b, '"');
    if (body >= 0) ckv_gb_ref(b, body);
    else ckv_gb_str(b, lo, hi);
    ckv_gb_byte(b, '"');
    ckv_gb_end(b, rule);
    return 0;
}

/* ---- integer ranges ----------------------------------------------------------------------------- */

#define INT_LIMIT 9999999999999999ll /* 16 digits: the integer rule's own bound */

static int all_of(const char *p, int n, char c) {
    for (int i = 0; i < n; i++)
        if (p[i] != c) return 0;
    return 1;
}

/* The digit strings of exactly length n from lo to hi (same length, lo <= hi) as a rule: a first digit
 * strictly between lo's and hi's takes any tail; lo's and hi's own first digits recurse on one side
 * only, so the rules grow with n squared. */
static int digit_range(ckv_gb *b, const char *lo, const char *hi, int n) {
    int r = ckv_gb_rule(b);
    ckv_gb_begin(b);
    if (all_of(lo, n, '0') && all_of(hi, n, '9')) { /* [0-9]{n} */
        ckv_gb_range(b, '0', '9');
        ckv_grammar_el digit = b->scr[--b->n_scr];
        ckv_gb_repeat(b, digit, (uint32_t)n, (uint32_t)n);
        ckv_gb_end(b, r);
        return r;
    }
    if (n == 1 || lo[0] == hi[0]) {
        ckv_gb_range(b, (uint8_t)lo[0], (uint8_t)hi[0]);
        if (n > 1) ckv_gb_ref(b, digit_range(b, lo + 1, hi + 1, n - 1));
        ckv_gb_end(b, r);
        return r;
    }
    char nines[20], zeros[20];
    memset(nines, '9', (size_t)n), memset(zeros, '0', (size_t)n);
    int lo_whole = all_of(lo + 1, n - 1, '0'), hi_whole = all_of(hi + 1, n - 1, '9');
    char first = (char)(lo_whole ? lo[0] : lo[0] + 1), last = (char)(hi_whole ? hi[0] : hi[0] - 1);
    if (first <= last) { /* a first digit whose every tail is in range */
        ckv_gb_range(b, (uint8_t)first, (uint8_t)last);
        ckv_gb_ref(b, digit_range(b, zeros, nines, n - 1));
        ckv_gb_end(b, r);
    } else {
        b->n_scr = b->open[--b->n_open]; /* nothing in between */
    }
    if (!lo_whole) { /* lo[0], then lo's tail .. 9s */
        ckv_gb_begin(b);
        ckv_gb_byte(b, (uint8_t)lo[0]);
        ckv_gb_ref(b, digit_range(b, lo + 1, nines, n - 1));
        ckv_gb_end(b, r);
    }
    if (!hi_whole) { /* hi[0], then 0s .. hi's tail */
        ckv_gb_begin(b);
        ckv_gb_byte(b, (uint8_t)hi[0]);
        ckv_gb_ref(b, digit_range(b, zeros, hi + 1, n - 1));
        ckv_gb_end(b, r);
    }
    return r;
}

/* Alternatives of rule: the decimal forms (no leading zeros) of a .. z, 0 <= a <= z. */
static void nonneg_range(ckv_gb *b, int rule, long long a, long long z) {
    long long p = 1;
    for (int n = 1; n <= 16 && a <= z; n++, p *= 10) {
        long long lo = n == 1 ? 0 : p, hi = p * 10 - 1;
        if (hi < a) continue;
        if (lo < a) lo = a;
        if (hi > z) hi = z;
        if (lo > hi) continue;
        char sl[24], sh[24];
        snprintf(sl, sizeof sl, "%lld", lo);
        snprintf(sh, sizeof sh, "%lld", hi);
        ckv_gb_begin(b);
        ckv_gb_ref(b, digit_range(b, sl, sh, n));
        ckv_gb_end(b, rule);
    }
}

static int bound(sc *c, const cJSON *s, const char *k, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(s, k);
    if (!x) return 0;
    if (!cJSON_IsNumber(x)) return fail(c, "'%s' must be a number", k);
    *v = x->valuedouble;
    return 1;
}

/* An integer alternative of rule within the schema's bounds (absent: the integer rule). */
static int integer_alt(sc *c, const cJSON *s, int rule) {
    ckv_gb *b = c->b;
    double v = 0;
    long long lo = -INT_LIMIT, hi = INT_LIMIT;
    int any = 0, k;
    if ((k = bound(c, s, "minimum", &v)) < 0) return -1;
    if (k && (any = 1) && ceil(v) > (double)lo) lo = v > (double)INT_LIMIT ? INT_LIMIT + 1 : (long long)ceil(v);
    if ((k = bound(c, s, "exclusiveMinimum", &v)) < 0) return -1;
    if (k && (any = 1) && floor(v) + 1 > (double)lo) lo = v >= (double)INT_LIMIT ? INT_LIMIT + 1 : (long long)floor(v) + 1;
    if ((k = bound(c, s, "maximum", &v)) < 0) return -1;
    if (k && (any = 1) && floor(v) < (double)hi) hi = v < (double)-INT_LIMIT ? -INT_LIMIT - 1 : (long long)floor(v);
    if ((k = bound(c, s, "exclusiveMaximum", &v)) < 0) return -1;
    if (k && (any = 1) && ceil(v) - 1 < (double)hi) hi = v <= (double)-INT_LIMIT ? -INT_LIMIT - 1 : (long long)ceil(v) - 1;
    if (!any) {
        ckv_gb_begin(b);
        ckv_gb_ref(b, ckv_gb_json_integer(b));
        ckv_gb_end(b, rule);
        return 0;
    }
    if (lo > hi) return fail(c, "no integer of at most 16 digits satisfies the bounds");
    if (hi >= 0) nonneg_range(b, rule, lo > 0 ? lo : 0, hi);
    if (lo < 0) { /* "-" and a magnitude from max(1, -hi) to -lo */
        int mag = ckv_gb_rule(b);
        nonneg_range(b, mag, hi < 0 ? -hi : 1, -lo);
        ckv_gb_begin(b);
        ckv_gb_byte(b, '-');
        ckv_gb_ref(b, mag);
        ckv_gb_end(b, rule);
    }
    return 0;
}

/* ---- types, combinations, references --------------------------------------------------------------- */

enum { T_OBJ = 1, T_ARR = 2, T_STR = 4, T_INT = 8, T_FRAC = 16, T_BOOL = 32, T_NULL = 64, T_ANY = 127 };

static const cJSON *resolve(sc *c, const char *ref) {
    if (ref[0] != '#') return NULL;
    const cJSON *at = c->root;
    const char *p = ref + 1;
    while (*p == '/' && at) {
        char key[256];
        size_t n = 0;
        for (p++; *p && *p != '/' && n + 1 < sizeof key; p++) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) key[n++] = p[1] == '0' ? '~' : '/', p++;
            else key[n++] = *p;
        }
        key[n] = '\0';
        at = cJSON_IsArray(at) ? cJSON_GetArrayItem(at, atoi(key)) : cJSON_GetObjectItemCaseSensitive(at, key);
    }
    return *p ? NULL : at;
}

static int value_types(const cJSON *v) {
    if (cJSON_IsObject(v)) return T_OBJ;
    if (cJSON_IsArray(v)) return T_ARR;
    if (cJSON_IsString(v)) return T_STR;
    if (cJSON_IsBool(v)) return T_BOOL;
    if (cJSON_IsNull(v)) return T_NULL;
    return v->valuedouble == (double)(long long)v->valuedouble ? T_INT : T_FRAC;
}

/* The JSON types a schema's values may have (T_ANY when unsure). */
static int types_of(sc *c, const cJSON *s, int depth) {
    if (!cJSON_IsObject(s) || depth > 16) return T_ANY;
    const cJSON *v, *x;
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "$ref")) && cJSON_IsString(v)) return types_of(c, resolve(c, v->valuestring), depth + 1);
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "const"))) return value_types(v);
    int m = 0;
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "enum")) && cJSON_IsArray(v)) {
        cJSON_ArrayForEach(x, v) m |= value_types(x);
        return m;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "anyOf")) || (v = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) {
        cJSON_ArrayForEach(x, v) m |= types_of(c, x, depth + 1);
        return m;
    }
    static const char *const names[] = {"object", "array", "string", "integer", "number", "boolean", "null"};
    static const int bits[] = {T_OBJ, T_ARR, T_STR, T_INT, T_INT | T_FRAC, T_BOOL, T_NULL};
    v = cJSON_GetObjectItemCaseSensitive(s, "type");
    const cJSON *one = v;
    if (cJSON_IsArray(v)) one = v->child;
    for (; one; one = cJSON_IsArray(v) ? one->next : NULL)
        for (int k = 0; k < 7; k++)
            if (cJSON_IsString(one) && !strcmp(one->valuestring, names[k])) m |= bits[k];
    if (m && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable"))) m |= T_NULL;
    return m ? m : T_ANY;
}

/* One alternative of rule per type name. */
static int type_alt(sc *c, const cJSON *s, const char *type, int rule) {
    ckv_gb *b = c->b;
    if (!strcmp(type, "object")) return object_alt(c, s, rule);
    if (!strcmp(type, "array")) return array_alt(c, s, rule);
    if (!strcmp(type, "string")) return string_alt(c, s, rule);
    if (!strcmp(type, "integer")) return integer_alt(c, s, rule);
    if (!strcmp(type, "number")) {
        static const char *const nb[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
        for (int i = 0; i < 4; i++)
            if (cJSON_GetObjectItemCaseSensitive(s, nb[i]))
                return fail(c, "'%s' is supported on integers, not on 'number'", nb[i]);
        ckv_gb_begin(b);
        ckv_gb_ref(b, ckv_gb_json_number(b));
        ckv_gb_end(b, rule);
        return 0;
    }
    static const char *const lits[] = {"true", "false", "null"};
    for (int i = type[0] == 'n' ? 2 : 0; i < (!strcmp(type, "boolean") ? 2 : !strcmp(type, "null") ? 3 : 0); i++) {
        ckv_gb_begin(b);
        ckv_gb_lit(b, lits[i], strlen(lits[i]));
        ckv_gb_end(b, rule);
    }
    if (strcmp(type, "boolean") && strcmp(type, "null")) return fail(c, "unknown type '%.40s'", type);
    return 0;
}

/* Only annotations beside keyword k (it does not combine with constraints here). */
static int alone(sc *c, const cJSON *s, const char *k) {
    const cJSON *it;
    cJSON_ArrayForEach(it, s) if (strcmp(it->string, k) && !listed(annotations, it->string) && strcmp(it->string, "nullable"))
        return fail(c, "'%s' beside '%.40s' is not supported", k, it->string);
    return 0;
}

static int compile_into(sc *c, const cJSON *s, int rule) {
    ckv_gb *b = c->b;
    if (cJSON_IsBool(s)) {
        if (cJSON_IsFalse(s)) return fail(c, "the schema false matches no value");
        ckv_gb_begin(b);
        ckv_gb_ref(b, ckv_gb_json_value(b));
        ckv_gb_end(b, rule);
        return 0;
    }
    if (!cJSON_IsObject(s)) return fail(c, "a schema must be an object or a boolean");
    if (++c->depth > MAX_DEPTH) return fail(c, "schemas nested deeper than %d", MAX_DEPTH);
    const cJSON *it, *v;
    cJSON_ArrayForEach(it, s) if (!listed(annotations, it->string) && !listed(constraints, it->string))
        return fail(c, "unsupported keyword '%.60s'", it->string);
    int rc = 0;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "nullable"))) {
        ckv_gb_begin(b);
        ckv_gb_lit(b, "null", 4);
        ckv_gb_end(b, rule);
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) {
        if (!cJSON_IsString(v)) return fail(c, "'$ref' must be a string");
        if (alone(c, s, "$ref")) return -1;
        const cJSON *target = resolve(c, v->valuestring);
        if (!target) return fail(c, "'$ref' '%.80s' does not resolve (only '#/...' pointers into this schema)", v->valuestring);
        int r = -1;
        for (int i = 0; i < c->n_memo; i++)
            if (c->memo_node[i] == target) r = c->memo_rule[i];
        if (r < 0) {
            if (c->n_memo >= MAX_MEMO) return fail(c, "more than %d '$ref' targets", MAX_MEMO);
            r = ckv_gb_rule(b);
            c->memo_node[c->n_memo] = target;
            c->memo_rule[c->n_memo++] = r;
            char saved[sizeof c->path];
            memcpy(saved, c->path, sizeof saved);
            snprintf(c->path, sizeof c->path, "%s", v->valuestring);
            rc = compile_into(c, target, r);
            if (rc) return -1; /* the message names the target's path */
            memcpy(c->path, saved, sizeof saved);
        }
        ckv_gb_begin(b);
        ckv_gb_ref(b, r);
        ckv_gb_end(b, rule);
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "const"))) {
        if (alone(c, s, "const")) return -1;
        rc = literal_alt(c, v, rule);
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
        cJSON_ArrayForEach(it, s) if (strcmp(it->string, "enum") && strcmp(it->string, "type") && !listed(annotations, it->string) &&
                                      strcmp(it->string, "nullable")) return fail(c, "'enum' beside '%.40s' is not supported", it->string);
        (void)ty; /* the values themselves decide: type only restates them */
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0) return fail(c, "'enum' must be a non-empty array");
        cJSON_ArrayForEach(it, v) if ((rc = literal_alt(c, it, rule))) break;
    } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "anyOf")) || (v = cJSON_GetObjectItemCaseSensitive(s, "oneOf")) ||
               (v = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
        const char *k = v->string;
        if (alone(c, s, k)) return -1;
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) == 0) return fail(c, "'%s' must be a non-empty array of schemas", k);
        if (!strcmp(k, "allOf") && cJSON_GetArraySize(v) != 1) return fail(c, "'allOf' of more than one schema is not supported");
        if (!strcmp(k, "oneOf")) { /* exactly one must match: only alternatives whose types cannot overlap */
            int i = 0, seen = 0;
            cJSON_ArrayForEach(it, v) {
                int m = types_of(c, it, 0);
                if (m & seen) return fail(c, "'oneOf' alternative %d may match a value another matches (overlapping types): use 'anyOf'", i);
                seen |= m, i++;
            }
        }
        int i = 0;
        cJSON_ArrayForEach(it, v) {
            size_t at = path_push_i(c, k, i++);
            int r;
            rc = compile(c, it, &r);
            c->path[at] = '\0';
            if (rc) return -1;
            ckv_gb_begin(b);
            ckv_gb_ref(b, r);
            ckv_gb_end(b, rule);
        }
    } else {
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(s, "type");
        if (ty && !cJSON_IsString(ty) && !(cJSON_IsArray(ty) && cJSON_GetArraySize(ty) > 0))
            return fail(c, "'type' must be a type name or a non-empty list of them");
        if (cJSON_IsString(ty)) {
            rc = type_alt(c, s, ty->valuestring, rule);
        } else if (ty) {
            cJSON_ArrayForEach(it, ty) {
                if (!cJSON_IsString(it)) return fail(c, "'type' must be a type name or a non-empty list of them");
                if ((rc = type_alt(c, s, it->valuestring, rule))) break;
            }
        } else { /* no type: what the other keywords imply, else any value */
            const char *implied = NULL;
            if (cJSON_GetObjectItemCaseSensitive(s, "properties") || cJSON_GetObjectItemCaseSensitive(s, "required") ||
                cJSON_GetObjectItemCaseSensitive(s, "additionalProperties"))
                implied = "object";
            else if (cJSON_GetObjectItemCaseSensitive(s, "items") || cJSON_GetObjectItemCaseSensitive(s, "prefixItems") ||
                     cJSON_GetObjectItemCaseSensitive(s, "minItems") || cJSON_GetObjectItemCaseSensitive(s, "maxItems"))
                implied = "array";
            else if (cJSON_GetObjectItemCaseSensitive(s, "minLength") || cJSON_GetObjectItemCaseSensitive(s, "maxLength") ||
                     cJSON_GetObjectItemCaseSensitive(s, "format") || cJSON_GetObjectItemCaseSensitive(s, "pattern"))
                implied = "string";
            else if (cJSON_GetObjectItemCaseSensitive(s, "minimum") || cJSON_GetObjectItemCaseSensitive(s, "maximum") ||
                     cJSON_GetObjectItemCaseSensitive(s, "exclusiveMinimum") || cJSON_GetObjectItemCaseSensitive(s, "exclusiveMaximum"))
                implied = "integer"; /* bounded numbers: integers satisfy them */
            if (implied) {
                rc = type_alt(c, s, implied, rule);
            } else {
                ckv_gb_begin(b);
                ckv_gb_ref(b, ckv_gb_json_value(b));
                ckv_gb_end(b, rule);
            }
        }
    }
    c->depth--;
    return rc;
}

static int compile(sc *c, const cJSON *s, int *rule) {
    *rule = ckv_gb_rule(c->b);
    return compile_into(c, s, *rule);
}

int ckv_gb_schema(ckv_gb *b, const cJSON *schema, int strict, char *err, size_t errlen) {
    sc *c = calloc(1, sizeof *c);
    if (!c) {
        snprintf(err, errlen, "out of memory for the schema");
        return -1;
    }
    c->b = b;
    c->root = schema;
    c->strict = strict;
    c->err = err;
    c->errlen = errlen;
    snprintf(c->path, sizeof c->path, "$");
    int rc = 0;
    const cJSON *ty = cJSON_IsObject(schema) ? cJSON_GetObjectItemCaseSensitive(schema, "type") : NULL;
    if (strict && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "object")))
        rc = fail(c, "strict: the root schema must be of type 'object'");
    int r = -1;
    if (rc == 0) rc = compile(c, schema, &r);
    if (rc == 0) ckv_gb_ref(b, r);
    free(c);
    return rc;
}
