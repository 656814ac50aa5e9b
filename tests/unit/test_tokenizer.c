/* test_tokenizer.c - unit tests of src/tokenizer on small handmade tokenizer.json files written at
 * run time: byte-level BPE merges (GPT-2 regex and Llama-3 style Split), SentencePiece-style BPE
 * with byte fallback and Metaspace (prepend "first" after an added token), added and special
 * tokens (lstrip/rstrip, single_word, split_special, skip_special), the post-processor, the
 * streaming decoder across split UTF-8, GGUF vocabularies (score BPE, gpt2 merges), chat templates,
 * and malformed or unsupported files and input (clear errors, no crash). The parity against HF on
 * real tokenizers is test_tokenizer_parity.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckv_test.h"
#include "tokenizer/tokenizer.h"

/* byte-level BPE: GPT-2 regex via ByteLevel(use_regex), decoder ByteLevel */
static const char *k_bytelevel =
    "{\"version\":\"1.0\",\"added_tokens\":["
    "{\"id\":20,\"content\":\"<|end|>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
    "\"special\":true},"
    "{\"id\":21,\"content\":\"<x>\",\"single_word\":false,\"lstrip\":true,\"rstrip\":true,\"normalized\":false,"
    "\"special\":false},"
    "{\"id\":22,\"content\":\"hi\",\"single_word\":true,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
    "\"special\":false},"
    "{\"id\":23,\"content\":\"<bos>\",\"single_word\":false,\"lstrip\":false,\"rstrip\":false,\"normalized\":false,"
    "\"special\":true}],"
    "\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
    "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<bos>\",\"type_id\":0}},"
    "{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{\"<bos>\":{\"id\":\"<bos>\",\"ids\":[23],"
    "\"tokens\":[\"<bos>\"]}}},"
    "\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,\"use_regex\":true},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,\"fuse_unk\":false,\"byte_fallback\":false,"
    "\"vocab\":{\"h\":0,\"e\":1,\"l\":2,\"o\":3,\"\\u0120\":4,\"w\":5,\"r\":6,\"d\":7,\"he\":8,\"ll\":9,\"hell\":10,"
    "\"hello\":11,\"\\u0120w\":12,\"or\":13,\"\\u0120wor\":14,\"\\u0120world\":15,\"ld\":16,\"\\u00c3\":17,"
    "\"\\u00a9\":18,\"!\":19},"
    "\"merges\":[\"h e\",\"l l\",\"he ll\",\"hell o\",\"\\u0120 w\",\"o r\",\"\\u0120w or\",\"l d\",\"\\u0120wor ld\"]}}";

/* SentencePiece style: byte fallback, Metaspace first, Replace/ByteFallback/Fuse/Strip decoder.
 * ids: <unk> 0, <s> 1, </s> 2, <0x00>.. <0xFF> 3..258, then the pieces below. */
static char *make_spm(const char *pre, const char *norm) {
    size_t cap = 16384;
    char *j = malloc(cap);
    size_t n = 0;
    n += (size_t)snprintf(j + n, cap - n,
                          "{\"added_tokens\":[{\"id\":0,\"content\":\"<unk>\",\"special\":true,\"normalized\":false},"
                          "{\"id\":1,\"content\":\"<s>\",\"special\":true,\"normalized\":false},"
                          "{\"id\":2,\"content\":\"</s>\",\"special\":true,\"normalized\":false}],"
                          "\"normalizer\":%s,\"pre_tokenizer\":%s,"
                          "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\","
                          "\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],\"pair\":[],\"special_tokens\":{"
                          "\"<s>\":{\"id\":\"<s>\",\"ids\":[1],\"tokens\":[\"<s>\"]}}},"
                          "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":"
                          "\"\\u2581\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\","
                          "\"content\":\" \",\"start\":1,\"stop\":0}]},"
                          "\"model\":{\"type\":\"BPE\",\"unk_token\":\"<unk>\",\"fuse_unk\":true,\"byte_fallback\":true,"
                          "\"vocab\":{\"<unk>\":0,\"<s>\":1,\"</s>\":2",
                          norm, pre);
    for (int b = 0; b < 256; b++) n += (size_t)snprintf(j + n, cap - n, ",\"<0x%02X>\":%d", b, 3 + b);
    n += (size_t)snprintf(j + n, cap - n,
                          ",\"\\u2581\":259,\"a\":260,\"b\":261,\"\\u2581a\":262,\"ab\":263},"
                          "\"merges\":[[\"\\u2581\",\"a\"],[\"a\",\"b\"]]}}");
    return j;
}

static const char *k_metaspace_first = "{\"type\":\"Metaspace\",\"replacement\":\"\\u2581\",\"prepend_scheme\":\"first\","
                                       "\"split\":false}";

static int ids_eq(const int32_t *got, size_t n, const int32_t *want, size_t nw) {
    return n == nw && (n == 0 || memcmp(got, want, n * sizeof *got) == 0);
}

static void check_encode(ckv_tokenizer *t, const char *text, unsigned flags, const int32_t *want, size_t nw) {
    int32_t *ids = NULL;
    size_t n = 0;
    ckv_status s = ckv_tokenizer_encode(t, text, strlen(text), flags, &ids, &n);
    CHECK_MSG(s == CKV_STATUS_OK, "encode '%s': %s", text, ckv_error_message());
    if (s == CKV_STATUS_OK && !ids_eq(ids, n, want, nw)) {
        fprintf(stderr, "FAIL encode '%s': got", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, ", expected");
        for (size_t i = 0; i < nw; i++) fprintf(stderr, " %d", want[i]);
        fprintf(stderr, "\n");
        ckv_test_failures++;
    }
    free(ids);
}

static void check_decode(ckv_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, const char *want) {
    char *text = NULL;
    size_t len = 0;
    CHECK_OK(ckv_tokenizer_decode(t, ids, n, flags, &text, &len));
    CHECK_MSG(text && len == strlen(want) && !memcmp(text, want, len), "decode gave '%s', expected '%s'",
              text ? text : "(null)", want);
    free(text);
}

static void test_bytelevel(void) {
    ckv_tokenizer *t = NULL;
    CHECK_OK(ckv_tokenizer_load_json_buffer(&t, k_bytelevel, strlen(k_bytelevel), NULL, 0, "bytelevel.json"));
    if (!t) return;
    check_encode(t, "hello world!", 0, (int32_t[]){11, 15, 19}, 3);
    check_encode(t, "hello world!", CKV_TOKENIZE_ADD_SPECIAL, (int32_t[]){23, 11, 15, 19}, 4);
    check_encode(t, "", CKV_TOKENIZE_ADD_SPECIAL, (int32_t[]){23}, 1);
    check_encode(t, "\xc3\xa9", 0, (int32_t[]){17, 18}, 2); /* é = C3 A9 -> two byte-level chars */
    check_encode(t, "hello<|end|>", 0, (int32_t[]){11, 20}, 2);
    check_encode(t, "hello  <x>  world", 0, (int32_t[]){11, 21, 5, 13, 16}, 5); /* lstrip + rstrip */
    check_encode(t, "hi", 0, (int32_t[]){22}, 1);                                /* single word */
    check_encode(t, "he hi", 0, (int32_t[]){8, 4, 22}, 3); /* the space is its own piece */
    check_encode(t, "hhi", 0, (int32_t[]){0, 0}, 2); /* "hi" inside a word is not the added token; i unknown */
    {
        int32_t *ids = NULL;
        size_t n = 0;
        CHECK_OK(ckv_tokenizer_encode(t, "hello<|end|>", 12, CKV_TOKENIZE_SPLIT_SPECIAL, &ids, &n));
        int has = 0;
        for (size_t i = 0; i < n; i++) has |= ids[i] == 20;
        CHECK_MSG(!has && n >= 1 && ids[0] == 11, "split_special still produced <|end|>");
        free(ids);
    }
    check_decode(t, (int32_t[]){11, 15, 19}, 3, 0, "hello world!");
    check_decode(t, (int32_t[]){23, 11, 20}, 3, 0, "<bos>hello<|end|>");
    check_decode(t, (int32_t[]){23, 11, 20}, 3, CKV_DETOKENIZE_SKIP_SPECIAL, "hello");
    check_decode(t, (int32_t[]){17, 18}, 2, 0, "\xc3\xa9");
    check_decode(t, (int32_t[]){17}, 1, 0, "\xef\xbf\xbd"); /* lone lead byte -> U+FFFD */
    check_decode(t, (int32_t[]){18, 11}, 2, 0, "\xef\xbf\xbdhello");

    /* streaming: é split over two tokens comes out whole, once */
    ckv_detok_stream st;
    ckv_detok_stream_init(&st, t, 0);
    char buf[1024];
    size_t n = 99;
    CHECK_OK(ckv_detok_stream_push(&st, 11, buf, sizeof buf, &n));
    CHECK(n == 5 && !strcmp(buf, "hello"));
    CHECK_OK(ckv_detok_stream_push(&st, 17, buf, sizeof buf, &n));
    CHECK_MSG(n == 0, "incomplete UTF-8 was not held back (%zu bytes out)", n);
    CHECK_OK(ckv_detok_stream_push(&st, 18, buf, sizeof buf, &n));
    CHECK(n == 2 && !memcmp(buf, "\xc3\xa9", 2));
    CHECK_OK(ckv_detok_stream_push(&st, 17, buf, sizeof buf, &n));
    CHECK(n == 0);
    CHECK_OK(ckv_detok_stream_flush(&st, buf, sizeof buf, &n));
    CHECK_MSG(n == 3 && !memcmp(buf, "\xef\xbf\xbd", 3), "flush of a dangling lead byte gave %zu bytes", n);
    CHECK_FAILS(ckv_detok_stream_push(&st, 999, buf, sizeof buf, &n), CKV_STATUS_ERR_RANGE, "token id 999");
    CHECK_FAILS(ckv_detok_stream_push(&st, 11, buf, 3, &n), CKV_STATUS_ERR_RANGE, "too small");

    /* pieces and look-ups */
    char piece[16];
    CHECK(ckv_tokenizer_token_to_piece(t, 15, piece, sizeof piece) == 6 && !memcmp(piece, " world", 6));
    CHECK(ckv_tokenizer_token_to_piece(t, 17, piece, sizeof piece) == 1 && (uint8_t)piece[0] == 0xC3);
    CHECK(ckv_tokenizer_token_to_piece(t, 5000, piece, sizeof piece) == -1);
    CHECK(ckv_tokenizer_token_id(t, "<|end|>") == 20);
    CHECK(ckv_tokenizer_token_id(t, "hello") == 11);
    CHECK(ckv_tokenizer_token_id(t, "nope") == -1);
    CHECK(ckv_tokenizer_is_special(t, 20) && !ckv_tokenizer_is_special(t, 21) && !ckv_tokenizer_is_special(t, 11));
    CHECK(ckv_tokenizer_vocab_size(t) == 24);
    CHECK(ckv_tokenizer_bos_id(t) == 23);
    CHECK(!strcmp(ckv_tokenizer_token_text(t, 15), "\xc4\xa0world"));

    /* invalid UTF-8: an error naming the byte and offset, or U+FFFD replacement on request */
    int32_t *ids = NULL;
    size_t ni = 0;
    CHECK_FAILS(ckv_tokenizer_encode(t, "hel\xfflo", 6, 0, &ids, &ni), CKV_STATUS_ERR_FORMAT, "byte 0xff at offset 3");
    CHECK(ids == NULL && ni == 0);
    CHECK_OK(ckv_tokenizer_encode(t, "hel\xfflo", 6, CKV_TOKENIZE_UTF8_REPLACE, &ids, &ni));
    free(ids);
    ckv_tokenizer_free(t);
}

static void test_llama3_split(void) {
    /* Split with a Llama-3 style regex then ByteLevel without its own regex: digits in runs of 3 */
    const char *j =
        "{\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":"
        "\"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}| ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|"
        "\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"},\"behavior\":\"Isolated\",\"invert\":false},"
        "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]},"
        "\"decoder\":{\"type\":\"ByteLevel\"},"
        "\"model\":{\"type\":\"BPE\",\"ignore_merges\":true,\"vocab\":{\"1\":0,\"2\":1,\"3\":2,\"4\":3,\"12\":4,\"123\":5,"
        "\"S\":6,\"'\":7,\"'S\":8,\"\\u0120\":9,\"\\u0120\\u0120\":10},"
        "\"merges\":[\"1 2\",\"12 3\",\"' S\",\"\\u0120 \\u0120\"]}}";
    ckv_tokenizer *t = NULL;
    CHECK_OK(ckv_tokenizer_load_json_buffer(&t, j, strlen(j), NULL, 0, "split.json"));
    if (!t) return;
    check_encode(t, "1234", 0, (int32_t[]){5, 3}, 2);
    check_encode(t, "'S", 0, (int32_t[]){8}, 1);               /* case-insensitive contraction */
    check_encode(t, "   ", 0, (int32_t[]){10, 9}, 2);          /* \s+(?!\S) keeps runs together */
    check_encode(t, "\xc2\x85", 0, (int32_t[]){0}, 0);         /* U+0085 bytes are not in this vocab */
    check_decode(t, (int32_t[]){5, 3, 10}, 3, 0, "1234  ");
    ckv_tokenizer_free(t);
}

static void test_spm(void) {
    char *j = make_spm(k_metaspace_first, "null");
    ckv_tokenizer *t = NULL;
    CHECK_OK(ckv_tokenizer_load_json_buffer(&t, j, strlen(j), NULL, 0, "spm.json"));
    free(j);
    if (!t) return;
    /* "ab é": ▁a b ▁ <0xC3> <0xA9> (é is not a piece: byte fallback) */
    check_encode(t, "ab \xc3\xa9", 0, (int32_t[]){262, 261, 259, 3 + 0xC3, 3 + 0xA9}, 5);
    check_encode(t, "ab", CKV_TOKENIZE_ADD_SPECIAL, (int32_t[]){1, 262, 261}, 3);
    /* after an added token the split is not "first": no ▁ is prepended, so "a b" merges */
    check_encode(t, "<s>ab", 0, (int32_t[]){1, 263}, 2);
    check_encode(t, "ab</s> ab", 0, (int32_t[]){262, 261, 2, 262, 261}, 5);
    check_decode(t, (int32_t[]){262, 261, 259, 3 + 0xC3, 3 + 0xA9}, 5, 0, "ab \xc3\xa9");
    check_decode(t, (int32_t[]){1, 262, 261}, 3, 0, "<s> ab"); /* Strip only cuts the very first space */
    check_decode(t, (int32_t[]){1, 262, 261}, 3, CKV_DETOKENIZE_SKIP_SPECIAL, "ab");
    /* an invalid byte run becomes one U+FFFD per byte (HF ByteFallback) */
    check_decode(t, (int32_t[]){260, 3 + 0xE4, 3 + 0xB8, 261}, 4, 0, "a\xef\xbf\xbd\xef\xbf\xbd" "b");
    char piece[8];
    CHECK(ckv_tokenizer_token_to_piece(t, 262, piece, sizeof piece) == 2 && !memcmp(piece, " a", 2));
    CHECK(ckv_tokenizer_token_to_piece(t, 3 + 0x41, piece, sizeof piece) == 1 && piece[0] == 'A');

    /* streaming: 中 = E4 B8 AD as three byte tokens, held until the run ends */
    ckv_detok_stream st;
    ckv_detok_stream_init(&st, t, 0);
    char buf[2048];
    size_t n;
    CHECK_OK(ckv_detok_stream_push(&st, 262, buf, sizeof buf, &n));
    CHECK_MSG(n == 1 && buf[0] == 'a', "first token's leading space is stripped (got %zu bytes)", n);
    CHECK_OK(ckv_detok_stream_push(&st, 3 + 0xE4, buf, sizeof buf, &n));
    CHECK(n == 0);
    CHECK_OK(ckv_detok_stream_push(&st, 3 + 0xB8, buf, sizeof buf, &n));
    CHECK(n == 0);
    CHECK_OK(ckv_detok_stream_push(&st, 3 + 0xAD, buf, sizeof buf, &n));
    CHECK(n == 0);
    CHECK_OK(ckv_detok_stream_push(&st, 262, buf, sizeof buf, &n));
    CHECK_MSG(n == 5 && !memcmp(buf, "\xe4\xb8\xad a", 5), "byte run then ' a' (got %zu bytes)", n);
    CHECK_OK(ckv_detok_stream_push(&st, 3 + 0xE4, buf, sizeof buf, &n));
    CHECK_OK(ckv_detok_stream_flush(&st, buf, sizeof buf, &n));
    CHECK(n == 3 && !memcmp(buf, "\xef\xbf\xbd", 3));
    ckv_tokenizer_free(t);

    /* the legacy form: Prepend + Replace normalizer, no pre-tokenizer; every split gets ▁ */
    j = make_spm("null", "{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\\u2581\"},"
                         "{\"type\":\"Replace\",\"pattern\":{\"String\":\" \"},\"content\":\"\\u2581\"}]}");
    CHECK_OK(ckv_tokenizer_load_json_buffer(&t, j, strlen(j), NULL, 0, "spm-legacy.json"));
    free(j);
    if (!t) return;
    check_encode(t, "<s>ab", 0, (int32_t[]){1, 262, 261}, 3);
    check_encode(t, "", 0, NULL, 0);
    ckv_tokenizer_free(t);
}

static void test_files_and_config(void) {
    /* a model directory: tokenizer.json + tokenizer_config.json with a chat template */
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/tok_unit_dir", CKV_TEST_TMP);
    snprintf(path, sizeof path, "mkdir -p '%s'", dir);
    CHECK(system(path) == 0);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fputs(k_bytelevel, f);
    fclose(f);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    f = fopen(path, "wb");
    fputs("{\"bos_token\":\"<bos>\",\"eos_token\":{\"content\":\"<|end|>\"},\"chat_template\":\"{% for m in messages %}"
          "{{'<|im_start|>' + m['role'] + '\\\\n' + m['content'] + '<|im_end|>' + '\\\\n'}}{% endfor %}\"}",
          f);
    fclose(f);
    ckv_tokenizer *t = NULL;
    CHECK_OK(ckv_tokenizer_load_json(&t, dir));
    if (t) {
        CHECK(ckv_tokenizer_eos_id(t) == 20 && ckv_tokenizer_bos_id(t) == 23);
        CHECK(ckv_tokenizer_chat_template(t)->family == CKV_CHAT_CHATML);
        int32_t stop[8];
        int ns = ckv_tokenizer_stop_ids(t, stop, 8);
        CHECK(ns >= 1 && stop[0] == 20);
        ckv_tokenizer_free(t);
    }
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    CHECK_OK(ckv_tokenizer_load_json(&t, path)); /* the file itself works too */
    ckv_tokenizer_free(t);
    snprintf(path, sizeof path, "%s/missing", dir);
    CHECK_FAILS(ckv_tokenizer_load_json(&t, path), CKV_STATUS_ERR_IO, "missing");
    CHECK(t == NULL);
}

static void expect_bad(const char *json, ckv_status code, const char *needle) {
    ckv_tokenizer *t = (ckv_tokenizer *)1;
    CHECK_FAILS(ckv_tokenizer_load_json_buffer(&t, json, strlen(json), NULL, 0, "bad.json"), code, needle);
    CHECK_MSG(t == NULL, "a failed load left a tokenizer behind (%s)", needle);
}

static void test_malformed(void) {
    expect_bad("", CKV_STATUS_ERR_FORMAT, "invalid JSON");
    expect_bad("{\"model\": {", CKV_STATUS_ERR_FORMAT, "bad.json");
    expect_bad("[1,2]", CKV_STATUS_ERR_FORMAT, "not a JSON object");
    expect_bad("{}", CKV_STATUS_ERR_FORMAT, "'model' is missing");
    expect_bad("{\"model\":{\"type\":\"Unigram\",\"vocab\":[[\"a\",0.0]]}}", CKV_STATUS_ERR_UNSUPPORTED,
               "model type 'Unigram' is not supported");
    expect_bad("{\"model\":{\"type\":\"WordPiece\",\"vocab\":{\"a\":0}}}", CKV_STATUS_ERR_UNSUPPORTED, "'WordPiece'");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":-1},\"merges\":[]}}", CKV_STATUS_ERR_FORMAT, "token id -1");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":1.5},\"merges\":[]}}", CKV_STATUS_ERR_FORMAT, "token id 1.5");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":99999999},\"merges\":[]}}", CKV_STATUS_ERR_FORMAT,
               "not an integer in");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":\"x\"},\"merges\":[]}}", CKV_STATUS_ERR_FORMAT,
               "expected an integer");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":[],\"merges\":[]}}", CKV_STATUS_ERR_FORMAT, "model.vocab");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a b\"]}}", CKV_STATUS_ERR_FORMAT,
               "merge 0: token 'b' is not in the vocabulary");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[\"a b\"]}}", CKV_STATUS_ERR_FORMAT,
               "merged token 'ab'");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[\"a\"]}}", CKV_STATUS_ERR_FORMAT,
               "not two tokens");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[7]}}", CKV_STATUS_ERR_FORMAT, "merge 0");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{},\"merges\":[]}}", CKV_STATUS_ERR_FORMAT, "model.vocab is empty");
    /* added tokens do not make up for an empty vocabulary (all other text would be dropped) */
    expect_bad("{\"added_tokens\":[{\"id\":0,\"content\":\"<s>\",\"special\":true}],\"model\":{\"type\":\"BPE\","
               "\"vocab\":{},\"merges\":[]}}", CKV_STATUS_ERR_FORMAT, "model.vocab is empty");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"a\":1},\"merges\":[]}}", CKV_STATUS_ERR_FORMAT,
               "duplicate key 'a'");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\xff\":0},\"merges\":[]}}", CKV_STATUS_ERR_FORMAT,
               "token 0 is not valid UTF-8");
    expect_bad("{\"added_tokens\":[{\"id\":1,\"content\":\"\xc3\"}],\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},"
               "\"merges\":[]}}", CKV_STATUS_ERR_FORMAT, "added token 1 is not valid UTF-8");
    expect_bad("{\"model\":{\"type\":\"BPE\",\"dropout\":0.1,\"vocab\":{\"a\":0},\"merges\":[]}}",
               CKV_STATUS_ERR_UNSUPPORTED, "dropout");
    const char *m = "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]}";
    char buf[1024];
    snprintf(buf, sizeof buf, "{%s,\"pre_tokenizer\":{\"type\":\"Whitespace\"}}", m);
    expect_bad(buf, CKV_STATUS_ERR_UNSUPPORTED, "pre_tokenizer type 'Whitespace' is not supported");
    snprintf(buf, sizeof buf, "{%s,\"pre_tokenizer\":{\"type\":\"BertPreTokenizer\"}}", m);
    expect_bad(buf, CKV_STATUS_ERR_UNSUPPORTED, "'BertPreTokenizer'");
    snprintf(buf, sizeof buf, "{%s,\"normalizer\":{\"type\":\"Lowercase\"}}", m);
    expect_bad(buf, CKV_STATUS_ERR_UNSUPPORTED, "normalizer type 'Lowercase' is not supported");
    snprintf(buf, sizeof buf, "{%s,\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"Precompiled\"}]}}", m);
    expect_bad(buf, CKV_STATUS_ERR_UNSUPPORTED, "'Precompiled'");
    snprintf(buf, sizeof buf,
             "{%s,\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(unclosed\"},\"behavior\":\"Isolated\"}}", m);
    expect_bad(buf, CKV_STATUS_ERR_FORMAT, "does not compile");
    snprintf(buf, sizeof buf, "{%s,\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":{\"Regex\":\"a\"},\"behavior\":\"Odd\"}}", m);
    expect_bad(buf, CKV_STATUS_ERR_FORMAT, "behavior 'Odd'");
    snprintf(buf, sizeof buf, "{%s,\"pre_tokenizer\":{\"type\":\"Split\",\"pattern\":42,\"behavior\":\"Isolated\"}}", m);
    expect_bad(buf, CKV_STATUS_ERR_FORMAT, "pattern must be");
    snprintf(buf, sizeof buf, "{%s,\"pre_tokenizer\":{\"type\":\"Metaspace\",\"replacement\":\"ab\"}}", m);
    expect_bad(buf, CKV_STATUS_ERR_FORMAT, "one character");
    snprintf(buf, sizeof buf, "{%s,\"decoder\":{\"type\":\"WordPiece\"}}", m);
    expect_bad(buf, CKV_STATUS_ERR_UNSUPPORTED, "decoder 'WordPiece'");
    snprintf(buf, sizeof buf, "{%s,\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Fuse\"},{\"type\":\"Replace\"}]}}", m);
    expect_bad(buf, CKV_STATUS_ERR_UNSUPPORTED, "decoder 'Replace'");
    snprintf(buf, sizeof buf, "{%s,\"post_processor\":{\"type\":\"Fancy\"}}", m);
    expect_bad(buf, CKV_STATUS_ERR_UNSUPPORTED, "post_processor type 'Fancy'");
    snprintf(buf, sizeof buf,
             "{%s,\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}}],"
             "\"special_tokens\":{}}}", m);
    expect_bad(buf, CKV_STATUS_ERR_FORMAT, "special token '<s>' has no 'ids'");
    snprintf(buf, sizeof buf,
             "{%s,\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":{\"id\":\"<s>\"}}],"
             "\"special_tokens\":{\"<s>\":{\"ids\":[7]}}}}", m);
    expect_bad(buf, CKV_STATUS_ERR_FORMAT, "token id 7, which has no token");
    snprintf(buf, sizeof buf, "{%s,\"added_tokens\":[{\"id\":\"x\",\"content\":\"<a>\"}]}", m);
    expect_bad(buf, CKV_STATUS_ERR_FORMAT, "added_tokens[0].id");
    snprintf(buf, sizeof buf, "{%s,\"added_tokens\":[{\"id\":3}]}", m);
    expect_bad(buf, CKV_STATUS_ERR_FORMAT, "no 'content'");
    snprintf(buf, sizeof buf, "{%s,\"added_tokens\":{}}", m);
    expect_bad(buf, CKV_STATUS_ERR_FORMAT, "added_tokens must be an array");

    /* a tokenizer with holes in its id space decodes the holes as an error, not a crash */
    const char *holes = "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":5},\"merges\":[]}}";
    ckv_tokenizer *t = NULL;
    CHECK_OK(ckv_tokenizer_load_json_buffer(&t, holes, strlen(holes), NULL, 0, "holes.json"));
    if (t) {
        char *s = NULL;
        size_t l;
        CHECK_FAILS(ckv_tokenizer_decode(t, (int32_t[]){0, 3}, 2, 0, &s, &l), CKV_STATUS_ERR_RANGE, "token id 3");
        CHECK_FAILS(ckv_tokenizer_decode(t, (int32_t[]){-4}, 1, 0, &s, &l), CKV_STATUS_ERR_RANGE, "token id -4");
        check_decode(t, (int32_t[]){0, 1 + 4}, 2, 0, "a b"); /* no decoder: joined with spaces */
        ckv_tokenizer_free(t);
    }
}

static void test_gguf(void) {
    /* llama (SentencePiece) vocabulary with scores: "ab" outscores "▁a", so "▁ab" = ▁ + ab */
    enum { NB = 256 };
    const char *tokens[3 + NB + 6];
    float scores[3 + NB + 6];
    int32_t types[3 + NB + 6];
    static char bytes[NB][8];
    tokens[0] = "<unk>";
    tokens[1] = "<s>";
    tokens[2] = "</s>";
    types[0] = CKV_GGUF_TOKEN_UNKNOWN;
    types[1] = types[2] = CKV_GGUF_TOKEN_CONTROL;
    scores[0] = scores[1] = scores[2] = 0;
    for (int b = 0; b < NB; b++) {
        snprintf(bytes[b], sizeof bytes[b], "<0x%02X>", b);
        tokens[3 + b] = bytes[b];
        types[3 + b] = CKV_GGUF_TOKEN_BYTE;
        scores[3 + b] = 0;
    }
    const char *extra[6] = {"\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab"};
    float extra_scores[6] = {-1, -2, -3, -5, -4, -6};
    for (int i = 0; i < 6; i++) {
        tokens[3 + NB + i] = extra[i];
        scores[3 + NB + i] = extra_scores[i];
        types[3 + NB + i] = CKV_GGUF_TOKEN_NORMAL;
    }
    ckv_tokenizer_gguf_vocab v;
    memset(&v, 0, sizeof v);
    v.model = "llama";
    v.n_tokens = 3 + NB + 6;
    v.tokens = tokens;
    v.scores = scores;
    v.types = types;
    v.bos_id = 1;
    v.eos_id = 2;
    v.unk_id = 0;
    v.pad_id = v.eot_id = -1;
    v.add_bos = -1;
    v.add_eos = -1;
    v.add_space_prefix = -1;
    v.chat_template = "{{ bos_token }}{% for m in messages %}{{ '[INST] ' + m['content'] + '[/INST]' }}{% endfor %}";
    ckv_tokenizer *t = NULL;
    CHECK_OK(ckv_tokenizer_load_gguf_vocab(&t, &v));
    if (t) {
        const int32_t base = 3 + NB;
        check_encode(t, "ab", CKV_TOKENIZE_ADD_SPECIAL, (int32_t[]){1, base + 5}, 2);
        check_encode(t, "ab a", 0, (int32_t[]){base + 5, base + 3}, 2);
        check_encode(t, "\xc3\xa9", 0, (int32_t[]){base, 3 + 0xC3, 3 + 0xA9}, 3);
        check_encode(t, "</s>ab", 0, (int32_t[]){2, base + 5}, 2);
        check_decode(t, (int32_t[]){1, base + 5, base + 3}, 3, 0, "<s> ab a");
        CHECK(ckv_tokenizer_chat_template(t)->family == CKV_CHAT_MISTRAL);
        ckv_tokenizer_free(t);
    }
    v.model = "bert";
    CHECK_FAILS(ckv_tokenizer_load_gguf_vocab(&t, &v), CKV_STATUS_ERR_UNSUPPORTED, "GGUF tokenizer model 'bert'");
    v.model = "llama";
    v.bos_id = 100000;
    CHECK_FAILS(ckv_tokenizer_load_gguf_vocab(&t, &v), CKV_STATUS_ERR_FORMAT, "bos token id 100000");
    v.bos_id = 1;
    v.scores = NULL;
    CHECK_FAILS(ckv_tokenizer_load_gguf_vocab(&t, &v), CKV_STATUS_ERR_FORMAT, "scores");

    /* gpt2 vocabulary with merges and a named pre-tokenizer */
    const char *gt[] = {"h", "e", "l", "o", "he", "ll", "hell", "hello", "<|im_end|>"};
    int32_t gty[] = {1, 1, 1, 1, 1, 1, 1, 1, CKV_GGUF_TOKEN_CONTROL};
    const char *gm[] = {"h e", "l l", "he ll", "hell o"};
    memset(&v, 0, sizeof v);
    v.model = "gpt2";
    v.pre = "smollm";
    v.n_tokens = 9;
    v.tokens = gt;
    v.types = gty;
    v.n_merges = 4;
    v.merges = gm;
    v.bos_id = v.eos_id = v.unk_id = v.pad_id = v.eot_id = -1;
    v.add_bos = v.add_eos = v.add_space_prefix = -1;
    CHECK_OK(ckv_tokenizer_load_gguf_vocab(&t, &v));
    if (t) {
        check_encode(t, "hello<|im_end|>", 0, (int32_t[]){7, 8}, 2);
        int32_t stop[4];
        CHECK(ckv_tokenizer_stop_ids(t, stop, 4) == 1 && stop[0] == 8);
        ckv_tokenizer_free(t);
    }
    v.pre = "deepseek-coder";
    CHECK_FAILS(ckv_tokenizer_load_gguf_vocab(&t, &v), CKV_STATUS_ERR_UNSUPPORTED, "pre-tokenizer 'deepseek-coder'");
    v.pre = "gpt2";
    const char *bad_merges[] = {"h x"};
    v.merges = bad_merges;
    v.n_merges = 1;
    CHECK_FAILS(ckv_tokenizer_load_gguf_vocab(&t, &v), CKV_STATUS_ERR_FORMAT, "merge 0 ('h x')");
}

static void check_chat(const ckv_chat_template *ct, const ckv_chat_message *m, int n, int gen, const char *want) {
    char *out = NULL;
    CHECK_OK(ckv_chat_apply(ct, m, n, gen, &out));
    CHECK_MSG(out && !strcmp(out, want), "%s template gave\n%s\nexpected\n%s", ct->name, out ? out : "(null)", want);
    free(out);
}

static void test_chat(void) {
    ckv_chat_template ct;
    ckv_chat_message sys_user[2] = {{"system", "Be brief."}, {"user", " Hi there \n"}};
    ckv_chat_message user[1] = {{"user", "Hi"}};

    CHECK_OK(ckv_chat_template_detect("{% set content = '<|start_header_id|>' + message['role'] %}", &ct));
    CHECK(ct.family == CKV_CHAT_LLAMA3 && !ct.llama31_preamble);
    check_chat(&ct, sys_user, 2, 1,
               "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
               "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n");
    CHECK_OK(ckv_chat_template_detect("Cutting Knowledge Date: ... <|start_header_id|>", &ct));
    CHECK(ct.llama31_preamble && !strcmp(ct.name, "llama3.1"));
    check_chat(&ct, user, 1, 1,
               "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
               "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
               "<|start_header_id|>assistant<|end_header_id|>\n\n");

    CHECK_OK(ckv_chat_template_detect("{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a "
                                      "helpful assistant.<|im_end|>\\n' }}",
                                      &ct));
    CHECK(ct.family == CKV_CHAT_CHATML && !strcmp(ct.name, "qwen2.5"));
    check_chat(&ct, user, 1, 1,
               "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
               "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    check_chat(&ct, sys_user, 2, 0,
               "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi there \n<|im_end|>\n");
    CHECK_OK(ckv_chat_template_detect("{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] }}", &ct));
    CHECK(ct.default_system[0] == '\0' && !strcmp(ct.name, "chatml"));

    CHECK_OK(ckv_chat_template_detect("{{ '[INST] ' + message['content'] + '[/INST]' }}", &ct));
    CHECK(ct.family == CKV_CHAT_MISTRAL && !ct.mistral_space);
    ckv_chat_message conv[4] = {{"system", "S"}, {"user", "Q1"}, {"assistant", " A1 "}, {"user", "Q2"}};
    check_chat(&ct, conv, 4, 1, "<s>[INST] Q1[/INST] A1</s>[INST] S\n\nQ2[/INST]");
    CHECK_OK(ckv_chat_template_by_name("mistral-v0.1", &ct));
    check_chat(&ct, user, 1, 1, "<s>[INST] Hi [/INST]");
    ckv_chat_message bad[1] = {{"tool", "x"}};
    char *out = NULL;
    CHECK_FAILS(ckv_chat_apply(&ct, bad, 1, 1, &out), CKV_STATUS_ERR_UNSUPPORTED, "role 'tool'");

    CHECK_OK(ckv_chat_template_by_name("smollm2", &ct));
    check_chat(&ct, user, 1, 1,
               "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
               "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    CHECK_OK(ckv_chat_template_by_name("none", &ct));
    check_chat(&ct, user, 1, 1, "Hi");
    CHECK_FAILS(ckv_chat_template_by_name("vicuna", &ct), CKV_STATUS_ERR_UNSUPPORTED, "'vicuna' is unknown");
    CHECK_FAILS(ckv_chat_template_detect("{{ messages }}", &ct), CKV_STATUS_ERR_UNSUPPORTED, "not recognised");
}

int main(void) {
    test_bytelevel();
    test_llama3_split();
    test_spm();
    test_files_and_config();
    test_malformed();
    test_gguf();
    test_chat();
    return ckv_test_finish("test_tokenizer");
}
