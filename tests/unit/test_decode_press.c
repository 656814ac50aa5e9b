#define _POSIX_C_SOURCE 200809L
/* test_decode_press.c - decode-time compression equals kvpress 0.5.5's decoding presses: for each
 * case under tests/fixtures/decode/<model>/ (tools/oracle/decode_fixtures.py: DecodingPress,
 * CompressionRatioDecodingPress and PrefillDecodingPress over a greedy continuation), the engine
 * (ckv_engine_prepare, ckv_prepared_answer) generates from the same prompt with the same prefill press and decode press and checks, at every
 * token, that
 *   - the token is kvpress's greedy token and its logits row matches within 1e-4;
 *   - after every compression kvpress made, each (layer, KV head) keeps exactly its positions.
 * Also: the builder's errors, a context spent by a decode compression, and the target rule. */
#include <dirent.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "core/json.h"
#include "engine/decode_press.h"
#include "engine/request.h"
#include "model/model.h"

typedef struct {
    const char *file;
    const ckv_json *events;  /* the fixture's compressions */
    const int32_t *ids;      /* kvpress's tokens */
    const float *logits;     /* [n_rows, V] */
    int n_rows, V, n_kv, n_layers;
    int tokens, mism_tok, mism_kept, checked_events;
    double max_err;
} tracker;

/* The session of the prepared context being answered (the callback reads its cache: host memory on
 * the cpu backend). */
static const ckv_session *g_session;

static int int_array(const ckv_json *a, int32_t *out, int cap) {
    int n = ckv_json_array_size(a);
    for (int i = 0; i < n && i < cap; i++) out[i] = (int32_t)ckv_json_number(ckv_json_array_at(a, i));
    return n;
}

/* Token i was sampled after i decode steps: the cache holds every compression of steps <= i. */
static int on_token(void *ctx, int question, int32_t token, int is_stop, const float *lg) {
    (void)question, (void)is_stop;
    tracker *t = ctx;
    int i = t->tokens++;
    if (i >= t->n_rows) return 1;
    if (token != t->ids[i] && t->mism_tok++ < 3)
        fprintf(stderr, "  %s token %d: ckv %d, kvpress %d\n", t->file, i, token, t->ids[i]);
    for (int v = 0; v < t->V; v++) {
        double d = fabs((double)lg[v] - (double)t->logits[(size_t)i * t->V + v]);
        if (!(d <= t->max_err)) t->max_err = d != d ? INFINITY : d;
    }
    const ckv_session *s = g_session;
    int32_t want[4096];
    for (int e = 0; e < ckv_json_array_size(t->events); e++) {
        const ckv_json *ev = ckv_json_array_at(t->events, e);
        if ((int)ckv_json_number(ckv_json_get(ev, "step")) != i) continue;
        int l = (int)ckv_json_number(ckv_json_get(ev, "layer"));
        const ckv_json *heads = ckv_json_get(ev, "positions");
        const ckv_kv_layer *kl = &s->kv.layers[l];
        for (int h = 0; h < t->n_kv; h++) {
            int nw = int_array(ckv_json_array_at(heads, h), want, 4096);
            const int32_t *got = kl->pos + kl->off[h];
            int same = nw == kl->len[h];
            for (int k = 0; same && k < nw; k++) same = got[k] == want[k];
            if (!same && t->mism_kept++ < 3) {
                fprintf(stderr, "  %s step %d layer %d head %d: ckv keeps %d rows, kvpress %d:", t->file, i, l, h,
                        kl->len[h], nw);
                for (int k = 0; k < kl->len[h] && k < 12; k++) fprintf(stderr, " %d/%d", got[k], k < nw ? want[k] : -1);
                fprintf(stderr, "\n");
            }
        }
        t->checked_events++;
    }
    return 0;
}

static void check_case(const char *dir, const char *file, ckv_model *m, const int32_t *prompt, int P, int *n_cases) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    ckv_json *j = NULL;
    if (ckv_json_parse_file(&j, path) != CKV_STATUS_OK) {
        fprintf(stderr, "FAIL %s\n", ckv_error_message());
        ckv_test_failures++;
        return;
    }
    const int V = m->cfg.vocab_size;
    tracker t = {.file = file, .V = V, .n_kv = m->cfg.n_kv_heads, .n_layers = m->cfg.n_layers};
    t.events = ckv_json_get(j, "compressions");
    int32_t ids[1024];
    t.n_rows = int_array(ckv_json_get(j, "generated_ids"), ids, 1024);
    t.ids = ids;
    char lpath[2300];
    snprintf(lpath, sizeof lpath, "%s/%s", dir, ckv_json_string(ckv_json_get(j, "logits_file")));
    char *buf = NULL;
    size_t len = 0;
    CHECK_OK(ckv_read_file(lpath, &buf, &len));
    CHECK_MSG(len == (size_t)t.n_rows * V * 4, "%s: %zu bytes of logits, expected %d rows", lpath, len, t.n_rows);
    t.logits = (const float *)buf;
    /* the presses */
    ckv_press_config pre;
    ckv_press_request rq = {.spec = ckv_json_string(ckv_json_get(j, "press")),
                            .budget = {CKV_BUDGET_RATIO, ckv_json_number(ckv_json_get(j, "compression_ratio"))}};
    if (!strcmp(rq.spec, "none")) rq.budget.kind = CKV_BUDGET_NONE;
    CHECK_OK(ckv_press_build(&pre, &rq, NULL));
    ckv_decode_press dp;
    CHECK_OK(ckv_decode_press_build(&dp, ckv_json_string(ckv_json_get(j, "decode_press")),
                                    (int)ckv_json_number(ckv_json_get(j, "interval")),
                                    (int)ckv_json_number(ckv_json_get(j, "target")),
                                    ckv_json_number(ckv_json_get(j, "ratio")), NULL, 0));
    if (buf && len == (size_t)t.n_rows * V * 4) {
        ckv_engine e;
        CHECK_OK(ckv_engine_wrap(&e, m, 16, NULL));
        /* prepare + answer as ckv_engine_run does, with a hook that finds the session */
        ckv_prepare_params pp = {.ids = prompt, .n = P, .press = &pre, .reserve = t.n_rows};
        ckv_prepared pc;
        CHECK_OK(ckv_engine_prepare(&e, &pp, &pc));
        g_session = &pc.sess;
        ckv_gen_params g = {.max_new_tokens = t.n_rows, .ignore_eos = 1, .on_token = on_token, .cb_ctx = &t,
                            .decode_press = &dp};
        g.sampling.top_p = 1.0f; /* greedy */
        ckv_answer a;
        CHECK_OK(ckv_prepared_answer(&pc, 0, NULL, 0, &g, NULL, &a));
        CHECK_MSG(t.tokens == t.n_rows, "%s: %d tokens, kvpress %d", file, t.tokens, t.n_rows);
        CHECK_MSG(t.mism_tok == 0, "%s: %d tokens differ from kvpress's greedy continuation", file, t.mism_tok);
        CHECK_MSG(t.mism_kept == 0, "%s: %d (layer, head) kept sets differ from kvpress's", file, t.mism_kept);
        CHECK_MSG(t.max_err <= 1e-4, "%s: logits max |diff| %.3g > 1e-4", file, t.max_err);
        CHECK_MSG(t.checked_events == ckv_json_array_size(t.events) && t.checked_events > 0,
                  "%s: checked %d of %d compressions", file, t.checked_events, ckv_json_array_size(t.events));
        CHECK_MSG(pc.spent == 1 && pc.stats.decode_compressions > 0, "%s: the context is not marked spent", file);
        /* a spent context takes no question */
        ckv_answer b;
        CHECK_FAILS(ckv_prepared_answer(&pc, 1, ids, 2, &g, NULL, &b), CKV_STATUS_ERR_ARG, "prepare it again");
        fprintf(stderr, "  %s: %d tokens, %d layer compressions checked, logits max |diff| %.3g\n", file, t.tokens,
                t.checked_events, t.max_err);
        ckv_answer_free(&a);
        ckv_prepared_free(&pc);
        ckv_engine_free(&e);
    }
    free(buf);
    ckv_json_free(j);
    (*n_cases)++;
}

static void check_builder(void) {
    ckv_decode_press dp;
    CHECK_FAILS(ckv_decode_press_build(&dp, "snapkv", 8, 16, -1, NULL, 0), CKV_STATUS_ERR_UNSUPPORTED, "attention input");
    CHECK_FAILS(ckv_decode_press_build(&dp, "adakv:knorm", 8, 16, -1, NULL, 0), CKV_STATUS_ERR_UNSUPPORTED, "wrappers");
    CHECK_FAILS(ckv_decode_press_build(&dp, "knorm", 0, 16, -1, NULL, 0), CKV_STATUS_ERR_ARG, "decode interval");
    const ckv_press_option_value kvz[] = {{"repeat_ids", "1,2"}, {"repeat_next_ids", "3"}, {"suffix_ids", "4"}};
    CHECK_FAILS(ckv_decode_press_build(&dp, "kvzip", 8, 16, -1, kvz, 3), CKV_STATUS_ERR_UNSUPPORTED, "replaying");
    CHECK_FAILS(ckv_decode_press_build(&dp, "layer_defensivekv", 8, 16, -1, NULL, 0), CKV_STATUS_ERR_UNSUPPORTED,
                "attention input");
    CHECK_FAILS(ckv_decode_press_build(&dp, "knorm", 8, 0, -1, NULL, 0), CKV_STATUS_ERR_ARG, "decode target");
    CHECK_FAILS(ckv_decode_press_build(&dp, "knorm", 8, 0, 1.0, NULL, 0), CKV_STATUS_ERR_ARG, "decode ratio");
    CHECK_FAILS(ckv_decode_press_build(&dp, "knorm", 8, 16, 0.5, NULL, 0), CKV_STATUS_ERR_ARG, "exclude");
    CHECK_FAILS(ckv_decode_press_build(&dp, "nosuch", 8, 16, -1, NULL, 0), CKV_STATUS_ERR_ARG, "decode press");
    CHECK_FAILS(ckv_decode_press_build(&dp, "none", 8, 16, -1, NULL, 0), CKV_STATUS_ERR_ARG, "does not compress");
    CHECK_OK(ckv_decode_press_build(&dp, "knorm", 8, 16, -1, NULL, 0));
    CHECK_MSG(!strcmp(dp.spec, "knorm interval=8 target=16"), "spec '%s'", dp.spec);
    CHECK(ckv_decode_press_target(&dp, 1000) == 16);
    const ckv_press_option_value opt[] = {{"n_sink", "2"}};
    CHECK_OK(ckv_decode_press_build(&dp, "streaming_llm", 4, 0, 0.5, opt, 1));
    CHECK_MSG(strstr(dp.spec, "n_sink=2") && strstr(dp.spec, "ratio=0.5"), "spec '%s'", dp.spec);
    CHECK(ckv_decode_press_target(&dp, 41) == 20 && ckv_decode_press_target(&dp, 1) == 1);
    ckv_press_config ada;
    ckv_press_request rq = {.spec = "adakv:snapkv", .budget = {CKV_BUDGET_RATIO, 0.5}};
    CHECK_OK(ckv_press_build(&ada, &rq, NULL));
    CHECK_FAILS(ckv_decode_press_check_prefill(&dp, &ada), CKV_STATUS_ERR_UNSUPPORTED, "different numbers of rows");
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(void) {
    check_builder();
    char root[1024];
    snprintf(root, sizeof root, "%s/decode", CKV_FIXTURES);
    DIR *d = opendir(root);
    if (!d) {
        fprintf(stderr, "FAIL: %s is missing (run tools/oracle/regen.sh)\n", root);
        return 1;
    }
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 2));
    int n_cases = 0, n_models = 0;
    struct dirent *e;
    while (be && (e = readdir(d))) {
        char dir[1300], path[1400];
        snprintf(dir, sizeof dir, "%s/%s", root, e->d_name);
        snprintf(path, sizeof path, "%s/prompt.json", dir);
        struct stat sb;
        if (e->d_name[0] == '.' || stat(path, &sb) != 0) continue;
        ckv_json *pj = NULL;
        CHECK_OK(ckv_json_parse_file(&pj, path));
        if (!pj) continue;
        char model_dir[1400];
        snprintf(model_dir, sizeof model_dir, "%s/models/%s", CKV_FIXTURES, ckv_json_string(ckv_json_get(pj, "model")));
        int32_t prompt[4096];
        int P = int_array(ckv_json_get(pj, "prompt_ids"), prompt, 4096);
        ckv_json_free(pj);
        ckv_model *m = NULL;
        CHECK_OK(ckv_model_load(&m, model_dir, be, NULL));
        if (!m) continue;
        n_models++;
        char *names[256];
        int nn = 0;
        DIR *dd = opendir(dir);
        struct dirent *f;
        while (dd && (f = readdir(dd)) && nn < 256) {
            size_t len = strlen(f->d_name);
            if (len > 5 && !strcmp(f->d_name + len - 5, ".json") && strcmp(f->d_name, "prompt.json") != 0)
                names[nn++] = strdup(f->d_name);
        }
        if (dd) closedir(dd);
        qsort(names, (size_t)nn, sizeof *names, cmp_str);
        for (int i = 0; i < nn; i++) {
            check_case(dir, names[i], m, prompt, P, &n_cases);
            free(names[i]);
        }
        ckv_model_free(m);
    }
    closedir(d);
    CHECK_MSG(n_models >= 2 && n_cases >= 8, "expected >= 2 models and >= 8 cases, found %d and %d", n_models, n_cases);
    ckv_backend_free(be);
    return ckv_test_finish("test_decode_press");
}
