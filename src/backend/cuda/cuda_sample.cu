/* cuda_sample.cu - the sample op on the GPU (backend.h), each row spread over blocks that take a span
 * of whole 2,048-entry chunks (about two blocks per SM over all rows). Greedy is an argmax over
 * per-span partials. Otherwise p is computed once per entry into the split-KV partials' workspace,
 * and every cut of the candidate order (descending p, then ascending index) - the top_k-th
 * candidate, the end of the top-p prefix, the sampled token - is a radix select over the bit
 * patterns of p (non-negative floats order as their bits): three passes, each a histogram of the
 * next digit (11, 11, 9 bits) of the entries of the current prefix that match the digits found so
 * far, counts and masses as integers (backend.h: masses p * 2^61 truncated, exact and order-free;
 * each pass's blocks find the earlier digits from the earlier histograms alike), then one block per
 * row finds the boundary entry among the tied ones from the last pass's per-span counts and a scan
 * of one span. The softmax's sum is an integer too, so the token is a function of (logits, T,
 * top_k, top_p, u) alone, the same for any grid and the same as the CPU reference's
 * (cpu/cpu_sample.c: the same arithmetic). Launches, all on the stream, no host wait, nothing
 * allocated once the workspace holds the rows: greedy 2; sampled 3, then 3 for the first cut and 4
 * for each further one (top-k when 0 < top_k < vocab, top-p when top_p < 1, the draw). A row with a
 * non-finite logit samples CKV_SAMPLE_NONFINITE. Cost model: docs/gpu.md. */
#include "cuda_internal.h"

namespace CKV_CUDA_NS {

namespace {

constexpr unsigned THREADS = 256;
constexpr int ITEMS = 8;                         /* entries per thread per tile */
constexpr int TILE = (int)THREADS * ITEMS;       /* entries of one row per block */
constexpr int LEVELS = 3;                        /* radix passes over the 31 bits of p (bit 31 is 0) */
constexpr int LAST_BINS = 512;                   /* bins of the last level */
constexpr int HBINS = 2048 + 2048 + LAST_BINS;   /* bins of one row, all levels */

/* The digits: bits [20, 31), [9, 20), [0, 9); a level's bins and its first bin in a row's histograms. */
__host__ __device__ __forceinline__ int level_shift(int l) { return l == 0 ? 20 : l == 1 ? 9 : 0; }
__host__ __device__ __forceinline__ int level_bins(int l) { return l == 2 ? LAST_BINS : 2048; }
__host__ __device__ __forceinline__ int level_bin0(int l) { return l * 2048; }

enum cut_kind { CUT_TOPK, CUT_TOPP, CUT_DRAW };

/* The prefix of the candidate order a row's later cuts search (i is in it iff bits_i > tb, or
 * bits_i == tb and i <= ti), mx the row's max logit / T, done once out[r] is written. */
struct row_state {
    uint32_t tb;
    int ti, done;
    float mx;
};

struct tile_max {
    float v;
    int i, bad;
};

/* The op's scratch in the split-KV partials (the ops run in stream order): rows x (state, tile
 * partials, p's bits, histograms (counts and masses per level), the last level's per-tile counts). */
struct scratch {
    row_state *st;  /* [n] */
    tile_max *tmax; /* [n, tiles] */
    uint64_t *tsum; /* [n, tiles] the tiles' exp sums, fixed point */
    uint32_t *p;    /* [n, vocab] bits of p */
    uint32_t *hcnt; /* [n, HBINS] */
    uint64_t *hmass; /* [n, HBINS] */
    uint32_t *tcnt; /* [n, tiles, LAST_BINS] */
};

size_t scratch_bytes(int n, int tiles, int vocab, size_t *at) {
    const size_t rows = (size_t)n, t = (size_t)tiles;
    const size_t b[7] = {sizeof(row_state) * rows,         sizeof(tile_max) * rows * t,
                         sizeof(uint64_t) * rows * t,      sizeof(uint32_t) * rows * (size_t)vocab,
                         sizeof(uint32_t) * rows * HBINS,  sizeof(uint64_t) * rows * HBINS,
                         sizeof(uint32_t) * rows * t * LAST_BINS};
    return parts_total(b, 7, at);
}

/* One cut of a launch: its kind and setting (u: the draws). */
struct cut_args {
    int kind, top_k;
    float top_p;
    const double *u;
};

__device__ __forceinline__ uint64_t mass_of(uint32_t b) { return (uint64_t)((double)__uint_as_float(b) * CKV_SAMPLE_MASS_ONE); }

__device__ __forceinline__ bool in_prefix(const row_state &s, uint32_t b, int i) {
    return b > s.tb || (b == s.tb && i <= s.ti);
}

/* (value, index) reduction: the larger value, the lower index on ties. */
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
    return ib < 0 || (ia >= 0 && (va > vb || (va == vb && ia < ib)));
}

__device__ void block_argbest(float *v, int *i, float *sv, int *si) {
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, *v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, *i, o);
        if (better(ov, oi, *v, *i)) *v = ov, *i = oi;
    }
    const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31, nw = (int)blockDim.x >> 5;
    __syncthreads();
    if (lane == 0) sv[warp] = *v, si[warp] = *i;
    __syncthreads();
    *v = lane < nw ? sv[lane] : 0.0f;
    *i = lane < nw ? si[lane] : -1;
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, *v, o);
        const int oi = __shfl_xor_sync(0xffffffffu, *i, o);
        if (better(ov, oi, *v, *i)) *v = ov, *i = oi;
    }
}

/* Shared scratch of the searches. */
struct search_smem {
    uint64_t wsum[32];
    uint64_t res[2];
};

/* A cut's search after some levels of its passes: whether its target lies in the prefix (reach), the
 * weight (use_mass), the digits found (prefix), the weight still needed among the entries that match
 * them (T), and the last level's bin. */
struct search {
    int reach, use_mass, bin;
    uint32_t prefix;
    uint64_t T;
};

/* The target from the prefix's count C and mass M (the first level's totals): top-k: count k;
 * top-p: mass ceil(top_p M); the draw: mass floor(u M) + 1, or, when rounding puts that beyond M,
 * count C (the prefix's last candidate). */
__device__ __forceinline__ void cut_target(cut_args cut, int r, uint64_t C, uint64_t M, search *s) {
    s->reach = 1, s->use_mass = 1;
    if (cut.kind == CUT_TOPK) {
        s->use_mass = 0;
        s->T = (uint64_t)cut.top_k;
        s->reach = C > s->T;
    } else if (cut.kind == CUT_TOPP) {
        const double t = ceil((double)cut.top_p * (double)M);
        s->T = t < 1.0 ? 1 : (uint64_t)t;
        s->reach = M >= s->T;
    } else {
        s->T = (uint64_t)floor(cut.u[r] * (double)M) + 1;
        if (s->T > M) s->use_mass = 0, s->T = C;
    }
}

/* Shared histogram of one block (also the staging of a row's level for a search). */
struct hist_smem {
    uint32_t cnt[2048];
    uint64_t mass[2048];
};

/* One level of a row's histograms (cnt, mass): the bin at which the running weight (counts, or
 * masses when use_mass) from the top bin down reaches s->T, which becomes what is still needed
 * inside it. At the first level (first) the cut's target comes from the level's totals first. The
 * level is staged into h by coalesced loads; thread t sums bins of its own descending run (read in a
 * rotated order: no bank conflicts), a scan finds the run holding the crossing and its thread walks
 * it. Uniform: every thread calls and gets the result. */
__device__ __forceinline__ void pick_level(const uint32_t *cnt, const uint64_t *mass, int level, int first,
                                          cut_args cut, int r, search *s, search_smem *sm, hist_smem *h) {
    const int nb = level_bins(level), per = nb / (int)blockDim.x, top = nb - 1 - (int)threadIdx.x * per;
    for (int j = (int)threadIdx.x; j < nb; j += (int)blockDim.x) h->cnt[j] = cnt[j], h->mass[j] = mass[j];
    __syncthreads();
    uint64_t sc = 0, smass = 0;
    for (int j = 0; j < per; j++) {
        const int b = top - (j + (int)threadIdx.x) % per;
        sc += h->cnt[b], smass += h->mass[b];
    }
    uint64_t C = 0, M = 0;
    const uint64_t bc = block_scan_excl(sc, sm->wsum, &C), bm = block_scan_excl(smass, sm->wsum, &M);
    if (first) cut_target(cut, r, C, M, s);
    if (s->reach) { /* uniform */
        const uint64_t before = s->use_mass ? bm : bc, mine = s->use_mass ? smass : sc;
        if (before < s->T && s->T <= before + mine) {
            uint64_t acc = before;
            for (int j = 0; j < per; j++) {
                const uint64_t w = s->use_mass ? h->mass[top - j] : (uint64_t)h->cnt[top - j];
                if (acc + w >= s->T) {
                    sm->res[0] = (uint64_t)(top - j);
                    sm->res[1] = s->T - acc;
                    break;
                }
                acc += w;
            }
        }
        __syncthreads();
        s->bin = (int)sm->res[0];
        s->T = sm->res[1];
        s->prefix |= (uint32_t)s->bin << level_shift(level);
    }
    __syncthreads(); /* h and res may be written next */
}

/* A cut's target and the digits of its first `levels` levels (>= 1) from their histograms. */
__device__ __forceinline__ search descend(cut_args cut, int r, const uint32_t *hc, const uint64_t *hm, int levels,
                          search_smem *sm, hist_smem *h) {
    search s = {1, 1, 0, 0u, 0};
    for (int l = 0; l < levels && s.reach; l++)
        pick_level(hc + level_bin0(l), hm + level_bin0(l), l, l == 0, cut, r, &s, sm, h);
    return s;
}

__device__ __forceinline__ void hist_clear(hist_smem *h, int level) {
    for (int j = (int)threadIdx.x; j < level_bins(level); j += (int)blockDim.x) h->cnt[j] = 0u, h->mass[j] = 0;
    __syncthreads();
}

/* Adds one chunk's entries to the block's histogram of level `level`: those of the row's prefix whose
 * higher digits are `prefix`'s. bits: the k-th is entry i0 + threadIdx.x + k * THREADS, n entries. */
__device__ __forceinline__ void hist_add(const uint32_t (&bits)[ITEMS], int i0, int n, const row_state &st, int level,
                                         uint32_t prefix, hist_smem *h) {
    const int nb = level_bins(level), shift = level_shift(level), hi = level == 0 ? 31 : level_shift(level - 1);
    CKV_UNROLL
    for (int k = 0; k < ITEMS; k++) {
        const int i = (int)threadIdx.x + k * (int)THREADS;
        const uint32_t b = bits[k];
        if (i < n && in_prefix(st, b, i0 + i) && (b >> hi) == (prefix >> hi)) {
            const uint32_t bin = (b >> shift) & (uint32_t)(nb - 1);
            atomicAdd(&h->cnt[bin], 1u);
            atomicAdd((unsigned long long *)&h->mass[bin], (unsigned long long)mass_of(b));
        }
    }
}

/* The block's histogram of level `level` over entries [t0, end) of the row, chunk by chunk; key(i) is
 * entry i's bits (sample_p_kernel computes and stores them there). */
template <typename K>
__device__ __forceinline__ void hist_span(int t0, int end, const row_state &st, int level, uint32_t prefix,
                                          hist_smem *h, K key) {
    hist_clear(h, level);
    for (int c0 = t0; c0 < end; c0 += TILE) {
        const int n = end - c0 < TILE ? end - c0 : TILE;
        uint32_t bits[ITEMS];
        CKV_UNROLL
        for (int k = 0; k < ITEMS; k++) {
            const int i = (int)threadIdx.x + k * (int)THREADS;
            bits[k] = i < n ? key(c0 + i) : 0u;
        }
        hist_add(bits, c0, n, st, level, prefix, h);
    }
}

/* The block's histogram added to the row's (gc, gm: all levels), and at the last level its counts
 * written to tc [LAST_BINS] (the span's ties per bin). */
__device__ __forceinline__ void hist_flush(int level, uint32_t *gc, uint64_t *gm, uint32_t *tc, hist_smem *h) {
    __syncthreads();
    for (int j = (int)threadIdx.x; j < level_bins(level); j += (int)blockDim.x) {
        const uint32_t c = h->cnt[j];
        if (c) {
            atomicAdd(&gc[level_bin0(level) + j], c);
            atomicAdd((unsigned long long *)&gm[level_bin0(level) + j], (unsigned long long)h->mass[j]);
        }
        if (tc) tc[j] = c;
    }
}

/* Per span: the largest logit (lowest index on ties) and the non-finite count; the rows' histograms
 * zeroed (the first cut's passes add to them). */
__global__ void sample_max_kernel(scratch w, const float *logits, int vocab, int span) {
    __shared__ int red[32];
    __shared__ float sv[32];
    __shared__ int si[32];
    const int r = (int)blockIdx.y, tiles = (int)gridDim.x, t0 = (int)blockIdx.x * span;
    const float *x = logits + (size_t)r * (size_t)vocab; // [vocab]
    const int end = vocab - t0 < span ? vocab : t0 + span;
    float bv = 0.0f;
    int bi = -1, bad = 0;
    for (int i = t0 + (int)threadIdx.x; i < end; i += (int)blockDim.x) {
        const float v = x[i];
        bad += isfinite(v) ? 0 : 1;
        if (bi < 0 || v > bv) bv = v, bi = i;
    }
    bad = block_sum(bad, red);
    block_argbest(&bv, &bi, sv, si);
    if (threadIdx.x == 0) w.tmax[(size_t)r * tiles + blockIdx.x] = tile_max{bv, bi, bad};
    for (int j = (int)(blockIdx.x * blockDim.x + threadIdx.x); j < HBINS; j += (int)(gridDim.x * blockDim.x)) {
        w.hcnt[(size_t)r * HBINS + j] = 0u;
        w.hmass[(size_t)r * HBINS + j] = 0;
    }
}

/* Greedy rows and rows with a non-finite logit are done (out written by block 0); otherwise each
 * span's sum of exp(x / T - mx) as an integer: each term times exp_one = 2^ckv_sample_exp_shift
 * (vocab), truncated (backend.h). The row's argmax from the span partials (order-free). */
__global__ void sample_exp_kernel(scratch w, int32_t *out, const float *logits, int vocab, int span, float temperature,
                                  double exp_one) {
    __shared__ uint64_t red[32];
    __shared__ int ired[32];
    __shared__ float sv[32];
    __shared__ int si[32];
    const int r = (int)blockIdx.y, tiles = (int)gridDim.x, t0 = (int)blockIdx.x * span;
    float bv = 0.0f;
    int bi = -1, bad = 0;
    for (int t = (int)threadIdx.x; t < tiles; t += (int)blockDim.x) {
        const tile_max q = w.tmax[(size_t)r * tiles + t];
        bad += q.bad;
        if (better(q.v, q.i, bv, bi)) bv = q.v, bi = q.i;
    }
    bad = block_sum(bad, ired);
    block_argbest(&bv, &bi, sv, si);
    const int done = bad > 0 || temperature == 0.0f;
    const float inv_t = done ? 0.0f : 1.0f / temperature, mx = bv * inv_t;
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        w.st[r] = row_state{0u, vocab - 1, done, mx};
        if (done) out[r] = bad > 0 ? CKV_SAMPLE_NONFINITE : bi;
    }
    if (done) return;
    const float *x = logits + (size_t)r * (size_t)vocab; // [vocab]
    const int end = vocab - t0 < span ? vocab : t0 + span;
    uint64_t s = 0;
    for (int i = t0 + (int)threadIdx.x; i < end; i += (int)blockDim.x)
        s += (uint64_t)((double)expf(x[i] * inv_t - mx) * exp_one);
    s = block_sum(s, red);
    if (threadIdx.x == 0) w.tsum[(size_t)r * tiles + blockIdx.x] = s;
}

/* p = exp(x / T - mx) / sum for the span's entries, stored as bits, and the first level of the first
 * cut's histogram (its prefix: the whole row). */
__global__ void sample_p_kernel(scratch w, const float *logits, int vocab, int span, float temperature,
                                double exp_unit) {
    __shared__ hist_smem h;
    __shared__ uint64_t red[32];
    const int r = (int)blockIdx.y, tiles = (int)gridDim.x, t0 = (int)blockIdx.x * span;
    const row_state st = w.st[r];
    if (st.done) return; /* uniform */
    uint64_t e = 0;
    for (int t = (int)threadIdx.x; t < tiles; t += (int)blockDim.x) e += w.tsum[(size_t)r * tiles + t];
    const double sum = (double)block_sum(e, red) * exp_unit;
    const float inv_t = 1.0f / temperature;
    const float *x = logits + (size_t)r * (size_t)vocab; // [vocab]
    uint32_t *p = w.p + (size_t)r * (size_t)vocab;      // [vocab]
    const int end = vocab - t0 < span ? vocab : t0 + span;
    hist_span(t0, end, st, 0, 0u, &h, [&](int i) {
        const uint32_t b = __float_as_uint((float)((double)expf(x[i] * inv_t - st.mx) / sum));
        p[i] = b;
        return b;
    });
    hist_flush(0, w.hcnt + (size_t)r * HBINS, w.hmass + (size_t)r * HBINS, NULL, &h);
}

/* Level `level` of a cut's histogram over the stored p (the digits of the levels before it found
 * from their histograms by every block alike). */
__global__ void sample_hist_kernel(scratch w, int vocab, int span, cut_args cut, int level) {
    __shared__ hist_smem h;
    __shared__ search_smem sm;
    const int r = (int)blockIdx.y, tiles = (int)gridDim.x, t0 = (int)blockIdx.x * span;
    const row_state st = w.st[r];
    if (st.done) return; /* uniform */
    uint32_t *hc = w.hcnt + (size_t)r * HBINS;
    uint64_t *hm = w.hmass + (size_t)r * HBINS;
    /* the first level histograms the whole prefix: its target is found from that histogram */
    const search s = level ? descend(cut, r, hc, hm, level, &sm, &h) : search{1, 1, 0, 0u, 0};
    if (!s.reach) return; /* uniform */
    const uint32_t *p = w.p + (size_t)r * (size_t)vocab; // [vocab]
    const int end = vocab - t0 < span ? vocab : t0 + span;
    hist_span(t0, end, st, level, s.prefix, &h, [&](int i) { return p[i]; });
    uint32_t *tc = level == LEVELS - 1 ? w.tcnt + ((size_t)r * tiles + blockIdx.x) * LAST_BINS : NULL;
    hist_flush(level, hc, hm, tc, &h);
}

/* One block per row: the cut's boundary entry. Its bits tb are the digits of the three levels; it is
 * the m-th entry of bits tb in the prefix (index order), m the weight still needed over one entry's
 * weight, rounded up; the span holding it from the last level's per-span counts, then a scan of that
 * span. The prefix ends there (the draw: out[r] is it); the histograms are zeroed for the next cut. */
__global__ void sample_cut_kernel(scratch w, int32_t *out, int vocab, int span, int tiles, cut_args cut) {
    __shared__ search_smem sm;
    __shared__ hist_smem h;
    __shared__ int where[3]; /* the span, the rank in it, the entry */
    const int r = (int)blockIdx.x;
    row_state st = w.st[r];
    if (st.done) return; /* uniform */
    uint32_t *hc = w.hcnt + (size_t)r * HBINS;
    uint64_t *hm = w.hmass + (size_t)r * HBINS;
    const search s = descend(cut, r, hc, hm, LEVELS, &sm, &h);
    if (s.reach) {
        const uint64_t unit = s.use_mass ? mass_of(s.prefix) : 1;
        const uint64_t ties = hc[level_bin0(LEVELS - 1) + s.bin];
        uint64_t m = (s.T + unit - 1) / unit;
        m = m < 1 ? 1 : m > ties ? ties : m;
        /* the span: the first whose running count of ties reaches m */
        uint64_t run = 0;
        for (int t0 = 0; t0 < tiles; t0 += (int)blockDim.x) {
            const int t = t0 + (int)threadIdx.x;
            const uint64_t v = t < tiles ? w.tcnt[((size_t)r * tiles + t) * LAST_BINS + s.bin] : 0;
            uint64_t all = 0;
            const uint64_t before = run + block_scan_excl(v, sm.wsum, &all);
            if (before < m && m <= before + v) where[0] = t, where[1] = (int)(m - before);
            run += all;
        }
        __syncthreads();
        const int base = where[0] * span, need = where[1];
        const int n = vocab - base < span ? vocab - base : span;
        const uint32_t *p = w.p + (size_t)r * (size_t)vocab; // [vocab]
        uint64_t seen = 0;
        for (int c0 = 0; c0 < n; c0 += (int)blockDim.x) {
            const int i = base + c0 + (int)threadIdx.x;
            const int hit = c0 + (int)threadIdx.x < n && p[i] == s.prefix && in_prefix(st, s.prefix, i);
            uint64_t all = 0;
            const uint64_t before = seen + block_scan_excl((uint64_t)hit, sm.wsum, &all);
            if (hit && before + 1 == (uint64_t)need) where[2] = i;
            seen += all;
            if (seen >= (uint64_t)need) break; /* uniform: seen is the block's total */
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            st.tb = s.prefix;
            st.ti = where[2];
            st.done = cut.kind == CUT_DRAW;
            w.st[r] = st;
            if (st.done) out[r] = st.ti;
        }
    }
    for (int j = (int)threadIdx.x; j < HBINS; j += (int)blockDim.x) hc[j] = 0u, hm[j] = 0;
}

} // namespace

void sample(ckv_backend *be, int32_t *out, const float *logits, int n, int vocab, float temperature, int top_k,
            float top_p, const double *u) {
    ctx *c = ctx_of(be);
    if (n <= 0 || vocab <= 0) return;
    /* spans of whole chunks of TILE entries: about two blocks per SM over all rows, at least a chunk
     * each (the result does not depend on the spans: integer sums) */
    const int chunks = (vocab + TILE - 1) / TILE;
    int per_row = (2 * c->sms + n - 1) / n;
    per_row = per_row < 1 ? 1 : per_row > chunks ? chunks : per_row;
    const int span = (chunks + per_row - 1) / per_row * TILE, tiles = (vocab + span - 1) / span;
    size_t at[7];
    const size_t bytes = scratch_bytes(n, tiles, vocab, at);
    ckv_status s = grow(c, (void **)&c->part, &c->part_cap, bytes, "the sample op's scratch (split-KV partials)");
    if (s != CKV_STATUS_OK) {
        record(c, s);
        return;
    }
    char *base = (char *)c->part;
    const scratch w = {(row_state *)(base + at[0]), (tile_max *)(base + at[1]), (uint64_t *)(base + at[2]),
                       (uint32_t *)(base + at[3]),  (uint32_t *)(base + at[4]), (uint64_t *)(base + at[5]),
                       (uint32_t *)(base + at[6])};
    const int S = ckv_sample_exp_shift(vocab);
    const dim3 grid((unsigned)tiles, (unsigned)n);
    CKV_LAUNCH(sample_max_kernel, grid, dim3(THREADS), 0, c->stream, w, logits, vocab, span);
    CKV_LAUNCH(sample_exp_kernel, grid, dim3(THREADS), 0, c->stream, w, out, logits, vocab, span, temperature,
               ldexp(1.0, S));
    if (temperature != 0.0f) {
        CKV_LAUNCH(sample_p_kernel, grid, dim3(THREADS), 0, c->stream, w, logits, vocab, span, temperature,
                   ldexp(1.0, -S));
        cut_args cuts[3];
        int n_cuts = 0;
        if (top_k > 0 && top_k < vocab) cuts[n_cuts++] = cut_args{CUT_TOPK, top_k, 1.0f, u};
        if (top_p < 1.0f) cuts[n_cuts++] = cut_args{CUT_TOPP, 0, top_p, u};
        cuts[n_cuts++] = cut_args{CUT_DRAW, 0, 1.0f, u};
        for (int k = 0; k < n_cuts; k++) {
            for (int level = k == 0 ? 1 : 0; level < LEVELS; level++)
                CKV_LAUNCH(sample_hist_kernel, grid, dim3(THREADS), 0, c->stream, w, vocab, span, cuts[k], level);
            CKV_LAUNCH(sample_cut_kernel, dim3((unsigned)n), dim3(THREADS), 0, c->stream, w, out, vocab, span, tiles,
                       cuts[k]);
        }
    }
    op_done(c, "sample");
}

} // namespace CKV_CUDA_NS
