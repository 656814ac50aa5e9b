/* comm.c - picks the world communicator from the launch environment, ends the job on a failed or
 * timed-out collective, and dispatches the device-buffer collectives (to the host ops where a
 * communicator has none). */
#include "comm/comm.h"

#include "core/gpu_module.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/log.h"

void ckv_comm_params_default(ckv_comm_params *p) { p->timeout_s = CKV_COMM_TIMEOUT_DEFAULT_S; }

ckv_status ckv_comm_init_world_params(ckv_comm **out, int *argc, char ***argv, const ckv_comm_params *p) {
    CKV_TRY(ckv_comm_init_world(out, argc, argv));
    ckv_comm_params def;
    ckv_comm_params_default(&def);
    (*out)->timeout_s = p ? p->timeout_s : def.timeout_s;
    return CKV_STATUS_OK;
}

void ckv_comm_fail(ckv_comm *c, const char *op, const char *why) {
    CKV_LOG_ERROR("rank %d of the %d-rank %s communicator: %s failed: %s; ending the job", c ? c->rank : 0,
                  c ? c->size : 1, c && c->kind ? c->kind : "?", op, why);
    fflush(stderr);
    if (c && c->ops && c->ops->abort) c->ops->abort(c, 3);
    exit(3);
}

int ckv_comm_has_device_ops(const ckv_comm *c) { return c && c->ops && c->ops->dev_allreduce_f32 && c->ops->dev_allgather; }

ckv_status ckv_comm_dev_allreduce_f32(ckv_comm *c, float *buf, size_t n, ckv_comm_op op) {
    if (!c || c->size == 1 || n == 0) return CKV_STATUS_OK;
    if (c->ops->dev_allreduce_f32) return c->ops->dev_allreduce_f32(c, buf, n, op);
    return c->ops->allreduce_f32(c, buf, n, op);
}

ckv_status ckv_comm_dev_allgather(ckv_comm *c, const void *send, void *recv, size_t bytes) {
    if (c && c->ops->dev_allgather) return c->ops->dev_allgather(c, send, recv, bytes);
    return c->ops->allgather(c, send, recv, bytes);
}

void ckv_comm_set_stream(ckv_comm *c, void *stream) {
    if (c && c->ops && c->ops->set_stream) c->ops->set_stream(c, stream);
}

const char *ckv_comm_path_name(ckv_comm_path p) {
    switch (p) {
    case CKV_COMM_PATH_HOST: return "host";
    case CKV_COMM_PATH_NCCL: return "nccl";
    case CKV_COMM_PATH_STAGED: return "staged";
    default: return "auto";
    }
}

/* 1 when a process manager interface (mpirun's, or srun's PMI/PMIx plugin) set this process up. */
static int comm_pmi_present(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "MPI_LOCALNRANKS"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        if (getenv(vars[i])) return 1;
    return 0;
}

/* Tasks of the srun step this process belongs to (0 outside SLURM steps). */
static long comm_slurm_step_tasks(void) {
    const char *s = getenv("SLURM_STEP_NUM_TASKS");
    return s ? strtol(s, NULL, 10) : 0;
}

int ckv_comm_launched_by_mpi(void) { return comm_pmi_present() || comm_slurm_step_tasks() > 1; }

ckv_status ckv_comm_init_world(ckv_comm **out, int *argc, char ***argv) {
    if (ckv_comm_launched_by_mpi()) {
        if (!comm_pmi_present()) /* srun --mpi=none (or a cluster whose default plugin is none) */
            return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                             "srun started %ld tasks without a process manager interface: run them with "
                             "srun --mpi=pmix (see srun --mpi=list) or mpirun", comm_slurm_step_tasks());
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
int ckv_comm_mpi_any_thread(void) { return 1; }
ckv_status ckv_comm_init_mpi(ckv_comm **out, int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    *out = NULL;
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "this build of ckv has no MPI support");
}
#endif

/* ---- NCCL: in the GPU module (core/gpu_module.h), loaded on first use ---- */

/* The module's definition of the NCCL entry point `name` (the function of that name in the module's
 * comm_nccl.c), or NULL when the module does not load or has no NCCL. */
static ckv_gpu_module_fn nccl_entry(const char *name) {
    ckv_gpu_module_fn fn = NULL;
    if (ckv_gpu_module_symbol(name, &fn) != CKV_STATUS_OK) fn = NULL;
    ckv_error_clear();
    return fn;
}

int ckv_comm_nccl_available(void) { return nccl_entry("ckv_comm_init_nccl") != NULL; }

int ckv_comm_nccl_on_stream(const ckv_comm *c) {
    ckv_gpu_module_fn fn = nccl_entry("ckv_comm_nccl_on_stream");
    return fn ? ((int (*)(const ckv_comm *))fn)(c) : 0;
}

/* Why there is no NCCL: the module's own message, or that it was built without NCCL. */
static ckv_status no_nccl(const char *what) {
    ckv_status st = ckv_gpu_module_load();
    if (st != CKV_STATUS_OK) return ckv_error(st, "%s: %s", what, ckv_error_message());
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: the CUDA module of this build has no NCCL (install NCCL and configure again)", what);
}

ckv_status ckv_comm_init_nccl(ckv_comm **out, ckv_comm *bootstrap, int device) {
    *out = NULL;
    ckv_gpu_module_fn fn = nccl_entry("ckv_comm_init_nccl");
    return fn ? ((ckv_status(*)(ckv_comm **, ckv_comm *, int))fn)(out, bootstrap, device) : no_nccl("NCCL");
}

ckv_status ckv_comm_select_gpu(ckv_comm *world, int *device) {
    *device = -1;
    ckv_gpu_module_fn fn = nccl_entry("ckv_comm_select_gpu");
    return fn ? ((ckv_status(*)(ckv_comm *, int *))fn)(world, device) : no_nccl("choosing a GPU");
}

ckv_status ckv_comm_gpu_id(int device, char *id, size_t cap) {
    if (cap) id[0] = 0;
    ckv_gpu_module_fn fn = nccl_entry("ckv_comm_gpu_id");
    if (fn) return ((ckv_status(*)(int, char *, size_t))fn)(device, id, cap);
    char what[64];
    snprintf(what, sizeof what, "the PCI bus id of GPU %d", device);
    return no_nccl(what);
}
