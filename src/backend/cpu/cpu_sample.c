/* cpu_sample.c - the CPU backend's sample op (backend.h): greedy, or temperature -> top-k -> top-p
 * sampling of rows of logits with caller-supplied uniform draws, choosing exactly the token
 * engine/sampler.c chooses. It sorts nothing and allocates nothing: the candidates form a total
 * order (descending p, then ascending index) and every cut (the k-th candidate, the end of the top-p
 * prefix, the sampled token) is found as a boundary element of that order by binary search over the
 * bit patterns of p (non-negative floats order as their bits) and then over the indices of the
 * tied candidates, each step one pass that recomputes p. The same algorithm runs on the GPU
 * (cuda/cuda_sample.cu); this file is its reference. */
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

static float ckv_sample_value(uint32_t b) {
    float v;
    memcpy(&v, &b, sizeof v);
    return v;
}

/* Sum over the prefix of the candidates whose bits are >= lo (count or mass). */
static double ckv_sample_cum(const ckv_sample_row *r, ckv_sample_cut c, uint32_t lo, int mass) {
    double acc = 0.0;
    for (int i = 0; i < r->vocab; i++) {
        uint32_t b = ckv_sample_bits(r, i);
        if (b >= lo && ckv_sample_in(b, i, c)) acc += mass ? (double)ckv_sample_value(b) : 1.0;
    }
    return acc;
}

/* The first candidate of prefix c (in order) at which the running count / mass reaches `target`
 * (>= target, or > when strict) becomes the new end of c. Returns 0 (c unchanged) when the whole
 * prefix does not reach it. */
static int ckv_sample_cut_at(const ckv_sample_row *r, ckv_sample_cut *c, double target, int mass, int strict) {
#define CKV_REACH(v) (strict ? (v) > target : (v) >= target)
    if (!CKV_REACH(ckv_sample_cum(r, *c, 0, mass))) return 0;
    uint32_t lo = 0, hi = 0x3f800001u; /* p <= 1: nothing has bits >= hi */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (CKV_REACH(ckv_sample_cum(r, *c, mid, mass)))
            lo = mid;
        else
            hi = mid;
    }
    const double gt = ckv_sample_cum(r, *c, lo + 1, mass), w = mass ? (double)ckv_sample_value(lo) : 1.0;
    double ties = 0.0;
    for (int i = 0; i < r->vocab; i++) {
        uint32_t b = ckv_sample_bits(r, i);
        ties += b == lo && ckv_sample_in(b, i, *c);
    }
    double m = strict ? floor((target - gt) / w) + 1.0 : ceil((target - gt) / w); /* ties needed */
    m = m < 1.0 ? 1.0 : m > ties ? ties : m;
    int seen = 0;
    for (int i = 0; i < r->vocab; i++) {
        uint32_t b = ckv_sample_bits(r, i);
        if (b == lo && ckv_sample_in(b, i, *c) && ++seen >= (int)m) {
            c->tb = lo;
            c->ti = i;
            break;
        }
    }
#undef CKV_REACH
    return 1;
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
    for (int i = 0; i < vocab; i++) r.sum += (double)expf(x[i] * r.inv_t - r.mx);
    ckv_sample_cut c = {0, vocab - 1}; /* every candidate */
    if (top_k > 0 && top_k < vocab) ckv_sample_cut_at(&r, &c, (double)top_k, 0, 0);
    if (top_p < 1.0f) ckv_sample_cut_at(&r, &c, (double)top_p * ckv_sample_cum(&r, c, 0, 1), 1, 0);
    const double target = u * ckv_sample_cum(&r, c, 0, 1);
    if (ckv_sample_cut_at(&r, &c, target, 1, 1)) return c.ti;
    /* rounding never got there: the last candidate of the prefix */
    int last = -1;
    uint32_t lb = 0;
    for (int i = 0; i < vocab; i++) {
        uint32_t b = ckv_sample_bits(&r, i);
        if (ckv_sample_in(b, i, c) && (last < 0 || b < lb || b == lb)) last = i, lb = b;
    }
    return last;
}

void ckv_cpu_sample(ckv_backend *be, int32_t *out, const float *logits, int n, int vocab, float temperature, int top_k,
                    float top_p, const double *u) {
    (void)be;
    for (int r = 0; r < n; r++)
        out[r] = ckv_sample_one(logits + (size_t)r * (size_t)vocab, vocab, temperature, top_k, top_p, u[r]);
}
