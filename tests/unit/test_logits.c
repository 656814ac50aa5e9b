/* test_logits.c - the request's logit processing and log-probabilities (engine/logits.h) on
 * hand-checkable rows: logit_bias adds to the named ids, OpenAI's frequency and presence penalties
 * subtract count * f + p from the generated tokens only (and reset per answer), HF's repetition
 * penalty divides positive / multiplies negative logits of prompt and generated tokens, an inactive
 * configuration returns the row itself; log-softmax and the top-k list (descending, ties by id) against
 * a direct computation; min-p in the sampler keeps exactly the tokens at or above min_p x the top
 * probability; bad settings are refused naming the request field. */
#include "ckv_test.h"
#include "engine/logits.h"
#include "engine/sampler.h"

int main(void) {
    const float row[6] = {1.0f, -2.0f, 3.0f, 0.5f, -0.5f, 3.0f};
    ckv_logits p;
    ckv_logits_config off = {0};
    off.repetition_penalty = 1.0f;
    CHECK_OK(ckv_logits_init(&p, &off, 6));
    CHECK_MSG(ckv_logits_apply(&p, row) == row, "an inactive configuration copies the row");
    ckv_logits_free(&p);

    /* bias + OpenAI penalties: counts over the generated tokens */
    ckv_logits_config c = {0};
    c.repetition_penalty = 1.0f;
    c.n_bias = 2;
    c.bias_ids[0] = 1, c.bias[0] = 5.0f;
    c.bias_ids[1] = 5, c.bias[1] = -100.0f;
    c.frequency_penalty = 0.5f;
    c.presence_penalty = 0.25f;
    CHECK_OK(ckv_logits_init(&p, &c, 6));
    int32_t prompt[2] = {0, 3};
    ckv_logits_prompt(&p, prompt, 2); /* OpenAI's penalties ignore the prompt */
    ckv_logits_accept(&p, 2);
    ckv_logits_accept(&p, 2);
    ckv_logits_accept(&p, 4);
    const float *w = ckv_logits_apply(&p, row);
    const float want[6] = {1.0f, 3.0f, 3.0f - 2 * 0.5f - 0.25f, 0.5f, -0.5f - 0.5f - 0.25f, -97.0f};
    CHECK(ckv_test_allclose("bias+penalties", w, want, 6, 1e-6, 0) <= 1e-6);
    ckv_logits_begin(&p); /* a new answer: nothing generated yet */
    w = ckv_logits_apply(&p, row);
    const float want0[6] = {1.0f, 3.0f, 3.0f, 0.5f, -0.5f, -97.0f};
    CHECK(ckv_test_allclose("after begin", w, want0, 6, 1e-6, 0) <= 1e-6);
    ckv_logits_free(&p);

    /* HF repetition penalty over prompt and answer */
    ckv_logits_config r = {0};
    r.repetition_penalty = 2.0f;
    CHECK_OK(ckv_logits_init(&p, &r, 6));
    int32_t pr[1] = {1};
    ckv_logits_prompt(&p, pr, 1);
    ckv_logits_accept(&p, 2);
    w = ckv_logits_apply(&p, row);
    const float wantr[6] = {1.0f, -4.0f, 1.5f, 0.5f, -0.5f, 3.0f};
    CHECK(ckv_test_allclose("repetition", w, wantr, 6, 1e-6, 0) <= 1e-6);
    ckv_logits_free(&p);

    /* log-softmax and top-k */
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp((double)row[i]);
    int32_t ids[4];
    float lp[4];
    float l1 = ckv_logprobs_row(row, 6, 1, 4, ids, lp);
    CHECK_MSG(fabs(l1 - (-2.0 - log(z))) < 1e-6, "logprob of token 1: %g vs %g", l1, -2.0 - log(z));
    CHECK_MSG(ids[0] == 2 && ids[1] == 5 && ids[2] == 0 && ids[3] == 3, "top-4 ids %d %d %d %d, expected 2 5 0 3", ids[0], ids[1],
              ids[2], ids[3]);
    for (int i = 0; i < 4; i++)
        CHECK_MSG(fabs(lp[i] - (row[ids[i]] - log(z))) < 1e-6, "top %d: %g vs %g", i, lp[i], row[ids[i]] - log(z));
    /* a larger vocabulary: the top-k of a random row equals a full sort's */
    enum { V = 5000, K = 20 };
    static float big[V];
    uint64_t st = 99;
    for (int i = 0; i < V; i++) big[i] = (float)(ckv_test_rng_u32(&st) % 100000) / 1000.0f;
    int32_t bi[K];
    float bl[K];
    ckv_logprobs_row(big, V, 0, K, bi, bl);
    for (int k = 0; k < K; k++) { /* bi[k] has exactly k tokens above it or tied with a lower id */
        int above = 0;
        for (int i = 0; i < V; i++) above += big[i] > big[bi[k]] || (big[i] == big[bi[k]] && i < bi[k]);
        CHECK_MSG(above == k, "top-%d entry %d has %d tokens ranked above it", k, bi[k], above);
    }

    /* min-p: probabilities {0.5, 0.3, 0.15, 0.05}; min_p 0.5 keeps p >= 0.25: tokens 0 and 1 */
    float pl[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    ckv_sampler_config mp = {1.0f, 0, 1.0f, 5, 0.5f};
    ckv_sampler s;
    CHECK_OK(ckv_sampler_init(&s, &mp, 4));
    int cnt[4] = {0};
    for (int i = 0; i < 20000; i++) cnt[ckv_sampler_sample(&s, pl)]++;
    CHECK_MSG(cnt[2] == 0 && cnt[3] == 0 && cnt[1] > 0, "min_p 0.5: counts %d %d %d %d", cnt[0], cnt[1], cnt[2], cnt[3]);
    CHECK_MSG(fabs(cnt[0] / 20000.0 - 0.625) < 0.02, "min-p renormalisation: %.3f vs 0.625", cnt[0] / 20000.0);
    ckv_sampler_free(&s);
    ckv_sampler_config mpk = {1.0f, 3, 1.0f, 5, 0.4f}; /* with top-k: 0.2 cut keeps {0, 1} */
    CHECK_OK(ckv_sampler_init(&s, &mpk, 4));
    int ck[4] = {0};
    for (int i = 0; i < 5000; i++) ck[ckv_sampler_sample(&s, pl)]++;
    CHECK_MSG(ck[2] == 0 && ck[3] == 0, "top-k 3 + min_p 0.4: counts %d %d %d %d", ck[0], ck[1], ck[2], ck[3]);
    ckv_sampler_free(&s);

    /* bad settings name the request fields */
    ckv_logits_config b = {0};
    b.repetition_penalty = 1.0f;
    b.n_bias = 1, b.bias_ids[0] = 6, b.bias[0] = 1.0f;
    CHECK_FAILS(ckv_logits_init(&p, &b, 6), CKV_STATUS_ERR_RANGE, "logit_bias");
    b.n_bias = 0, b.frequency_penalty = 3.0f;
    CHECK_FAILS(ckv_logits_init(&p, &b, 6), CKV_STATUS_ERR_RANGE, "frequency_penalty");
    b.frequency_penalty = 0, b.repetition_penalty = 0.0f;
    CHECK_FAILS(ckv_logits_init(&p, &b, 6), CKV_STATUS_ERR_RANGE, "repetition_penalty");
    ckv_sampler_config bm = {1.0f, 0, 1.0f, 0, 1.5f};
    CHECK_FAILS(ckv_sampler_init(&s, &bm, 4), CKV_STATUS_ERR_ARG, "min_p");
    return ckv_test_finish("test_logits");
}
