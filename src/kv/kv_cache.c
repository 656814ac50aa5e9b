/* kv_cache.c - ragged KV cache pools, append, compact and truncate, with the device segment table
 * of every layer kept in step with the host bookkeeping (see kv_cache.h). */
#include "kv/kv_cache.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

static size_t kv_elem(const ckv_kv_cache *c) { return ckv_dtype_size(c->dtype); }

size_t ckv_kv_cache_row_bytes(const ckv_kv_cache *c) {
    return (size_t)c->head_dim * 2 * kv_elem(c) + sizeof(int32_t);
}

static void kv_pool_release(ckv_backend *be, ckv_kv_layer *l) {
    be->ops->release(be, l->kbuf);
    be->ops->release(be, l->vbuf);
    be->ops->release(be, l->pos);
    l->kbuf = l->vbuf = NULL;
    l->pos = NULL;
    l->rows = 0;
}

/* Points the host segment table at the pool (off/cap/len) and uploads it. */
static ckv_status kv_segs_sync(ckv_kv_cache *c, ckv_kv_layer *l) {
    const size_t rowb = (size_t)c->head_dim * kv_elem(c);
    for (int h = 0; h < c->n_kv; h++) {
        ckv_kv_seg *g = &l->segs_host[h];
        g->k = l->kbuf ? (char *)l->kbuf + (size_t)l->off[h] * rowb : NULL;
        g->v = l->vbuf ? (char *)l->vbuf + (size_t)l->off[h] * rowb : NULL;
        g->pos = l->pos ? l->pos + l->off[h] : NULL;
        g->len = l->len[h];
        g->cap = l->cap[h];
    }
    return c->be->ops->upload(c->be, l->segs, l->segs_host, (size_t)c->n_kv * sizeof(ckv_kv_seg));
}

ckv_status ckv_kv_cache_init(ckv_kv_cache *c, ckv_backend *be, int n_layers, int n_kv, int head_dim, ckv_dtype dtype) {
    memset(c, 0, sizeof *c);
    if (n_layers < 1 || n_kv < 1 || head_dim < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "KV cache shape %d layers x %d heads x %d dims is invalid", n_layers, n_kv,
                         head_dim);
    if ((dtype != CKV_DTYPE_F32 && dtype != CKV_DTYPE_F16 && dtype != CKV_DTYPE_BF16) || !be->ops->kv_dtype_ok(be, dtype))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "--kv-dtype %s: the %s backend cannot store the KV cache in it",
                         ckv_dtype_name(dtype), be->name);
    c->be = be;
    c->n_layers = n_layers;
    c->n_kv = n_kv;
    c->head_dim = head_dim;
    c->dtype = dtype;
    c->layers = calloc((size_t)n_layers, sizeof *c->layers);
    if (!c->layers) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the KV cache tables");
    ckv_status st = CKV_STATUS_OK;
    for (int i = 0; i < n_layers && st == CKV_STATUS_OK; i++) {
        ckv_kv_layer *l = &c->layers[i];
        l->off = calloc((size_t)n_kv, sizeof *l->off);
        l->cap = calloc((size_t)n_kv, sizeof *l->cap);
        l->len = calloc((size_t)n_kv, sizeof *l->len);
        l->segs_host = calloc((size_t)n_kv, sizeof *l->segs_host);
        if (!l->off || !l->cap || !l->len || !l->segs_host) {
            st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the KV cache tables");
            break;
        }
        st = be->ops->alloc(be, (void **)&l->segs, (size_t)n_kv * sizeof(ckv_kv_seg), "KV segment table");
        if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&l->seg_list, sizeof(ckv_kv_seg *), "KV segment list");
        if (st == CKV_STATUS_OK) st = be->ops->upload(be, l->seg_list, &l->segs, sizeof(ckv_kv_seg *));
        if (st == CKV_STATUS_OK) st = kv_segs_sync(c, l);
    }
    if (st != CKV_STATUS_OK) ckv_kv_cache_free(c);
    return st;
}

void ckv_kv_cache_free(ckv_kv_cache *c) {
    if (!c || !c->layers) return;
    for (int i = 0; i < c->n_layers; i++) {
        ckv_kv_layer *l = &c->layers[i];
        if (c->be) {
            kv_pool_release(c->be, l);
            c->be->ops->release(c->be, l->segs);
            c->be->ops->release(c->be, l->seg_list);
        }
        free(l->off);
        free(l->cap);
        free(l->len);
        free(l->segs_host);
    }
    free(c->layers);
    if (c->be) {
        c->be->ops->release(c->be, c->gather_segs);
        c->be->ops->release(c->be, c->gather_n_keep);
        c->be->ops->release(c->be, c->gather_keep);
    }
    memset(c, 0, sizeof *c);
}

/* A pool of `rows` rows: zeroed (reserve), or with undefined contents (raw: a compaction's pool,
 * whose kept rows the gather writes and whose other rows nothing reads before they are appended). */
static ckv_status kv_pool_alloc(ckv_kv_cache *c, ckv_kv_layer *l, int64_t rows, int raw) {
    ckv_backend *be = c->be;
    ckv_status (*alloc)(ckv_backend *, void **, size_t, const char *) = raw ? be->ops->alloc_raw : be->ops->alloc;
    size_t rb = (size_t)(rows > 0 ? rows : 1);
    size_t kbytes = rb * (size_t)c->head_dim * kv_elem(c);
    CKV_TRY(alloc(be, &l->kbuf, kbytes, "KV cache keys"));
    CKV_TRY(alloc(be, &l->vbuf, kbytes, "KV cache values"));
    CKV_TRY(alloc(be, (void **)&l->pos, rb * sizeof(int32_t), "KV cache positions"));
    l->rows = rows;
    return CKV_STATUS_OK;
}

int ckv_kv_layer_has_pool(const ckv_kv_cache *c, int layer) { return c->layers[layer].kbuf != NULL; }

ckv_status ckv_kv_layer_reserve(ckv_kv_cache *c, int layer, int cap) {
    if (layer < 0 || layer >= c->n_layers) return ckv_error(CKV_STATUS_ERR_ARG, "KV cache layer %d out of range", layer);
    if (cap < 1) return ckv_error(CKV_STATUS_ERR_ARG, "KV cache capacity %d must be positive", cap);
    ckv_kv_layer *l = &c->layers[layer];
    kv_pool_release(c->be, l);
    ckv_status s = kv_pool_alloc(c, l, (int64_t)cap * c->n_kv, 0);
    if (s != CKV_STATUS_OK) kv_pool_release(c->be, l);
    for (int h = 0; h < c->n_kv; h++) {
        l->off[h] = s == CKV_STATUS_OK ? (int64_t)h * cap : 0;
        l->cap[h] = s == CKV_STATUS_OK ? cap : 0;
        l->len[h] = 0;
    }
    ckv_status s2 = kv_segs_sync(c, l);
    return s != CKV_STATUS_OK ? s : s2;
}

ckv_kv_batch ckv_kv_layer_batch(const ckv_kv_cache *c, int layer, int extra) {
    const ckv_kv_layer *l = &c->layers[layer];
    int max_len = 0;
    for (int h = 0; h < c->n_kv; h++) max_len = l->len[h] > max_len ? l->len[h] : max_len;
    ckv_kv_batch b = {.dtype = c->dtype, .head_dim = c->head_dim, .n_kv_heads = c->n_kv, .n_seq = 1,
                      .segs = l->seg_list, .seq_of = NULL, .seq_start = NULL, .max_len = max_len + extra};
    return b;
}

ckv_status ckv_kv_account_batch(ckv_kv_cache *const *caches, int n_seq, const int32_t *seq_start, int layer, int n) {
    for (int i = 0; i < n_seq; i++) {
        const ckv_kv_cache *c = caches[i];
        const ckv_kv_layer *l = &c->layers[layer];
        const int cnt = seq_start ? seq_start[i + 1] - seq_start[i] : n;
        if (!l->kbuf) return ckv_error(CKV_STATUS_ERR_INTERNAL, "KV cache layer %d has no pool", layer);
        for (int h = 0; h < c->n_kv; h++)
            if (l->len[h] + cnt > l->cap[h])
                return ckv_error(CKV_STATUS_ERR_RANGE, "KV cache layer %d head %d is full (%d of %d rows, %d more asked)",
                                 layer, h, l->len[h], l->cap[h], cnt);
    }
    for (int i = 0; i < n_seq; i++) {
        ckv_kv_layer *l = &caches[i]->layers[layer];
        const int cnt = seq_start ? seq_start[i + 1] - seq_start[i] : n;
        for (int h = 0; h < caches[i]->n_kv; h++) {
            l->len[h] += cnt;
            l->segs_host[h].len = l->len[h];
        }
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_kv_append_batch(ckv_kv_cache *const *caches, int n_seq, const int32_t *seq_start, int layer,
                               const ckv_kv_batch *b, const float *k, const float *v, const int32_t *pos, int n) {
    CKV_TRY(ckv_kv_account_batch(caches, n_seq, seq_start, layer, n));
    ckv_backend *be = caches[0]->be;
    be->ops->kv_store(be, b, k, v, pos, n); /* advances the device lengths (the view is built from them) */
    return CKV_STATUS_OK;
}

ckv_status ckv_kv_layer_append(ckv_kv_cache *c, int layer, const float *k, const float *v, const int32_t *pos, int n) {
    ckv_kv_batch b = ckv_kv_layer_batch(c, layer, n);
    return ckv_kv_append_batch(&c, 1, NULL, layer, &b, k, v, pos, n);
}

/* The cache's compaction scratch for n_kv heads (and, with host rows, stride rows each): kept from an
 * earlier compaction when large enough. */
static ckv_status kv_gather_scratch(ckv_kv_cache *c, int host_rows, int stride) {
    ckv_backend *be = c->be;
    if (!c->gather_segs)
        CKV_TRY(be->ops->alloc(be, (void **)&c->gather_segs, (size_t)c->n_kv * sizeof(ckv_kv_seg), "KV gather segments"));
    if (!c->gather_n_keep)
        CKV_TRY(be->ops->alloc(be, (void **)&c->gather_n_keep, (size_t)c->n_kv * sizeof(int32_t), "KV gather counts"));
    if (host_rows && stride > c->gather_stride) {
        be->ops->release(be, c->gather_keep);
        c->gather_keep = NULL;
        c->gather_stride = 0;
        CKV_TRY(be->ops->alloc(be, (void **)&c->gather_keep, (size_t)c->n_kv * (size_t)stride * sizeof(int32_t),
                               "KV gather rows"));
        c->gather_stride = stride;
    }
    return CKV_STATUS_OK;
}

/* The compaction behind both entry points: keep_host (validated, uploaded) or keep_dev (device rows,
 * trusted) holds the kept rows. */
static ckv_status kv_compact(ckv_kv_cache *c, const ckv_kv_cache *from, int layer, const int32_t *keep_host,
                             const int32_t *keep_dev, int stride, const int32_t *n_keep, int room) {
    if (layer < 0 || layer >= c->n_layers) return ckv_error(CKV_STATUS_ERR_ARG, "KV cache layer %d out of range", layer);
    if (room < 0) return ckv_error(CKV_STATUS_ERR_ARG, "KV cache room %d is negative", room);
    if (from->n_layers != c->n_layers || from->n_kv != c->n_kv || from->head_dim != c->head_dim || from->dtype != c->dtype)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "KV gather between caches of different shapes or dtypes");
    const ckv_kv_layer *old = &from->layers[layer]; /* the rows are read here ... */
    ckv_kv_layer *dst = &c->layers[layer];          /* ... and the new pool replaces this layer's (old when c == from) */
    if (!old->kbuf) return ckv_error(CKV_STATUS_ERR_INTERNAL, "KV cache layer %d has no pool to compact", layer);
    int64_t rows = 0;
    for (int h = 0; h < c->n_kv; h++) {
        if (n_keep[h] < 0 || n_keep[h] > old->len[h] || n_keep[h] > stride)
            return ckv_error(CKV_STATUS_ERR_ARG, "layer %d head %d: cannot keep %d of %d rows", layer, h, n_keep[h],
                             old->len[h]);
        const int32_t *kh = keep_host ? keep_host + (size_t)h * (size_t)stride : NULL;
        for (int i = 0; kh && i < n_keep[h]; i++)
            if (kh[i] < 0 || kh[i] >= old->len[h] || (i > 0 && kh[i] <= kh[i - 1]))
                return ckv_error(CKV_STATUS_ERR_ARG, "layer %d head %d: keep list is not ascending rows below %d",
                                 layer, h, old->len[h]);
        rows += n_keep[h] + room;
    }
    ckv_backend *be = c->be;
    /* a pool this layer of c already holds takes the rows when they fit and it is not their source
     * (a derived cache's pool moved in by ckv_kv_cache_move_pools): nothing is allocated */
    const int reuse = c != from && dst->kbuf && dst->rows >= rows;
    ckv_kv_layer nl;
    memset(&nl, 0, sizeof nl);
    ckv_status s = CKV_STATUS_OK;
    if (reuse) {
        nl.kbuf = dst->kbuf;
        nl.vbuf = dst->vbuf;
        nl.pos = dst->pos;
        nl.rows = dst->rows;
    } else {
        s = kv_pool_alloc(c, &nl, rows, 1);
    }
    ckv_kv_seg *tab = dst->segs_host; // [n_kv] host: staged with the new pool's segments (kv_segs_sync restores it)
    if (s == CKV_STATUS_OK) s = kv_gather_scratch(c, keep_host != NULL, stride);
    if (s == CKV_STATUS_OK) {
        const size_t rowb = (size_t)c->head_dim * kv_elem(c);
        int64_t at = 0;
        for (int h = 0; h < c->n_kv; h++) {
            tab[h].k = (char *)nl.kbuf + (size_t)at * rowb;
            tab[h].v = (char *)nl.vbuf + (size_t)at * rowb;
            tab[h].pos = nl.pos + at;
            tab[h].len = 0;
            tab[h].cap = n_keep[h] + room;
            at += n_keep[h] + room;
        }
        s = be->ops->upload(be, c->gather_segs, tab, (size_t)c->n_kv * sizeof *tab);
    }
    if (s == CKV_STATUS_OK && keep_host)
        s = be->ops->upload(be, c->gather_keep, keep_host, (size_t)c->n_kv * (size_t)stride * sizeof(int32_t));
    if (s == CKV_STATUS_OK) s = be->ops->upload(be, c->gather_n_keep, n_keep, (size_t)c->n_kv * sizeof(int32_t));
    if (s == CKV_STATUS_OK) {
        const ckv_kv_gather_params gp = {c->dtype, c->head_dim, c->n_kv, c->gather_segs, old->segs,
                                         keep_host ? c->gather_keep : keep_dev, stride, c->gather_n_keep};
        be->ops->kv_gather(be, &gp);
        s = be->ops->sync(be); /* the old pool is released next */
    }
    if (s != CKV_STATUS_OK) {
        if (!reuse) kv_pool_release(be, &nl);
        kv_segs_sync(c, dst); /* the staged table back to the layer's own (its status adds nothing to s) */
        return s;
    }
    if (!reuse) kv_pool_release(be, dst);
    dst->kbuf = nl.kbuf;
    dst->vbuf = nl.vbuf;
    dst->pos = nl.pos;
    dst->rows = nl.rows;
    int64_t at = 0;
    for (int h = 0; h < c->n_kv; h++) {
        dst->off[h] = at;
        dst->cap[h] = n_keep[h] + room;
        dst->len[h] = n_keep[h];
        at += n_keep[h] + room;
    }
    return kv_segs_sync(c, dst);
}

ckv_status ckv_kv_layer_compact(ckv_kv_cache *c, int layer, const int32_t *keep, int stride, const int32_t *n_keep,
                                int room) {
    if (!keep) return ckv_error(CKV_STATUS_ERR_ARG, "KV compact of layer %d without kept rows", layer);
    return kv_compact(c, c, layer, keep, NULL, stride, n_keep, room);
}

ckv_status ckv_kv_layer_compact_dev(ckv_kv_cache *c, int layer, const int32_t *keep_dev, int stride,
                                    const int32_t *n_keep, int room) {
    if (!keep_dev) return ckv_error(CKV_STATUS_ERR_ARG, "KV compact of layer %d without kept rows", layer);
    return kv_compact(c, c, layer, NULL, keep_dev, stride, n_keep, room);
}

ckv_status ckv_kv_layer_gather_from(ckv_kv_cache *c, const ckv_kv_cache *from, int layer, const int32_t *keep_dev,
                                    int stride, const int32_t *n_keep, int room) {
    if (!keep_dev) return ckv_error(CKV_STATUS_ERR_ARG, "KV gather of layer %d without kept rows", layer);
    if (from == c) return ckv_error(CKV_STATUS_ERR_ARG, "KV gather of layer %d from its own cache (compact it)", layer);
    return kv_compact(c, from, layer, NULL, keep_dev, stride, n_keep, room);
}

ckv_status ckv_kv_cache_move_pools(ckv_kv_cache *c, ckv_kv_cache *from) {
    if (from->n_layers != c->n_layers || from->n_kv != c->n_kv || from->head_dim != c->head_dim || from->dtype != c->dtype ||
        from->be != c->be)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "KV pools moved between caches of different shapes, dtypes or backends");
    for (int i = 0; i < c->n_layers; i++) {
        ckv_kv_layer *l = &c->layers[i], *f = &from->layers[i];
        if (!f->kbuf) continue;
        kv_pool_release(c->be, l);
        l->kbuf = f->kbuf;
        l->vbuf = f->vbuf;
        l->pos = f->pos;
        l->rows = f->rows;
        f->kbuf = f->vbuf = NULL;
        f->pos = NULL;
        f->rows = 0;
        for (int h = 0; h < c->n_kv; h++) l->off[h] = l->cap[h] = l->len[h] = f->off[h] = f->cap[h] = f->len[h] = 0;
        CKV_TRY(kv_segs_sync(c, l));
        CKV_TRY(kv_segs_sync(from, f));
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_kv_keep_ws_init(ckv_kv_keep_ws *ws, const ckv_kv_cache *c) {
    memset(ws, 0, sizeof *ws);
    ckv_backend *be = c->be;
    ws->be = be;
    for (int l = 0; l < c->n_layers; l++)
        if (c->layers[l].rows > ws->rows) ws->rows = c->layers[l].rows;
    if (ws->rows < 1) ws->rows = 1;
    const size_t rowb = (size_t)c->head_dim * kv_elem(c), n = (size_t)ws->rows;
    ckv_status st = be->ops->alloc(be, &ws->kbuf, n * rowb, "KV keep keys");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, &ws->vbuf, n * rowb, "KV keep values");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&ws->pos, n * sizeof(int32_t), "KV keep positions");
    if (st == CKV_STATUS_OK)
        st = be->ops->alloc(be, (void **)&ws->segs, (size_t)c->n_kv * sizeof(ckv_kv_seg), "KV keep segments");
    if (st == CKV_STATUS_OK)
        st = be->ops->alloc(be, (void **)&ws->n_keep, (size_t)c->n_kv * sizeof(int32_t), "KV keep counts");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&ws->segs_host, (size_t)c->n_kv * sizeof(ckv_kv_seg), "KV keep segments");
    if (st != CKV_STATUS_OK) ckv_kv_keep_ws_free(ws);
    return st;
}

void ckv_kv_keep_ws_free(ckv_kv_keep_ws *ws) {
    if (!ws) return;
    if (ws->be) {
        ws->be->ops->release(ws->be, ws->kbuf);
        ws->be->ops->release(ws->be, ws->vbuf);
        ws->be->ops->release(ws->be, ws->pos);
        ws->be->ops->release(ws->be, ws->segs);
        ws->be->ops->release(ws->be, ws->n_keep);
    }
    ckv_free(ws->segs_host);
    memset(ws, 0, sizeof *ws);
}

ckv_status ckv_kv_layer_keep(ckv_kv_cache *c, int layer, const int32_t *keep_dev, int stride, const int32_t *n_keep,
                             ckv_kv_keep_ws *ws) {
    if (layer < 0 || layer >= c->n_layers) return ckv_error(CKV_STATUS_ERR_ARG, "KV cache layer %d out of range", layer);
    ckv_kv_layer *l = &c->layers[layer];
    if (!l->kbuf || !keep_dev) return ckv_error(CKV_STATUS_ERR_INTERNAL, "KV keep of layer %d without a pool or rows", layer);
    if (l->rows > ws->rows)
        return ckv_error(CKV_STATUS_ERR_INTERNAL, "KV keep of layer %d: %lld rows, scratch for %lld", layer,
                         (long long)l->rows, (long long)ws->rows);
    for (int h = 0; h < c->n_kv; h++)
        if (n_keep[h] < 0 || n_keep[h] > l->len[h] || n_keep[h] > stride)
            return ckv_error(CKV_STATUS_ERR_ARG, "layer %d head %d: cannot keep %d of %d rows", layer, h, n_keep[h], l->len[h]);
    ckv_backend *be = c->be;
    const size_t rowb = (size_t)c->head_dim * kv_elem(c);
    for (int h = 0; h < c->n_kv; h++) { /* the scratch pool mirrors the layer's layout */
        ckv_kv_seg *g = &ws->segs_host[h];
        g->k = (char *)ws->kbuf + (size_t)l->off[h] * rowb;
        g->v = (char *)ws->vbuf + (size_t)l->off[h] * rowb;
        g->pos = ws->pos + l->off[h];
        g->len = 0;
        g->cap = l->cap[h];
    }
    CKV_TRY(be->ops->upload(be, ws->segs, ws->segs_host, (size_t)c->n_kv * sizeof(ckv_kv_seg)));
    CKV_TRY(be->ops->upload(be, ws->n_keep, n_keep, (size_t)c->n_kv * sizeof(int32_t)));
    const ckv_kv_gather_params gp = {c->dtype, c->head_dim, c->n_kv, ws->segs, l->segs, keep_dev, stride, ws->n_keep};
    be->ops->kv_gather(be, &gp);
    for (int h = 0; h < c->n_kv; h++) { /* back into the layer's pool: the kept rows only */
        const size_t at = (size_t)l->off[h], k = (size_t)n_keep[h];
        if (k == 0) continue;
        CKV_TRY(be->ops->copy(be, (char *)l->kbuf + at * rowb, (char *)ws->kbuf + at * rowb, k * rowb));
        CKV_TRY(be->ops->copy(be, (char *)l->vbuf + at * rowb, (char *)ws->vbuf + at * rowb, k * rowb));
        CKV_TRY(be->ops->copy(be, l->pos + at, ws->pos + at, k * sizeof(int32_t)));
    }
    for (int h = 0; h < c->n_kv; h++) l->len[h] = n_keep[h];
    return kv_segs_sync(c, l);
}

ckv_status ckv_kv_head_read(const ckv_kv_cache *c, int layer, int h, float *k, float *v, int32_t *pos) {
    return ckv_kv_head_read_rows(c, layer, h, 0, c->layers[layer].len[h], k, v, pos);
}

ckv_status ckv_kv_head_read_rows(const ckv_kv_cache *c, int layer, int h, int row0, int n_rows, float *k, float *v,
                                 int32_t *pos) {
    const ckv_kv_layer *l = &c->layers[layer];
    ckv_backend *be = c->be;
    if (row0 < 0 || n_rows < 0 || row0 + n_rows > l->len[h])
        return ckv_error(CKV_STATUS_ERR_RANGE, "KV cache layer %d head %d: rows %d .. %d of its %d", layer, h, row0,
                         row0 + n_rows - 1, l->len[h]);
    const size_t n = (size_t)n_rows, d = (size_t)c->head_dim, es = kv_elem(c), rowb = d * es;
    const size_t first = (size_t)l->off[h] + (size_t)row0;
    if (n == 0) return CKV_STATUS_OK;
    if (pos) CKV_TRY(be->ops->download(be, pos, l->pos + first, n * sizeof(int32_t)));
    const void *src[2] = {(const char *)l->kbuf + first * rowb, (const char *)l->vbuf + first * rowb};
    float *dst[2] = {k, v};
    void *tmp = NULL;
    ckv_status s = c->dtype == CKV_DTYPE_F32 ? CKV_STATUS_OK : ckv_alloc(&tmp, n * rowb, "KV head staging");
    for (int part = 0; part < 2 && s == CKV_STATUS_OK; part++) {
        if (!dst[part]) continue;
        s = be->ops->download(be, tmp ? tmp : (void *)dst[part], src[part], n * rowb);
        if (s == CKV_STATUS_OK && tmp) ckv_convert_to_f32(dst[part], tmp, c->dtype, n * d);
    }
    ckv_free(tmp);
    return s;
}

ckv_status ckv_kv_head_write(ckv_kv_cache *c, int layer, int h, const float *k, const float *v, const int32_t *pos,
                             int n) {
    ckv_kv_layer *l = &c->layers[layer];
    ckv_backend *be = c->be;
    if (!l->kbuf || n < 0 || n > l->cap[h])
        return ckv_error(CKV_STATUS_ERR_RANGE, "KV cache layer %d head %d: %d rows do not fit its %d reserved", layer, h,
                         n, l->cap[h]);
    const size_t d = (size_t)c->head_dim, es = kv_elem(c), rowb = d * es;
    ckv_status s = CKV_STATUS_OK;
    if (n > 0) {
        s = be->ops->upload(be, l->pos + l->off[h], pos, (size_t)n * sizeof(int32_t));
        if (c->dtype == CKV_DTYPE_F32) {
            if (s == CKV_STATUS_OK) s = be->ops->upload(be, (char *)l->kbuf + (size_t)l->off[h] * rowb, k, (size_t)n * rowb);
            if (s == CKV_STATUS_OK) s = be->ops->upload(be, (char *)l->vbuf + (size_t)l->off[h] * rowb, v, (size_t)n * rowb);
        } else {
            void *tmp = NULL;
            if (s == CKV_STATUS_OK) s = ckv_alloc(&tmp, (size_t)n * rowb, "KV head staging");
            if (s == CKV_STATUS_OK) {
                ckv_convert_from_f32(tmp, k, c->dtype, (size_t)n * d);
                s = be->ops->upload(be, (char *)l->kbuf + (size_t)l->off[h] * rowb, tmp, (size_t)n * rowb);
            }
            if (s == CKV_STATUS_OK) {
                ckv_convert_from_f32(tmp, v, c->dtype, (size_t)n * d);
                s = be->ops->upload(be, (char *)l->vbuf + (size_t)l->off[h] * rowb, tmp, (size_t)n * rowb);
            }
            ckv_free(tmp);
        }
    }
    if (s != CKV_STATUS_OK) return s;
    l->len[h] = n;
    return kv_segs_sync(c, l);
}

ckv_status ckv_kv_cache_truncate(ckv_kv_cache *c, const int32_t *lens) {
    for (int i = 0; i < c->n_layers; i++)
        for (int h = 0; h < c->n_kv; h++)
            if (lens[i * c->n_kv + h] < 0 || lens[i * c->n_kv + h] > c->layers[i].len[h])
                return ckv_error(CKV_STATUS_ERR_ARG, "KV truncate: layer %d head %d length %d exceeds %d", i, h,
                                 lens[i * c->n_kv + h], c->layers[i].len[h]);
    for (int i = 0; i < c->n_layers; i++) {
        int changed = 0;
        for (int h = 0; h < c->n_kv; h++) {
            changed |= c->layers[i].len[h] != lens[i * c->n_kv + h];
            c->layers[i].len[h] = lens[i * c->n_kv + h];
        }
        if (changed) CKV_TRY(kv_segs_sync(c, &c->layers[i]));
    }
    return CKV_STATUS_OK;
}

void ckv_kv_cache_lengths(const ckv_kv_cache *c, int32_t *lens) {
    for (int i = 0; i < c->n_layers; i++)
        for (int h = 0; h < c->n_kv; h++) lens[i * c->n_kv + h] = c->layers[i].len[h];
}

size_t ckv_kv_cache_bytes_reserved(const ckv_kv_cache *c) {
    size_t b = 0;
    for (int i = 0; i < c->n_layers; i++) b += (size_t)c->layers[i].rows * ckv_kv_cache_row_bytes(c);
    return b;
}

size_t ckv_kv_cache_bytes_used(const ckv_kv_cache *c) {
    size_t b = 0;
    for (int i = 0; i < c->n_layers; i++)
        for (int h = 0; h < c->n_kv; h++) b += (size_t)c->layers[i].len[h] * ckv_kv_cache_row_bytes(c);
    return b;
}
