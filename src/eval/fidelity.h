/* fidelity.h - how closely a compressed cache reproduces the full one under teacher forcing: the
 * context is prefilled (and compressed), then a continuation of the same text is fed and, at every
 * continuation position, the next-token distribution is compared with the full-cache one: KL(full ||
 * compressed), top-1 agreement, and the negative log-likelihood of the true next token under both.
 * It does not tokenise or print. */
#ifndef CKV_EVAL_FIDELITY_H
#define CKV_EVAL_FIDELITY_H

#include <stdint.h>

#include "evict/press.h"
#include "model/model.h"

typedef struct {
    int n;               /* positions compared */
    double kl;           /* mean KL(full || compressed) in nats */
    double top1;         /* fraction of positions where the argmax agrees */
    double nll_full;     /* mean -log p(next token) with the full cache */
    double nll_press;    /* the same with the compressed cache */
    double kv_kept_frac; /* kept context entries / all context entries */
    double prefill_s;    /* wall seconds of the context's prefill: a sweep's shared full-cache one, or (a prefill
                          * per press) the press's own, its eviction included */
    double evict_s;      /* wall seconds of the press's scoring + selection + compaction over every layer */
    double score_s;      /* the scoring part of evict_s */
    double select_s;     /* the selection part of evict_s (the rest is the compaction) */
} ckv_fidelity;

/* Full-cache logits of the continuation: rows [n_cont, V] (malloc'd into *out). */
ckv_status ckv_fidelity_reference(ckv_model *m, const int32_t *ids, int n_ctx, int n_cont, int chunk, float **out);

/* Compares the press (context-only compression of ids[0..n_ctx)) with the reference rows. */
ckv_status ckv_fidelity_measure(ckv_model *m, const ckv_press_config *press, const int32_t *ids, int n_ctx, int n_cont,
                                int chunk, const float *reference, ckv_fidelity *out);

/* Every press of a sweep from one prefill of the context (engine/sweep.h): the reference rows from
 * its full cache, then each press's compressed context derived from it; out [n_presses]. The same
 * results as ckv_fidelity_reference + ckv_fidelity_measure per press. on_result (may be NULL) is
 * called after each press. */
ckv_status ckv_fidelity_sweep(ckv_model *m, const ckv_press_config *const *presses, int n_presses, const int32_t *ids,
                              int n_ctx, int n_cont, int chunk, ckv_fidelity *out,
                              void (*on_result)(void *ctx, int i, const ckv_fidelity *r), void *cb_ctx);

/* KL(p || q) in nats of the softmax distributions of two logit rows [V]. */
double ckv_kl_logits(const float *p_logits, const float *q_logits, int V);

#endif
