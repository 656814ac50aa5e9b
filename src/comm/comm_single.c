/* comm_single.c - the one-rank communicator: reductions and gathers are copies or no-ops. */
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

static ckv_status single_allreduce_f32(ckv_comm *c, float *buf, size_t n, ckv_comm_op op) {
    (void)c; (void)buf; (void)n; (void)op;
    return CKV_STATUS_OK;
}

static ckv_status single_allreduce_i32(ckv_comm *c, int *buf, size_t n, ckv_comm_op op) {
    (void)c; (void)buf; (void)n; (void)op;
    return CKV_STATUS_OK;
}

static ckv_status single_allgather(ckv_comm *c, const void *send, void *recv, size_t bytes) {
    (void)c;
    if (recv != send) memmove(recv, send, bytes);
    return CKV_STATUS_OK;
}

static ckv_status single_bcast(ckv_comm *c, void *buf, size_t bytes, int root) {
    (void)c; (void)buf; (void)bytes;
    if (root != 0) return ckv_error(CKV_STATUS_ERR_ARG, "broadcast root %d outside a 1-rank communicator", root);
    return CKV_STATUS_OK;
}

static ckv_status single_barrier(ckv_comm *c) {
    (void)c;
    return CKV_STATUS_OK;
}

static ckv_status single_split(ckv_comm *c, int color, int key, ckv_comm **out) {
    (void)c; (void)color; (void)key;
    return ckv_comm_init_single(out);
}

static void single_abort(ckv_comm *c, int code) {
    (void)c;
    exit(code ? code : 1);
}

static void single_free(ckv_comm *c) { free(c); }

static const ckv_comm_ops single_ops = {
    .allreduce_f32 = single_allreduce_f32,
    .allreduce_i32 = single_allreduce_i32,
    .allgather = single_allgather,
    .bcast = single_bcast,
    .barrier = single_barrier,
    .split = single_split,
    .abort = single_abort,
    .free = single_free,
};

ckv_status ckv_comm_init_single(ckv_comm **out) {
    ckv_comm *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory creating a communicator");
    c->ops = &single_ops;
    c->rank = 0;
    c->size = 1;
    c->kind = "single";
    *out = c;
    return CKV_STATUS_OK;
}
