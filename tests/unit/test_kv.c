/* test_kv.c - the ragged KV cache: append writes every head's rows in place, compact keeps exactly
 * the chosen rows in position order and really shrinks the pool, appends after compaction land
 * behind the kept rows, truncate drops only what came after a snapshot, and misuse is refused. */
#include "backend/backend.h"
#include "ckv_test.h"
#include "kv/kv_cache.h"

enum { NKV = 3, D = 4, NTOK = 6 };

static float kval(int tok, int h, int j) { return (float)(tok * 100 + h * 10 + j); }

int main(void) {
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 1));
    if (!be) return ckv_test_finish("test_kv");
    ckv_kv_cache c;
    CHECK_OK(ckv_kv_cache_init(&c, be, 2, NKV, D));
    CHECK_OK(ckv_kv_layer_reserve(&c, 1, 10));
    float k[NTOK * NKV * D], v[NTOK * NKV * D]; /* [n, n_kv, d] */
    int32_t pos[NTOK];
    for (int t = 0; t < NTOK; t++) {
        pos[t] = t;
        for (int h = 0; h < NKV; h++)
            for (int j = 0; j < D; j++) {
                k[(t * NKV + h) * D + j] = kval(t, h, j);
                v[(t * NKV + h) * D + j] = -kval(t, h, j);
            }
    }
    CHECK_OK(ckv_kv_layer_append(&c, 1, k, v, pos, 4));
    CHECK_OK(ckv_kv_layer_append(&c, 1, k + 4 * NKV * D, v + 4 * NKV * D, pos + 4, 2));
    ckv_kv_layer *l = &c.layers[1];
    for (int h = 0; h < NKV; h++) {
        CHECK(l->len[h] == NTOK);
        for (int t = 0; t < NTOK; t++) {
            CHECK(l->pos[l->off[h] + t] == t);
            CHECK(l->k[(l->off[h] + t) * D + 2] == kval(t, h, 2));
            CHECK(l->v[(l->off[h] + t) * D + 3] == -kval(t, h, 3));
        }
    }
    size_t before = ckv_kv_cache_bytes_reserved(&c);
    /* head 0 keeps {0, 1, 5}, head 1 keeps {2}, head 2 keeps {1, 2, 3, 4} */
    int32_t k0[] = {0, 1, 5}, k1[] = {2}, k2[] = {1, 2, 3, 4};
    const int32_t *keep[NKV] = {k0, k1, k2};
    int32_t nk[NKV] = {3, 1, 4};
    CHECK_OK(ckv_kv_layer_compact(&c, 1, keep, nk, 2));
    size_t after = ckv_kv_cache_bytes_reserved(&c);
    CHECK_MSG(after < before, "compaction did not shrink the pool: %zu -> %zu bytes", before, after);
    CHECK(l->rows == 3 + 1 + 4 + 3 * 2);
    for (int h = 0; h < NKV; h++) {
        CHECK(l->len[h] == nk[h]);
        CHECK(l->cap[h] == nk[h] + 2);
        for (int i = 0; i < nk[h]; i++) {
            int t = keep[h][i];
            CHECK_MSG(l->pos[l->off[h] + i] == t, "head %d row %d: pos %d, expected %d", h, i, l->pos[l->off[h] + i], t);
            CHECK(l->k[(l->off[h] + i) * D + 1] == kval(t, h, 1));
            CHECK(l->v[(l->off[h] + i) * D + 0] == -kval(t, h, 0));
        }
    }
    int32_t snap[2 * NKV];
    ckv_kv_cache_lengths(&c, snap);
    int32_t qpos[2] = {6, 7};
    CHECK_OK(ckv_kv_layer_append(&c, 1, k, v, qpos, 2));
    for (int h = 0; h < NKV; h++) {
        CHECK(l->pos[l->off[h] + nk[h]] == 6 && l->pos[l->off[h] + nk[h] + 1] == 7);
        CHECK(l->k[(l->off[h] + nk[h] + 1) * D] == kval(1, h, 0));
    }
    CHECK_FAILS(ckv_kv_layer_append(&c, 1, k, v, qpos, 1), CKV_STATUS_ERR_RANGE, "is full");
    CHECK_OK(ckv_kv_cache_truncate(&c, snap));
    for (int h = 0; h < NKV; h++) CHECK(l->len[h] == nk[h] && l->pos[l->off[h] + nk[h] - 1] == keep[h][nk[h] - 1]);

    int32_t bad[] = {2, 1};
    const int32_t *kb[NKV] = {bad, k1, k1};
    int32_t nb[NKV] = {2, 1, 1};
    CHECK_FAILS(ckv_kv_layer_compact(&c, 1, kb, nb, 0), CKV_STATUS_ERR_ARG, "ascending");
    int32_t nbig[NKV] = {9, 1, 1};
    CHECK_FAILS(ckv_kv_layer_compact(&c, 1, keep, nbig, 0), CKV_STATUS_ERR_ARG, "cannot keep");
    CHECK_FAILS(ckv_kv_layer_reserve(&c, 5, 4), CKV_STATUS_ERR_ARG, "layer 5");
    ckv_kv_cache_free(&c);
    ckv_kv_cache_free(&c); /* freeing twice (a zeroed cache) is fine */
    ckv_backend_free(be);
    return ckv_test_finish("test_kv");
}
