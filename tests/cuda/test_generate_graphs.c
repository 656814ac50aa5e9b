/* test_generate_graphs.c - the decode of `ckv generate` and `ckv eval` (ckv_engine_run ->
 * ckv_prepared_answer) through the recorded decode step: on the bf16 fixture model with a bf16 KV
 * cache, the same requests on a backend with recorded steps on and on one with them off
 * (CKV_CUDA_GRAPHS=0) give the same ids and the same host logits at every token (max error 0), the
 * rows the on_token callback sees (host sampling, stop strings, logprobs read them):
 *   - greedy, two questions over one context (the second answered after the rewind, with the first's
 *     recordings);
 *   - sampled on the host (temperature, top-k, top-p, a seed);
 *   - a decode press (knorm, every 8 steps down to 48 rows per head) that compresses mid-answer,
 *     replays continuing over the compacted caches;
 *   - a stop string that ends the answer part way (finish stop).
 * On cuda-emu the layer's counters show, per decode step of the greedy answers: the first step of
 * the first answer runs unrecorded, the second is recorded, and every later one is 1 graph launch,
 * 1 host wait, no kernel or GEMM launched from the host and no allocation; printed beside the
 * unrecorded backend's launches per step. CKV_EMU_CHECK=1 runs the replays through the layer's checks.
 *   test_generate_graphs [cuda-emu]   the above (label cuda-emu)
 *   test_generate_graphs cuda         on a GPU (label cuda): ids and logits only; skips without one */
#define _POSIX_C_SOURCE 200809L /* setenv (graph_test.h) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "engine/decode_press.h"
#include "engine/request.h"
#include "engine/text.h"
#include "graph_test.h"
#include "model/model.h"

enum { NCTX = 60, NQ = 2, QLEN = 5, MAX_NEW = 24, MAX_TOK = NQ * (MAX_NEW + 1) };

/* What one run's on_token callback saw: every token, its logits row and the counters after it. */
typedef struct {
    int V, n;
    int32_t ids[MAX_TOK];
    int question[MAX_TOK];
    float *logits;          /* [MAX_TOK, V] */
    emu_counts at[MAX_TOK]; /* the counters when token i was sampled */
} trace;

static int record(void *ctx, int question, int32_t token, int is_stop, const float *logits) {
    (void)is_stop;
    trace *t = ctx;
    if (t->n >= MAX_TOK) return 1;
    t->ids[t->n] = token;
    t->question[t->n] = question;
    memcpy(t->logits + (size_t)t->n * t->V, logits, sizeof(float) * (size_t)t->V);
    t->at[t->n] = emu_counts_now();
    t->n++;
    return 0;
}

/* One request on engine e, its trace in *t and its result in *res (freed by the caller). */
static ckv_status run(ckv_engine *e, const ckv_request *base, trace *t, ckv_result *res) {
    t->n = 0;
    ckv_request r = *base;
    r.gen.on_token = record;
    r.gen.cb_ctx = t;
    return ckv_engine_run(e, &r, res);
}

/* The same request on the unrecorded (off) and the recording (on) engine: ids, finish reasons and
 * logits equal. Returns 1 when they are; *ton keeps the recording run's trace, *ron its result. */
static int same_run(const char *what, ckv_engine *off, ckv_engine *on, const ckv_request *r, trace *toff, trace *ton,
                    ckv_result *ron) {
    ckv_result roff;
    memset(ron, 0, sizeof *ron);
    const ckv_status s0 = run(off, r, toff, &roff);
    CHECK_MSG(s0 == CKV_STATUS_OK, "%s, recorded steps off: %s", what, ckv_error_message());
    const ckv_status s1 = run(on, r, ton, ron);
    CHECK_MSG(s1 == CKV_STATUS_OK, "%s, recorded steps on: %s", what, ckv_error_message());
    if (s0 != CKV_STATUS_OK || s1 != CKV_STATUS_OK) {
        if (s0 == CKV_STATUS_OK) ckv_result_free(&roff);
        return 0;
    }
    int wrong = toff->n != ton->n, shown = 0;
    double max_err = 0.0;
    const int V = toff->V;
    for (int i = 0; i < toff->n && i < ton->n; i++) {
        if (toff->ids[i] != ton->ids[i] && shown++ < 5)
            fprintf(stderr, "  %s token %d: id %d recorded, %d unrecorded\n", what, i, ton->ids[i], toff->ids[i]);
        wrong += toff->ids[i] != ton->ids[i];
        for (int v = 0; v < V; v++) {
            const double d = fabs((double)toff->logits[(size_t)i * V + v] - (double)ton->logits[(size_t)i * V + v]);
            if (!(d <= max_err)) { /* NaN counts */
                if (max_err == 0.0 && shown++ < 5)
                    fprintf(stderr, "  %s token %d logit %d: %.9g recorded, %.9g unrecorded\n", what, i, v,
                            (double)ton->logits[(size_t)i * V + v], (double)toff->logits[(size_t)i * V + v]);
                max_err = isnan(d) ? INFINITY : d;
            }
        }
    }
    for (int q = 0; q < roff.n_answers && q < ron->n_answers; q++)
        wrong += roff.answers[q].finish != ron->answers[q].finish || roff.answers[q].n != ron->answers[q].n;
    CHECK_MSG(wrong == 0, "%s: %d tokens (of %d and %d) or finish reasons differ between recorded steps on and off",
              what, wrong, toff->n, ton->n);
    CHECK_MSG(max_err == 0.0, "%s: the host logits differ between recorded steps on and off by up to %g", what, max_err);
    fprintf(stderr, "%s %s: %d tokens, ids equal with recorded steps on and off, host logits max error %g\n",
            wrong || max_err > 0.0 ? "FAIL" : "ok  ", what, ton->n, max_err);
    ckv_result_free(&roff);
    return !wrong && max_err == 0.0;
}

/* The graph launches of a recording run (the counters between its first and last token). */
static unsigned long long graph_launches(const trace *t) {
    return t->n > 1 ? t->at[t->n - 1].graph_launches - t->at[0].graph_launches : 0;
}

/* The counters of the decode step after token i (the work between its callback and the next). */
static emu_counts step(const trace *t, int i) { return emu_counts_between(t->at[i], t->at[i + 1]); }

/* Per decode step of the greedy answers (see the top): recording on, 1 graph launch and 1 wait from
 * the third step of the first answer on (the second answer's key is known: it replays from its first). */
static void check_counts(const trace *off, const trace *on, int L) {
    int bad = 0, replays = 0;
    emu_counts last_on = {0}, last_off = {0};
    for (int i = 0; i + 1 < on->n; i++) {
        if (on->question[i + 1] != on->question[i]) continue; /* the next question's prefill between */
        const emu_counts c = step(on, i), u = step(off, i);
        const int first_two = on->question[i] == 0 && i < 2;
        if (first_two) {
            const int want_captures = i == 1;
            if (c.captures != (unsigned long long)want_captures || c.graph_launches != (unsigned long long)want_captures) {
                if (bad++ < 5)
                    fprintf(stderr, "  decode step %d: %llu captures, %llu graph launches (want %d, %d)\n", i,
                            c.captures, c.graph_launches, want_captures, want_captures);
            }
            continue;
        }
        if (c.graph_launches != 1 || c.captures != 0 || c.kernels != 0 || c.gemms != 0 || c.waits != 1 || c.allocs != 0) {
            if (bad++ < 5)
                fprintf(stderr, "  decode step %d (question %d): %llu graph launches, %llu captures, %llu kernels, %llu "
                        "GEMMs, %llu host waits, %llu allocations (want 1, 0, 0, 0, 1, 0)\n", i, on->question[i],
                        c.graph_launches, c.captures, c.kernels, c.gemms, c.waits, c.allocs);
        }
        replays++;
        last_on = c, last_off = u;
    }
    CHECK_MSG(bad == 0, "%d decode steps of the answers launched or waited other than recorded", bad);
    CHECK_MSG(replays >= 2 * (MAX_NEW - 3), "only %d replayed decode steps (want at least %d)", replays, 2 * (MAX_NEW - 3));
    fprintf(stderr, "%s %d replayed decode steps, per step: recorded %llu graph launch, %llu kernels, %llu GEMMs, "
            "%llu host wait; unrecorded %llu kernels (%.1f per layer), %llu GEMMs, %llu host wait\n",
            bad ? "FAIL" : "ok  ", replays, last_on.graph_launches, last_on.kernels, last_on.gemms, last_on.waits,
            last_off.kernels, (double)last_off.kernels / L, last_off.gemms, last_off.waits);
}

/* The text of the first k ids of an answer (malloc'd, NUL-terminated), or NULL. */
static char *answer_text(const ckv_tokenizer *tok, const ckv_answer *a, int k) {
    char *text = NULL;
    size_t len = 0;
    if (ckv_tokenizer_decode(tok, a->ids, k, CKV_DETOKENIZE_SKIP_SPECIAL, &text, &len) != CKV_STATUS_OK) return NULL;
    return text;
}

/* A stop string that ends the greedy answer a part way: the last character of the text of its first
 * k ids that is not in the text before, for the largest k in 4 .. a->n - 2. 0 when none. */
static int pick_stop(const ckv_tokenizer *tok, const ckv_answer *a, char *stop) {
    for (int k = a->n - 2; k >= 4; k--) {
        char *text = answer_text(tok, a, k), *before = answer_text(tok, a, k - 1);
        const size_t len = text ? strlen(text) : 0;
        const int ok = len > 0 && before && !strchr(before, text[len - 1]) && (unsigned char)text[len - 1] < 0x80;
        if (ok) stop[0] = text[len - 1], stop[1] = 0;
        free(text);
        free(before);
        if (ok) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    ckv_backend *dev = NULL, *gdev = NULL;
    const int gpu = argc > 1 && strcmp(argv[1], "cuda") == 0;
    const int rc = graph_test_open(argc, argv, "test_generate_graphs", &dev, &gdev);
    if (rc >= 0) return rc;
    ckv_model *m = NULL, *gm = NULL;
    ckv_tokenizer *tok = NULL;
    const ckv_model_opts opts = {.weights_dtype = CKV_DTYPE_BF16};
    CHECK_OK(ckv_model_load_opts(&m, CKV_FIXTURES "/models/llama_gqa_bf16", dev, NULL, &opts));
    CHECK_OK(ckv_model_load_opts(&gm, CKV_FIXTURES "/models/llama_gqa_bf16", gdev, NULL, &opts));
    CHECK_OK(ckv_text_open_tokenizer(&tok, CKV_FIXTURES "/models/llama_gqa"));
    if (!m || !gm || !tok) return ckv_test_finish("test_generate_graphs");
    CHECK(ckv_backend_supports(gdev, CKV_BACKEND_CAP_GRAPHS));
    ckv_engine off, on;
    CHECK_OK(ckv_engine_wrap(&off, m, 16, tok));
    CHECK_OK(ckv_engine_wrap(&on, gm, 16, tok));
    off.cfg.kv_dtype = on.cfg.kv_dtype = CKV_DTYPE_BF16; /* the production path: bf16 weights and KV cache */

    const int V = m->cfg.vocab_size;
    int32_t ctx[NCTX], qids[NQ][QLEN];
    for (int i = 0; i < NCTX; i++) ctx[i] = (int32_t)((7 * i + 3) % V);
    for (int q = 0; q < NQ; q++)
        for (int i = 0; i < QLEN; i++) qids[q][i] = (int32_t)((11 * i + 5 * q + 2) % V);
    const ckv_question qs[NQ] = {{qids[0], QLEN, 0}, {qids[1], QLEN, 0}};
    trace toff = {.V = V}, ton = {.V = V};
    toff.logits = ckv_test_calloc(sizeof(float) * (size_t)MAX_TOK * (size_t)V);
    ton.logits = ckv_test_calloc(sizeof(float) * (size_t)MAX_TOK * (size_t)V);

    /* greedy, two questions over one context */
    ckv_request r = {.context = ctx, .n_context = NCTX, .questions = qs, .n_questions = NQ};
    r.gen.max_new_tokens = MAX_NEW;
    r.gen.ignore_eos = 1;
    r.gen.sampling.top_p = 1.0f;
    ckv_result greedy;
    if (same_run("greedy, 2 questions", &off, &on, &r, &toff, &ton, &greedy) && !gpu) check_counts(&toff, &ton, m->cfg.n_layers);
    const int have_greedy = greedy.n_answers > 0; /* ckv_engine_run zeroes a failed result */

    /* sampled on the host */
    ckv_request rs = r;
    rs.gen.sampling = (ckv_sampler_config){.temperature = 0.8f, .top_k = 20, .top_p = 0.9f, .seed = 1234};
    ckv_result res;
    same_run("sampled (T 0.8, top-k 20, top-p 0.9)", &off, &on, &rs, &toff, &ton, &res);
    ckv_result_free(&res);

    /* a decode press that compresses mid-answer */
    ckv_decode_press dp;
    CHECK_OK(ckv_decode_press_build(&dp, "knorm", 8, 48, -1.0, NULL, 0));
    ckv_request rd = r;
    rd.n_questions = 1;
    rd.gen.decode_press = &dp;
    if (same_run("decode press knorm interval=8 target=48", &off, &on, &rd, &toff, &ton, &res)) {
        CHECK_MSG(res.stats.decode_compressions >= 2 && res.stats.decode_evicted_entries > 0,
                  "the decode press compressed %d times, %ld entries (want at least 2 compressions)",
                  res.stats.decode_compressions, res.stats.decode_evicted_entries);
        CHECK_MSG(gpu || graph_launches(&ton) >= MAX_NEW - 4, "only %llu graph launches with the decode press",
                  graph_launches(&ton));
        fprintf(stderr, "     %d compressions evicting %ld entries, %llu graph launches\n", res.stats.decode_compressions,
                res.stats.decode_evicted_entries, graph_launches(&ton));
    }
    ckv_result_free(&res);

    /* a stop string that ends the answer part way */
    char stop[2] = {0};
    CHECK_MSG(have_greedy && pick_stop(tok, &greedy.answers[0], stop),
              "no stop string ends the greedy answer part way: the test needs one");
    if (stop[0]) {
        const char *stops[] = {stop};
        ckv_request rt = r;
        rt.n_questions = 1;
        rt.gen.stop_strings = stops;
        rt.gen.n_stop_strings = 1;
        if (same_run("stop string", &off, &on, &rt, &toff, &ton, &res)) {
            const ckv_answer *a = &res.answers[0];
            CHECK_MSG(a->finish == CKV_FINISH_STOP && a->n >= 3 && a->n < MAX_NEW,
                      "stop string '%s': finish %s after %d tokens (want stop after 3 .. %d)", stop,
                      ckv_finish_reason_name(a->finish), a->n, MAX_NEW - 1);
            CHECK_MSG(gpu || graph_launches(&ton) >= 1, "no graph launch before the stop string");
            fprintf(stderr, "     stop string '%s': finish %s after %d tokens\n", stop, ckv_finish_reason_name(a->finish),
                    a->n);
        }
        ckv_result_free(&res);
    }

    ckv_result_free(&greedy);
    free(toff.logits);
    free(ton.logits);
    ckv_engine_free(&off);
    ckv_engine_free(&on);
    ckv_tokenizer_free(tok);
    ckv_model_free(m);
    ckv_model_free(gm);
    ckv_backend_free(dev);
    ckv_backend_free(gdev);
    return ckv_test_finish("test_generate_graphs");
}
