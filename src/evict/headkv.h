/* headkv.h - HeadKV's per-head budgets (FYYFU/HeadKV, ReasonSnapKVCluster): a head-importance profile
 * loaded from JSON, and the allocation that turns it into kept counts per (layer, KV head) for the
 * headkv presses (CKV_ALLOC_HEADKV; select.c takes one layer's row as a ckv_head_budgets table).
 * It neither scores nor selects tokens.
 *
 * Profile file (JSON object; tools/oracle/headkv_profile.py converts HeadKV's own importance files):
 *   {"format": "ckv-headkv-profile",         optional; when present it must be this string
 *    "model": "Meta-Llama-3-8B-Instruct",    optional, informational
 *    "n_layers": 32, "n_kv_heads": 8,        required; must equal the model's
 *    "scores": [[8 numbers] x 32],           required: importance of each (layer, KV head), >= 0,
 *                                            not all 0; any scale (normalised on use)
 *    "beta": 1.5, "temp": 1.0,               optional HeadKV allocation parameters (defaults 1.5, 1)
 *    "source": "...", ...}                   optional provenance; other keys are ignored
 * HeadKV's published importance is per QUERY head ({"layer-head": [scores]}, np.mean of each list);
 * a ckv profile holds, per KV head, the mean over its query heads of those values.
 *
 * Allocation (HeadKV's formula with KV heads in place of query heads):
 *   p = s / sum(s); p = p^temp / sum(p^temp)           over all n_layers * n_kv_heads entries
 *   base = n_kept_mean - window                         tokens beside the protected window
 *   q = base // beta (Python's float floor division); pool = q * n_layers * n_kv_heads
 *   budget = min(round_half_even(p * pool + base - q), L - window) + window, clamped to [1, L]
 * Before rounding and capping the budgets sum to n_layers * n_kv_heads * n_kept_mean. base < 0 (the
 * kept count is below the window) gives every head n_kept_mean; base > L - window (HeadKV: nothing to
 * compress) gives every head L. */
#ifndef CKV_EVICT_HEADKV_H
#define CKV_EVICT_HEADKV_H

#include <stdint.h>

#include "core/status.h"

#define CKV_HEADKV_DEFAULT_BETA 1.5 /* HeadKV run_longbench.py's default (its scripts sweep 1.005 .. 10) */
#define CKV_HEADKV_DEFAULT_TEMP 1.0

typedef struct {
    int n_layers, n_kv_heads;
    double *scores; /* [n_layers * n_kv_heads] importance as in the file, layer-major */
    /* allocation parameters: beta and temp from the file (or the defaults); window = tokens every
     * head keeps beside its share: the tokens the base scorer protects (snapkv / pyramidkv: its
     * window; tova: 1; streaming_llm / expected_attention: n_sink; others 0), 0 after loading. The
     * caller may change all three before ckv_headkv_budgets. */
    double beta, temp;
    int window;
    char model[128];
    char source[256];
    char path[512];
} ckv_headkv_profile;

/* Loads a profile and checks it against the model (n_layers, n_kv_heads; a value <= 0 skips that
 * check). Errors: unreadable file (ERR_IO), malformed JSON or schema (ERR_FORMAT, naming the file and
 * the key), a shape that does not match the model (ERR_SHAPE: "profile X has 28 layers x 4 KV heads,
 * the model 32 x 8"). On error *p is left empty (safe to free). */
ckv_status ckv_headkv_load(ckv_headkv_profile *p, const char *path, int n_layers, int n_kv_heads);

/* Frees what ckv_headkv_load allocated (NULL and empty profiles are fine). */
void ckv_headkv_free(ckv_headkv_profile *p);

/* Kept rows per (layer, KV head), layer-major into budgets [n_layers * n_kv_heads], for a context of
 * L tokens whose uniform per-head kept count would be n_kept_mean (window included), with p->beta,
 * p->temp and p->window (see the formula above). Errors: L < 1, n_kept_mean < 1, window outside
 * [0, L), beta < 1, temp <= 0. */
ckv_status ckv_headkv_budgets(const ckv_headkv_profile *p, int L, int n_kept_mean, int32_t *budgets);

#endif
