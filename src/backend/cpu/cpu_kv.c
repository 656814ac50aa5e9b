/* cpu_kv.c - the CPU backend's KV-cache ops: kv_store (append a batch's tokens to their sequences'
 * segments, converting to the cache dtype, and advance the segment lengths), kv_gather (compact
 * every segment of a layer into another pool in one call, over (segment, row block) units: on the
 * calling thread up to a few MB of kept rows, else on the backend's threads; whole destination cache
 * lines written by streaming stores, the source rows prefetched a few kept rows ahead) and kv_rerotate
 * (kept keys rotated to their row index, over (segment, row block) units, the angles from a table
 * the backend keeps from one layer to the next). It does not attend (cpu_attention.c) and
 * decides nothing about what is kept. Nothing here allocates but that table, when a context needs
 * larger offsets than it holds. */
#include <math.h>
#include <stdint.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "core/alloc.h"
#include "cpu_backend.h"

/* Writes n fp32 values as `dt` at dst. */
static void ckv_kv_put(void *dst, const float *src, ckv_dtype dt, size_t n) {
    if (dt == CKV_DTYPE_F32)
        memcpy(dst, src, n * sizeof(float));
    else
        ckv_convert_from_f32(dst, src, dt, n);
}

void ckv_cpu_kv_store(ckv_backend *be, const ckv_kv_batch *kv, const float *k, const float *v, const int32_t *pos,
                      int n) {
    (void)be;
    const int n_kv = kv->n_kv_heads;
    const size_t d = (size_t)kv->head_dim, rowb = d * ckv_dtype_size(kv->dtype);
    for (int s = 0; s < kv->n_seq; s++) {
        const int t0 = kv->seq_start ? kv->seq_start[s] : 0, t1 = kv->seq_start ? kv->seq_start[s + 1] : n;
        ckv_kv_seg *segs = kv->segs[s]; // [n_kv]
        for (int g = 0; g < n_kv; g++) {
            ckv_kv_seg *sg = &segs[g];
            for (int t = t0; t < t1; t++) {
                const size_t row = (size_t)sg->len + (size_t)(t - t0);           // segment row
                const size_t src = ((size_t)t * (size_t)n_kv + (size_t)g) * d;    // k, v [n, n_kv, d]
                ckv_kv_put((char *)sg->k + row * rowb, k + src, kv->dtype, d);
                ckv_kv_put((char *)sg->v + row * rowb, v + src, kv->dtype, d);
                sg->pos[row] = pos[t];
            }
            sg->len += t1 - t0;
        }
    }
}

/* bytes from src to dst: the destination's whole 64-byte lines by non-temporal stores (no read of
 * the line before it is written, and the kept rows, read next by attention, are not left in the
 * cache in place of the rows still to copy), the partial lines at either end by memcpy. The stores
 * are ordered by gather_fence before the unit's work is handed back. */
static void gather_copy(char *dst, const char *src, size_t bytes) {
#if defined(__SSE2__)
    size_t head = (size_t)(-(uintptr_t)dst & 63u);
    if (head > bytes) head = bytes;
    if (head) { /* (no call for the aligned rows of the usual pools) */
        memcpy(dst, src, head);
        dst += head, src += head, bytes -= head;
    }
    for (; bytes >= 64; dst += 64, src += 64, bytes -= 64) {
        const __m128i a = _mm_loadu_si128((const __m128i *)src), b = _mm_loadu_si128((const __m128i *)(src + 16));
        const __m128i c = _mm_loadu_si128((const __m128i *)(src + 32)), d = _mm_loadu_si128((const __m128i *)(src + 48));
        _mm_stream_si128((__m128i *)dst, a);
        _mm_stream_si128((__m128i *)(dst + 16), b);
        _mm_stream_si128((__m128i *)(dst + 32), c);
        _mm_stream_si128((__m128i *)(dst + 48), d);
    }
#endif
    if (bytes) memcpy(dst, src, bytes);
}

/* Makes a unit's streaming stores visible before the pool reports the unit done. */
static void gather_fence(void) {
#if defined(__SSE2__)
    _mm_sfence();
#endif
}

/* Requests source row r's key and value lines into the L2 (a hint: no fault, no effect on the
 * result; a request into the L1 as well measured a few percent slower). */
static void gather_prefetch(const ckv_kv_seg *src, size_t r, size_t rowb) {
    for (size_t b = 0; b < rowb; b += 64) {
        __builtin_prefetch((const char *)src->k + r * rowb + b, 0, 2);
        __builtin_prefetch((const char *)src->v + r * rowb + b, 0, 2);
    }
}

/* Kept rows of one gather unit: a unit is (segment g, block b) of rows b * GATHER_BLOCK .. of the
 * segment's kept list, so both threads copy even when a layer has fewer KV heads than threads. */
enum { GATHER_BLOCK = 128, GATHER_AHEAD = 8 /* rows prefetched ahead of the copy */ };

/* Kept bytes up to which a gather runs on the calling thread: one thread copies a layer of 4K
 * contexts' kept rows (about 1 MB) in tens of microseconds, about what waking the pool's workers
 * costs on an idle machine and much less than it costs when the cores are busy (a worker then waits
 * for a scheduler slice). */
enum { GATHER_INLINE_BYTES = 4 << 20 };

typedef struct {
    const ckv_kv_gather_params *gp;
    size_t rowb;
    int blocks; /* per segment: ceil(max n_keep / GATHER_BLOCK) */
} gather_job;

/* Units [u0, u1): the kept rows i0 .. i1 - 1 of segment g, copied in maximal runs of consecutive
 * source rows. */
static void gather_units(void *ctx, int u0, int u1, int tid) {
    (void)tid;
    const gather_job *jb = ctx;
    const ckv_kv_gather_params *gp = jb->gp;
    const size_t rowb = jb->rowb;
    for (int u = u0; u < u1; u++) {
        int g, b, i0, i1;
        ckv_cpu_unit_rows(u, jb->blocks, GATHER_BLOCK, gp->n_keep[u / jb->blocks], &g, &b, &i0, &i1);
        const int32_t *kg = gp->keep + (size_t)g * (size_t)gp->stride; // [n_keep[g]] ascending source rows
        const ckv_kv_seg *src = &gp->src[g], *dst = &gp->dst[g];
        for (int i = i0; i < i1;) {
            int j = i + 1;
            while (j < i1 && kg[j] == kg[j - 1] + 1) j++;
            if (j + GATHER_AHEAD <= i1) /* scattered rows (random's) wait on memory one at a time without
                                         * this: the row GATHER_AHEAD kept rows on is requested now */
                gather_prefetch(src, (size_t)kg[j + GATHER_AHEAD - 1], rowb);
            const size_t r = (size_t)kg[i], cnt = (size_t)(j - i);
            gather_copy((char *)dst->k + (size_t)i * rowb, (const char *)src->k + r * rowb, cnt * rowb);
            gather_copy((char *)dst->v + (size_t)i * rowb, (const char *)src->v + r * rowb, cnt * rowb);
            if (cnt == 1)
                dst->pos[i] = src->pos[r];
            else
                memcpy(dst->pos + i, src->pos + r, cnt * sizeof(int32_t));
            i = j;
        }
    }
    gather_fence();
}

void ckv_cpu_kv_gather(ckv_backend *be, const ckv_kv_gather_params *gp) {
    int most = 0;
    for (int g = 0; g < gp->n_kv; g++) most = gp->n_keep[g] > most ? gp->n_keep[g] : most;
    gather_job jb = {gp, (size_t)gp->head_dim * ckv_dtype_size(gp->dtype), ckv_cpu_blocks((size_t)most, GATHER_BLOCK)};
    size_t kept = 0; /* bytes of kept keys and values */
    for (int g = 0; g < gp->n_kv; g++) kept += (size_t)gp->n_keep[g] * 2 * jb.rowb;
    if (jb.blocks > 0 && kept <= GATHER_INLINE_BYTES)
        gather_units(&jb, 0, gp->n_kv * jb.blocks, 0);
    else if (jb.blocks > 0)
        ckv_threadpool_for(ckv_cpu_pool(be), gp->n_kv * jb.blocks, 1, gather_units, &jb);
    for (int g = 0; g < gp->n_kv; g++) gp->dst[g].len = gp->n_keep[g];
}

/* kv_rerotate's angles: cos and sin of delta * inv_freq[j] for the row offsets delta = i - pos[i] <= 0,
 * computed once per offset and kept by the backend for the next layers (every layer of a context
 * re-rotates rows at the same kind of offsets with the same frequencies), filled on first use. The
 * same cosf / sinf of the same fp32 angle as computing them per row: the same bits. */
enum { RR_BLOCK = 64 }; /* rows per work unit */
#define RR_TABLE_MAX_BYTES ((size_t)32 << 20) /* offsets beyond what this holds are computed per row */

typedef struct {
    const ckv_kv_batch *kv;
    const float *inv_freq;
    const float *tab;     /* [>= n_off, half, 2] cos, sin at offset -delta; NULL: none */
    const int32_t *fill;  /* [n_fill] offsets to compute into tab (the fill phase) */
    float *tab_w;         /* tab, written by the fill phase */
    int n_off, half, blocks;
} rerot_job;

static void rerot_fill_units(void *ctx, int i0, int i1, int tid) {
    (void)tid;
    const rerot_job *jb = ctx;
    for (int i = i0; i < i1; i++) {
        const int off = jb->fill[i];
        float *e = jb->tab_w + (size_t)off * (size_t)jb->half * 2;
        for (int j = 0; j < jb->half; j++) {
            const float a = (float)(-off) * jb->inv_freq[j];
            e[2 * j] = cosf(a);
            e[2 * j + 1] = sinf(a);
        }
    }
}

/* Rows of units (segment, block of RR_BLOCK rows) u0 .. u1. */
static void rerot_units(void *ctx, int u0, int u1, int tid) {
    (void)tid;
    const rerot_job *jb = ctx;
    const ckv_kv_batch *kv = jb->kv;
    enum { BLOCK = 64 }; /* pairs converted at once: any head_dim, a fixed stack buffer */
    const int hd = kv->head_dim, half = hd / 2;
    const size_t es = ckv_dtype_size(kv->dtype);
    float x0[BLOCK], x1[BLOCK]; /* [BLOCK] the first and second halves' elements j0..j0+nb */
    for (int u = u0; u < u1; u++) {
        const int seg = u / jb->blocks, blk = u % jb->blocks;
        ckv_kv_seg *sg = &kv->segs[seg / kv->n_kv_heads][seg % kv->n_kv_heads];
        const int i_end = (blk + 1) * RR_BLOCK < sg->len ? (blk + 1) * RR_BLOCK : sg->len;
        for (int i = blk * RR_BLOCK; i < i_end; i++) {
            char *row = (char *)sg->k + (size_t)i * (size_t)hd * es; // [hd] in the cache's dtype
            const int off = sg->pos[i] - i;
            const float delta = (float)(i - sg->pos[i]);
            const float *e = jb->tab && off >= 0 && off < jb->n_off ? jb->tab + (size_t)off * (size_t)half * 2 : NULL;
            for (int j0 = 0; j0 < half; j0 += BLOCK) {
                const int nb = half - j0 < BLOCK ? half - j0 : BLOCK;
                char *lo = row + (size_t)j0 * es, *hi = row + (size_t)(j0 + half) * es;
                ckv_convert_to_f32(x0, lo, kv->dtype, (size_t)nb);
                ckv_convert_to_f32(x1, hi, kv->dtype, (size_t)nb);
                for (int j = 0; j < nb; j++) {
                    float c, sn;
                    if (e) {
                        c = e[2 * (j0 + j)];
                        sn = e[2 * (j0 + j) + 1];
                    } else {
                        const float a = delta * jb->inv_freq[j0 + j];
                        c = cosf(a);
                        sn = sinf(a);
                    }
                    const float y0 = x0[j] * c - x1[j] * sn, y1 = x1[j] * c + x0[j] * sn; /* x cos + rotate_half(x) sin */
                    x0[j] = y0;
                    x1[j] = y1;
                }
                ckv_kv_put(lo, x0, kv->dtype, (size_t)nb);
                ckv_kv_put(hi, x1, kv->dtype, (size_t)nb);
            }
        }
    }
}

/* Bytes of the table for n offsets of `half` angles: cos, sin [n, half, 2]; the fill list int32 [n];
 * the filled flags uint8 [n]. */
static size_t rerot_table_bytes(int n, int half) {
    return (size_t)n * ((size_t)half * 2 * sizeof(float) + sizeof(int32_t) + 1);
}

/* The table for offsets 0 .. n_off - 1 at these frequencies, every offset the batch's rows need
 * filled; NULL when it would pass RR_TABLE_MAX_BYTES or cannot be allocated (the rows then compute
 * their angles themselves: the same values). */
static const float *rerot_table(ckv_backend *be, const ckv_kv_batch *kv, const float *inv_freq, int half, int n_off) {
    ckv_cpu_ctx *ctx = be->ctx;
    if (n_off <= 0 || half > CKV_CPU_RR_HALF_MAX || rerot_table_bytes(n_off, half) > RR_TABLE_MAX_BYTES) return NULL;
    if (n_off > ctx->rr_n_off || half != ctx->rr_half || memcmp(ctx->rr_freq, inv_freq, (size_t)half * sizeof(float))) {
        /* a larger range or other frequencies: start over (at twice the offsets asked where that fits,
         * so a growing range restarts rarely) */
        const int cap = rerot_table_bytes(2 * n_off, half) <= RR_TABLE_MAX_BYTES ? 2 * n_off : n_off;
        ckv_free(ctx->rr_tab);
        ctx->rr_tab = NULL;
        ctx->rr_n_off = 0;
        if (ckv_alloc(&ctx->rr_tab, rerot_table_bytes(cap, half), "kv_rerotate's angle table") != CKV_STATUS_OK)
            return NULL; /* zeroed: no offset filled */
        ctx->rr_n_off = cap;
        ctx->rr_half = half;
        memcpy(ctx->rr_freq, inv_freq, (size_t)half * sizeof(float));
    }
    float *tab = ctx->rr_tab;                                           /* [rr_n_off, half, 2] */
    int32_t *fill = (int32_t *)(tab + (size_t)ctx->rr_n_off * half * 2); /* [rr_n_off] */
    uint8_t *filled = (uint8_t *)(fill + ctx->rr_n_off);                 /* [rr_n_off] */
    int n_fill = 0;
    for (int s = 0; s < kv->n_seq; s++)
        for (int g = 0; g < kv->n_kv_heads; g++) {
            const ckv_kv_seg *sg = &kv->segs[s][g];
            for (int i = 0; i < sg->len; i++) {
                const int off = sg->pos[i] - i;
                if (off >= 0 && off < n_off && !filled[off]) filled[off] = 1, fill[n_fill++] = off;
            }
        }
    if (n_fill > 0) {
        rerot_job jb = {.inv_freq = inv_freq, .fill = fill, .tab_w = tab, .half = half};
        ckv_threadpool_for(ckv_cpu_pool(be), n_fill, 64, rerot_fill_units, &jb);
    }
    return tab;
}

void ckv_cpu_kv_rerotate(ckv_backend *be, const ckv_kv_batch *kv, const float *inv_freq) {
    const int half = kv->head_dim / 2;
    int most = 0, n_off = 0; /* the longest segment; offsets 0 .. n_off - 1 the rows need */
    for (int s = 0; s < kv->n_seq; s++)
        for (int g = 0; g < kv->n_kv_heads; g++) {
            const ckv_kv_seg *sg = &kv->segs[s][g];
            most = sg->len > most ? sg->len : most;
            for (int i = 0; i < sg->len; i++) n_off = sg->pos[i] - i + 1 > n_off ? sg->pos[i] - i + 1 : n_off;
        }
    if (most == 0) return;
    rerot_job jb = {.kv = kv, .inv_freq = inv_freq, .half = half, .blocks = ckv_cpu_blocks((size_t)most, RR_BLOCK)};
    jb.tab = rerot_table(be, kv, inv_freq, half, n_off);
    jb.n_off = jb.tab ? n_off : 0;
    ckv_threadpool_for(ckv_cpu_pool(be), kv->n_seq * kv->n_kv_heads * jb.blocks, 1, rerot_units, &jb);
    for (int s = 0; s < kv->n_seq; s++)
        for (int g = 0; g < kv->n_kv_heads; g++) {
            ckv_kv_seg *sg = &kv->segs[s][g];
            for (int i = 0; i < sg->len; i++) sg->pos[i] = i;
        }
}
