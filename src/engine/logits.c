/* logits.c - logit bias, OpenAI's penalties, HF's repetition penalty and log-probabilities (see
 * logits.h). */
#include "engine/logits.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"

ckv_status ckv_logits_init(ckv_logits *p, const ckv_logits_config *cfg, int vocab) {
    memset(p, 0, sizeof *p);
    if (vocab < 1) return ckv_error(CKV_STATUS_ERR_ARG, "logits: vocabulary %d is empty", vocab);
    if (cfg->n_bias < 0 || cfg->n_bias > CKV_LOGITS_MAX_BIAS)
        return ckv_error(CKV_STATUS_ERR_RANGE, "logit_bias has %d entries, at most %d are allowed", cfg->n_bias, CKV_LOGITS_MAX_BIAS);
    for (int i = 0; i < cfg->n_bias; i++) {
        if (cfg->bias_ids[i] < 0 || cfg->bias_ids[i] >= vocab)
            return ckv_error(CKV_STATUS_ERR_RANGE, "logit_bias: %d is not a token id in [0, %d)", cfg->bias_ids[i], vocab);
        if (!(cfg->bias[i] >= -100.0f && cfg->bias[i] <= 100.0f))
            return ckv_error(CKV_STATUS_ERR_RANGE, "logit_bias[%d] is %g, expected -100..100", cfg->bias_ids[i], cfg->bias[i]);
    }
    if (!(cfg->frequency_penalty >= -2.0f && cfg->frequency_penalty <= 2.0f))
        return ckv_error(CKV_STATUS_ERR_RANGE, "frequency_penalty is %g, expected -2..2", cfg->frequency_penalty);
    if (!(cfg->presence_penalty >= -2.0f && cfg->presence_penalty <= 2.0f))
        return ckv_error(CKV_STATUS_ERR_RANGE, "presence_penalty is %g, expected -2..2", cfg->presence_penalty);
    if (!(cfg->repetition_penalty > 0.0f) || !isfinite(cfg->repetition_penalty))
        return ckv_error(CKV_STATUS_ERR_RANGE, "repetition_penalty is %g, expected a number > 0", cfg->repetition_penalty);
    p->cfg = *cfg;
    p->vocab = vocab;
    p->active = cfg->n_bias > 0 || cfg->frequency_penalty != 0.0f || cfg->presence_penalty != 0.0f ||
                cfg->repetition_penalty != 1.0f;
    if (!p->active) return CKV_STATUS_OK;
    ckv_status st = ckv_alloc((void **)&p->counts, sizeof(int32_t) * (size_t)vocab, "generated-token counts");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&p->prompt, (size_t)vocab, "prompt-token set");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&p->work, sizeof(float) * (size_t)vocab, "processed logits");
    if (st != CKV_STATUS_OK) {
        ckv_logits_free(p);
        return st;
    }
    memset(p->prompt, 0, (size_t)vocab);
    ckv_logits_begin(p);
    return CKV_STATUS_OK;
}

void ckv_logits_prompt(ckv_logits *p, const int32_t *ids, int n) {
    if (!p->active) return;
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < p->vocab) p->prompt[ids[i]] = 1;
}

ckv_status ckv_logits_grammar(ckv_logits *p, const ckv_grammar_vocab *gv, const int32_t *eos, int n_eos) {
    if (!p->cfg.grammar) return ckv_error(CKV_STATUS_ERR_ARG, "response_format: no grammar to follow");
    if (gv->vocab != p->vocab)
        return ckv_error(CKV_STATUS_ERR_ARG, "response_format: the grammar's vocabulary (%d) is not the model's (%d)", gv->vocab, p->vocab);
    CKV_TRY(ckv_alloc((void **)&p->allowed, (size_t)p->vocab, "grammar mask"));
    if (!p->work) CKV_TRY(ckv_alloc((void **)&p->work, sizeof(float) * (size_t)p->vocab, "processed logits"));
    CKV_TRY(ckv_grammar_matcher_init(&p->gm, p->cfg.grammar, gv));
    p->gv = gv;
    p->eos = eos;
    p->n_eos = n_eos;
    return CKV_STATUS_OK;
}

int ckv_logits_grammar_finished(const ckv_logits *p) { return p->gv && ckv_grammar_matcher_finished(&p->gm); }

void ckv_logits_free(ckv_logits *p) {
    if (!p) return;
    ckv_free(p->counts);
    ckv_free(p->prompt);
    ckv_free(p->work);
    ckv_free(p->allowed);
    ckv_grammar_matcher_free(&p->gm);
    memset(p, 0, sizeof *p);
}

void ckv_logits_begin(ckv_logits *p) {
    if (p->active) memset(p->counts, 0, sizeof(int32_t) * (size_t)p->vocab);
    if (p->gv) ckv_grammar_matcher_reset(&p->gm);
    p->json_failed = 0;
}

void ckv_logits_accept(ckv_logits *p, int32_t token) {
    if (p->active && token >= 0 && token < p->vocab) p->counts[token]++;
    if (p->gv && !ckv_grammar_matcher_finished(&p->gm) && !ckv_grammar_matcher_accept(&p->gm, token)) p->json_failed = 1;
}

const float *ckv_logits_apply(ckv_logits *p, const float *logits) {
    if (!p->active && !p->gv) return logits;
    const ckv_logits_config *c = &p->cfg;
    float *w = p->work;
    memcpy(w, logits, sizeof(float) * (size_t)p->vocab);
    if (p->gv) { /* the grammar: disallowed tokens can never be chosen */
        /* (a state no token continues cannot occur with a byte-complete vocabulary; the row is then left
         * unmasked rather than all -inf) */
        if (ckv_grammar_matcher_mask(&p->gm, p->eos, p->n_eos, p->allowed) > 0)
            for (int i = 0; i < p->vocab; i++)
                if (!p->allowed[i]) w[i] = -INFINITY;
    }
    if (!p->active) return w;
    /* HF's RepetitionPenaltyLogitsProcessor first (it runs on the raw scores), over prompt + answer */
    if (c->repetition_penalty != 1.0f) {
        const float r = c->repetition_penalty;
        for (int i = 0; i < p->vocab; i++)
            if (p->prompt[i] || p->counts[i]) w[i] = w[i] < 0.0f ? w[i] * r : w[i] / r;
    }
    /* OpenAI: mu[j] - c[j] * alpha_frequency - (c[j] > 0) * alpha_presence, c over the generated text */
    if (c->frequency_penalty != 0.0f || c->presence_penalty != 0.0f)
        for (int i = 0; i < p->vocab; i++)
            if (p->counts[i]) w[i] -= (float)p->counts[i] * c->frequency_penalty + c->presence_penalty;
    for (int i = 0; i < c->n_bias; i++) w[c->bias_ids[i]] += c->bias[i];
    return w;
}

float ckv_logprobs_row(const float *logits, int V, int32_t token, int k, int32_t *top_ids, float *top_lp) {
    double mx = logits[0];
    for (int i = 1; i < V; i++)
        if (logits[i] > mx) mx = logits[i];
    double z = 0.0;
    for (int i = 0; i < V; i++) z += exp((double)logits[i] - mx);
    const double lse = mx + log(z);
    if (k > V) k = V;
    if (k > 0) { /* the k largest, kept sorted by insertion (k <= 20) */
        int n = 0;
        for (int i = 0; i < V; i++) {
            float v = logits[i];
            if (n == k && !(v > logits[top_ids[n - 1]])) continue;
            int at = n < k ? n++ : k - 1;
            while (at > 0 && v > logits[top_ids[at - 1]]) {
                top_ids[at] = top_ids[at - 1];
                at--;
            }
            top_ids[at] = i;
        }
        for (int i = 0; i < k; i++) top_lp[i] = (float)((double)logits[top_ids[i]] - lse);
    }
    return (float)((double)logits[token] - lse);
}
