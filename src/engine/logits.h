/* logits.h - what a request does to a row of logits before the sampler picks from it, and the
 * log-probabilities it reports: OpenAI's logit_bias and frequency / presence penalties (counted over
 * the tokens generated so far), Hugging Face's repetition penalty (over the prompt and the generated
 * tokens), the grammar's mask (grammar.h: response_format and the grammar field), and log-softmax with the k most likely tokens. Per-request state ([vocab] counts, a
 * working row) is allocated once at init; nothing is allocated per token. It does not sample
 * (sampler.h) or know about HTTP. */
#ifndef CKV_LOGITS_H
#define CKV_LOGITS_H

#include <stdint.h>

#include "core/status.h"
#include "engine/grammar.h"

#define CKV_LOGITS_MAX_BIAS 300 /* logit_bias entries per request (OpenAI's limit) */
#define CKV_LOGPROBS_MAX_TOP 20 /* top_logprobs per token (OpenAI's limit) */

typedef struct {
    int n_bias;
    int32_t bias_ids[CKV_LOGITS_MAX_BIAS];
    float bias[CKV_LOGITS_MAX_BIAS]; /* added to the logit of bias_ids[i] (-100..100; -100 bans in effect) */
    float frequency_penalty;         /* OpenAI: logit -= count * f (-2..2) */
    float presence_penalty;          /* OpenAI: logit -= (count > 0) * p (-2..2) */
    float repetition_penalty;        /* HF: a seen token's logit / r when > 0, * r when < 0 (1 = off) */
    const ckv_grammar *grammar;      /* non-NULL: the answer follows this grammar (ckv_logits_grammar sets it up;
                                      * the caller keeps it) */
} ckv_logits_config;

typedef struct {
    ckv_logits_config cfg;
    int vocab;
    int active;       /* any processing at all (else apply returns the row untouched) */
    int32_t *counts;  /* [vocab] times each token was generated in the current answer */
    uint8_t *prompt;  /* [vocab] 1: the token is in the prompt (repetition penalty) */
    float *work;      /* [vocab] the processed row */
    const ckv_grammar_vocab *gv; /* non-NULL: the answer follows cfg.grammar */
    ckv_grammar_matcher gm;
    uint8_t *allowed; /* [vocab] the grammar's mask of the next token */
    const int32_t *eos; /* [n_eos] ids that end the answer (allowed once the value is complete) */
    int n_eos;
    int json_failed;  /* a token outside the grammar was accepted (never, unless the row was all -inf) */
} ckv_logits;

/* Checks the configuration (ids in [0, vocab), ranges; errors name the request field) and sizes the
 * state. */
ckv_status ckv_logits_init(ckv_logits *p, const ckv_logits_config *cfg, int vocab);
/* Prompt ids [n] the repetition penalty sees before any answer (may be called for several parts). */
void ckv_logits_prompt(ckv_logits *p, const int32_t *ids, int n);
void ckv_logits_free(ckv_logits *p); /* accepts zeroed and partial objects */

/* Constrains the answer to cfg.grammar over vocabulary gv (built once per model); eos [n_eos] (kept
 * by the caller) end it where the document is complete. */
ckv_status ckv_logits_grammar(ckv_logits *p, const ckv_grammar_vocab *gv, const int32_t *eos, int n_eos);
/* 1 once the grammar's document is complete and nothing may follow (the answer ends there). */
int ckv_logits_grammar_finished(const ckv_logits *p);

/* A new answer starts (no generated tokens counted). */
void ckv_logits_begin(ckv_logits *p);
/* The processed row of logits [vocab]: `logits` itself when nothing applies, else p->work. */
const float *ckv_logits_apply(ckv_logits *p, const float *logits);
/* Counts a generated token. */
void ckv_logits_accept(ckv_logits *p, int32_t token);

/* log-softmax of logits [V] at `token` (computed in double); with k > 0 also the k most likely tokens
 * in descending order (ties: lower id first) into top_ids [k] and top_lp [k]. */
float ckv_logprobs_row(const float *logits, int V, int32_t token, int k, int32_t *top_ids, float *top_lp);

#endif
