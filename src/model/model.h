/* model.h - one rank's share of a Llama / Mistral / Qwen2 model and its transformer forward.
 * Loading reads only this rank's slice of every tensor (shard/ plan) from a Hugging Face model
 * directory. The forward is split so the engine can run it layer-major: embed -> layer l over a
 * chunk of tokens (appending that chunk's keys and values to the layer's cache) -> final norm and
 * logits. Row-parallel projections end in an all-reduce over the TP communicator. It does not
 * sample, choose what to evict or own a KV cache. */
#ifndef CKV_MODEL_H
#define CKV_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "comm/comm.h"
#include "kv/kv_cache.h"
#include "model/config.h"
#include "shard/shard.h"

/* Matrices are typed (ckv_weight: the dtype the backend computes); norms and biases are fp32. */
typedef struct {
    float *attn_norm; /* [D] */
    ckv_weight wq;    /* [n_q_local * d, D] */
    float *bq;        /* [n_q_local * d] or NULL */
    ckv_weight wk;    /* [n_kv_local * d, D] */
    float *bk;        /* [n_kv_local * d] or NULL */
    ckv_weight wv;    /* [n_kv_local * d, D] */
    float *bv;        /* [n_kv_local * d] or NULL */
    ckv_weight wo;    /* [D, n_q_local * d] (this rank's columns of o_proj) */
    float *bo;        /* [D] o_proj bias (Llama attention_bias) on TP rank 0 only, else NULL */
    float *mlp_norm;  /* [D] */
    ckv_weight wgate; /* [n_ff_local, D] */
    ckv_weight wup;   /* [n_ff_local, D] */
    ckv_weight wdown; /* [D, n_ff_local] */
} ckv_layer_weights;

/* How weights are loaded. */
typedef struct {
    /* dtype of the weight matrices: F32, F16 or BF16; CKV_DTYPE_DEFAULT = the backend's choice
     * (be->weight_dtype). The backend must compute it (weight_dtype_ok). */
    ckv_dtype weights_dtype;
    /* 1: a matrix stored in a dtype the backend computes (weight_dtype_ok: GGUF blocks, F16, BF16 on
     * the CPU) is kept as stored; the others are converted to weights_dtype. */
    int as_stored;
    /* 1: draw the weights from random_seed (source_random.c) instead of reading the model path, which
     * needs only config.json (--random-weights SEED; benchmarks and scale tests). Commands whose
     * output would be meaningless with it (eval, fidelity) refuse it. */
    int random_weights;
    uint64_t random_seed;
} ckv_model_opts;

typedef struct {
    ckv_model_config cfg;
    ckv_shard_plan plan;
    ckv_backend *be;
    ckv_comm *tp;           /* tensor-parallel group (borrowed) */
    ckv_comm *replica;      /* the ranks of the group holding the same KV heads (owned; NULL unless tp > Hkv) */
    ckv_weight embed;       /* [V, D] token embeddings (replicated) */
    ckv_weight lm_head;     /* [n_vocab_local, D]; shares embed's data when tied and unsharded */
    int lm_head_tied;       /* lm_head.data is embed.data (not freed twice) */
    float *final_norm;      /* [D] */
    ckv_layer_weights *layers; /* [n_layers] */
    float *inv_freq;        /* [d / 2] (device) */
    float rope_scale;       /* cos/sin multiplier (YaRN attention factor) */
    size_t weight_bytes;    /* device bytes of this rank's weights */
    ckv_dtype wdtype;       /* dtype of the weight matrices not kept as stored */
    int as_stored;          /* matrices the backend computes in their stored dtype are kept so */
    void *stage[2];         /* the loader's host staging (0: fp32 values, 1: bytes to upload), kept from one
                               tensor to the next and freed when loading ends */
    size_t stage_cap[2];    /* bytes */
} ckv_model;

/* Rows of logits computed at once: a prefill needs the last row only, parity tests ask for more and
 * get them in groups of this many (a [chunk, vocab] buffer would be ~100 MiB at a 512-token chunk). */
#define CKV_LOGITS_ROWS 32

/* Activation buffers for chunks of up to n_max tokens (device), allocated once per session. */
typedef struct {
    int n_max;
    float *xn;     /* [n_max, D] normed input */
    float *q;      /* [n_max, n_q_local * d]; after a layer call: its n rows' queries, post-RoPE, until the next
                    * call (a prefill's layer hook hands the last ones to the window scorers) */
    float *k;      /* [n_max, n_kv_local * d] */
    float *v;      /* [n_max, n_kv_local * d] */
    float *att;    /* [n_max, n_q_local * d] */
    float *gate;   /* [n_max, n_ff_local] */
    float *up;     /* [n_max, n_ff_local] */
    float *proj;   /* [n_max, D] partial output of a row-parallel projection */
    int n_logits;  /* rows the logits buffers hold: min(n_max, CKV_LOGITS_ROWS) */
    float *logits; /* [n_logits, n_vocab_local] */
    int32_t *pos;  /* [n_max] positions (device) */
    int32_t *pos_host; /* [n_max] what pos holds (host), valid for pos_n rows: the layers of one
                        * forward share their positions, so only the first uploads them */
    int pos_n;
    int32_t *ids;  /* [n_max] token ids (device) */
    float *host_logits; /* [n_logits, V] gathered logits (host) */
    float *host_part;   /* [n_logits, padded vocab slice * tp] all-gather staging (host) */
} ckv_model_scratch;

/* Loads rank plan->rank's share of the model in `dir`. tp may be NULL (one rank). opts may be NULL
 * (defaults); opts->random_weights loads as ckv_model_load_random with opts->random_seed. */
ckv_status ckv_model_load(ckv_model **out, const char *dir, ckv_backend *be, ckv_comm *tp);
ckv_status ckv_model_load_opts(ckv_model **out, const char *dir, ckv_backend *be, ckv_comm *tp,
                               const ckv_model_opts *opts);
/* The same with every weight drawn from `seed` (model/source_random.c) instead of read: dir needs
 * only config.json (--random-weights SEED; benchmarks and scale tests). Commands whose output would
 * be meaningless with it (eval, fidelity) refuse it. */
ckv_status ckv_model_load_random(ckv_model **out, const char *dir, ckv_backend *be, ckv_comm *tp,
                                 const ckv_model_opts *opts, uint64_t seed);
void ckv_model_free(ckv_model *m); /* NULL and partial objects are fine */

ckv_status ckv_model_scratch_init(ckv_model_scratch *s, const ckv_model *m, int n_max);
void ckv_model_scratch_free(ckv_model_scratch *s, const ckv_model *m);

/* x[n, D] (device) = embeddings of ids[n] (host ids; checked against the vocabulary). */
ckv_status ckv_model_embed(ckv_model *m, ckv_model_scratch *s, float *x, const int32_t *ids, int n);
/* The two halves of ckv_model_embed, for a step whose device work must not upload (a CUDA graph's
 * capture or replay, engine/batch.c): ckv_model_ids_put checks ids[n] and uploads them into s->ids;
 * ckv_model_embed_ids queues x[n, D] = embeddings of s->ids (no host value but n). */
ckv_status ckv_model_ids_put(ckv_model *m, ckv_model_scratch *s, const int32_t *ids, int n);
void ckv_model_embed_ids(ckv_model *m, ckv_model_scratch *s, float *x, int n);
/* s->pos [n] = pos [n] (host): uploaded only when it differs from what s->pos holds. The layers call
 * it with their positions; a caller that puts them first makes the layers upload nothing. */
ckv_status ckv_model_positions_put(ckv_model *m, ckv_model_scratch *s, const int32_t *pos, int n);

/* Runs decoder layer `layer` in place on x[n, D] (device) for tokens at host positions pos[n]:
 * appends their keys/values to the layer's cache, attends over the cache, adds the MLP. n <= n_max.
 * xn_out [n, D] (device), when not NULL, receives the attention input (post input-RMSNorm), which
 * the eviction scorers read. */
ckv_status ckv_model_layer(ckv_model *m, ckv_model_scratch *s, int layer, float *x, const int32_t *pos, int n,
                           ckv_kv_cache *kv, float *xn_out);

/* The same over several KV caches at once (batched decode and prefill): the tokens of caches[i] are
 * rows seq_start[i] .. seq_start[i + 1] - 1 (host) of x, at host positions pos; kv is the layer's
 * batch view over these caches (its seq_of/seq_start device arrays describe the same split).
 * xn_out [n, D] as for ckv_model_layer (may be NULL). */
ckv_status ckv_model_layer_batch(ckv_model *m, ckv_model_scratch *s, int layer, float *x, const int32_t *pos, int n,
                                 ckv_kv_cache *const *caches, int n_seq, const int32_t *seq_start,
                                 const ckv_kv_batch *kv, float *xn_out);

/* Fails with CKV_STATUS_ERR_NUMERIC naming `layer` when x [n, D] (device) holds a NaN or Inf;
 * synchronises the backend (prefill calls it once per layer). */
ckv_status ckv_model_check_finite(ckv_model *m, const float *x, int n, int layer);

/* Final norm + lm_head of x[n, D] (device), n <= s->n_logits: full-vocabulary logits [n, V] on the
 * host (gathered over the TP group), returned as a pointer into the scratch (valid until the next
 * call). Non-finite logits are an error (CKV_STATUS_ERR_NUMERIC). */
ckv_status ckv_model_logits(ckv_model *m, ckv_model_scratch *s, const float *x, int n, const float **logits);

/* As ckv_model_logits, but the logits [n, V] stay on the device (for the device sample op): at tp 1
 * they are the scratch's, at tp > 1 the gathered slices are copied into `full` [n, V] (device, the
 * caller's; NULL allowed at tp 1). Every rank of the group calls it together. Nothing here waits
 * for the device or checks the values: the sample op returns CKV_SAMPLE_NONFINITE for a row with a
 * non-finite logit, and its caller makes that the error ckv_model_logits would give. */
ckv_status ckv_model_logits_device(ckv_model *m, ckv_model_scratch *s, const float *x, int n, float *full,
                                   const float **logits);
/* The device logits [n, V] ckv_model_logits_device gave (logits_dev) downloaded into the scratch's
 * host rows and checked as ckv_model_logits checks them; *logits points at them (valid until the
 * next call). The download is the host wait. */
ckv_status ckv_model_logits_fetch(ckv_model *m, ckv_model_scratch *s, const float *logits_dev, int n,
                                  const float **logits);

/* A 16-hex-digit fingerprint of the model (its configuration and samples of its weights), the same
 * on every rank; cache files record it so a cache is never loaded into another model. */
ckv_status ckv_model_fingerprint(const ckv_model *m, char out[17]);

/* Bytes of weights a rank would need for a given plan (for `ckv inspect`) with matrices stored as
 * `dtype` (F32, F16, BF16; norms and biases fp32). */
size_t ckv_model_weight_bytes(const ckv_model_config *cfg, const ckv_shard_plan *plan);
size_t ckv_model_weight_bytes_dtype(const ckv_model_config *cfg, const ckv_shard_plan *plan, ckv_dtype dtype);

#endif
