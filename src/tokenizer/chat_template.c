/* chat_template.c - the three chat template families ckv supports, rendered in C: Llama 3 header
 * tokens (3.0, and 3.1+ with the knowledge/today-date preamble), ChatML (Qwen2.5 and SmolLM2, with
 * their default system prompts; Qwen2.5's tools block, assistant tool calls and tool results in its
 * Hermes-style <tools>/<tool_call>/<tool_response> form) and Mistral [INST] (v0.3 spacing, and the
 * older "[INST] x [/INST]"). A Jinja template from tokenizer_config.json or GGUF metadata is
 * recognised by its markers; it is never executed. Images and multi-part contents are out of scope;
 * tools only where the template takes them (the others refuse them, naming "tools"). */
#define _POSIX_C_SOURCE 200809L /* localtime_r */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "tokenizer/tok_internal.h"

static void set_name(ckv_chat_template *t, const char *name) { snprintf(t->name, sizeof t->name, "%s", name); }

/* Finds the default system prompt a ChatML template writes when the conversation has none: the text
 * of a string literal after "<|im_start|>system\n" up to "<|im_end|>". */
static ckv_status chatml_default_system(const char *jinja, char *out, size_t cap) {
    out[0] = '\0';
    static const char *const heads[] = {"<|im_start|>system\\n", "<|im_start|>system\n"};
    for (size_t h = 0; h < 2; h++) {
        const char *p = jinja;
        while ((p = strstr(p, heads[h])) != NULL) {
            p += strlen(heads[h]);
            const char *end = strstr(p, "<|im_end|>");
            if (!end) break;
            size_t n = (size_t)(end - p);
            int literal = n > 0;
            for (size_t i = 0; i < n && literal; i++)
                if (p[i] == '\'' || p[i] == '"' || p[i] == '{' || p[i] == '}' || p[i] == '+') literal = 0;
            if (literal) {
                size_t k = 0, need = 0;
                for (size_t i = 0; i < n; i++, need++)
                    if (p[i] == '\\' && i + 1 < n && p[i + 1] == 'n') i++;
                if (need + 1 > cap)
                    return ckv_error(CKV_STATUS_ERR_RANGE, "chat template: its default system prompt is %zu bytes, more "
                                     "than the limit of %zu (it is never cut)", need, cap - 1);
                for (size_t i = 0; i < n && k + 1 < cap; i++) {
                    if (p[i] == '\\' && i + 1 < n && p[i + 1] == 'n') {
                        out[k++] = '\n';
                        i++;
                    } else {
                        out[k++] = p[i];
                    }
                }
                out[k] = '\0';
                return CKV_STATUS_OK;
            }
        }
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_chat_template_detect(const char *jinja, ckv_chat_template *out) {
    memset(out, 0, sizeof *out);
    if (!jinja) return ckv_error(CKV_STATUS_ERR_ARG, "chat template: none given");
    if (strstr(jinja, "<|start_header_id|>")) {
        out->family = CKV_CHAT_LLAMA3;
        out->llama31_preamble = strstr(jinja, "Cutting Knowledge Date") != NULL;
        out->llama_date_today = out->llama31_preamble && strstr(jinja, "strftime_now") != NULL;
        set_name(out, out->llama_date_today ? "llama3.2" : out->llama31_preamble ? "llama3.1" : "llama3");
        return CKV_STATUS_OK;
    }
    if (strstr(jinja, "<|im_start|>")) {
        out->family = CKV_CHAT_CHATML;
        CKV_TRY(chatml_default_system(jinja, out->default_system, sizeof out->default_system));
        if (strstr(jinja, "<tool_call>") && strstr(jinja, "<tools>")) snprintf(out->tool_syntax, sizeof out->tool_syntax, "hermes");
        set_name(out, strstr(out->default_system, "Qwen") ? "qwen2.5"
                      : strstr(out->default_system, "SmolLM") ? "smollm2" : "chatml");
        return CKV_STATUS_OK;
    }
    if (strstr(jinja, "[INST]")) {
        out->family = CKV_CHAT_MISTRAL;
        out->mistral_space = strstr(jinja, " [/INST]") != NULL;
        set_name(out, out->mistral_space ? "mistral-v0.1" : "mistral");
        return CKV_STATUS_OK;
    }
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                     "chat template not recognised: it has none of the markers <|start_header_id|> (Llama 3), "
                     "<|im_start|> (ChatML) or [INST] (Mistral); pick one by name");
}

ckv_status ckv_chat_template_by_name(const char *name, ckv_chat_template *out) {
    memset(out, 0, sizeof *out);
    if (!name) return ckv_error(CKV_STATUS_ERR_ARG, "chat template: no name given");
    if (!strcmp(name, "none")) {
        set_name(out, "none");
        return CKV_STATUS_OK;
    }
    if (!strcmp(name, "llama3") || !strcmp(name, "llama3.1") || !strcmp(name, "llama3.2")) {
        out->family = CKV_CHAT_LLAMA3;
        out->llama31_preamble = strcmp(name, "llama3") != 0;
        out->llama_date_today = !strcmp(name, "llama3.2");
    } else if (!strcmp(name, "chatml")) {
        out->family = CKV_CHAT_CHATML;
    } else if (!strcmp(name, "qwen2.5")) {
        out->family = CKV_CHAT_CHATML;
        snprintf(out->default_system, sizeof out->default_system, "%s",
                 "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
        snprintf(out->tool_syntax, sizeof out->tool_syntax, "hermes");
    } else if (!strcmp(name, "smollm2")) {
        out->family = CKV_CHAT_CHATML;
        snprintf(out->default_system, sizeof out->default_system, "%s",
                 "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    } else if (!strcmp(name, "mistral") || !strcmp(name, "mistral-v0.1")) {
        out->family = CKV_CHAT_MISTRAL;
        out->mistral_space = !strcmp(name, "mistral-v0.1");
    } else {
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "chat template '%s' is unknown (expected llama3, llama3.1, llama3.2, chatml, qwen2.5, smollm2, "
                         "mistral, mistral-v0.1 or none)",
                         name);
    }
    set_name(out, name);
    return CKV_STATUS_OK;
}

ckv_status ckv_tk_chat_from_config(ckv_tokenizer *t, const char *jinja) {
    ckv_chat_template ct;
    ckv_status st = ckv_chat_template_detect(jinja, &ct);
    if (st == CKV_STATUS_OK) t->chat = ct;
    if (st == CKV_STATUS_ERR_RANGE) return st; /* a literal over a limit: never cut silently */
    ckv_error_clear(); /* an unknown template: the model has none ckv can render */
    return CKV_STATUS_OK;
}

const ckv_chat_template *ckv_tokenizer_chat_template(const ckv_tokenizer *tok) { return &tok->chat; }

static ckv_status app(ckv_tk_buf *b, const char *s) { return ckv_tk_buf_append(b, s, strlen(s)); }

/* The ranges of the rendered text that are message content (NULL p: not recorded). */
typedef struct {
    ckv_text_range *p;
    size_t n, cap;
    int record;
} content_ranges;

static ckv_status note_range(content_ranges *r, size_t off, size_t len) {
    if (!r || !r->record || len == 0) return CKV_STATUS_OK;
    if (r->n && r->p[r->n - 1].off + r->p[r->n - 1].len == off) { /* adjacent: one range */
        r->p[r->n - 1].len += len;
        return CKV_STATUS_OK;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        ckv_text_range *q = realloc(r->p, cap * sizeof *q);
        if (!q) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory rendering the chat");
        r->p = q;
        r->cap = cap;
    }
    r->p[r->n++] = (ckv_text_range){off, len};
    return CKV_STATUS_OK;
}

/* A message's content (trimmed like Jinja's |trim when asked), recorded as a plain range. */
static ckv_status app_content(ckv_tk_buf *b, content_ranges *r, const char *s, int trim) {
    size_t len = strlen(s), i = 0;
    if (trim) {
        while (i < len && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r' || s[i] == '\f' || s[i] == '\v')) i++;
        while (len > i && (s[len - 1] == ' ' || s[len - 1] == '\n' || s[len - 1] == '\t' || s[len - 1] == '\r' ||
                           s[len - 1] == '\f' || s[len - 1] == '\v'))
            len--;
    }
    size_t off = b->n;
    CKV_TRY(ckv_tk_buf_append(b, s + i, len - i));
    return note_range(r, off, len - i);
}

/* JSON as the template's tojson writes it, recorded as content. */
static ckv_status app_json(ckv_tk_buf *b, content_ranges *r, const cJSON *v) {
    size_t off = b->n;
    CKV_TRY(ckv_chat_tojson(v, b));
    return note_range(r, off, b->n - off);
}

/* A tool call's arguments: a JSON string holding JSON is rendered as that value (what the model
 * wrote), any other value as itself. */
static ckv_status app_arguments(ckv_tk_buf *b, content_ranges *r, const cJSON *args) {
    if (cJSON_IsString(args)) {
        cJSON *v = cJSON_Parse(args->valuestring);
        if (v) {
            ckv_status st = app_json(b, r, v);
            cJSON_Delete(v);
            return st;
        }
    }
    return app_json(b, r, args);
}

/* Qwen2.5's system turn with its tools block (the system message's content, else the default). */
static ckv_status chatml_tools_system(const ckv_chat_template *t, const cJSON *tools, const ckv_chat_message *m, int n,
                                      ckv_tk_buf *b, content_ranges *r) {
    CKV_TRY(app(b, "<|im_start|>system\n"));
    if (n > 0 && !strcmp(m[0].role, "system")) CKV_TRY(app_content(b, r, m[0].content, 0));
    else CKV_TRY(app(b, t->default_system));
    CKV_TRY(app(b, "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
                   "function signatures within <tools></tools> XML tags:\n<tools>"));
    for (const cJSON *tool = tools->child; tool; tool = tool->next) {
        CKV_TRY(app(b, "\n"));
        CKV_TRY(app_json(b, r, tool));
    }
    return app(b, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                  "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                  "<args-json-object>}\n</tool_call><|im_end|>\n");
}

/* An assistant turn with tool calls, and tool results (one user turn for a run of them). */
static ckv_status chatml_tool_message(const ckv_chat_message *m, const cJSON *const *calls, int i, int n, ckv_tk_buf *b,
                                      content_ranges *r) {
    if (!strcmp(m[i].role, "tool")) {
        if (i == 0 || strcmp(m[i - 1].role, "tool") != 0) CKV_TRY(app(b, "<|im_start|>user"));
        CKV_TRY(app(b, "\n<tool_response>\n"));
        CKV_TRY(app_content(b, r, m[i].content, 0));
        CKV_TRY(app(b, "\n</tool_response>"));
        if (i == n - 1 || strcmp(m[i + 1].role, "tool") != 0) CKV_TRY(app(b, "<|im_end|>\n"));
        return CKV_STATUS_OK;
    }
    CKV_TRY(app(b, "<|im_start|>assistant"));
    if (m[i].content && m[i].content[0]) {
        CKV_TRY(app(b, "\n"));
        CKV_TRY(app_content(b, r, m[i].content, 0));
    }
    for (const cJSON *call = calls[i]->child; call; call = call->next) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(call, "function");
        if (!f) f = call;
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (!cJSON_IsString(name))
            return ckv_error(CKV_STATUS_ERR_ARG, "chat message %d: a tool call has no function name", i);
        CKV_TRY(app(b, "\n<tool_call>\n{\"name\": \""));
        CKV_TRY(app_content(b, r, name->valuestring, 0));
        CKV_TRY(app(b, "\", \"arguments\": "));
        CKV_TRY(app_arguments(b, r, args));
        CKV_TRY(app(b, "}\n</tool_call>"));
    }
    return app(b, "<|im_end|>\n");
}

static int has_tools(const cJSON *tools) { return tools && cJSON_IsArray(tools) && tools->child; }

/* Message i is an assistant's with tool calls. */
static int has_calls(const ckv_chat_message *m, const cJSON *const *calls, int i) {
    return calls && calls[i] && cJSON_IsArray(calls[i]) && calls[i]->child && m[i].role && !strcmp(m[i].role, "assistant");
}

static ckv_status render(const ckv_chat_template *t, const cJSON *tools, const ckv_chat_message *m, const cJSON *const *calls, int n,
                         int gen, ckv_tk_buf *b, content_ranges *r) {
    int tool_turns = 0;
    for (int i = 0; i < n; i++) {
        if (!m[i].role || (!m[i].content && !has_calls(m, calls, i)))
            return ckv_error(CKV_STATUS_ERR_ARG, "chat message %d has no role or content", i);
        if (has_calls(m, calls, i) || !strcmp(m[i].role, "tool")) tool_turns = 1;
    }
    const int hermes = t->family == CKV_CHAT_CHATML && !strcmp(t->tool_syntax, "hermes");
    if ((has_tools(tools) || tool_turns) && !hermes)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "chat template %s takes no tools: 'tools', assistant tool_calls and role 'tool' messages need a "
                         "template that renders them (Qwen2.5's)",
                         t->name[0] ? t->name : "(none)");
    switch (t->family) {
    case CKV_CHAT_NONE:
        for (int i = 0; i < n; i++) CKV_TRY(app_content(b, r, m[i].content, 0));
        return CKV_STATUS_OK;
    case CKV_CHAT_LLAMA3: {
        CKV_TRY(app(b, "<|begin_of_text|>"));
        int first = 0;
        if (t->llama31_preamble) {
            char date[32] = "26 Jul 2024";
            if (t->llama_date_today) {
                time_t now = time(NULL);
                struct tm tmv;
                if (localtime_r(&now, &tmv)) { /* what strftime_now("%d %b %Y") gives */
                    static const char *const mon[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                                        "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
                    snprintf(date, sizeof date, "%02d %s %d", tmv.tm_mday, mon[tmv.tm_mon], tmv.tm_year + 1900);
                }
            }
            CKV_TRY(app(b, "<|start_header_id|>system<|end_header_id|>\n\n"
                           "Cutting Knowledge Date: December 2023\nToday Date: "));
            CKV_TRY(app(b, date));
            CKV_TRY(app(b, "\n\n"));
            if (n > 0 && !strcmp(m[0].role, "system")) {
                CKV_TRY(app_content(b, r, m[0].content, 1));
                first = 1;
            }
            CKV_TRY(app(b, "<|eot_id|>"));
        }
        for (int i = first; i < n; i++) {
            CKV_TRY(app(b, "<|start_header_id|>"));
            CKV_TRY(app(b, m[i].role));
            CKV_TRY(app(b, "<|end_header_id|>\n\n"));
            CKV_TRY(app_content(b, r, m[i].content, 1));
            CKV_TRY(app(b, "<|eot_id|>"));
        }
        if (gen) CKV_TRY(app(b, "<|start_header_id|>assistant<|end_header_id|>\n\n"));
        return CKV_STATUS_OK;
    }
    case CKV_CHAT_CHATML: {
        int first = 0;
        if (has_tools(tools)) {
            CKV_TRY(chatml_tools_system(t, tools, m, n, b, r));
            first = n > 0 && !strcmp(m[0].role, "system");
        } else if (t->default_system[0] && (n == 0 || strcmp(m[0].role, "system") != 0)) {
            CKV_TRY(app(b, "<|im_start|>system\n"));
            CKV_TRY(app(b, t->default_system));
            CKV_TRY(app(b, "<|im_end|>\n"));
        }
        for (int i = first; i < n; i++) {
            if (!strcmp(m[i].role, "tool") || has_calls(m, calls, i)) {
                CKV_TRY(chatml_tool_message(m, calls, i, n, b, r));
                continue;
            }
            CKV_TRY(app(b, "<|im_start|>"));
            CKV_TRY(app(b, m[i].role));
            CKV_TRY(app(b, "\n"));
            CKV_TRY(app_content(b, r, m[i].content, 0));
            CKV_TRY(app(b, "<|im_end|>\n"));
        }
        if (gen) CKV_TRY(app(b, "<|im_start|>assistant\n"));
        return CKV_STATUS_OK;
    }
    case CKV_CHAT_MISTRAL: {
        const char *system = NULL;
        int start = 0, last_user = -1;
        if (n > 0 && !strcmp(m[0].role, "system")) {
            system = m[0].content;
            start = 1;
        }
        for (int i = start; i < n; i++)
            if (!strcmp(m[i].role, "user")) last_user = i;
        CKV_TRY(app(b, "<s>"));
        for (int i = start; i < n; i++) {
            if (!strcmp(m[i].role, "user")) {
                CKV_TRY(app(b, "[INST] "));
                if (system && i == last_user) {
                    CKV_TRY(app_content(b, r, system, 0));
                    CKV_TRY(app(b, "\n\n"));
                }
                CKV_TRY(app_content(b, r, m[i].content, 0));
                CKV_TRY(app(b, t->mistral_space ? " [/INST]" : "[/INST]"));
            } else if (!strcmp(m[i].role, "assistant")) {
                if (t->mistral_space) {
                    CKV_TRY(app_content(b, r, m[i].content, 0));
                } else {
                    CKV_TRY(app(b, " "));
                    CKV_TRY(app_content(b, r, m[i].content, 1));
                }
                CKV_TRY(app(b, "</s>"));
            } else {
                return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                                 "chat template %s: role '%s' of message %d is not supported (system first, then "
                                 "user/assistant)",
                                 t->name, m[i].role, i);
            }
        }
        (void)gen; /* the Mistral format has no assistant header */
        return CKV_STATUS_OK;
    }
    }
    return ckv_error(CKV_STATUS_ERR_ARG, "chat template: unknown family %d", (int)t->family);
}

static ckv_status apply(const ckv_chat_template *t, const cJSON *tools, const ckv_chat_message *msgs, const cJSON *const *calls,
                        int n_msgs, int add_generation_prompt, char **out, content_ranges *r) {
    *out = NULL;
    if (!t || n_msgs < 0 || (n_msgs && !msgs)) return ckv_error(CKV_STATUS_ERR_ARG, "chat template: bad arguments");
    ckv_tk_buf b = {0};
    ckv_status s = ckv_tk_buf_reserve(&b, 64);
    if (s == CKV_STATUS_OK) s = render(t, tools, msgs, calls, n_msgs, add_generation_prompt, &b, r);
    if (s != CKV_STATUS_OK) {
        ckv_tk_buf_free(&b);
        return s;
    }
    *out = b.p;
    return CKV_STATUS_OK;
}

ckv_status ckv_chat_apply(const ckv_chat_template *t, const ckv_chat_message *msgs, int n_msgs,
                          int add_generation_prompt, char **out) {
    return apply(t, NULL, msgs, NULL, n_msgs, add_generation_prompt, out, NULL);
}

ckv_status ckv_chat_apply_tools(const ckv_chat_template *t, const cJSON *tools, const ckv_chat_message *msgs,
                                const cJSON *const *calls, int n_msgs, int add_generation_prompt, char **out,
                                ckv_text_range **content, size_t *n_content) {
    content_ranges r = {NULL, 0, 0, content != NULL};
    if (content) {
        *content = NULL;
        *n_content = 0;
    }
    ckv_status s = apply(t, tools, msgs, calls, n_msgs, add_generation_prompt, out, &r);
    if (s != CKV_STATUS_OK || !content) {
        free(r.p);
        return s;
    }
    *content = r.p;
    *n_content = r.n;
    return CKV_STATUS_OK;
}

ckv_status ckv_chat_apply_ranges(const ckv_chat_template *t, const ckv_chat_message *msgs, int n_msgs, int add_generation_prompt,
                                 char **out, ckv_text_range **content, size_t *n_content) {
    return ckv_chat_apply_tools(t, NULL, msgs, NULL, n_msgs, add_generation_prompt, out, content, n_content);
}
