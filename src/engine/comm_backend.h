/* comm_backend.h - device communicators over a compute backend's memory: the glue between comm/
 * and backend/, which know nothing of each other (so it lives in engine/, which may use both). */
#ifndef CKV_ENGINE_COMM_BACKEND_H
#define CKV_ENGINE_COMM_BACKEND_H

#include "backend/backend.h"
#include "comm/comm.h"

/* Fills io with be's download/upload/copy; device ids are the GPU's PCI bus id. */
void ckv_comm_device_io_from_backend(ckv_comm_device_io *io, ckv_backend *be);

/* Hands be's compute stream (ckv_backend_stream; the backend keeps owning it) to the device
 * communicator c (ckv_comm_set_stream): on the NCCL path collectives are then enqueued behind be's
 * kernels with no host synchronisation per call, their completion watched against c's timeout. The
 * staged and host paths need no stream (their transfers are be's own, ordered on it). Rank 0 logs
 * whether NCCL took the stream. Call once, before c's first collective; be must outlive c. */
void ckv_comm_use_backend_stream(ckv_comm *c, ckv_backend *be);

/* The tensor-parallel communicator a model on `be` uses: ckv_comm_init_device over `host` (the TP
 * group's MPI communicator, borrowed; it must outlive *out) on GPU `device`, its device collectives
 * on be's compute stream (ckv_comm_use_backend_stream; free *out before be), with workspace_bytes of
 * device workspace preallocated (ckv_plan's collective buffers; 0: on demand). */
ckv_status ckv_comm_init_backend(ckv_comm **out, ckv_comm *host, ckv_backend *be, int device, size_t workspace_bytes);

#endif
