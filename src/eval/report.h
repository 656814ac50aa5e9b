/* report.h - the summary of an evaluation's results: the mean score (x100) per task (and length),
 * press and budget, the full-cache score of the same task and the loss against it, a mean over tasks
 * per press and budget, rendered as a Markdown table, as JSON, and as an SVG plot of score vs budget
 * (one panel per task plus the mean, one line per press, the full cache dashed). It builds text;
 * writing the files is the caller's (ckv_eval_report_write does it atomically). */
#ifndef CKV_EVAL_REPORT_H
#define CKV_EVAL_REPORT_H

#include "core/status.h"
#include "eval/results.h"

typedef struct {
    char task[96];    /* "(mean)" for the mean over tasks */
    int length;       /* 0: not a generated task (or the mean) */
    char press[128];  /* as given; "none" = the full cache */
    double budget;
    int n;            /* answers scored */
    double score;     /* mean score x 100 */
    int has_base;     /* a full-cache score exists for this task */
    double base;      /* the full-cache score x 100 */
    double loss;      /* base - score */
} ckv_eval_summary;

/* Groups rows into *out (malloc'd), sorted: task, length, the full cache first, press, budget; the
 * "(mean)" rows last. */
ckv_status ckv_eval_summarize(const ckv_eval_result *rows, int n, ckv_eval_summary **out, int *n_out);

/* Renderings (*out malloc'd). */
ckv_status ckv_eval_report_table(const ckv_eval_summary *s, int n, char **out);
ckv_status ckv_eval_report_json(const ckv_eval_summary *s, int n, char **out);
ckv_status ckv_eval_report_svg(const ckv_eval_summary *s, int n, const char *title, char **out);

/* Writes dir/summary.md, dir/summary.json and dir/score_vs_budget.svg (atomically) from rows;
 * *table (may be NULL) receives the Markdown table. */
ckv_status ckv_eval_report_write(const char *dir, const ckv_eval_result *rows, int n, const char *title, char **table);

#endif
