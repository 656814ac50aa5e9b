/* batch.h - batched decode: one forward step for the next token of several sessions at once (one
 * row per session), so a server's running requests share every weight read. The sessions keep
 * their own KV caches (each may have been compressed differently); the attention op sees them as
 * one segment batch. A batch object is sized once for up to max_seq sessions and allocates nothing
 * per step. It does not choose which sessions run (the caller's scheduler does) or sample. */
#ifndef CKV_ENGINE_BATCH_H
#define CKV_ENGINE_BATCH_H

#include <stdint.h>

#include "engine/session.h"

typedef struct {
    ckv_model *model;
    int max_seq;
    ckv_model_scratch scratch;  /* activations for max_seq rows */
    float *x;                   /* [max_seq, D] hidden states (device) */
    ckv_kv_seg **lists_host;    /* [n_layers, max_seq] each member's segment table per layer (host copy) */
    ckv_kv_seg **lists;         /* [n_layers, max_seq] the same on the device */
    int32_t *seq_of;            /* [max_seq] device: 0, 1, 2, ... (one token per sequence) */
    int32_t *seq_start;         /* [max_seq + 1] device: 0, 1, 2, ... */
    int32_t *pos;               /* [max_seq] host positions of the step */
    uint64_t *members;          /* [max_seq] ids of the sessions the device lists describe (host) */
    int n_members;
    double step_seconds;        /* statistics */
    long steps, rows;
} ckv_decode_batch;

/* Sizes a batch for up to max_seq sessions of model m (1 <= max_seq <= CKV_LOGITS_ROWS). */
ckv_status ckv_decode_batch_init(ckv_decode_batch *b, ckv_model *m, int max_seq);
void ckv_decode_batch_free(ckv_decode_batch *b); /* accepts partial objects */

/* Feeds tokens[i] to sessions[i] (i < n, n <= max_seq, distinct sessions of b's model, each with room
 * for one more token) at that session's next position, in one forward. *logits points at [n, V]
 * host logits, row i for session i (valid until the next call). Each session's n_past and decode
 * statistics advance as after ckv_session_decode. */
ckv_status ckv_decode_batch_step(ckv_decode_batch *b, ckv_session *const *sessions, const int32_t *tokens, int n,
                                 const float **logits);

#endif
