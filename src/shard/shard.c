/* shard.c - the tensor-parallel plan (see shard.h). */
#include "shard/shard.h"

#include <string.h>

void ckv_shard_range(int n, int parts, int index, int *begin, int *count) {
    int base = n / parts, rem = n % parts;
    *begin = index * base + (index < rem ? index : rem);
    *count = base + (index < rem ? 1 : 0);
}

ckv_status ckv_shard_plan_init(ckv_shard_plan *p, int tp, int rank, int n_heads, int n_kv_heads, int head_dim,
                               int intermediate, int vocab) {
    memset(p, 0, sizeof *p);
    if (tp < 1) return ckv_error(CKV_STATUS_ERR_ARG, "--tp must be >= 1, got %d", tp);
    if (rank < 0 || rank >= tp) return ckv_error(CKV_STATUS_ERR_ARG, "rank %d outside a %d-way tensor-parallel group", rank, tp);
    if (n_heads < 1 || n_kv_heads < 1 || n_heads % n_kv_heads != 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "%d attention heads are not a multiple of %d KV heads", n_heads, n_kv_heads);
    if (n_heads % tp != 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "--tp %d does not divide the model's %d attention heads", tp, n_heads);
    if (tp <= n_kv_heads ? n_kv_heads % tp != 0 : tp % n_kv_heads != 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "--tp %d and the model's %d KV heads must divide one another", tp, n_kv_heads);
    if (intermediate < tp) return ckv_error(CKV_STATUS_ERR_ARG, "--tp %d exceeds the MLP width %d", tp, intermediate);
    if (vocab < tp) return ckv_error(CKV_STATUS_ERR_ARG, "--tp %d exceeds the vocabulary size %d", tp, vocab);
    p->tp = tp;
    p->rank = rank;
    p->n_heads = n_heads;
    p->n_kv_heads = n_kv_heads;
    p->head_dim = head_dim;
    p->n_q_local = n_heads / tp;
    p->q_head0 = rank * p->n_q_local;
    if (tp <= n_kv_heads) {
        p->n_kv_local = n_kv_heads / tp;
        p->kv_head0 = rank * p->n_kv_local;
        p->kv_replicas = 1;
        p->replica_group = rank;
        p->replica_rank = 0;
    } else {
        p->kv_replicas = tp / n_kv_heads;
        p->n_kv_local = 1;
        p->kv_head0 = rank / p->kv_replicas;
        p->replica_group = p->kv_head0;
        p->replica_rank = rank % p->kv_replicas;
    }
    p->intermediate = intermediate;
    ckv_shard_range(intermediate, tp, rank, &p->ff0, &p->n_ff_local);
    p->vocab = vocab;
    ckv_shard_range(vocab, tp, rank, &p->vocab0, &p->n_vocab_local);
    return CKV_STATUS_OK;
}
