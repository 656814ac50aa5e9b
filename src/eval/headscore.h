/* headscore.h - HeadKV's head-level retrieval-reasoning score, computed by the engine as the official
 * HeadKV detection script does (FYYFU/HeadKV, retrieval_head_detection_r2.py; arXiv 2410.19258,
 * Section 3.2): needle probes (a key-value sentence hidden in the essay haystack, asked for at the
 * end) are fed with their answer teacher-forced; for the row that produces each answer token, every
 * query head's attention over the sequence is read, and each of the head's top-k rows (k = the
 * needle sentence's length unless given) that lies in the needle sentence adds
 * 10 * weight / (needle length * answer length). No token match is required (the retrieval-
 * reasoning variant; Wu et al.'s retrieval heads count top-1 copies only). A probe counts only when
 * the model answers it (every answer token is the greedy argmax, which for the one-number answer
 * is HeadKV's qa_f1 > 50 on its greedy answer), and a head's score is the mean over the probes that
 * count. A KV head's importance is the mean over its query heads (the headkv presses allocate per
 * KV head, evict/headkv.h). One process (no tensor parallelism); it does not print. */
#ifndef CKV_EVAL_HEADSCORE_H
#define CKV_EVAL_HEADSCORE_H

#include <stdint.h>

#include "engine/request.h"
#include "eval/haystack.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    int32_t *ids;         /* [n + n_answer] the prompt, then its answer (owned) */
    int n;                /* prompt tokens */
    int needle_lo, needle_hi; /* the needle sentence: rows needle_lo .. needle_hi - 1 of the prompt */
    int answer_lo;        /* the value inside it: rows answer_lo .. answer_lo + n_answer - 1 */
    int n_answer;         /* the answer is the value's tokens */
} ckv_headscore_probe;

/* Probe `index` of a seeded set: about `length` tokens of haystack words with the needle at a random
 * depth, then the question; the pieces are tokenized apart so the answer's ids equal the needle's. */
ckv_status ckv_headscore_make_probe(const ckv_tokenizer *tok, const ckv_haystack *hay, int length, uint64_t seed,
                                    int index, ckv_headscore_probe *out);
void ckv_headscore_probe_free(ckv_headscore_probe *p); /* accepts zeroed objects */

/* Scores one probe (one prefill of the probe and its answer but the last token, the attention read
 * at every layer): *answered = whether every answer token is the model's greedy choice; when it is,
 * or when count_all is set, the probe's score of every (layer, query head) is added to scores
 * [n_layers * n_heads]. topk >= 1, or 0 for the needle sentence's length (HeadKV's). */
ckv_status ckv_headscore_probe_run(ckv_engine *e, const ckv_headscore_probe *p, int topk, int count_all, double *scores,
                                   int *answered);

#endif
