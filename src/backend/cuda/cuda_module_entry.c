/* cuda_module_entry.c - the one symbol the loader of the GPU module (libckv_cuda.so;
 * core/gpu_module.h) checks before it looks up any other: the module's interface version. The entry
 * points themselves are the module's functions under their own names (ckv_backend_cuda_init in
 * cuda_backend.cu, and with NCCL the communicator's in the comm sources built into the module), found
 * by name; this file knows none of them. Built into the module only. */
#include "core/gpu_module.h"

int ckv_gpu_module_abi(void);

int ckv_gpu_module_abi(void) { return CKV_GPU_MODULE_ABI; }
