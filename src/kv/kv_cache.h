/* kv_cache.h - the ragged KV cache of one rank and one sequence: per layer, per local KV head a
 * segment of a pooled K and V buffer with a capacity, a length and the original position of every
 * row. Rows of a head stay sorted by position. Keys and values are stored in the cache's dtype (F32,
 * F16 or BF16). Appends write in place (capacity is reserved up front, nothing is allocated per
 * token); compact() keeps a chosen set of rows per head and releases the rest by moving the layer
 * into a smaller pool (one kv_gather launch). Buffers live on the backend's device; the bookkeeping
 * (offsets, capacities, lengths) lives on the host AND in a device segment table per layer
 * (ckv_kv_seg, backend.h) that every change keeps in step, so device ops never read host memory.
 * It does not decide what to keep (that is evict/). */
#ifndef CKV_KV_CACHE_H
#define CKV_KV_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "core/status.h"

typedef struct {
    int64_t rows;     /* pool rows allocated (the sum of cap, or more in a pool reused by a gather) */
    void *kbuf;       /* [rows, head_dim] post-RoPE keys in the cache dtype (device) */
    void *vbuf;       /* [rows, head_dim] values (device) */
    int32_t *pos;     /* [rows] original positions (device) */
    int64_t *off;     /* [n_kv] first row of each head (host) */
    int32_t *cap;     /* [n_kv] rows reserved for each head (host) */
    int32_t *len;     /* [n_kv] rows used by each head (host) */
    ckv_kv_seg *segs_host; /* [n_kv] host copy of the device segment table */
    ckv_kv_seg *segs;      /* [n_kv] device segment table (stable address for the session) */
    ckv_kv_seg **seg_list; /* [1] device: &segs, the one-sequence list a ckv_kv_batch points at */
} ckv_kv_layer;

typedef struct {
    ckv_backend *be;
    int n_layers;
    int n_kv;     /* KV heads held by this rank */
    int head_dim;
    ckv_dtype dtype; /* of keys and values */
    ckv_kv_layer *layers; /* [n_layers] */
    /* compaction scratch (device), allocated by the first compaction and reused by the next ones, so a
     * compacted layer allocates only its new pool */
    ckv_kv_seg *gather_segs;  /* [n_kv] the new pool's segment table */
    int32_t *gather_n_keep;   /* [n_kv] */
    int32_t *gather_keep;     /* [n_kv, gather_stride] kept rows uploaded from the host */
    int gather_stride;
} ckv_kv_cache;

/* Sets up an empty cache (no pools yet) storing keys and values as `dtype` (F32, F16, BF16; the
 * backend must accept it). */
ckv_status ckv_kv_cache_init(ckv_kv_cache *c, ckv_backend *be, int n_layers, int n_kv, int head_dim, ckv_dtype dtype);
/* Frees every pool; accepts a partially initialised or zeroed cache. */
void ckv_kv_cache_free(ckv_kv_cache *c);

/* Bytes of one row (key + value + position) in this cache. */
size_t ckv_kv_cache_row_bytes(const ckv_kv_cache *c);

/* Gives layer `layer` a fresh pool with `cap` rows for every head, all empty (frees the old pool). */
ckv_status ckv_kv_layer_reserve(ckv_kv_cache *c, int layer, int cap);
/* 1 when the layer has a pool. */
int ckv_kv_layer_has_pool(const ckv_kv_cache *c, int layer);

/* Appends n tokens to every head of a layer: k, v [n, n_kv, head_dim] fp32 (device), pos [n]
 * (device). Fails without writing when a head would exceed its capacity. */
ckv_status ckv_kv_layer_append(ckv_kv_cache *c, int layer, const float *k, const float *v, const int32_t *pos, int n);

/* The host half of ckv_kv_append_batch: checks that every head of `layer` of caches[i] has room for
 * the rows seq_start[i] .. seq_start[i + 1] - 1 (host array; NULL when n_seq = 1: n rows) and
 * advances the host lengths by them; queues nothing. A replayed CUDA graph of a decode step, which
 * holds the kv_store, calls it alone (engine/batch.c). Fails without changing anything when a head
 * would exceed its capacity. */
ckv_status ckv_kv_account_batch(ckv_kv_cache *const *caches, int n_seq, const int32_t *seq_start, int layer, int n);

/* Appends a batch's tokens to several caches at once (one kv_store): the tokens of cache i are
 * rows seq_start[i] .. seq_start[i + 1] - 1 (host array; NULL when n_seq = 1) of k, v [n, n_kv,
 * head_dim] and pos [n] (device). b is the batch view of `layer` over exactly these caches, in
 * order. Fails without writing when any head would exceed its capacity. */
ckv_status ckv_kv_append_batch(ckv_kv_cache *const *caches, int n_seq, const int32_t *seq_start, int layer,
                               const ckv_kv_batch *b, const float *k, const float *v, const int32_t *pos, int n);

/* Keeps, for every head h, the rows keep[h * stride + i], i < n_keep[h] (row indices relative to
 * the head, ascending, < len[h]; host arrays) and reserves `room` more rows per head for later
 * appends. The layer moves to a pool of exactly sum(n_keep[h] + room) rows in one kv_gather; the
 * old pool is released. */
ckv_status ckv_kv_layer_compact(ckv_kv_cache *c, int layer, const int32_t *keep, int stride, const int32_t *n_keep,
                                int room);

/* The same with the kept rows already on the device (keep_dev [n_kv, stride], e.g. a top-k op's
 * output; trusted to be ascending rows below len[h]); n_keep stays a host array (the counts size the
 * new pool). */
ckv_status ckv_kv_layer_compact_dev(ckv_kv_cache *c, int layer, const int32_t *keep_dev, int stride,
                                    const int32_t *n_keep, int room);

/* The same kept rows read from another cache `from` of the same shape and dtype (left untouched): the
 * layer of c gets a pool of exactly sum(n_keep[h] + room) rows holding them (its old pool, if any, is
 * released), or, when c's layer holds a pool of at least that many rows (ckv_kv_cache_move_pools),
 * the rows are gathered into it and nothing is allocated. One full cache can so serve several
 * compressed copies (a sweep of presses). */
ckv_status ckv_kv_layer_gather_from(ckv_kv_cache *c, const ckv_kv_cache *from, int layer, const int32_t *keep_dev,
                                    int stride, const int32_t *n_keep, int room);

/* Moves every pool of `from` (same shape, dtype and backend) to the same layer of c, replacing the
 * pool c held there; both caches' layers that moved are left empty (no rows, no capacity), from's
 * without a pool. A later ckv_kv_layer_gather_from into c reuses a moved pool when the kept rows fit
 * it (a sweep hands one derived context's pools to the next), so the pool may hold more rows than
 * its layer uses until then. */
ckv_status ckv_kv_cache_move_pools(ckv_kv_cache *c, ckv_kv_cache *from);

/* Scratch for ckv_kv_layer_keep: a second pool as large as the cache's largest layer pool and a
 * device segment table, reserved once (before a decode loop) so that keeping rows in place
 * allocates nothing. */
typedef struct {
    ckv_backend *be;
    int64_t rows;          /* pool rows held */
    void *kbuf, *vbuf;     /* [rows, head_dim] in the cache dtype (device) */
    int32_t *pos;          /* [rows] (device) */
    ckv_kv_seg *segs;      /* [n_kv] device segment table of the scratch pool */
    ckv_kv_seg *segs_host; /* [n_kv] its host copy */
    int32_t *n_keep;       /* [n_kv] kept counts (device) */
} ckv_kv_keep_ws;

/* Sizes ws for the layer pools c holds now (a later compaction that grows a pool needs a new ws). */
ckv_status ckv_kv_keep_ws_init(ckv_kv_keep_ws *ws, const ckv_kv_cache *c);
void ckv_kv_keep_ws_free(ckv_kv_keep_ws *ws); /* accepts zeroed and partial objects */

/* Keeps, for every head h, rows keep_dev[h * stride + i], i < n_keep[h] (ascending rows below
 * len[h], trusted: a top-k op's output; n_keep a host array) inside the layer's own pool: its
 * capacity stays, so later appends need nothing new. Gathers into ws and copies back; allocates
 * nothing. */
ckv_status ckv_kv_layer_keep(ckv_kv_cache *c, int layer, const int32_t *keep_dev, int stride, const int32_t *n_keep,
                             ckv_kv_keep_ws *ws);

/* The attention/kv_store ops' view of a layer as a one-sequence batch; `extra` rows about to be
 * appended count in max_len. */
ckv_kv_batch ckv_kv_layer_batch(const ckv_kv_cache *c, int layer, int extra);

/* Host access to one head's rows, for cache files and analysis (not in the decode loop):
 * read copies rows [0, len) of head h as fp32 keys/values and positions into host buffers
 * k, v [len, head_dim], pos [len]; write replaces head h's rows with n host rows (n <= cap),
 * converting to the cache dtype. */
ckv_status ckv_kv_head_read(const ckv_kv_cache *c, int layer, int h, float *k, float *v, int32_t *pos);
/* The same for rows [row0, row0 + n) of head h (within its length): k, v [n, head_dim], pos [n];
 * a NULL buffer is not read. */
ckv_status ckv_kv_head_read_rows(const ckv_kv_cache *c, int layer, int h, int row0, int n, float *k, float *v,
                                 int32_t *pos);
ckv_status ckv_kv_head_write(ckv_kv_cache *c, int layer, int h, const float *k, const float *v, const int32_t *pos,
                             int n);

/* Sets every head's length of every layer back to lens[layer * n_kv + h] (<= current length):
 * drops the rows appended after a snapshot (a question's tokens) without touching the rows before. */
ckv_status ckv_kv_cache_truncate(ckv_kv_cache *c, const int32_t *lens);
/* Copies every head's current length into lens [n_layers * n_kv]. */
void ckv_kv_cache_lengths(const ckv_kv_cache *c, int32_t *lens);

/* Device bytes held by the pools (K, V and positions) / bytes of the rows in use. */
size_t ckv_kv_cache_bytes_reserved(const ckv_kv_cache *c);
size_t ckv_kv_cache_bytes_used(const ckv_kv_cache *c);

#endif
