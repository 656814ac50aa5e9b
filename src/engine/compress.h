/* compress.h - the bridge between a session's layer-major prefill and the presses: after a layer
 * has seen the whole context, build the scorer inputs from the model and the cache's device
 * segments, select what each local KV head keeps (evict/, on the backend's ops), compact the layer's
 * pool to exactly that plus room for the question and answer tokens straight from the device rows,
 * and optionally log the kept positions (rank 0 writes JSON lines {layer, kv_head, positions} for
 * every head of the model). Also keeps the statistics: bytes before/after, time scoring, selecting
 * and compacting. Works for every KV dtype (F32, F16, BF16) and backend the scorers support. */
#ifndef CKV_ENGINE_COMPRESS_H
#define CKV_ENGINE_COMPRESS_H

#include <stdio.h>

#include "engine/kvzip.h"
#include "engine/session.h"
#include "evict/press.h"
#include "evict/select.h"
#include "evict/select_model.h"

typedef struct {
    const ckv_press_config *cfg;
    const int32_t *headkv_budgets; /* [n_layers, n_kv_heads] from a profile, or NULL */
    int dump;                      /* log kept positions (set on EVERY rank: the log gathers over ranks) */
    FILE *dump_kept;               /* where rank 0 writes the JSON lines (NULL on other ranks) */
    /* optional observer of every layer's selection (tests, analysis): its buffers are device memory */
    void (*observe)(void *ctx, int layer, const ckv_selection *sel);
    void *observe_ctx;
    /* statistics (summed over layers) */
    double score_seconds, select_seconds, compact_seconds;
    size_t kv_bytes_full;          /* what the layers would hold uncompressed (context rows) */
    size_t kv_bytes_kept;          /* what they hold after compression (kept rows) */
    long kept_entries, total_entries;
    unsigned long long comm_bytes; /* payload this rank handed to collectives while compressing */
    /* a press that selects across layers (layer_defensivekv): every layer's scores, from the first
     * layer's hook to the last one's (then freed); NULL otherwise */
    ckv_model_selection *model;
    /* kvzip: the context's token ids [L], which its replay feeds again (owned; set by the caller before
     * the prefill, freed with the rest), and its replay's scores [n_layers, n_kv_local, L] (device) */
    int32_t *context_ids;
    float *replay_scores;
    /* one layer's selection buffers, sized at the first layer for the context and reused by the
     * layers after it (no device allocation per layer); freed after the last layer */
    ckv_selection sel;
    ckv_score_arena arena;         /* the scorers' device scratch, kept likewise */
    /* a composed press's host rows, kept likewise: [n_kv_local, L] the context rows kept so far,
     * [n_kv_local, L] a later press's kept rows, [n_kv_local, L] the first press's scores */
    int32_t *composed_rows, *composed_r2;
    float *composed_scores;
    size_t composed_cap;           /* entries each of the three holds */
} ckv_compressor;

/* Frees what a compressor holds between layers (a prefill abandoned part way through: a press that
 * selects across layers, the selection buffers, kvzip's context ids); a no-op otherwise. The
 * statistics stay. */
void ckv_compressor_release(ckv_compressor *cz);

/* Fills the scorer inputs of `layer` from the session's model, cache segments (context rows 0..L-1
 * of every local head; their device positions serve as the context positions) and saved attention
 * inputs (the session must have been created with compress = 1). */
void ckv_compress_score_inputs(const ckv_session *s, int layer, int L, ckv_score_inputs *in);

/* Kept rows per (layer, KV head) [n_layers * n_kv_heads] (malloc'd) of a headkv press for a context
 * of L tokens, from the profile named in the press (evict/headkv.h); every head also keeps the
 * tokens its base scorer protects. */
ckv_status ckv_compress_headkv_budgets(const ckv_press_config *cfg, const ckv_model_config *mc, int L, int32_t **out);

/* The layer hook to pass to ckv_session_prefill_hook (ctx = a ckv_compressor). A press that selects
 * across layers (CKV_ALLOC_MODEL) leaves every layer whole until the last layer's hook, which selects
 * over the model and compacts them all (peak KV: the full cache); kvzip's first replays the context
 * (engine/kvzip.h: the session needs ckv_kvzip_replay_rows more rows, and cz->context_ids). */
ckv_status ckv_compress_layer_hook(void *ctx, ckv_session *s, int layer, int n_prompt);

/* The same selection made on src's full layer (its cache rows 0..L-1 and attention inputs) with the
 * kept rows written into dst's layer (room for dst->capacity - L more); src is left untouched unless
 * it is dst (then this is the hook). Both sessions are of the same model; dst has nothing cached
 * yet, src's layer holds exactly the L context rows. */
ckv_status ckv_compress_layer_from(ckv_compressor *cz, ckv_session *dst, const ckv_session *src, int layer, int L);

/* After a compressed context of L positions is in s (every layer compacted, s->n_past == L): with
 * re-rotated keys (key_rerotation:, finch's rerotate_keys) the kept rows sit at positions 0 .. n_kept - 1,
 * so what follows (question, answer) takes positions n_kept, n_kept + 1, ... (kvpress's pipeline
 * continues at the cache's length): s->n_past becomes n_kept, which every layer and head holds (an
 * error otherwise). Any other press leaves s->n_past at L. */
ckv_status ckv_compress_context_end(const ckv_press_config *cfg, ckv_session *s);

/* Why press p leaves a context of L tokens uncompressed (static text), or NULL when it compresses it:
 * too short for its window, or a budget that keeps every token. */
const char *ckv_compress_skip_reason(const ckv_press_config *p, int L);

#endif
