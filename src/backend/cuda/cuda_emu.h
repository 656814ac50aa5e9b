/* cuda_emu.h - the C entry points of the emulated CUDA backend ("cuda-emu": the .cu sources of this
 * directory compiled by the host C++ compiler against emu/ckv_emu.h). Tests only: they run the CUDA
 * kernels on the CPU, and steer the simulated device to reach the error paths. */
#ifndef CKV_CUDA_EMU_ENTRY_H
#define CKV_CUDA_EMU_ENTRY_H

#include "backend/backend.h"

ckv_status ckv_backend_cuda_emu_init(ckv_backend **out, int device_index);
/* The simulated machine: `count` GPUs of compute capability major.minor (default 1, 9.0). */
void ckv_cuda_emu_set_devices(int count, int major, int minor);
/* SMs of every simulated GPU, read by a backend at init (0: CKV_EMU_SMS, default 132). */
void ckv_cuda_emu_set_sms(int sms);
/* The next launch of the kernel named `kernel` faults (an illegal address, surfacing at sync). */
void ckv_cuda_emu_inject_fault(const char *kernel);
/* Clears a fault and frees all device memory of the simulated GPU (after its backends are freed). */
void ckv_cuda_emu_reset(void);
/* Device allocations made so far (cudaMalloc calls), to check that an op does not allocate. */
unsigned long long ckv_cuda_emu_alloc_calls(void);
/* Times the host has waited for the simulated GPU so far (stream/event/device synchronisations,
 * copies into pageable memory, frees), and kernels launched and cuBLAS GEMMs queued (either NULL). */
unsigned long long ckv_cuda_emu_host_waits(void);
void ckv_cuda_emu_launches(unsigned long long *kernels, unsigned long long *gemms);
/* Stream capture of a backend's stream (be->ops->stream): begin, and end (the graph, if any, is
 * discarded); each returns the CUDA error code (0: success; 900 a refused call, 901 an invalidated
 * capture). Tests: which part of a step could be captured. */
int ckv_cuda_emu_capture_begin(void *stream);
int ckv_cuda_emu_capture_end(void *stream);
/* Reallocates the split-KV partials of `be` (a cuda-emu backend) at twice their size, so at another
 * address, as a workspace growth would (ws_gen moves): a recorded step captured before must record
 * again at its next use. Decode moves no workspace itself; tests reach that path with this. */
ckv_status ckv_cuda_emu_move_workspace(ckv_backend *be);
/* Captures that produced a graph, and graph launches outside a capture, so far (either NULL). */
void ckv_cuda_emu_graph_counts(unsigned long long *captures, unsigned long long *launches);

#endif
