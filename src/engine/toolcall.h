/* toolcall.h - the tool-call syntaxes models write, as data (one table entry per syntax: Hermes
 * <tool_call>{...}</tool_call> of Qwen2.5, Mistral's [TOOL_CALLS] [...]), and an incremental parser
 * that turns a model's answer into text and tool calls (name, arguments as JSON text) as it arrives:
 * fed in pieces of any size, it reports the same events as when fed the whole answer at once, so one
 * path serves whole responses and streams. A call whose head ({"name": ..., "arguments": ) does not
 * parse stays text; text that may still become a marker is held back until it cannot. It does not
 * write HTTP responses (src/server) or constrain decoding (toolcall_grammar.h).
 *
 * What becomes a call: the syntax's open marker, then the head pattern with the function's name, then
 * the arguments (a JSON object, followed byte by byte to its closing brace: strings and nesting are
 * tracked, the JSON is not validated), then the tail pattern. Once the head and the arguments' first
 * byte are read the call is reported (index, id, name) and every later byte of the arguments is
 * reported as a fragment. An answer cut short inside the arguments ends the call with what was
 * written; after the arguments, a tail that does not match is text. Whitespace before a call, at the end of an answer with calls and between a call and the
 * answer's first text is dropped. A Hermes call in another key order (arguments first) is read whole at its close
 * marker. */
#ifndef CKV_TOOLCALL_H
#define CKV_TOOLCALL_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define CKV_TOOLCALL_MAX_NAME 64 /* a function name's bytes (OpenAI: ^[a-zA-Z0-9_-]{1,64}$) */

/* Patterns: byte 0x01 is any run of whitespace, 0x02 the function's name as a JSON string (no
 * escapes), any other byte itself. */
typedef struct {
    const char *name;      /* "hermes", "mistral" */
    const char *open;      /* the marker that starts calls in the text */
    const char *pre;       /* pattern after the marker, before the first call's head */
    const char *head;      /* pattern of a call up to its arguments */
    const char *tail;      /* pattern after the arguments */
    char list_sep, list_end; /* 0: one call per marker; else a list: list_sep before the next call's head,
                              * list_end after the last (whitespace around them allowed) */
    const char *close;     /* the literal that ends a call read whole (NULL: no such reading) */
    const char *bare_tail; /* non-NULL: a call may also come without the marker, as a bare head + arguments +
                            * this tail, when it opens the answer or follows such a call (small Qwen2.5
                            * models answer so) */
    /* the exact text the constrained decoder writes: first, then per call open + name + mid +
     * arguments + close, sep between calls, last after them */
    const char *c_first, *c_open, *c_mid, *c_close, *c_sep, *c_last;
} ckv_toolcall_syntax;

/* The syntax named `name` (NULL when unknown). */
const ckv_toolcall_syntax *ckv_toolcall_syntax_find(const char *name);

/* What the parser reports; each callback returns 0, or non-zero to stop (the feed then returns an
 * error). */
typedef struct {
    void *ctx;
    int (*text)(void *ctx, const char *s, size_t n);                 /* answer text outside calls */
    int (*call)(void *ctx, int index, const char *id, const char *name); /* a call begins */
    int (*args)(void *ctx, int index, const char *s, size_t n);      /* a fragment of its arguments */
} ckv_toolcall_sink;

typedef struct {
    const ckv_toolcall_syntax *syn;
    uint64_t seed;        /* call ids: "call_" + 24 hex digits, a function of seed and the index */
    int mode;             /* toolcall.c */
    const char *pat;      /* the pattern being matched */
    size_t pi;            /* position in it */
    int in_name;          /* inside the name string */
    char name[CKV_TOOLCALL_MAX_NAME + 1];
    size_t name_len;
    size_t hold;          /* bytes of the open marker matched so far (held back) */
    char *ws;             /* [cap] whitespace held back after text */
    size_t ws_len;
    char *raw;            /* [cap] the bytes since the marker (text again if no call comes of them) */
    size_t raw_len, cap;
    int depth, in_str, esc; /* the arguments: nesting, inside a string, after a backslash */
    int n_calls;
    int started;          /* text other than whitespace was reported */
    int bare, after_bare; /* the current call came without the marker; the last one did */
} ckv_toolcall_parser;

/* A parser for answers of at most cap bytes (its buffers, allocated here once). */
ckv_status ckv_toolcall_parser_init(ckv_toolcall_parser *p, const ckv_toolcall_syntax *syn, size_t cap, uint64_t seed);
void ckv_toolcall_parser_free(ckv_toolcall_parser *p); /* accepts zeroed and partial objects */
/* The next n bytes of the answer. */
ckv_status ckv_toolcall_feed(ckv_toolcall_parser *p, const char *s, size_t n, const ckv_toolcall_sink *sink);
/* The answer ended: held-back text is reported (or dropped: whitespace beside a call). Returns the
 * number of calls in *n_calls. */
ckv_status ckv_toolcall_finish(ckv_toolcall_parser *p, const ckv_toolcall_sink *sink, int *n_calls);

/* The id of call `index` ("call_" + 24 hex digits; out[32]). */
void ckv_toolcall_id(uint64_t seed, int index, char out[32]);

#endif
