/* evict_comm.c - where eviction data crosses ranks or the device boundary (see scorer.h): the
 * all-reduce and all-gather of scores on device or host buffers through the group's device
 * communicator (the staging between device and host memory is comm's), and the host views the
 * scorers with host bookkeeping use. No arithmetic, no selection. */
#include <string.h>

#include "core/alloc.h"
#include "evict/scorer.h"

/* c is the group's device communicator (engine/comm_backend.h): it decides how device buffers
 * move; host buffers take its host collectives. */
ckv_status ckv_evict_allreduce(ckv_backend *be, ckv_comm *c, float *buf, size_t n, ckv_comm_op op, int on_device) {
    (void)be;
    if (!c || c->size <= 1 || n == 0) return CKV_STATUS_OK;
    return on_device ? ckv_comm_dev_allreduce_f32(c, buf, n, op) : c->ops->allreduce_f32(c, buf, n, op);
}

ckv_status ckv_evict_allgather(ckv_backend *be, ckv_comm *c, const void *send, void *recv, size_t bytes) {
    if (!c || c->size <= 1) return be->ops->copy(be, recv, send, bytes);
    return ckv_comm_dev_allgather(c, send, recv, bytes);
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
