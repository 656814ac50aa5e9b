/* shard.h - the tensor-parallel plan: which query heads, KV heads, MLP rows and vocabulary rows a
 * rank owns, and the replica groups when tp > n_kv_heads. Pure functions of the model shape and
 * (tp, rank); no I/O, no communication. */
#ifndef CKV_SHARD_H
#define CKV_SHARD_H

#include "core/status.h"

typedef struct {
    int tp, rank;
    int n_heads, n_kv_heads, head_dim;
    /* attention: query heads [q_head0, q_head0 + n_q_local), KV heads [kv_head0, kv_head0 + n_kv_local) */
    int q_head0, n_q_local;
    int kv_head0, n_kv_local;
    /* when tp > n_kv_heads each KV head lives on kv_replicas ranks; replica_rank is this rank's index
     * among them, replica_group the KV head's index (ranks with the same group hold the same KV head) */
    int kv_replicas;
    int replica_group;
    int replica_rank;
    /* MLP intermediate rows [ff0, ff0 + n_ff_local) of gate/up, the same columns of down */
    int intermediate, ff0, n_ff_local;
    /* vocabulary rows [vocab0, vocab0 + n_vocab_local) of lm_head */
    int vocab, vocab0, n_vocab_local;
} ckv_shard_plan;

/* Plans rank `rank` of a tp-way split. Errors name the constraint: tp must divide n_heads; tp and
 * n_kv_heads must divide one another. */
ckv_status ckv_shard_plan_init(ckv_shard_plan *p, int tp, int rank, int n_heads, int n_kv_heads, int head_dim,
                               int intermediate, int vocab);

/* [begin, end) of an even split of n items over parts (the first n % parts get one more). */
void ckv_shard_range(int n, int parts, int index, int *begin, int *count);

#endif
