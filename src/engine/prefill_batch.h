/* prefill_batch.h - batched prefill: the begun prefills of several sessions (short prompts of
 * different requests) in one forward. Per layer the rows of every sequence go through the model in
 * one pass (one matmul per weight over all rows; the caches seen as one segment batch, each
 * sequence attending to its own cache only), then each session's own layer hook runs on its own
 * layer (its press compresses that sequence alone, exactly as in its own prefill), then the next
 * layer. The last row of every sequence gives its logits. A prefill here computes what each session's
 * own ckv_session_prefill_hook computes, row for row (up to the summation order of a matmul over
 * another number of rows). A batch object is sized once (rows, sequences) and allocates nothing per
 * call. It does not choose which prompts run together (the scheduler does), sample or handle
 * contexts being prepared (engine/request.h's ckv_prepared_advance_batch does). */
#ifndef CKV_ENGINE_PREFILL_BATCH_H
#define CKV_ENGINE_PREFILL_BATCH_H

#include <stdint.h>

#include "engine/session.h"

typedef struct {
    ckv_model *model;
    int max_tokens, max_seq;
    ckv_model_scratch scratch;  /* activations for max_tokens rows */
    float *x;                   /* [max_tokens, D] the batch's hidden states (device) */
    float *xn;                  /* [max_tokens, D] a layer's attention inputs (device; copied to the sessions that keep them) */
    float *last;                /* [max_seq, D] every sequence's last row, for the logits (device) */
    ckv_kv_seg **lists_host;    /* [max_seq] the members' segment tables of the layer being run (host) */
    ckv_kv_seg **lists;         /* [max_seq] the same on the device */
    int32_t *seq_of;            /* [max_tokens] device: the sequence of each row */
    int32_t *seq_start;         /* [max_seq + 1] device: each sequence's first row */
    int32_t *seq_of_host;       /* [max_tokens] */
    int32_t *split;             /* [max_seq + 1] host: each sequence's first row */
    int32_t *pos;               /* [max_tokens] host positions of the rows */
    double seconds;             /* statistics */
    long calls, rows, seqs;
} ckv_prefill_batch;

/* Sizes a batch for up to max_tokens rows over up to max_seq sequences of model m (1 <= max_seq <=
 * CKV_LOGITS_ROWS, max_seq <= max_tokens). */
ckv_status ckv_prefill_batch_init(ckv_prefill_batch *b, ckv_model *m, int max_tokens, int max_seq);
void ckv_prefill_batch_free(ckv_prefill_batch *b); /* accepts zeroed and partial objects */

/* Runs the prefills begun on sessions[i] (ckv_session_prefill_begin, no layer run yet; i < n, distinct
 * sessions of b's model with one KV dtype, at most max_tokens prompt rows in all) through every layer
 * in one forward; after layer l, hooks[i] (may be NULL, as may `hooks`) runs on sessions[i] with
 * hook_ctx[i]. *logits points at [n, V] host logits, row i the last prompt token's of session i (valid
 * until the next call). Each session's n_past and prefill statistics advance as after its own
 * ckv_session_prefill_end. Members that do not fit (another model, no prefill begun, too many rows)
 * are refused before anything runs (the prefills stay begun); an error during the forward aborts every
 * member's prefill (the layers run hold part of its prompt: rewind or free the session). */
ckv_status ckv_prefill_batch_run(ckv_prefill_batch *b, ckv_session *const *sessions, const ckv_layer_hook *hooks,
                                 void *const *hook_ctx, int n, const float **logits);

#endif
