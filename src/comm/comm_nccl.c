/* comm_nccl.c - the NCCL communicator: collectives over GPU buffers, bootstrapped by broadcasting
 * the NCCL unique id over another communicator (MPI). Without a stream set, every call runs on the
 * communicator's own stream and is waited for by polling (cudaStreamQuery, ncclCommGetAsyncError)
 * against the timeout, so the engine's ordering guarantees are the same as with MPI. With a stream
 * set (ckv_comm_set_stream: the backend's compute stream, which stays the caller's) calls are only
 * enqueued, between two events recorded on that stream, into a ring a watchdog thread polls: a
 * collective not done within the timeout of its start (the first event: the kernels queued before
 * it are not counted), or an asynchronous NCCL error, aborts the NCCL communicator and ends the job
 * naming the rank and the operation. The communicator is created non-blocking, so its init is bounded too.
 * Nothing is allocated per call. This is the only file that includes nccl.h; it and src/backend/cuda
 * are the only ones with CUDA headers. */
#define _POSIX_C_SOURCE 200809L /* gethostname, nanosleep: before any system header */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm/comm.h"
#include "core/timer.h"

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
        if (ckv_r_ != ncclSuccess && ckv_r_ != ncclInProgress)                                        \
            return ckv_error(CKV_STATUS_ERR_COMM, "%s failed: %s", #call, ncclGetErrorString(ckv_r_)); \
    } while (0)

#define CKV_NCCL_RING 256 /* collectives in flight on the compute stream before the caller waits */

typedef struct {
    cudaEvent_t start;  /* recorded before the collective: the kernels producing its input are done */
    cudaEvent_t done;   /* recorded after it */
    const char *op;
    size_t bytes;
    double t0;          /* when the watchdog first saw `start` complete (the deadline counts from it) */
    int started;
} nccl_pending;

typedef struct {
    ncclComm_t comm;
    cudaStream_t own;       /* the communicator's stream (synchronous mode) */
    cudaStream_t stream;    /* where collectives go: own, or the compute stream */
    cudaStream_t compute;   /* the compute stream when asynchronous mode could not start: waited for
                               before each collective on own (no event to order the two streams) */
    int device;
    float *one;             /* [1] device word of the barrier */
    ckv_comm *bootstrap;    /* borrowed: used to end the job */
    /* asynchronous mode: the ring of enqueued collectives and its watchdog */
    int async;
    nccl_pending ring[CKV_NCCL_RING];
    int head, count;
    pthread_mutex_t lock;
    pthread_t watchdog;
    int watching, stop;
} nccl_ctx;

static nccl_ctx *ctx_of(ckv_comm *c) { return c->ctx; }

/* Ends the job: aborts NCCL (so no kernel waits on a dead peer), then the bootstrap (MPI_Abort). */
static void nccl_fail(ckv_comm *c, const char *op, size_t bytes, const char *why) {
    char msg[256];
    snprintf(msg, sizeof msg, "%zu bytes on GPU %d: %s", bytes, ctx_of(c)->device, why);
    ckv_comm_fail(c, op, msg); /* calls nccl_abort */
}

/* Why a communicator is failing (asynchronous NCCL error), or NULL. */
static const char *nccl_async_error(nccl_ctx *x) {
    ncclResult_t e = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(x->comm, &e);
    if (r != ncclSuccess) return ncclGetErrorString(r);
    if (e != ncclSuccess && e != ncclInProgress) return ncclGetErrorString(e);
    return NULL;
}

/* Waits for an enqueue of a non-blocking communicator to be accepted (ncclInProgress), bounded. */
static void nccl_settle(ckv_comm *c, ncclResult_t r, const char *op, size_t bytes) {
    nccl_ctx *x = ctx_of(c);
    const double t0 = ckv_time_now();
    while (r == ncclInProgress) {
        ncclResult_t e = ncclSuccess;
        ncclCommGetAsyncError(x->comm, &e);
        r = e;
        if (r == ncclInProgress && c->timeout_s > 0 && ckv_time_now() - t0 > c->timeout_s)
            nccl_fail(c, op, bytes, "NCCL did not accept the operation within --comm-timeout");
        if (r == ncclInProgress) sched_yield();
    }
    if (r != ncclSuccess) nccl_fail(c, op, bytes, ncclGetErrorString(r));
}

/* Synchronous mode: waits for the stream, polling NCCL's asynchronous error and the deadline. */
static ckv_status nccl_wait(ckv_comm *c, const char *op, size_t bytes) {
    nccl_ctx *x = ctx_of(c);
    const double t0 = ckv_time_now();
    for (;;) {
        cudaError_t e = cudaStreamQuery(x->stream);
        if (e == cudaSuccess) return CKV_STATUS_OK;
        if (e != cudaErrorNotReady)
            return ckv_error(CKV_STATUS_ERR_DEVICE, "%s on GPU %d failed: %s", op, x->device, cudaGetErrorString(e));
        const char *err = nccl_async_error(x);
        if (err) nccl_fail(c, op, bytes, err);
        if (c->timeout_s > 0 && ckv_time_now() - t0 > c->timeout_s)
            nccl_fail(c, op, bytes, "not complete within --comm-timeout: a peer rank stopped participating or died");
        sched_yield();
    }
}

/* Asynchronous mode: pops the completed collectives at the head of the ring; fails the job on a
 * deadline passed or an error. Called with the lock held. */
static void ring_poll(ckv_comm *c) {
    nccl_ctx *x = ctx_of(c);
    while (x->count > 0) {
        nccl_pending *p = &x->ring[x->head];
        cudaError_t e = cudaEventQuery(p->done);
        if (e == cudaErrorNotReady) {
            if (!p->started) { /* still behind the compute kernels queued before it */
                cudaError_t es = cudaEventQuery(p->start);
                if (es != cudaSuccess && es != cudaErrorNotReady) nccl_fail(c, p->op, p->bytes, cudaGetErrorString(es));
                if (es != cudaSuccess) break;
                p->started = 1;
                p->t0 = ckv_time_now();
            }
            if (c->timeout_s > 0 && ckv_time_now() - p->t0 > c->timeout_s)
                nccl_fail(c, p->op, p->bytes, "not complete within --comm-timeout: a peer rank stopped participating or died");
            break;
        }
        if (e != cudaSuccess) nccl_fail(c, p->op, p->bytes, cudaGetErrorString(e));
        x->head = (x->head + 1) % CKV_NCCL_RING;
        x->count--;
    }
    const char *err = nccl_async_error(x);
    if (err) nccl_fail(c, x->count ? x->ring[x->head].op : "NCCL", x->count ? x->ring[x->head].bytes : 0, err);
}

static void *watchdog_main(void *arg) {
    ckv_comm *c = arg;
    nccl_ctx *x = ctx_of(c);
    cudaSetDevice(x->device);
    struct timespec ts = {0, 10 * 1000 * 1000};
    for (;;) {
        pthread_mutex_lock(&x->lock);
        int stop = x->stop;
        if (!stop) ring_poll(c);
        pthread_mutex_unlock(&x->lock);
        if (stop) return NULL;
        nanosleep(&ts, NULL);
    }
}

/* Before an enqueue in asynchronous mode: waits for a free slot of the ring (the oldest collective
 * to complete when it is full) and records the slot's start event. Only the calling thread fills
 * slots; the watchdog reads the `count` of them from the head, so the free slot is the caller's. */
static ckv_status nccl_before(ckv_comm *c) {
    nccl_ctx *x = ctx_of(c);
    /* synchronous mode beside a compute stream: its kernels produce the input, so they finish first */
    if (!x->async && x->compute) CKV_CUDA_CHECK(cudaStreamSynchronize(x->compute));
    if (!x->async) return CKV_STATUS_OK;
    struct timespec ts = {0, 20 * 1000};
    pthread_mutex_lock(&x->lock);
    while (x->count == CKV_NCCL_RING) {
        ring_poll(c);
        if (x->count == CKV_NCCL_RING) {
            pthread_mutex_unlock(&x->lock);
            nanosleep(&ts, NULL);
            pthread_mutex_lock(&x->lock);
        }
    }
    nccl_pending *p = &x->ring[(x->head + x->count) % CKV_NCCL_RING];
    pthread_mutex_unlock(&x->lock);
    CKV_CUDA_CHECK(cudaEventRecord(p->start, x->stream));
    return CKV_STATUS_OK;
}

/* After an enqueue: synchronous mode waits; asynchronous mode records the completion event of the
 * slot nccl_before prepared and hands it to the watchdog. */
static ckv_status nccl_after(ckv_comm *c, ncclResult_t r, const char *op, size_t bytes) {
    nccl_ctx *x = ctx_of(c);
    if (r != ncclSuccess && r != ncclInProgress)
        return ckv_error(CKV_STATUS_ERR_COMM, "%s of %zu bytes on GPU %d failed: %s", op, bytes, x->device,
                         ncclGetErrorString(r));
    nccl_settle(c, r, op, bytes);
    if (!x->async) return nccl_wait(c, op, bytes);
    pthread_mutex_lock(&x->lock);
    nccl_pending *p = &x->ring[(x->head + x->count) % CKV_NCCL_RING];
    cudaError_t e = cudaEventRecord(p->done, x->stream);
    if (e == cudaSuccess) {
        p->op = op;
        p->bytes = bytes;
        p->t0 = 0;
        p->started = 0;
        x->count++;
    }
    pthread_mutex_unlock(&x->lock);
    if (e != cudaSuccess)
        return ckv_error(CKV_STATUS_ERR_DEVICE, "recording the completion of %s failed: %s", op, cudaGetErrorString(e));
    return CKV_STATUS_OK;
}

/* Waits for a non-blocking communicator's init (or split) to finish, bounded by the timeout. */
static ckv_status nccl_init_wait(ncclComm_t comm, double timeout_s, const char *what, int rank) {
    const double t0 = ckv_time_now();
    for (;;) {
        ncclResult_t e = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(comm, &e);
        if (r != ncclSuccess) e = r;
        if (e == ncclSuccess) return CKV_STATUS_OK;
        if (e != ncclInProgress)
            return ckv_error(CKV_STATUS_ERR_COMM, "rank %d: %s failed: %s%s", rank, what, ncclGetErrorString(e),
                             e == ncclInvalidUsage ? " (two ranks on one GPU? the staged path serves that)" : "");
        if (timeout_s > 0 && ckv_time_now() - t0 > timeout_s)
            return ckv_error(CKV_STATUS_ERR_COMM, "rank %d: %s did not finish within --comm-timeout %g s (a peer rank "
                             "did not join)", rank, what, timeout_s);
        sched_yield();
    }
}

static ncclRedOp_t nccl_op(ckv_comm_op op) {
    return op == CKV_COMM_OP_MAX ? ncclMax : op == CKV_COMM_OP_MIN ? ncclMin : ncclSum;
}

static ckv_status nccl_allreduce_f32(ckv_comm *c, float *buf, size_t n, ckv_comm_op op) {
    if (c->size == 1 || n == 0) return CKV_STATUS_OK;
    c->bytes += n * sizeof(float);
    CKV_TRY(nccl_before(c));
    return nccl_after(c, ncclAllReduce(buf, buf, n, ncclFloat32, nccl_op(op), ctx_of(c)->comm, ctx_of(c)->stream),
                      "NCCL all-reduce (float)", n * sizeof(float));
}

static ckv_status nccl_allreduce_i32(ckv_comm *c, int *buf, size_t n, ckv_comm_op op) {
    if (c->size == 1 || n == 0) return CKV_STATUS_OK;
    c->bytes += n * sizeof(int);
    CKV_TRY(nccl_before(c));
    return nccl_after(c, ncclAllReduce(buf, buf, n, ncclInt32, nccl_op(op), ctx_of(c)->comm, ctx_of(c)->stream),
                      "NCCL all-reduce (int)", n * sizeof(int));
}

static ckv_status nccl_allgather(ckv_comm *c, const void *send, void *recv, size_t bytes) {
    c->bytes += bytes;
    CKV_TRY(nccl_before(c));
    return nccl_after(c, ncclAllGather(send, recv, bytes, ncclUint8, ctx_of(c)->comm, ctx_of(c)->stream),
                      "NCCL all-gather", bytes);
}

static ckv_status nccl_bcast(ckv_comm *c, void *buf, size_t bytes, int root) {
    if (root < 0 || root >= c->size) return ckv_error(CKV_STATUS_ERR_ARG, "broadcast root %d outside %d ranks", root, c->size);
    c->bytes += bytes;
    CKV_TRY(nccl_before(c));
    return nccl_after(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, ctx_of(c)->comm, ctx_of(c)->stream),
                      "NCCL broadcast", bytes);
}

static ckv_status nccl_barrier(ckv_comm *c) {
    /* NCCL has no barrier: a one-element all-reduce on the device orders every rank the same way */
    if (c->size == 1) return CKV_STATUS_OK;
    CKV_TRY(nccl_before(c));
    return nccl_after(c, ncclAllReduce(ctx_of(c)->one, ctx_of(c)->one, 1, ncclFloat32, ncclSum, ctx_of(c)->comm,
                                       ctx_of(c)->stream), "NCCL barrier", sizeof(float));
}

static void nccl_free(ckv_comm *c);
static ckv_status nccl_wrap(ckv_comm **out, ncclComm_t comm, int device, ckv_comm *bootstrap);

static ckv_status nccl_split(ckv_comm *c, int color, int key, ckv_comm **out) {
    ncclComm_t sub;
    *out = NULL;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommSplit(ctx_of(c)->comm, color, key, &sub, &cfg);
    if (r != ncclSuccess && r != ncclInProgress)
        return ckv_error(CKV_STATUS_ERR_COMM, "ncclCommSplit failed: %s", ncclGetErrorString(r));
    CKV_TRY(nccl_init_wait(sub, c->timeout_s, "ncclCommSplit", c->rank));
    ckv_status s = nccl_wrap(out, sub, ctx_of(c)->device, ctx_of(c)->bootstrap);
    if (s != CKV_STATUS_OK) ncclCommDestroy(sub);
    return s;
}

static void nccl_abort(ckv_comm *c, int code) {
    if (c && c->ctx) {
        ncclCommAbort(ctx_of(c)->comm);
        ctx_of(c)->comm = NULL;
        if (ctx_of(c)->bootstrap) ctx_of(c)->bootstrap->ops->abort(ctx_of(c)->bootstrap, code);
    }
    exit(code ? code : 1);
}

/* Switches to asynchronous mode on `stream` (once; NULL keeps the synchronous own stream): the
 * events of the ring are created now and the watchdog started, so no call allocates. When the
 * events cannot be created it stays synchronous on its own stream, each collective after the host
 * has waited for `stream` (whose kernels produce its input). */
static void nccl_set_stream(ckv_comm *c, void *stream) {
    nccl_ctx *x = ctx_of(c);
    if (!stream || x->async) return;
    cudaStreamSynchronize(x->own);
    for (int i = 0; i < CKV_NCCL_RING; i++) {
        cudaError_t e = cudaEventCreateWithFlags(&x->ring[i].start, cudaEventDisableTiming);
        if (e == cudaSuccess) {
            e = cudaEventCreateWithFlags(&x->ring[i].done, cudaEventDisableTiming);
            if (e != cudaSuccess) cudaEventDestroy(x->ring[i].start);
        }
        if (e != cudaSuccess) {
            for (int j = 0; j < i; j++) {
                cudaEventDestroy(x->ring[j].start);
                cudaEventDestroy(x->ring[j].done);
            }
            x->compute = (cudaStream_t)stream; /* stays synchronous on its own stream, after it */
            return;
        }
    }
    x->stream = (cudaStream_t)stream;
    x->async = 1;
    x->watching = pthread_create(&x->watchdog, NULL, watchdog_main, c) == 0;
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
    .set_stream = nccl_set_stream,
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
    c->timeout_s = bootstrap ? bootstrap->timeout_s : CKV_COMM_TIMEOUT_DEFAULT_S;
    pthread_mutex_init(&x->lock, NULL);
    cudaError_t e = cudaStreamCreateWithFlags(&x->own, cudaStreamNonBlocking);
    if (e == cudaSuccess) e = cudaMalloc((void **)&x->one, sizeof(float));
    if (e == cudaSuccess) e = cudaMemset(x->one, 0, sizeof(float));
    if (e != cudaSuccess) {
        if (x->own) cudaStreamDestroy(x->own);
        if (x->one) cudaFree(x->one);
        pthread_mutex_destroy(&x->lock);
        free(x);
        free(c);
        return ckv_error(CKV_STATUS_ERR_DEVICE, "creating the NCCL stream failed: %s", cudaGetErrorString(e));
    }
    x->stream = x->own;
    ncclCommUserRank(comm, &c->rank);
    ncclCommCount(comm, &c->size);
    *out = c;
    return CKV_STATUS_OK;
}

static void nccl_free(ckv_comm *c) {
    if (!c) return;
    nccl_ctx *x = c->ctx;
    if (x) {
        if (x->watching) {
            pthread_mutex_lock(&x->lock);
            x->stop = 1;
            pthread_mutex_unlock(&x->lock);
            pthread_join(x->watchdog, NULL);
        }
        if (x->async) {
            cudaStreamSynchronize(x->stream);
            for (int i = 0; i < CKV_NCCL_RING; i++) {
                cudaEventDestroy(x->ring[i].start);
                cudaEventDestroy(x->ring[i].done);
            }
        }
        if (x->comm) ncclCommDestroy(x->comm);
        if (x->own) cudaStreamDestroy(x->own);
        if (x->one) cudaFree(x->one);
        pthread_mutex_destroy(&x->lock);
        free(x);
    }
    free(c);
}

int ckv_comm_nccl_available(void) { return 1; }

int ckv_comm_nccl_on_stream(const ckv_comm *c) { return c && c->ops == &nccl_ops && ((const nccl_ctx *)c->ctx)->async; }

ckv_status ckv_comm_init_nccl(ckv_comm **out, ckv_comm *bootstrap, int device) {
    *out = NULL;
    if (!bootstrap) return ckv_error(CKV_STATUS_ERR_ARG, "NCCL needs a bootstrap communicator");
    CKV_CUDA_CHECK(cudaSetDevice(device));
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (bootstrap->rank == 0) CKV_NCCL_CHECK(ncclGetUniqueId(&id));
    CKV_TRY(bootstrap->ops->bcast(bootstrap, &id, sizeof id, 0));
    ncclComm_t comm;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* init and collectives return at once; nccl_init_wait bounds the init */
    CKV_NCCL_CHECK(ncclCommInitRankConfig(&comm, bootstrap->size, id, bootstrap->rank, &cfg));
    ckv_status s = nccl_init_wait(comm, bootstrap->timeout_s, "ncclCommInitRankConfig", bootstrap->rank);
    if (s != CKV_STATUS_OK) {
        ncclCommAbort(comm);
        return s;
    }
    s = nccl_wrap(out, comm, device, bootstrap);
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
    /* more ranks than GPUs share them round-robin; the device communicator then stages their
     * collectives through host memory (NCCL refuses two ranks on one GPU) */
    *device = local % count;
    return CKV_STATUS_OK;
}

ckv_status ckv_comm_gpu_id(int device, char *id, size_t cap) {
    char bus[64] = "";
    CKV_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, (int)sizeof bus, device));
    snprintf(id, cap, "%s", bus);
    return CKV_STATUS_OK;
}
