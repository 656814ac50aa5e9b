/* test_eval_tasks.c - the RULER-style generators with the fixture tokenizer as the token counter:
 * every task reaches the requested length (prompt + max_new_tokens within 6.25% below it, never above),
 * samples are deterministic in (seed, index) and differ across seeds and indices, the needles /
 * chains / word lists are in the context and the answers can be derived from the context alone
 * (needle values of the queried keys, the variables of the value's chain, the most frequent words);
 * also task lists, the haystack's words and sentence splitter, and the error for a length too short. */
#define _POSIX_C_SOURCE 200809L /* strtok_r */
#include <stdlib.h>
#include <string.h>

#include "ckv_test.h"
#include "core/status.h"
#include "eval/haystack.h"
#include "eval/ruler.h"
#include "tokenizer/tokenizer.h"

static ckv_tokenizer *tok;

static ckv_status count_plain(void *ctx, const ckv_eval_sample *s, long *tokens) {
    (void)ctx;
    const ckv_eval_question *q = &s->questions[0];
    size_t n = strlen(s->context) + strlen(q->question) + strlen(q->answer_prefix);
    char *t = malloc(n + 1);
    if (!t) return CKV_STATUS_ERR_NOMEM;
    snprintf(t, n + 1, "%s%s%s", s->context, q->question, q->answer_prefix);
    int32_t *ids = NULL;
    size_t ni = 0;
    ckv_status st = ckv_tokenizer_encode(tok, t, n, CKV_TOKENIZE_ADD_SPECIAL, &ids, &ni);
    free(t);
    free(ids);
    *tokens = (long)ni;
    return st;
}

/* Values of the needles "One of the special magic <type> for <key> is: <value>." with this key. */
static int needle_values(const char *ctx, const char *key, char vals[][64], int cap) {
    int n = 0;
    const char *p = ctx;
    while ((p = strstr(p, "One of the special magic ")) != NULL) {
        p += strlen("One of the special magic ");
        const char *f = strstr(p, " for ");
        if (!f) break;
        const char *k = f + 5, *is = strstr(k, " is: ");
        if (!is) break;
        if ((size_t)(is - k) == strlen(key) && !strncmp(k, key, strlen(key)) && n < cap) {
            const char *v = is + 5, *e = strchr(v, '.');
            if (e && (size_t)(e - v) < 64) {
                memcpy(vals[n], v, (size_t)(e - v));
                vals[n][e - v] = '\0';
                n++;
            }
        }
        p = is;
    }
    return n;
}

static int has_answer(const ckv_eval_question *q, const char *v) {
    for (int i = 0; i < q->n_answers; i++)
        if (!strcmp(q->answers[i], v)) return 1;
    return 0;
}

static void check_niah(const ckv_ruler_task *t, const ckv_eval_sample *s) {
    const ckv_eval_question *q = &s->questions[0];
    /* the keys queried: between " for " and " mentioned" in the question, joined by ", " / ", and " */
    const char *f = strstr(q->question, " for "), *m = strstr(q->question, " mentioned");
    CHECK_MSG(f && m && m > f, "%s: question '%s'", t->name, q->question);
    if (!f || !m || m <= f) return;
    char keys[1024];
    snprintf(keys, sizeof keys, "%.*s", (int)(m - f - 5), f + 5);
    int n_keys = 0, found = 0;
    char *save = NULL;
    for (char *k = strtok_r(keys, ",", &save); k; k = strtok_r(NULL, ",", &save)) {
        while (*k == ' ') k++;
        if (!strncmp(k, "and ", 4)) k += 4;
        n_keys++;
        char vals[16][64];
        int nv = needle_values(s->context, k, vals, 16);
        CHECK_MSG(nv == t->num_v, "%s: key '%s' has %d needles in the context, expected %d", t->name, k, nv, t->num_v);
        for (int i = 0; i < nv; i++) {
            CHECK_MSG(has_answer(q, vals[i]), "%s: value '%s' of key '%s' is not an answer", t->name, vals[i], k);
            found++;
        }
    }
    CHECK_MSG(n_keys == t->num_q, "%s: %d keys queried, expected %d", t->name, n_keys, t->num_q);
    CHECK_MSG(found == q->n_answers && q->n_answers == t->num_q * t->num_v, "%s: %d answers derived, %d given", t->name, found,
              q->n_answers);
    int single = t->num_q * t->num_v == 1;
    CHECK(!strncmp(s->context, single ? "A special magic" : "Some special magic", single ? 15 : 18));
    CHECK(strstr(q->question, single ? "What is the special magic" : "What are all the special magic") == q->question);
    CHECK(!strncmp(q->answer_prefix, "The special magic", 17));
}

static void check_vt(const ckv_eval_sample *s) {
    const ckv_eval_question *q = &s->questions[0];
    const char *vq = strstr(q->question, "the value ");
    CHECK(vq != NULL);
    if (!vq) return;
    long value = strtol(vq + 10, NULL, 10);
    /* the sample's own chain: after the second task header (the first belongs to the example) */
    const char *head = "Memorize and track the chain(s) of variable assignment hidden in the following text.";
    const char *main_part = strstr(s->context, head);
    CHECK(main_part != NULL);
    if (!main_part) return;
    main_part = strstr(main_part + 1, head);
    CHECK(main_part != NULL);
    if (!main_part) return;
    char var[16][8];
    int nv = 0;
    char pat[64];
    snprintf(pat, sizeof pat, " = %ld\n", value);
    const char *p = strstr(main_part, pat);
    CHECK_MSG(p != NULL, "vt: no 'VAR X = %ld'", value);
    if (!p) return;
    const char *vstart = p;
    while (vstart > main_part && vstart[-1] != '\n') vstart--;
    sscanf(vstart, "VAR %7s", var[nv++]);
    for (int hop = 0; hop < 10 && nv < 16; hop++) { /* "VAR Y = VAR X " */
        char link[32];
        snprintf(link, sizeof link, " = VAR %s \n", var[nv - 1]);
        const char *l = strstr(main_part, link);
        if (!l) break;
        const char *ls = l;
        while (ls > main_part && ls[-1] != '\n') ls--;
        sscanf(ls, "VAR %7s", var[nv++]);
    }
    CHECK_MSG(nv == q->n_answers && nv == 5, "vt: chain of %d variables, %d answers", nv, q->n_answers);
    for (int i = 0; i < nv; i++) CHECK_MSG(has_answer(q, var[i]), "vt: variable %s is not an answer", var[i]);
}

typedef struct {
    char w[48];
    int c;
} wc;

static int cmp_wc(const void *a, const void *b) { return ((const wc *)b)->c - ((const wc *)a)->c; }

static int count_words(const char *text, int numbered, wc *v, int cap) {
    int n = 0;
    const char *p = text;
    while (*p && *p != '\n') {
        while (*p == ' ') p++;
        if (numbered) { /* "12. word" */
            while (*p >= '0' && *p <= '9') p++;
            if (*p == '.') p++;
            while (*p == ' ') p++;
        }
        const char *e = p;
        while (*e && *e != ' ' && *e != '\n') e++;
        if (e == p) break;
        char w[48];
        snprintf(w, sizeof w, "%.*s", (int)(e - p), p);
        int k = 0;
        while (k < n && strcmp(v[k].w, w)) k++;
        if (k == n && n < cap) snprintf(v[n++].w, sizeof v[0].w, "%s", w), v[k].c = 0;
        if (k < n) v[k].c++;
        p = e;
    }
    qsort(v, (size_t)n, sizeof *v, cmp_wc);
    return n;
}

static void check_cwe(const ckv_eval_sample *s) {
    const ckv_eval_question *q = &s->questions[0];
    const char *head = "Memorize the ones that appear most often.\n";
    const char *last = NULL, *p = s->context;
    while ((p = strstr(p, head)) != NULL) last = p, p++;
    CHECK(last != NULL);
    if (!last) return;
    static wc v[20000];
    int n = count_words(last + strlen(head), 1, v, 20000);
    CHECK_MSG(n > 10 && v[9].c > v[10].c, "cwe: %d words, 10th count %d, 11th %d", n, n > 9 ? v[9].c : -1, n > 10 ? v[10].c : -1);
    CHECK(q->n_answers == 10);
    for (int i = 0; i < 10 && i < n; i++) CHECK_MSG(has_answer(q, v[i].w), "cwe: frequent word %s is not an answer", v[i].w);
}

static void check_fwe(const ckv_eval_sample *s) {
    const ckv_eval_question *q = &s->questions[0];
    const char *head = "Find the three most frequently appeared coded words. ";
    const char *t = strstr(s->context, head);
    CHECK(t != NULL);
    if (!t) return;
    static wc v[20000];
    int n = count_words(t + strlen(head), 0, v, 20000);
    int k = 0;
    CHECK(q->n_answers == 3);
    for (int i = 0; i < n && k < 3; i++) {
        if (!strcmp(v[i].w, "...")) continue;
        CHECK_MSG(has_answer(q, v[i].w), "fwe: frequent word %s (x%d) is not an answer", v[i].w, v[i].c);
        k++;
    }
    CHECK(k == 3 && n > 4 && v[3].c > v[4].c);
}

static int same_sample(const ckv_eval_sample *a, const ckv_eval_sample *b) {
    if (strcmp(a->context, b->context) || strcmp(a->id, b->id) || a->n_questions != b->n_questions) return 0;
    const ckv_eval_question *x = &a->questions[0], *y = &b->questions[0];
    if (strcmp(x->question, y->question) || strcmp(x->answer_prefix, y->answer_prefix) || x->n_answers != y->n_answers) return 0;
    for (int i = 0; i < x->n_answers; i++)
        if (strcmp(x->answers[i], y->answers[i])) return 0;
    return 1;
}

static void test_task(const ckv_ruler_task *t, int length, const ckv_haystack *essay) {
    ckv_ruler_params p = {t, length, 42, essay, 0, count_plain, NULL};
    long units = 0;
    CHECK_OK(ckv_ruler_fit(&p, &units));
    int max_new = t->max_new_tokens;
    long budget = length - max_new;
    for (int i = 0; i < 3; i++) {
        ckv_eval_sample s, again;
        long tokens = 0;
        CHECK_OK(ckv_ruler_generate(&p, i, units, &s, &tokens));
        if (!s.context) continue;
        long counted = 0;
        CHECK_OK(count_plain(NULL, &s, &counted));
        CHECK(counted == tokens);
        CHECK_MSG(tokens <= budget && tokens >= budget - budget / 16, "%s @ %d sample %d: %ld prompt tokens, target %ld", t->name,
                  length, i, tokens, budget);
        char id[128];
        ckv_ruler_sample_id(t->name, length, 42, i, id, sizeof id);
        CHECK(!strcmp(s.id, id) && !strcmp(s.task, t->name) && s.length == length && s.n_questions == 1);
        CHECK(s.metric == CKV_METRIC_STRING_MATCH_ALL && s.questions[0].max_new_tokens == max_new);
        CHECK_OK(ckv_ruler_generate(&p, i, units, &again, NULL));
        CHECK_MSG(again.context && same_sample(&s, &again), "%s: sample %d is not deterministic", t->name, i);
        ckv_eval_sample_free(&again);
        ckv_ruler_params p2 = p;
        p2.seed = 43;
        CHECK_OK(ckv_ruler_generate(&p2, i, units, &again, NULL));
        CHECK_MSG(again.context && strcmp(again.context, s.context) != 0, "%s: seeds 42 and 43 give the same sample", t->name);
        ckv_eval_sample_free(&again);
        if (i > 0) {
            CHECK_OK(ckv_ruler_generate(&p, i - 1, units, &again, NULL));
            CHECK_MSG(again.context && strcmp(again.context, s.context) != 0, "%s: samples %d and %d are equal", t->name, i - 1, i);
            ckv_eval_sample_free(&again);
        }
        switch (t->kind) {
        case CKV_RULER_NIAH: check_niah(t, &s); break;
        case CKV_RULER_VT: check_vt(&s); break;
        case CKV_RULER_CWE: check_cwe(&s); break;
        case CKV_RULER_FWE: check_fwe(&s); break;
        }
        ckv_eval_sample_free(&s);
    }
    fprintf(stderr, "ok   %s @ %d tokens: haystack size %ld\n", t->name, length, units);
}

static void test_lists(void) {
    const ckv_ruler_task **v = NULL;
    int n = 0;
    CHECK_OK(ckv_ruler_task_list("niah", &v, &n));
    CHECK(n == 8);
    free(v);
    CHECK_OK(ckv_ruler_task_list("all", &v, &n));
    CHECK(n == 11 && ckv_ruler_task_count() == 11);
    free(v);
    CHECK_OK(ckv_ruler_task_list("vt,cwe,vt,variable_tracking", &v, &n));
    CHECK(n == 2 && !strcmp(v[0]->name, "vt") && !strcmp(v[1]->name, "cwe"));
    free(v);
    CHECK_FAILS(ckv_ruler_task_list("niah_single_9", &v, &n), CKV_STATUS_ERR_ARG, "unknown task 'niah_single_9' (known: niah_single_1");
    CHECK_FAILS(ckv_ruler_task_list("vt,,cwe", &v, &n), CKV_STATUS_ERR_ARG, "empty");
    const ckv_ruler_task *t = NULL;
    CHECK_OK(ckv_ruler_task_find("niah_multikey_3", &t));
    CHECK(t->key_type == CKV_RULER_UUIDS && t->haystack == CKV_RULER_HAY_NEEDLE);
}

static void test_haystack(void) {
    ckv_haystack h;
    CHECK_OK(ckv_haystack_open_builtin(&h));
    CHECK(h.n_words > 50000 && !strncmp(h.text, "The Devil's Dictionary", 22));
    char *w = NULL;
    CHECK_OK(ckv_haystack_take_words(&h, 3, &w));
    CHECK(w && !strcmp(w, "The Devil's Dictionary"));
    free(w);
    CHECK_OK(ckv_haystack_take_words(&h, h.n_words + 2, &w)); /* wraps around */
    CHECK(w && strlen(w) == h.len + 1 + strlen("The Devil's"));
    free(w);
    ckv_haystack_free(&h);
    const char *text = "ABASEMENT, n. A decent attitude. Mr. Smith came! Did he? \"Yes.\" He left at 5 p.m. today. End";
    size_t *st = NULL, n = 0;
    CHECK_OK(ckv_haystack_sentences(text, strlen(text), &st, &n));
    const char *want[] = {"ABASEMENT, n. A decent attitude.", "Mr. Smith came!", "Did he?", "\"Yes.\"", "He left at 5 p.m. today.", "End"};
    CHECK_MSG(n == 6, "%zu sentences", n);
    for (size_t i = 0; i < n && i < 6; i++) {
        size_t e = i + 1 < n ? st[i + 1] - 1 : strlen(text);
        CHECK_MSG(e - st[i] == strlen(want[i]) && !strncmp(text + st[i], want[i], e - st[i]), "sentence %zu: '%.*s'", i,
                  (int)(e - st[i]), text + st[i]);
    }
    free(st);
    CHECK_FAILS(ckv_haystack_open_file(&h, "/nonexistent/haystack.txt"), CKV_STATUS_ERR_IO, "haystack.txt");
}

int main(void) {
    ckv_status s = ckv_tokenizer_load_json(&tok, CKV_FIXTURES "/models/llama_gqa/tokenizer.json");
    if (s != CKV_STATUS_OK) {
        fprintf(stderr, "FAIL loading the fixture tokenizer: %s\n", ckv_error_message());
        return 1;
    }
    test_lists();
    test_haystack();
    ckv_haystack essay;
    CHECK_OK(ckv_haystack_open_builtin(&essay));
    for (int i = 0; i < ckv_ruler_task_count(); i++) {
        const ckv_ruler_task *t = ckv_ruler_task_at(i);
        int length = t->kind == CKV_RULER_VT ? 3000 : 2000;
        test_task(t, length, &essay);
    }
    test_task(ckv_ruler_task_at(9), 6000, &essay); /* cwe's settings from 4096 tokens on */
    /* a length too short names the task and the smallest length */
    const ckv_ruler_task *vt = NULL;
    CHECK_OK(ckv_ruler_task_find("vt", &vt));
    ckv_ruler_params p = {vt, 300, 1, &essay, 0, count_plain, NULL};
    long units = 0;
    CHECK_FAILS(ckv_ruler_fit(&p, &units), CKV_STATUS_ERR_RANGE, "task vt cannot be generated at --length 300");
    ckv_haystack_free(&essay);
    ckv_tokenizer_free(tok);
    return ckv_test_finish("test_eval_tasks");
}
