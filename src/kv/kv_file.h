/* kv_file.h - saves a rank's (compressed) KV cache to a file and loads it back: every layer's
 * per-head rows (original positions, keys, values) with a caller-supplied JSON header describing
 * what the cache belongs to (model fingerprint, press, context length). The file is versioned and
 * checksummed (FNV-1a 64 over everything before the trailer); a truncated, corrupted or foreign
 * file is refused with a message naming the file and the problem; only regular files are read (a FIFO
 * or device in its place is refused without blocking). It does not decide whether the header matches a
 * model: the caller compares. */
#ifndef CKV_KV_FILE_H
#define CKV_KV_FILE_H

#include "kv/kv_cache.h"

/* Version 2 added the tail section (fp32 values after the rows, e.g. a prompt's last logits);
 * version 1 files are still read, as files with an empty tail. */
#define CKV_KV_FILE_VERSION 2

/* Writes the cache (rows in use of every head of every layer), `meta_json` and tail [n_tail] (fp32,
 * may be NULL with n_tail 0) to path (via a synced temporary file renamed into place, so a failed
 * save never leaves a half-written file; a target that is not a regular file, e.g. a device,
 * directory or symbolic link, is refused). */
ckv_status ckv_kv_cache_save(const ckv_kv_cache *c, const char *path, const char *meta_json, const float *tail, uint32_t n_tail);

/* Reads a file written by ckv_kv_cache_save into a cache initialised with the same shape
 * (n_layers, n_kv, head_dim; checked), reserving `room` extra rows per head for later appends.
 * The file's tail must hold exactly n_tail values (finite), read into tail [n_tail].
 * ctx_len is the context the rows came from: a head may hold at most ctx_len rows, at ascending
 * positions in [0, ctx_len); with `full` (an uncompressed cache) exactly the positions 0 .. ctx_len-1.
 * Sizes are checked against the file before anything is allocated and the checksum before any row
 * is used; non-finite keys or values are refused. *meta_json receives the header (free with free()). */
ckv_status ckv_kv_cache_load(ckv_kv_cache *c, const char *path, int room, int ctx_len, int full, float *tail, uint32_t n_tail,
                             char **meta_json);

/* The checksum trailer of a cache file (what its content hashes to when it is intact), read without
 * the rest: lets a caller tie the file to a record of it (e.g. the context store's sidecar). */
ckv_status ckv_kv_file_checksum(const char *path, uint64_t *sum);

/* Reads only the header of a cache file (to check it before loading). */
ckv_status ckv_kv_file_read_meta(const char *path, char **meta_json);

#endif
