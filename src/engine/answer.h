/* answer.h - the state of one answer while it is generated: the ids, the text (when the engine has a
 * tokenizer), and the rules that end it: the model's end-of-sequence ids (unless ignore_eos), the
 * request's stop ids, its stop strings (the text up to the first match is the answer) and its token
 * limit. Every command that generates (generate, eval, serve) pushes its sampled tokens here, so the
 * rules live in one place; ckv_answer_state_sample is the one place a request's next token is
 * sampled and pushed. Buffers are sized at init for max_tokens: nothing is allocated per token.
 * It does not run the model or know about HTTP; it does not lock (its owner does). */
#ifndef CKV_ENGINE_ANSWER_H
#define CKV_ENGINE_ANSWER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "engine/sampler.h"
#include "tokenizer/tokenizer.h"

typedef enum {
    CKV_FINISH_NONE = 0,
    CKV_FINISH_LENGTH,     /* max_new_tokens reached */
    CKV_FINISH_STOP,       /* a stop id or stop string of the request */
    CKV_FINISH_EOS,        /* an end-of-sequence / end-of-turn id of the model or tokenizer */
    CKV_FINISH_CANCELLED   /* the caller stopped the answer */
} ckv_finish_reason;

const char *ckv_finish_reason_name(ckv_finish_reason r); /* "length", "stop", "eos", "cancelled" */

typedef struct {
    int max_tokens;                  /* >= 0 */
    const int32_t *eos_ids;          /* the model's end ids (the engine's stop_ids); ignored with ignore_eos */
    int n_eos_ids;
    int ignore_eos;
    const int32_t *stop_ids;         /* the request's extra ids (finish STOP) */
    int n_stop_ids;
    const char *const *stop_strings; /* text that ends the answer (needs tok) */
    int n_stop_strings;
    const ckv_tokenizer *tok;        /* NULL: no text is kept */
    int keep_text;                   /* 1: keep the whole text (else only what stop strings need) */
} ckv_answer_config;

typedef struct {
    ckv_answer_config cfg;           /* the pointers are the caller's and must outlive the state */
    int32_t *ids;                    /* [max_tokens] generated ids, without a stopping eos / stop id */
    int n_ids;
    char *text;                      /* [text_cap] the text of ids (NUL-terminated; NULL without tok) */
    size_t text_len, text_cap;
    size_t safe_len;                 /* keep_text: text no stop string can still claim (what a stream may send) */
    size_t stop_max_len;             /* longest stop string */
    size_t text_base;                /* bytes dropped from the front (keep_text 0: only a window is kept) */
    char *piece;                     /* [piece_cap] one token's text */
    size_t piece_cap;
    ckv_detok_stream ds;
    int32_t stop_id;                 /* the eos / stop id that ended the answer (-1: none) */
    ckv_finish_reason finish;        /* NONE while it runs */
} ckv_answer_state;

/* Checks the configuration (stop strings need a tokenizer and may not be empty) and sizes the
 * buffers; the state is ready for a first answer. */
ckv_status ckv_answer_state_init(ckv_answer_state *a, const ckv_answer_config *cfg);
void ckv_answer_state_free(ckv_answer_state *a); /* accepts zeroed and partial objects */

/* Starts a new answer (the next choice of a request): no ids, no text, finish NONE. */
void ckv_answer_state_reset(ckv_answer_state *a);

/* Adds a sampled token; returns the finish reason it causes (NONE: the answer goes on). A finished
 * answer takes no more tokens (returns its finish reason again). */
ckv_finish_reason ckv_answer_state_push(ckv_answer_state *a, int32_t token);

/* Samples the next token from logits [V] with `sampler` and pushes it (*token: the id). */
ckv_finish_reason ckv_answer_state_sample(ckv_answer_state *a, ckv_sampler *sampler, const float *logits, int32_t *token);

/* Ends the answer now with `why` (CANCELLED, or LENGTH when max_tokens is 0): the text held back by
 * the detokeniser is flushed; a no-op on a finished answer. */
void ckv_answer_state_end(ckv_answer_state *a, ckv_finish_reason why);

#endif
