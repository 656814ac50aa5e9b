/* cuda_sample.cu - the sample op on the GPU (backend.h): one block per row of logits. Greedy is an
 * argmax reduction. Otherwise the candidates form a total order (descending p, then ascending index)
 * and every cut (the top_k-th candidate, the end of the top-p prefix, the sampled token) is found as
 * a boundary element of that order: a binary search over the bit patterns of p (non-negative floats
 * order as their bits), then one over the indices of the tied candidates, each step a block-wide
 * count or mass (double) over the row that recomputes p. It sorts nothing and needs no workspace;
 * the CPU reference (cpu/cpu_sample.c) is the same algorithm, so both pick the same tokens as
 * engine/sampler.c up to the last bit of the sums. The first pass over the row also counts its
 * non-finite values (a row with any samples CKV_SAMPLE_NONFINITE). */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr unsigned THREADS = 256;

struct row_state {
    const float *x; // [vocab]
    int vocab;
    float inv_t, mx;
    double sum;
    __device__ __forceinline__ uint32_t bits(int i) const {
        const float p = (float)((double)expf(x[i] * inv_t - mx) / sum);
        return __float_as_uint(p);
    }
};

/* Prefix of the candidate order: i is in it iff bits_i > tb, or bits_i == tb and i <= ti. */
struct cut {
    uint32_t tb;
    int ti;
    __device__ __forceinline__ bool in(uint32_t b, int i) const { return b > tb || (b == tb && i <= ti); }
};

/* Block-wide sum over the prefix of the candidates with bits >= lo (mass: their p; else 1), or with
 * bits == lo and index <= imax when imax >= 0. Every thread gets the total. */
__device__ double cum(const row_state &r, cut c, uint32_t lo, bool mass, int imax, double *red) {
    double acc = 0.0;
    for (int i = (int)threadIdx.x; i < r.vocab; i += (int)blockDim.x) {
        const uint32_t b = r.bits(i);
        const bool hit = imax >= 0 ? b == lo && i <= imax : b >= lo;
        if (hit && c.in(b, i)) acc += mass ? (double)__uint_as_float(b) : 1.0;
    }
    return block_sum(acc, red);
}

/* The first candidate of prefix c at which the running count / mass reaches target (>=, or > when
 * strict) becomes the new end of c; false (c unchanged) when the whole prefix does not reach it.
 * Uniform over the block: every decision is on block-wide totals. */
__device__ bool cut_at(const row_state &r, cut *c, double target, bool mass, bool strict, double *red) {
    const double all = cum(r, *c, 0u, mass, -1, red);
    if (!(strict ? all > target : all >= target)) return false;
    uint32_t lo = 0u, hi = 0x3f800001u; /* p <= 1: nothing has bits >= hi */
    while (hi - lo > 1u) {
        const uint32_t mid = lo + (hi - lo) / 2u;
        const double v = cum(r, *c, mid, mass, -1, red);
        if (strict ? v > target : v >= target)
            lo = mid;
        else
            hi = mid;
    }
    const double gt = cum(r, *c, lo + 1u, mass, -1, red), w = mass ? (double)__uint_as_float(lo) : 1.0;
    const double ties = cum(r, *c, lo, false, r.vocab - 1, red);
    double m = strict ? floor((target - gt) / w) + 1.0 : ceil((target - gt) / w); /* ties needed */
    m = m < 1.0 ? 1.0 : m > ties ? ties : m;
    int ilo = -1, ihi = r.vocab - 1; /* count(ties <= ilo) < m <= count(ties <= ihi) */
    while (ihi - ilo > 1) {
        const int mid = ilo + (ihi - ilo) / 2;
        if (cum(r, *c, lo, false, mid, red) >= m)
            ihi = mid;
        else
            ilo = mid;
    }
    c->tb = lo;
    c->ti = ihi;
    return true;
}

/* (value, index) reduction: the larger value, the lower index on ties. */
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
    return ib < 0 || (ia >= 0 && (va > vb || (va == vb && ia < ib)));
}

__device__ int block_argbest(float v, int i, float *sv, int *si) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) v = ov, i = oi;
    }
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, nw = (int)blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sv[warp] = v, si[warp] = i;
    __syncthreads();
    v = lane < nw ? sv[lane] : 0.0f;
    i = lane < nw ? si[lane] : -1;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, i, o);
        if (better(ov, oi, v, i)) v = ov, i = oi;
    }
    return i;
}

__global__ void sample_kernel(int32_t *out, const float *logits, int vocab, float temperature, int top_k, float top_p,
                              const double *u) {
    __shared__ double red[32];
    __shared__ float sv[32];
    __shared__ int si[32];
    const float *x = logits + (size_t)blockIdx.x * (size_t)vocab; // [vocab]
    int bi = -1;
    double bad = 0.0;
    for (int i = (int)threadIdx.x; i < vocab; i += (int)blockDim.x) {
        const float v = x[i];
        bad += isfinite(v) ? 0.0 : 1.0;
        if (bi < 0 || v > x[bi]) bi = i;
    }
    if (block_sum(bad, red) > 0.0) { /* uniform: every thread has the total */
        if (threadIdx.x == 0) out[blockIdx.x] = CKV_SAMPLE_NONFINITE;
        return;
    }
    const int best = block_argbest(bi >= 0 ? x[bi] : 0.0f, bi, sv, si);
    if (temperature == 0.0f) {
        if (threadIdx.x == 0) out[blockIdx.x] = best;
        return;
    }
    row_state r = {x, vocab, 1.0f / temperature, 0.0f, 0.0};
    r.mx = x[best] * r.inv_t;
    double s = 0.0;
    for (int i = (int)threadIdx.x; i < vocab; i += (int)blockDim.x) s += (double)expf(x[i] * r.inv_t - r.mx);
    r.sum = block_sum(s, red);
    cut c = {0u, vocab - 1}; /* every candidate */
    if (top_k > 0 && top_k < vocab) cut_at(r, &c, (double)top_k, false, false, red);
    if (top_p < 1.0f) cut_at(r, &c, (double)top_p * cum(r, c, 0u, true, -1, red), true, false, red);
    const double target = u[blockIdx.x] * cum(r, c, 0u, true, -1, red);
    int token;
    if (cut_at(r, &c, target, true, true, red)) {
        token = c.ti;
    } else { /* rounding never got there: the last candidate of the prefix (lowest p, highest index) */
        int li = -1;
        uint32_t lb = 0u;
        for (int i = (int)threadIdx.x; i < vocab; i += (int)blockDim.x) {
            const uint32_t b = r.bits(i);
            if (c.in(b, i) && (li < 0 || b <= lb)) li = i, lb = b;
        }
        /* the last in order = the best under (-p, index descending): reuse the reduction */
        token = block_argbest(li >= 0 ? -__uint_as_float(lb) : 0.0f, li >= 0 ? vocab - 1 - li : -1, sv, si);
        token = token >= 0 ? vocab - 1 - token : vocab - 1;
    }
    if (threadIdx.x == 0) out[blockIdx.x] = token;
}

} // namespace

void sample(ckv_backend *be, int32_t *out, const float *logits, int n, int vocab, float temperature, int top_k,
            float top_p, const double *u) {
    ctx *c = ctx_of(be);
    if (n <= 0 || vocab <= 0) return;
    CKV_LAUNCH(sample_kernel, dim3((unsigned)n), dim3(THREADS), 0, c->stream, out, logits, vocab, temperature, top_k,
               top_p, u);
    op_done(c, "sample");
}

} // namespace CKV_CUDA_NS
