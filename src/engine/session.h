/* session.h - one inference session on one rank: a KV cache and activation buffers sized once for
 * `capacity` tokens, layer-major chunked prefill (every chunk of the prompt through layer l, then
 * layer l + 1; docs/architecture.md, "One request today") and single-token decode steps that allocate nothing.
 * It does not tokenise, sample or print. */
#ifndef CKV_SESSION_H
#define CKV_SESSION_H

#include <stddef.h>
#include <stdint.h>

#include "kv/kv_cache.h"
#include "model/model.h"

typedef struct ckv_session ckv_session;

/* Called after layer `layer` has seen the whole prompt chunk set (for eviction). */
typedef ckv_status (*ckv_layer_hook)(void *ctx, ckv_session *s, int layer, int n_prompt);

struct ckv_session {
    ckv_model *model;
    uint64_t id;    /* unique in the process (a freed session's address may be reused; its id is not) */
    ckv_kv_cache kv;
    ckv_model_scratch scratch;
    int capacity;   /* most tokens (prompt + generated) the session holds */
    int chunk;      /* prefill chunk length */
    int n_past;     /* tokens already in the cache = next position */
    int compress;   /* layers are compressed after prefill: pools are reserved layer by layer */
    float *x;       /* [capacity, D] hidden states of the tokens being prefilled (device) */
    float *xn;      /* [capacity, D] attention input of the layer being prefilled (compress only) */
    int32_t *pos;   /* [capacity] host positions */
    int32_t *mark_lens; /* [n_layers * n_kv_local] cache lengths at ckv_session_mark */
    int mark_past;      /* n_past at ckv_session_mark (-1: none) */
    int pf_n;           /* tokens of the prefill in progress (0: none) */
    int pf_layer;       /* the next layer it runs */
    /* During a layer hook: the roped queries the forward computed for the last q_tail_rows rows of the
     * prompt (rows q_tail_end - q_tail_rows .. q_tail_end - 1) of layer q_tail_layer, [q_tail_rows,
     * n_q_local * d] (device, the forward's scratch or a sweep's copy); the window scorers read them
     * instead of recomputing them. NULL outside a hook. */
    const float *q_tail;
    int q_tail_rows, q_tail_end, q_tail_layer;
    /* statistics */
    double prefill_seconds, decode_seconds;
    long prefill_tokens, decode_tokens;
};

/* `compress` of a session whose layers are compacted from another session's full cache (engine/sweep.h):
 * pools reserved lazily as with compress = 1, but no attention inputs (the scorers read the other's). */
#define CKV_SESSION_DERIVED 2

/* Reserves everything for up to `capacity` tokens with prefill chunks of `chunk` tokens. With
 * `compress`, the KV pool of a layer is reserved only when the first prefill reaches it (full
 * capacity) so that the layer hook can compact it before the next layer: peak KV is the compressed
 * layers plus one full layer; the attention input of each layer is kept for the scorers. */
ckv_status ckv_session_init(ckv_session *s, ckv_model *m, int capacity, int chunk, int compress);
/* The same with the KV cache stored as kv_dtype (F32, F16, BF16; ckv_session_init takes the
 * backend's default, be->kv_dtype). */
ckv_status ckv_session_init_kv(ckv_session *s, ckv_model *m, int capacity, int chunk, int compress, ckv_dtype kv_dtype);
void ckv_session_free(ckv_session *s); /* accepts partial objects */

/* Prefills ids[n] at positions n_past .. n_past + n - 1, layer-major in chunks. When all_logits is
 * not NULL it receives [n, V] logits of every prompt position; *last (if not NULL) points at the
 * logits [V] of the last token (valid until the next call). */
ckv_status ckv_session_prefill(ckv_session *s, const int32_t *ids, int n, float *all_logits, const float **last);

/* Same with a hook run after each layer (eviction). */
ckv_status ckv_session_prefill_hook(ckv_session *s, const int32_t *ids, int n, float *all_logits, const float **last,
                                    ckv_layer_hook hook, void *hook_ctx);

/* The same prefill one layer per call, so that a caller can run other work between two layers of a
 * long prompt (a server's decode steps): begin embeds ids[n] (they are not needed afterwards), each
 * ckv_session_prefill_layer runs the next layer over every chunk (then `hook`, may be NULL) and
 * sets *done after the last one; ckv_session_prefill_end then computes the logits as
 * ckv_session_prefill does and advances n_past. Nothing else may be fed to the session in between;
 * a prefill left unfinished is dropped by ckv_session_prefill_abort, after which the layers it ran hold
 * part of the prompt: rewind the session to a mark or free it. */
ckv_status ckv_session_prefill_begin(ckv_session *s, const int32_t *ids, int n);
ckv_status ckv_session_prefill_layer(ckv_session *s, ckv_layer_hook hook, void *hook_ctx, int *done);
ckv_status ckv_session_prefill_end(ckv_session *s, float *all_logits, const float **last);
/* Runs a layer's hook with s->q_tail set to q_tail [q_tail_rows, n_q_local * d] (device: the queries
 * the forward computed for the prompt's last q_tail_rows rows, 0 = none), cleared when it returns. */
ckv_status ckv_session_run_hook(ckv_session *s, ckv_layer_hook hook, void *hook_ctx, int layer, int n_prompt,
                                const float *q_tail, int q_tail_rows);
void ckv_session_prefill_abort(ckv_session *s);

/* Feeds one token at position n_past; *logits points at its [V] logits. */
ckv_status ckv_session_decode(ckv_session *s, int32_t token, const float **logits);

/* Remembers the cache state (after a compressed context) / returns to it, dropping every token
 * added since (a question and its answer) without touching the rows before. */
ckv_status ckv_session_mark(ckv_session *s);
ckv_status ckv_session_rewind(ckv_session *s);

/* Bytes the session reserved on the device (KV pools + activations + hidden states). */
size_t ckv_session_bytes(const ckv_session *s);
/* Bytes a session of `capacity` tokens with prefill chunks of `chunk` would reserve (full KV in the
 * backend's KV dtype). */
size_t ckv_session_bytes_for(const ckv_model *m, int capacity, int chunk);

#endif
