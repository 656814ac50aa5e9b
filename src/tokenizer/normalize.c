/* normalize.c - the normalizer steps of tokenizer.json (NFC/NFD/NFKC/NFKD through utf8proc,
 * Prepend, Replace with a literal or a regex, Strip) applied to one split of text, and the PCRE2
 * compilation of tokenizer.json regexes (shared with pretokenize.c). It does not decide where
 * splits are (encode.c) or parse the JSON description of the steps (load_json.c). */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

/* Oniguruma (what HF tokenizers uses) gives \s the Unicode White_Space set; PCRE2 with UCP leaves
 * out U+0085. Spell the set out so both engines split the same way. */
#define WS_BODY "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

ckv_status ckv_tk_regex_compile(pcre2_code **out, const char *pattern, size_t len, const char *what) {
    *out = NULL;
    ckv_tk_buf b = {0};
    int in_class = 0;
    size_t class_start = 0;
    ckv_status s = CKV_STATUS_OK;
    for (size_t i = 0; i < len && s == CKV_STATUS_OK; i++) {
        char c = pattern[i];
        if (c == '\\' && i + 1 < len) {
            char e = pattern[i + 1];
            if (e == 's') {
                s = in_class ? ckv_tk_buf_append(&b, WS_BODY, strlen(WS_BODY))
                             : ckv_tk_buf_append(&b, "[" WS_BODY "]", strlen(WS_BODY) + 2);
            } else if (e == 'S' && !in_class) {
                s = ckv_tk_buf_append(&b, "[^" WS_BODY "]", strlen(WS_BODY) + 3);
            } else {
                s = ckv_tk_buf_append(&b, pattern + i, 2);
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = 1;
            class_start = i;
        } else if (in_class && c == ']') {
            /* a ']' right after '[' or '[^' is a literal */
            size_t k = class_start + 1;
            if (k < len && pattern[k] == '^') k++;
            if (i != k) in_class = 0;
        }
        s = ckv_tk_buf_append(&b, &c, 1);
    }
    if (s != CKV_STATUS_OK) {
        ckv_tk_buf_free(&b);
        return s;
    }
    int err = 0;
    PCRE2_SIZE erroff = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(b.p ? b.p : ""), b.n, PCRE2_UTF | PCRE2_UCP, &err, &erroff, NULL);
    ckv_tk_buf_free(&b);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: regex '%.*s' does not compile: %s", what, (int)(len > 80 ? 80 : len),
                         pattern, (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* JIT is an optimisation; fall back silently */
    *out = re;
    return CKV_STATUS_OK;
}

static ckv_status unicode_form(const char *s, size_t len, int options, ckv_tk_buf *out) {
    utf8proc_uint8_t *dst = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)len, &dst,
                                      (utf8proc_option_t)(options | UTF8PROC_STABLE));
    if (n < 0) {
        free(dst);
        return ckv_error(CKV_STATUS_ERR_FORMAT, "tokenizer: unicode normalization failed: %s", utf8proc_errmsg(n));
    }
    ckv_status st = ckv_tk_buf_append(out, dst, (size_t)n);
    free(dst);
    return st;
}

static ckv_status replace_step(const ckv_tk_norm *n, const char *s, size_t len, ckv_tk_buf *out) {
    if (!n->re) {
        if (n->a_len == 0) return ckv_tk_buf_append(out, s, len);
        size_t i = 0, run = 0;
        while (i + n->a_len <= len) {
            if (memcmp(s + i, n->a, n->a_len) == 0) {
                CKV_TRY(ckv_tk_buf_append(out, s + run, i - run));
                CKV_TRY(ckv_tk_buf_append(out, n->b, n->b_len));
                i += n->a_len;
                run = i;
            } else {
                i++;
            }
        }
        return ckv_tk_buf_append(out, s + run, len - run);
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(n->re, NULL);
    if (!md) return ckv_error(CKV_STATUS_ERR_NOMEM, "tokenizer: out of memory for regex matching");
    size_t pos = 0, run = 0;
    ckv_status st = CKV_STATUS_OK;
    while (pos <= len && st == CKV_STATUS_OK) {
        int rc = pcre2_match(n->re, (PCRE2_SPTR)s, len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0) break;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        st = ckv_tk_buf_append(out, s + run, ms - run);
        if (st == CKV_STATUS_OK) st = ckv_tk_buf_append(out, n->b, n->b_len);
        run = me;
        if (me == ms) { /* empty match: step over one character */
            if (me >= len) break;
            size_t step = 1;
            while (me + step < len && ((uint8_t)s[me + step] & 0xC0) == 0x80) step++;
            st = st == CKV_STATUS_OK ? ckv_tk_buf_append(out, s + me, step) : st;
            run = me + step;
            pos = me + step;
        } else {
            pos = me;
        }
    }
    pcre2_match_data_free(md);
    CKV_TRY(st);
    return ckv_tk_buf_append(out, s + run, run <= len ? len - run : 0);
}

static ckv_status strip_step(const ckv_tk_norm *n, const char *s, size_t len, ckv_tk_buf *out) {
    size_t b = 0, e = len;
    if (n->left) {
        while (b < e) {
            uint32_t cp;
            int k = ckv_utf8_decode((const uint8_t *)s + b, &cp);
            if (!ckv_unicode_is_whitespace(cp)) break;
            b += (size_t)k;
        }
    }
    if (n->right) {
        while (e > b) {
            size_t k = e - 1;
            while (k > b && ((uint8_t)s[k] & 0xC0) == 0x80) k--;
            uint32_t cp;
            ckv_utf8_decode((const uint8_t *)s + k, &cp);
            if (!ckv_unicode_is_whitespace(cp)) break;
            e = k;
        }
    }
    return ckv_tk_buf_append(out, s + b, e - b);
}

ckv_status ckv_tk_normalize(const ckv_tokenizer *t, const char *s, size_t len, ckv_tk_buf *out) {
    if (t->n_norms == 0) return ckv_tk_buf_append(out, s, len);
    ckv_tk_buf cur = {0}, next = {0};
    ckv_status st = ckv_tk_buf_append(&cur, s, len);
    for (int i = 0; i < t->n_norms && st == CKV_STATUS_OK; i++) {
        const ckv_tk_norm *n = &t->norms[i];
        next.n = 0;
        switch (n->kind) {
        case CKV_TK_NORM_NFC: st = unicode_form(cur.p, cur.n, UTF8PROC_COMPOSE, &next); break;
        case CKV_TK_NORM_NFD: st = unicode_form(cur.p, cur.n, UTF8PROC_DECOMPOSE, &next); break;
        case CKV_TK_NORM_NFKC: st = unicode_form(cur.p, cur.n, UTF8PROC_COMPOSE | UTF8PROC_COMPAT, &next); break;
        case CKV_TK_NORM_NFKD: st = unicode_form(cur.p, cur.n, UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT, &next); break;
        case CKV_TK_NORM_PREPEND:
            if (cur.n) st = ckv_tk_buf_append(&next, n->a, n->a_len);
            if (st == CKV_STATUS_OK) st = ckv_tk_buf_append(&next, cur.p, cur.n);
            break;
        case CKV_TK_NORM_REPLACE: st = replace_step(n, cur.p, cur.n, &next); break;
        case CKV_TK_NORM_STRIP: st = strip_step(n, cur.p, cur.n, &next); break;
        }
        ckv_tk_buf tmp = cur;
        cur = next;
        next = tmp;
    }
    if (st == CKV_STATUS_OK) st = ckv_tk_buf_append(out, cur.p, cur.n);
    ckv_tk_buf_free(&cur);
    ckv_tk_buf_free(&next);
    return st;
}
