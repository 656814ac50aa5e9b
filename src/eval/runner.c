/* runner.c - the resumable evaluation loop (see runner.h): output-directory lock and setup check,
 * the done set read from the results files and broadcast by world rank 0, round-robin sharing of the
 * samples among data-parallel groups, prompt encoding and token broadcast inside a tensor-parallel
 * group, context prefill with the press's layer hook, greedy answers from one compressed cache per
 * context, scoring, whole-line appends, and the final merge + report. It prints nothing. */
#define _XOPEN_SOURCE 700 /* realpath */
#include "eval/runner.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "core/json.h"
#include "core/threadpool.h"
#include "core/timer.h"
#include "engine/request.h"
#include "engine/text.h"
#include "eval/report.h"
#include "eval/results.h"
#include "eval/strbuf.h"
#include "model/config.h"
#include "model/model.h"
#include "model/source.h"

typedef struct {
    const ckv_eval_job *job;
    ckv_comm *world, *tp;
    int group, n_groups, tp_size;
    ckv_engine eng;             /* the group's model (engine/request.h) */
    ckv_model *model;           /* eng.model */
    ckv_tokenizer *tok;
    int chat;                   /* prompts use the chat template */
    char template_label[64];    /* recorded in the results */
    ckv_eval_sample *data;      /* dataset samples (group leaders) */
    int n_data;
    ckv_haystack essay;
    int have_essay;
    long *fitted;               /* [n_tasks * n_lengths] fitted haystack sizes (leader), 0 = not yet */
    int n_total;                /* samples of the job */
    unsigned char *done;        /* [n_total * n_configs] */
    char results_path[PATH_MAX];
    char model_id[PATH_MAX];
} runner;

/* ---- small helpers -------------------------------------------------------------------------------- */

static void notice(const runner *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

static void notice(const runner *r, const char *fmt, ...) {
    if (r->world->rank != 0 || !r->job->on_notice) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->job->on_notice(r->job->cb_ctx, msg);
}

static ckv_status mkdir_p(const char *dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return ckv_error(CKV_STATUS_ERR_ARG, "--out: path too long");
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return ckv_error(CKV_STATUS_ERR_IO, "--out: cannot create directory %s: %s", p, strerror(errno));
            *s = '/';
        }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return ckv_error(CKV_STATUS_ERR_IO, "--out: cannot create directory %s: %s", p, strerror(errno));
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) return ckv_error(CKV_STATUS_ERR_IO, "--out: %s is not a directory", p);
    return CKV_STATUS_OK;
}

static int n_samples_of(const ckv_eval_job *j) {
    return j->data_path ? 0 : j->n_tasks * j->n_lengths * j->n_samples;
}

/* generated sample s -> (task, length, index) */
static void decode_sample(const ckv_eval_job *j, int s, int *t, int *l, int *i) {
    *i = s % j->n_samples;
    *l = (s / j->n_samples) % j->n_lengths;
    *t = s / (j->n_samples * j->n_lengths);
}

static uint64_t fnv_file(const char *path, ckv_status *st) {
    char *buf = NULL;
    size_t len = 0;
    *st = ckv_read_file(path, &buf, &len);
    if (*st != CKV_STATUS_OK) return 0;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)buf[i]) * 1099511628211ull;
    free(buf);
    return h;
}

/* ---- world rank 0: lock, setup check, done set ----------------------------------------------------- */

ckv_status ckv_eval_lock(const char *dir, int *fd_out) {
    *fd_out = -1;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) return ckv_error(CKV_STATUS_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        close(fd);
        return ckv_error(CKV_STATUS_ERR_IO, "%s is in use by another ckv eval (it holds %s); wait for it or use another --out",
                         dir, path);
    }
    *fd_out = fd;
    return CKV_STATUS_OK;
}

void ckv_eval_unlock(int fd) {
    if (fd >= 0) close(fd);
}

/* The setup that results of one directory must share; a different one is refused. */
static ckv_status identity_json(const runner *r, uint64_t data_hash, char **out) {
    const ckv_eval_job *j = r->job;
    ckv_strbuf b;
    ckv_strbuf_init(&b);
    ckv_strbuf_adds(&b, "{\"model\": ");
    ckv_strbuf_json_string(&b, r->model_id);
    if (j->data_path) {
        char abs[PATH_MAX];
        ckv_strbuf_adds(&b, ", \"data\": ");
        ckv_strbuf_json_string(&b, realpath(j->data_path, abs) ? abs : j->data_path);
        ckv_strbuf_printf(&b, ", \"data_fnv1a\": \"%016llx\"", (unsigned long long)data_hash);
    } else {
        ckv_strbuf_adds(&b, ", \"data\": \"ruler\", \"haystack\": ");
        ckv_strbuf_json_string(&b, j->haystack_file ? j->haystack_file : "builtin:devils-dictionary");
    }
    ckv_strbuf_adds(&b, ", \"template\": ");
    ckv_strbuf_json_string(&b, j->template_name ? j->template_name : "auto");
    ckv_strbuf_adds(&b, ", \"system\": ");
    ckv_strbuf_json_string(&b, j->system ? j->system : "");
    ckv_strbuf_printf(&b, ", \"max_new_tokens\": %d, \"decoding\": \"greedy\"}", j->max_new_tokens);
    return ckv_strbuf_take(&b, out, "run.json");
}

/* Compares the setup with the directory's run.json; *to_write (malloc'd) gets the setup to record
 * when the directory has none yet (written once every check passed). */
static ckv_status check_identity(const runner *r, char **to_write) {
    const ckv_eval_job *j = r->job;
    *to_write = NULL;
    ckv_status st = CKV_STATUS_OK;
    uint64_t h = j->data_path ? fnv_file(j->data_path, &st) : 0;
    CKV_TRY(st);
    char *mine = NULL;
    CKV_TRY(identity_json(r, h, &mine));
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/run.json", j->out_dir);
    if (access(path, F_OK) != 0) {
        *to_write = mine;
        return CKV_STATUS_OK;
    }
    ckv_json *old = NULL, *cur = NULL;
    st = ckv_json_parse_file(&old, path);
    if (st == CKV_STATUS_OK) st = ckv_json_parse_buffer(&cur, mine, strlen(mine), "the setup");
    static const char *const keys[] = {"model", "data", "data_fnv1a", "haystack", "template", "system", "max_new_tokens"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0] && st == CKV_STATUS_OK; k++) {
        char *a = cJSON_PrintUnformatted(ckv_json_get(old, keys[k]));
        char *b = cJSON_PrintUnformatted(ckv_json_get(cur, keys[k]));
        if ((a || b) && (!a || !b || strcmp(a, b) != 0))
            st = ckv_error(CKV_STATUS_ERR_ARG, "%s holds results of another setup: %s was %s, now %s (%s); use another --out "
                           "or remove that directory", j->out_dir, keys[k], a ? a : "(none)", b ? b : "(none)",
                           !strcmp(keys[k], "data_fnv1a") ? "the data file changed" : "see run.json");
        free(a);
        free(b);
    }
    ckv_json_free(old);
    ckv_json_free(cur);
    free(mine);
    return st;
}

static int is_part_file(const char *name) {
    size_t n = strlen(name);
    return !strncmp(name, "results.g", 9) && n > 15 && !strcmp(name + n - 6, ".jsonl");
}

/* Reads results.jsonl and every part file of dir (cutting partial last lines). */
static ckv_status read_all_results(const char *dir, ckv_eval_result **rows, int *n) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    CKV_TRY(ckv_eval_results_read(path, 1, rows, n));
    DIR *d = opendir(dir);
    if (!d) return ckv_error(CKV_STATUS_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
    struct dirent *e;
    ckv_status st = CKV_STATUS_OK;
    while (st == CKV_STATUS_OK && (e = readdir(d)) != NULL)
        if (is_part_file(e->d_name)) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            st = ckv_eval_results_read(path, 1, rows, n);
        }
    closedir(d);
    return st;
}

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The done bitmap over (sample, configuration): every question of the sample has a result. */
static ckv_status compute_done(runner *r, long *n_done) {
    const ckv_eval_job *j = r->job;
    ckv_eval_result *rows = NULL;
    int n = 0;
    CKV_TRY(read_all_results(j->out_dir, &rows, &n));
    char **keys = malloc(sizeof(char *) * (size_t)(n > 0 ? n : 1));
    ckv_status st = keys ? CKV_STATUS_OK : ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory reading results");
    int nk = 0;
    for (int i = 0; i < n && st == CKV_STATUS_OK; i++) {
        st = ckv_eval_result_key(rows[i].press_spec, rows[i].sample, rows[i].question, &keys[nk]);
        if (st == CKV_STATUS_OK) nk++;
    }
    if (st == CKV_STATUS_OK) qsort(keys, (size_t)nk, sizeof *keys, cmp_cstr);
    *n_done = 0;
    for (int s = 0; s < r->n_total && st == CKV_STATUS_OK; s++) {
        char sid[320];
        int nq = 1;
        if (j->data_path) {
            snprintf(sid, sizeof sid, "%s", r->data[s].id);
            nq = r->data[s].n_questions;
        } else {
            int t, l, i;
            decode_sample(j, s, &t, &l, &i);
            ckv_ruler_sample_id(j->tasks[t]->name, j->lengths[l], j->seed, i, sid, sizeof sid);
        }
        for (int c = 0; c < j->n_configs && st == CKV_STATUS_OK; c++) {
            int all = 1;
            for (int q = 0; q < nq && all && st == CKV_STATUS_OK; q++) {
                char *k = NULL;
                st = ckv_eval_result_key(j->configs[c].cfg.spec, sid, q, &k);
                if (st == CKV_STATUS_OK) all = bsearch(&k, keys, (size_t)nk, sizeof *keys, cmp_cstr) != NULL;
                free(k);
            }
            r->done[(size_t)s * j->n_configs + c] = (unsigned char)all;
            *n_done += all;
        }
    }
    for (int i = 0; i < nk; i++) free(keys[i]);
    free(keys);
    ckv_eval_results_free(rows, n);
    return st;
}

/* ---- prompts ---------------------------------------------------------------------------------------- */

/* Token ids of one sample as the group runs it, packed for a broadcast:
 * [n_q, n_units, unit_len[n_units], q_len[n_q], max_new[n_q], unit ids ..., question ids ...]. A unit
 * is what is prefilled and compressed: the context (one unit, context-only) or context + question
 * (one per question, query-aware). */
typedef struct {
    int32_t *v;
    int n;
    int n_q, n_units;
    const int32_t *unit_len, *q_len, *max_new;
    const int32_t **unit_ids, **q_ids; /* [n_units], [n_q] pointers into v */
} packed;

static void packed_free(packed *p) {
    free(p->v);
    free(p->unit_ids);
    free(p->q_ids);
    memset(p, 0, sizeof *p);
}

static ckv_status packed_index(packed *p) {
    if (p->n < 2) return ckv_error(CKV_STATUS_ERR_INTERNAL, "empty prompt packet");
    p->n_q = p->v[0];
    p->n_units = p->v[1];
    p->unit_len = p->v + 2;
    p->q_len = p->unit_len + p->n_units;
    p->max_new = p->q_len + p->n_q;
    p->unit_ids = malloc(sizeof(int32_t *) * (size_t)p->n_units);
    p->q_ids = malloc(sizeof(int32_t *) * (size_t)p->n_q);
    if (!p->unit_ids || !p->q_ids) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory unpacking a prompt");
    const int32_t *d = p->max_new + p->n_q;
    for (int u = 0; u < p->n_units; u++) p->unit_ids[u] = d, d += p->unit_len[u];
    for (int q = 0; q < p->n_q; q++) p->q_ids[q] = d, d += p->q_len[q];
    return CKV_STATUS_OK;
}

/* Encodes (compressed part, part fed after) the way kvpress splits them; the answer prefix follows
 * the question (plain text) or the assistant header (chat). */
static ckv_status encode_pair(const runner *r, const char *cpart, const char *qpart, const char *prefix, int32_t **a,
                              int *na, int32_t **b, int *nb) {
    const ckv_eval_job *j = r->job;
    *a = *b = NULL;
    if (!r->chat) {
        size_t l1 = strlen(qpart), l2 = strlen(prefix);
        char *q = malloc(l1 + l2 + 1);
        if (!q) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building a prompt");
        memcpy(q, qpart, l1);
        memcpy(q + l1, prefix, l2 + 1);
        ckv_status st = ckv_text_encode_split(r->tok, cpart, q, 0, NULL, NULL, a, na, b, nb);
        free(q);
        return st;
    }
    CKV_TRY(ckv_text_encode_split(r->tok, cpart, qpart, 1, j->template_name, j->system, a, na, b, nb));
    if (!*prefix) return CKV_STATUS_OK;
    int32_t *p = NULL;
    size_t np = 0;
    ckv_status st = ckv_tokenizer_encode(r->tok, prefix, strlen(prefix), CKV_TOKENIZE_UTF8_REPLACE, &p, &np);
    if (st == CKV_STATUS_OK) {
        int32_t *nbuf = realloc(*b, sizeof(int32_t) * ((size_t)*nb + np + 1));
        if (!nbuf) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building a prompt");
        else {
            memcpy(nbuf + *nb, p, sizeof(int32_t) * np);
            *b = nbuf;
            *nb += (int)np;
        }
    }
    free(p);
    if (st != CKV_STATUS_OK) {
        free(*a);
        free(*b);
        *a = *b = NULL;
    }
    return st;
}

static int query_aware_job(const ckv_eval_job *j) {
    for (int c = 0; c < j->n_configs; c++)
        if (j->configs[c].cfg.query_aware) return 1;
    return 0;
}

static char *concat2(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (s) {
        memcpy(s, a, la);
        memcpy(s + la, b, lb + 1);
    }
    return s;
}

/* Packs the prompts of sample s; query_aware selects the unit layout. */
static ckv_status build_packed(const runner *r, const ckv_eval_sample *s, int query_aware, packed *out) {
    memset(out, 0, sizeof *out);
    int nq = s->n_questions, nu = query_aware ? nq : 1;
    int32_t **ua = calloc((size_t)nu, sizeof(int32_t *)), **qb = calloc((size_t)nq, sizeof(int32_t *));
    int *una = calloc((size_t)nu, sizeof(int)), *qnb = calloc((size_t)nq, sizeof(int));
    ckv_status st = (ua && qb && una && qnb) ? CKV_STATUS_OK : ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building prompts");
    for (int q = 0; q < nq && st == CKV_STATUS_OK; q++) {
        const ckv_eval_question *Q = &s->questions[q];
        int32_t *a = NULL;
        int na = 0;
        if (query_aware) {
            char *cq = concat2(s->context, Q->question);
            if (!cq) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building prompts");
            else st = encode_pair(r, cq, "", Q->answer_prefix, &a, &na, &qb[q], &qnb[q]);
            free(cq);
            if (st == CKV_STATUS_OK) ua[q] = a, una[q] = na;
        } else {
            st = encode_pair(r, s->context, Q->question, Q->answer_prefix, &a, &na, &qb[q], &qnb[q]);
            if (st == CKV_STATUS_OK && q == 0) {
                ua[0] = a, una[0] = na;
            } else if (st == CKV_STATUS_OK) {
                if (na != una[0] || memcmp(a, ua[0], sizeof(int32_t) * (size_t)na) != 0)
                    st = ckv_error(CKV_STATUS_ERR_INTERNAL, "sample %s: the context encodes differently with question %d",
                                   s->id, q);
                free(a);
            }
        }
    }
    if (st == CKV_STATUS_OK) {
        long total = 2 + nu + 2L * nq;
        for (int u = 0; u < nu; u++) total += una[u];
        for (int q = 0; q < nq; q++) total += qnb[q];
        if (total > INT_MAX / 2) st = ckv_error(CKV_STATUS_ERR_RANGE, "sample %s: prompt too large", s->id);
        else if (!(out->v = malloc(sizeof(int32_t) * (size_t)total))) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
        if (st == CKV_STATUS_OK) {
            int32_t *v = out->v;
            int k = 0;
            v[k++] = nq;
            v[k++] = nu;
            for (int u = 0; u < nu; u++) v[k++] = una[u];
            for (int q = 0; q < nq; q++) v[k++] = qnb[q];
            for (int q = 0; q < nq; q++) {
                int mn = r->job->max_new_tokens > 0 ? r->job->max_new_tokens : s->questions[q].max_new_tokens;
                v[k++] = mn > 0 ? mn : 1;
            }
            for (int u = 0; u < nu; u++) memcpy(v + k, ua[u], sizeof(int32_t) * (size_t)una[u]), k += una[u];
            for (int q = 0; q < nq; q++) memcpy(v + k, qb[q], sizeof(int32_t) * (size_t)qnb[q]), k += qnb[q];
            out->n = k;
            st = packed_index(out);
        }
    }
    for (int u = 0; ua && u < nu; u++) free(ua[u]);
    for (int q = 0; qb && q < nq; q++) free(qb[q]);
    free(ua);
    free(qb);
    free(una);
    free(qnb);
    if (st != CKV_STATUS_OK) packed_free(out);
    return st;
}

/* Token counter for the RULER length fit: the prompt of question 0 as it will run. */
static ckv_status count_tokens(void *ctx, const ckv_eval_sample *s, long *tokens) {
    const runner *r = ctx;
    int32_t *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    const ckv_eval_question *q = &s->questions[0];
    ckv_status st;
    if (query_aware_job(r->job)) {
        char *cq = concat2(s->context, q->question);
        if (!cq) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory counting tokens");
        st = encode_pair(r, cq, "", q->answer_prefix, &a, &na, &b, &nb);
        free(cq);
    } else {
        st = encode_pair(r, s->context, q->question, q->answer_prefix, &a, &na, &b, &nb);
    }
    free(a);
    free(b);
    *tokens = (long)na + nb;
    return st;
}

/* The leader's sample s (generated or from the dataset); *owned = 1 when it must be freed. */
static ckv_status get_sample(runner *r, int s, ckv_eval_sample *tmp, const ckv_eval_sample **out) {
    const ckv_eval_job *j = r->job;
    if (j->data_path) {
        *out = &r->data[s];
        return CKV_STATUS_OK;
    }
    int t, l, i;
    decode_sample(j, s, &t, &l, &i);
    ckv_ruler_params p = {j->tasks[t], j->lengths[l], j->seed, &r->essay, j->max_new_tokens, count_tokens, r};
    long *fit = &r->fitted[t * j->n_lengths + l];
    if (j->lengths[l] > r->model->cfg.max_context)
        return ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG, "--length %d exceeds the context window of %s (%d tokens)",
                         j->lengths[l], j->model_path, r->model->cfg.max_context);
    if (*fit == 0) CKV_TRY(ckv_ruler_fit(&p, fit));
    CKV_TRY(ckv_ruler_generate(&p, i, *fit, tmp, NULL));
    *out = tmp;
    return CKV_STATUS_OK;
}

/* ---- one (sample, configuration) ------------------------------------------------------------------- */

typedef struct {
    int32_t *toks;  /* [max_new] generated ids (no stop token) */
    int n_new, stopped;
    double prefill_s, answer_s, kept;
    int unit_len;
} answer;

/* One configuration on one prompt packet: each unit (the context, or context + question when
 * query-aware) is prepared once and answers its questions greedily (engine/request.h). */
static ckv_status run_item(runner *r, const packed *pk, const ckv_eval_config *c, answer *ans) {
    ckv_status st = CKV_STATUS_OK;
    for (int u = 0; u < pk->n_units && st == CKV_STATUS_OK; u++) {
        int L = pk->unit_len[u], q0 = pk->n_units == 1 ? 0 : u, q1 = pk->n_units == 1 ? pk->n_q : u + 1;
        int max_q = 0, max_new = 1;
        for (int q = q0; q < q1; q++) {
            if (pk->q_len[q] > max_q) max_q = pk->q_len[q];
            if (pk->max_new[q] > max_new) max_new = pk->max_new[q];
        }
        ckv_prepare_params pp = {.ids = pk->unit_ids[u], .n = L, .press = &c->cfg, .reserve = max_q + max_new};
        ckv_prepared pc;
        CKV_TRY(ckv_engine_prepare(&r->eng, &pp, &pc));
        double kept = pc.stats.total_entries ? (double)pc.stats.kept_entries / (double)pc.stats.total_entries : 1.0;
        for (int q = q0; q < q1 && st == CKV_STATUS_OK; q++) {
            ckv_gen_params g = {.max_new_tokens = pk->max_new[q]};
            g.sampling.top_p = 1.0f; /* greedy */
            ckv_answer a;
            st = ckv_prepared_answer(&pc, q, pk->q_ids[q], pk->q_len[q], &g, NULL, &a);
            if (st != CKV_STATUS_OK) break;
            memcpy(ans[q].toks, a.ids, sizeof(int32_t) * (size_t)a.n);
            ans[q].n_new = a.n;
            ans[q].stopped = a.finish == CKV_FINISH_EOS;
            ans[q].answer_s = a.seconds;
            ans[q].prefill_s = pc.prepare_seconds;
            ans[q].unit_len = L;
            ans[q].kept = kept;
            ckv_answer_free(&a);
        }
        ckv_prepared_free(&pc);
    }
    return st;
}

/* The shortest %g form of v that reads back as v. */
static void shortest(double v, char *buf, size_t cap) {
    for (int prec = 15; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, v);
        if (strtod(buf, NULL) == v) return;
    }
}

/* The results lines of one (sample, configuration) (leader). */
static ckv_status result_lines(const runner *r, const ckv_eval_sample *s, int sample_index, const packed *pk,
                               const ckv_eval_config *c, const answer *ans, ckv_strbuf *b, double *mean) {
    const ckv_eval_job *j = r->job;
    *mean = 0.0;
    for (int q = 0; q < s->n_questions; q++) {
        const ckv_eval_question *Q = &s->questions[q];
        char *pred = NULL;
        size_t plen = 0;
        CKV_TRY(ckv_tokenizer_decode(r->tok, ans[q].toks, (size_t)ans[q].n_new, CKV_DETOKENIZE_SKIP_SPECIAL, &pred, &plen));
        double score = 0.0;
        ckv_status st = ckv_metric_score(s->metric, s->first_line, pred, (const char *const *)Q->answers, Q->n_answers,
                                         (const char *const *)s->all_classes, s->n_classes, &score);
        if (st != CKV_STATUS_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", ckv_error_message());
            free(pred);
            return ckv_error(st, "sample %s question %d: %s", s->id, q, msg);
        }
        *mean += score / s->n_questions;
        ckv_strbuf_printf(b, "{\"schema\": 1, \"ckv_version\": ");
        ckv_strbuf_json_string(b, j->version ? j->version : "");
        ckv_strbuf_adds(b, ", \"model\": ");
        ckv_strbuf_json_string(b, j->model_path);
        ckv_strbuf_adds(b, ", \"task\": ");
        ckv_strbuf_json_string(b, s->task);
        ckv_strbuf_printf(b, ", \"length\": %d, \"sample\": ", s->length);
        ckv_strbuf_json_string(b, s->id);
        ckv_strbuf_printf(b, ", \"sample_index\": %d, \"question\": %d", sample_index, q);
        if (Q->line) ckv_strbuf_printf(b, ", \"line\": %d", Q->line);
        if (Q->id) {
            ckv_strbuf_adds(b, ", \"id\": ");
            ckv_strbuf_json_string(b, Q->id);
        }
        if (!j->data_path) ckv_strbuf_printf(b, ", \"seed\": %llu", (unsigned long long)j->seed);
        ckv_strbuf_adds(b, ", \"press\": ");
        ckv_strbuf_json_string(b, c->press);
        ckv_strbuf_adds(b, ", \"press_spec\": ");
        ckv_strbuf_json_string(b, c->cfg.spec);
        char bs[40], ss[40];
        shortest(c->budget, bs, sizeof bs);
        shortest(score, ss, sizeof ss);
        ckv_strbuf_printf(b, ", \"budget\": %s, \"query_aware\": %s, \"template\": ", bs, c->cfg.query_aware ? "true" : "false");
        ckv_strbuf_json_string(b, r->template_label);
        ckv_strbuf_printf(b, ", \"metric\": \"%s\", \"score\": %s, \"prediction\": ", ckv_metric_name(s->metric), ss);
        ckv_strbuf_json_string(b, pred);
        ckv_strbuf_adds(b, ", \"answers\": [");
        for (int a = 0; a < Q->n_answers; a++) {
            if (a) ckv_strbuf_adds(b, ", ");
            ckv_strbuf_json_string(b, Q->answers[a]);
        }
        ckv_strbuf_printf(b, "], \"context_tokens\": %d, \"question_tokens\": %d, \"max_new_tokens\": %d, \"new_tokens\": %d, "
                          "\"stopped\": %s, \"kept_fraction\": %.6f, \"prefill_s\": %.4f, \"answer_s\": %.4f, \"dp\": %d, "
                          "\"tp\": %d}\n", ans[q].unit_len, pk->q_len[q], pk->max_new[q], ans[q].n_new,
                          ans[q].stopped ? "true" : "false", ans[q].kept, ans[q].prefill_s, ans[q].answer_s, r->n_groups,
                          r->tp_size);
        free(pred);
    }
    return ckv_strbuf_status(b, "results lines");
}

/* ---- the run ------------------------------------------------------------------------------------------ */

static ckv_status group_stop(runner *r) {
    int flag = r->job->stop && *r->job->stop ? 1 : 0;
    if (r->tp->size > 1) CKV_TRY(r->tp->ops->allreduce_i32(r->tp, &flag, 1, CKV_COMM_OP_MAX));
    return flag ? CKV_STATUS_ERR_INTERNAL : CKV_STATUS_OK; /* used as a boolean */
}

/* Opens the tokenizer and the prompt format; a leader (who builds the prompts) also the haystack. */
static ckv_status open_text(runner *r, int leader) {
    const ckv_eval_job *j = r->job;
    if (!r->tok) {
        CKV_TRY(ckv_text_open_tokenizer(&r->tok, j->model_path));
        const ckv_chat_template *own = ckv_tokenizer_chat_template(r->tok);
        if (j->template_name && !strcmp(j->template_name, "none")) {
            r->chat = 0;
        } else if (j->template_name) {
            ckv_chat_template t;
            CKV_TRY(ckv_chat_template_by_name(j->template_name, &t));
            r->chat = 1;
        } else {
            r->chat = own && own->family != CKV_CHAT_NONE;
        }
        snprintf(r->template_label, sizeof r->template_label, "%s",
                 !r->chat ? "none" : j->template_name ? j->template_name : own->name);
    }
    if (leader && !j->data_path && !r->have_essay) {
        if (j->haystack_file) CKV_TRY(ckv_haystack_open_file(&r->essay, j->haystack_file));
        else CKV_TRY(ckv_haystack_open_builtin(&r->essay));
        r->have_essay = 1;
        r->fitted = calloc((size_t)(j->n_tasks * j->n_lengths), sizeof(long));
        if (!r->fitted) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
    }
    return CKV_STATUS_OK;
}

/* The model's context window from its configuration alone (no weights). */
static ckv_status model_window(const char *path, int *window) {
    ckv_model_config c;
    size_t n = strlen(path);
    if (n > 5 && !strcmp(path + n - 5, ".gguf")) {
        ckv_weight_source src;
        CKV_TRY(ckv_source_open(&src, &c, path));
        ckv_source_close(&src);
    } else {
        CKV_TRY(ckv_config_load(&c, path));
    }
    *window = c.max_context;
    return CKV_STATUS_OK;
}

/* Before any work (world rank 0): every --length fits the model and every task can be generated at
 * every length (the haystack sizes are fitted now, so a bad pair fails before the first sample). */
static ckv_status check_tasks(runner *r) {
    const ckv_eval_job *j = r->job;
    int window = 0;
    CKV_TRY(model_window(j->model_path, &window));
    for (int l = 0; l < j->n_lengths; l++)
        if (j->lengths[l] > window)
            return ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG, "--length %d exceeds the context window of %s (%d tokens)",
                             j->lengths[l], j->model_path, window);
    CKV_TRY(open_text(r, 1));
    for (int t = 0; t < j->n_tasks; t++)
        for (int l = 0; l < j->n_lengths; l++) {
            ckv_ruler_params p = {j->tasks[t], j->lengths[l], j->seed, &r->essay, j->max_new_tokens, count_tokens, r};
            CKV_TRY(ckv_ruler_fit(&p, &r->fitted[t * j->n_lengths + l]));
        }
    return CKV_STATUS_OK;
}

/* Opens the tokenizer, the model and the samples for a group with work. */
static ckv_status open_group(runner *r) {
    const ckv_eval_job *j = r->job;
    int threads = j->threads;
    if (!threads) {
        threads = ckv_cpu_count() / (r->world->size > 0 ? r->world->size : 1);
        if (threads < 1) threads = 1;
    }
    CKV_TRY(open_text(r, r->tp->rank == 0));
    ckv_engine_config ec = {.model_path = j->model_path, .backend = j->backend, .threads = threads, .device = -1,
                            .chunk = j->chunk, .tokenizer = r->tok};
    CKV_TRY(ckv_engine_init(&r->eng, &ec, r->tp));
    r->model = r->eng.model;
    if (r->tp->rank == 0 && j->data_path && !r->data) {
        ckv_dataset_options o = j->data;
        o.warn = NULL; /* world rank 0 reported them */
        CKV_TRY(ckv_dataset_load(j->data_path, &o, &r->data, &r->n_data, NULL));
        if (r->n_data != r->n_total) return ckv_error(CKV_STATUS_ERR_IO, "%s changed while the job started", j->data_path);
    }
    return CKV_STATUS_OK;
}

static void runner_free(runner *r) {
    ckv_eval_samples_free(r->data, r->n_data);
    ckv_haystack_free(&r->essay);
    free(r->fitted);
    free(r->done);
    ckv_engine_free(&r->eng);
    ckv_tokenizer_free(r->tok);
    if (r->tp) ckv_comm_free(r->tp);
}

/* Broadcast from the group leader of an agreed status + message (so every rank fails alike). */
static ckv_status group_status(runner *r, ckv_status st, int *skip, char *msg, size_t cap) {
    int32_t hdr[2] = {st == CKV_STATUS_OK ? 0 : (*skip ? 1 : 2), (int32_t)st};
    if (r->tp->rank == 0 && st != CKV_STATUS_OK) snprintf(msg, cap, "%s", ckv_error_message());
    if (r->tp->size > 1) {
        CKV_TRY(r->tp->ops->bcast(r->tp, hdr, sizeof hdr, 0));
        if (hdr[0]) CKV_TRY(r->tp->ops->bcast(r->tp, msg, cap, 0));
    }
    *skip = hdr[0] == 1;
    if (hdr[0] == 2) return ckv_error((ckv_status)hdr[1], "%s", msg);
    return CKV_STATUS_OK;
}

ckv_status ckv_eval_run(const ckv_eval_job *job, ckv_comm *world, ckv_eval_outcome *out) {
    memset(out, 0, sizeof *out);
    runner R, *r = &R;
    memset(r, 0, sizeof R);
    r->job = job;
    r->world = world;
    int lock_fd = -1;
    ckv_status st = CKV_STATUS_OK;
    char msg[1024] = "";
    long n_done_before = 0;
    int32_t hdr[3] = {0, 0, 0};

    /* phase A: world rank 0 checks the directory and reads what is done */
    if (world->rank == 0) {
        if (!realpath(job->model_path, r->model_id)) snprintf(r->model_id, sizeof r->model_id, "%s", job->model_path);
        char *setup = NULL; /* run.json is written once every check passed */
        st = mkdir_p(job->out_dir);
        if (st == CKV_STATUS_OK) st = ckv_eval_lock(job->out_dir, &lock_fd);
        if (st == CKV_STATUS_OK) st = check_identity(r, &setup);
        if (st == CKV_STATUS_OK && !job->data_path) st = check_tasks(r);
        if (st == CKV_STATUS_OK && job->data_path) {
            int skipped = 0;
            st = ckv_dataset_load(job->data_path, &job->data, &r->data, &r->n_data, &skipped);
            if (st == CKV_STATUS_OK && skipped)
                notice(r, "%s: %d bad line(s) skipped", job->data_path, skipped);
        }
        if (st == CKV_STATUS_OK && setup) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/run.json", job->out_dir);
            st = ckv_eval_write_atomic(path, setup, strlen(setup));
        }
        free(setup);
        r->n_total = job->data_path ? r->n_data : n_samples_of(job);
        if (st == CKV_STATUS_OK) {
            r->done = calloc((size_t)r->n_total * (size_t)job->n_configs + 1, 1);
            if (!r->done) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
        }
        if (st == CKV_STATUS_OK) st = compute_done(r, &n_done_before);
        if (st != CKV_STATUS_OK) snprintf(msg, sizeof msg, "%s", ckv_error_message());
        hdr[0] = st == CKV_STATUS_OK ? 0 : (int32_t)st;
        hdr[1] = r->n_total;
    }
    if (world->size > 1) {
        st = world->ops->bcast(world, hdr, sizeof hdr, 0);
        if (st == CKV_STATUS_OK && hdr[0]) st = world->ops->bcast(world, msg, sizeof msg, 0);
        if (st != CKV_STATUS_OK) goto done;
    }
    if (hdr[0]) {
        st = ckv_error((ckv_status)hdr[0], "%s", msg);
        out->collective_error = 1;
        goto done;
    }
    r->n_total = hdr[1];
    if (world->rank != 0) {
        r->done = calloc((size_t)r->n_total * (size_t)job->n_configs + 1, 1);
        if (!r->done) {
            st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (!realpath(job->model_path, r->model_id)) snprintf(r->model_id, sizeof r->model_id, "%s", job->model_path);
    }
    if (world->size > 1) CKV_TRY_GOTO(st, world->ops->bcast(world, r->done, (size_t)r->n_total * job->n_configs, 0), done);

    /* phase B: groups */
    r->tp_size = job->tp ? job->tp : world->size;
    if (world->size % r->tp_size != 0) {
        st = ckv_error(CKV_STATUS_ERR_ARG, "--tp %d does not divide the %d ranks of the job", r->tp_size, world->size);
        out->collective_error = 1;
        goto done;
    }
    r->n_groups = world->size / r->tp_size;
    r->group = world->rank / r->tp_size;
    CKV_TRY_GOTO(st, world->ops->split(world, r->group, world->rank, &r->tp), done);
    {
        /* the samples with work left, dealt round-robin; my group's items */
        long items = (long)r->n_total * job->n_configs, my_items = 0, todo_total = 0;
        int k = 0;
        for (int s = 0; s < r->n_total; s++) {
            int left = 0;
            for (int c = 0; c < job->n_configs; c++) left += !r->done[(size_t)s * job->n_configs + c];
            if (!left) continue;
            todo_total += left;
            if (k++ % r->n_groups == r->group) my_items += left;
        }
        out->items = items;
        out->items_done_before = n_done_before;
        if (todo_total == 0) notice(r, "all %ld items are done in %s; nothing to run", items, job->out_dir);
        else if (n_done_before)
            notice(r, "resuming: %ld of %ld items done in %s, %ld to run", n_done_before, items, job->out_dir, todo_total);
        if (r->group == 0 && r->n_groups > 1 && todo_total)
            notice(r, "%d data-parallel groups of %d rank(s); progress shows group 0", r->n_groups, r->tp_size);
        if (my_items > 0) {
            st = open_group(r);
            if (st != CKV_STATUS_OK) goto done;
            if (r->group == 0) snprintf(r->results_path, sizeof r->results_path, "%s/results.jsonl", job->out_dir);
            else snprintf(r->results_path, sizeof r->results_path, "%s/results.g%d.jsonl", job->out_dir, r->group);
            long done_items = 0;
            int qa_job = query_aware_job(job);
            k = 0;
            for (int s = 0; s < r->n_total && !out->interrupted; s++) {
                int left = 0;
                for (int c = 0; c < job->n_configs; c++) left += !r->done[(size_t)s * job->n_configs + c];
                if (!left) continue;
                if (k++ % r->n_groups != r->group) continue;
                if (group_stop(r) != CKV_STATUS_OK) {
                    out->interrupted = 1;
                    break;
                }
                /* the leader builds the prompts; the group gets them */
                ckv_eval_sample tmp;
                memset(&tmp, 0, sizeof tmp);
                const ckv_eval_sample *smp = NULL;
                packed pk;
                memset(&pk, 0, sizeof pk);
                packed pk_ctx; /* context-only layout for the full cache in a query-aware job */
                memset(&pk_ctx, 0, sizeof pk_ctx);
                int skip = 0;
                ckv_status ls = CKV_STATUS_OK;
                if (r->tp->rank == 0) {
                    ls = get_sample(r, s, &tmp, &smp);
                    if (ls == CKV_STATUS_OK) ls = build_packed(r, smp, qa_job, &pk);
                    if (ls == CKV_STATUS_OK && qa_job) ls = build_packed(r, smp, 0, &pk_ctx);
                    if (ls == CKV_STATUS_OK) { /* the model's window */
                        const packed *chk[2] = {&pk, qa_job ? &pk_ctx : NULL};
                        for (int x = 0; x < 2 && ls == CKV_STATUS_OK; x++) {
                            if (!chk[x]) continue;
                            for (int q = 0; q < chk[x]->n_q && ls == CKV_STATUS_OK; q++) {
                                int u = chk[x]->n_units == 1 ? 0 : q;
                                long need = (long)chk[x]->unit_len[u] + chk[x]->q_len[q] + chk[x]->max_new[q];
                                if (need > r->model->cfg.max_context) {
                                    ls = ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG, "sample %s: context %d + question %d + max_new_tokens %d = "
                                                   "%ld tokens exceed the context window of %s (%d tokens)", smp->id,
                                                   chk[x]->unit_len[u], chk[x]->q_len[q], chk[x]->max_new[q], need,
                                                   job->model_path, r->model->cfg.max_context);
                                    skip = job->skip_bad;
                                }
                            }
                        }
                    }
                }
                st = group_status(r, ls, &skip, msg, sizeof msg);
                if (st != CKV_STATUS_OK) {
                    ckv_eval_sample_free(&tmp);
                    packed_free(&pk);
                    packed_free(&pk_ctx);
                    goto done;
                }
                /* broadcast the token packets */
                for (int x = 0; x < (qa_job ? 2 : 1) && !skip && r->tp->size > 1; x++) {
                    packed *p = x ? &pk_ctx : &pk;
                    int32_t n = p->n;
                    st = r->tp->ops->bcast(r->tp, &n, sizeof n, 0);
                    if (st == CKV_STATUS_OK && r->tp->rank != 0) {
                        p->v = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
                        p->n = n;
                        if (!p->v) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory receiving a prompt");
                    }
                    if (st == CKV_STATUS_OK) st = r->tp->ops->bcast(r->tp, p->v, sizeof(int32_t) * (size_t)n, 0);
                    if (st == CKV_STATUS_OK && r->tp->rank != 0) st = packed_index(p);
                    if (st != CKV_STATUS_OK) {
                        ckv_eval_sample_free(&tmp);
                        packed_free(&pk);
                        packed_free(&pk_ctx);
                        goto done;
                    }
                }
                answer *ans = NULL;
                int32_t *tokbuf = NULL;
                if (!skip) {
                    int maxn = 1;
                    for (int q = 0; q < pk.n_q; q++) maxn = pk.max_new[q] > maxn ? pk.max_new[q] : maxn;
                    ans = calloc((size_t)pk.n_q, sizeof *ans);
                    tokbuf = malloc(sizeof(int32_t) * (size_t)maxn * (size_t)pk.n_q);
                    if (!ans || !tokbuf) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
                    for (int q = 0; ans && tokbuf && q < pk.n_q; q++) ans[q].toks = tokbuf + (size_t)q * maxn;
                }
                for (int c = 0; c < job->n_configs && st == CKV_STATUS_OK; c++) {
                    if (r->done[(size_t)s * job->n_configs + c]) continue;
                    const ckv_eval_config *cf = &job->configs[c];
                    double t0 = ckv_time_now();
                    ckv_eval_event ev = {0};
                    ev.group = r->group;
                    ev.n_groups = r->n_groups;
                    ev.press = cf->press;
                    ev.budget = cf->budget;
                    if (skip) {
                        ev.skipped = msg;
                        out->items_skipped++;
                    } else {
                        const packed *p = cf->cfg.query_aware || !qa_job ? &pk : &pk_ctx;
                        ckv_status is = run_item(r, p, cf, ans);
                        if (is == CKV_STATUS_ERR_CONTEXT_TOO_LONG && job->skip_bad) { /* does not fit the model */
                            snprintf(msg, sizeof msg, "%s", ckv_error_message());
                            ev.skipped = msg;
                            out->items_skipped++;
                        } else if (is != CKV_STATUS_OK) {
                            st = is;
                            break;
                        } else if (r->tp->rank == 0) {
                            ckv_strbuf lines;
                            ckv_strbuf_init(&lines);
                            double mean = 0.0;
                            st = result_lines(r, smp, smp->length ? (int)(s % job->n_samples) : s, p, cf, ans, &lines, &mean);
                            if (st == CKV_STATUS_OK) st = ckv_eval_append(r->results_path, lines.s, lines.len);
                            ckv_strbuf_free(&lines);
                            ev.score = mean;
                        }
                        out->items_run++;
                    }
                    done_items++;
                    if (world->rank == 0 && job->on_event && st == CKV_STATUS_OK) {
                        ev.done = done_items;
                        ev.total = my_items;
                        ev.task = r->tp->rank == 0 && smp ? smp->task : "";
                        ev.sample = r->tp->rank == 0 && smp ? smp->id : "";
                        ev.n_questions = r->tp->rank == 0 && smp ? smp->n_questions : 0;
                        ev.seconds = ckv_time_now() - t0;
                        job->on_event(job->cb_ctx, &ev);
                    }
                    if (c + 1 < job->n_configs && group_stop(r) != CKV_STATUS_OK) {
                        out->interrupted = 1;
                        break;
                    }
                }
                free(ans);
                free(tokbuf);
                ckv_eval_sample_free(&tmp);
                packed_free(&pk);
                packed_free(&pk_ctx);
                if (st != CKV_STATUS_OK) goto done;
            }
        }
    }
    /* every group is done (or stopped): merge and report */
    if (world->size > 1) { /* the job's totals: each group counted once (by its first rank) */
        int lead = !r->tp || r->tp->rank == 0;
        int v[3] = {out->interrupted, lead ? (int)out->items_run : 0, lead ? (int)out->items_skipped : 0};
        CKV_TRY_GOTO(st, world->ops->allreduce_i32(world, v, 3, CKV_COMM_OP_SUM), done);
        out->interrupted = v[0] > 0;
        out->items_run = v[1];
        out->items_skipped = v[2];
    }
    if (world->rank == 0) {
        char title[PATH_MAX + 64];
        const char *base = strrchr(job->model_path, '/');
        snprintf(title, sizeof title, "ckv eval: %s", base && base[1] ? base + 1 : job->model_path);
        st = ckv_eval_finish(job->out_dir, title, &out->table, NULL);
    }
done:
    ckv_eval_unlock(lock_fd);
    runner_free(r);
    return st;
}

ckv_status ckv_eval_finish(const char *out_dir, const char *title, char **table, int *n_results) {
    if (table) *table = NULL;
    ckv_eval_result *rows = NULL;
    int n = 0;
    ckv_status st = read_all_results(out_dir, &rows, &n);
    if (n_results) *n_results = n;
    if (st == CKV_STATUS_OK && n_results && n == 0) return CKV_STATUS_OK; /* nothing to report: write nothing */
    if (st == CKV_STATUS_OK) ckv_eval_results_sort_unique(rows, &n);
    ckv_strbuf b;
    ckv_strbuf_init(&b);
    for (int i = 0; i < n && st == CKV_STATUS_OK; i++) {
        ckv_strbuf_adds(&b, rows[i].line);
        ckv_strbuf_addc(&b, '\n');
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/results.jsonl", out_dir);
    if (st == CKV_STATUS_OK) st = ckv_strbuf_status(&b, "results.jsonl");
    if (st == CKV_STATUS_OK) st = ckv_eval_write_atomic(path, b.s ? b.s : "", b.len);
    ckv_strbuf_free(&b);
    if (st == CKV_STATUS_OK) { /* the parts are in results.jsonl now */
        DIR *d = opendir(out_dir);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL)
            if (is_part_file(e->d_name)) {
                snprintf(path, sizeof path, "%s/%s", out_dir, e->d_name);
                unlink(path);
            }
        if (d) closedir(d);
    }
    if (st == CKV_STATUS_OK) st = ckv_eval_report_write(out_dir, rows, n, title, table);
    ckv_eval_results_free(rows, n);
    return st;
}
