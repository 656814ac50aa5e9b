/* grammar_vocab.c - the vocabulary side of constrained decoding (see grammar.h): every token's bytes,
 * the byte tries the mask walks (all tokens; the tokens that are not plain string content), and the
 * plain-content tokens ordered by character count. Built once per model. It does not match. */
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "engine/grammar_impl.h"

/* token ids by their bytes (a merge sort: the comparison needs the vocabulary) */
static int cmp_tok(const ckv_grammar_vocab *gv, int32_t a, int32_t b) {
    uint32_t la = gv->off[a + 1] - gv->off[a], lb = gv->off[b + 1] - gv->off[b];
    int c = memcmp(gv->bytes + gv->off[a], gv->bytes + gv->off[b], la < lb ? la : lb);
    return c ? c : la < lb ? -1 : la > lb;
}

static void sort_tok(const ckv_grammar_vocab *gv, int32_t *ids, int32_t *tmp, int n) {
    if (n < 2) return;
    int h = n / 2;
    sort_tok(gv, ids, tmp, h);
    sort_tok(gv, ids + h, tmp, n - h);
    int i = 0, j = h, k = 0;
    while (i < h && j < n) tmp[k++] = cmp_tok(gv, ids[j], ids[i]) < 0 ? ids[j++] : ids[i++];
    while (i < h) tmp[k++] = ids[i++];
    while (j < n) tmp[k++] = ids[j++];
    memcpy(ids, tmp, sizeof(int32_t) * (size_t)n);
}

static void trie_free(ckv_grammar_trie *t) {
    ckv_free(t->byte);
    ckv_free(t->depth);
    ckv_free(t->skip);
    ckv_free(t->token);
    memset(t, 0, sizeof *t);
}

/* The preorder trie of tokens ids[n] (sorted by bytes, each non-empty). */
static ckv_status trie_build(ckv_grammar_trie *t, ckv_grammar_vocab *gv, const int32_t *ids, int n) {
    memset(t, 0, sizeof *t);
    size_t cap = 1, maxlen = 1;
    for (int i = 0; i < n; i++) {
        size_t len = gv->off[ids[i] + 1] - gv->off[ids[i]];
        cap += len;
        if (len > maxlen) maxlen = len;
    }
    uint32_t *open = malloc(sizeof(uint32_t) * (maxlen + 1));
    ckv_status st = open ? CKV_STATUS_OK : ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the grammar trie");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&t->byte, cap, "grammar trie bytes");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&t->depth, sizeof *t->depth * cap, "grammar trie depths");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&t->skip, sizeof *t->skip * cap, "grammar trie skips");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&t->token, sizeof *t->token * cap, "grammar trie tokens");
    if (st != CKV_STATUS_OK || maxlen > 0xFFFF) {
        free(open);
        trie_free(t);
        return st != CKV_STATUS_OK ? st : ckv_error(CKV_STATUS_ERR_FORMAT, "a token of %zu bytes is too long for the grammar", maxlen);
    }
    uint32_t nn = 0;
    size_t depth = 0, prev_len = 0;
    const uint8_t *prev = NULL;
    for (int i = 0; i < n; i++) {
        const uint8_t *s = gv->bytes + gv->off[ids[i]];
        size_t len = gv->off[ids[i] + 1] - gv->off[ids[i]], l = 0;
        while (prev && l < len && l < prev_len && s[l] == prev[l]) l++;
        if (prev && l == len && l == prev_len) { /* the same bytes as the previous token */
            gv->same[ids[i]] = t->token[open[len]];
            t->token[open[len]] = ids[i];
            continue;
        }
        for (; depth > l; depth--) t->skip[open[depth]] = nn;
        for (size_t d = l + 1; d <= len; d++) {
            t->byte[nn] = s[d - 1];
            t->depth[nn] = (uint16_t)d;
            t->token[nn] = -1;
            open[d] = nn++;
        }
        depth = len;
        t->token[open[len]] = ids[i];
        prev = s;
        prev_len = len;
    }
    for (; depth > 0; depth--) t->skip[open[depth]] = nn;
    t->n = nn;
    t->max_depth = (int)maxlen;
    free(open);
    return CKV_STATUS_OK;
}

ckv_status ckv_grammar_vocab_init(ckv_grammar_vocab *gv, const ckv_tokenizer *tok, int vocab) {
    memset(gv, 0, sizeof *gv);
    gv->vocab = vocab;
    size_t cap = ckv_tokenizer_max_piece_bytes(tok) + 16;
    char *piece = malloc(cap);
    int32_t *ids = malloc(sizeof(int32_t) * ((size_t)vocab + 1)), *tmp = malloc(sizeof(int32_t) * ((size_t)vocab + 1));
    uint32_t *chars = malloc(sizeof(uint32_t) * ((size_t)vocab + 1));
    ckv_status st = piece && ids && tmp && chars ? CKV_STATUS_OK : ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the grammar vocabulary");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&gv->off, sizeof(uint32_t) * ((size_t)vocab + 1), "grammar token offsets");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&gv->same, sizeof(int32_t) * ((size_t)vocab + 1), "grammar same-bytes chain");
    size_t total = 0;
    for (int t = 0; st == CKV_STATUS_OK && t < vocab; t++) { /* sizes first */
        int n = ckv_tokenizer_is_special(tok, t) ? 0 : ckv_tokenizer_token_to_piece(tok, t, piece, cap);
        total += n > 0 ? (size_t)n : 0;
    }
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&gv->bytes, total > 0 ? total : 1, "grammar token bytes");
    size_t at = 0;
    int n_plain = 0;
    for (int t = 0; st == CKV_STATUS_OK && t < vocab; t++) {
        int n = ckv_tokenizer_is_special(tok, t) ? 0 : ckv_tokenizer_token_to_piece(tok, t, piece, cap);
        if (n < 0) n = 0;
        gv->off[t] = (uint32_t)at;
        gv->same[t] = -1;
        memcpy(gv->bytes + at, piece, (size_t)n);
        at += (size_t)n;
        /* plain: accepted inside a string between characters, ending between characters */
        uint32_t aux = 0;
        for (int i = 0; i < n && aux != CKV_STR_REFUSED; i++)
            aux = piece[i] == '\\' ? CKV_STR_REFUSED : ckv_grammar_str_step(aux, (uint8_t)piece[i], CKV_GRAMMAR_UNBOUNDED);
        chars[t] = n > 0 && aux != CKV_STR_REFUSED && CKV_STR_SUB(aux) == 0 ? CKV_STR_COUNT(aux) : 0;
        n_plain += chars[t] > 0;
    }
    if (st == CKV_STATUS_OK) {
        gv->off[vocab] = (uint32_t)at;
        st = ckv_alloc((void **)&gv->plain, sizeof(int32_t) * (size_t)(n_plain + 1), "grammar plain tokens");
    }
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&gv->plain_chars, sizeof(uint32_t) * (size_t)(n_plain + 1), "grammar plain lengths");
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&gv->plain_mask, (size_t)vocab + 1, "grammar plain mask");
    for (int t = 0; st == CKV_STATUS_OK && t < vocab; t++) gv->plain_mask[t] = chars[t] > 0;
    if (st == CKV_STATUS_OK) { /* plain tokens by character count (counting sort, stable) */
        uint32_t maxc = 0;
        for (int t = 0; t < vocab; t++)
            if (chars[t] > maxc) maxc = chars[t];
        uint32_t *cnt = calloc((size_t)maxc + 2, sizeof(uint32_t));
        if (!cnt) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for the grammar vocabulary");
        for (int t = 0; cnt && t < vocab; t++)
            if (chars[t]) cnt[chars[t] + 1]++;
        for (uint32_t c = 0; cnt && c <= maxc; c++) cnt[c + 1] += cnt[c];
        for (int t = 0; cnt && t < vocab; t++)
            if (chars[t]) {
                gv->plain[cnt[chars[t]]] = t;
                gv->plain_chars[cnt[chars[t]]++] = chars[t];
            }
        gv->n_plain = n_plain;
        free(cnt);
    }
    if (st == CKV_STATUS_OK) { /* the tries */
        int n = 0;
        for (int t = 0; t < vocab; t++)
            if (gv->off[t + 1] > gv->off[t]) ids[n++] = t;
        sort_tok(gv, ids, tmp, n);
        st = trie_build(&gv->all, gv, ids, n);
        int k = 0;
        for (int i = 0; i < n; i++)
            if (!chars[ids[i]]) ids[k++] = ids[i];
        /* the same-bytes chains are rebuilt by the second trie: only the first trie's are kept */
        for (int i = 0; st == CKV_STATUS_OK && i < k; i++) tmp[i] = gv->same[ids[i]];
        if (st == CKV_STATUS_OK) st = trie_build(&gv->nonplain, gv, ids, k);
        for (int i = 0; st == CKV_STATUS_OK && i < k; i++) gv->same[ids[i]] = tmp[i];
        /* (the nonplain trie's node tokens are the chain heads the first trie chose, as the order is the same) */
    }
    free(piece);
    free(ids);
    free(tmp);
    free(chars);
    if (st != CKV_STATUS_OK) ckv_grammar_vocab_free(gv);
    return st;
}

void ckv_grammar_vocab_free(ckv_grammar_vocab *gv) {
    if (!gv) return;
    ckv_free(gv->off);
    ckv_free(gv->bytes);
    ckv_free(gv->same);
    ckv_free(gv->plain);
    ckv_free(gv->plain_chars);
    ckv_free(gv->plain_mask);
    trie_free(&gv->all);
    trie_free(&gv->nonplain);
    memset(gv, 0, sizeof *gv);
}
