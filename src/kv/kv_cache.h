/* kv_cache.h - the ragged KV cache of one rank: per layer, per local KV head a segment of a pooled
 * K and V buffer with a capacity, a length and the original position of every row. Rows of a head
 * stay sorted by position. Appends write in place (capacity is reserved up front, nothing is
 * allocated per token); compact() keeps a chosen set of rows per head and releases the rest by
 * moving the layer into a smaller pool. Buffers live on the backend's device; the bookkeeping
 * (offsets, capacities, lengths) on the host. It does not decide what to keep (that is evict/). */
#ifndef CKV_KV_CACHE_H
#define CKV_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/status.h"

typedef struct {
    int64_t rows; /* pool rows allocated (sum of cap) */
    float *k;     /* [rows, head_dim] post-RoPE keys (device) */
    float *v;     /* [rows, head_dim] values (device) */
    int32_t *pos; /* [rows] original positions (device) */
    int64_t *off; /* [n_kv] first row of each head (host) */
    int32_t *cap; /* [n_kv] rows reserved for each head (host) */
    int32_t *len; /* [n_kv] rows used by each head (host) */
} ckv_kv_layer;

typedef struct {
    ckv_backend *be;
    int n_layers;
    int n_kv;     /* KV heads held by this rank */
    int head_dim;
    ckv_kv_layer *layers; /* [n_layers] */
} ckv_kv_cache;

/* Sets up an empty cache (no pools yet). */
ckv_status ckv_kv_cache_init(ckv_kv_cache *c, ckv_backend *be, int n_layers, int n_kv, int head_dim);
/* Frees every pool; accepts a partially initialised or zeroed cache. */
void ckv_kv_cache_free(ckv_kv_cache *c);

/* Gives layer `layer` a fresh pool with `cap` rows for every head, all empty (frees the old pool). */
ckv_status ckv_kv_layer_reserve(ckv_kv_cache *c, int layer, int cap);

/* Appends n tokens to every head of a layer: k, v [n, n_kv, head_dim] (device), pos [n] (device).
 * Fails without writing when a head would exceed its capacity. */
ckv_status ckv_kv_layer_append(ckv_kv_cache *c, int layer, const float *k, const float *v, const int32_t *pos, int n);

/* Keeps, for every head h, the rows keep[h][0 .. n_keep[h]) (row indices relative to the head,
 * ascending, < len[h]) and reserves `room` more rows per head for later appends. The layer moves to a
 * pool of exactly sum(n_keep[h] + room) rows; the old pool is released. */
ckv_status ckv_kv_layer_compact(ckv_kv_cache *c, int layer, const int32_t *const *keep, const int32_t *n_keep,
                                int room);

/* The attention op's view of a layer. The host bookkeeping arrays are passed as they are, which is
 * what the CPU backend reads. */
ckv_attn_cache ckv_kv_layer_view(const ckv_kv_cache *c, int layer);

/* Sets every head's length of every layer back to lens[layer * n_kv + h] (<= current length):
 * drops the rows appended after a snapshot (a question's tokens) without touching the rows before. */
ckv_status ckv_kv_cache_truncate(ckv_kv_cache *c, const int32_t *lens);
/* Copies every head's current length into lens [n_layers * n_kv]. */
void ckv_kv_cache_lengths(const ckv_kv_cache *c, int32_t *lens);

/* Device bytes held by the pools (K, V and positions) / bytes of the rows in use. */
size_t ckv_kv_cache_bytes_reserved(const ckv_kv_cache *c);
size_t ckv_kv_cache_bytes_used(const ckv_kv_cache *c);

#endif
