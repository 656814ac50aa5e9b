/* decode_press.h - decode-time compression: while an answer is generated, every `interval` decode
 * steps every layer's cache is cut back to `target` entries per KV head by a registry scorer, as
 * kvpress 0.5.5's DecodingPress (fixed target_size) and CompressionRatioDecodingPress (a fraction of
 * the tokens seen so far) do; a prefill press before it is kvpress's PrefillDecodingPress. The
 * semantics (which steps count, the target, what is scored) are docs/spec-eviction.md's "Decode-time
 * compression". The scorers it takes read keys and values only (the attention-free presses: knorm,
 * keydiff, streaming_llm, random, lagkv, cur, leverage), so nothing per step is kept for them; the
 * selection buffers and the in-place compaction's scratch are sized when an answer starts, so the
 * decode loop allocates nothing. It does not sample, prefill or parse flags. */
#ifndef CKV_ENGINE_DECODE_PRESS_H
#define CKV_ENGINE_DECODE_PRESS_H

#include <stdio.h>

#include "engine/session.h"
#include "evict/press.h"
#include "evict/select.h"

#define CKV_DECODE_INTERVAL_DEFAULT 512 /* kvpress compression_interval */
#define CKV_DECODE_TARGET_DEFAULT 2048  /* kvpress target_size */

typedef struct {
    ckv_press_config press; /* the scorer (uniform kept counts; its budget is the target, set per compression) */
    int interval;           /* decode steps between two compressions (>= 1) */
    int target;             /* entries per head kept (>= 1); 0 in the ratio form */
    double ratio;           /* the ratio form's fraction of the tokens seen that is removed, in [0, 1); < 0: none */
    char spec[640];         /* canonical: "knorm interval=512 target=2048" or "... ratio=0.5" */
} ckv_decode_press;

/* Builds a decode press from the scorer's spec and options (applied in order, as ckv_press_build
 * does), the interval and either target (> 0) or ratio (>= 0; the other < 0 / 0). Errors name the
 * field ("decode press", "decode interval", "decode target", "decode ratio") and refuse scorers that
 * read the attention input and wrappers (their selection is not one per head over the whole cache). */
ckv_status ckv_decode_press_build(ckv_decode_press *dp, const char *spec, int interval, int target, double ratio,
                                  const ckv_press_option_value *options, int n_options);

/* Replaces the interval and target (> 0) or ratio (>= 0; the other < 0 / 0) of a built decode press
 * (its scorer kept), checked as ckv_decode_press_build checks them; the canonical spec follows. */
ckv_status ckv_decode_press_set_counts(ckv_decode_press *dp, int interval, int target, double ratio);

/* Checks that a prefill press leaves caches the decode press can cut (the same rows on every head of
 * a layer: no cross-head allocation). */
ckv_status ckv_decode_press_check_prefill(const ckv_decode_press *dp, const ckv_press_config *prefill);

/* The entries per head a compression keeps when n_seen positions have been seen (the target, or
 * max(1, floor(n_seen * (1 - ratio)))). */
int ckv_decode_press_target(const ckv_decode_press *dp, long n_seen);

/* One answer's decode-time compression over session s. */
typedef struct {
    const ckv_decode_press *dp;
    ckv_session *s;
    ckv_press_config cfg;   /* dp->press with the budget of the compression in progress */
    int steps;              /* decode steps since the last compression (kvpress's layer_step_counts) */
    int answer_steps;       /* decode steps of the answer */
    ckv_selection sel;      /* sized for the session's capacity */
    ckv_score_arena arena;  /* the scorers' device scratch (grown at the first compression, then reused) */
    ckv_kv_keep_ws ws;      /* in-place compaction scratch */
    int dump;               /* log kept positions after each compression (set on EVERY rank) */
    FILE *dump_file;        /* where rank 0 writes them (NULL on other ranks) */
    int32_t *dump_mine;     /* [n_kv_local, capacity + 1] this rank's heads: count, positions (host) */
    int32_t *dump_all;      /* [tp, n_kv_local, capacity + 1] every rank's (host) */
    /* statistics */
    int compressions;       /* compressions that evicted rows */
    long evicted_entries;   /* rows x KV heads of the model evicted (the same on every rank) */
    double seconds;
} ckv_decode_state;

/* Sizes the buffers for session s as it is now (its pools must not grow afterwards). With dump
 * (on every rank), rank 0 writes one JSON line {step, layer, kv_head, n_kept, positions} per KV head
 * of the model to dump_file after each layer a compression cut (step: decode steps of the answer). */
ckv_status ckv_decode_state_init(ckv_decode_state *ds, const ckv_decode_press *dp, ckv_session *s, int dump,
                                 FILE *dump_file);
void ckv_decode_state_free(ckv_decode_state *ds); /* accepts zeroed and partial objects */

/* After one decode step of the session: counts it and, when `interval` steps have passed (or the
 * target is 1), cuts every layer holding more than the target down to it. *evicted (may be NULL)
 * is set to 1 when rows were dropped. Every rank of the group makes the same call. */
ckv_status ckv_decode_state_step(ckv_decode_state *ds, int *evicted);

#endif
