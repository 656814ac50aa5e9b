/* test_grammar.c - constrained decoding (engine/grammar.h): json_object accepts valid objects and
 * refuses everything else at the first wrong byte; JSON schemas compiled into grammars accept and
 * refuse documents as the schema says (properties in order, required / optional, additionalProperties,
 * arrays with counts and prefixItems, string lengths and formats, enum, const, anyOf, oneOf, $ref with
 * recursion, nullable); unsupported keywords and broken strict rules are refused naming the keyword or
 * rule and its path; GBNF texts parse (or fail naming line and column) and match; a literal-schema-
 * literal sequence (the tool-call wrapper) matches; the vocabulary mask of the fixture tokenizer equals
 * simulating every token at every step; eos only where complete. With CKV_GRAMMAR_BENCH set to model
 * paths (colon separated) it prints the mask's cost per step on their vocabularies for json_object, a
 * nested schema and a schema of patterns and an integer range. */
#define _POSIX_C_SOURCE 200809L
#include <time.h>

#include "ckv_test.h"
#include "core/timer.h"
#include "engine/grammar.h"
#include "engine/text.h"

/* 1: the whole text is accepted and complete; 0: refused somewhere; 2: accepted but incomplete */
static int run(const ckv_grammar *g, const char *text) {
    ckv_grammar_matcher m;
    if (ckv_grammar_matcher_init(&m, g, NULL) != CKV_STATUS_OK) return -1;
    int ok = ckv_grammar_matcher_accept_bytes(&m, (const uint8_t *)text, strlen(text));
    int r = !ok ? 0 : ckv_grammar_matcher_complete(&m) ? 1 : 2;
    ckv_grammar_matcher_free(&m);
    return r;
}

static cJSON *parse(const char *json) {
    cJSON *j = cJSON_Parse(json);
    CHECK_MSG(j != NULL, "test schema does not parse: %s", json);
    return j;
}

/* A schema's verdicts: docs[i] accepted and complete when want[i], else refused or incomplete. */
static void schema_case(const char *schema, int strict, const char *const *docs, const int *want, int n) {
    cJSON *s = parse(schema);
    ckv_grammar g;
    char err[300] = "";
    ckv_status st = ckv_grammar_init_schema(&g, s, strict, err, sizeof err);
    CHECK_MSG(st == CKV_STATUS_OK, "schema %s refused: %s", schema, err);
    ckv_error_clear();
    for (int i = 0; st == CKV_STATUS_OK && i < n; i++) {
        int r = run(&g, docs[i]);
        CHECK_MSG((r == 1) == want[i], "schema %s: document %s %s (matcher %d)", schema, docs[i], want[i] ? "refused" : "accepted", r);
    }
    ckv_grammar_free(&g);
    cJSON_Delete(s);
}

static void schema_refused(const char *schema, int strict, const char *needle) {
    cJSON *s = parse(schema);
    ckv_grammar g;
    char err[300] = "";
    ckv_status st = ckv_grammar_init_schema(&g, s, strict, err, sizeof err);
    CHECK_MSG(st != CKV_STATUS_OK, "schema %s (strict %d) accepted, expected a refusal naming %s", schema, strict, needle);
    CHECK_MSG(strstr(err, needle) != NULL, "schema %s: message '%s' does not name '%s'", schema, err, needle);
    ckv_error_clear();
    ckv_grammar_free(&g);
    cJSON_Delete(s);
}

#define N(a) (int)(sizeof a / sizeof *a)

static void schema_tests(void) {
    {
        const char *d[] = {"{\"a\":1}", "{\"a\": -5, \"b\": \"xyz\"}", "{}", "{\"b\":\"x\"}", "{\"a\":1,\"b\":\"wxyz\"}",
                           "{\"b\":\"x\",\"a\":1}", "{\"a\":1.5}", "{\"a\":1,\"c\":2}", "{\"a\":1 }", "{\"a\":01}"};
        const int w[] = {1, 1, 0, 0, 0, 0, 0, 0, 0, 0};
        schema_case("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"string\",\"maxLength\":3}},"
                    "\"required\":[\"a\"]}", 0, d, w, N(d));
    }
    { /* every property optional, extra properties as a schema */
        const char *d[] = {"{}", "{\"y\":true}", "{\"x\":null,\"y\":false}", "{\"x\":null,\"zz\":2}", "{\"zz\":2,\"q\":3}",
                           "{\"zz\":\"s\"}", "{,}", "{\"x\":null,}"};
        const int w[] = {1, 1, 1, 1, 1, 0, 0, 0};
        schema_case("{\"properties\":{\"x\":{\"type\":\"null\"},\"y\":{\"type\":\"boolean\"}},\"additionalProperties\":{\"type\":\"number\"}}",
                    0, d, w, N(d));
    }
    { /* arrays: counts, prefixItems, items false */
        const char *d[] = {"[1]", "[1, 2, 3]", "[]", "[1,2,3,4]", "[1,\"a\"]"};
        const int w[] = {1, 1, 0, 0, 0};
        schema_case("{\"type\":\"array\",\"items\":{\"type\":\"integer\"},\"minItems\":1,\"maxItems\":3}", 0, d, w, N(d));
        const char *d2[] = {"[\"a\",1]", "[\"a\"]", "[\"a\",1,true]", "[1,1]"};
        const int w2[] = {1, 1, 0, 0};
        schema_case("{\"prefixItems\":[{\"type\":\"string\"},{\"type\":\"integer\"}],\"items\":false}", 0, d2, w2, N(d2));
        const char *d3[] = {"[]", "[[]]", "[[],[[]]]", "[1]", "[[],]"};
        const int w3[] = {1, 1, 1, 0, 0};
        schema_case("{\"$defs\":{\"t\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/t\"}}},\"$ref\":\"#/$defs/t\"}", 0, d3, w3, N(d3));
    }
    { /* strings: lengths (characters, escapes and UTF-8 count one), formats */
        const char *d[] = {"\"ab\"", "\"a\\u00e9c\"", "\"\xc3\xa9\xc3\xa9\"", "\"a\"", "\"abcd\"", "\"a\\n\\\"\"", "\"a\x01\""};
        const int w[] = {1, 1, 1, 0, 0, 1, 0};
        schema_case("{\"type\":\"string\",\"minLength\":2,\"maxLength\":3}", 0, d, w, N(d));
        const char *d2[] = {"\"2024-02-29\"", "\"2024-13-01\"", "\"24-01-01\"", "\"2024-01-32\""};
        const int w2[] = {1, 0, 0, 0};
        schema_case("{\"type\":\"string\",\"format\":\"date\"}", 0, d2, w2, N(d2));
        const char *d3[] = {"\"123e4567-e89b-12d3-a456-426614174000\"", "\"123e4567e89b12d3a456426614174000\""};
        const int w3[] = {1, 0};
        schema_case("{\"type\":\"string\",\"format\":\"uuid\"}", 0, d3, w3, N(d3));
        const char *d4[] = {"\"2024-01-01T10:20:30Z\"", "\"2024-01-01T10:20:30.5+02:00\"", "\"2024-01-01 10:20:30Z\""};
        const int w4[] = {1, 1, 0};
        schema_case("{\"type\":\"string\",\"format\":\"date-time\"}", 0, d4, w4, N(d4));
    }
    { /* integer bounds: every value of small ranges, and the edges of large ones */
        static const long long rng[][2] = {{-5, 120}, {0, 9}, {1, 1}, {-1000, -999}, {7, 1999}, {-12, -3}, {95, 305}};
        for (size_t r = 0; r < sizeof rng / sizeof *rng; r++) {
            char sch[160];
            snprintf(sch, sizeof sch, "{\"type\":\"integer\",\"minimum\":%lld,\"maximum\":%lld}", rng[r][0], rng[r][1]);
            cJSON *s = parse(sch);
            ckv_grammar g;
            char err[300];
            CHECK_OK(ckv_grammar_init_schema(&g, s, 0, err, sizeof err));
            int bad = 0;
            for (long long v = -2100; v <= 2100 && bad < 3; v++) {
                char d[32];
                snprintf(d, sizeof d, "%lld", v);
                int want = v >= rng[r][0] && v <= rng[r][1], got = run(&g, d) == 1;
                if (want != got) bad++, fprintf(stderr, "%s: %s %s\n", sch, d, got ? "accepted" : "refused");
            }
            CHECK_MSG(bad == 0 && run(&g, "-0") != 1 && run(&g, "007") != 1, "%s: integers accepted exactly in range", sch);
            ckv_grammar_free(&g);
            cJSON_Delete(s);
        }
        const char *d[] = {"1", "9999999999999999", "0", "-3", "10000000000000000"};
        const int w[] = {1, 1, 0, 0, 0};
        schema_case("{\"type\":\"integer\",\"exclusiveMinimum\":0}", 0, d, w, N(d));
        const char *d2[] = {"-9999999999999999", "-1", "0", "1"};
        const int w2[] = {1, 1, 0, 0};
        schema_case("{\"exclusiveMaximum\":0}", 0, d2, w2, N(d2));
    }
    { /* patterns: anchored or searched, classes, groups, quantifiers; characters as JSON escapes them */
        const char *d[] = {"\"AB-123\"", "\"ab-123\"", "\"AB-12\"", "\"AB-1234\"", "\"XY-000\""};
        const int w[] = {1, 0, 0, 0, 1};
        schema_case("{\"type\":\"string\",\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"}", 0, d, w, N(d));
        const char *d2[] = {"\"xx cat yy\"", "\"cat\"", "\"dog\"", "\"a\\\"cat\\\\\"", "\"\\ncats\""};
        const int w2[] = {1, 1, 0, 1, 1};
        schema_case("{\"pattern\":\"ca(t|r)\"}", 0, d2, w2, N(d2));
        const char *d3[] = {"\"a\\\"b\"", "\"a\\\\b\"", "\"ab\"", "\"a\\u0022b\""};
        const int w3[] = {1, 1, 0, 0};
        schema_case("{\"type\":\"string\",\"pattern\":\"^a[\\\"\\\\\\\\]b$\"}", 0, d3, w3, N(d3));
        const char *d4[] = {"\"\"", "\"ab\"", "\"abab\"", "\"aba\"", "\"x\""};
        const int w4[] = {1, 1, 1, 0, 0};
        schema_case("{\"type\":\"string\",\"pattern\":\"^(?:ab)*?$\"}", 0, d4, w4, N(d4));
    }
    { /* enum, const, anyOf, oneOf, type lists, nullable */
        const char *d[] = {"\"red\"", "3", "null", "\"blue\"", "4"};
        const int w[] = {1, 1, 1, 0, 0};
        schema_case("{\"enum\":[\"red\",3,null]}", 0, d, w, N(d));
        const char *d2[] = {"{\"k\":\"v\"}", "{\"k\":\"w\"}"};
        const int w2[] = {1, 0};
        schema_case("{\"type\":\"object\",\"properties\":{\"k\":{\"const\":\"v\"}},\"required\":[\"k\"],\"additionalProperties\":false}", 1,
                    d2, w2, N(d2));
        const char *d3[] = {"\"s\"", "12", "true", "[1]"};
        const int w3[] = {1, 1, 0, 0};
        schema_case("{\"anyOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", 0, d3, w3, N(d3));
        schema_case("{\"oneOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}", 0, d3, w3, N(d3));
        const char *d4[] = {"\"s\"", "null", "1", "-2.5e3", "1.", "1e"};
        const int w4[] = {1, 1, 0, 0, 0, 0};
        schema_case("{\"type\":[\"string\",\"null\"]}", 0, d4, w4, N(d4));
        const int w5[] = {0, 1, 1, 1, 0, 0};
        schema_case("{\"type\":\"number\",\"nullable\":true}", 0, d4, w5, N(d4));
    }
    { /* strict: every property required, no extra ones; a recursive $ref */
        const char *d[] = {"{\"name\":\"n\",\"kids\":[{\"name\":\"m\",\"kids\":[]}]}", "{\"name\":\"n\"}", "{\"kids\":[],\"name\":\"n\"}"};
        const int w[] = {1, 0, 0};
        schema_case("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#\"}}},"
                    "\"required\":[\"name\",\"kids\"],\"additionalProperties\":false}", 1, d, w, N(d));
    }
    schema_refused("{\"type\":\"object\",\"properties\":{\"age\":{\"type\":\"integer\",\"multipleOf\":2}}}", 0,
                   "$.properties.age: unsupported keyword 'multipleOf'");
    schema_refused("{\"type\":\"number\",\"maximum\":1}", 0, "'maximum' is supported on integers, not on 'number'");
    schema_refused("{\"type\":\"integer\",\"minimum\":5,\"exclusiveMaximum\":5}", 0, "no integer");
    schema_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"additionalProperties\":false}", 1,
                   "strict: property 'a' must be listed in 'required'");
    schema_refused("{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"string\"}},\"required\":[\"a\"]}", 1,
                   "$: strict: 'additionalProperties' must be false");
    schema_refused("{\"type\":\"array\"}", 1, "strict: the root schema must be of type 'object'");
    schema_refused("{\"type\":\"string\",\"pattern\":\"(?=a)b\"}", 0, "$: pattern at offset 1: look-arounds");
    schema_refused("{\"type\":\"string\",\"pattern\":\"(a)\\\\1\"}", 0, "back-references are not supported");
    schema_refused("{\"type\":\"string\",\"pattern\":\"a\",\"maxLength\":3}", 0, "'pattern' with");
    schema_refused("{\"type\":\"string\",\"format\":\"email\"}", 0, "unsupported format 'email'");
    schema_refused("{\"oneOf\":[{\"type\":\"number\"},{\"type\":\"integer\"}]}", 0, "'oneOf' alternative 1");
    schema_refused("{\"items\":{\"$ref\":\"#/$defs/missing\"}}", 0, "$.items: '$ref' '#/$defs/missing' does not resolve");
    schema_refused("{\"allOf\":[{\"type\":\"string\"},{\"maxLength\":2}]}", 0, "'allOf' of more than one");
    schema_refused("{\"type\":\"object\",\"required\":[\"x\"]}", 0, "'required' lists 'x'");
    schema_refused("{\"type\":\"array\",\"minItems\":3,\"maxItems\":2}", 0, "'minItems' 3");
    schema_refused("{\"type\":\"widget\"}", 0, "unknown type 'widget'");
    schema_refused("{\"type\":\"array\",\"maxItems\":100000}", 0, "'maxItems' over 4096 is not supported");
    schema_refused("{\"type\":\"string\",\"maxLength\":-1}", 0, "'maxLength' must be a non-negative integer");
    schema_refused("{\"anyOf\":[{\"$ref\":\"#\"},{\"type\":\"null\"}]}", 0, "left recursion");
}

static void gbnf_tests(void) {
    static const char *text = "# a list of names\n"
                              "root ::= \"[\" name (\", \" name){0,2} \"]\"\n"
                              "name ::= [A-Z] [a-z]* | \"\\u00e9t\\xe9\"\n";
    ckv_grammar g;
    char err[300] = "";
    CHECK_MSG(ckv_grammar_init_gbnf(&g, text, err, sizeof err) == CKV_STATUS_OK, "gbnf refused: %s", err);
    static const char *const docs[] = {"[Ada]", "[Ada, Bo, C]", "[\xc3\xa9t\xc3\xa9]", "[ada]", "[Ada, Bo, C, D]", "[]", "[Ada"};
    static const int want[] = {1, 1, 1, 0, 0, 0, 2};
    for (int i = 0; i < N(docs); i++) {
        int r = run(&g, docs[i]);
        CHECK_MSG(r == want[i], "gbnf: %s gave %d, expected %d", docs[i], r, want[i]);
    }
    ckv_grammar_free(&g);
    /* a grammar that may go on after it is complete, negated classes and . */
    CHECK_MSG(ckv_grammar_init_gbnf(&g, "root ::= [^\\n\"]+ (\"!\" .)?", err, sizeof err) == CKV_STATUS_OK, "gbnf 2 refused: %s", err);
    CHECK_MSG(run(&g, "ab c") == 1 && run(&g, "ab!\xe2\x82\xac") == 1 && run(&g, "a\"") == 0 && run(&g, "") == 2 &&
                  run(&g, "a!\xed\xa0\x80") == 0 && run(&g, "a!\xf0\x9f\x98\x80") == 1,
              "gbnf 2 verdicts");
    ckv_grammar_free(&g);
    static const char *const bad[][2] = {
        {"root ::= \"a\" (\"b\"", "line 1, column 18: expected ')'"},
        {"root ::= x\n", "line 1, column 10: rule 'x' is not defined"},
        {"root ::= \"a\"\nroot ::= \"b\"", "line 2, column 1: rule 'root' is defined twice"},
        {"a ::= \"x\"", "no rule 'root'"},
        {"root ::= [b-a]", "line 1, column 11: range end"},
        {"root ::= \"a\" ??", "line 1, column 14: unexpected '?'"},
        {"root := \"a\"", "line 1, column 1: expected '::='"},
        {"root ::= \"\\q\"", "unknown escape"},
        {"root ::= \"a\"{3,1}", "the maximum is under the minimum"},
        {"root ::= expr\nexpr ::= expr \"+\" t | t\nt ::= [0-9]", "rule 'expr' is left-recursive"},
        {"root ::= a? root \"x\" | \"y\"\na ::= \"q\"", "rule 'root' is left-recursive"},
    };
    for (int i = 0; i < N(bad); i++) {
        err[0] = '\0';
        ckv_status st = ckv_grammar_init_gbnf(&g, bad[i][0], err, sizeof err);
        CHECK_MSG(st != CKV_STATUS_OK && strstr(err, bad[i][1]), "gbnf %s: '%s', expected '%s'", bad[i][0], err, bad[i][1]);
        ckv_error_clear();
        ckv_grammar_free(&g);
    }
    /* repetitions that would expand past the element cap: refused, not allocated */
    size_t cap = 1200 * 12 + 16, o = 0;
    char *big = malloc(cap);
    o += (size_t)snprintf(big, cap, "root ::=");
    for (int i = 0; i < 1200; i++) o += (size_t)snprintf(big + o, cap - o, " \"a\"{1000}");
    err[0] = '\0';
    CHECK_MSG(ckv_grammar_init_gbnf(&g, big, err, sizeof err) != CKV_STATUS_OK && strstr(err, "the grammar is too large"),
              "a grammar of 1.2M elements: '%s'", err);
    ckv_error_clear();
    ckv_grammar_free(&g);
    free(big);
}

static void json_object_tests(void) {
    ckv_grammar g;
    CHECK_OK(ckv_grammar_init_json_object(&g));
    static const char *const valid[] = {
        "{}", "{\"a\": 1}", "{\"a\":[1,2.5,-0.5e+3,0,1E9,-0],\"b\":{\"c\":[]}}", "{\"s\": \"x\\u00e9\\n\\\"\\\\/\\t caf\xc3\xa9\"}",
        "{\"t\": true, \"f\": false, \"n\": null}", "{\"a\": [{\"b\": []}, \"\"]}"};
    for (int i = 0; i < N(valid); i++) CHECK_MSG(run(&g, valid[i]) == 1, "json_object: valid document refused: %s", valid[i]);
    CHECK_MSG(run(&g, "{\"a\": [1, 2") == 2, "json_object: a prefix is accepted and incomplete");
    static const char *const invalid[] = {
        "[1]", "\"x\"", "1", "{\"a\" 1}", "{\"a\":}", "{\"a\": 01}", "{\"a\": tru}", "{,}", "{\"a\":1,}", "{\"a\": \"\x01\"}",
        "{\"a\": 1]", "{\"a\": [1}", "{\"a\": .5}", "{\"a\": 1.}", "{\"a\": 1e}", "{\"a\": \"\\x\"}", "{\"a\": \"\\u12g4\"}",
        "{a: 1}", "{} {}", "{\"a\": 1}}", "{\"a\": nul}", "{\"a\": -}", "{ }", "{\"a\": \"\xff\"}", "{\"a\":  1}",
        "{\"a\": \"\xc3\"}", "{\"a\": \"\xe2\x82\"}", "{\"a\": \"\x80\"}", "{\"a\": 12345678901234567}",
        "{\"a\": \"\xe0\x80\x80\"}", "{\"a\": \"\xed\xa0\x80\"}", "{\"a\": \"\xf4\x90\x80\x80\"}", "{\"a\": \"\xc0\xaf\"}", "{\"a\": \"\\ud83d\\ude00\"}"};
    for (int i = 0; i < N(invalid); i++) CHECK_MSG(run(&g, invalid[i]) != 1, "json_object: invalid document accepted: %s", invalid[i]);
    char deep[CKV_GRAMMAR_MAX_NEST + 32] = "{\"a\":";
    size_t o = strlen(deep);
    for (int i = 0; i < CKV_GRAMMAR_MAX_NEST + 8; i++) deep[o++] = '[';
    deep[o] = '\0';
    CHECK_MSG(run(&g, deep) == 0, "json_object: nesting beyond %d accepted", CKV_GRAMMAR_MAX_NEST);
    ckv_grammar_free(&g);
}

static void parts_tests(void) {
    cJSON *s = parse("{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"],"
                     "\"additionalProperties\":false}");
    ckv_grammar_part parts[3] = {{.literal = "<tool_call>\n{\"name\": \"f\", \"arguments\": "}, {.schema = s, .strict = 1},
                                 {.literal = "}\n</tool_call>"}};
    ckv_grammar g;
    char err[300] = "";
    CHECK_MSG(ckv_grammar_init_parts(&g, parts, 3, err, sizeof err) == CKV_STATUS_OK, "parts refused: %s", err);
    CHECK(run(&g, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>") == 1);
    CHECK(run(&g, "<tool_call>\n{\"name\": \"g\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>") == 0);
    CHECK(run(&g, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>") == 0);
    ckv_grammar_free(&g);
    cJSON_Delete(s);
}

/* The mask against a per-token simulation at every byte boundary of doc (a document of g). */
static void check_mask(const ckv_grammar_vocab *gv, const ckv_grammar *g, const char *doc, const char *what, int finishes) {
    uint8_t *allowed = malloc((size_t)gv->vocab);
    int32_t eos[1] = {2};
    ckv_grammar_matcher m, x;
    CHECK_OK(ckv_grammar_matcher_init(&m, g, gv));
    CHECK_OK(ckv_grammar_matcher_init(&x, g, gv));
    int bad = 0;
    for (const char *p = doc;; p++) {
        int n = ckv_grammar_matcher_mask(&m, eos, 1, allowed);
        int count = 0;
        for (int t = 0; t < gv->vocab && bad < 5; t++) {
            ckv_grammar_matcher_reset(&x); /* x = the state of m: replay the prefix */
            int ok = ckv_grammar_matcher_accept_bytes(&x, (const uint8_t *)doc, (size_t)(p - doc));
            ok = ok && gv->off[t + 1] > gv->off[t] && ckv_grammar_matcher_accept(&x, t);
            if (t == eos[0]) ok = ckv_grammar_matcher_complete(&m);
            count += ok;
            if (ok != allowed[t]) {
                fprintf(stderr, "%s: after %d bytes token %d mask %d, simulation %d\n", what, (int)(p - doc), t, allowed[t], ok);
                bad++;
            }
        }
        CHECK_MSG(n == count, "%s: mask counts %d tokens, simulation %d", what, n, count);
        if (!*p) break;
        CHECK_MSG(ckv_grammar_matcher_accept_bytes(&m, (const uint8_t *)p, 1), "%s: byte %d refused", what, (int)(p - doc));
    }
    CHECK_MSG(bad == 0, "%s: %d mask mismatches", what, bad);
    CHECK_MSG(ckv_grammar_matcher_finished(&m) == finishes, "%s: finished %d, expected %d", what, ckv_grammar_matcher_finished(&m), finishes);
    ckv_grammar_matcher_free(&m);
    ckv_grammar_matcher_free(&x);
    free(allowed);
}

static const char *const nested_schema =
    "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},\"born\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":4},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"},\"zip\":{\"type\":[\"string\",\"null\"]}},"
    "\"required\":[\"city\",\"zip\"],\"additionalProperties\":false},\"alive\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"born\",\"tags\",\"address\",\"alive\"],\"additionalProperties\":false}";
static const char *const nested_doc = "{\"name\": \"Ada Lovelace\", \"born\": 1815, \"tags\": [\"math\", \"poetry\"], "
                                      "\"address\": {\"city\": \"London\", \"zip\": null}, \"alive\": false}";

/* this thread's CPU seconds: the machine may be shared, and preemption is not the mask's cost */
static double cpu_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static const char *const pattern_schema =
    "{\"type\":\"object\",\"properties\":{\"id\":{\"pattern\":\"^[A-Z]{2}-\\\\d{3}$\"},\"note\":{\"pattern\":\"ca(t|r)s?\"},"
    "\"n\":{\"type\":\"integer\",\"minimum\":-40,\"maximum\":125}},\"required\":[\"id\",\"note\",\"n\"],\"additionalProperties\":false}";
static const char *const pattern_doc = "{\"id\": \"AB-123\", \"note\": \"a \\\"cat\\\" here \\u00e9\", \"n\": -12}";

static void bench(const char *path) {
    ckv_tokenizer *bt = NULL;
    if (ckv_text_open_tokenizer(&bt, path) != CKV_STATUS_OK) {
        fprintf(stderr, "CKV_GRAMMAR_BENCH: %s\n", ckv_error_message());
        ckv_test_failures++;
        return;
    }
    int V = ckv_tokenizer_vocab_size(bt);
    ckv_grammar_vocab gv;
    double t0 = ckv_time_now();
    CHECK_OK(ckv_grammar_vocab_init(&gv, bt, V));
    double t_init = ckv_time_now() - t0;
    cJSON *s = parse(nested_schema);
    cJSON *sp = parse(pattern_schema);
    ckv_grammar gs, go, gp;
    char err[300];
    CHECK_OK(ckv_grammar_init_schema(&gs, s, 1, err, sizeof err));
    CHECK_OK(ckv_grammar_init_json_object(&go));
    CHECK_OK(ckv_grammar_init_schema(&gp, sp, 1, err, sizeof err));
    uint8_t *allowed = malloc((size_t)V);
    int32_t eos[1] = {0};
    enum { REPS = 5, MAXS = 160 };
    static double dt[REPS * MAXS];
    for (int k = 0; k < 3; k++) {
        const ckv_grammar *g = k == 0 ? &go : k == 1 ? &gs : &gp;
        const char *doc = k == 2 ? pattern_doc : nested_doc;
        ckv_grammar_matcher m;
        CHECK_OK(ckv_grammar_matcher_init(&m, g, &gv));
        int steps = 0;
        for (int r = 0; r < REPS; r++) { /* the document's every state, five times: median and 90th percentile */
            ckv_grammar_matcher_reset(&m);
            for (const char *p = doc; *p && steps < REPS * MAXS; p++) {
                double t1 = cpu_now();
                ckv_grammar_matcher_mask(&m, eos, 1, allowed);
                dt[steps++] = cpu_now() - t1;
                ckv_grammar_matcher_accept_bytes(&m, (const uint8_t *)p, 1);
            }
        }
        for (int i = 1; i < steps; i++) /* insertion sort: a few hundred values */
            for (int j = i; j > 0 && dt[j] < dt[j - 1]; j--) {
                double x = dt[j];
                dt[j] = dt[j - 1], dt[j - 1] = x;
            }
        printf("grammar mask on %s (%s): vocabulary %d, built in %.1f ms; per step (thread CPU time) median %.0f us, "
               "90th percentile %.0f us, max %.0f us (%d steps)\n",
               path, k == 0 ? "json_object" : k == 1 ? "nested schema" : "patterns, integer range", V, 1e3 * t_init, 1e6 * dt[steps / 2], 1e6 * dt[steps * 9 / 10],
               1e6 * dt[steps - 1], steps);
        ckv_grammar_matcher_free(&m);
    }
    free(allowed);
    ckv_grammar_free(&gs);
    ckv_grammar_free(&gp);
    cJSON_Delete(sp);
    ckv_grammar_free(&go);
    cJSON_Delete(s);
    ckv_grammar_vocab_free(&gv);
    ckv_tokenizer_free(bt);
}

int main(void) {
    json_object_tests();
    schema_tests();
    gbnf_tests();
    parts_tests();

    /* the fixture tokenizer's vocabulary: the mask equals simulating every token */
    ckv_tokenizer *tok = NULL;
    CHECK_OK(ckv_text_open_tokenizer(&tok, CKV_FIXTURES "/models/llama_gqa"));
    if (!tok) return ckv_test_finish("test_grammar");
    ckv_grammar_vocab gv;
    CHECK_OK(ckv_grammar_vocab_init(&gv, tok, ckv_tokenizer_vocab_size(tok)));
    ckv_grammar g;
    CHECK_OK(ckv_grammar_init_json_object(&g));
    check_mask(&gv, &g, "{\"key\": [1, -2.5e3, true, null, \"str\\n\\u00e9 x\"], \"o\": {}}", "json_object", 1);
    ckv_grammar_free(&g);
    cJSON *s = parse(nested_schema);
    char err[300];
    CHECK_OK(ckv_grammar_init_schema(&g, s, 1, err, sizeof err));
    check_mask(&gv, &g, nested_doc, "nested schema", 1);
    ckv_grammar_free(&g);
    cJSON_Delete(s);
    s = parse(pattern_schema);
    CHECK_OK(ckv_grammar_init_schema(&g, s, 1, err, sizeof err));
    check_mask(&gv, &g, pattern_doc, "pattern schema", 1);
    ckv_grammar_free(&g);
    cJSON_Delete(s);
    CHECK_OK(ckv_grammar_init_gbnf(&g, "root ::= \"ab\" [0-9]{1,3} (\" \" [a-z]+)?", err, sizeof err));
    check_mask(&gv, &g, "ab12 xyz", "gbnf", 0);
    ckv_grammar_free(&g);
    ckv_grammar_vocab_free(&gv);
    ckv_tokenizer_free(tok);

    /* the cost per step on real vocabularies (not a CI check: printed for the docs) */
    const char *paths = getenv("CKV_GRAMMAR_BENCH");
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", paths ? paths : "");
    for (char *path = strtok(buf, ":"); path; path = strtok(NULL, ":")) bench(path);
    return ckv_test_finish("test_grammar");
}
