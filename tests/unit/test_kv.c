/* test_kv.c - the ragged KV cache: append writes every head's rows in place, compact keeps exactly
 * the chosen rows in position order and really shrinks the pool, appends after compaction land
 * behind the kept rows, truncate drops only what came after a snapshot, the device segment table
 * follows every change, F16/BF16 caches round-trip through head read/write, a row range reads what the
 * whole head's read holds there, a gather from another cache reuses a pool moved in when the rows
 * fit it (and allocates a new one when they do not), and misuse is refused. */
#include <string.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "common/fixture.h"
#include "kv/kv_cache.h"

enum { NKV = 3, D = 4, NTOK = 6 };

/* The value x as the cache stores it. */
static float stored(float x, ckv_dtype dt) {
    uint16_t h;
    float f;
    if (dt == CKV_DTYPE_F32) return x;
    ckv_convert_from_f32(&h, &x, dt, 1);
    ckv_convert_to_f32(&f, &h, dt, 1);
    return f;
}

/* Head h's rows as fp32 through the host accessor. */
static void read_head(const ckv_kv_cache *c, int layer, int h, float *k, float *v, int32_t *pos) {
    CHECK_OK(ckv_kv_head_read(c, layer, h, k, v, pos));
}

/* The device segment table agrees with the host bookkeeping. */
static void check_segs(const ckv_kv_cache *c, int layer) {
    const ckv_kv_layer *l = &c->layers[layer];
    for (int h = 0; h < c->n_kv; h++) {
        const ckv_kv_seg *g = &l->segs[h]; /* the cpu backend's device memory is the host's */
        size_t rowb = (size_t)c->head_dim * ckv_dtype_size(c->dtype);
        CHECK_MSG(g->len == l->len[h] && g->cap == l->cap[h], "layer %d head %d: segment len/cap %d/%d, host %d/%d",
                  layer, h, g->len, g->cap, l->len[h], l->cap[h]);
        CHECK(g->pos == l->pos + l->off[h]);
        CHECK((char *)g->k == (char *)l->kbuf + (size_t)l->off[h] * rowb);
    }
    CHECK(l->seg_list[0] == l->segs);
}

/* Kept rows of every head of layer 1 of c: keep [NKV, 8] rows of the fixture's tokens. */
static void check_kept(const ckv_kv_cache *c, const int32_t *keep, const int32_t *nk, ckv_dtype dt) {
    float hk[16 * D], hv[16 * D];
    int32_t hp[16];
    check_segs(c, 1);
    for (int h = 0; h < NKV; h++) {
        CHECK(c->layers[1].len[h] == nk[h]);
        read_head(c, 1, h, hk, hv, hp);
        for (int i = 0; i < nk[h]; i++) {
            const int t = keep[h * 8 + i];
            CHECK_MSG(hp[i] == t, "head %d row %d: pos %d, expected %d", h, i, hp[i], t);
            CHECK(hk[i * D + 1] == stored(ckv_fixture_kval(t, h, 1), dt));
            CHECK(hv[i * D + 2] == stored(-ckv_fixture_kval(t, h, 2), dt));
        }
    }
}

static void run(ckv_backend *be, ckv_dtype dt) {
    ckv_kv_cache c;
    CHECK_OK(ckv_kv_cache_init(&c, be, 2, NKV, D, dt));
    CHECK_OK(ckv_kv_layer_reserve(&c, 1, 10));
    check_segs(&c, 1);
    float k[NTOK * NKV * D], v[NTOK * NKV * D]; /* [n, n_kv, d] */
    int32_t pos[NTOK];
    ckv_fixture_kv_rows(NTOK, NKV, D, k, v, pos);
    CHECK_OK(ckv_kv_layer_append(&c, 1, k, v, pos, 4));
    CHECK_OK(ckv_kv_layer_append(&c, 1, k + 4 * NKV * D, v + 4 * NKV * D, pos + 4, 2));
    check_segs(&c, 1);
    ckv_kv_layer *l = &c.layers[1];
    float hk[16 * D], hv[16 * D];
    int32_t hp[16];
    for (int h = 0; h < NKV; h++) {
        CHECK(l->len[h] == NTOK);
        read_head(&c, 1, h, hk, hv, hp);
        for (int t = 0; t < NTOK; t++) {
            CHECK(hp[t] == t);
            CHECK(hk[t * D + 2] == stored(ckv_fixture_kval(t, h, 2), dt));
            CHECK(hv[t * D + 3] == stored(-ckv_fixture_kval(t, h, 3), dt));
        }
        /* rows 2 .. 4 alone, values only: the same floats as the whole head's rows */
        float rv[3 * D];
        CHECK_OK(ckv_kv_head_read_rows(&c, 1, h, 2, 3, NULL, rv, NULL));
        CHECK_MSG(memcmp(rv, hv + 2 * D, sizeof rv) == 0, "head %d: rows 2..4 read alone differ from the whole read", h);
    }
    CHECK_FAILS(ckv_kv_head_read_rows(&c, 1, 0, 4, 3, NULL, hv, NULL), CKV_STATUS_ERR_RANGE, "rows 4 .. 6 of its 6");
    size_t before = ckv_kv_cache_bytes_reserved(&c);
    /* head 0 keeps {0, 1, 5}, head 1 keeps {2}, head 2 keeps {1, 2, 3, 4} (rows of a [NKV, 8] table) */
    int32_t keep[NKV * 8] = {0, 1, 5, [8] = 2, [16] = 1, 2, 3, 4};
    int32_t nk[NKV] = {3, 1, 4};
    CHECK_OK(ckv_kv_layer_compact(&c, 1, keep, 8, nk, 2));
    check_segs(&c, 1);
    size_t after = ckv_kv_cache_bytes_reserved(&c);
    CHECK_MSG(after < before, "compaction did not shrink the pool: %zu -> %zu bytes", before, after);
    CHECK(l->rows == 3 + 1 + 4 + 3 * 2);
    for (int h = 0; h < NKV; h++) CHECK(l->cap[h] == nk[h] + 2);
    check_kept(&c, keep, nk, dt);
    int32_t snap[2 * NKV];
    ckv_kv_cache_lengths(&c, snap);
    int32_t qpos[2] = {6, 7};
    CHECK_OK(ckv_kv_layer_append(&c, 1, k, v, qpos, 2));
    check_segs(&c, 1);
    for (int h = 0; h < NKV; h++) {
        read_head(&c, 1, h, hk, hv, hp);
        CHECK(hp[nk[h]] == 6 && hp[nk[h] + 1] == 7);
        CHECK(hk[(nk[h] + 1) * D] == stored(ckv_fixture_kval(1, h, 0), dt));
    }
    CHECK_FAILS(ckv_kv_layer_append(&c, 1, k, v, qpos, 1), CKV_STATUS_ERR_RANGE, "is full");
    CHECK_OK(ckv_kv_cache_truncate(&c, snap));
    check_segs(&c, 1);
    for (int h = 0; h < NKV; h++) {
        read_head(&c, 1, h, hk, hv, hp);
        CHECK(l->len[h] == nk[h] && hp[nk[h] - 1] == keep[h * 8 + nk[h] - 1]);
    }
    /* host writes (cache files): replace head 1 with two rows */
    float wk[2 * D] = {1, 2, 3, 4, 5, 6, 7, 8}, wv[2 * D] = {-1, -2, -3, -4, -5, -6, -7, -8};
    int32_t wp[2] = {40, 41};
    CHECK_OK(ckv_kv_head_write(&c, 1, 1, wk, wv, wp, 2));
    check_segs(&c, 1);
    read_head(&c, 1, 1, hk, hv, hp);
    CHECK(l->len[1] == 2 && hp[1] == 41 && hk[7] == 8 && hv[4] == -5);
    CHECK_FAILS(ckv_kv_head_write(&c, 1, 1, wk, wv, wp, 99), CKV_STATUS_ERR_RANGE, "do not fit");

    int32_t bad[NKV * 2] = {2, 1, 0, 0, 0, 0};
    int32_t nb[NKV] = {2, 1, 1};
    CHECK_FAILS(ckv_kv_layer_compact(&c, 1, bad, 2, nb, 0), CKV_STATUS_ERR_ARG, "ascending");
    int32_t nbig[NKV] = {9, 1, 1};
    CHECK_FAILS(ckv_kv_layer_compact(&c, 1, keep, 8, nbig, 0), CKV_STATUS_ERR_ARG, "cannot keep");
    CHECK_FAILS(ckv_kv_layer_reserve(&c, 5, 4), CKV_STATUS_ERR_ARG, "layer 5");
    ckv_kv_cache_free(&c);
    ckv_kv_cache_free(&c); /* freeing twice (a zeroed cache) is fine */
}

/* Gathers from a full cache into pools moved from another cache: reused when the rows fit. */
static void run_moved_pools(ckv_backend *be, ckv_dtype dt) {
    ckv_kv_cache full, a, b, odd;
    CHECK_OK(ckv_kv_cache_init(&full, be, 2, NKV, D, dt));
    CHECK_OK(ckv_kv_cache_init(&a, be, 2, NKV, D, dt));
    CHECK_OK(ckv_kv_cache_init(&b, be, 2, NKV, D, dt));
    CHECK_OK(ckv_kv_cache_init(&odd, be, 2, NKV - 1, D, dt));
    CHECK_OK(ckv_kv_layer_reserve(&full, 1, 8));
    float k[NTOK * NKV * D], v[NTOK * NKV * D];
    int32_t pos[NTOK];
    ckv_fixture_kv_rows(NTOK, NKV, D, k, v, pos);
    CHECK_OK(ckv_kv_layer_append(&full, 1, k, v, pos, NTOK));
    int32_t keep[NKV * 8] = {0, 1, 5, [8] = 2, [16] = 1, 2, 3, 4}, nk[NKV] = {3, 1, 4};
    CHECK_OK(ckv_kv_layer_gather_from(&a, &full, 1, keep, 8, nk, 2)); /* a new pool of 8 + 3 * 2 rows */
    check_kept(&a, keep, nk, dt);
    void *pool = a.layers[1].kbuf;
    CHECK_OK(ckv_kv_cache_move_pools(&b, &a));
    CHECK(!a.layers[1].kbuf && a.layers[1].rows == 0 && b.layers[1].kbuf == pool && b.layers[1].rows == 14);
    CHECK(b.layers[1].len[0] == 0 && b.layers[1].cap[0] == 0 && !b.layers[0].kbuf);
    check_segs(&a, 1);
    check_segs(&b, 1);
    int32_t keep2[NKV * 8] = {5, [8] = 0, 3, [16] = 4}, nk2[NKV] = {1, 2, 1};
    CHECK_OK(ckv_kv_layer_gather_from(&b, &full, 1, keep2, 8, nk2, 1)); /* 4 + 3 rows fit the 14 */
    CHECK_MSG(b.layers[1].kbuf == pool && b.layers[1].rows == 14, "a pool the rows fit was not reused (%lld rows)",
              (long long)b.layers[1].rows);
    check_kept(&b, keep2, nk2, dt);
    int32_t all[NKV * 8] = {0, 1, 2, 3, 4, 5, [8] = 0, 1, 2, 3, 4, 5, [16] = 0, 1, 2, 3, 4, 5}, n6[NKV] = {6, 6, 6};
    CHECK_OK(ckv_kv_layer_gather_from(&b, &full, 1, all, 8, n6, 2)); /* 24 rows: a new pool */
    CHECK(b.layers[1].rows == 24);
    check_kept(&b, all, n6, dt);
    CHECK_FAILS(ckv_kv_cache_move_pools(&odd, &b), CKV_STATUS_ERR_SHAPE, "different shapes");
    ckv_kv_cache_free(&odd);
    ckv_kv_cache_free(&b);
    ckv_kv_cache_free(&a);
    ckv_kv_cache_free(&full);
}

int main(void) {
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 1));
    if (!be) return ckv_test_finish("test_kv");
    run(be, CKV_DTYPE_F32);
    run(be, CKV_DTYPE_F16);
    run(be, CKV_DTYPE_BF16);
    run_moved_pools(be, CKV_DTYPE_F32);
    run_moved_pools(be, CKV_DTYPE_BF16);
    ckv_kv_cache c;
    CHECK_FAILS(ckv_kv_cache_init(&c, be, 2, NKV, D, CKV_DTYPE_Q8_0), CKV_STATUS_ERR_UNSUPPORTED, "kv-dtype");
    ckv_backend_free(be);
    return ckv_test_finish("test_kv");
}
