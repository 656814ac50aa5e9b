/* comm_nccl.c - the NCCL communicator: collectives over GPU buffers on the communicator's own CUDA
 * stream, bootstrapped by broadcasting the NCCL unique id over another communicator (MPI). Every
 * call is synchronous for the caller (the stream is synchronised before returning), so the engine's
 * ordering guarantees are the same as with MPI. abort() aborts the NCCL communicator (so no rank
 * waits forever in a collective) and then ends the job through the bootstrap communicator. This is
 * the only file that includes nccl.h; it and src/backend/cuda are the only ones with CUDA headers. */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"

/* The checker family for CUDA and NCCL calls in this file: return a ckv_status naming the call. */
#define CKV_CUDA_CHECK(call)                                                                          \
    do {                                                                                              \
        cudaError_t ckv_e_ = (call);                                                                  \
        if (ckv_e_ != cudaSuccess)                                                                    \
            return ckv_error(CKV_STATUS_ERR_DEVICE, "%s failed: %s", #call, cudaGetErrorString(ckv_e_)); \
    } while (0)
#define CKV_NCCL_CHECK(call)                                                                          \
    do {                                                                                              \
        ncclResult_t ckv_r_ = (call);                                                                 \
        if (ckv_r_ != ncclSuccess)                                                                    \
            return ckv_error(CKV_STATUS_ERR_COMM, "%s failed: %s", #call, ncclGetErrorString(ckv_r_)); \
    } while (0)

typedef struct {
    ncclComm_t comm;
    cudaStream_t stream;
    int device;
    ckv_comm *bootstrap; /* borrowed: used to end the job */
} nccl_ctx;

static nccl_ctx *ctx_of(ckv_comm *c) { return c->ctx; }

static ckv_status nccl_wait(ckv_comm *c) {
    CKV_CUDA_CHECK(cudaStreamSynchronize(ctx_of(c)->stream));
    return CKV_STATUS_OK;
}

static ncclRedOp_t nccl_op(ckv_comm_op op) {
    return op == CKV_COMM_OP_MAX ? ncclMax : op == CKV_COMM_OP_MIN ? ncclMin : ncclSum;
}

static ckv_status nccl_allreduce_f32(ckv_comm *c, float *buf, size_t n, ckv_comm_op op) {
    if (c->size == 1 || n == 0) return CKV_STATUS_OK;
    c->bytes += n * sizeof(float);
    CKV_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclFloat32, nccl_op(op), ctx_of(c)->comm, ctx_of(c)->stream));
    return nccl_wait(c);
}

static ckv_status nccl_allreduce_i32(ckv_comm *c, int *buf, size_t n, ckv_comm_op op) {
    if (c->size == 1 || n == 0) return CKV_STATUS_OK;
    c->bytes += n * sizeof(int);
    CKV_NCCL_CHECK(ncclAllReduce(buf, buf, n, ncclInt32, nccl_op(op), ctx_of(c)->comm, ctx_of(c)->stream));
    return nccl_wait(c);
}

static ckv_status nccl_allgather(ckv_comm *c, const void *send, void *recv, size_t bytes) {
    c->bytes += bytes;
    CKV_NCCL_CHECK(ncclAllGather(send, recv, bytes, ncclUint8, ctx_of(c)->comm, ctx_of(c)->stream));
    return nccl_wait(c);
}

static ckv_status nccl_bcast(ckv_comm *c, void *buf, size_t bytes, int root) {
    if (root < 0 || root >= c->size) return ckv_error(CKV_STATUS_ERR_ARG, "broadcast root %d outside %d ranks", root, c->size);
    c->bytes += bytes;
    CKV_NCCL_CHECK(ncclBroadcast(buf, buf, bytes, ncclUint8, root, ctx_of(c)->comm, ctx_of(c)->stream));
    return nccl_wait(c);
}

static ckv_status nccl_barrier(ckv_comm *c) {
    /* NCCL has no barrier: a one-element all-reduce on the device orders every rank the same way */
    float *one = NULL;
    CKV_CUDA_CHECK(cudaMalloc((void **)&one, sizeof(float)));
    ckv_status s = nccl_allreduce_f32(c, one, 1, CKV_COMM_OP_SUM);
    cudaFree(one);
    return s;
}

static void nccl_free(ckv_comm *c);
static ckv_status nccl_wrap(ckv_comm **out, ncclComm_t comm, int device, ckv_comm *bootstrap);

static ckv_status nccl_split(ckv_comm *c, int color, int key, ckv_comm **out) {
    ncclComm_t sub;
    *out = NULL;
    CKV_NCCL_CHECK(ncclCommSplit(ctx_of(c)->comm, color, key, &sub, NULL));
    ckv_status s = nccl_wrap(out, sub, ctx_of(c)->device, ctx_of(c)->bootstrap);
    if (s != CKV_STATUS_OK) ncclCommDestroy(sub);
    return s;
}

static void nccl_abort(ckv_comm *c, int code) {
    if (c && c->ctx) {
        ncclCommAbort(ctx_of(c)->comm);
        if (ctx_of(c)->bootstrap) ctx_of(c)->bootstrap->ops->abort(ctx_of(c)->bootstrap, code);
    }
    exit(code ? code : 1);
}

static ckv_status nccl_node_local(ckv_comm *c, int *local_rank, int *local_size) {
    return ckv_comm_node_local(ctx_of(c)->bootstrap, local_rank, local_size);
}

static const ckv_comm_ops nccl_ops = {
    .allreduce_f32 = nccl_allreduce_f32,
    .allreduce_i32 = nccl_allreduce_i32,
    .allgather = nccl_allgather,
    .bcast = nccl_bcast,
    .barrier = nccl_barrier,
    .split = nccl_split,
    .abort = nccl_abort,
    .free = nccl_free,
    .node_local = nccl_node_local,
};

static ckv_status nccl_wrap(ckv_comm **out, ncclComm_t comm, int device, ckv_comm *bootstrap) {
    ckv_comm *c = calloc(1, sizeof *c);
    nccl_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory creating an NCCL communicator");
    }
    x->comm = comm;
    x->device = device;
    x->bootstrap = bootstrap;
    c->ops = &nccl_ops;
    c->ctx = x;
    c->kind = "nccl";
    c->device_buffers = 1;
    cudaError_t e = cudaStreamCreateWithFlags(&x->stream, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        free(x);
        free(c);
        return ckv_error(CKV_STATUS_ERR_DEVICE, "cudaStreamCreate failed: %s", cudaGetErrorString(e));
    }
    ncclCommUserRank(comm, &c->rank);
    ncclCommCount(comm, &c->size);
    *out = c;
    return CKV_STATUS_OK;
}

static void nccl_free(ckv_comm *c) {
    if (!c) return;
    nccl_ctx *x = c->ctx;
    if (x) {
        if (x->comm) ncclCommDestroy(x->comm);
        if (x->stream) cudaStreamDestroy(x->stream);
        free(x);
    }
    free(c);
}

int ckv_comm_nccl_available(void) { return 1; }

ckv_status ckv_comm_init_nccl(ckv_comm **out, ckv_comm *bootstrap, int device) {
    *out = NULL;
    if (!bootstrap) return ckv_error(CKV_STATUS_ERR_ARG, "NCCL needs a bootstrap communicator");
    CKV_CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (bootstrap->rank == 0) CKV_NCCL_CHECK(ncclGetUniqueId(&id));
    CKV_TRY(bootstrap->ops->bcast(bootstrap, &id, sizeof id, 0));
    ncclComm_t comm;
    CKV_NCCL_CHECK(ncclCommInitRank(&comm, bootstrap->size, id, bootstrap->rank));
    ckv_status s = nccl_wrap(out, comm, device, bootstrap);
    if (s != CKV_STATUS_OK) ncclCommDestroy(comm);
    return s;
}

ckv_status ckv_comm_select_gpu(ckv_comm *world, int *device) {
    int count = 0, local = 0, local_size = 1;
    *device = -1;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return ckv_error(CKV_STATUS_ERR_DEVICE, "no GPU visible to rank %d (%s; CUDA_VISIBLE_DEVICES=%s)", world ? world->rank : 0,
                         e != cudaSuccess ? cudaGetErrorString(e) : "0 devices",
                         getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    CKV_TRY(ckv_comm_node_local(world, &local, &local_size));
    if (local_size > count)
        return ckv_error(CKV_STATUS_ERR_ARG, "%d ranks on this node share %d visible GPUs: start one rank per GPU", local_size,
                         count);
    *device = local % count;
    return CKV_STATUS_OK;
}
