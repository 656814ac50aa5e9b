/* cuda_module.c - the CUDA backend's entry points in the ckv binary: they load the GPU module
 * (core/gpu_module.h: libckv_cuda.so, where the .cu sources are built) and call into it, so the
 * binary itself never links the CUDA libraries. The module defines the same two functions for
 * itself (cuda_backend.cu); it binds its own, and this file finds its ckv_backend_cuda_init by name. */
#include "backend/backend.h"
#include "core/gpu_module.h"

int ckv_backend_cuda_available(void) {
    if (ckv_gpu_module_load() != CKV_STATUS_OK) {
        ckv_error_clear();
        return 0;
    }
    return 1;
}

ckv_status ckv_backend_cuda_init(ckv_backend **out, int device_index) {
    *out = NULL;
    ckv_gpu_module_fn fn = NULL;
    ckv_status st = ckv_gpu_module_symbol("ckv_backend_cuda_init", &fn);
    if (st != CKV_STATUS_OK) return ckv_error(st, "--backend cuda: %s", ckv_error_message());
    ckv_status (*init)(ckv_backend **, int) = (ckv_status(*)(ckv_backend **, int))fn; /* this function's type */
    return init(out, device_index);
}
