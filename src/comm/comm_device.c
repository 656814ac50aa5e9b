/* comm_device.c - the device communicator of a tensor-parallel group: host collectives go to the
 * host communicator (MPI), device collectives take one of three paths chosen once at init from the
 * ranks' device ids: the host communicator itself where device memory is host memory (CPU backend),
 * NCCL where every rank has its own GPU, or staging (device -> host, host communicator, host ->
 * device) where ranks share a GPU (NCCL refuses that) or NCCL is missing. It holds no CUDA or MPI
 * code: the device side is the ckv_comm_device_io callbacks, NCCL is comm_nccl.c. */
#define _POSIX_C_SOURCE 200809L /* gethostname, nanosleep: before any system header */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "comm/comm.h"

#define CKV_DEVICE_ID_LEN 160 /* host name + '/' + device id, NUL-terminated */

typedef struct {
    ckv_comm *host;  /* borrowed (owned by a split: owns_host) */
    int owns_host;
    ckv_comm *nccl;  /* owned (NCCL path) */
    ckv_comm_device_io io;
    ckv_comm_path path;
    void *stage;     /* host staging of the staged path */
    size_t stage_cap;
    int on_stream;   /* NCCL enqueues on the compute stream (ckv_comm_set_stream) */
    void *work;      /* device workspace (ckv_comm_dev_workspace) */
    size_t work_cap;
} dev_ctx;

static dev_ctx *dctx(ckv_comm *c) { return c->ctx; }

ckv_comm_path ckv_comm_choose_path(const char *ids, int n, size_t id_len, int host_memory, int nccl_available,
                                   char *why, size_t cap) {
    if (host_memory) {
        snprintf(why, cap, "device memory is host memory: the host communicator moves it directly");
        return CKV_COMM_PATH_HOST;
    }
    if (n <= 1) {
        snprintf(why, cap, "one rank: device collectives are local copies");
        return CKV_COMM_PATH_STAGED;
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (!strncmp(ids + (size_t)i * id_len, ids + (size_t)j * id_len, id_len)) {
                snprintf(why, cap, "ranks %d and %d share device %.*s and NCCL needs one GPU per rank", i, j,
                         (int)id_len, ids + (size_t)i * id_len);
                return CKV_COMM_PATH_STAGED;
            }
    if (!nccl_available) {
        snprintf(why, cap, "this build of ckv has no NCCL");
        return CKV_COMM_PATH_STAGED;
    }
    snprintf(why, cap, "one GPU per rank");
    return CKV_COMM_PATH_NCCL;
}

/* Host staging of at least `bytes`: grows on the first call that needs more (a prefill chunk), so the
 * decode loop, whose payloads are smaller, allocates nothing. */
static ckv_status stage_reserve(dev_ctx *x, size_t bytes) {
    if (bytes <= x->stage_cap) return CKV_STATUS_OK;
    ckv_free(x->stage);
    x->stage = NULL;
    x->stage_cap = 0;
    CKV_TRY(ckv_alloc(&x->stage, bytes, "staged collective buffer"));
    x->stage_cap = bytes;
    return CKV_STATUS_OK;
}

static ckv_status work_reserve(dev_ctx *x, size_t bytes) {
    if (bytes <= x->work_cap) return CKV_STATUS_OK;
    x->io.release(x->io.ctx, x->work);
    x->work = NULL;
    x->work_cap = 0;
    CKV_TRY(x->io.alloc(x->io.ctx, &x->work, bytes, "collective workspace"));
    x->work_cap = bytes;
    return CKV_STATUS_OK;
}

/* ---- host collectives: the host communicator ---- */
static ckv_status dev_h_allreduce_f32(ckv_comm *c, float *buf, size_t n, ckv_comm_op op) {
    c->bytes += n * sizeof(float);
    return dctx(c)->host->ops->allreduce_f32(dctx(c)->host, buf, n, op);
}
static ckv_status dev_h_allreduce_i32(ckv_comm *c, int *buf, size_t n, ckv_comm_op op) {
    c->bytes += n * sizeof(int);
    return dctx(c)->host->ops->allreduce_i32(dctx(c)->host, buf, n, op);
}
static ckv_status dev_h_allgather(ckv_comm *c, const void *send, void *recv, size_t bytes) {
    c->bytes += bytes;
    return dctx(c)->host->ops->allgather(dctx(c)->host, send, recv, bytes);
}
static ckv_status dev_h_bcast(ckv_comm *c, void *buf, size_t bytes, int root) {
    c->bytes += bytes;
    return dctx(c)->host->ops->bcast(dctx(c)->host, buf, bytes, root);
}
static ckv_status dev_h_barrier(ckv_comm *c) { return dctx(c)->host->ops->barrier(dctx(c)->host); }
static ckv_status dev_wrap(ckv_comm **out, ckv_comm *host, const ckv_comm_device_io *io, ckv_comm_path path);

/* A split is a device communicator over the split of the host communicator (the replica groups
 * reduce device scores too): device memory that is host memory moves directly, anything else is
 * staged (the groups' payloads are a layer's scores; no NCCL communicator is made for them). */
static ckv_status dev_h_split(ckv_comm *c, int color, int key, ckv_comm **out) {
    *out = NULL;
    ckv_comm *hs = NULL;
    CKV_TRY(dctx(c)->host->ops->split(dctx(c)->host, color, key, &hs));
    ckv_comm_path path = dctx(c)->path == CKV_COMM_PATH_HOST ? CKV_COMM_PATH_HOST : CKV_COMM_PATH_STAGED;
    ckv_status st = dev_wrap(out, hs, &dctx(c)->io, path);
    if (st != CKV_STATUS_OK) {
        ckv_comm_free(hs);
        return st;
    }
    dctx(*out)->owns_host = 1;
    return CKV_STATUS_OK;
}
static ckv_status dev_h_node_local(ckv_comm *c, int *local_rank, int *local_size) {
    return ckv_comm_node_local(dctx(c)->host, local_rank, local_size);
}
static void dev_abort(ckv_comm *c, int code) {
    if (c && c->ctx && dctx(c)->nccl) dctx(c)->nccl->ops->abort(dctx(c)->nccl, code); /* ends the job */
    if (c && c->ctx) dctx(c)->host->ops->abort(dctx(c)->host, code);
    exit(code ? code : 1);
}

/* ---- device collectives ---- */
static ckv_status dev_allreduce_f32(ckv_comm *c, float *buf, size_t n, ckv_comm_op op) {
    dev_ctx *x = dctx(c);
    if (c->size == 1 || n == 0) return CKV_STATUS_OK;
    c->bytes += n * sizeof(float);
    if (x->path == CKV_COMM_PATH_HOST) return x->host->ops->allreduce_f32(x->host, buf, n, op);
    if (x->path == CKV_COMM_PATH_NCCL) {
        if (!x->on_stream && x->io.sync) CKV_TRY(x->io.sync(x->io.ctx)); /* its own stream: order after the kernels */
        return x->nccl->ops->allreduce_f32(x->nccl, buf, n, op);
    }
    const size_t bytes = n * sizeof(float);
    CKV_TRY(stage_reserve(x, bytes));
    CKV_TRY(x->io.download(x->io.ctx, x->stage, buf, bytes));
    CKV_TRY(x->host->ops->allreduce_f32(x->host, x->stage, n, op));
    return x->io.upload(x->io.ctx, buf, x->stage, bytes);
}

static ckv_status dev_allgather(ckv_comm *c, const void *send, void *recv, size_t bytes) {
    dev_ctx *x = dctx(c);
    if (c->size == 1) return send == recv || bytes == 0 ? CKV_STATUS_OK : x->io.copy(x->io.ctx, recv, send, bytes);
    c->bytes += bytes;
    if (x->path == CKV_COMM_PATH_HOST) return x->host->ops->allgather(x->host, send, recv, bytes);
    if (x->path == CKV_COMM_PATH_NCCL) {
        if (!x->on_stream && x->io.sync) CKV_TRY(x->io.sync(x->io.ctx));
        return x->nccl->ops->allgather(x->nccl, send, recv, bytes);
    }
    const size_t all = bytes * (size_t)c->size;
    CKV_TRY(stage_reserve(x, bytes + all));
    char *hs = x->stage, *hr = hs + bytes; /* [bytes] send, [size, bytes] receive */
    CKV_TRY(x->io.download(x->io.ctx, hs, send, bytes));
    CKV_TRY(x->host->ops->allgather(x->host, hs, hr, bytes));
    return x->io.upload(x->io.ctx, recv, hr, all);
}

/* Only NCCL enqueues device work of its own: the staged path's transfers are the io callbacks (the
 * backend's download and upload, queued on its compute stream and waited for) and the host path
 * reads host memory, so for them there is nothing to hand the stream to. */
static void dev_set_stream(ckv_comm *c, void *stream) {
    if (!dctx(c)->nccl || !stream) return;
    ckv_comm_set_stream(dctx(c)->nccl, stream);
    dctx(c)->on_stream = ckv_comm_nccl_on_stream(dctx(c)->nccl);
}

static void dev_free(ckv_comm *c) {
    if (!c) return;
    dev_ctx *x = c->ctx;
    if (x) {
        ckv_comm_free(x->nccl);
        ckv_free(x->stage);
        if (x->work) x->io.release(x->io.ctx, x->work);
        if (x->owns_host) ckv_comm_free(x->host);
        free(x);
    }
    free(c);
}

static const ckv_comm_ops dev_ops = {
    .allreduce_f32 = dev_h_allreduce_f32,
    .allreduce_i32 = dev_h_allreduce_i32,
    .allgather = dev_h_allgather,
    .bcast = dev_h_bcast,
    .barrier = dev_h_barrier,
    .split = dev_h_split,
    .abort = dev_abort,
    .free = dev_free,
    .node_local = dev_h_node_local,
    .dev_allreduce_f32 = dev_allreduce_f32,
    .dev_allgather = dev_allgather,
    .set_stream = dev_set_stream,
};

ckv_status ckv_comm_dev_workspace(ckv_comm *c, size_t bytes, void **dev) {
    *dev = NULL;
    if (!c || c->ops != &dev_ops) return ckv_error(CKV_STATUS_ERR_ARG, "a collective workspace needs a device communicator");
    CKV_TRY(work_reserve(dctx(c), bytes));
    *dev = dctx(c)->work;
    return CKV_STATUS_OK;
}

int ckv_comm_device_on_stream(const ckv_comm *c) {
    return c && c->ops == &dev_ops && ((const dev_ctx *)c->ctx)->on_stream;
}

ckv_comm_path ckv_comm_device_path(const ckv_comm *c) {
    return c && c->ops == &dev_ops ? ((const dev_ctx *)c->ctx)->path : CKV_COMM_PATH_HOST;
}

/* This rank's device id, prefixed with the host name (bus ids repeat across nodes). */
static ckv_status local_device_id(const ckv_comm_device_io *io, int device, char *id) {
    char host[64] = "host", dev[96] = "";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    if (io->device_id) CKV_TRY(io->device_id(io->ctx, dev, sizeof dev));
    else if (io->host_memory) snprintf(dev, sizeof dev, "host-memory");
    else CKV_TRY(ckv_comm_gpu_id(device, dev, sizeof dev));
    dev[sizeof dev - 1] = 0;
    snprintf(id, CKV_DEVICE_ID_LEN, "%s/%s", host, dev);
    return CKV_STATUS_OK;
}

/* A device communicator taking `path` over `host` (no collective, nothing else set up). */
static ckv_status dev_wrap(ckv_comm **out, ckv_comm *host, const ckv_comm_device_io *io, ckv_comm_path path) {
    *out = NULL;
    ckv_comm *c = calloc(1, sizeof *c);
    dev_ctx *x = calloc(1, sizeof *x);
    if (!c || !x) {
        free(c);
        free(x);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory creating a device communicator");
    }
    x->host = host;
    x->io = *io;
    x->path = path;
    c->ops = &dev_ops;
    c->ctx = x;
    c->rank = host->rank;
    c->size = host->size;
    c->timeout_s = host->timeout_s;
    c->kind = path == CKV_COMM_PATH_NCCL ? "nccl" : path == CKV_COMM_PATH_STAGED ? "staged" : host->kind;
    *out = c;
    return CKV_STATUS_OK;
}

ckv_status ckv_comm_init_device(ckv_comm **out, ckv_comm *host, const ckv_comm_device_io *io,
                                const ckv_comm_device_params *p) {
    *out = NULL;
    if (!host || !io || !io->download || !io->upload || !io->copy || !io->alloc || !io->release)
        return ckv_error(CKV_STATUS_ERR_ARG, "a device communicator needs a host communicator and the device's "
                         "download/upload/copy/alloc/release");
    ckv_comm_device_params def = {.device = 0, .path = CKV_COMM_PATH_AUTO, .staging_bytes = 0, .workspace_bytes = 0};
    if (!p) p = &def;
    char id[CKV_DEVICE_ID_LEN] = "";
    if (host->size > 1) CKV_TRY(local_device_id(io, p->device, id)); /* one rank shares with nobody */
    char *ids = NULL; // [size, CKV_DEVICE_ID_LEN]
    CKV_TRY(ckv_alloc((void **)&ids, (size_t)host->size * CKV_DEVICE_ID_LEN, "device ids"));
    ckv_status s = host->ops->allgather(host, id, ids, CKV_DEVICE_ID_LEN);
    char why[256] = "forced";
    ckv_comm_path path = p->path;
    if (s == CKV_STATUS_OK) {
        ckv_comm_path chosen = ckv_comm_choose_path(ids, host->size, CKV_DEVICE_ID_LEN, io->host_memory,
                                                    ckv_comm_nccl_available(), why, sizeof why);
        if (path == CKV_COMM_PATH_AUTO) path = chosen;
        else snprintf(why, sizeof why, "forced");
    }
    ckv_free(ids);
    CKV_TRY(s);
    ckv_comm *c = NULL;
    CKV_TRY(dev_wrap(&c, host, io, path));
    dev_ctx *x = dctx(c);
    if (path == CKV_COMM_PATH_NCCL) s = ckv_comm_init_nccl(&x->nccl, host, p->device);
    if (s == CKV_STATUS_OK && path == CKV_COMM_PATH_STAGED && p->staging_bytes) s = stage_reserve(x, p->staging_bytes);
    if (s == CKV_STATUS_OK && p->workspace_bytes) s = work_reserve(x, p->workspace_bytes);
    if (s != CKV_STATUS_OK) {
        dev_free(c);
        return s;
    }
    if (host->rank == 0 && path != CKV_COMM_PATH_HOST)
        CKV_LOG_INFO("tensor-parallel collectives on device buffers: %s over %d ranks (%s)", ckv_comm_path_name(path),
                     host->size, why);
    *out = c;
    return CKV_STATUS_OK;
}
