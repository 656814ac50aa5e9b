/* test_press_registry.c - the press registry and its one builder: every registered press and wrapper
 * parses, takes exactly its options and echoes the canonical spec it always did; the builder applies
 * defaults, options, budgets and query_aware as the server and the command line need, and its errors
 * name the field (never a command-line flag); the budget -> kept-count rule gives kvpress's counts;
 * protected tokens follow each scorer. No model, no backend. */
#include <stdio.h>
#include <string.h>

#include "ckv_test.h"
#include "core/status.h"
#include "evict/press.h"
#include "evict/press_registry.h"

static ckv_press_config built(const char *spec, ckv_budget_kind kind, double value) {
    ckv_press_config c;
    ckv_press_request rq = {.spec = spec, .budget = {kind, value}, .query_aware = -1, .flags = CKV_PRESS_NEED_BUDGET};
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    return c;
}

/* The canonical specs as every earlier release printed them (fixtures, saved caches and the server's
 * context store key on them). */
static void check_canonical(void) {
    static const struct {
        const char *spec, *want;
    } cases[] = {
        {"snapkv", "snapkv(window=64,kernel=5,pool=avg)"},
        {"snapkv_paper", "snapkv(window=32,kernel=7,pool=max)"},
        {"pyramidkv", "pyramidkv(window=64,kernel=5,pool=avg,beta=20)"},
        {"tova", "tova"},
        {"knorm", "knorm"},
        {"streaming_llm", "streaming_llm(n_sink=4)"},
        {"observed_attention", "observed_attention"},
        {"expected_attention", "expected_attention(n_future=512,n_sink=4,covariance=1,vnorm=1,epsilon=0)"},
        {"random", "random(seed=0)"},
        {"defensivekv", "defensivekv(window=32,kernel=5,pool=avg)"},
        {"critical:snapkv", "critical(alpha=0.5,eps=0.0001):snapkv(window=64,kernel=5,pool=avg)"},
        {"adakv:tova", "adakv(safeguard=0.2):tova"},
        {"critical_adakv:snapkv_paper", "critical_adakv(alpha=0.5,eps=0.0001,safeguard=0.2):snapkv(window=32,kernel=7,pool=max)"},
        {"critical:random", "critical(alpha=0.5,eps=0.0001):random(seed=0)"},
        {"cur", "cur(n_sink=4,leverage_type=kv_product,use_local_approximation=1,local_window_size=16)"},
        {"adakv:leverage", "adakv(safeguard=0.2):leverage(sketch_dimension=48,seed=0)"},
        {"key_rerotation:critical:snapkv", "key_rerotation:critical(alpha=0.5,eps=0.0001):snapkv(window=64,kernel=5,pool=avg)"},
    };
    const char *tail = " budget=0.25 (cr=0.75, kept=max(1,floor(L*(1-cr)))) context-only";
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ckv_press_config c = built(cases[i].spec, CKV_BUDGET_FRACTION, 0.25);
        char want[600];
        snprintf(want, sizeof want, "%s%s", cases[i].want, tail);
        CHECK_MSG(!strcmp(c.spec, want), "%s: got '%s', expected '%s'", cases[i].spec, c.spec, want);
    }
    ckv_press_config c = built("knorm", CKV_BUDGET_RATIO, 0.3);
    CHECK_MSG(!strcmp(c.spec, "knorm cr=0.3 (kept=max(1,floor(L*(1-cr)))) context-only"), "got '%s'", c.spec);
    c = built("layer_defensivekv", CKV_BUDGET_FRACTION, 0.25); /* its count is over the model */
    CHECK_MSG(!strcmp(c.spec, "layer_defensivekv(window=32,kernel=5,pool=avg) budget=0.25 (cr=0.75, "
                              "kept=int(L*(1-cr)*Hkv*n_layers) over the model) context-only"), "got '%s'", c.spec);
    c = built("snapkv", CKV_BUDGET_TOKENS, 40);
    CHECK_MSG(!strcmp(c.spec, "snapkv(window=64,kernel=5,pool=avg) budget_tokens=40 per head context-only"), "got '%s'",
              c.spec);
    ckv_press_request rq = {.spec = "headkv:snapkv", .budget = {CKV_BUDGET_FRACTION, 0.5}, .query_aware = 1,
                            .options = (ckv_press_option_value[]){{"profile", "p.json"}, {"window", "8"}}, .n_options = 2,
                            .flags = CKV_PRESS_NEED_FILES | CKV_PRESS_NEED_BUDGET};
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    CHECK_MSG(!strcmp(c.spec, "headkv(profile=p.json):snapkv(window=8,kernel=5,pool=avg) budget=0.5 (cr=0.5, "
                              "kept=max(1,floor(L*(1-cr)))) query-aware"), "got '%s'", c.spec);
    c = built("none", CKV_BUDGET_NONE, 0);
    CHECK_MSG(!strcmp(c.spec, "none full cache context-only"), "got '%s'", c.spec);
}

/* Every entry parses and finalises with its defaults, takes exactly its (and its wrapper's) options,
 * and every wrapper stacks exactly where the press allows it. */
static void check_table(void) {
    int n_checked = 0;
    for (int i = 0; i < ckv_press_count; i++) {
        const ckv_press_def *d = &ckv_press_table[i];
        ckv_press_config c;
        CHECK_OK(ckv_press_parse(&c, d->name));
        CHECK_OK(ckv_press_finalize(&c));
        CHECK_MSG(c.scorer == d->scorer, "%s parses to scorer %d", d->name, (int)c.scorer);
        CHECK_MSG(!strncmp(c.spec, ckv_scorer_name(d->scorer), strlen(ckv_scorer_name(d->scorer))), "%s: spec '%s'",
                  d->name, c.spec);
        CHECK_MSG(ckv_press_is_press(d->name, (int)strlen(d->name)), "%s is a press", d->name);
        CHECK_MSG((d->score == NULL) == (d->scorer == CKV_SCORER_NONE), "%s: scorer present iff it evicts", d->name);
        for (int o = 0; o < ckv_press_option_count; o++) {
            const char *key = ckv_press_option_table[o].key;
            const int want = ckv_option_listed(d->options, key, strlen(key));
            CHECK_MSG(ckv_press_takes(&c, key) == want, "%s takes %s: %d, expected %d", d->name, key, !want, want);
            char pat[80];
            snprintf(pat, sizeof pat, "%s=", key);
            if (want) CHECK_MSG(strstr(c.spec, pat) != NULL, "%s: spec '%s' lacks %s", d->name, c.spec, key);
            n_checked++;
        }
        for (int w = 0; w < ckv_wrapper_count; w++) {
            const ckv_wrapper_def *wd = &ckv_wrapper_table[w];
            char spec[128];
            snprintf(spec, sizeof spec, "%s:%s", wd->name, d->name);
            ckv_press_config cw;
            ckv_status st = ckv_press_parse(&cw, spec);
            const int allowed = (d->wrappers & wd->needs) == wd->needs;
            CHECK_MSG((st == CKV_STATUS_OK) == allowed, "%s: parse %s, expected %s (%s)", spec,
                      st == CKV_STATUS_OK ? "ok" : "error", allowed ? "ok" : "an error", ckv_error_message());
            ckv_error_clear();
            if (st != CKV_STATUS_OK) continue;
            CHECK(cw.critical == wd->critical && cw.alloc == wd->alloc);
            for (const char *k = wd->options; *k;) {
                const char *end = strchr(k, ',');
                char key[32];
                snprintf(key, sizeof key, "%.*s", (int)(end ? end - k : (long)strlen(k)), k);
                CHECK_MSG(ckv_press_takes(&cw, key), "%s takes its wrapper's %s", spec, key);
                k = end ? end + 1 : k + strlen(k);
            }
        }
    }
    for (int o = 0; o < ckv_press_option_count; o++) { /* defaults lie in their ranges */
        const ckv_option_def *od = &ckv_press_option_table[o];
        ckv_press_config c;
        CHECK_OK(ckv_press_parse(&c, "none"));
        if (od->dflt[0]) CHECK_OK(ckv_press_set_option(&c, od->key, od->dflt)); /* files, lists: no default */
    }
    fprintf(stderr, "ok   registry: %d presses x %d options, %d wrappers (%d checks)\n", ckv_press_count,
            ckv_press_option_count, ckv_wrapper_count, n_checked);
}

static void expect_build_error(const ckv_press_request *rq, const char *field, int missing, const char *needle) {
    ckv_press_config c;
    ckv_press_error e;
    ckv_error_clear();
    ckv_status st = ckv_press_build(&c, rq, &e);
    const char *msg = ckv_error_message();
    CHECK_MSG(st != CKV_STATUS_OK, "spec '%s' built; expected an error on %s", rq->spec ? rq->spec : "(defaults)", field);
    if (st == CKV_STATUS_OK) return;
    CHECK_MSG(e.field && !strcmp(e.field, field), "error field %s, expected %s (%s)", e.field ? e.field : "NULL", field, msg);
    CHECK_MSG(e.missing == missing, "missing %d, expected %d (%s)", e.missing, missing, msg);
    CHECK_MSG(strstr(msg, needle) != NULL, "message '%s' lacks '%s'", msg, needle);
    CHECK_MSG(strstr(msg, "--") == NULL, "message '%s' names a command-line flag", msg);
    CHECK_MSG(c.scorer == CKV_SCORER_NONE, "a failed build leaves a full-cache press");
    fprintf(stderr, "ok   error on %s: %s\n", field, msg);
}

static void check_builder(void) {
    /* the server's rules: no spec = the defaults; a spec without a budget takes the defaults' budget */
    ckv_press_config def = built("critical:snapkv", CKV_BUDGET_FRACTION, 0.3), c;
    ckv_press_request rq = {.defaults = &def, .query_aware = -1, .flags = CKV_PRESS_NEED_BUDGET};
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    CHECK(!strcmp(c.spec, def.spec));
    rq.spec = "knorm";
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    CHECK(c.scorer == CKV_SCORER_KNORM && c.compression_ratio == def.compression_ratio && c.budget_given_as_b);
    rq.budget = (ckv_press_budget){CKV_BUDGET_RATIO, 0.5};
    rq.query_aware = 1;
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    CHECK(c.compression_ratio == 0.5 && !c.budget_given_as_b && c.query_aware);
    CHECK(strstr(c.spec, " query-aware") != NULL);
    rq.spec = NULL; /* the defaults' press with the request's budget */
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    CHECK(c.scorer == CKV_SCORER_SNAPKV && c.critical && c.compression_ratio == 0.5);

    /* options: applied in order after the press's defaults; strict by default */
    ckv_press_option_value opts[] = {{"window", "16"}, {"window", "8"}, {"pool", "max"}};
    ckv_press_request ro = {.spec = "defensivekv", .budget = {CKV_BUDGET_FRACTION, 0.5}, .options = opts, .n_options = 3,
                            .query_aware = -1};
    CHECK_OK(ckv_press_build(&c, &ro, NULL));
    CHECK(c.window == 8 && c.pool == CKV_POOL_MAX && c.kernel == 5);
    /* a choice option: its values by name, echoed by name, anything else refused naming them */
    ckv_press_option_value lt[] = {{"leverage_type", "kv_avg"}};
    ckv_press_request rl = {.spec = "cur", .budget = {CKV_BUDGET_FRACTION, 0.5}, .options = lt, .n_options = 1,
                            .query_aware = -1};
    CHECK_OK(ckv_press_build(&c, &rl, NULL));
    CHECK_MSG(c.leverage_type == CKV_CUR_KV_AVG && strstr(c.spec, "leverage_type=kv_avg,") != NULL, "got '%s'", c.spec);
    lt[0].value = "kv";
    expect_build_error(&rl, "leverage_type", 0, "'kv' is not one of key|value|kv_avg|kv_product");
    ro.spec = "knorm";
    expect_build_error(&ro, "window", 0, "does not take option window");
    ro.flags = CKV_PRESS_ANY_OPTIONS; /* validated, ignored */
    CHECK_OK(ckv_press_build(&c, &ro, NULL));
    CHECK(!strcmp(c.spec, "knorm budget=0.5 (cr=0.5, kept=max(1,floor(L*(1-cr)))) context-only"));
    ckv_press_option_value bad[] = {{"kernel", "4"}};
    ro.options = bad, ro.n_options = 1, ro.spec = "snapkv";
    expect_build_error(&ro, "kernel", 0, "kernel: 4 must be odd");
    ckv_press_option_value unknown[] = {{"foo", "1"}};
    ro.options = unknown;
    expect_build_error(&ro, "press", 0, "unknown press option 'foo'");

    /* what a request must give, and what it may not */
    ckv_press_request rb = {.spec = "snapkv", .query_aware = -1, .flags = CKV_PRESS_NEED_BUDGET};
    expect_build_error(&rb, "budget", 1, "needs a budget");
    rb.budget = (ckv_press_budget){CKV_BUDGET_FRACTION, 1.5};
    expect_build_error(&rb, "budget", 0, "budget 1.5 is outside (0, 1]");
    rb.budget = (ckv_press_budget){CKV_BUDGET_RATIO, 1.0};
    expect_build_error(&rb, "compression_ratio", 0, "compression_ratio 1 is outside [0, 1)");
    rb.budget = (ckv_press_budget){CKV_BUDGET_TOKENS, 0};
    expect_build_error(&rb, "budget_tokens", 0, "budget_tokens 0 must be");
    rb.budget = (ckv_press_budget){CKV_BUDGET_FRACTION, 0.5};
    rb.spec = "none";
    expect_build_error(&rb, "budget", 0, "the press is none");
    rb.spec = "critical_headkv:tova";
    rb.flags = CKV_PRESS_NEED_FILES;
    expect_build_error(&rb, "profile", 1, "needs option profile");
    rb.flags = 0; /* planning: the file may be missing */
    CHECK_OK(ckv_press_build(&c, &rb, NULL));
    /* bad specs, each an error on "press": among them the stacks kvpress refuses (a wrapper over AdaKVPress /
     * CriticalAdaKVPress / HeadKV, PerLayerCompressionPress over CriticalKVPress, whose constructor takes no
     * compression_ratio, critical over critical), chunkkv over critical, which kvpress allows but whose chunk
     * sums overflow (docs/presses.md), and composed members kvpress refuses (AdaKVPress) or whose rows ckv
     * orders otherwise (chunkkv: or key_rerotation: after a plain press) */
    static const struct {
        const char *spec, *needle;
    } bad_specs[] = {
        {"snapkv:knorm", "'snapkv' is a press, not a wrapper"},
        {"super:snapkv", "unknown wrapper 'super'"},
        {"snapkw", "unknown press 'snapkw'"},
        {"critical:pyramidkv", "cannot be wrapped"},
        {"adakv:critical:snapkv", "cannot stack on"},
        {"key_rerotation:adakv:snapkv", "cannot stack on"},
        {"key_rerotation:critical_adakv:snapkv", "cannot stack on"},
        {"per_layer:headkv:snapkv", "cannot stack on"},
        {"per_layer:critical:knorm", "cannot stack on"},
        {"critical:critical:snapkv", "cannot stack on"},
        {"chunkkv:critical:snapkv", "does not stack chunkkv: on critical:"},
        {"composed:adakv:snapkv+knorm", "refuses AdaKVPress"},
        {"composed:snapkv+critical_adakv:knorm", "refuses AdaKVPress"},
        {"composed:snapkv+headkv:knorm", "kvpress has no HeadKV press"},
        {"composed:per_layer:critical:snapkv+knorm", "per_layer: needs a press built with compression_ratio"},
        {"composed:snapkv+per_layer:tova", "tova scores with the attention input"},
        {"composed:per_layer:snapkv+chunkkv:knorm", "chunkkv: on press 2 of composed: needs"},
        {"composed:snapkv+chunkkv:knorm", "chunkkv: on press 2 of composed: needs"},
        {"composed:snapkv+key_rerotation:knorm", "key_rerotation: on press 2 of composed: needs"},
        {"composed:chunkkv:snapkv+key_rerotation:knorm", "key_rerotation: on press 2 of composed: needs"},
        {"composed:chunkkv:critical:snapkv+knorm", "does not stack chunkkv: on critical:"},
        {"composed:snapkv+critical:tova", "tova scores with the attention input"},
        {"composed:snapkv+composed:knorm", "composed: press inside composed:"},
        {"key_rerotation:critical:snapkv:knorm", "at most two wrappers"},
        {"key_rerotation:critical:pyramidkv", "cannot be wrapped"},
    };
    for (size_t i = 0; i < sizeof bad_specs / sizeof bad_specs[0]; i++) {
        rb.spec = bad_specs[i].spec;
        expect_build_error(&rb, "press", 0, bad_specs[i].needle);
    }
    rb.spec = "snapkv(window=4)";
    expect_build_error(&rb, "press", 0, "options are not part of the press name");
}

/* kvpress's counts at hand-computed points. */
static void check_kept(void) {
    ckv_press_kept k;
    ckv_press_config c = built("critical_adakv:snapkv", CKV_BUDGET_RATIO, 0.75);
    ckv_press_layer_kept(&c, 0, 3, 300, 4, &k);
    CHECK_MSG(k.per_head == 75 && k.layer_total == 300 && k.first_stage == 37 && k.safeguard == 15,
              "per head %d, total %ld, b1 %d, safeguard %d", k.per_head, k.layer_total, k.first_stage, k.safeguard);
    CHECK(ckv_press_first_stage(&c, 75) == 37);
    c = built("critical:snapkv", CKV_BUDGET_TOKENS, 40);
    ckv_press_layer_kept(&c, 0, 3, 300, 4, &k);
    CHECK_MSG(k.per_head == 40 && k.layer_total == 160 && k.first_stage == 20 && k.safeguard == 0,
              "per head %d, total %ld, b1 %d, safeguard %d", k.per_head, k.layer_total, k.first_stage, k.safeguard);
    c = built("critical:knorm", CKV_BUDGET_RATIO, 0.9); /* L 3: max(1, floor(0.3)) = 1; b1 at least 1 */
    ckv_press_layer_kept(&c, 0, 3, 3, 2, &k);
    CHECK_MSG(k.per_head == 1 && k.first_stage == 1, "per head %d, b1 %d", k.per_head, k.first_stage);
    c = built("snapkv", CKV_BUDGET_FRACTION, 0.2); /* cr = 0.8000000000000000444: 0.2 x 130000 keeps 25999 */
    ckv_press_layer_kept(&c, 0, 1, 130000, 8, &k);
    CHECK_MSG(k.per_head == 25999, "per head %d", k.per_head);
    c = built("defensivekv", CKV_BUDGET_RATIO, 0.7); /* int(L * (1 - cr) * Hkv) over the layer */
    ckv_press_layer_kept(&c, 0, 3, 301, 4, &k);
    CHECK_MSG(k.layer_total == (long)(301.0 * (1.0 - 0.7) * 4.0) && k.per_head == 90, "total %ld, per head %d",
              k.layer_total, k.per_head);
    c = built("layer_defensivekv", CKV_BUDGET_RATIO, 0.9); /* int(L * (1 - cr) * Hkv * n_layers) over the model */
    CHECK_MSG(ckv_press_model_kept(&c, 3, 300, 2) == (long)(300.0 * (1.0 - 0.9) * 2.0 * 3.0) &&
                  ckv_press_model_kept(&c, 3, 300, 2) == 179, /* one truncation: 179.99999999999997 */
              "model total %ld", ckv_press_model_kept(&c, 3, 300, 2));
    c = built("layer_defensivekv", CKV_BUDGET_TOKENS, 40);
    CHECK_MSG(ckv_press_model_kept(&c, 3, 300, 2) == 240 && ckv_press_model_kept(&c, 3, 20, 2) == 120,
              "model total with budget_tokens: %ld, %ld", ckv_press_model_kept(&c, 3, 300, 2),
              ckv_press_model_kept(&c, 3, 20, 2));
    CHECK_MSG(c.alloc == CKV_ALLOC_MODEL, "layer_defensivekv selects over the model (alloc %d)", (int)c.alloc);
    c = built("pyramidkv", CKV_BUDGET_RATIO, 0.5);
    for (int layer = 0; layer < 24; layer++) {
        ckv_press_layer_kept(&c, layer, 24, 1000, 2, &k);
        CHECK_MSG(k.per_head == ckv_pyramidkv_n_kept(layer, 24, 1000, 0.5, 64, 20.0), "pyramid layer %d: %d", layer,
                  k.per_head);
    }
    ckv_press_layer_kept(&c, 0, 24, 1000, 2, &k);
    CHECK_MSG(k.per_head > 500, "pyramidkv's first layer keeps more than the mean (%d)", k.per_head);
}

static void check_protected(void) {
    static const struct {
        const char *spec;
        int head, tail;
    } cases[] = {{"snapkv", 0, 64},       {"snapkv_paper", 0, 32},      {"pyramidkv", 0, 64},
                 {"tova", 0, 1},          {"streaming_llm", 4, 0},      {"expected_attention", 4, 0},
                 {"knorm", 0, 0},         {"observed_attention", 0, 0}, {"random", 0, 0},
                 {"defensivekv", 0, 32},   {"critical_adakv:snapkv", 0, 64}, {"keydiff", 0, 0},
                 {"layer_defensivekv", 0, 0}, /* its window competes across layers at its layer's max */
                 {"lagkv", 0, 0},         /* its sinks and tail score 1, kvpress's "always keep" */
                 {"cur", 0, 0},           /* its sinks score 1 the same way */
                 {"leverage", 0, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ckv_press_config c = built(cases[i].spec, CKV_BUDGET_FRACTION, 0.5);
        int h = -1, t = -1;
        ckv_press_protected(&c, 300, &h, &t);
        CHECK_MSG(h == cases[i].head && t == cases[i].tail, "%s protects %d + %d, expected %d + %d", cases[i].spec, h, t,
                  cases[i].head, cases[i].tail);
    }
    /* the attention-input rows each scorer reads (what a shared prefill keeps) */
    static const struct {
        const char *spec;
        int first;
    } reads[] = {{"snapkv", 300 - 64}, {"tova", 299}, {"observed_attention", 0}, {"expected_attention", 0},
                 {"knorm", 300},       {"cur", 300},  {"leverage", 300},         {"critical:lagkv", 300}};
    for (size_t i = 0; i < sizeof reads / sizeof reads[0]; i++) {
        ckv_press_config r = built(reads[i].spec, CKV_BUDGET_FRACTION, 0.5);
        CHECK_MSG(ckv_press_xn_first(&r, 300) == reads[i].first, "%s reads from row %d, expected %d", reads[i].spec,
                  ckv_press_xn_first(&r, 300), reads[i].first);
    }
    ckv_press_config c = built("snapkv", CKV_BUDGET_FRACTION, 0.5);
    CHECK_FAILS(ckv_press_check_context(&c, 64), CKV_STATUS_ERR_ARG, "window 64 needs a context longer than 64 tokens");
    CHECK_OK(ckv_press_check_context(&c, 65));
    c = built("knorm", CKV_BUDGET_FRACTION, 0.5);
    CHECK_FAILS(ckv_press_check_context(&c, 1), CKV_STATUS_ERR_ARG, "cannot be compressed");
}

/* chunkkv: its spec, its budget kinds, the scorers it refuses; per_layer: its ratio list (parsed,
 * printed, counted per layer, checked against the model's depth) replaces the budget. */
static void check_layer_wrappers(void) {
    ckv_press_config c = built("chunkkv:snapkv", CKV_BUDGET_RATIO, 0.5);
    CHECK_MSG(!strcmp(c.spec, "chunkkv(chunk_length=20):snapkv(window=64,kernel=5,pool=avg) cr=0.5 "
                              "(kept=max(1,floor(L*(1-cr)))) context-only"), "got '%s'", c.spec);
    CHECK(c.alloc == CKV_ALLOC_CHUNK && !c.critical);
    ckv_press_request rq = {.spec = "chunkkv:knorm", .budget = {CKV_BUDGET_TOKENS, 40}, .query_aware = -1,
                            .flags = CKV_PRESS_NEED_BUDGET};
    expect_build_error(&rq, "press", 0, "keeps whole chunks");
    rq.budget = (ckv_press_budget){CKV_BUDGET_RATIO, 0.5};
    rq.spec = "chunkkv:observed_attention";
    expect_build_error(&rq, "press", 0, "cannot be wrapped by chunkkv");
    rq.spec = "chunkkv:streaming_llm";
    expect_build_error(&rq, "press", 0, "cannot be wrapped by chunkkv");
    rq.spec = "chunkkv:pyramidkv";
    expect_build_error(&rq, "press", 0, "cannot be wrapped by chunkkv");

    c = built("key_rerotation:streaming_llm", CKV_BUDGET_RATIO, 0.5);
    CHECK_MSG(!strcmp(c.spec, "key_rerotation:streaming_llm(n_sink=4) cr=0.5 (kept=max(1,floor(L*(1-cr)))) "
                              "context-only"), "got '%s'", c.spec);
    CHECK(c.rerotate_keys && c.alloc == CKV_ALLOC_UNIFORM && !c.critical);
    c = built("critical:snapkv", CKV_BUDGET_RATIO, 0.5);
    CHECK(!c.rerotate_keys);
    rq.spec = "key_rerotation:pyramidkv";
    expect_build_error(&rq, "press", 0, "its kept counts are its own");

    ckv_press_option_value ratios = {"compression_ratios", "[0.25, 0.5,0.75]"};
    ckv_press_request pl = {.spec = "per_layer:snapkv", .options = &ratios, .n_options = 1, .query_aware = -1,
                            .flags = CKV_PRESS_NEED_BUDGET};
    CHECK_OK(ckv_press_build(&c, &pl, NULL));
    CHECK_MSG(!strcmp(c.spec, "per_layer(compression_ratios=[0.25,0.5,0.75]):snapkv(window=64,kernel=5,pool=avg) per "
                              "layer (kept=max(1,floor(L*(1-cr_layer)))) context-only"), "got '%s'", c.spec);
    ckv_press_kept k;
    const int want[3] = {225, 150, 75};
    for (int l = 0; l < 3; l++) {
        ckv_press_layer_kept(&c, l, 3, 300, 2, &k);
        CHECK_MSG(k.per_head == want[l] && k.layer_total == 2L * want[l], "per_layer layer %d keeps %d (total %ld), "
                  "expected %d", l, k.per_head, k.layer_total, want[l]);
    }
    CHECK_MSG(ckv_press_n_kept(&c, 300) == 225, "per_layer's largest layer keeps %d", ckv_press_n_kept(&c, 300));
    CHECK_OK(ckv_press_check_layers(&c, 3));
    CHECK_FAILS(ckv_press_check_layers(&c, 24), CKV_STATUS_ERR_ARG, "compression_ratios has 3 values, the model has 24");
    pl.budget = (ckv_press_budget){CKV_BUDGET_FRACTION, 0.5};
    expect_build_error(&pl, "budget", 0, "takes its budget from compression_ratios");
    pl.budget = (ckv_press_budget){CKV_BUDGET_NONE, 0};
    pl.n_options = 0;
    expect_build_error(&pl, "compression_ratios", 1, "needs option compression_ratios");
    static const char *bad[] = {"", "0.5,", "0.5;0.6", "[0.5", "1", "-0.1", "0.5,x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ratios.value = bad[i];
        pl.n_options = 1;
        expect_build_error(&pl, "compression_ratios", 0, "press option compression_ratios");
    }
}

/* composed: PRESS+PRESS+... parsed and printed, its ratios (one per press) its budget, the stages as
 * plain presses, the kept count press after press, and the presses it refuses after the first. */
static void check_composed(void) {
    ckv_press_option_value ratios = {"press_ratios", "0.5,0.25"};
    ckv_press_request rq = {.spec = "composed:snapkv+knorm", .options = &ratios, .n_options = 1, .query_aware = -1,
                            .flags = CKV_PRESS_NEED_BUDGET};
    ckv_press_config c, st;
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    CHECK_MSG(!strcmp(c.spec, "composed(press_ratios=[0.5,0.25]):snapkv(window=64,kernel=5,pool=avg)+knorm per press "
                              "(kept=max(1,floor(n*(1-cr_i))) of the n rows before it; cr=0.625 overall) context-only"),
              "got '%s'", c.spec);
    CHECK(c.composed && c.n_stages == 2 && c.scorer == CKV_SCORER_SNAPKV && c.stages[1] == CKV_SCORER_KNORM &&
          c.alloc == CKV_ALLOC_UNIFORM);
    CHECK_MSG(ckv_press_n_kept(&c, 300) == 112 && ckv_press_n_kept(&c, 3) == 1, "composed keeps %d of 300, %d of 3",
              ckv_press_n_kept(&c, 300), ckv_press_n_kept(&c, 3)); /* 300 -> 150 -> 112; 3 -> 1 -> 1 */
    CHECK(ckv_press_takes(&c, "window") && ckv_press_takes(&c, "press_ratios") && !ckv_press_takes(&c, "n_sink"));
    ckv_press_stage(&c, 1, &st);
    CHECK_MSG(st.scorer == CKV_SCORER_KNORM && !st.composed && st.compression_ratio == 0.25 && st.alloc == CKV_ALLOC_UNIFORM,
              "stage 1: scorer %d, cr %g", (int)st.scorer, st.compression_ratio);
    CHECK_MSG(ckv_press_n_kept(&st, 150) == 112, "stage 1 keeps %d of 150", ckv_press_n_kept(&st, 150));
    rq.spec = "composed:critical:snapkv+knorm"; /* critical: on the first press: its stage only */
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    CHECK_MSG(!strncmp(c.spec, "composed(press_ratios=[0.5,0.25]):critical(alpha=0.5,eps=0.0001):snapkv(window=64,"
                               "kernel=5,pool=avg)+knorm per press", 90), "got '%s'", c.spec);
    CHECK(c.critical && ckv_press_takes(&c, "alpha") && ckv_press_takes(&c, "eps"));
    ckv_press_stage(&c, 0, &st);
    CHECK(st.critical && st.scorer == CKV_SCORER_SNAPKV && st.compression_ratio == 0.5);
    ckv_press_kept k0;
    ckv_press_layer_kept(&st, 0, 3, 300, 2, &k0); /* kvpress: int((1 - 0.5) * 300 * 0.5) = 75 of 150 */
    CHECK_MSG(k0.per_head == 150 && k0.first_stage == 75, "stage 0 keeps %d, first stage %d", k0.per_head, k0.first_stage);
    ckv_press_stage(&c, 1, &st);
    CHECK(!st.critical && st.scorer == CKV_SCORER_KNORM);
    /* wrapped members: each stage its own wrappers, printed before its press */
    rq.spec = "composed:snapkv+critical:knorm";
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    CHECK_MSG(strstr(c.spec, "composed(press_ratios=[0.5,0.25]):snapkv(window=64,kernel=5,pool=avg)+critical(alpha=0.5,"
                             "eps=0.0001):knorm per press") == c.spec, "got '%s'", c.spec);
    CHECK(!c.critical && ckv_press_takes(&c, "alpha") && !ckv_press_takes(&c, "chunk_length"));
    ckv_press_stage(&c, 0, &st);
    CHECK(!st.critical && st.scorer == CKV_SCORER_SNAPKV);
    ckv_press_stage(&c, 1, &st);
    CHECK(st.critical && st.scorer == CKV_SCORER_KNORM && st.compression_ratio == 0.25 && st.alloc == CKV_ALLOC_UNIFORM);
    ckv_press_layer_kept(&st, 0, 3, 150, 2, &k0); /* kvpress: int((1 - 0.25) * 150 * 0.5) = 56 of the 150 rows */
    CHECK_MSG(k0.per_head == 112 && k0.first_stage == 56, "stage 1 keeps %d, first stage %d", k0.per_head, k0.first_stage);
    rq.spec = "composed:chunkkv:snapkv+knorm";
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    CHECK_MSG(strstr(c.spec, "composed(press_ratios=[0.5,0.25]):chunkkv(chunk_length=20):snapkv(") == c.spec, "got '%s'",
              c.spec);
    CHECK(ckv_press_takes(&c, "chunk_length") && !ckv_press_takes(&c, "alpha") && c.alloc == CKV_ALLOC_UNIFORM);
    ckv_press_stage(&c, 0, &st);
    CHECK(st.alloc == CKV_ALLOC_CHUNK && !st.critical && !st.rerotate_keys);
    rq.spec = "composed:key_rerotation:critical:snapkv+key_rerotation:knorm+chunkkv:keydiff";
    ratios.value = "0.5,0.25,0.1";
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    CHECK_MSG(strstr(c.spec, "composed(press_ratios=[0.5,0.25,0.1]):key_rerotation:critical(alpha=0.5,eps=0.0001):"
                             "snapkv(window=64,kernel=5,pool=avg)+key_rerotation:knorm+chunkkv(chunk_length=20):keydiff "
                             "per press") == c.spec, "got '%s'", c.spec);
    CHECK(!ckv_press_rerotates(&c)); /* the question follows at L (kvpress's pipeline with a ComposedPress) */
    ckv_press_stage(&c, 0, &st);
    CHECK(st.critical && st.rerotate_keys && ckv_press_rerotates(&st) && st.alloc == CKV_ALLOC_UNIFORM);
    ckv_press_stage(&c, 1, &st);
    CHECK(!st.critical && st.rerotate_keys && st.scorer == CKV_SCORER_KNORM);
    ckv_press_stage(&c, 2, &st);
    CHECK(!st.rerotate_keys && st.alloc == CKV_ALLOC_CHUNK && st.scorer == CKV_SCORER_KEYDIFF);
    rq.spec = "composed:knorm+cur+keydiff"; /* a later press's options belong to the press */
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    CHECK(ckv_press_takes(&c, "n_sink") && ckv_press_takes(&c, "local_window_size") && !ckv_press_takes(&c, "window"));
    CHECK_MSG(strstr(c.spec, "composed(press_ratios=[0.5,0.25,0.1]):knorm+cur(n_sink=4,") != NULL, "got '%s'", c.spec);
    rq.spec = "composed:snapkv+knorm";
    expect_build_error(&rq, "press_ratios", 0, "press_ratios has 3 values for 2 presses");
    rq.n_options = 0;
    expect_build_error(&rq, "press_ratios", 1, "needs option press_ratios");
    rq.n_options = 1;
    ratios.value = "0.5,0.5";
    rq.budget = (ckv_press_budget){CKV_BUDGET_FRACTION, 0.5};
    expect_build_error(&rq, "budget", 0, "takes its budget from press_ratios");
    rq.budget = (ckv_press_budget){CKV_BUDGET_NONE, 0};
    rq.spec = "composed:snapkv+tova";
    expect_build_error(&rq, "press", 0, "tova scores with the attention input");
    rq.spec = "composed:knorm+leverage";
    expect_build_error(&rq, "press", 0, "leverage rotates every head's keys back");
    rq.spec = "composed:pyramidkv+knorm";
    expect_build_error(&rq, "press", 0, "pyramidkv cannot be composed");
    rq.spec = "composed:snapkv+nope";
    expect_build_error(&rq, "press", 0, "unknown press 'nope'");
    rq.spec = "snapkv+knorm";
    expect_build_error(&rq, "press", 0, "need the wrapper composed:");
    rq.spec = "composed:snapkv+knorm+knorm+knorm+knorm+knorm+knorm+knorm+knorm";
    expect_build_error(&rq, "press", 0, "more than 8 presses");
}

/* composed with per_layer: members (kvpress's PerLayerCompressionPress in a ComposedPress): each layer
 * at its own ratio of compression_ratios, press_ratios one per other member, kvpress's overall ratio
 * (the member at its mean), and the contradictions refused naming the option. */
static void check_composed_per_layer(void) {
    ckv_press_option_value o[2] = {{"compression_ratios", "0.25,0.5,0.75"}, {"press_ratios", "0.5"}};
    ckv_press_request rq = {.spec = "composed:per_layer:snapkv+knorm", .options = o, .n_options = 2, .query_aware = -1,
                            .flags = CKV_PRESS_NEED_BUDGET};
    ckv_press_config c, st, again;
    CHECK_OK(ckv_press_build(&c, &rq, NULL));
    CHECK_MSG(!strcmp(c.spec, "composed(press_ratios=[0.5]):per_layer(compression_ratios=[0.25,0.5,0.75]):snapkv("
                              "window=64,kernel=5,pool=avg)+knorm per press (kept=max(1,floor(n*(1-cr_i))) of the n rows "
                              "before it, a per_layer: press's cr_i its layer's; cr=0.75 overall) context-only"),
              "got '%s'", c.spec);
    CHECK(c.composed && c.n_stages == 2 && c.stage_per_layer[0] && !c.stage_per_layer[1] && ckv_press_n_ratios(&c) == 1);
    CHECK(ckv_press_takes(&c, "compression_ratios") && ckv_press_takes(&c, "press_ratios"));
    CHECK_OK(ckv_press_check_layers(&c, 3));
    CHECK_FAILS(ckv_press_check_layers(&c, 4), CKV_STATUS_ERR_ARG, "compression_ratios has 3 values, the model has 4");
    ckv_press_stage(&c, 0, &st);
    CHECK(st.alloc == CKV_ALLOC_PER_LAYER && st.scorer == CKV_SCORER_SNAPKV && !st.composed);
    ckv_press_kept k;
    ckv_press_layer_kept(&st, 2, 3, 300, 2, &k); /* layer 2 at 0.75: 75 of 300 */
    CHECK_MSG(k.per_head == 75, "stage 0 layer 2 keeps %d of 300", k.per_head);
    ckv_press_stage(&c, 1, &st);
    CHECK_MSG(st.alloc == CKV_ALLOC_UNIFORM && st.scorer == CKV_SCORER_KNORM && st.compression_ratio == 0.5,
              "stage 1: alloc %d, cr %g", (int)st.alloc, st.compression_ratio);
    /* what a layer may hold: the largest layer's count, then knorm's share: 300 -> 225 -> 112 */
    CHECK_MSG(ckv_press_n_kept(&c, 300) == 112, "composed keeps at most %d of 300", ckv_press_n_kept(&c, 300));
    /* after a plain press, its entry of press_ratios skipped: snapkv at 0.5, then the layer's ratio */
    rq.spec = "composed:snapkv+per_layer:knorm";
    CHECK_OK(ckv_press_build(&again, &rq, NULL));
    CHECK_MSG(strstr(again.spec, "composed(press_ratios=[0.5]):snapkv(window=64,kernel=5,pool=avg)+per_layer("
                                 "compression_ratios=[0.25,0.5,0.75]):knorm per press") == again.spec, "got '%s'", again.spec);
    ckv_press_stage(&again, 0, &st);
    CHECK(st.alloc == CKV_ALLOC_UNIFORM && st.compression_ratio == 0.5);
    ckv_press_stage(&again, 1, &st);
    ckv_press_layer_kept(&st, 0, 3, 150, 2, &k); /* layer 0 at 0.25: 112 of 150 */
    CHECK_MSG(st.alloc == CKV_ALLOC_PER_LAYER && k.per_head == 112, "stage 1 layer 0 keeps %d of 150", k.per_head);
    /* every member per_layer: no press_ratios */
    rq.spec = "composed:per_layer:snapkv+per_layer:knorm";
    rq.n_options = 1;
    CHECK_OK(ckv_press_build(&again, &rq, NULL));
    CHECK_MSG(strstr(again.spec, "composed:per_layer(") == again.spec && ckv_press_n_ratios(&again) == 0,
              "got '%s'", again.spec);
    CHECK_MSG(strstr(again.spec, "cr=0.75 overall") != NULL, "got '%s'", again.spec); /* 1 - 0.5 * 0.5 */
    /* contradictions, each naming its option */
    rq.n_options = 2;
    expect_build_error(&rq, "press_ratios", 0, "press_ratios has 1 values for 0 presses that take one (per_layer: "
                                               "members take their ratios from compression_ratios");
    rq.spec = "composed:per_layer:snapkv+knorm";
    o[1].value = "0.5,0.25";
    expect_build_error(&rq, "press_ratios", 0, "press_ratios has 2 values for 1 presses that take one");
    rq.options = o + 1;
    rq.n_options = 1;
    expect_build_error(&rq, "compression_ratios", 1, "needs option compression_ratios for its per_layer: member");
    rq.options = o;
    expect_build_error(&rq, "press_ratios", 1, "needs option press_ratios (one compression ratio per press but its "
                                               "per_layer: members");
    rq.n_options = 2;
    o[1].value = "0.5";
    rq.budget = (ckv_press_budget){CKV_BUDGET_FRACTION, 0.5};
    expect_build_error(&rq, "budget", 0, "takes its budget from press_ratios");
}

/* finch: its window is the question it is given; kept counts per chunk; its own rerotate_keys. */
static void check_finch(void) {
    ckv_press_config c = built("finch", CKV_BUDGET_RATIO, 0.9), q;
    CHECK_MSG(strstr(c.spec, "finch(chunk_length=0,normalize_scores=1,rerotate_keys=1) cr=0.9") != NULL, "spec '%s'",
              c.spec);
    CHECK_MSG(c.chunk_length == 0 && c.normalize_scores == 1 && ckv_press_rerotates(&c) && c.question_rows == 0,
              "defaults: chunk_length %d, normalize_scores %d", c.chunk_length, c.normalize_scores);
    CHECK(ckv_press_with_question(&c, 0, &q) == CKV_STATUS_ERR_ARG);
    CHECK_MSG(strstr(ckv_error_message(), "needs a question compressed with the context (query_aware)") != NULL, "'%s'",
              ckv_error_message());
    ckv_error_clear();
    CHECK(ckv_press_check_context(&c, 308) == CKV_STATUS_ERR_ARG); /* no question: never a silent skip */
    ckv_error_clear();
    CHECK_OK(ckv_press_with_question(&c, 8, &q));
    CHECK_MSG(q.question_rows == 8 && q.window == 8 && strstr(q.spec, " question_rows=8 cr=0.9") != NULL, "spec '%s'",
              q.spec);
    int head = -1, tail = -1;
    ckv_press_protected(&q, 308, &head, &tail);
    CHECK_MSG(head == 0 && tail == 8 && ckv_press_xn_first(&q, 308) == 300, "protects %d + %d, reads from %d", head,
              tail, ckv_press_xn_first(&q, 308));
    CHECK(ckv_press_n_kept(&q, 308) == 30);
    ckv_press_config again; /* a press given its question keeps it when none is passed (the server's requests) */
    CHECK_OK(ckv_press_with_question(&q, 0, &again));
    CHECK(again.question_rows == 8);
    /* chunks of 128 over 308 rows: 12 + 12 + 5 (kvpress's count on the fixtures) */
    CHECK_OK(ckv_press_set_option(&q, "chunk_length", "128"));
    CHECK_MSG(ckv_press_n_kept(&q, 308) == 29, "chunked kept %d", ckv_press_n_kept(&q, 308));
    CHECK_OK(ckv_press_check_context(&q, 308));
    CHECK_OK(ckv_press_set_option(&q, "chunk_length", "80")); /* must exceed 8 / (1 - 0.9) = 80 */
    CHECK(ckv_press_check_context(&q, 308) == CKV_STATUS_ERR_ARG);
    ckv_error_clear();
    CHECK_OK(ckv_press_set_option(&q, "rerotate_keys", "0"));
    CHECK(!ckv_press_rerotates(&q));
    c = built("snapkv", CKV_BUDGET_RATIO, 0.5); /* the option is finch's: stored, no effect elsewhere */
    CHECK_OK(ckv_press_set_option(&c, "rerotate_keys", "1"));
    CHECK(!ckv_press_rerotates(&c));
    CHECK_OK(ckv_press_with_question(&c, 0, &q));
    CHECK(!strcmp(q.spec, c.spec));
}

int main(void) {
    check_canonical();
    check_finch();
    check_table();
    check_builder();
    check_kept();
    check_protected();
    check_layer_wrappers();
    check_composed();
    check_composed_per_layer();
    return ckv_test_finish("test_press_registry");
}
