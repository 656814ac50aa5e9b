/* test_plan.c - the GPU memory plan against hand computations for two real shapes (the configs/
 * references): Llama-3.1-8B at 32K (tp 1, full cache; tp 2), Qwen2.5-32B (YaRN) at 130000 + 1024
 * tokens with 20% of the context kept (critical_adakv:snapkv at budget 0.2), bf16 weights and KV;
 * the backend's fixed workspaces on an H200 and an A100; the check against a limit names the part
 * that does not fit. Each expected value is written out
 * from the configuration's numbers, not from the code under test. */
#include "ckv_test.h"
#include "model/config.h"
#include "model/plan.h"

#define CONFIGS CKV_FIXTURES "/../../configs/models"

static void expect(const char *what, size_t got, size_t want) {
    CHECK_MSG(got == want, "%s: %zu bytes, expected %zu (diff %lld)", what, got, want, (long long)got - (long long)want);
}

static void test_llama_8b(void) {
    ckv_model_config c;
    CHECK_OK(ckv_config_load(&c, CONFIGS "/llama-3.1-8b-instruct"));
    ckv_plan_params p = {.tp = 1, .context = 32768, .new_tokens = 256, .chunk = 512, .weight_dtype = CKV_DTYPE_BF16,
                         .kv_dtype = CKV_DTYPE_BF16, .kept = 0, .window = 0, .nccl = 0};
    ckv_plan pl;
    CHECK_OK(ckv_plan_init(&pl, &c, &p, 0));
    /* 32 layers of q,o 4096x4096, k,v 1024x4096, gate,up,down 14336x4096; embed + lm_head 128256x4096;
     * bf16 = 2 bytes; norms 2 x 4096 per layer + final 4096 in fp32 */
    size_t mats = 32 * (2 * 4096ul * 4096 + 2 * 1024ul * 4096 + 3 * 14336ul * 4096) + 2 * 128256ul * 4096;
    expect("8B weights", pl.part[CKV_PLAN_WEIGHTS], mats * 2 + (32 * 2 * 4096ul + 4096) * 4);
    CHECK(pl.part[CKV_PLAN_WEIGHTS] == 16061054976ul);
    /* 32 layers x 8 KV heads x (32768 + 256) tokens x (K + V: 2 x 128 bf16 + int32 position) */
    expect("8B KV", pl.part[CKV_PLAN_KV], 32ul * 8 * 33024 * (2 * 128 * 2 + 4));
    expect("8B hidden", pl.part[CKV_PLAN_HIDDEN], 32768ul * 4096 * 4);
    /* chunk 512: xn, proj 4096; q, att 4096; k, v 1024; gate, up 14336 (fp32) + pos, ids + logits
     * 32 x 128256 */
    expect("8B workspace", pl.part[CKV_PLAN_WORKSPACE],
           (512ul * (2 * 4096 + 2 * 4096 + 2 * 1024 + 2 * 14336) + 32ul * 128256) * 4 + 2 * 512 * 4);
    expect("8B eviction", pl.part[CKV_PLAN_EVICT], 0);
    expect("8B comm", pl.part[CKV_PLAN_COMM], 0);
    /* an H200 (132 SMs, Hopper): cuBLAS 32 MiB; the GEMM's bf16 activations at their initial 512 x
     * 32768 (the widest chunk input, 512 x 14336, is smaller); split-K partials 2 waves x 132 SMs x 2
     * blocks x 64 rows x (128 + 2) fp32; the 8-byte counter */
    const size_t partials = 2ul * 132 * 2 * 64 * 130 * 4;
    CHECK(partials == 17571840ul);
    expect("8B backend", pl.part[CKV_PLAN_BACKEND], (32ul << 20) + 512ul * 32768 * 2 + partials + 8);
    size_t total = 16061054976ul + 32ul * 8 * 33024 * 516 + 32768ul * 4096 * 4 + 112889856ul +
                   ((32ul << 20) + (32ul << 20) + partials + 8) + (1ul << 30);
    expect("8B total", pl.total, total);
    CHECK_OK(ckv_plan_check(&pl, 141000000000ul));
    CHECK_OK(ckv_plan_check(&pl, 24ul << 30));
    /* 16 GiB: the weights (14.96 GiB) fit, the KV cache (4.06 GiB) on top does not */
    CHECK_FAILS(ckv_plan_check(&pl, 16ul << 30), CKV_STATUS_ERR_NOMEM, "part 'KV cache' (4.06 GiB) does not fit after");
    CHECK_FAILS(ckv_plan_check(&pl, 8ul << 30), CKV_STATUS_ERR_NOMEM, "rank 0 does not fit in GPU memory: part 'weights'");

    /* tp 2 with NCCL: rank 1 holds half of every sharded matrix, the whole embedding, half of the
     * lm_head (128256 / 2 rows), 4 KV heads */
    p.tp = 2;
    p.nccl = 1;
    CHECK_OK(ckv_plan_init(&pl, &c, &p, 1));
    size_t half = 32 * (2 * 2048ul * 4096 + 2 * 512ul * 4096 + 3 * 7168ul * 4096) + 128256ul * 4096 + 64128ul * 4096;
    expect("8B tp 2 weights", pl.part[CKV_PLAN_WEIGHTS], half * 2 + (32 * 2 * 4096ul + 4096) * 4);
    expect("8B tp 2 KV", pl.part[CKV_PLAN_KV], 32ul * 4 * 33024 * 516);
    /* logits gather workspace 32 rows x 64128 x (2 + 1) fp32 + one peer's NCCL buffers */
    expect("8B tp 2 comm", pl.part[CKV_PLAN_COMM], 32ul * 64128 * 3 * 4 + CKV_PLAN_NCCL_PER_PEER);
    /* an A100 (108 SMs, Ampere): cuBLAS 4 MiB, partials 2 x 108 x 2 x 64 x 130 x 4 */
    p.sms = 108;
    p.cc_major = 8;
    CHECK_OK(ckv_plan_init(&pl, &c, &p, 1));
    expect("8B tp 2 A100 backend", pl.part[CKV_PLAN_BACKEND], (4ul << 20) + 512ul * 32768 * 2 + 2ul * 108 * 2 * 64 * 130 * 4 + 8);
    p.sms = 0;
    p.cc_major = 0;
    CHECK_FAILS(ckv_plan_init(&pl, &c, &p, 2), CKV_STATUS_ERR_ARG, "rank 2 of tp 2");
}

static void test_qwen_32b(void) {
    ckv_model_config c;
    CHECK_OK(ckv_config_load(&c, CONFIGS "/qwen2.5-32b-instruct-128k"));
    CHECK(c.attention_bias == 1 && c.max_context == 131072);
    ckv_plan_params p = {.tp = 1, .context = 130000, .new_tokens = 1024, .chunk = 2048, .weight_dtype = CKV_DTYPE_BF16,
                         .kv_dtype = CKV_DTYPE_BF16, .kept = 26000, .window = 64, .nccl = 0};
    ckv_plan pl;
    CHECK_OK(ckv_plan_init(&pl, &c, &p, 0));
    /* 64 layers of q,o 5120x5120, k,v 1024x5120, MLP 3 x 27648x5120; embed + lm_head 152064x5120 (bf16);
     * fp32: 2 norms + q,k,v biases (5120 + 2 x 1024) per layer + the final norm */
    size_t mats = 64 * (2 * 5120ul * 5120 + 2 * 1024ul * 5120 + 3 * 27648ul * 5120) + 2 * 152064ul * 5120;
    size_t w = mats * 2 + (64 * (2 * 5120ul + 5120 + 2 * 1024) + 5120) * 4;
    expect("32B weights", pl.part[CKV_PLAN_WEIGHTS], w);
    const size_t row = 2 * 128 * 2 + 4;
    expect("32B KV full", pl.kv_full, 64ul * 8 * 131024 * row);
    expect("32B KV kept", pl.kv_kept, 64ul * 8 * (26000 + 1024) * row);
    /* prefill peak: every layer compressed + the last layer's full pool */
    expect("32B KV peak", pl.part[CKV_PLAN_KV], 64ul * 8 * 27024 * row + 8ul * 131024 * row);
    expect("32B hidden", pl.part[CKV_PLAN_HIDDEN], 130000ul * 5120 * 4 * 2);
    expect("32B workspace", pl.part[CKV_PLAN_WORKSPACE],
           (2048ul * (2 * 5120 + 2 * 5120 + 2 * 1024 + 2 * 27648) + 32ul * 152064) * 4 + 2 * 2048 * 4);
    /* 8 heads x 130000 rows x (score, norm, row) + gathered [8, 130000] + window logits 40 x 64 x 130000 */
    expect("32B eviction", pl.part[CKV_PLAN_EVICT], 8ul * 130000 * 12 + 8ul * 130000 * 4 + 40ul * 64 * 130000 * 4);
    /* chunk 2048: the down projection's input 2048 x 27648 in bf16 outgrows the GEMM workspace's
     * initial 512 x 32768 */
    expect("32B backend", pl.part[CKV_PLAN_BACKEND], (32ul << 20) + 2048ul * 27648 * 2 + 2ul * 132 * 2 * 64 * 130 * 4 + 8);
    /* the H200 (141 GB) holds it; an 80 GB card does not */
    CHECK_OK(ckv_plan_check(&pl, 141000000000ul));
    CHECK(pl.total < 90000000000ul);
    CHECK_FAILS(ckv_plan_check(&pl, 64ul << 30), CKV_STATUS_ERR_NOMEM, "part 'KV cache'");
    fprintf(stderr, "ok   32B@130000+1024, keep 26000: total %zu bytes (%.2f GiB)\n", pl.total,
            (double)pl.total / (1 << 30));
    ckv_plan_print(stderr, &c, &p);
    /* the full cache at tp 1 fits an H200 as well */
    p.kept = 0;
    CHECK_OK(ckv_plan_init(&pl, &c, &p, 0));
    expect("32B full KV", pl.part[CKV_PLAN_KV], 64ul * 8 * 131024 * row);
    CHECK_OK(ckv_plan_check(&pl, 141000000000ul));
    CHECK_FAILS(ckv_plan_check(&pl, 80000000000ul), CKV_STATUS_ERR_NOMEM, "part 'KV cache'");
}

int main(void) {
    test_llama_8b();
    test_qwen_32b();
    ckv_plan pl;
    ckv_model_config c;
    memset(&c, 0, sizeof c);
    ckv_plan_params bad = {.tp = 1, .context = 0, .new_tokens = 0, .chunk = 1, .weight_dtype = CKV_DTYPE_BF16,
                           .kv_dtype = CKV_DTYPE_BF16};
    CHECK_FAILS(ckv_plan_init(&pl, &c, &bad, 0), CKV_STATUS_ERR_ARG, "context 0");
    return ckv_test_finish("test_plan");
}
