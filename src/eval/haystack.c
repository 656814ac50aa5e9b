/* haystack.c - essay haystacks (the built-in public-domain prose or a user's text file) cut into
 * words, the first-n-words view the generators use, and a small rule-based sentence splitter for
 * needle insertion. It does not build tasks or tokenise. */
#include "eval/haystack.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/json.h"

/* Collapses whitespace runs of src[len] into single spaces (trimmed) and indexes the words. */
static ckv_status haystack_build(ckv_haystack *h, const char *src, size_t len, const char *source) {
    memset(h, 0, sizeof *h);
    h->text = malloc(len + 1);
    if (!h->text) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory reading the haystack %s", source);
    size_t n = 0, words = 0;
    int in_space = 1;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)src[i];
        if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
            in_space = 1;
            continue;
        }
        if (in_space) {
            if (n > 0) h->text[n++] = ' ';
            words++;
            in_space = 0;
        }
        h->text[n++] = (char)c;
    }
    h->text[n] = '\0';
    h->len = n;
    h->word = malloc(sizeof(size_t) * (words ? words : 1));
    if (!h->word) {
        ckv_haystack_free(h);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory indexing the haystack %s", source);
    }
    size_t w = 0;
    for (size_t i = 0; i < n; i++)
        if (i == 0 || h->text[i - 1] == ' ') h->word[w++] = i;
    h->n_words = w;
    snprintf(h->source, sizeof h->source, "%s", source);
    return CKV_STATUS_OK;
}

ckv_status ckv_haystack_open_builtin(ckv_haystack *h) {
    return haystack_build(h, ckv_haystack_essay_text, (size_t)ckv_haystack_essay_len, "builtin:devils-dictionary");
}

ckv_status ckv_haystack_open_file(ckv_haystack *h, const char *path) {
    memset(h, 0, sizeof *h);
    char *buf = NULL;
    size_t len = 0;
    CKV_TRY(ckv_read_file(path, &buf, &len));
    if (memchr(buf, '\0', len)) {
        free(buf);
        return ckv_error(CKV_STATUS_ERR_FORMAT, "haystack file '%s' contains a NUL byte: expected UTF-8 text", path);
    }
    ckv_status s = haystack_build(h, buf, len, path);
    free(buf);
    if (s != CKV_STATUS_OK) return s;
    if (h->n_words < 100) {
        size_t nw = h->n_words;
        ckv_haystack_free(h);
        return ckv_error(CKV_STATUS_ERR_FORMAT, "haystack file '%s' has %zu words; a haystack needs at least 100", path, nw);
    }
    return CKV_STATUS_OK;
}

void ckv_haystack_free(ckv_haystack *h) {
    if (!h) return;
    free(h->text);
    free(h->word);
    memset(h, 0, sizeof *h);
}

ckv_status ckv_haystack_take_words(const ckv_haystack *h, size_t n, char **out) {
    *out = NULL;
    if (h->n_words == 0) return ckv_error(CKV_STATUS_ERR_ARG, "the haystack %s is empty", h->source);
    size_t full = n / h->n_words, rest = n % h->n_words;
    size_t rest_bytes = rest ? (rest < h->n_words ? h->word[rest] - 1 : h->len) : 0;
    size_t total = full * (h->len + 1) + rest_bytes + 1;
    char *s = malloc(total);
    if (!s) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building a haystack of %zu words", n);
    size_t p = 0;
    for (size_t r = 0; r < full; r++) {
        if (p) s[p++] = ' ';
        memcpy(s + p, h->text, h->len);
        p += h->len;
    }
    if (rest) {
        if (p) s[p++] = ' ';
        memcpy(s + p, h->text, rest_bytes);
        p += rest_bytes;
    }
    s[p] = '\0';
    *out = s;
    return CKV_STATUS_OK;
}

/* 1 when the word text[word_start .. end) before a '.' is an abbreviation that does not end a
 * sentence: a title, an initial or one-letter mark ("A.", "n."), a dotted form ("v.t.", "e.g.") or a
 * part-of-speech mark of the dictionary ("adj.", "pp."). */
static int is_abbreviation(const char *text, size_t word_start, size_t end) {
    while (word_start < end && !isalnum((unsigned char)text[word_start])) word_start++;
    size_t wl = end - word_start;
    const char *w = text + word_start;
    static const char *const words[] = {"Mr", "Mrs", "Ms", "Dr", "St", "Jr", "Sr", "Prof", "Rev", "Gen", "Col", "Capt",
                                        "Lt", "Mt", "Vol", "vs", "etc", "cf", "viz", "ibid", "adj", "adv", "pp",
                                        "pron", "prep", "conj", "interj"};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (strlen(words[i]) == wl && !strncmp(w, words[i], wl)) return 1;
    if (wl == 1 && isalpha((unsigned char)w[0])) return 1;
    return wl > 0 && memchr(w, '.', wl) != NULL;
}

ckv_status ckv_haystack_sentences(const char *text, size_t len, size_t **starts, size_t *n) {
    *starts = NULL;
    *n = 0;
    size_t cap = 64, cnt = 0;
    size_t *st = malloc(cap * sizeof *st);
    if (!st) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory splitting sentences");
    if (len > 0) st[cnt++] = 0;
    size_t word_start = 0;
    for (size_t i = 0; i < len; i++) {
        char c = text[i];
        if (c == ' ') {
            word_start = i + 1;
            continue;
        }
        if (c != '.' && c != '!' && c != '?') continue;
        size_t j = i + 1;
        while (j < len && (text[j] == '"' || text[j] == '\'' || text[j] == ')' || text[j] == ']')) j++;
        if (j >= len || text[j] != ' ' || j + 1 >= len) continue;
        if (c == '.' && j == i + 1 && is_abbreviation(text, word_start, i)) continue;
        if (cnt == cap) {
            cap *= 2;
            size_t *bigger = realloc(st, cap * sizeof *st);
            if (!bigger) {
                free(st);
                return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory splitting sentences");
            }
            st = bigger;
        }
        st[cnt++] = j + 1;
        i = j;
        word_start = j + 1;
    }
    *starts = st;
    *n = cnt;
    return CKV_STATUS_OK;
}
