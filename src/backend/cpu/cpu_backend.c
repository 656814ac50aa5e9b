/* cpu_backend.c - the CPU backend object: construction (thread pool, OpenBLAS thread count), teardown,
 * and the memory entries of the op table (the "device" is host memory: ckv_alloc and memcpy). The
 * compute kernels live in cpu_matmul.c, cpu_attention.c, cpu_kv.c, cpu_ops.c and cpu_evict_*.c; this file does no
 * arithmetic. */
#include "cpu_backend.h"

#include <string.h>

#include "core/alloc.h"

/* Declared here as well in case the cblas.h found is not OpenBLAS's own (identical prototype). */
void openblas_set_num_threads(int num_threads);

static void ckv_cpu_free(ckv_backend *be) {
    if (!be) return;
    ckv_cpu_ctx *ctx = be->ctx;
    if (ctx) {
        ckv_threadpool_free(ctx->pool);
        ckv_free(ctx->attn_ws);
        ckv_free(ctx->evict_ws);
        ckv_free(ctx->lev_angles);
        ckv_free(ctx->rr_tab);
    }
    ckv_free(ctx);
    ckv_free(be);
}

ckv_status ckv_cpu_grow(void **buf, size_t *cap, size_t bytes, const char *what) {
    if (bytes <= *cap) return CKV_STATUS_OK;
    ckv_free(*buf);
    *buf = NULL;
    *cap = 0;
    CKV_TRY(ckv_alloc(buf, bytes, what));
    *cap = bytes;
    return CKV_STATUS_OK;
}

ckv_status ckv_cpu_evict_scratch_raw(ckv_backend *be, size_t bytes, void **p) {
    ckv_cpu_ctx *ctx = be->ctx;
    *p = NULL;
    CKV_TRY(ckv_cpu_grow(&ctx->evict_ws, &ctx->evict_ws_bytes, bytes, "the eviction ops' scratch"));
    *p = ctx->evict_ws;
    return CKV_STATUS_OK;
}

ckv_status ckv_cpu_evict_scratch(ckv_backend *be, size_t bytes, void **p) {
    CKV_TRY(ckv_cpu_evict_scratch_raw(be, bytes, p));
    memset(*p, 0, bytes); /* zeroed, as a fresh ckv_alloc */
    return CKV_STATUS_OK;
}

/* alloc (zero set) and alloc_raw: host memory from ckv_alloc / ckv_alloc_raw. */
static ckv_status cpu_alloc_any(void **ptr, size_t bytes, const char *what, int zero) {
    if (!ptr)
        return ckv_error(CKV_STATUS_ERR_ARG, "cpu backend: alloc of %s without an output pointer",
                         what ? what : "a buffer");
    what = what ? what : "a cpu backend buffer";
    return zero ? ckv_alloc(ptr, bytes, what) : ckv_alloc_raw(ptr, bytes, what);
}

static ckv_status ckv_cpu_alloc(ckv_backend *be, void **ptr, size_t bytes, const char *what) {
    (void)be;
    return cpu_alloc_any(ptr, bytes, what, 1);
}

static ckv_status ckv_cpu_alloc_raw(ckv_backend *be, void **ptr, size_t bytes, const char *what) {
    (void)be;
    return cpu_alloc_any(ptr, bytes, what, 0);
}

static void ckv_cpu_release(ckv_backend *be, void *ptr) {
    (void)be;
    ckv_free(ptr);
}

static ckv_status ckv_cpu_copy_bytes(void *dst, const void *src, size_t bytes, const char *what) {
    if (bytes == 0) return CKV_STATUS_OK;
    if (!dst || !src)
        return ckv_error(CKV_STATUS_ERR_ARG, "cpu backend: %s of %zu bytes with a NULL %s pointer", what, bytes,
                         dst ? "source" : "destination");
    memmove(dst, src, bytes);
    return CKV_STATUS_OK;
}

static ckv_status ckv_cpu_upload(ckv_backend *be, void *dst_dev, const void *src_host, size_t bytes) {
    (void)be;
    return ckv_cpu_copy_bytes(dst_dev, src_host, bytes, "upload");
}

static ckv_status ckv_cpu_download(ckv_backend *be, void *dst_host, const void *src_dev, size_t bytes) {
    (void)be;
    return ckv_cpu_copy_bytes(dst_host, src_dev, bytes, "download");
}

static ckv_status ckv_cpu_copy(ckv_backend *be, void *dst_dev, const void *src_dev, size_t bytes) {
    (void)be;
    return ckv_cpu_copy_bytes(dst_dev, src_dev, bytes, "copy");
}

static ckv_status ckv_cpu_sync(ckv_backend *be) {
    (void)be;
    return CKV_STATUS_OK; /* every CPU op has finished when it returns */
}

static int ckv_cpu_kv_dtype_ok(const ckv_backend *be, ckv_dtype t) {
    (void)be;
    return t == CKV_DTYPE_F32 || t == CKV_DTYPE_F16 || t == CKV_DTYPE_BF16;
}

static const ckv_backend_ops ckv_cpu_ops = {
    /* no stream, device_id or evict_reserve: the ops finish before they return and keep no scratch */
    .caps = CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_KEYDIFF) | CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_LAGKV) |
            CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_CUR) | CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_LEVERAGE) |
            CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_CHUNK_COLSUM) | CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_KVZIP) |
            CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_CHUNK_RANK),
    .free = ckv_cpu_free,
    .alloc = ckv_cpu_alloc,
    .alloc_raw = ckv_cpu_alloc_raw,
    .release = ckv_cpu_release,
    .upload = ckv_cpu_upload,
    .download = ckv_cpu_download,
    .copy = ckv_cpu_copy,
    .sync = ckv_cpu_sync,
    .weight_dtype_ok = ckv_cpu_weight_dtype_ok,
    .kv_dtype_ok = ckv_cpu_kv_dtype_ok,
    .embedding = ckv_cpu_embedding,
    .rmsnorm = ckv_cpu_rmsnorm,
    .matmul = ckv_cpu_matmul,
    .rope = ckv_cpu_rope,
    .kv_store = ckv_cpu_kv_store,
    .attention = ckv_cpu_attention,
    .swiglu = ckv_cpu_swiglu,
    .add = ckv_cpu_add,
    .count_nonfinite = ckv_cpu_count_nonfinite,
    .kv_gather = ckv_cpu_kv_gather,
    .kv_rerotate = ckv_cpu_kv_rerotate,
    .evict_attn_colsum = ckv_cpu_evict_attn_colsum,
    .evict_attn_probs = ckv_cpu_evict_attn_probs,
    .evict_colsum_finish = ckv_cpu_evict_colsum_finish,
    .evict_pool = ckv_cpu_evict_pool,
    .evict_head_sum = ckv_cpu_evict_head_sum,
    .evict_div = ckv_cpu_evict_div,
    .evict_row_norm = ckv_cpu_evict_row_norm,
    .evict_add_mul = ckv_cpu_evict_add_mul,
    .evict_value_norm = ckv_cpu_evict_value_norm,
    .evict_fill = ckv_cpu_evict_fill,
    .evict_random = ckv_cpu_evict_random,
    .evict_max = ckv_cpu_evict_max,
    .evict_topk = ckv_cpu_evict_topk,
    .evict_scatter = ckv_cpu_evict_scatter,
    .evict_topk_counts = ckv_cpu_evict_topk_counts,
    .evict_softmax_add = ckv_cpu_evict_softmax_add,
    .evict_moments = ckv_cpu_evict_moments,
    .evict_ea_logits = ckv_cpu_evict_ea_logits,
    .evict_defensive_rows = ckv_cpu_evict_defensive_rows,
    .evict_keydiff = ckv_cpu_evict_keydiff,
    .evict_lagkv = ckv_cpu_evict_lagkv,
    .evict_cur = ckv_cpu_evict_cur,
    .evict_leverage = ckv_cpu_evict_leverage,
    .evict_affine = ckv_cpu_evict_affine,
    .evict_chunk_colsum = ckv_cpu_evict_chunk_colsum,
    .evict_row_stats = ckv_cpu_evict_row_stats,
    .evict_kvzip = ckv_cpu_evict_kvzip,
    .evict_kvzip_norms = ckv_cpu_evict_kvzip_norms,
    .evict_chunk_rank = ckv_cpu_evict_chunk_rank,
    .sample = ckv_cpu_sample,
};

ckv_status ckv_backend_cpu_init(ckv_backend **out, int n_threads) {
    if (!out) return ckv_error(CKV_STATUS_ERR_ARG, "cpu backend: init without an output pointer");
    *out = NULL;
    if (n_threads <= 0) n_threads = ckv_cpu_count();

    void *mem = NULL;
    CKV_TRY(ckv_alloc(&mem, sizeof(ckv_backend), "the cpu backend"));
    ckv_backend *be = mem;
    be->ops = &ckv_cpu_ops;
    be->name = "cpu";
    be->device = CKV_DEVICE_HOST;
    be->n_threads = n_threads;
    be->weight_dtype = CKV_DTYPE_F32;
    be->kv_dtype = CKV_DTYPE_F32;

    ckv_status s = ckv_alloc(&be->ctx, sizeof(ckv_cpu_ctx), "the cpu backend context");
    if (s != CKV_STATUS_OK) {
        ckv_cpu_free(be);
        return s;
    }
    ckv_cpu_ctx *ctx = be->ctx;
    ctx->n_threads = n_threads;
    s = ckv_alloc((void **)&ctx->attn_ws, CKV_CPU_ATTN_WS_FLOATS * sizeof(float), "the attention workspace");
    if (s == CKV_STATUS_OK) ctx->attn_ws_floats = CKV_CPU_ATTN_WS_FLOATS;
    if (s == CKV_STATUS_OK) s = ckv_threadpool_init(&ctx->pool, n_threads);
    if (s != CKV_STATUS_OK) {
        ckv_cpu_free(be);
        return s;
    }
    /* Process-wide setting; ckv_cpu_matmul re-applies it when another backend changed it. */
    openblas_set_num_threads(n_threads);
    *out = be;
    return CKV_STATUS_OK;
}
