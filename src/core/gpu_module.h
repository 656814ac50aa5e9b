/* gpu_module.h - the GPU module: the CUDA backend and the NCCL communicator are built into a shared
 * library of their own (libckv_cuda.so, next to the ckv binary) that is loaded on first use, so that
 * a run on the CPU never maps the CUDA runtime, cuBLAS or NCCL (hundreds of MiB of address space and
 * ~150 MiB of resident pages at start-up) and a binary built with CUDA runs on machines without it.
 * This file finds and loads the module and hands out its entry table; it knows nothing of what the
 * entries do (backend.c and comm.c call them). The module resolves ckv's own functions from the
 * executable that loads it. */
#ifndef CKV_GPU_MODULE_H
#define CKV_GPU_MODULE_H

#include <stddef.h>

#include "core/status.h"

struct ckv_backend;
struct ckv_comm;

/* The module and the binary share this table and the backend's op table (backend/backend.h): a
 * change to either's layout bumps it. 2: the op table's capability mask; 3: the eviction ops'
 * parameter structs. */
#define CKV_GPU_MODULE_ABI 3
#define CKV_GPU_MODULE_FILE "libckv_cuda.so"
#define CKV_GPU_MODULE_ENTRY "ckv_gpu_module_entry"

/* What the module provides (its entry function returns a static table). */
typedef struct {
    int abi; /* CKV_GPU_MODULE_ABI */
    ckv_status (*backend_init)(struct ckv_backend **out, int device_index);
    int has_nccl; /* the NCCL entries below are set */
    ckv_status (*init_nccl)(struct ckv_comm **out, struct ckv_comm *bootstrap, int device);
    int (*nccl_on_stream)(const struct ckv_comm *c);
    ckv_status (*select_gpu)(struct ckv_comm *world, int *device);
    ckv_status (*gpu_id)(int device, char *id, size_t cap);
} ckv_gpu_module;

/* The module's table, loaded once (thread-safe): from $CKV_GPU_MODULE when set, else
 * libckv_cuda.so beside the executable, in ../lib/ckv or ../lib beside it. Returns an error naming
 * where it looked (or what dlopen said) when the module is missing, does not load, or was built for
 * another ABI; a build of ckv without CUDA says so. */
ckv_status ckv_gpu_module_get(const ckv_gpu_module **out);

/* 1 when this build of ckv has a GPU module (whether or not it loads here). */
int ckv_gpu_module_built(void);

#endif
