/* cache_io.h - saves a session's compressed context to a cache file and loads it into a fresh
 * session, so many runs can answer questions over one compressed context. The file header names
 * the model (fingerprint), the tensor-parallel layout, the press and the context length; a file
 * made for another model or layout is refused. With tp > 1 every rank writes its own shard to
 * PATH.rank<r>. A file may also hold the answer state: the prompt's last logits [vocab] fp32 in the
 * file's tail (header flag "last_logits"; every rank's shard holds them, as every rank holds them
 * after the prefill) and the flag "question_inside" (a query-aware context, compressed together with
 * its question, which stays in the cache): a run that loads it answers from those logits with no
 * question. The server's context store keeps its contexts' logits this way too. */
#ifndef CKV_ENGINE_CACHE_IO_H
#define CKV_ENGINE_CACHE_IO_H

#include "engine/session.h"

/* Saves the session's cache as it is now (call right after the context prefill). logits [vocab]:
 * the prompt's last logits to store with it, or NULL; question_inside (needs logits): the question
 * was compressed with the context (query-aware). */
ckv_status ckv_session_save_cache(ckv_session *s, const char *path, const char *press_spec, const float *logits,
                                  int question_inside);

/* Loads a cache into a session created with compress = 1 and nothing prefilled yet; afterwards
 * n_past is the original context length, so questions continue at the right positions. The press
 * spec recorded in the file is copied into press_spec[cap]. When the file holds logits they are read
 * into logits [vocab] and *has_logits is 1 (else 0, logits untouched); *question_inside is the
 * file's flag (0 for files written before it existed). */
ckv_status ckv_session_load_cache(ckv_session *s, const char *path, char *press_spec, size_t cap, float *logits,
                                  int *has_logits, int *question_inside);

#endif
