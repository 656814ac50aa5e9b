/* sample.h - one evaluation sample as every source produces it (the RULER-style generators, JSONL
 * datasets): a context, one or more questions answered from it (each with its answer prefix, the
 * reference answers and a generation limit), the task and the metric that scores it. Plain data
 * plus free/copy helpers; no I/O. */
#ifndef CKV_EVAL_SAMPLE_H
#define CKV_EVAL_SAMPLE_H

#include "core/status.h"
#include "eval/metrics.h"

typedef struct {
    char *question;      /* text fed after the context ("" allowed) */
    char *answer_prefix; /* text that opens the answer ("" when none) */
    char **answers;      /* [n_answers] reference answers */
    int n_answers;
    int max_new_tokens;  /* generation limit of this question */
    int line;            /* JSONL line it came from (0 for generated samples) */
    char *id;            /* the dataset's own id ("_id"/"id") or NULL */
} ckv_eval_question;

typedef struct {
    char *id;            /* stable sample id: "<task>/<length>/<seed>/<index>" or "<file>:<line>" */
    char *task;          /* e.g. "niah_single_1", "hotpotqa" */
    int length;          /* requested length in tokens for generated samples, 0 for datasets */
    char *context;
    ckv_eval_question *questions;
    int n_questions;
    char **all_classes;  /* [n_classes] for classification metrics (LongBench trec, lsht) */
    int n_classes;
    ckv_metric_kind metric;
    int first_line;      /* score only the first line of the prediction (LongBench trec, triviaqa, samsum, lsht) */
} ckv_eval_sample;

void ckv_eval_sample_free(ckv_eval_sample *s); /* frees the members; accepts zeroed objects */
void ckv_eval_samples_free(ckv_eval_sample *s, int n); /* frees the members of s[0..n) and s itself */

/* strdup that records an out-of-memory error naming `what`. */
ckv_status ckv_eval_strdup(const char *src, char **out, const char *what);

/* Appends a question (the strings are copied; answers[n_answers]). */
ckv_status ckv_eval_sample_add_question(ckv_eval_sample *s, const char *question, const char *answer_prefix,
                                        const char *const *answers, int n_answers, int max_new_tokens, int line,
                                        const char *id);

#endif
