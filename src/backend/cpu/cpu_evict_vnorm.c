/* cpu_evict_vnorm.c - the CPU backend's CriticalKV value norms ||V W_O^h||_1 (evict_value_norm;
 * semantics in backend.h). o_proj is widened once per call into per-head fp32 blocks (W_O^h)^T
 * [D, d] (GGUF block types dequantised row by row, F16/BF16 converted) and packed once into the GEMM's
 * weight panels; then the backend's pool takes blocks of CKV_CPU_VNORM_BLOCK value rows, each task
 * running every local head in ascending order through ckv_gemm_packed_l1 on its own thread: each
 * register tile of the projection is reduced to its rows' 16 fp32 lanes of |y| while it is in L1, so
 * the projection [rows, D] is never written. The sums are those of the forward's fp32 GEMM kernels
 * (independent of the thread count) and the L1 order is backend.h's, so every output is the same sum
 * in the same order as one thread computes it. Scratch is the backend's eviction scratch
 * (ckv_cpu_evict_scratch). It selects nothing. */

#include "core/quant.h"
#include "cpu_backend.h"
#include "cpu_gemm.h"

#define CKV_CPU_VNORM_BLOCK 128 /* value rows per task and GEMM */

typedef struct {
    const ckv_gemm_arch *arch;
    float *out;
    int ld, n_rows, d, D, n_heads_local, head0, group;
    const ckv_kv_batch *kv;
    const float *bp; // [n_heads_local, panel_floats] W_O^j packed for the GEMM (ckv_gemm_pack_all)
    size_t panel_floats;
    float *lanes;    // [n_workers, BLOCK, 16] the L1 lanes of each worker's rows
    float *tail;     // [n_workers, BLOCK, 15] |y| of the columns past the last multiple of 16
    float *vals;     // [n_workers, BLOCK, d] fp32 values of each worker (F16/BF16 caches only)
} vnorm_job;

static void vnorm_blocks(void *ctx, int begin, int end, int tid) {
    const vnorm_job *jb = ctx;
    const int d = jb->d, D = jb->D, n_tail = D % 16;
    const size_t vsz = ckv_dtype_size(jb->kv->dtype);
    float *lanes = jb->lanes + (size_t)tid * CKV_CPU_VNORM_BLOCK * 16;
    float *tail = jb->tail + (size_t)tid * CKV_CPU_VNORM_BLOCK * 15;
    float *vals = jb->vals ? jb->vals + (size_t)tid * CKV_CPU_VNORM_BLOCK * (size_t)d : NULL;
    for (int b = begin; b < end; b++) {
        const int t0 = b * CKV_CPU_VNORM_BLOCK;
        const int nb = jb->n_rows - t0 < CKV_CPU_VNORM_BLOCK ? jb->n_rows - t0 : CKV_CPU_VNORM_BLOCK;
        int converted = -1; /* the KV head whose values vals holds */
        for (int j = 0; j < jb->n_heads_local; j++) {
            const int g = (jb->head0 + j) / jb->group;
            const char *V = (const char *)jb->kv->segs[0][g].v + (size_t)t0 * (size_t)d * vsz; // [nb, d]
            const float *vb = (const float *)(const void *)V;
            if (vals) {
                if (converted != g) ckv_convert_to_f32(vals, V, jb->kv->dtype, (size_t)nb * (size_t)d);
                converted = g;
                vb = vals;
            }
            memset(lanes, 0, (size_t)nb * 16 * sizeof(float));
            ckv_gemm_packed_l1(jb->arch, lanes, n_tail ? tail : NULL, vb, (size_t)d,
                               jb->bp + (size_t)j * jb->panel_floats, nb, d, D);
            float *dst = jb->out + (size_t)g * (size_t)jb->ld + t0;
            for (int i = 0; i < nb; i++) { /* the lanes in double in lane order, then the tail */
                double s = 0.0;
                for (int l = 0; l < 16; l++) s += lanes[(size_t)i * 16 + (size_t)l];
                for (int c = 0; c < n_tail; c++) s += tail[(size_t)i * 15 + (size_t)c];
                dst[i] += (float)s;
            }
        }
    }
}

/* wh[j, r, :] = wo[r, j*d : (j+1)*d] in fp32 for every local head j. row: [cols] scratch (block types). */
static void vnorm_widen(const ckv_weight *wo, int n_heads_local, int d, float *wh, float *row) {
    const int D = (int)wo->rows;
    const size_t esz = ckv_dtype_size(wo->dtype), hd = (size_t)D * (size_t)d;
    for (int r = 0; r < D; r++) {
        const char *src = (const char *)wo->data + (size_t)r * wo->row_bytes;
        if (row) ckv_dequant_row(wo->dtype, src, row, (size_t)wo->cols);
        for (int j = 0; j < n_heads_local; j++) {
            float *dst = wh + (size_t)j * hd + (size_t)r * (size_t)d;
            if (row)
                memcpy(dst, row + (size_t)j * (size_t)d, (size_t)d * sizeof(float));
            else if (wo->dtype == CKV_DTYPE_F32)
                memcpy(dst, src + (size_t)j * (size_t)d * esz, (size_t)d * sizeof(float));
            else
                ckv_convert_to_f32(dst, src + (size_t)j * (size_t)d * esz, wo->dtype, (size_t)d);
        }
    }
}

ckv_status ckv_cpu_evict_value_norm(ckv_backend *be, float *out, int ld, const ckv_kv_batch *kv, int n_rows,
                                    const ckv_weight *wo, int n_heads_local, int head0, int group) {
    const int d = kv->head_dim, D = (int)wo->rows;
    const int blocks = ckv_dtype_is_block(wo->dtype); /* GGUF blocks: dequantised row by row, once per call */
    if (wo->dtype != CKV_DTYPE_F32 && wo->dtype != CKV_DTYPE_F16 && wo->dtype != CKV_DTYPE_BF16 && !blocks)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "cpu evict_value_norm: o_proj stored as %s",
                         ckv_dtype_name(wo->dtype));
    if (wo->cols < (int64_t)n_heads_local * d)
        return ckv_error(CKV_STATUS_ERR_SHAPE, "cpu evict_value_norm: o_proj has %lld columns, %d heads x %d need more",
                         (long long)wo->cols, n_heads_local, d);
    if (n_rows < 1 || n_heads_local < 1) return CKV_STATUS_OK;
    ckv_threadpool *pool = ckv_cpu_pool(be);
    const int n_blocks = ckv_cpu_blocks((size_t)n_rows, CKV_CPU_VNORM_BLOCK);
    int workers = pool ? ckv_threadpool_size(pool) : 1;
    if (workers > n_blocks) workers = n_blocks;
    const ckv_gemm_arch *arch = ckv_gemm_best_arch();
    vnorm_job jb = {arch, out, ld, n_rows, d, D, n_heads_local, head0, group, kv, NULL,
                    ckv_gemm_packed_floats(arch, d, D), NULL, NULL, NULL};
    /* the scratch's parts, each rounded to 16 floats (64-byte aligned): wh [n_heads_local, D, d], row
     * [cols] (block types), bp [n_heads_local, panel_floats], lanes, tail and vals (F16/BF16) per worker */
#define VNORM_ROUND16(x) (((size_t)(x) + 15) & ~(size_t)15)
    const size_t n_wh = VNORM_ROUND16((size_t)n_heads_local * (size_t)D * (size_t)d),
                 n_row = blocks ? VNORM_ROUND16(wo->cols) : 0,
                 n_bp = VNORM_ROUND16((size_t)n_heads_local * jb.panel_floats),
                 n_lanes = VNORM_ROUND16((size_t)workers * CKV_CPU_VNORM_BLOCK * 16),
                 n_tail = VNORM_ROUND16((size_t)workers * CKV_CPU_VNORM_BLOCK * 15),
                 n_vals = kv->dtype != CKV_DTYPE_F32 ? VNORM_ROUND16((size_t)workers * CKV_CPU_VNORM_BLOCK * (size_t)d) : 0;
#undef VNORM_ROUND16
    float *wh = NULL;
    ckv_status s = ckv_cpu_evict_scratch(be, (n_wh + n_row + n_bp + n_lanes + n_tail + n_vals) * sizeof(float),
                                         (void **)&wh);
    float *row = NULL, *bp = NULL;
    if (s == CKV_STATUS_OK) {
        row = blocks ? wh + n_wh : NULL;
        bp = wh + n_wh + n_row;
        jb.lanes = bp + n_bp;
        jb.tail = jb.lanes + n_lanes;
        jb.vals = n_vals ? jb.tail + n_tail : NULL;
    }
    if (s == CKV_STATUS_OK) {
        vnorm_widen(wo, n_heads_local, d, wh, row);
        for (int j = 0; j < n_heads_local; j++)
            ckv_gemm_pack_all(arch, bp + (size_t)j * jb.panel_floats, wh + (size_t)j * (size_t)D * (size_t)d, d, D);
        jb.bp = bp;
        if (workers > 1)
            ckv_threadpool_for(pool, n_blocks, 1, vnorm_blocks, &jb);
        else
            vnorm_blocks(&jb, 0, n_blocks, 0);
    }
    return s;
}
