/* test_model_fixtures.c - the forward pass equals Hugging Face transformers: for every model under
 * tests/fixtures/models (written by tools/oracle/regen.sh) the logits of all 240 prompt positions
 * and of 8 greedy decode steps match the recorded ones, and layer-major chunked prefill gives the
 * same logits as one-shot prefill.
 * Tolerances: fp32 checkpoints (HF computes in fp32): |diff| <= 1e-4; both sides compute in fp32 and
 * differ only in summation order. bf16 checkpoints are checked twice: (1) against HF loading the same
 * bf16 weights with dtype=float32 (exact upcast, fp32 compute, which is what ckv's CPU backend does):
 * |diff| <= 1e-4, stricter than the 2e-2 the issue allows; (2) against HF computing in bf16 as a user
 * loads it: identical greedy tokens, and |diff| <= 0.25. That bound is the bf16 arithmetic of the
 * reference, not ours: every HF activation is rounded to 8 mantissa bits (relative 2^-9), ~10
 * roundings per layer on logits of std ~3 give a typical error of a few 1e-2 and a tail near 0.15
 * (measured up to 0.185 over the three fixtures; the oracle's own bf16 incremental-vs-full self-check
 * differs by up to 0.06). */
#include <dirent.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "core/json.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/model.h"

typedef struct {
    int32_t prompt[4096];
    int n_prompt;
    int32_t greedy[64];
    int n_greedy;
    int n_decode, vocab, rows;
    int bf16;
    float *logits;     /* [rows, vocab] as HF ran the checkpoint (fp32 or bf16) */
    float *logits_f32; /* [rows, vocab] bf16 checkpoints only: HF with the weights upcast to fp32 */
} reference;

static int read_logits(const char *path, const reference *r, float **out) {
    char *buf = NULL;
    size_t len = 0;
    if (ckv_read_file(path, &buf, &len) != CKV_STATUS_OK || len != (size_t)r->rows * r->vocab * 4) {
        fprintf(stderr, "FAIL %s: %zu bytes, expected %d x %d floats\n", path, len, r->rows, r->vocab);
        free(buf);
        return 0;
    }
    *out = (float *)buf;
    return 1;
}

/* Compares rows [row0, row0 + n) of a reference with got [n, V]. */
static void compare_rows(const char *what, const float *got, const float *ref, int row0, int n, int V, double atol) {
    ckv_test_allclose(what, got, ref + (size_t)row0 * V, (size_t)n * V, atol, 0.0);
}

static int load_reference(const char *dir, reference *r) {
    char path[1024];
    snprintf(path, sizeof path, "%s/reference.json", dir);
    ckv_json *j = NULL;
    if (ckv_json_parse_file(&j, path) != CKV_STATUS_OK) {
        fprintf(stderr, "FAIL %s\n", ckv_error_message());
        return 0;
    }
    ckv_json *p = ckv_json_get(j, "prompt_ids"), *g = ckv_json_get(j, "greedy_ids");
    r->n_prompt = ckv_json_array_size(p);
    r->n_greedy = ckv_json_array_size(g);
    for (int i = 0; i < r->n_prompt && i < 4096; i++) r->prompt[i] = (int32_t)ckv_json_number(ckv_json_array_at(p, i));
    for (int i = 0; i < r->n_greedy && i < 64; i++) r->greedy[i] = (int32_t)ckv_json_number(ckv_json_array_at(g, i));
    r->n_decode = (int)ckv_json_number(ckv_json_get(j, "n_decode"));
    r->vocab = (int)ckv_json_number(ckv_json_get(j, "vocab_size"));
    r->rows = (int)ckv_json_number(ckv_json_get(j, "rows"));
    const char *dt = ckv_json_string(ckv_json_get(j, "dtype_run"));
    r->bf16 = dt && !strcmp(dt, "bfloat16");
    const char *f32c = ckv_json_string(ckv_json_get(j, "logits_file_f32compute"));
    char path2[1300];
    snprintf(path, sizeof path, "%s/%s", dir, ckv_json_string(ckv_json_get(j, "logits_file")));
    snprintf(path2, sizeof path2, "%s/%s", dir, f32c ? f32c : "");
    ckv_json_free(j);
    if (r->n_prompt < 1 || r->n_prompt > 4096 || r->rows != r->n_prompt + r->n_decode || r->n_greedy != r->n_decode + 1) {
        fprintf(stderr, "FAIL %s: inconsistent reference.json\n", dir);
        return 0;
    }
    if (r->bf16 && !f32c) {
        fprintf(stderr, "FAIL %s: a bf16 fixture needs logits_file_f32compute (rerun tools/oracle/regen.sh)\n", dir);
        return 0;
    }
    return read_logits(path, r, &r->logits) && (!r->bf16 || read_logits(path2, r, &r->logits_f32));
}

static void check_model(const char *dir, ckv_backend *be) {
    reference *r = calloc(1, sizeof *r);
    if (!load_reference(dir, r)) {
        ckv_test_failures++;
        free(r);
        return;
    }
    ckv_model *m = NULL;
    CHECK_OK(ckv_model_load(&m, dir, be, NULL));
    if (!m) {
        free(r->logits);
        free(r->logits_f32);
        free(r);
        return;
    }
    CHECK(m->cfg.vocab_size == r->vocab);
    int V = r->vocab, P = r->n_prompt, D = r->n_decode;
    /* strict reference: HF in fp32 (for bf16 checkpoints: bf16 weights upcast to fp32) */
    const float *strict = r->bf16 ? r->logits_f32 : r->logits;
    float *full = malloc(sizeof(float) * (size_t)P * V), *chunked = malloc(sizeof(float) * (size_t)P * V);
    float *dec = malloc(sizeof(float) * (size_t)D * V);
    const int chunks[] = {P, 64, 17};
    for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
        ckv_session s;
        CHECK_OK(ckv_session_init(&s, m, P + D, chunks[ci], 0));
        const float *last = NULL;
        float *dst = ci == 0 ? full : chunked;
        CHECK_OK(ckv_session_prefill(&s, r->prompt, P, dst, &last));
        char what[1500];
        snprintf(what, sizeof what, "%s prefill logits, chunk %d, vs HF fp32", dir, chunks[ci]);
        compare_rows(what, dst, strict, 0, P, V, 1e-4);
        if (ci > 0) {
            snprintf(what, sizeof what, "%s chunk %d vs one-shot prefill", dir, chunks[ci]);
            ckv_test_allclose(what, chunked, full, (size_t)P * V, 1e-5, 1e-5);
        }
        CHECK(last && memcmp(last, dst + (size_t)(P - 1) * V, sizeof(float) * V) == 0);
        /* greedy decode: feed the reference tokens, compare each row and the chosen token */
        int32_t tok = last ? ckv_argmax(last, V) : -1;
        CHECK_MSG(tok == r->greedy[0], "%s: first greedy token %d, expected %d", dir, tok, r->greedy[0]);
        for (int t = 0; t < D; t++) {
            const float *lg = NULL;
            CHECK_OK(ckv_session_decode(&s, r->greedy[t], &lg));
            if (!lg) break;
            memcpy(dec + (size_t)t * V, lg, sizeof(float) * V);
            int32_t g = ckv_argmax(lg, V);
            CHECK_MSG(g == r->greedy[t + 1], "%s: greedy token %d is %d, expected %d", dir, t + 1, g, r->greedy[t + 1]);
        }
        snprintf(what, sizeof what, "%s decode logits, chunk %d, vs HF fp32", dir, chunks[ci]);
        compare_rows(what, dec, strict, P, D, V, 1e-4);
        if (r->bf16) {
            snprintf(what, sizeof what, "%s prefill logits, chunk %d, vs HF computing in bf16", dir, chunks[ci]);
            compare_rows(what, dst, r->logits, 0, P, V, 0.25);
            snprintf(what, sizeof what, "%s decode logits, chunk %d, vs HF computing in bf16", dir, chunks[ci]);
            compare_rows(what, dec, r->logits, P, D, V, 0.25);
        }
        ckv_session_free(&s);
    }
    free(dec);
    free(full);
    free(chunked);
    ckv_model_free(m);
    free(r->logits);
    free(r->logits_f32);
    free(r);
}

int main(void) {
    char root[1024];
    snprintf(root, sizeof root, "%s/models", CKV_FIXTURES);
    DIR *d = opendir(root);
    if (!d) {
        fprintf(stderr, "FAIL: fixture directory %s is missing (run tools/oracle/regen.sh)\n", root);
        return 1;
    }
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 2));
    int n = 0;
    struct dirent *e;
    char names[64][256];
    while ((e = readdir(d)) && n < 64) {
        char full[1300];
        struct stat sb;
        snprintf(full, sizeof full, "%s/%s", root, e->d_name);
        if (e->d_name[0] == '.' || stat(full, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue; /* MANIFEST.json etc. */
        snprintf(names[n++], sizeof names[0], "%s", e->d_name);
    }
    closedir(d);
    for (int i = 0; i < n && be; i++) {
        char dir[1300];
        snprintf(dir, sizeof dir, "%s/%s", root, names[i]);
        check_model(dir, be);
    }
    CHECK_MSG(n >= 6, "expected >= 6 fixture models (3 architectures x F32/BF16), found %d", n);
    ckv_backend_free(be);
    return ckv_test_finish("test_model_fixtures");
}
