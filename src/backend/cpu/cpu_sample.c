/* cpu_sample.c - the CPU backend's sample op (backend.h): greedy, or temperature -> top-k -> top-p
 * sampling of rows of logits with caller-supplied uniform draws, choosing the token engine/sampler.c
 * chooses. It sorts nothing and allocates nothing: the candidates form a total order (descending p,
 * then ascending index) and every cut (the k-th candidate, the end of the top-p prefix, the sampled
 * token) is the first candidate of the current prefix at which a running weight (count, or mass)
 * reaches an integer target, found by binary search over the bit patterns of p (non-negative floats
 * order as their bits) and then the tied candidates in index order, each step one pass that
 * recomputes p. The softmax's sum and the masses are the integers backend.h defines
 * (ckv_sample_exp_shift, CKV_SAMPLE_MASS_ONE), as the GPU's radix select (cuda/cuda_sample.cu) sums
 * them, so both backends pick the same tokens; this file is the reference. */
#include <math.h>
#include <string.h>

#include "cpu_backend.h"

typedef struct {
    const float *x; // [vocab]
    int vocab;
    float inv_t, mx;
    double sum;
} ckv_sample_row;

static uint32_t ckv_sample_bits(const ckv_sample_row *r, int i) {
    float p = (float)((double)expf(r->x[i] * r->inv_t - r->mx) / r->sum);
    uint32_t b;
    memcpy(&b, &p, sizeof b);
    return b;
}

/* Prefix of the candidate order: i is in it iff bits_i > tb, or bits_i == tb and i <= ti. */
typedef struct {
    uint32_t tb;
    int ti;
} ckv_sample_cut;

static int ckv_sample_in(uint32_t b, int i, ckv_sample_cut c) { return b > c.tb || (b == c.tb && i <= c.ti); }

/* A candidate's weight: 1, or its mass p * 2^61 truncated. */
static uint64_t ckv_sample_weight(uint32_t b, int mass) {
    float v;
    memcpy(&v, &b, sizeof v);
    return mass ? (uint64_t)((double)v * CKV_SAMPLE_MASS_ONE) : 1u;
}

/* Weight of the candidates of prefix c whose bits are >= lo. */
static uint64_t ckv_sample_cum(const ckv_sample_row *r, ckv_sample_cut c, uint32_t lo, int mass) {
    uint64_t acc = 0;
    for (int i = 0; i < r->vocab; i++) {
        uint32_t b = ckv_sample_bits(r, i);
        if (b >= lo && ckv_sample_in(b, i, c)) acc += ckv_sample_weight(b, mass);
    }
    return acc;
}

/* The first candidate of prefix c (in order) at which the running weight reaches T >= 1 becomes the
 * new end of c: its bits tb are the largest with weight(bits >= tb) >= T, and it is the m-th
 * candidate of bits tb, m = (T - weight(bits > tb)) / (one's weight), rounded up. */
static void ckv_sample_cut_at(const ckv_sample_row *r, ckv_sample_cut *c, uint64_t T, int mass) {
    uint32_t lo = 0, hi = 0x3f800001u; /* p <= 1: nothing has bits >= hi */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (ckv_sample_cum(r, *c, mid, mass) >= T)
            lo = mid;
        else
            hi = mid;
    }
    const uint64_t gt = ckv_sample_cum(r, *c, lo + 1, mass), unit = ckv_sample_weight(lo, mass);
    const uint64_t m = (T - gt + unit - 1) / unit;
    uint64_t seen = 0;
    int ti = -1;
    for (int i = 0; i < r->vocab; i++) {
        uint32_t b = ckv_sample_bits(r, i);
        if (b == lo && ckv_sample_in(b, i, *c)) {
            ti = i; /* the last tie if m were beyond them */
            if (++seen >= m) break;
        }
    }
    c->tb = lo;
    c->ti = ti;
}

static int32_t ckv_sample_one(const float *x, int vocab, float temperature, int top_k, float top_p, double u) {
    for (int i = 0; i < vocab; i++)
        if (!isfinite(x[i])) return CKV_SAMPLE_NONFINITE;
    int best = 0;
    for (int i = 1; i < vocab; i++)
        if (x[i] > x[best]) best = i;
    if (temperature == 0.0f) return best;
    ckv_sample_row r = {x, vocab, 1.0f / temperature, 0.0f, 0.0};
    r.mx = x[best] * r.inv_t;
    const int S = ckv_sample_exp_shift(vocab);
    const double one = ldexp(1.0, S);
    uint64_t e = 0;
    for (int i = 0; i < vocab; i++) e += (uint64_t)((double)expf(x[i] * r.inv_t - r.mx) * one);
    r.sum = (double)e * ldexp(1.0, -S);
    ckv_sample_cut c = {0, vocab - 1}; /* every candidate */
    if (top_k > 0 && top_k < vocab) ckv_sample_cut_at(&r, &c, (uint64_t)top_k, 0);
    if (top_p < 1.0f) { /* the shortest prefix whose mass reaches ceil(top_p M) */
        const uint64_t M = ckv_sample_cum(&r, c, 0, 1);
        const double t = ceil((double)top_p * (double)M);
        const uint64_t T = t < 1.0 ? 1 : (uint64_t)t;
        if (M >= T) ckv_sample_cut_at(&r, &c, T, 1);
    }
    /* the first candidate whose running mass exceeds u M; the last one when rounding puts that
     * beyond M (a count target: all of the prefix) */
    const uint64_t M = ckv_sample_cum(&r, c, 0, 1), T = (uint64_t)floor(u * (double)M) + 1;
    if (T <= M)
        ckv_sample_cut_at(&r, &c, T, 1);
    else
        ckv_sample_cut_at(&r, &c, ckv_sample_cum(&r, c, 0, 0), 0);
    return c.ti;
}

void ckv_cpu_sample(ckv_backend *be, int32_t *out, const float *logits, int n, int vocab, float temperature, int top_k,
                    float top_p, const double *u) {
    (void)be;
    for (int r = 0; r < n; r++)
        out[r] = ckv_sample_one(logits + (size_t)r * (size_t)vocab, vocab, temperature, top_k, top_p, u[r]);
}
