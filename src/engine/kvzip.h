/* kvzip.h - KVzip's context replay (kvpress 0.5.5 KVzipPress, arXiv 2505.23416): after the context's
 * prefill, the model is fed "repeat the context" prompts followed by the context itself, chunk by
 * chunk, against the full cache; each (layer, KV head, context token) scores the largest attention
 * any replayed token of the group pays it, softmaxed over the sinks, the chunk being replayed and the
 * replay itself. It scores only: the one selection over the model and the compaction are
 * select_model.h's and compress.c's. It does not tokenise (the prompts arrive as press options). */
#ifndef CKV_ENGINE_KVZIP_H
#define CKV_ENGINE_KVZIP_H

#include <stdint.h>

#include "engine/session.h"
#include "evict/press.h"

/* The replay prompts are given and hold ids of a vocabulary of vocab_size (an error names the option). */
ckv_status ckv_kvzip_check(const ckv_press_config *cfg, int vocab_size);

/* Rows the replay of an L-token context needs after it: its longest prompt + suffix + chunk. */
int ckv_kvzip_replay_rows(const ckv_press_config *cfg, int L);

/* Replays the context ids[L] that s holds (every layer whole: rows 0 .. L-1 of every local head, its
 * prefill's layers all run, s->n_past == 0) and writes scores [n_layers, n_kv_local, L] (device,
 * float32): the replay's attention maxima, the first n_sink tokens at the model's maximum + 1 (over
 * every layer, head and rank). The replay uses the session's rows L .. L + ckv_kvzip_replay_rows - 1
 * (hidden states, attention inputs, positions, KV rows), which must fit its capacity, and leaves
 * every layer holding its L context rows again; rows 0 .. L - 1 of the hidden states are untouched. */
ckv_status ckv_kvzip_score(ckv_session *s, const ckv_press_config *cfg, const int32_t *ids, int L, float *scores);

#endif
