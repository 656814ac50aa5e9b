/* srv_fields.c - the request fields' readers (type and range checks, errors naming the field) and the
 * fields beside the prompt and the press: the list of known fields, sampling (penalties, logit_bias,
 * min_p, best_of, suffix), response_format, the tool fields (tools, tool_choice,
 * parallel_tool_calls, and the tool parts of messages), logprobs and echo (see srv_fields.h). It does not tokenise prompts or build jobs (srv_api.c). */
#define _POSIX_C_SOURCE 200809L
#include "server/srv_fields.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/toolcall.h"
#include "engine/toolcall_grammar.h"

#define INVALID "invalid_request_error"

/* ---- field readers: 0 ok (absent or null leaves *out alone), -1 with err set ----------------------- */

int ckv_srv_bad_type(ckv_srv_error *err, const char *field, const char *want) {
    ckv_srv_error_set(err, 400, INVALID, field, "invalid_type", "'%s' must be %s", field, want);
    return -1;
}

int ckv_srv_get_number(const cJSON *o, const char *field, double lo, double hi, double *out, ckv_srv_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, field);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v)) return ckv_srv_bad_type(err, field, "a number");
    double d = v->valuedouble;
    if (!isfinite(d) || d < lo || d > hi) {
        ckv_srv_error_set(err, 400, INVALID, field, "invalid_value", "'%s' is %g, expected a number in [%g, %g]", field, d, lo, hi);
        return -1;
    }
    *out = d;
    return 0;
}

int ckv_srv_get_int(const cJSON *o, const char *field, double lo, double hi, long long *out, ckv_srv_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, field);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble)) return ckv_srv_bad_type(err, field, "an integer");
    double d = v->valuedouble;
    if (!isfinite(d) || d < lo || d > hi) {
        ckv_srv_error_set(err, 400, INVALID, field, "invalid_value", "'%s' is %.17g, expected an integer in [%.0f, %.0f]", field,
                          d, lo, hi);
        return -1;
    }
    *out = (long long)d;
    return 0;
}

int ckv_srv_get_bool(const cJSON *o, const char *field, int *out, ckv_srv_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, field);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsBool(v)) return ckv_srv_bad_type(err, field, "a boolean");
    *out = cJSON_IsTrue(v);
    return 0;
}

int ckv_srv_get_string(const cJSON *o, const char *field, const char **out, ckv_srv_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, field);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsString(v)) return ckv_srv_bad_type(err, field, "a string");
    *out = v->valuestring;
    return 0;
}

/* ---- press options ------------------------------------------------------------------------------------ */

/* v as option text at t (cap bytes); 0 ok, -1 when v has no option form or does not fit. */
static int option_text(const cJSON *v, char *t, size_t cap) {
    if (cJSON_IsBool(v)) return snprintf(t, cap, "%d", cJSON_IsTrue(v)) < (int)cap ? 0 : -1;
    if (cJSON_IsString(v)) return strlen(v->valuestring) < cap ? (memcpy(t, v->valuestring, strlen(v->valuestring) + 1), 0) : -1;
    if (cJSON_IsNumber(v)) {
        const double d = v->valuedouble;
        if (!isfinite(d)) return -1;
        const int n = d == floor(d) && fabs(d) < 1e15 ? snprintf(t, cap, "%lld", (long long)d) : snprintf(t, cap, "%.17g", d);
        return n < (int)cap ? 0 : -1;
    }
    if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) < 1) return -1;
    size_t used = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (!cJSON_IsNumber(it) || used + 2 >= cap) return -1;
        if (used) t[used++] = ',';
        if (option_text(it, t + used, cap - used)) return -1;
        used += strlen(t + used);
    }
    return 0;
}

int ckv_srv_get_press_options(const cJSON *o, const char *field, ckv_srv_press_options *out, ckv_srv_error *err) {
    enum { VALUE_CAP = 8192 }; /* 256 ratios or 64 ids, as text */
    memset(out, 0, sizeof *out);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, field);
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsObject(v)) return ckv_srv_bad_type(err, field, "an object of press options (name: value)");
    const int n = cJSON_GetArraySize(v);
    if (n > CKV_SRV_MAX_PRESS_OPTIONS) {
        ckv_srv_error_set(err, 400, INVALID, field, "invalid_value", "'%s' has %d options, at most %d are allowed", field, n,
                          CKV_SRV_MAX_PRESS_OPTIONS);
        return -1;
    }
    if (n == 0) return 0;
    if (!(out->text = malloc((size_t)n * VALUE_CAP))) {
        ckv_srv_error_set(err, 500, "server_error", field, NULL, "out of memory");
        return -1;
    }
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        char *t = out->text + (size_t)out->n * VALUE_CAP;
        if (option_text(it, t, VALUE_CAP)) {
            ckv_srv_error_set(err, 400, INVALID, field, "invalid_type",
                              "'%s': option '%s' must be a number, a boolean, a string or an array of numbers", field,
                              it->string);
            ckv_srv_press_options_free(out);
            return -1;
        }
        out->v[out->n].key = it->string;
        out->v[out->n].value = t;
        out->n++;
    }
    return 0;
}

void ckv_srv_press_options_free(ckv_srv_press_options *po) {
    if (!po) return;
    free(po->text);
    memset(po, 0, sizeof *po);
}

/* ---- sampling fields ------------------------------------------------------------------------------- */

/* The request fields each endpoint knows (everything else is refused, as OpenAI does). */
static const char *const common_fields[] = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "seed", "stop", "stream", "stream_options",
    "ignore_eos", "logprobs", "logit_bias", "frequency_penalty", "presence_penalty", "repetition_penalty", "user",
    "context", "press", "budget", "compression_ratio", "query_aware", "decode_press", "decode_interval", "decode_target",
    "decode_ratio", "press_options", "decode_press_options", NULL};
static const char *const completion_fields[] = {"prompt", "echo", "best_of", "suffix", "grammar", NULL};
static const char *const chat_fields[] = {"messages", "max_completion_tokens", "top_logprobs", "response_format", "grammar", "tools",
                                          "tool_choice", "parallel_tool_calls", "functions", "function_call", NULL};

static int in_list(const char *const *l, const char *k) {
    for (; *l; l++)
        if (!strcmp(*l, k)) return 1;
    return 0;
}

int ckv_srv_known_fields(const cJSON *o, ckv_srv_kind kind, ckv_srv_error *err) {
    const cJSON *it;
    cJSON_ArrayForEach(it, o) {
        const char *k = it->string ? it->string : "";
        if (in_list(common_fields, k) || in_list(kind == CKV_SRV_CHAT ? chat_fields : completion_fields, k)) continue;
        ckv_srv_error_set(err, 400, INVALID, k, "unknown_field", "unrecognized request argument '%.60s' (%s)", k,
                          kind == CKV_SRV_CHAT ? "/v1/chat/completions" : "/v1/completions");
        return -1;
    }
    return 0;
}

/* "logit_bias": {"token id": bias in [-100, 100], ...} (OpenAI). */
static int logit_bias_field(const ckv_srv_api *a, const cJSON *o, ckv_logits_config *lc, ckv_srv_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "logit_bias");
    if (!v || cJSON_IsNull(v)) return 0;
    if (!cJSON_IsObject(v)) return ckv_srv_bad_type(err, "logit_bias", "an object mapping token ids to numbers");
    int V = a->engine->model->cfg.vocab_size;
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        char *end = NULL;
        long id = strtol(it->string, &end, 10);
        if (!it->string[0] || *end || id < 0 || id >= V) {
            ckv_srv_error_set(err, 400, INVALID, "logit_bias", "invalid_value", "'logit_bias': '%.40s' is not a token id in [0, %d)",
                              it->string, V);
            return -1;
        }
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < -100 || it->valuedouble > 100) {
            ckv_srv_error_set(err, 400, INVALID, "logit_bias", "invalid_value", "'logit_bias'[%ld] must be a number in [-100, 100]", id);
            return -1;
        }
        if (lc->n_bias >= CKV_LOGITS_MAX_BIAS) {
            ckv_srv_error_set(err, 400, INVALID, "logit_bias", "invalid_value", "'logit_bias' has more than %d entries",
                              CKV_LOGITS_MAX_BIAS);
            return -1;
        }
        lc->bias_ids[lc->n_bias] = (int32_t)id;
        lc->bias[lc->n_bias++] = (float)it->valuedouble;
    }
    return 0;
}

/* Penalties, logit_bias and the fields refused because they would otherwise do nothing. */
int ckv_srv_sampling_fields(const ckv_srv_api *a, const cJSON *o, ckv_srv_kind kind, long long n, ckv_srv_job *j,
                           ckv_srv_error *err) {
    double fp = 0, pp = 0, rp = 1, min_p = 0;
    long long best_of = n;
    const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(o, "suffix");
    if (ckv_srv_get_number(o, "frequency_penalty", -2, 2, &fp, err) || ckv_srv_get_number(o, "presence_penalty", -2, 2, &pp, err) ||
        ckv_srv_get_number(o, "repetition_penalty", 1e-6, 1e6, &rp, err) || ckv_srv_get_number(o, "min_p", 0, 1, &min_p, err) ||
        (kind == CKV_SRV_COMPLETION && ckv_srv_get_int(o, "best_of", 1, CKV_SRV_MAX_CHOICES, &best_of, err)) ||
        logit_bias_field(a, o, &j->logits, err))
        return -1;
    if (best_of != n) {
        ckv_srv_error_set(err, 400, INVALID, "best_of", "unsupported",
                          "'best_of' other than 'n' is not supported (ask for n choices and rank them by their logprobs)");
        return -1;
    }
    if (suffix && !cJSON_IsNull(suffix) && !(cJSON_IsString(suffix) && !suffix->valuestring[0])) {
        ckv_srv_error_set(err, 400, INVALID, "suffix", "unsupported", "'suffix' needs an infill template, which this model does not have");
        return -1;
    }
    j->logits.frequency_penalty = (float)fp;
    j->logits.presence_penalty = (float)pp;
    j->logits.repetition_penalty = (float)rp;
    j->sampling.min_p = (float)min_p;
    return 0;
}

/* response_format json_schema: {"name": ..., "schema": {...}, "strict": bool, "description": ...}. */
static int json_schema_format(const cJSON *rf, ckv_srv_job *j, ckv_srv_error *err) {
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(rf, "json_schema"), *it;
    if (!cJSON_IsObject(js)) return ckv_srv_bad_type(err, "response_format.json_schema", "an object with 'name' and 'schema'");
    cJSON_ArrayForEach(it, js) {
        if (!strcmp(it->string, "name") || !strcmp(it->string, "schema") || !strcmp(it->string, "strict") ||
            !strcmp(it->string, "description"))
            continue;
        ckv_srv_error_set(err, 400, INVALID, "response_format", "unknown_field", "'response_format.json_schema' has an unknown field '%.60s'",
                          it->string);
        return -1;
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(js, "name"), *schema = cJSON_GetObjectItemCaseSensitive(js, "schema");
    const cJSON *strict = cJSON_GetObjectItemCaseSensitive(js, "strict");
    size_t nl = cJSON_IsString(name) ? strlen(name->valuestring) : 0;
    if (nl == 0 || nl > 64 || strspn(name->valuestring, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != nl)
        return ckv_srv_bad_type(err, "response_format.json_schema.name", "a name of 1 to 64 letters, digits, '_' or '-'");
    if (strict && !cJSON_IsNull(strict) && !cJSON_IsBool(strict))
        return ckv_srv_bad_type(err, "response_format.json_schema.strict", "a boolean");
    if (schema && !cJSON_IsNull(schema) && !cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return ckv_srv_bad_type(err, "response_format.json_schema.schema", "a JSON schema (an object)");
    char msg[300];
    cJSON any = {.type = cJSON_True}; /* no schema: any JSON value */
    if (ckv_grammar_init_schema(&j->grammar, schema && !cJSON_IsNull(schema) ? schema : &any, cJSON_IsTrue(strict), msg,
                                sizeof msg) != CKV_STATUS_OK) {
        ckv_error_clear();
        ckv_srv_error_set(err, 400, INVALID, "response_format", "invalid_schema", "'response_format' json_schema %s", msg);
        return -1;
    }
    j->logits.grammar = &j->grammar;
    return 0;
}

/* response_format (chat) and the "grammar" extension: the constrained decoder. */
int ckv_srv_format_fields(const cJSON *o, ckv_srv_kind kind, ckv_srv_job *j, ckv_srv_error *err) {
    const cJSON *gr = cJSON_GetObjectItemCaseSensitive(o, "grammar");
    const cJSON *rf = kind == CKV_SRV_CHAT ? cJSON_GetObjectItemCaseSensitive(o, "response_format") : NULL;
    const cJSON *ty = cJSON_IsObject(rf) ? cJSON_GetObjectItemCaseSensitive(rf, "type") : NULL;
    if (gr && !cJSON_IsNull(gr)) {
        if (!cJSON_IsString(gr)) return ckv_srv_bad_type(err, "grammar", "a string (a GBNF grammar)");
        if (cJSON_IsString(ty) && strcmp(ty->valuestring, "text") != 0) {
            ckv_srv_error_set(err, 400, INVALID, "grammar", "invalid_value", "'grammar' and 'response_format' %.40s cannot be combined",
                              ty->valuestring);
            return -1;
        }
        char msg[300];
        if (ckv_grammar_init_gbnf(&j->grammar, gr->valuestring, msg, sizeof msg) != CKV_STATUS_OK) {
            ckv_error_clear();
            ckv_srv_error_set(err, 400, INVALID, "grammar", "invalid_grammar", "'grammar': %s", msg);
            return -1;
        }
        j->logits.grammar = &j->grammar;
    }
    if (kind != CKV_SRV_CHAT) return 0;
    if (rf && !cJSON_IsNull(rf)) {
        if (!cJSON_IsString(ty)) return ckv_srv_bad_type(err, "response_format", "an object with a 'type'");
        if (!strcmp(ty->valuestring, "json_object")) {
            if (ckv_grammar_init_json_object(&j->grammar) != CKV_STATUS_OK) {
                ckv_srv_error_set(err, 500, "server_error", "response_format", NULL, "%s", ckv_error_message());
                ckv_error_clear();
                return -1;
            }
            j->logits.grammar = &j->grammar;
        } else if (!strcmp(ty->valuestring, "json_schema")) {
            if (json_schema_format(rf, j, err)) return -1;
        } else if (strcmp(ty->valuestring, "text") != 0) {
            ckv_srv_error_set(err, 400, INVALID, "response_format.type", "invalid_value",
                              "'response_format.type' is '%.40s', expected 'text', 'json_object' or 'json_schema'", ty->valuestring);
            return -1;
        }
    }
    return 0;
}

/* ---- tools ------------------------------------------------------------------------------------------ */

static int bad_value(ckv_srv_error *err, const char *field, const char *msg) {
    ckv_srv_error_set(err, 400, INVALID, field, "invalid_value", "'%s' %s", field, msg);
    return -1;
}

/* OpenAI's rule for function names: ^[a-zA-Z0-9_-]{1,64}$ */
static int good_name(const char *s) {
    size_t n = strlen(s);
    if (n < 1 || n > CKV_TOOLCALL_MAX_NAME) return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_' ||
              s[i] == '-'))
            return 0;
    return 1;
}

/* Only the listed keys in object v (field names it). */
static int only_keys(const cJSON *v, const char *field, const char *const *keys, ckv_srv_error *err) {
    const cJSON *it;
    cJSON_ArrayForEach(it, v) {
        if (in_list(keys, it->string)) continue;
        ckv_srv_error_set(err, 400, INVALID, field, "unknown_field", "'%s' has an unknown member '%.40s'", field, it->string);
        return -1;
    }
    return 0;
}

/* tools[i]: {"type": "function", "function": {"name", "description", "parameters", "strict"}}. */
static int tool_entry(const cJSON *t, int i, ckv_srv_error *err) {
    static const char *const keys[] = {"type", "function", NULL};
    static const char *const fkeys[] = {"name", "description", "parameters", "strict", NULL};
    char field[64];
    snprintf(field, sizeof field, "tools[%d]", i);
    if (!cJSON_IsObject(t)) return ckv_srv_bad_type(err, field, "an object {\"type\": \"function\", \"function\": {...}}");
    if (only_keys(t, field, keys, err)) return -1;
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(t, "type"), *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    snprintf(field, sizeof field, "tools[%d].type", i);
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function")) return bad_value(err, field, "must be 'function'");
    snprintf(field, sizeof field, "tools[%d].function", i);
    if (!cJSON_IsObject(f)) return ckv_srv_bad_type(err, field, "an object with a 'name'");
    if (only_keys(f, field, fkeys, err)) return -1;
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(f, "name"), *d = cJSON_GetObjectItemCaseSensitive(f, "description");
    const cJSON *par = cJSON_GetObjectItemCaseSensitive(f, "parameters"), *st = cJSON_GetObjectItemCaseSensitive(f, "strict");
    snprintf(field, sizeof field, "tools[%d].function.name", i);
    if (!cJSON_IsString(name) || !good_name(name->valuestring))
        return bad_value(err, field, "must be 1 to 64 letters, digits, '_' or '-'");
    snprintf(field, sizeof field, "tools[%d].function.description", i);
    if (d && !cJSON_IsNull(d) && !cJSON_IsString(d)) return ckv_srv_bad_type(err, field, "a string");
    snprintf(field, sizeof field, "tools[%d].function.parameters", i);
    if (par && !cJSON_IsNull(par) && !cJSON_IsObject(par)) return ckv_srv_bad_type(err, field, "a JSON Schema object");
    snprintf(field, sizeof field, "tools[%d].function.strict", i);
    if (st && !cJSON_IsNull(st) && !cJSON_IsBool(st)) return ckv_srv_bad_type(err, field, "a boolean");
    return 0;
}

static const cJSON *tool_by_name(const cJSON *tools, const char *name) {
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return t;
    }
    return NULL;
}

/* tool_choice "required" (any of the tools) or a named function: the constrained decoder (each
 * function's arguments follow its parameters schema; a non-strict one the compiler does not support:
 * any object). */
static int tool_constraint(const cJSON *tools, const char *forced, const ckv_toolcall_syntax *syn, int parallel, ckv_srv_job *j,
                           ckv_srv_error *err) {
    ckv_toolcall_fn fns[CKV_SRV_MAX_TOOLS];
    int n = 0, loose = 0;
    const cJSON *t;
    cJSON_ArrayForEach(t, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
        const char *name = cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring;
        if (forced && strcmp(name, forced)) continue;
        const cJSON *par = cJSON_GetObjectItemCaseSensitive(f, "parameters");
        fns[n++] = (ckv_toolcall_fn){name, cJSON_IsObject(par) ? par : NULL, cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f, "strict"))};
    }
    char msg[320];
    if (ckv_toolcall_grammar_init(&j->grammar, syn, fns, n, parallel && !forced, &loose, msg, sizeof msg) != CKV_STATUS_OK) {
        ckv_error_clear();
        ckv_srv_error_set(err, 400, INVALID, "tools", "invalid_schema", "'tools': %s", msg);
        return -1;
    }
    (void)loose; /* a schema the compiler does not support constrains nothing beyond an object */
    j->logits.grammar = &j->grammar;
    return 0;
}

int ckv_srv_tool_fields(const ckv_srv_api *a, const cJSON *o, ckv_srv_kind kind, ckv_srv_job *j, ckv_srv_error *err) {
    if (kind != CKV_SRV_CHAT) return 0;
    static const char *const legacy[] = {"functions", "function_call"};
    for (int i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, legacy[i]);
        if (v && !cJSON_IsNull(v)) {
            ckv_srv_error_set(err, 400, INVALID, legacy[i], "unsupported", "'%s' (the deprecated function-calling API) is not "
                              "supported: use 'tools' and 'tool_choice'", legacy[i]);
            return -1;
        }
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(o, "tools"), *choice = cJSON_GetObjectItemCaseSensitive(o, "tool_choice");
    int parallel = 1;
    if (ckv_srv_get_bool(o, "parallel_tool_calls", &parallel, err)) return -1;
    int n_tools = 0;
    if (tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) return ckv_srv_bad_type(err, "tools", "an array of tools");
        n_tools = cJSON_GetArraySize(tools);
        if (n_tools > CKV_SRV_MAX_TOOLS) {
            ckv_srv_error_set(err, 400, INVALID, "tools", "invalid_value", "'tools' has %d tools, at most %d are allowed", n_tools,
                              CKV_SRV_MAX_TOOLS);
            return -1;
        }
        int i = 0;
        const cJSON *t;
        cJSON_ArrayForEach(t, tools) {
            if (tool_entry(t, i, err)) return -1;
            const cJSON *nm = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"), "name");
            if (tool_by_name(tools, nm->valuestring) != t) {
                char field[64];
                snprintf(field, sizeof field, "tools[%d].function.name", i);
                return bad_value(err, field, "names a function that an earlier tool already names");
            }
            i++;
        }
    }
    /* tool_choice: "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}} */
    const char *mode = n_tools ? "auto" : "none", *forced = NULL;
    if (choice && !cJSON_IsNull(choice)) {
        if (cJSON_IsString(choice)) {
            mode = choice->valuestring;
            if (strcmp(mode, "none") && strcmp(mode, "auto") && strcmp(mode, "required"))
                return bad_value(err, "tool_choice", "must be 'none', 'auto', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}");
        } else if (cJSON_IsObject(choice)) {
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(choice, "type"), *f = cJSON_GetObjectItemCaseSensitive(choice, "function");
            const cJSON *nm = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
            if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "function") || !cJSON_IsString(nm))
                return bad_value(err, "tool_choice", "as an object must be {\"type\": \"function\", \"function\": {\"name\": ...}}");
            mode = "required";
            forced = nm->valuestring;
        } else {
            return ckv_srv_bad_type(err, "tool_choice", "a string or an object");
        }
        if (strcmp(mode, "none") && !n_tools)
            return bad_value(err, "tool_choice", "needs 'tools' (a non-empty list of functions)");
        if (forced && !tool_by_name(tools, forced)) {
            ckv_srv_error_set(err, 400, INVALID, "tool_choice", "invalid_value", "'tool_choice' names the function '%.64s', which "
                              "is not in 'tools'", forced);
            return -1;
        }
    }
    const cJSON *pv = cJSON_GetObjectItemCaseSensitive(o, "parallel_tool_calls");
    if (!n_tools && pv && !cJSON_IsNull(pv)) return bad_value(err, "parallel_tool_calls", "needs 'tools' (a non-empty list of functions)");
    if (!n_tools) return 0;
    const cJSON *ctx = cJSON_GetObjectItemCaseSensitive(o, "context");
    if (ctx && !cJSON_IsNull(ctx)) {
        ckv_srv_error_set(err, 400, INVALID, "tools", "unsupported", "'tools' with 'context' is not supported (put the context in "
                          "the messages)");
        return -1;
    }
    if (!a->tmpl.tool_syntax[0]) {
        ckv_srv_error_set(err, 400, INVALID, "tools", "unsupported", "'tools': the model's chat template (%s) takes no tools",
                          a->tmpl.name[0] ? a->tmpl.name : "none");
        return -1;
    }
    const ckv_toolcall_syntax *syn = ckv_toolcall_syntax_find(a->tmpl.tool_syntax);
    if (!syn) {
        ckv_srv_error_set(err, 500, "server_error", "tools", NULL, "the chat template's tool syntax '%s' is unknown", a->tmpl.tool_syntax);
        return -1;
    }
    j->parallel_tool_calls = parallel;
    if (!strcmp(mode, "none")) return 0; /* the tools are shown to the model; its answer is text */
    j->tool_syntax = syn;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "stream"))) { /* the stream's parsers, sized now */
        j->tool_parsers = calloc((size_t)j->n_choices, sizeof *j->tool_parsers);
        ckv_status st = j->tool_parsers ? CKV_STATUS_OK : ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
        for (int c = 0; st == CKV_STATUS_OK && c < j->n_choices; c++)
            st = ckv_toolcall_parser_init(&j->tool_parsers[c], syn, j->choices[c].text_cap, 0); /* seeded at the first chunk */
        if (st != CKV_STATUS_OK) {
            ckv_srv_error_set(err, 500, "server_error", "tools", NULL, "%s", ckv_error_message());
            ckv_error_clear();
            return -1;
        }
    }
    if (strcmp(mode, "required")) return 0;
    if (j->logits.grammar) {
        ckv_srv_error_set(err, 400, INVALID, "tool_choice", "invalid_value", "'tool_choice' %s and 'response_format' (or "
                          "'grammar') cannot both constrain the answer", forced ? "naming a function" : "required");
        return -1;
    }
    return tool_constraint(tools, forced, syn, parallel, j, err);
}

/* An assistant's tool_calls ([{"id", "type": "function", "function": {"name", "arguments"}}]) or a
 * tool result's tool_call_id. */
int ckv_srv_message_tools(const cJSON *msg, int i, const char *role, const cJSON **calls, ckv_srv_error *err) {
    char field[80];
    *calls = NULL;
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(msg, "tool_call_id");
    snprintf(field, sizeof field, "messages[%d].tool_calls", i);
    if (tc && !cJSON_IsNull(tc)) {
        if (strcmp(role, "assistant")) return bad_value(err, field, "is allowed in assistant messages only");
        if (!cJSON_IsArray(tc)) return ckv_srv_bad_type(err, field, "an array of tool calls");
        int k = 0;
        const cJSON *c;
        cJSON_ArrayForEach(c, tc) {
            snprintf(field, sizeof field, "messages[%d].tool_calls[%d]", i, k++);
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(c, "function");
            const cJSON *ty = cJSON_GetObjectItemCaseSensitive(c, "type");
            const cJSON *nm = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "name") : NULL;
            const cJSON *ar = cJSON_IsObject(f) ? cJSON_GetObjectItemCaseSensitive(f, "arguments") : NULL;
            if (!cJSON_IsObject(c) || (ty && !(cJSON_IsString(ty) && !strcmp(ty->valuestring, "function"))) || !cJSON_IsString(nm) ||
                !good_name(nm->valuestring) || !cJSON_IsString(ar))
                return ckv_srv_bad_type(err, field, "{\"id\": ..., \"type\": \"function\", \"function\": {\"name\": ..., "
                                                    "\"arguments\": a JSON string}}");
        }
        if (k > 0) *calls = tc;
    }
    snprintf(field, sizeof field, "messages[%d].tool_call_id", i);
    if (!strcmp(role, "tool")) {
        if (!cJSON_IsString(id)) return ckv_srv_bad_type(err, field, "a string (the id of the call this message answers)");
    } else if (id && !cJSON_IsNull(id)) {
        return bad_value(err, field, "is allowed in tool messages only");
    }
    return 0;
}

/* logprobs (completions: an integer, the legacy API's count of alternatives; chat: a boolean with
 * "top_logprobs") and echo. */
int ckv_srv_logprob_fields(const cJSON *o, ckv_srv_kind kind, int *want, int *top, int *echo, ckv_srv_error *err) {
    *want = 0;
    *top = 0;
    *echo = 0;
    if (kind == CKV_SRV_COMPLETION) {
        long long k = -1;
        if (ckv_srv_get_int(o, "logprobs", 0, CKV_LOGPROBS_MAX_TOP, &k, err) || ckv_srv_get_bool(o, "echo", echo, err)) return -1;
        *want = k >= 0;
        *top = k > 0 ? (int)k : 0;
        return 0;
    }
    long long k = -1;
    if (ckv_srv_get_bool(o, "logprobs", want, err) || ckv_srv_get_int(o, "top_logprobs", 0, CKV_LOGPROBS_MAX_TOP, &k, err)) return -1;
    if (k >= 0 && !*want) {
        ckv_srv_error_set(err, 400, INVALID, "top_logprobs", "invalid_value", "'top_logprobs' needs 'logprobs': true");
        return -1;
    }
    *top = k > 0 ? (int)k : 0;
    return 0;
}

/* Echo: the echoed ids (the "prompt" part) and, with logprobs, a question holding them so that each
 * gets its row of logits: without "context" the prompt's first token becomes the context and the rest
 * the question (scored with the full cache, as a prefill sees it; nothing is compressed). */
int ckv_srv_echo_setup(const ckv_srv_api *a, ckv_srv_job *j, int with_logprobs, ckv_srv_error *err) {
    int whole = j->n_q == 0; /* the prompt is the context */
    j->n_echo = whole ? j->n_ctx : j->n_q;
    j->echo_ids = malloc(sizeof(int32_t) * (size_t)(j->n_echo > 0 ? j->n_echo : 1));
    if (!j->echo_ids) {
        ckv_srv_error_set(err, 500, "server_error", "echo", NULL, "out of memory");
        return -1;
    }
    memcpy(j->echo_ids, whole ? j->ctx_ids : j->q_ids, sizeof(int32_t) * (size_t)j->n_echo);
    if (ckv_tokenizer_decode(a->tok, j->echo_ids, (size_t)j->n_echo, 0, &j->echo_text, &j->echo_len) != CKV_STATUS_OK) {
        ckv_srv_error_set(err, 400, INVALID, "prompt", "invalid_value", "'prompt': %s", ckv_error_message());
        ckv_error_clear();
        return -1;
    }
    if (!with_logprobs) return 0;
    j->echo_scored = 1;
    if (whole && j->n_ctx > 1) {
        int32_t *q = malloc(sizeof(int32_t) * (size_t)(j->n_ctx - 1));
        if (!q) {
            ckv_srv_error_set(err, 500, "server_error", "echo", NULL, "out of memory");
            return -1;
        }
        memcpy(q, j->ctx_ids + 1, sizeof(int32_t) * (size_t)(j->n_ctx - 1));
        free(j->q_ids);
        j->q_ids = q;
        j->n_q = j->n_ctx - 1;
        j->n_ctx = 1;
    }
    return 0;
}

