/* fuzz_safetensors.c - libFuzzer target for the safetensors reader (model/safetensors.c): every input
 * is opened as a .safetensors file; when it opens, every tensor small enough is read as fp32 whole
 * and, when 2-D, as a row slice and a column slice. Invariants besides "no crash, no sanitizer
 * report": a refusal carries a one-line printable message, and what opens lists tensors whose
 * bytes lie inside the file. It does not check values (tests/unit/test_safetensors.c does). */
#include "fuzz_input.h" /* first: it sets _GNU_SOURCE */
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = ckv_fuzz_file(data, size);
    ckv_safetensors *st = NULL;
    ckv_error_clear();
    if (ckv_safetensors_open_file(&st, path) != CKV_STATUS_OK) {
        ckv_fuzz_check_message();
        ckv_safetensors_close(st);
        return 0;
    }
    for (int i = 0; i < ckv_safetensors_count(st); i++) {
        const ckv_st_tensor *t = ckv_safetensors_at(st, i);
        if (t->nbytes > size) abort();
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        if (numel > (1 << 20)) continue;
        float *dst = malloc(sizeof(float) * (size_t)(numel ? numel : 1));
        if (!dst) continue;
        if (ckv_safetensors_read_f32(st, t->name, t->ndim, t->shape, 0, -1, 0, -1, dst) != CKV_STATUS_OK)
            ckv_fuzz_check_message();
        if (t->ndim == 2) {
            int64_t R = t->shape[0], C = t->shape[1];
            (void)ckv_safetensors_read_f32(st, t->name, 2, t->shape, R / 2, R, 0, C, dst);
            (void)ckv_safetensors_read_f32(st, t->name, 2, t->shape, 0, R, C / 3, C - C / 4, dst);
        }
        free(dst);
    }
    ckv_safetensors_close(st);
    return 0;
}
