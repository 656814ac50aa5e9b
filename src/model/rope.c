/* rope.c - rotary-embedding inverse frequencies for the default, linear, llama3 and yarn rope types,
 * following the arithmetic of Hugging Face transformers step by step: exponents, powers, reciprocals
 * and blends are rounded to fp32 where the reference keeps fp32 tensors, and the scalar set-up
 * (wavelength bounds, correction range, attention factor) is done in double as the reference does
 * in Python. Every fp32 operation goes through a helper that rounds once, so the compiler cannot fuse
 * a multiply and an add into an FMA the reference does not perform. The one known source of a
 * difference is pow: the reference's vectorised powf is not correctly rounded and may differ from
 * ours by one ulp. This file applies no rotation and reads no config; it validates its inputs only. */
#include "model/rope.h"

#include <math.h>

#include "core/status.h"

/* fp32 arithmetic with a single rounding per operation (double holds every exact product of two
 * floats, and rounding a double sum/quotient to float gives the correctly rounded fp32 result). */
static float rope_f32_mul(float a, float b) { return (float)((double)a * (double)b); }
static float rope_f32_div(float a, float b) { return (float)((double)a / (double)b); }
static float rope_f32_add(float a, float b) { return (float)((double)a + (double)b); }
static float rope_f32_sub(float a, float b) { return (float)((double)a - (double)b); }

/* base ** (arange(0, dim, 2) / dim) as the reference builds it: the integer index becomes fp32, is
 * divided by dim in fp32, and the fp32-rounded base is raised to that power. */
static float rope_pos_freq(double base, int i, int dim) {
    float e = rope_f32_div((float)(2 * i), (float)dim);
    return (float)pow((double)(float)base, (double)e);
}

/* YaRN: the dimension at which a frequency completes `num_rotations` turns over `max_pos`. */
static double rope_yarn_correction_dim(double num_rotations, int dim, double base, double max_pos) {
    const double pi = 3.14159265358979323846;
    return ((double)dim * log(max_pos / (num_rotations * 2.0 * pi))) / (2.0 * log(base));
}

static double rope_yarn_mscale(double scale, double mscale) {
    if (scale <= 1.0) return 1.0;
    return 0.1 * mscale * log(scale) + 1.0;
}

static void rope_default(double theta, int dim, float *inv_freq) {
    for (int i = 0; i < dim / 2; i++) inv_freq[i] = rope_f32_div(1.0f, rope_pos_freq(theta, i, dim));
}

static void rope_llama3(const ckv_rope_config *r, int orig, int dim, float *inv_freq) {
    const double pi = 3.14159265358979323846;
    const float two_pi = (float)(2.0 * pi);
    const float factor = (float)r->factor;
    const double old_ctx = (double)orig;
    const float low_wavelen = (float)(old_ctx / r->low_freq_factor);
    const float high_wavelen = (float)(old_ctx / r->high_freq_factor);
    const float low = (float)r->low_freq_factor;
    const float span = (float)(r->high_freq_factor - r->low_freq_factor);
    for (int i = 0; i < dim / 2; i++) {
        float inv = rope_f32_div(1.0f, rope_pos_freq(r->theta, i, dim));
        /* python scalar / tensor is reciprocal(tensor) * scalar */
        float wavelen = rope_f32_mul(rope_f32_div(1.0f, inv), two_pi);
        float inv_llama = wavelen > low_wavelen ? rope_f32_div(inv, factor) : inv;
        float ctx_over_wl = rope_f32_mul(rope_f32_div(1.0f, wavelen), (float)old_ctx);
        float smooth = rope_f32_div(rope_f32_sub(ctx_over_wl, low), span);
        float smoothed = rope_f32_add(rope_f32_div(rope_f32_mul(rope_f32_sub(1.0f, smooth), inv_llama), factor),
                                      rope_f32_mul(smooth, inv_llama));
        int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        inv_freq[i] = medium ? smoothed : inv_llama;
    }
}

static void rope_yarn(const ckv_rope_config *r, int orig, int dim, float *inv_freq, float *attn_scale) {
    double factor = r->factor;
    double attention = r->attention_factor;
    if (attention <= 0.0) {
        if (r->mscale != 0.0 && r->mscale_all_dim != 0.0)
            attention = rope_yarn_mscale(factor, r->mscale) / rope_yarn_mscale(factor, r->mscale_all_dim);
        else
            attention = rope_yarn_mscale(factor, 1.0);
    }
    /* the reference treats a zero beta as absent (`x or default`) */
    double beta_fast = r->beta_fast != 0.0 ? r->beta_fast : 32.0;
    double beta_slow = r->beta_slow != 0.0 ? r->beta_slow : 1.0;

    double low = rope_yarn_correction_dim(beta_fast, dim, r->theta, (double)orig);
    double high = rope_yarn_correction_dim(beta_slow, dim, r->theta, (double)orig);
    if (r->truncate) {
        low = floor(low);
        high = ceil(high);
    }
    if (low < 0.0) low = 0.0;
    if (high > (double)(dim - 1)) high = (double)(dim - 1);
    if (low == high) high += 0.001; /* the reference's guard against a zero-width ramp */
    const float ramp_min = (float)low;
    const float ramp_span = (float)(high - low);

    const float f = (float)factor;
    for (int i = 0; i < dim / 2; i++) {
        float pos = rope_pos_freq(r->theta, i, dim);
        float extrapolation = rope_f32_div(1.0f, pos);
        float interpolation = rope_f32_div(1.0f, rope_f32_mul(f, pos));
        float ramp = rope_f32_div(rope_f32_sub((float)i, ramp_min), ramp_span);
        if (ramp < 0.0f) ramp = 0.0f;
        if (ramp > 1.0f) ramp = 1.0f;
        float extrapolation_factor = rope_f32_sub(1.0f, ramp);
        inv_freq[i] = rope_f32_add(rope_f32_mul(interpolation, rope_f32_sub(1.0f, extrapolation_factor)),
                                   rope_f32_mul(extrapolation, extrapolation_factor));
    }
    *attn_scale = (float)attention;
}

ckv_status ckv_rope_init_freqs(const ckv_rope_config *rope, int head_dim, int max_position_embeddings,
                               float *inv_freq, float *attn_scale) {
    if (!rope || !inv_freq || !attn_scale) return ckv_error(CKV_STATUS_ERR_ARG, "rope: NULL argument");
    if (head_dim <= 0 || head_dim % 2 != 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "rope: head_dim %d must be positive and even", head_dim);
    if (!(rope->theta > 0.0) || !isfinite(rope->theta))
        return ckv_error(CKV_STATUS_ERR_ARG, "rope: rope_theta %g must be positive", rope->theta);
    if (rope->type != CKV_ROPE_TYPE_DEFAULT && (!(rope->factor > 0.0) || !isfinite(rope->factor)))
        return ckv_error(CKV_STATUS_ERR_ARG, "rope: factor %g must be positive", rope->factor);
    int orig = rope->original_max_position > 0 ? rope->original_max_position : max_position_embeddings;

    *attn_scale = 1.0f;
    switch (rope->type) {
    case CKV_ROPE_TYPE_DEFAULT:
        rope_default(rope->theta, head_dim, inv_freq);
        return CKV_STATUS_OK;
    case CKV_ROPE_TYPE_LINEAR:
        rope_default(rope->theta, head_dim, inv_freq);
        for (int i = 0; i < head_dim / 2; i++) inv_freq[i] = rope_f32_div(inv_freq[i], (float)rope->factor);
        return CKV_STATUS_OK;
    case CKV_ROPE_TYPE_LLAMA3:
        if (orig <= 0)
            return ckv_error(CKV_STATUS_ERR_ARG, "rope: llama3 original_max_position_embeddings %d must be positive",
                             orig);
        if (!(rope->low_freq_factor > 0.0) || !(rope->high_freq_factor > rope->low_freq_factor))
            return ckv_error(CKV_STATUS_ERR_ARG,
                             "rope: llama3 needs 0 < low_freq_factor < high_freq_factor (got %g and %g)",
                             rope->low_freq_factor, rope->high_freq_factor);
        rope_llama3(rope, orig, head_dim, inv_freq);
        return CKV_STATUS_OK;
    case CKV_ROPE_TYPE_YARN:
        if (orig <= 0)
            return ckv_error(CKV_STATUS_ERR_ARG, "rope: yarn original_max_position_embeddings %d must be positive",
                             orig);
        if (rope->attention_factor < 0.0)
            return ckv_error(CKV_STATUS_ERR_ARG, "rope: yarn attention_factor %g must not be negative",
                             rope->attention_factor);
        rope_yarn(rope, orig, head_dim, inv_freq, attn_scale);
        return CKV_STATUS_OK;
    }
    return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "rope: unknown rope type %d", (int)rope->type);
}
