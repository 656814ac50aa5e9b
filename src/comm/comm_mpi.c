/* comm_mpi.c - the MPI communicator (host buffers). Errors are returned with MPI's own message;
 * MPI_ERRORS_RETURN is set so a failing call reports instead of killing silently, and abort() ends
 * every rank with MPI_Abort so a failure on one rank never leaves the others hanging. Collectives
 * are started non-blocking and polled against the communicator's timeout: a rank that stops
 * participating ends the job with the operation named instead of a hang. The splits, which MPI
 * offers only blocking, are preceded by a timed barrier (mpi_arrive). */
#define _POSIX_C_SOURCE 200809L /* gethostname, nanosleep: before any system header */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/timer.h"

#include "comm/comm.h"

typedef struct {
    MPI_Comm comm;
    int is_world; /* finalise MPI when freed */
} ckv_mpi_ctx;

static ckv_status ckv_mpi_status(int rc, const char *what) {
    if (rc == MPI_SUCCESS) return CKV_STATUS_OK;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return ckv_error(CKV_STATUS_ERR_COMM, "%s failed: %.*s", what, len, msg);
}

/* The checker of this family: returns a ckv_status naming the MPI call. */
#define CKV_MPI_CHECK(call) CKV_TRY(ckv_mpi_status((call), #call))

static MPI_Comm mpi_comm_of(ckv_comm *c) { return ((ckv_mpi_ctx *)c->ctx)->comm; }

static MPI_Op mpi_op(ckv_comm_op op) {
    return op == CKV_COMM_OP_MAX ? MPI_MAX : op == CKV_COMM_OP_MIN ? MPI_MIN : MPI_SUM;
}

/* Completes a started collective: MPI_Wait without a timeout, else MPI_Test polled (busy for the
 * first millisecond, then every 50 us) until done or the deadline, which ends the job naming `op`. */
static ckv_status mpi_complete(ckv_comm *c, MPI_Request *req, const char *op, size_t bytes) {
    if (c->timeout_s <= 0) return ckv_mpi_status(MPI_Wait(req, MPI_STATUS_IGNORE), op);
    const double t0 = ckv_time_now();
    for (unsigned long it = 0;; it++) {
        int done = 0;
        int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) return ckv_mpi_status(rc, op);
        if (done) return CKV_STATUS_OK;
        if ((it & 63) != 63) continue;
        const double dt = ckv_time_now() - t0;
        if (dt > c->timeout_s) {
            char why[160];
            snprintf(why, sizeof why, "%zu bytes, not complete after %.1f s (--comm-timeout %g): a peer rank stopped "
                     "participating or died", bytes, dt, c->timeout_s);
            ckv_comm_fail(c, op, why);
        }
        if (dt > 1e-3) {
            struct timespec ts = {0, 50000};
            nanosleep(&ts, NULL);
        }
    }
}

static ckv_status mpi_allreduce_f32(ckv_comm *c, float *buf, size_t n, ckv_comm_op op) {
    if (c->size == 1 || n == 0) return CKV_STATUS_OK;
    if (n > (size_t)INT32_MAX) return ckv_error(CKV_STATUS_ERR_ARG, "all-reduce of %zu floats is too large", n);
    c->bytes += n * sizeof(float);
    MPI_Request req;
    CKV_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, mpi_op(op), mpi_comm_of(c), &req));
    return mpi_complete(c, &req, "MPI all-reduce (float)", n * sizeof(float));
}

static ckv_status mpi_allreduce_i32(ckv_comm *c, int *buf, size_t n, ckv_comm_op op) {
    if (c->size == 1 || n == 0) return CKV_STATUS_OK;
    if (n > (size_t)INT32_MAX) return ckv_error(CKV_STATUS_ERR_ARG, "all-reduce of %zu ints is too large", n);
    c->bytes += n * sizeof(int);
    MPI_Request req;
    CKV_MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_INT, mpi_op(op), mpi_comm_of(c), &req));
    return mpi_complete(c, &req, "MPI all-reduce (int)", n * sizeof(int));
}

static ckv_status mpi_allgather(ckv_comm *c, const void *send, void *recv, size_t bytes) {
    if (bytes > (size_t)INT32_MAX) return ckv_error(CKV_STATUS_ERR_ARG, "all-gather of %zu bytes is too large", bytes);
    c->bytes += bytes;
    MPI_Request req;
    CKV_MPI_CHECK(MPI_Iallgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE,
                                 mpi_comm_of(c), &req));
    return mpi_complete(c, &req, "MPI all-gather", bytes);
}

static ckv_status mpi_bcast(ckv_comm *c, void *buf, size_t bytes, int root) {
    if (root < 0 || root >= c->size) return ckv_error(CKV_STATUS_ERR_ARG, "broadcast root %d outside %d ranks", root, c->size);
    if (bytes > (size_t)INT32_MAX) return ckv_error(CKV_STATUS_ERR_ARG, "broadcast of %zu bytes is too large", bytes);
    c->bytes += bytes;
    MPI_Request req;
    CKV_MPI_CHECK(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, root, mpi_comm_of(c), &req));
    return mpi_complete(c, &req, "MPI broadcast", bytes);
}

static ckv_status mpi_barrier(ckv_comm *c) {
    MPI_Request req;
    CKV_MPI_CHECK(MPI_Ibarrier(mpi_comm_of(c), &req));
    return mpi_complete(c, &req, "MPI barrier", 0);
}

static void mpi_free(ckv_comm *c);
static ckv_status mpi_wrap(ckv_comm **out, MPI_Comm comm, int is_world);

/* MPI has no non-blocking communicator split: a timed barrier first makes sure every rank has
 * reached the split, so a stalled or dead peer ends the job naming `op` instead of hanging it in
 * the blocking call (which then only runs among ranks that are all there). */
static ckv_status mpi_arrive(ckv_comm *c, const char *op) {
    if (c->size == 1) return CKV_STATUS_OK;
    MPI_Request req;
    CKV_MPI_CHECK(MPI_Ibarrier(mpi_comm_of(c), &req));
    return mpi_complete(c, &req, op, 0);
}

static ckv_status mpi_split(ckv_comm *c, int color, int key, ckv_comm **out) {
    MPI_Comm sub;
    *out = NULL;
    CKV_TRY(mpi_arrive(c, "MPI split"));
    CKV_MPI_CHECK(MPI_Comm_split(mpi_comm_of(c), color, key, &sub));
    MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
    ckv_status s = mpi_wrap(out, sub, 0);
    if (s != CKV_STATUS_OK) MPI_Comm_free(&sub);
    else (*out)->timeout_s = c->timeout_s;
    return s;
}

static void mpi_abort(ckv_comm *c, int code) {
    MPI_Abort(c && c->ctx ? mpi_comm_of(c) : MPI_COMM_WORLD, code ? code : 1);
    exit(code ? code : 1);
}

static ckv_status mpi_node_local(ckv_comm *c, int *local_rank, int *local_size) {
    MPI_Comm node;
    CKV_TRY(mpi_arrive(c, "MPI split by node"));
    CKV_MPI_CHECK(MPI_Comm_split_type(mpi_comm_of(c), MPI_COMM_TYPE_SHARED, c->rank, MPI_INFO_NULL, &node));
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_size(node, local_size);
    MPI_Comm_free(&node);
    return CKV_STATUS_OK;
}

static const ckv_comm_ops mpi_ops = {
    .allreduce_f32 = mpi_allreduce_f32,
    .allreduce_i32 = mpi_allreduce_i32,
    .allgather = mpi_allgather,
    .bcast = mpi_bcast,
    .barrier = mpi_barrier,
    .split = mpi_split,
    .abort = mpi_abort,
    .free = mpi_free,
    .node_local = mpi_node_local,
};

static ckv_status mpi_wrap(ckv_comm **out, MPI_Comm comm, int is_world) {
    ckv_comm *c = calloc(1, sizeof *c);
    ckv_mpi_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory creating an MPI communicator");
    }
    x->comm = comm;
    x->is_world = is_world;
    c->ops = &mpi_ops;
    c->ctx = x;
    c->kind = "mpi";
    c->timeout_s = CKV_COMM_TIMEOUT_DEFAULT_S;
    MPI_Comm_rank(comm, &c->rank);
    MPI_Comm_size(comm, &c->size);
    *out = c;
    return CKV_STATUS_OK;
}

static void mpi_free(ckv_comm *c) {
    if (!c) return;
    ckv_mpi_ctx *x = c->ctx;
    if (x) {
        if (x->is_world) {
            int fin = 0;
            MPI_Finalized(&fin);
            if (!fin) MPI_Finalize();
        } else if (x->comm != MPI_COMM_NULL) {
            MPI_Comm_free(&x->comm);
        }
        free(x);
    }
    free(c);
}

int ckv_comm_mpi_available(void) { return 1; }

int ckv_comm_mpi_any_thread(void) {
    int inited = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&inited);
    if (!inited) return 1;
    MPI_Query_thread(&provided);
    return provided >= MPI_THREAD_SERIALIZED;
}

ckv_status ckv_comm_init_mpi(ckv_comm **out, int *argc, char ***argv) {
    *out = NULL;
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    /* serialized: the server's engine thread, not the main one, issues a serving job's collectives */
    if (!inited) CKV_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided));
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    return mpi_wrap(out, MPI_COMM_WORLD, !inited);
}
