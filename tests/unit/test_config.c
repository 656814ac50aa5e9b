/* test_config.c - config.json / generation_config.json parsing: real-model shapes (Llama-3.1-8B,
 * Qwen2.5-7B and -0.5B, Mistral-7B v0.1 and v0.3), defaults, the transformers-5 spellings, loading
 * from a directory written at run time, parameter counts, and one malformed or unsupported config
 * per check, each required to fail with the right status and a message naming the file and key. */
#define _POSIX_C_SOURCE 200809L
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckv_test.h"
#include "core/status.h"
#include "model/config.h"

#define WHAT "tiny/config.json"

/* ---- a small Llama config with overrides ------------------------------------------------------- */

static const char *const base_keys[][2] = {
    {"architectures", "[\"LlamaForCausalLM\"]"},
    {"vocab_size", "1000"},
    {"hidden_size", "256"},
    {"intermediate_size", "512"},
    {"num_hidden_layers", "2"},
    {"num_attention_heads", "4"},
    {"num_key_value_heads", "2"},
    {"max_position_embeddings", "2048"},
    {"rms_norm_eps", "1e-05"},
    {"hidden_act", "\"silu\""},
};

static char cfg_buf[8192];

/* The base config with (key, raw JSON value) pairs replacing or adding keys; a NULL value removes
 * the key. The list ends with NULL. */
static const char *mk(const char *key, ...) {
    const char *keys[32], *vals[32];
    int n = 0;
    va_list ap;
    va_start(ap, key);
    for (const char *k = key; k && n < 32; k = va_arg(ap, const char *)) {
        keys[n] = k;
        vals[n] = va_arg(ap, const char *);
        n++;
    }
    va_end(ap);
    size_t len = 0;
    int first = 1;
    len += (size_t)snprintf(cfg_buf + len, sizeof cfg_buf - len, "{");
    for (size_t b = 0; b < sizeof base_keys / sizeof base_keys[0]; b++) {
        const char *v = base_keys[b][1];
        for (int i = 0; i < n; i++)
            if (strcmp(keys[i], base_keys[b][0]) == 0) v = vals[i];
        if (!v) continue;
        len += (size_t)snprintf(cfg_buf + len, sizeof cfg_buf - len, "%s\"%s\": %s", first ? "" : ", ",
                                base_keys[b][0], v);
        first = 0;
    }
    for (int i = 0; i < n; i++) {
        int in_base = 0;
        for (size_t b = 0; b < sizeof base_keys / sizeof base_keys[0]; b++)
            in_base |= strcmp(keys[i], base_keys[b][0]) == 0;
        if (in_base || !vals[i]) continue;
        len += (size_t)snprintf(cfg_buf + len, sizeof cfg_buf - len, "%s\"%s\": %s", first ? "" : ", ", keys[i],
                                vals[i]);
        first = 0;
    }
    snprintf(cfg_buf + len, sizeof cfg_buf - len, "}");
    return cfg_buf;
}

static ckv_model_config cfg;

static ckv_status parse(const char *json) { return ckv_config_parse(&cfg, json, NULL, WHAT); }

/* ---- real-model configs ------------------------------------------------------------------------ */

static const char llama31_8b[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"attention_bias\": false, \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 128000, \"eos_token_id\": 128001, \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 14336, \"max_position_embeddings\": 131072,"
    " \"mlp_bias\": false, \"model_type\": \"llama\", \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"pretraining_tp\": 1, \"rms_norm_eps\": 1e-05, \"rope_scaling\": {\"factor\": 8.0,"
    " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192,"
    " \"rope_type\": \"llama3\"}, \"rope_theta\": 500000.0, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.43.0.dev0\", \"use_cache\": true,"
    " \"vocab_size\": 128256}";
static const char llama31_gen[] =
    "{\"bos_token_id\": 128000, \"do_sample\": true, \"eos_token_id\": [128001, 128008, 128009],"
    " \"temperature\": 0.6, \"top_p\": 0.9}";

static const char qwen25_7b[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"attention_dropout\": 0.0, \"bos_token_id\": 151643,"
    " \"eos_token_id\": 151645, \"hidden_act\": \"silu\", \"hidden_size\": 3584, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 18944, \"max_position_embeddings\": 32768, \"max_window_layers\": 28,"
    " \"model_type\": \"qwen2\", \"num_attention_heads\": 28, \"num_hidden_layers\": 28,"
    " \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 131072,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"use_cache\": true,"
    " \"use_sliding_window\": false, \"vocab_size\": 152064}";
static const char qwen25_gen[] =
    "{\"bos_token_id\": 151643, \"pad_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": [151645, 151643],"
    " \"repetition_penalty\": 1.05, \"temperature\": 0.7}";

static const char qwen25_05b[] =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"bos_token_id\": 151643, \"eos_token_id\": 151645,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 896, \"intermediate_size\": 4864,"
    " \"max_position_embeddings\": 32768, \"max_window_layers\": 21, \"num_attention_heads\": 14,"
    " \"num_hidden_layers\": 24, \"num_key_value_heads\": 2, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
    " \"sliding_window\": 32768, \"tie_word_embeddings\": true, \"torch_dtype\": \"bfloat16\","
    " \"use_sliding_window\": false, \"vocab_size\": 151936}";

static const char mistral_v01[] =
    "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"intermediate_size\": 14336,"
    " \"max_position_embeddings\": 32768, \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 10000.0, \"sliding_window\": 4096,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"vocab_size\": 32000}";

static const char mistral_v03[] =
    "{\"architectures\": [\"MistralForCausalLM\"], \"bos_token_id\": 1, \"eos_token_id\": 2,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"intermediate_size\": 14336,"
    " \"max_position_embeddings\": 32768, \"num_attention_heads\": 32, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000.0, \"sliding_window\": null,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"vocab_size\": 32768}";

static void test_real_models(void) {
    CHECK_OK(ckv_config_parse(&cfg, llama31_8b, llama31_gen, "llama/config.json"));
    CHECK(cfg.arch == CKV_ARCH_LLAMA && strcmp(cfg.arch_name, "LlamaForCausalLM") == 0);
    CHECK(cfg.vocab_size == 128256 && cfg.hidden_size == 4096 && cfg.intermediate_size == 14336);
    CHECK(cfg.n_layers == 32 && cfg.n_heads == 32 && cfg.n_kv_heads == 8 && cfg.head_dim == 128);
    CHECK(cfg.max_position_embeddings == 131072 && cfg.rms_norm_eps == 1e-5);
    CHECK(cfg.attention_bias == 0 && cfg.tie_word_embeddings == 0 && cfg.sliding_window == 0);
    CHECK(cfg.dtype == CKV_DTYPE_BF16);
    CHECK(cfg.rope.type == CKV_ROPE_TYPE_LLAMA3 && cfg.rope.theta == 500000.0 && cfg.rope.factor == 8.0);
    CHECK(cfg.rope.low_freq_factor == 1.0 && cfg.rope.high_freq_factor == 4.0);
    CHECK(cfg.rope.original_max_position == 8192);
    CHECK(cfg.bos_token_id == 128000);
    CHECK(cfg.n_eos == 3 && cfg.eos_ids[0] == 128001 && cfg.eos_ids[1] == 128008 && cfg.eos_ids[2] == 128009);
    CHECK_MSG(ckv_config_param_count(&cfg) == 8030261248LL, "%lld", ckv_config_param_count(&cfg));

    CHECK_OK(ckv_config_parse(&cfg, qwen25_7b, qwen25_gen, "qwen/config.json"));
    CHECK(cfg.arch == CKV_ARCH_QWEN2 && cfg.attention_bias == 1 && cfg.head_dim == 128);
    CHECK(cfg.sliding_window == 0 && cfg.rope.type == CKV_ROPE_TYPE_DEFAULT && cfg.rope.theta == 1e6);
    CHECK(cfg.rms_norm_eps == 1e-6 && cfg.bos_token_id == 151643);
    CHECK(cfg.n_eos == 2 && cfg.eos_ids[0] == 151645 && cfg.eos_ids[1] == 151643);
    CHECK_MSG(ckv_config_param_count(&cfg) == 7615616512LL, "%lld", ckv_config_param_count(&cfg));

    CHECK_OK(ckv_config_parse(&cfg, qwen25_05b, NULL, "qwen05/config.json"));
    CHECK(cfg.tie_word_embeddings == 1 && cfg.head_dim == 64 && cfg.n_eos == 1 && cfg.eos_ids[0] == 151645);
    CHECK_MSG(ckv_config_param_count(&cfg) == 494032768LL, "%lld", ckv_config_param_count(&cfg));

    CHECK_OK(ckv_config_parse(&cfg, mistral_v01, NULL, "mistral/config.json"));
    CHECK(cfg.arch == CKV_ARCH_MISTRAL && cfg.sliding_window == 4096 && cfg.attention_bias == 0);
    CHECK(cfg.bos_token_id == 1 && cfg.n_eos == 1 && cfg.eos_ids[0] == 2);
    CHECK_MSG(ckv_config_param_count(&cfg) == 7241732096LL, "%lld", ckv_config_param_count(&cfg));
    CHECK_OK(ckv_config_parse(&cfg, mistral_v03, NULL, "mistral3/config.json"));
    CHECK(cfg.sliding_window == 0 && cfg.rope.theta == 1e6 && cfg.vocab_size == 32768);

    CHECK(strcmp(ckv_arch_name(CKV_ARCH_LLAMA), "LlamaForCausalLM") == 0);
    CHECK(strcmp(ckv_arch_name(CKV_ARCH_MISTRAL), "MistralForCausalLM") == 0);
    CHECK(strcmp(ckv_arch_name(CKV_ARCH_QWEN2), "Qwen2ForCausalLM") == 0);
}

/* ---- defaults and alternative spellings -------------------------------------------------------- */

static void test_defaults(void) {
    CHECK_OK(parse(mk("num_key_value_heads", NULL, "max_position_embeddings", NULL, "rms_norm_eps", NULL,
                      "hidden_act", NULL, NULL)));
    CHECK(cfg.n_kv_heads == 4 && cfg.head_dim == 64 && cfg.max_position_embeddings == 2048);
    CHECK(cfg.rms_norm_eps == 1e-6 && cfg.tie_word_embeddings == 0 && cfg.attention_bias == 0);
    CHECK(cfg.rope.type == CKV_ROPE_TYPE_DEFAULT && cfg.rope.theta == 10000.0 && cfg.rope.factor == 1.0);
    CHECK(cfg.dtype == CKV_DTYPE_F32 && cfg.bos_token_id == -1 && cfg.n_eos == 0 && cfg.sliding_window == 0);
    /* class defaults for max_position_embeddings and Mistral's sliding window */
    CHECK_OK(parse(mk("architectures", "[\"MistralForCausalLM\"]", "max_position_embeddings", NULL, NULL)));
    CHECK(cfg.max_position_embeddings == 131072 && cfg.sliding_window == 4096);
    CHECK_OK(parse(mk("architectures", "[\"Qwen2ForCausalLM\"]", "max_position_embeddings", NULL, NULL)));
    CHECK(cfg.max_position_embeddings == 32768 && cfg.attention_bias == 1 && cfg.sliding_window == 0);

    /* explicit head_dim (Mistral-Nemo style) and null head_dim */
    CHECK_OK(parse(mk("head_dim", "128", NULL)));
    CHECK(cfg.head_dim == 128);
    CHECK_OK(parse(mk("head_dim", "null", NULL)));
    CHECK(cfg.head_dim == 64);

    /* transformers 5: dtype and rope_parameters (theta inside wins over the top level) */
    CHECK_OK(parse(mk("dtype", "\"float16\"", "torch_dtype", "\"bfloat16\"", "rope_theta", "5.0",
                      "rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": 250000.0}", NULL)));
    CHECK(cfg.dtype == CKV_DTYPE_F16 && cfg.rope.theta == 250000.0 && cfg.rope.type == CKV_ROPE_TYPE_DEFAULT);
    CHECK_OK(parse(mk("torch_dtype", "\"float32\"", "rope_parameters",
                      "{\"rope_type\": \"linear\", \"factor\": 2.0}", "rope_theta", "20000", NULL)));
    CHECK(cfg.dtype == CKV_DTYPE_F32 && cfg.rope.type == CKV_ROPE_TYPE_LINEAR && cfg.rope.factor == 2.0);
    CHECK(cfg.rope.theta == 20000.0);
    /* rope_scaling wins over rope_parameters; an empty rope_scaling does not */
    CHECK_OK(parse(mk("rope_scaling", "{\"type\": \"linear\", \"factor\": 3.0}", "rope_parameters",
                      "{\"rope_type\": \"linear\", \"factor\": 2.0}", NULL)));
    CHECK(cfg.rope.factor == 3.0);
    CHECK_OK(parse(mk("rope_scaling", "{}", "rope_parameters", "{\"rope_type\": \"linear\", \"factor\": 2.0}",
                      NULL)));
    CHECK(cfg.rope.factor == 2.0);
    CHECK_OK(parse(mk("rope_scaling", "null", NULL)));
    CHECK(cfg.rope.type == CKV_ROPE_TYPE_DEFAULT);

    /* yarn: defaults, null factor = max_position / original, top-level original wins */
    CHECK_OK(parse(mk("rope_scaling",
                      "{\"type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 512}", NULL)));
    CHECK(cfg.rope.type == CKV_ROPE_TYPE_YARN && cfg.rope.factor == 4.0 && cfg.rope.original_max_position == 512);
    CHECK(cfg.rope.beta_fast == 32.0 && cfg.rope.beta_slow == 1.0 && cfg.rope.truncate == 1);
    CHECK(cfg.rope.mscale == 0.0 && cfg.rope.mscale_all_dim == 0.0 && cfg.rope.attention_factor == 0.0);
    CHECK_OK(parse(mk("rope_scaling",
                      "{\"rope_type\": \"yarn\", \"factor\": null, \"original_max_position_embeddings\": 512,"
                      " \"beta_fast\": 16, \"beta_slow\": 0, \"mscale\": 0.707, \"mscale_all_dim\": 0.707,"
                      " \"attention_factor\": 1.5, \"truncate\": false}", NULL)));
    CHECK(cfg.rope.factor == 4.0 && cfg.rope.beta_fast == 16.0 && cfg.rope.beta_slow == 1.0);
    CHECK(cfg.rope.mscale == 0.707 && cfg.rope.mscale_all_dim == 0.707 && cfg.rope.attention_factor == 1.5);
    CHECK(cfg.rope.truncate == 0);
    CHECK_OK(parse(mk("original_max_position_embeddings", "1024", "rope_scaling",
                      "{\"type\": \"yarn\", \"factor\": 2.0, \"original_max_position_embeddings\": 512}", NULL)));
    CHECK(cfg.rope.original_max_position == 1024);
    CHECK_OK(parse(mk("rope_scaling", "{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1,"
                      " \"high_freq_factor\": 4}", NULL)));
    CHECK(cfg.rope.original_max_position == 2048); /* defaults to max_position_embeddings */

    /* Llama attention_bias also puts a bias on o_proj: q+k+v+o bias per layer */
    CHECK_OK(parse(mk("attention_bias", "true", "tie_word_embeddings", "true", NULL)));
    CHECK(cfg.attention_bias == 1 && cfg.tie_word_embeddings == 1);
    long long D = 256, F = 512, V = 1000, q = 256, kv = 128;
    long long layer = D * q + 2 * D * kv + q * D + 3 * D * F + 2 * D + q + 2 * kv + D;
    CHECK_MSG(ckv_config_param_count(&cfg) == V * D + 2 * layer + D, "%lld", ckv_config_param_count(&cfg));

    /* Qwen2 sliding window: all layers, none, or given per layer */
    CHECK_OK(parse(mk("architectures", "[\"Qwen2ForCausalLM\"]", "use_sliding_window", "true", "sliding_window",
                      "64", "max_window_layers", "0", NULL)));
    CHECK(cfg.sliding_window == 64);
    CHECK_OK(parse(mk("architectures", "[\"Qwen2ForCausalLM\"]", "use_sliding_window", "true", "sliding_window",
                      "64", "max_window_layers", "2", NULL)));
    CHECK(cfg.sliding_window == 0);
    CHECK_OK(parse(mk("architectures", "[\"Qwen2ForCausalLM\"]", "use_sliding_window", "true", "sliding_window",
                      "64", "layer_types", "[\"sliding_attention\", \"sliding_attention\"]", NULL)));
    CHECK(cfg.sliding_window == 64);
    CHECK_OK(parse(mk("architectures", "[\"Qwen2ForCausalLM\"]", "use_sliding_window", "false", "sliding_window",
                      "64", "max_window_layers", "0", NULL)));
    CHECK(cfg.sliding_window == 0);
    CHECK_OK(parse(mk("architectures", "[\"MistralForCausalLM\"]", "sliding_window", "512", NULL)));
    CHECK(cfg.sliding_window == 512);

    /* eos as a list, duplicates merged with the generation config; bos from the generation config */
    CHECK_OK(ckv_config_parse(&cfg, mk("eos_token_id", "[5, 6, 5]", NULL), "{\"eos_token_id\": 6, \"bos_token_id\": 3}",
                              WHAT));
    CHECK(cfg.n_eos == 2 && cfg.eos_ids[0] == 5 && cfg.eos_ids[1] == 6 && cfg.bos_token_id == 3);
    CHECK_OK(ckv_config_parse(&cfg, mk("bos_token_id", "1", "eos_token_id", "null", NULL),
                              "{\"eos_token_id\": [7, 8], \"bos_token_id\": 3}", WHAT));
    CHECK(cfg.n_eos == 2 && cfg.eos_ids[0] == 7 && cfg.eos_ids[1] == 8 && cfg.bos_token_id == 1);
    CHECK_OK(parse(mk("hidden_act", "\"swish\"", "hidden_size", "256.0", NULL)));
    CHECK(cfg.hidden_size == 256);
}

/* ---- malformed and unsupported ----------------------------------------------------------------- */

#define FAILS(json, code, needle) CHECK_FAILS(parse(json), code, needle)

static void test_malformed(void) {
    const ckv_status F = CKV_STATUS_ERR_FORMAT, U = CKV_STATUS_ERR_UNSUPPORTED;
    FAILS("{\"architectures\": [\"LlamaForCausalLM\"], ", F, WHAT ": invalid JSON");
    FAILS("[1, 2]", F, WHAT ": top level must be an object");
    FAILS(mk("architectures", NULL, NULL), F, WHAT ": missing key 'architectures'");
    FAILS(mk("architectures", "[]", NULL), F, WHAT ": key 'architectures' must be a non-empty list");
    FAILS(mk("architectures", "\"LlamaForCausalLM\"", NULL), F, "key 'architectures'");
    FAILS(mk("architectures", "[\"GPT2LMHeadModel\"]", NULL), U, WHAT ": architectures[0] 'GPT2LMHeadModel'");
    FAILS(mk("architectures", "[\"Qwen3ForCausalLM\"]", NULL), U, "'Qwen3ForCausalLM' is not supported");
    FAILS(mk("vocab_size", NULL, NULL), F, WHAT ": missing key 'vocab_size'");
    FAILS(mk("hidden_size", NULL, NULL), F, WHAT ": missing key 'hidden_size'");
    FAILS(mk("intermediate_size", "null", NULL), F, WHAT ": missing key 'intermediate_size'");
    FAILS(mk("num_hidden_layers", NULL, NULL), F, WHAT ": missing key 'num_hidden_layers'");
    FAILS(mk("num_attention_heads", NULL, NULL), F, WHAT ": missing key 'num_attention_heads'");
    FAILS(mk("hidden_size", "0", NULL), F, WHAT ": key 'hidden_size' must be positive (got 0)");
    FAILS(mk("vocab_size", "-5", NULL), F, WHAT ": key 'vocab_size' must be positive (got -5)");
    FAILS(mk("hidden_size", "256.5", NULL), F, WHAT ": key 'hidden_size' must be an integer");
    FAILS(mk("hidden_size", "\"256\"", NULL), F, WHAT ": key 'hidden_size' must be an integer");
    FAILS(mk("num_hidden_layers", "1e12", NULL), F, WHAT ": key 'num_hidden_layers' must be an integer");
    FAILS(mk("num_key_value_heads", "3", NULL), F, WHAT ": key 'num_key_value_heads' (3) must divide");
    FAILS(mk("num_key_value_heads", "0", NULL), F, WHAT ": key 'num_key_value_heads' must be positive");
    FAILS(mk("head_dim", "33", NULL), F, WHAT ": key 'head_dim' must be positive and even (got 33)");
    FAILS(mk("head_dim", "-2", NULL), F, WHAT ": key 'head_dim' must be positive and even");
    FAILS(mk("hidden_size", "132", NULL), F, "key 'head_dim' must be positive and even (got 33, hidden_size / heads)");
    FAILS(mk("max_position_embeddings", "0", NULL), F, WHAT ": key 'max_position_embeddings' must be positive");
    FAILS(mk("rms_norm_eps", "0", NULL), CKV_STATUS_ERR_RANGE, WHAT ": rms_norm_eps 0 is outside [1e-12, 0.1]");
    FAILS(mk("rms_norm_eps", "1e300", NULL), CKV_STATUS_ERR_RANGE, WHAT ": rms_norm_eps 1e+300 is outside");
    FAILS(mk("rms_norm_eps", "-1e-5", NULL), CKV_STATUS_ERR_RANGE, WHAT ": rms_norm_eps -1e-05 is outside");
    FAILS(mk("rms_norm_eps", "1e-13", NULL), CKV_STATUS_ERR_RANGE, WHAT ": rms_norm_eps 1e-13 is outside");
    FAILS(mk("rms_norm_eps", "0.2", NULL), CKV_STATUS_ERR_RANGE, WHAT ": rms_norm_eps 0.2 is outside");
    CHECK_OK(parse(mk("rms_norm_eps", "1e-12", NULL)));
    CHECK_OK(parse(mk("rms_norm_eps", "0.1", NULL)));
    /* ids outside the vocabulary (1000 tokens) */
    FAILS(mk("bos_token_id", "1000", NULL), CKV_STATUS_ERR_RANGE, WHAT ": bos_token_id 1000 is outside the vocabulary of 1000");
    FAILS(mk("eos_token_id", "[2, 5000]", NULL), CKV_STATUS_ERR_RANGE, WHAT ": eos_token_id 5000 is outside the vocabulary");
    CHECK_OK(parse(mk("bos_token_id", "999", "eos_token_id", "[0, 999]", NULL)));
    CHECK_FAILS(ckv_config_parse(&cfg, mk(NULL), "{\"eos_token_id\": 1001}", WHAT), CKV_STATUS_ERR_RANGE,
                "eos_token_id 1001 is outside the vocabulary");
    /* strict JSON: a repeated key, bytes after the object */
    {
        char text[sizeof cfg_buf + 32];
        snprintf(text, sizeof text, "{\"vocab_size\": 50, %s", mk(NULL) + 1);
        CHECK_FAILS(parse(text), F, WHAT ": duplicate key 'vocab_size' in one object");
        snprintf(text, sizeof text, "%s garbage", mk(NULL));
        CHECK_FAILS(parse(text), F, WHAT ": unexpected bytes after the JSON value");
        snprintf(text, sizeof text, "%s}", mk(NULL));
        CHECK_FAILS(parse(text), F, WHAT ": unexpected bytes after the JSON value");
        snprintf(text, sizeof text, "%s \n\t\r\n", mk(NULL));
        CHECK_OK(parse(text));
    }
    FAILS(mk("rms_norm_eps", "\"1e-5\"", NULL), F, WHAT ": key 'rms_norm_eps' must be a number");
    FAILS(mk("hidden_act", "\"gelu\"", NULL), U, WHAT ": key 'hidden_act' is 'gelu'");
    FAILS(mk("hidden_act", "3", NULL), F, WHAT ": key 'hidden_act' must be a string");
    FAILS(mk("mlp_bias", "true", NULL), U, WHAT ": key 'mlp_bias' is true");
    FAILS(mk("attention_bias", "\"yes\"", NULL), F, WHAT ": key 'attention_bias' must be true or false");
    FAILS(mk("tie_word_embeddings", "1", NULL), F, WHAT ": key 'tie_word_embeddings' must be true or false");

    /* rope */
    FAILS(mk("rope_theta", "0", NULL), F, WHAT ": key 'rope_theta' must be positive");
    FAILS(mk("rope_theta", "\"big\"", NULL), F, WHAT ": key 'rope_theta' must be a number");
    FAILS(mk("rope_parameters", "{\"rope_type\": \"default\", \"rope_theta\": -1}", NULL), F,
          WHAT ": key 'rope_parameters.rope_theta' must be positive");
    FAILS(mk("rope_scaling", "\"linear\"", NULL), F, WHAT ": key 'rope_scaling' must be an object or null");
    FAILS(mk("rope_parameters", "[1]", NULL), F, WHAT ": key 'rope_parameters' must be an object or null");
    FAILS(mk("rope_scaling", "{\"type\": \"dynamic\", \"factor\": 2.0}", NULL), U,
          WHAT ": key 'rope_scaling.type' is 'dynamic'");
    FAILS(mk("rope_scaling", "{\"rope_type\": \"longrope\", \"factor\": 2.0}", NULL), U,
          WHAT ": key 'rope_scaling.rope_type' is 'longrope'");
    FAILS(mk("rope_scaling", "{\"rope_type\": 7}", NULL), F, WHAT ": key 'rope_scaling.rope_type' must be a string");
    FAILS(mk("rope_scaling", "{\"type\": \"linear\"}", NULL), F, WHAT ": missing key 'rope_scaling.factor'");
    FAILS(mk("rope_scaling", "{\"type\": \"linear\", \"factor\": 0}", NULL), F,
          WHAT ": key 'rope_scaling.factor' must be positive");
    FAILS(mk("rope_scaling", "{\"type\": \"linear\", \"factor\": -2.0}", NULL), F,
          WHAT ": key 'rope_scaling.factor' must be positive");
    FAILS(mk("rope_scaling", "{\"type\": \"linear\", \"factor\": null}", NULL), F,
          WHAT ": missing key 'rope_scaling.factor'");
    FAILS(mk("rope_scaling", "{\"type\": \"llama3\", \"factor\": 8.0, \"high_freq_factor\": 4.0}", NULL), F,
          WHAT ": missing key 'rope_scaling.low_freq_factor'");
    FAILS(mk("rope_scaling", "{\"type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0}", NULL), F,
          WHAT ": missing key 'rope_scaling.high_freq_factor'");
    FAILS(mk("rope_scaling",
             "{\"type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 4.0, \"high_freq_factor\": 4.0}", NULL),
          F, WHAT ": key 'rope_scaling.high_freq_factor' (4) must be greater than low_freq_factor (4)");
    FAILS(mk("rope_scaling",
             "{\"type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 0, \"high_freq_factor\": 4.0}", NULL),
          F, WHAT ": key 'rope_scaling.low_freq_factor' must be positive");
    FAILS(mk("rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 0}", NULL), F,
          WHAT ": key 'rope_scaling.original_max_position_embeddings' must be positive");
    FAILS(mk("rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 64.5}", NULL),
          F, WHAT ": key 'rope_scaling.original_max_position_embeddings' must be an integer");
    FAILS(mk("original_max_position_embeddings", "-1", "rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0}", NULL),
          F, WHAT ": key 'original_max_position_embeddings' must be positive");
    FAILS(mk("rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0, \"attention_factor\": 0}", NULL), F,
          WHAT ": key 'rope_scaling.attention_factor' must be positive");
    FAILS(mk("rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0, \"beta_fast\": -1}", NULL), F,
          "'rope_scaling.beta_fast' and 'beta_slow' must be positive");
    FAILS(mk("rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0, \"mscale\": \"x\"}", NULL), F,
          WHAT ": key 'rope_scaling.mscale' must be a number");
    FAILS(mk("rope_scaling", "{\"type\": \"yarn\", \"factor\": 4.0, \"truncate\": 1}", NULL), F,
          WHAT ": key 'rope_scaling.truncate' must be true or false");
    FAILS(mk("partial_rotary_factor", "0.5", NULL), U, WHAT ": key 'partial_rotary_factor' 0.5 is not supported");
    FAILS(mk("rope_parameters", "{\"rope_type\": \"default\", \"partial_rotary_factor\": 0.25}", NULL), U,
          WHAT ": key 'rope_parameters.partial_rotary_factor' 0.25");
    FAILS(mk("rope_parameters", "{\"full_attention\": {\"rope_type\": \"default\"}, \"sliding_attention\": {}}",
             NULL),
          U,
          WHAT ": key 'rope_parameters.full_attention': per-layer-type rope parameters");

    /* dtype */
    FAILS(mk("torch_dtype", "\"int8\"", NULL), U, WHAT ": key 'torch_dtype' is 'int8'");
    FAILS(mk("dtype", "\"float8_e4m3fn\"", NULL), U, WHAT ": key 'dtype' is 'float8_e4m3fn'");
    FAILS(mk("torch_dtype", "5", NULL), F, WHAT ": key 'torch_dtype' must be a string");

    /* token ids */
    FAILS(mk("eos_token_id", "\"</s>\"", NULL), F, WHAT ": key 'eos_token_id' must be an integer or a list");
    FAILS(mk("eos_token_id", "[1, -2]", NULL), F, WHAT ": key 'eos_token_id' must hold non-negative integers");
    FAILS(mk("eos_token_id", "[1, 2.5]", NULL), F, WHAT ": key 'eos_token_id' must hold non-negative integers");
    FAILS(mk("eos_token_id", "[1, 2, 3, 4, 5, 6, 7, 8, 9]", NULL), U, WHAT ": key 'eos_token_id': more than 8");
    FAILS(mk("bos_token_id", "-3", NULL), F, WHAT ": key 'bos_token_id' must not be negative");
    FAILS(mk("bos_token_id", "[1]", NULL), F, WHAT ": key 'bos_token_id' must be an integer");

    /* sliding window */
    FAILS(mk("architectures", "[\"MistralForCausalLM\"]", "sliding_window", "0", NULL), F,
          WHAT ": key 'sliding_window' must be positive or null");
    FAILS(mk("architectures", "[\"MistralForCausalLM\"]", "sliding_window", "\"4k\"", NULL), F,
          WHAT ": key 'sliding_window' must be an integer");
    FAILS(mk("architectures", "[\"Qwen2ForCausalLM\"]", "use_sliding_window", "true", "sliding_window", "64",
             "max_window_layers", "1", NULL),
          U, WHAT ": key 'use_sliding_window': 1 of 2 layers slide");
    FAILS(mk("architectures", "[\"Qwen2ForCausalLM\"]", "use_sliding_window", "true", "sliding_window", "-64",
             "max_window_layers", "0", NULL),
          F, WHAT ": key 'sliding_window' must be positive");
    FAILS(mk("architectures", "[\"Qwen2ForCausalLM\"]", "use_sliding_window", "true", "layer_types",
             "[\"full_attention\"]", NULL),
          F, WHAT ": key 'layer_types' must list 2 layer types");
    FAILS(mk("architectures", "[\"Qwen2ForCausalLM\"]", "use_sliding_window", "true", "layer_types",
             "[\"full_attention\", \"chunked_attention\"]", NULL),
          U, WHAT ": key 'layer_types'[1]");
    FAILS(mk("architectures", "[\"Qwen2ForCausalLM\"]", "use_sliding_window", "\"yes\"", NULL), F,
          WHAT ": key 'use_sliding_window' must be true or false");

    /* generation config */
    CHECK_FAILS(ckv_config_parse(&cfg, mk(NULL), "{\"eos_token_id\": ", WHAT), F,
                "generation_config.json: invalid JSON");
    CHECK_FAILS(ckv_config_parse(&cfg, mk(NULL), "[]", WHAT), F, "generation_config.json: top level must be an object");
    CHECK_FAILS(ckv_config_parse(&cfg, mk(NULL), "{\"eos_token_id\": \"x\"}", WHAT), F,
                "generation_config.json: key 'eos_token_id'");
    CHECK_FAILS(ckv_config_parse(&cfg, mk(NULL), "{\"bos_token_id\": 1.5}", WHAT), F,
                "generation_config.json: key 'bos_token_id' must be an integer");
    CHECK_FAILS(ckv_config_parse(&cfg, NULL, NULL, WHAT), CKV_STATUS_ERR_ARG, "NULL config");
}

/* ---- from a directory -------------------------------------------------------------------------- */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void test_load_dir(void) {
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/test_config.%ld", CKV_TEST_TMP, (long)getpid());
    CHECK(mkdir(dir, 0755) == 0);

    CHECK_FAILS(ckv_config_load(&cfg, dir), CKV_STATUS_ERR_IO, "config.json");

    snprintf(path, sizeof path, "%s/config.json", dir);
    write_text(path, llama31_8b);
    CHECK_OK(ckv_config_load(&cfg, dir));
    CHECK(cfg.n_eos == 1 && cfg.eos_ids[0] == 128001 && cfg.rope.type == CKV_ROPE_TYPE_LLAMA3);

    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    write_text(path, llama31_gen);
    CHECK_OK(ckv_config_load(&cfg, dir));
    CHECK(cfg.n_eos == 3 && cfg.eos_ids[2] == 128009);

    write_text(path, "{\"eos_token_id\": [1,");
    CHECK_FAILS(ckv_config_load(&cfg, dir), CKV_STATUS_ERR_FORMAT, "/generation_config.json: invalid JSON");
    CHECK(unlink(path) == 0);

    snprintf(path, sizeof path, "%s/config.json", dir);
    { /* a NUL byte inside the file would hide what follows it */
        FILE *f = fopen(path, "wb");
        const char *t = mk(NULL);
        if (f) {
            fwrite(t, 1, strlen(t) - 1, f);
            fwrite("\0 \"x\": 1}", 1, 10, f);
            fclose(f);
        }
        CHECK_FAILS(ckv_config_load(&cfg, dir), CKV_STATUS_ERR_FORMAT, "/config.json: NUL byte in the file");
    }
    write_text(path, mk("architectures", "[\"FalconForCausalLM\"]", NULL));
    CHECK_FAILS(ckv_config_load(&cfg, dir), CKV_STATUS_ERR_UNSUPPORTED,
                "/config.json: architectures[0] 'FalconForCausalLM'");
    CHECK(unlink(path) == 0);
    CHECK(rmdir(dir) == 0);
}

int main(void) {
    test_real_models();
    test_defaults();
    test_malformed();
    test_load_dir();
    return ckv_test_finish("test_config");
}
