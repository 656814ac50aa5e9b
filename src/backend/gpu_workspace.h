/* gpu_workspace.h - the CUDA backend's fixed device workspaces, sized from the device's SM count and
 * compute capability and the widest GEMM input: the sizes the backend allocates at init (and grows
 * to for a prefill chunk), in plain C so the memory plan (model/plan.c) counts the same bytes the
 * backend takes. It allocates nothing; the kernels' own tile constants derive from the ones here. */
#ifndef CKV_GPU_WORKSPACE_H
#define CKV_GPU_WORKSPACE_H

#include <stddef.h>
#include <stdint.h>

/* The prefill kernel's query rows per block, its resident blocks per SM (its launch bounds, checked
 * by tests/cuda/sass_expect.txt), the largest head dim with a tile, and the split-K plan's bound:
 * at most this many waves of resident blocks share a long prefix. */
enum {
    CKV_GPU_PREFILL_ROWS = 64,
    CKV_GPU_PREFILL_BLOCKS_PER_SM = 2,
    CKV_GPU_PREFILL_HD_MAX = 128,
    CKV_GPU_PREFILL_SPLIT_WAVES = 2
};

/* Activation elements (bf16) the GEMM workspace holds from init: a 512-token chunk of a 32K-wide
 * layer; a prefill chunk of more rows x columns grows it once. */
#define CKV_GPU_GEMM_WS_INITIAL ((size_t)512 * 32768)

/* cuBLAS's workspace: 32 MiB on Hopper (compute capability 9+), 4 MiB before (cuBLAS's own
 * recommendation for cublasSetWorkspace; docs/gpu.md §5). */
static inline size_t ckv_gpu_blas_ws_bytes(int cc_major) { return (size_t)(cc_major >= 9 ? 32 : 4) << 20; }

/* The split-K partials reserved at init on a device of `sms` SMs: the prefill's split blocks (at most
 * CKV_GPU_PREFILL_SPLIT_WAVES waves of resident blocks of CKV_GPU_PREFILL_ROWS rows, each row's
 * output of the largest head dim plus its max and sum in fp32). Decode's partials share this buffer. */
static inline size_t ckv_gpu_split_partials_bytes(int sms) {
    const size_t wave = (size_t)(sms > 0 ? sms : 1) * CKV_GPU_PREFILL_BLOCKS_PER_SM;
    return (size_t)CKV_GPU_PREFILL_SPLIT_WAVES * wave * CKV_GPU_PREFILL_ROWS * (CKV_GPU_PREFILL_HD_MAX + 2) *
           sizeof(float);
}

/* The GEMM workspace after a matmul of `rows` activations of `cols` inputs: bf16, at least its size
 * at init. */
static inline size_t ckv_gpu_gemm_ws_bytes(size_t rows, size_t cols) {
    const size_t n = rows * cols > CKV_GPU_GEMM_WS_INITIAL ? rows * cols : CKV_GPU_GEMM_WS_INITIAL;
    return n * sizeof(uint16_t);
}

/* Everything above, plus the non-finite counter (8 bytes), for a device of `sms` SMs and compute
 * capability cc_major whose widest matmul input is rows x cols: the bytes the backend holds
 * besides the buffers its callers allocate (the eviction ops' workspace is the plan's own line). */
static inline size_t ckv_gpu_fixed_workspace_bytes(int sms, int cc_major, size_t rows, size_t cols) {
    return ckv_gpu_blas_ws_bytes(cc_major) + ckv_gpu_gemm_ws_bytes(rows, cols) + ckv_gpu_split_partials_bytes(sms) +
           sizeof(unsigned long long);
}

#endif
