/* gpu_module.h - the GPU module: the CUDA backend and the NCCL communicator are built into a shared
 * library of their own (libckv_cuda.so, next to the ckv binary) that is loaded on first use, so that
 * a run on the CPU never maps the CUDA runtime, cuBLAS or NCCL (hundreds of MiB of address space and
 * ~150 MiB of resident pages at start-up) and a binary built with CUDA runs on machines without it.
 * This file finds and loads the module and looks its entry points up by name; it knows nothing of
 * what they do (backend/cuda/cuda_module.c and comm/comm.c call them). The module resolves ckv's own
 * functions from the executable that loads it. */
#ifndef CKV_GPU_MODULE_H
#define CKV_GPU_MODULE_H

#include <stddef.h>

#include "core/status.h"

/* The module and the binary share the backend's op table (backend/backend.h) and the prototypes of
 * the entry points: a change to either bumps it. 2: the op table's capability mask; 3: the eviction
 * ops' parameter structs; 4: entry points looked up by name (no entry table); 5: the attention op's
 * parameter struct; 6: kv_gather's; 7: enums for the remaining flags of the eviction ops; 8: the
 * recorded steps' ops (graph_begin, graph_end, graph_release); 9: evict_kvzip and evict_chunk_rank; 10: evict_kvzip_norms;
 * 11: alloc_raw, mem_usage and its ckv_backend_mem (with the device's SMs and compute capability). */
#define CKV_GPU_MODULE_ABI 11
#define CKV_GPU_MODULE_FILE "libckv_cuda.so"
/* int ckv_gpu_module_abi(void), defined by the module only: its CKV_GPU_MODULE_ABI. */
#define CKV_GPU_MODULE_ABI_SYMBOL "ckv_gpu_module_abi"

/* Loads the module once (thread-safe): from $CKV_GPU_MODULE when set, else libckv_cuda.so beside the
 * executable, in ../lib/ckv or ../lib beside it. Returns an error naming where it looked (or what
 * dlopen said) when the module is missing, does not load, or was built for another ABI; a build of
 * ckv without CUDA says so. */
ckv_status ckv_gpu_module_load(void);

/* A function of the module, found by its name: the module's entry points are the functions it
 * defines under the names of the entry points they implement ("ckv_backend_cuda_init";
 * "ckv_comm_init_nccl", "ckv_comm_nccl_on_stream", "ckv_comm_select_gpu", "ckv_comm_gpu_id" when it
 * was built with NCCL). Only the module's own definition counts, never the binary's function of the
 * same name. The caller casts *out to the entry point's type. Loads the module first; an error
 * (ERR_UNSUPPORTED) when it does not load or does not define `name`, naming it. */
typedef void (*ckv_gpu_module_fn)(void);
ckv_status ckv_gpu_module_symbol(const char *name, ckv_gpu_module_fn *out);

/* 1 when this build of ckv has a GPU module (whether or not it loads here). */
int ckv_gpu_module_built(void);

#endif
