/* comm_backend.c - the device side of a device communicator taken from a compute backend: its
 * download, upload and copy ops as ckv_comm_device_io callbacks, its compute stream handed to the
 * communicator, and the communicator of a tensor-parallel group built over them. No collective
 * logic (comm_device.c) and no CUDA here: the stream is an opaque handle. */
#include "engine/comm_backend.h"

#include "core/log.h"

static ckv_status be_download(void *ctx, void *dst_host, const void *src_dev, size_t bytes) {
    ckv_backend *be = ctx;
    return be->ops->download(be, dst_host, src_dev, bytes);
}
static ckv_status be_upload(void *ctx, void *dst_dev, const void *src_host, size_t bytes) {
    ckv_backend *be = ctx;
    return be->ops->upload(be, dst_dev, src_host, bytes);
}
static ckv_status be_copy(void *ctx, void *dst_dev, const void *src_dev, size_t bytes) {
    ckv_backend *be = ctx;
    return be->ops->copy(be, dst_dev, src_dev, bytes);
}

static ckv_status be_alloc(void *ctx, void **dev, size_t bytes, const char *what) {
    ckv_backend *be = ctx;
    return be->ops->alloc(be, dev, bytes, what);
}
static void be_release(void *ctx, void *dev) {
    ckv_backend *be = ctx;
    be->ops->release(be, dev);
}

static ckv_status be_sync(void *ctx) {
    ckv_backend *be = ctx;
    return be->ops->sync(be);
}

static ckv_status be_device_id(void *ctx, char *id, size_t cap) {
    ckv_backend *be = ctx;
    return be->ops->device_id(be, id, cap);
}

void ckv_comm_device_io_from_backend(ckv_comm_device_io *io, ckv_backend *be) {
    io->ctx = be;
    io->host_memory = be->device == CKV_DEVICE_HOST;
    io->download = be_download;
    io->upload = be_upload;
    io->copy = be_copy;
    io->alloc = be_alloc;
    io->release = be_release;
    io->sync = be_sync;
    /* NULL: ckv_comm_gpu_id of the device index */
    io->device_id = ckv_backend_supports(be, CKV_BACKEND_CAP_DEVICE_ID) ? be_device_id : NULL;
}

void ckv_comm_use_backend_stream(ckv_comm *c, ckv_backend *be) {
    void *stream = ckv_backend_stream(be);
    ckv_comm_set_stream(c, stream);
    if (!c || c->rank != 0 || ckv_comm_device_path(c) != CKV_COMM_PATH_NCCL) return;
    if (ckv_comm_device_on_stream(c))
        CKV_LOG_INFO("NCCL collectives enqueued on the %s backend's compute stream (no host synchronisation per "
                     "collective; a watchdog ends the job when one is not done within --comm-timeout %g s)",
                     be->name, c->timeout_s);
    else
        CKV_LOG_INFO("NCCL collectives on their own stream, synchronised per call (%s)",
                     stream ? "its completion events could not be created" : "the backend has no compute stream");
}

ckv_status ckv_comm_init_backend(ckv_comm **out, ckv_comm *host, ckv_backend *be, int device, size_t workspace_bytes) {
    ckv_comm_device_io io;
    ckv_comm_device_io_from_backend(&io, be);
    ckv_comm_device_params p = {.device = device < 0 ? 0 : device, .path = CKV_COMM_PATH_AUTO, .staging_bytes = 0,
                                .workspace_bytes = workspace_bytes};
    CKV_TRY(ckv_comm_init_device(out, host, &io, &p));
    ckv_comm_use_backend_stream(*out, be);
    return CKV_STATUS_OK;
}
