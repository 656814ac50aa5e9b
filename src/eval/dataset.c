/* dataset.c - the JSONL sample reader: line splitting with line numbers, field validation with
 * messages naming file:line and the field, skip-or-stop on bad lines, and grouping of the lines that
 * share a task and a context into one multi-question sample. It does not tokenise. */
#include "eval/dataset.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

#define DEFAULT_MAX_NEW 128

typedef struct {
    const char *path, *base; /* base: file name for messages and ids */
    int line;
} where;

/* Reads a string or an array of strings into a malloc'd array of borrowed pointers. */
static ckv_status string_list(const ckv_json *j, const where *w, const char *field, const char ***out, int *n) {
    *out = NULL;
    *n = 0;
    if (ckv_json_is_string(j)) {
        const char **v = malloc(sizeof *v);
        if (!v) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory reading %s:%d", w->base, w->line);
        v[0] = ckv_json_string(j);
        *out = v;
        *n = 1;
        return CKV_STATUS_OK;
    }
    if (!ckv_json_is_array(j))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: \"%s\" must be a string or an array of strings", w->base, w->line, field);
    int k = ckv_json_array_size(j);
    const char **v = malloc(sizeof *v * (size_t)(k > 0 ? k : 1));
    if (!v) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory reading %s:%d", w->base, w->line);
    for (int i = 0; i < k; i++) {
        const ckv_json *e = ckv_json_array_at(j, i);
        if (ckv_json_is_number(e)) { /* numbers as answers: keep their JSON text */
            free(v);
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: \"%s\"[%d] is a number; write it as a string", w->base, w->line,
                             field, i);
        }
        if (!ckv_json_is_string(e)) {
            free(v);
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: \"%s\"[%d] is not a string", w->base, w->line, field, i);
        }
        v[i] = ckv_json_string(e);
    }
    *out = v;
    *n = k;
    return CKV_STATUS_OK;
}

/* The answers field of an object: "answers", "answer" or "outputs". */
static const ckv_json *answers_field(const ckv_json *o, const char **name) {
    static const char *const names[] = {"answers", "answer", "outputs"};
    for (int i = 0; i < 3; i++) {
        const ckv_json *a = ckv_json_get(o, names[i]);
        if (a && !ckv_json_is_null(a)) {
            *name = names[i];
            return a;
        }
    }
    *name = "answers";
    return NULL;
}

static ckv_status read_int(const ckv_json *o, const char *key, const where *w, int lo, int hi, int *out) {
    const ckv_json *j = ckv_json_get(o, key);
    if (!j || ckv_json_is_null(j)) return CKV_STATUS_OK;
    double v = ckv_json_is_number(j) ? ckv_json_number(j) : -1e300;
    if (!(v >= lo && v <= hi) || v != (double)(long)v)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: \"%s\" must be an integer in [%d, %d]", w->base, w->line, key, lo, hi);
    *out = (int)v;
    return CKV_STATUS_OK;
}

static ckv_status read_str(const ckv_json *o, const char *key, const where *w, const char **out) {
    const ckv_json *j = ckv_json_get(o, key);
    if (!j || ckv_json_is_null(j)) return CKV_STATUS_OK;
    if (!ckv_json_is_string(j)) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: \"%s\" must be a string", w->base, w->line, key);
    *out = ckv_json_string(j);
    return CKV_STATUS_OK;
}

/* One question with its answers and options, appended to s. */
static ckv_status add_question(ckv_eval_sample *s, const ckv_json *answers, const char *answers_name, const char *question,
                               const char *prefix, int max_new, const char *id, const where *w) {
    if (!answers)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: the sample has no answers (\"answers\", \"answer\" or \"outputs\"): "
                         "it cannot be scored", w->base, w->line);
    const char **a = NULL;
    int na = 0;
    CKV_TRY(string_list(answers, w, answers_name, &a, &na));
    ckv_status st = na == 0 ? ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: \"%s\" is empty: the sample cannot be scored", w->base,
                                        w->line, answers_name)
                            : ckv_eval_sample_add_question(s, question, prefix, a, na, max_new, w->line, id);
    free(a);
    return st;
}

/* Parses one line into a fresh sample (one or more questions). */
static ckv_status parse_line(const char *text, size_t len, const where *w, const ckv_dataset_options *o,
                             ckv_eval_sample *s) {
    memset(s, 0, sizeof *s);
    /* a NUL (raw or \u0000) would silently cut the context or question short */
    const char *nul = memchr(text, '\0', len);
    if (nul)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: NUL byte at byte %zu of the line", w->base, w->line,
                         (size_t)(nul - text) + 1);
    char what[200];
    snprintf(what, sizeof what, "%s:%d", w->base, w->line);
    CKV_TRY(ckv_json_check_no_nul(text, len, what));
    const char *end = NULL;
    cJSON *j = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!j) {
        size_t off = end ? (size_t)(end - text) : 0;
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: malformed JSON near byte %zu of the line", w->base, w->line, off + 1);
    }
    ckv_status st = CKV_STATUS_OK;
    for (const char *p = end; p && p < text + len; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r') {
            st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: malformed JSON: text after the object (byte %zu)", w->base, w->line,
                           (size_t)(p - text) + 1);
            goto out;
        }
    if (!ckv_json_is_object(j)) {
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: expected a JSON object", w->base, w->line);
        goto out;
    }
    const ckv_json *ctx = ckv_json_get(j, "context");
    if (!ckv_json_is_string(ctx)) {
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: %s \"context\"", w->base, w->line, ctx ? "a string is needed for" : "no");
        goto out;
    }
    const char *task = NULL, *metric = NULL, *prefix = "", *question = NULL, *id = NULL;
    char idbuf[64];
    int max_new = o->max_new_tokens > 0 ? o->max_new_tokens : DEFAULT_MAX_NEW;
    CKV_TRY_GOTO(st, read_str(j, "task", w, &task), out);
    CKV_TRY_GOTO(st, read_str(j, "metric", w, &metric), out);
    CKV_TRY_GOTO(st, read_str(j, "answer_prefix", w, &prefix), out);
    CKV_TRY_GOTO(st, read_str(j, "question", w, &question), out);
    if (!question) CKV_TRY_GOTO(st, read_str(j, "input", w, &question), out);
    CKV_TRY_GOTO(st, read_int(j, "max_new_tokens", w, 1, 1 << 20, &max_new), out);
    const ckv_json *jid = ckv_json_get(j, "_id");
    if (!jid) jid = ckv_json_get(j, "id");
    if (ckv_json_is_string(jid)) id = ckv_json_string(jid);
    else if (ckv_json_is_number(jid)) snprintf(idbuf, sizeof idbuf, "%.17g", ckv_json_number(jid)), id = idbuf;

    /* task and metric */
    char stem[128];
    if (!task) {
        snprintf(stem, sizeof stem, "%s", w->base);
        char *dot = strstr(stem, ".jsonl");
        if (dot) *dot = '\0';
        task = stem;
    }
    if (o->metric) metric = o->metric;
    if (metric) {
        CKV_TRY_GOTO(st, ckv_metric_by_name(metric, &s->metric), bad_metric);
        int fl = 0;
        ckv_metric_kind dummy;
        if (ckv_metric_for_task(task, &dummy, &fl) == CKV_STATUS_OK) s->first_line = fl;
    } else {
        CKV_TRY_GOTO(st, ckv_metric_for_task(task, &s->metric, &s->first_line), bad_metric);
    }
    CKV_TRY_GOTO(st, ckv_eval_strdup(task, &s->task, "a task name"), out);
    CKV_TRY_GOTO(st, ckv_eval_strdup(ckv_json_string(ctx), &s->context, "a context"), out);
    {
        char sid[300];
        snprintf(sid, sizeof sid, "%s:%d", w->base, w->line);
        CKV_TRY_GOTO(st, ckv_eval_strdup(sid, &s->id, "a sample id"), out);
    }
    const ckv_json *classes = ckv_json_get(j, "all_classes");
    if (classes && !ckv_json_is_null(classes)) {
        const char **c = NULL;
        int nc = 0;
        CKV_TRY_GOTO(st, string_list(classes, w, "all_classes", &c, &nc), out);
        s->all_classes = calloc((size_t)(nc > 0 ? nc : 1), sizeof(char *));
        if (!s->all_classes) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory reading %s:%d", w->base, w->line);
        for (int i = 0; i < nc && st == CKV_STATUS_OK; i++) {
            st = ckv_eval_strdup(c[i], &s->all_classes[i], "a class");
            if (st == CKV_STATUS_OK) s->n_classes = i + 1;
        }
        free(c);
        if (st != CKV_STATUS_OK) goto out;
    }
    if (s->metric == CKV_METRIC_CLASSIFICATION && s->n_classes == 0) {
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: task '%s' is scored by classification and needs \"all_classes\"",
                       w->base, w->line, task);
        goto out;
    }

    const char *aname = NULL;
    const ckv_json *answers = answers_field(j, &aname);
    const ckv_json *qs = ckv_json_get(j, "questions");
    if (qs && !ckv_json_is_null(qs) && question) {
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: both \"questions\" and \"%s\" are given; use one", w->base, w->line,
                       ckv_json_get(j, "question") ? "question" : "input");
        goto out;
    }
    if (qs && !ckv_json_is_null(qs)) {
        if (!ckv_json_is_array(qs) || ckv_json_array_size(qs) == 0) {
            st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: \"questions\" must be a non-empty array", w->base, w->line);
            goto out;
        }
        int nq = ckv_json_array_size(qs);
        for (int i = 0; i < nq && st == CKV_STATUS_OK; i++) {
            const ckv_json *q = ckv_json_array_at(qs, i);
            if (ckv_json_is_string(q)) { /* answers: one list per question */
                if (!ckv_json_is_array(answers) || ckv_json_array_size(answers) != nq) {
                    st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: with \"questions\" as strings, \"%s\" must be an array of %d "
                                   "answer lists", w->base, w->line, aname ? aname : "answers", nq);
                    break;
                }
                st = add_question(s, ckv_json_array_at(answers, i), aname, ckv_json_string(q), prefix, max_new, id, w);
            } else if (ckv_json_is_object(q)) {
                const char *qt = NULL, *qp = prefix, *qid = id, *qan = NULL;
                int qmax = max_new;
                CKV_TRY_GOTO(st, read_str(q, "question", w, &qt), out);
                CKV_TRY_GOTO(st, read_str(q, "answer_prefix", w, &qp), out);
                CKV_TRY_GOTO(st, read_str(q, "id", w, &qid), out);
                CKV_TRY_GOTO(st, read_int(q, "max_new_tokens", w, 1, 1 << 20, &qmax), out);
                if (!qt) {
                    st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: \"questions\"[%d] has no \"question\"", w->base, w->line, i);
                    break;
                }
                st = add_question(s, answers_field(q, &qan), qan, qt, qp, qmax, qid, w);
            } else {
                st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: \"questions\"[%d] must be a string or an object", w->base,
                               w->line, i);
            }
        }
    } else {
        st = add_question(s, answers, aname, question ? question : "", prefix, max_new, id, w);
    }
    goto out;
bad_metric:
    { /* name the line in the metric's message */
        char msg[512];
        snprintf(msg, sizeof msg, "%s", ckv_error_message());
        st = ckv_error(st, "%s:%d: %s", w->base, w->line, msg);
    }
out:
    cJSON_Delete(j);
    if (st != CKV_STATUS_OK) ckv_eval_sample_free(s);
    return st;
}

static uint64_t hash2(const char *a, const char *b) {
    uint64_t h = 1469598103934665603ull;
    for (; *a; a++) h = (h ^ (unsigned char)*a) * 1099511628211ull;
    h = (h ^ 0xFF) * 1099511628211ull;
    for (; *b; b++) h = (h ^ (unsigned char)*b) * 1099511628211ull;
    return h;
}

/* Moves the questions of `src` (same task and context) to the end of `dst`. */
static ckv_status merge_into(ckv_eval_sample *dst, ckv_eval_sample *src) {
    ckv_eval_question *q = realloc(dst->questions, sizeof *q * (size_t)(dst->n_questions + src->n_questions));
    if (!q) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory grouping questions");
    dst->questions = q;
    memcpy(q + dst->n_questions, src->questions, sizeof *q * (size_t)src->n_questions);
    dst->n_questions += src->n_questions;
    free(src->questions);
    src->questions = NULL;
    src->n_questions = 0;
    ckv_eval_sample_free(src);
    return CKV_STATUS_OK;
}

ckv_status ckv_dataset_load(const char *path, const ckv_dataset_options *o, ckv_eval_sample **samples, int *n,
                            int *n_skipped) {
    *samples = NULL;
    *n = 0;
    if (n_skipped) *n_skipped = 0;
    char *buf = NULL;
    size_t len = 0;
    CKV_TRY(ckv_read_file(path, &buf, &len));
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    where w = {path, base, 0};
    size_t lines = 1;
    for (size_t i = 0; i < len; i++) lines += buf[i] == '\n';
    ckv_eval_sample *v = calloc(lines, sizeof *v);
    size_t tcap = 1;
    while (tcap < 2 * lines) tcap *= 2;
    int *table = malloc(sizeof(int) * tcap); /* context hash -> sample index + 1 */
    uint64_t *hashes = malloc(sizeof(uint64_t) * lines);
    ckv_status st = CKV_STATUS_OK;
    int cnt = 0, skipped = 0;
    if (!v || !table || !hashes) {
        st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory reading %s", path);
        goto out;
    }
    memset(table, 0, sizeof(int) * tcap);
    size_t p = 0;
    while (p < len && st == CKV_STATUS_OK) {
        size_t e = p;
        while (e < len && buf[e] != '\n') e++;
        w.line++;
        size_t q = p;
        while (q < e && (buf[q] == ' ' || buf[q] == '\t' || buf[q] == '\r')) q++;
        if (q < e) {
            ckv_eval_sample s;
            ckv_status ls = parse_line(buf + p, e - p, &w, o, &s);
            if (ls == CKV_STATUS_OK) {
                uint64_t h = hash2(s.task, s.context);
                size_t slot = (size_t)h & (tcap - 1);
                int found = -1;
                while (table[slot]) {
                    int k = table[slot] - 1;
                    if (hashes[k] == h && !strcmp(v[k].task, s.task) && !strcmp(v[k].context, s.context)) {
                        found = k;
                        break;
                    }
                    slot = (slot + 1) & (tcap - 1);
                }
                if (found >= 0) {
                    if (v[found].metric != s.metric) {
                        ls = ckv_error(CKV_STATUS_ERR_FORMAT, "%s:%d: the same context as line %d with another metric (%s, "
                                       "not %s)", base, w.line, v[found].questions[0].line, ckv_metric_name(s.metric),
                                       ckv_metric_name(v[found].metric));
                        ckv_eval_sample_free(&s);
                    } else {
                        st = merge_into(&v[found], &s);
                    }
                } else {
                    hashes[cnt] = h;
                    table[slot] = cnt + 1;
                    v[cnt++] = s;
                }
            }
            if (ls != CKV_STATUS_OK && ls != CKV_STATUS_ERR_NOMEM && o->skip_bad) {
                if (o->warn) {
                    char msg[600];
                    snprintf(msg, sizeof msg, "skipping %s", ckv_error_message());
                    o->warn(o->warn_ctx, msg);
                }
                skipped++;
            } else if (ls != CKV_STATUS_OK) {
                st = ls;
            }
        }
        p = e + 1;
    }
    if (st == CKV_STATUS_OK && cnt == 0)
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: no usable sample (%d line(s) skipped)", path, skipped);
out:
    free(buf);
    free(table);
    free(hashes);
    if (st != CKV_STATUS_OK) {
        ckv_eval_samples_free(v, cnt);
        return st;
    }
    *samples = v;
    *n = cnt;
    if (n_skipped) *n_skipped = skipped;
    return CKV_STATUS_OK;
}
