/* backend.c - picks a backend by name (cpu, cuda, and cuda-emu: the CUDA sources built against the CPU
 * execution layer, for tests) and checks the table it hands back (backend_caps.c). The backends
 * themselves live in cpu/ and cuda/. */
#include "backend.h"

#include "backend/cuda/cuda_emu.h"

#include <string.h>

static ckv_status init_by_name(ckv_backend **out, const ckv_backend_params *p) {
    const char *name = p ? p->name : NULL;
    if (!name || strcmp(name, "cpu") == 0) return ckv_backend_cpu_init(out, p ? p->n_threads : 0);
    if (strcmp(name, "cuda") == 0) return ckv_backend_cuda_init(out, p->device < 0 ? 0 : p->device);
    /* the CUDA kernels on ckv's CPU execution layer: end-to-end tests of the CUDA path without a GPU */
    if (strcmp(name, "cuda-emu") == 0) return ckv_backend_cuda_emu_init(out, p->device < 0 ? 0 : p->device);
    return ckv_error(CKV_STATUS_ERR_ARG, "--backend: unknown backend '%s' (expected cpu or cuda)", name);
}

ckv_status ckv_backend_init_params(ckv_backend **out, const ckv_backend_params *p) {
    *out = NULL;
    CKV_TRY(init_by_name(out, p));
    const ckv_status s = ckv_backend_check_ops(*out); /* a table that says what it offers (backend_caps.c) */
    if (s != CKV_STATUS_OK) {
        ckv_backend_free(*out);
        *out = NULL;
    }
    return s;
}

ckv_status ckv_backend_init(ckv_backend **out, const char *name, int n_threads) {
    ckv_backend_params p = {name, n_threads, -1};
    return ckv_backend_init_params(out, &p);
}

void ckv_backend_free(ckv_backend *be) {
    if (be && be->ops && be->ops->free) be->ops->free(be);
}
