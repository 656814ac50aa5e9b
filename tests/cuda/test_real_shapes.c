/* test_real_shapes.c - the CUDA backend at the shapes of the models users run, against the CPU
 * backend. The attention geometry (query heads, KV heads, head_dim), RoPE, biases, tied embeddings
 * and vocabulary are read from configs/models/<name>/config.json: Llama-3.1-8B (32/8 heads, head_dim
 * 128, llama3 RoPE scaling, vocabulary 128,256), Mistral-7B-v0.3 (32/8, 128, 32,768), Qwen2.5-32B
 * (40/8, 128, YaRN x4, biases, 152,064) and Qwen2.5-0.5B (14/2, 64, biases, tied, 151,936). Models
 * get random weights (model/source_random.c), one layer and hidden and MLP sizes of 256, so
 * the emulated GEMMs stay affordable while every attention kernel runs at its real shape. Cases:
 *   rope     positions from 131,072 to 2^24 with each model's own frequencies and YaRN factor:
 *            device and host agree within test_backend_ops' bound (4e-6 x scale x |x|max).
 *   decode   the attention op over 8 sequences whose ragged, compacted segments hold 4,096-4,607
 *            keys at positions up to ~140,000 (a 128K context kept at a few percent), one query each
 *            past the last key: the split-KV kernel with the split count of the device's SMs (the
 *            CPU execution layer reports an H200's 132: 5 splits of ~29 tiles for 8 KV heads, 17
 *            for Qwen2.5-0.5B's 2) within the split kernel's bound 2e-5 absolute + 1e-4 relative.
 *   sample   rows over Qwen2.5's 152,064-token vocabulary (distinct logits and rows of many exact
 *            ties): the same token as the CPU op and the engine's sampler for greedy, top-p and
 *            top-k draws.
 *   prefill  a 1-layer model: 2,100 prompt tokens in chunks of 500 (33 query tiles of 64 per head,
 *            partial tiles, causal edges inside tiles, later chunks over the cache) with bf16
 *            weights and KV on the device, then 3 decode steps fed fixed tokens: last-row and
 *            decode logits within test_model_cuda's bf16 bound (0.25) of the CPU backend's.
 *   evict    every press of the eviction tests selecting on one 4,096-token context of a 1-layer
 *            model (ratio 0.5: top-k over many chunks, value norms over many blocks, cross-head
 *            counts over 4,096 x Hkv scores), f32 weights and KV: the CPU backend prefills and
 *            selects, the device selects on the CPU's layer state (copied bit for bit). Kept rows
 *            identical up to near-ties (the rule at kept_compare, docs/spec-eviction.md).
 * Modes: `quick` (label cuda-emu, CI: rope, decode and sample on every geometry, prefill on
 * Qwen2.5-0.5B), `full` (everything on every geometry) and `full GEOMETRY` (that geometry's prefill
 * and eviction: the slow tests, one per geometry). Each part prints its CPU seconds.
 *   test_real_shapes [cuda-emu|cuda [quick|full [GEOMETRY]]]     (default: cuda-emu quick) */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "backend/backend.h"
#include "ckv_test.h"
#include "common/fixture.h"
#include "core/tensor.h"
#include "cuda_test_backend.h"
#include "engine/compress.h"
#include "engine/session.h"
#include "evict/press.h"
#include "evict/select.h"
#include "model/config.h"
#include "model/model.h"
#include "model/rope.h"

static ckv_backend *tb;  /* the backend under test */
static ckv_backend *ref; /* the CPU backend */
static uint64_t rng = 0x9E3779B97F4A7C15ull;

static const char *const geometries[] = {"llama-3.1-8b-instruct", "mistral-7b-instruct-v0.3",
                                         "qwen2.5-32b-instruct-128k", "qwen2.5-0.5b-instruct"};
enum { N_GEOMETRIES = 4, SMALL = 3 /* index of Qwen2.5-0.5B, the cheapest */ };

static float urand(float lo, float hi) {
    const float x = ckv_test_uniform(&rng, lo, hi);
    return x == 0.0f ? 0.5f * hi : x;
}

static float *rand_floats(size_t n, float lo, float hi) {
    float *x = ckv_test_calloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = urand(lo, hi);
    return x;
}

/* The geometry's config.json with `layers` layers, hidden and MLP sizes of 256 and head_dim written
 * out, in TMP/<name>-<layers>l/ (returned in dir). */
static int model_dir(char *dir, size_t cap, const char *configs, const char *name, int layers, const char *tmp) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/config.json", configs, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "FAIL: cannot open %s\n", path);
        ckv_test_failures++;
        return 0;
    }
    static char text[1 << 16];
    const size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = 0;
    cJSON *j = cJSON_Parse(text);
    const cJSON *h = j ? cJSON_GetObjectItem(j, "hidden_size") : NULL, *nh = j ? cJSON_GetObjectItem(j, "num_attention_heads") : NULL;
    if (!cJSON_IsNumber(h) || !cJSON_IsNumber(nh)) {
        fprintf(stderr, "FAIL: %s: no hidden_size / num_attention_heads\n", path);
        ckv_test_failures++;
        cJSON_Delete(j);
        return 0;
    }
    if (!cJSON_GetObjectItem(j, "head_dim")) cJSON_AddNumberToObject(j, "head_dim", h->valuedouble / nh->valuedouble);
    cJSON_ReplaceItemInObject(j, "hidden_size", cJSON_CreateNumber(256));
    cJSON_ReplaceItemInObject(j, "intermediate_size", cJSON_CreateNumber(256));
    cJSON_ReplaceItemInObject(j, "num_hidden_layers", cJSON_CreateNumber(layers));
    char *out = cJSON_Print(j);
    cJSON_Delete(j);
    snprintf(dir, cap, "%s/%s-%dl", tmp, name, layers);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/config.json", dir);
    f = fopen(path, "wb");
    const int ok = f && out && fputs(out, f) >= 0;
    if (f) fclose(f);
    free(out);
    CHECK_MSG(ok, "cannot write %s", path);
    return ok;
}

static int load_config(ckv_model_config *c, const char *configs, const char *name) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/%s", configs, name);
    const ckv_status s = ckv_config_load(c, dir);
    CHECK_OK(s);
    return s == CKV_STATUS_OK;
}

/* The geometry's 1-layer random-weight model (seed, weight matrices in wdt) on the device (*md) and
 * on the CPU backend (*mc): 1 when both loaded. The CPU computes the same wdt values in fp32. */
static int load_pair(const char *configs, const char *name, const char *tmp, ckv_dtype wdt, uint64_t seed,
                     ckv_model **md, ckv_model **mc) {
    char dir[1024];
    *md = *mc = NULL;
    if (!model_dir(dir, sizeof dir, configs, name, 1, tmp)) return 0;
    const ckv_model_opts o = {.weights_dtype = wdt, .random_weights = 1, .random_seed = seed};
    CHECK_OK(ckv_model_load_opts(md, dir, tb, NULL, &o));
    CHECK_OK(ckv_model_load_opts(mc, dir, ref, NULL, &o));
    return *md && *mc;
}

/* ---- rope at far positions --------------------------------------------------------------------- */

static void test_rope_far(const char *configs, const char *name) {
    ckv_model_config c;
    if (!load_config(&c, configs, name)) return;
    const int hd = c.head_dim, heads = c.n_heads, n = 48;
    float inv[512], scale = 1.0f;
    CHECK_OK(ckv_rope_init_freqs(&c.rope, hd, c.max_position_embeddings, inv, &scale));
    int32_t pos[48];
    for (int t = 0; t < n; t++) /* 131,072 .. 2^24 (fp32 holds every integer there), a few at the edge */
        pos[t] = t < 8 ? 131068 + t : t == n - 1 ? (1 << 24) : 131072 + (int32_t)(ckv_test_rng_u32(&rng) % (1u << 24));
    const size_t nx = (size_t)n * heads * hd;
    float *x = rand_floats(nx, -4.0f, 4.0f), *a = ckv_test_calloc(nx * 4), *b = ckv_test_calloc(nx * 4);
    float *xt = cuda_test_upload(tb, x, nx * 4), *xr = cuda_test_upload(ref, x, nx * 4),
          *ft = cuda_test_upload(tb, inv, (size_t)hd / 2 * 4), *fr = cuda_test_upload(ref, inv, (size_t)hd / 2 * 4);
    int32_t *pt = cuda_test_upload(tb, pos, sizeof pos), *pr = cuda_test_upload(ref, pos, sizeof pos);
    tb->ops->rope(tb, xt, pt, n, heads, hd, ft, scale);
    ref->ops->rope(ref, xr, pr, n, heads, hd, fr, scale);
    cuda_test_download(tb, a, xt, nx * 4);
    cuda_test_download(ref, b, xr, nx * 4);
    char what[160];
    snprintf(what, sizeof what, "%s rope %s (%d heads, hd %d, scale %.4g) at positions 131068 .. 2^24", tb->name,
             name, heads, hd, scale);
    ckv_test_allclose(what, a, b, nx, 4e-6 * scale * 4.0, 1e-6);
    tb->ops->release(tb, xt), tb->ops->release(tb, ft), tb->ops->release(tb, pt);
    ref->ops->release(ref, xr), ref->ops->release(ref, fr), ref->ops->release(ref, pr);
    free(x), free(a), free(b);
}

/* ---- decode attention over long, ragged, compacted caches ------------------------------------- */

enum { DEC_SEQ = 8 };

/* One backend's copy of the batch: all K, V and positions of all (sequence, head) segments in three
 * buffers, the segment tables and the pointer list pointing into them. */
typedef struct {
    void *k, *v, *pos, *tables, *list, *q, *qpos, *seq_of, *seq_start;
    float *out;
} dec_side;

static void dec_side_free(ckv_backend *be, dec_side *d) {
    void *bufs[] = {d->k, d->v, d->pos, d->tables, d->list, d->q, d->qpos, d->seq_of, d->seq_start, d->out};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->ops->release(be, bufs[i]);
}

static void test_decode(const char *configs, const char *name) {
    ckv_model_config c;
    if (!load_config(&c, configs, name)) return;
    const int hd = c.head_dim, n_kv = c.n_kv_heads, heads = c.n_heads, cap = 4608;
    if (n_kv > 8) {
        CHECK_MSG(0, "%s: %d KV heads, more than this test lays out (8)", name, n_kv);
        return;
    }
    const size_t segs = (size_t)DEC_SEQ * n_kv, rows = segs * cap;
    /* host content: values in [-1, 1) rounded to bf16, ascending positions with gaps of 0..60 */
    uint16_t *hk = ckv_test_calloc(rows * hd * 2), *hv = ckv_test_calloc(rows * hd * 2);
    int32_t *hp = ckv_test_calloc(rows * 4), len[DEC_SEQ * 8], qpos[DEC_SEQ], seq_of[DEC_SEQ], seq_start[DEC_SEQ + 1];
    for (size_t i = 0; i < rows * hd; i++) hk[i] = ckv_f32_to_bf16(urand(-1.0f, 1.0f)), hv[i] = ckv_f32_to_bf16(urand(-1.0f, 1.0f));
    int max_len = 0;
    for (int s = 0; s < DEC_SEQ; s++) {
        int32_t top = 0;
        for (int g = 0; g < n_kv; g++) {
            const size_t sg = (size_t)s * n_kv + g;
            len[sg] = 4096 + (int)(ckv_test_rng_u32(&rng) % 512);
            max_len = len[sg] > max_len ? len[sg] : max_len;
            int32_t p = (int32_t)(ckv_test_rng_u32(&rng) % 8);
            for (int r = 0; r < cap; r++) {
                hp[sg * cap + r] = p;
                p += 1 + (int32_t)(ckv_test_rng_u32(&rng) % 61);
            }
            top = hp[sg * cap + len[sg] - 1] > top ? hp[sg * cap + len[sg] - 1] : top;
        }
        qpos[s] = top + 1 + (int32_t)(ckv_test_rng_u32(&rng) % 100); /* past every kept key of the sequence */
        seq_of[s] = s, seq_start[s] = s;
    }
    seq_start[DEC_SEQ] = DEC_SEQ;
    const size_t nq = (size_t)DEC_SEQ * heads * hd;
    float *q = rand_floats(nq, -1.0f, 1.0f);
    float *fk = NULL, *fv = NULL; /* the CPU backend's f32 copy of the same bf16 values */
    fk = ckv_test_calloc(rows * hd * 4), fv = ckv_test_calloc(rows * hd * 4);
    for (size_t i = 0; i < rows * hd; i++) fk[i] = ckv_bf16_to_f32(hk[i]), fv[i] = ckv_bf16_to_f32(hv[i]);
    dec_side side[2];
    ckv_backend *bes[2] = {tb, ref};
    ckv_kv_batch kb[2];
    for (int w = 0; w < 2; w++) {
        ckv_backend *be = bes[w];
        dec_side *d = &side[w];
        const ckv_dtype dt = w == 0 ? CKV_DTYPE_BF16 : CKV_DTYPE_F32;
        const size_t es = ckv_dtype_size(dt);
        d->k = cuda_test_upload(be, w == 0 ? (void *)hk : (void *)fk, rows * hd * es);
        d->v = cuda_test_upload(be, w == 0 ? (void *)hv : (void *)fv, rows * hd * es);
        d->pos = cuda_test_upload(be, hp, rows * 4);
        ckv_kv_seg *tab = ckv_test_calloc(segs * sizeof *tab);
        for (size_t sg = 0; sg < segs; sg++)
            tab[sg] = (ckv_kv_seg){(char *)d->k + sg * cap * hd * es, (char *)d->v + sg * cap * hd * es,
                                   (int32_t *)d->pos + sg * cap, len[sg], cap};
        d->tables = cuda_test_upload(be, tab, segs * sizeof *tab);
        ckv_kv_seg *list[DEC_SEQ];
        for (int s = 0; s < DEC_SEQ; s++) list[s] = (ckv_kv_seg *)d->tables + (size_t)s * n_kv;
        d->list = cuda_test_upload(be, list, sizeof list);
        d->q = cuda_test_upload(be, q, nq * 4);
        d->qpos = cuda_test_upload(be, qpos, sizeof qpos);
        d->seq_of = cuda_test_upload(be, seq_of, sizeof seq_of);
        d->seq_start = cuda_test_upload(be, seq_start, sizeof seq_start);
        float *poison = ckv_test_calloc(nq * 4);
        for (size_t i = 0; i < nq; i++) poison[i] = NAN;
        d->out = cuda_test_upload(be, poison, nq * 4);
        free(poison);
        free(tab);
        kb[w] = (ckv_kv_batch){dt, hd, n_kv, DEC_SEQ, (ckv_kv_seg *const *)d->list, d->seq_of, d->seq_start, max_len};
    }
    /* the reference computes on f32 copies of the same bf16 values: only summation order differs */
    const float scale = 1.0f / sqrtf((float)hd);
    for (int w = 0; w < 2; w++) {
        const ckv_attention_params ap = {side[w].q, side[w].qpos, &kb[w], DEC_SEQ, heads, scale};
        bes[w]->ops->attention(bes[w], side[w].out, &ap);
    }
    float *a = ckv_test_calloc(nq * 4), *b = ckv_test_calloc(nq * 4);
    cuda_test_download(tb, a, side[0].out, nq * 4);
    cuda_test_download(ref, b, side[1].out, nq * 4);
    char what[200];
    snprintf(what, sizeof what, "%s decode %s: %d sequences x %d/%d heads, hd %d, %d..%d keys, positions to %d",
             tb->name, name, DEC_SEQ, heads, n_kv, hd, 4096, max_len, qpos[0]);
    ckv_test_allclose(what, a, b, nq, 2e-5, 1e-4);
    for (int w = 0; w < 2; w++) dec_side_free(bes[w], &side[w]);
    free(hk), free(hv), free(hp), free(fk), free(fv), free(q), free(a), free(b);
}

/* ---- sampling over a 152K vocabulary ------------------------------------------------------------ */

static void test_sample_vocab(float temperature, int top_k, float top_p) {
    enum { ROWS = 2, V = 152064 };
    float *x = rand_floats((size_t)ROWS * V, -4.0f, 4.0f);
    for (int i = V; i < ROWS * V; i++) x[i] = roundf(x[i] * 2.0f) * 0.5f; /* row 1: ~17 values, many ties */
    cuda_test_sample_agree(tb, ref, x, ROWS, V, temperature, top_k, top_p, ckv_test_rng_u32(&rng));
    free(x);
}

/* ---- chunked prefill of a 1-layer model ------------------------------------------------------- */

enum { PRE_TOKENS = 2100, PRE_CHUNK = 500, PRE_DECODE = 3 };

/* Prefill + PRE_DECODE fixed decode steps on one backend: logits [1 + PRE_DECODE, V]. */
static ckv_status prefill_run(ckv_model *m, const int32_t *ids, float *logits) {
    const int V = m->cfg.vocab_size;
    ckv_session s;
    CKV_TRY(ckv_session_init(&s, m, PRE_TOKENS + PRE_DECODE, PRE_CHUNK, 0));
    const float *lg = NULL;
    ckv_status st = ckv_session_prefill(&s, ids, PRE_TOKENS, NULL, &lg);
    if (st == CKV_STATUS_OK) memcpy(logits, lg, sizeof(float) * (size_t)V);
    for (int t = 0; t < PRE_DECODE && st == CKV_STATUS_OK; t++) {
        st = ckv_session_decode(&s, ids[t], &lg);
        if (st == CKV_STATUS_OK) memcpy(logits + (size_t)(t + 1) * V, lg, sizeof(float) * (size_t)V);
    }
    ckv_session_free(&s);
    return st;
}

static void test_prefill(const char *configs, const char *name, const char *tmp) {
    ckv_model *md, *mc;
    if (load_pair(configs, name, tmp, CKV_DTYPE_BF16, 11, &md, &mc)) {
        const int V = md->cfg.vocab_size;
        int32_t *ids = ckv_test_calloc(sizeof(int32_t) * PRE_TOKENS);
        for (int t = 0; t < PRE_TOKENS; t++) ids[t] = (int32_t)(ckv_test_rng_u32(&rng) % (uint32_t)V);
        const size_t n = (size_t)(1 + PRE_DECODE) * V;
        float *a = ckv_test_calloc(n * 4), *b = ckv_test_calloc(n * 4);
        CHECK_OK(prefill_run(mc, ids, b));
        CHECK_OK(prefill_run(md, ids, a));
        char what[200];
        snprintf(what, sizeof what, "%s prefill %s (%d/%d heads, hd %d): %d tokens in chunks of %d, then %d decode "
                 "steps: logits vs the cpu backend", tb->name, name, md->cfg.n_heads, md->cfg.n_kv_heads,
                 md->cfg.head_dim, PRE_TOKENS, PRE_CHUNK, PRE_DECODE);
        ckv_test_allclose(what, a, b, n, 0.25, 0.0);
        free(ids), free(a), free(b);
    }
    ckv_model_free(md);
    ckv_model_free(mc);
}

/* ---- every press at 4,096 rows ----------------------------------------------------------------
 * The CPU backend prefills the 4,096-token context once; after the layer's attention a hook runs
 * every press's selection on the full cache (ckv_evict_layer, as `ckv analyze` does, never
 * compacting) and keeps the layer's state: the attention inputs xn [L, D] and every KV head's keys,
 * values and positions. The device gets that state bit for bit (a session of its own whose cache
 * and xn are written from it) and runs the same selections on it. So both backends score the same
 * fp32 numbers and differ only by the summation order of their eviction kernels, and the device
 * never runs the 4,096-token fp32 prefill, which the emulated split-KV kernel took ~7 minutes a
 * backend for on the 32-head geometries (the prefill kernels are checked by test_prefill). */

enum { EV_L = CKV_FIXTURE_MAX_PROMPT, EV_MAX_KV = 8 };

typedef struct {
    int n_kv;
    int32_t (*n_keep)[EV_MAX_KV];              /* [press][head] */
    int32_t *rows;                             /* [press][head][EV_L] kept rows, ascending */
    float *scores;                             /* [press][head][EV_L] the base scores selection ranked */
    float *keys2;                              /* [press][head][EV_L] CriticalKV's stage-2 keys, else 0 */
} ev_record;

typedef struct {
    float *xn;         /* [EV_L, D] */
    float *k, *v;      /* [n_kv, EV_L, head_dim] */
    int32_t *pos;      /* [n_kv, EV_L] */
} ev_state;

/* Every press's selection on `in` into r. */
static ckv_status select_all(const ckv_score_inputs *in, ev_record *r) {
    ckv_selection sel;
    CKV_TRY(ckv_selection_init(&sel, in->be, in->n_kv_local, in->n_kv_heads, in->L));
    ckv_status st = CKV_STATUS_OK;
    for (size_t p = 0; p < ckv_fixture_n_presses && st == CKV_STATUS_OK; p++) {
        ckv_press_config cfg;
        st = ckv_press_parse(&cfg, ckv_fixture_presses[p]);
        if (st == CKV_STATUS_OK) st = ckv_press_set_compression_ratio(&cfg, 0.5);
        if (st == CKV_STATUS_OK) st = ckv_press_finalize(&cfg);
        if (st == CKV_STATUS_OK) st = ckv_evict_layer(&cfg, in, NULL, &sel);
        if (st == CKV_STATUS_OK) st = ckv_selection_rows_host(&sel, r->rows + p * EV_MAX_KV * EV_L);
        const size_t at = p * EV_MAX_KV * EV_L, bytes = sizeof(float) * (size_t)r->n_kv * EV_L;
        if (st == CKV_STATUS_OK) st = in->be->ops->sync(in->be);
        if (st == CKV_STATUS_OK) st = in->be->ops->download(in->be, r->scores + at, sel.scores, bytes);
        if (st == CKV_STATUS_OK && cfg.critical) st = in->be->ops->download(in->be, r->keys2 + at, sel.tmp, bytes);
        for (int h = 0; st == CKV_STATUS_OK && h < r->n_kv; h++) r->n_keep[p][h] = sel.n_keep[h];
        if (st != CKV_STATUS_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", ckv_error_message());
            st = ckv_error(st, "%s on %s: %s", ckv_fixture_presses[p], in->be->name, msg);
        }
    }
    ckv_selection_free(&sel);
    return st;
}

typedef struct {
    ev_record *rec;
    ev_state *state;
} ev_cpu_ctx;

/* The CPU prefill's hook: every selection, then the layer's state for the device. */
static ckv_status cpu_hook(void *ctx, ckv_session *s, int layer, int n_prompt) {
    ev_cpu_ctx *c = ctx;
    ckv_score_inputs in;
    ckv_compress_score_inputs(s, layer, n_prompt, &in);
    CKV_TRY(select_all(&in, c->rec));
    const size_t hd = (size_t)in.head_dim;
    for (int h = 0; h < in.n_kv_local; h++)
        CKV_TRY(ckv_kv_head_read(&s->kv, layer, h, c->state->k + (size_t)h * EV_L * hd,
                                 c->state->v + (size_t)h * EV_L * hd, c->state->pos + (size_t)h * EV_L));
    return in.be->ops->download(in.be, c->state->xn, s->xn, sizeof(float) * (size_t)n_prompt * in.D);
}

/* The device's selections on the CPU's layer state. */
static ckv_status device_select(ckv_model *m, const ev_state *st, ev_record *r) {
    ckv_session s;
    CKV_TRY(ckv_session_init_kv(&s, m, EV_L, 64, 1, CKV_DTYPE_F32));
    const size_t hd = (size_t)m->cfg.head_dim;
    ckv_status rc = ckv_kv_layer_reserve(&s.kv, 0, EV_L); /* a compressing session reserves at prefill */
    for (int h = 0; h < m->plan.n_kv_local && rc == CKV_STATUS_OK; h++)
        rc = ckv_kv_head_write(&s.kv, 0, h, st->k + (size_t)h * EV_L * hd, st->v + (size_t)h * EV_L * hd,
                               st->pos + (size_t)h * EV_L, EV_L);
    if (rc == CKV_STATUS_OK)
        rc = m->be->ops->upload(m->be, s.xn, st->xn, sizeof(float) * (size_t)EV_L * m->cfg.hidden_size);
    ckv_score_inputs in;
    ckv_compress_score_inputs(&s, 0, EV_L, &in);
    if (rc == CKV_STATUS_OK) rc = select_all(&in, r);
    ckv_session_free(&s);
    return rc;
}

/* ---- near-ties: how two kept sets may differ ---------------------------------------------------
 * The backends score the same fp32 inputs and differ only by summation order, so their scores of a
 * row agree to about 1e-6 relative. A row kept by one backend alone is therefore accepted only as a
 * near-tie: its score on the CPU lies within EV_TIE_REL x (the largest |score| of the layer) of the
 * CPU's cut (the gap between the lowest kept and the highest dropped score), the head's own cut for
 * uniform allocation and, for allocations across heads (adakv, defensivekv), the head's or the
 * layer's. For CriticalKV the stage-2 keys (scores x value norms) decide too, so a row near either
 * cut counts. Any other difference fails; near-ties are counted and printed. Exact ties are no
 * near-ties: both backends break them by the rule of docs/spec-eviction.md. */
#define EV_TIE_REL 1e-5

/* The CPU's cut of one head: lowest kept (lo) and highest dropped (hi) of key[] (-inf / +inf none). */
static void cut_of(const float *key, const int32_t *kept, int n, int L, float *lo, float *hi) {
    *lo = INFINITY, *hi = -INFINITY;
    for (int x = 0, t = 0; t < L; t++) {
        const int in = x < n && kept[x] == t;
        x += in;
        if (in && key[t] < *lo) *lo = key[t];
        if (!in && key[t] > *hi) *hi = key[t];
    }
}

/* Is a row whose CPU key is v, kept by one backend only, within tol of the cut [lo, hi]? */
static int near_cut(float v, float lo, float hi, double tol) {
    return (double)v >= (double)fminf(lo, hi) - tol && (double)v <= (double)fmaxf(lo, hi) + tol;
}

typedef struct {
    int heads_diff, near_ties, other; /* heads whose sets differ; rows that are near-ties; rows that are not */
    double max_score_diff;            /* max |device - cpu| over the base scores */
    double tol;
} ev_diff;

/* Compares press p's sets of the device (a) and the cpu (b) under the near-tie rule; prints every row
 * that differs (the first few per head). */
static ev_diff kept_compare(const char *what, const ev_record *a, const ev_record *b, size_t p, int cross_head,
                            int critical) {
    ev_diff d = {0, 0, 0, 0.0, 0.0};
    const int n_kv = b->n_kv;
    float scale = 0.0f, lo_s[EV_MAX_KV], hi_s[EV_MAX_KV], lo_c[EV_MAX_KV], hi_c[EV_MAX_KV];
    float glo_s = INFINITY, ghi_s = -INFINITY, glo_c = INFINITY, ghi_c = -INFINITY;
    for (int h = 0; h < n_kv; h++) {
        const size_t at = (p * EV_MAX_KV + (size_t)h) * EV_L;
        for (int t = 0; t < EV_L; t++) {
            scale = fmaxf(scale, fabsf(b->scores[at + t]));
            const double e = fabs((double)a->scores[at + t] - b->scores[at + t]);
            d.max_score_diff = e > d.max_score_diff ? e : d.max_score_diff;
        }
        cut_of(b->scores + at, b->rows + at, b->n_keep[p][h], EV_L, &lo_s[h], &hi_s[h]);
        cut_of(b->keys2 + at, b->rows + at, b->n_keep[p][h], EV_L, &lo_c[h], &hi_c[h]);
        glo_s = fminf(glo_s, lo_s[h]), ghi_s = fmaxf(ghi_s, hi_s[h]);
        glo_c = fminf(glo_c, lo_c[h]), ghi_c = fmaxf(ghi_c, hi_c[h]);
    }
    d.tol = EV_TIE_REL * scale;
    for (int h = 0; h < n_kv; h++) {
        const size_t at = (p * EV_MAX_KV + (size_t)h) * EV_L;
        const int32_t *ra = a->rows + at, *rb = b->rows + at;
        const int na = a->n_keep[p][h], nb = b->n_keep[p][h];
        int printed = 0, differs = na != nb;
        for (int x = 0, y = 0; x < na || y < nb;) {
            int row, by_device;
            if (x < na && y < nb && ra[x] == rb[y]) {
                x++, y++;
                continue;
            }
            if (y >= nb || (x < na && ra[x] < rb[y])) row = ra[x++], by_device = 1;
            else row = rb[y++], by_device = 0;
            differs = 1;
            const float vs = b->scores[at + row], vc = b->keys2[at + row];
            const int tie = near_cut(vs, lo_s[h], hi_s[h], d.tol) ||
                            (cross_head && near_cut(vs, glo_s, ghi_s, d.tol)) ||
                            (critical && (near_cut(vc, lo_c[h], hi_c[h], EV_TIE_REL * fabsf(lo_c[h])) ||
                                          (cross_head && near_cut(vc, glo_c, ghi_c, EV_TIE_REL * fabsf(glo_c)))));
            d.near_ties += tie, d.other += !tie;
            if (printed++ < 6)
                fprintf(stderr, "  %s KV head %d: row %d kept by the %s only: cpu score %.9g (device %.9g), cpu cut "
                        "[%.9g, %.9g]: %s\n", what, h, row, by_device ? "device" : "cpu", vs, a->scores[at + row],
                        hi_s[h], lo_s[h], tie ? "a near-tie" : "NOT a near-tie");
        }
        d.heads_diff += differs;
    }
    return d;
}

static void test_evict(const char *configs, const char *name, const char *tmp) {
    ckv_model *md, *mc;
    const int loaded = load_pair(configs, name, tmp, CKV_DTYPE_F32, 5, &md, &mc);
    if (loaded && md->cfg.n_kv_heads > EV_MAX_KV) {
        CHECK_MSG(0, "%s: %d KV heads: more than this test records", name, md->cfg.n_kv_heads);
    } else if (loaded) {
        const int n_kv = md->cfg.n_kv_heads, hd = md->cfg.head_dim, D = md->cfg.hidden_size;
        int32_t *ids = ckv_test_calloc(sizeof(int32_t) * EV_L);
        for (int t = 0; t < EV_L; t++) ids[t] = (int32_t)(ckv_test_rng_u32(&rng) % (uint32_t)md->cfg.vocab_size);
        static ev_record a, b; /* a: the device, b: the cpu backend */
        const size_t cells = ckv_fixture_n_presses * EV_MAX_KV * EV_L;
        ev_record *both[2] = {&a, &b};
        for (int w = 0; w < 2; w++) {
            both[w]->n_kv = n_kv;
            both[w]->rows = ckv_test_calloc(sizeof(int32_t) * cells);
            both[w]->scores = ckv_test_calloc(sizeof(float) * cells);
            both[w]->keys2 = ckv_test_calloc(sizeof(float) * cells);
            both[w]->n_keep = ckv_test_calloc(sizeof(int32_t) * EV_MAX_KV * ckv_fixture_n_presses);
        }
        ev_state st = {ckv_test_calloc(sizeof(float) * (size_t)EV_L * D),
                       ckv_test_calloc(sizeof(float) * (size_t)n_kv * EV_L * hd),
                       ckv_test_calloc(sizeof(float) * (size_t)n_kv * EV_L * hd),
                       ckv_test_calloc(sizeof(int32_t) * (size_t)n_kv * EV_L)};
        ev_cpu_ctx ctx = {&b, &st};
        ckv_session s;
        ckv_status rc = ckv_session_init_kv(&s, mc, EV_L, 64, 1, CKV_DTYPE_F32);
        if (rc == CKV_STATUS_OK) rc = ckv_session_prefill_hook(&s, ids, EV_L, NULL, NULL, cpu_hook, &ctx);
        ckv_session_free(&s);
        CHECK_OK(rc);
        if (rc == CKV_STATUS_OK) CHECK_OK(device_select(md, &st, &a));
        for (size_t p = 0; !ckv_test_failures && p < ckv_fixture_n_presses; p++) {
            ckv_press_config cfg;
            CHECK_OK(ckv_press_parse(&cfg, ckv_fixture_presses[p]));
            char what[160];
            snprintf(what, sizeof what, "%s %s %s at L=%d", tb->name, name, ckv_fixture_presses[p], EV_L);
            const ev_diff d = kept_compare(what, &a, &b, p, cfg.alloc != CKV_ALLOC_UNIFORM, cfg.critical);
            long kept = 0;
            for (int h = 0; h < n_kv; h++) kept += b.n_keep[p][h];
            CHECK_MSG(d.other == 0, "%s: %d kept rows differ from the cpu backend's beyond a near-tie (%d near-ties, "
                      "score tolerance %.3g, max score diff %.3g)", what, d.other, d.near_ties, d.tol, d.max_score_diff);
            if (!d.other)
                fprintf(stderr, "ok   %s: %d heads, %ld kept rows; %d heads differ, by %d near-ties (tolerance %.3g); "
                        "max score diff %.3g\n", what, n_kv, kept, d.heads_diff, d.near_ties, d.tol, d.max_score_diff);
        }
        free(ids), free(st.xn), free(st.k), free(st.v), free(st.pos);
        for (int w = 0; w < 2; w++)
            free(both[w]->rows), free(both[w]->scores), free(both[w]->keys2), free(both[w]->n_keep);
    }
    ckv_model_free(md);
    ckv_model_free(mc);
}

/* Seconds of CPU time used by this process so far: the per-case profile a slow run prints. */
static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    const char *mode = argc > 2 ? argv[2] : "quick", *only = argc > 3 ? argv[3] : NULL;
    int pick = -1; /* full GEOMETRY: that geometry's prefill and eviction only */
    for (int g = 0; only && g < N_GEOMETRIES; g++)
        if (!strcmp(only, geometries[g])) pick = g;
    if (argc > 4 || (strcmp(mode, "quick") && strcmp(mode, "full")) || (only && (pick < 0 || strcmp(mode, "full")))) {
        fprintf(stderr, "usage: test_real_shapes [cuda-emu|cuda [quick|full [GEOMETRY]]]; GEOMETRY is one of");
        for (int g = 0; g < N_GEOMETRIES; g++) fprintf(stderr, " %s", geometries[g]);
        fprintf(stderr, "\n");
        return 2;
    }
    const int full = !strcmp(mode, "full");
    const char *configs = CKV_FIXTURES "/../../configs/models", *tmp = CKV_TEST_TMP;
    const int rc = cuda_test_open(argc, argv, "test_real_shapes", &tb);
    if (rc >= 0) return rc;
    CHECK_OK(ckv_backend_cpu_init(&ref, 2));
    double t0 = cpu_seconds();
    for (int g = 0; g < N_GEOMETRIES && ref && pick < 0; g++) {
        test_rope_far(configs, geometries[g]);
        test_decode(configs, geometries[g]);
    }
    if (ref && pick < 0) {
        test_sample_vocab(0.0f, 0, 1.0f);
        test_sample_vocab(1.0f, 0, 0.9f);
        test_sample_vocab(0.7f, 40, 1.0f);
    }
    if (pick < 0) fprintf(stderr, "time rope, decode and sample: %.1f s cpu\n", cpu_seconds() - t0);
    /* the cheapest geometry first; quick stops after its prefill */
    const int order[N_GEOMETRIES] = {SMALL, 0, 1, 2};
    for (int i = 0; i < (full ? N_GEOMETRIES : 1) && ref; i++) {
        const int g = order[i];
        if (pick >= 0 && g != pick) continue;
        t0 = cpu_seconds();
        test_prefill(configs, geometries[g], tmp);
        fprintf(stderr, "time prefill %s: %.1f s cpu\n", geometries[g], cpu_seconds() - t0);
        if (!full) continue;
        t0 = cpu_seconds();
        test_evict(configs, geometries[g], tmp);
        fprintf(stderr, "time evict %s: %.1f s cpu\n", geometries[g], cpu_seconds() - t0);
    }
    CHECK_OK(tb->ops->sync(tb));
    ckv_backend_free(tb);
    ckv_backend_free(ref);
    return ckv_test_finish(full ? "test_real_shapes full" : "test_real_shapes quick");
}
