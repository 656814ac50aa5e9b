/* cuda_absent.c - the CUDA entry points of a build without CUDA: they report that clearly. */
#include "backend/backend.h"

int ckv_backend_cuda_available(void) { return 0; }

ckv_status ckv_backend_cuda_init(ckv_backend **out, int device_index) {
    (void)device_index;
    *out = NULL;
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "this build of ckv has no CUDA backend");
}
