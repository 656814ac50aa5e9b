/* fuzz_dataset.c - libFuzzer target for the JSONL dataset reader (eval/dataset.c): every input is
 * loaded as a dataset file, once stopping at the first bad line and once skipping bad lines.
 * Invariants besides "no crash, no sanitizer report": a refusal carries a one-line printable
 * message; what loads has at least one sample, each with a context and at least one question with
 * answers. */
#include "fuzz_input.h" /* first: it sets _GNU_SOURCE */
#include "eval/dataset.h"

static void warn(void *ctx, const char *msg) {
    (void)ctx;
    if (!msg[0] || strchr(msg, '\n')) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = ckv_fuzz_file(data, size);
    for (int skip = 0; skip < 2; skip++) {
        ckv_dataset_options o = {skip, NULL, 0, warn, NULL};
        ckv_eval_sample *s = NULL;
        int n = 0, skipped = 0;
        ckv_error_clear();
        if (ckv_dataset_load(path, &o, &s, &n, &skipped) != CKV_STATUS_OK) {
            ckv_fuzz_check_message();
            continue;
        }
        if (n < 1) abort();
        for (int i = 0; i < n; i++) {
            if (!s[i].context || s[i].n_questions < 1) abort();
            for (int q = 0; q < s[i].n_questions; q++)
                if (!s[i].questions[q].question || s[i].questions[q].n_answers < 1) abort();
        }
        ckv_eval_samples_free(s, n);
    }
    return 0;
}
