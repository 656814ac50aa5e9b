/* bpe.c - the models that turn one pre-tokenized piece into ids:
 *  - merges BPE as HF tokenizers runs it: characters (with byte fallback to <0xXX> tokens or a
 *    possibly fused unk), then repeatedly the lowest-ranked merge, leftmost first (a binary heap
 *    over a linked list of symbols); ignore_merges looks the whole piece up first;
 *  - score BPE as SentencePiece / llama.cpp run it for GGUF "llama" vocabularies: repeatedly merge
 *    the adjacent pair whose concatenation is a token with the highest score, then bytes for what
 *    is left unknown.
 * It does not split text into pieces (pretokenize.c) or handle added tokens (encode.c). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

typedef struct {
    int32_t id;
    int32_t prev, next;
    uint32_t off, len; /* bytes of the piece this symbol covers */
} sym;

typedef struct {
    float score;       /* score BPE (higher first) */
    uint32_t rank;     /* merges BPE (lower first) */
    uint32_t pos;      /* left symbol */
    int32_t new_id;    /* merges BPE */
    uint32_t size;     /* score BPE: byte length of the pair when queued */
} cand;

static ckv_status work_reserve(ckv_tk_bpe_work *w, size_t n) {
    if (n > w->sym_cap) {
        size_t cap = n < 64 ? 64 : n * 2;
        sym *s = realloc(w->sym, cap * sizeof *s);
        if (!s) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory for a %zu-symbol word", n);
        w->sym = s;
        w->sym_cap = cap;
    }
    if (n * 2 > w->heap_cap) {
        size_t cap = n < 64 ? 128 : n * 4;
        cand *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory for a %zu-symbol word", n);
        w->heap = h;
        w->heap_cap = cap;
    }
    return CKV_STATUS_OK;
}

void ckv_tk_bpe_work_free(ckv_tk_bpe_work *w) {
    free(w->sym);
    free(w->heap);
    w->sym = w->heap = NULL;
    w->sym_cap = w->heap_cap = 0;
}

/* heap order: "a comes out before b" */
static int before_rank(const cand *a, const cand *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static int before_score(const cand *a, const cand *b) {
    return a->score != b->score ? a->score > b->score : a->pos < b->pos;
}

typedef int (*before_fn)(const cand *, const cand *);

static ckv_status heap_push(ckv_tk_bpe_work *w, size_t *n, cand c, before_fn before) {
    if (*n >= w->heap_cap) {
        size_t cap = w->heap_cap * 2 + 64;
        cand *h = realloc(w->heap, cap * sizeof *h);
        if (!h) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory merging a word");
        w->heap = h;
        w->heap_cap = cap;
    }
    cand *h = w->heap;
    size_t i = (*n)++;
    h[i] = c;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!before(&h[i], &h[p])) break;
        cand tmp = h[i];
        h[i] = h[p];
        h[p] = tmp;
        i = p;
    }
    return CKV_STATUS_OK;
}

static cand heap_pop(ckv_tk_bpe_work *w, size_t *n, before_fn before) {
    cand *h = w->heap;
    cand top = h[0];
    h[0] = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < *n && before(&h[l], &h[m])) m = l;
        if (r < *n && before(&h[r], &h[m])) m = r;
        if (m == i) break;
        cand tmp = h[i];
        h[i] = h[m];
        h[m] = tmp;
        i = m;
    }
    return top;
}

static void add_sym(sym *s, size_t *n, int32_t id, uint32_t off, uint32_t len) {
    size_t i = (*n)++;
    s[i].id = id;
    s[i].off = off;
    s[i].len = len;
    s[i].prev = (int32_t)i - 1;
    s[i].next = (int32_t)i + 1;
}

/* Looks a character up with the BPE affixes HF applies (prefix when not first, suffix when last). */
static int32_t lookup_affixed(const ckv_tokenizer *t, const char *c, size_t clen, int first, int last, char *tmp,
                              size_t tmp_cap) {
    size_t pl = (!first && t->cont_prefix) ? strlen(t->cont_prefix) : 0;
    size_t sl = (last && t->end_suffix) ? strlen(t->end_suffix) : 0;
    if (!pl && !sl) return ckv_tk_vocab_find(t, c, clen);
    if (pl + clen + sl > tmp_cap) return -1;
    memcpy(tmp, t->cont_prefix ? t->cont_prefix : "", pl);
    memcpy(tmp + pl, c, clen);
    memcpy(tmp + pl + clen, t->end_suffix ? t->end_suffix : "", sl);
    return ckv_tk_vocab_find(t, tmp, pl + clen + sl);
}

static ckv_status bpe_merges_word(const ckv_tokenizer *t, const char *s, size_t len, ckv_tk_ids *out,
                                  ckv_tk_bpe_work *w) {
    if (t->ignore_merges) {
        int32_t id = ckv_tk_vocab_find(t, s, len);
        if (id >= 0) return ckv_tk_ids_push(out, id);
    }
    CKV_TRY(work_reserve(w, len + 1));
    sym *sy = w->sym;
    size_t n = 0;
    int32_t unk = -1;
    uint32_t unk_off = 0, unk_len = 0;
    char tmp[256];
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = (size_t)ckv_utf8_decode((const uint8_t *)s + i, &cp);
        if (i + k > len) k = len - i;
        int32_t id = lookup_affixed(t, s + i, k, i == 0, i + k == len, tmp, sizeof tmp);
        if (id >= 0) {
            if (unk >= 0) {
                add_sym(sy, &n, unk, unk_off, unk_len);
                unk = -1;
            }
            add_sym(sy, &n, id, (uint32_t)i, (uint32_t)k);
        } else {
            int done = 0;
            if (t->byte_fallback) {
                int all = 1;
                for (size_t b = 0; b < k; b++) all &= t->byte_tok[(uint8_t)s[i + b]] >= 0;
                if (all) { /* a pending unk stays pending until the next known char, as in HF */
                    for (size_t b = 0; b < k; b++) add_sym(sy, &n, t->byte_tok[(uint8_t)s[i + b]], (uint32_t)(i + b), 1);
                    done = 1;
                }
            }
            if (!done && t->unk_id >= 0) {
                if (unk >= 0 && t->fuse_unk) {
                    unk_len += (uint32_t)k;
                } else {
                    if (unk >= 0) add_sym(sy, &n, unk, unk_off, unk_len);
                    unk = t->unk_id;
                    unk_off = (uint32_t)i;
                    unk_len = (uint32_t)k;
                }
            }
        }
        i += k;
    }
    if (unk >= 0) add_sym(sy, &n, unk, unk_off, unk_len);
    if (n == 0) return CKV_STATUS_OK;
    sy[n - 1].next = -1;

    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) {
        const ckv_tk_merge *m = ckv_tk_merges_get(t, sy[i].id, sy[i + 1].id);
        if (m) {
            cand c = {0};
            c.rank = m->rank;
            c.pos = (uint32_t)i;
            c.new_id = m->new_id;
            CKV_TRY(heap_push(w, &hn, c, before_rank));
            sy = w->sym;
        }
    }
    while (hn > 0) {
        cand top = heap_pop(w, &hn, before_rank);
        sym *cur = &sy[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        sym *right = &sy[cur->next];
        const ckv_tk_merge *m = ckv_tk_merges_get(t, cur->id, right->id);
        if (!m || m->new_id != top.new_id) continue; /* stale entry */
        cur->id = top.new_id;
        cur->len += right->len;
        right->len = 0;
        cur->next = right->next;
        if (right->next >= 0) sy[right->next].prev = (int32_t)top.pos;
        if (cur->prev >= 0) {
            const ckv_tk_merge *pm = ckv_tk_merges_get(t, sy[cur->prev].id, cur->id);
            if (pm) {
                cand c = {0};
                c.rank = pm->rank;
                c.pos = (uint32_t)cur->prev;
                c.new_id = pm->new_id;
                CKV_TRY(heap_push(w, &hn, c, before_rank));
            }
        }
        if (cur->next >= 0) {
            const ckv_tk_merge *nm = ckv_tk_merges_get(t, cur->id, sy[cur->next].id);
            if (nm) {
                cand c = {0};
                c.rank = nm->rank;
                c.pos = top.pos;
                c.new_id = nm->new_id;
                CKV_TRY(heap_push(w, &hn, c, before_rank));
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        if (sy[i].len) CKV_TRY(ckv_tk_ids_push(out, sy[i].id));
    return CKV_STATUS_OK;
}

static ckv_status score_try_pair(const ckv_tokenizer *t, ckv_tk_bpe_work *w, size_t *hn, const char *s, int32_t left,
                                 int32_t right) {
    if (left < 0 || right < 0) return CKV_STATUS_OK;
    const sym *sy = w->sym;
    int32_t id = ckv_tk_vocab_find(t, s + sy[left].off, sy[left].len + sy[right].len);
    if (id < 0) return CKV_STATUS_OK;
    cand c = {0};
    c.score = t->scores ? t->scores[id] : 0.0f;
    c.pos = (uint32_t)left;
    c.size = sy[left].len + sy[right].len;
    return heap_push(w, hn, c, before_score);
}

static ckv_status bpe_scores_word(const ckv_tokenizer *t, const char *s, size_t len, ckv_tk_ids *out,
                                  ckv_tk_bpe_work *w) {
    CKV_TRY(work_reserve(w, len + 1));
    sym *sy = w->sym;
    size_t n = 0;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = (size_t)ckv_utf8_decode((const uint8_t *)s + i, &cp);
        if (i + k > len) k = len - i;
        add_sym(sy, &n, -1, (uint32_t)i, (uint32_t)k);
        i += k;
    }
    if (n == 0) return CKV_STATUS_OK;
    sy[n - 1].next = -1;
    size_t hn = 0;
    for (size_t i = 0; i + 1 < n; i++) CKV_TRY(score_try_pair(t, w, &hn, s, (int32_t)i, (int32_t)i + 1));
    while (hn > 0) {
        cand top = heap_pop(w, &hn, before_score);
        sy = w->sym;
        sym *l = &sy[top.pos];
        if (l->len == 0 || l->next < 0) continue;
        sym *r = &sy[l->next];
        if (l->len + r->len != top.size) continue; /* one side changed since it was queued */
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0) sy[r->next].prev = (int32_t)top.pos;
        CKV_TRY(score_try_pair(t, w, &hn, s, l->prev, (int32_t)top.pos));
        CKV_TRY(score_try_pair(t, w, &hn, s, (int32_t)top.pos, ((sym *)w->sym)[top.pos].next));
        sy = w->sym;
    }
    for (size_t i = 0; i < n; i++) {
        if (!sy[i].len) continue;
        int32_t id = ckv_tk_vocab_find(t, s + sy[i].off, sy[i].len);
        if (id >= 0) {
            CKV_TRY(ckv_tk_ids_push(out, id));
            continue;
        }
        for (uint32_t b = 0; b < sy[i].len; b++) {
            int32_t bid = t->byte_tok[(uint8_t)s[sy[i].off + b]];
            if (bid < 0) bid = t->unk_id;
            if (bid >= 0) CKV_TRY(ckv_tk_ids_push(out, bid));
        }
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_tk_bpe_word(const ckv_tokenizer *t, const char *s, size_t len, ckv_tk_ids *out, ckv_tk_bpe_work *w) {
    if (len == 0) return CKV_STATUS_OK;
    return t->model == CKV_TK_MODEL_SPM_SCORES ? bpe_scores_word(t, s, len, out, w) : bpe_merges_word(t, s, len, out, w);
}
