/* source_random.c - a weight source that draws every tensor from (seed, tensor name, element index)
 * instead of reading a checkpoint: a model directory needs only config.json. Values are scaled so
 * activations stay bounded through any depth: matrices uniform with variance 1 / fan_in (fan_in =
 * the HF layout's second dimension), norm weights 1, biases uniform in [-0.02, 0.02]. An element's
 * value depends only on its global index, so any row/column slice (any TP degree) sees the same
 * model. For benchmarks and scale tests; outputs are meaningless as text. Filling is spread over the
 * cores (a thread pool owned by the source). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "model/source.h"

typedef struct {
    uint64_t seed;
    int tied;
    ckv_threadpool *pool;
} random_ctx;

static uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t name_hash(const char *name) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return h;
}

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

typedef struct {
    uint64_t key;
    float scale, offset; /* value = offset + scale * u, u uniform in [-1, 1) */
    int64_t cols;        /* of the whole tensor */
    int64_t r0, c0, nc;  /* the slice: rows from r0, columns [c0, c0 + nc) */
    float *dst;
} fill_job;

static void fill_rows(void *ctx, int begin, int end, int tid) {
    (void)tid;
    const fill_job *j = ctx;
    for (int r = begin; r < end; r++) {
        const uint64_t base = (uint64_t)(j->r0 + r) * (uint64_t)j->cols + (uint64_t)j->c0;
        float *out = j->dst + (size_t)r * (size_t)j->nc;
        for (int64_t c = 0; c < j->nc; c++) {
            const uint64_t h = mix64(j->key + (base + (uint64_t)c) * 0x9e3779b97f4a7c15ull);
            const float u = (float)(int32_t)(h >> 32) * (1.0f / 2147483648.0f);
            out[c] = j->offset + j->scale * u;
        }
    }
}

static ckv_status random_read(void *vctx, const char *name, int ndim, const int64_t *shape, int64_t r0, int64_t r1,
                              int64_t c0, int64_t c1, float *dst) {
    random_ctx *x = vctx;
    if (ndim < 1 || ndim > 2) return ckv_error(CKV_STATUS_ERR_ARG, "random weights: '%s' has %d dimensions", name, ndim);
    const int64_t rows = shape[0], cols = ndim == 2 ? shape[1] : 1;
    if (r1 < 0) {
        r0 = 0;
        r1 = rows;
        c0 = 0;
        c1 = cols;
    }
    if (r0 < 0 || r1 > rows || r0 > r1 || c0 < 0 || c1 > cols || c0 > c1)
        return ckv_error(CKV_STATUS_ERR_RANGE, "random weights: slice [%lld, %lld) x [%lld, %lld) of '%s' outside [%lld, %lld]",
                         (long long)r0, (long long)r1, (long long)c0, (long long)c1, name, (long long)rows, (long long)cols);
    fill_job j = {.key = mix64(x->seed ^ name_hash(name)), .cols = cols, .r0 = r0, .c0 = c0, .nc = c1 - c0, .dst = dst};
    if (ends_with(name, "norm.weight")) { /* RMSNorm weights: ones */
        for (size_t i = 0; i < (size_t)(r1 - r0) * (size_t)(c1 - c0); i++) dst[i] = 1.0f;
        return CKV_STATUS_OK;
    }
    if (ends_with(name, ".bias")) {
        j.scale = 0.02f;
    } else {
        /* uniform in [-a, a] has variance a^2 / 3: a = sqrt(3 / fan_in) gives 1 / fan_in */
        j.scale = sqrtf(3.0f / (float)(ndim == 2 ? cols : rows));
    }
    if (r1 - r0 > (int64_t)0x7fffffff) return ckv_error(CKV_STATUS_ERR_RANGE, "random weights: '%s' has too many rows", name);
    ckv_threadpool_for(x->pool, (int)(r1 - r0), 16, fill_rows, &j);
    return CKV_STATUS_OK;
}

static int random_has(void *vctx, const char *name) {
    random_ctx *x = vctx;
    return strcmp(name, "lm_head.weight") || !x->tied;
}

static void random_close(void *vctx) {
    random_ctx *x = vctx;
    if (!x) return;
    ckv_threadpool_free(x->pool);
    free(x);
}

ckv_status ckv_source_open_random(ckv_weight_source *src, ckv_model_config *cfg, const char *dir, uint64_t seed) {
    memset(src, 0, sizeof *src);
    snprintf(src->path, sizeof src->path, "%s (random weights, seed %llu)", dir, (unsigned long long)seed);
    CKV_TRY(ckv_config_load(cfg, dir));
    if (cfg->max_context < cfg->max_position_embeddings) cfg->max_context = cfg->max_position_embeddings;
    random_ctx *x = calloc(1, sizeof *x);
    if (!x) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the random weight source");
    x->seed = seed;
    x->tied = cfg->tie_word_embeddings;
    ckv_status s = ckv_threadpool_init(&x->pool, ckv_cpu_count());
    if (s != CKV_STATUS_OK) {
        free(x);
        return s;
    }
    src->ctx = x;
    src->read_f32 = random_read;
    src->has = random_has;
    src->close = random_close;
    return CKV_STATUS_OK;
}
