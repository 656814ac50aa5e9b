/* test_toolcall_grammar.c - the forced tool-call automaton (engine/toolcall_grammar.h): the exact
 * call text of each allowed name is accepted byte by byte (arguments any JSON object), anything else
 * refused at the first wrong byte; one call without parallel calls, several with; the vocabulary mask
 * of the fixture tokenizer equals simulating every token from the state at every byte of a document,
 * end-of-sequence exactly where the answer may end; the text it forces parses back into the same calls
 * (toolcall.h). With CKV_TOOLCALL_BENCH set to model paths (colon separated) it prints the mask's cost
 * per step on their vocabularies. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include "ckv_test.h"
#include "core/timer.h"
#include "engine/text.h"
#include "engine/toolcall.h"
#include "engine/toolcall_grammar.h"

static const char *const names[] = {"get_weather", "get_time", "get"};

/* 1 when all of text is accepted; *end: ckv_toolcall_can_end after it */
static int run(const ckv_toolcall_grammar *g, const char *text, int *end) {
    ckv_toolcall_state s;
    ckv_toolcall_state_init(g, &s);
    for (const char *p = text; *p; p++)
        if (!ckv_toolcall_step(g, &s, (uint8_t)*p)) return 0;
    *end = ckv_toolcall_can_end(g, &s);
    return 1;
}

static void check_mask(const ckv_toolcall_grammar *g, const ckv_grammar_vocab *gv, const char *doc) {
    ckv_toolcall_vocab tv;
    CHECK_OK(ckv_toolcall_vocab_init(&tv, gv));
    uint8_t *allowed = malloc((size_t)gv->vocab);
    int32_t eos[1] = {2};
    ckv_toolcall_state s;
    ckv_toolcall_state_init(g, &s);
    int bad = 0, steps = 0;
    for (const char *p = doc;; p++, steps++) {
        int n = ckv_toolcall_mask(g, &tv, &s, eos, 1, allowed), count = 0;
        for (int t = 0; t < gv->vocab; t++) {
            int want;
            if (t == eos[0]) {
                want = ckv_toolcall_can_end(g, &s) > 0;
            } else {
                ckv_toolcall_state s1 = s;
                want = gv->off[t + 1] > gv->off[t] && ckv_toolcall_accept(g, gv, &s1, t);
            }
            count += allowed[t];
            if (allowed[t] != want && bad++ < 5)
                fprintf(stderr, "  mask at byte %d: token %d allowed %d, simulation %d\n", (int)(p - doc), t, allowed[t], want);
        }
        CHECK(n == count);
        if (!*p) break;
        CHECK(ckv_toolcall_step(g, &s, (uint8_t)*p));
    }
    CHECK_MSG(bad == 0, "%d mask entries differ from simulating the tokens over %d steps", bad, steps);
    if (!bad) fprintf(stderr, "ok   mask equals simulation at all %d steps of the forced text\n", steps);
    free(allowed);
    ckv_toolcall_vocab_free(&tv);
}

typedef struct {
    int n;
    char name[4][72], args[4][128];
} calls;
static int on_text(void *c, const char *s, size_t n) { (void)c, (void)s; return n ? 1 : 0; } /* no text expected */
static int on_call(void *c, int i, const char *id, const char *name) {
    calls *k = c;
    (void)id;
    snprintf(k->name[i], sizeof k->name[i], "%s", name);
    k->args[i][0] = '\0';
    k->n = i + 1;
    return 0;
}
static int on_args(void *c, int i, const char *s, size_t n) {
    calls *k = c;
    strncat(k->args[i], s, n);
    return 0;
}

int main(void) {
    const ckv_toolcall_syntax *h = ckv_toolcall_syntax_find("hermes");
    ckv_toolcall_grammar one, par;
    CHECK_OK(ckv_toolcall_grammar_init(&one, h, names, 3, 0));
    CHECK_OK(ckv_toolcall_grammar_init(&par, h, names, 3, 1));
    const char *call1 = "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>";
    const char *call2 = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"d\": [1, {\"x\": null}]} }\n</tool_call>";
    int end = -1;
    CHECK(run(&one, call1, &end) && end == 2);
    CHECK(run(&one, call2, &end) && end == 2);
    CHECK(run(&one, "<tool_call>\n{\"name\": \"get\", \"arguments\": {\"a\": 1}}\n</tool_call>", &end) && end == 2);
    CHECK(run(&one, "<tool_call>\n{\"name\": \"get_", &end) && end == 0);
    char two[512];
    snprintf(two, sizeof two, "%s\n%s", call1, call2);
    CHECK(!run(&one, two, &end));
    CHECK(run(&par, two, &end) && end == 1);
    static const char *const refused[] = {"Sure", " <tool_call>", "<tool_call>\n{\"name\": \"get_x", "<tool_call>\n{\"name\": \"gets",
                                          "<tool_call>\n{\"name\": \"get\", \"arguments\": [", "<tool_call>\n{\"name\": \"get\", \"arguments\": {}]"};
    for (int i = 0; i < 6; i++) CHECK_MSG(!run(&par, refused[i], &end), "accepted '%s'", refused[i]);
    /* what it forces parses back into the calls */
    ckv_toolcall_parser p;
    calls k = {0};
    ckv_toolcall_sink sink = {&k, on_text, on_call, on_args};
    int nc = 0;
    CHECK_OK(ckv_toolcall_parser_init(&p, h, strlen(two), 1));
    CHECK_OK(ckv_toolcall_feed(&p, two, strlen(two), &sink));
    CHECK_OK(ckv_toolcall_finish(&p, &sink, &nc));
    CHECK(nc == 2 && !strcmp(k.name[0], "get_time") && !strcmp(k.args[0], "{}") && !strcmp(k.name[1], "get_weather") &&
          !strcmp(k.args[1], "{\"city\": \"Paris\", \"d\": [1, {\"x\": null}]}"));
    ckv_toolcall_parser_free(&p);
    /* Mistral's list form: first and last literals */
    ckv_toolcall_grammar mi;
    const ckv_toolcall_syntax *m = ckv_toolcall_syntax_find("mistral");
    CHECK_OK(ckv_toolcall_grammar_init(&mi, m, names, 3, 1));
    CHECK(run(&mi, "[TOOL_CALLS] [{\"name\": \"get\", \"arguments\": {}}, {\"name\": \"get_time\", \"arguments\": {}}]", &end) && end == 2);
    CHECK(run(&mi, "[TOOL_CALLS] [{\"name\": \"get\", \"arguments\": {}}", &end) && end == 0);
    ckv_toolcall_grammar_free(&mi);

    ckv_tokenizer *tok = NULL;
    CHECK_OK(ckv_text_open_tokenizer(&tok, CKV_FIXTURES "/models/llama_gqa"));
    if (tok) {
        ckv_grammar_vocab gv;
        CHECK_OK(ckv_grammar_vocab_init(&gv, tok, ckv_tokenizer_vocab_size(tok)));
        check_mask(&par, &gv, two);
        ckv_grammar_vocab_free(&gv);
        ckv_tokenizer_free(tok);
    }
    /* the mask's cost on real vocabularies */
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
        ckv_toolcall_vocab tv;
        CHECK_OK(ckv_grammar_vocab_init(&gv, bt, V));
        double t0 = ckv_time_now();
        CHECK_OK(ckv_toolcall_vocab_init(&tv, &gv));
        double t_vocab = ckv_time_now() - t0;
        uint8_t *allowed = malloc((size_t)V);
        int32_t eos[1] = {0};
        double ms[512];
        int n = 0;
        ckv_toolcall_state s;
        ckv_toolcall_state_init(&par, &s);
        for (const char *q = call2; *q && n < 512; q++) { /* one mask per byte of the forced text */
            double t1 = ckv_time_now();
            ckv_toolcall_mask(&par, &tv, &s, eos, 1, allowed);
            ms[n++] = (ckv_time_now() - t1) * 1e3;
            ckv_toolcall_step(&par, &s, (uint8_t)*q);
        }
        for (int i = 1; i < n; i++) /* sort for the median and p90 */
            for (int j = i; j > 0 && ms[j] < ms[j - 1]; j--) {
                double x = ms[j];
                ms[j] = ms[j - 1];
                ms[j - 1] = x;
            }
        printf("tool-call mask: %s vocab %d (%d with '}'): median %.3f ms, p90 %.3f ms, max %.3f ms over %d steps; brace list %.1f ms\n",
               path, V, tv.n_brace, ms[n / 2], ms[n * 9 / 10], ms[n - 1], n, t_vocab * 1e3);
        free(allowed);
        ckv_toolcall_vocab_free(&tv);
        ckv_grammar_vocab_free(&gv);
        ckv_tokenizer_free(bt);
    }
    free(paths);
    ckv_toolcall_grammar_free(&one);
    ckv_toolcall_grammar_free(&par);
    return ckv_test_finish("test_toolcall_grammar");
}
