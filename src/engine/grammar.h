/* grammar.h - constrained decoding for JSON output: an incremental pushdown automaton over bytes
 * that accepts exactly one JSON value (RFC 8259; the top level an object for response_format
 * json_object; strings are valid UTF-8), and the vocabulary mask it implies at each step (a token is allowed when every one of
 * its bytes is accepted from the current state; end-of-sequence only once the value is complete).
 * The per-vocabulary structures (every token's bytes, the tokens that are plain string content, the
 * tokens grouped by first byte) are built once at load; a request's state is a fixed-size struct, so
 * a step allocates nothing. It does not sample (sampler.h) or parse JSON schemas. */
#ifndef CKV_GRAMMAR_H
#define CKV_GRAMMAR_H

#include <stdint.h>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

#define CKV_JSON_MAX_DEPTH 64 /* nesting the automaton accepts */
#define CKV_JSON_MAX_WS 16    /* whitespace bytes in a row (a model cannot stall on blanks) */

typedef struct {
    int vocab;
    uint32_t *off;         /* [vocab + 1] token t's bytes are bytes[off[t] .. off[t + 1]) */
    uint8_t *bytes;
    uint8_t *plain;        /* [vocab] 1: non-empty plain string content (no '"', '\\', control bytes; whole
                            * UTF-8 characters) */
    int32_t *by_first;     /* [n_first] token ids ordered by first byte (empty and special tokens left out) */
    uint32_t n_first;
    /* the same tokens in that order, so the mask reads memory in sequence: */
    uint32_t *k_off;       /* [n_first + 1] bytes of by_first[k]: k_bytes[k_off[k] .. k_off[k + 1]) */
    uint8_t *k_bytes;
    uint8_t *k_plain;      /* [n_first] plain[by_first[k]] */
    uint32_t first_off[257]; /* tokens with first byte b: by_first[first_off[b] .. first_off[b + 1]) */
} ckv_grammar_vocab;

/* Reads every token's bytes from the tokenizer (special / control tokens excluded: never allowed). */
ckv_status ckv_grammar_vocab_init(ckv_grammar_vocab *gv, const ckv_tokenizer *tok, int vocab);
void ckv_grammar_vocab_free(ckv_grammar_vocab *gv); /* accepts zeroed and partial objects */

typedef struct {
    uint64_t objects; /* bit d: the container at depth d is an object (else an array); 16 bytes in all, so
                       * the mask copies a state per token cheaply */
    int depth;
    uint8_t st;      /* lexical state (grammar.c) */
    uint8_t sub;     /* progress inside a literal or a \uXXXX escape */
    uint8_t key;     /* the string being read is an object key */
    uint8_t ws;      /* whitespace bytes in a row */
    uint8_t u8;      /* continuation bytes the string's current UTF-8 character still needs */
    uint8_t top_object; /* the top-level value must be an object */
} ckv_json_state;

void ckv_json_init(ckv_json_state *s, int top_object);
/* Advances by one byte; 0 when the byte is not allowed (the state is then unspecified). */
int ckv_json_step(ckv_json_state *s, uint8_t b);
/* 1 once a whole value was read (only whitespace may follow). */
int ckv_json_complete(const ckv_json_state *s);

/* The mask of the next token: allowed[t] = 1 when token t's bytes are all accepted from s (eos ids
 * [n_eos]: when the value is complete, and then only they). Returns the number of allowed tokens. */
int ckv_grammar_mask(const ckv_grammar_vocab *gv, const ckv_json_state *s, const int32_t *eos, int n_eos, uint8_t *allowed);
/* Advances s by token t's bytes; 0 when the token is not allowed. */
int ckv_grammar_accept(const ckv_grammar_vocab *gv, ckv_json_state *s, int32_t t);

#endif
