/* test_sweep.c - one prefill serves a sweep (engine/sweep.h): for every press family of the eviction
 * tests (plus headkv with a profile) at two budgets, on the llama_gqa fixture with an F32 cache and
 * on qwen2_bias (q/k/v biases) with a BF16 cache, the context derived from the shared prefill equals
 * ckv_engine_prepare's bit for bit: the kept rows of every (layer, KV head) with their positions and
 * capacities, the kept counts, then the greedy answer to a question and the teacher-forced logits of
 * a continuation. Presses that leave the context whole answer from the full cache and say why; a
 * press reading attention inputs the sweep did not keep is refused; nothing leaks. */
#include <stdio.h>
#include <string.h>

#include "ckv_test.h"
#include "common/fixture.h"
#include "core/alloc.h"
#include "engine/sweep.h"

#define NCTX 300
#define NQ 3
#define NEW 6

static void press_of(ckv_press_config *p, const char *spec, double budget, const char *model) {
    CHECK_OK(ckv_press_parse(p, spec));
    if (p->composed) { /* its budget is one ratio per press: the budget's for every press */
        char r[256];
        int n = 0;
        for (int i = 0; i < p->n_stages; i++) n += snprintf(r + n, sizeof r - (size_t)n, "%s%.17g", i ? "," : "", 1.0 - budget);
        CHECK_OK(ckv_press_set_option(p, "press_ratios", r));
        CHECK_OK(ckv_press_finalize(p));
        return;
    }
    if (!strncmp(spec, "headkv", 6) || strstr(spec, "_headkv")) {
        char prof[600];
        snprintf(prof, sizeof prof, "%s/presses/headkv_profile_%s.json", CKV_FIXTURES, model);
        CHECK_OK(ckv_press_set_option(p, "profile", prof));
    }
    CHECK_OK(ckv_press_set_budget(p, budget));
    CHECK_OK(ckv_press_finalize(p));
}

/* Every head's rows of two caches: equal bytes (read back as fp32), positions and capacities. */
static int same_cache(const ckv_session *a, const ckv_session *b, const char *what) {
    const ckv_kv_cache *x = &a->kv, *y = &b->kv;
    int d = x->head_dim, bad = 0;
    for (int l = 0; l < x->n_layers && !bad; l++)
        for (int h = 0; h < x->n_kv && !bad; h++) {
            int n = x->layers[l].len[h];
            if (n != y->layers[l].len[h] || x->layers[l].cap[h] != y->layers[l].cap[h]) {
                fprintf(stderr, "  %s: layer %d head %d holds %d rows (cap %d), separately %d (cap %d)\n", what, l, h,
                        y->layers[l].len[h], y->layers[l].cap[h], n, x->layers[l].cap[h]);
                bad = 1;
                break;
            }
            float *k0 = malloc(sizeof(float) * (size_t)n * d * 4);
            int32_t *p0 = malloc(sizeof(int32_t) * (size_t)n * 2);
            float *v0 = k0 + (size_t)n * d, *k1 = v0 + (size_t)n * d, *v1 = k1 + (size_t)n * d;
            int32_t *p1 = p0 + n;
            CHECK_OK(ckv_kv_head_read(x, l, h, k0, v0, p0));
            CHECK_OK(ckv_kv_head_read(y, l, h, k1, v1, p1));
            for (int i = 0; i < n && !bad; i++)
                if (p0[i] != p1[i] || memcmp(k0 + (size_t)i * d, k1 + (size_t)i * d, sizeof(float) * d) ||
                    memcmp(v0 + (size_t)i * d, v1 + (size_t)i * d, sizeof(float) * d)) {
                    fprintf(stderr, "  %s: layer %d head %d row %d: position %d, separately %d (or its key/value differs)\n",
                            what, l, h, i, p1[i], p0[i]);
                    bad = 1;
                }
            free(k0);
            free(p0);
        }
    return !bad;
}

static void run_model(const char *name, ckv_dtype kv) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/%s", CKV_FIXTURES, name);
    ckv_engine_config cfg = {.model_path = dir, .backend = "cpu", .threads = 2, .device = -1, .chunk = 64, .kv_dtype = kv,
                             .weights_dtype = CKV_DTYPE_DEFAULT};
    ckv_engine e;
    CHECK_OK(ckv_engine_init(&e, &cfg, NULL));
    if (!e.model) return;
    const int V = e.model->cfg.vocab_size;
    int32_t ctx[NCTX], q[NQ] = {5, 17, 29}, cont[NEW];
    for (int i = 0; i < NCTX; i++) ctx[i] = 1 + (i * 37) % 400;
    for (int i = 0; i < NEW; i++) cont[i] = 3 + i * 11;
    const int reserve = NQ + NEW;
    ckv_gen_params g = {.max_new_tokens = NEW, .ignore_eos = 1};
    g.sampling.top_p = 1.0f;
    const char *extra[] = {"headkv:snapkv", "critical_headkv:snapkv", "adakv:tova", "critical:observed_attention",
                           "layer_defensivekv", "composed:snapkv+knorm", "composed:knorm+cur+keydiff"};
    const int n_fx = (int)ckv_fixture_n_presses, n_all = n_fx + (int)(sizeof extra / sizeof extra[0]);
    const double budgets[] = {0.3, 0.6, 1.0};
    int xn_first = NCTX;
    ckv_press_config *presses = calloc((size_t)n_all * 3, sizeof *presses);
    for (int i = 0; i < n_all; i++)
        for (int b = 0; b < 3; b++) {
            press_of(&presses[i * 3 + b], i < n_fx ? ckv_fixture_presses[i] : extra[i - n_fx], budgets[b], name);
            int f = ckv_sweep_xn_first(&presses[i * 3 + b], NCTX);
            xn_first = f < xn_first ? f : xn_first;
        }
    CHECK_MSG(xn_first == 0, "observed attention reads every row, the sweep keeps from %d", xn_first);
    ckv_sweep sw;
    CHECK_OK(ckv_sweep_init(&sw, &e, ctx, NCTX, reserve, xn_first));
    float *lf = malloc(sizeof(float) * (size_t)NEW * V * 2), *ls = lf + (size_t)NEW * V;
    int n_same = 0, n_cases = 0;
    for (int i = 0; i < n_all * 3; i++) {
        const ckv_press_config *p = &presses[i];
        char what[700];
        snprintf(what, sizeof what, "%s %s", name, p->spec);
        ckv_prepared sep, der, *use = NULL;
        ckv_prepare_params pp = {.ids = ctx, .n = NCTX, .press = p, .reserve = reserve};
        CHECK_OK(ckv_engine_prepare(&e, &pp, &sep));
        CHECK_OK(ckv_sweep_derive(&sw, p, 0, NULL, &der, &use));
        if (!use || !sep.sess.model) {
            ckv_prepared_free(&sep);
            continue;
        }
        n_cases++;
        int ok = use->compressed == sep.compressed && use->stats.kept_entries == sep.stats.kept_entries &&
                 use->stats.total_entries == sep.stats.total_entries &&
                 (use->uncompressed_reason == NULL) == (sep.uncompressed_reason == NULL);
        CHECK_MSG(ok, "%s: compressed %d/%d kept %ld/%ld of %ld/%ld, reason '%s' / '%s'", what, use->compressed,
                  sep.compressed, use->stats.kept_entries, sep.stats.kept_entries, use->stats.total_entries,
                  sep.stats.total_entries, use->uncompressed_reason ? use->uncompressed_reason : "-",
                  sep.uncompressed_reason ? sep.uncompressed_reason : "-");
        CHECK_MSG(budgets[i % 3] < 1.0 || !use->compressed || p->alloc == CKV_ALLOC_HEADKV, "%s: a budget of 1 compressed", what);
        int same = same_cache(&sep.sess, &use->sess, what);
        CHECK_MSG(same, "%s: the derived cache differs from the separate prefill's", what);
        CHECK_MSG(!memcmp(sep.logits, use->logits, sizeof(float) * (size_t)V), "%s: context logits differ", what);
        ckv_answer a, b;
        CHECK_OK(ckv_prepared_answer(&sep, 0, q, NQ, &g, NULL, &a));
        CHECK_OK(ckv_prepared_answer(use, 0, q, NQ, &g, NULL, &b));
        int ids = a.n == b.n && !memcmp(a.ids, b.ids, sizeof(int32_t) * (size_t)a.n);
        CHECK_MSG(ids, "%s: answers differ (%d vs %d tokens)", what, a.n, b.n);
        for (int t = 0; !ids && t < a.n && t < b.n; t++)
            if (a.ids[t] != b.ids[t]) {
                fprintf(stderr, "  first mismatch at token %d: %d vs %d\n", t, a.ids[t], b.ids[t]);
                break;
            }
        CHECK_OK(ckv_prepared_forward(&sep, cont, NEW, lf));
        CHECK_OK(ckv_prepared_forward(use, cont, NEW, ls));
        double maxerr = 0;
        for (size_t k = 0; k < (size_t)NEW * V; k++) maxerr = fmax(maxerr, fabs((double)lf[k] - ls[k]));
        CHECK_MSG(maxerr == 0.0, "%s: teacher-forced logits differ, max |error| %.3g", what, maxerr);
        n_same += same && ids && maxerr == 0.0;
        ckv_answer_free(&a);
        ckv_answer_free(&b);
        const int derived = use == &der;
        ckv_sweep_release(&sw, &der); /* the next press gathers into these pools */
        CHECK_MSG(!derived || (sw.spare.layers && sw.spare.layers[0].kbuf), "%s: the derived pools were not kept", what);
        ckv_prepared_free(&sep);
    }
    fprintf(stderr, "%s (%s cache): %d of %d press x budget cases bit-identical to a separate prefill\n", name,
            kv == CKV_DTYPE_BF16 ? "bf16" : "f32", n_same, n_cases);
    CHECK_MSG(n_cases == n_all * 3, "%d cases ran of %d", n_cases, n_all * 3);
    ckv_sweep_free(&sw);
    /* a sweep that kept only the window rows refuses a press reading all of them */
    ckv_press_config snap, obs;
    press_of(&snap, "snapkv", 0.3, name);
    press_of(&obs, "observed_attention", 0.3, name);
    CHECK_OK(ckv_sweep_init(&sw, &e, ctx, NCTX, reserve, ckv_sweep_xn_first(&snap, NCTX)));
    CHECK(sw.xn_first == NCTX - snap.window);
    ckv_prepared der, *use = NULL;
    CHECK_FAILS(ckv_sweep_derive(&sw, &obs, 0, NULL, &der, &use), CKV_STATUS_ERR_ARG, "attention inputs from row 0");
    CHECK_OK(ckv_sweep_derive(&sw, &snap, 0, NULL, &der, &use));
    CHECK(use == &der && der.compressed);
    ckv_prepared_free(&der);
    ckv_sweep_free(&sw);
    free(lf);
    free(presses);
    ckv_engine_free(&e);
}

int main(void) {
    const size_t live0 = ckv_alloc_live_bytes();
    run_model("llama_gqa", CKV_DTYPE_F32);
    run_model("qwen2_bias", CKV_DTYPE_BF16);
    CHECK_MSG(ckv_alloc_live_bytes() == live0, "%zu bytes live, %zu before", ckv_alloc_live_bytes(), live0);
    return ckv_test_finish("test_sweep");
}
