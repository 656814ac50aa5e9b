/* toolcall.c - the table of tool-call syntaxes and the incremental parser (see toolcall.h). */
#include "engine/toolcall.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/alloc.h"

#define WS "\x01"   /* pattern: any run of whitespace */
#define NAME "\x02" /* pattern: the function's name as a JSON string */

static const ckv_toolcall_syntax syntaxes[] = {
    /* Qwen2.5 (and Hermes 2 Pro): <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>, one per call */
    {.name = "hermes", .open = "<tool_call>", .pre = "", .head = WS "{" WS "\"name\"" WS ":" WS NAME WS "," WS "\"arguments\"" WS ":" WS,
     .tail = WS "}" WS "</tool_call>", .close = "</tool_call>", .bare_tail = WS "}", .c_first = "", .c_open = "<tool_call>\n{\"name\": \"",
     .c_mid = "\", \"arguments\": ", .c_close = "}\n</tool_call>", .c_sep = "\n", .c_last = ""},
    /* Mistral (v0.3 instruct): [TOOL_CALLS] [{"name": "f", "arguments": {...}}, ...] */
    {.name = "mistral", .open = "[TOOL_CALLS]", .pre = WS "[", .head = WS "{" WS "\"name\"" WS ":" WS NAME WS "," WS "\"arguments\"" WS ":" WS,
     .tail = WS "}", .list_sep = ',', .list_end = ']', .close = NULL, .c_first = "[TOOL_CALLS] [", .c_open = "{\"name\": \"",
     .c_mid = "\", \"arguments\": ", .c_close = "}", .c_sep = ", ", .c_last = "]"},
};

const ckv_toolcall_syntax *ckv_toolcall_syntax_find(const char *name) {
    for (size_t i = 0; name && i < sizeof syntaxes / sizeof syntaxes[0]; i++)
        if (!strcmp(syntaxes[i].name, name)) return &syntaxes[i];
    return NULL;
}

enum { M_TEXT, M_PRE, M_HEAD, M_RAW, M_ARGS, M_TAIL, M_LIST };

static int is_ws(unsigned char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

void ckv_toolcall_id(uint64_t seed, int index, char out[32]) {
    uint64_t h[2];
    for (int k = 0; k < 2; k++) { /* splitmix64 of (seed, index, k) */
        uint64_t z = seed + 0x9E3779B97F4A7C15ull * (uint64_t)(2 * index + k + 1);
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        h[k] = z ^ (z >> 31);
    }
    snprintf(out, 32, "call_%016llx%08llx", (unsigned long long)h[0], (unsigned long long)(h[1] >> 32));
}

ckv_status ckv_toolcall_parser_init(ckv_toolcall_parser *p, const ckv_toolcall_syntax *syn, size_t cap, uint64_t seed) {
    memset(p, 0, sizeof *p);
    if (!syn) return ckv_error(CKV_STATUS_ERR_ARG, "tool calls: no syntax given");
    p->syn = syn;
    p->seed = seed;
    p->cap = cap + 1;
    CKV_TRY(ckv_alloc((void **)&p->ws, p->cap, "tool-call parser"));
    CKV_TRY(ckv_alloc((void **)&p->raw, p->cap, "tool-call parser"));
    return CKV_STATUS_OK;
}

void ckv_toolcall_parser_free(ckv_toolcall_parser *p) {
    if (!p) return;
    ckv_free(p->ws);
    ckv_free(p->raw);
    memset(p, 0, sizeof *p);
}

#define EMIT(call)                                                                                                     \
    do {                                                                                                               \
        if (call) return ckv_error(CKV_STATUS_ERR_IO, "tool calls: the response could not be written");              \
    } while (0)

/* Text outside calls: whitespace is held back until text follows (dropped before a call, at the end of
 * an answer with calls, and between calls and the first text). */
static ckv_status text_byte(ckv_toolcall_parser *p, char c, const ckv_toolcall_sink *k) {
    if (is_ws((unsigned char)c) && p->ws_len < p->cap) {
        p->ws[p->ws_len++] = c;
        return CKV_STATUS_OK;
    }
    if (p->ws_len && (p->started || !p->n_calls)) EMIT(k->text(k->ctx, p->ws, p->ws_len)); /* not first after a call */
    p->ws_len = 0;
    p->started = 1;
    p->after_bare = 0;
    EMIT(k->text(k->ctx, &c, 1));
    return CKV_STATUS_OK;
}

static ckv_status text_bytes(ckv_toolcall_parser *p, const char *s, size_t n, const ckv_toolcall_sink *k) {
    for (size_t i = 0; i < n; i++) CKV_TRY(text_byte(p, s[i], k));
    return CKV_STATUS_OK;
}

/* Bytes since the marker that did not become a call: text again. */
static ckv_status give_back(ckv_toolcall_parser *p, const ckv_toolcall_sink *k) {
    size_t n = p->raw_len;
    p->raw_len = 0;
    p->mode = M_TEXT;
    return text_bytes(p, p->raw, n, k);
}

/* One byte against pattern p->pat at p->pi: 1 consumed, 0 the pattern is complete and the byte is
 * the next one's, -1 mismatch. */
static int pattern_step(ckv_toolcall_parser *p, unsigned char c) {
    if (p->in_name) {
        if (c == '"') {
            p->in_name = 0;
            p->pi++;
            return p->name_len > 0 ? 1 : -1;
        }
        if (c < 0x20 || c == '\\' || p->name_len >= CKV_TOOLCALL_MAX_NAME) return -1;
        p->name[p->name_len++] = (char)c;
        p->name[p->name_len] = '\0';
        return 1;
    }
    for (;;) {
        char want = p->pat[p->pi];
        if (!want) return 0;
        if (want == '\x01') {
            if (is_ws(c)) return 1;
            p->pi++;
            continue;
        }
        if (want == '\x02') {
            if (c != '"') return -1;
            p->in_name = 1;
            p->name_len = 0;
            p->name[0] = '\0';
            return 1;
        }
        if ((unsigned char)want != c) return -1;
        p->pi++;
        return 1;
    }
}

static int pattern_done(const ckv_toolcall_parser *p) {
    size_t i = p->pi;
    while (p->pat[i] == '\x01') i++;
    return !p->in_name && !p->pat[i];
}

static void start_pattern(ckv_toolcall_parser *p, int mode, const char *pat) {
    p->mode = mode;
    p->pat = pat;
    p->pi = 0;
    p->in_name = 0;
}

static ckv_status begin_call(ckv_toolcall_parser *p, const ckv_toolcall_sink *k) {
    char id[32];
    ckv_toolcall_id(p->seed, p->n_calls, id);
    p->ws_len = 0; /* whitespace before a call is dropped */
    EMIT(k->call(k->ctx, p->n_calls, id, p->name));
    p->n_calls++;
    return CKV_STATUS_OK;
}

/* A Hermes call read whole (raw holds marker + body [+ close]): {"name": str, "arguments": object or
 * JSON text} in any key order; 1 when it was one. */
static ckv_status raw_call(ckv_toolcall_parser *p, size_t body_end, const ckv_toolcall_sink *k, int *ok) {
    *ok = 0;
    size_t ol = strlen(p->syn->open);
    cJSON *o = cJSON_ParseWithLength(p->raw + ol, body_end - ol);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(o, "arguments");
    int args_ok = cJSON_IsObject(args);
    if (cJSON_IsString(args)) { /* arguments given as JSON text */
        cJSON *inner = cJSON_Parse(args->valuestring);
        args_ok = cJSON_IsObject(inner);
        cJSON_Delete(inner);
    }
    if (cJSON_IsObject(o) && cJSON_IsString(name) && name->valuestring[0] && strlen(name->valuestring) <= CKV_TOOLCALL_MAX_NAME &&
        args_ok) {
        char *text = cJSON_IsString(args) ? NULL : cJSON_PrintUnformatted(args);
        const char *a = text ? text : args->valuestring;
        snprintf(p->name, sizeof p->name, "%s", name->valuestring);
        ckv_status st = begin_call(p, k);
        if (st == CKV_STATUS_OK && k->args(k->ctx, p->n_calls - 1, a, strlen(a)))
            st = ckv_error(CKV_STATUS_ERR_IO, "tool calls: the response could not be written");
        cJSON_free(text);
        cJSON_Delete(o);
        if (st != CKV_STATUS_OK) return st;
        *ok = 1;
        p->raw_len = 0;
        p->mode = M_TEXT;
        return CKV_STATUS_OK;
    }
    cJSON_Delete(o);
    return CKV_STATUS_OK;
}

static ckv_status step(ckv_toolcall_parser *p, char ch, const ckv_toolcall_sink *k) {
    const ckv_toolcall_syntax *s = p->syn;
    unsigned char c = (unsigned char)ch;
    switch (p->mode) {
    case M_TEXT: {
        size_t ol = strlen(s->open);
        if (s->bare_tail && !p->hold && c == '{' && (!p->started || p->after_bare)) { /* a call without the marker */
            p->raw_len = 0;
            p->bare = 1;
            start_pattern(p, M_HEAD, s->head);
            return step(p, ch, k);
        }
        if ((unsigned char)s->open[p->hold] == c) {
            p->raw[p->hold++] = ch;
            if (p->hold == ol) { /* a marker */
                p->raw_len = p->hold;
                p->hold = 0;
                p->bare = 0;
                start_pattern(p, M_PRE, s->pre);
            }
            return CKV_STATUS_OK;
        }
        if (p->hold) { /* not the marker after all: the held bytes are text, then this one is looked at again */
            size_t h = p->hold;
            p->hold = 0;
            /* the longest tail of held + c that still starts the marker (markers are short) */
            char buf[64];
            size_t n = h < sizeof buf - 1 ? h : sizeof buf - 1;
            memcpy(buf, p->raw, n);
            buf[n++] = ch;
            size_t keep = 0;
            for (size_t t = 1; t < n && !keep; t++)
                if (n - t < ol && !memcmp(buf + t, s->open, n - t)) keep = n - t;
            CKV_TRY(text_bytes(p, buf, n - keep, k));
            memcpy(p->raw, buf + n - keep, keep);
            p->hold = keep;
            return CKV_STATUS_OK;
        }
        return text_byte(p, ch, k);
    }
    case M_PRE:
    case M_HEAD: {
        if (p->raw_len < p->cap) p->raw[p->raw_len++] = ch;
        int r = pattern_step(p, c);
        if (r == 1) return CKV_STATUS_OK;
        if (r == 0 && p->mode == M_PRE) {
            start_pattern(p, M_HEAD, s->head);
            p->raw_len--;
            return step(p, ch, k);
        }
        if (r == 0 && c == '{') { /* the arguments start: the call is reported */
            CKV_TRY(begin_call(p, k));
            p->raw_len = 0;
            p->depth = 1;
            p->in_str = p->esc = 0;
            p->mode = M_ARGS;
            EMIT(k->args(k->ctx, p->n_calls - 1, &ch, 1));
            return CKV_STATUS_OK;
        }
        if (s->close && !s->list_sep && !p->bare) { /* another key order: read the call whole */
            p->mode = M_RAW;
            return CKV_STATUS_OK;
        }
        return give_back(p, k);
    }
    case M_RAW: {
        if (p->raw_len < p->cap) p->raw[p->raw_len++] = ch;
        size_t cl = strlen(s->close);
        if (p->raw_len >= strlen(s->open) + cl && !memcmp(p->raw + p->raw_len - cl, s->close, cl)) {
            int ok = 0;
            CKV_TRY(raw_call(p, p->raw_len - cl, k, &ok));
            if (!ok) return give_back(p, k);
        }
        return CKV_STATUS_OK;
    }
    case M_ARGS:
        EMIT(k->args(k->ctx, p->n_calls - 1, &ch, 1));
        if (p->in_str) {
            if (p->esc) p->esc = 0;
            else if (c == '\\') p->esc = 1;
            else if (c == '"') p->in_str = 0;
        } else if (c == '"') {
            p->in_str = 1;
        } else if (c == '{' || c == '[') {
            p->depth++;
        } else if ((c == '}' || c == ']') && --p->depth == 0) {
            start_pattern(p, M_TAIL, p->bare ? s->bare_tail : s->tail);
        }
        return CKV_STATUS_OK;
    case M_TAIL: {
        if (p->raw_len < p->cap) p->raw[p->raw_len++] = ch;
        int r = pattern_step(p, c);
        if (r == 1 && !pattern_done(p)) return CKV_STATUS_OK;
        if (r == 1) { /* the call is complete */
            p->raw_len = 0;
            p->after_bare = p->bare;
            p->mode = s->list_sep ? M_LIST : M_TEXT;
            return CKV_STATUS_OK;
        }
        if (r == 0) { /* complete before this byte (a tail ending in whitespace) */
            p->mode = s->list_sep ? M_LIST : M_TEXT;
            p->raw_len = 0;
            p->after_bare = p->bare;
            return step(p, ch, k);
        }
        return give_back(p, k); /* the call stays; its broken tail is text */
    }
    case M_LIST:
        if (is_ws(c)) return CKV_STATUS_OK;
        if (c == (unsigned char)s->list_sep) {
            start_pattern(p, M_HEAD, s->head);
            p->raw_len = 0;
            return CKV_STATUS_OK;
        }
        p->mode = M_TEXT;
        if (c == (unsigned char)s->list_end) return CKV_STATUS_OK;
        return step(p, ch, k);
    }
    return ckv_error(CKV_STATUS_ERR_ARG, "tool calls: bad parser state %d", p->mode);
}

ckv_status ckv_toolcall_feed(ckv_toolcall_parser *p, const char *s, size_t n, const ckv_toolcall_sink *sink) {
    for (size_t i = 0; i < n; i++) CKV_TRY(step(p, s[i], sink));
    return CKV_STATUS_OK;
}

ckv_status ckv_toolcall_finish(ckv_toolcall_parser *p, const ckv_toolcall_sink *k, int *n_calls) {
    if (p->mode == M_TEXT && p->hold) { /* a marker's beginning that the answer ended in */
        size_t h = p->hold;
        p->hold = 0;
        CKV_TRY(text_bytes(p, p->raw, h, k));
    } else if (p->mode == M_RAW) { /* no close marker: the call if its body is one */
        int ok = 0;
        CKV_TRY(raw_call(p, p->raw_len, k, &ok));
        if (!ok) CKV_TRY(give_back(p, k));
    } else if (p->mode == M_PRE || p->mode == M_HEAD) {
        CKV_TRY(give_back(p, k));
    }
    if (p->ws_len && !p->n_calls) EMIT(k->text(k->ctx, p->ws, p->ws_len));
    p->ws_len = 0;
    p->mode = M_TEXT;
    *n_calls = p->n_calls;
    return CKV_STATUS_OK;
}
