/* ruler.c - the RULER-style task generators: RULER's templates and parameters (synthetic.yaml), the
 * needle / chain / word-list constructions of its generator scripts, a splitmix64 random stream per
 * sample (so sample i is the same whatever the sample count), and the length fit (largest haystack
 * whose prompt + max_new_tokens fits, measured with the caller's token counter). Known differences
 * from RULER: the word lists and prose come from a public-domain text (haystack.h); needle keys of a
 * sample are distinct, and distractor needles never reuse a real key; vt's in-context example uses a
 * fixed 15 noise sentences. It does not tokenise or score. */
#include "eval/ruler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "eval/strbuf.h"

/* ---- the task table (RULER's synthetic.yaml + constants.py) --------------------------------- */

static const ckv_ruler_task tasks[] = {
    {"niah_single_1", CKV_RULER_NIAH, 128, CKV_RULER_HAY_NOISE, CKV_RULER_WORDS, CKV_RULER_NUMBERS, 1, 1, 1},
    {"niah_single_2", CKV_RULER_NIAH, 128, CKV_RULER_HAY_ESSAY, CKV_RULER_WORDS, CKV_RULER_NUMBERS, 1, 1, 1},
    {"niah_single_3", CKV_RULER_NIAH, 128, CKV_RULER_HAY_ESSAY, CKV_RULER_WORDS, CKV_RULER_UUIDS, 1, 1, 1},
    {"niah_multikey_1", CKV_RULER_NIAH, 128, CKV_RULER_HAY_ESSAY, CKV_RULER_WORDS, CKV_RULER_NUMBERS, 4, 1, 1},
    {"niah_multikey_2", CKV_RULER_NIAH, 128, CKV_RULER_HAY_NEEDLE, CKV_RULER_WORDS, CKV_RULER_NUMBERS, 1, 1, 1},
    {"niah_multikey_3", CKV_RULER_NIAH, 128, CKV_RULER_HAY_NEEDLE, CKV_RULER_UUIDS, CKV_RULER_UUIDS, 1, 1, 1},
    {"niah_multivalue", CKV_RULER_NIAH, 128, CKV_RULER_HAY_ESSAY, CKV_RULER_WORDS, CKV_RULER_NUMBERS, 1, 4, 1},
    {"niah_multiquery", CKV_RULER_NIAH, 128, CKV_RULER_HAY_ESSAY, CKV_RULER_WORDS, CKV_RULER_NUMBERS, 1, 1, 4},
    {"vt", CKV_RULER_VT, 30, CKV_RULER_HAY_NOISE, 0, 0, 0, 0, 0},
    {"cwe", CKV_RULER_CWE, 120, 0, 0, 0, 0, 0, 0},
    {"fwe", CKV_RULER_FWE, 50, 0, 0, 0, 0, 0, 0},
};
#define N_TASKS ((int)(sizeof tasks / sizeof tasks[0]))
#define KNOWN_TASKS                                                                                                   \
    "niah_single_1, niah_single_2, niah_single_3, niah_multikey_1, niah_multikey_2, niah_multikey_3, niah_multivalue, " \
    "niah_multiquery, vt, cwe, fwe; groups: niah, all"

int ckv_ruler_task_count(void) { return N_TASKS; }

const ckv_ruler_task *ckv_ruler_task_at(int i) { return i >= 0 && i < N_TASKS ? &tasks[i] : NULL; }

ckv_status ckv_ruler_task_find(const char *name, const ckv_ruler_task **out) {
    static const char *const alias[][2] = {
        {"variable_tracking", "vt"}, {"common_words_extraction", "cwe"}, {"freq_words_extraction", "fwe"}};
    for (size_t a = 0; a < sizeof alias / sizeof alias[0]; a++)
        if (!strcmp(name, alias[a][0])) name = alias[a][1];
    for (int i = 0; i < N_TASKS; i++)
        if (!strcmp(name, tasks[i].name)) {
            *out = &tasks[i];
            return CKV_STATUS_OK;
        }
    return ckv_error(CKV_STATUS_ERR_ARG, "unknown task '%s' (known: " KNOWN_TASKS ")", name);
}

ckv_status ckv_ruler_task_list(const char *list, const ckv_ruler_task ***out, int *n) {
    *out = NULL;
    *n = 0;
    const ckv_ruler_task **v = malloc(sizeof *v * N_TASKS);
    if (!v) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory listing tasks");
    int cnt = 0;
    const char *p = list;
    for (;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char name[64];
        if (len == 0 || len >= sizeof name) {
            free(v);
            return ckv_error(CKV_STATUS_ERR_ARG, "--task '%s': empty or overlong task name (known: " KNOWN_TASKS ")", list);
        }
        memcpy(name, p, len);
        name[len] = '\0';
        int lo = 0, hi = 0;
        if (!strcmp(name, "all") || !strcmp(name, "ruler")) lo = 0, hi = N_TASKS;
        else if (!strcmp(name, "niah")) lo = 0, hi = 8;
        else {
            const ckv_ruler_task *t = NULL;
            ckv_status s = ckv_ruler_task_find(name, &t);
            if (s != CKV_STATUS_OK) {
                free(v);
                return s;
            }
            lo = (int)(t - tasks), hi = lo + 1;
        }
        for (int i = lo; i < hi; i++) {
            int dup = 0;
            for (int k = 0; k < cnt; k++) dup |= v[k] == &tasks[i];
            if (!dup) v[cnt++] = &tasks[i];
        }
        if (!e) break;
        p = e + 1;
    }
    *out = v;
    *n = cnt;
    return CKV_STATUS_OK;
}

/* ---- random stream ------------------------------------------------------------------------------ */

uint64_t ckv_ruler_mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r) {
    r->s += 0x9E3779B97F4A7C15ull;
    return ckv_ruler_mix(r->s);
}

/* Uniform in [0, n) without modulo bias. */
static uint64_t rng_below(rng *r, uint64_t n) {
    uint64_t lim = UINT64_MAX - UINT64_MAX % n, x;
    do x = rng_next(r);
    while (x >= lim);
    return x % n;
}

static long rng_range(rng *r, long lo, long hi) { return lo + (long)rng_below(r, (uint64_t)(hi - lo + 1)); }

static void shuffle_long(rng *r, long *v, size_t n) {
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rng_below(r, i);
        long t = v[i - 1];
        v[i - 1] = v[j];
        v[j] = t;
    }
}

/* k distinct values of [0, n) (k <= n), by rejection (k is small here). */
static void sample_distinct(rng *r, long n, int k, long *out) {
    for (int i = 0; i < k; i++) {
        long x;
        int dup;
        do {
            x = (long)rng_below(r, (uint64_t)n);
            dup = 0;
            for (int j = 0; j < i; j++) dup |= out[j] == x;
        } while (dup);
        out[i] = x;
    }
}

static int cmp_long(const void *a, const void *b) {
    long x = *(const long *)a, y = *(const long *)b;
    return x < y ? -1 : x > y;
}

static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static rng sample_rng(const ckv_ruler_params *p, int index) {
    uint64_t s = ckv_ruler_mix(p->seed ^ fnv1a(p->task->name));
    s = ckv_ruler_mix(s ^ ((uint64_t)p->length * 0xD1B54A32D192ED03ull));
    s = ckv_ruler_mix(s ^ ((uint64_t)(index + 1) * 0x9E3779B97F4A7C15ull));
    return (rng){s};
}

void ckv_ruler_sample_id(const char *task, int length, uint64_t seed, int index, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%d/%llu/%d", task, length, (unsigned long long)seed, index);
}

/* ---- pieces ----------------------------------------------------------------------------------- */

static int max_new(const ckv_ruler_params *p) { return p->max_new_tokens > 0 ? p->max_new_tokens : p->task->max_new_tokens; }

/* A random key or value of a needle type into buf (>= 40 bytes). */
static void gen_needle_item(rng *r, ckv_ruler_needle_type t, char *buf, size_t cap) {
    if (t == CKV_RULER_NUMBERS) {
        snprintf(buf, cap, "%ld", rng_range(r, 1000000, 9999999));
    } else if (t == CKV_RULER_WORDS) {
        const char *adj = ckv_haystack_adjectives[rng_below(r, (uint64_t)ckv_haystack_adjectives_count)];
        const char *noun = ckv_haystack_nouns[rng_below(r, (uint64_t)ckv_haystack_nouns_count)];
        snprintf(buf, cap, "%s-%s", adj, noun);
    } else { /* a version-4 UUID, as uuid.UUID(int=getrandbits(128), version=4) */
        unsigned char b[16];
        uint64_t x = rng_next(r), y = rng_next(r);
        for (int i = 0; i < 8; i++) b[i] = (unsigned char)(x >> (8 * i)), b[8 + i] = (unsigned char)(y >> (8 * i));
        b[6] = (unsigned char)((b[6] & 0x0F) | 0x40);
        b[8] = (unsigned char)((b[8] & 0x3F) | 0x80);
        snprintf(buf, cap, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2], b[3],
                 b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
    }
}

static const char *needle_type_plural(ckv_ruler_needle_type t) {
    return t == CKV_RULER_NUMBERS ? "numbers" : t == CKV_RULER_WORDS ? "words" : "uuids";
}

static ckv_status finish_sample(const ckv_ruler_params *p, int index, ckv_strbuf *ctx, const char *question,
                                const char *answer_prefix, const char *const *answers, int n_answers,
                                ckv_eval_sample *out) {
    memset(out, 0, sizeof *out);
    CKV_TRY(ckv_strbuf_status(ctx, "a task sample"));
    char id[160];
    ckv_ruler_sample_id(p->task->name, p->length, p->seed, index, id, sizeof id);
    ckv_status s = ckv_eval_strdup(id, &out->id, "a sample id");
    if (s == CKV_STATUS_OK) s = ckv_eval_strdup(p->task->name, &out->task, "a task name");
    if (s == CKV_STATUS_OK) s = ckv_strbuf_take(ctx, &out->context, "a task context");
    if (s == CKV_STATUS_OK)
        s = ckv_eval_sample_add_question(out, question, answer_prefix, answers, n_answers, max_new(p), 0, NULL);
    out->length = p->length;
    out->metric = CKV_METRIC_STRING_MATCH_ALL;
    if (s != CKV_STATUS_OK) ckv_eval_sample_free(out);
    return s;
}

/* ---- needle in a haystack ----------------------------------------------------------------------- */

#define MAX_NEEDLES 64

static ckv_status build_niah(const ckv_ruler_params *p, int index, long units, ckv_eval_sample *out) {
    const ckv_ruler_task *t = p->task;
    rng r = sample_rng(p, index);
    int num_k = t->num_k > t->num_q ? t->num_k : t->num_q, num_v = t->num_v, n_needles = num_k * num_v;
    if (n_needles > MAX_NEEDLES) return ckv_error(CKV_STATUS_ERR_ARG, "%s: too many needles", t->name);
    char keys[MAX_NEEDLES][48], values[MAX_NEEDLES][48], needles[MAX_NEEDLES][160];
    const char *plural = needle_type_plural(t->value_type);
    for (int k = 0; k < num_k; k++) {
        int dup;
        do {
            gen_needle_item(&r, t->key_type, keys[k], sizeof keys[k]);
            dup = 0;
            for (int j = 0; j < k; j++) dup |= !strcmp(keys[j], keys[k]);
        } while (dup);
        for (int v = 0; v < num_v; v++) {
            gen_needle_item(&r, t->value_type, values[k * num_v + v], sizeof values[0]);
            snprintf(needles[k * num_v + v], sizeof needles[0], "One of the special magic %s for %s is: %s.", plural,
                     keys[k], values[k * num_v + v]);
        }
    }
    int order[MAX_NEEDLES];
    {
        long perm[MAX_NEEDLES];
        for (int i = 0; i < n_needles; i++) perm[i] = i;
        shuffle_long(&r, perm, (size_t)n_needles);
        for (int i = 0; i < n_needles; i++) order[i] = (int)perm[i];
    }
    ckv_strbuf hay;
    ckv_strbuf_init(&hay);
    ckv_status st = CKV_STATUS_OK;
    if (t->haystack == CKV_RULER_HAY_ESSAY) {
        if (!p->essay) return ckv_error(CKV_STATUS_ERR_ARG, "%s needs an essay haystack", t->name);
        char *text = NULL;
        size_t *starts = NULL, ns = 0;
        CKV_TRY(ckv_haystack_take_words(p->essay, (size_t)units, &text));
        st = ckv_haystack_sentences(text, strlen(text), &starts, &ns);
        if (st != CKV_STATUS_OK) {
            free(text);
            return st;
        }
        /* RULER's DEPTHS: round(linspace(0, 100, 40)); insertion points int(n_sentences * depth / 100) */
        long depth_idx[MAX_NEEDLES], pos[MAX_NEEDLES + 2];
        sample_distinct(&r, 40, n_needles, depth_idx);
        pos[0] = 0;
        for (int i = 0; i < n_needles; i++) {
            double depth = nearbyint(100.0 * (double)depth_idx[i] / 39.0);
            pos[1 + i] = (long)((double)ns * (depth / 100.0));
        }
        qsort(pos + 1, (size_t)n_needles, sizeof(long), cmp_long);
        pos[n_needles + 1] = (long)ns;
        size_t tlen = strlen(text);
        for (int i = 1; i <= n_needles + 1; i++) {
            if (i > 1) ckv_strbuf_addc(&hay, ' ');
            if (pos[i] > pos[i - 1]) { /* sentences pos[i-1] .. pos[i]-1 as they stand in the text */
                size_t a = starts[pos[i - 1]], b = pos[i] < (long)ns ? starts[pos[i]] - 1 : tlen;
                ckv_strbuf_add(&hay, text + a, b - a);
            }
            if (i - 1 < n_needles) {
                ckv_strbuf_addc(&hay, ' ');
                ckv_strbuf_adds(&hay, needles[order[i - 1]]);
            }
        }
        free(starts);
        free(text);
    } else {
        if (units < n_needles) return ckv_error(CKV_STATUS_ERR_ARG, "%s: %ld haystack sentences for %d needles", t->name, units, n_needles);
        long at[MAX_NEEDLES];
        sample_distinct(&r, units, n_needles, at);
        qsort(at, (size_t)n_needles, sizeof(long), cmp_long); /* needle order[n-1-i] goes before sentence at[i] */
        int next = 0;
        for (long s = 0; s < units; s++) {
            if (next < n_needles && at[next] == s) {
                if (hay.len) ckv_strbuf_addc(&hay, '\n');
                ckv_strbuf_adds(&hay, needles[order[n_needles - 1 - next]]);
                next++;
            }
            if (hay.len) ckv_strbuf_addc(&hay, '\n');
            if (t->haystack == CKV_RULER_HAY_NOISE) {
                ckv_strbuf_adds(&hay, CKV_HAYSTACK_NOISE);
            } else { /* a distractor needle with a key that is none of the real ones */
                char k[48], v[48];
                int dup;
                do {
                    gen_needle_item(&r, t->key_type, k, sizeof k);
                    dup = 0;
                    for (int j = 0; j < num_k; j++) dup |= !strcmp(keys[j], k);
                } while (dup);
                gen_needle_item(&r, t->value_type, v, sizeof v);
                ckv_strbuf_printf(&hay, "One of the special magic %s for %s is: %s.", plural, k, v);
            }
        }
    }
    /* the query: num_q keys, their values are the answers */
    long qi[MAX_NEEDLES];
    sample_distinct(&r, num_k, t->num_q, qi);
    char query[MAX_NEEDLES * 50] = "";
    const char *answers[MAX_NEEDLES];
    int n_answers = 0;
    for (int i = 0; i < t->num_q; i++) {
        size_t ql = strlen(query);
        if (i > 0) snprintf(query + ql, sizeof query - ql, "%s", i == t->num_q - 1 ? ", and " : ", ");
        ql = strlen(query);
        snprintf(query + ql, sizeof query - ql, "%s", keys[qi[i]]);
        for (int v = 0; v < num_v; v++) answers[n_answers++] = values[qi[i] * num_v + v];
    }
    int single = t->num_q * t->num_v == 1;
    const char *tv = single ? (t->value_type == CKV_RULER_NUMBERS ? "number" : t->value_type == CKV_RULER_WORDS ? "word" : "uuid")
                            : plural;
    ckv_strbuf ctx;
    ckv_strbuf_init(&ctx);
    if (single)
        ckv_strbuf_printf(&ctx, "A special magic %s is hidden within the following text. Make sure to memorize it. I will quiz "
                          "you about the %s afterwards.\n", tv, tv);
    else
        ckv_strbuf_printf(&ctx, "Some special magic %s are hidden within the following text. Make sure to memorize it. I will "
                          "quiz you about the %s afterwards.\n", tv, tv);
    ckv_strbuf_add(&ctx, hay.s ? hay.s : "", hay.len);
    ckv_strbuf_addc(&ctx, '\n');
    ckv_strbuf_free(&hay);
    char question[MAX_NEEDLES * 50 + 200], prefix[MAX_NEEDLES * 50 + 200];
    snprintf(question, sizeof question, "What %s the special magic %s for %s mentioned in the provided text? ",
             single ? "is" : "are all", tv, query);
    snprintf(prefix, sizeof prefix, "The special magic %s for %s mentioned in the provided text %s", tv, query,
             single ? "is" : "are");
    st = finish_sample(p, index, &ctx, question, prefix, answers, n_answers, out);
    ckv_strbuf_free(&ctx);
    return st;
}

/* ---- variable tracking --------------------------------------------------------------------------- */

#define VT_HOPS 4
#define VT_ICL_NOISE 15

static const char vt_head[] = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";

/* One chain of VT_HOPS + 1 variables of `letters` upper-case letters hidden among `units` noise
 * sentences: appends the context to b, the names to names[], the value to *value. */
static void vt_chain(rng *r, long units, int letters, ckv_strbuf *b, char names[VT_HOPS + 1][8], long *value) {
    for (int i = 0; i <= VT_HOPS; i++) {
        int dup;
        do {
            for (int c = 0; c < letters; c++) names[i][c] = (char)('A' + rng_below(r, 26));
            names[i][letters] = '\0';
            dup = 0;
            for (int j = 0; j < i; j++) dup |= !strcmp(names[i], names[j]);
        } while (dup);
    }
    *value = rng_range(r, 10000, 99998);
    long at[VT_HOPS + 1];
    sample_distinct(r, units, VT_HOPS + 1, at);
    qsort(at, VT_HOPS + 1, sizeof(long), cmp_long);
    int next = 0;
    for (long s = 0; s < units + VT_HOPS + 1; s++) {
        if (s) ckv_strbuf_addc(b, '\n');
        if (next <= VT_HOPS && at[next] + next == s) { /* sentences.insert(at[j] + j, chain[j]) */
            if (next == 0) ckv_strbuf_printf(b, "VAR %s = %ld", names[0], *value);
            else ckv_strbuf_printf(b, "VAR %s = VAR %s ", names[next], names[next - 1]);
            next++;
        } else {
            ckv_strbuf_adds(b, CKV_HAYSTACK_NOISE);
        }
    }
}

static ckv_status build_vt(const ckv_ruler_params *p, int index, long units, ckv_eval_sample *out) {
    if (units < VT_HOPS + 1) return ckv_error(CKV_STATUS_ERR_ARG, "vt: %ld noise sentences is too few", units);
    rng r = sample_rng(p, index);
    ckv_strbuf ctx;
    ckv_strbuf_init(&ctx);
    char names[VT_HOPS + 1][8];
    long value;
    /* the in-context example: 3-letter variables, the full prompt and its answer */
    ckv_strbuf_adds(&ctx, vt_head);
    vt_chain(&r, VT_ICL_NOISE, 3, &ctx, names, &value);
    ckv_strbuf_printf(&ctx, "\nQuestion: Find all variables that are assigned the value %ld in the text above. Answer: "
                      "According to the chain(s) of variable assignment in the text above, %d variables are assigned the "
                      "value %ld, they are:  ", value, VT_HOPS + 1, value);
    for (int i = 0; i <= VT_HOPS; i++) ckv_strbuf_printf(&ctx, i ? " %s" : "%s", names[i]);
    ckv_strbuf_adds(&ctx, "\n\n");
    ckv_strbuf_adds(&ctx, vt_head);
    vt_chain(&r, units, 5, &ctx, names, &value);
    ckv_strbuf_addc(&ctx, '\n');
    char question[200], prefix[300];
    snprintf(question, sizeof question, "Question: Find all variables that are assigned the value %ld in the text above. ", value);
    snprintf(prefix, sizeof prefix, "Answer: According to the chain(s) of variable assignment in the text above, %d variables "
             "are assigned the value %ld, they are: ", VT_HOPS + 1, value);
    const char *answers[VT_HOPS + 1];
    for (int i = 0; i <= VT_HOPS; i++) answers[i] = names[i];
    ckv_status st = finish_sample(p, index, &ctx, question, prefix, answers, VT_HOPS + 1, out);
    ckv_strbuf_free(&ctx);
    return st;
}

/* ---- common words extraction -------------------------------------------------------------------- */

#define CWE_NUM 10

static int cmp_str(const void *a, const void *b) { return strcmp(*(const char *const *)a, *(const char *const *)b); }

/* nouns + adjectives + verbs, sorted, duplicates dropped (malloc'd array of borrowed strings). */
static ckv_status cwe_pool(const char ***out, long *n) {
    long total = ckv_haystack_nouns_count + ckv_haystack_adjectives_count + ckv_haystack_verbs_count, k = 0;
    const char **v = malloc(sizeof *v * (size_t)total);
    if (!v) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building the word list");
    for (int i = 0; i < ckv_haystack_nouns_count; i++) v[k++] = ckv_haystack_nouns[i];
    for (int i = 0; i < ckv_haystack_adjectives_count; i++) v[k++] = ckv_haystack_adjectives[i];
    for (int i = 0; i < ckv_haystack_verbs_count; i++) v[k++] = ckv_haystack_verbs[i];
    qsort(v, (size_t)k, sizeof *v, cmp_str);
    long u = 0;
    for (long i = 0; i < k; i++)
        if (u == 0 || strcmp(v[u - 1], v[i])) v[u++] = v[i];
    *out = v;
    *n = u;
    return CKV_STATUS_OK;
}

/* RULER's get_example: num_words distinct words, the first CWE_NUM repeated `common` times, the rest
 * `uncommon` times, shuffled, as "1. w 2. w ..."; answers[] gets the common words. */
static ckv_status cwe_example(rng *r, const char *const *pool, long pool_n, long num_words, int common, int uncommon,
                              ckv_strbuf *b, const char **answers) {
    long *idx = malloc(sizeof(long) * (size_t)pool_n);
    long total = CWE_NUM * (long)common + (num_words - CWE_NUM) * (long)uncommon;
    long *list = malloc(sizeof(long) * (size_t)(total > 0 ? total : 1));
    if (!idx || !list) {
        free(idx);
        free(list);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building a word list");
    }
    for (long i = 0; i < pool_n; i++) idx[i] = i;
    for (long i = 0; i < num_words; i++) { /* partial Fisher-Yates: idx[0..num_words) is a random sample */
        long j = i + (long)rng_below(r, (uint64_t)(pool_n - i));
        long t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
    long k = 0;
    for (long i = 0; i < num_words; i++)
        for (int c = 0; c < (i < CWE_NUM ? common : uncommon); c++) list[k++] = idx[i];
    shuffle_long(r, list, (size_t)k);
    for (long i = 0; i < k; i++) ckv_strbuf_printf(b, i ? " %ld. %s" : "%ld. %s", i + 1, pool[list[i]]);
    for (int i = 0; i < CWE_NUM; i++) answers[i] = pool[idx[i]];
    free(idx);
    free(list);
    return CKV_STATUS_OK;
}

static const char cwe_head[] = "Below is a numbered list of words. In these words, some appear more often than others. "
                               "Memorize the ones that appear most often.\n";
static const char cwe_question[] = "Question: What are the 10 most common words in the above list? ";
static const char cwe_prefix[] = "Answer: The top 10 words that appear most often in the list are:";

static ckv_status build_cwe(const ckv_ruler_params *p, int index, long units, ckv_eval_sample *out) {
    if (units <= CWE_NUM) return ckv_error(CKV_STATUS_ERR_ARG, "cwe: %ld words is too few", units);
    const char **pool = NULL;
    long pool_n = 0;
    CKV_TRY(cwe_pool(&pool, &pool_n));
    rng r = sample_rng(p, index);
    int shortp = p->length < 4096; /* RULER's settings below 4096 tokens */
    ckv_strbuf ctx;
    ckv_strbuf_init(&ctx);
    const char *shot_answers[CWE_NUM], *answers[CWE_NUM];
    ckv_status st = CKV_STATUS_OK;
    /* one in-context example (the full prompt and its answer) */
    ckv_strbuf_adds(&ctx, cwe_head);
    st = cwe_example(&r, pool, pool_n, shortp ? 20 : 40, shortp ? 3 : 10, shortp ? 1 : 3, &ctx, shot_answers);
    if (st == CKV_STATUS_OK) {
        ckv_strbuf_printf(&ctx, "\n%s%s", cwe_question, cwe_prefix);
        for (int i = 0; i < CWE_NUM; i++) ckv_strbuf_printf(&ctx, " %d. %s", i + 1, shot_answers[i]);
        ckv_strbuf_addc(&ctx, '\n');
        ckv_strbuf_adds(&ctx, cwe_head);
        const char *const *src = pool;
        long src_n = pool_n;
        if (units > pool_n) { /* RULER switches to a larger English word list */
            src = ckv_haystack_vocabulary;
            src_n = ckv_haystack_vocabulary_count;
        }
        if (units > src_n)
            st = ckv_error(CKV_STATUS_ERR_RANGE, "cwe: %ld distinct words requested, the word list has %ld", units, src_n);
        else
            st = cwe_example(&r, src, src_n, units, shortp ? 6 : 30, shortp ? 1 : 3, &ctx, answers);
    }
    if (st == CKV_STATUS_OK) {
        ckv_strbuf_addc(&ctx, '\n');
        st = finish_sample(p, index, &ctx, cwe_question, cwe_prefix, answers, CWE_NUM, out);
    }
    ckv_strbuf_free(&ctx);
    free(pool);
    return st;
}

/* ---- frequent words extraction ------------------------------------------------------------------ */

static ckv_status build_fwe(const ckv_ruler_params *p, int index, long units, ckv_eval_sample *out) {
    rng r = sample_rng(p, index);
    long vocab_n = (p->length - max_new(p)) / 50;
    if (vocab_n < 10) vocab_n = 10;
    const int wl = 6;
    char *vocab = malloc((size_t)vocab_n * (wl + 1));
    long *order = malloc(sizeof(long) * (size_t)vocab_n);
    ckv_strbuf ctx;
    ckv_strbuf_init(&ctx);
    long *list = NULL;
    ckv_status st = CKV_STATUS_OK;
    if (!vocab || !order) {
        st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building fwe's vocabulary");
        goto done;
    }
    /* vocab_n distinct random 6-letter words, in random order; the first one becomes the noise "..." */
    for (long i = 0; i < vocab_n; i++) {
        char *w = vocab + (size_t)i * (wl + 1);
        int dup;
        do {
            for (int c = 0; c < wl; c++) w[c] = (char)('a' + rng_below(&r, 26));
            w[wl] = '\0';
            dup = 0;
            for (long j = 0; j < i && !dup; j++) dup = !memcmp(vocab + (size_t)j * (wl + 1), w, wl);
        } while (dup);
        order[i] = i;
    }
    shuffle_long(&r, order, (size_t)vocab_n);
    const double pi = 3.14159265358979323846, zeta2 = pi * pi / 6.0;
    long total = 0;
    for (long k = 1; k <= vocab_n; k++) total += (long)((double)units * pow((double)k, -2.0) / zeta2);
    list = malloc(sizeof(long) * (size_t)(total > 0 ? total : 1));
    if (!list) {
        st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building fwe's text");
        goto done;
    }
    long n = 0;
    for (long k = 1; k <= vocab_n; k++) {
        long c = (long)((double)units * pow((double)k, -2.0) / zeta2);
        for (long i = 0; i < c; i++) list[n++] = k - 1;
    }
    shuffle_long(&r, list, (size_t)n);
    ckv_strbuf_adds(&ctx, "Read the following coded text and track the frequency of each coded word. Find the three most "
                          "frequently appeared coded words. ");
    for (long i = 0; i < n; i++) {
        if (i) ckv_strbuf_addc(&ctx, ' ');
        if (list[i] == 0) ckv_strbuf_adds(&ctx, "...");
        else ckv_strbuf_add(&ctx, vocab + (size_t)order[list[i]] * (wl + 1), (size_t)wl);
    }
    ckv_strbuf_addc(&ctx, '\n');
    const char *answers[3];
    for (int i = 0; i < 3; i++) answers[i] = vocab + (size_t)order[i + 1] * (wl + 1);
    st = finish_sample(p, index, &ctx,
                       "Question: Do not provide any explanation. Please ignore the dots '....'. What are the three most "
                       "frequently appeared words in the above coded text? ",
                       "Answer: According to the coded text above, the three most frequently appeared words are:", answers,
                       3, out);
done:
    ckv_strbuf_free(&ctx);
    free(vocab);
    free(order);
    free(list);
    return st;
}

/* ---- build, fit, generate -------------------------------------------------------------------------- */

ckv_status ckv_ruler_build(const ckv_ruler_params *p, int index, long units, ckv_eval_sample *out) {
    memset(out, 0, sizeof *out);
    if (!p->task) return ckv_error(CKV_STATUS_ERR_ARG, "no task given");
    switch (p->task->kind) {
    case CKV_RULER_NIAH: return build_niah(p, index, units, out);
    case CKV_RULER_VT: return build_vt(p, index, units, out);
    case CKV_RULER_CWE: return build_cwe(p, index, units, out);
    case CKV_RULER_FWE: return build_fwe(p, index, units, out);
    }
    return ckv_error(CKV_STATUS_ERR_ARG, "unknown task kind");
}

static long min_units(const ckv_ruler_task *t) {
    switch (t->kind) {
    case CKV_RULER_NIAH:
        if (t->haystack == CKV_RULER_HAY_ESSAY) return 20;
        return (t->num_k > t->num_q ? t->num_k : t->num_q) * t->num_v > 5 ? (t->num_k > t->num_q ? t->num_k : t->num_q) * t->num_v : 5;
    case CKV_RULER_VT: return VT_HOPS + 1;
    case CKV_RULER_CWE: return CWE_NUM + 1;
    case CKV_RULER_FWE: return 100;
    }
    return 1;
}

static long max_units(const ckv_ruler_task *t) {
    return t->kind == CKV_RULER_CWE ? (long)ckv_haystack_vocabulary_count : 50L * 1000 * 1000;
}

/* Tokens of sample `index` built with `units` (prompt only). */
static ckv_status measure(const ckv_ruler_params *p, int index, long units, long *tokens) {
    ckv_eval_sample s;
    CKV_TRY(ckv_ruler_build(p, index, units, &s));
    ckv_status st = p->count(p->count_ctx, &s, tokens);
    ckv_eval_sample_free(&s);
    return st;
}

ckv_status ckv_ruler_fit(const ckv_ruler_params *p, long *units) {
    *units = 0;
    if (!p->count) return ckv_error(CKV_STATUS_ERR_ARG, "no token counter given");
    long budget = (long)p->length - max_new(p);
    long lo = min_units(p->task), cap = max_units(p->task), t_lo = 0;
    CKV_TRY(measure(p, 0, lo, &t_lo));
    if (t_lo > budget)
        return ckv_error(CKV_STATUS_ERR_RANGE, "task %s cannot be generated at --length %d: its smallest prompt has %ld tokens "
                         "and it generates up to %d (use --length %ld or more)", p->task->name, p->length, t_lo, max_new(p),
                         t_lo + max_new(p));
    /* a linear estimate from two sizes, then a bracket around it, then bisection to 0.4% */
    long probe = lo + 256 < cap ? lo + 256 : cap, t_probe = 0;
    CKV_TRY(measure(p, 0, probe, &t_probe));
    if (t_probe <= budget && probe == cap) {
        *units = cap;
        return CKV_STATUS_OK;
    }
    double rate = t_probe > t_lo ? (double)(t_probe - t_lo) / (double)(probe - lo) : 1.0;
    long est = lo + (long)((double)(budget - t_lo) / rate);
    if (t_probe <= budget) lo = probe;
    long hi = est + est / 16 + 8;
    if (hi > cap + 1) hi = cap + 1;
    if (hi <= lo) hi = lo + 1;
    for (;;) { /* hi must not fit */
        if (hi > cap) break;
        long t = 0;
        CKV_TRY(measure(p, 0, hi, &t));
        if (t > budget) break;
        lo = hi;
        hi = hi + hi / 2 + 8;
        if (hi > cap + 1) hi = cap + 1;
    }
    long mid0 = est - est / 16;
    if (mid0 > lo && mid0 < hi) { /* tighten from below */
        long t = 0;
        CKV_TRY(measure(p, 0, mid0, &t));
        if (t <= budget) lo = mid0;
        else hi = mid0;
    }
    while (hi - lo > 1 && hi - lo > lo / 256) {
        long mid = lo + (hi - lo) / 2, t = 0;
        CKV_TRY(measure(p, 0, mid, &t));
        if (t <= budget) lo = mid;
        else hi = mid;
    }
    *units = lo;
    return CKV_STATUS_OK;
}

ckv_status ckv_ruler_generate(const ckv_ruler_params *p, int index, long fitted_units, ckv_eval_sample *out,
                              long *tokens) {
    long budget = (long)p->length - max_new(p), units = fitted_units, lo = min_units(p->task);
    for (;;) {
        CKV_TRY(ckv_ruler_build(p, index, units, out));
        long t = 0;
        ckv_status st = p->count(p->count_ctx, out, &t);
        if (st != CKV_STATUS_OK) {
            ckv_eval_sample_free(out);
            return st;
        }
        if (t <= budget) {
            if (tokens) *tokens = t;
            return CKV_STATUS_OK;
        }
        ckv_eval_sample_free(out);
        if (units <= lo)
            return ckv_error(CKV_STATUS_ERR_RANGE, "%s sample %d does not fit --length %d even at its smallest", p->task->name,
                             index, p->length);
        units -= units / 100 > 1 ? units / 100 : 1;
        if (units < lo) units = lo;
    }
}
