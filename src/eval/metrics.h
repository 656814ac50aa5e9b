/* metrics.h - scores of a predicted answer against reference answers, defined as the benchmarks define
 * them (text semantics are Python's: strings are sequences of code points, str.lower, str.split,
 * re's \b and \d):
 *  - RULER: string_match_all (the fraction of references found, case-insensitively, in the prediction)
 *    and string_match_part (1 when any is found), after RULER's clean-up of the prediction (strip,
 *    control characters to newlines, strip);
 *  - LongBench: qa_f1 (token F1 after SQuAD-style normalisation: lower case, ASCII punctuation
 *    removed, articles a/an/the removed, whitespace collapsed), rouge_l (ROUGE-L F of the `rouge`
 *    package 1.0.1 that LongBench uses: sentences split at '.', distinct-word counts, union-LCS word
 *    sets), classification (the classes named in the prediction, LongBench's rules), retrieval
 *    ("Paragraph N"), retrieval_zh ("段落N"), count (digit runs equal to the answer) and code_sim, the
 *    edit similarity (fuzzywuzzy's ratio over difflib's SequenceMatcher, rounded to a percent, of the
 *    prediction's first line that is not a comment or a code fence);
 *  - the task -> metric table of RULER and LongBench, and the LongBench "first line only" tasks.
 * Every score is in [0, 1]. Chinese LongBench metrics that need jieba word segmentation (qa_f1_zh,
 * rouge_zh) are not provided. Pure functions: no I/O. */
#ifndef CKV_EVAL_METRICS_H
#define CKV_EVAL_METRICS_H

#include "core/status.h"

typedef enum {
    CKV_METRIC_STRING_MATCH_ALL = 0,
    CKV_METRIC_STRING_MATCH_PART,
    CKV_METRIC_QA_F1,
    CKV_METRIC_ROUGE_L,
    CKV_METRIC_CLASSIFICATION,
    CKV_METRIC_RETRIEVAL,
    CKV_METRIC_RETRIEVAL_ZH,
    CKV_METRIC_PASSAGE_COUNT,
    CKV_METRIC_CODE_SIM,
    CKV_METRIC_KIND_COUNT_
} ckv_metric_kind;

/* "string_match_all", "string_match_part", "qa_f1", "rouge_l", "classification", "retrieval",
 * "retrieval_zh", "count", "code_sim" ("edit_sim" is accepted for code_sim). */
const char *ckv_metric_name(ckv_metric_kind k);
ckv_status ckv_metric_by_name(const char *name, ckv_metric_kind *out);

/* The metric a task is scored with: RULER (niah_*, vt, cwe, fwe: string_match_all; qa_*:
 * string_match_part) and LongBench / LongBench-E names (hotpotqa, gov_report, trec, lcc, ..., with or
 * without the "_e" suffix). *first_line is 1 for trec, triviaqa, samsum and lsht. Unknown tasks:
 * CKV_STATUS_ERR_ARG; the Chinese tasks that need jieba: CKV_STATUS_ERR_UNSUPPORTED. */
ckv_status ckv_metric_for_task(const char *task, ckv_metric_kind *out, int *first_line);

/* The score of `prediction` against answers[n_answers]: RULER metrics combine the references as
 * RULER does; LongBench metrics take the best reference. classes[n_classes] are the labels of
 * classification tasks. first_line: keep only the first line of the prediction (after leading
 * newlines) first. Errors: no answers, out of memory, a retrieval answer without its paragraph. */
ckv_status ckv_metric_score(ckv_metric_kind k, int first_line, const char *prediction, const char *const *answers,
                            int n_answers, const char *const *classes, int n_classes, double *score);

/* The single-reference LongBench functions (exposed for tests). */
ckv_status ckv_metric_qa_f1(const char *prediction, const char *answer, double *score);
ckv_status ckv_metric_rouge_l(const char *prediction, const char *answer, double *score);
ckv_status ckv_metric_code_sim(const char *prediction, const char *answer, double *score);
ckv_status ckv_metric_classification(const char *prediction, const char *answer, const char *const *classes,
                                     int n_classes, double *score);
ckv_status ckv_metric_retrieval(const char *prediction, const char *answer, int zh, double *score);
ckv_status ckv_metric_passage_count(const char *prediction, const char *answer, double *score);
/* RULER's over all references (all = 1: string_match_all, 0: string_match_part). */
ckv_status ckv_metric_string_match(const char *prediction, const char *const *answers, int n_answers, int all,
                                   double *score);

/* SQuAD/LongBench answer normalisation into *out (malloc'd UTF-8). */
ckv_status ckv_metric_normalize_answer(const char *s, char **out);
/* difflib.SequenceMatcher(None, a, b).ratio() over code points (autojunk on). */
ckv_status ckv_metric_sequence_ratio(const char *a, const char *b, double *ratio);

#endif
