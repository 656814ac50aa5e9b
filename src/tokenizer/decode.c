/* decode.c - ids -> text for the decoder chains of tokenizer.json that ckv supports (ByteLevel;
 * SentencePiece style Replace / ByteFallback / Fuse / Strip; Metaspace; none), as one streaming
 * state machine: whole-sequence decode is the stream fed every id, so both always agree. Held
 * back: an incomplete UTF-8 tail (byte-level), a run of <0xXX> tokens (byte fallback: HF turns an
 * invalid run into one U+FFFD per byte, so the whole run must be seen). Also token_to_piece. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

static const char k_fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

typedef struct {
    char *p;
    size_t n, cap;
} sink;

static ckv_status put(sink *o, const void *s, size_t len) {
    if (o->n + len + 1 > o->cap)
        return ckv_error(CKV_STATUS_ERR_RANGE, "tokenizer decode: output buffer of %zu bytes is too small", o->cap);
    memcpy(o->p + o->n, s, len);
    o->n += len;
    o->p[o->n] = '\0';
    return CKV_STATUS_OK;
}

/* Lossy UTF-8 of s into the sink (one U+FFFD per maximal invalid subpart). */
static ckv_status put_lossy(sink *o, const uint8_t *s, size_t len) {
    size_t i = 0, run = 0;
    while (i < len) {
        int valid;
        size_t k = ckv_utf8_next(s + i, len - i, &valid);
        if (!valid) {
            CKV_TRY(put(o, s + run, i - run));
            CKV_TRY(put(o, k_fffd, 3));
            run = i + k;
        }
        i += k;
    }
    return put(o, s + run, len - run);
}

/* Strip of leading `strip_char`s (SPM decoders) applied to text on its way out. */
static ckv_status emit(ckv_detok_stream *st, sink *o, const char *s, size_t len) {
    const ckv_tk_decoder *d = &st->tok->dec;
    if (d->mode == CKV_TK_DEC_SPM && d->strip_start > 0 && !st->strip_done) {
        size_t i = 0;
        while (i < len && st->strip_left > 0) {
            uint32_t cp;
            int k = ckv_utf8_decode((const uint8_t *)s + i, &cp);
            if (cp != d->strip_char) {
                st->strip_done = 1;
                break;
            }
            st->strip_left--;
            i += (size_t)k;
        }
        if (st->strip_left == 0) st->strip_done = 1;
        s += i;
        len -= i;
        if (len) st->strip_done = 1;
    }
    return put(o, s, len);
}

static int parse_byte_token(const char *s, size_t len) {
    if (len != 6 || s[0] != '<' || s[1] != '0' || s[2] != 'x' || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int h;
        if (c >= '0' && c <= '9') h = c - '0';
        else if (c >= 'a' && c <= 'f') h = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') h = c - 'A' + 10;
        else if (c == '+' && i == 3) h = 0; /* Rust's from_str_radix accepts a leading '+' */
        else return -1;
        v = v * 16 + h;
    }
    return v;
}

/* Flushes a held byte-fallback run: its bytes when valid UTF-8, else one U+FFFD per byte. */
static ckv_status flush_run(ckv_detok_stream *st, sink *o) {
    if (!st->pending_is_run || st->pending_len == 0) {
        st->pending_is_run = 0;
        return CKV_STATUS_OK;
    }
    ckv_status s = CKV_STATUS_OK;
    size_t n = st->pending_len;
    st->pending_len = 0;
    st->pending_is_run = 0;
    if (ckv_utf8_first_invalid(st->pending, n) == n) {
        s = emit(st, o, (const char *)st->pending, n);
    } else {
        for (size_t i = 0; i < n && s == CKV_STATUS_OK; i++) s = emit(st, o, k_fffd, 3);
    }
    return s;
}

static int match_at(const char *s, size_t len, size_t i, const char *pat, int plen) {
    return plen > 0 && i + (size_t)plen <= len && memcmp(s + i, pat, (size_t)plen) == 0;
}

/* Applies the SPM Replace step to one token and emits it, or adds it to the byte run. */
static ckv_status push_spm(ckv_detok_stream *st, sink *o, const char *s, size_t len) {
    const ckv_tk_decoder *d = &st->tok->dec;
    int rep = d->replace && d->rep_from_len > 0;
    /* the replaced text, when it is short enough to be "<0xHH>", decides the byte test (HF runs
     * Replace before ByteFallback) */
    size_t rl = len;
    if (rep)
        for (size_t i = 0; i < len;) {
            if (match_at(s, len, i, d->rep_from, d->rep_from_len)) {
                rl = rl - (size_t)d->rep_from_len + (size_t)d->rep_to_len;
                i += (size_t)d->rep_from_len;
            } else {
                i++;
            }
        }
    if (d->byte_fallback) {
        int b = -1;
        if (rl == 6) {
            char small[8];
            size_t n = 0;
            for (size_t i = 0; i < len && n <= 6;) {
                if (rep && match_at(s, len, i, d->rep_from, d->rep_from_len)) {
                    for (int k = 0; k < d->rep_to_len && n < 8; k++) small[n++] = d->rep_to[k];
                    i += (size_t)d->rep_from_len;
                } else {
                    small[n++] = s[i++];
                }
            }
            if (n == 6) b = parse_byte_token(small, 6);
        }
        if (b >= 0) {
            if (!st->pending_is_run) {
                st->pending_is_run = 1;
                st->pending_len = 0;
            }
            if (st->pending_len == sizeof st->pending) { /* over-long run: decided early */
                CKV_TRY(flush_run(st, o));
                st->pending_is_run = 1;
            }
            st->pending[st->pending_len++] = (uint8_t)b;
            return CKV_STATUS_OK;
        }
        CKV_TRY(flush_run(st, o));
    }
    if (!rep) return emit(st, o, s, len);
    size_t run = 0;
    for (size_t i = 0; i < len;) {
        if (match_at(s, len, i, d->rep_from, d->rep_from_len)) {
            CKV_TRY(emit(st, o, s + run, i - run));
            CKV_TRY(emit(st, o, d->rep_to, (size_t)d->rep_to_len));
            i += (size_t)d->rep_from_len;
            run = i;
        } else {
            i++;
        }
    }
    return emit(st, o, s + run, len - run);
}

static ckv_status push_bytelevel(ckv_detok_stream *st, sink *o, const char *s, size_t len) {
    const int16_t *c2b;
    ckv_tk_bytelevel_tables(NULL, &c2b);
    /* all chars in the table -> their bytes, else the token's own UTF-8 bytes (HF) */
    int all = 1;
    for (size_t i = 0; i < len && all;) {
        uint32_t cp;
        int k = ckv_utf8_decode((const uint8_t *)s + i, &cp);
        all = cp < 324 && c2b[cp] >= 0;
        i += (size_t)k;
    }
    for (size_t i = 0; i < len;) {
        uint8_t byte;
        if (all) {
            uint32_t cp;
            i += (size_t)ckv_utf8_decode((const uint8_t *)s + i, &cp);
            byte = (uint8_t)c2b[cp];
        } else {
            byte = (uint8_t)s[i++];
        }
        if (st->pending_len == sizeof st->pending) {
            CKV_TRY(put_lossy(o, st->pending, st->pending_len));
            st->pending_len = 0;
        }
        st->pending[st->pending_len++] = byte;
        /* emit everything but an incomplete tail */
        size_t tail = ckv_utf8_incomplete_tail(st->pending, st->pending_len);
        if (tail == 0 || st->pending_len > 8) {
            size_t keep = tail;
            CKV_TRY(put_lossy(o, st->pending, st->pending_len - keep));
            memmove(st->pending, st->pending + st->pending_len - keep, keep);
            st->pending_len = keep;
        }
    }
    return CKV_STATUS_OK;
}

void ckv_detok_stream_init(ckv_detok_stream *s, const ckv_tokenizer *tok, unsigned flags) {
    memset(s, 0, sizeof *s);
    s->tok = tok;
    s->flags = flags;
    s->strip_left = tok ? tok->dec.strip_start : 0;
}

ckv_status ckv_detok_stream_push(ckv_detok_stream *st, int32_t id, char *out, size_t cap, size_t *n_out) {
    sink o = {out, 0, cap};
    if (n_out) *n_out = 0;
    if (cap) out[0] = '\0';
    const ckv_tokenizer *t = st->tok;
    size_t len = 0;
    const char *s = t ? ckv_tk_text(t, id, &len) : NULL;
    if (!s) return ckv_error(CKV_STATUS_ERR_RANGE, "tokenizer decode: token id %d is not in the vocabulary (size %d)",
                             (int)id, t ? (int)t->n_vocab : 0);
    if ((st->flags & CKV_DETOKENIZE_SKIP_SPECIAL) && t->added_of[id] >= 0 && t->added[t->added_of[id]].special)
        return CKV_STATUS_OK;
    ckv_status r = CKV_STATUS_OK;
    switch (t->dec.mode) {
    case CKV_TK_DEC_BYTELEVEL: r = push_bytelevel(st, &o, s, len); break;
    case CKV_TK_DEC_SPM: r = push_spm(st, &o, s, len); break;
    case CKV_TK_DEC_METASPACE: {
        const ckv_tk_decoder *d = &t->dec;
        int drop = st->n_tokens == 0 && d->prepend_scheme != CKV_TK_PREPEND_NEVER;
        size_t i = 0, run = 0;
        while (i < len && r == CKV_STATUS_OK) {
            if (d->repl_len > 0 && i + (size_t)d->repl_len <= len && memcmp(s + i, d->repl, (size_t)d->repl_len) == 0) {
                r = put(&o, s + run, i - run);
                if (r == CKV_STATUS_OK && !drop) r = put(&o, " ", 1);
                i += (size_t)d->repl_len;
                run = i;
            } else {
                i++;
            }
        }
        if (r == CKV_STATUS_OK) r = put(&o, s + run, len - run);
        break;
    }
    case CKV_TK_DEC_NONE:
        if (st->n_tokens > 0) r = put(&o, " ", 1);
        if (r == CKV_STATUS_OK) r = put(&o, s, len);
        break;
    }
    st->n_tokens++;
    if (n_out) *n_out = o.n;
    return r;
}

ckv_status ckv_detok_stream_flush(ckv_detok_stream *st, char *out, size_t cap, size_t *n_out) {
    sink o = {out, 0, cap};
    if (n_out) *n_out = 0;
    if (cap) out[0] = '\0';
    ckv_status r = CKV_STATUS_OK;
    if (st->pending_is_run) {
        r = flush_run(st, &o);
    } else if (st->pending_len) {
        r = put_lossy(&o, st->pending, st->pending_len);
        st->pending_len = 0;
    }
    if (n_out) *n_out = o.n;
    return r;
}

size_t ckv_detok_stream_cap(const ckv_tokenizer *t) {
    /* a token's text (at most 3x longer after replacements or U+FFFD) plus a flushed byte run */
    return t->max_piece_bytes * 3 + 3 * 256 + 64;
}

ckv_status ckv_tokenizer_decode(const ckv_tokenizer *t, const int32_t *ids, size_t n, unsigned flags, char **text,
                                size_t *len) {
    *text = NULL;
    if (len) *len = 0;
    ckv_detok_stream st;
    ckv_detok_stream_init(&st, t, flags);
    size_t cap = ckv_detok_stream_cap(t);
    char *piece = malloc(cap);
    ckv_tk_buf out = {0};
    ckv_status r = piece ? ckv_tk_buf_reserve(&out, 16) : ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer decode: out of memory");
    for (size_t i = 0; i < n && r == CKV_STATUS_OK; i++) {
        size_t k;
        r = ckv_detok_stream_push(&st, ids[i], piece, cap, &k);
        if (r == CKV_STATUS_OK) r = ckv_tk_buf_append(&out, piece, k);
    }
    if (r == CKV_STATUS_OK) {
        size_t k;
        r = ckv_detok_stream_flush(&st, piece, cap, &k);
        if (r == CKV_STATUS_OK) r = ckv_tk_buf_append(&out, piece, k);
    }
    free(piece);
    if (r != CKV_STATUS_OK) {
        ckv_tk_buf_free(&out);
        return r;
    }
    *text = out.p;
    if (len) *len = out.n;
    return CKV_STATUS_OK;
}

int ckv_tokenizer_token_to_piece(const ckv_tokenizer *t, int32_t id, char *buf, size_t cap) {
    size_t len = 0;
    const char *s = ckv_tk_text(t, id, &len);
    if (!s) return -1;
    size_t n = 0;
    const ckv_tk_decoder *d = &t->dec;
    if (d->mode == CKV_TK_DEC_BYTELEVEL) {
        const int16_t *c2b;
        ckv_tk_bytelevel_tables(NULL, &c2b);
        int all = 1;
        for (size_t i = 0; i < len && all;) {
            uint32_t cp;
            int k = ckv_utf8_decode((const uint8_t *)s + i, &cp);
            all = cp < 324 && c2b[cp] >= 0;
            i += (size_t)k;
        }
        for (size_t i = 0; i < len;) {
            uint8_t byte;
            if (all) {
                uint32_t cp;
                i += (size_t)ckv_utf8_decode((const uint8_t *)s + i, &cp);
                byte = (uint8_t)c2b[cp];
            } else {
                byte = (uint8_t)s[i++];
            }
            if (n < cap) buf[n] = (char)byte;
            n++;
        }
        return (int)n;
    }
    if (d->mode == CKV_TK_DEC_SPM && d->byte_fallback) {
        int b = parse_byte_token(s, len);
        if (b >= 0) {
            if (cap) buf[0] = (char)b;
            return 1;
        }
    }
    const char *from = d->mode == CKV_TK_DEC_SPM && d->replace ? d->rep_from : d->repl;
    size_t from_len = (size_t)(d->mode == CKV_TK_DEC_SPM && d->replace ? d->rep_from_len
                                                                         : d->mode == CKV_TK_DEC_METASPACE ? d->repl_len : 0);
    const char *to = d->mode == CKV_TK_DEC_SPM ? d->rep_to : " ";
    size_t to_len = d->mode == CKV_TK_DEC_SPM ? (size_t)d->rep_to_len : 1;
    for (size_t i = 0; i < len;) {
        if (from_len && i + from_len <= len && memcmp(s + i, from, from_len) == 0) {
            for (size_t k = 0; k < to_len; k++, n++)
                if (n < cap) buf[n] = to[k];
            i += from_len;
        } else {
            if (n < cap) buf[n] = s[i];
            n++;
            i++;
        }
    }
    return (int)n;
}
