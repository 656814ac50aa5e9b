/* sampler.c - greedy / temperature / top-k / top-p / min-p sampling (see sampler.h). */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>

#include "core/alloc.h"

ckv_status ckv_sampler_init(ckv_sampler *s, const ckv_sampler_config *cfg, int vocab) {
    s->probs = NULL;
    s->idx = NULL;
    if (!(cfg->temperature >= 0.0f) || !isfinite(cfg->temperature))
        return ckv_error(CKV_STATUS_ERR_ARG, "--temperature must be a finite number >= 0, got %g", cfg->temperature);
    if (cfg->top_k < 0) return ckv_error(CKV_STATUS_ERR_ARG, "--top-k must be >= 0, got %d", cfg->top_k);
    if (!(cfg->top_p > 0.0f && cfg->top_p <= 1.0f))
        return ckv_error(CKV_STATUS_ERR_ARG, "--top-p must be in (0, 1], got %g", cfg->top_p);
    if (!(cfg->min_p >= 0.0f && cfg->min_p <= 1.0f))
        return ckv_error(CKV_STATUS_ERR_ARG, "min_p must be in [0, 1], got %g", cfg->min_p);
    if (vocab < 1) return ckv_error(CKV_STATUS_ERR_ARG, "sampler vocabulary %d is empty", vocab);
    s->cfg = *cfg;
    s->vocab = vocab;
    s->state = cfg->seed ^ 0x9e3779b97f4a7c15ull;
    CKV_TRY(ckv_alloc((void **)&s->probs, (size_t)vocab * sizeof(float), "sampler probabilities"));
    ckv_status st = ckv_alloc((void **)&s->idx, (size_t)vocab * sizeof(int32_t), "sampler indices");
    if (st != CKV_STATUS_OK) ckv_sampler_free(s);
    return st;
}

void ckv_sampler_free(ckv_sampler *s) {
    if (!s) return;
    ckv_free(s->probs);
    ckv_free(s->idx);
    s->probs = NULL;
    s->idx = NULL;
}

int32_t ckv_argmax(const float *x, int n) {
    int32_t best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

double ckv_sampler_uniform(ckv_sampler *s) {
    uint64_t z = (s->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

/* Context for sorting candidate indices by descending probability (ties: lower index first). */
static const float *ckv_sort_probs;
static int ckv_cmp_desc(const void *a, const void *b) {
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    float pi = ckv_sort_probs[i], pj = ckv_sort_probs[j];
    if (pi > pj) return -1;
    if (pi < pj) return 1;
    return (i > j) - (i < j);
}

int32_t ckv_sampler_sample(ckv_sampler *s, const float *logits) {
    int V = s->vocab;
    if (s->cfg.temperature == 0.0f) return ckv_argmax(logits, V);
    float *p = s->probs;
    int32_t *idx = s->idx;
    float inv_t = 1.0f / s->cfg.temperature;
    float mx = logits[ckv_argmax(logits, V)] * inv_t;
    double sum = 0.0;
    for (int i = 0; i < V; i++) {
        p[i] = expf(logits[i] * inv_t - mx);
        sum += p[i];
    }
    for (int i = 0; i < V; i++) p[i] = (float)(p[i] / sum);
    /* candidates: all tokens, or (top-p alone) those at or above a cut-off: the tokens below it hold
     * less than 1 - top_p of the mass together, so the nucleus ends before reaching them */
    int n = 0;
    float cutoff = s->cfg.top_p < 1.0f && s->cfg.top_k == 0 ? (1.0f - s->cfg.top_p) / (float)(V > 1 ? V - 1 : 1) : 0.0f;
    /* min-p drops everything below min_p x the top probability whatever else runs; without top-k (whose
     * renormalised mass top-p measures) those tokens need not be sorted */
    const float pmax = (float)(1.0 / sum), min_cut = s->cfg.min_p * pmax;
    if (s->cfg.top_k == 0 && min_cut > cutoff) cutoff = min_cut;
    for (int i = 0; i < V; i++)
        if (p[i] >= cutoff) idx[n++] = i;
    ckv_sort_probs = p;
    qsort(idx, (size_t)n, sizeof *idx, ckv_cmp_desc);
    if (s->cfg.top_k > 0 && s->cfg.top_k < n) n = s->cfg.top_k;
    /* the distribution top-p measures: the top-k candidates renormalised (top_k > 0), else the whole
     * softmax, the tokens below the cut-off included (they are never in the nucleus, but their mass
     * counts towards the whole) */
    double mass = 0.0;
    if (s->cfg.top_k > 0)
        for (int i = 0; i < n; i++) mass += p[idx[i]];
    else
        for (int i = 0; i < V; i++) mass += p[i];
    if (s->cfg.top_p < 1.0f) { /* smallest prefix whose mass reaches top_p of that (at least one token) */
        const double target = (double)s->cfg.top_p * mass;
        double acc = 0.0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            acc += p[idx[i]];
            if (acc >= target) {
                keep = i + 1;
                break;
            }
        }
        n = keep;
        mass = 0.0;
        for (int i = 0; i < n; i++) mass += p[idx[i]];
    }
    if (s->cfg.min_p > 0.0f) { /* HF's MinPLogitsWarper, after top-p: a prefix of the sorted candidates */
        int keep = 1;
        while (keep < n && p[idx[keep]] >= min_cut) keep++;
        n = keep;
        mass = 0.0;
        for (int i = 0; i < n; i++) mass += p[idx[i]];
    }
    double r = ckv_sampler_uniform(s) * mass, acc = 0.0;
    for (int i = 0; i < n; i++) {
        acc += p[idx[i]];
        if (r < acc) return idx[i];
    }
    return idx[n - 1];
}
