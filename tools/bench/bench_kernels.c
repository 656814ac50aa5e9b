/* bench_kernels.c - kernel microbenchmarks of one backend through its op table: prefill attention
 * (causal, one sequence), decode attention (one query row per sequence), the eviction ops
 * critical_adakv:snapkv runs (snapkv's window column sums, CriticalKV's value norm, the cross-head
 * top-k counts), compactor's chunk column sums (one chunk of 256 rows; small: 64) and the sample op,
 * on the shapes of Llama-3.1-8B (32 query heads over 8 KV heads,
 * head_dim 128, bf16 cache, hidden 4096; --shapes small: 4 over 1, hidden 512, short rows, for the
 * CPU execution layer). Every buffer is allocated before the first measurement;
 * a measurement is the median (and min) of N repetitions after warm-up, each repetition `inner`
 * calls between two syncs of the backend (inner sized so that a repetition lasts --min-ms), printed
 * as one JSON line with the op's FLOPs or bytes and its rate. Inputs are random: the figures are
 * speeds, never results; nothing is compared or checked here (tests/cuda does that).
 *   bench_kernels [--backend cuda|cuda-emu|cpu] [--shapes full|small] [--evict-rows N] [--cases A,B]
 *                 [--rounds R] [--reps N] [--warmup N] [--min-ms X] [--list] [--stdin]
 * --evict-rows sets the context rows of the eviction cases (default 32768 full, 256 small; the case
 * names follow, e.g. evict_window_colsum_4096), so that a shape set's heads can be profiled at
 * other lengths (CKV_EMU_PROFILE=1 on cuda-emu: docs/benchmarks.md).
 * --list prints the case names of the shape set and opens no backend; --stdin measures the case
 * named on each line of standard input (tools/bench/bench_kernels_peer.py alternates them with its
 * torch peers this way) until end of input; otherwise every case is measured once per round, the
 * cases alternating. Every failure prints one line naming it and exits non-zero. */
#define _POSIX_C_SOURCE 200809L /* strtok_r */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/status.h"
#include "core/tensor.h"
#include "core/timer.h"

enum { KB_WINDOW = 64, KB_MAX_CASES = 16, KB_MAX_SEQ = 16, KB_MAX_HKV = 8 };
#define KB_KEEP 0.2 /* the budget of the top-k counts: kept fraction of every head's rows */

typedef enum {
    KB_PREFILL,
    KB_DECODE,
    KB_EVICT_COLSUM,
    KB_EVICT_VALUE_NORM,
    KB_EVICT_TOPK_COUNTS,
    KB_SAMPLE,
    KB_EVICT_CHUNK
} kb_kind;
static const char *const kb_kernel_names[] = {"prefill_attention", "decode_attention", "evict_window_colsum",
                                              "evict_value_norm", "evict_topk_counts", "sample",
                                              "evict_chunk_colsum"};

typedef struct {
    char name[40];
    kb_kind kind;
    int rows;  /* prefill: tokens; decode: cached rows per sequence; evict: context rows; sample: vocabulary */
    int batch; /* sequences (decode) or logits rows (sample); 1 otherwise */
    int used;  /* measured in this run (--cases): only these size the buffers */
} kb_case;

typedef struct {
    kb_case cases[KB_MAX_CASES];
    int n_cases;
    int hq, hkv, hd, hidden; /* the model: query heads, KV heads, head_dim, o_proj rows */
    int chunk;               /* compactor's chunk rows (evict_chunk_colsum) */
    int max_rows, max_seq, max_q, max_vocab, max_evict;
} kb_shapes;

typedef struct {
    ckv_backend *be;
    const kb_shapes *sh;
    /* the cache: max_seq sequences x hkv segments, cap = sh->max_rows rows each */
    void *k[KB_MAX_SEQ][KB_MAX_HKV], *v[KB_MAX_SEQ][KB_MAX_HKV]; /* [cap, hd] bf16 */
    int32_t *pos[KB_MAX_SEQ][KB_MAX_HKV];                      /* [cap] 0 .. cap-1 (shared by every segment) */
    ckv_kv_seg *segs[KB_MAX_CASES][KB_MAX_SEQ];                /* per case: [hkv] descriptors (device) */
    ckv_kv_seg **list[KB_MAX_CASES];                           /* per case: [batch] (device) */
    int32_t *seq_of, *seq_start;                               /* [max_seq], [max_seq + 1]: 0, 1, 2, ... */
    float *q;                                                  /* [max_q, hq, hd] */
    int32_t *qpos;                                             /* [max_q] 0, 1, 2, ... (prefill) */
    int32_t *qpos_end;                                         /* [KB_MAX_SEQ] cap: a decode query sees every row */
    float *out;                                                /* [max_q, hq, hd] */
    double *colsum;                                            /* [hq, max_evict] */
    float *scores;                                             /* [hkv, max_evict] */
    int32_t *counts;                                           /* [KB_MAX_HKV] */
    void *wo;                                                  /* [hidden, hq * hd] bf16 */
    float *logits;                                             /* [KB_MAX_SEQ, max_vocab] */
    int32_t *ids;                                              /* [KB_MAX_SEQ] */
    double *u;                                                 /* [KB_MAX_SEQ] */
} kb_bench;

static void kb_die(const char *what) {
    fprintf(stderr, "bench_kernels: %s\n", what);
    exit(1);
}

static void kb_check(ckv_status s, const char *what) {
    if (s == CKV_STATUS_OK) return;
    fprintf(stderr, "bench_kernels: %s: %s\n", what, ckv_error_message());
    exit(1);
}

static double kb_now_ms(void) { return ckv_time_now() * 1e3; }

static uint64_t kb_rng = 0x9E3779B97F4A7C15ull;
static float kb_uniform(float lo, float hi) { /* xorshift64* */
    kb_rng ^= kb_rng >> 12, kb_rng ^= kb_rng << 25, kb_rng ^= kb_rng >> 27;
    return lo + (hi - lo) * (float)((kb_rng * 0x2545F4914F6CDD1Dull) >> 40) / 16777216.0f;
}

/* Adds the case named prefix_rows (decode and sample: prefix_rows_bBATCH). */
static void kb_shapes_add(kb_shapes *s, kb_kind kind, int rows, int batch, const char *prefix) {
    kb_case *c = &s->cases[s->n_cases++];
    c->kind = kind, c->rows = rows, c->batch = batch;
    if (kind == KB_DECODE || kind == KB_SAMPLE) snprintf(c->name, sizeof c->name, "%s_%d_b%d", prefix, rows, batch);
    else snprintf(c->name, sizeof c->name, "%s_%d", prefix, rows);
}

/* The cases of a shape set ("full": the GPU run's; "small": seconds on cuda-emu), the eviction cases at
 * evict_rows context rows (0: the set's own). 0 when unknown. */
static int kb_shapes_init(kb_shapes *s, const char *which, int evict_rows) {
    const int full = strcmp(which, "full") == 0;
    if (!full && strcmp(which, "small") != 0) return 0;
    memset(s, 0, sizeof *s);
    /* full: Llama-3.1-8B at tp 1; small: 4 query heads over 1 KV head (GQA 4 kept), hidden 512 */
    s->hq = full ? 32 : 4, s->hkv = full ? 8 : 1, s->hd = 128, s->hidden = full ? 4096 : 512;
    s->chunk = full ? 256 : 64; /* small: the emulated chunk costs C^2 */
    const int prefill[2] = {full ? 8192 : 128, full ? 32768 : 256};
    const int decode[2] = {full ? 32768 : 256, full ? 131072 : 512};
    const int evict = evict_rows ? evict_rows : full ? 32768 : 256, vocab = full ? 152064 : 1024;
    for (int i = 0; i < 2; i++) kb_shapes_add(s, KB_PREFILL, prefill[i], 1, "prefill");
    for (int i = 0; i < 2; i++)
        for (int b = 1; b <= 16; b += 15) kb_shapes_add(s, KB_DECODE, decode[i], b, "decode");
    kb_shapes_add(s, KB_EVICT_COLSUM, evict, 1, "evict_window_colsum");
    kb_shapes_add(s, KB_EVICT_VALUE_NORM, evict, 1, "evict_value_norm");
    kb_shapes_add(s, KB_EVICT_CHUNK, evict, 1, "evict_chunk_colsum");
    kb_shapes_add(s, KB_EVICT_TOPK_COUNTS, evict, 1, "evict_topk_counts");
    kb_shapes_add(s, KB_SAMPLE, vocab, 1, "sample");
    kb_shapes_add(s, KB_SAMPLE, vocab, full ? 16 : 4, "sample"); /* small: the emulated sort is slow */
    return 1;
}

/* Marks case i as measured and grows the buffer sizes to hold it. */
static void kb_shapes_use(kb_shapes *s, int i) {
    kb_case *c = &s->cases[i];
    c->used = 1;
    const int q = c->kind == KB_PREFILL          ? c->rows
                  : c->kind == KB_DECODE       ? c->batch
                  : c->kind == KB_EVICT_CHUNK ? s->chunk
                                              : KB_WINDOW;
    if (q > s->max_q) s->max_q = q;
    if (c->kind == KB_SAMPLE) {
        if (c->rows > s->max_vocab) s->max_vocab = c->rows;
        return;
    }
    if (c->rows > s->max_rows) s->max_rows = c->rows;
    if (c->batch > s->max_seq) s->max_seq = c->batch;
    if (c->kind != KB_PREFILL && c->kind != KB_DECODE && c->rows > s->max_evict) s->max_evict = c->rows;
}

static const kb_case *kb_find(const kb_shapes *s, const char *name, int *index) {
    for (int i = 0; i < s->n_cases; i++)
        if (strcmp(s->cases[i].name, name) == 0) {
            if (index) *index = i;
            return &s->cases[i];
        }
    return NULL;
}

/* A device buffer of `bytes` (4 when 0) holding `host` (when not NULL). */
static void *kb_upload(ckv_backend *be, const void *host, size_t bytes, const char *what) {
    void *d = NULL;
    kb_check(be->ops->alloc(be, &d, bytes ? bytes : 4, what), what);
    if (host && bytes) kb_check(be->ops->upload(be, d, host, bytes), what);
    return d;
}

static void *kb_upload_random(ckv_backend *be, size_t n, ckv_dtype t, float lo, float hi, const char *what) {
    float *x = malloc(n * sizeof(float));
    void *h = malloc(n * ckv_dtype_size(t));
    if (!x || !h) kb_die("out of host memory for the inputs");
    for (size_t i = 0; i < n; i++) x[i] = kb_uniform(lo, hi);
    ckv_convert_from_f32(h, x, t, n);
    void *d = kb_upload(be, h, n * ckv_dtype_size(t), what);
    free(x), free(h);
    return d;
}

/* Allocates and fills every buffer the cases of b->sh read or write. */
static void kb_bench_init(kb_bench *b, ckv_backend *be, const kb_shapes *sh) {
    memset(b, 0, sizeof *b);
    b->be = be, b->sh = sh;
    const size_t cap = (size_t)sh->max_rows, row_elems = cap * sh->hd;
    /* one random block of keys/values uploaded to every segment; positions 0 .. cap-1 */
    uint16_t *kv_host = malloc(row_elems * sizeof(uint16_t));
    int32_t *pos_host = malloc((cap + (size_t)sh->max_q + KB_MAX_SEQ + 1) * sizeof(int32_t));
    if (!kv_host || !pos_host) kb_die("out of host memory for the cache");
    for (size_t i = 0; i < row_elems; i++) kv_host[i] = ckv_f32_to_bf16(kb_uniform(-1.0f, 1.0f));
    for (size_t i = 0; i < cap + (size_t)sh->max_q + KB_MAX_SEQ + 1; i++) pos_host[i] = (int32_t)i;
    for (int s = 0; s < sh->max_seq; s++)
        for (int g = 0; g < sh->hkv; g++) {
            b->k[s][g] = kb_upload(be, kv_host, row_elems * 2, "keys");
            b->v[s][g] = kb_upload(be, kv_host, row_elems * 2, "values");
            b->pos[s][g] = kb_upload(be, pos_host, cap * 4, "positions");
        }
    b->seq_of = kb_upload(be, pos_host, (size_t)sh->max_seq * 4, "seq_of");
    b->seq_start = kb_upload(be, pos_host, (size_t)(sh->max_seq + 1) * 4, "seq_start");
    for (int i = 0; i < sh->n_cases; i++) {
        const kb_case *c = &sh->cases[i];
        if (c->kind == KB_SAMPLE || !c->used) continue;
        ckv_kv_seg *ptrs[KB_MAX_SEQ];
        for (int s = 0; s < c->batch; s++) {
            ckv_kv_seg segs[KB_MAX_HKV];
            for (int g = 0; g < sh->hkv; g++) segs[g] = (ckv_kv_seg){b->k[s][g], b->v[s][g], b->pos[s][g], c->rows,
                                                                    (int32_t)cap};
            ptrs[s] = b->segs[i][s] = kb_upload(be, segs, sizeof(ckv_kv_seg) * (size_t)sh->hkv, "segments");
        }
        b->list[i] = kb_upload(be, ptrs, sizeof(ckv_kv_seg *) * (size_t)c->batch, "segment lists");
    }
    const size_t qn = (size_t)sh->max_q * sh->hq * sh->hd;
    b->q = kb_upload_random(be, qn, CKV_DTYPE_F32, -1.0f, 1.0f, "queries");
    b->out = kb_upload(be, NULL, qn * sizeof(float), "attention output");
    /* prefill queries sit at rows 0 .. L-1; decode queries after the cache (qpos = rows sees all) */
    b->qpos = kb_upload(be, pos_host, (size_t)sh->max_q * 4, "query positions");
    for (int i = 0; i < KB_MAX_SEQ; i++) pos_host[i] = (int32_t)cap;
    b->qpos_end = kb_upload(be, pos_host, KB_MAX_SEQ * 4, "decode query positions");
    free(kv_host), free(pos_host);
    if (sh->max_evict) {
        const size_t L = (size_t)sh->max_evict;
        b->colsum = kb_upload(be, NULL, sh->hq * L * sizeof(double), "column sums");
        b->scores = kb_upload_random(be, sh->hkv * L, CKV_DTYPE_F32, 0.0f, 1.0f, "scores");
        b->counts = kb_upload(be, NULL, sh->hkv * sizeof(int32_t), "counts");
        b->wo = kb_upload_random(be, (size_t)sh->hidden * sh->hq * sh->hd, CKV_DTYPE_BF16, -0.05f, 0.05f, "o_proj");
        if (ckv_backend_supports(be, CKV_BACKEND_CAP_EVICT_RESERVE)) {
            const ckv_evict_shape es = {sh->max_evict, 256, sh->hq, sh->hkv, sh->hkv, sh->hd, sh->hidden,
                                        CKV_DTYPE_BF16, CKV_DTYPE_BF16, 0};
            kb_check(be->ops->evict_reserve(be, &es), "evict_reserve");
        }
    }
    if (sh->max_vocab) {
        const size_t n = (size_t)KB_MAX_SEQ * (size_t)sh->max_vocab;
        b->logits = kb_upload_random(be, n, CKV_DTYPE_F32, -8.0f, 8.0f, "logits");
        b->ids = kb_upload(be, NULL, KB_MAX_SEQ * sizeof(int32_t), "sampled ids");
        double uh[KB_MAX_SEQ];
        for (int i = 0; i < KB_MAX_SEQ; i++) uh[i] = kb_uniform(0.0f, 1.0f);
        b->u = kb_upload(be, uh, sizeof uh, "uniform draws");
    }
    kb_check(be->ops->sync(be), "filling the inputs");
}

static void kb_bench_free(kb_bench *b) {
    ckv_backend *be = b->be;
    const kb_shapes *sh = b->sh;
    for (int s = 0; s < b->sh->max_seq; s++)
        for (int g = 0; g < sh->hkv; g++) {
            be->ops->release(be, b->k[s][g]);
            be->ops->release(be, b->v[s][g]);
            be->ops->release(be, b->pos[s][g]);
        }
    for (int i = 0; i < b->sh->n_cases; i++) {
        for (int s = 0; s < KB_MAX_SEQ; s++) be->ops->release(be, b->segs[i][s]);
        be->ops->release(be, b->list[i]);
    }
    void *rest[] = {b->seq_of, b->seq_start, b->q, b->qpos, b->qpos_end, b->out, b->colsum, b->scores,
                    b->counts,  b->wo,        b->logits, b->ids, b->u};
    for (size_t i = 0; i < sizeof rest / sizeof rest[0]; i++) be->ops->release(be, rest[i]);
}

/* One call of case i's op. */
static void kb_call(kb_bench *b, int i) {
    ckv_backend *be = b->be;
    const kb_shapes *sh = b->sh;
    const kb_case *c = &sh->cases[i];
    const int L = c->rows;
    const int one = c->kind != KB_DECODE; /* a batch of one sequence: seq_of / seq_start may be NULL */
    const ckv_kv_batch kv = {CKV_DTYPE_BF16, sh->hd, sh->hkv, c->batch, (ckv_kv_seg *const *)b->list[i],
                             one ? NULL : b->seq_of, one ? NULL : b->seq_start, L};
    const float inv_sqrt_d = 1.0f / sqrtf((float)sh->hd);
    switch (c->kind) {
    case KB_PREFILL: {
        const ckv_attention_params a = {b->q, b->qpos, &kv, L, sh->hq, inv_sqrt_d};
        be->ops->attention(be, b->out, &a);
        break;
    }
    case KB_DECODE: { /* one query per sequence, after its L cached rows */
        const ckv_attention_params a = {b->q, b->qpos_end, &kv, c->batch, sh->hq, inv_sqrt_d};
        be->ops->attention(be, b->out, &a);
        break;
    }
    case KB_EVICT_COLSUM: { /* snapkv: the last KB_WINDOW rows' queries over the rows before them */
        const ckv_evict_attn_params a = {b->q, KB_WINDOW, L - KB_WINDOW, &kv, sh->hq, 0, sh->hq / sh->hkv,
                                         sqrtf((float)sh->hd), CKV_EVICT_LOGITS_DIV};
        kb_check(be->ops->evict_attn_colsum(be, b->colsum, L - KB_WINDOW, &a, CKV_EVICT_PER_QUERY_HEAD,
                                            CKV_EVICT_ZERO_FIRST), c->name);
        break;
    }
    case KB_EVICT_CHUNK: { /* compactor: the last chunk's queries over their own keys, scale 1 */
        const ckv_evict_attn_params a = {b->q, sh->chunk, L - sh->chunk, &kv, sh->hq, 0, sh->hq / sh->hkv, 1.0f,
                                         CKV_EVICT_LOGITS_MUL};
        kb_check(be->ops->evict_chunk_colsum(be, b->colsum, L, &a, 0, CKV_EVICT_ZERO_FIRST), c->name);
        break;
    }
    case KB_EVICT_VALUE_NORM: {
        const ckv_weight wo = {b->wo, CKV_DTYPE_BF16, sh->hidden, sh->hq * sh->hd, (size_t)sh->hq * sh->hd * 2};
        kb_check(be->ops->evict_value_norm(be, b->scores, L, &kv, L, &wo, sh->hq, 0, sh->hq / sh->hkv), c->name);
        break;
    }
    case KB_EVICT_TOPK_COUNTS:
        kb_check(be->ops->evict_topk_counts(be, b->counts, b->scores, L, sh->hkv, L,
                                            (int64_t)(KB_KEEP * sh->hkv * (double)L)), c->name);
        break;
    case KB_SAMPLE: /* nucleus sampling at temperature 0.7, top_p 0.9 */
        be->ops->sample(be, b->ids, b->logits, c->batch, L, 0.7f, 0, 0.9f, b->u);
        break;
    }
}

/* The op's work: FLOPs (*is_flops = 1) or bytes it must move at least. */
static double kb_work(const kb_shapes *sh, const kb_case *c, int *is_flops) {
    const double L = c->rows, B = c->batch, d = sh->hd;
    *is_flops = 1;
    switch (c->kind) {
    case KB_PREFILL: return 4.0 * L * L / 2.0 * d * sh->hq; /* QK^T and PV over the causal half */
    case KB_EVICT_COLSUM: return 2.0 * KB_WINDOW * (L - KB_WINDOW) * d * sh->hq; /* QK^T only */
    case KB_EVICT_VALUE_NORM: return 2.0 * L * d * sh->hidden * sh->hq;          /* V W_O^h per query head */
    case KB_EVICT_CHUNK: return 2.0 * sh->chunk * sh->chunk * d * sh->hq;         /* QK^T of the chunk, once */
    default: break;
    }
    *is_flops = 0;
    switch (c->kind) {
    case KB_DECODE: return B * sh->hkv * L * (2.0 * d * 2.0 + 4.0); /* K + V rows (bf16) and positions, once */
    case KB_EVICT_TOPK_COUNTS: return sh->hkv * L * 4.0;            /* the fp32 scores, once */
    default: return B * L * 4.0;                                    /* sample: the fp32 logits, once */
    }
}

static int kb_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef struct {
    int reps, warmup;
    double min_ms;
} kb_timing;

/* Times case i and prints its JSON line (round r). */
static void kb_measure(kb_bench *b, int i, const kb_timing *tm, int r) {
    ckv_backend *be = b->be;
    const kb_shapes *sh = b->sh;
    const kb_case *c = &sh->cases[i];
    for (int w = 0; w < tm->warmup; w++) kb_call(b, i);
    kb_check(be->ops->sync(be), c->name);
    double t0 = kb_now_ms();
    kb_call(b, i);
    kb_check(be->ops->sync(be), c->name);
    const double one = kb_now_ms() - t0;
    int inner = one > 0 ? (int)ceil(tm->min_ms / one) : 64;
    inner = inner < 1 ? 1 : inner > 64 ? 64 : inner;
    double ts[256];
    for (int k = 0; k < tm->reps; k++) {
        t0 = kb_now_ms();
        for (int j = 0; j < inner; j++) kb_call(b, i);
        kb_check(be->ops->sync(be), c->name);
        ts[k] = (kb_now_ms() - t0) / inner;
    }
    qsort(ts, (size_t)tm->reps, sizeof ts[0], kb_cmp_double);
    const double med = tm->reps % 2 ? ts[tm->reps / 2] : 0.5 * (ts[tm->reps / 2 - 1] + ts[tm->reps / 2]);
    int is_flops;
    const double work = kb_work(sh, c, &is_flops);
    printf("{\"kernel\": \"%s\", \"case\": \"%s\", \"backend\": \"%s\", \"round\": %d, \"shape\": {\"rows\": %d, "
           "\"batch\": %d, \"heads\": %d, \"kv_heads\": %d, \"head_dim\": %d, \"hidden\": %d, \"window\": %d, "
           "\"dtype\": \"bf16\"}, \"reps\": %d, \"inner\": %d, \"median_ms\": %.6g, \"min_ms\": %.6g, \"%s\": %.6g, "
           "\"%s\": %.6g}\n",
           kb_kernel_names[c->kind], c->name, be->name, r, c->rows, c->batch, sh->hq, sh->hkv, sh->hd, sh->hidden,
           KB_WINDOW, tm->reps, inner, med, ts[0], is_flops ? "flops" : "bytes", work,
           is_flops ? "tflops" : "gbs", work / (med * 1e-3) / (is_flops ? 1e12 : 1e9));
    fflush(stdout);
}

static int kb_usage(const char *what) {
    fprintf(stderr, "bench_kernels: %s (usage: bench_kernels [--backend cuda|cuda-emu|cpu] [--shapes full|small] "
                    "[--evict-rows N] [--cases A,B] [--rounds R] [--reps N] [--warmup N] [--min-ms X] [--list] "
                    "[--stdin])\n", what);
    return 2;
}

/* atoi with a range: 0 when s is not an integer in [lo, hi] */
static int kb_parse_int(const char *s, int lo, int hi, int *out) {
    char *end;
    const long v = strtol(s, &end, 10);
    if (!*s || *end || v < lo || v > hi) return 0;
    *out = (int)v;
    return 1;
}

int main(int argc, char **argv) {
    const char *backend = "cuda", *shapes = "full", *cases = NULL;
    int rounds = 3, list = 0, from_stdin = 0, evict_rows = 0;
    kb_timing tm = {10, 2, 2.0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--list") == 0) { list = 1; continue; }
        if (strcmp(f, "--stdin") == 0) { from_stdin = 1; continue; }
        char msg[160];
        if (strncmp(f, "--", 2) != 0 || i + 1 >= argc) {
            snprintf(msg, sizeof msg, strncmp(f, "--", 2) ? "%.60s: not a flag" : "%.60s needs a value", f);
            return kb_usage(msg);
        }
        const char *v = argv[++i];
        snprintf(msg, sizeof msg, "%s %s: not a valid value", f, v);
        if (strcmp(f, "--backend") == 0) backend = v;
        else if (strcmp(f, "--shapes") == 0) shapes = v;
        else if (strcmp(f, "--cases") == 0) cases = v;
        else if (strcmp(f, "--evict-rows") == 0) { if (!kb_parse_int(v, 256, 1 << 20, &evict_rows)) return kb_usage(msg); }
        else if (strcmp(f, "--rounds") == 0) { if (!kb_parse_int(v, 1, 100, &rounds)) return kb_usage(msg); }
        else if (strcmp(f, "--reps") == 0) { if (!kb_parse_int(v, 1, 256, &tm.reps)) return kb_usage(msg); }
        else if (strcmp(f, "--warmup") == 0) { if (!kb_parse_int(v, 0, 100, &tm.warmup)) return kb_usage(msg); }
        else if (strcmp(f, "--min-ms") == 0) {
            char *end;
            tm.min_ms = strtod(v, &end);
            if (!*v || *end || !(tm.min_ms >= 0 && tm.min_ms <= 1000)) return kb_usage(msg);
        } else {
            snprintf(msg, sizeof msg, "unknown flag %s", f);
            return kb_usage(msg);
        }
    }
    kb_shapes sh;
    if (!kb_shapes_init(&sh, shapes, evict_rows)) return kb_usage("--shapes must be full or small");
    int chosen[KB_MAX_CASES], n_chosen = 0;
    if (cases) { /* a comma-separated subset, in the order given */
        char buf[512];
        snprintf(buf, sizeof buf, "%s", cases);
        for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            int idx;
            if (!kb_find(&sh, t, &idx) || n_chosen == KB_MAX_CASES) {
                char msg[96];
                snprintf(msg, sizeof msg, "--cases: no case %.40s in --shapes %s (see --list)", t, shapes);
                return kb_usage(msg);
            }
            chosen[n_chosen++] = idx;
        }
    } else {
        for (int i = 0; i < sh.n_cases; i++) chosen[n_chosen++] = i;
    }
    for (int i = 0; i < n_chosen; i++) kb_shapes_use(&sh, chosen[i]);
    if (list) {
        for (int i = 0; i < n_chosen; i++) printf("%s\n", sh.cases[chosen[i]].name);
        return 0;
    }
    ckv_backend *be = NULL;
    if (ckv_backend_init(&be, backend, 0) != CKV_STATUS_OK) {
        fprintf(stderr, "bench_kernels: backend %s: %s\n", backend, ckv_error_message());
        return 1;
    }
    if (!be->ops->kv_dtype_ok(be, CKV_DTYPE_BF16)) kb_die("this backend holds no bf16 cache");
    kb_bench b;
    kb_bench_init(&b, be, &sh);
    if (from_stdin) {
        char line[128];
        int done[KB_MAX_CASES] = {0}; /* measurements of each case so far: its round */
        while (fgets(line, sizeof line, stdin)) {
            line[strcspn(line, "\r\n")] = 0;
            if (!*line) continue;
            int idx;
            if (!kb_find(&sh, line, &idx) || !sh.cases[idx].used) {
                fprintf(stderr, "bench_kernels: --stdin: no case %.60s in --shapes %s and --cases\n", line, shapes);
                return 1;
            }
            kb_measure(&b, idx, &tm, done[idx]++);
        }
    } else {
        for (int r = 0; r < rounds; r++)
            for (int i = 0; i < n_chosen; i++) kb_measure(&b, chosen[i], &tm, r);
    }
    kb_bench_free(&b);
    ckv_backend_free(be);
    return 0;
}
