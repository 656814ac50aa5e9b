/* ruler.h - RULER-style synthetic long-context tasks, generated deterministically from a seed at a
 * requested length in tokens: needle-in-a-haystack (niah_single_1/2/3, niah_multikey_1/2/3,
 * niah_multivalue, niah_multiquery), variable tracking (vt), common-words extraction (cwe) and
 * frequent-words extraction (fwe), with RULER's templates, answer prefixes, generation limits and
 * task parameters (its synthetic.yaml), split into context / question / answer prefix the way
 * kvpress splits RULER prompts. The length is measured with a caller-supplied token counter (the
 * model's tokenizer, chat template included), so that prompt + max_new_tokens fits the request.
 * It does not tokenise, run a model or score. */
#ifndef CKV_EVAL_RULER_H
#define CKV_EVAL_RULER_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "eval/haystack.h"
#include "eval/sample.h"

typedef enum { CKV_RULER_NIAH = 0, CKV_RULER_VT, CKV_RULER_CWE, CKV_RULER_FWE } ckv_ruler_kind;
typedef enum { CKV_RULER_HAY_NOISE = 0, CKV_RULER_HAY_ESSAY, CKV_RULER_HAY_NEEDLE } ckv_ruler_haystack;
typedef enum { CKV_RULER_WORDS = 0, CKV_RULER_NUMBERS, CKV_RULER_UUIDS } ckv_ruler_needle_type;

typedef struct {
    const char *name;          /* "niah_single_1", ..., "vt", "cwe", "fwe" */
    ckv_ruler_kind kind;
    int max_new_tokens;        /* RULER's tokens_to_generate */
    /* needle tasks */
    ckv_ruler_haystack haystack;
    ckv_ruler_needle_type key_type, value_type;
    int num_k, num_v, num_q;
} ckv_ruler_task;

int ckv_ruler_task_count(void);
const ckv_ruler_task *ckv_ruler_task_at(int i);
/* By name; an unknown name is an error listing the known ones. */
ckv_status ckv_ruler_task_find(const char *name, const ckv_ruler_task **out);
/* A comma-separated list of names, or the groups "niah" (the 8 needle tasks) and "all"/"ruler" (the
 * 11 tasks); duplicates are dropped. *out is malloc'd. */
ckv_status ckv_ruler_task_list(const char *list, const ckv_ruler_task ***out, int *n);

/* Tokens the model would see for a sample: its context, question and answer prefix as prompted. */
typedef ckv_status (*ckv_ruler_count_fn)(void *ctx, const ckv_eval_sample *s, long *tokens);

typedef struct {
    const ckv_ruler_task *task;
    int length;               /* requested total: prompt tokens + max_new_tokens */
    uint64_t seed;
    const ckv_haystack *essay; /* for the essay haystack (niah_single_2/3, multikey_1, multivalue, multiquery) */
    int max_new_tokens;       /* 0 = the task's */
    ckv_ruler_count_fn count;
    void *count_ctx;
} ckv_ruler_params;

/* Sample `index` with `units` of haystack (noise/needle sentences, essay words, vt noise sentences,
 * cwe or fwe words); deterministic in (task, length, seed, index, units). */
ckv_status ckv_ruler_build(const ckv_ruler_params *p, int index, long units, ckv_eval_sample *out);

/* The largest haystack size (within 0.4%) whose sample 0 fits the length; an error names the task
 * and the smallest length it can be generated at. */
ckv_status ckv_ruler_fit(const ckv_ruler_params *p, long *units);

/* Sample `index` at the fitted size, shrunk (by 1% steps, as RULER does) while it does not fit;
 * *tokens receives its prompt tokens (may be NULL). */
ckv_status ckv_ruler_generate(const ckv_ruler_params *p, int index, long fitted_units, ckv_eval_sample *out,
                              long *tokens);

/* The id of a generated sample: "<task>/<length>/<seed>/<index>". */
void ckv_ruler_sample_id(const char *task, int length, uint64_t seed, int index, char *buf, size_t cap);

/* The generator's random stream (splitmix64), exposed for tests. */
uint64_t ckv_ruler_mix(uint64_t x);

#endif
