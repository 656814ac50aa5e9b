/* test_comm_nccl.c - the NCCL communicator on the GPUs of this machine: a one-rank NCCL
 * communicator bootstrapped by the single-process communicator runs all-reduce, all-gather and
 * broadcast on device buffers and returns what the CPU computes, first synchronously on its own
 * stream, then enqueued on a caller's stream (ckv_comm_set_stream: the watchdog ring) with a kernel-
 * free copy after it on the same stream; the GPU's PCI bus id is readable. Skipped (exit 77) where
 * no GPU is visible, saying so; multi-rank NCCL runs are covered by tests/gpu/run.sh. */
#include <cuda_runtime.h>

#include <string.h>

#include "ckv_test.h"
#include "comm/comm.h"

int main(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) return ckv_test_skip("no GPU visible: NCCL cannot run here");
    ckv_comm *boot = NULL, *nc = NULL;
    CHECK_OK(ckv_comm_init_single(&boot));
    int dev = -1;
    CHECK_OK(ckv_comm_select_gpu(boot, &dev));
    CHECK_OK(ckv_comm_init_nccl(&nc, boot, dev));
    if (!nc) return ckv_test_finish("test_comm_nccl");
    CHECK(nc->size == 1 && nc->rank == 0 && nc->device_buffers == 1);
    float host[256], back[256];
    for (int i = 0; i < 256; i++) host[i] = (float)i * 0.5f - 3.0f;
    float *d = NULL, *g = NULL;
    CHECK(cudaMalloc((void **)&d, sizeof host) == cudaSuccess);
    CHECK(cudaMalloc((void **)&g, sizeof host) == cudaSuccess);
    cudaMemcpy(d, host, sizeof host, cudaMemcpyHostToDevice);
    CHECK_OK(nc->ops->allreduce_f32(nc, d, 256, CKV_COMM_OP_SUM));
    CHECK_OK(nc->ops->allgather(nc, d, g, sizeof host));
    CHECK_OK(nc->ops->bcast(nc, g, sizeof host, 0));
    CHECK_OK(nc->ops->barrier(nc));
    cudaMemcpy(back, g, sizeof back, cudaMemcpyDeviceToHost);
    ckv_test_allclose("nccl all-reduce/all-gather/broadcast on 1 rank", back, host, 256, 0.0, 0.0);
    char bus[64] = "";
    CHECK_OK(ckv_comm_gpu_id(dev, bus, sizeof bus));
    CHECK_MSG(strlen(bus) > 4, "PCI bus id '%s'", bus);
    /* asynchronous mode on a caller's stream: no host wait per call, ordered with the stream */
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess);
    ckv_comm_set_stream(nc, st);
    CHECK(ckv_comm_nccl_on_stream(nc) == 1);
    for (int i = 0; i < 300; i++) /* more than the ring holds: the caller waits for the oldest */
        CHECK_OK(nc->ops->allgather(nc, d, g, sizeof host));
    CHECK(cudaMemcpyAsync(back, g, sizeof back, cudaMemcpyDeviceToHost, st) == cudaSuccess);
    CHECK(cudaStreamSynchronize(st) == cudaSuccess);
    ckv_test_allclose("nccl on the caller's stream", back, host, 256, 0.0, 0.0);
    cudaFree(d);
    cudaFree(g);
    ckv_comm_free(nc);
    cudaStreamDestroy(st);
    ckv_comm_free(boot);
    return ckv_test_finish("test_comm_nccl");
}
