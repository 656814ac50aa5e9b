/* fixture.h - scaffolding shared by the tests over the committed fixtures: the Hugging Face reference
 * of a fixture model (tests/fixtures/models/<name>/reference.json and its logits), the model
 * directories, a prefill + greedy decode of the reference prompt, a press fixture's context and
 * question (tests/fixtures/presses/<name>/context.json), a press run at ratio 0.5 that records the
 * kept positions of every (layer, KV head) and the question logits, the comparison of two kept sets,
 * and the deterministic rows the KV cache tests fill a cache with.
 * It asserts nothing itself: every function returns a status (with ckv_error's message) or a value,
 * and the tests decide what to check. Tests only. */
#ifndef CKV_TEST_FIXTURE_H
#define CKV_TEST_FIXTURE_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "core/tensor.h"
#include "model/model.h"

enum { CKV_FIXTURE_MAX_PROMPT = 4096, CKV_FIXTURE_MAX_GREEDY = 64, CKV_FIXTURE_MAX_MODELS = 64 };

/* A fixture model's reference (written by tools/oracle/regen.sh from transformers). */
typedef struct {
    int32_t prompt[CKV_FIXTURE_MAX_PROMPT];
    int n_prompt;
    int32_t greedy[CKV_FIXTURE_MAX_GREEDY]; /* the first greedy token, then one per decode step */
    int n_greedy, n_decode, vocab, rows;    /* rows = n_prompt + n_decode, n_greedy = n_decode + 1 */
    int bf16;                               /* the checkpoint's dtype is bf16 */
    float *logits;     /* [rows, vocab] as HF ran the checkpoint (fp32 or bf16) */
    float *logits_f32; /* [rows, vocab] bf16 checkpoints: HF with the weights upcast to fp32; else NULL */
} ckv_fixture_ref;

/* Reads dir/reference.json and its logits files; ERR_FORMAT when they are inconsistent (a bf16
 * fixture without logits_file_f32compute included), ERR_IO when a file is missing or short. */
ckv_status ckv_fixture_ref_load(ckv_fixture_ref *r, const char *dir);
void ckv_fixture_ref_free(ckv_fixture_ref *r); /* zeroed is fine */
/* A heap reference loaded from dir, or NULL after printing "FAIL <why>" (the caller counts the
 * failure); ckv_fixture_ref_delete frees it (NULL is fine). */
ckv_fixture_ref *ckv_fixture_ref_new(const char *dir);
void ckv_fixture_ref_delete(ckv_fixture_ref *r);
/* HF computing in fp32: logits_f32 for bf16 checkpoints, else logits. */
const float *ckv_fixture_ref_strict(const ckv_fixture_ref *r);

/* The model directories under <fixtures>/models (readdir order; MANIFEST.json etc. skipped). */
typedef struct {
    int n;
    char name[CKV_FIXTURE_MAX_MODELS][256];
    char dir[CKV_FIXTURE_MAX_MODELS][1300];
} ckv_fixture_models;
ckv_status ckv_fixture_models_list(ckv_fixture_models *out, const char *fixtures);

/* Prefill of the reference prompt in chunks of `chunk`, then n_decode steps fed the reference's greedy
 * tokens: logits [rows, vocab]; greedy[0..n_decode] the argmax of the last prefill row and of each
 * step; *last_same (may be NULL) says whether the prefill's last-row logits equal row n_prompt - 1. */
ckv_status ckv_fixture_run(ckv_model *m, const ckv_fixture_ref *r, int chunk, float *logits, int32_t *greedy,
                           int *last_same);

/* A press fixture: the context and question ids and the fixture model it belongs to. */
typedef struct {
    int32_t ctx[CKV_FIXTURE_MAX_PROMPT];
    int L;
    int32_t q[CKV_FIXTURE_MAX_GREEDY];
    int nq;
    char model_dir[1024];
} ckv_fixture_context;
ckv_status ckv_fixture_context_load(ckv_fixture_context *c, const char *fixtures, const char *name);

/* Every press family the eviction tests run (kvpress names and ckv's combinations). */
extern const char *const ckv_fixture_presses[];
extern const size_t ckv_fixture_n_presses;

/* What a press kept. */
typedef struct {
    int n_layers, n_kv, L;
    int32_t *n_keep; // [n_layers, n_kv]
    int32_t *pos;    // [n_layers, n_kv, L] kept positions, ascending
    float *logits;   // [nq, vocab] question logits after the compressed prefill (NULL when nq = 0)
    unsigned long long *layer_count; // [n_layers] ckv_fixture_layer_counter() after each layer's compaction
                                     // (NULL unless the counter is set; a press that selects over the
                                     // model compacts every layer after the last one's scores)
} ckv_fixture_kept;

/* When set, ckv_fixture_run_press records its value after every layer's compaction (e.g. the CPU
 * execution layer's device allocation count: a press allocates at its first layer only). */
extern unsigned long long (*ckv_fixture_layer_counter)(void);

/* Compresses c's context with `spec` at ratio 0.5 (prefill chunks of 64) into a cache of kv_dtype,
 * records the kept sets, then prefills the question against the compressed cache (finch, query-aware:
 * context + question compressed together, the question its window, then the question fed again). `spec` is a press
 * spec, optionally followed by a space and press options KEY=VALUE,KEY=VALUE. */
ckv_status ckv_fixture_run_press(ckv_model *m, const char *spec, ckv_dtype kv_dtype, const ckv_fixture_context *c,
                                 ckv_fixture_kept *out);
void ckv_fixture_kept_free(ckv_fixture_kept *k); /* zeroed is fine */

/* b relative to a (same shape): heads whose sets differ, heads keeping another count, positions of a
 * missing from b, and a's total. */
typedef struct {
    int heads_diff, count_mismatch;
    long pos_diff, pos_total;
} ckv_fixture_kept_diff;
ckv_fixture_kept_diff ckv_fixture_kept_compare(const ckv_fixture_kept *a, const ckv_fixture_kept *b);

/* The KV cache tests' rows: token t's key element (h, j) is t * 100 + h * 10 + j, its value the
 * negation; k, v [n, n_kv, d] and pos [n] = 0 .. n - 1. */
float ckv_fixture_kval(int t, int h, int j);
void ckv_fixture_kv_rows(int n, int n_kv, int d, float *k, float *v, int32_t *pos);

#endif
