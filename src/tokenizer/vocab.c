/* vocab.c - the tokenizer's tables: id <-> string (one pool, an open-addressing string map), the
 * merge table (pair -> rank, new id), added tokens with their first-byte index, special-token
 * look-ups, and freeing. It parses no file (load_json.c, load_gguf.c fill these tables). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* ---- buffers ---------------------------------------------------------------------------------- */

ckv_status ckv_tk_buf_reserve(ckv_tk_buf *b, size_t extra) {
    if (b->n + extra + 1 <= b->cap) return CKV_STATUS_OK;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + extra + 1) {
        if (cap > ((size_t)1 << 40)) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: buffer too large");
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", cap);
    b->p = p;
    b->cap = cap;
    return CKV_STATUS_OK;
}

ckv_status ckv_tk_buf_append(ckv_tk_buf *b, const void *data, size_t len) {
    CKV_TRY(ckv_tk_buf_reserve(b, len));
    if (len) memcpy(b->p + b->n, data, len);
    b->n += len;
    b->p[b->n] = '\0';
    return CKV_STATUS_OK;
}

void ckv_tk_buf_free(ckv_tk_buf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

ckv_status ckv_tk_ids_push(ckv_tk_ids *v, int32_t id) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        int32_t *p = realloc(v->p, cap * sizeof *p);
        if (!p) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory for %zu ids", cap);
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n++] = id;
    return CKV_STATUS_OK;
}

ckv_status ckv_tk_spans_push(ckv_tk_spans *v, size_t off, size_t len, int32_t token, int first) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        ckv_tk_span *p = realloc(v->p, cap * sizeof *p);
        if (!p) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory for %zu pieces", cap);
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n].off = off;
    v->p[v->n].len = len;
    v->p[v->n].token = token;
    v->p[v->n].first = first;
    v->n++;
    return CKV_STATUS_OK;
}

/* ---- string map ------------------------------------------------------------------------------- */

uint64_t ckv_tk_hash(const char *s, size_t len) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < len; i++) {
        h ^= (uint8_t)s[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

static int tok_equals(const ckv_tokenizer *t, int32_t id, const char *s, size_t len) {
    return t->tok_len[id] == len && t->tok_off[id] != UINT32_MAX && memcmp(t->pool.p + t->tok_off[id], s, len) == 0;
}

int32_t ckv_tk_vocab_find(const ckv_tokenizer *t, const char *s, size_t len) {
    const ckv_tk_strmap *m = &t->vocab_map;
    if (!m->cap) return -1;
    uint32_t mask = m->cap - 1;
    for (uint32_t i = (uint32_t)ckv_tk_hash(s, len) & mask;; i = (i + 1) & mask) {
        uint32_t v = m->slots[i];
        if (!v) return -1;
        if (tok_equals(t, (int32_t)(v - 1), s, len)) return (int32_t)(v - 1);
    }
}

/* ---- vocabulary ------------------------------------------------------------------------------- */

ckv_status ckv_tk_alloc(ckv_tokenizer **out) {
    ckv_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory");
    t->unk_id = -1;
    t->bos_id = t->eos_id = t->pad_id = t->eot_id = -1;
    for (int i = 0; i < 256; i++) t->byte_tok[i] = -1;
    *out = t;
    return CKV_STATUS_OK;
}

ckv_status ckv_tk_resize(ckv_tokenizer *t, int32_t n_vocab) {
    if (n_vocab <= t->n_vocab) return CKV_STATUS_OK;
    size_t n = (size_t)n_vocab;
    uint32_t *off = realloc(t->tok_off, n * sizeof *off);
    if (off) t->tok_off = off;
    uint32_t *len = realloc(t->tok_len, n * sizeof *len);
    if (len) t->tok_len = len;
    int32_t *ad = realloc(t->added_of, n * sizeof *ad);
    if (ad) t->added_of = ad;
    if (!off || !len || !ad) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory for %d ids", n_vocab);
    for (int32_t i = t->n_vocab; i < n_vocab; i++) {
        t->tok_off[i] = UINT32_MAX;
        t->tok_len[i] = 0;
        t->added_of[i] = -1;
    }
    t->n_vocab = n_vocab;
    return CKV_STATUS_OK;
}

ckv_status ckv_tk_set_token(ckv_tokenizer *t, int32_t id, const char *s, size_t len) {
    size_t bad = ckv_utf8_first_invalid((const uint8_t *)s, len);
    if (bad < len)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "tokenizer: token %d is not valid UTF-8 (byte 0x%02x at offset %zu)",
                         (int)id, (uint8_t)s[bad], bad);
    if (t->pool.n + len >= UINT32_MAX) return ckv_error(CKV_STATUS_ERR_RANGE, "tokenizer: vocabulary strings exceed 4 GiB");
    t->tok_off[id] = (uint32_t)t->pool.n;
    t->tok_len[id] = (uint32_t)len;
    CKV_TRY(ckv_tk_buf_append(&t->pool, s, len));
    return ckv_tk_buf_append(&t->pool, "", 1); /* NUL-separated: token_text() returns C strings */
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

ckv_status ckv_tk_index_vocab(ckv_tokenizer *t, const char *what) {
    uint32_t count = 0;
    for (int32_t i = 0; i < t->n_vocab; i++)
        if (t->tok_off[i] != UINT32_MAX) count++;
    uint32_t cap = 16;
    while (cap < count * 2 + 16) cap *= 2;
    free(t->vocab_map.slots);
    t->vocab_map.slots = calloc(cap, sizeof *t->vocab_map.slots);
    if (!t->vocab_map.slots) return ckv_error(CKV_STATUS_ERR_NOMEM, "%s: out of memory indexing the vocabulary", what);
    t->vocab_map.cap = cap;
    t->vocab_map.count = count;
    uint32_t mask = cap - 1;
    for (int32_t id = 0; id < t->n_vocab; id++) {
        if (t->tok_off[id] == UINT32_MAX) continue;
        const char *s = t->pool.p + t->tok_off[id];
        size_t len = t->tok_len[id];
        for (uint32_t i = (uint32_t)ckv_tk_hash(s, len) & mask;; i = (i + 1) & mask) {
            uint32_t v = t->vocab_map.slots[i];
            if (!v) {
                t->vocab_map.slots[i] = (uint32_t)id + 1;
                break;
            }
            if (tok_equals(t, (int32_t)(v - 1), s, len)) {
                /* duplicate string: the later id wins, as a JSON map read into a hash map would */
                t->vocab_map.slots[i] = (uint32_t)id + 1;
                break;
            }
        }
        if (len == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>') {
            int hi = hexval(s[3]), lo = hexval(s[4]);
            /* HF formats fallback bytes as <0x%02X> (upper case) */
            if (hi >= 0 && lo >= 0 && !(s[3] >= 'a' && s[3] <= 'f') && !(s[4] >= 'a' && s[4] <= 'f'))
                t->byte_tok[hi * 16 + lo] = id;
        }
        if (len > t->max_piece_bytes) t->max_piece_bytes = len;
    }
    return CKV_STATUS_OK;
}

/* ---- merges ----------------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

ckv_status ckv_tk_merges_init(ckv_tokenizer *t, size_t n) {
    uint32_t cap = 16;
    while (cap < n * 2 + 16) {
        if (cap >= (1u << 30)) return ckv_error(CKV_STATUS_ERR_RANGE, "tokenizer: too many merges (%zu)", n);
        cap *= 2;
    }
    free(t->merges);
    t->merges = malloc((size_t)cap * sizeof *t->merges);
    if (!t->merges) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory for %zu merges", n);
    for (uint32_t i = 0; i < cap; i++) t->merges[i].key = UINT64_MAX;
    t->merges_cap = cap;
    return CKV_STATUS_OK;
}

void ckv_tk_merges_put(ckv_tokenizer *t, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t mask = t->merges_cap - 1;
    for (uint32_t i = (uint32_t)mix64(key) & mask;; i = (i + 1) & mask) {
        if (t->merges[i].key == UINT64_MAX || t->merges[i].key == key) {
            t->merges[i].key = key;
            t->merges[i].rank = rank;
            t->merges[i].new_id = new_id;
            return;
        }
    }
}

const ckv_tk_merge *ckv_tk_merges_get(const ckv_tokenizer *t, int32_t a, int32_t b) {
    if (!t->merges_cap) return NULL;
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t mask = t->merges_cap - 1;
    for (uint32_t i = (uint32_t)mix64(key) & mask;; i = (i + 1) & mask) {
        if (t->merges[i].key == key) return &t->merges[i];
        if (t->merges[i].key == UINT64_MAX) return NULL;
    }
}

/* ---- added tokens ----------------------------------------------------------------------------- */

ckv_status ckv_tk_add_token(ckv_tokenizer *t, int32_t id, const char *s, size_t len, int special, int normalized,
                            int lstrip, int rstrip, int single_word) {
    if (len == 0) return CKV_STATUS_OK; /* HF ignores empty added tokens */
    if (id < 0) return ckv_error(CKV_STATUS_ERR_FORMAT, "tokenizer: added token has a negative id");
    size_t bad = ckv_utf8_first_invalid((const uint8_t *)s, len);
    if (bad < len)
        return ckv_error(CKV_STATUS_ERR_FORMAT, "tokenizer: added token %d is not valid UTF-8 (byte 0x%02x at offset %zu)",
                         (int)id, (uint8_t)s[bad], bad);
    CKV_TRY(ckv_tk_resize(t, id + 1));
    if (t->pool.n + len >= UINT32_MAX) return ckv_error(CKV_STATUS_ERR_RANGE, "tokenizer: strings exceed 4 GiB");
    int idx = t->added_of[id];
    if (idx < 0) {
        ckv_tk_added *a = realloc(t->added, (size_t)(t->n_added + 1) * sizeof *a);
        if (!a) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory for added tokens");
        t->added = a;
        idx = t->n_added++;
        t->added_of[id] = idx;
    }
    ckv_tk_added *a = &t->added[idx];
    a->id = id;
    a->off = (uint32_t)t->pool.n;
    a->len = (uint32_t)len;
    a->norm_off = a->off;
    a->norm_len = a->len;
    a->special = (uint8_t)!!special;
    a->normalized = (uint8_t)!!normalized;
    a->lstrip = (uint8_t)!!lstrip;
    a->rstrip = (uint8_t)!!rstrip;
    a->single_word = (uint8_t)!!single_word;
    if (len > t->max_piece_bytes) t->max_piece_bytes = len;
    CKV_TRY(ckv_tk_buf_append(&t->pool, s, len));
    return ckv_tk_buf_append(&t->pool, "", 1);
}

typedef struct {
    uint32_t len;
    int32_t id, idx;
} added_key;

static int cmp_added_len_desc(const void *x, const void *y) {
    const added_key *a = x, *b = y;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id < b->id ? -1 : a->id > b->id;
}

ckv_status ckv_tk_index_added(ckv_tokenizer *t) {
    /* normalized forms of normalized tokens (the pattern matched in normalized text, and their
     * decode text) */
    for (int i = 0; i < t->n_added; i++) {
        ckv_tk_added *a = &t->added[i];
        if (!a->normalized || !t->n_norms) continue;
        ckv_tk_buf nb = {0};
        ckv_tk_buf copy = {0};
        ckv_status s = ckv_tk_buf_append(&copy, t->pool.p + a->off, a->len);
        if (s == CKV_STATUS_OK) s = ckv_tk_normalize(t, copy.p, copy.n, &nb);
        if (s == CKV_STATUS_OK && nb.n && t->pool.n + nb.n < UINT32_MAX) {
            a->norm_off = (uint32_t)t->pool.n;
            a->norm_len = (uint32_t)nb.n;
            s = ckv_tk_buf_append(&t->pool, nb.p, nb.n);
            if (s == CKV_STATUS_OK) s = ckv_tk_buf_append(&t->pool, "", 1);
        }
        ckv_tk_buf_free(&nb);
        ckv_tk_buf_free(&copy);
        CKV_TRY(s);
    }
    for (int b = 0; b < 256; b++) {
        free(t->added_by_byte[b]);
        t->added_by_byte[b] = NULL;
    }
    int counts[256] = {0};
    for (int i = 0; i < t->n_added; i++) {
        const ckv_tk_added *a = &t->added[i];
        uint8_t c = (uint8_t)t->pool.p[a->normalized ? a->norm_off : a->off];
        counts[c]++;
    }
    for (int b = 0; b < 256; b++) {
        if (!counts[b]) continue;
        t->added_by_byte[b] = malloc((size_t)(counts[b] + 1) * sizeof(int32_t));
        if (!t->added_by_byte[b]) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory");
        counts[b] = 0;
    }
    for (int i = 0; i < t->n_added; i++) {
        const ckv_tk_added *a = &t->added[i];
        uint8_t c = (uint8_t)t->pool.p[a->normalized ? a->norm_off : a->off];
        t->added_by_byte[c][counts[c]++] = i;
    }
    for (int b = 0; b < 256; b++) {
        if (!t->added_by_byte[b]) continue;
        added_key *keys = malloc((size_t)counts[b] * sizeof *keys);
        if (!keys) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory");
        for (int k = 0; k < counts[b]; k++) {
            const ckv_tk_added *a = &t->added[t->added_by_byte[b][k]];
            keys[k].len = a->normalized ? a->norm_len : a->len;
            keys[k].id = a->id;
            keys[k].idx = t->added_by_byte[b][k];
        }
        qsort(keys, (size_t)counts[b], sizeof *keys, cmp_added_len_desc);
        for (int k = 0; k < counts[b]; k++) t->added_by_byte[b][k] = keys[k].idx;
        t->added_by_byte[b][counts[b]] = -1;
        free(keys);
    }
    return CKV_STATUS_OK;
}

const char *ckv_tk_text(const ckv_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_vocab) return NULL;
    if (t->added_of[id] >= 0) {
        const ckv_tk_added *a = &t->added[t->added_of[id]];
        *len = a->norm_len;
        return t->pool.p + a->norm_off;
    }
    if (t->tok_off[id] == UINT32_MAX) return NULL;
    *len = t->tok_len[id];
    return t->pool.p + t->tok_off[id];
}

/* ---- public look-ups -------------------------------------------------------------------------- */

int32_t ckv_tokenizer_vocab_size(const ckv_tokenizer *tok) { return tok->n_vocab; }

size_t ckv_tokenizer_max_piece_bytes(const ckv_tokenizer *tok) { return tok->max_piece_bytes; }

const char *ckv_tokenizer_token_text(const ckv_tokenizer *tok, int32_t id) {
    size_t len;
    const char *s = ckv_tk_text(tok, id, &len);
    (void)len;
    return s; /* pool strings are NUL-separated */
}

int32_t ckv_tokenizer_token_id(const ckv_tokenizer *tok, const char *text) {
    size_t len = strlen(text);
    for (int i = 0; i < tok->n_added; i++) {
        const ckv_tk_added *a = &tok->added[i];
        if (a->len == len && memcmp(tok->pool.p + a->off, text, len) == 0) return a->id;
    }
    return ckv_tk_vocab_find(tok, text, len);
}

int ckv_tokenizer_is_special(const ckv_tokenizer *tok, int32_t id) {
    if (id < 0 || id >= tok->n_vocab || tok->added_of[id] < 0) return 0;
    return tok->added[tok->added_of[id]].special;
}

int32_t ckv_tokenizer_bos_id(const ckv_tokenizer *tok) { return tok->bos_id; }
int32_t ckv_tokenizer_eos_id(const ckv_tokenizer *tok) { return tok->eos_id; }

int ckv_tokenizer_stop_ids(const ckv_tokenizer *tok, int32_t *ids, int cap) {
    static const char *const names[] = {"<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|endoftext|>", "</s>",
                                        "<|end_of_text|>"};
    int n = 0;
    int32_t cand[8];
    int nc = 0;
    cand[nc++] = tok->eos_id;
    cand[nc++] = tok->eot_id;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        int32_t id = ckv_tokenizer_token_id(tok, names[i]);
        if (id >= 0 && ckv_tokenizer_is_special(tok, id) && nc < 8) cand[nc++] = id;
    }
    for (int i = 0; i < nc; i++) {
        if (cand[i] < 0) continue;
        int dup = 0;
        for (int j = 0; j < n; j++) dup |= ids[j] == cand[i];
        if (!dup && n < cap) ids[n++] = cand[i];
    }
    return n;
}

void ckv_tk_norm_free(ckv_tk_norm *n) {
    free(n->a);
    free(n->b);
    if (n->re) pcre2_code_free(n->re);
}

void ckv_tk_pre_free(ckv_tk_pre *p) {
    free(p->lit);
    if (p->re) pcre2_code_free(p->re);
}

void ckv_tokenizer_free(ckv_tokenizer *t) {
    if (!t) return;
    free(t->tok_off);
    free(t->tok_len);
    free(t->added_of);
    ckv_tk_buf_free(&t->pool);
    free(t->vocab_map.slots);
    free(t->merges);
    free(t->scores);
    free(t->cont_prefix);
    free(t->end_suffix);
    free(t->added);
    for (int b = 0; b < 256; b++) free(t->added_by_byte[b]);
    for (int i = 0; i < t->n_norms; i++) ckv_tk_norm_free(&t->norms[i]);
    free(t->norms);
    for (int i = 0; i < t->n_pres; i++) ckv_tk_pre_free(&t->pres[i]);
    free(t->pres);
    free(t->post_pre);
    free(t->post_post);
    free(t);
}
