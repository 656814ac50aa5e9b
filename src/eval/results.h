/* results.h - the results files of an evaluation: JSON lines, one per answered question, appended
 * whole (one write of complete lines, then fsync) so that a killed run leaves at most a partial last
 * line, which the next reader cuts off; reading them back (the fields the resume logic and the report
 * need), merging several part files into one sorted file, and writing any file atomically (temporary
 * file, fsync, rename). It does not run models or decide what to run. */
#ifndef CKV_EVAL_RESULTS_H
#define CKV_EVAL_RESULTS_H

#include <stddef.h>

#include "core/status.h"

/* One results line, with the fields used to resume, sort and summarise. */
typedef struct {
    char *line;        /* the JSON text (no newline) */
    char *task;
    int length;        /* generated length, 0 for datasets */
    char *press;       /* the press as given ("none": full cache) */
    char *press_spec;  /* canonical spec with budget (the resume key) */
    double budget;     /* kept fraction (1 for the full cache) */
    char *sample;      /* sample id */
    int sample_index;
    int question;
    double score;      /* [0, 1] */
    int source_line;   /* line number in its file (for messages) */
} ckv_eval_result;

void ckv_eval_results_free(ckv_eval_result *r, int n);

/* Reads a results file (a missing file is 0 rows). With `repair`, a partial last line (no newline:
 * a write cut by a kill) is cut off the file; without, it is ignored. A malformed complete line is an
 * error naming file:line. Rows are appended to *rows (realloc'd), *n updated. */
ckv_status ckv_eval_results_read(const char *path, int repair, ckv_eval_result **rows, int *n);

/* The resume key of a row: press_spec, sample and question joined by '\x1f' (malloc'd). */
ckv_status ckv_eval_result_key(const char *press_spec, const char *sample, int question, char **out);

/* Sorts rows (press, budget, task, length, sample_index, sample, question) and drops repeated keys
 * (keeping the first). */
void ckv_eval_results_sort_unique(ckv_eval_result *rows, int *n);

/* Appends len bytes (whole lines) to the file at `path` with O_APPEND, then fsyncs. */
ckv_status ckv_eval_append(const char *path, const char *data, size_t len);

/* Writes `path` atomically (core/atomic_file.h: regular targets only, temporary beside it, fsync, rename, directory fsync). */
ckv_status ckv_eval_write_atomic(const char *path, const char *data, size_t len);

#endif
