/* sampler.h - next-token choice from a row of logits: greedy, or temperature -> top-k -> top-p ->
 * min-p sampling (the order Hugging Face applies them) with a seeded generator, so every rank that runs
 * the same sampler on the same logits picks the same token. Buffers are allocated once at init. */
#ifndef CKV_SAMPLER_H
#define CKV_SAMPLER_H

#include <stdint.h>

#include "core/status.h"

typedef struct {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* 1 = off */
    uint64_t seed;
    float min_p;       /* 0 = off; else tokens below min_p x the top token's probability are dropped (HF) */
} ckv_sampler_config;

typedef struct {
    ckv_sampler_config cfg;
    int vocab;
    uint64_t state;   /* generator state */
    float *probs;     /* [vocab] */
    int32_t *idx;     /* [vocab] */
} ckv_sampler;

/* Validates the configuration (temperature >= 0, top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1; errors
 * name the flag). */
ckv_status ckv_sampler_init(ckv_sampler *s, const ckv_sampler_config *cfg, int vocab);
void ckv_sampler_free(ckv_sampler *s);

/* Index of the largest logit (lowest index on ties). */
int32_t ckv_argmax(const float *x, int n);

/* Picks the next token from logits[vocab]. */
int32_t ckv_sampler_sample(ckv_sampler *s, const float *logits);

/* Uniform double in [0, 1) from the sampler's generator (splitmix64). */
double ckv_sampler_uniform(ckv_sampler *s);

#endif
