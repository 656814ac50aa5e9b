/* test_grammar.c - the JSON automaton (engine/grammar.h): valid documents (nesting, escapes, numbers,
 * literals, whitespace) are accepted byte by byte and end complete; invalid ones are refused at the
 * first wrong byte; json_object refuses any other top-level value; the vocabulary mask of the fixture
 * tokenizer equals simulating every token from the state, at every step of a document; eos only once
 * complete. With CKV_GRAMMAR_BENCH set to model paths (GGUF files or model directories, colon
 * separated) it also prints the mask's cost per step on their vocabularies. */
#include "ckv_test.h"
#include "core/timer.h"
#include "engine/grammar.h"
#include "engine/text.h"

/* 1 when the whole text is accepted; *complete: whether it ended a value */
static int run(const char *text, int top_object, int *complete) {
    ckv_json_state s;
    ckv_json_init(&s, top_object);
    for (const char *p = text; *p; p++)
        if (!ckv_json_step(&s, (uint8_t)*p)) return 0;
    *complete = ckv_json_complete(&s);
    return 1;
}

/* The mask against a per-token simulation at every byte boundary of doc whose prefix is a state. */
static void check_mask(const ckv_grammar_vocab *gv, const char *doc, const char *what) {
    uint8_t *allowed = malloc((size_t)gv->vocab);
    int32_t eos[1] = {2};
    ckv_json_state s;
    ckv_json_init(&s, 1);
    int bad = 0;
    for (const char *p = doc;; p++) {
        int n = ckv_grammar_mask(gv, &s, eos, 1, allowed);
        int count = 0;
        for (int t = 0; t < gv->vocab && bad < 5; t++) {
            ckv_json_state x = s;
            int ok = gv->off[t + 1] > gv->off[t] && !ckv_json_complete(&s) && ckv_grammar_accept(gv, &x, t);
            if (ckv_json_complete(&s)) ok = t == 2;
            count += ok;
            if (ok != allowed[t]) {
                fprintf(stderr, "%s: after %d bytes token %d mask %d, simulation %d\n", what, (int)(p - doc), t, allowed[t], ok);
                bad++;
            }
        }
        CHECK_MSG(n == count, "%s: mask counts %d tokens, simulation %d", what, n, count);
        if (!*p) break;
        CHECK_MSG(ckv_json_step(&s, (uint8_t)*p), "%s: byte %d refused", what, (int)(p - doc));
    }
    CHECK_MSG(bad == 0, "%s: %d mask mismatches", what, bad);
    free(allowed);
}

int main(void) {
    static const char *const valid[] = {
        "{}", " { } ", "{\"a\": 1}", "{\"a\":[1,2.5,-0.5e+3,0,1E9,-0],\"b\":{\"c\":[]}}",
        "{\"s\": \"x\\u00e9\\n\\\"\\\\/\\t caf\xc3\xa9\"}", "{\"t\": true, \"f\": false, \"n\": null}",
        "{\n  \"a\": [\n    {\"b\": []}\n  ]\n}"};
    for (size_t i = 0; i < sizeof valid / sizeof *valid; i++) {
        int complete = 0;
        CHECK_MSG(run(valid[i], 1, &complete) && complete, "valid document %zu refused or incomplete: %s", i, valid[i]);
    }
    int complete = 0;
    CHECK_MSG(run("[1, \"a\", {}]", 0, &complete) && complete, "an array is a value when the top need not be an object");
    CHECK_MSG(run("{\"a\": [1, 2", 1, &complete) && !complete, "a prefix is accepted and incomplete");
    static const char *const invalid[] = {
        "[1]", "\"x\"", "1", "{\"a\" 1}", "{\"a\":}", "{\"a\": 01}", "{\"a\": tru}", "{,}", "{\"a\":1,}", "{\"a\": \"\x01\"}",
        "{\"a\": 1]", "{\"a\": [1}", "{\"a\": .5}", "{\"a\": 1.}", "{\"a\": 1e}", "{\"a\": \"\\x\"}", "{\"a\": \"\\u12g4\"}",
        "{a: 1}", "{} {}", "{\"a\": 1}}", "{\"a\": nul}", "{\"a\": -}", "{                    }", "{\"a\": \"\xff\"}",
        "{\"a\": \"\xc3\"}", "{\"a\": \"\xe2\x82\"}", "{\"a\": \"\x80\"}"};
    for (size_t i = 0; i < sizeof invalid / sizeof *invalid; i++)
        CHECK_MSG(!run(invalid[i], 1, &complete), "invalid document %zu accepted: %s", i, invalid[i]);
    char deep[2 * CKV_JSON_MAX_DEPTH + 8] = "{\"a\":";
    size_t o = strlen(deep);
    for (int i = 0; i < CKV_JSON_MAX_DEPTH; i++) deep[o++] = '[';
    deep[o] = '\0';
    CHECK_MSG(!run(deep, 1, &complete), "nesting beyond %d accepted", CKV_JSON_MAX_DEPTH);

    /* the fixture tokenizer's vocabulary: the mask equals simulating every token */
    ckv_tokenizer *tok = NULL;
    CHECK_OK(ckv_text_open_tokenizer(&tok, CKV_FIXTURES "/models/llama_gqa"));
    if (!tok) return ckv_test_finish("test_grammar");
    ckv_grammar_vocab gv;
    CHECK_OK(ckv_grammar_vocab_init(&gv, tok, ckv_tokenizer_vocab_size(tok)));
    check_mask(&gv, "{\"key\": [1, -2.5e3, true, null, \"str\\n\\u00e9 x\"], \"o\": {}}", "fixture vocabulary");
    ckv_grammar_vocab_free(&gv);
    ckv_tokenizer_free(tok);

    /* the cost per step on real vocabularies (not a CI check: printed for the docs) */
    const char *bench = getenv("CKV_GRAMMAR_BENCH");
    char paths[4096];
    snprintf(paths, sizeof paths, "%s", bench ? bench : "");
    for (char *path = strtok(paths, ":"); path; path = strtok(NULL, ":")) {
        ckv_tokenizer *bt = NULL;
        if (ckv_text_open_tokenizer(&bt, path) != CKV_STATUS_OK) {
            fprintf(stderr, "CKV_GRAMMAR_BENCH: %s\n", ckv_error_message());
            ckv_test_failures++;
            continue;
        }
        int V = ckv_tokenizer_vocab_size(bt);
        double t0 = ckv_time_now();
        CHECK_OK(ckv_grammar_vocab_init(&gv, bt, V));
        double t_init = ckv_time_now() - t0;
        const char *doc = "{\"name\": \"Ada Lovelace\", \"born\": 1815, \"tags\": [\"math\", \"poetry\"], \"alive\": false}";
        uint8_t *allowed = malloc((size_t)V);
        int32_t eos[1] = {0};
        enum { REPS = 5, MAXS = 128 };
        double dt[REPS * MAXS];
        int steps = 0;
        for (int r = 0; r < REPS; r++) { /* the document's every state, five times: median and 90th percentile */
            ckv_json_state s;
            ckv_json_init(&s, 1);
            for (const char *p = doc; *p && steps < REPS * MAXS; p++) {
                double t1 = ckv_time_now();
                ckv_grammar_mask(&gv, &s, eos, 1, allowed);
                dt[steps++] = ckv_time_now() - t1;
                ckv_json_step(&s, (uint8_t)*p);
            }
        }
        for (int i = 1; i < steps; i++) /* insertion sort: a few hundred values */
            for (int k = i; k > 0 && dt[k] < dt[k - 1]; k--) {
                double x = dt[k];
                dt[k] = dt[k - 1], dt[k - 1] = x;
            }
        printf("grammar mask on %s: vocabulary %d, built in %.1f ms; per step median %.0f us, 90th percentile %.0f us (%d steps)\n",
               path, V, 1e3 * t_init, 1e6 * dt[steps / 2], 1e6 * dt[steps * 9 / 10], steps);
        free(allowed);
        ckv_grammar_vocab_free(&gv);
        ckv_tokenizer_free(bt);
    }
    return ckv_test_finish("test_grammar");
}
