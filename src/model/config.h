/* config.h - a model's hyper-parameters, read from a Hugging Face model directory (config.json and
 * generation_config.json). Validates what ckv supports and says exactly what it does not. No
 * weights, no I/O beyond those two small files. */
#ifndef CKV_MODEL_CONFIG_H
#define CKV_MODEL_CONFIG_H

#include "core/status.h"
#include "core/tensor.h"

typedef enum {
    CKV_ARCH_LLAMA = 0,   /* LlamaForCausalLM */
    CKV_ARCH_MISTRAL = 1, /* MistralForCausalLM */
    CKV_ARCH_QWEN2 = 2    /* Qwen2ForCausalLM */
} ckv_arch;

typedef enum {
    CKV_ROPE_TYPE_DEFAULT = 0,
    CKV_ROPE_TYPE_LINEAR = 1,
    CKV_ROPE_TYPE_LLAMA3 = 2,
    CKV_ROPE_TYPE_YARN = 3
} ckv_rope_type;

#define CKV_MAX_EOS 8

typedef struct {
    ckv_rope_type type;
    double theta;                   /* rope_theta */
    double factor;                  /* rope_scaling.factor (1 when absent) */
    double low_freq_factor;         /* llama3 */
    double high_freq_factor;        /* llama3 */
    int original_max_position;      /* llama3, yarn: original_max_position_embeddings */
    double beta_fast, beta_slow;    /* yarn (defaults 32, 1) */
    double mscale, mscale_all_dim;  /* yarn (0 when absent) */
    double attention_factor;        /* yarn: explicit attention_factor, 0 when absent */
    int truncate;                   /* yarn: truncate (default 1) */
} ckv_rope_config;

typedef struct {
    ckv_arch arch;
    char arch_name[64];       /* architectures[0] as written */
    int vocab_size;
    int hidden_size;          /* D */
    int intermediate_size;    /* F */
    int n_layers;
    int n_heads;              /* H */
    int n_kv_heads;           /* Hkv */
    int head_dim;             /* d (config head_dim, else D / H) */
    int max_position_embeddings;
    int max_context;          /* tokens a sequence may hold: max_position_embeddings, or the YaRN-stretched
                                 window original_max_position_embeddings * factor when larger */
    double rms_norm_eps;
    int attention_bias;       /* q/k/v projections have a bias (Qwen2: always; Llama: o_proj too) */
    int tie_word_embeddings;
    int sliding_window;       /* 0 when none / disabled */
    ckv_rope_config rope;
    ckv_dtype dtype;          /* torch_dtype / dtype of the checkpoint (F32 when absent) */
    int bos_token_id;         /* -1 when absent */
    int eos_ids[CKV_MAX_EOS]; /* union of config.json and generation_config.json eos ids */
    int n_eos;
} ckv_model_config;

/* Reads `dir`/config.json (required) and `dir`/generation_config.json (optional) into *cfg.
 * Errors name the file and the key: unknown architecture, missing or non-positive sizes, heads
 * that do not divide, unsupported activation or rope type. */
ckv_status ckv_config_load(ckv_model_config *cfg, const char *dir);

/* Same, from an in-memory config.json text (generation config: NULL or its text). */
ckv_status ckv_config_parse(ckv_model_config *cfg, const char *config_json, const char *generation_json,
                            const char *what);

/* The range of rms_norm_eps ckv accepts. Checkpoints use 1e-5 or 1e-6 (1e-12 at the smallest, in
 * BERT-style norms). Below 1e-12 eps is meaningless next to any non-zero fp32 sum of squares and a
 * tiny one narrows to 0 in fp32 (a zero row then divides by zero); above 0.1 it changes the norm of
 * unit-variance hidden states by over 5 %, which no trained model does. Either is a corrupt file. */
#define CKV_RMS_EPS_MIN 1e-12
#define CKV_RMS_EPS_MAX 1e-1

/* Checks what both config readers (config.json, GGUF metadata) must agree on once parsed:
 * rms_norm_eps in [CKV_RMS_EPS_MIN, CKV_RMS_EPS_MAX], bos and every eos id inside the vocabulary.
 * `what` names the source in the message. */
ckv_status ckv_config_check(const ckv_model_config *cfg, const char *what);

const char *ckv_arch_name(ckv_arch a);

/* Parameter count of the full model (embeddings counted once when tied). */
long long ckv_config_param_count(const ckv_model_config *cfg);

#endif
