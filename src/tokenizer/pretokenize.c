/* pretokenize.c - the pre-tokenizer steps of tokenizer.json run on one normalized split: Split by a
 * PCRE2 regex or a literal with HF's five delimiter behaviours (and invert), ByteLevel (optional
 * prefix space, the GPT-2 regex, bytes -> printable chars), Digits, Metaspace. Empty pieces are
 * dropped as HF does. It does not normalize, match added tokens or run the BPE model. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tok_internal.h"

/* One match event of a pattern over a piece: [s, e) and whether it is a match. */
typedef struct {
    size_t s, e;
    int match;
} ev;

typedef struct {
    ev *p;
    size_t n, cap;
} evs;

static ckv_status ev_push(evs *v, size_t s, size_t e, int match) {
    if (v->n == v->cap) {
        size_t cap = v->cap ? v->cap * 2 : 64;
        ev *p = realloc(v->p, cap * sizeof *p);
        if (!p) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory splitting text");
        v->p = p;
        v->cap = cap;
    }
    v->p[v->n].s = s;
    v->p[v->n].e = e;
    v->p[v->n].match = match;
    v->n++;
    return CKV_STATUS_OK;
}

static size_t char_len_at(const char *s, size_t i, size_t len) {
    size_t k = 1;
    while (i + k < len && ((uint8_t)s[i + k] & 0xC0) == 0x80) k++;
    return k;
}

/* HF's find_matches for a regex: gaps and matches in order; empty text gives one empty gap. */
static ckv_status regex_events(pcre2_code *re, pcre2_match_data *md, const char *s, size_t len, evs *out) {
    out->n = 0;
    if (len == 0) return ev_push(out, 0, 0, 0);
    size_t prev = 0, pos = 0;
    size_t last_match_end = (size_t)-1;
    while (pos <= len) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0) {
            if (rc == PCRE2_ERROR_NOMATCH) break;
            PCRE2_UCHAR msg[120];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return ckv_error(CKV_STATUS_ERR_INTERNAL, "tokenizer: regex match failed: %s", (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (ms == me) {
            if (last_match_end == me) { /* no empty match right after the previous match */
                if (me >= len) break;
                pos = me + char_len_at(s, me, len);
                continue;
            }
        }
        if (prev != ms) CKV_TRY(ev_push(out, prev, ms, 0));
        CKV_TRY(ev_push(out, ms, me, 1));
        prev = me;
        last_match_end = me;
        if (ms == me) {
            if (me >= len) break;
            pos = me + char_len_at(s, me, len);
        } else {
            pos = me;
        }
    }
    if (prev != len) CKV_TRY(ev_push(out, prev, len, 0));
    return CKV_STATUS_OK;
}

static ckv_status literal_events(const char *lit, size_t lit_len, const char *s, size_t len, evs *out) {
    out->n = 0;
    if (len == 0) return ev_push(out, 0, 0, 0);
    if (lit_len == 0) return ev_push(out, 0, len, 0);
    size_t prev = 0, i = 0;
    while (i + lit_len <= len) {
        if (memcmp(s + i, lit, lit_len) == 0) {
            if (prev != i) CKV_TRY(ev_push(out, prev, i, 0));
            CKV_TRY(ev_push(out, i, i + lit_len, 1));
            i += lit_len;
            prev = i;
        } else {
            i++;
        }
    }
    if (prev != len) CKV_TRY(ev_push(out, prev, len, 0));
    return CKV_STATUS_OK;
}

/* Each numeric character (or each `repl` occurrence for Metaspace) is a match of its own. */
static ckv_status char_events(const char *s, size_t len, int numeric, const char *repl, int repl_len, evs *out) {
    out->n = 0;
    if (len == 0) return ev_push(out, 0, 0, 0);
    size_t last = 0, i = 0;
    while (i < len) {
        uint32_t cp;
        int k = ckv_utf8_decode((const uint8_t *)s + i, &cp);
        int hit = numeric ? ckv_unicode_is_numeric(cp)
                          : (k == repl_len && memcmp(s + i, repl, (size_t)repl_len) == 0);
        if (hit) {
            if (last < i) CKV_TRY(ev_push(out, last, i, 0));
            CKV_TRY(ev_push(out, i, i + (size_t)k, 1));
            last = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (len > last) CKV_TRY(ev_push(out, last, len, 0));
    return CKV_STATUS_OK;
}

/* Turns events into pieces per HF's SplitDelimiterBehavior; pushes non-empty pieces (offsets are
 * relative to the text buffer: base + event offset). */
static ckv_status apply_behavior(evs *e, ckv_tk_split_behavior behavior, int invert, size_t base, int first,
                                 ckv_tk_spans *out) {
    if (invert)
        for (size_t i = 0; i < e->n; i++) e->p[i].match = !e->p[i].match;
    /* the pieces: in place in e (match field reused as "remove") */
    size_t n = 0;
    switch (behavior) {
    case CKV_TK_SPLIT_ISOLATED:
        for (size_t i = 0; i < e->n; i++) e->p[i].match = 0;
        n = e->n;
        break;
    case CKV_TK_SPLIT_REMOVED:
        n = e->n;
        break;
    case CKV_TK_SPLIT_CONTIGUOUS: {
        int prev = 0;
        for (size_t i = 0; i < e->n; i++) {
            int m = e->p[i].match;
            if (m == prev && n > 0) {
                e->p[n - 1].e = e->p[i].e;
            } else {
                e->p[n] = e->p[i];
                e->p[n].match = 0;
                n++;
            }
            prev = m;
        }
        break;
    }
    case CKV_TK_SPLIT_MERGED_WITH_PREVIOUS: {
        int prev = 0;
        for (size_t i = 0; i < e->n; i++) {
            int m = e->p[i].match;
            if (m && !prev && n > 0) {
                e->p[n - 1].e = e->p[i].e;
            } else {
                e->p[n] = e->p[i];
                e->p[n].match = 0;
                n++;
            }
            prev = m;
        }
        break;
    }
    case CKV_TK_SPLIT_MERGED_WITH_NEXT: {
        /* walk backwards, merging a match into the piece that follows it */
        int prev = 0;
        size_t w = e->n; /* pieces are built from the end of the array towards its start */
        for (size_t k = e->n; k-- > 0;) {
            ev cur = e->p[k];
            int m = cur.match;
            if (m && !prev && w < e->n) {
                e->p[w].s = cur.s;
            } else {
                w--;
                e->p[w] = cur;
                e->p[w].match = 0;
            }
            prev = m;
        }
        n = e->n - w;
        memmove(e->p, e->p + w, n * sizeof *e->p);
        break;
    }
    }
    for (size_t i = 0; i < n; i++) {
        if (e->p[i].match) continue; /* removed */
        if (e->p[i].e == e->p[i].s) continue;
        CKV_TRY(ckv_tk_spans_push(out, base + e->p[i].s, e->p[i].e - e->p[i].s, -1, first && e->p[i].s == 0));
    }
    return CKV_STATUS_OK;
}

static ckv_status bytelevel_transform(const char *s, size_t len, ckv_tk_buf *out) {
    const uint16_t *b2c;
    ckv_tk_bytelevel_tables(&b2c, NULL);
    CKV_TRY(ckv_tk_buf_reserve(out, len * 2));
    for (size_t i = 0; i < len; i++) {
        char tmp[4];
        int k = ckv_utf8_encode(b2c[(uint8_t)s[i]], tmp);
        memcpy(out->p + out->n, tmp, (size_t)k);
        out->n += (size_t)k;
    }
    out->p[out->n] = '\0';
    return CKV_STATUS_OK;
}

ckv_status ckv_tk_pretokenize(const ckv_tokenizer *t, const char *text, size_t len, int first, ckv_tk_buf *out_text,
                              ckv_tk_spans *out, ckv_tk_buf *a, ckv_tk_buf *b, ckv_tk_spans *s1, ckv_tk_spans *s2) {
    a->n = 0;
    s1->n = 0;
    CKV_TRY(ckv_tk_buf_append(a, text, len));
    if (len) CKV_TRY(ckv_tk_spans_push(s1, 0, len, -1, first));
    evs e = {0};
    pcre2_match_data *md = NULL;
    ckv_status st = CKV_STATUS_OK;
    for (int si = 0; si < t->n_pres && st == CKV_STATUS_OK; si++) {
        const ckv_tk_pre *p = &t->pres[si];
        s2->n = 0;
        if (p->re) {
            pcre2_match_data_free(md);
            md = pcre2_match_data_create_from_pattern(p->re, NULL);
            if (!md) {
                st = ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory for regex matching");
                break;
            }
        }
        switch (p->kind) {
        case CKV_TK_PRE_SPLIT:
            for (size_t i = 0; i < s1->n && st == CKV_STATUS_OK; i++) {
                const ckv_tk_span *sp = &s1->p[i];
                st = p->re ? regex_events(p->re, md, a->p + sp->off, sp->len, &e)
                           : literal_events(p->lit, p->lit_len, a->p + sp->off, sp->len, &e);
                if (st == CKV_STATUS_OK) st = apply_behavior(&e, p->behavior, p->invert, sp->off, sp->first, s2);
            }
            break;
        case CKV_TK_PRE_DIGITS:
            for (size_t i = 0; i < s1->n && st == CKV_STATUS_OK; i++) {
                const ckv_tk_span *sp = &s1->p[i];
                st = char_events(a->p + sp->off, sp->len, 1, NULL, 0, &e);
                if (st == CKV_STATUS_OK)
                    st = apply_behavior(&e, p->individual ? CKV_TK_SPLIT_ISOLATED : CKV_TK_SPLIT_CONTIGUOUS, 0, sp->off,
                                        sp->first, s2);
            }
            break;
        case CKV_TK_PRE_BYTELEVEL: {
            /* 1. optional prefix space and the GPT-2 split (into b), 2. bytes -> chars (into a) */
            b->n = 0;
            ckv_tk_spans tmp = {0};
            for (size_t i = 0; i < s1->n && st == CKV_STATUS_OK; i++) {
                const ckv_tk_span *sp = &s1->p[i];
                size_t base = b->n;
                if (p->add_prefix_space && (sp->len == 0 || a->p[sp->off] != ' ')) st = ckv_tk_buf_append(b, " ", 1);
                if (st == CKV_STATUS_OK) st = ckv_tk_buf_append(b, a->p + sp->off, sp->len);
                if (st != CKV_STATUS_OK) break;
                if (p->re) {
                    st = regex_events(p->re, md, b->p + base, b->n - base, &e);
                    if (st == CKV_STATUS_OK) st = apply_behavior(&e, CKV_TK_SPLIT_ISOLATED, 0, base, sp->first, &tmp);
                } else if (b->n > base) {
                    st = ckv_tk_spans_push(&tmp, base, b->n - base, -1, sp->first);
                }
            }
            a->n = 0;
            for (size_t i = 0; i < tmp.n && st == CKV_STATUS_OK; i++) {
                size_t base = a->n;
                st = bytelevel_transform(b->p + tmp.p[i].off, tmp.p[i].len, a);
                if (st == CKV_STATUS_OK) st = ckv_tk_spans_push(s2, base, a->n - base, -1, tmp.p[i].first);
            }
            free(tmp.p);
            break;
        }
        case CKV_TK_PRE_METASPACE: {
            b->n = 0;
            for (size_t i = 0; i < s1->n && st == CKV_STATUS_OK; i++) {
                const ckv_tk_span *sp = &s1->p[i];
                size_t base = b->n;
                const char *src = a->p + sp->off;
                int starts = sp->len > 0 && (src[0] == ' ' || ((size_t)p->repl_len <= sp->len &&
                                                               memcmp(src, p->repl, (size_t)p->repl_len) == 0));
                int prepend = !starts && (p->prepend_scheme == CKV_TK_PREPEND_ALWAYS ||
                                          (p->prepend_scheme == CKV_TK_PREPEND_FIRST && sp->first));
                if (prepend) st = ckv_tk_buf_append(b, p->repl, (size_t)p->repl_len);
                for (size_t k = 0; k < sp->len && st == CKV_STATUS_OK; k++)
                    st = src[k] == ' ' ? ckv_tk_buf_append(b, p->repl, (size_t)p->repl_len)
                                       : ckv_tk_buf_append(b, src + k, 1);
                if (st != CKV_STATUS_OK) break;
                if (p->split) {
                    st = char_events(b->p + base, b->n - base, 0, p->repl, p->repl_len, &e);
                    if (st == CKV_STATUS_OK)
                        st = apply_behavior(&e, CKV_TK_SPLIT_MERGED_WITH_NEXT, 0, base, sp->first, s2);
                } else if (b->n > base) {
                    st = ckv_tk_spans_push(s2, base, b->n - base, -1, sp->first);
                }
            }
            ckv_tk_buf swap = *a;
            *a = *b;
            *b = swap;
            break;
        }
        }
        ckv_tk_spans sw = *s1;
        *s1 = *s2;
        *s2 = sw;
    }
    pcre2_match_data_free(md);
    free(e.p);
    CKV_TRY(st);
    for (size_t i = 0; i < s1->n; i++) {
        size_t base = out_text->n;
        CKV_TRY(ckv_tk_buf_append(out_text, a->p + s1->p[i].off, s1->p[i].len));
        CKV_TRY(ckv_tk_spans_push(out, base, s1->p[i].len, -1, s1->p[i].first));
    }
    return CKV_STATUS_OK;
}
