/* comm.c - picks the world communicator from the launch environment. */
#include "comm/comm.h"

#include <stdlib.h>

int ckv_comm_launched_by_mpi(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS",
                                       "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

ckv_status ckv_comm_init_world(ckv_comm **out, int *argc, char ***argv) {
    if (ckv_comm_launched_by_mpi()) {
        if (!ckv_comm_mpi_available())
            return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                             "started by an MPI launcher but this build of ckv has no MPI (install libopenmpi-dev and rebuild)");
        return ckv_comm_init_mpi(out, argc, argv);
    }
    return ckv_comm_init_single(out);
}

ckv_status ckv_comm_node_local(ckv_comm *c, int *local_rank, int *local_size) {
    *local_rank = 0;
    *local_size = 1;
    if (!c || !c->ops->node_local) return CKV_STATUS_OK;
    return c->ops->node_local(c, local_rank, local_size);
}

void ckv_comm_free(ckv_comm *c) {
    if (c && c->ops && c->ops->free) c->ops->free(c);
}

#ifndef CKV_HAVE_MPI
int ckv_comm_mpi_available(void) { return 0; }
ckv_status ckv_comm_init_mpi(ckv_comm **out, int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    *out = NULL;
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "this build of ckv has no MPI support");
}
#endif

#ifndef CKV_HAVE_NCCL
int ckv_comm_nccl_available(void) { return 0; }
ckv_status ckv_comm_init_nccl(ckv_comm **out, ckv_comm *bootstrap, int device) {
    (void)bootstrap;
    (void)device;
    *out = NULL;
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "this build of ckv has no NCCL support (configure with CUDA and NCCL)");
}
ckv_status ckv_comm_select_gpu(ckv_comm *world, int *device) {
    (void)world;
    *device = -1;
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "this build of ckv has no GPU support");
}
#endif
