/* cuda_rt.h - the one include of every .cu file of the CUDA backend: under nvcc the CUDA runtime,
 * bf16 and cuBLAS headers; under the host C++ compiler (CKV_CUDA_EMU) ckv's CPU execution layer
 * (emu/ckv_emu.h) in their place. It also defines what differs between the two builds: the kernel
 * launch (CKV_LAUNCH, so the kernel sources are identical), a kernel's dynamic shared memory
 * (CKV_SHARED_DYN), loop unrolling hints (CKV_UNROLL), the namespace that keeps the two copies
 * of the backend apart when one program links both, and the names of their C entry points. */
#ifndef CKV_CUDA_RT_H
#define CKV_CUDA_RT_H

#if defined(CKV_CUDA_EMU)
#include "emu/ckv_emu.h"
/* CKV_LAUNCH(kernel, grid, block, smem, stream, args...): kernel<<<grid, block, smem, stream>>>(args).
 * A template kernel goes in parentheses: CKV_LAUNCH((k<T, 64>), ...). */
#define CKV_LAUNCH(kernel, grid, block, smem, stream, ...) \
    ::ckv_emu::ckv_emu_launch(#kernel, (grid), (block), (smem), (stream), kernel, __VA_ARGS__)
#define CKV_UNROLL
/* CKV_SHARED_DYN(name, bytes): the block's dynamic shared memory as uint4 name[] of at least `bytes`
 * (a constant; the launch passes the same bytes, and a cudaFuncSetAttribute opt-in above 48 KiB).
 * The emulator gives it static per-block storage of that size, seen by its checks as any
 * __shared__ array. */
#define CKV_SHARED_DYN(name, bytes) __shared__ uint4 name[((bytes) + 15) / 16]
#define CKV_CUDA_NS ckv_cuda_emu
#define CKV_CUDA_BACKEND_NAME "cuda-emu"
#elif defined(__CUDACC__)
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#define CKV_LAUNCH(kernel, grid, block, smem, stream, ...) kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define CKV_UNROLL _Pragma("unroll")
#define CKV_SHARED_DYN(name, bytes) extern __shared__ uint4 name[]
#define CKV_CUDA_NS ckv_cuda
#define CKV_CUDA_BACKEND_NAME "cuda"
#else
#error "cuda_rt.h: compile with nvcc, or with the host C++ compiler and -DCKV_CUDA_EMU"
#endif

typedef __nv_bfloat16 ckv_bf16;

#endif
