/* tok_internal.h - private to src/tokenizer: the tokenizer's in-memory form (vocabulary, merges,
 * added tokens, normalizer / pre-tokenizer / decoder steps) and the helpers the .c files of this
 * module share (growable buffers, string map, UTF-8). Nothing outside src/tokenizer includes it. */
#ifndef CKV_TOK_INTERNAL_H
#define CKV_TOK_INTERNAL_H

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "tokenizer/tokenizer.h"

/* ---- growable buffers ------------------------------------------------------------------------- */

typedef struct {
    char *p;
    size_t n, cap;
} ckv_tk_buf;

ckv_status ckv_tk_buf_reserve(ckv_tk_buf *b, size_t extra);
ckv_status ckv_tk_buf_append(ckv_tk_buf *b, const void *data, size_t len);
void ckv_tk_buf_free(ckv_tk_buf *b);

struct cJSON;
/* Appends v as transformers' Jinja tojson writes it (chat_template_json.c). */
ckv_status ckv_chat_tojson(const struct cJSON *v, ckv_tk_buf *b);

typedef struct {
    int32_t *p;
    size_t n, cap;
} ckv_tk_ids;

ckv_status ckv_tk_ids_push(ckv_tk_ids *v, int32_t id);

/* ---- string -> id map (open addressing; keys point into the tokenizer's pool) ---------------- */

typedef struct {
    uint32_t *slots;   /* [cap] id + 1, 0 = empty */
    uint32_t cap;      /* power of two */
    uint32_t count;
} ckv_tk_strmap;

uint64_t ckv_tk_hash(const char *s, size_t len);

/* ---- UTF-8 ------------------------------------------------------------------------------------ */

/* Length of the valid UTF-8 sequence at s[0..len) or 0 if it is not a complete valid one. */
int ckv_utf8_valid_len(const uint8_t *s, size_t len);
/* Decodes one code point of VALID UTF-8; returns its byte length. */
int ckv_utf8_decode(const uint8_t *s, uint32_t *cp);
int ckv_utf8_encode(uint32_t cp, char *out); /* returns 1..4 */
/* Returns the offset of the first invalid byte, or len when s is valid UTF-8. */
size_t ckv_utf8_first_invalid(const uint8_t *s, size_t len);
/* Appends s with every maximal invalid subpart replaced by U+FFFD (Python/Rust "lossy" rule). */
ckv_status ckv_utf8_append_lossy(ckv_tk_buf *out, const uint8_t *s, size_t len);
/* Length of the next unit at s: a valid sequence (*valid = 1) or a maximal invalid subpart (0). */
size_t ckv_utf8_next(const uint8_t *s, size_t len, int *valid);
/* How many bytes at the end of s form an incomplete but still possibly valid sequence (0..3). */
size_t ckv_utf8_incomplete_tail(const uint8_t *s, size_t len);
int ckv_unicode_is_whitespace(uint32_t cp); /* White_Space property (Rust char::is_whitespace) */
int ckv_unicode_is_numeric(uint32_t cp);    /* general category N* (Rust char::is_numeric) */
int ckv_unicode_is_word(uint32_t cp);       /* regex \w (alphabetic, marks, Nd, Pc, joiners) */

/* ---- pipeline steps --------------------------------------------------------------------------- */

typedef enum {
    CKV_TK_NORM_NFC,
    CKV_TK_NORM_NFD,
    CKV_TK_NORM_NFKC,
    CKV_TK_NORM_NFKD,
    CKV_TK_NORM_PREPEND,
    CKV_TK_NORM_REPLACE,
    CKV_TK_NORM_STRIP
} ckv_tk_norm_kind;

typedef struct {
    ckv_tk_norm_kind kind;
    char *a;            /* PREPEND text, REPLACE literal pattern (when re is NULL) */
    size_t a_len;
    char *b;            /* REPLACE content */
    size_t b_len;
    pcre2_code *re;     /* REPLACE regex pattern */
    int left, right;    /* STRIP */
} ckv_tk_norm;

typedef enum {
    CKV_TK_SPLIT_ISOLATED,
    CKV_TK_SPLIT_REMOVED,
    CKV_TK_SPLIT_MERGED_WITH_PREVIOUS,
    CKV_TK_SPLIT_MERGED_WITH_NEXT,
    CKV_TK_SPLIT_CONTIGUOUS
} ckv_tk_split_behavior;

typedef enum {
    CKV_TK_PRE_SPLIT,      /* regex (re) or literal (lit) pattern */
    CKV_TK_PRE_BYTELEVEL,  /* optional prefix space, optional GPT-2 regex split, bytes -> chars */
    CKV_TK_PRE_DIGITS,
    CKV_TK_PRE_METASPACE
} ckv_tk_pre_kind;

enum { CKV_TK_PREPEND_ALWAYS = 0, CKV_TK_PREPEND_FIRST = 1, CKV_TK_PREPEND_NEVER = 2 };

typedef struct {
    ckv_tk_pre_kind kind;
    pcre2_code *re;          /* SPLIT with a regex; BYTELEVEL with use_regex */
    char *lit;               /* SPLIT with a literal string */
    size_t lit_len;
    ckv_tk_split_behavior behavior;
    int invert;
    int add_prefix_space;    /* BYTELEVEL */
    int individual;          /* DIGITS */
    char repl[8];            /* METASPACE replacement (UTF-8) */
    int repl_len;
    int prepend_scheme;      /* METASPACE */
    int split;               /* METASPACE */
} ckv_tk_pre;

/* How ids turn back into text. */
typedef enum {
    CKV_TK_DEC_NONE,       /* no decoder: tokens joined with " " */
    CKV_TK_DEC_BYTELEVEL,  /* byte-level chars -> bytes, lossy UTF-8 */
    CKV_TK_DEC_SPM,        /* [Replace(x -> y)], [ByteFallback], [Fuse], [Strip(c, n, 0)] in this order */
    CKV_TK_DEC_METASPACE   /* Metaspace decoder (first token's replacement chars dropped) */
} ckv_tk_dec_mode;

typedef struct {
    ckv_tk_dec_mode mode;
    int replace;             /* SPM: Replace step present */
    char rep_from[8];
    int rep_from_len;
    char rep_to[8];
    int rep_to_len;
    int byte_fallback;       /* SPM: ByteFallback step present */
    uint32_t strip_char;     /* SPM: Strip content */
    int strip_start;         /* SPM: Strip start count (0 = none) */
    char repl[8];            /* METASPACE */
    int repl_len;
    int prepend_scheme;      /* METASPACE */
} ckv_tk_decoder;

typedef struct {
    int32_t id;
    uint32_t off, len;        /* content in pool */
    uint32_t norm_off, norm_len; /* normalized content (pattern for normalized tokens, decode text) */
    uint8_t single_word, lstrip, rstrip, normalized, special;
} ckv_tk_added;

typedef enum { CKV_TK_MODEL_BPE = 0, CKV_TK_MODEL_SPM_SCORES = 1 } ckv_tk_model_kind;

typedef struct {
    uint64_t key;             /* (left id << 32) | right id, UINT64_MAX = empty */
    uint32_t rank;
    int32_t new_id;
} ckv_tk_merge;

struct ckv_tokenizer {
    /* vocabulary: id -> string in pool (model vocabulary; holes have len 0 and off UINT32_MAX) */
    int32_t n_vocab;          /* max id + 1 over model vocab and added tokens */
    uint32_t *tok_off, *tok_len; /* [n_vocab] */
    int32_t *added_of;        /* [n_vocab] index into added[] or -1 */
    ckv_tk_buf pool;
    ckv_tk_strmap vocab_map;  /* model vocabulary */
    size_t max_piece_bytes;

    /* model */
    ckv_tk_model_kind model;
    ckv_tk_merge *merges;     /* open-addressing table */
    uint32_t merges_cap;
    float *scores;            /* [n_vocab] SPM_SCORES */
    int byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;
    int32_t byte_tok[256];    /* "<0xXX>" ids or -1 */
    char *cont_prefix, *end_suffix; /* BPE continuing_subword_prefix / end_of_word_suffix (NULL = none) */

    /* added tokens */
    ckv_tk_added *added;
    int n_added;
    int32_t *added_by_byte[256]; /* per first byte: indices into added[], longest first, -1 ended */

    /* pipeline */
    ckv_tk_norm *norms;
    int n_norms;
    ckv_tk_pre *pres;
    int n_pres;
    ckv_tk_decoder dec;

    /* post-processor (single sequence): ids before and after the text */
    int32_t *post_pre, *post_post;
    int n_post_pre, n_post_post;

    /* special ids */
    int32_t bos_id, eos_id, pad_id, eot_id;
    ckv_chat_template chat;
};

/* The GPT-2 byte <-> char table. */
void ckv_tk_bytelevel_tables(const uint16_t **byte_to_cp, const int16_t **cp_to_byte);

/* ---- vocabulary building (vocab.c) ------------------------------------------------------------ */

ckv_status ckv_tk_alloc(ckv_tokenizer **out);
/* Sets the size of the id space (grows arrays; new ids are holes). */
ckv_status ckv_tk_resize(ckv_tokenizer *t, int32_t n_vocab);
/* Stores the model-vocabulary string of `id` (must be < n_vocab). */
ckv_status ckv_tk_set_token(ckv_tokenizer *t, int32_t id, const char *s, size_t len);
/* Builds vocab_map over the model vocabulary, byte_tok[], max_piece_bytes. */
ckv_status ckv_tk_index_vocab(ckv_tokenizer *t, const char *what);
int32_t ckv_tk_vocab_find(const ckv_tokenizer *t, const char *s, size_t len);
/* Adds the merge (a, b) -> new_id with `rank` (a later duplicate pair overrides). */
ckv_status ckv_tk_merges_init(ckv_tokenizer *t, size_t n);
void ckv_tk_merges_put(ckv_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t new_id);
const ckv_tk_merge *ckv_tk_merges_get(const ckv_tokenizer *t, int32_t a, int32_t b);
ckv_status ckv_tk_add_token(ckv_tokenizer *t, int32_t id, const char *s, size_t len, int special, int normalized,
                            int lstrip, int rstrip, int single_word);
/* Normalizes normalized added tokens, builds the first-byte index. Call after norms are set. */
ckv_status ckv_tk_index_added(ckv_tokenizer *t);
const char *ckv_tk_text(const ckv_tokenizer *t, int32_t id, size_t *len); /* decode text of an id */

/* ---- steps (normalize.c, pretokenize.c) ------------------------------------------------------ */

/* Compiles a tokenizer.json regex for PCRE2 (UTF + UCP; \s/\S rewritten to Unicode White_Space as
 * Oniguruma has it). Errors name `what` and PCRE2's message. */
ckv_status ckv_tk_regex_compile(pcre2_code **out, const char *pattern, size_t len, const char *what);
/* Applies the normalizer steps to s, appending the result to out. */
ckv_status ckv_tk_normalize(const ckv_tokenizer *t, const char *s, size_t len, ckv_tk_buf *out);
void ckv_tk_norm_free(ckv_tk_norm *n);
void ckv_tk_pre_free(ckv_tk_pre *p);

/* A piece of text moving through the pipeline: bytes [off, off + len) of a buffer. */
typedef struct {
    size_t off, len;
    int32_t token;   /* >= 0: an added token already decided */
    int first;       /* starts at offset 0 of the original text (Metaspace "first") */
} ckv_tk_span;

typedef struct {
    ckv_tk_span *p;
    size_t n, cap;
} ckv_tk_spans;

ckv_status ckv_tk_spans_push(ckv_tk_spans *v, size_t off, size_t len, int32_t token, int first);

/* Runs the pre-tokenizer steps on the normalized text in `text` (whole buffer is one split with
 * `first`), appending the final pieces' bytes to `out_text` and their spans to `out`. */
ckv_status ckv_tk_pretokenize(const ckv_tokenizer *t, const char *text, size_t len, int first, ckv_tk_buf *out_text,
                              ckv_tk_spans *out, ckv_tk_buf *scratch_a, ckv_tk_buf *scratch_b,
                              ckv_tk_spans *scratch_s1, ckv_tk_spans *scratch_s2);

/* ---- models (bpe.c) -------------------------------------------------------------------------- */

/* Tokenizes one pre-tokenized piece, appending ids. `work` is reusable scratch. */
typedef struct {
    void *sym;
    size_t sym_cap;
    void *heap;
    size_t heap_cap;
} ckv_tk_bpe_work;

ckv_status ckv_tk_bpe_word(const ckv_tokenizer *t, const char *s, size_t len, ckv_tk_ids *out, ckv_tk_bpe_work *w);
void ckv_tk_bpe_work_free(ckv_tk_bpe_work *w);

/* ---- chat template (chat_template.c) ---------------------------------------------------------- */

ckv_status ckv_tk_chat_from_config(ckv_tokenizer *t, const char *jinja); /* fails only on a literal over a limit */

#endif
