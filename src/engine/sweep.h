/* sweep.h - one prefill serves a whole sweep of presses x budgets. In layer-major prefill every layer
 * sees the whole context with its full cache before any compression, so the context's hidden states,
 * keys, values and attention inputs do not depend on the press: only what each layer keeps does (the
 * question and answer tokens, which come after, see the compressed caches). A sweep prefills the
 * context once with the full cache, keeps the attention inputs the sweep's scorers read (the window
 * rows for snapkv-like scorers, every row for observed/expected attention), and derives each press's
 * compressed context from it layer by layer: the same selection a separate run would make on the
 * same inputs, its kept rows gathered straight into a fresh session (into the pools of the previous one). The derived prepared context is
 * bit-identical to ckv_engine_prepare with that press (same session capacity, same rows, same
 * logits), and answers questions the same way (ckv_prepared_answer). Peak memory: the full cache and
 * kept attention inputs, plus one compressed copy at a time (ckv_sweep_release keeps its pools for the
 * next press).
 * Every rank of the tensor-parallel group makes the same calls. It does not tokenise, choose presses
 * or print. */
#ifndef CKV_ENGINE_SWEEP_H
#define CKV_ENGINE_SWEEP_H

#include <stddef.h>
#include <stdint.h>

#include "engine/request.h"

typedef struct {
    ckv_engine *engine;
    ckv_prepared full;      /* the context with the full cache: it answers the full-cache configuration */
    int L;                  /* context tokens */
    int reserve;            /* tokens every derived session holds beyond the context */
    int xn_first;           /* first context row whose attention inputs are kept (L: none) */
    float *xn;              /* [n_layers, L - xn_first, D] device: attention inputs of rows xn_first .. L-1 */
    float *q;               /* [n_layers, L - xn_first, n_q_local * d] device: the forward's roped queries of the
                             * last q_rows rows (at the end of each layer's block), as a prefill's hook sees them */
    int q_rows;             /* min(L - xn_first, the rows of the prefill's last chunk) */
    double prefill_seconds; /* the shared prefill */
    ckv_kv_cache spare;     /* the pools of the last context released (ckv_sweep_release), for the next derive */
} ckv_sweep;

/* The first context row of the attention input that press p's scorer reads for a context of L tokens
 * (L when it reads none): windowed scorers read the last `window` rows, tova the last, knorm,
 * streaming_llm, random and keydiff none, observed and expected attention (and any scorer not
 * listed) all. */
int ckv_sweep_xn_first(const ckv_press_config *p, int L);

/* Prefills ids[n] once with the full cache in a session of n + reserve tokens, keeping the attention
 * inputs of rows xn_first .. n-1 of every layer (the minimum of ckv_sweep_xn_first over the presses
 * to derive). */
ckv_status ckv_sweep_init(ckv_sweep *sw, ckv_engine *e, const int32_t *ids, int n, int reserve, int xn_first);
void ckv_sweep_free(ckv_sweep *sw); /* accepts zeroed and partial objects */

/* The prepared context of `press` (NULL or none: the full cache): *use points at the sweep's full
 * context when the press leaves the context uncompressed (its stats say why, as ckv_engine_prepare's
 * would), else at *pc, derived from the shared prefill (free it with ckv_prepared_free; *pc is zeroed
 * otherwise). dump_kept / dump_file as in ckv_prepare_params. A press that reads attention inputs
 * before xn_first is ERR_ARG. Answers rewind, so any number of presses can be derived in turn. */
ckv_status ckv_sweep_derive(ckv_sweep *sw, const ckv_press_config *press, int dump_kept, FILE *dump_file,
                            ckv_prepared *pc, ckv_prepared **use);

/* Frees pc, a context ckv_sweep_derive derived (zeroed is fine), keeping its cache's pools in the
 * sweep: the next derive gathers its kept rows into them instead of allocating new pools (fresh
 * pages, each zeroed and faulted in, cost more than the copy). Peak memory is unchanged: one
 * compressed copy at a time, whose pools are the largest any derived context of the sweep needed
 * so far. */
void ckv_sweep_release(ckv_sweep *sw, ckv_prepared *pc);

#endif
