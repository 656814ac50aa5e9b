/* test_toolcall_grammar.c - tool_choice required / a named function as a grammar
 * (engine/toolcall_grammar.h): each allowed function's exact call text is accepted, with arguments
 * that follow its parameters schema; another name, arguments breaking the schema, or text around the
 * call are refused; one call without parallel calls, several with; a non-strict schema the compiler
 * does not support falls back to any object, a strict one fails naming the function; Mistral's list
 * form. On the fixture vocabulary a greedy walk through the mask forces a whole call that the parser
 * (toolcall.h) reads back. With CKV_TOOLCALL_BENCH set to model paths (colon separated) it prints the
 * mask's cost per token of a forced call on their vocabularies. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "ckv_test.h"
#include "core/timer.h"
#include "engine/text.h"
#include "engine/toolcall.h"
#include "engine/toolcall_grammar.h"

/* 1: all of text accepted and finished; 2: accepted, complete, more may follow; 0 refused or incomplete */
static int run(const ckv_grammar *g, const char *text) {
    ckv_grammar_matcher m;
    if (ckv_grammar_matcher_init(&m, g, NULL) != CKV_STATUS_OK) return -1;
    int ok = ckv_grammar_matcher_accept_bytes(&m, (const uint8_t *)text, strlen(text));
    int r = !ok || !ckv_grammar_matcher_complete(&m) ? 0 : ckv_grammar_matcher_finished(&m) ? 1 : 2;
    ckv_grammar_matcher_free(&m);
    return r;
}

typedef struct {
    int n;
    char name[4][72], args[4][256];
} calls;
static int on_text(void *c, const char *s, size_t n) { (void)c, (void)s; return n ? 1 : 0; } /* no text expected */
static int on_call(void *c, int i, const char *id, const char *name) {
    calls *k = c;
    (void)id;
    if (i >= 4) return 1;
    snprintf(k->name[i], sizeof k->name[i], "%s", name);
    k->args[i][0] = '\0';
    k->n = i + 1;
    return 0;
}
static int on_args(void *c, int i, const char *s, size_t n) {
    calls *k = c;
    if (strlen(k->args[i]) + n >= sizeof k->args[i]) return 1;
    strncat(k->args[i], s, n);
    return 0;
}

int main(void) {
    const ckv_toolcall_syntax *h = ckv_toolcall_syntax_find("hermes");
    cJSON *weather = cJSON_Parse("{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}, \"days\": {\"type\": "
                                 "\"integer\"}}, \"required\": [\"city\"]}");
    cJSON *odd = cJSON_Parse("{\"type\": \"object\", \"properties\": {\"q\": {\"type\": \"string\", \"format\": \"x-unknown\"}}, "
                             "\"patternProperties\": {\"^a\": {}}}");
    ckv_toolcall_fn fns[3] = {{"get_weather", weather, 0}, {"get_time", NULL, 0}, {"get", odd, 0}};
    ckv_grammar one, par;
    char err[320];
    int loose = -1;
    CHECK_OK(ckv_toolcall_grammar_init(&one, h, fns, 3, 0, &loose, err, sizeof err));
    CHECK_MSG(loose == 1, "%d schemas fell back to any object, expected 1", loose);
    CHECK_OK(ckv_toolcall_grammar_init(&par, h, fns, 3, 1, &loose, err, sizeof err));
    const char *c1 = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    const char *c2 = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";
    const char *c3 = "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"anything\": [1, {\"x\": null}]}}\n</tool_call>";
    CHECK(run(&one, c1) == 1);
    CHECK(run(&one, c2) == 1);
    CHECK(run(&one, c3) == 1);
    char two[512];
    snprintf(two, sizeof two, "%s\n%s", c1, c2);
    CHECK(run(&one, two) == 0);
    CHECK(run(&par, c1) == 2 && run(&par, two) == 2);
    static const char *const refused[] = {
        "Sure <tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_x\", \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"days\": 2}}\n</tool_call>",   /* city is required */
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": 7}}\n</tool_call>",    /* not a string */
        "<tool_call>\n{\"name\": \"get_time\", \"arguments\": []}\n</tool_call>"};
    for (int i = 0; i < 5; i++) CHECK_MSG(run(&par, refused[i]) == 0, "accepted '%s'", refused[i]);
    /* a strict schema that breaks OpenAI's rules fails naming the function */
    ckv_toolcall_fn strict = {"get_weather", weather, 1};
    ckv_grammar gs;
    ckv_status st = ckv_toolcall_grammar_init(&gs, h, &strict, 1, 0, &loose, err, sizeof err);
    CHECK_MSG(st != CKV_STATUS_OK && strstr(err, "get_weather"), "strict schema: %s", err);
    ckv_error_clear();
    ckv_grammar_free(&gs);
    /* Mistral's list */
    ckv_grammar mi;
    CHECK_OK(ckv_toolcall_grammar_init(&mi, ckv_toolcall_syntax_find("mistral"), fns + 1, 1, 1, &loose, err, sizeof err));
    CHECK(run(&mi, "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}}, {\"name\": \"get_time\", \"arguments\": {}}]") == 1);
    CHECK(run(&mi, "[TOOL_CALLS] [{\"name\": \"get_time\", \"arguments\": {}}") == 0);
    ckv_grammar_free(&mi);

    /* the fixture vocabulary: a walk through the mask (an allowed token holding '}', else '"', else the
     * lowest allowed id) forces a whole call */
    ckv_tokenizer *tok = NULL;
    CHECK_OK(ckv_text_open_tokenizer(&tok, CKV_FIXTURES "/models/llama_gqa"));
    if (tok) {
        ckv_grammar_vocab gv;
        CHECK_OK(ckv_grammar_vocab_init(&gv, tok, ckv_tokenizer_vocab_size(tok)));
        ckv_grammar_matcher m;
        CHECK_OK(ckv_grammar_matcher_init(&m, &one, &gv));
        uint8_t *allowed = malloc((size_t)gv.vocab);
        int32_t eos[1] = {2};
        char text[1024];
        size_t len = 0;
        int steps = 0;
        while (!ckv_grammar_matcher_finished(&m) && steps < 400) {
            CHECK(ckv_grammar_matcher_mask(&m, eos, 1, allowed) > 0);
            int t = -1;
            for (int pass = 0; pass < 3 && t < 0; pass++)
                for (int u = 0; u < gv.vocab && t < 0; u++) {
                    if (!allowed[u] || u == eos[0]) continue;
                    const void *b = gv.bytes + gv.off[u];
                    size_t nb = gv.off[u + 1] - gv.off[u];
                    if (pass == 2 || memchr(b, pass == 0 ? '}' : '"', nb)) t = u;
                }
            if (t < 0) break;
            CHECK(ckv_grammar_matcher_accept(&m, t));
            for (uint32_t b = gv.off[t]; b < gv.off[t + 1] && len < sizeof text - 1; b++) text[len++] = (char)gv.bytes[b];
            steps++;
        }
        text[len] = '\0';
        CHECK_MSG(ckv_grammar_matcher_finished(&m), "the walk did not finish a call in %d tokens: '%s'", steps, text);
        ckv_toolcall_parser p;
        calls k = {0};
        ckv_toolcall_sink sink = {&k, on_text, on_call, on_args};
        int nc = 0;
        CHECK_OK(ckv_toolcall_parser_init(&p, h, len, 1));
        CHECK_OK(ckv_toolcall_feed(&p, text, len, &sink));
        CHECK_OK(ckv_toolcall_finish(&p, &sink, &nc));
        CHECK_MSG(nc == 1 && (!strcmp(k.name[0], "get_weather") || !strcmp(k.name[0], "get_time") || !strcmp(k.name[0], "get")),
                  "forced text '%s' parsed into %d calls", text, nc);
        if (nc == 1) fprintf(stderr, "ok   forced in %d tokens: %s(%s)\n", steps, k.name[0], k.args[0]);
        ckv_toolcall_parser_free(&p);
        ckv_grammar_matcher_free(&m);
        free(allowed);
        ckv_grammar_vocab_free(&gv);
        ckv_tokenizer_free(tok);
    }
    /* the mask's cost per token of a forced call on real vocabularies */
    const char *bench = getenv("CKV_TOOLCALL_BENCH");
    char *paths = bench ? strdup(bench) : NULL;
    for (char *path = paths ? strtok(paths, ":") : NULL; path; path = strtok(NULL, ":")) {
        ckv_tokenizer *bt = NULL;
        if (ckv_text_open_tokenizer(&bt, path) != CKV_STATUS_OK) {
            fprintf(stderr, "CKV_TOOLCALL_BENCH: %s\n", ckv_error_message());
            ckv_test_failures++;
            continue;
        }
        int V = ckv_tokenizer_vocab_size(bt);
        ckv_grammar_vocab gv;
        CHECK_OK(ckv_grammar_vocab_init(&gv, bt, V));
        ckv_grammar_matcher m;
        CHECK_OK(ckv_grammar_matcher_init(&m, &par, &gv));
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(ckv_tokenizer_encode(bt, c2, strlen(c2), 0, &ids, &n));
        uint8_t *allowed = malloc((size_t)V);
        int32_t eos[1] = {0};
        double ms[256];
        int k = 0, refused_tok = 0;
        for (size_t i = 0; i < n && k < 256; i++) {
            double t0 = ckv_time_now();
            ckv_grammar_matcher_mask(&m, eos, 1, allowed);
            ms[k++] = (ckv_time_now() - t0) * 1e3;
            refused_tok += !allowed[ids[i]];
            if (!ckv_grammar_matcher_accept(&m, ids[i])) break;
        }
        CHECK_MSG(refused_tok == 0, "%s: %d tokens of the call's own tokenization were masked", path, refused_tok);
        for (int i = 1; i < k; i++)
            for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
                double x = ms[j];
                ms[j] = ms[j - 1];
                ms[j - 1] = x;
            }
        printf("tool-call mask: %s vocab %d: median %.3f ms, p90 %.3f ms, max %.3f ms over %d tokens\n", path, V, ms[k / 2],
               ms[k * 9 / 10], ms[k - 1], k);
        free(ids);
        free(allowed);
        ckv_grammar_matcher_free(&m);
        ckv_grammar_vocab_free(&gv);
        ckv_tokenizer_free(bt);
    }
    free(paths);
    ckv_grammar_free(&one);
    ckv_grammar_free(&par);
    cJSON_Delete(weather);
    cJSON_Delete(odd);
    return ckv_test_finish("test_toolcall_grammar");
}
