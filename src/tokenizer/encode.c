/* encode.c - text -> ids, in HF tokenizers' order: UTF-8 check (or lossy repair), added tokens
 * that are not normalized matched on the raw text (leftmost-longest, with single_word / lstrip /
 * rstrip), the normalizer on each remaining split, normalized added tokens matched on the normalized
 * text, the pre-tokenizer, the model (bpe.c) on each piece, then the post-processor's ids; optionally
 * stopping once more ids than a caller's limit came out (a request over its limit costs no more than
 * the limit). It does not parse files or decode. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

typedef struct {
    ckv_tk_buf norm, pre_text, sa, sb;
    ckv_tk_spans pieces, s1, s2, split1, split2;
    ckv_tk_bpe_work work;
} enc_ctx;

static void ctx_free(enc_ctx *c) {
    ckv_tk_buf_free(&c->norm);
    ckv_tk_buf_free(&c->pre_text);
    ckv_tk_buf_free(&c->sa);
    ckv_tk_buf_free(&c->sb);
    free(c->pieces.p);
    free(c->s1.p);
    free(c->s2.p);
    free(c->split1.p);
    free(c->split2.p);
    ckv_tk_bpe_work_free(&c->work);
}

static int prev_char_is(const char *s, size_t end, int (*pred)(uint32_t)) {
    if (end == 0) return 0;
    size_t k = end - 1;
    while (k > 0 && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
    uint32_t cp;
    ckv_utf8_decode((const uint8_t *)s + k, &cp);
    return pred(cp);
}

static int next_char_is(const char *s, size_t pos, size_t len, int (*pred)(uint32_t)) {
    if (pos >= len) return 0;
    uint32_t cp;
    ckv_utf8_decode((const uint8_t *)s + pos, &cp);
    return pred(cp);
}

/* HF AddedVocabulary::find_matches over s[0..len) for the tokens with normalized == want_norm.
 * Pushes gaps (token -1) and tokens onto out, offsets relative to s plus base. */
/* Whether [a, b) overlaps one of the sorted plain ranges (*cur: the first that may still matter). */
static int in_plain(const ckv_text_range *plain, size_t n_plain, size_t *cur, size_t a, size_t b) {
    while (*cur < n_plain && plain[*cur].off + plain[*cur].len <= a) (*cur)++;
    return *cur < n_plain && plain[*cur].off < b;
}

static ckv_status find_added(const ckv_tokenizer *t, const char *s, size_t len, int want_norm, int split_special,
                             const ckv_text_range *plain, size_t n_plain, size_t base, int first, ckv_tk_spans *out) {
    size_t cur = 0;
    if (len == 0) return CKV_STATUS_OK;
    size_t start_offset = 0;
    size_t i = 0;
    while (i < len) {
        const int32_t *list = t->added_by_byte[(uint8_t)s[i]];
        int best = -1;
        size_t plen = 0;
        if (list) {
            for (const int32_t *q = list; *q >= 0; q++) {
                const ckv_tk_added *a = &t->added[*q];
                if (a->normalized != (uint8_t)want_norm) continue;
                uint32_t off = want_norm ? a->norm_off : a->off, l = want_norm ? a->norm_len : a->len;
                if (l <= len - i && memcmp(s + i, t->pool.p + off, l) == 0) {
                    best = *q;
                    plen = l;
                    break; /* lists are longest first */
                }
            }
        }
        if (best < 0) {
            i++;
            continue;
        }
        const ckv_tk_added *a = &t->added[best];
        size_t start = i, stop = i + plen;
        i = stop; /* the match is consumed even when it is discarded below */
        if (split_special && a->special) continue;
        if (a->special && in_plain(plain, n_plain, &cur, base + start, base + stop)) {
            i = start + 1; /* plain text: a marker of the template may still start inside this match */
            continue;
        }
        if (a->single_word) {
            int start_space = start == 0 || !prev_char_is(s, start, ckv_unicode_is_word);
            int stop_space = stop == len || !next_char_is(s, stop, len, ckv_unicode_is_word);
            if (!start_space || !stop_space) continue;
        }
        if (a->lstrip) {
            size_t ns = start;
            while (ns > 0 && prev_char_is(s, ns, ckv_unicode_is_whitespace)) {
                ns--;
                while (ns > 0 && ((uint8_t)s[ns] & 0xC0) == 0x80) ns--;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (next_char_is(s, stop, len, ckv_unicode_is_whitespace)) {
                uint32_t cp;
                stop += (size_t)ckv_utf8_decode((const uint8_t *)s + stop, &cp);
            }
        }
        if (start_offset < start) CKV_TRY(ckv_tk_spans_push(out, base + start_offset, start - start_offset, -1,
                                                            first && start_offset == 0));
        CKV_TRY(ckv_tk_spans_push(out, base + start, stop - start, a->id, first && start == 0));
        start_offset = stop;
    }
    if (start_offset < len)
        CKV_TRY(ckv_tk_spans_push(out, base + start_offset, len - start_offset, -1, first && start_offset == 0));
    return CKV_STATUS_OK;
}

/* normalize -> normalized added tokens -> pre-tokenize -> model, for one raw split */
static ckv_status encode_split_all(const ckv_tokenizer *t, const char *s, size_t len, int first, int split_special,
                                   size_t max_ids, enc_ctx *c, ckv_tk_ids *out) {
    c->norm.n = 0;
    CKV_TRY(ckv_tk_normalize(t, s, len, &c->norm));
    c->split2.n = 0;
    int have_norm_tokens = 0;
    for (int i = 0; i < t->n_added && !have_norm_tokens; i++) have_norm_tokens = t->added[i].normalized;
    if (have_norm_tokens) {
        CKV_TRY(find_added(t, c->norm.p, c->norm.n, 1, split_special, NULL, 0, 0, first, &c->split2));
    } else if (c->norm.n) {
        CKV_TRY(ckv_tk_spans_push(&c->split2, 0, c->norm.n, -1, first));
    }
    for (size_t k = 0; k < c->split2.n; k++) {
        const ckv_tk_span *sp = &c->split2.p[k];
        if (sp->token >= 0) {
            CKV_TRY(ckv_tk_ids_push(out, sp->token));
            continue;
        }
        c->pre_text.n = 0;
        c->pieces.n = 0;
        CKV_TRY(ckv_tk_pretokenize(t, c->norm.p + sp->off, sp->len, sp->first, &c->pre_text, &c->pieces, &c->sa,
                                   &c->sb, &c->s1, &c->s2));
        for (size_t p = 0; p < c->pieces.n && out->n <= max_ids; p++)
            CKV_TRY(ckv_tk_bpe_word(t, c->pre_text.p + c->pieces.p[p].off, c->pieces.p[p].len, out, &c->work));
    }
    return CKV_STATUS_OK;
}

#define PROBE_BYTES ((size_t)64 << 10)

static int is_space(char ch) { return ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r'; }

/* The first offset at or after `at` where a single space sits between two other characters: a piece
 * boundary for every pre-tokenizer ckv knows (the space opens the next word's piece); len if none. */
static size_t word_boundary(const char *s, size_t len, size_t at) {
    for (size_t i = at > 0 ? at : 1; i + 1 < len; i++)
        if (s[i] == ' ' && !is_space(s[i - 1]) && !is_space(s[i + 1])) return i;
    return len;
}

/* One raw split, with a limit: a long split is first encoded in pieces of about PROBE_BYTES cut at
 * word boundaries, and once those alone give more than max_ids ids the rest is not encoded (the
 * caller refuses the text anyway); a split that stays within the limit is then encoded whole, so
 * its ids are exactly what encoding it at once gives. */
static ckv_status encode_split(const ckv_tokenizer *t, const char *s, size_t len, int first, int split_special,
                               size_t max_ids, enc_ctx *c, ckv_tk_ids *out) {
    if (max_ids >= SIZE_MAX - 1 || len <= PROBE_BYTES) return encode_split_all(t, s, len, first, split_special, max_ids, c, out);
    ckv_tk_ids probe = {0};
    size_t count = out->n;
    ckv_status st = CKV_STATUS_OK;
    for (size_t off = 0; off < len && st == CKV_STATUS_OK;) {
        size_t end = word_boundary(s, len, off + PROBE_BYTES);
        probe.n = 0;
        st = encode_split_all(t, s + off, end - off, first && off == 0, split_special, max_ids, c, &probe);
        count += probe.n;
        if (st == CKV_STATUS_OK && count > max_ids) { /* over the limit: the caller sees max_ids + 1 ids */
            for (size_t i = 0; i < probe.n && out->n <= max_ids && st == CKV_STATUS_OK; i++) st = ckv_tk_ids_push(out, probe.p[i]);
            free(probe.p);
            return st;
        }
        off = end;
    }
    free(probe.p);
    CKV_TRY(st);
    return encode_split_all(t, s, len, first, split_special, max_ids, c, out);
}

ckv_status ckv_tokenizer_encode(const ckv_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                                size_t *n_ids) {
    return ckv_tokenizer_encode_max(t, text, len, flags, SIZE_MAX - 1, ids, n_ids);
}

ckv_status ckv_tokenizer_encode_max(const ckv_tokenizer *t, const char *text, size_t len, unsigned flags, size_t max_ids,
                                    int32_t **ids, size_t *n_ids) {
    return ckv_tokenizer_encode_ranges(t, text, len, flags, max_ids, NULL, 0, ids, n_ids);
}

ckv_status ckv_tokenizer_encode_ranges(const ckv_tokenizer *t, const char *text, size_t len, unsigned flags, size_t max_ids,
                                       const ckv_text_range *plain, size_t n_plain, int32_t **ids, size_t *n_ids) {
    *ids = NULL;
    *n_ids = 0;
    if (!t || (!text && len)) return ckv_error(CKV_STATUS_ERR_ARG, "tokenizer encode: NULL tokenizer or text");
    ckv_tk_buf fixed = {0};
    size_t bad = ckv_utf8_first_invalid((const uint8_t *)text, len);
    if (bad < len) {
        if (!(flags & CKV_TOKENIZE_UTF8_REPLACE) || n_plain) /* a repair would move the ranges */
            return ckv_error(CKV_STATUS_ERR_FORMAT, "input text is not valid UTF-8: byte 0x%02x at offset %zu",
                             (uint8_t)text[bad], bad);
        CKV_TRY(ckv_utf8_append_lossy(&fixed, (const uint8_t *)text, len));
        text = fixed.p;
        len = fixed.n;
    }
    int split_special = (flags & CKV_TOKENIZE_SPLIT_SPECIAL) != 0;
    enc_ctx c;
    memset(&c, 0, sizeof c);
    ckv_tk_ids out = {0};
    ckv_status st = CKV_STATUS_OK;
    if (flags & CKV_TOKENIZE_ADD_SPECIAL)
        for (int i = 0; i < t->n_post_pre && st == CKV_STATUS_OK; i++) st = ckv_tk_ids_push(&out, t->post_pre[i]);
    if (st == CKV_STATUS_OK) st = find_added(t, text ? text : "", len, 0, split_special, plain, n_plain, 0, 1, &c.split1);
    size_t cur = 0;
    for (size_t k = 0; k < c.split1.n && st == CKV_STATUS_OK && out.n <= max_ids; k++) {
        const ckv_tk_span *sp = &c.split1.p[k];
        /* normalized special tokens are not recognised in a split that holds plain text */
        int split_k = split_special || in_plain(plain, n_plain, &cur, sp->off, sp->off + sp->len);
        if (sp->token >= 0)
            st = ckv_tk_ids_push(&out, sp->token);
        else
            st = encode_split(t, text + sp->off, sp->len, sp->first, split_k, max_ids, &c, &out);
    }
    if (out.n > max_ids) out.n = max_ids + 1; /* more than the caller takes: the rest was not encoded */
    if (flags & CKV_TOKENIZE_ADD_SPECIAL)
        for (int i = 0; i < t->n_post_post && st == CKV_STATUS_OK; i++) st = ckv_tk_ids_push(&out, t->post_post[i]);
    ctx_free(&c);
    ckv_tk_buf_free(&fixed);
    if (st != CKV_STATUS_OK) {
        free(out.p);
        return st;
    }
    *ids = out.p;
    *n_ids = out.n;
    return CKV_STATUS_OK;
}
