/* srv_api.c - request validation, prompt splitting and response writing (see srv_api.h). */
#define _POSIX_C_SOURCE 200809L
#include "server/srv_api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "core/json.h"
#include "core/timer.h"
#include "engine/text.h"
#include "server/srv_fields.h"

#define INVALID "invalid_request_error"
#define CKV_SRV_MAX_MESSAGES 16384 /* messages of one chat request */

void ckv_srv_error_set(ckv_srv_error *e, int http, const char *type, const char *param, const char *code, const char *fmt, ...) {
    e->http = http;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    /* error bodies stay valid UTF-8: a cut ('%.60s', a full buffer) may split a character */
    e->param[ckv_utf8_first_invalid((const uint8_t *)e->param, strlen(e->param))] = '\0';
    e->message[ckv_utf8_first_invalid((const uint8_t *)e->message, strlen(e->message))] = '\0';
}

ckv_status ckv_srv_api_init(ckv_srv_api *a, ckv_engine *e, const ckv_server_config *cfg, size_t piece_cap) {
    memset(a, 0, sizeof *a);
    a->engine = e;
    a->tok = e->cfg.tokenizer;
    a->cfg = cfg;
    a->piece_cap = piece_cap;
    int W = e->model->cfg.max_context;
    a->max_prompt = cfg->max_prompt_tokens > 0 && cfg->max_prompt_tokens < W ? cfg->max_prompt_tokens : W;
    if (cfg->chat_template) {
        CKV_TRY(ckv_chat_template_by_name(cfg->chat_template, &a->tmpl));
    } else {
        const ckv_chat_template *t = ckv_tokenizer_chat_template(a->tok);
        if (t) a->tmpl = *t;
        else a->tmpl.family = CKV_CHAT_NONE;
    }
    return CKV_STATUS_OK;
}

/* The request body as a JSON object, strictly: nothing after it, no key twice in one object, no NUL
 * byte raw or as \u0000 (a C string would be cut there: "user\u0000x" would pass as "user"). */
static cJSON *parse_object(const char *body, size_t len, ckv_srv_error *err) {
    memset(err, 0, sizeof *err);
    ckv_json *o = NULL;
    ckv_status st = ckv_json_check_no_nul(body, len, "the request body");
    size_t bad = st == CKV_STATUS_OK ? ckv_utf8_first_invalid((const uint8_t *)body, len) : len;
    if (bad < len) /* JSON exchanged between systems is UTF-8 (RFC 8259, 8.1); a key or string is echoed in replies */
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "the request body is not valid UTF-8: byte 0x%02x at offset %zu", (uint8_t)body[bad], bad);
    if (st == CKV_STATUS_OK) st = ckv_json_parse_buffer(&o, body, len, "the request body");
    if (st != CKV_STATUS_OK || !cJSON_IsObject(o)) {
        ckv_srv_error_set(err, 400, INVALID, "", "invalid_json", "%s", st != CKV_STATUS_OK ? ckv_error_message() : "the request body is not a JSON object");
        ckv_error_clear();
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* ---- prompts ----------------------------------------------------------------------------------------- */

/* text[len] (plain[n_plain]: its ranges where special-token text stays text) */
static int encode_ranges(const ckv_srv_api *a, const char *text, size_t len, const ckv_text_range *plain, size_t n_plain, int special,
                         const char *field, int32_t **ids, int *n, ckv_srv_error *err) {
    size_t nn = 0;
    *ids = NULL;
    *n = 0;
    ckv_status st = ckv_tokenizer_encode_ranges(a->tok, text, len, special ? CKV_TOKENIZE_ADD_SPECIAL : 0, (size_t)a->max_prompt,
                                                plain, n_plain, ids, &nn);
    if (st != CKV_STATUS_OK) {
        ckv_srv_error_set(err, 400, INVALID, field, "invalid_value", "'%s': %s", field, ckv_error_message());
        ckv_error_clear();
        return -1;
    }
    if (nn > (size_t)a->max_prompt) {
        free(*ids);
        *ids = NULL;
        ckv_srv_error_set(err, 400, INVALID, field, "context_length_exceeded", "'%s' has more than the limit of %d tokens",
                          field, a->max_prompt);
        return -1;
    }
    *n = (int)nn;
    return 0;
}

static int encode_text(const ckv_srv_api *a, const char *text, int special, const char *field, int32_t **ids, int *n,
                       ckv_srv_error *err) {
    return encode_ranges(a, text, strlen(text), NULL, 0, special, field, ids, n, err);
}

/* Token ids given as a JSON array. */
static int parse_ids(const ckv_srv_api *a, const cJSON *arr, const char *field, int32_t **ids, int *n, ckv_srv_error *err) {
    int len = cJSON_GetArraySize(arr);
    *ids = NULL;
    *n = 0;
    if (len > a->max_prompt) {
        ckv_srv_error_set(err, 400, INVALID, field, "context_length_exceeded", "'%s' has %d tokens, more than the limit of %d",
                          field, len, a->max_prompt);
        return -1;
    }
    int32_t *v = malloc(sizeof(int32_t) * (size_t)(len > 0 ? len : 1));
    if (!v) {
        ckv_srv_error_set(err, 500, "server_error", field, NULL, "out of memory");
        return -1;
    }
    int V = a->engine->model->cfg.vocab_size, i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 || it->valuedouble >= V) {
            free(v);
            ckv_srv_error_set(err, 400, INVALID, field, "invalid_value", "'%s'[%d] is not a token id in [0, %d)", field, i, V);
            return -1;
        }
        v[i++] = (int32_t)it->valuedouble;
    }
    *ids = v;
    *n = len;
    return 0;
}

/* A text-or-ids field: a string, an array of token ids, or an array holding one of those. */
static int parse_text_or_ids(const ckv_srv_api *a, const cJSON *v, const char *field, int special, int32_t **ids, int *n,
                             ckv_srv_error *err) {
    if (cJSON_IsArray(v) && cJSON_GetArraySize(v) >= 1) {
        const cJSON *first = cJSON_GetArrayItem(v, 0);
        if (cJSON_IsString(first) || cJSON_IsArray(first)) {
            if (cJSON_GetArraySize(v) != 1) {
                ckv_srv_error_set(err, 400, INVALID, field, "invalid_value", "'%s': one prompt per request (got %d)", field,
                                  cJSON_GetArraySize(v));
                return -1;
            }
            v = first;
        }
    }
    if (cJSON_IsString(v)) return encode_text(a, v->valuestring, special, field, ids, n, err);
    if (cJSON_IsArray(v)) return parse_ids(a, v, field, ids, n, err);
    return ckv_srv_bad_type(err, field, "a string or an array of token ids");
}

static int concat(int32_t **a, int *na, int32_t *b, int nb, ckv_srv_error *err) {
    int32_t *v = realloc(*a, sizeof(int32_t) * (size_t)(*na + nb + 1));
    if (!v) {
        ckv_srv_error_set(err, 500, "server_error", "", NULL, "out of memory");
        return -1;
    }
    if (nb) memcpy(v + *na, b, sizeof(int32_t) * (size_t)nb);
    *a = v;
    *na += nb;
    return 0;
}

static int completion_prompt(const ckv_srv_api *a, const cJSON *o, ckv_srv_job *j, ckv_srv_error *err) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(o, "context");
    if (!p || cJSON_IsNull(p)) {
        ckv_srv_error_set(err, 400, INVALID, "prompt", "missing_field", "'prompt' is required");
        return -1;
    }
    if (c && !cJSON_IsNull(c)) {
        if (parse_text_or_ids(a, c, "context", 1, &j->ctx_ids, &j->n_ctx, err)) return -1;
        if (parse_text_or_ids(a, p, "prompt", 0, &j->q_ids, &j->n_q, err)) return -1;
    } else if (parse_text_or_ids(a, p, "prompt", 1, &j->ctx_ids, &j->n_ctx, err)) {
        return -1;
    }
    return 0;
}

/* The text of a message's content: a string or an array of {"type": "text", "text": ...} parts. */
static char *message_text(const cJSON *content, int i, ckv_srv_error *err) {
    char field[64];
    snprintf(field, sizeof field, "messages[%d].content", i);
    if (cJSON_IsString(content)) return strdup(content->valuestring);
    if (!cJSON_IsArray(content)) {
        ckv_srv_bad_type(err, field, "a string or an array of text parts");
        return NULL;
    }
    size_t len = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, content) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "text");
        const cJSON *ty = cJSON_GetObjectItemCaseSensitive(part, "type");
        if (!cJSON_IsObject(part) || !cJSON_IsString(ty) || strcmp(ty->valuestring, "text") || !cJSON_IsString(t)) {
            ckv_srv_error_set(err, 400, INVALID, field, "invalid_value", "'%s': only {\"type\": \"text\", \"text\": ...} parts are supported", field);
            return NULL;
        }
        len += strlen(t->valuestring);
    }
    char *s = malloc(len + 1);
    if (!s) return NULL;
    size_t o = 0;
    cJSON_ArrayForEach(part, content) { /* appended at the end (strcat would rescan the text per part) */
        const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        size_t l = strlen(t);
        memcpy(s + o, t, l);
        o += l;
    }
    s[o] = '\0';
    return s;
}

/* full[off, off + len) of a rendered chat; its content ranges are plain text unless the server was
 * started with --special-in-content. */
static int encode_rendered(const ckv_srv_api *a, const char *full, size_t off, size_t len, const ckv_text_range *plain,
                           size_t n_plain, int32_t **ids, int *n, ckv_srv_error *err) {
    if (a->cfg->special_in_content) n_plain = 0;
    ckv_text_range *r = n_plain ? malloc(n_plain * sizeof *r) : NULL;
    if (n_plain && !r) {
        ckv_srv_error_set(err, 500, "server_error", "messages", NULL, "out of memory");
        return -1;
    }
    size_t k = 0;
    for (size_t i = 0; i < n_plain; i++) { /* the ranges inside the slice, relative to it */
        size_t lo = plain[i].off, hi = plain[i].off + plain[i].len;
        if (hi <= off || lo >= off + len) continue;
        lo = lo < off ? off : lo;
        hi = hi > off + len ? off + len : hi;
        r[k++] = (ckv_text_range){lo - off, hi - lo};
    }
    int rc = encode_ranges(a, full + off, len, r, k, 0, "messages", ids, n, err);
    free(r);
    return rc;
}

static int chat_prompt(const ckv_srv_api *a, const cJSON *o, ckv_srv_job *j, ckv_srv_error *err) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(o, "messages");
    if (!msgs || cJSON_IsNull(msgs)) {
        ckv_srv_error_set(err, 400, INVALID, "messages", "missing_field", "'messages' is required");
        return -1;
    }
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) < 1) return ckv_srv_bad_type(err, "messages", "a non-empty array of messages");
    if (a->tmpl.family == CKV_CHAT_NONE) {
        ckv_srv_error_set(err, 400, INVALID, "messages", "no_chat_template",
                          "the model has no chat template: use /v1/completions (or start the server with --template)");
        return -1;
    }
    int n = cJSON_GetArraySize(msgs), last_user = -1, rc = -1;
    if (n > CKV_SRV_MAX_MESSAGES) {
        ckv_srv_error_set(err, 400, INVALID, "messages", "too_many_messages", "'messages' has %d messages, more than the limit of %d",
                          n, CKV_SRV_MAX_MESSAGES);
        return -1;
    }
    ckv_chat_message *m = calloc((size_t)n, sizeof *m);
    const cJSON **calls_of = calloc((size_t)n, sizeof *calls_of); /* [n] assistant tool_calls */
    char **texts = calloc((size_t)n, sizeof *texts);
    char *full = NULL, *prefix = NULL;
    ckv_text_range *plain = NULL; /* [n_plain] the messages' content in full */
    size_t n_plain = 0;
    const char *context = NULL;
    if (!m || !texts || !calls_of) {
        ckv_srv_error_set(err, 500, "server_error", "messages", NULL, "out of memory");
        goto done;
    }
    const cJSON *msg = msgs->child; /* walked once: cJSON_GetArrayItem(i) would walk from the start each time */
    for (int i = 0; i < n; i++, msg = msg->next) {
        char field[64];
        snprintf(field, sizeof field, "messages[%d]", i);
        if (!cJSON_IsObject(msg)) {
            ckv_srv_bad_type(err, field, "an object with 'role' and 'content'");
            goto done;
        }
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(msg, "role");
        snprintf(field, sizeof field, "messages[%d].role", i);
        if (!cJSON_IsString(role)) {
            ckv_srv_bad_type(err, field, "one of 'system', 'developer', 'user', 'assistant'");
            goto done;
        }
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) r = "system";
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "tool")) {
            ckv_srv_error_set(err, 400, INVALID, field, "invalid_value",
                              "'%s' is '%s', expected system, developer, user, assistant or tool", field, role->valuestring);
            goto done;
        }
        const cJSON *calls = NULL, *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
        if (ckv_srv_message_tools(msg, i, r, &calls, err)) goto done;
        if (!(calls && (!content || cJSON_IsNull(content))) && !(texts[i] = message_text(content, i, err))) {
            if (!err->http) ckv_srv_error_set(err, 500, "server_error", "messages", NULL, "out of memory");
            goto done;
        }
        m[i] = (ckv_chat_message){r, texts[i]};
        calls_of[i] = calls;
        if (!strcmp(r, "user")) last_user = i;
    }
    if (ckv_srv_get_string(o, "context", &context, err)) goto done;
    if (context) { /* kvpress's split: one user turn "context + question" */
        int sys = n == 2 && !strcmp(m[0].role, "system");
        if (!(n == 1 || sys) || strcmp(m[n - 1].role, "user")) {
            ckv_srv_error_set(err, 400, INVALID, "context", "invalid_value",
                              "with 'context', 'messages' must be one user message (the question), optionally after a system message");
            goto done;
        }
        ckv_status st = ckv_text_encode_split(a->tok, context, m[n - 1].content,
                                              CKV_TEXT_CHAT | (a->cfg->special_in_content ? CKV_TEXT_SPECIAL_IN_CONTENT : 0), a->cfg->chat_template,
                                              sys ? m[0].content : NULL, &j->ctx_ids, &j->n_ctx, &j->q_ids, &j->n_q);
        if (st != CKV_STATUS_OK) {
            ckv_srv_error_set(err, 400, INVALID, "context", "invalid_value", "%s", ckv_error_message());
            ckv_error_clear();
            goto done;
        }
        if (j->n_ctx + j->n_q > a->max_prompt) {
            ckv_srv_error_set(err, 400, INVALID, "context", "context_length_exceeded", "the prompt has %d tokens, more than the limit of %d",
                              j->n_ctx + j->n_q, a->max_prompt);
            goto done;
        }
        rc = 0;
        goto done;
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(o, "tools"); /* checked by ckv_srv_tool_fields */
    if (ckv_chat_apply_tools(&a->tmpl, cJSON_IsArray(tools) ? tools : NULL, m, calls_of, n, 1, &full, &plain, &n_plain) != CKV_STATUS_OK) {
        ckv_srv_error_set(err, 400, INVALID, "messages", "invalid_value", "%s", ckv_error_message());
        ckv_error_clear();
        goto done;
    }
    size_t lp = 0;
    if (last_user > 0 &&
        ckv_chat_apply_tools(&a->tmpl, cJSON_IsArray(tools) ? tools : NULL, m, calls_of, last_user, 0, &prefix, NULL, NULL) == CKV_STATUS_OK) {
        lp = strlen(prefix);
        if (strncmp(full, prefix, lp) != 0) lp = 0;
    }
    ckv_error_clear();
    if (lp > 0) {
        if (encode_rendered(a, full, 0, lp, plain, n_plain, &j->ctx_ids, &j->n_ctx, err)) goto done;
        if (encode_rendered(a, full, lp, strlen(full + lp), plain, n_plain, &j->q_ids, &j->n_q, err)) goto done;
    } else if (encode_rendered(a, full, 0, strlen(full), plain, n_plain, &j->ctx_ids, &j->n_ctx, err)) {
        goto done;
    }
    if (j->n_ctx + j->n_q > a->max_prompt) {
        ckv_srv_error_set(err, 400, INVALID, "messages", "context_length_exceeded", "the prompt has %d tokens, more than the limit of %d",
                          j->n_ctx + j->n_q, a->max_prompt);
        goto done;
    }
    rc = 0;
done:
    for (int i = 0; texts && i < n; i++) free(texts[i]);
    free(texts);
    free(m);
    free((void *)calls_of);
    free(full);
    free(prefix);
    free(plain);
    return rc;
}

/* ---- press ------------------------------------------------------------------------------------------ */

/* The request field a press error names: the options' object for one of its options or an option the
 * press requires (compression_ratios, ...), else the press field it names. */
static const char *press_error_field(const ckv_press_error *pe) {
    static const char *const own[] = {"press", "budget", "compression_ratio", "query_aware"};
    if (pe->option || !pe->field) return pe->option ? "press_options" : "press";
    for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
        if (!strcmp(pe->field, own[i])) return own[i];
    return !strcmp(pe->field, "budget_tokens") ? "budget" : "press_options";
}

/* "press", "budget" / "compression_ratio", "query_aware" and "press_options" (the press's options by
 * name, as --press-opt gives them; options naming files stay the server's). */
static int press_fields(const ckv_srv_api *a, const cJSON *o, ckv_srv_job *j, ckv_srv_error *err) {
    const char *spec = NULL;
    double budget = -1, cr = -1;
    int qa = -1;
    if (ckv_srv_get_string(o, "press", &spec, err) || ckv_srv_get_number(o, "budget", 1e-9, 1, &budget, err) ||
        ckv_srv_get_number(o, "compression_ratio", 0, 1 - 1e-9, &cr, err) || ckv_srv_get_bool(o, "query_aware", &qa, err))
        return -1;
    if (budget >= 0 && cr >= 0) {
        ckv_srv_error_set(err, 400, INVALID, "compression_ratio", "invalid_value", "give 'budget' or 'compression_ratio', not both");
        return -1;
    }
    ckv_srv_press_options po;
    if (ckv_srv_get_press_options(o, "press_options", &po, err)) return -1;
    /* "none" takes nothing from the server's defaults (their budget would be refused with it) */
    ckv_press_request rq = {.defaults = spec && !strcmp(spec, "none") ? NULL : a->cfg->default_press, .spec = spec,
                            .options = po.v, .n_options = po.n, .query_aware = qa,
                            .flags = CKV_PRESS_NEED_BUDGET | CKV_PRESS_NEED_FILES | CKV_PRESS_NO_FILE_OPTIONS};
    if (budget >= 0) rq.budget = (ckv_press_budget){CKV_BUDGET_FRACTION, budget};
    else if (cr >= 0) rq.budget = (ckv_press_budget){CKV_BUDGET_RATIO, cr};
    ckv_press_error pe;
    ckv_status st = ckv_press_build(&j->press, &rq, &pe);
    ckv_srv_press_options_free(&po);
    if (st == CKV_STATUS_OK && (st = ckv_press_check_layers(&j->press, a->engine->model->cfg.n_layers)) != CKV_STATUS_OK)
        pe = (ckv_press_error){.field = "compression_ratios", .missing = 0, .option = 1};
    if (st != CKV_STATUS_OK) {
        ckv_srv_error_set(err, 400, INVALID, press_error_field(&pe), pe.missing ? "missing_field" : "invalid_value", "%s",
                          ckv_error_message());
        ckv_error_clear();
        return -1;
    }
    return 0;
}

/* "decode_press", "decode_interval", "decode_target" or "decode_ratio": decode-time compression of
 * every choice (docs/presses.md), the server's default (--decode-press) when the request names no press
 * ("none": off); the counts alone change the default's. After press_fields (a press with cross-head
 * allocation before it is refused, as the command line refuses it). */
static int decode_fields(const ckv_srv_api *a, const cJSON *o, ckv_srv_job *j, ckv_srv_error *err) {
    const char *spec = NULL;
    long long interval = -1, target = -1;
    double ratio = -1;
    if (ckv_srv_get_string(o, "decode_press", &spec, err) || ckv_srv_get_int(o, "decode_interval", 1, 1 << 24, &interval, err) ||
        ckv_srv_get_int(o, "decode_target", 1, 1 << 24, &target, err) ||
        ckv_srv_get_number(o, "decode_ratio", 1e-9, 1 - 1e-9, &ratio, err))
        return -1;
    const cJSON *opts = cJSON_GetObjectItemCaseSensitive(o, "decode_press_options");
    if (opts && !cJSON_IsNull(opts) && (!spec || !strcmp(spec, "none"))) {
        ckv_srv_error_set(err, 400, INVALID, "decode_press_options", "invalid_value",
                          "'decode_press_options' needs 'decode_press' (the options are that press's)");
        return -1;
    }
    if (target >= 0 && ratio >= 0) {
        ckv_srv_error_set(err, 400, INVALID, "decode_ratio", "invalid_value", "give 'decode_target' or 'decode_ratio', not both");
        return -1;
    }
    const ckv_decode_press *def = a->cfg->default_decode_press;
    if ((spec && !strcmp(spec, "none")) || (!spec && !def)) {
        const char *f = interval >= 0 ? "decode_interval" : target >= 0 ? "decode_target" : ratio >= 0 ? "decode_ratio" : NULL;
        if (f) {
            ckv_srv_error_set(err, 400, INVALID, f, "invalid_value",
                              "'%s' needs 'decode_press' (the press that compresses during generation)", f);
            return -1;
        }
        return 0;
    }
    ckv_status st;
    if (spec) {
        ckv_srv_press_options po;
        if (ckv_srv_get_press_options(o, "decode_press_options", &po, err)) return -1;
        st = ckv_decode_press_build(&j->decode, spec, interval >= 0 ? (int)interval : CKV_DECODE_INTERVAL_DEFAULT,
                                    ratio >= 0 ? 0 : target >= 0 ? (int)target : CKV_DECODE_TARGET_DEFAULT, ratio >= 0 ? ratio : -1,
                                    po.v, po.n);
        for (int i = 0; i < po.n && st == CKV_STATUS_OK; i++) /* the builder ignores options its press does not take */
            if (!ckv_press_takes(&j->decode.press, po.v[i].key)) {
                ckv_srv_error_set(err, 400, INVALID, "decode_press_options", "invalid_value",
                                  "decode press %s does not take option %s (its options are those its spec lists: %s)", spec,
                                  po.v[i].key, j->decode.press.spec);
                ckv_srv_press_options_free(&po);
                return -1;
            }
        ckv_srv_press_options_free(&po);
    } else { /* the default's scorer and options, the request's counts */
        j->decode = *def;
        int by_ratio = ratio >= 0 || (target < 0 && def->ratio >= 0);
        st = ckv_decode_press_set_counts(&j->decode, interval >= 0 ? (int)interval : def->interval,
                                         by_ratio ? 0 : target >= 0 ? (int)target : def->target,
                                         by_ratio ? (ratio >= 0 ? ratio : def->ratio) : -1);
    }
    if (st == CKV_STATUS_OK) st = ckv_decode_press_check_prefill(&j->decode, &j->press);
    if (st != CKV_STATUS_OK) {
        ckv_srv_error_set(err, 400, INVALID, "decode_press", "invalid_value", "%s", ckv_error_message());
        ckv_error_clear();
        return -1;
    }
    j->has_decode = 1;
    return 0;
}

/* ---- stop strings ------------------------------------------------------------------------------------ */

static int stop_field(const cJSON *o, ckv_srv_job *j, ckv_srv_error *err) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "stop");
    if (!v || cJSON_IsNull(v)) return 0;
    const cJSON *items[CKV_SRV_MAX_STOP];
    int n = 0;
    if (cJSON_IsString(v)) {
        items[n++] = v;
    } else if (cJSON_IsArray(v)) {
        if (cJSON_GetArraySize(v) > CKV_SRV_MAX_STOP) {
            ckv_srv_error_set(err, 400, INVALID, "stop", "invalid_value", "'stop' has %d strings, at most %d are allowed",
                              cJSON_GetArraySize(v), CKV_SRV_MAX_STOP);
            return -1;
        }
        const cJSON *it;
        cJSON_ArrayForEach(it, v) {
            if (!cJSON_IsString(it)) return ckv_srv_bad_type(err, "stop", "a string or an array of strings");
            items[n++] = it;
        }
    } else {
        return ckv_srv_bad_type(err, "stop", "a string or an array of strings");
    }
    for (int i = 0; i < n; i++) {
        size_t l = strlen(items[i]->valuestring);
        if (l == 0 || l > 256) {
            ckv_srv_error_set(err, 400, INVALID, "stop", "invalid_value", "stop strings must have 1 to 256 bytes");
            return -1;
        }
        if (!(j->stop[j->n_stop] = strdup(items[i]->valuestring))) {
            ckv_srv_error_set(err, 500, "server_error", "stop", NULL, "out of memory");
            return -1;
        }
        j->n_stop++;
        if (l > j->stop_max_len) j->stop_max_len = l;
    }
    return 0;
}

/* ---- requests --------------------------------------------------------------------------------------- */

static unsigned long long next_id(void) {
    static unsigned long long counter;
    return __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
}

/* One job from a request object (deleted here). */
static int parse_job(const ckv_srv_api *a, ckv_srv_kind kind, cJSON *o, ckv_srv_job **out, ckv_srv_error *err) {
    const ckv_server_config *cfg = a->cfg;
    long long max_tokens = -1, n = 1, seed = -1, top_k = 0;
    double temperature = 1.0, top_p = 1.0;
    int stream = 0, include_usage = 0, ignore_eos = 0, logprobs = 0, top_logprobs = 0, echo = 0;
    const char *model = NULL;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(o, "stream_options");
    int bad = ckv_srv_known_fields(o, kind, err) || ckv_srv_get_string(o, "model", &model, err) ||
              ckv_srv_get_int(o, "max_tokens", 0, cfg->max_tokens_limit, &max_tokens, err) ||
              (kind == CKV_SRV_CHAT && ckv_srv_get_int(o, "max_completion_tokens", 0, cfg->max_tokens_limit, &max_tokens, err)) ||
              ckv_srv_get_number(o, "temperature", 0, 2, &temperature, err) || ckv_srv_get_number(o, "top_p", 1e-9, 1, &top_p, err) ||
              ckv_srv_get_int(o, "top_k", 0, 1e9, &top_k, err) || ckv_srv_get_int(o, "n", 1, CKV_SRV_MAX_CHOICES, &n, err) ||
              ckv_srv_get_int(o, "seed", -9.2e18, 9.2e18, &seed, err) || ckv_srv_get_bool(o, "stream", &stream, err) ||
              ckv_srv_get_bool(o, "ignore_eos", &ignore_eos, err) || ckv_srv_logprob_fields(o, kind, &logprobs, &top_logprobs, &echo, err);
    if (!bad && so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) bad = ckv_srv_bad_type(err, "stream_options", "an object");
        else bad = ckv_srv_get_bool(so, "include_usage", &include_usage, err);
    }
    if (!bad && model && cfg->model_name && strcmp(model, cfg->model_name) != 0) {
        ckv_srv_error_set(err, 404, INVALID, "model", "model_not_found", "the model '%s' does not exist (this server serves '%s')",
                          model, cfg->model_name);
        bad = 1;
    }
    int W = a->engine->model->cfg.max_context;
    /* the job is sized before the prompt is known: the longest answer that can fit (a request naming no
     * max_tokens gets the rest of the window, at most --default-max-tokens when set, and at most
     * --max-tokens-limit) */
    long long cap = cfg->max_tokens_limit < W ? cfg->max_tokens_limit : W;
    if (max_tokens < 0 && cfg->default_max_tokens > 0 && cfg->default_max_tokens < cap) cap = cfg->default_max_tokens;
    int default_max = max_tokens < 0;
    if (default_max) max_tokens = cap;
    ckv_srv_job *j = NULL;
    if (!bad && ckv_srv_job_create(&j, (int)max_tokens, (int)n, a->piece_cap) != CKV_STATUS_OK) {
        ckv_srv_error_set(err, 500, "server_error", "", NULL, "%s", ckv_error_message());
        ckv_error_clear();
        bad = 1;
    }
    if (!bad) {
        j->kind = kind;
        bad = ckv_srv_format_fields(o, kind, j, err) || ckv_srv_tool_fields(a, o, kind, j, err) || press_fields(a, o, j, err) || decode_fields(a, o, j, err) ||
              stop_field(o, j, err) ||
              ckv_srv_sampling_fields(a, o, kind, n, j, err) ||
              (kind == CKV_SRV_COMPLETION ? completion_prompt(a, o, j, err) : chat_prompt(a, o, j, err));
    }
    if (!bad && j->n_ctx < 1) {
        ckv_srv_error_set(err, 400, INVALID, kind == CKV_SRV_CHAT ? "messages" : "prompt", "invalid_value", "the prompt is empty");
        bad = 1;
    }
    if (!bad && j->press.scorer == CKV_SCORER_FINCH) { /* its window is the question: query_aware with one */
        if (ckv_press_with_question(&j->press, j->press.query_aware ? j->n_q : 0, &j->press) != CKV_STATUS_OK) {
            ckv_srv_error_set(err, 400, INVALID, "query_aware", "invalid_value", "%s", ckv_error_message());
            ckv_error_clear();
            bad = 1;
        }
    }
    if (!bad && j->press.query_aware && j->n_q > 0) { /* the question is compressed with the context */
        bad = concat(&j->ctx_ids, &j->n_ctx, j->q_ids, j->n_q, err);
        j->ctx_question_rows = j->n_q;
        free(j->q_ids);
        j->q_ids = NULL;
        j->n_q = 0;
    }
    if (!bad && default_max && (long)j->n_ctx + j->n_q + max_tokens > W) { /* the rest of the window */
        max_tokens = W - (long)(j->n_ctx + j->n_q);
        if (max_tokens < 0) max_tokens = 0;
        j->max_tokens = (int)max_tokens;
    }
    if (!bad && (long)j->n_ctx + j->n_q + max_tokens > W) {
        ckv_srv_error_set(err, 400, INVALID, "max_tokens", "context_length_exceeded",
                          "the prompt (%d tokens) + max_tokens (%lld) exceed the context window of %d tokens", j->n_ctx + j->n_q,
                          max_tokens, W);
        bad = 1;
    }
    if (!bad && echo) {
        j->echo = 1;
        bad = ckv_srv_echo_setup(a, j, logprobs, err);
    }
    if (!bad && logprobs && ckv_srv_job_alloc_logprobs(j, top_logprobs) != CKV_STATUS_OK) {
        ckv_srv_error_set(err, 500, "server_error", "logprobs", NULL, "%s", ckv_error_message());
        ckv_error_clear();
        bad = 1;
    }
    cJSON_Delete(o);
    if (bad) {
        if (j) {
            j->refs = 1;
            ckv_srv_job_release(j);
        }
        return -1;
    }
    j->sampling.temperature = (float)temperature;
    j->sampling.top_p = (float)top_p;
    j->sampling.top_k = (int)top_k;
    j->sampling.seed = seed >= 0 ? (uint64_t)seed : (uint64_t)(ckv_time_now() * 1e6) ^ next_id();
    j->ignore_eos = ignore_eos;
    j->stream = stream;
    j->include_usage = include_usage;
    j->created = (long)time(NULL);
    j->t_submit = ckv_time_now();
    snprintf(j->id, sizeof j->id, "%s-%llx%06llx", kind == CKV_SRV_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)j->created,
             next_id());
    *out = j;
    return 0;
}

/* A list of prompts in /v1/completions: one job per prompt (the other fields shared). */
static int is_prompt_list(const cJSON *p) {
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) < 2) return 0;
    const cJSON *first = cJSON_GetArrayItem(p, 0);
    return cJSON_IsString(first) || cJSON_IsArray(first);
}

int ckv_srv_api_parse(const ckv_srv_api *a, ckv_srv_kind kind, const char *body, size_t len, ckv_srv_job **out, int cap,
                      int *n_out, ckv_srv_error *err) {
    *n_out = 0;
    memset(err, 0, sizeof *err);
    cJSON *o = parse_object(body, len, err);
    if (!o) return -1;
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(o, "prompt");
    if (kind != CKV_SRV_COMPLETION || !is_prompt_list(p)) {
        if (parse_job(a, kind, o, &out[0], err)) return -1;
        *n_out = 1;
        return 0;
    }
    int k = cJSON_GetArraySize(p);
    const cJSON *st = cJSON_GetObjectItemCaseSensitive(o, "stream");
    if (k > cap) {
        ckv_srv_error_set(err, 400, INVALID, "prompt", "invalid_value", "'prompt' lists %d prompts, at most %d are allowed", k, cap);
    } else if (cJSON_IsTrue(st)) {
        ckv_srv_error_set(err, 400, INVALID, "stream", "unsupported", "'stream' with a list of prompts is not supported (one request per prompt)");
    } else {
        for (int i = 0; i < k; i++) {
            cJSON *one = cJSON_Duplicate(o, 1);
            cJSON *item = one ? cJSON_Duplicate(cJSON_GetArrayItem(p, i), 1) : NULL;
            if (!one || !item || !cJSON_ReplaceItemInObjectCaseSensitive(one, "prompt", item)) {
                cJSON_Delete(one);
                cJSON_Delete(item);
                ckv_srv_error_set(err, 500, "server_error", "prompt", NULL, "out of memory");
                break;
            }
            if (parse_job(a, kind, one, &out[i], err)) {
                if (err->param[0] == 'p' && !strcmp(err->param, "prompt")) snprintf(err->param, sizeof err->param, "prompt[%d]", i);
                break;
            }
            if (i > 0) memcpy(out[i]->id, out[0]->id, sizeof out[i]->id); /* one response */
            *n_out = i + 1;
        }
    }
    cJSON_Delete(o);
    if (*n_out == k) return 0;
    for (int i = 0; i < *n_out; i++) {
        out[i]->refs = 1;
        ckv_srv_job_release(out[i]);
    }
    *n_out = 0;
    if (!err->http) ckv_srv_error_set(err, 500, "server_error", "prompt", NULL, "out of memory");
    return -1;
}


char *ckv_srv_api_tokenize(const ckv_srv_api *a, const char *body, size_t len, ckv_srv_error *err) {
    cJSON *o = parse_object(body, len, err);
    if (!o) return NULL;
    const char *text = NULL, *model = NULL;
    int add_special = 1;
    if (ckv_srv_get_string(o, "model", &model, err) || ckv_srv_get_string(o, "prompt", &text, err) || ckv_srv_get_bool(o, "add_special_tokens", &add_special, err)) {
        cJSON_Delete(o);
        return NULL;
    }
    if (!text) {
        cJSON_Delete(o);
        ckv_srv_error_set(err, 400, INVALID, "prompt", "missing_field", "'prompt' is required");
        return NULL;
    }
    int32_t *ids = NULL;
    int n = 0;
    int r = encode_text(a, text, add_special, "prompt", &ids, &n, err);
    cJSON_Delete(o);
    if (r) return NULL;
    cJSON *res = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(res, "tokens");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    cJSON_AddNumberToObject(res, "count", n);
    cJSON_AddNumberToObject(res, "max_model_len", a->engine->model->cfg.max_context);
    free(ids);
    return ckv_srv_json_print(res);
}

char *ckv_srv_api_detokenize(const ckv_srv_api *a, const char *body, size_t len, ckv_srv_error *err) {
    cJSON *o = parse_object(body, len, err);
    if (!o) return NULL;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "tokens");
    const char *model = NULL;
    if (ckv_srv_get_string(o, "model", &model, err)) {
        cJSON_Delete(o);
        return NULL;
    }
    if (!t || !cJSON_IsArray(t)) {
        cJSON_Delete(o);
        ckv_srv_error_set(err, 400, INVALID, "tokens", t ? "invalid_type" : "missing_field", "'tokens' must be an array of token ids");
        return NULL;
    }
    int32_t *ids = NULL;
    int n = 0;
    int r = parse_ids(a, t, "tokens", &ids, &n, err);
    cJSON_Delete(o);
    if (r) return NULL;
    char *text = NULL;
    size_t tl = 0;
    ckv_status st = ckv_tokenizer_decode(a->tok, ids, (size_t)n, 0, &text, &tl);
    free(ids);
    if (st != CKV_STATUS_OK) {
        ckv_srv_error_set(err, 400, INVALID, "tokens", "invalid_value", "%s", ckv_error_message());
        ckv_error_clear();
        return NULL;
    }
    cJSON *res = cJSON_CreateObject();
    cJSON_AddStringToObject(res, "prompt", text);
    free(text);
    return ckv_srv_json_print(res);
}
