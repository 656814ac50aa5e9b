/* test_decode_traffic.cpp - the memory traffic of a decode step's attention on the CPU execution
 * layer's counters (emu/emu_profile.h), at the benchmark shapes scaled down: Llama-3.1-8B's layout
 * (GQA group 4, head dim 128) at batch 1 and 16 and Qwen2.5-32B's (group 5), bf16 and f32 caches,
 * 2 KV heads and 1K-8K cached rows instead of 8 heads and 32K-128K; the bf16 cases run the
 * tensor-core decode kernel (4-8 query rows per KV head), the f32 one the FMA kernel (whichever ran is
 * counted). Decode attention is bound by the
 * bytes of the cache it reads: per case it prints the attention kernels' counters beside the
 * compulsory bytes (every K/V row and position once, the queries, the outputs) and fails when the
 * kernels move more than the case's bound over them, load less than 95% of the bytes of the sectors
 * they touch, or exceed 1.35 bank ways; it also checks the outputs against a double-precision
 * reference (all rows visible). The bounds: at these lengths every split holds the minimum of 256
 * keys, and a split's fixed traffic (each warp reads the queries itself: the counters model no L1;
 * the partial row it writes and the merge reads back) is 15-25% of its K/V bytes with 4-5 query rows
 * of head dim 128 and ~45% with 8 rows of head dim 80; at 32K-128K a split holds 2K or more keys and
 * that share is under 3%. The ways: the host build splits the kernel's 16-byte shared stores of the
 * end-of-split merge into 4-byte ones (counted as up to 4 wavefronts where an STS.128 phase has 1).
 * Skips (77) when the kernels are not instrumented. What it does not check: speed (no clock). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rt.h"
#include "emu/emu_profile.h"

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda_emu.h"
#include "core/status.h"
}

using namespace ckv_emu;

static int failures = 0;
#define EXPECT(cond, ...)                                        \
    do {                                                         \
        if (!(cond)) {                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
            failures++;                                          \
        }                                                        \
    } while (0)

struct decode_case {
    const char *name;
    ckv_dtype dt;
    int batch, n_kv, group, hd, len;
    double bound; /* bytes moved / compulsory at most */
};

static uint32_t rng_state = 12345u;
static float rnd(void) { /* uniform in [-1, 1) */
    rng_state = rng_state * 1664525u + 1013904223u;
    return (float)(rng_state >> 8) / 8388608.0f - 1.0f;
}

static void *dev_upload(ckv_backend *be, const void *host, size_t bytes) {
    void *d = NULL;
    if (be->ops->alloc(be, &d, bytes, "test buffer") != CKV_STATUS_OK ||
        be->ops->upload(be, d, host, bytes) != CKV_STATUS_OK) {
        fprintf(stderr, "FAIL: cannot allocate/upload %zu bytes: %s\n", bytes, ckv_error_message());
        exit(1);
    }
    return d;
}

static float bf16_round(float x, uint16_t *bits) {
    const __nv_bfloat16 h = __float2bfloat16(x);
    *bits = h.x;
    return __bfloat162float(h);
}

static void run_case(ckv_backend *be, const decode_case &dc) {
    const int B = dc.batch, n_kv = dc.n_kv, hd = dc.hd, L = dc.len, n_heads = n_kv * dc.group;
    const size_t esz = dc.dt == CKV_DTYPE_BF16 ? 2 : 4, rowsz = (size_t)hd * esz;
    /* host copies: K/V values as the cache holds them (for the reference) */
    float *kh = (float *)malloc(sizeof(float) * (size_t)B * n_kv * L * hd);
    float *vh = (float *)malloc(sizeof(float) * (size_t)B * n_kv * L * hd);
    unsigned char *raw = (unsigned char *)malloc(rowsz * (size_t)L);
    int32_t *pos = (int32_t *)malloc(sizeof(int32_t) * (size_t)L);
    for (int i = 0; i < L; i++) pos[i] = i;
    ckv_kv_seg *segs = (ckv_kv_seg *)calloc((size_t)B * n_kv, sizeof(ckv_kv_seg));
    void **bufs = (void **)calloc((size_t)B * n_kv * 3 + 8, sizeof(void *));
    int nb = 0;
    for (int s = 0; s < B; s++)
        for (int g = 0; g < n_kv; g++) {
            void *kv[2] = {NULL, NULL};
            for (int w = 0; w < 2; w++) {
                float *host = (w ? vh : kh) + ((size_t)s * n_kv + g) * L * hd;
                for (size_t e = 0; e < (size_t)L * hd; e++) {
                    const float x = rnd();
                    if (dc.dt == CKV_DTYPE_BF16) {
                        uint16_t b;
                        host[e] = bf16_round(x, &b);
                        memcpy(raw + e * 2, &b, 2);
                    } else {
                        host[e] = x;
                        memcpy(raw + e * 4, &x, 4);
                    }
                }
                kv[w] = bufs[nb++] = dev_upload(be, raw, rowsz * (size_t)L);
            }
            int32_t *pd = (int32_t *)(bufs[nb++] = dev_upload(be, pos, sizeof(int32_t) * (size_t)L));
            ckv_kv_seg *sg = &segs[s * n_kv + g];
            sg->k = kv[0], sg->v = kv[1], sg->pos = pd, sg->len = L, sg->cap = L;
        }
    ckv_kv_seg *segs_d = (ckv_kv_seg *)(bufs[nb++] = dev_upload(be, segs, sizeof(ckv_kv_seg) * (size_t)B * n_kv));
    ckv_kv_seg **list = (ckv_kv_seg **)malloc(sizeof(ckv_kv_seg *) * (size_t)B);
    for (int s = 0; s < B; s++) list[s] = segs_d + s * n_kv;
    ckv_kv_seg **list_d = (ckv_kv_seg **)(bufs[nb++] = dev_upload(be, list, sizeof(ckv_kv_seg *) * (size_t)B));
    int32_t *seq_of = (int32_t *)malloc(sizeof(int32_t) * (size_t)(B + 1)), *qpos = (int32_t *)malloc(sizeof(int32_t) * (size_t)B);
    for (int s = 0; s <= B; s++) seq_of[s] = s; /* one token per sequence: seq_of and seq_start alike */
    for (int s = 0; s < B; s++) qpos[s] = L - 1;
    int32_t *seq_d = (int32_t *)(bufs[nb++] = dev_upload(be, seq_of, sizeof(int32_t) * (size_t)(B + 1)));
    int32_t *qpos_d = (int32_t *)(bufs[nb++] = dev_upload(be, qpos, sizeof(int32_t) * (size_t)B));
    const size_t nq = (size_t)B * n_heads * hd;
    float *q = (float *)malloc(sizeof(float) * nq), *out = (float *)malloc(sizeof(float) * nq);
    for (size_t e = 0; e < nq; e++) q[e] = rnd();
    float *q_d = (float *)(bufs[nb++] = dev_upload(be, q, sizeof(float) * nq));
    float *out_d = (float *)(bufs[nb++] = dev_upload(be, q, sizeof(float) * nq));
    const ckv_kv_batch kvb = {dc.dt, hd, n_kv, B, (ckv_kv_seg *const *)list_d, B > 1 ? seq_d : NULL,
                              B > 1 ? seq_d : NULL, L};
    const float scale = 1.0f / sqrtf((float)hd);

    ckv_emu_profile_start();
    const ckv_attention_params ap = {q_d, qpos_d, &kvb, B, n_heads, scale};
    be->ops->attention(be, out_d, &ap);
    ckv_status st = be->ops->sync(be);
    ckv_emu_profile_stop();
    EXPECT(st == CKV_STATUS_OK, "%s: attention: %s", dc.name, ckv_error_message());
    if (st == CKV_STATUS_OK) st = be->ops->download(be, out, out_d, sizeof(float) * nq);

    /* reference: every row visible, softmax in double */
    double max_err = 0.0;
    int shown = 0;
    double *w = (double *)malloc(sizeof(double) * (size_t)L);
    for (int s = 0; s < B; s++)
        for (int h = 0; h < n_heads; h++) {
            const int g = h / dc.group;
            const float *qr = q + ((size_t)s * n_heads + h) * hd;
            const float *K = kh + ((size_t)s * n_kv + g) * L * hd, *V = vh + ((size_t)s * n_kv + g) * L * hd;
            double mx = -INFINITY, sum = 0.0;
            for (int i = 0; i < L; i++) {
                double d = 0.0;
                for (int e = 0; e < hd; e++) d += (double)qr[e] * K[(size_t)i * hd + e];
                w[i] = d * scale;
                mx = w[i] > mx ? w[i] : mx;
            }
            for (int i = 0; i < L; i++) sum += (w[i] = exp(w[i] - mx));
            for (int e = 0; e < hd; e++) {
                double o = 0.0;
                for (int i = 0; i < L; i++) o += w[i] * V[(size_t)i * hd + e];
                const double err = fabs(o / sum - out[((size_t)s * n_heads + h) * hd + e]);
                if (err > 2e-6 && shown++ < 5)
                    fprintf(stderr, "  %s: seq %d head %d dim %d: %.8g, reference %.8g\n", dc.name, s, h, e,
                            out[((size_t)s * n_heads + h) * hd + e], o / sum);
                max_err = err > max_err ? err : max_err;
            }
        }
    EXPECT(max_err <= 2e-6, "%s: max |error| %.3g against the double reference (bound 2e-6)", dc.name, max_err);

    /* traffic: every K/V row and position once, the queries once, the outputs once */
    const double kv_bytes = (double)B * n_kv * L * (2.0 * (double)rowsz + 4.0);
    const double ideal = kv_bytes + 2.0 * (double)nq * 4.0;
    ckv_emu_profile_stats k = {}, m = {};
    /* the tensor-core kernel where it fits (bf16, 4-8 query rows, head dims 64-128), else the FMA one */
    const int have = ckv_emu_profile_get("(decode_mma_kernel<HD>)", &k) || ckv_emu_profile_get("(decode_kernel<T, RP>)", &k);
    EXPECT(have, "%s: no decode kernel ran", dc.name);
    ckv_emu_profile_get("merge_kernel", &m);
    const double moved = 32.0 * (double)(k.ld_sectors + k.st_sectors + m.ld_sectors + m.st_sectors);
    const double ld_eff = k.ld_sectors ? (double)k.ld_bytes / (32.0 * (double)k.ld_sectors) : 0.0;
    const double ways = k.sh_ideal_wavefronts ? (double)k.sh_wavefronts / (double)k.sh_ideal_wavefronts : 1.0;
    printf("%-34s  K/V+pos %8.3f MB  moved %8.3f MB (%.3fx compulsory %.3f MB)  decode load eff %5.1f%%  "
           "requests %llu  shared ways %.2f  partials %.1f kB  max|err| %.2g\n",
           dc.name, kv_bytes / 1e6, moved / 1e6, moved / ideal, ideal / 1e6, 100.0 * ld_eff,
           (unsigned long long)k.ld_requests, ways, 32.0 * (double)(k.st_sectors + m.ld_sectors) / 1e3, max_err);
    ckv_emu_profile_print(stdout);
    EXPECT(moved <= dc.bound * ideal, "%s: %.3f MB moved, more than %.2f x the compulsory %.3f MB", dc.name,
           moved / 1e6, dc.bound, ideal / 1e6);
    EXPECT(ld_eff >= 0.95, "%s: decode kernel load efficiency %.1f%% (want >= 95%%)", dc.name, 100.0 * ld_eff);
    EXPECT(ways <= 1.35, "%s: decode kernel shared-memory bank ways %.2f (want <= 1.35)", dc.name, ways);

    for (int i = 0; i < nb; i++) be->ops->release(be, bufs[i]);
    free(kh), free(vh), free(raw), free(pos), free(segs), free(bufs), free(list), free(seq_of), free(qpos), free(q);
    free(out), free(w);
}

int main() {
    ckv_backend *be = NULL;
    if (ckv_backend_cuda_emu_init(&be, 0) != CKV_STATUS_OK) {
        fprintf(stderr, "FAIL: cuda-emu backend: %s\n", ckv_error_message());
        return 1;
    }
    if (!ckv_emu_profile_start()) {
        printf("skip: the kernels are not instrumented (CMake CKV_EMU_INSTRUMENT=OFF): nothing to count\n");
        be->ops->free(be);
        return 77;
    }
    ckv_emu_profile_stop();
    static const decode_case cases[] = {
        /* name                               dtype          batch kv G  hd   len   bound */
        {"llama-3.1-8b layout, batch 1, 4K", CKV_DTYPE_BF16, 1, 2, 4, 128, 4096, 1.25},
        {"llama-3.1-8b layout, batch 16, 1K", CKV_DTYPE_BF16, 16, 2, 4, 128, 1024, 1.25},
        {"qwen2.5-32b layout, batch 1, 8K", CKV_DTYPE_BF16, 1, 2, 5, 128, 8192, 1.25},
        {"llama-3.1-8b layout, f32 cache, 2K", CKV_DTYPE_F32, 1, 2, 4, 128, 2048, 1.15},
        {"head dim 80, group 8, 2K", CKV_DTYPE_BF16, 1, 1, 8, 80, 2048, 1.50},
    };
    for (const decode_case &dc : cases) run_case(be, dc);
    be->ops->free(be);
    if (failures) {
        fprintf(stderr, "test_decode_traffic: %d failures\n", failures);
        return 1;
    }
    printf("test_decode_traffic: all checks passed\n");
    return 0;
}
