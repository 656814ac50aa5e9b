/* test_chat_tools.c - conversations with tools through Qwen2.5's chat template: the renderings of
 * tests/fixtures/templates/qwen2.5-tools.json (made by transformers from the model's own Jinja
 * template, tools/oracle/chat_tools_reference.py) must come out byte for byte, from the template
 * detected in the Jinja text and from the template named qwen2.5; templates without tools refuse them
 * naming "tools"; tojson writes numbers and strings as Python's json.dumps does. */
#include <cjson/cJSON.h>

#include "ckv_test.h"
#include "core/json.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (s && fread(s, 1, (size_t)n, f) != (size_t)n) n = 0;
    if (s) s[n] = '\0';
    fclose(f);
    return s;
}

/* Renders case c with template t; NULL on error (the library's message then set). */
static char *render(const ckv_chat_template *t, const cJSON *c) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(c, "messages"), *tools = cJSON_GetObjectItemCaseSensitive(c, "tools");
    int n = cJSON_GetArraySize(msgs), i = 0;
    ckv_chat_message *m = calloc((size_t)n, sizeof *m);
    const cJSON **calls_of = calloc((size_t)n, sizeof *calls_of);
    const cJSON *it;
    cJSON_ArrayForEach(it, msgs) {
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        const cJSON *calls = cJSON_GetObjectItemCaseSensitive(it, "tool_calls");
        calls_of[i] = cJSON_IsArray(calls) ? calls : NULL;
        m[i++] = (ckv_chat_message){cJSON_GetObjectItemCaseSensitive(it, "role")->valuestring,
                                    cJSON_IsString(content) ? content->valuestring : NULL};
    }
    char *out = NULL;
    ckv_text_range *r = NULL;
    size_t nr = 0;
    ckv_status st = ckv_chat_apply_tools(t, cJSON_IsArray(tools) ? tools : NULL, m, calls_of, n, 1, &out, &r, &nr);
    free(m);
    free((void *)calls_of);
    free(r);
    return st == CKV_STATUS_OK ? out : NULL;
}

static void compare(const char *what, const char *got, const char *want) {
    if (!got) {
        CHECK_MSG(0, "%s: rendering failed: %s", what, ckv_error_message());
        ckv_error_clear();
        return;
    }
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    CHECK_MSG(!got[i] && !want[i], "%s: first difference at byte %zu: got '%.40s', want '%.40s'", what, i, got + i, want + i);
    if (!got[i] && !want[i]) fprintf(stderr, "ok   %s: %zu bytes equal\n", what, i);
}

static void tojson_number(double x, const char *want) {
    ckv_tk_buf b = {0};
    cJSON *v = cJSON_CreateNumber(x);
    CHECK_OK(ckv_chat_tojson(v, &b));
    CHECK_OK(ckv_tk_buf_append(&b, "", 1));
    CHECK_MSG(!strcmp(b.p, want), "tojson(%.17g) = '%s', want '%s'", x, b.p, want);
    cJSON_Delete(v);
    ckv_tk_buf_free(&b);
}

int main(void) {
    char *jinja = slurp(CKV_FIXTURES "/templates/qwen2.5-coder-instruct.jinja");
    char *cases_text = slurp(CKV_FIXTURES "/templates/qwen2.5-tools.json");
    CHECK(jinja && cases_text);
    if (!jinja || !cases_text) return ckv_test_finish("test_chat_tools");
    ckv_chat_template detected, named, smol;
    CHECK_OK(ckv_chat_template_detect(jinja, &detected));
    CHECK(!strcmp(detected.tool_syntax, "hermes"));
    CHECK_OK(ckv_chat_template_by_name("qwen2.5", &named));
    cJSON *cases = cJSON_Parse(cases_text);
    CHECK(cJSON_GetArraySize(cases) >= 4);
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        const char *name = cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring;
        const char *want = cJSON_GetObjectItemCaseSensitive(c, "text")->valuestring;
        char what[96];
        char *got = render(&detected, c);
        snprintf(what, sizeof what, "%s (detected template)", name);
        compare(what, got, want);
        free(got);
        got = render(&named, c);
        snprintf(what, sizeof what, "%s (qwen2.5 by name)", name);
        compare(what, got, want);
        free(got);
    }
    /* templates without tools refuse them, naming 'tools' */
    static const char *const plain[] = {"smollm2", "chatml", "llama3.1", "mistral"};
    for (int k = 0; k < 4; k++) {
        CHECK_OK(ckv_chat_template_by_name(plain[k], &smol));
        CHECK(!smol.tool_syntax[0]);
        char *got = render(&smol, cJSON_GetArrayItem(cases, 0));
        CHECK_MSG(!got && strstr(ckv_error_message(), "'tools'"), "%s: %s", plain[k], got ? "rendered tools" : ckv_error_message());
        ckv_error_clear();
        free(got);
    }
    /* Python's json.dumps numbers */
    tojson_number(0.5, "0.5");
    tojson_number(7, "7");
    tojson_number(-3, "-3");
    tojson_number(1e-05, "1e-05");
    tojson_number(0.0001, "0.0001");
    tojson_number(123.456, "123.456");
    tojson_number(1.5e16, "1.5e+16"); /* beyond 2^53: a float, as Python writes it */
    tojson_number(1e300, "1e+300");
    tojson_number(-2.5e-7, "-2.5e-07");
    tojson_number(0.1, "0.1");
    cJSON_Delete(cases);
    free(jinja);
    free(cases_text);
    return ckv_test_finish("test_chat_tools");
}
