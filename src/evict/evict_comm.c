/* evict_comm.c - where eviction data crosses ranks or the device boundary (see scorer.h): the
 * all-reduce and all-gather of scores on device or host buffers, staged through the other memory
 * when the communicator wants its buffers elsewhere (MPI takes host memory, NCCL device memory), and
 * the host views the scorers with host bookkeeping use. No arithmetic, no selection. */
#include <string.h>

#include "core/alloc.h"
#include "evict/scorer.h"

static int comm_wants_device(const ckv_backend *be, const ckv_comm *c) {
    return be->device == CKV_DEVICE_HOST || c->device_buffers;
}

ckv_status ckv_evict_allreduce(ckv_backend *be, ckv_comm *c, float *buf, size_t n, ckv_comm_op op, int on_device) {
    if (!c || c->size <= 1 || n == 0) return CKV_STATUS_OK;
    /* on a host backend device memory is host memory: every combination is direct */
    const int direct = be->device == CKV_DEVICE_HOST || (on_device ? c->device_buffers : !c->device_buffers);
    if (direct) return c->ops->allreduce_f32(c, buf, n, op);
    const size_t bytes = n * sizeof(float);
    void *stage = NULL;
    ckv_status s;
    if (on_device) { /* device buffer, host communicator */
        CKV_TRY(ckv_alloc(&stage, bytes, "score all-reduce staging"));
        s = be->ops->download(be, stage, buf, bytes);
        if (s == CKV_STATUS_OK) s = c->ops->allreduce_f32(c, stage, n, op);
        if (s == CKV_STATUS_OK) s = be->ops->upload(be, buf, stage, bytes);
        ckv_free(stage);
    } else { /* host buffer, device communicator */
        CKV_TRY(be->ops->alloc(be, &stage, bytes, "score all-reduce staging"));
        s = be->ops->upload(be, stage, buf, bytes);
        if (s == CKV_STATUS_OK) s = c->ops->allreduce_f32(c, stage, n, op);
        if (s == CKV_STATUS_OK) s = be->ops->download(be, buf, stage, bytes);
        be->ops->release(be, stage);
    }
    return s;
}

ckv_status ckv_evict_allgather(ckv_backend *be, ckv_comm *c, const void *send, void *recv, size_t bytes) {
    if (!c || c->size <= 1) return be->ops->copy(be, recv, send, bytes);
    if (comm_wants_device(be, c)) return c->ops->allgather(c, send, recv, bytes);
    void *hs = NULL, *hr = NULL;
    ckv_status s = ckv_alloc(&hs, bytes, "score all-gather staging");
    if (s == CKV_STATUS_OK) s = ckv_alloc(&hr, bytes * (size_t)c->size, "score all-gather staging");
    if (s == CKV_STATUS_OK) s = be->ops->download(be, hs, send, bytes);
    if (s == CKV_STATUS_OK) s = c->ops->allgather(c, hs, hr, bytes);
    if (s == CKV_STATUS_OK) s = be->ops->upload(be, recv, hr, bytes * (size_t)c->size);
    ckv_free(hs);
    ckv_free(hr);
    return s;
}

ckv_status ckv_evict_host_view(ckv_backend *be, const void *dev, size_t bytes, void **host) {
    *host = NULL;
    if (be->device == CKV_DEVICE_HOST) {
        *host = (void *)(uintptr_t)dev;
        return CKV_STATUS_OK;
    }
    CKV_TRY(be->ops->sync(be));
    CKV_TRY(ckv_alloc(host, bytes, "eviction host staging"));
    ckv_status s = be->ops->download(be, *host, dev, bytes);
    if (s != CKV_STATUS_OK) {
        ckv_free(*host);
        *host = NULL;
    }
    return s;
}

ckv_status ckv_evict_host_release(ckv_backend *be, void *dev, void *host, size_t bytes, int write_back) {
    if (!host || host == dev) return CKV_STATUS_OK;
    ckv_status s = write_back ? be->ops->upload(be, dev, host, bytes) : CKV_STATUS_OK;
    ckv_free(host);
    return s;
}
