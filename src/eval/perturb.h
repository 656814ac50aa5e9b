/* perturb.h - layer-wise perturbation of the hidden state (CriticalKV paper, Figure 5): after a
 * context is compressed, the question is fed and, for its last token (whose output is the first
 * decoded token), the hidden state after every layer is compared with the full cache's:
 * ||h_c - h_f||_2 / ||h_f||_2 per layer and press. The context is prefilled once for every press
 * (engine/sweep.h). Every rank of the tensor-parallel group makes the same call (the hidden states are
 * replicated; every rank gets the results). It does not print or choose presses. */
#ifndef CKV_EVAL_PERTURB_H
#define CKV_EVAL_PERTURB_H

#include <stdint.h>

#include "engine/request.h"
#include "evict/press.h"

/* rel [n_presses, n_layers]: the relative perturbation after each layer of the last question token
 * (n_q >= 1 question ids after the n_ctx context ids); kept [n_presses] (may be NULL): the kept
 * fraction of the context entries. */
ckv_status ckv_perturb_layerwise(ckv_engine *e, const int32_t *ctx, int n_ctx, const int32_t *q, int n_q,
                                 const ckv_press_config *const *presses, int n_presses, double *rel, double *kept);

#endif
