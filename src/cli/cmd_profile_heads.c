/* cmd_profile_heads.c - `ckv profile-heads`: the head-importance profile the headkv presses read
 * (evict/headkv.h), computed by the engine as HeadKV's detection script scores retrieval-reasoning
 * heads: seeded needle probes with their answers teacher-forced, the attention weights each query
 * head puts on the needle sentence among its top-k rows (eval/headscore.h), averaged over the probes
 * the model answers (or all of them) and over the query heads of each KV head. Writes the profile
 * (JSON) and optionally the probes (JSON lines). One process. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_agree.h"
#include "cli/cli_opts.h"
#include "comm/comm.h"
#include "core/atomic_file.h"
#include "engine/text.h"
#include "eval/headscore.h"

static const ckv_cli_command profile_cmd = {
    CKV_CMD_PROFILE_HEADS, "profile-heads", "-m PATH --out PROFILE.json [--samples N --length T --topk K --count-probes answered|all] [flags]",
    "Scores every attention head's retrieval-and-copy ability on generated needle probes (HeadKV's\n"
    "retrieval-reasoning heads) and writes the head-importance profile of the headkv presses\n"
    "(--press headkv:snapkv --profile PROFILE.json)."};

static cJSON *number_rows(const double *v, int rows, int cols) {
    cJSON *a = cJSON_CreateArray();
    for (int r = 0; a && r < rows; r++) {
        cJSON *row = cJSON_CreateArray();
        for (int c = 0; row && c < cols; c++) cJSON_AddItemToArray(row, cJSON_CreateNumber(v[(size_t)r * cols + c]));
        cJSON_AddItemToArray(a, row);
    }
    return a;
}

static void write_probe(FILE *f, int index, const ckv_headscore_probe *p) {
    fprintf(f, "{\"index\": %d, \"n\": %d, \"needle_lo\": %d, \"needle_hi\": %d, \"answer_lo\": %d, \"n_answer\": %d, \"ids\": [",
            index, p->n, p->needle_lo, p->needle_hi, p->answer_lo, p->n_answer);
    for (int i = 0; i < p->n + p->n_answer; i++) fprintf(f, i ? ", %d" : "%d", p->ids[i]);
    fprintf(f, "]}\n");
}

int ckv_cmd_profile_heads(int argc, char **argv) {
    ckv_opts opts;
    ckv_opts_parse(&opts, &profile_cmd, argc, argv);
    const char *model = ckv_opt_str(&opts, CKV_OPT_MODEL, NULL), *out_path = ckv_opt_str(&opts, CKV_OPT_OUT, NULL);
    const char *probes_path = ckv_opt_str(&opts, CKV_OPT_PROBES_OUT, NULL), *hay_path = ckv_opt_str(&opts, CKV_OPT_HAYSTACK, NULL);
    int n_probes = (int)ckv_opt_long(&opts, CKV_OPT_SAMPLES, 20), length = (int)ckv_opt_long(&opts, CKV_OPT_LENGTH, 2048);
    int topk = (int)ckv_opt_long(&opts, CKV_OPT_TOPK, 0); /* 0: the needle sentence's length */
    const int count_all = !strcmp(ckv_opt_str(&opts, CKV_OPT_COUNT_PROBES, "answered"), "all");
    uint64_t seed = (uint64_t)ckv_opt_long(&opts, CKV_OPT_SEED, 42);
    if (!model || !out_path) ckv_cli_usage_error("profile-heads", "--model and --out are required");
    if (ckv_comm_launched_by_mpi()) {
        ckv_cli_agreement ag;
        ckv_cli_agree_init(&ag, &opts, model);
        ckv_comm *w = ckv_cli_world(&ag, &argc, &argv);
        if (w->size > 1) ckv_cli_die("profile-heads runs on one rank (got %d)", w->size);
        ckv_comm_free(w);
    }
    ckv_tokenizer *tok = NULL;
    ckv_cli_check(ckv_text_open_tokenizer(&tok, model));
    ckv_haystack hay;
    ckv_cli_check(hay_path ? ckv_haystack_open_file(&hay, hay_path) : ckv_haystack_open_builtin(&hay));
    ckv_engine_config ec;
    ckv_cli_engine_config(&opts, NULL, &ec);
    ckv_engine eng;
    ckv_cli_check(ckv_engine_init(&eng, &ec, NULL));
    const ckv_model_config *c = &eng.model->cfg;
    if (length > c->max_context)
        ckv_cli_die("--length %d exceeds the model's context window of %d tokens", length, c->max_context);
    FILE *pf = NULL;
    if (probes_path && !(pf = fopen(probes_path, "w"))) ckv_cli_die("--probes-out: cannot write '%s'", probes_path);
    const int H = c->n_heads, Hkv = c->n_kv_heads, G = H / Hkv, nl = c->n_layers;
    double *q_scores = calloc((size_t)nl * H, sizeof *q_scores), *kv_scores = calloc((size_t)nl * Hkv, sizeof *kv_scores);
    if (!q_scores || !kv_scores) ckv_cli_die("out of memory");
    int n_answered = 0, n_counted = 0;
    for (int i = 0; i < n_probes; i++) {
        ckv_headscore_probe p;
        int answered = 0;
        ckv_cli_check(ckv_headscore_make_probe(tok, &hay, length, seed, i, &p));
        if (pf) write_probe(pf, i, &p);
        ckv_cli_check(ckv_headscore_probe_run(&eng, &p, topk, count_all, q_scores, &answered));
        n_answered += answered;
        n_counted += answered || count_all;
        fprintf(stderr, "ckv profile-heads: probe %d/%d (%d tokens, needle at %d): %s\n", i + 1, n_probes, p.n, p.needle_lo,
                answered ? "answered" : "not answered");
        ckv_headscore_probe_free(&p);
    }
    if (pf && fclose(pf) != 0) ckv_cli_die("--probes-out: error writing '%s'", probes_path);
    if (n_counted == 0)
        ckv_cli_die("the model answered none of the %d probes (raise --samples, shorten --length, or --count-probes all)",
                    n_probes);
    double total = 0;
    for (int l = 0; l < nl; l++)
        for (int h = 0; h < H; h++) {
            q_scores[(size_t)l * H + h] /= n_counted;
            kv_scores[(size_t)l * Hkv + h / G] += q_scores[(size_t)l * H + h] / G;
            total += q_scores[(size_t)l * H + h];
        }
    if (!(total > 0))
        ckv_cli_die("no head attended the needle among its top rows in %d probes (raise --samples or --topk)", n_counted);
    cJSON *o = cJSON_CreateObject();
    if (!o) ckv_cli_die("out of memory");
    const char *base = strrchr(model, '/');
    char source[512];
    char kdesc[32];
    if (topk > 0) snprintf(kdesc, sizeof kdesc, "top-%d", topk);
    else snprintf(kdesc, sizeof kdesc, "top-(needle length)");
    snprintf(source, sizeof source, "ckv profile-heads: %d needle probes of %d tokens (%d answered, %s counted), seed %llu, "
             "%s attention on the needle sentence (HeadKV retrieval-reasoning score)", n_probes, length, n_answered,
             count_all ? "all" : "the answered", (unsigned long long)seed, kdesc);
    cJSON_AddStringToObject(o, "format", "ckv-headkv-profile");
    cJSON_AddStringToObject(o, "model", base && base[1] ? base + 1 : model);
    cJSON_AddNumberToObject(o, "n_layers", nl);
    cJSON_AddNumberToObject(o, "n_kv_heads", Hkv);
    cJSON_AddNumberToObject(o, "n_query_heads", H);
    cJSON_AddStringToObject(o, "aggregation", "mean over each KV head's query heads of the per-query-head score");
    cJSON_AddStringToObject(o, "source", source);
    cJSON_AddNumberToObject(o, "probes", n_probes);
    cJSON_AddNumberToObject(o, "length", length);
    cJSON_AddNumberToObject(o, "topk", topk); /* 0: the needle sentence's length */
    cJSON_AddNumberToObject(o, "probes_answered", n_answered);
    cJSON_AddNumberToObject(o, "probes_counted", n_counted);
    cJSON_AddItemToObject(o, "scores", number_rows(kv_scores, nl, Hkv));
    cJSON_AddItemToObject(o, "query_head_scores", number_rows(q_scores, nl, H));
    char *text = cJSON_Print(o);
    cJSON_Delete(o);
    if (!text) ckv_cli_die("out of memory");
    size_t n = strlen(text);
    text[n] = '\n'; /* the NUL becomes the final newline (the length excludes the NUL) */
    ckv_cli_check(ckv_write_file_atomic(out_path, text, n + 1, "--out"));
    cJSON_free(text);
    printf("wrote %s: %d layers x %d KV heads from %d of %d probes (%d answered)\n", out_path, nl, Hkv, n_counted, n_probes,
           n_answered);
    free(q_scores);
    free(kv_scores);
    ckv_engine_free(&eng);
    ckv_haystack_free(&hay);
    ckv_tokenizer_free(tok);
    return 0;
}
