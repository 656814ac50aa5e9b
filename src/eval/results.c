/* results.c - results JSONL files: whole-line appends with fsync, tolerant reading (a partial last
 * line from a killed run is cut off), sorting with de-duplication, atomic whole-file writes. */
#define _POSIX_C_SOURCE 200809L
#include "eval/results.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/json.h"
#include "eval/sample.h"

void ckv_eval_results_free(ckv_eval_result *r, int n) {
    if (!r) return;
    for (int i = 0; i < n; i++) {
        free(r[i].line);
        free(r[i].task);
        free(r[i].press);
        free(r[i].press_spec);
        free(r[i].sample);
    }
    free(r);
}

ckv_status ckv_eval_result_key(const char *press_spec, const char *sample, int question, char **out) {
    size_t n = strlen(press_spec) + strlen(sample) + 32;
    *out = malloc(n);
    if (!*out) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building a result key");
    snprintf(*out, n, "%s\x1f%s\x1f%d", press_spec, sample, question);
    return CKV_STATUS_OK;
}

static ckv_status parse_row(const char *path, int line_no, const char *text, size_t len, ckv_eval_result *r) {
    memset(r, 0, sizeof *r);
    char what[300];
    snprintf(what, sizeof what, "%s:%d", path, line_no);
    ckv_json *j = NULL;
    CKV_TRY(ckv_json_parse_buffer(&j, text, len, what));
    ckv_status st = CKV_STATUS_OK;
    const char *task = ckv_json_string(ckv_json_get(j, "task")), *press = ckv_json_string(ckv_json_get(j, "press"));
    const char *spec = ckv_json_string(ckv_json_get(j, "press_spec")), *sample = ckv_json_string(ckv_json_get(j, "sample"));
    const ckv_json *budget = ckv_json_get(j, "budget"), *score = ckv_json_get(j, "score"), *q = ckv_json_get(j, "question");
    if (!task || !press || !spec || !sample || !ckv_json_is_number(budget) || !ckv_json_is_number(score) ||
        !ckv_json_is_number(q)) {
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: not a ckv eval result (needs task, press, press_spec, sample, question, "
                       "budget, score)", what);
        goto out;
    }
    r->budget = ckv_json_number(budget);
    r->score = ckv_json_number(score);
    r->question = (int)ckv_json_number(q);
    r->length = ckv_json_is_number(ckv_json_get(j, "length")) ? (int)ckv_json_number(ckv_json_get(j, "length")) : 0;
    r->sample_index = ckv_json_is_number(ckv_json_get(j, "sample_index")) ? (int)ckv_json_number(ckv_json_get(j, "sample_index")) : 0;
    r->source_line = line_no;
    r->line = malloc(len + 1);
    if (!r->line) {
        st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory reading %s", what);
        goto out;
    }
    memcpy(r->line, text, len);
    r->line[len] = '\0';
    CKV_TRY_GOTO(st, ckv_eval_strdup(task, &r->task, "a task"), out);
    CKV_TRY_GOTO(st, ckv_eval_strdup(press, &r->press, "a press"), out);
    CKV_TRY_GOTO(st, ckv_eval_strdup(spec, &r->press_spec, "a press spec"), out);
    CKV_TRY_GOTO(st, ckv_eval_strdup(sample, &r->sample, "a sample id"), out);
out:
    ckv_json_free(j);
    if (st != CKV_STATUS_OK) {
        free(r->line);
        free(r->task);
        free(r->press);
        free(r->press_spec);
        free(r->sample);
        memset(r, 0, sizeof *r);
    }
    return st;
}

ckv_status ckv_eval_results_read(const char *path, int repair, ckv_eval_result **rows, int *n) {
    if (access(path, F_OK) != 0) return CKV_STATUS_OK;
    char *buf = NULL;
    size_t len = 0;
    CKV_TRY(ckv_read_file(path, &buf, &len));
    size_t complete = len;
    while (complete > 0 && buf[complete - 1] != '\n') complete--;
    if (complete < len && repair) { /* a line cut by a kill: drop it so appends start on a fresh line */
        if (truncate(path, (off_t)complete) != 0) {
            free(buf);
            return ckv_error(CKV_STATUS_ERR_IO, "cannot cut the partial last line of %s: %s", path, strerror(errno));
        }
    }
    size_t lines = 0;
    for (size_t i = 0; i < complete; i++) lines += buf[i] == '\n';
    ckv_eval_result *v = realloc(*rows, sizeof *v * (size_t)(*n + (int)lines + 1));
    if (!v) {
        free(buf);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory reading %s", path);
    }
    *rows = v;
    ckv_status st = CKV_STATUS_OK;
    size_t p = 0;
    int line_no = 0;
    while (p < complete && st == CKV_STATUS_OK) {
        size_t e = p;
        while (buf[e] != '\n') e++;
        line_no++;
        size_t q = p;
        while (q < e && (buf[q] == ' ' || buf[q] == '\r')) q++;
        if (q < e) {
            st = parse_row(path, line_no, buf + p, e - p, &v[*n]);
            if (st == CKV_STATUS_OK) (*n)++;
        }
        p = e + 1;
    }
    free(buf);
    return st;
}

static int cmp_row(const void *x, const void *y) {
    const ckv_eval_result *a = x, *b = y;
    int an = !strcmp(a->press, "none"), bn = !strcmp(b->press, "none");
    if (an != bn) return bn - an; /* the full cache first */
    int c = strcmp(a->press, b->press);
    if (c) return c;
    if (a->budget != b->budget) return a->budget < b->budget ? -1 : 1;
    c = strcmp(a->press_spec, b->press_spec);
    if (c) return c;
    c = strcmp(a->task, b->task);
    if (c) return c;
    if (a->length != b->length) return a->length < b->length ? -1 : 1;
    if (a->sample_index != b->sample_index) return a->sample_index < b->sample_index ? -1 : 1;
    c = strcmp(a->sample, b->sample);
    if (c) return c;
    if (a->question != b->question) return a->question < b->question ? -1 : 1;
    return a->source_line < b->source_line ? -1 : a->source_line > b->source_line; /* the earlier copy first */
}

void ckv_eval_results_sort_unique(ckv_eval_result *rows, int *n) {
    if (*n <= 1) return;
    qsort(rows, (size_t)*n, sizeof *rows, cmp_row);
    int m = 1;
    for (int i = 1; i < *n; i++) {
        ckv_eval_result *p = &rows[m - 1], *r = &rows[i];
        if (!strcmp(p->press_spec, r->press_spec) && !strcmp(p->sample, r->sample) && p->question == r->question) {
            free(r->line);
            free(r->task);
            free(r->press);
            free(r->press_spec);
            free(r->sample);
            continue;
        }
        rows[m++] = *r;
    }
    *n = m;
}

static ckv_status write_all(int fd, const char *data, size_t len, const char *path) {
    while (len > 0) {
        ssize_t w = write(fd, data, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return ckv_error(CKV_STATUS_ERR_IO, "error writing %s: %s", path, w < 0 ? strerror(errno) : "short write");
        data += w;
        len -= (size_t)w;
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_eval_append(const char *path, const char *data, size_t len) {
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0) return ckv_error(CKV_STATUS_ERR_IO, "cannot open %s for appending: %s", path, strerror(errno));
    ckv_status st = write_all(fd, data, len, path);
    if (st == CKV_STATUS_OK && fsync(fd) != 0 && errno != EINVAL)
        st = ckv_error(CKV_STATUS_ERR_IO, "cannot sync %s: %s", path, strerror(errno));
    if (close(fd) != 0 && st == CKV_STATUS_OK) st = ckv_error(CKV_STATUS_ERR_IO, "error closing %s: %s", path, strerror(errno));
    return st;
}

ckv_status ckv_eval_write_atomic(const char *path, const char *data, size_t len) {
    return ckv_write_file_atomic(path, data, len, NULL);
}
