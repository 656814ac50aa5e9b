/* comm_backend.h - device communicators over a compute backend's memory: the glue between comm/
 * and backend/, which know nothing of each other (so it lives in engine/, which may use both). */
#ifndef CKV_ENGINE_COMM_BACKEND_H
#define CKV_ENGINE_COMM_BACKEND_H

#include "backend/backend.h"
#include "comm/comm.h"

/* Fills io with be's download/upload/copy; device ids are the GPU's PCI bus id. */
void ckv_comm_device_io_from_backend(ckv_comm_device_io *io, ckv_backend *be);

/* The tensor-parallel communicator a model on `be` uses: ckv_comm_init_device over `host` (the TP
 * group's MPI communicator, borrowed; it must outlive *out) on GPU `device`, its device collectives
 * enqueued on `stream` (the backend's compute stream, opaque; NULL: synchronised per call), with
 * workspace_bytes of device workspace preallocated (ckv_plan's collective buffers; 0: on demand). */
ckv_status ckv_comm_init_backend(ckv_comm **out, ckv_comm *host, ckv_backend *be, int device, void *stream,
                                 size_t workspace_bytes);

#endif
