/* cpu_evict_chunkkv.c - the CPU backend's evict_chunk_rank: ChunkKV's chunk selection from a layer's
 * scores (semantics in backend.h), the reference the device backends are tested against. Each
 * chunk's mean is summed in the op's order, the chunks are ranked by an insertion sort in top-k
 * order (descending mean, NaN after every number, ties to the lower chunk; the chunk count L / C is
 * small) and the kept chunks' rows written in ascending order for every output row. Scratch is
 * allocated per call and freed before it returns. It scores nothing. */
#include <math.h>

#include "core/alloc.h"
#include "cpu_backend.h"

/* 1 when chunk a (mean ma) ranks before chunk b (mean mb): top-k order. */
static int chunk_better(double ma, int a, double mb, int b) {
    if (isnan(ma) || isnan(mb)) return isnan(mb) && (!isnan(ma) || a < b);
    return ma > mb || (ma == mb && a < b);
}

ckv_status ckv_cpu_evict_chunk_rank(ckv_backend *be, int32_t *rows, int ld_rows, int n_rows, int32_t *n_kept,
                                    const float *s, int ld, int H, int n, int C, int keep) {
    (void)be;
    const int n_chunks = C >= 1 ? (n + C - 1) / C : 0;
    if (C < 1 || C > n || keep < 1 || keep > n_chunks || H < 1 || ld < n || ld_rows < n || n_rows < 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "evict_chunk_rank: chunks of %d over %d rows keeping %d of %d (%d heads)", C,
                         n, keep, n_chunks, H);
    double *mean = NULL;   // [n_chunks]
    int32_t *order = NULL; // [n_chunks] chunks best first
    unsigned char *kept = NULL; // [n_chunks] 1: kept
    ckv_status st = ckv_alloc((void **)&mean, (size_t)n_chunks * sizeof(double), "chunk means");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&order, (size_t)n_chunks * sizeof(int32_t), "chunk order");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&kept, (size_t)n_chunks, "kept chunks");
    if (st == CKV_STATUS_OK) {
        for (int c = 0; c < n_chunks; c++) {
            const int t0 = c * C, t1 = t0 + C < n ? t0 + C : n;
            double sum = 0.0;
            for (int t = t0; t < t1; t++) {
                float over_heads = 0.0f; /* kvpress sums the heads in fp32 first */
                for (int h = 0; h < H; h++) over_heads += s[(size_t)h * (size_t)ld + (size_t)t];
                sum += over_heads;
            }
            mean[c] = sum / (double)(t1 - t0);
        }
        for (int i = 0; i < n_chunks; i++) {
            const int32_t c = i;
            int j = i;
            for (; j > 0 && chunk_better(mean[c], c, mean[order[j - 1]], order[j - 1]); j--) order[j] = order[j - 1];
            order[j] = c;
        }
        /* the kept chunks in position order */
        memset(kept, 0, (size_t)n_chunks);
        for (int i = 0; i < keep; i++) kept[order[i]] = 1;
        int m = 0;
        for (int c = 0; c < n_chunks; c++)
            for (int t = c * C; kept[c] && t < (c * C + C < n ? c * C + C : n); t++) rows[m++] = t;
        for (int r = 1; r < n_rows; r++) memcpy(rows + (size_t)r * (size_t)ld_rows, rows, (size_t)m * sizeof(int32_t));
        *n_kept = m;
    }
    ckv_free(mean);
    ckv_free(order);
    ckv_free(kept);
    return st;
}
