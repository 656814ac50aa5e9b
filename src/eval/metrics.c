/* metrics.c - RULER and LongBench answer scores with Python's text semantics (code points, str.lower,
 * str.split, re's \b and \d) implemented over utf8proc. Each function follows the definition of the
 * benchmark it belongs to, edge cases included (see metrics.h). Pure computation: no I/O. */
#include "eval/metrics.h"

#include <fenv.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- code point strings --------------------------------------------------------------------- */

typedef struct {
    uint32_t *c;
    size_t n;
} cps;

typedef struct { /* a span of a cps buffer */
    size_t off, len;
} span;

static ckv_status oom(const char *what) { return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory scoring (%s)", what); }

/* UTF-8 -> code points; an invalid byte becomes U+FFFD (as a decode with errors="replace"). */
static ckv_status to_cps(const char *s, size_t len, cps *out) {
    out->c = malloc(sizeof(uint32_t) * (len + 1));
    out->n = 0;
    if (!out->c) return oom("decoding text");
    const utf8proc_uint8_t *p = (const utf8proc_uint8_t *)s;
    size_t i = 0;
    while (i < len) {
        utf8proc_int32_t cp = 0;
        utf8proc_ssize_t k = utf8proc_iterate(p + i, (utf8proc_ssize_t)(len - i), &cp);
        if (k <= 0) {
            cp = 0xFFFD;
            k = 1;
        }
        out->c[out->n++] = (uint32_t)cp;
        i += (size_t)k;
    }
    return CKV_STATUS_OK;
}

static ckv_status to_utf8(const uint32_t *c, size_t n, char **out) {
    char *s = malloc(n * 4 + 1);
    if (!s) return oom("encoding text");
    size_t p = 0;
    for (size_t i = 0; i < n; i++) p += (size_t)utf8proc_encode_char((utf8proc_int32_t)c[i], (utf8proc_uint8_t *)s + p);
    s[p] = '\0';
    *out = s;
    return CKV_STATUS_OK;
}

/* Python's str.isspace(). */
static int py_isspace(uint32_t c) {
    if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
    if (c < 0x80) return 0;
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* re's \w for str patterns: letters, numbers and the underscore. */
static int py_isword(uint32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    utf8proc_category_t k = utf8proc_category((utf8proc_int32_t)c);
    return (k >= UTF8PROC_CATEGORY_LU && k <= UTF8PROC_CATEGORY_LO) || (k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO);
}

/* re's \d for str patterns: decimal digits. */
static int py_isdigit(uint32_t c) {
    if (c < 0x80) return c >= '0' && c <= '9';
    return utf8proc_category((utf8proc_int32_t)c) == UTF8PROC_CATEGORY_ND;
}

/* str.lower() in place (the one-to-many mapping of U+0130 is kept to its first code point, 'i'). */
static void py_lower(cps *s) {
    for (size_t i = 0; i < s->n; i++) s->c[i] = s->c[i] == 0x130 ? 'i' : (uint32_t)utf8proc_tolower((utf8proc_int32_t)s->c[i]);
}

static int span_eq(const uint32_t *a, span x, const uint32_t *b, span y) {
    return x.len == y.len && (x.len == 0 || !memcmp(a + x.off, b + y.off, x.len * sizeof(uint32_t)));
}

/* str.split() (any whitespace, no empty parts) of s[lo, hi) into spans appended to *v. */
static ckv_status split_ws(const cps *s, size_t lo, size_t hi, span **v, size_t *n, size_t *cap) {
    size_t i = lo;
    while (i < hi) {
        while (i < hi && py_isspace(s->c[i])) i++;
        if (i >= hi) break;
        size_t st = i;
        while (i < hi && !py_isspace(s->c[i])) i++;
        if (*n == *cap) {
            size_t nc = *cap ? *cap * 2 : 16;
            span *b = realloc(*v, nc * sizeof *b);
            if (!b) return oom("splitting words");
            *v = b;
            *cap = nc;
        }
        (*v)[(*n)++] = (span){st, i - st};
    }
    return CKV_STATUS_OK;
}

/* ---- names and the task table ---------------------------------------------------------------- */

static const char *const metric_names[CKV_METRIC_KIND_COUNT_] = {
    "string_match_all", "string_match_part", "qa_f1", "rouge_l", "classification", "retrieval", "retrieval_zh", "count",
    "code_sim"};

const char *ckv_metric_name(ckv_metric_kind k) {
    return (unsigned)k < CKV_METRIC_KIND_COUNT_ ? metric_names[k] : "unknown";
}

ckv_status ckv_metric_by_name(const char *name, ckv_metric_kind *out) {
    for (int k = 0; k < CKV_METRIC_KIND_COUNT_; k++)
        if (!strcmp(name, metric_names[k])) {
            *out = (ckv_metric_kind)k;
            return CKV_STATUS_OK;
        }
    if (!strcmp(name, "edit_sim")) {
        *out = CKV_METRIC_CODE_SIM;
        return CKV_STATUS_OK;
    }
    return ckv_error(CKV_STATUS_ERR_ARG,
                     "unknown metric '%s' (known: string_match_all, string_match_part, qa_f1, rouge_l, classification, "
                     "retrieval, retrieval_zh, count, code_sim)", name);
}

ckv_status ckv_metric_for_task(const char *task, ckv_metric_kind *out, int *first_line) {
    static const struct {
        const char *task;
        ckv_metric_kind k;
        int first_line;
    } table[] = {
        {"narrativeqa", CKV_METRIC_QA_F1, 0},     {"qasper", CKV_METRIC_QA_F1, 0},
        {"multifieldqa_en", CKV_METRIC_QA_F1, 0}, {"hotpotqa", CKV_METRIC_QA_F1, 0},
        {"2wikimqa", CKV_METRIC_QA_F1, 0},        {"musique", CKV_METRIC_QA_F1, 0},
        {"triviaqa", CKV_METRIC_QA_F1, 1},        {"gov_report", CKV_METRIC_ROUGE_L, 0},
        {"qmsum", CKV_METRIC_ROUGE_L, 0},         {"multi_news", CKV_METRIC_ROUGE_L, 0},
        {"samsum", CKV_METRIC_ROUGE_L, 1},        {"trec", CKV_METRIC_CLASSIFICATION, 1},
        {"lsht", CKV_METRIC_CLASSIFICATION, 1},   {"passage_retrieval_en", CKV_METRIC_RETRIEVAL, 0},
        {"passage_retrieval_zh", CKV_METRIC_RETRIEVAL_ZH, 0}, {"passage_count", CKV_METRIC_PASSAGE_COUNT, 0},
        {"lcc", CKV_METRIC_CODE_SIM, 0},          {"repobench-p", CKV_METRIC_CODE_SIM, 0},
    };
    *first_line = 0;
    char base[128];
    snprintf(base, sizeof base, "%s", task);
    size_t bl = strlen(base);
    if (bl > 2 && !strcmp(base + bl - 2, "_e")) base[bl - 2] = '\0'; /* LongBench-E */
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (!strcmp(base, table[i].task)) {
            *out = table[i].k;
            *first_line = table[i].first_line;
            return CKV_STATUS_OK;
        }
    if (!strcmp(base, "multifieldqa_zh") || !strcmp(base, "dureader") || !strcmp(base, "vcsum"))
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "task '%s': its LongBench metric needs jieba word segmentation, which ckv does not provide; "
                         "give another \"metric\" (or --metric) to score it anyway", task);
    if (!strncmp(task, "niah", 4) || !strncmp(task, "vt", 2) || !strncmp(task, "cwe", 3) || !strncmp(task, "fwe", 3) ||
        !strcmp(task, "variable_tracking") || !strcmp(task, "common_words_extraction") ||
        !strcmp(task, "freq_words_extraction")) {
        *out = CKV_METRIC_STRING_MATCH_ALL;
        return CKV_STATUS_OK;
    }
    if (!strncmp(task, "qa_", 3) || !strcmp(task, "qa")) {
        *out = CKV_METRIC_STRING_MATCH_PART;
        return CKV_STATUS_OK;
    }
    return ckv_error(CKV_STATUS_ERR_ARG,
                     "task '%s' has no known metric (RULER: niah_*, vt, cwe, fwe, qa_*; LongBench: hotpotqa, gov_report, "
                     "trec, lcc, ...): give \"metric\" in the sample or --metric NAME", task);
}

/* ---- RULER string match ---------------------------------------------------------------------- */

/* RULER's post-processing: strip, control characters (\x00-\x1f) to newlines, strip; then lower. */
static ckv_status ruler_clean(const char *s, char **out) {
    cps c;
    CKV_TRY(to_cps(s, strlen(s), &c));
    size_t lo = 0, hi = c.n;
    while (lo < hi && py_isspace(c.c[lo])) lo++;
    while (hi > lo && py_isspace(c.c[hi - 1])) hi--;
    for (size_t i = lo; i < hi; i++)
        if (c.c[i] < 0x20) c.c[i] = '\n';
    while (lo < hi && py_isspace(c.c[lo])) lo++;
    while (hi > lo && py_isspace(c.c[hi - 1])) hi--;
    cps v = {c.c + lo, hi - lo};
    py_lower(&v);
    ckv_status s2 = to_utf8(v.c, v.n, out);
    free(c.c);
    return s2;
}

static ckv_status lower_utf8(const char *s, char **out) {
    cps c;
    CKV_TRY(to_cps(s, strlen(s), &c));
    py_lower(&c);
    ckv_status st = to_utf8(c.c, c.n, out);
    free(c.c);
    return st;
}

ckv_status ckv_metric_string_match(const char *prediction, const char *const *answers, int n_answers, int all,
                                   double *score) {
    *score = 0.0;
    if (n_answers <= 0) return ckv_error(CKV_STATUS_ERR_ARG, "string match: no reference answers");
    char *pred = NULL;
    CKV_TRY(ruler_clean(prediction, &pred));
    double hits = 0.0, best = 0.0;
    for (int i = 0; i < n_answers; i++) {
        char *ref = NULL;
        ckv_status s = lower_utf8(answers[i], &ref);
        if (s != CKV_STATUS_OK) {
            free(pred);
            return s;
        }
        double h = strstr(pred, ref) ? 1.0 : 0.0;
        hits += h;
        if (h > best) best = h;
        free(ref);
    }
    free(pred);
    *score = all ? hits / n_answers : best;
    return CKV_STATUS_OK;
}

/* ---- LongBench: normalisation and token F1 ------------------------------------------------------ */

static int is_ascii_punct(uint32_t c) { return c < 0x80 && c > 0x20 && c != 0x7F && strchr("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", (int)c); }

/* lower -> remove punctuation -> replace \b(a|an|the)\b by " " -> split on whitespace; the tokens are
 * spans of *buf (owned by the caller). */
static ckv_status normalize_tokens(const char *s, cps *buf, span **tok, size_t *n_tok) {
    *tok = NULL;
    *n_tok = 0;
    cps c;
    CKV_TRY(to_cps(s, strlen(s), &c));
    py_lower(&c);
    size_t m = 0;
    for (size_t i = 0; i < c.n; i++)
        if (!is_ascii_punct(c.c[i])) c.c[m++] = c.c[i];
    c.n = m;
    /* articles: matched on the punctuation-free text, replaced by a space */
    uint32_t *o = malloc(sizeof(uint32_t) * (c.n + 1));
    if (!o) {
        free(c.c);
        return oom("normalising");
    }
    size_t on = 0, i = 0;
    static const char *const articles[] = {"a", "an", "the"};
    while (i < c.n) {
        int replaced = 0;
        if (i == 0 || !py_isword(c.c[i - 1])) {
            for (int a = 0; a < 3 && !replaced; a++) { /* alternation order: a, an, the */
                size_t L = strlen(articles[a]);
                if (i + L > c.n) continue;
                int eq = 1;
                for (size_t k = 0; k < L; k++)
                    if (c.c[i + k] != (uint32_t)articles[a][k]) eq = 0;
                if (!eq || (i + L < c.n && py_isword(c.c[i + L]))) continue;
                o[on++] = ' ';
                i += L;
                replaced = 1;
            }
        }
        if (!replaced) o[on++] = c.c[i++];
    }
    free(c.c);
    buf->c = o;
    buf->n = on;
    size_t cap = 0;
    ckv_status st = split_ws(buf, 0, buf->n, tok, n_tok, &cap);
    if (st != CKV_STATUS_OK) {
        free(buf->c);
        free(*tok);
        *tok = NULL;
        buf->c = NULL;
    }
    return st;
}

ckv_status ckv_metric_normalize_answer(const char *s, char **out) {
    cps buf;
    span *tok = NULL;
    size_t n = 0;
    CKV_TRY(normalize_tokens(s, &buf, &tok, &n));
    size_t total = 0;
    for (size_t i = 0; i < n; i++) total += tok[i].len + 1;
    uint32_t *j = malloc(sizeof(uint32_t) * (total + 1));
    ckv_status st = CKV_STATUS_OK;
    if (!j) {
        st = oom("normalising");
    } else {
        size_t p = 0;
        for (size_t i = 0; i < n; i++) {
            if (i) j[p++] = ' ';
            memcpy(j + p, buf.c + tok[i].off, tok[i].len * sizeof(uint32_t));
            p += tok[i].len;
        }
        st = to_utf8(j, p, out);
    }
    free(j);
    free(tok);
    free(buf.c);
    return st;
}

ckv_status ckv_metric_qa_f1(const char *prediction, const char *answer, double *score) {
    *score = 0.0;
    cps pb, gb;
    span *pt = NULL, *gt = NULL;
    size_t np = 0, ng = 0;
    CKV_TRY(normalize_tokens(prediction, &pb, &pt, &np));
    ckv_status st = normalize_tokens(answer, &gb, &gt, &ng);
    if (st != CKV_STATUS_OK) {
        free(pb.c);
        free(pt);
        return st;
    }
    /* Counter(pred) & Counter(truth): each prediction token consumes one equal unused truth token */
    unsigned char *used = calloc(ng ? ng : 1, 1);
    if (!used) {
        st = oom("token F1");
    } else {
        size_t same = 0;
        for (size_t i = 0; i < np; i++)
            for (size_t k = 0; k < ng; k++)
                if (!used[k] && span_eq(pb.c, pt[i], gb.c, gt[k])) {
                    used[k] = 1;
                    same++;
                    break;
                }
        if (same > 0) {
            double p = (double)same / (double)np, r = (double)same / (double)ng;
            *score = 2.0 * p * r / (p + r);
        }
    }
    free(used);
    free(pb.c);
    free(pt);
    free(gb.c);
    free(gt);
    return st;
}

/* ---- LongBench: ROUGE-L (the `rouge` package, exclusive n-grams) -------------------------------- */

typedef struct {
    cps text;       /* the normalised sentences' words back to back */
    span *word;     /* all words in order */
    size_t n_words;
    size_t *sent;   /* [n_sent + 1] first word index of each sentence */
    size_t n_sent;
} rouge_doc;

static void rouge_doc_free(rouge_doc *d) {
    free(d->text.c);
    free(d->word);
    free(d->sent);
}

/* [" ".join(p.split()) for p in s.split(".") if len(p) > 0], each then split(" "). */
static ckv_status rouge_doc_init(const char *s, rouge_doc *d) {
    memset(d, 0, sizeof *d);
    CKV_TRY(to_cps(s, strlen(s), &d->text));
    size_t cap_w = 0, n_pieces = 1;
    for (size_t i = 0; i < d->text.n; i++) n_pieces += d->text.c[i] == '.';
    d->sent = malloc(sizeof(size_t) * (n_pieces + 1));
    if (!d->sent) {
        rouge_doc_free(d);
        return oom("ROUGE sentences");
    }
    size_t lo = 0;
    for (size_t i = 0; i <= d->text.n; i++) {
        if (i < d->text.n && d->text.c[i] != '.') continue;
        if (i > lo) { /* a non-empty piece */
            size_t first = d->n_words;
            ckv_status st = split_ws(&d->text, lo, i, &d->word, &d->n_words, &cap_w);
            if (st != CKV_STATUS_OK) {
                rouge_doc_free(d);
                return st;
            }
            if (d->n_words == first) { /* whitespace only: the sentence "" is one empty word */
                if (d->n_words == cap_w) {
                    size_t nc = cap_w ? cap_w * 2 : 16;
                    span *b = realloc(d->word, nc * sizeof *b);
                    if (!b) {
                        rouge_doc_free(d);
                        return oom("ROUGE words");
                    }
                    d->word = b;
                    cap_w = nc;
                }
                d->word[d->n_words++] = (span){lo, 0};
            }
            d->sent[d->n_sent++] = first;
        }
        lo = i + 1;
    }
    d->sent[d->n_sent] = d->n_words;
    return CKV_STATUS_OK;
}

/* Adds text[w] to the set (spans into the same text) unless present. */
static ckv_status set_add(const uint32_t *txt, span w, span **set, size_t *n, size_t *cap) {
    for (size_t i = 0; i < *n; i++)
        if (span_eq(txt, (*set)[i], txt, w)) return CKV_STATUS_OK;
    if (*n == *cap) {
        size_t nc = *cap ? *cap * 2 : 32;
        span *b = realloc(*set, nc * sizeof *b);
        if (!b) return oom("ROUGE sets");
        *set = b;
        *cap = nc;
    }
    (*set)[(*n)++] = w;
    return CKV_STATUS_OK;
}

static ckv_status distinct_words(const rouge_doc *d, size_t *count) {
    span *set = NULL;
    size_t n = 0, cap = 0;
    for (size_t i = 0; i < d->n_words; i++) {
        ckv_status st = set_add(d->text.c, d->word[i], &set, &n, &cap);
        if (st != CKV_STATUS_OK) {
            free(set);
            return st;
        }
    }
    free(set);
    *count = n;
    return CKV_STATUS_OK;
}

ckv_status ckv_metric_rouge_l(const char *prediction, const char *answer, double *score) {
    *score = 0.0;
    rouge_doc hyp, ref;
    CKV_TRY(rouge_doc_init(prediction, &hyp));
    ckv_status st = rouge_doc_init(answer, &ref);
    if (st != CKV_STATUS_OK) {
        rouge_doc_free(&hyp);
        return st;
    }
    span *uni = NULL; /* union of LCS words: spans into ref.text */
    size_t n_uni = 0, cap_uni = 0, m = 0, n = 0;
    int32_t *tab = NULL;
    if (hyp.n_sent == 0 || ref.n_sent == 0) goto done; /* the package raises; LongBench scores 0 */
    CKV_TRY_GOTO(st, distinct_words(&ref, &m), done);
    CKV_TRY_GOTO(st, distinct_words(&hyp, &n), done);
    for (size_t r = 0; r < ref.n_sent; r++) {
        const span *x = ref.word + ref.sent[r];
        size_t nx = ref.sent[r + 1] - ref.sent[r];
        for (size_t h = 0; h < hyp.n_sent; h++) {
            const span *y = hyp.word + hyp.sent[h];
            size_t ny = hyp.sent[h + 1] - hyp.sent[h];
            size_t W = ny + 1;
            int32_t *t2 = realloc(tab, sizeof(int32_t) * (nx + 1) * W);
            if (!t2) {
                st = oom("ROUGE LCS table");
                goto done;
            }
            tab = t2;
            for (size_t i = 0; i <= nx; i++)
                for (size_t j = 0; j <= ny; j++) {
                    int32_t v;
                    if (i == 0 || j == 0) v = 0;
                    else if (span_eq(ref.text.c, x[i - 1], hyp.text.c, y[j - 1])) v = tab[(i - 1) * W + j - 1] + 1;
                    else {
                        int32_t a = tab[(i - 1) * W + j], b = tab[i * W + j - 1];
                        v = a > b ? a : b;
                    }
                    tab[i * W + j] = v;
                }
            /* _recon_lcs: walk back from (nx, ny) */
            size_t i = nx, j = ny;
            while (i > 0 && j > 0) {
                if (span_eq(ref.text.c, x[i - 1], hyp.text.c, y[j - 1])) {
                    CKV_TRY_GOTO(st, set_add(ref.text.c, x[i - 1], &uni, &n_uni, &cap_uni), done);
                    i--, j--;
                } else if (tab[(i - 1) * W + j] > tab[i * W + j - 1]) {
                    i--;
                } else {
                    j--;
                }
            }
        }
    }
    {
        double llcs = (double)n_uni, r_lcs = llcs / (double)m, p_lcs = llcs / (double)n;
        *score = 2.0 * ((p_lcs * r_lcs) / (p_lcs + r_lcs + 1e-8));
    }
done:
    free(tab);
    free(uni);
    rouge_doc_free(&hyp);
    rouge_doc_free(&ref);
    return st;
}

/* ---- LongBench: edit similarity (fuzzywuzzy ratio over difflib) --------------------------------- */

typedef struct {
    const uint32_t *a, *b;
    const unsigned char *popular; /* [lb] b[j] is a popular element (autojunk) */
    int32_t *prev, *cur;          /* [lb + 1] DP rows */
} matcher;

/* difflib's find_longest_match without junk: the longest run of equal non-popular elements (the first
 * found, scanning i then j upward), then extended over equal elements (popular ones included). */
static void longest_match(const matcher *m, size_t alo, size_t ahi, size_t blo, size_t bhi, size_t *bi, size_t *bj,
                          size_t *bk) {
    size_t besti = alo, bestj = blo, best = 0;
    int32_t *prev = m->prev, *cur = m->cur;
    for (size_t j = blo; j <= bhi; j++) prev[j] = 0;
    for (size_t i = alo; i < ahi; i++) {
        for (size_t j = blo; j < bhi; j++) {
            int32_t k = 0;
            if (!m->popular[j] && m->a[i] == m->b[j]) {
                k = (j > blo ? prev[j - 1] : 0) + 1;
                if ((size_t)k > best) {
                    besti = i + 1 - (size_t)k;
                    bestj = j + 1 - (size_t)k;
                    best = (size_t)k;
                }
            }
            cur[j] = k;
        }
        int32_t *t = prev;
        prev = cur;
        cur = t;
    }
    while (besti > alo && bestj > blo && m->a[besti - 1] == m->b[bestj - 1]) besti--, bestj--, best++;
    while (besti + best < ahi && bestj + best < bhi && m->a[besti + best] == m->b[bestj + best]) best++;
    *bi = besti;
    *bj = bestj;
    *bk = best;
}

static int cmp_u32(const void *x, const void *y) {
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return a < b ? -1 : a > b;
}

static ckv_status seq_ratio(const cps *a, const cps *b, double *ratio) {
    size_t la = a->n, lb = b->n;
    if (la + lb == 0) {
        *ratio = 1.0;
        return CKV_STATUS_OK;
    }
    unsigned char *popular = calloc(lb + 1, 1);
    int32_t *rows = malloc(sizeof(int32_t) * 2 * (lb + 1));
    uint32_t *sorted = malloc(sizeof(uint32_t) * (lb + 1));
    size_t *stack = malloc(sizeof(size_t) * 4 * (la + lb + 2));
    ckv_status st = CKV_STATUS_OK;
    if (!popular || !rows || !sorted || !stack) {
        st = oom("edit similarity");
        goto out;
    }
    if (lb >= 200) { /* autojunk: elements occurring more than lb / 100 + 1 times are popular */
        memcpy(sorted, b->c, sizeof(uint32_t) * lb);
        qsort(sorted, lb, sizeof(uint32_t), cmp_u32);
        size_t ntest = lb / 100 + 1;
        for (size_t j = 0; j < lb; j++) {
            uint32_t *lo = sorted, *hi = sorted + lb; /* count of b[j] by binary search */
            while (lo < hi) {
                uint32_t *mid = lo + (hi - lo) / 2;
                if (*mid < b->c[j]) lo = mid + 1;
                else hi = mid;
            }
            size_t cnt = 0;
            for (uint32_t *p = lo; p < sorted + lb && *p == b->c[j]; p++) cnt++;
            popular[j] = cnt > ntest;
        }
    }
    matcher m = {a->c, b->c, popular, rows, rows + lb + 1};
    size_t sp = 0, matches = 0;
    stack[sp++] = 0, stack[sp++] = la, stack[sp++] = 0, stack[sp++] = lb;
    while (sp) {
        size_t bhi = stack[--sp], blo = stack[--sp], ahi = stack[--sp], alo = stack[--sp];
        size_t i, j, k;
        longest_match(&m, alo, ahi, blo, bhi, &i, &j, &k);
        if (!k) continue;
        matches += k;
        if (alo < i && blo < j) stack[sp++] = alo, stack[sp++] = i, stack[sp++] = blo, stack[sp++] = j;
        if (i + k < ahi && j + k < bhi) stack[sp++] = i + k, stack[sp++] = ahi, stack[sp++] = j + k, stack[sp++] = bhi;
    }
    *ratio = 2.0 * (double)matches / (double)(la + lb);
out:
    free(popular);
    free(rows);
    free(sorted);
    free(stack);
    return st;
}

ckv_status ckv_metric_sequence_ratio(const char *a, const char *b, double *ratio) {
    cps x, y;
    CKV_TRY(to_cps(a, strlen(a), &x));
    ckv_status st = to_cps(b, strlen(b), &y);
    if (st == CKV_STATUS_OK) {
        st = seq_ratio(&x, &y, ratio);
        free(y.c);
    }
    free(x.c);
    return st;
}

ckv_status ckv_metric_code_sim(const char *prediction, const char *answer, double *score) {
    *score = 0.0;
    /* the first line (after leading newlines) without a code fence or a comment marker */
    while (*prediction == '\n') prediction++;
    const char *line = "", *p = prediction;
    size_t line_len = 0;
    for (;;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        int bad = memchr(p, '`', len) || memchr(p, '#', len);
        for (size_t i = 0; i + 1 < len && !bad; i++) bad = p[i] == '/' && p[i + 1] == '/';
        if (!bad) {
            line = p;
            line_len = len;
            break;
        }
        if (!e) break;
        p = e + 1;
    }
    /* fuzz.ratio: equal strings 100, an empty one 0, else round(100 * SequenceMatcher.ratio()) */
    if (line_len == strlen(answer) && !memcmp(line, answer, line_len)) {
        *score = 1.0;
        return CKV_STATUS_OK;
    }
    if (line_len == 0 || !*answer) return CKV_STATUS_OK;
    cps x, y;
    CKV_TRY(to_cps(line, line_len, &x));
    ckv_status st = to_cps(answer, strlen(answer), &y);
    double r = 0.0;
    if (st == CKV_STATUS_OK) st = seq_ratio(&x, &y, &r);
    free(x.c);
    free(y.c);
    if (st != CKV_STATUS_OK) return st;
    int save = fegetround();
    fesetround(FE_TONEAREST);
    double pct = nearbyint(100.0 * r); /* Python's round(): halves to even */
    fesetround(save);
    *score = pct / 100.0;
    return CKV_STATUS_OK;
}

/* ---- LongBench: classification, retrieval, count --------------------------------------------------- */

ckv_status ckv_metric_classification(const char *prediction, const char *answer, const char *const *classes,
                                     int n_classes, double *score) {
    *score = 0.0;
    const char **em = malloc(sizeof(char *) * (size_t)(n_classes > 0 ? n_classes : 1));
    if (!em) return oom("classification");
    int n = 0;
    for (int i = 0; i < n_classes; i++)
        if (strstr(prediction, classes[i])) em[n++] = classes[i];
    /* `for t in em: if t in truth and t != truth: em.remove(t)`: removing while iterating skips the
     * element after each removal; list.remove drops the first equal element */
    for (int i = 0; i < n; i++) {
        const char *t = em[i];
        if (strstr(answer, t) && strcmp(t, answer) != 0) {
            int f = 0;
            while (strcmp(em[f], t) != 0) f++;
            memmove(em + f, em + f + 1, sizeof(char *) * (size_t)(n - f - 1));
            n--;
        }
    }
    for (int i = 0; i < n; i++)
        if (!strcmp(em[i], answer)) {
            *score = 1.0 / n;
            break;
        }
    free(em);
    return CKV_STATUS_OK;
}

/* Fraction of the digit runs of `prediction` equal to `want` (0 when there are none). */
static ckv_status digit_runs_equal(const char *prediction, const cps *want, double *score) {
    cps c;
    CKV_TRY(to_cps(prediction, strlen(prediction), &c));
    size_t runs = 0, right = 0, i = 0;
    while (i < c.n) {
        if (!py_isdigit(c.c[i])) {
            i++;
            continue;
        }
        size_t st = i;
        while (i < c.n && py_isdigit(c.c[i])) i++;
        runs++;
        if (i - st == want->n && !memcmp(c.c + st, want->c, want->n * sizeof(uint32_t))) right++;
    }
    free(c.c);
    *score = runs ? (double)right / (double)runs : 0.0;
    return CKV_STATUS_OK;
}

ckv_status ckv_metric_passage_count(const char *prediction, const char *answer, double *score) {
    cps w;
    CKV_TRY(to_cps(answer, strlen(answer), &w));
    ckv_status st = digit_runs_equal(prediction, &w, score);
    free(w.c);
    return st;
}

ckv_status ckv_metric_retrieval(const char *prediction, const char *answer, int zh, double *score) {
    *score = 0.0;
    const char *marker = zh ? "\xe6\xae\xb5\xe8\x90\xbd" /* 段落 */ : "Paragraph ";
    cps a, mk;
    CKV_TRY(to_cps(answer, strlen(answer), &a));
    ckv_status st = to_cps(marker, strlen(marker), &mk);
    if (st != CKV_STATUS_OK) {
        free(a.c);
        return st;
    }
    /* the first match of marker(\d+) */
    cps id = {NULL, 0};
    for (size_t i = 0; i + mk.n < a.n && !id.c; i++) {
        if (memcmp(a.c + i, mk.c, mk.n * sizeof(uint32_t)) != 0 || !py_isdigit(a.c[i + mk.n])) continue;
        size_t e = i + mk.n;
        while (e < a.n && py_isdigit(a.c[e])) e++;
        id.c = a.c + i + mk.n;
        id.n = e - (i + mk.n);
    }
    if (!id.c)
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "retrieval answer '%.60s' does not name a paragraph ('%s<N>')", answer, marker);
    else
        st = digit_runs_equal(prediction, &id, score);
    free(a.c);
    free(mk.c);
    return st;
}

/* ---- dispatch ------------------------------------------------------------------------------------ */

ckv_status ckv_metric_score(ckv_metric_kind k, int first_line, const char *prediction, const char *const *answers,
                            int n_answers, const char *const *classes, int n_classes, double *score) {
    *score = 0.0;
    if (n_answers <= 0) return ckv_error(CKV_STATUS_ERR_ARG, "%s: the sample has no reference answers", ckv_metric_name(k));
    char *owned = NULL;
    if (first_line) { /* prediction.lstrip("\n").split("\n")[0] */
        while (*prediction == '\n') prediction++;
        const char *e = strchr(prediction, '\n');
        size_t len = e ? (size_t)(e - prediction) : strlen(prediction);
        owned = malloc(len + 1);
        if (!owned) return oom("first line");
        memcpy(owned, prediction, len);
        owned[len] = '\0';
        prediction = owned;
    }
    ckv_status st = CKV_STATUS_OK;
    if (k == CKV_METRIC_STRING_MATCH_ALL || k == CKV_METRIC_STRING_MATCH_PART) {
        st = ckv_metric_string_match(prediction, answers, n_answers, k == CKV_METRIC_STRING_MATCH_ALL, score);
    } else {
        double best = 0.0;
        for (int i = 0; i < n_answers && st == CKV_STATUS_OK; i++) {
            double v = 0.0;
            switch (k) {
            case CKV_METRIC_QA_F1: st = ckv_metric_qa_f1(prediction, answers[i], &v); break;
            case CKV_METRIC_ROUGE_L: st = ckv_metric_rouge_l(prediction, answers[i], &v); break;
            case CKV_METRIC_CLASSIFICATION: st = ckv_metric_classification(prediction, answers[i], classes, n_classes, &v); break;
            case CKV_METRIC_RETRIEVAL: st = ckv_metric_retrieval(prediction, answers[i], 0, &v); break;
            case CKV_METRIC_RETRIEVAL_ZH: st = ckv_metric_retrieval(prediction, answers[i], 1, &v); break;
            case CKV_METRIC_PASSAGE_COUNT: st = ckv_metric_passage_count(prediction, answers[i], &v); break;
            case CKV_METRIC_CODE_SIM: st = ckv_metric_code_sim(prediction, answers[i], &v); break;
            default: st = ckv_error(CKV_STATUS_ERR_ARG, "unknown metric %d", (int)k); break;
            }
            if (v > best) best = v;
        }
        *score = best;
    }
    free(owned);
    return st;
}
