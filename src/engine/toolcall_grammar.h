/* toolcall_grammar.h - tool_choice "required" and a named function, enforced while decoding: the
 * answer must be the syntax's exact call text (toolcall.h: first, then open + one of the allowed
 * names + mid, the arguments as one JSON object, close; with parallel calls sep and further calls),
 * then end-of-sequence. The arguments follow the JSON automaton of grammar.h (any object: the tool's
 * parameter schema is not imposed). A byte-level automaton over that text; its vocabulary mask uses
 * grammar.h's JSON mask inside the arguments and simulates only the tokens that can leave them (those
 * holding a '}') or that start with an allowed byte elsewhere. Built per request before decoding;
 * the state is a fixed-size struct, so a step allocates nothing. It does not parse answers
 * (toolcall.h) or sample. */
#ifndef CKV_TOOLCALL_GRAMMAR_H
#define CKV_TOOLCALL_GRAMMAR_H

#include <stdint.h>

#include "core/status.h"
#include "engine/grammar.h"
#include "engine/toolcall.h"

typedef struct {
    const ckv_toolcall_syntax *syn;
    int n;           /* allowed calls */
    char **lits;     /* [n] open + name + mid of each, sorted (no one is a prefix of another) */
    int parallel;    /* more than one call may follow */
} ckv_toolcall_grammar;

/* names [n] (each at most CKV_TOOLCALL_MAX_NAME bytes of [A-Za-z0-9_-]). */
ckv_status ckv_toolcall_grammar_init(ckv_toolcall_grammar *g, const ckv_toolcall_syntax *syn, const char *const *names, int n,
                                     int parallel);
void ckv_toolcall_grammar_free(ckv_toolcall_grammar *g); /* accepts zeroed and partial objects */

/* The tokens of a vocabulary holding a '}' (the only ones that can end the arguments and go on). */
typedef struct {
    const ckv_grammar_vocab *gv;
    int32_t *brace; /* [n_brace] */
    int n_brace;
} ckv_toolcall_vocab;

ckv_status ckv_toolcall_vocab_init(ckv_toolcall_vocab *tv, const ckv_grammar_vocab *gv);
void ckv_toolcall_vocab_free(ckv_toolcall_vocab *tv); /* accepts zeroed and partial objects */

typedef struct {
    uint8_t phase;   /* toolcall_grammar.c */
    uint16_t lo, hi; /* the calls still possible: lits[lo .. hi) */
    uint32_t pos;    /* bytes of the current literal matched */
    ckv_json_state js;
} ckv_toolcall_state;

void ckv_toolcall_state_init(const ckv_toolcall_grammar *g, ckv_toolcall_state *s);
/* Advances by one byte; 0 when it is not allowed. */
int ckv_toolcall_step(const ckv_toolcall_grammar *g, ckv_toolcall_state *s, uint8_t b);
/* 1 when the answer may end here; 2 when it must (no further byte is allowed). */
int ckv_toolcall_can_end(const ckv_toolcall_grammar *g, const ckv_toolcall_state *s);
/* The next token's mask (eos [n_eos] allowed when the answer may end); returns the allowed count. */
int ckv_toolcall_mask(const ckv_toolcall_grammar *g, const ckv_toolcall_vocab *tv, const ckv_toolcall_state *s, const int32_t *eos,
                      int n_eos, uint8_t *allowed);
/* Advances s by token t's bytes; 0 when the token is not allowed. */
int ckv_toolcall_accept(const ckv_toolcall_grammar *g, const ckv_grammar_vocab *gv, ckv_toolcall_state *s, int32_t t);

#endif
