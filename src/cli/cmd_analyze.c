/* cmd_analyze.c - `ckv analyze`: for one prompt and budget, the attention-output perturbation
 * ||o - o^||_1 of every (layer, query head) under two presses, with the CriticalKV paper's bounds
 * (docs/presses.md, "Perturbation analysis"). Prints a summary on stdout (rank 0) and writes one JSON
 * line per head with --out. It does not generate tokens or compress a cache for later use. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/cli_agree.h"
#include "cli/cli_opts.h"
#include "cli/cli_press.h"
#include "comm/comm.h"
#include "core/json.h"
#include "core/log.h"
#include "core/threadpool.h"
#include "engine/analyze.h"
#include "engine/compress.h"
#include "engine/request.h"
#include "eval/perturb.h"
#include "evict/headkv.h"
#include "model/model.h"

static const ckv_cli_command analyze_cmd = {
    CKV_CMD_ANALYZE, "analyze", "-m DIR (--prompt-ids 1,2,3 | --prompt-ids-file F) --budget B [flags]",
    "Per (layer, query head): ||o - o^||_1 of the attention output of the first decode input under\n"
    "press A and press B, the bound theta (CriticalKV Theorem 3.3) and the attention-weight-only bound.\n"
    "Press options and the budget apply to both presses."};

#define MAX_BUDGETS 32

typedef struct {
    const char *model, *prompt_ids, *prompt_file, *question, *out, *stats_json, *layerwise;
    const char *spec[CKV_ANALYZE_PRESSES];
    int n_budgets;                                         /* one analysis per budget, all from one prefill */
    double budget[MAX_BUDGETS];                            /* kept fractions (0: --compression-ratio / --budget-tokens) */
    ckv_press_config press[MAX_BUDGETS][CKV_ANALYZE_PRESSES];
} analyze_args;

static void parse_args(analyze_args *a, ckv_opts *o, int argc, char **argv) {
    ckv_opts_parse(o, &analyze_cmd, argc, argv);
    memset(a, 0, sizeof *a);
    a->model = ckv_opt_str(o, CKV_OPT_MODEL, NULL);
    a->prompt_ids = ckv_opt_str(o, CKV_OPT_PROMPT_IDS, NULL);
    a->prompt_file = ckv_opt_str(o, CKV_OPT_PROMPT_IDS_FILE, NULL);
    a->question = ckv_opt_str(o, CKV_OPT_QUESTION_IDS, NULL);
    a->out = ckv_opt_str(o, CKV_OPT_OUT, NULL);
    a->spec[0] = ckv_opt_str(o, CKV_OPT_PRESS_A, "snapkv");
    a->spec[1] = ckv_opt_str(o, CKV_OPT_PRESS_B, "critical:snapkv");
    if (!a->model) ckv_cli_usage_error("analyze", "--model is required");
    if (!a->prompt_ids == !a->prompt_file)
        ckv_cli_usage_error("analyze", "give exactly one of --prompt-ids and --prompt-ids-file");
    a->stats_json = ckv_opt_str(o, CKV_OPT_STATS_JSON, NULL);
    a->layerwise = ckv_opt_str(o, CKV_OPT_LAYERWISE, NULL);
    ckv_cli_budget bs[MAX_BUDGETS];
    if (ckv_opt_has(o, CKV_OPT_BUDGET)) { /* a list of kept fractions */
        static const ckv_opt_id ids[] = {CKV_OPT_BUDGET, CKV_OPT_COMPRESSION_RATIO, CKV_OPT_BUDGET_TOKENS};
        ckv_opts_exclusive(o, ids, 3, "both set the budget");
        char list[1024];
        snprintf(list, sizeof list, "%s", ckv_opt_str(o, CKV_OPT_BUDGET, ""));
        for (char *t = strtok(list, ","); t; t = strtok(NULL, ",")) {
            if (a->n_budgets == MAX_BUDGETS) ckv_cli_usage_error("analyze", "--budget: at most %d budgets", MAX_BUDGETS);
            a->budget[a->n_budgets] = ckv_cli_parse_double("--budget", t, -1e300, 1e300);
            bs[a->n_budgets].kind = CKV_CLI_BUDGET_FRACTION;
            bs[a->n_budgets].value = a->budget[a->n_budgets];
            a->n_budgets++;
        }
        if (!a->n_budgets) ckv_cli_usage_error("analyze", "--budget: empty list");
    } else {
        ckv_cli_press_budget(o, &bs[0]);
        a->n_budgets = 1;
    }
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
        char flag[16];
        snprintf(flag, sizeof flag, "--press-%c", 'a' + p);
        ckv_cli_press_check_spec(o, flag, a->spec[p]);
        ckv_cli_check(ckv_press_parse(&a->press[0][p], a->spec[p]));
        if (a->press[0][p].scorer == CKV_SCORER_NONE)
            ckv_cli_usage_error("analyze", "--press-%c none: the analysis compares two presses that evict (the full "
                                "cache is the reference)", 'a' + p);
    }
    if (bs[0].kind == CKV_CLI_BUDGET_NONE)
        ckv_cli_usage_error("analyze", "needs a budget: --budget B[,B2...], --compression-ratio R or --budget-tokens N");
    for (int k = 0; k < a->n_budgets; k++)
        for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
            ckv_cli_press_build(o, a->spec[p], &bs[k], &a->press[k][p]);
            ckv_cli_check(ckv_press_finalize(&a->press[k][p]));
        }
    char what[300];
    snprintf(what, sizeof what, "--press-a %s and --press-b %s", a->spec[0], a->spec[1]);
    ckv_cli_press_check_options(o, a->press[0], CKV_ANALYZE_PRESSES, what);
}

/* The analyses of every budget as the layer hook of one prefill: each selects on the same full cache. */
typedef struct {
    ckv_analyzer *an;
    int n;
} analyzer_chain;

static ckv_status chain_hook(void *ctx, ckv_session *s, int layer, int n_prompt) {
    analyzer_chain *c = ctx;
    for (int i = 0; i < c->n; i++) CKV_TRY(ckv_analyze_layer_hook(&c->an[i], s, layer, n_prompt));
    return CKV_STATUS_OK;
}

/* A headkv press's kept rows per (layer, KV head) from its profile. */
static int32_t *headkv_budgets(ckv_comm *world, const ckv_model *m, const ckv_press_config *pr, int L) {
    int32_t *b = NULL;
    ckv_cli_check_comm(world, ckv_compress_headkv_budgets(pr, &m->cfg, L, &b));
    return b;
}

static int32_t *read_prompt(const analyze_args *a, int *n) {
    if (!a->prompt_file) return ckv_cli_parse_ids(a->prompt_ids, n, "--prompt-ids");
    char *text = NULL;
    ckv_cli_check(ckv_read_file(a->prompt_file, &text, NULL));
    int32_t *ids = ckv_cli_parse_ids(text, n, a->prompt_file);
    free(text);
    return ids;
}

/* One summary line per budget of the analysis (rank 0). */
static void print_summary(const analyze_args *a, int k, const ckv_analyze_summary *sum) {
    const char *bname[CKV_ANALYZE_PRESSES];
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) bname[p] = a->press[k][p].critical ? "theta" : "attention-only bound";
    if (a->n_budgets > 1) printf("\nbudget %g\n", a->budget[k]);
    printf("B perturbs less than A in %d of %d heads (%.1f%%); equal in %d\n", sum->n_b_less, sum->n_heads,
           100.0 * sum->n_b_less / (sum->n_heads ? sum->n_heads : 1), sum->n_equal);
    printf("mean ||o - o^||_1: A %.6g, B %.6g", sum->mean_perturbation[0], sum->mean_perturbation[1]);
    if (sum->mean_perturbation[0] > 0) printf(" (B/A %.4g)", sum->mean_perturbation[1] / sum->mean_perturbation[0]);
    printf("\n");
    printf("mean bound ratio (bound / perturbation):");
    for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) {
        if (sum->n_ratio[p]) printf(" %c %.4g (%s, %d heads)", 'A' + p, sum->mean_bound_ratio[p], bname[p], sum->n_ratio[p]);
        else printf(" %c n/a (%s, no head perturbed)", 'A' + p, bname[p]);
        printf(p + 1 < CKV_ANALYZE_PRESSES ? ";" : "\n");
    }
    if (sum->n_theta_ratio) printf("mean theta B / theta A: %.4g (%d heads)\n", sum->mean_theta_ratio, sum->n_theta_ratio);
    else printf("mean theta B / theta A: n/a (theta A is 0 in every head)\n");
}

static cJSON *number_array(const double *v, int n) {
    cJSON *r = cJSON_CreateArray();
    for (int i = 0; r && i < n; i++) cJSON_AddItemToArray(r, cJSON_CreateNumber(v[i])); /* NaN prints as null */
    return r;
}

/* The median of the finite values of f(head) over every head; NaN when there is none. */
static double head_median(const ckv_analyzer *an, double (*f)(const ckv_conc_stats *, int), int t, double *scratch) {
    int m = 0;
    for (int i = 0; i < an->n_layers * an->n_heads; i++) {
        double v = f(&an->heads[i].conc, t);
        if (isfinite(v)) scratch[m++] = v;
    }
    if (!m) return NAN;
    for (int i = 1; i < m; i++) /* insertion sort: a few hundred heads */
        for (int j = i; j > 0 && scratch[j - 1] > scratch[j]; j--) {
            double x = scratch[j];
            scratch[j] = scratch[j - 1], scratch[j - 1] = x;
        }
    return m % 2 ? scratch[m / 2] : 0.5 * (scratch[m / 2 - 1] + scratch[m / 2]);
}
static double conc_share(const ckv_conc_stats *c, int t) { return c->top_share[t]; }
static double conc_recall(const ckv_conc_stats *c, int t) { return c->recall[t]; }
static double conc_rho(const ckv_conc_stats *c, int t) { (void)t; return c->spearman; }
static double conc_spread(const ckv_conc_stats *c, int t) { (void)t; return c->norm_spread; }

/* Medians over heads of the concentration statistics: [share x3, recall x3, spearman, spread]. */
static void conc_medians(const ckv_analyzer *an, double med[2 * CKV_CONC_N_TOP + 2]) {
    double *scratch = malloc(sizeof(double) * (size_t)(an->n_layers * an->n_heads));
    if (!scratch) ckv_cli_die("out of memory");
    for (int t = 0; t < CKV_CONC_N_TOP; t++) {
        med[t] = head_median(an, conc_share, t, scratch);
        med[CKV_CONC_N_TOP + t] = head_median(an, conc_recall, t, scratch);
    }
    med[2 * CKV_CONC_N_TOP] = head_median(an, conc_rho, 0, scratch);
    med[2 * CKV_CONC_N_TOP + 1] = head_median(an, conc_spread, 0, scratch);
    free(scratch);
}

/* "concentration": per head, the statistics of analyze_stats.h (the full cache and press A's scores,
 * so the same at every budget: taken from the first), and their medians over heads. */
static void add_concentration(cJSON *o, const analyze_args *a, const ckv_analyzer *an) {
    cJSON *c = cJSON_AddObjectToObject(o, "concentration");
    if (!c) return;
    cJSON_AddStringToObject(c, "scores_of", a->press[0][0].spec);
    cJSON_AddItemToObject(c, "fractions", number_array(ckv_conc_fractions, CKV_CONC_N_TOP));
    double med[2 * CKV_CONC_N_TOP + 2];
    conc_medians(an, med);
    cJSON *m = cJSON_AddObjectToObject(c, "median");
    if (m) {
        cJSON_AddItemToObject(m, "top_share", number_array(med, CKV_CONC_N_TOP));
        cJSON_AddItemToObject(m, "recall", number_array(med + CKV_CONC_N_TOP, CKV_CONC_N_TOP));
        cJSON_AddNumberToObject(m, "spearman", med[2 * CKV_CONC_N_TOP]);
        cJSON_AddNumberToObject(m, "norm_spread", med[2 * CKV_CONC_N_TOP + 1]);
    }
    cJSON *heads = cJSON_AddArrayToObject(c, "heads");
    for (int i = 0; heads && i < an->n_layers * an->n_heads; i++) {
        const ckv_analyze_head *h = &an->heads[i];
        cJSON *r = cJSON_CreateObject();
        if (!r) return;
        cJSON_AddItemToArray(heads, r);
        cJSON_AddNumberToObject(r, "layer", h->layer);
        cJSON_AddNumberToObject(r, "head", h->head);
        cJSON_AddNumberToObject(r, "kv_head", h->kv_head);
        double k[CKV_CONC_N_TOP];
        for (int t = 0; t < CKV_CONC_N_TOP; t++) k[t] = h->conc.top_k[t];
        cJSON_AddItemToObject(r, "top_k", number_array(k, CKV_CONC_N_TOP));
        cJSON_AddItemToObject(r, "top_share", number_array(h->conc.top_share, CKV_CONC_N_TOP));
        cJSON_AddItemToObject(r, "recall", number_array(h->conc.recall, CKV_CONC_N_TOP));
        cJSON_AddNumberToObject(r, "spearman", h->conc.spearman);
        cJSON_AddNumberToObject(r, "norm_spread", h->conc.norm_spread);
    }
}

/* --stats-json: the summaries of every budget (Figure 6's share of heads, Table 9's bound tightness)
 * and the attention-concentration statistics. */
static ckv_status write_stats(const analyze_args *a, const ckv_analyzer *an, const ckv_analyze_summary *sums, int n_ctx,
                              int n_q) {
    cJSON *o = cJSON_CreateObject(), *rows = o ? cJSON_AddArrayToObject(o, "budgets") : NULL;
    if (!rows) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
    cJSON_AddStringToObject(o, "press_a", a->press[0][0].spec);
    cJSON_AddStringToObject(o, "press_b", a->press[0][1].spec);
    cJSON_AddNumberToObject(o, "context", n_ctx);
    cJSON_AddNumberToObject(o, "question", n_q);
    for (int k = 0; k < a->n_budgets; k++) {
        const ckv_analyze_summary *m = &sums[k];
        cJSON *r = cJSON_CreateObject();
        cJSON_AddItemToArray(rows, r);
        cJSON_AddNumberToObject(r, "budget", a->budget[k]);
        cJSON_AddStringToObject(r, "spec_a", a->press[k][0].spec);
        cJSON_AddStringToObject(r, "spec_b", a->press[k][1].spec);
        cJSON_AddNumberToObject(r, "n_heads", m->n_heads);
        cJSON_AddNumberToObject(r, "n_b_less", m->n_b_less);
        cJSON_AddNumberToObject(r, "n_equal", m->n_equal);
        cJSON_AddNumberToObject(r, "frac_b_less", m->n_heads ? (double)m->n_b_less / m->n_heads : 0.0);
        cJSON_AddNumberToObject(r, "mean_perturbation_a", m->mean_perturbation[0]);
        cJSON_AddNumberToObject(r, "mean_perturbation_b", m->mean_perturbation[1]);
        cJSON_AddNumberToObject(r, "mean_bound_ratio_a", m->mean_bound_ratio[0]);
        cJSON_AddNumberToObject(r, "mean_bound_ratio_b", m->mean_bound_ratio[1]);
        cJSON_AddNumberToObject(r, "mean_theta_ratio", m->mean_theta_ratio);
        cJSON_AddNumberToObject(r, "max_perturbation_over_theta", m->max_pert_over_theta);
    }
    add_concentration(o, a, an);
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
    FILE *f = fopen(a->stats_json, "w");
    ckv_status st = CKV_STATUS_OK;
    if (!f) st = ckv_error(CKV_STATUS_ERR_IO, "--stats-json: cannot write '%s'", a->stats_json);
    else if (fprintf(f, "%s\n", text) < 0 || fclose(f) != 0) st = ckv_error(CKV_STATUS_ERR_IO, "--stats-json: error writing '%s'", a->stats_json);
    cJSON_free(text);
    return st;
}

/* --layerwise: both presses at every budget, one prefill of the context (eval/perturb.h). */
static ckv_status write_layerwise(const analyze_args *a, ckv_engine *e, const int32_t *ctx, int n_ctx, const int32_t *q,
                                  int n_q, int rank) {
    const int nl = e->model->cfg.n_layers, n = a->n_budgets * CKV_ANALYZE_PRESSES;
    const ckv_press_config *ps[MAX_BUDGETS * CKV_ANALYZE_PRESSES];
    for (int k = 0; k < a->n_budgets; k++)
        for (int p = 0; p < CKV_ANALYZE_PRESSES; p++) ps[k * CKV_ANALYZE_PRESSES + p] = &a->press[k][p];
    double *rel = malloc(sizeof(double) * (size_t)n * (size_t)(nl + 1)), *kept = rel ? rel + (size_t)n * nl : NULL;
    if (!rel) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
    ckv_status st = ckv_perturb_layerwise(e, ctx, n_ctx, q, n_q, ps, n, rel, kept);
    FILE *f = NULL;
    if (st == CKV_STATUS_OK && rank == 0 && !(f = fopen(a->layerwise, "w")))
        st = ckv_error(CKV_STATUS_ERR_IO, "--layerwise: cannot write '%s'", a->layerwise);
    for (int i = 0; f && i < n; i++)
        for (int l = 0; l < nl; l++)
            fprintf(f, "{\"press\": \"%s\", \"budget\": %.17g, \"spec\": \"%s\", \"layer\": %d, \"kept_fraction\": %.6f, "
                    "\"rel_perturbation\": %.17g}\n", a->spec[i % CKV_ANALYZE_PRESSES], a->budget[i / CKV_ANALYZE_PRESSES],
                    ps[i]->spec, l, kept[i], rel[(size_t)i * nl + l]);
    if (f && (ferror(f) | fclose(f))) st = ckv_error(CKV_STATUS_ERR_IO, "--layerwise: error writing '%s'", a->layerwise);
    free(rel);
    return st;
}

int ckv_cmd_analyze(int argc, char **argv) {
    analyze_args a;
    ckv_opts opts;
    parse_args(&a, &opts, argc, argv);
    int n_ctx = 0, n_q = 0;
    int32_t *ctx = read_prompt(&a, &n_ctx);
    int32_t *q = a.question ? ckv_cli_parse_ids(a.question, &n_q, "--question-ids") : NULL;
    if (!q) { /* the last context token is fed again as the first decode input */
        n_q = 1;
        q = malloc(sizeof *q);
        if (!q) ckv_cli_die("out of memory");
        q[0] = ctx[n_ctx - 1];
    }
    int n = n_ctx + n_q, nb = a.n_budgets;
    int32_t *ids = malloc(sizeof *ids * (size_t)n);
    if (!ids) ckv_cli_die("out of memory");
    memcpy(ids, ctx, sizeof *ids * (size_t)n_ctx);
    memcpy(ids + n_ctx, q, sizeof *ids * (size_t)n_q);

    ckv_cli_agreement ag;
    ckv_cli_agree_init(&ag, &opts, a.model);
    ckv_cli_agree_add(&ag, CKV_AGREE_PROMPT, ids, sizeof *ids * (size_t)n);
    for (int k = 0; k < nb; k++)
        for (int p = 0; p < CKV_ANALYZE_PRESSES; p++)
            ckv_cli_agree_add(&ag, CKV_AGREE_PRESS, a.press[k][p].spec, strlen(a.press[k][p].spec));
    ckv_comm *world = ckv_cli_world(&ag, &argc, &argv);
    FILE *out = NULL;
    if (a.out && world->rank == 0 && !(out = fopen(a.out, "w")))
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--out: cannot write '%s'", a.out));
    ckv_engine_config ec;
    ckv_cli_engine_config(&opts, world, &ec);
    /* on the cpu backend the analysis is of the f32 model unless told otherwise (every matrix dequantised
     * at load, the parity reference); a device backend keeps its default (bf16 on cuda), which the
     * measurement converts to fp32 */
    if (!ckv_opt_has(&opts, CKV_OPT_WEIGHTS_DTYPE) && !strcmp(ec.backend, "cpu")) ec.weights_dtype = CKV_DTYPE_F32;
    ckv_engine eng;
    ckv_cli_check_comm(world, ckv_engine_init(&eng, &ec, world));
    ckv_model *m = eng.model;
    const ckv_model_config *c = &m->cfg;
    if (n > c->max_context)
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_RANGE,
                               "context (%d) + question (%d) tokens exceed the context window of %d tokens "
                               "(max_position_embeddings) of %s", n_ctx, n_q, c->max_context, a.model));
    ckv_analyzer *an = calloc((size_t)nb, sizeof *an);
    int32_t **budgets = calloc((size_t)nb * CKV_ANALYZE_PRESSES, sizeof *budgets);
    ckv_analyze_summary *sums = calloc((size_t)nb, sizeof *sums);
    if (!an || !budgets || !sums) ckv_cli_die("out of memory");
    for (int k = 0; k < nb; k++) {
        ckv_cli_check_comm(world, ckv_analyzer_init(&an[k], m, &a.press[k][0], &a.press[k][1], n_ctx, n_q, ec.threads));
        an[k].budget = a.budget[k] > 0 && nb > 1 ? a.budget[k] : 0.0;
        for (int p = 0; p < CKV_ANALYZE_PRESSES; p++)
            if (a.press[k][p].alloc == CKV_ALLOC_HEADKV)
                an[k].head_budgets[p] = budgets[k * CKV_ANALYZE_PRESSES + p] = headkv_budgets(world, m, &a.press[k][p], n_ctx);
    }
    /* one full-cache prefill of context + question with every budget's analysis as the layer hook */
    analyzer_chain chain = {an, nb};
    ckv_prepare_params pp = {.ids = ids, .n = n, .hook = chain_hook, .hook_ctx = &chain};
    ckv_prepared pc;
    ckv_cli_check_comm(world, ckv_engine_prepare(&eng, &pp, &pc));
    for (int k = 0; k < nb; k++) ckv_cli_check_comm(world, ckv_analyze_summarize(&an[k], &sums[k]));
    if (a.layerwise) ckv_cli_check_comm(world, write_layerwise(&a, &eng, ctx, n_ctx, q, n_q, world->rank));

    if (world->rank == 0) {
        if (out) {
            for (int k = 0; k < nb; k++) ckv_cli_check_comm(world, ckv_analyze_write_jsonl(&an[k], out, a.out));
            if (fclose(out) != 0) ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_IO, "--out: error writing '%s'", a.out));
        }
        if (a.stats_json) ckv_cli_check_comm(world, write_stats(&a, an, sums, n_ctx, n_q));
        printf("press A: %s\n", a.press[0][0].spec);
        printf("press B: %s\n", a.press[0][1].spec);
        printf("context %d tokens, question %d token%s; %d layers x %d query heads = %d heads\n", n_ctx, n_q,
               n_q == 1 ? "" : "s", c->n_layers, c->n_heads, sums[0].n_heads);
        int violations = 0;
        double max_ratio = 0;
        double med[2 * CKV_CONC_N_TOP + 2];
        conc_medians(&an[0], med);
        printf("attention concentration (medians over heads; the question's attention on the context, press A's scores):\n"
               "  its top 1%%/5%%/10%% of rows hold %.3f/%.3f/%.3f; recall of those rows in press A's top: %.3f/%.3f/%.3f;\n"
               "  Spearman(score, attention) %.3f; value-norm spread max/median ||v W_O^h||_1 %.3g\n",
               med[0], med[1], med[2], med[3], med[4], med[5], med[6], med[7]);
        for (int k = 0; k < nb; k++) {
            print_summary(&a, k, &sums[k]);
            violations += sums[k].n_bound_violations;
            if (sums[k].max_pert_over_theta > max_ratio) max_ratio = sums[k].max_pert_over_theta;
        }
        fflush(stdout);
        if (violations)
            ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_INTERNAL, "%d (head, press) pairs break perturbation <= theta <= "
                                   "attention-only bound beyond rounding (see --out)", violations));
        printf("bounds: perturbation <= theta <= attention-only bound in every head (max perturbation / theta %.4g)\n",
               max_ratio);
        fflush(stdout);
        double sel = 0, meas = 0;
        for (int k = 0; k < nb; k++) sel += an[k].select_seconds, meas += an[k].measure_seconds;
        fprintf(stderr, "ckv: analyzed %d tokens x %d budget%s in one prefill of %.3f s (selection %.3f s, measurement %.3f s)\n",
                n, nb, nb == 1 ? "" : "s", pc.sess.prefill_seconds, sel, meas);
    }
    ckv_prepared_free(&pc);
    for (int k = 0; k < nb; k++) ckv_analyzer_free(&an[k]);
    for (int k = 0; k < nb * CKV_ANALYZE_PRESSES; k++) free(budgets[k]);
    free(an);
    free(budgets);
    free(sums);
    ckv_engine_free(&eng);
    ckv_comm_free(world);
    free(ctx);
    free(q);
    free(ids);
    return 0;
}
