/* batch.h - batched decode: one forward step for the next token of several sessions at once (one
 * row per session), so a server's running requests share every weight read. The sessions keep
 * their own KV caches (each may have been compressed differently); the attention op sees them as
 * one segment batch. A batch object is sized once for up to max_seq sessions and allocates nothing
 * per step. It does not choose which sessions run (the caller's scheduler does); it samples only on
 * the device (ckv_decode_batch_step_ids, the backend's sample op): the host sampler, logit processing
 * and log-probabilities are the caller's, on the rows ckv_decode_batch_step returns. */
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
    float *full_logits;         /* [max_seq, V] device, tp > 1 only: the gathered rows the sample op reads */
    double *u;                  /* [max_seq] device: each row's uniform draw */
    int32_t *ids;               /* [max_seq] device: the sampled ids */
    int *bound;                 /* [n_layers] host: each layer's key bound the step's attention is planned
                                 * for (its view's max_len: the longest segment after the step, bucketed) */
    int32_t *key;               /* [3 + n_layers + 3 max_seq] host: the key of the step's recording */
    int graphs;                 /* 1: steps are recorded and replayed (backend graphs, tp 1) */
    const float *logits_dev;    /* [max_seq, V] device: where the forward leaves the step's logits */
    int n_members;
    double step_seconds;        /* statistics */
    long steps, rows;
} ckv_decode_batch;

/* The key bound a decode step's attention is planned for when its longest segment holds len rows
 * after the step: len rounded up to a multiple of 256, or of 1/16 of the largest power of two <= len
 * when that is larger (at most 1/16 more keys planned than held; the kernels skip the keys past each
 * segment's length). */
int ckv_decode_len_bound(int len);

/* Sizes a batch for up to max_seq sessions of model m (1 <= max_seq <= CKV_LOGITS_ROWS). */
ckv_status ckv_decode_batch_init(ckv_decode_batch *b, ckv_model *m, int max_seq);
void ckv_decode_batch_free(ckv_decode_batch *b); /* accepts partial objects */

/* Feeds tokens[i] to sessions[i] (i < n, n <= max_seq, distinct sessions of b's model, each with room
 * for one more token) at that session's next position, in one forward. Each layer's attention is
 * planned for a bucket of its longest segment (ckv_decode_len_bound), not the length itself, so the
 * plan, and with it the summation order, is the same for every step of a bucket (a recorded CUDA
 * graph of the step and the unrecorded step give the same logits). The forward is recorded and
 * replayed as in ckv_decode_batch_step_ids (its key with no sampling settings), the logits'
 * download after it. *logits points at [n, V]
 * host logits, row i for session i (valid until the next call). Each session's n_past and decode
 * statistics advance as after ckv_session_decode. */
ckv_status ckv_decode_batch_step(ckv_decode_batch *b, ckv_session *const *sessions, const int32_t *tokens, int n,
                                 const float **logits);

/* How the device sample op picks a row's token (backend.h, `sample`): the host sampler's settings
 * without min_p (which the op does not apply) and the uniform draw the host sampler would make
 * (ckv_sampler_uniform, only when temperature > 0). */
typedef struct {
    float temperature, top_p;
    int top_k;
    double u;
} ckv_batch_pick;

/* As ckv_decode_batch_step, but row i's token is sampled on the device as picks[i] says and only the
 * ids leave it: ids[i] (host) for session i. On a backend with recorded steps (CKV_BACKEND_CAP_GRAPHS:
 * the CUDA backend's CUDA graphs) at tp 1, the step's device work (forward, logits, sampling) is
 * recorded under a key of its row count, KV dtype, each layer's key bound and each row's sampling
 * settings: the first step of a key runs as usual, the second is recorded, later ones replay it with
 * one graph launch (the members may change between them: their segment lists, ids, positions and
 * draws are uploaded before the launch). The ids are the same recorded or not. Every rank of a tensor-parallel group calls it together;
 * a rank whose ids nobody reads (a follower) passes picks and ids NULL: the step stops at the logits.
 * The host waits for the device once per step (the ids' download; a follower's sync): the inputs are
 * staged uploads, rows with equal settings are sampled by one call, and a row with a non-finite logit
 * is an error found in its id (CKV_SAMPLE_NONFINITE) on the sampling rank, which the group's agreement
 * on the step's status carries to the others. */
ckv_status ckv_decode_batch_step_ids(ckv_decode_batch *b, ckv_session *const *sessions, const int32_t *tokens, int n,
                                     const ckv_batch_pick *picks, int32_t *ids);

#endif
