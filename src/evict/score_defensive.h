/* score_defensive.h - DefensiveKV's scorer (FFY0/DefensiveKV, press "efficient_defensivekv", the
 * CriticalKV authors' follow-up), ported from the official code with its quirks: defensive
 * aggregation (max over the group's query heads and the window queries of pooled, mass-preserving
 * window attention, floored at the per-head mean), value-norm weighting normalised across the KV heads
 * of the layer, and a CriticalKV-like first stage that lifts each head's most attended tokens to the
 * layer max. The scores are ranked by ONE top-k over all KV heads of the layer (CKV_ALLOC_GLOBAL in
 * select.c). Semantics, defaults (window 32, avg pooling, kernel 5) and every quirk: docs/spec-eviction.md
 * "defensivekv", docs/presses.md and score_defensive.c. It selects nothing itself. */
#ifndef CKV_EVICT_SCORE_DEFENSIVE_H
#define CKV_EVICT_SCORE_DEFENSIVE_H

#include "core/status.h"
#include "evict/press.h"
#include "evict/scorer.h"

/* Writes scores [n_kv_local, L] for the layer in `in` (higher = keep): entries of the L - window
 * context tokens hold DefensiveKV's final scores (first-stage tokens set to the layer-wide max M of
 * the weighted scores), the last `window` entries are left 0 and reported in info->protect_tail
 * (the caller lifts them to the layer max + 1). Uses cfg->window, cfg->kernel (odd), cfg->pool (avg
 * only: DefensiveKV has no max pooling) and the budget (cfg->compression_ratio, or budget_tokens as a
 * kept fraction budget_tokens / L) for the first-stage cap. Collectives: over in->replica (when
 * tp > Hkv) a sum and a max (plus the sum inside the value norm), over in->tp a sum of the window
 * bias, a sum of the per-token value norms of all KV heads and a max for M; every rank of a replica
 * group gets identical scores. Errors: L <= window, even kernel, max pooling, missing inputs.
 * For layer_defensivekv (cfg->scorer CKV_SCORER_LAYER_DEFENSIVEKV) the window entries hold
 * nextafterf(M, +inf) instead and info->protect_tail is 0 (it competes across layers; select_model.h). */
ckv_status ckv_score_defensivekv(const ckv_score_inputs *in, const ckv_press_config *cfg, float *scores,
                                 ckv_score_info *info);

#endif
