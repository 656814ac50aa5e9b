/* comm.h - the communicator interface: rank, size, all-reduce, all-gather, broadcast, barrier,
 * split and abort, as a table of function pointers, plus collectives on a compute backend's device
 * buffers. Implementations: single process (comm_single.c), MPI (comm_mpi.c, host buffers; also the
 * bootstrap of NCCL), NCCL (comm_nccl.c) and the device communicator of a tensor-parallel group
 * (comm_device.c: NCCL on device buffers, or staged through host memory and MPI when several ranks
 * share a GPU). mpi.h is included only under src/comm. Every rank must issue the same collectives in
 * the same order. A blocking collective that has not completed within the communicator's timeout
 * ends the job, naming the rank and the operation: a dead or stalled peer never hangs it. */
#ifndef CKV_COMM_H
#define CKV_COMM_H

#include <stddef.h>

#include "core/status.h"

typedef struct ckv_comm ckv_comm;

typedef enum { CKV_COMM_OP_SUM = 0, CKV_COMM_OP_MAX = 1, CKV_COMM_OP_MIN = 2 } ckv_comm_op;

typedef struct {
    /* in-place reduction of n floats (host memory) over all ranks */
    ckv_status (*allreduce_f32)(ckv_comm *c, float *buf, size_t n, ckv_comm_op op);
    /* in-place reduction of n ints */
    ckv_status (*allreduce_i32)(ckv_comm *c, int *buf, size_t n, ckv_comm_op op);
    /* recv [size * bytes] gets every rank's `bytes` from send, in rank order */
    ckv_status (*allgather)(ckv_comm *c, const void *send, void *recv, size_t bytes);
    ckv_status (*bcast)(ckv_comm *c, void *buf, size_t bytes, int root);
    ckv_status (*barrier)(ckv_comm *c);
    /* a sub-communicator of the ranks with the same color, ordered by key */
    ckv_status (*split)(ckv_comm *c, int color, int key, ckv_comm **out);
    /* ends the whole job (every rank) with `code`; does not return */
    void (*abort)(ckv_comm *c, int code);
    void (*free)(ckv_comm *c);
    /* this rank's index among the ranks on the same node, and their number (NULL: 0 of 1) */
    ckv_status (*node_local)(ckv_comm *c, int *local_rank, int *local_size);
    /* ---- device buffers (NULL where the compute device is the host: use the host ops) ---- */
    /* in-place reduction of n floats in the backend's device memory */
    ckv_status (*dev_allreduce_f32)(ckv_comm *c, float *buf, size_t n, ckv_comm_op op);
    /* recv [size * bytes] (device) gets every rank's `bytes` of send (device), in rank order */
    ckv_status (*dev_allgather)(ckv_comm *c, const void *send, void *recv, size_t bytes);
    /* the stream device collectives are enqueued on (an opaque cudaStream_t, borrowed; NULL: the
     * communicator's own stream, synchronised per call); see ckv_comm_set_stream */
    void (*set_stream)(ckv_comm *c, void *stream);
} ckv_comm_ops;

struct ckv_comm {
    const ckv_comm_ops *ops;
    void *ctx;
    int rank;
    int size;
    const char *kind; /* "single", "mpi", "nccl" */
    int device_buffers; /* 1 when the buffers handed to the collectives live on the GPU (NCCL) */
    unsigned long long bytes; /* payload bytes this rank handed to collectives (statistics) */
    /* seconds a blocking collective may wait before the job is ended (<= 0: forever); inherited by
     * split() and by the communicators bootstrapped from this one */
    double timeout_s;
};

/* What the world communicator is created with (the CLI's --comm-timeout fills timeout_s). */
#define CKV_COMM_TIMEOUT_DEFAULT_S 300.0
typedef struct {
    double timeout_s; /* see ckv_comm.timeout_s; default CKV_COMM_TIMEOUT_DEFAULT_S */
} ckv_comm_params;
void ckv_comm_params_default(ckv_comm_params *p);
/* ckv_comm_init_world with parameters (p NULL: defaults). */
ckv_status ckv_comm_init_world_params(ckv_comm **out, int *argc, char ***argv, const ckv_comm_params *p);

/* Ends the job because a collective timed out or failed: prints one line naming the rank, the
 * communicator and the operation, then calls c's abort. Does not return. */
void ckv_comm_fail(ckv_comm *c, const char *op, const char *why);

/* ---- collectives on device buffers (the backend's memory; host memory on the CPU backend) ---- */
/* 1 when c has device collectives (a device communicator from ckv_comm_init_device). */
int ckv_comm_has_device_ops(const ckv_comm *c);
/* In-place sum/max/min of n floats of device memory: the device op when c has one, else the host op
 * (valid only where device memory is host memory). */
ckv_status ckv_comm_dev_allreduce_f32(ckv_comm *c, float *buf, size_t n, ckv_comm_op op);
/* recv [size * bytes] (device) = every rank's send [bytes] (device), in rank order. */
ckv_status ckv_comm_dev_allgather(ckv_comm *c, const void *send, void *recv, size_t bytes);
/* A device buffer of at least `bytes` owned by the device communicator c (staging of gathers whose
 * operands are not contiguous, e.g. the padded vocabulary slices): allocated on the first call that
 * needs more, then reused, so steady-state calls allocate nothing. Valid until the next call. */
ckv_status ckv_comm_dev_workspace(ckv_comm *c, size_t bytes, void **dev);
/* Makes device collectives run on `stream` (an opaque cudaStream_t: the backend's compute stream,
 * engine/comm_backend.c), so no host synchronisation happens per collective: each is enqueued
 * behind the kernels producing its input, the kernels after it wait for it on the stream, and the
 * host sees its result through the backend's download (on the same stream). The stream stays the
 * caller's: the communicator only enqueues on it and records events (a watchdog thread polls them
 * against the timeout, so a dead peer still ends the job); it must outlive the communicator, which
 * waits for it when freed. Set once, before the first collective. Only the NCCL path takes it; the
 * staged path (whose transfers are the io callbacks, ordered on the backend's stream) and
 * communicators without device ops ignore it. */
void ckv_comm_set_stream(ckv_comm *c, void *stream);
/* 1 when the device communicator c enqueues its collectives on the stream of ckv_comm_set_stream
 * (the NCCL path, once it took it); 0 otherwise. */
int ckv_comm_device_on_stream(const ckv_comm *c);

/* How a device communicator moves device buffers between ranks. */
typedef enum {
    CKV_COMM_PATH_AUTO = 0, /* chosen at init (ckv_comm_choose_path) */
    CKV_COMM_PATH_HOST,     /* the device is the host: the host communicator directly */
    CKV_COMM_PATH_NCCL,     /* NCCL on device buffers, one GPU per rank */
    CKV_COMM_PATH_STAGED,   /* device -> host, host communicator, host -> device */
} ckv_comm_path;
const char *ckv_comm_path_name(ckv_comm_path p);

/* The device side a device communicator needs, as callbacks over an opaque context (a backend; see
 * ckv_comm_device_io_from_backend in comm_backend.c). */
typedef struct {
    void *ctx;
    int host_memory; /* 1 when device memory is host memory (the CPU backend) */
    /* download must return with dst_host filled, after the device work queued before it (the
     * kernels producing src_dev): the CUDA backend's runs on its compute stream and waits for it,
     * which orders the staged path without a separate sync; upload must have read src_host on return */
    ckv_status (*download)(void *ctx, void *dst_host, const void *src_dev, size_t bytes);
    ckv_status (*upload)(void *ctx, void *dst_dev, const void *src_host, size_t bytes);
    ckv_status (*copy)(void *ctx, void *dst_dev, const void *src_dev, size_t bytes);
    ckv_status (*alloc)(void *ctx, void **dev, size_t bytes, const char *what);
    void (*release)(void *ctx, void *dev);
    /* waits for the device's queued work (NCCL without the compute stream must not start before
     * the kernels producing its input); NULL: nothing to wait for */
    ckv_status (*sync)(void *ctx);
    /* a string naming the physical device, equal on two ranks exactly when they share it (the PCI
     * bus id of a GPU); NULL: ckv_comm_gpu_id of `device` */
    ckv_status (*device_id)(void *ctx, char *id, size_t cap);
} ckv_comm_device_io;

typedef struct {
    int device;            /* GPU index of this rank (NCCL, and the default device_id) */
    ckv_comm_path path;    /* AUTO, or a forced path (tests) */
    size_t staging_bytes;  /* host staging preallocated for the staged path (grows on demand) */
    size_t workspace_bytes; /* device workspace preallocated (ckv_comm_dev_workspace; grows on demand) */
} ckv_comm_device_params;

/* The device communicator of a group: host collectives go to `host` (borrowed; MPI or single),
 * device collectives take the path chosen from the ranks' device ids (gathered over `host`): the
 * host communicator where device memory is host memory, staged when two ranks share a device or
 * NCCL is missing, else NCCL bootstrapped by `host`. Rank 0 logs the choice in one line. Timeouts
 * follow host->timeout_s. The io table is copied. */
ckv_status ckv_comm_init_device(ckv_comm **out, ckv_comm *host, const ckv_comm_device_io *io,
                                const ckv_comm_device_params *p);
/* The path a device communicator over n ranks with these device ids [n][id_len] (NUL-terminated
 * strings) takes; why [cap] receives one line saying why (the ranks that share a device). Pure
 * function (the selection rule, unit-tested). */
ckv_comm_path ckv_comm_choose_path(const char *ids, int n, size_t id_len, int host_memory, int nccl_available,
                                   char *why, size_t cap);
/* The path a device communicator took (HOST for communicators that are not device communicators). */
ckv_comm_path ckv_comm_device_path(const ckv_comm *c);

/* Node-local rank and size (0 of 1 for communicators that do not know). */
ckv_status ckv_comm_node_local(ckv_comm *c, int *local_rank, int *local_size);

/* NCCL (GPU buffers): a communicator over the same ranks as `bootstrap` (whose bcast carries the
 * unique id), on GPU `device`, with its own stream. Available when built with NCCL. */
int ckv_comm_nccl_available(void);
ckv_status ckv_comm_init_nccl(ckv_comm **out, ckv_comm *bootstrap, int device);
/* 1 when an NCCL communicator enqueues on a stream given by ckv_comm_set_stream (0: its own
 * stream, synchronised per call, e.g. when the ring's events could not be created). */
int ckv_comm_nccl_on_stream(const ckv_comm *c);
/* The PCI bus id of GPU `device` (the NCCL build), for telling ranks that share a GPU. */
ckv_status ckv_comm_gpu_id(int device, char *id, size_t cap);
/* The GPU a rank should use: its node-local rank modulo the devices it can see (CUDA_VISIBLE_DEVICES
 * is honoured by the CUDA runtime). Errors when no GPU is visible. */
ckv_status ckv_comm_select_gpu(ckv_comm *world, int *device);

/* A communicator of one rank (no MPI needed). */
ckv_status ckv_comm_init_single(ckv_comm **out);

/* 1 when this build has MPI. */
int ckv_comm_mpi_available(void);
/* 1 when the process was started by mpirun/srun (launcher environment variables present). */
int ckv_comm_launched_by_mpi(void);
/* 1 when MPI calls may come from any one thread at a time (MPI_THREAD_SERIALIZED provided, or MPI
 * not initialised / not built): what a server whose engine thread is not the main thread needs. */
int ckv_comm_mpi_any_thread(void);
/* MPI world communicator (initialises MPI asking for MPI_THREAD_SERIALIZED; errors return, never
 * hang). */
ckv_status ckv_comm_init_mpi(ckv_comm **out, int *argc, char ***argv);
/* MPI when launched by an MPI launcher and available, else single process. */
ckv_status ckv_comm_init_world(ckv_comm **out, int *argc, char ***argv);

/* Frees a communicator (NULL is fine). Freeing the world MPI communicator finalises MPI. */
void ckv_comm_free(ckv_comm *c);

#endif
