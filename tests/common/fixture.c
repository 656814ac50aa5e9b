/* fixture.c - the tests' shared fixture scaffolding (see fixture.h): reference and press-context
 * loading, the fixture model directories, a prefill + decode run, a press run recording the kept
 * sets, kept-set comparison and the KV cache tests' rows. Asserts nothing and prints nothing; each
 * failure is a status with a one-line message naming the file or press. Tests only. */
#define _POSIX_C_SOURCE 200809L
#include "common/fixture.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/alloc.h"
#include "core/json.h"
#include "engine/compress.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "evict/press.h"

static ckv_status read_logits(const char *path, const ckv_fixture_ref *r, float **out) {
    char *buf = NULL;
    size_t len = 0;
    ckv_status s = ckv_read_file(path, &buf, &len);
    if (s == CKV_STATUS_OK && len != (size_t)r->rows * r->vocab * 4) {
        free(buf);
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: %zu bytes, expected %d x %d floats", path, len, r->rows,
                         r->vocab);
    }
    *out = (float *)buf;
    return s;
}

/* The elements of a JSON array of numbers, at most cap of them; returns how many were stored. */
static int int_array(const ckv_json *a, int32_t *out, int cap) {
    int n = ckv_json_array_size(a);
    for (int i = 0; i < n && i < cap; i++) out[i] = (int32_t)ckv_json_number(ckv_json_array_at(a, i));
    return n < cap ? n : cap;
}

ckv_status ckv_fixture_ref_load(ckv_fixture_ref *r, const char *dir) {
    memset(r, 0, sizeof *r);
    char path[1300], path_f32[1300];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    ckv_json *j = NULL;
    CKV_TRY(ckv_json_parse_file(&j, path));
    ckv_json *p = ckv_json_get(j, "prompt_ids"), *g = ckv_json_get(j, "greedy_ids");
    r->n_prompt = ckv_json_array_size(p);
    r->n_greedy = ckv_json_array_size(g);
    int_array(p, r->prompt, CKV_FIXTURE_MAX_PROMPT);
    int_array(g, r->greedy, CKV_FIXTURE_MAX_GREEDY);
    r->n_decode = (int)ckv_json_number(ckv_json_get(j, "n_decode"));
    r->vocab = (int)ckv_json_number(ckv_json_get(j, "vocab_size"));
    r->rows = (int)ckv_json_number(ckv_json_get(j, "rows"));
    const char *dt = ckv_json_string(ckv_json_get(j, "dtype_run"));
    r->bf16 = dt && !strcmp(dt, "bfloat16");
    const char *lf = ckv_json_string(ckv_json_get(j, "logits_file"));
    const char *f32c = ckv_json_string(ckv_json_get(j, "logits_file_f32compute"));
    snprintf(path, sizeof path, "%s/%s", dir, lf ? lf : "");
    snprintf(path_f32, sizeof path_f32, "%s/%s", dir, f32c ? f32c : "");
    ckv_json_free(j);
    if (!lf || r->n_prompt < 1 || r->n_prompt > CKV_FIXTURE_MAX_PROMPT || r->rows != r->n_prompt + r->n_decode ||
        r->n_greedy != r->n_decode + 1 || r->n_greedy > CKV_FIXTURE_MAX_GREEDY)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: inconsistent reference.json", dir);
    if (r->bf16 && !f32c)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: a bf16 fixture needs logits_file_f32compute (rerun tools/oracle/regen.sh)", dir);
    CKV_TRY(read_logits(path, r, &r->logits));
    if (r->bf16) CKV_TRY(read_logits(path_f32, r, &r->logits_f32));
    return CKV_STATUS_OK;
}

void ckv_fixture_ref_free(ckv_fixture_ref *r) {
    if (!r) return;
    free(r->logits);
    free(r->logits_f32);
    r->logits = r->logits_f32 = NULL;
}

ckv_fixture_ref *ckv_fixture_ref_new(const char *dir) {
    ckv_fixture_ref *r = calloc(1, sizeof *r);
    if (!r || ckv_fixture_ref_load(r, dir) != CKV_STATUS_OK) {
        fprintf(stderr, "FAIL %s\n", r ? ckv_error_message() : "out of memory");
        ckv_fixture_ref_delete(r);
        return NULL;
    }
    return r;
}

void ckv_fixture_ref_delete(ckv_fixture_ref *r) {
    ckv_fixture_ref_free(r);
    free(r);
}

const float *ckv_fixture_ref_strict(const ckv_fixture_ref *r) { return r->logits_f32 ? r->logits_f32 : r->logits; }

ckv_status ckv_fixture_models_list(ckv_fixture_models *out, const char *fixtures) {
    out->n = 0;
    char root[1024];
    snprintf(root, sizeof root, "%s/models", fixtures);
    DIR *d = opendir(root);
    if (!d)
        return ckv_error(CKV_STATUS_ERR_IO, "fixture directory %s is missing (run tools/oracle/regen.sh)", root);
    struct dirent *e;
    while ((e = readdir(d)) && out->n < CKV_FIXTURE_MAX_MODELS) {
        char full[1300];
        struct stat sb;
        snprintf(full, sizeof full, "%s/%s", root, e->d_name);
        if (e->d_name[0] == '.' || stat(full, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue; /* MANIFEST.json etc. */
        snprintf(out->name[out->n], sizeof out->name[0], "%s", e->d_name);
        snprintf(out->dir[out->n], sizeof out->dir[0], "%s", full);
        out->n++;
    }
    closedir(d);
    return CKV_STATUS_OK;
}

ckv_status ckv_fixture_run(ckv_model *m, const ckv_fixture_ref *r, int chunk, float *logits, int32_t *greedy,
                           int *last_same) {
    const int V = r->vocab, P = r->n_prompt, D = r->n_decode;
    for (int t = 0; t <= D; t++) greedy[t] = -1;
    if (last_same) *last_same = 0;
    ckv_session s;
    CKV_TRY(ckv_session_init(&s, m, P + D, chunk, 0));
    const float *last = NULL;
    ckv_status st = ckv_session_prefill(&s, r->prompt, P, logits, &last);
    if (st == CKV_STATUS_OK && last) {
        greedy[0] = ckv_argmax(last, V);
        if (last_same) *last_same = memcmp(last, logits + (size_t)(P - 1) * V, sizeof(float) * (size_t)V) == 0;
    }
    for (int t = 0; st == CKV_STATUS_OK && t < D; t++) {
        const float *lg = NULL;
        st = ckv_session_decode(&s, r->greedy[t], &lg);
        if (st == CKV_STATUS_OK && !lg) st = ckv_error(CKV_STATUS_ERR_INTERNAL, "decode step %d returned no logits", t);
        if (st != CKV_STATUS_OK) break;
        memcpy(logits + (size_t)(P + t) * V, lg, sizeof(float) * (size_t)V);
        greedy[t + 1] = ckv_argmax(lg, V);
    }
    ckv_session_free(&s);
    return st;
}

ckv_status ckv_fixture_context_load(ckv_fixture_context *c, const char *fixtures, const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/presses/%s/context.json", fixtures, name);
    snprintf(c->model_dir, sizeof c->model_dir, "%s/models/%s", fixtures, name);
    ckv_json *cj = NULL;
    CKV_TRY(ckv_json_parse_file(&cj, path));
    c->L = int_array(ckv_json_get(cj, "context_ids"), c->ctx, CKV_FIXTURE_MAX_PROMPT);
    c->nq = int_array(ckv_json_get(cj, "question_ids"), c->q, CKV_FIXTURE_MAX_GREEDY);
    ckv_json_free(cj);
    return CKV_STATUS_OK;
}

const char *const ckv_fixture_presses[] = {
    "snapkv",        "snapkv_paper",       "pyramidkv",          "tova",   "knorm",
    "streaming_llm", "observed_attention", "expected_attention", "random", "critical:snapkv",
    "adakv:snapkv",  "critical_adakv:snapkv", "critical:knorm",  "defensivekv", "keydiff",
    "cur",           "adakv:cur",          "chunkkv:snapkv",
};
const size_t ckv_fixture_n_presses = sizeof ckv_fixture_presses / sizeof ckv_fixture_presses[0];

void ckv_fixture_kept_free(ckv_fixture_kept *k) {
    if (!k) return;
    free(k->n_keep);
    free(k->pos);
    free(k->logits);
    free(k->layer_count);
    memset(k, 0, sizeof *k);
}

/* The press run after the session exists: kept sets, then the question. */
static ckv_status press_record(ckv_session *s, const ckv_fixture_context *c, ckv_fixture_kept *out) {
    const ckv_model_config *mc = &s->model->cfg;
    const int L = c->L, nq = c->nq;
    out->n_layers = mc->n_layers, out->n_kv = s->kv.n_kv, out->L = L;
    out->n_keep = calloc((size_t)mc->n_layers * s->kv.n_kv, sizeof(int32_t));
    out->pos = calloc((size_t)mc->n_layers * s->kv.n_kv * L, sizeof(int32_t));
    out->logits = nq > 0 ? calloc((size_t)nq * mc->vocab_size, sizeof(float)) : NULL;
    float *hk = malloc(sizeof(float) * (size_t)(L + nq) * mc->head_dim); // [L + nq, d] scratch
    float *hv = malloc(sizeof(float) * (size_t)(L + nq) * mc->head_dim);
    ckv_status st = CKV_STATUS_OK;
    if (!out->n_keep || !out->pos || (nq > 0 && !out->logits) || !hk || !hv)
        st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory recording the kept sets");
    for (int l = 0; st == CKV_STATUS_OK && l < mc->n_layers; l++)
        for (int h = 0; st == CKV_STATUS_OK && h < s->kv.n_kv; h++) {
            out->n_keep[l * s->kv.n_kv + h] = s->kv.layers[l].len[h];
            st = ckv_kv_head_read(&s->kv, l, h, hk, hv, out->pos + ((size_t)l * s->kv.n_kv + h) * L);
        }
    if (st == CKV_STATUS_OK && nq > 0) st = ckv_session_prefill(s, c->q, nq, out->logits, NULL);
    free(hk);
    free(hv);
    return st;
}

unsigned long long (*ckv_fixture_layer_counter)(void);

static void count_layer(void *ctx, int layer, const ckv_selection *sel) {
    (void)sel;
    ((unsigned long long *)ctx)[layer] = ckv_fixture_layer_counter();
}

ckv_status ckv_fixture_run_press(ckv_model *m, const char *spec, ckv_dtype kv_dtype, const ckv_fixture_context *c,
                                 ckv_fixture_kept *out) {
    memset(out, 0, sizeof *out);
    ckv_press_config cfg;
    char name[256];
    const char *opts = strchr(spec, ' ');
    snprintf(name, sizeof name, "%.*s", opts ? (int)(opts - spec) : (int)strlen(spec), spec);
    CKV_TRY(ckv_press_parse(&cfg, name));
    for (const char *o = opts ? opts + 1 : NULL; o && *o;) { /* KEY=VALUE,KEY=VALUE (a list value: KEY=A,B) */
        const char *end = strchr(o, ','), *eq = strchr(o, '=');
        while (end) { /* a part without '=' continues the value before it */
            const char *next = strchr(end + 1, ','), *next_eq = strchr(end + 1, '=');
            if (next_eq && (!next || next_eq < next)) break;
            end = next;
        }
        const int n = end ? (int)(end - o) : (int)strlen(o);
        if (!eq || eq - o >= n) return ckv_error(CKV_STATUS_ERR_ARG, "fixture press '%s': '%.*s' is not KEY=VALUE", spec, n, o);
        char key[64], value[64];
        snprintf(key, sizeof key, "%.*s", (int)(eq - o), o);
        snprintf(value, sizeof value, "%.*s", n - (int)(eq - o) - 1, eq + 1);
        CKV_TRY(ckv_press_set_option(&cfg, key, value));
        o = end ? end + 1 : NULL;
    }
    CKV_TRY(ckv_press_set_compression_ratio(&cfg, 0.5));
    CKV_TRY(ckv_press_finalize(&cfg));
    static ckv_fixture_context qa; /* finch (query-aware): context + question compressed, the question fed again */
    if (cfg.scorer == CKV_SCORER_FINCH) {
        if (c->L + c->nq > CKV_FIXTURE_MAX_PROMPT) return ckv_error(CKV_STATUS_ERR_ARG, "fixture prompt too long for finch");
        qa = *c;
        memcpy(qa.ctx + c->L, c->q, sizeof(int32_t) * (size_t)c->nq);
        qa.L = c->L + c->nq;
        c = &qa;
        CKV_TRY(ckv_press_with_question(&cfg, c->nq, &cfg));
    }
    ckv_compressor cz;
    memset(&cz, 0, sizeof cz);
    cz.cfg = &cfg;
    unsigned long long *counts = NULL;
    if (ckv_fixture_layer_counter) {
        counts = calloc((size_t)m->cfg.n_layers, sizeof *counts);
        if (!counts) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
        cz.observe = count_layer;
        cz.observe_ctx = counts;
    }
    int rows = c->nq; /* after the context: the question, or kvzip's replay of the context before it */
    ckv_status st = CKV_STATUS_OK;
    if (cfg.scorer == CKV_SCORER_KVZIP) {
        rows = ckv_kvzip_replay_rows(&cfg, c->L) > rows ? ckv_kvzip_replay_rows(&cfg, c->L) : rows;
        st = ckv_alloc((void **)&cz.context_ids, sizeof(int32_t) * (size_t)c->L, "kvzip context"); /* the compressor's */
        if (st == CKV_STATUS_OK) memcpy(cz.context_ids, c->ctx, sizeof(int32_t) * (size_t)c->L);
    }
    ckv_session s;
    if (st == CKV_STATUS_OK) st = ckv_session_init_kv(&s, m, c->L + rows, 64, 1, kv_dtype);
    if (st == CKV_STATUS_OK) {
        st = ckv_session_prefill_hook(&s, c->ctx, c->L, NULL, NULL, ckv_compress_layer_hook, &cz);
        if (st == CKV_STATUS_OK) st = press_record(&s, c, out);
        ckv_session_free(&s);
    }
    ckv_compressor_release(&cz);
    out->layer_count = counts;
    if (st != CKV_STATUS_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ckv_error_message());
        ckv_fixture_kept_free(out);
        return ckv_error(st, "%s on %s with a %s cache: %s", spec, m->be->name, ckv_dtype_name(kv_dtype), msg);
    }
    return CKV_STATUS_OK;
}

ckv_fixture_kept_diff ckv_fixture_kept_compare(const ckv_fixture_kept *a, const ckv_fixture_kept *b) {
    ckv_fixture_kept_diff d = {0, 0, 0, 0};
    for (int i = 0; i < a->n_layers * a->n_kv; i++) {
        const int32_t *pa = a->pos + (size_t)i * a->L, *pb = b->pos + (size_t)i * a->L;
        const int na = a->n_keep[i], nb = b->n_keep[i];
        d.count_mismatch += na != nb;
        long common = 0;
        for (int x = 0, y = 0; x < na && y < nb;) { /* both ascending */
            if (pa[x] == pb[y]) common++, x++, y++;
            else if (pa[x] < pb[y]) x++;
            else y++;
        }
        d.pos_total += na;
        d.pos_diff += na - common;
        d.heads_diff += !(na == nb && common == na);
    }
    return d;
}

float ckv_fixture_kval(int t, int h, int j) { return (float)(t * 100 + h * 10 + j); }

void ckv_fixture_kv_rows(int n, int n_kv, int d, float *k, float *v, int32_t *pos) {
    for (int t = 0; t < n; t++) {
        pos[t] = t;
        for (int h = 0; h < n_kv; h++)
            for (int j = 0; j < d; j++) {
                k[((size_t)t * n_kv + h) * d + j] = ckv_fixture_kval(t, h, j);
                v[((size_t)t * n_kv + h) * d + j] = -ckv_fixture_kval(t, h, j);
            }
    }
}
