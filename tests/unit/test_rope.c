/* test_rope.c - rotary inverse frequencies against Hugging Face transformers: default, linear,
 * llama3 (a small original context and the Llama-3.1 values) and yarn (Qwen2.5-style, a small
 * original context, mscale / beta / no truncation, an explicit attention factor), plus the argument
 * checks and the path config.json -> ckv_rope_init_freqs. Tolerance: 1e-6 relative (the reference's
 * vectorised powf is not correctly rounded; ours may differ from it by an ulp before amplification).
 *
 * The ref_* arrays below were printed by transformers 5.2.0 (torch 2.x, CPU) with this command:
 *
 * python3 - <<'EOF'
 * import torch
 * from transformers import LlamaConfig
 * from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
 * from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
 * def ref(name, head_dim, max_pos, **rp):
 *     c = LlamaConfig(hidden_size=4 * head_dim, num_attention_heads=4, head_dim=head_dim,
 *                     max_position_embeddings=max_pos, rope_parameters=rp)
 *     t = c.rope_parameters["rope_type"]
 *     f = LlamaRotaryEmbedding.compute_default_rope_parameters if t == "default" else ROPE_INIT_FUNCTIONS[t]
 *     inv, att = f(c, "cpu")
 *     v = ["%.9ef" % x for x in inv.tolist()]
 *     print("// %s: attention factor %.17g" % (name, att))
 *     print("static const float %s[%d] = {" % (name, len(v)))
 *     for i in range(0, len(v), 6): print("    " + ", ".join(v[i:i + 6]) + ",")
 *     print("};")
 * ref("ref_default_64", 64, 2048, rope_type="default", rope_theta=10000.0)
 * ref("ref_default_128", 128, 32768, rope_type="default", rope_theta=1000000.0)
 * ref("ref_linear_32", 32, 4096, rope_type="linear", rope_theta=10000.0, factor=4.0)
 * ref("ref_llama3_small", 64, 256, rope_type="llama3", rope_theta=10000.0, factor=8.0,
 *     low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=64)
 * ref("ref_llama3_31", 128, 131072, rope_type="llama3", rope_theta=500000.0, factor=8.0,
 *     low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)
 * ref("ref_yarn_qwen", 128, 32768, rope_type="yarn", rope_theta=1000000.0, factor=4.0,
 *     original_max_position_embeddings=32768)
 * ref("ref_yarn_small", 64, 256, rope_type="yarn", rope_theta=10000.0, factor=4.0,
 *     original_max_position_embeddings=64)
 * ref("ref_yarn_mscale", 32, 160, rope_type="yarn", rope_theta=10000.0, factor=2.5,
 *     original_max_position_embeddings=64, beta_fast=16.0, beta_slow=2.0, mscale=0.707,
 *     mscale_all_dim=1.0, truncate=False)
 * ref("ref_yarn_attn", 16, 512, rope_type="yarn", rope_theta=10000.0, factor=8.0,
 *     original_max_position_embeddings=64, attention_factor=1.25)
 * EOF
 */
#include <math.h>
#include <string.h>

#include "ckv_test.h"
#include "core/status.h"
#include "model/config.h"
#include "model/rope.h"

// ref_default_64: attention factor 1
static const float ref_default_64[32] = {
    1.000000000e+00f, 7.498942018e-01f, 5.623413324e-01f, 4.216965139e-01f, 3.162277639e-01f, 2.371373624e-01f,
    1.778279394e-01f, 1.333521456e-01f, 1.000000015e-01f, 7.498941571e-02f, 5.623412877e-02f, 4.216964915e-02f,
    3.162277862e-02f, 2.371373586e-02f, 1.778279431e-02f, 1.333521493e-02f, 9.999999776e-03f, 7.498942316e-03f,
    5.623413250e-03f, 4.216964822e-03f, 3.162277862e-03f, 2.371373819e-03f, 1.778279431e-03f, 1.333521446e-03f,
    1.000000047e-03f, 7.498941850e-04f, 5.623413017e-04f, 4.216964880e-04f, 3.162277862e-04f, 2.371373848e-04f,
    1.778279402e-04f, 1.333521504e-04f,
};
// ref_default_128: attention factor 1
static const float ref_default_128[64] = {
    1.000000000e+00f, 8.058422208e-01f, 6.493816376e-01f, 5.232991576e-01f, 4.216965139e-01f, 3.398208320e-01f,
    2.738419771e-01f, 2.206733972e-01f, 1.778279394e-01f, 1.433012635e-01f, 1.154782027e-01f, 9.305720031e-02f,
    7.498941571e-02f, 6.042964384e-02f, 4.869675264e-02f, 3.924189880e-02f, 3.162277862e-02f, 2.548296750e-02f,
    2.053525113e-02f, 1.654817164e-02f, 1.333521493e-02f, 1.074607857e-02f, 8.659643121e-03f, 6.978305988e-03f,
    5.623413250e-03f, 4.531583749e-03f, 3.651741426e-03f, 2.942727180e-03f, 2.371373819e-03f, 1.910952851e-03f,
    1.539926510e-03f, 1.240937854e-03f, 1.000000047e-03f, 8.058422245e-04f, 6.493816618e-04f, 5.232990952e-04f,
    4.216964880e-04f, 3.398208355e-04f, 2.738419571e-04f, 2.206734207e-04f, 1.778279402e-04f, 1.433012658e-04f,
    1.154781930e-04f, 9.305720596e-05f, 7.498942432e-05f, 6.042963651e-05f, 4.869675467e-05f, 3.924189878e-05f,
    3.162277426e-05f, 2.548296652e-05f, 2.053524986e-05f, 1.654817061e-05f, 1.333521413e-05f, 1.074607826e-05f,
    8.659643754e-06f, 6.978306374e-06f, 5.623413472e-06f, 4.531583727e-06f, 3.651741281e-06f, 2.942727178e-06f,
    2.371373739e-06f, 1.910952960e-06f, 1.539926529e-06f, 1.240937763e-06f,
};
// ref_linear_32: attention factor 1
static const float ref_linear_32[16] = {
    2.500000000e-01f, 1.405853331e-01f, 7.905694097e-02f, 4.445698485e-02f, 2.500000037e-02f, 1.405853219e-02f,
    7.905694656e-03f, 4.445698578e-03f, 2.499999944e-03f, 1.405853312e-03f, 7.905694656e-04f, 4.445698578e-04f,
    2.500000119e-04f, 1.405853254e-04f, 7.905694656e-05f, 4.445698505e-05f,
};
// ref_llama3_small: attention factor 1
static const float ref_llama3_small[32] = {
    1.000000000e+00f, 7.498942018e-01f, 5.623413324e-01f, 4.216965139e-01f, 2.443845868e-01f, 1.275426447e-01f,
    6.430987269e-02f, 3.060540557e-02f, 1.304225624e-02f, 9.373676963e-03f, 7.029266097e-03f, 5.271206144e-03f,
    3.952847328e-03f, 2.964216983e-03f, 2.222849289e-03f, 1.666901866e-03f, 1.249999972e-03f, 9.373677894e-04f,
    7.029266562e-04f, 5.271206028e-04f, 3.952847328e-04f, 2.964217274e-04f, 2.222849289e-04f, 1.666901808e-04f,
    1.250000059e-04f, 9.373677312e-05f, 7.029266271e-05f, 5.271206101e-05f, 3.952847328e-05f, 2.964217310e-05f,
    2.222849253e-05f, 1.666901881e-05f,
};
// ref_llama3_31: attention factor 1
static const float ref_llama3_31[64] = {
    1.000000000e+00f, 8.146172166e-01f, 6.636012793e-01f, 5.405809879e-01f, 4.403666258e-01f, 3.587302268e-01f,
    2.922278345e-01f, 2.380538136e-01f, 1.939227581e-01f, 1.579728127e-01f, 1.286873817e-01f, 1.048309505e-01f,
    8.539710194e-02f, 6.956595182e-02f, 5.666961893e-02f, 4.616405070e-02f, 3.760603070e-02f, 3.063452058e-02f,
    2.495540865e-02f, 2.032910474e-02f, 1.656044088e-02f, 1.349041983e-02f, 1.098952908e-02f, 8.952259086e-03f,
    7.292665076e-03f, 5.940730684e-03f, 4.839421250e-03f, 3.942275885e-03f, 3.211446106e-03f, 2.166570630e-03f,
    1.371893683e-03f, 8.567514597e-04f, 5.248460220e-04f, 3.126936499e-04f, 1.785077911e-04f, 9.556212171e-05f,
    7.784655463e-05f, 6.341514381e-05f, 5.165906987e-05f, 4.208236714e-05f, 3.428102355e-05f, 2.792590931e-05f,
    2.274892904e-05f, 1.853166941e-05f, 1.509621779e-05f, 1.229763893e-05f, 1.001786859e-05f, 8.160727702e-06f,
    6.647869668e-06f, 5.415469332e-06f, 4.411534519e-06f, 3.593711881e-06f, 2.927499736e-06f, 2.384791742e-06f,
    1.942692506e-06f, 1.582550794e-06f, 1.289173156e-06f, 1.050182618e-06f, 8.554969213e-07f, 6.969025321e-07f,
    5.677088097e-07f, 4.624653798e-07f, 3.767322596e-07f, 3.068925878e-07f,
};
// ref_yarn_qwen: attention factor 1.1386294361119891
static const float ref_yarn_qwen[64] = {
    1.000000000e+00f, 8.058422208e-01f, 6.493816376e-01f, 5.232991576e-01f, 4.216965139e-01f, 3.398208320e-01f,
    2.738419771e-01f, 2.206733972e-01f, 1.778279394e-01f, 1.433012635e-01f, 1.154782027e-01f, 9.305720031e-02f,
    7.498941571e-02f, 6.042964384e-02f, 4.869675264e-02f, 3.924189880e-02f, 3.162277862e-02f, 2.548296750e-02f,
    2.053525113e-02f, 1.654817164e-02f, 1.333521493e-02f, 1.074607857e-02f, 8.659643121e-03f, 6.978305988e-03f,
    5.375321489e-03f, 4.131738096e-03f, 3.168422729e-03f, 2.423422411e-03f, 1.848276588e-03f, 1.405112445e-03f,
    1.064360957e-03f, 8.029597811e-04f, 6.029411452e-04f, 4.503235687e-04f, 3.342405544e-04f, 2.462583943e-04f,
    1.798411540e-04f, 1.299314899e-04f, 9.262301319e-05f, 6.490394298e-05f, 4.445698505e-05f, 3.582531644e-05f,
    2.886954826e-05f, 2.326430149e-05f, 1.874735608e-05f, 1.510740913e-05f, 1.217418867e-05f, 9.810474694e-06f,
    7.905693565e-06f, 6.370741630e-06f, 5.133812465e-06f, 4.137042652e-06f, 3.333803534e-06f, 2.686519565e-06f,
    2.164910939e-06f, 1.744576593e-06f, 1.405853368e-06f, 1.132895932e-06f, 9.129353202e-07f, 7.356817946e-07f,
    5.928434348e-07f, 4.777382401e-07f, 3.849816324e-07f, 3.102344408e-07f,
};
// ref_yarn_small: attention factor 1.1386294361119891
static const float ref_yarn_small[32] = {
    1.000000000e+00f, 6.874030232e-01f, 4.686177671e-01f, 3.162723780e-01f, 2.108185142e-01f, 1.383301318e-01f,
    8.891396970e-02f, 5.556339398e-02f, 3.333333135e-02f, 1.874735393e-02f, 1.405853219e-02f, 1.054241229e-02f,
    7.905694656e-03f, 5.928433966e-03f, 4.445698578e-03f, 3.333803732e-03f, 2.499999944e-03f, 1.874735579e-03f,
    1.405853312e-03f, 1.054241206e-03f, 7.905694656e-04f, 5.928434548e-04f, 4.445698578e-04f, 3.333803616e-04f,
    2.500000119e-04f, 1.874735462e-04f, 1.405853254e-04f, 1.054241220e-04f, 7.905694656e-05f, 5.928434621e-05f,
    4.445698505e-05f, 3.333803761e-05f,
};
// ref_yarn_mscale: attention factor 0.9754061896084153
static const float ref_yarn_mscale[16] = {
    1.000000000e+00f, 4.430276453e-01f, 1.820377409e-01f, 7.113117725e-02f, 3.999999911e-02f, 2.249365300e-02f,
    1.264911145e-02f, 7.113117725e-03f, 4.000000190e-03f, 2.249365207e-03f, 1.264911145e-03f, 7.113117608e-04f,
    3.999999899e-04f, 2.249365207e-04f, 1.264911116e-04f, 7.113117317e-05f,
};
// ref_yarn_attn: attention factor 1.25
static const float ref_yarn_attn[8] = {
    1.000000000e+00f, 2.239946574e-01f, 4.166666418e-02f, 3.952847328e-03f, 1.249999972e-03f, 3.952847328e-04f,
    1.250000059e-04f, 3.952847328e-05f,
};

static ckv_rope_config rope_base(ckv_rope_type type, double theta) {
    ckv_rope_config r;
    memset(&r, 0, sizeof r);
    r.type = type;
    r.theta = theta;
    r.factor = 1.0;
    r.beta_fast = 32.0;
    r.beta_slow = 1.0;
    r.truncate = 1;
    return r;
}

/* Runs ckv_rope_init_freqs and compares inv_freq and the attention scale with the reference. */
static void rope_check(const char *what, const ckv_rope_config *r, int head_dim, int max_pos, const float *ref,
                       double ref_attn) {
    float inv[256], attn = -1.0f;
    ckv_status s = ckv_rope_init_freqs(r, head_dim, max_pos, inv, &attn);
    CHECK_MSG(s == CKV_STATUS_OK, "%s: %s", what, ckv_error_message());
    if (s != CKV_STATUS_OK) return;
    ckv_test_allclose(what, inv, ref, (size_t)head_dim / 2, 0.0, 1e-6);
    CHECK_MSG(fabs((double)attn - ref_attn) <= 1e-6 * ref_attn, "%s: attention scale %.9g, expected %.9g", what,
              (double)attn, ref_attn);
}

static void test_reference_values(void) {
    ckv_rope_config r = rope_base(CKV_ROPE_TYPE_DEFAULT, 10000.0);
    rope_check("default d64", &r, 64, 2048, ref_default_64, 1.0);
    r = rope_base(CKV_ROPE_TYPE_DEFAULT, 1000000.0);
    rope_check("default d128 theta 1e6", &r, 128, 32768, ref_default_128, 1.0);

    r = rope_base(CKV_ROPE_TYPE_LINEAR, 10000.0);
    r.factor = 4.0;
    rope_check("linear x4", &r, 32, 4096, ref_linear_32, 1.0);

    r = rope_base(CKV_ROPE_TYPE_LLAMA3, 10000.0);
    r.factor = 8.0;
    r.low_freq_factor = 1.0;
    r.high_freq_factor = 4.0;
    r.original_max_position = 64;
    rope_check("llama3 original 64", &r, 64, 256, ref_llama3_small, 1.0);
    r.original_max_position = 0; /* falls back to max_position_embeddings */
    rope_check("llama3 original from max_position", &r, 64, 64, ref_llama3_small, 1.0);

    r = rope_base(CKV_ROPE_TYPE_LLAMA3, 500000.0);
    r.factor = 8.0;
    r.low_freq_factor = 1.0;
    r.high_freq_factor = 4.0;
    r.original_max_position = 8192;
    rope_check("llama3 Llama-3.1", &r, 128, 131072, ref_llama3_31, 1.0);

    const double yarn4 = 1.1386294361119891; /* 0.1 ln 4 + 1 */
    r = rope_base(CKV_ROPE_TYPE_YARN, 1000000.0);
    r.factor = 4.0;
    r.original_max_position = 32768;
    rope_check("yarn Qwen2.5 x4", &r, 128, 32768, ref_yarn_qwen, yarn4);

    r = rope_base(CKV_ROPE_TYPE_YARN, 10000.0);
    r.factor = 4.0;
    r.original_max_position = 64;
    rope_check("yarn original 64", &r, 64, 256, ref_yarn_small, yarn4);
    r.beta_fast = 0.0; /* zero betas mean the defaults, as in the reference */
    r.beta_slow = 0.0;
    rope_check("yarn zero betas", &r, 64, 256, ref_yarn_small, yarn4);

    r = rope_base(CKV_ROPE_TYPE_YARN, 10000.0);
    r.factor = 2.5;
    r.original_max_position = 64;
    r.beta_fast = 16.0;
    r.beta_slow = 2.0;
    r.mscale = 0.707;
    r.mscale_all_dim = 1.0;
    r.truncate = 0;
    rope_check("yarn mscale, betas, no truncation", &r, 32, 160, ref_yarn_mscale, 0.9754061896084153);

    r = rope_base(CKV_ROPE_TYPE_YARN, 10000.0);
    r.factor = 8.0;
    r.original_max_position = 64;
    r.attention_factor = 1.25;
    rope_check("yarn explicit attention_factor", &r, 16, 512, ref_yarn_attn, 1.25);
}

static void test_bad_arguments(void) {
    float inv[64], attn;
    ckv_rope_config r = rope_base(CKV_ROPE_TYPE_DEFAULT, 10000.0);
    CHECK_FAILS(ckv_rope_init_freqs(&r, 63, 2048, inv, &attn), CKV_STATUS_ERR_ARG, "head_dim 63");
    CHECK_FAILS(ckv_rope_init_freqs(&r, 0, 2048, inv, &attn), CKV_STATUS_ERR_ARG, "head_dim 0");
    CHECK_FAILS(ckv_rope_init_freqs(NULL, 64, 2048, inv, &attn), CKV_STATUS_ERR_ARG, "NULL");
    r.theta = 0.0;
    CHECK_FAILS(ckv_rope_init_freqs(&r, 64, 2048, inv, &attn), CKV_STATUS_ERR_ARG, "rope_theta");
    r = rope_base(CKV_ROPE_TYPE_LINEAR, 10000.0);
    r.factor = 0.0;
    CHECK_FAILS(ckv_rope_init_freqs(&r, 64, 2048, inv, &attn), CKV_STATUS_ERR_ARG, "factor");
    r = rope_base(CKV_ROPE_TYPE_LLAMA3, 10000.0);
    r.factor = 8.0;
    r.low_freq_factor = 4.0;
    r.high_freq_factor = 4.0;
    r.original_max_position = 64;
    CHECK_FAILS(ckv_rope_init_freqs(&r, 64, 2048, inv, &attn), CKV_STATUS_ERR_ARG, "high_freq_factor");
    r = rope_base(CKV_ROPE_TYPE_YARN, 10000.0);
    r.factor = 4.0;
    CHECK_FAILS(ckv_rope_init_freqs(&r, 64, 0, inv, &attn), CKV_STATUS_ERR_ARG, "original_max_position_embeddings");
    r.original_max_position = 64;
    r.attention_factor = -1.0;
    CHECK_FAILS(ckv_rope_init_freqs(&r, 64, 2048, inv, &attn), CKV_STATUS_ERR_ARG, "attention_factor");
    r = rope_base((ckv_rope_type)42, 10000.0);
    r.factor = 2.0;
    CHECK_FAILS(ckv_rope_init_freqs(&r, 64, 2048, inv, &attn), CKV_STATUS_ERR_UNSUPPORTED, "rope type 42");
}

/* config.json text -> ckv_model_config -> frequencies, for the shapes real checkpoints use. */
static void test_from_config(void) {
    static const char llama31[] =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 128256, \"hidden_size\": 4096,"
        " \"intermediate_size\": 14336, \"num_hidden_layers\": 32, \"num_attention_heads\": 32,"
        " \"num_key_value_heads\": 8, \"max_position_embeddings\": 131072, \"rope_theta\": 500000.0,"
        " \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
        " \"original_max_position_embeddings\": 8192, \"rope_type\": \"llama3\"}}";
    static const char qwen_yarn[] =
        "{\"architectures\": [\"Qwen2ForCausalLM\"], \"vocab_size\": 152064, \"hidden_size\": 3584,"
        " \"intermediate_size\": 18944, \"num_hidden_layers\": 28, \"num_attention_heads\": 28,"
        " \"num_key_value_heads\": 4, \"max_position_embeddings\": 32768, \"rope_theta\": 1000000.0,"
        " \"rope_scaling\": {\"factor\": 4.0, \"original_max_position_embeddings\": 32768, \"type\": \"yarn\"}}";
    /* transformers 5 style: theta inside rope_parameters */
    static const char v5_default[] =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 100, \"hidden_size\": 256,"
        " \"intermediate_size\": 512, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
        " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 10000.0}, \"rope_theta\": 99.0}";
    ckv_model_config cfg;
    float inv[128], attn;
    CHECK_OK(ckv_config_parse(&cfg, llama31, NULL, "llama31/config.json"));
    CHECK_OK(ckv_rope_init_freqs(&cfg.rope, cfg.head_dim, cfg.max_position_embeddings, inv, &attn));
    ckv_test_allclose("config -> llama3 Llama-3.1", inv, ref_llama3_31, 64, 0.0, 1e-6);
    CHECK(attn == 1.0f);
    CHECK_OK(ckv_config_parse(&cfg, qwen_yarn, NULL, "qwen/config.json"));
    CHECK_OK(ckv_rope_init_freqs(&cfg.rope, cfg.head_dim, cfg.max_position_embeddings, inv, &attn));
    ckv_test_allclose("config -> yarn Qwen2.5", inv, ref_yarn_qwen, 64, 0.0, 1e-6);
    CHECK(fabs((double)attn - 1.1386294361119891) < 1e-6);
    CHECK_OK(ckv_config_parse(&cfg, v5_default, NULL, "v5/config.json"));
    CHECK_OK(ckv_rope_init_freqs(&cfg.rope, cfg.head_dim, cfg.max_position_embeddings, inv, &attn));
    ckv_test_allclose("config -> default (rope_parameters)", inv, ref_default_64, 32, 0.0, 1e-6);
}

int main(void) {
    test_reference_values();
    test_bad_arguments();
    test_from_config();
    return ckv_test_finish("test_rope");
}
