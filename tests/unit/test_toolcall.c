/* test_toolcall.c - the tool-call parser (engine/toolcall.h): Hermes (Qwen2.5) and Mistral answers
 * become text and calls (name, arguments JSON text) as expected, including calls that do not parse
 * (they stay text), calls in another key order, parallel calls, answers cut short and text around
 * calls; and fed in two pieces split at every byte, and byte by byte, the parser reports exactly what
 * it reports for the whole answer (the streaming deltas concatenate to the whole response). */
#include "ckv_test.h"
#include "engine/toolcall.h"

#define MAXC 4
typedef struct {
    char text[512];
    size_t text_len;
    int n;
    char id[MAXC][32], name[MAXC][80], args[MAXC][256];
    size_t args_len[MAXC];
    int bad; /* an event out of order */
} result;

static int on_text(void *c, const char *s, size_t n) {
    result *r = c;
    if (r->text_len + n >= sizeof r->text) return 1;
    memcpy(r->text + r->text_len, s, n);
    r->text[r->text_len += n] = '\0';
    return 0;
}
static int on_call(void *c, int index, const char *id, const char *name) {
    result *r = c;
    if (index != r->n || r->n >= MAXC) return r->bad = 1;
    snprintf(r->id[index], sizeof r->id[index], "%s", id);
    snprintf(r->name[index], sizeof r->name[index], "%s", name);
    r->n++;
    return 0;
}
static int on_args(void *c, int index, const char *s, size_t n) {
    result *r = c;
    if (index != r->n - 1 || r->args_len[index] + n >= sizeof r->args[index]) return r->bad = 1;
    memcpy(r->args[index] + r->args_len[index], s, n);
    r->args[index][r->args_len[index] += n] = '\0';
    return 0;
}

/* Feeds text in pieces cut at cuts[ncut] (ascending offsets). */
static void parse(const char *syntax, const char *text, const size_t *cuts, int ncut, result *r) {
    memset(r, 0, sizeof *r);
    ckv_toolcall_parser p;
    ckv_toolcall_sink k = {r, on_text, on_call, on_args};
    size_t n = strlen(text), at = 0;
    CHECK_OK(ckv_toolcall_parser_init(&p, ckv_toolcall_syntax_find(syntax), n, 42));
    for (int i = 0; i <= ncut; i++) {
        size_t end = i < ncut ? cuts[i] : n;
        CHECK_OK(ckv_toolcall_feed(&p, text + at, end - at, &k));
        at = end;
    }
    int calls = -1;
    CHECK_OK(ckv_toolcall_finish(&p, &k, &calls));
    CHECK(calls == r->n);
    ckv_toolcall_parser_free(&p);
}

static int same(const result *a, const result *b) {
    if (a->n != b->n || a->bad || b->bad || strcmp(a->text, b->text)) return 0;
    for (int i = 0; i < a->n; i++)
        if (strcmp(a->id[i], b->id[i]) || strcmp(a->name[i], b->name[i]) || strcmp(a->args[i], b->args[i])) return 0;
    return 1;
}

/* expect: the text, then name and arguments of each call (NULL ends). */
static void expect(const char *syntax, const char *text, const char *want_text, const char *const *calls) {
    result whole;
    parse(syntax, text, NULL, 0, &whole);
    int nc = 0;
    while (calls[2 * nc]) nc++;
    int ok = !whole.bad && whole.n == nc && !strcmp(whole.text, want_text);
    for (int i = 0; ok && i < nc; i++) ok = !strcmp(whole.name[i], calls[2 * i]) && !strcmp(whole.args[i], calls[2 * i + 1]);
    CHECK_MSG(ok, "%s %.60s: got text '%s' and %d calls (first: %s %s), want text '%s' and %d calls", syntax, text, whole.text,
              whole.n, whole.n ? whole.name[0] : "-", whole.n ? whole.args[0] : "-", want_text, nc);
    for (int i = 0; i < whole.n; i++) CHECK_MSG(!strncmp(whole.id[i], "call_", 5) && strlen(whole.id[i]) == 29, "id %s", whole.id[i]);
    if (whole.n > 1) CHECK(strcmp(whole.id[0], whole.id[1]) != 0);
    /* every two-piece split, then byte by byte */
    size_t n = strlen(text);
    int bad_splits = 0;
    for (size_t c = 1; c < n; c++) {
        result r;
        parse(syntax, text, &c, 1, &r);
        if (!same(&r, &whole)) {
            if (bad_splits++ < 3) fprintf(stderr, "  split at %zu: text '%s' calls %d\n", c, r.text, r.n);
        }
    }
    size_t *cuts = malloc(sizeof *cuts * (n + 1));
    for (size_t c = 1; c < n; c++) cuts[c - 1] = c;
    result r;
    parse(syntax, text, cuts, n > 0 ? (int)n - 1 : 0, &r);
    free(cuts);
    if (!same(&r, &whole)) bad_splits++;
    CHECK_MSG(bad_splits == 0, "%s %.60s: %d splits differ from the whole answer", syntax, text, bad_splits);
}

#define CALLS(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NONE ((const char *const[]){NULL})

int main(void) {
    /* Qwen2.5's own form */
    expect("hermes", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>", "",
           CALLS("get_weather", "{\"city\": \"Paris\"}"));
    /* text before, parallel calls, whitespace between them dropped */
    expect("hermes",
           "Let me check.\n<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n<tool_call>\n{\"name\":\"b_2\","
           "\"arguments\":{\"x\":[1,{\"y\":\"}\"}]}}\n</tool_call>\n",
           "Let me check.", CALLS("a", "{}", "b_2", "{\"x\":[1,{\"y\":\"}\"}]}"));
    /* another key order: read whole at the close marker */
    expect("hermes", "<tool_call>{\"arguments\": {\"q\": 1}, \"name\": \"search\"}</tool_call>", "",
           CALLS("search", "{\"q\":1}"));
    /* arguments as JSON text */
    expect("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 2}\"}</tool_call>", "", CALLS("f", "{\"a\": 2}"));
    /* not a call: stays text */
    expect("hermes", "<tool_call>\nnot json\n</tool_call> ok", "<tool_call>\nnot json\n</tool_call> ok", NONE);
    expect("hermes", "a <tool_cal b <tool_call", "a <tool_cal b <tool_call", NONE);
    expect("hermes", "<<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>", "<", CALLS("g", "{}"));
    expect("hermes", "  plain text  \n", "  plain text  \n", NONE);
    /* cut short inside the arguments: the call with what was written */
    expect("hermes", "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"city\": \"Par", "", CALLS("f", "{\"city\": \"Par"));
    /* a broken tail: the call stays, the rest is text */
    expect("hermes", "<tool_call>{\"name\": \"f\", \"arguments\": {}} oops", "} oops", CALLS("f", "{}"));
    /* cut inside the head: text */
    expect("hermes", "<tool_call>\n{\"name\": \"f", "<tool_call>\n{\"name\": \"f", NONE);
    /* Hermes without the marker (small Qwen2.5 models): a call when it opens the answer */
    expect("hermes", "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}", "",
           CALLS("get_weather", "{\"city\": \"Paris\"}"));
    expect("hermes", "{\"name\": \"a\", \"arguments\": {}}\n{\"name\": \"b\", \"arguments\": {}} then text", "then text",
           CALLS("a", "{}", "b", "{}"));
    expect("hermes", "{\"name\": \"a\", \"arguments\": {}}\n{\"temp\": 21}", "{\"temp\": 21}", CALLS("a", "{}"));
    expect("hermes", "{\"city\": \"Paris\"}", "{\"city\": \"Paris\"}", NONE);
    expect("hermes", "Here: {\"name\": \"a\", \"arguments\": {}}", "Here: {\"name\": \"a\", \"arguments\": {}}", NONE);
    /* Mistral's list */
    expect("mistral", "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"k\": true}}, {\"name\": \"b\", \"arguments\": {}}]",
           "", CALLS("a", "{\"k\": true}", "b", "{}"));
    expect("mistral", "Sure [TOOL_CALLS][{\"name\":\"a\",\"arguments\":{}}] done", "Sure done", CALLS("a", "{}"));
    expect("mistral", "[TOOL_CALLS] nope", "[TOOL_CALLS] nope", NONE);
    CHECK(ckv_toolcall_syntax_find("nosuch") == NULL);
    char a[32], b[32];
    ckv_toolcall_id(7, 0, a);
    ckv_toolcall_id(8, 0, b);
    CHECK(strcmp(a, b) != 0);
    return ckv_test_finish("test_toolcall");
}
