/* cache_io.h - saves a session's compressed context to a cache file and loads it into a fresh
 * session, so many runs can answer questions over one compressed context. The file header names
 * the model (fingerprint), the tensor-parallel layout, the press and the context length; a file
 * made for another model or layout is refused. With tp > 1 every rank writes its own shard to
 * PATH.rank<r>. A query-aware context (compressed together with its question, which stays inside
 * the cache) also stores its answer state: the header flag "question_inside" and the prompt's last
 * logits [vocab] fp32 in the file's tail (every rank's shard holds them, as every rank holds them
 * after the prefill), so a run that loads it answers from those logits without a question. */
#ifndef CKV_ENGINE_CACHE_IO_H
#define CKV_ENGINE_CACHE_IO_H

#include "engine/session.h"

/* Saves the session's cache as it is now (call right after the context prefill). logits [vocab]:
 * the last logits of a prompt whose question is inside the cache (query-aware), or NULL for a
 * context-only cache. */
ckv_status ckv_session_save_cache(ckv_session *s, const char *path, const char *press_spec, const float *logits);

/* Loads a cache into a session created with compress = 1 and nothing prefilled yet; afterwards
 * n_past is the original context length, so questions continue at the right positions. The press
 * spec recorded in the file is copied into press_spec[cap]. logits [vocab] receives the stored
 * answer state and *question_inside is set to 1 when the file holds one (a query-aware cache), to 0
 * for a context-only cache (logits untouched). */
ckv_status ckv_session_load_cache(ckv_session *s, const char *path, char *press_spec, size_t cap, float *logits,
                                  int *question_inside);

#endif
