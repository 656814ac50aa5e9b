/* pyramid.c - PyramidKV's per-layer kept count, step for step as kvpress's
 * PyramidKVPress.get_layer_budget computes it in Python doubles:
 *   cap = window + L * (1 - cr); min = (cap - window) / beta; max = (cap - window) * 2 - min;
 *   if max >= L - window: max = L - window, min = (cap - window) * 2 - max;
 *   if not (L >= max >= min >= window): return max(1, round(L * (1 - cr)))   (the SnapKV fallback)
 *   steps = (max - min) / (n_layers - 1) (0 for one layer); return round(max - layer * steps)
 * with Python's round (half to even). Every product is rounded on its own (no fused multiply-add,
 * which the build's -ffp-contract=fast would otherwise allow). window <= 0 and beta < 1 mean
 * kvpress's defaults 64 and 20 (kvpress rejects beta < 1). Scores are snapkv's (score_window.c);
 * this file only counts. */
#include <math.h>

#include "evict/scorer.h"

/* One rounded IEEE operation each: the volatile store keeps the compiler from contracting. */
static double pyr_mul(double a, double b) {
    volatile double r = a * b;
    return r;
}

static double pyr_div(double a, double b) {
    volatile double r = a / b;
    return r;
}

/* Python's round(x) for a float: nearest integer, halves to even. */
static double pyr_round(double x) {
    double f = floor(x);
    double frac = x - f; /* exact for |x| < 2^52 */
    if (frac > 0.5 || (frac == 0.5 && fmod(f, 2.0) != 0.0)) f += 1.0;
    return f;
}

int ckv_pyramidkv_n_kept(int layer, int n_layers, int L, double compression_ratio, int window, double beta) {
    if (window <= 0) window = 64;
    if (!(beta >= 1.0)) beta = 20.0;
    const double w = (double)window, q_len = (double)L, keep = 1.0 - compression_ratio;
    const double cap = w + pyr_mul(q_len, keep);
    double min_num = pyr_div(cap - w, beta);
    double max_num = pyr_mul(cap - w, 2.0) - min_num;
    if (max_num >= q_len - w) {
        max_num = q_len - w;
        min_num = pyr_mul(cap - w, 2.0) - max_num;
    }
    if (!(q_len >= max_num && max_num >= min_num && min_num >= w)) {
        double r = pyr_round(pyr_mul(q_len, keep));
        return r < 1.0 ? 1 : (int)r;
    }
    const double steps = n_layers > 1 ? pyr_div(max_num - min_num, (double)(n_layers - 1)) : 0.0;
    return (int)pyr_round(max_num - pyr_mul((double)layer, steps));
}
