/* srv_store.h - the compressed-context store behind "compress once, ask many": contexts that were
 * prefilled (and compressed) before, keyed by model fingerprint, press spec and context ids, kept as
 * host snapshots of their KV rows plus the context's last logits, under a byte limit with LRU
 * eviction; optionally also written as engine cache files (cache_io.h) with a small sidecar (ids,
 * logits, entry counts) in a directory, so they survive restarts. A hit restores the rows into a fresh
 * session with room for the question and answer, which the request then owns (several requests may
 * reuse one context at once). Used by the engine thread only (no locking). It does not decide what a
 * context is (srv_api.c) or run the press (the engine does). */
#ifndef CKV_SRV_STORE_H
#define CKV_SRV_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/request.h"

typedef struct ckv_srv_entry ckv_srv_entry;

typedef struct {
    ckv_engine *engine;
    size_t limit, bytes;    /* memory limit and use (bytes of the snapshots) */
    int n_entries;
    ckv_srv_entry *head, *tail; /* most / least recently used */
    char dir[2048];         /* "" : memory only */
    char fingerprint[17];
} ckv_srv_store;

typedef struct {
    int hit;                /* 1: restored instead of prefilled */
    int from_disk;          /* the hit came from a cache file */
} ckv_srv_lookup;

/* Whether dir can hold cache files: an existing directory this process may write (checked at start). */
ckv_status ckv_srv_store_check_dir(const char *dir);

ckv_status ckv_srv_store_init(ckv_srv_store *s, ckv_engine *e, size_t limit, const char *dir);
void ckv_srv_store_free(ckv_srv_store *s); /* accepts zeroed objects */

/* Looks the context up (memory, then cache_dir); on a hit *pc is a prepared context restored with
 * `reserve` tokens of room (stats: reused_tokens = n, kept entries of the stored context); a memory
 * hit's session prefills in chunks of `chunk` tokens (what the question needs, not a context's). */
ckv_status ckv_srv_store_get(ckv_srv_store *s, const char *press_spec, const int32_t *ids, int n, int reserve, int chunk,
                             ckv_prepared *pc, ckv_srv_lookup *res);

/* Stores the context of a freshly prepared *pc (call before anything is fed after the context). */
ckv_status ckv_srv_store_put(ckv_srv_store *s, const char *press_spec, const int32_t *ids, int n, const ckv_prepared *pc);

/* A copy of a ready context's rows and logits outside the store (not counted in its limit; the
 * caller owns it): a lane keeps one when decode-time compression may cut its context before another
 * answer needs it. */
ckv_status ckv_srv_store_copy(ckv_srv_store *s, const ckv_prepared *pc, ckv_srv_entry **out);
/* *pc (zeroed or freed) becomes a ready context restored from such a copy, as a store hit is. */
ckv_status ckv_srv_store_restore(ckv_srv_store *s, const ckv_srv_entry *copy, int reserve, int chunk, ckv_prepared *pc);
void ckv_srv_entry_free(ckv_srv_entry *e); /* accepts NULL */

#endif
