/* cuda_module_entry.c - the entry table of the GPU module (libckv_cuda.so; core/gpu_module.h): the
 * CUDA backend's constructor and, when built with NCCL, the NCCL communicator's entry points. Built
 * into the module only. */
#include "backend/backend.h"
#include "comm/comm.h"
#include "core/gpu_module.h"

const ckv_gpu_module *ckv_gpu_module_entry(void);

const ckv_gpu_module *ckv_gpu_module_entry(void) {
    static const ckv_gpu_module t = {
        .abi = CKV_GPU_MODULE_ABI,
        .backend_init = ckv_backend_cuda_init,
#ifdef CKV_HAVE_NCCL
        .has_nccl = 1,
        .init_nccl = ckv_comm_init_nccl,
        .nccl_on_stream = ckv_comm_nccl_on_stream,
        .select_gpu = ckv_comm_select_gpu,
        .gpu_id = ckv_comm_gpu_id,
#endif
    };
    return &t;
}
