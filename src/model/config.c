/* config.c - reads a Hugging Face config.json (and the optional generation_config.json) into
 * ckv_model_config for the Llama, Mistral and Qwen2 causal-LM families. Defaults follow the
 * transformers configuration classes of those families (absent keys take the class default; rope
 * parameters come from `rope_scaling`, else `rope_parameters`, with `rope_theta` taken from that dict
 * before the top level). Anything ckv cannot run faithfully (another activation, MLP biases, dynamic
 * or longrope scaling, partial rotary, per-layer rope, mixed sliding/full layers) is refused with a
 * message naming the file and the key. It computes no rope frequencies (rope.c does) and reads no
 * weights. */
#include "model/config.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

/* ---- typed look-ups that name the file and the key on error ------------------------------------ */

/* An integer-valued JSON number within int range. */
static int cfg_is_int(const ckv_json *v) {
    if (!ckv_json_is_number(v)) return 0;
    double d = ckv_json_number(v);
    return isfinite(d) && d == floor(d) && d >= (double)INT_MIN && d <= (double)INT_MAX;
}

/* Reads key as an int; absent or null gives `def` unless `required`. *present says whether it was
 * given (may be NULL). */
static ckv_status cfg_int(const ckv_json *obj, const char *key, const char *what, const char *prefix, int required,
                          int def, int *out, int *present) {
    const ckv_json *v = ckv_json_get(obj, key);
    if (present) *present = 0;
    if (ckv_json_is_null(v)) {
        if (required) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing key '%s%s'", what, prefix, key);
        *out = def;
        return CKV_STATUS_OK;
    }
    if (!cfg_is_int(v))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key '%s%s' must be an integer", what, prefix, key);
    *out = (int)ckv_json_number(v);
    if (present) *present = 1;
    return CKV_STATUS_OK;
}

static ckv_status cfg_positive_int(const ckv_json *obj, const char *key, const char *what, int required, int def,
                                   int *out) {
    CKV_TRY(cfg_int(obj, key, what, "", required, def, out, NULL));
    if (*out <= 0) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key '%s' must be positive (got %d)", what, key, *out);
    return CKV_STATUS_OK;
}

static ckv_status cfg_number(const ckv_json *obj, const char *key, const char *what, const char *prefix, int required,
                             double def, double *out, int *present) {
    const ckv_json *v = ckv_json_get(obj, key);
    if (present) *present = 0;
    if (ckv_json_is_null(v)) {
        if (required) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing key '%s%s'", what, prefix, key);
        *out = def;
        return CKV_STATUS_OK;
    }
    if (!ckv_json_is_number(v) || !isfinite(ckv_json_number(v)))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key '%s%s' must be a number", what, prefix, key);
    *out = ckv_json_number(v);
    if (present) *present = 1;
    return CKV_STATUS_OK;
}

static ckv_status cfg_bool(const ckv_json *obj, const char *key, const char *what, const char *prefix, int def,
                           int *out) {
    const ckv_json *v = ckv_json_get(obj, key);
    if (ckv_json_is_null(v)) {
        *out = def;
        return CKV_STATUS_OK;
    }
    if (!ckv_json_is_bool(v))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key '%s%s' must be true or false", what, prefix, key);
    *out = ckv_json_bool(v);
    return CKV_STATUS_OK;
}

/* ---- architecture ------------------------------------------------------------------------------ */

static const struct {
    const char *name;
    ckv_arch arch;
    int default_max_position; /* the transformers class default for max_position_embeddings */
    int default_bos;          /* the class default bos_token_id (-1: None) */
} cfg_archs[] = {
    {"LlamaForCausalLM", CKV_ARCH_LLAMA, 2048, 1},
    {"MistralForCausalLM", CKV_ARCH_MISTRAL, 4096 * 32, 1},
    {"Qwen2ForCausalLM", CKV_ARCH_QWEN2, 32768, -1},
};

const char *ckv_arch_name(ckv_arch a) {
    for (size_t i = 0; i < sizeof cfg_archs / sizeof cfg_archs[0]; i++)
        if (cfg_archs[i].arch == a) return cfg_archs[i].name;
    return "unknown";
}

/* ---- pieces ------------------------------------------------------------------------------------ */

static ckv_status cfg_parse_arch(ckv_model_config *cfg, const ckv_json *root, const char *what, size_t *arch_index) {
    const ckv_json *archs = ckv_json_get(root, "architectures");
    if (ckv_json_is_null(archs)) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing key 'architectures'", what);
    if (!ckv_json_is_array(archs) || ckv_json_array_size(archs) < 1 ||
        !ckv_json_is_string(ckv_json_array_at(archs, 0)))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key 'architectures' must be a non-empty list of strings", what);
    const char *name = ckv_json_string(ckv_json_array_at(archs, 0));
    for (size_t i = 0; i < sizeof cfg_archs / sizeof cfg_archs[0]; i++) {
        if (strcmp(name, cfg_archs[i].name) == 0) {
            cfg->arch = cfg_archs[i].arch;
            snprintf(cfg->arch_name, sizeof cfg->arch_name, "%s", name);
            *arch_index = i;
            return CKV_STATUS_OK;
        }
    }
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                     "%s: architectures[0] '%.200s' is not supported (ckv runs LlamaForCausalLM, "
                     "MistralForCausalLM and Qwen2ForCausalLM)",
                     what, name);
}

static ckv_status cfg_parse_dtype(ckv_model_config *cfg, const ckv_json *root, const char *what) {
    const char *key = "dtype";
    const ckv_json *v = ckv_json_get(root, key);
    if (ckv_json_is_null(v)) {
        key = "torch_dtype";
        v = ckv_json_get(root, key);
    }
    cfg->dtype = CKV_DTYPE_F32;
    if (ckv_json_is_null(v)) return CKV_STATUS_OK;
    const char *s = ckv_json_string(v);
    if (!s) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key '%s' must be a string", what, key);
    if (strncmp(s, "torch.", 6) == 0) s += 6;
    if (strcmp(s, "float32") == 0)
        cfg->dtype = CKV_DTYPE_F32;
    else if (strcmp(s, "bfloat16") == 0)
        cfg->dtype = CKV_DTYPE_BF16;
    else if (strcmp(s, "float16") == 0)
        cfg->dtype = CKV_DTYPE_F16;
    else
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: key '%s' is '%.100s' (ckv reads float32, bfloat16 and float16 checkpoints)", what, key,
                         s);
    return CKV_STATUS_OK;
}

/* Adds the ids of an `eos_token_id` value (int, list of ints or null) to cfg->eos_ids, skipping
 * ids already there. */
static ckv_status cfg_add_eos(ckv_model_config *cfg, const ckv_json *v, const char *what) {
    if (ckv_json_is_null(v)) return CKV_STATUS_OK;
    int n = 1;
    if (ckv_json_is_array(v))
        n = ckv_json_array_size(v);
    else if (!ckv_json_is_number(v))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key 'eos_token_id' must be an integer or a list of integers",
                         what);
    for (int i = 0; i < n; i++) {
        const ckv_json *e = ckv_json_is_array(v) ? ckv_json_array_at(v, i) : v;
        if (!cfg_is_int(e) || ckv_json_number(e) < 0)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key 'eos_token_id' must hold non-negative integers", what);
        int id = (int)ckv_json_number(e);
        int seen = 0;
        for (int k = 0; k < cfg->n_eos; k++) seen |= cfg->eos_ids[k] == id;
        if (seen) continue;
        if (cfg->n_eos == CKV_MAX_EOS)
            return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: key 'eos_token_id': more than %d distinct ids", what,
                             CKV_MAX_EOS);
        cfg->eos_ids[cfg->n_eos++] = id;
    }
    return CKV_STATUS_OK;
}

static ckv_status cfg_parse_bos(const ckv_json *obj, const char *what, int *bos, int *present) {
    CKV_TRY(cfg_int(obj, "bos_token_id", what, "", 0, -1, bos, present));
    if (*present && *bos < 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key 'bos_token_id' must not be negative (got %d)", what, *bos);
    return CKV_STATUS_OK;
}

/* Sliding window: Llama has none; Mistral's `sliding_window` is null or a size (class default 4096
 * when the key is absent); Qwen2 uses it only with use_sliding_window, and then only on the layers
 * that layer_types (or max_window_layers) mark as sliding - all or none of them for ckv. */
static ckv_status cfg_parse_sliding(ckv_model_config *cfg, const ckv_json *root, const char *what) {
    cfg->sliding_window = 0;
    if (cfg->arch == CKV_ARCH_LLAMA) return CKV_STATUS_OK;
    int window = 0, present = 0;
    if (cfg->arch == CKV_ARCH_MISTRAL) {
        const ckv_json *v = ckv_json_get(root, "sliding_window");
        if (!v) {
            cfg->sliding_window = 4096;
            return CKV_STATUS_OK;
        }
        CKV_TRY(cfg_int(root, "sliding_window", what, "", 0, 0, &window, &present));
        if (present && window <= 0)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key 'sliding_window' must be positive or null (got %d)",
                             what, window);
        cfg->sliding_window = window;
        return CKV_STATUS_OK;
    }
    int use = 0;
    CKV_TRY(cfg_bool(root, "use_sliding_window", what, "", 0, &use));
    if (!use) return CKV_STATUS_OK;
    CKV_TRY(cfg_int(root, "sliding_window", what, "", 0, 4096, &window, NULL));
    if (window <= 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key 'sliding_window' must be positive (got %d)", what, window);
    int n_sliding = 0;
    const ckv_json *types = ckv_json_get(root, "layer_types");
    if (!ckv_json_is_null(types)) {
        if (!ckv_json_is_array(types) || ckv_json_array_size(types) != cfg->n_layers)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key 'layer_types' must list %d layer types", what,
                             cfg->n_layers);
        for (int i = 0; i < cfg->n_layers; i++) {
            const char *t = ckv_json_string(ckv_json_array_at(types, i));
            if (t && strcmp(t, "sliding_attention") == 0)
                n_sliding++;
            else if (!t || strcmp(t, "full_attention") != 0)
                return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                                 "%s: key 'layer_types'[%d] must be 'full_attention' or 'sliding_attention'", what, i);
        }
    } else {
        int max_window_layers = 28;
        CKV_TRY(cfg_int(root, "max_window_layers", what, "", 0, 28, &max_window_layers, NULL));
        for (int i = 0; i < cfg->n_layers; i++) n_sliding += i >= max_window_layers;
    }
    if (n_sliding != 0 && n_sliding != cfg->n_layers)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: key 'use_sliding_window': %d of %d layers slide (ckv needs all or none; see "
                         "'max_window_layers' / 'layer_types')",
                         what, n_sliding, cfg->n_layers);
    cfg->sliding_window = n_sliding ? window : 0;
    return CKV_STATUS_OK;
}

static ckv_status cfg_parse_rope(ckv_model_config *cfg, const ckv_json *root, const char *what) {
    ckv_rope_config *r = &cfg->rope;
    memset(r, 0, sizeof *r);
    r->type = CKV_ROPE_TYPE_DEFAULT;
    r->factor = 1.0;
    r->beta_fast = 32.0;
    r->beta_slow = 1.0;
    r->truncate = 1;

    /* rope_scaling wins when it is a non-empty dict, else rope_parameters */
    const char *dict_key = "rope_scaling";
    const ckv_json *d = ckv_json_get(root, dict_key);
    if (!ckv_json_is_null(d) && !ckv_json_is_object(d))
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key 'rope_scaling' must be an object or null", what);
    if (!ckv_json_is_object(d) || !ckv_json_first_child(d)) {
        dict_key = "rope_parameters";
        d = ckv_json_get(root, dict_key);
        if (!ckv_json_is_null(d) && !ckv_json_is_object(d))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key 'rope_parameters' must be an object or null", what);
        if (!ckv_json_is_object(d)) d = NULL;
    }
    char prefix[32];
    snprintf(prefix, sizeof prefix, "%s.", dict_key);

    if (d) {
        for (const ckv_json *c = ckv_json_first_child(d); c; c = ckv_json_next(c))
            if (ckv_json_is_object(c))
                return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                                 "%s: key '%s%s': per-layer-type rope parameters are not supported", what, prefix,
                                 ckv_json_key(c));
    }

    /* rope_theta: the dict's value, else the top level, else 10000 */
    int present = 0;
    CKV_TRY(cfg_number(d, "rope_theta", what, prefix, 0, 0.0, &r->theta, &present));
    if (!present) {
        CKV_TRY(cfg_number(root, "rope_theta", what, "", 0, 10000.0, &r->theta, &present));
        if (present && !(r->theta > 0.0))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key 'rope_theta' must be positive (got %g)", what, r->theta);
    } else if (!(r->theta > 0.0)) {
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key '%srope_theta' must be positive (got %g)", what, prefix,
                         r->theta);
    }

    double partial = 1.0;
    CKV_TRY(cfg_number(d, "partial_rotary_factor", what, prefix, 0, 1.0, &partial, NULL));
    if (partial != 1.0)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: key '%spartial_rotary_factor' %g is not supported", what,
                         prefix, partial);
    CKV_TRY(cfg_number(root, "partial_rotary_factor", what, "", 0, 1.0, &partial, NULL));
    if (partial != 1.0)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: key 'partial_rotary_factor' %g is not supported", what,
                         partial);

    if (!d) return CKV_STATUS_OK;

    const char *type_key = "rope_type";
    const ckv_json *tv = ckv_json_get(d, type_key);
    if (ckv_json_is_null(tv)) {
        type_key = "type";
        tv = ckv_json_get(d, type_key);
    }
    const char *type = "default";
    if (!ckv_json_is_null(tv)) {
        type = ckv_json_string(tv);
        if (!type) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key '%s%s' must be a string", what, prefix, type_key);
    }
    if (strcmp(type, "default") == 0) {
        r->type = CKV_ROPE_TYPE_DEFAULT;
        return CKV_STATUS_OK;
    } else if (strcmp(type, "linear") == 0) {
        r->type = CKV_ROPE_TYPE_LINEAR;
    } else if (strcmp(type, "llama3") == 0) {
        r->type = CKV_ROPE_TYPE_LLAMA3;
    } else if (strcmp(type, "yarn") == 0) {
        r->type = CKV_ROPE_TYPE_YARN;
    } else {
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s: key '%s%s' is '%.100s' (ckv supports default, linear, llama3 and yarn)", what, prefix,
                         type_key, type);
    }

    /* factor: required (a yarn factor given as null means max_position / original) */
    const ckv_json *fv = ckv_json_get(d, "factor");
    if (!fv) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: missing key '%sfactor' for rope type %s", what, prefix, type);

    if (r->type == CKV_ROPE_TYPE_LLAMA3 || r->type == CKV_ROPE_TYPE_YARN) {
        /* a top-level original_max_position_embeddings takes priority over the dict's */
        int orig = 0, top = 0;
        CKV_TRY(cfg_int(root, "original_max_position_embeddings", what, "", 0, 0, &orig, &top));
        if (!top) CKV_TRY(cfg_int(d, "original_max_position_embeddings", what, prefix, 0, 0, &orig, &present));
        if (!top && !present) orig = cfg->max_position_embeddings;
        if (orig <= 0)
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key '%soriginal_max_position_embeddings' must be positive",
                             what, top ? "" : prefix);
        r->original_max_position = orig;
    }

    if (ckv_json_is_null(fv) && r->type == CKV_ROPE_TYPE_YARN) {
        r->factor = (double)cfg->max_position_embeddings / (double)r->original_max_position;
    } else {
        CKV_TRY(cfg_number(d, "factor", what, prefix, 1, 1.0, &r->factor, NULL));
        if (!(r->factor > 0.0))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key '%sfactor' must be positive (got %g)", what, prefix,
                             r->factor);
    }

    if (r->type == CKV_ROPE_TYPE_LLAMA3) {
        CKV_TRY(cfg_number(d, "low_freq_factor", what, prefix, 1, 0.0, &r->low_freq_factor, NULL));
        CKV_TRY(cfg_number(d, "high_freq_factor", what, prefix, 1, 0.0, &r->high_freq_factor, NULL));
        if (!(r->low_freq_factor > 0.0))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key '%slow_freq_factor' must be positive (got %g)", what,
                             prefix, r->low_freq_factor);
        if (!(r->high_freq_factor > r->low_freq_factor))
            return ckv_error(CKV_STATUS_ERR_FORMAT,
                             "%s: key '%shigh_freq_factor' (%g) must be greater than low_freq_factor (%g)", what,
                             prefix, r->high_freq_factor, r->low_freq_factor);
    }

    if (r->type == CKV_ROPE_TYPE_YARN) {
        /* a zero or null beta falls back to the default, as in the reference (`x or default`) */
        CKV_TRY(cfg_number(d, "beta_fast", what, prefix, 0, 32.0, &r->beta_fast, NULL));
        CKV_TRY(cfg_number(d, "beta_slow", what, prefix, 0, 1.0, &r->beta_slow, NULL));
        if (r->beta_fast == 0.0) r->beta_fast = 32.0;
        if (r->beta_slow == 0.0) r->beta_slow = 1.0;
        if (!(r->beta_fast > 0.0) || !(r->beta_slow > 0.0))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: keys '%sbeta_fast' and 'beta_slow' must be positive", what,
                             prefix);
        CKV_TRY(cfg_number(d, "mscale", what, prefix, 0, 0.0, &r->mscale, NULL));
        CKV_TRY(cfg_number(d, "mscale_all_dim", what, prefix, 0, 0.0, &r->mscale_all_dim, NULL));
        CKV_TRY(cfg_number(d, "attention_factor", what, prefix, 0, 0.0, &r->attention_factor, &present));
        if (present && !(r->attention_factor > 0.0))
            return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key '%sattention_factor' must be positive (got %g)", what,
                             prefix, r->attention_factor);
        /* the reference reads truncate with a default of true; an explicit null disables it */
        const ckv_json *tr = ckv_json_get(d, "truncate");
        if (tr && ckv_json_is_null(tr))
            r->truncate = 0;
        else
            CKV_TRY(cfg_bool(d, "truncate", what, prefix, 1, &r->truncate));
    }
    return CKV_STATUS_OK;
}

/* ---- entry points ------------------------------------------------------------------------------ */

static ckv_status cfg_parse_root(ckv_model_config *cfg, const ckv_json *root, const char *what) {
    if (!ckv_json_is_object(root)) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: top level must be an object", what);
    size_t ai = 0;
    CKV_TRY(cfg_parse_arch(cfg, root, what, &ai));

    CKV_TRY(cfg_positive_int(root, "vocab_size", what, 1, 0, &cfg->vocab_size));
    CKV_TRY(cfg_positive_int(root, "hidden_size", what, 1, 0, &cfg->hidden_size));
    CKV_TRY(cfg_positive_int(root, "intermediate_size", what, 1, 0, &cfg->intermediate_size));
    CKV_TRY(cfg_positive_int(root, "num_hidden_layers", what, 1, 0, &cfg->n_layers));
    CKV_TRY(cfg_positive_int(root, "num_attention_heads", what, 1, 0, &cfg->n_heads));
    CKV_TRY(cfg_positive_int(root, "num_key_value_heads", what, 0, cfg->n_heads, &cfg->n_kv_heads));
    if (cfg->n_heads % cfg->n_kv_heads != 0)
        return ckv_error(CKV_STATUS_ERR_FORMAT,
                         "%s: key 'num_key_value_heads' (%d) must divide num_attention_heads (%d)", what,
                         cfg->n_kv_heads, cfg->n_heads);
    int derived_head_dim = cfg->hidden_size / cfg->n_heads;
    CKV_TRY(cfg_int(root, "head_dim", what, "", 0, derived_head_dim, &cfg->head_dim, NULL));
    if (cfg->head_dim <= 0 || cfg->head_dim % 2 != 0) {
        const char *derived = ckv_json_is_null(ckv_json_get(root, "head_dim")) ? ", hidden_size / heads" : "";
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key 'head_dim' must be positive and even (got %d%s)", what,
                         cfg->head_dim, derived);
    }
    CKV_TRY(cfg_positive_int(root, "max_position_embeddings", what, 0, cfg_archs[ai].default_max_position,
                             &cfg->max_position_embeddings));

    int present = 0;
    CKV_TRY(cfg_number(root, "rms_norm_eps", what, "", 0, 1e-6, &cfg->rms_norm_eps, &present));

    const ckv_json *act = ckv_json_get(root, "hidden_act");
    if (!ckv_json_is_null(act)) {
        const char *a = ckv_json_string(act);
        if (!a) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: key 'hidden_act' must be a string", what);
        if (strcmp(a, "silu") != 0 && strcmp(a, "swish") != 0)
            return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: key 'hidden_act' is '%.100s' (ckv supports silu)", what,
                             a);
    }

    cfg->attention_bias = 0;
    if (cfg->arch == CKV_ARCH_QWEN2) {
        cfg->attention_bias = 1;
    } else if (cfg->arch == CKV_ARCH_LLAMA) {
        CKV_TRY(cfg_bool(root, "attention_bias", what, "", 0, &cfg->attention_bias));
        int mlp_bias = 0;
        CKV_TRY(cfg_bool(root, "mlp_bias", what, "", 0, &mlp_bias));
        if (mlp_bias)
            return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "%s: key 'mlp_bias' is true (ckv has no MLP biases)", what);
    }
    CKV_TRY(cfg_bool(root, "tie_word_embeddings", what, "", 0, &cfg->tie_word_embeddings));

    CKV_TRY(cfg_parse_sliding(cfg, root, what));
    CKV_TRY(cfg_parse_rope(cfg, root, what));
    CKV_TRY(cfg_parse_dtype(cfg, root, what));

    CKV_TRY(cfg_parse_bos(root, what, &cfg->bos_token_id, &present));
    cfg->n_eos = 0;
    CKV_TRY(cfg_add_eos(cfg, ckv_json_get(root, "eos_token_id"), what));
    /* YaRN stretches the original window by its factor (Qwen2.5 at 128K keeps max_position_embeddings
     * at 32768 and adds factor 4): that stretched window is the context ckv accepts */
    cfg->max_context = cfg->max_position_embeddings;
    if (cfg->rope.type == CKV_ROPE_TYPE_YARN) {
        double stretched = (double)cfg->rope.original_max_position * cfg->rope.factor;
        if (stretched > cfg->max_context && stretched < 2147483647.0) cfg->max_context = (int)stretched;
    }
    return CKV_STATUS_OK;
}

static ckv_status cfg_parse_named(ckv_model_config *cfg, const char *config_json, const char *what,
                                  const char *generation_json, const char *gen_what) {
    if (!cfg || !config_json) return ckv_error(CKV_STATUS_ERR_ARG, "%s: NULL config", what ? what : "config.json");
    memset(cfg, 0, sizeof *cfg);
    ckv_json *root = NULL, *gen = NULL;
    ckv_status s;
    CKV_TRY_GOTO(s, ckv_json_parse_buffer(&root, config_json, strlen(config_json), what), done);
    CKV_TRY_GOTO(s, cfg_parse_root(cfg, root, what), done);
    if (generation_json) {
        CKV_TRY_GOTO(s, ckv_json_parse_buffer(&gen, generation_json, strlen(generation_json), gen_what), done);
        if (!ckv_json_is_object(gen)) {
            s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: top level must be an object", gen_what);
            goto done;
        }
        CKV_TRY_GOTO(s, cfg_add_eos(cfg, ckv_json_get(gen, "eos_token_id"), gen_what), done);
        int gen_bos = -1, present = 0;
        CKV_TRY_GOTO(s, cfg_parse_bos(gen, gen_what, &gen_bos, &present), done);
        if (cfg->bos_token_id < 0 && present) cfg->bos_token_id = gen_bos;
    }
    s = ckv_config_check(cfg, what);
done:
    ckv_json_free(root);
    ckv_json_free(gen);
    return s;
}

ckv_status ckv_config_check(const ckv_model_config *cfg, const char *what) {
    if (!(cfg->rms_norm_eps >= CKV_RMS_EPS_MIN && cfg->rms_norm_eps <= CKV_RMS_EPS_MAX))
        return ckv_error(CKV_STATUS_ERR_RANGE, "%s: rms_norm_eps %g is outside [%g, %g]", what, cfg->rms_norm_eps,
                         CKV_RMS_EPS_MIN, CKV_RMS_EPS_MAX);
    if (cfg->bos_token_id >= cfg->vocab_size)
        return ckv_error(CKV_STATUS_ERR_RANGE, "%s: bos_token_id %d is outside the vocabulary of %d tokens", what,
                         cfg->bos_token_id, cfg->vocab_size);
    for (int k = 0; k < cfg->n_eos; k++)
        if (cfg->eos_ids[k] < 0 || cfg->eos_ids[k] >= cfg->vocab_size)
            return ckv_error(CKV_STATUS_ERR_RANGE, "%s: eos_token_id %d is outside the vocabulary of %d tokens", what,
                             cfg->eos_ids[k], cfg->vocab_size);
    return CKV_STATUS_OK;
}

ckv_status ckv_config_parse(ckv_model_config *cfg, const char *config_json, const char *generation_json,
                            const char *what) {
    if (!what) what = "config.json";
    return cfg_parse_named(cfg, config_json, what, generation_json, "generation_config.json");
}

ckv_status ckv_config_load(ckv_model_config *cfg, const char *dir) {
    if (!cfg || !dir) return ckv_error(CKV_STATUS_ERR_ARG, "config: NULL argument");
    size_t n = strlen(dir) + sizeof "/generation_config.json", clen = 0, glen = 0;
    char *cpath = malloc(n), *gpath = malloc(n);
    char *ctext = NULL, *gtext = NULL;
    ckv_status s;
    if (!cpath || !gpath) {
        s = ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory", dir);
        goto done;
    }
    snprintf(cpath, n, "%s/config.json", dir);
    snprintf(gpath, n, "%s/generation_config.json", dir);
    CKV_TRY_GOTO(s, ckv_read_file(cpath, &ctext, &clen), done);
    FILE *g = fopen(gpath, "rb");
    if (g) {
        fclose(g);
        CKV_TRY_GOTO(s, ckv_read_file(gpath, &gtext, &glen), done);
    }
    /* the text is parsed as a C string: a NUL byte would hide the rest of the file */
    if (strlen(ctext) != clen || (gtext && strlen(gtext) != glen)) {
        s = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: NUL byte in the file (not JSON text)", strlen(ctext) != clen ? cpath : gpath);
        goto done;
    }
    s = cfg_parse_named(cfg, ctext, cpath, gtext, gpath);
done:
    free(ctext);
    free(gtext);
    free(cpath);
    free(gpath);
    return s;
}

long long ckv_config_param_count(const ckv_model_config *cfg) {
    long long D = cfg->hidden_size, F = cfg->intermediate_size, V = cfg->vocab_size;
    long long q = (long long)cfg->n_heads * cfg->head_dim, kv = (long long)cfg->n_kv_heads * cfg->head_dim;
    long long layer = D * q + 2 * D * kv + q * D /* q, k, v, o */ + 3 * D * F /* gate, up, down */ + 2 * D /* norms */;
    if (cfg->attention_bias) layer += q + 2 * kv;
    if (cfg->attention_bias && cfg->arch == CKV_ARCH_LLAMA) layer += D; /* Llama's o_proj bias */
    long long total = V * D + (long long)cfg->n_layers * layer + D;
    if (!cfg->tie_word_embeddings) total += V * D;
    return total;
}
