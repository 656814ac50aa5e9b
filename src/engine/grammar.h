/* grammar.h - constrained decoding: a context-free grammar over bytes (rules of alternatives of
 * sequences: bytes, byte classes, references to rules, and JSON string bodies with a length range),
 * built from a JSON schema (grammar_schema.c), a GBNF-style text (grammar_gbnf.c) or a sequence of
 * literal and schema parts; the pushdown matcher that follows it byte by byte (a set of stacks, as
 * llama.cpp's GBNF sampler does; grammar_match.c); and the vocabulary mask it implies at each step
 * (a token is allowed when every one of its bytes is accepted from the current state; end-of-sequence
 * only where the document is complete). The vocabulary side (token bytes, a byte trie of the tokens,
 * the tokens that are plain JSON string content grouped by length) is built once per model at load
 * (grammar_vocab.c); a compiled grammar is immutable and may be shared; a matcher allocates its
 * arenas at init, so a step allocates nothing. It does not sample (sampler.h) or read requests. */
#ifndef CKV_GRAMMAR_H
#define CKV_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

/* ---- the vocabulary (once per model) ---------------------------------------------------------- */

typedef struct {
    uint8_t *byte;   /* [n] the byte leading to node i (preorder: a node's subtree is i + 1 .. skip[i] - 1) */
    uint16_t *depth; /* [n] 1 for the root's children */
    uint32_t *skip;  /* [n] the first node after i's subtree */
    int32_t *token;  /* [n] the token whose bytes end at node i, or -1 (more: ckv_grammar_vocab.same) */
    uint32_t n;
    int max_depth;
} ckv_grammar_trie;

typedef struct {
    int vocab;
    uint32_t *off;    /* [vocab + 1] token t's bytes are bytes[off[t] .. off[t + 1]) */
    uint8_t *bytes;
    int32_t *same;    /* [vocab] the next token with the same bytes, or -1 */
    ckv_grammar_trie all;      /* every token with bytes (special tokens left out: never allowed) */
    ckv_grammar_trie nonplain; /* the tokens that are not plain string content */
    int32_t *plain;   /* [n_plain] tokens that are plain JSON string content (no '"', '\\', control bytes;
                       * whole UTF-8 characters), by character count */
    uint32_t *plain_chars; /* [n_plain] their character counts, ascending */
    int n_plain;
    uint8_t *plain_mask;   /* [vocab] 1: plain (copied whole when a string has room for the longest) */
} ckv_grammar_vocab;

/* Reads every token's bytes from the tokenizer (special / control tokens excluded: never allowed). */
ckv_status ckv_grammar_vocab_init(ckv_grammar_vocab *gv, const ckv_tokenizer *tok, int vocab);
void ckv_grammar_vocab_free(ckv_grammar_vocab *gv); /* accepts zeroed and partial objects */

/* ---- the compiled grammar ----------------------------------------------------------------------- */

enum { CKV_GEL_END = 0, CKV_GEL_BYTE, CKV_GEL_CLASS, CKV_GEL_REF, CKV_GEL_STR };

#define CKV_GRAMMAR_UNBOUNDED 0xFFFFFFFFu

typedef struct {
    uint8_t kind;  /* CKV_GEL_* */
    uint8_t byte;  /* BYTE: the byte */
    uint32_t arg;  /* CLASS: index into classes; REF: the rule; STR: minimum characters */
    uint32_t hi;   /* STR: maximum characters (CKV_GRAMMAR_UNBOUNDED: none) */
} ckv_grammar_el;

typedef struct {
    ckv_grammar_el *els;  /* [n_els] alternatives one after another, each ended by CKV_GEL_END */
    uint32_t n_els;
    uint32_t *alts;       /* [n_alts] the first element of each alternative, grouped by rule */
    uint32_t *rule_off;   /* [n_rules + 1] rule r's alternatives are alts[rule_off[r] .. rule_off[r + 1]) */
    int n_rules;          /* rule 0 is the root */
    uint32_t (*classes)[8]; /* [n_classes] 256-bit byte sets */
    uint8_t *class_plain; /* [n_classes] 1: the class holds a byte a plain string token can start with */
    int n_classes;
} ckv_grammar;

/* One part of a sequence (ckv_grammar_init_parts): a literal byte string, or a JSON value valid for
 * a schema (strict as OpenAI's structured outputs, else the schema as written). */
typedef struct {
    const char *literal; /* non-NULL: these bytes exactly */
    const cJSON *schema; /* else: a value valid for this schema (NULL: any JSON value) */
    int strict;
} ckv_grammar_part;

/* The document is one JSON value valid for `schema` (a cJSON tree; true/{}: any value), in the
 * schema's property order, with at most one space after ':' and ','. strict: OpenAI's rules (every
 * object lists all its properties in required and has additionalProperties false; the root is an
 * object). Unsupported keywords, a strict schema that breaks a rule, and a schema no value can match
 * fail with CKV_STATUS_ERR_ARG and a one-line message in err naming the keyword or rule and its JSON
 * path (e.g. "$.properties.age: unsupported keyword 'minimum'"). g needs ckv_grammar_free either way. */
ckv_status ckv_grammar_init_schema(ckv_grammar *g, const cJSON *schema, int strict, char *err, size_t errlen);
/* response_format json_object: one JSON object, any keys and values. */
ckv_status ckv_grammar_init_json_object(ckv_grammar *g);
/* The parts one after another (the tool-call wrapper: a literal, a schema's value, a literal). The
 * schema parts' errors are those of ckv_grammar_init_schema. */
ckv_status ckv_grammar_init_parts(ckv_grammar *g, const ckv_grammar_part *parts, int n_parts, char *err, size_t errlen);
/* A GBNF-style grammar (rules "name ::= ...", root "root"; alternation |, grouping ( ), literals "...",
 * classes [a-z] [^...], . any character, repetition ? * + {m} {m,} {m,n}, # comments). A text that
 * does not parse fails naming the line and column. The answer may end wherever root is complete. */
ckv_status ckv_grammar_init_gbnf(ckv_grammar *g, const char *text, char *err, size_t errlen);
void ckv_grammar_free(ckv_grammar *g); /* accepts zeroed and partial objects */

/* ---- the matcher (one per request) -------------------------------------------------------------- */

#define CKV_GRAMMAR_MAX_TOPS 128     /* stacks alive at once (more: the byte is refused) */
#define CKV_GRAMMAR_MAX_NEST 512     /* continuation frames on one stack (JSON nesting) */

typedef struct {
    uint32_t pos;    /* the element the stack waits on */
    int32_t parent;  /* the continuation below it (-1: the end of the document) */
    uint32_t aux;    /* STR: characters read (low 24 bits) and the progress inside one (high 8) */
    uint32_t nest;   /* frames below */
} ckv_grammar_node;

typedef struct {
    const ckv_grammar *g;
    const ckv_grammar_vocab *gv;
    ckv_grammar_node *nodes; /* [cap] the current stacks' nodes, then the mask's scratch nodes */
    uint32_t n_nodes, cap;
    ckv_grammar_node *spare; /* [cap] compaction target after a token */
    int32_t *moved;          /* [cap] compaction map */
    uint32_t *tops;          /* [(max_depth + 3) * CKV_GRAMMAR_MAX_TOPS] the stacks now (0), at each trie depth,
                              * and a saved copy (max_depth + 2) */
    int *n_tops;             /* [max_depth + 3] */
    uint8_t *accept;         /* [max_depth + 3] the document is complete at that depth */
    uint32_t *mark;          /* [max_depth + 3] n_nodes after that depth's state */
    int max_depth;
    int failed;              /* a token outside the grammar was accepted */
} ckv_grammar_matcher;

/* Sizes the matcher for grammar g over vocabulary gv (both kept by the caller; gv NULL: bytes only,
 * no mask) and resets it. */
ckv_status ckv_grammar_matcher_init(ckv_grammar_matcher *m, const ckv_grammar *g, const ckv_grammar_vocab *gv);
void ckv_grammar_matcher_free(ckv_grammar_matcher *m); /* accepts zeroed and partial objects */
void ckv_grammar_matcher_reset(ckv_grammar_matcher *m); /* a new document */
/* The mask of the next token: allowed[t] = 1 when token t's bytes are all accepted (eos ids [n_eos]
 * when the document is complete). Returns the number of allowed tokens. */
int ckv_grammar_matcher_mask(ckv_grammar_matcher *m, const int32_t *eos, int n_eos, uint8_t *allowed);
/* Advances by token t's bytes; 0 (and m->failed) when the token is not allowed (the state is kept). */
int ckv_grammar_matcher_accept(ckv_grammar_matcher *m, int32_t t);
/* Advances by raw bytes (tests; the literal prefix a caller forces): 0 when refused (state kept). */
int ckv_grammar_matcher_accept_bytes(ckv_grammar_matcher *m, const uint8_t *b, size_t n);
int ckv_grammar_matcher_complete(const ckv_grammar_matcher *m); /* the document may end here */
int ckv_grammar_matcher_finished(const ckv_grammar_matcher *m); /* complete and nothing may follow */

#endif
