/* comm.h - the communicator interface: rank, size, all-reduce, all-gather, broadcast, barrier,
 * split and abort, as a table of function pointers. Implementations: single process (comm_single.c),
 * MPI (comm_mpi.c, host buffers; also the bootstrap of NCCL). mpi.h is included only under
 * src/comm. Every rank must issue the same collectives in the same order. */
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
} ckv_comm_ops;

struct ckv_comm {
    const ckv_comm_ops *ops;
    void *ctx;
    int rank;
    int size;
    const char *kind; /* "single", "mpi", "nccl" */
    int device_buffers; /* 1 when the buffers handed to the collectives live on the GPU (NCCL) */
    unsigned long long bytes; /* payload bytes this rank handed to collectives (statistics) */
};

/* Node-local rank and size (0 of 1 for communicators that do not know). */
ckv_status ckv_comm_node_local(ckv_comm *c, int *local_rank, int *local_size);

/* NCCL (GPU buffers): a communicator over the same ranks as `bootstrap` (whose bcast carries the
 * unique id), on GPU `device`, with its own stream. Available when built with NCCL. */
int ckv_comm_nccl_available(void);
ckv_status ckv_comm_init_nccl(ckv_comm **out, ckv_comm *bootstrap, int device);
/* The GPU a rank should use: its node-local rank modulo the devices it can see (CUDA_VISIBLE_DEVICES
 * is honoured by the CUDA runtime). Errors when no GPU is visible. */
ckv_status ckv_comm_select_gpu(ckv_comm *world, int *device);

/* A communicator of one rank (no MPI needed). */
ckv_status ckv_comm_init_single(ckv_comm **out);

/* 1 when this build has MPI. */
int ckv_comm_mpi_available(void);
/* 1 when the process was started by mpirun/srun (launcher environment variables present). */
int ckv_comm_launched_by_mpi(void);
/* MPI world communicator (initialises MPI; errors return, never hang). */
ckv_status ckv_comm_init_mpi(ckv_comm **out, int *argc, char ***argv);
/* MPI when launched by an MPI launcher and available, else single process. */
ckv_status ckv_comm_init_world(ckv_comm **out, int *argc, char ***argv);

/* Frees a communicator (NULL is fine). Freeing the world MPI communicator finalises MPI. */
void ckv_comm_free(ckv_comm *c);

#endif
