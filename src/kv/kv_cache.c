/* kv_cache.c - ragged KV cache pools, append, compact and truncate (see kv_cache.h). */
#include "kv/kv_cache.h"

#include <stdlib.h>
#include <string.h>

static void kv_layer_release(ckv_backend *be, ckv_kv_layer *l) {
    be->ops->release(be, l->k);
    be->ops->release(be, l->v);
    be->ops->release(be, l->pos);
    l->k = l->v = NULL;
    l->pos = NULL;
    l->rows = 0;
}

ckv_status ckv_kv_cache_init(ckv_kv_cache *c, ckv_backend *be, int n_layers, int n_kv, int head_dim) {
    memset(c, 0, sizeof *c);
    if (n_layers < 1 || n_kv < 1 || head_dim < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "KV cache shape %d layers x %d heads x %d dims is invalid", n_layers, n_kv,
                         head_dim);
    c->be = be;
    c->n_layers = n_layers;
    c->n_kv = n_kv;
    c->head_dim = head_dim;
    c->layers = calloc((size_t)n_layers, sizeof *c->layers);
    if (!c->layers) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the KV cache tables");
    for (int i = 0; i < n_layers; i++) {
        ckv_kv_layer *l = &c->layers[i];
        l->off = calloc((size_t)n_kv, sizeof *l->off);
        l->cap = calloc((size_t)n_kv, sizeof *l->cap);
        l->len = calloc((size_t)n_kv, sizeof *l->len);
        if (!l->off || !l->cap || !l->len) {
            ckv_kv_cache_free(c);
            return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the KV cache tables");
        }
    }
    return CKV_STATUS_OK;
}

void ckv_kv_cache_free(ckv_kv_cache *c) {
    if (!c || !c->layers) return;
    for (int i = 0; i < c->n_layers; i++) {
        ckv_kv_layer *l = &c->layers[i];
        if (c->be) kv_layer_release(c->be, l);
        free(l->off);
        free(l->cap);
        free(l->len);
    }
    free(c->layers);
    memset(c, 0, sizeof *c);
}

static ckv_status kv_layer_alloc(ckv_kv_cache *c, ckv_kv_layer *l, int64_t rows) {
    ckv_backend *be = c->be;
    size_t rb = (size_t)(rows > 0 ? rows : 1);
    size_t kbytes = rb * (size_t)c->head_dim * sizeof(float);
    CKV_TRY(be->ops->alloc(be, (void **)&l->k, kbytes, "KV cache keys"));
    CKV_TRY(be->ops->alloc(be, (void **)&l->v, kbytes, "KV cache values"));
    CKV_TRY(be->ops->alloc(be, (void **)&l->pos, rb * sizeof(int32_t), "KV cache positions"));
    l->rows = rows;
    return CKV_STATUS_OK;
}

ckv_status ckv_kv_layer_reserve(ckv_kv_cache *c, int layer, int cap) {
    if (layer < 0 || layer >= c->n_layers) return ckv_error(CKV_STATUS_ERR_ARG, "KV cache layer %d out of range", layer);
    if (cap < 1) return ckv_error(CKV_STATUS_ERR_ARG, "KV cache capacity %d must be positive", cap);
    ckv_kv_layer *l = &c->layers[layer];
    kv_layer_release(c->be, l);
    ckv_status s = kv_layer_alloc(c, l, (int64_t)cap * c->n_kv);
    if (s != CKV_STATUS_OK) {
        kv_layer_release(c->be, l);
        return s;
    }
    for (int h = 0; h < c->n_kv; h++) {
        l->off[h] = (int64_t)h * cap;
        l->cap[h] = cap;
        l->len[h] = 0;
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_kv_layer_append(ckv_kv_cache *c, int layer, const float *k, const float *v, const int32_t *pos, int n) {
    ckv_kv_layer *l = &c->layers[layer];
    if (!l->k) return ckv_error(CKV_STATUS_ERR_INTERNAL, "KV cache layer %d has no pool", layer);
    for (int h = 0; h < c->n_kv; h++)
        if (l->len[h] + n > l->cap[h])
            return ckv_error(CKV_STATUS_ERR_RANGE, "KV cache layer %d head %d is full (%d of %d rows, %d more asked)",
                             layer, h, l->len[h], l->cap[h], n);
    c->be->ops->kv_store(c->be, l->k, l->v, l->pos, l->off, l->len, k, v, pos, n, c->n_kv, c->head_dim);
    for (int h = 0; h < c->n_kv; h++) l->len[h] += n;
    return CKV_STATUS_OK;
}

/* Copies rows src[a..b) of a pool to dst row d (K, V and positions). */
static ckv_status kv_copy_rows(ckv_kv_cache *c, ckv_kv_layer *dst, int64_t drow, const ckv_kv_layer *src,
                               int64_t srow, int64_t n) {
    ckv_backend *be = c->be;
    size_t w = (size_t)c->head_dim;
    CKV_TRY(be->ops->copy(be, dst->k + drow * w, src->k + srow * w, (size_t)n * w * sizeof(float)));
    CKV_TRY(be->ops->copy(be, dst->v + drow * w, src->v + srow * w, (size_t)n * w * sizeof(float)));
    CKV_TRY(be->ops->copy(be, dst->pos + drow, src->pos + srow, (size_t)n * sizeof(int32_t)));
    return CKV_STATUS_OK;
}

ckv_status ckv_kv_layer_compact(ckv_kv_cache *c, int layer, const int32_t *const *keep, const int32_t *n_keep,
                                int room) {
    if (layer < 0 || layer >= c->n_layers) return ckv_error(CKV_STATUS_ERR_ARG, "KV cache layer %d out of range", layer);
    if (room < 0) return ckv_error(CKV_STATUS_ERR_ARG, "KV cache room %d is negative", room);
    ckv_kv_layer *old = &c->layers[layer];
    int64_t rows = 0;
    for (int h = 0; h < c->n_kv; h++) {
        if (n_keep[h] < 0 || n_keep[h] > old->len[h])
            return ckv_error(CKV_STATUS_ERR_ARG, "layer %d head %d: cannot keep %d of %d rows", layer, h, n_keep[h],
                             old->len[h]);
        for (int i = 0; i < n_keep[h]; i++)
            if (keep[h][i] < 0 || keep[h][i] >= old->len[h] || (i > 0 && keep[h][i] <= keep[h][i - 1]))
                return ckv_error(CKV_STATUS_ERR_ARG, "layer %d head %d: keep list is not ascending rows below %d",
                                 layer, h, old->len[h]);
        rows += n_keep[h] + room;
    }
    ckv_kv_layer nl;
    memset(&nl, 0, sizeof nl);
    ckv_status s = kv_layer_alloc(c, &nl, rows);
    if (s != CKV_STATUS_OK) {
        kv_layer_release(c->be, &nl);
        return s;
    }
    int64_t at = 0;
    for (int h = 0; h < c->n_kv && s == CKV_STATUS_OK; h++) {
        int i = 0;
        while (i < n_keep[h] && s == CKV_STATUS_OK) { /* copy maximal runs of consecutive rows at once */
            int j = i + 1;
            while (j < n_keep[h] && keep[h][j] == keep[h][j - 1] + 1) j++;
            s = kv_copy_rows(c, &nl, at + i, old, old->off[h] + keep[h][i], j - i);
            i = j;
        }
        old->off[h] = at; /* bookkeeping arrays are reused; pools are swapped below */
        old->cap[h] = n_keep[h] + room;
        old->len[h] = n_keep[h];
        at += n_keep[h] + room;
    }
    if (s != CKV_STATUS_OK) {
        kv_layer_release(c->be, &nl);
        return s;
    }
    kv_layer_release(c->be, old);
    old->k = nl.k;
    old->v = nl.v;
    old->pos = nl.pos;
    old->rows = nl.rows;
    return CKV_STATUS_OK;
}

ckv_attn_cache ckv_kv_layer_view(const ckv_kv_cache *c, int layer) {
    const ckv_kv_layer *l = &c->layers[layer];
    ckv_attn_cache v = {l->k, l->v, l->pos, l->off, l->len, c->n_kv, c->head_dim};
    return v;
}

ckv_status ckv_kv_cache_truncate(ckv_kv_cache *c, const int32_t *lens) {
    for (int i = 0; i < c->n_layers; i++)
        for (int h = 0; h < c->n_kv; h++)
            if (lens[i * c->n_kv + h] < 0 || lens[i * c->n_kv + h] > c->layers[i].len[h])
                return ckv_error(CKV_STATUS_ERR_ARG, "KV truncate: layer %d head %d length %d exceeds %d", i, h,
                                 lens[i * c->n_kv + h], c->layers[i].len[h]);
    for (int i = 0; i < c->n_layers; i++)
        for (int h = 0; h < c->n_kv; h++) c->layers[i].len[h] = lens[i * c->n_kv + h];
    return CKV_STATUS_OK;
}

void ckv_kv_cache_lengths(const ckv_kv_cache *c, int32_t *lens) {
    for (int i = 0; i < c->n_layers; i++)
        for (int h = 0; h < c->n_kv; h++) lens[i * c->n_kv + h] = c->layers[i].len[h];
}

static size_t kv_row_bytes(const ckv_kv_cache *c) { return (size_t)c->head_dim * 2 * sizeof(float) + sizeof(int32_t); }

size_t ckv_kv_cache_bytes_reserved(const ckv_kv_cache *c) {
    size_t b = 0;
    for (int i = 0; i < c->n_layers; i++) b += (size_t)c->layers[i].rows * kv_row_bytes(c);
    return b;
}

size_t ckv_kv_cache_bytes_used(const ckv_kv_cache *c) {
    size_t b = 0;
    for (int i = 0; i < c->n_layers; i++)
        for (int h = 0; h < c->n_kv; h++) b += (size_t)c->layers[i].len[h] * kv_row_bytes(c);
    return b;
}
