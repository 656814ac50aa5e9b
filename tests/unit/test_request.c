/* test_request.c - the engine request API on the llama_gqa fixture: a whole request equals the same
 * questions asked one by one of one prepared (compressed) context, in any order and repeatedly
 * (compress once, ask many); query-aware requests equal a prepared context + question; stop ids,
 * stop strings and the token callback end answers with the right finish reason; short contexts and
 * budgets that keep everything stay uncompressed and say so; a request beyond the model's window
 * fails with CKV_STATUS_ERR_CONTEXT_TOO_LONG; cache files round-trip; nothing leaks. */
#include <stdio.h>
#include <string.h>

#include "ckv_test.h"
#include "core/alloc.h"
#include "engine/request.h"
#include "engine/text.h"

#define NCTX 200

static int same_ids(const ckv_answer *a, const ckv_answer *b) {
    return a->n == b->n && a->stop_id == b->stop_id && a->finish == b->finish &&
           (a->n == 0 || !memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n));
}

static void print_ids(const char *what, const ckv_answer *a) {
    fprintf(stderr, "  %s (%s):", what, ckv_finish_reason_name(a->finish));
    for (int i = 0; i < a->n; i++) fprintf(stderr, " %d", a->ids[i]);
    fprintf(stderr, "\n");
}

static void press_of(ckv_press_config *p, const char *spec, double budget) {
    CHECK_OK(ckv_press_parse(p, spec));
    if (budget > 0) CHECK_OK(ckv_press_set_budget(p, budget));
    CHECK_OK(ckv_press_finalize(p));
}

typedef struct {
    int calls, cancel_at, last_is_stop;
} cb_state;

static int count_and_cancel(void *ctx, int question, int32_t token, int is_stop, const float *logits) {
    (void)question, (void)token, (void)logits;
    cb_state *c = ctx;
    c->calls++;
    c->last_is_stop = is_stop;
    return c->cancel_at > 0 && c->calls == c->cancel_at;
}

static void test_compress_once_ask_many(ckv_engine *e, const int32_t *ctx) {
    ckv_press_config press;
    press_of(&press, "critical_adakv:snapkv", 0.3);
    int32_t q1[] = {5, 6}, q2[] = {7};
    ckv_question qs[2] = {{q1, 2, 0}, {q2, 1, 0}};
    ckv_request r = {.context = ctx, .n_context = NCTX, .questions = qs, .n_questions = 2, .press = &press};
    r.gen.max_new_tokens = 6;
    r.gen.ignore_eos = 1;
    r.gen.sampling.top_p = 1.0f;
    ckv_result res;
    CHECK_OK(ckv_engine_run(e, &r, &res));
    if (res.n_answers != 2) {
        CHECK(res.n_answers == 2);
        return;
    }
    CHECK(res.stats.compressed && res.stats.kept_entries < res.stats.total_entries);
    CHECK_MSG(res.stats.prompt_tokens == NCTX + 3, "prompt tokens %ld", res.stats.prompt_tokens);
    CHECK(res.answers[0].n == 6 && res.answers[0].finish == CKV_FINISH_LENGTH);
    CHECK(res.stats.kv_bytes_kept < res.stats.kv_bytes_full && res.stats.ttft_seconds > 0);

    /* one prepared context, the questions in another order and again */
    ckv_prepared pc;
    ckv_prepare_params pp = {.ids = ctx, .n = NCTX, .press = &press, .reserve = 2 + 6};
    CHECK_OK(ckv_engine_prepare(e, &pp, &pc));
    ckv_answer a2, a1, a1b;
    CHECK_OK(ckv_prepared_answer(&pc, 1, q2, 1, &r.gen, NULL, &a2));
    CHECK_OK(ckv_prepared_answer(&pc, 0, q1, 2, &r.gen, NULL, &a1));
    CHECK_OK(ckv_prepared_answer(&pc, 0, q1, 2, &r.gen, NULL, &a1b));
    CHECK(same_ids(&a1, &res.answers[0]) && same_ids(&a1b, &res.answers[0]) && same_ids(&a2, &res.answers[1]));
    if (!same_ids(&a1, &res.answers[0])) print_ids("run", &res.answers[0]), print_ids("prepared", &a1);

    /* a question that does not fit what was reserved */
    ckv_gen_params big = r.gen;
    big.max_new_tokens = 50;
    ckv_answer none;
    CHECK_FAILS(ckv_prepared_answer(&pc, 0, q1, 2, &big, NULL, &none), CKV_STATUS_ERR_CONTEXT_TOO_LONG, "reserved");

    /* stop ids end the answer before the stopping token; the callback sees it and can cancel */
    ckv_gen_params g = r.gen;
    int32_t stop = res.answers[0].ids[2];
    int first = 0;
    while (res.answers[0].ids[first] != stop) first++;
    g.stop_ids = &stop;
    g.n_stop_ids = 1;
    cb_state cs = {0, 0, 0};
    g.on_token = count_and_cancel;
    g.cb_ctx = &cs;
    ckv_answer as;
    CHECK_OK(ckv_prepared_answer(&pc, 0, q1, 2, &g, NULL, &as));
    CHECK_MSG(as.finish == CKV_FINISH_STOP && as.n == first && as.stop_id == stop && cs.calls == first + 1 && cs.last_is_stop,
              "finish %s n %d (want %d) stop %d calls %d", ckv_finish_reason_name(as.finish), as.n, first, as.stop_id, cs.calls);
    ckv_gen_params gc = r.gen;
    cb_state cc = {0, 3, 0};
    gc.on_token = count_and_cancel;
    gc.cb_ctx = &cc;
    ckv_answer ac;
    CHECK_OK(ckv_prepared_answer(&pc, 0, q1, 2, &gc, NULL, &ac));
    CHECK_MSG(ac.finish == CKV_FINISH_CANCELLED && ac.n == 3 && !memcmp(ac.ids, res.answers[0].ids, 3 * sizeof(int32_t)),
              "finish %s n %d", ckv_finish_reason_name(ac.finish), ac.n);
    /* stop strings need a tokenizer */
    const char *stops[] = {"x"};
    ckv_gen_params gs = r.gen;
    gs.stop_strings = stops;
    gs.n_stop_strings = 1;
    ckv_answer ax;
    CHECK_FAILS(ckv_prepared_answer(&pc, 0, q1, 2, &gs, NULL, &ax), CKV_STATUS_ERR_ARG, "tokenizer");

    /* cache files: the loaded context answers the same */
    char path[512];
    snprintf(path, sizeof path, "%s/test_request.ckv", CKV_TEST_TMP);
    ckv_prepared saved, loaded;
    ckv_prepare_params ps = pp;
    ps.cache_out = path;
    CHECK_OK(ckv_engine_prepare(e, &ps, &saved));
    ckv_prepare_params pl = {.cache_in = path, .reserve = 8};
    CHECK_OK(ckv_engine_prepare(e, &pl, &loaded));
    ckv_answer al;
    CHECK_OK(ckv_prepared_answer(&loaded, 0, q1, 2, &r.gen, NULL, &al));
    CHECK(same_ids(&al, &res.answers[0]) && loaded.stats.reused_tokens == NCTX && strstr(loaded.cache_press, "critical_adakv"));
    remove(path);
    ckv_answer_free(&al);
    ckv_prepared_free(&saved);
    ckv_prepared_free(&loaded);
    ckv_answer_free(&a1);
    ckv_answer_free(&a1b);
    ckv_answer_free(&a2);
    ckv_answer_free(&as);
    ckv_answer_free(&ac);
    ckv_prepared_free(&pc);

    /* query-aware: each question compressed with the context */
    r.query_aware = 1;
    ckv_result qa;
    CHECK_OK(ckv_engine_run(e, &r, &qa));
    int32_t all[NCTX + 2];
    memcpy(all, ctx, sizeof(int32_t) * NCTX);
    memcpy(all + NCTX, q1, sizeof q1);
    ckv_prepare_params pq = {.ids = all, .n = NCTX + 2, .press = &press, .reserve = 6};
    CHECK_OK(ckv_engine_prepare(e, &pq, &pc));
    ckv_answer aq;
    CHECK_OK(ckv_prepared_answer(&pc, 0, NULL, 0, &r.gen, NULL, &aq));
    CHECK(qa.n_answers == 2 && same_ids(&aq, &qa.answers[0]));
    ckv_answer_free(&aq);
    ckv_prepared_free(&pc);
    ckv_result_free(&qa);
    ckv_result_free(&res);
}

static void test_uncompressed(ckv_engine *e, const int32_t *ctx) {
    ckv_press_config none, snap, keep;
    press_of(&none, "none", 0);
    press_of(&snap, "snapkv", 0.5);
    CHECK_OK(ckv_press_parse(&keep, "knorm"));
    CHECK_OK(ckv_press_set_budget_tokens(&keep, 5000));
    CHECK_OK(ckv_press_finalize(&keep));
    ckv_request r = {.context = ctx, .n_context = 10, .press = &none};
    r.gen.max_new_tokens = 5;
    r.gen.sampling.top_p = 1.0f;
    ckv_result full, shortc, kept;
    CHECK_OK(ckv_engine_run(e, &r, &full));
    r.press = &snap; /* 10 tokens <= window 64 */
    CHECK_OK(ckv_engine_run(e, &r, &shortc));
    CHECK(!shortc.stats.compressed && shortc.stats.uncompressed_reason && strstr(shortc.stats.uncompressed_reason, "window"));
    CHECK(shortc.stats.kept_entries == shortc.stats.total_entries && shortc.stats.total_entries > 0);
    CHECK(full.n_answers == 1 && shortc.n_answers == 1 && same_ids(&full.answers[0], &shortc.answers[0]));
    r.press = &keep;
    r.n_context = NCTX;
    CHECK_OK(ckv_engine_run(e, &r, &kept));
    CHECK(!kept.stats.compressed && kept.stats.uncompressed_reason && strstr(kept.stats.uncompressed_reason, "keeps every"));
    ckv_result_free(&full);
    ckv_result_free(&shortc);
    ckv_result_free(&kept);

    /* beyond the model's window: a distinct status, not message text */
    static int32_t longctx[1100];
    for (int i = 0; i < 1100; i++) longctx[i] = 5;
    ckv_request lr = {.context = longctx, .n_context = 1000, .press = &none};
    lr.gen.max_new_tokens = 100;
    lr.gen.sampling.top_p = 1.0f;
    ckv_result lres;
    CHECK_FAILS(ckv_engine_run(e, &lr, &lres), CKV_STATUS_ERR_CONTEXT_TOO_LONG, "--max-new-tokens 100");
    lr.n_context = 1100;
    CHECK_FAILS(ckv_engine_run(e, &lr, &lres), CKV_STATUS_ERR_CONTEXT_TOO_LONG, "max_position_embeddings");
}

static void test_stop_strings(ckv_engine *plain, const int32_t *ctx) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/llama_gqa", CKV_FIXTURES);
    ckv_tokenizer *tok = NULL;
    CHECK_OK(ckv_text_open_tokenizer(&tok, dir));
    if (!tok) return;
    ckv_engine e;
    CHECK_OK(ckv_engine_wrap(&e, plain->model, 64, tok));
    ckv_request r = {.context = ctx, .n_context = NCTX};
    r.gen.max_new_tokens = 8;
    r.gen.ignore_eos = 1;
    r.gen.sampling.top_p = 1.0f;
    ckv_result ref;
    CHECK_OK(ckv_engine_run(&e, &r, &ref));
    /* the text of the first three tokens; its last character as the stop string ends the answer by then */
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(ckv_tokenizer_decode(tok, ref.answers[0].ids, 3, CKV_DETOKENIZE_SKIP_SPECIAL, &text, &len));
    if (text && len > 0) {
        char stop[2] = {text[len - 1], 0};
        const char *stops[] = {stop};
        r.gen.stop_strings = stops;
        r.gen.n_stop_strings = 1;
        ckv_result st;
        CHECK_OK(ckv_engine_run(&e, &r, &st));
        CHECK_MSG(st.answers[0].finish == CKV_FINISH_STOP && st.answers[0].n <= 3 && st.answers[0].n >= 1,
                  "finish %s after %d tokens (stop string '%s')", ckv_finish_reason_name(st.answers[0].finish),
                  st.answers[0].n, stop);
        ckv_result_free(&st);
    }
    free(text);
    ckv_result_free(&ref);
    ckv_engine_free(&e);
    ckv_tokenizer_free(tok);
}

int main(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/models/llama_gqa", CKV_FIXTURES);
    const size_t live0 = ckv_alloc_live_bytes();
    ckv_engine_config cfg = {.model_path = dir, .backend = "cpu", .threads = 2, .device = -1, .chunk = 64,
                             .kv_dtype = CKV_DTYPE_DEFAULT, .weights_dtype = CKV_DTYPE_DEFAULT};
    ckv_engine e;
    CHECK_OK(ckv_engine_init(&e, &cfg, NULL));
    if (!e.model) return ckv_test_finish("test_request");
    int32_t ctx[NCTX];
    for (int i = 0; i < NCTX; i++) ctx[i] = 1 + (i * 37) % 400;
    test_compress_once_ask_many(&e, ctx);
    test_uncompressed(&e, ctx);
    test_stop_strings(&e, ctx);
    /* a BF16 KV cache: the engine takes it, the same requests run (test_kv_dtype.sh compares ids) */
    ckv_engine_config half = cfg;
    half.kv_dtype = CKV_DTYPE_BF16;
    ckv_engine e2;
    CHECK_OK(ckv_engine_init(&e2, &half, NULL));
    if (e2.model) test_uncompressed(&e2, ctx);
    ckv_engine_free(&e2);
    /* CKV_DTYPE_DEFAULT leaves the KV cache to the backend (f32 on the cpu); a type it cannot hold is refused */
    CHECK(e.be->kv_dtype == CKV_DTYPE_F32);
    CHECK(strcmp(ckv_dtype_name(CKV_DTYPE_DEFAULT), "default") == 0);
    ckv_engine_config q8 = cfg;
    q8.kv_dtype = CKV_DTYPE_Q8_0;
    CHECK_FAILS(ckv_engine_init(&e2, &q8, NULL), CKV_STATUS_ERR_UNSUPPORTED, "--kv-dtype Q8_0");
    ckv_engine_free(&e);
    CHECK_MSG(ckv_alloc_live_bytes() == live0, "%zu bytes live, %zu before", ckv_alloc_live_bytes(), live0);
    return ckv_test_finish("test_request");
}
