/* test_sampler.c - greedy picks the argmax (lowest index on ties); sampling is reproducible by
 * seed, respects top-k and top-p (the nucleus measured over the whole softmax, or over the
 * renormalised top-k candidates), and follows the softmax distribution; bad settings are refused. */
#include "ckv_test.h"
#include "engine/sampler.h"

int main(void) {
    float logits[8] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f, 1.5f, -3.0f, 0.0f};
    CHECK(ckv_argmax(logits, 8) == 1);
    ckv_sampler s;
    ckv_sampler_config g = {0.0f, 0, 1.0f, 0, 0.0f};
    CHECK_OK(ckv_sampler_init(&s, &g, 8));
    CHECK(ckv_sampler_sample(&s, logits) == 1);
    ckv_sampler_free(&s);

    /* same seed, same sequence; different seed, (almost surely) a different one */
    ckv_sampler_config t = {1.0f, 0, 1.0f, 42, 0.0f};
    ckv_sampler a, b;
    CHECK_OK(ckv_sampler_init(&a, &t, 8));
    CHECK_OK(ckv_sampler_init(&b, &t, 8));
    int same = 1;
    for (int i = 0; i < 50; i++) same &= ckv_sampler_sample(&a, logits) == ckv_sampler_sample(&b, logits);
    CHECK_MSG(same, "two samplers with seed 42 diverged");
    ckv_sampler_free(&a);
    ckv_sampler_free(&b);

    /* frequencies follow softmax(logits / T) */
    ckv_sampler_config t2 = {0.7f, 0, 1.0f, 7, 0.0f};
    CHECK_OK(ckv_sampler_init(&a, &t2, 8));
    int counts[8] = {0};
    const int N = 200000;
    for (int i = 0; i < N; i++) counts[ckv_sampler_sample(&a, logits)]++;
    double z = 0, p[8];
    for (int i = 0; i < 8; i++) z += exp(logits[i] / 0.7);
    for (int i = 0; i < 8; i++) {
        p[i] = exp(logits[i] / 0.7) / z;
        double f = (double)counts[i] / N, sd = sqrt(p[i] * (1 - p[i]) / N);
        CHECK_MSG(fabs(f - p[i]) <= 5 * sd + 1e-4, "token %d: frequency %.4f vs probability %.4f", i, f, p[i]);
    }
    ckv_sampler_free(&a);

    /* top-k 2 only ever returns the two best (1 and 3 tie at 2.0) */
    ckv_sampler_config tk = {1.0f, 2, 1.0f, 3, 0.0f};
    CHECK_OK(ckv_sampler_init(&a, &tk, 8));
    for (int i = 0; i < 2000; i++) {
        int x = ckv_sampler_sample(&a, logits);
        CHECK_MSG(x == 1 || x == 3, "top-k 2 returned %d", x);
        if (x != 1 && x != 3) break;
    }
    ckv_sampler_free(&a);

    /* top-p: probabilities {0.5, 0.3, 0.15, 0.05}: p 0.75 keeps the first two */
    float lp[4] = {logf(0.5f), logf(0.3f), logf(0.15f), logf(0.05f)};
    ckv_sampler_config tp = {1.0f, 0, 0.75f, 9, 0.0f};
    CHECK_OK(ckv_sampler_init(&a, &tp, 4));
    int c2[4] = {0};
    for (int i = 0; i < 20000; i++) c2[ckv_sampler_sample(&a, lp)]++;
    CHECK_MSG(c2[2] == 0 && c2[3] == 0, "top-p 0.75 sampled outside the nucleus (%d, %d)", c2[2], c2[3]);
    CHECK_MSG(fabs(c2[0] / 20000.0 - 0.625) < 0.02, "top-p renormalisation: %.3f vs 0.625", c2[0] / 20000.0);
    ckv_sampler_free(&a);

    /* top-p measures the nucleus over the whole softmax (Hugging Face's TopPLogitsWarper: the smallest
     * set whose cumulative probability reaches top_p), also for the tokens the sampler never sorts.
     * Probabilities {0.4, 0.19, 0.17, 0.16, 0.08}, top_p 0.6: cumulative 0.4, 0.59, 0.76, so the kept
     * set is {0, 1, 2}, sampled as 0.4 : 0.19 : 0.17 (/ 0.76). Measured over the four tokens above the
     * sampler's cut-off ((1 - 0.6) / 4 = 0.1) only, 0.4 / 0.92 and 0.59 / 0.92 = 0.64 would already
     * reach 0.6 and drop token 2. */
    float lq[5] = {logf(0.4f), logf(0.19f), logf(0.17f), logf(0.16f), logf(0.08f)};
    ckv_sampler_config nucleus = {1.0f, 0, 0.6f, 11, 0.0f};
    CHECK_OK(ckv_sampler_init(&a, &nucleus, 5));
    int c3[5] = {0};
    const int N3 = 20000;
    for (int i = 0; i < N3; i++) c3[ckv_sampler_sample(&a, lq)]++;
    CHECK_MSG(c3[3] == 0 && c3[4] == 0, "top-p 0.6 sampled outside the kept set {0, 1, 2} (%d, %d)", c3[3], c3[4]);
    const double kept_p[3] = {0.4 / 0.76, 0.19 / 0.76, 0.17 / 0.76};
    for (int i = 0; i < 3; i++) {
        const double f = (double)c3[i] / N3, sd = sqrt(kept_p[i] * (1 - kept_p[i]) / N3);
        CHECK_MSG(c3[i] > 0 && fabs(f - kept_p[i]) <= 5 * sd, "top-p 0.6, token %d of the kept set {0, 1, 2}: "
                  "frequency %.4f vs %.4f", i, f, kept_p[i]);
    }
    ckv_sampler_free(&a);
    /* with top-k, top-p measures the renormalised top-k distribution (top-k runs first): top-3 of the
     * same probabilities is {0.4, 0.19, 0.17} / 0.76 = {0.526, 0.25, 0.224}, cumulative 0.526, 0.776,
     * so top_p 0.7 keeps {0, 1} (over the whole softmax 0.4, 0.59, 0.76 it would keep token 2 too) */
    ckv_sampler_config kp = {1.0f, 3, 0.7f, 12, 0.0f};
    CHECK_OK(ckv_sampler_init(&a, &kp, 5));
    int c4[5] = {0};
    for (int i = 0; i < N3; i++) c4[ckv_sampler_sample(&a, lq)]++;
    CHECK_MSG(c4[0] > 0 && c4[1] > 0 && c4[2] == 0 && c4[3] == 0 && c4[4] == 0,
              "top-k 3, top-p 0.7: counts %d %d %d %d %d, expected only the kept set {0, 1}", c4[0], c4[1], c4[2],
              c4[3], c4[4]);
    ckv_sampler_free(&a);

    ckv_sampler_config bad1 = {-1.0f, 0, 1.0f, 0, 0.0f}, bad2 = {1.0f, -1, 1.0f, 0, 0.0f}, bad3 = {1.0f, 0, 0.0f, 0, 0.0f};
    CHECK_FAILS(ckv_sampler_init(&a, &bad1, 8), CKV_STATUS_ERR_ARG, "--temperature");
    CHECK_FAILS(ckv_sampler_init(&a, &bad2, 8), CKV_STATUS_ERR_ARG, "--top-k");
    CHECK_FAILS(ckv_sampler_init(&a, &bad3, 8), CKV_STATUS_ERR_ARG, "--top-p");
    return ckv_test_finish("test_sampler");
}
