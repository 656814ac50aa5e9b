/* test_shard.c - the tensor-parallel plan: every head, MLP row and vocabulary row is owned exactly
 * once (or by a whole replica group when tp > Hkv), query heads sit with their KV head, and bad
 * tp values are refused with a message naming the constraint. */
#include "ckv_test.h"
#include "shard/shard.h"

static void check_cover(int H, int Hkv, int d, int F, int V, int tp) {
    int q_owner[256], ff_seen = 0, v_seen = 0, kv_count[64];
    memset(q_owner, -1, sizeof q_owner);
    memset(kv_count, 0, sizeof kv_count);
    int next_ff = 0, next_v = 0;
    for (int r = 0; r < tp; r++) {
        ckv_shard_plan p;
        CHECK_OK(ckv_shard_plan_init(&p, tp, r, H, Hkv, d, F, V));
        for (int h = p.q_head0; h < p.q_head0 + p.n_q_local; h++) {
            CHECK_MSG(q_owner[h] == -1, "H %d Hkv %d tp %d: query head %d owned twice", H, Hkv, tp, h);
            q_owner[h] = r;
            int g = h / (H / Hkv);
            CHECK_MSG(g >= p.kv_head0 && g < p.kv_head0 + p.n_kv_local, "tp %d rank %d: q head %d's KV head %d not local", tp, r, h, g);
        }
        for (int g = p.kv_head0; g < p.kv_head0 + p.n_kv_local; g++) kv_count[g]++;
        CHECK(p.ff0 == next_ff);
        next_ff += p.n_ff_local;
        ff_seen += p.n_ff_local;
        CHECK(p.vocab0 == next_v);
        next_v += p.n_vocab_local;
        v_seen += p.n_vocab_local;
        CHECK(p.replica_group == (tp > Hkv ? p.kv_head0 : r));
    }
    for (int h = 0; h < H; h++) CHECK_MSG(q_owner[h] >= 0, "query head %d unowned", h);
    int rep = tp > Hkv ? tp / Hkv : 1;
    for (int g = 0; g < Hkv; g++) CHECK_MSG(kv_count[g] == rep, "KV head %d held %d times, expected %d", g, kv_count[g], rep);
    CHECK(ff_seen == F);
    CHECK(v_seen == V);
}

int main(void) {
    check_cover(8, 2, 16, 100, 1001, 1);
    check_cover(8, 2, 16, 100, 1001, 2);
    check_cover(8, 2, 16, 100, 1001, 4); /* tp > Hkv: replica groups of 2 */
    check_cover(8, 2, 16, 100, 1001, 8);
    check_cover(32, 8, 128, 14336, 128256, 4);
    check_cover(40, 8, 128, 27648, 152064, 8);
    check_cover(14, 2, 64, 4864, 151936, 2);
    ckv_shard_plan p;
    CHECK_FAILS(ckv_shard_plan_init(&p, 3, 0, 8, 2, 16, 100, 1000), CKV_STATUS_ERR_ARG, "does not divide");
    CHECK_FAILS(ckv_shard_plan_init(&p, 4, 0, 12, 3, 16, 100, 1000), CKV_STATUS_ERR_ARG, "divide one another");
    CHECK_FAILS(ckv_shard_plan_init(&p, 0, 0, 8, 2, 16, 100, 1000), CKV_STATUS_ERR_ARG, "--tp");
    CHECK_FAILS(ckv_shard_plan_init(&p, 2, 2, 8, 2, 16, 100, 1000), CKV_STATUS_ERR_ARG, "rank 2");
    int b, n;
    ckv_shard_range(10, 3, 0, &b, &n);
    CHECK(b == 0 && n == 4);
    ckv_shard_range(10, 3, 2, &b, &n);
    CHECK(b == 7 && n == 3);
    return ckv_test_finish("test_shard");
}
