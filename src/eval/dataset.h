/* dataset.h - evaluation samples from a JSONL file in the kvpress / LongBench style, one object per
 * line:
 *   "context" (string, required), "question" (string; "input" is accepted for LongBench's raw files)
 *   or "questions" (array of strings, with "answers" an array of answer lists of the same length, or
 *   array of objects {question, answers|answer, answer_prefix, max_new_tokens, id}), "answer_prefix",
 *   "answers" | "answer" | "outputs" (string or array of strings: required), "max_new_tokens",
 *   "task" (default: the file name without .jsonl), "metric" (default: the task's, metrics.h),
 *   "all_classes" (classification tasks), "_id" | "id".
 * Lines with the same task and context become one sample whose questions share one compressed
 * context (as kvpress groups its data frames by context). Bad lines (malformed JSON, a missing
 * context, no answers, a task without a metric) are errors naming file:line, or, with skip_bad,
 * warnings through the callback and the line is left out. Empty lines are ignored. It does not
 * tokenise or check lengths against a model. */
#ifndef CKV_EVAL_DATASET_H
#define CKV_EVAL_DATASET_H

#include "core/status.h"
#include "eval/sample.h"

typedef void (*ckv_eval_warn_fn)(void *ctx, const char *msg);

typedef struct {
    int skip_bad;           /* leave bad lines out with a warning instead of failing */
    const char *metric;     /* metric for every sample (NULL: per sample / task) */
    int max_new_tokens;     /* default for lines without max_new_tokens (0: 128) */
    ckv_eval_warn_fn warn;  /* skipped-line messages (may be NULL) */
    void *warn_ctx;
} ckv_dataset_options;

/* Loads `path` into *samples (malloc'd; free with ckv_eval_samples_free). *n_skipped (may be NULL)
 * counts the lines left out. A file with no usable sample is an error. */
ckv_status ckv_dataset_load(const char *path, const ckv_dataset_options *o, ckv_eval_sample **samples, int *n,
                            int *n_skipped);

#endif
