/* fuzz_tokenizer_json.c - libFuzzer target for the tokenizer.json reader: any input must load or be
 * refused with a status (never crash, leak or read out of bounds); what loads must encode a few
 * fixed strings and part of the input itself, decode the ids back (whole and streaming) and map
 * every id to its piece. Built and run by tests/fuzz/run_fuzz_tokenizer.sh (clang, libFuzzer,
 * ASan + UBSan); with -DCKV_FUZZ_REPLAY it is a plain program replaying files given as arguments. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void exercise(const ckv_tokenizer *t, const char *text, size_t len, unsigned flags) {
    int32_t *ids = NULL;
    size_t n = 0;
    if (ckv_tokenizer_encode(t, text, len, flags, &ids, &n) != CKV_STATUS_OK) return;
    char *out = NULL;
    size_t olen = 0;
    if (ckv_tokenizer_decode(t, ids, n, 0, &out, &olen) == CKV_STATUS_OK) free(out);
    if (ckv_tokenizer_decode(t, ids, n, CKV_DETOKENIZE_SKIP_SPECIAL, &out, &olen) == CKV_STATUS_OK) free(out);
    ckv_detok_stream st;
    ckv_detok_stream_init(&st, t, 0);
    size_t cap = ckv_detok_stream_cap(t);
    char *buf = malloc(cap);
    size_t k;
    for (size_t i = 0; buf && i < n; i++) (void)ckv_detok_stream_push(&st, ids[i], buf, cap, &k);
    if (buf) (void)ckv_detok_stream_flush(&st, buf, cap, &k);
    free(buf);
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ckv_tokenizer *t = NULL;
    if (ckv_tokenizer_load_json_buffer(&t, (const char *)data, size, NULL, 0, "fuzz.json") != CKV_STATUS_OK) return 0;
    static const char *const texts[] = {"hello world!", "  \n\t x 123 'S", "\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80",
                                        "<s>a</s>", "<|end|>hi<x> <bos>", ""};
    for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
        exercise(t, texts[i], strlen(texts[i]), CKV_TOKENIZE_ADD_SPECIAL);
        exercise(t, texts[i], strlen(texts[i]), CKV_TOKENIZE_SPLIT_SPECIAL);
    }
    exercise(t, (const char *)data, size > 256 ? 256 : size, CKV_TOKENIZE_UTF8_REPLACE);
    int32_t nv = ckv_tokenizer_vocab_size(t);
    char piece[64];
    for (int32_t id = -1; id <= nv && id < 4096; id++) (void)ckv_tokenizer_token_to_piece(t, id, piece, sizeof piece);
    (void)ckv_tokenizer_token_id(t, "hello");
    int32_t stop[8];
    (void)ckv_tokenizer_stop_ids(t, stop, 8);
    ckv_tokenizer_free(t);
    return 0;
}

#ifdef CKV_FUZZ_REPLAY
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "cannot open %s\n", argv[i]);
            return 1;
        }
        static uint8_t buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
    }
    printf("replayed %d inputs\n", argc - 1);
    return 0;
}
#endif
