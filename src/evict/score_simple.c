/* score_simple.c - the scorers that need no attention: knorm (minus the L2 norm of each post-RoPE key,
 * so the smallest norms are kept), streaming_llm (score = token index, so that with the n_sink sinks
 * protected by the caller a top-k keeps the sinks and the most recent tokens, which is the kept set
 * of kvpress's StreamingLLMPress) and random (uniform [0, 1) from a counter-based generator keyed on
 * the seed, the layer, the GLOBAL KV head and the token, so scores do not depend on tensor
 * parallelism; it does not reproduce torch's generator). No communication, no selection. */
#include <math.h>
#include <string.h>

#include "core/status.h"
#include "evict/scorer.h"

ckv_status ckv_score_knorm(const ckv_score_inputs *in, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "knorm"));
    const int d = in->head_dim, L = in->L;
    for (int g = 0; g < in->n_kv_local; g++) {
        const float *K = in->cache.k + (size_t)in->cache.off[g] * (size_t)d; // [L, d]
        float *dst = scores + (size_t)g * (size_t)L;                          // [L]
        for (int t = 0; t < L; t++) {
            const float *k = K + (size_t)t * (size_t)d;
            double ss = 0.0;
            for (int i = 0; i < d; i++) ss += (double)k[i] * (double)k[i];
            dst[t] = -(float)sqrt(ss);
        }
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_score_streaming_llm(const ckv_score_inputs *in, int n_sink, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "streaming_llm"));
    if (n_sink < 0) return ckv_error(CKV_STATUS_ERR_ARG, "--n_sink %d must be >= 0", n_sink);
    if (in->L <= n_sink)
        return ckv_error(CKV_STATUS_ERR_ARG, "--n_sink %d needs a context longer than %d tokens, got %d", n_sink,
                         n_sink, in->L);
    const int L = in->L;
    for (int g = 0; g < in->n_kv_local; g++) {
        float *dst = scores + (size_t)g * (size_t)L; // [L]
        for (int t = 0; t < L; t++) dst[t] = (float)t; /* exact up to 2^24 tokens */
    }
    return CKV_STATUS_OK;
}

static uint64_t random_mix(uint64_t x) {
    /* splitmix64 finaliser */
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

ckv_status ckv_score_random(const ckv_score_inputs *in, uint64_t seed, float *scores) {
    CKV_TRY(ckv_score_check_inputs(in, "random"));
    const int L = in->L;
    const uint64_t k_layer = random_mix(random_mix(seed) ^ (uint64_t)(uint32_t)in->layer);
    for (int g = 0; g < in->n_kv_local; g++) {
        const uint64_t k_head = random_mix(k_layer ^ ((uint64_t)(uint32_t)(in->kv_head0 + g) << 32));
        float *dst = scores + (size_t)g * (size_t)L; // [L]
        for (int t = 0; t < L; t++) {
            uint64_t r = random_mix(k_head + (uint64_t)t * 0xD1B54A32D192ED03ull);
            dst[t] = (float)(r >> 40) * (1.0f / 16777216.0f); /* 24 bits: [0, 1) exactly */
        }
    }
    return CKV_STATUS_OK;
}
