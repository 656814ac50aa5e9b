/* test_dataset.c - the JSONL dataset reader (eval/dataset.c) on files written at run time: a valid
 * line with grouped questions, and the inputs issue 13 found accepted as garbage, each required to
 * fail naming file:line: a NUL inside a string (raw and as \u0000), "question" together with
 * "questions", bytes after the object; plus the input-size limit (CKV_MAX_INPUT_BYTES) and
 * /dev/zero, which must end quickly with an error. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckv_test.h"
#include "core/json.h"
#include "core/timer.h"
#include "eval/dataset.h"

static char path[600];

static void write_file(const char *text, size_t len) {
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot write %s", path);
    if (!f) return;
    if (len) CHECK(fwrite(text, 1, len, f) == len);
    fclose(f);
}

static ckv_status load(const char *text, size_t len, int *n) {
    write_file(text, len);
    ckv_dataset_options o = {0};
    ckv_eval_sample *s = NULL;
    *n = 0;
    ckv_status st = ckv_dataset_load(path, &o, &s, n, NULL);
    if (st == CKV_STATUS_OK) ckv_eval_samples_free(s, *n);
    return st;
}

#define LOAD_FAILS(text, needle)                                                                                \
    do {                                                                                                        \
        int n_;                                                                                                 \
        CHECK_FAILS(load(text, sizeof(text) - 1, &n_), CKV_STATUS_ERR_FORMAT, needle);                         \
        CHECK_MSG(strchr(ckv_error_message(), '\n') == NULL, "message spans lines: %s", ckv_error_message()); \
    } while (0)

static void test_lines(void) {
    int n = 0;
    const char ok[] = "{\"context\": \"abc\", \"questions\": [\"q1\", \"q2\"], \"answers\": [[\"a\"], [\"b\"]], \"task\": \"qa\","
                      " \"metric\": \"qa_f1\"}\n"
                      "{\"context\": \"abc\", \"question\": \"q3\", \"answers\": [\"c\"], \"task\": \"qa\", \"metric\": \"qa_f1\"}\n";
    CHECK_OK(load(ok, sizeof ok - 1, &n));
    CHECK_MSG(n == 1, "%d samples, expected 1 (grouped by context)", n);

    LOAD_FAILS("{\"context\": \"ab\\u0000cd\", \"question\": \"q\", \"answers\": [\"a\"], \"metric\": \"qa_f1\"}\n",
               "data.jsonl:1: string with a \\u0000 (NUL) character");
    LOAD_FAILS("\n{\"context\": \"ab\0cd\", \"question\": \"q\", \"answers\": [\"a\"], \"metric\": \"qa_f1\"}\n",
               "data.jsonl:2: NUL byte at byte 16 of the line");
    LOAD_FAILS("{\"context\": \"c\", \"question\": \"q\", \"questions\": [\"q1\"], \"answers\": [[\"a\"]], \"metric\": \"qa_f1\"}\n",
               "data.jsonl:1: both \"questions\" and \"question\" are given");
    LOAD_FAILS("{\"context\": \"c\", \"input\": \"q\", \"questions\": [\"q1\"], \"answers\": [[\"a\"]], \"metric\": \"qa_f1\"}\n",
               "data.jsonl:1: both \"questions\" and \"input\" are given");
    LOAD_FAILS("{\"context\": \"c\", \"question\": \"q\", \"answers\": [\"a\"], \"metric\": \"qa_f1\"} x\n",
               "data.jsonl:1: malformed JSON: text after the object");
    /* an escaped backslash before u0000 is not a NUL */
    const char esc[] = "{\"context\": \"a\\\\u0000\", \"question\": \"q\", \"answers\": [\"a\"], \"metric\": \"qa_f1\"}\n";
    CHECK_OK(load(esc, sizeof esc - 1, &n));
}

static void test_limits(void) {
    char *buf = NULL;
    size_t len = 0;
    const char text[] = "{\"context\": \"c\", \"question\": \"q\", \"answers\": [\"a\"], \"metric\": \"qa_f1\"}\n";
    write_file(text, sizeof text - 1);
    setenv("CKV_MAX_INPUT_BYTES", "20", 1);
    CHECK_FAILS(ckv_read_file(path, &buf, &len), CKV_STATUS_ERR_RANGE, "input larger than the limit of 20 bytes");
    int n;
    CHECK_FAILS(load(text, sizeof text - 1, &n), CKV_STATUS_ERR_RANGE, "data.jsonl: input larger than the limit");
    setenv("CKV_MAX_INPUT_BYTES", "1k", 1);
    CHECK_OK(ckv_read_file(path, &buf, &len));
    CHECK(len == sizeof text - 1 && buf && strcmp(buf, text) == 0);
    free(buf);
    buf = NULL;
    setenv("CKV_MAX_INPUT_BYTES", "100000000000", 1); /* a plain byte count above 2^32 */
    CHECK_OK(ckv_read_file(path, &buf, &len));
    free(buf);
    buf = NULL;
    setenv("CKV_MAX_INPUT_BYTES", "99999999999999999999999", 1);
    CHECK_FAILS(ckv_read_file(path, &buf, &len), CKV_STATUS_ERR_ARG, "is not a positive byte count");
    setenv("CKV_MAX_INPUT_BYTES", "lots", 1);
    CHECK_FAILS(ckv_read_file(path, &buf, &len), CKV_STATUS_ERR_ARG, "CKV_MAX_INPUT_BYTES='lots' is not a positive");
    setenv("CKV_MAX_INPUT_BYTES", "-5", 1);
    CHECK_FAILS(ckv_read_file(path, &buf, &len), CKV_STATUS_ERR_ARG, "is not a positive byte count");
    setenv("CKV_MAX_INPUT_BYTES", "16M", 1);
    double t0 = ckv_time_now();
    CHECK_FAILS(ckv_read_file("/dev/zero", &buf, &len), CKV_STATUS_ERR_RANGE, "/dev/zero: input larger than the limit of 16777216");
    double dt = ckv_time_now() - t0;
    CHECK_MSG(dt < 5.0, "reading /dev/zero to the limit took %.1f s", dt);
    unsetenv("CKV_MAX_INPUT_BYTES");
    CHECK_FAILS(ckv_read_file(CKV_TEST_TMP, &buf, &len), CKV_STATUS_ERR_IO, "is a directory");
    FILE *z = fopen("/dev/zero", "rb");
    if (z) {
        CHECK_FAILS(ckv_read_stream(z, "stdin", 1000, &buf, &len), CKV_STATUS_ERR_RANGE, "stdin: input larger than the limit of 1000");
        fclose(z);
    }
}

int main(void) {
    snprintf(path, sizeof path, "%s/test_dataset.%ld.data.jsonl", CKV_TEST_TMP, (long)getpid());
    /* messages name the file by its base name, which ends in "data.jsonl" */
    test_lines();
    test_limits();
    unlink(path);
    return ckv_test_finish("test_dataset");
}
