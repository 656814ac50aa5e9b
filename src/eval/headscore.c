/* headscore.c - HeadKV's retrieval-reasoning head scores over needle probes (see headscore.h). */
#include "eval/headscore.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

static const char *const probe_keys[] = {"harbor", "lantern", "orchid", "falcon", "meadow", "glacier", "compass", "ember"};

static uint64_t probe_rand(uint64_t *s) { /* splitmix64 */
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Appends the tokens of text to ids (capacity grown as needed). */
static ckv_status append_text(const ckv_tokenizer *tok, const char *text, unsigned flags, int32_t **ids, int *n, int *cap) {
    int32_t *t = NULL;
    size_t k = 0;
    CKV_TRY(ckv_tokenizer_encode(tok, text, strlen(text), flags, &t, &k));
    if (*n + (int)k > *cap) {
        int nc = (*n + (int)k) * 2 + 16;
        int32_t *g = realloc(*ids, sizeof *g * (size_t)nc);
        if (!g) {
            free(t);
            return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for a probe");
        }
        *ids = g, *cap = nc;
    }
    if (k) memcpy(*ids + *n, t, sizeof *t * k);
    *n += (int)k;
    free(t);
    return CKV_STATUS_OK;
}

ckv_status ckv_headscore_make_probe(const ckv_tokenizer *tok, const ckv_haystack *hay, int length, uint64_t seed,
                                    int index, ckv_headscore_probe *out) {
    memset(out, 0, sizeof *out);
    if (length < 64) return ckv_error(CKV_STATUS_ERR_ARG, "--length %d: probes need at least 64 tokens", length);
    uint64_t s = seed * 0x100000001B3ull + (uint64_t)index + 1;
    const char *key = probe_keys[probe_rand(&s) % (sizeof probe_keys / sizeof probe_keys[0])];
    unsigned value = 1000000u + (unsigned)(probe_rand(&s) % 9000000u);
    double depth = (double)(probe_rand(&s) % 1001) / 1000.0;
    size_t start = hay->n_words > 1 ? (size_t)(probe_rand(&s) % hay->n_words) : 0;
    char needle_a[96], needle_v[32], question[256];
    snprintf(needle_a, sizeof needle_a, " One of the special magic numbers for %s is:", key);
    snprintf(needle_v, sizeof needle_v, " %u", value);
    snprintf(question, sizeof question, "\nWhat is the special magic number for %s mentioned in the text above? "
             "The special magic number for %s mentioned in the text is:", key, key);
    /* haystack words before and after the needle, sized in tokens by one pass over the words */
    int32_t *ids = NULL;
    int n = 0, cap = 0;
    ckv_status st = CKV_STATUS_OK;
    int32_t bos = ckv_tokenizer_bos_id(tok);
    if (bos >= 0) {
        ids = malloc(sizeof *ids * 16);
        if (!ids) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for a probe");
        cap = 16, ids[n++] = bos;
    }
    int32_t *tmp = NULL;
    int n_tmp = 0, cap_tmp = 0;
    CKV_TRY_GOTO(st, append_text(tok, needle_a, 0, &tmp, &n_tmp, &cap_tmp), done);
    CKV_TRY_GOTO(st, append_text(tok, needle_v, 0, &tmp, &n_tmp, &cap_tmp), done);
    CKV_TRY_GOTO(st, append_text(tok, ".", 0, &tmp, &n_tmp, &cap_tmp), done);
    CKV_TRY_GOTO(st, append_text(tok, question, 0, &tmp, &n_tmp, &cap_tmp), done);
    int budget = length - n - n_tmp - 8; /* haystack tokens (8: the answer and rounding) */
    if (budget < 16) {
        st = ckv_error(CKV_STATUS_ERR_ARG, "--length %d leaves no room for a haystack around the needle", length);
        goto done;
    }
    char word[256];
    int before = (int)(budget * depth), used = 0;
    size_t w = start;
    for (int part = 0; part < 2 && st == CKV_STATUS_OK; part++) {
        int goal = part == 0 ? before : budget - before;
        for (used = 0; used < goal && st == CKV_STATUS_OK; w++) { /* one word at a time, with its leading space */
            const size_t i = w % hay->n_words, a = hay->word[i];
            size_t b = i + 1 < hay->n_words ? hay->word[i + 1] - 1 : hay->len;
            if (b - a > sizeof word - 2) b = a + sizeof word - 2;
            word[0] = ' ';
            memcpy(word + 1, hay->text + a, b - a);
            word[1 + b - a] = 0;
            int n0 = n;
            st = append_text(tok, word, 0, &ids, &n, &cap);
            used += n - n0;
        }
        if (part == 0 && st == CKV_STATUS_OK) { /* the needle sentence, its value inside */
            out->needle_lo = n;
            CKV_TRY_GOTO(st, append_text(tok, needle_a, 0, &ids, &n, &cap), done);
            out->answer_lo = n;
            CKV_TRY_GOTO(st, append_text(tok, needle_v, 0, &ids, &n, &cap), done);
            out->n_answer = n - out->answer_lo;
            CKV_TRY_GOTO(st, append_text(tok, ".", 0, &ids, &n, &cap), done);
            out->needle_hi = n;
        }
    }
    CKV_TRY_GOTO(st, append_text(tok, question, 0, &ids, &n, &cap), done);
    out->n = n;
    CKV_TRY_GOTO(st, append_text(tok, needle_v, 0, &ids, &n, &cap), done); /* the answer: the value's ids */
    if (out->n_answer < 1 || n - out->n != out->n_answer ||
        memcmp(ids + out->n, ids + out->answer_lo, sizeof *ids * (size_t)out->n_answer)) {
        st = ckv_error(CKV_STATUS_ERR_INTERNAL, "probe %d: the answer's tokens differ from the needle's", index);
        goto done;
    }
    out->ids = ids;
    ids = NULL;
done:
    free(ids);
    free(tmp);
    if (st != CKV_STATUS_OK) memset(out, 0, sizeof *out);
    return st;
}

void ckv_headscore_probe_free(ckv_headscore_probe *p) {
    if (!p) return;
    free(p->ids);
    memset(p, 0, sizeof *p);
}

typedef struct {
    const ckv_headscore_probe *p;
    int topk;        // rows searched per head (the needle's length when given 0)
    int answered;    // every answer token is the greedy argmax (read at the last layer)
    double *scores;  // [n_layers, n_heads] this probe's scores
    float *dq;       // [A, n_heads * d] device: the answer queries
    int32_t *dpos;   // [A] device
    float *q;        // [A, n_heads * d] host
    float *k;        // [n_kv, N, d] host keys
    float *v;        // [N, d] host values (read with the keys; unused)
    int32_t *pos;    // [N]
    double *w;       // [N] attention weights of one (query, head)
    struct ranked { double w; int row; } *order; // [N] rows by weight
} probe_ctx;

static int by_weight(const void *a, const void *b) { /* descending weight, then ascending row */
    const struct ranked *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return x->row - y->row;
}

/* Whether the greedy token of every answer row is the answer's: the logits of those rows from the
 * hidden states after the last layer (the prefill computes the last row's only). */
static ckv_status probe_answered(probe_ctx *c, ckv_session *s) {
    ckv_model *m = s->model;
    const int A = c->p->n_answer, q0 = c->p->n - 1, V = m->cfg.vocab_size, rows = s->scratch.n_logits;
    const size_t D = (size_t)m->cfg.hidden_size;
    c->answered = 1;
    for (int t0 = 0; t0 < A && c->answered; t0 += rows) {
        const int cn = A - t0 < rows ? A - t0 : rows;
        const float *lg = NULL;
        CKV_TRY(ckv_model_logits(m, &s->scratch, s->x + (size_t)(q0 + t0) * D, cn, &lg));
        CKV_TRY(m->be->ops->sync(m->be));
        for (int t = 0; t < cn && c->answered; t++) {
            const float *row = lg + (size_t)t * V;
            int best = 0;
            for (int v = 1; v < V; v++)
                if (row[v] > row[best]) best = v;
            c->answered = best == c->p->ids[c->p->n + t0 + t];
        }
    }
    return CKV_STATUS_OK;
}

/* The layer hook: the answer rows' queries against every key of the layer; after the last layer,
 * whether the model answers the probe. */
static ckv_status probe_layer(void *ctx, ckv_session *s, int layer, int N) {
    probe_ctx *c = ctx;
    ckv_model *m = s->model;
    ckv_backend *be = m->be;
    const ckv_model_config *mc = &m->cfg;
    const int d = mc->head_dim, D = mc->hidden_size, H = mc->n_heads, group = H / mc->n_kv_heads;
    const int A = c->p->n_answer, q0 = c->p->n - 1; /* row q0 + t produces answer token t */
    const int lo = c->p->needle_lo, hi = c->p->needle_hi, span = hi - lo;
    const ckv_layer_weights *w = &m->layers[layer];
    be->ops->matmul(be, c->dq, s->xn + (size_t)q0 * D, &w->wq, w->bq, A);
    be->ops->rope(be, c->dq, c->dpos, A, H, d, m->inv_freq, m->rope_scale);
    CKV_TRY(be->ops->sync(be));
    CKV_TRY(be->ops->download(be, c->q, c->dq, sizeof(float) * (size_t)A * H * d));
    for (int g = 0; g < mc->n_kv_heads; g++) CKV_TRY(ckv_kv_head_read(&s->kv, layer, g, c->k + (size_t)g * N * d, c->v, c->pos));
    const double scale = 1.0 / sqrt((double)d);
    for (int t = 0; t < A; t++) {
        const int row = q0 + t, n_rows = row + 1; /* causal: rows 0 .. row */
        for (int h = 0; h < H; h++) {
            const float *q = c->q + ((size_t)t * H + h) * d, *K = c->k + (size_t)(h / group) * N * d;
            double mx = -INFINITY, z = 0;
            for (int i = 0; i < n_rows; i++) {
                double dot = 0;
                for (int e = 0; e < d; e++) dot += (double)q[e] * (double)K[(size_t)i * d + e];
                c->w[i] = dot * scale;
                if (c->w[i] > mx) mx = c->w[i];
            }
            for (int i = 0; i < n_rows; i++) z += (c->w[i] = exp(c->w[i] - mx));
            for (int i = 0; i < n_rows; i++) c->w[i] /= z, c->order[i].w = c->w[i], c->order[i].row = i;
            const int want = c->topk > 0 ? c->topk : span, k = want < n_rows ? want : n_rows;
            qsort(c->order, (size_t)n_rows, sizeof *c->order, by_weight);
            double add = 0;
            for (int r = 0; r < k; r++) {
                int i = c->order[r].row;
                if (i >= lo && i < hi) add += c->w[i];
            }
            c->scores[(size_t)layer * H + h] += 10.0 * add / ((double)span * A);
        }
    }
    return layer == mc->n_layers - 1 ? probe_answered(c, s) : CKV_STATUS_OK;
}

ckv_status ckv_headscore_probe_run(ckv_engine *e, const ckv_headscore_probe *p, int topk, int count_all, double *scores,
                                   int *answered) {
    ckv_model *m = e->model;
    const ckv_model_config *mc = &m->cfg;
    if (m->tp && m->tp->size > 1) return ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "head scoring runs on one rank (no --tp)");
    if (topk < 0) return ckv_error(CKV_STATUS_ERR_ARG, "--topk %d must be >= 1", topk);
    const int A = p->n_answer, N = p->n + A - 1, d = mc->head_dim, H = mc->n_heads;
    ckv_backend *be = m->be;
    probe_ctx c = {.p = p, .topk = topk};
    *answered = 0;
    ckv_status st = ckv_alloc((void **)&c.scores, sizeof(double) * (size_t)mc->n_layers * H, "probe scores");
    if (st == CKV_STATUS_OK) memset(c.scores, 0, sizeof(double) * (size_t)mc->n_layers * H);
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&c.dq, sizeof(float) * (size_t)A * H * d, "probe queries");
    if (st == CKV_STATUS_OK) st = be->ops->alloc(be, (void **)&c.dpos, sizeof(int32_t) * (size_t)A, "probe positions");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&c.q, sizeof(float) * (size_t)A * H * d, "probe queries (host)");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&c.k, sizeof(float) * (size_t)mc->n_kv_heads * N * d, "probe keys");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&c.v, sizeof(float) * (size_t)N * d, "probe values");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&c.pos, sizeof(int32_t) * (size_t)N, "probe positions (host)");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&c.w, sizeof(double) * (size_t)N, "probe weights");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&c.order, sizeof *c.order * (size_t)N, "probe order");
    if (st == CKV_STATUS_OK) {
        int32_t *pos = malloc(sizeof *pos * (size_t)A);
        if (!pos) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
        for (int t = 0; pos && t < A; t++) pos[t] = p->n - 1 + t;
        if (st == CKV_STATUS_OK) st = be->ops->upload(be, c.dpos, pos, sizeof *pos * (size_t)A);
        free(pos);
    }
    ckv_prepared pc;
    memset(&pc, 0, sizeof pc);
    ckv_prepare_params pp = {.ids = p->ids, .n = N, .reserve = 0, .hook = probe_layer, .hook_ctx = &c};
    if (st == CKV_STATUS_OK) st = ckv_engine_prepare(e, &pp, &pc);
    ckv_prepared_free(&pc);
    if (st == CKV_STATUS_OK) {
        *answered = c.answered;
        if (c.answered || count_all)
            for (size_t i = 0; i < (size_t)mc->n_layers * H; i++) scores[i] += c.scores[i];
    }
    ckv_free(c.scores);
    be->ops->release(be, c.dq);
    be->ops->release(be, c.dpos);
    ckv_free(c.q);
    ckv_free(c.k);
    ckv_free(c.v);
    ckv_free(c.pos);
    ckv_free(c.w);
    ckv_free(c.order);
    return st;
}
