/* srv_response.c - the JSON the server answers with: completions and chat completions (whole, and
 * as stream chunks; with tools, the answer's tool calls as message.tool_calls and as OpenAI's
 * tool_calls deltas), their logprobs, usage, error objects and the model list (see srv_api.h). It
 * does not validate requests (srv_api.c). */
#define _POSIX_C_SOURCE 200809L
#include "server/srv_api.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "engine/toolcall.h"

#define INVALID "invalid_request_error"

/* ---- responses --------------------------------------------------------------------------------------- */

char *ckv_srv_json_print(cJSON *o) {
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *ckv_srv_api_error_json(const ckv_srv_error *e) {
    cJSON *o = cJSON_CreateObject(), *er = cJSON_AddObjectToObject(o, "error");
    cJSON_AddStringToObject(er, "message", e->message);
    cJSON_AddStringToObject(er, "type", e->type ? e->type : INVALID);
    if (e->param[0]) cJSON_AddStringToObject(er, "param", e->param);
    else cJSON_AddNullToObject(er, "param");
    if (e->code) cJSON_AddStringToObject(er, "code", e->code);
    else cJSON_AddNullToObject(er, "code");
    return ckv_srv_json_print(o);
}

/* OpenAI's finish_reason: an answer cut short (by the drain after SIGTERM, or a client that left) is
 * "length", as one cut by max_tokens; "finish_detail" (an extension) says which ending it was. */
static const char *finish_name(ckv_finish_reason r) {
    switch (r) {
    case CKV_FINISH_LENGTH:
    case CKV_FINISH_CANCELLED: return "length";
    case CKV_FINISH_STOP:
    case CKV_FINISH_EOS: return "stop";
    default: return NULL;
    }
}

/* calls: tool calls were made (an answer that ended by itself then finishes with "tool_calls"). */
static void add_finish_calls(cJSON *it, ckv_finish_reason r, int calls) {
    const char *fin = finish_name(r);
    if (fin && calls && !strcmp(fin, "stop")) fin = "tool_calls";
    if (!fin) {
        cJSON_AddNullToObject(it, "finish_reason");
        return;
    }
    cJSON_AddStringToObject(it, "finish_reason", fin);
    cJSON_AddStringToObject(it, "finish_detail", r == CKV_FINISH_STOP ? "stop_string" : ckv_finish_reason_name(r));
}


/* ---- tool calls ---------------------------------------------------------------------------------------- */

/* The ids of choice c's calls: a function of the response id. */
static uint64_t tool_seed(const ckv_srv_job *j, int c) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (const char *p = j->id; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h ^ (uint64_t)(c + 1) * 0x9E3779B97F4A7C15ull;
}

/* Collects the parser's events into a message (whole: message.tool_calls with whole arguments) or a
 * delta (stream: {index, id, type, function: {name, arguments}} on a call's first delta, then
 * {index, function: {arguments}} fragments). Calls after the first are left out without
 * parallel_tool_calls. */
typedef struct {
    char *text;          /* [cap] content */
    size_t text_len;
    char *args;          /* [cap] the current call's arguments so far (this piece) */
    size_t args_len, cap;
    cJSON *calls;        /* the array being filled (created at the first call) */
    cJSON *fn;           /* the current call's function object */
    int index;           /* the current call (-1: none) */
    int stream, parallel, failed;
} tool_sink;

static void sink_flush_args(tool_sink *t) {
    if (!t->fn) return;
    t->args[t->args_len] = '\0';
    cJSON_AddStringToObject(t->fn, "arguments", t->args);
    t->args_len = 0;
    t->fn = NULL;
}

static int sink_text(void *ctx, const char *s, size_t n) {
    tool_sink *t = ctx;
    if (t->text_len + n >= t->cap) return t->failed = 1;
    memcpy(t->text + t->text_len, s, n);
    t->text_len += n;
    return 0;
}

static int sink_call(void *ctx, int index, const char *id, const char *name) {
    tool_sink *t = ctx;
    if (index > 0 && !t->parallel) return 0;
    sink_flush_args(t);
    if (!t->calls) t->calls = cJSON_CreateArray();
    cJSON *c = cJSON_CreateObject();
    if (t->stream) cJSON_AddNumberToObject(c, "index", index);
    cJSON_AddStringToObject(c, "id", id);
    cJSON_AddStringToObject(c, "type", "function");
    t->fn = cJSON_AddObjectToObject(c, "function");
    cJSON_AddStringToObject(t->fn, "name", name);
    cJSON_AddItemToArray(t->calls, c);
    t->index = index;
    return 0;
}

static int sink_args(void *ctx, int index, const char *s, size_t n) {
    tool_sink *t = ctx;
    if (index > 0 && !t->parallel) return 0;
    if (index != t->index || !t->fn) { /* a later piece of a call begun in an earlier chunk */
        sink_flush_args(t);
        if (!t->calls) t->calls = cJSON_CreateArray();
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", index);
        t->fn = cJSON_AddObjectToObject(c, "function");
        cJSON_AddItemToArray(t->calls, c);
        t->index = index;
    }
    if (t->args_len + n >= t->cap) return t->failed = 1;
    memcpy(t->args + t->args_len, s, n);
    t->args_len += n;
    return 0;
}

static int sink_init(tool_sink *t, size_t cap, int stream, int parallel) {
    memset(t, 0, sizeof *t);
    t->cap = cap + 1;
    t->text = malloc(t->cap);
    t->args = malloc(t->cap);
    t->index = -1;
    t->stream = stream;
    t->parallel = parallel;
    return t->text && t->args ? 0 : -1;
}

static void sink_free(tool_sink *t) {
    free(t->text);
    free(t->args);
    cJSON_Delete(t->calls);
}

/* The message of a whole chat answer with tools: content (null when only calls) and tool_calls. */
static void tool_message(const ckv_srv_job *j, int c, const ckv_srv_choice *ch, cJSON *msg, int *calls) {
    tool_sink t;
    ckv_toolcall_parser p;
    ckv_toolcall_sink k = {&t, sink_text, sink_call, sink_args};
    int n = 0, ok = sink_init(&t, ch->text_len, 0, j->parallel_tool_calls) == 0 &&
                    ckv_toolcall_parser_init(&p, j->tool_syntax, ch->text_len, tool_seed(j, c)) == CKV_STATUS_OK;
    ok = ok && ckv_toolcall_feed(&p, ch->text ? ch->text : "", ch->text_len, &k) == CKV_STATUS_OK &&
         ckv_toolcall_finish(&p, &k, &n) == CKV_STATUS_OK && !t.failed;
    ckv_toolcall_parser_free(&p);
    ckv_error_clear();
    if (!ok || n == 0) { /* no call: the text as it is */
        cJSON_AddStringToObject(msg, "content", ch->text ? ch->text : "");
        sink_free(&t);
        *calls = 0;
        return;
    }
    sink_flush_args(&t);
    t.text[t.text_len] = '\0';
    if (t.text_len) cJSON_AddStringToObject(msg, "content", t.text);
    else cJSON_AddNullToObject(msg, "content");
    cJSON_AddItemToObject(msg, "tool_calls", t.calls);
    t.calls = NULL;
    sink_free(&t);
    *calls = 1;
}

/* ---- logprobs ----------------------------------------------------------------------------------------- */

/* A token's text as the logprobs name it: its bytes when they are valid UTF-8, else "bytes:\xNN..." (as
 * OpenAI writes a token that splits a character). Returns the bytes' length; raw [len] its bytes. */
static int token_name(const ckv_srv_api *a, int32_t id, char *out, size_t cap, unsigned char *raw, size_t raw_cap) {
    int n = ckv_tokenizer_token_to_piece(a->tok, id, (char *)raw, raw_cap);
    if (n < 0) n = 0;
    if ((size_t)n > raw_cap) n = (int)raw_cap;
    int valid = 1;
    for (int i = 0; i < n && valid;) { /* UTF-8 check (no overlong/surrogate subtleties needed for naming) */
        unsigned char b = raw[i];
        int len = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
        if (!len || i + len > n) valid = 0;
        for (int k = 1; valid && k < len; k++)
            if ((raw[i + k] & 0xC0) != 0x80) valid = 0;
        i += len ? len : 1;
    }
    size_t o = 0;
    if (valid) {
        o = (size_t)n < cap - 1 ? (size_t)n : cap - 1;
        memcpy(out, raw, o);
    } else {
        o = (size_t)snprintf(out, cap, "bytes:");
        for (int i = 0; i < n && o + 5 < cap; i++) o += (size_t)snprintf(out + o, cap - o, "\\x%02x", raw[i]);
    }
    out[o] = '\0';
    return n;
}

#define NAME_CAP 1024

/* The legacy completions object's four arrays, one entry appended per call. */
typedef struct {
    cJSON *tokens, *token_logprobs, *top_logprobs, *text_offset;
} legacy_lp;

static cJSON *legacy_begin(cJSON *it, legacy_lp *l) {
    cJSON *lp = cJSON_AddObjectToObject(it, "logprobs");
    l->tokens = cJSON_AddArrayToObject(lp, "tokens");
    l->token_logprobs = cJSON_AddArrayToObject(lp, "token_logprobs");
    l->top_logprobs = cJSON_AddArrayToObject(lp, "top_logprobs");
    l->text_offset = cJSON_AddArrayToObject(lp, "text_offset");
    return lp;
}

/* One token: lp NaN (the prompt's first token) has null logprob and alternatives. The alternatives
 * include the token itself, as OpenAI's legacy API does. */
static void legacy_add(const ckv_srv_api *a, legacy_lp *l, int32_t id, float lp, const int32_t *top_ids, const float *top_lp,
                       int k, size_t offset) {
    char name[NAME_CAP];
    unsigned char raw[NAME_CAP / 5];
    token_name(a, id, name, sizeof name, raw, sizeof raw);
    cJSON_AddItemToArray(l->tokens, cJSON_CreateString(name));
    cJSON_AddItemToArray(l->text_offset, cJSON_CreateNumber((double)offset));
    if (isnan(lp)) {
        cJSON_AddItemToArray(l->token_logprobs, cJSON_CreateNull());
        cJSON_AddItemToArray(l->top_logprobs, cJSON_CreateNull());
        return;
    }
    cJSON_AddItemToArray(l->token_logprobs, cJSON_CreateNumber(lp));
    cJSON *top = cJSON_CreateObject();
    for (int i = 0; i < k; i++) {
        char tn[NAME_CAP];
        token_name(a, top_ids[i], tn, sizeof tn, raw, sizeof raw);
        if (!cJSON_GetObjectItemCaseSensitive(top, tn)) cJSON_AddNumberToObject(top, tn, top_lp[i]);
    }
    if (!cJSON_GetObjectItemCaseSensitive(top, name)) cJSON_AddNumberToObject(top, name, lp);
    cJSON_AddItemToArray(l->top_logprobs, top);
}

static cJSON *chat_entry(const ckv_srv_api *a, int32_t id, float lp) {
    char name[NAME_CAP];
    unsigned char raw[NAME_CAP / 5];
    int n = token_name(a, id, name, sizeof name, raw, sizeof raw);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "token", name);
    cJSON_AddNumberToObject(e, "logprob", lp);
    cJSON *b = cJSON_AddArrayToObject(e, "bytes");
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber(raw[i]));
    return e;
}

/* The chat object's "content" entry of generated token i of choice ch. */
static cJSON *chat_token(const ckv_srv_api *a, const ckv_srv_job *j, const ckv_srv_choice *ch, int i) {
    size_t k = (size_t)j->top_logprobs;
    cJSON *e = chat_entry(a, ch->ids[i], ch->lp[i]);
    cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
    for (size_t t = 0; t < k; t++) cJSON_AddItemToArray(top, chat_entry(a, ch->top_ids[i * k + t], ch->top_lp[i * k + t]));
    return e;
}

/* Generated tokens [*t0, *t1) of choice ch whose text ends in (from, to] (from 0: [0, to]); a token
 * that starts at or after the answer's end (a stop string) is not part of it. */
static void token_range(const ckv_srv_choice *ch, size_t from, size_t to, int *t0, int *t1) {
    int i = 0;
    if (from > 0)
        while (i < ch->n_ids && ch->tok_end[i] <= from) i++;
    *t0 = i;
    while (i < ch->n_ids && ch->tok_end[i] <= to) i++;
    *t1 = i;
}

/* Adds choice ch's logprobs to item `it` for generated tokens [t0, t1), with the echoed prompt first
 * when `with_echo` (legacy offsets count from base, the echoed text's length). */
static void add_logprobs(const ckv_srv_api *a, const ckv_srv_job *j, const ckv_srv_choice *ch, cJSON *it, int t0, int t1,
                         int with_echo, size_t base) {
    size_t k = (size_t)j->top_logprobs;
    if (j->kind == CKV_SRV_CHAT) {
        cJSON *lp = cJSON_AddObjectToObject(it, "logprobs");
        cJSON *content = cJSON_AddArrayToObject(lp, "content");
        for (int i = t0; i < t1; i++) cJSON_AddItemToArray(content, chat_token(a, j, ch, i));
        cJSON_AddNullToObject(lp, "refusal");
        return;
    }
    legacy_lp l;
    legacy_begin(it, &l);
    if (with_echo) {
        size_t off = 0;
        for (int e = 0; e < j->n_echo; e++) {
            char name[NAME_CAP];
            unsigned char raw[NAME_CAP / 5];
            int nb = token_name(a, j->echo_ids[e], name, sizeof name, raw, sizeof raw);
            float v = j->echo_scored ? j->echo_lp[e] : NAN;
            legacy_add(a, &l, j->echo_ids[e], v, j->echo_scored ? j->echo_top_ids + (size_t)e * k : NULL,
                       j->echo_scored ? j->echo_top_lp + (size_t)e * k : NULL, j->echo_scored ? (int)k : 0, off);
            off += (size_t)nb;
        }
    }
    for (int i = t0; i < t1; i++)
        legacy_add(a, &l, ch->ids[i], ch->lp[i], ch->top_ids + (size_t)i * k, ch->top_lp + (size_t)i * k, (int)k,
                   base + (i > 0 ? ch->tok_end[i - 1] : 0));
}

static cJSON *head(const ckv_srv_api *a, const ckv_srv_job *j, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", j->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)j->created);
    cJSON_AddStringToObject(o, "model", a->cfg->model_name ? a->cfg->model_name : "ckv");
    return o;
}

/* Usage of jobs [n] (the prompts of one request), summed; the press and flags of the first. */
static void add_usage_n(cJSON *o, ckv_srv_job *const *jobs, int n) {
    long pt = 0, ct = 0, re = 0, cx = 0, kept = 0, total = 0, dc = 0, de = 0;
    double kb = 0, fb = 0;
    for (int i = 0; i < n; i++) {
        const ckv_srv_job *j = jobs[i];
        pt += j->prompt_tokens, ct += j->completion_tokens, re += j->reused_tokens, cx += j->n_ctx;
        dc += j->decode_compressions, de += j->decode_evicted_entries;
        kept += j->kept_entries, total += j->total_entries, kb += (double)j->kv_bytes_kept, fb += (double)j->kv_bytes_full;
    }
    const ckv_srv_job *j = jobs[0];
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", (double)pt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)ct);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(pt + ct));
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", (double)re);
    cJSON_AddNumberToObject(u, "reused_tokens", (double)re);
    cJSON_AddNumberToObject(u, "context_tokens", (double)cx);
    cJSON_AddNumberToObject(u, "kv_entries_kept", (double)kept);
    cJSON_AddNumberToObject(u, "kv_entries_total", (double)total);
    cJSON_AddNumberToObject(u, "kv_bytes_kept", kb);
    cJSON_AddNumberToObject(u, "kv_bytes_full", fb);
    cJSON_AddStringToObject(u, "press", j->press.scorer == CKV_SCORER_NONE ? "none" : j->press.spec);
    cJSON_AddBoolToObject(u, "compressed", j->compressed);
    if (j->uncompressed_reason) cJSON_AddStringToObject(u, "uncompressed_reason", j->uncompressed_reason);
    cJSON_AddBoolToObject(u, "cache_hit", j->cache_hit);
    cJSON_AddStringToObject(u, "decode_press", j->has_decode ? j->decode.spec : "none");
    cJSON_AddNumberToObject(u, "decode_compressions", (double)dc);
    cJSON_AddNumberToObject(u, "decode_evicted_entries", (double)de);
}

static void add_usage(cJSON *o, ckv_srv_job *j) { add_usage_n(o, &j, 1); }

char *ckv_srv_api_response(const ckv_srv_api *a, ckv_srv_job *const *jobs, int n_jobs) {
    int chat = jobs[0]->kind == CKV_SRV_CHAT;
    cJSON *o = head(a, jobs[0], chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    for (int q = 0; q < n_jobs; q++) pthread_mutex_lock(&jobs[q]->mu);
    for (int q = 0; q < n_jobs; q++) {
    ckv_srv_job *j = jobs[q];
    for (int c = 0; c < j->n_choices; c++) {
        const ckv_srv_choice *ch = &j->choices[c];
        cJSON *it = cJSON_CreateObject();
        cJSON_AddNumberToObject(it, "index", q * j->n_choices + c);
        size_t base = 0;
        int calls = 0;
        if (chat) {
            cJSON *msg = cJSON_AddObjectToObject(it, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            if (j->tool_syntax) tool_message(j, c, ch, msg, &calls);
            else cJSON_AddStringToObject(msg, "content", ch->text ? ch->text : "");
        } else if (j->echo) {
            base = j->echo_len;
            size_t tl = ch->text ? strlen(ch->text) : 0;
            char *t = malloc(base + tl + 1);
            if (t) {
                memcpy(t, j->echo_text, base);
                memcpy(t + base, ch->text ? ch->text : "", tl + 1);
            }
            cJSON_AddStringToObject(it, "text", t ? t : "");
            free(t);
        } else {
            cJSON_AddStringToObject(it, "text", ch->text ? ch->text : "");
        }
        if (j->logprobs) {
            int t0, t1;
            token_range(ch, 0, ch->text_len, &t0, &t1);
            add_logprobs(a, j, ch, it, t0, t1, j->echo, base);
        } else {
            cJSON_AddNullToObject(it, "logprobs");
        }
        add_finish_calls(it, ch->finish, calls);
        cJSON_AddItemToArray(choices, it);
    }
    }
    add_usage_n(o, jobs, n_jobs);
    for (int q = n_jobs - 1; q >= 0; q--) pthread_mutex_unlock(&jobs[q]->mu);
    return ckv_srv_json_print(o);
}

char *ckv_srv_api_chunk(const ckv_srv_api *a, const ckv_srv_job *j, int c, const char *delta, size_t n, int role,
                        ckv_finish_reason finish) {
    int chat = j->kind == CKV_SRV_CHAT;
    cJSON *o = head(a, j, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    cJSON *it = cJSON_CreateObject();
    cJSON_AddNumberToObject(it, "index", c);
    /* the first chunk of an echoing completion starts with the prompt */
    const int echo_now = !chat && j->echo && role;
    const size_t base = !chat && j->echo ? j->echo_len : 0, pre = echo_now ? base : 0;
    size_t dn = delta ? n : 0;
    char *text = malloc(pre + dn + 1);
    if (text) {
        memcpy(text, j->echo_text ? j->echo_text : "", pre);
        memcpy(text + pre, delta ? delta : "", dn);
        text[pre + dn] = '\0';
    }
    int calls = 0;
    if (chat && j->tool_parsers) { /* the piece through choice c's tool-call parser */
        cJSON *d = cJSON_AddObjectToObject(it, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        ckv_toolcall_parser *p = &j->tool_parsers[c];
        if (role) p->seed = tool_seed(j, c);
        tool_sink t;
        ckv_toolcall_sink k = {&t, sink_text, sink_call, sink_args};
        int nc = 0;
        /* this piece's text and arguments, and what the parser holds back and may give back now */
        if (sink_init(&t, dn + p->raw_len + p->ws_len + p->hold, 1, j->parallel_tool_calls) == 0) {
            ckv_toolcall_feed(p, delta ? delta : "", dn, &k);
            if (finish) ckv_toolcall_finish(p, &k, &nc);
            ckv_error_clear();
            sink_flush_args(&t);
            t.text[t.text_len] = '\0';
        } else {
            t.text_len = 0;
        }
        if (t.text_len || (!t.calls && !finish)) cJSON_AddStringToObject(d, "content", t.text_len ? t.text : "");
        if (t.calls) {
            cJSON_AddItemToObject(d, "tool_calls", t.calls);
            t.calls = NULL;
        }
        sink_free(&t);
        calls = p->n_calls > 0;
    } else if (chat) {
        cJSON *d = cJSON_AddObjectToObject(it, "delta");
        if (role) cJSON_AddStringToObject(d, "role", "assistant");
        if (n > 0 || !finish) cJSON_AddStringToObject(d, "content", text ? text : "");
    } else {
        cJSON_AddStringToObject(it, "text", text ? text : "");
    }
    free(text);
    const ckv_srv_choice *ch = &j->choices[c];
    if (j->logprobs && (delta || echo_now)) { /* the tokens whose text this chunk carries */
        size_t from = delta ? (size_t)(delta - ch->text) : 0;
        int t0 = 0, t1 = 0;
        if (delta) token_range(ch, from, from + n, &t0, &t1);
        add_logprobs(a, j, ch, it, t0, t1, echo_now, base);
    } else {
        cJSON_AddNullToObject(it, "logprobs");
    }
    add_finish_calls(it, finish, calls);
    cJSON_AddItemToArray(choices, it);
    if (j->include_usage) cJSON_AddNullToObject(o, "usage");
    return ckv_srv_json_print(o);
}

char *ckv_srv_api_usage_chunk(const ckv_srv_api *a, ckv_srv_job *j) {
    cJSON *o = head(a, j, j->kind == CKV_SRV_CHAT ? "chat.completion.chunk" : "text_completion");
    cJSON_AddArrayToObject(o, "choices");
    pthread_mutex_lock(&j->mu);
    add_usage(o, j);
    pthread_mutex_unlock(&j->mu);
    return ckv_srv_json_print(o);
}

static cJSON *model_object(const ckv_srv_api *a) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", a->cfg->model_name ? a->cfg->model_name : "ckv");
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", 0);
    cJSON_AddStringToObject(m, "owned_by", "ckv");
    cJSON_AddNumberToObject(m, "max_model_len", a->engine->model->cfg.max_context);
    return m;
}

char *ckv_srv_api_models(const ckv_srv_api *a) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(o, "data");
    cJSON_AddItemToArray(data, model_object(a));
    return ckv_srv_json_print(o);
}

char *ckv_srv_api_model(const ckv_srv_api *a, const char *id, ckv_srv_error *err) {
    const char *name = a->cfg->model_name ? a->cfg->model_name : "ckv";
    if (strcmp(id, name) != 0) {
        ckv_srv_error_set(err, 404, INVALID, "model", "model_not_found", "the model '%.200s' does not exist (this server serves '%s')",
                          id, name);
        return NULL;
    }
    return ckv_srv_json_print(model_object(a));
}

