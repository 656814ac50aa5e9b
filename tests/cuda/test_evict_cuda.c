/* test_evict_cuda.c - every press family through the CUDA backend keeps what the CPU backend keeps.
 * On the press fixtures (tests/fixtures/presses/<model>/context.json) each press compresses the
 * context at ratio 0.5 on the CPU backend and on the CUDA backend, both with the fixture's fp32
 * weights and an fp32 KV cache (so both compute the same keys up to fp32 summation order); the
 * kept positions of every (layer, KV head) must be identical (the SPEC tie rule decides exact ties
 * on both), and the question logits after the compressed prefill must agree to 1e-3. Near-ties
 * (candidates at a cut within the fp32 summation difference) get no tolerance: on these ~100-token
 * fixtures none occurs today; test_real_shapes counts them at 4,096 rows (docs/spec-eviction.md,
 * "Near-ties"). On the CPU execution layer, a layer after the first allocates device memory only for
 * its KV pools, full and compacted (the selection, the scorers' scratch and the compaction tables are
 * reused).
 *   test_evict_cuda cuda-emu   on the CPU execution layer (label cuda-emu)
 *   test_evict_cuda cuda       on a GPU (label cuda); skips without one
 *   test_evict_cuda cuda-emu [MODEL...] [PRESS...]   only those fixture models (llama_gqa, qwen2_bias)
 *                              and entries of the press list below (as written there) */
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_emu.h"
#include "ckv_test.h"
#include "common/fixture.h"
#include "cuda_test_backend.h"
#include "model/model.h"

/* beside the fixture presses: lagkv at its default lag (one partition of these contexts) and at
 * short lags (many partitions; cross scoring), leverage alone and under adakv (a few CPU seconds
 * each: lag 16, sketch 8 and critical:leverage were also identical when tried), layer_defensivekv
 * (its one top-k over every layer), composed (presses in turn on the compacted layer; wrapped members:
 * critical: after the first, chunkkv: twice, key_rerotation: twice, rotating in place each time), kvzip (its
 * context replay, in three chunks of these contexts; alone and with KVzip+) and key_rerotation (the
 * kept keys rotated in place on the device by kv_rerotate: the question logits read them; also over
 * critical:), finch (query-aware: context + question compressed, the question its window, fed again
 * after) and compactor (its chunked non-causal attention: one padded chunk at the default chunk_size,
 * several with a padded last one at 24 and 64; alone and under adakv); a press whose compression_ratios
 * give another depth than the model's is skipped for that model, saying so */
static const char *const extra[] = {"lagkv", "lagkv lag_size=32,cross_scoring=1", "adakv:lagkv lag_size=24",
                                    "leverage", "adakv:leverage", "layer_defensivekv",
                                    "composed:snapkv+knorm press_ratios=0.5,0.5", "composed:knorm+cur press_ratios=0.25,0.5",
                                    "composed:critical:snapkv+knorm press_ratios=0.5,0.5",
                                    "composed:snapkv+critical:knorm press_ratios=0.5,0.5",
                                    "composed:chunkkv:snapkv+chunkkv:keydiff press_ratios=0.5,0.5",
                                    "composed:key_rerotation:snapkv+key_rerotation:critical:knorm press_ratios=0.5,0.5",
                                    /* per_layer: members, each layer at its own ratio (3 ratios: llama_gqa's depth, 2: qwen2_bias's) */
                                    "composed:per_layer:snapkv+knorm compression_ratios=0.25,0.5,0.75,press_ratios=0.5",
                                    "composed:snapkv+per_layer:cur compression_ratios=0.25,0.75,press_ratios=0.5",
                                    "kvzip repeat_ids=13,13,85,104,276,repeat_next_ids=13,13,85,301,suffix_ids=13,chunk_size=100",
                                    "kvzip repeat_ids=13,13,85,104,276,repeat_next_ids=13,13,85,301,suffix_ids=13,chunk_size=100,"
                                    "kvzip_plus_normalization=1",
                                    "key_rerotation:snapkv", "key_rerotation:streaming_llm",
                                    "key_rerotation:critical:snapkv", "finch",
                                    "finch chunk_length=64,normalize_scores=0,rerotate_keys=0", "compactor",
                                    "compactor chunk_size=24", "adakv:compactor chunk_size=64,blending=0.5"};
static const size_t n_extra = sizeof extra / sizeof extra[0];

static const char *const models[] = {"llama_gqa", "qwen2_bias"};

static int is_model(const char *s) { return strcmp(s, models[0]) == 0 || strcmp(s, models[1]) == 0; }

/* Whether `what` (a model when model != 0, else a press) is selected by argv[2..]: named there, or
 * nothing of its kind is named. */
static int selected(const char *what, int model, int argc, char **argv) {
    int named = 0;
    for (int i = 2; i < argc; i++)
        if (is_model(argv[i]) == model) {
            named = 1;
            if (strcmp(argv[i], what) == 0) return 1;
        }
    return !named;
}

static void check_model(ckv_backend *dev, ckv_backend *cpu, const char *name, int argc, char **argv) {
    static ckv_fixture_context c;
    const ckv_status st = ckv_fixture_context_load(&c, CKV_FIXTURES, name);
    CHECK_OK(st);
    if (st != CKV_STATUS_OK) return;
    const ckv_model_opts f32 = {CKV_DTYPE_F32};
    ckv_model *md = NULL, *mc = NULL;
    CHECK_OK(ckv_model_load_opts(&md, c.model_dir, dev, NULL, &f32));
    CHECK_OK(ckv_model_load(&mc, c.model_dir, cpu, NULL));
    for (size_t p = 0; md && mc && p < ckv_fixture_n_presses + n_extra; p++) {
        const char *press = p < ckv_fixture_n_presses ? ckv_fixture_presses[p] : extra[p - ckv_fixture_n_presses];
        if (!selected(press, 0, argc, argv)) continue;
        ckv_fixture_kept a = {0}, b = {0}; /* a: the device, b: the cpu backend */
        ckv_status sb = ckv_fixture_run_press(mc, press, CKV_DTYPE_F32, &c, &b), sa = CKV_STATUS_OK;
        if (sb == CKV_STATUS_ERR_ARG && strstr(press, "compression_ratios=") && strstr(ckv_error_message(), "the model has")) {
            fprintf(stderr, "skip %s %s: %s (its ratios are the other fixture model's)\n", name, press, ckv_error_message());
            ckv_error_clear();
            continue;
        }
        CHECK_OK(sb);
        if (sb == CKV_STATUS_OK) {
            sa = ckv_fixture_run_press(md, press, CKV_DTYPE_F32, &c, &a);
            CHECK_OK(sa);
        }
        if (sb == CKV_STATUS_OK && sa == CKV_STATUS_OK) {
            /* positions of the CPU sets not kept on the device */
            const ckv_fixture_kept_diff d = ckv_fixture_kept_compare(&b, &a);
            const int cells = a.n_layers * a.n_kv;
            CHECK_MSG(d.heads_diff == 0,
                      "%s %s: %d of %d (layer, KV head) kept sets differ from the cpu backend (%ld of %ld positions)",
                      name, press, d.heads_diff, cells, d.pos_diff, d.pos_total);
            if (!d.heads_diff)
                fprintf(stderr, "ok   %s %s %s: %d kept sets (%ld positions) identical to the cpu backend\n", dev->name,
                        name, press, cells, d.pos_total);
            /* device scratch is allocated at the first layer (the selection, the scorers' arena, the
             * compaction's tables) and reused: a later layer allocates only its two KV pools of 3
             * buffers (keys, values, positions), the full one its prefill fills and the compacted one
             * (the pools are allocated layer by layer so that one full layer is the peak); a composed
             * press compacts once more per press after the first (P1+P2+...: one more pool per '+') */
            int pools = 2;
            for (const char *q = press; *q && *q != ' '; q++) pools += *q == '+';
            for (int l = 1; a.layer_count && l < md->cfg.n_layers; l++)
                CHECK_MSG(a.layer_count[l] - a.layer_count[l - 1] <= 3ull * (unsigned)pools, "%s %s: layer %d made %llu "
                          "device allocations (its %d KV pools take %d)", name, press, l,
                          a.layer_count[l] - a.layer_count[l - 1], pools, 3 * pools);
            char what[160];
            snprintf(what, sizeof what, "%s %s %s: question logits vs cpu", dev->name, name, press);
            ckv_test_allclose(what, a.logits, b.logits, (size_t)c.nq * md->cfg.vocab_size, 1e-3, 0.0);
        }
        ckv_fixture_kept_free(&a);
        ckv_fixture_kept_free(&b);
    }
    ckv_model_free(md);
    ckv_model_free(mc);
}

int main(int argc, char **argv) {
    ckv_backend *dev = NULL, *cpu = NULL;
    const int rc = cuda_test_open(argc, argv, "test_evict_cuda", &dev);
    if (rc >= 0) return rc;
    CHECK_OK(ckv_backend_init(&cpu, "cpu", 1));
    if (argc > 1 && strcmp(argv[1], "cuda-emu") == 0) ckv_fixture_layer_counter = ckv_cuda_emu_alloc_calls;
    for (int i = 2; i < argc; i++) { /* a name that selects nothing would test nothing */
        int known = is_model(argv[i]);
        for (size_t p = 0; p < ckv_fixture_n_presses + n_extra; p++)
            known |= strcmp(argv[i], p < ckv_fixture_n_presses ? ckv_fixture_presses[p] : extra[p - ckv_fixture_n_presses]) == 0;
        CHECK_MSG(known, "'%s' is neither a fixture model nor a press of the list", argv[i]);
    }
    if (cpu) {
        for (int m = 0; m < 2; m++)
            if (selected(models[m], 1, argc, argv)) check_model(dev, cpu, models[m], argc, argv);
    }
    CHECK_OK(dev->ops->sync(dev));
    ckv_backend_free(dev);
    ckv_backend_free(cpu);
    return ckv_test_finish("test_evict_cuda");
}
