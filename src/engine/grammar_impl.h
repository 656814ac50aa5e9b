/* grammar_impl.h - what the grammar's files share and nothing outside them uses: the rule builder
 * the schema and GBNF compilers write through (grammar_rules.c; also the forced tool calls of
 * toolcall_grammar.c), the JSON building blocks, and the JSON string body's byte step
 * (grammar_match.c). */
#ifndef CKV_GRAMMAR_IMPL_H
#define CKV_GRAMMAR_IMPL_H

#include "engine/grammar.h"

/* ---- the JSON string body: aux = characters read (low 24 bits) | progress (high 8 bits) ---------- */
#define CKV_STR_COUNT(aux) ((aux) & 0xFFFFFFu)
#define CKV_STR_SUB(aux) ((aux) >> 24) /* 0 between characters; 1-3 UTF-8 continuation bytes to come;
                                        * 4 after '\'; 5-8 inside \uXXXX (hex digits read + 5); 9-12 the
                                        * restricted second byte after E0, ED, F0, F4; 13 after \uD */
/* The next aux after byte b inside a string body of at most hi characters; 0xFFFFFFFF: refused. */
uint32_t ckv_grammar_str_step(uint32_t aux, uint8_t b, uint32_t hi);
#define CKV_STR_REFUSED 0xFFFFFFFFu

/* ---- the builder ---------------------------------------------------------------------------------- */
#define CKV_GB_MAX_OPEN 256 /* alternatives open at once (nesting of groups / schemas) */
#define CKV_GB_MAX_ELS (1u << 20) /* elements of one grammar (16 MiB: repetitions cannot blow it up) */

typedef struct {
    ckv_grammar *g;
    uint32_t cap_els;
    uint32_t *pair_rule, *pair_start; /* [n_pairs] each finished alternative: its rule and first element */
    uint32_t n_pairs, cap_pairs;
    ckv_grammar_el *scr; /* [n_scr] the open alternatives' elements, innermost last */
    uint32_t n_scr, cap_scr;
    uint32_t open[CKV_GB_MAX_OPEN];
    int n_open;
    int cap_classes;
    int oom;
    /* the JSON building blocks, made on first use (-1: not yet) */
    int r_value, r_object, r_array, r_string, r_number, r_integer, r_sp, r_utf8;
} ckv_gb;

void ckv_gb_init(ckv_gb *b, ckv_grammar *g);
void ckv_gb_free(ckv_gb *b); /* the builder's scratch (not g) */
int ckv_gb_rule(ckv_gb *b);  /* a new rule with no alternative yet */
void ckv_gb_begin(ckv_gb *b);          /* opens an alternative (nested ones may open before it ends) */
void ckv_gb_end(ckv_gb *b, int rule);  /* closes the innermost alternative as one of rule's */
void ckv_gb_el(ckv_gb *b, ckv_grammar_el e);
void ckv_gb_byte(ckv_gb *b, uint8_t c);
void ckv_gb_lit(ckv_gb *b, const char *s, size_t n);
void ckv_gb_class(ckv_gb *b, const uint32_t set[8]);
void ckv_gb_range(ckv_gb *b, uint8_t lo, uint8_t hi); /* a class of one byte range */
void ckv_gb_ref(ckv_gb *b, int rule);
void ckv_gb_str(ckv_gb *b, uint32_t lo, uint32_t hi);
void ckv_gb_empty(ckv_gb *b, int rule); /* an empty alternative */
/* Appends element x repeated m..n times (n CKV_GRAMMAR_UNBOUNDED: no maximum) to the open alternative. */
void ckv_gb_repeat(ckv_gb *b, ckv_grammar_el x, uint32_t m, uint32_t n);
/* Flattens what was built into g (rule 0 the root); a rule without alternatives, or memory, fails
 * with err set. */
ckv_status ckv_gb_finish(ckv_gb *b, char *err, size_t errlen);

/* JSON building blocks (rules; compact: at most one space after ':' and ','). */
int ckv_gb_json_value(ckv_gb *b);   /* any value */
int ckv_gb_json_object(ckv_gb *b);  /* any object */
int ckv_gb_json_string(ckv_gb *b);  /* "..." with any content */
int ckv_gb_json_member(ckv_gb *b, int value_rule); /* member ::= string ":" sp value_rule (a new rule) */
int ckv_gb_json_number(ckv_gb *b);  /* integer part <= 16 digits, fraction <= 16, exponent <= 3 */
int ckv_gb_json_integer(ckv_gb *b);
int ckv_gb_sp(ckv_gb *b);           /* "" | " " */
int ckv_gb_utf8_multibyte(ckv_gb *b); /* one UTF-8 character of 2-4 bytes */

/* The schema compiler into an open alternative of b (grammar_schema.c): 0 ok, -1 with err set. */
int ckv_gb_schema(ckv_gb *b, const cJSON *schema, int strict, char *err, size_t errlen);
/* A schema "pattern" (an ECMA-262 regular expression) as JSON string content into the open
 * alternative (grammar_pattern.c): 0 ok, -1 with err set. */
int ckv_gb_pattern(ckv_gb *b, const char *pattern, char *err, size_t errlen);
/* The GBNF compiler: root becomes rule `root_rule` (grammar_gbnf.c); check_left: refuse a rule that
 * reaches itself before a byte, naming it. 0 ok, -1 with err set. */
int ckv_gb_gbnf(ckv_gb *b, const char *text, int root_rule, int check_left, char *err, size_t errlen);
/* A rule that can reach itself without reading a byte (the matcher would expand it until its budget
 * runs out), or -1. */
int ckv_gb_left_recursive(const ckv_gb *b);

#endif
