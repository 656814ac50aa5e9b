/* headscore.h - HeadKV's head-level retrieval-reasoning score, computed by the engine: needle probes
 * (a key-value sentence hidden in the essay haystack, asked for at the end) are fed with their answer
 * teacher-forced, and for every answer token each query head's attention over the sequence is read:
 * among the head's top-k rows, the attention weight of rows that lie in the needle's value AND hold
 * the token being produced (retrieval-and-copy) is added to the head's score; a probe's score is that
 * sum over its answer tokens divided by their count, the profile the mean over probes (HeadKV,
 * arXiv 2410.19258, Section 3.2: the retrieval score of Wu et al. with attention weights in place of
 * top-1 hits). A KV head's importance is the mean over its query heads (the headkv presses allocate
 * per KV head, evict/headkv.h). One process (no tensor parallelism); it does not print. */
#ifndef CKV_EVAL_HEADSCORE_H
#define CKV_EVAL_HEADSCORE_H

#include <stdint.h>

#include "engine/request.h"
#include "eval/haystack.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    int32_t *ids;         /* [n + n_answer] the prompt, then its answer (owned) */
    int n;                /* prompt tokens */
    int needle_lo, needle_hi; /* the needle's value: rows needle_lo .. needle_hi - 1 of the prompt */
    int n_answer;         /* = needle_hi - needle_lo: the answer is the value's tokens */
} ckv_headscore_probe;

/* Probe `index` of a seeded set: about `length` tokens of haystack words with the needle at a random
 * depth, then the question; the pieces are tokenized apart so the answer's ids equal the needle's. */
ckv_status ckv_headscore_make_probe(const ckv_tokenizer *tok, const ckv_haystack *hay, int length, uint64_t seed,
                                    int index, ckv_headscore_probe *out);
void ckv_headscore_probe_free(ckv_headscore_probe *p); /* accepts zeroed objects */

/* Adds the probe's score of every (layer, query head) to scores [n_layers * n_heads] (one prefill of
 * the probe and its answer but the last token, the attention read at every layer). topk >= 1. */
ckv_status ckv_headscore_probe_run(ckv_engine *e, const ckv_headscore_probe *p, int topk, double *scores);

#endif
