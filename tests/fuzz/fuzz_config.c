/* fuzz_config.c - libFuzzer target for the config.json reader (model/config.c): the input up to its
 * first NUL byte is config.json, what follows (if anything) generation_config.json. Invariants
 * besides "no crash, no sanitizer report": a refusal carries a one-line printable message; an
 * accepted config has positive sizes, heads that divide, rms_norm_eps in ckv's range and bos / eos
 * ids inside the vocabulary. */
#include "fuzz_input.h" /* first: it sets _GNU_SOURCE */
#include "model/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 2);
    if (!text) return 0;
    memcpy(text, data, size);
    text[size] = text[size + 1] = '\0';
    const char *gen = NULL;
    size_t cut = strlen(text);
    if (cut < size) gen = text + cut + 1;
    ckv_model_config cfg;
    ckv_error_clear();
    if (ckv_config_parse(&cfg, text, gen, "fuzz/config.json") != CKV_STATUS_OK) {
        ckv_fuzz_check_message();
    } else {
        if (cfg.vocab_size <= 0 || cfg.hidden_size <= 0 || cfg.n_heads <= 0 || cfg.n_kv_heads <= 0 ||
            cfg.n_heads % cfg.n_kv_heads != 0 || cfg.head_dim <= 0 || cfg.n_layers <= 0 || cfg.intermediate_size <= 0)
            abort();
        if (!(cfg.rms_norm_eps >= CKV_RMS_EPS_MIN && cfg.rms_norm_eps <= CKV_RMS_EPS_MAX)) abort();
        if (cfg.bos_token_id >= cfg.vocab_size) abort();
        for (int k = 0; k < cfg.n_eos; k++)
            if (cfg.eos_ids[k] < 0 || cfg.eos_ids[k] >= cfg.vocab_size) abort();
        (void)ckv_config_param_count(&cfg);
    }
    free(text);
    return 0;
}
