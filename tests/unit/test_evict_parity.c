#define _POSIX_C_SOURCE 200809L
/* test_evict_parity.c - every press equals NVIDIA kvpress: for each case under
 * tests/fixtures/presses/<model>/ (written by tools/oracle/regen.sh from kvpress run on the tiny
 * fixture models), compress the same context with ckv and check
 *   - the kept token positions of every (layer, KV head) are identical (the fixtures avoid score
 *     ties, and record the smallest gap at the cut);
 *   - the base scores equal kvpress's (|diff| <= 1e-6 + 1e-4 |ref|: fp32 softmax/pooling order; a
 *     case's "scores_atol" replaces the 1e-6 for scores that are differences, such as z-scores);
 *   - the logits of the question tokens fed after compression match within 1e-4 (the engine-core
 *     tolerance: both sides compute in fp32 over the same kept keys).
 * Presses without a kvpress counterpart (defensivekv, headkv) have fixtures from ports of their
 * official code in tools/oracle and are checked the same way when their fixtures exist. kvzip's
 * session holds the rows of its context replay as well (ckv_kvzip_replay_rows). Query-aware cases
 * (finch: "prompt": "context+question") compress context + question together, the question being
 * the press's window, and feed the case's after_ids after them. */
#include <dirent.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "core/alloc.h"
#include "core/json.h"
#include "engine/compress.h"
#include "engine/session.h"
#include "evict/press.h"
#include "model/model.h"

typedef struct {
    int n_layers, n_kv, L;
    float *scores; /* [n_layers, n_kv, L] as ckv computed them */
    int32_t *rows; /* [n_layers, n_kv, L] the kept rows (positions of this first prefill) of each head */
    int32_t *n_rows; /* [n_layers, n_kv] */
} observed;

/* The CPU backend's device memory is host memory: the selection is read in place. */
static void observe(void *ctx, int layer, const ckv_selection *sel) {
    observed *o = ctx;
    memcpy(o->scores + (size_t)layer * o->n_kv * o->L, sel->scores, sizeof(float) * (size_t)o->n_kv * o->L);
    memcpy(o->rows + (size_t)layer * o->n_kv * o->L, sel->rows, sizeof(int32_t) * (size_t)o->n_kv * o->L);
    memcpy(o->n_rows + (size_t)layer * o->n_kv, sel->n_keep, sizeof(int32_t) * (size_t)o->n_kv);
}

static float *read_f32_file(const char *dir, const char *name, size_t n) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *buf = NULL;
    size_t len = 0;
    if (ckv_read_file(path, &buf, &len) != CKV_STATUS_OK || len != n * 4) {
        fprintf(stderr, "FAIL %s: %zu bytes, expected %zu floats\n", path, len, n);
        ckv_test_failures++;
        free(buf);
        return NULL;
    }
    return (float *)buf;
}

/* Applies the fixture's options (numbers, strings, booleans) through the CLI's option names. */
static int apply_options(ckv_press_config *cfg, const ckv_json *opts, const char *dir, const char *what) {
    for (const ckv_json *o = ckv_json_first_child(opts); o; o = ckv_json_next(o)) {
        char val[1400];
        if (ckv_json_is_string(o) && !strcmp(ckv_json_key(o), "profile")) /* relative to the case file */
            snprintf(val, sizeof val, "%s/%s", dir, ckv_json_string(o));
        else if (ckv_json_is_string(o))
            snprintf(val, sizeof val, "%s", ckv_json_string(o));
        else if (ckv_json_is_bool(o))
            snprintf(val, sizeof val, "%d", ckv_json_bool(o));
        else if (ckv_json_is_array(o)) /* per_layer's compression_ratios: "r0,r1,..." */
            for (int i = 0, n = 0; i < ckv_json_array_size(o) && (size_t)n < sizeof val; i++)
                n += snprintf(val + n, sizeof val - (size_t)n, "%s%.17g", i ? "," : "",
                              ckv_json_number(ckv_json_array_at(o, i)));
        else
            snprintf(val, sizeof val, "%.17g", ckv_json_number(o));
        if (ckv_press_set_option(cfg, ckv_json_key(o), val) != CKV_STATUS_OK) {
            fprintf(stderr, "FAIL %s: option %s=%s: %s\n", what, ckv_json_key(o), val, ckv_error_message());
            ckv_test_failures++;
            return 0;
        }
    }
    return 1;
}

static int int_array(const ckv_json *a, int32_t *out, int cap) {
    int n = ckv_json_array_size(a);
    for (int i = 0; i < n && i < cap; i++) out[i] = (int32_t)ckv_json_number(ckv_json_array_at(a, i));
    return n;
}

static void check_case(const char *dir, const char *file, ckv_model *m, const int32_t *ctx, int L, const int32_t *q,
                       int nq, int *n_cases) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    ckv_json *j = NULL;
    if (ckv_json_parse_file(&j, path) != CKV_STATUS_OK) {
        fprintf(stderr, "FAIL %s\n", ckv_error_message());
        ckv_test_failures++;
        return;
    }
    /* query-aware cases (finch): the prompt is context + question, compressed together; the ids fed
     * after it are the case's after_ids */
    const char *prompt = ckv_json_string(ckv_json_get(j, "prompt"));
    int32_t joined[4096 + 64], after[64];
    int question_rows = 0;
    if (prompt && !strcmp(prompt, "context+question") && L + nq <= 4096 + 64) {
        memcpy(joined, ctx, sizeof(int32_t) * (size_t)L);
        memcpy(joined + L, q, sizeof(int32_t) * (size_t)nq);
        question_rows = nq;
        ctx = joined;
        L += nq;
        q = after;
        nq = int_array(ckv_json_get(j, "after_ids"), after, 64);
    }
    const char *spec = ckv_json_string(ckv_json_get(j, "press"));
    ckv_press_config cfg;
    int ok = spec && ckv_press_parse(&cfg, spec) == CKV_STATUS_OK;
    if (!ok) fprintf(stderr, "FAIL %s: press '%s': %s\n", path, spec ? spec : "?", ckv_error_message());
    ok = ok && apply_options(&cfg, ckv_json_get(j, "options"), dir, path);
    ok = ok && ckv_press_set_compression_ratio(&cfg, ckv_json_number(ckv_json_get(j, "compression_ratio"))) == CKV_STATUS_OK;
    ok = ok && ckv_press_finalize(&cfg) == CKV_STATUS_OK;
    ok = ok && ckv_press_with_question(&cfg, question_rows, &cfg) == CKV_STATUS_OK;
    if (!ok) {
        ckv_test_failures++;
        ckv_json_free(j);
        return;
    }
    const ckv_model_config *c = &m->cfg;
    int NL = c->n_layers, H = c->n_kv_heads, V = c->vocab_size;
    observed ob = {NL, H, L, calloc((size_t)NL * H * L, sizeof(float)), calloc((size_t)NL * H * L, sizeof(int32_t)),
                   calloc((size_t)NL * H, sizeof(int32_t))};
    ckv_compressor cz;
    memset(&cz, 0, sizeof cz);
    cz.cfg = &cfg;
    int32_t *hkb = NULL; /* headkv: per-head budgets from the case's profile */
    if (cfg.alloc == CKV_ALLOC_HEADKV) CHECK_OK(ckv_compress_headkv_budgets(&cfg, &m->cfg, L, &hkb));
    cz.headkv_budgets = hkb;
    cz.observe = observe;
    cz.observe_ctx = &ob;
    int rows = nq; /* after the context: the question, or kvzip's replay of the context before it */
    if (cfg.scorer == CKV_SCORER_KVZIP) {
        rows = ckv_kvzip_replay_rows(&cfg, L) > nq ? ckv_kvzip_replay_rows(&cfg, L) : nq;
        CHECK_OK(ckv_alloc((void **)&cz.context_ids, sizeof(int32_t) * (size_t)L, "kvzip context")); /* the compressor's */
        if (cz.context_ids) memcpy(cz.context_ids, ctx, sizeof(int32_t) * (size_t)L);
    }
    ckv_session s;
    CHECK_OK(ckv_session_init(&s, m, L + rows, 64, 1));
    CHECK_OK(ckv_session_prefill_hook(&s, ctx, L, NULL, NULL, ckv_compress_layer_hook, &cz));
    /* re-rotated keys: the cache's positions became 0 .. n_kept - 1 (checked) and the question follows at
     * n_kept (a composed press's re-rotating members: at L); the kept positions are the selection's rows */
    const int rerotated = ckv_press_rerotates(&cfg);
    int members_rerotate = 0; /* composed with key_rerotation: members: their question follows at L */
    for (int i = 0; cfg.composed && i < cfg.n_stages; i++) members_rerotate |= cfg.stage_rerotate[i];
    CHECK_OK(ckv_compress_context_end(&cfg, &s));
    if (members_rerotate) CHECK_MSG(s.n_past == L, "%s: the question follows at %d, not at L = %d", file, s.n_past, L);
    if (rerotated) {
        int bad = s.n_past != s.kv.layers[0].len[0];
        for (int l = 0; l < NL; l++)
            for (int h = 0; h < H; h++)
                for (int i = 0; i < s.kv.layers[l].len[h]; i++) bad += s.kv.layers[l].pos[s.kv.layers[l].off[h] + i] != i;
        CHECK_MSG(!bad, "%s: re-rotated rows not at positions 0 .. n_kept - 1, or the next position %d not n_kept", file,
                  s.n_past);
    }
    /* kept positions per (layer, KV head). Where the protected window is larger than the budget the
     * choice among equal scores is torch.topk's (arbitrary); those cases also record the set under
     * ckv's rule (ties to the lower flat index head * L + position), which is what ckv must keep. */
    const ckv_json *kept = ckv_json_get(j, "kept_ties_low");
    if (!kept) kept = ckv_json_get(j, "kept");
    int mism = 0, heads = 0;
    int32_t *want = malloc(sizeof(int32_t) * (size_t)L);
    for (int l = 0; l < NL; l++) {
        const ckv_kv_layer *kl = &s.kv.layers[l];
        for (int h = 0; h < H; h++) {
            int nw = int_array(ckv_json_array_at(ckv_json_array_at(kept, l), h), want, L);
            const int by_rows = rerotated || members_rerotate;
            const int32_t *got = by_rows ? ob.rows + ((size_t)l * H + h) * L : kl->pos + kl->off[h];
            int same = nw == kl->len[h] && (!by_rows || ob.n_rows[l * H + h] == nw);
            for (int i = 0; same && i < nw; i++) same = got[i] == want[i];
            heads++;
            if (!same && mism++ < 3) {
                fprintf(stderr, "  %s layer %d head %d: kept %d positions, kvpress %d; first differences:", file, l, h,
                        kl->len[h], nw);
                int shown = 0;
                for (int i = 0; i < nw && shown < 6; i++) {
                    int found = 0;
                    for (int k = 0; k < kl->len[h]; k++) found |= got[k] == want[i];
                    if (!found) fprintf(stderr, " -%d", want[i]), shown++;
                }
                for (int k = 0; k < kl->len[h] && shown < 12; k++) {
                    int found = 0;
                    for (int i = 0; i < nw; i++) found |= got[k] == want[i];
                    if (!found) fprintf(stderr, " +%d", got[k]), shown++;
                }
                fprintf(stderr, " (min score gap %g)\n", ckv_json_number(ckv_json_get(j, "min_score_gap")));
            }
        }
    }
    free(want);
    CHECK_MSG(mism == 0, "%s: %d of %d heads kept a different set than kvpress", file, mism, heads);
    /* base scores (streaming_llm's scores are a representation of its rule, not values: kvpress
     * uses 0/1 masks, ckv ranks by position; their kept sets are compared above) */
    const char *sf = ckv_json_string(ckv_json_get(j, "scores_file"));
    if (sf && cfg.scorer != CKV_SCORER_STREAMING_LLM) {
        float *ref = read_f32_file(dir, sf, (size_t)NL * H * L);
        if (ref) {
            char what[2100];
            snprintf(what, sizeof what, "%s scores", file);
            const ckv_json *atol = ckv_json_get(j, "scores_atol");
            ckv_test_allclose(what, ob.scores, ref, (size_t)NL * H * L, atol ? ckv_json_number(atol) : 1e-6, 1e-4);
            free(ref);
        }
    }
    /* question logits after compression */
    /* the question logits for that same kept set; for AdaKV-style presses the "exact" file holds the
     * logits of a cache that really drops the evicted keys (kvpress only masks them) */
    const char *lf = ckv_json_string(ckv_json_get(j, "question_logits_ties_low_file"));
    if (!lf) lf = ckv_json_string(ckv_json_get(j, "question_logits_exact_file"));
    if (!lf) lf = ckv_json_string(ckv_json_get(j, "question_logits_file"));
    if (lf && nq > 0) {
        float *ref = read_f32_file(dir, lf, (size_t)nq * V);
        float *got = malloc(sizeof(float) * (size_t)nq * V);
        CHECK_OK(ckv_session_prefill(&s, q, nq, got, NULL));
        if (ref) {
            char what[2100];
            snprintf(what, sizeof what, "%s question logits", file);
            ckv_test_allclose(what, got, ref, (size_t)nq * V, 1e-4, 0.0);
        }
        free(ref);
        free(got);
    }
    ckv_session_free(&s);
    free(hkb);
    free(ob.scores);
    free(ob.rows);
    free(ob.n_rows);
    ckv_json_free(j);
    (*n_cases)++;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(void) {
    char root[1024];
    snprintf(root, sizeof root, "%s/presses", CKV_FIXTURES);
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
        snprintf(path, sizeof path, "%s/context.json", dir);
        struct stat sb;
        if (e->d_name[0] == '.' || stat(path, &sb) != 0) continue;
        ckv_json *cj = NULL;
        CHECK_OK(ckv_json_parse_file(&cj, path));
        if (!cj) continue;
        char model_dir[1400];
        snprintf(model_dir, sizeof model_dir, "%s/models/%s", CKV_FIXTURES, ckv_json_string(ckv_json_get(cj, "model")));
        int32_t ctx[4096], q[64];
        int L = int_array(ckv_json_get(cj, "context_ids"), ctx, 4096);
        int nq = int_array(ckv_json_get(cj, "question_ids"), q, 64);
        ckv_json_free(cj);
        ckv_model *m = NULL;
        CHECK_OK(ckv_model_load(&m, model_dir, be, NULL));
        if (!m) continue;
        n_models++;
        /* the cases, in name order */
        char *names[1024];
        int nn = 0;
        DIR *dd = opendir(dir);
        struct dirent *f;
        while (dd && (f = readdir(dd)) && nn < 1024) {
            size_t len = strlen(f->d_name);
            if (len > 5 && !strcmp(f->d_name + len - 5, ".json") && strcmp(f->d_name, "context.json") != 0)
                names[nn++] = strdup(f->d_name);
        }
        if (dd) closedir(dd);
        qsort(names, (size_t)nn, sizeof *names, cmp_str);
        int before = ckv_test_failures;
        for (int i = 0; i < nn; i++) {
            check_case(dir, names[i], m, ctx, L, q, nq, &n_cases);
            free(names[i]);
        }
        fprintf(stderr, "%s: %d cases, %s\n", e->d_name, nn, ckv_test_failures == before ? "all equal to the reference (kvpress, or the ports of DefensiveKV and HeadKV)" : "FAILURES");
        ckv_model_free(m);
    }
    closedir(d);
    CHECK_MSG(n_models >= 2 && n_cases >= 40, "expected >= 2 models and >= 40 cases, found %d and %d", n_models, n_cases);
    ckv_backend_free(be);
    return ckv_test_finish("test_evict_parity");
}
