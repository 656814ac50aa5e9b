/* test_eval_metrics.c - the eval metrics against values computed by hand and by the benchmarks' own
 * definitions (LongBench's metrics.py with the `rouge` 1.0.1 and fuzzywuzzy/difflib packages it uses,
 * RULER's string match): SQuAD-style normalisation (case, punctuation, articles, whitespace,
 * Unicode lower case), token F1 with repeated tokens, ROUGE-L's sentence split and distinct-word
 * counting, edit similarity's first-line rule, difflib's autojunk and Python's half-to-even
 * rounding, LongBench's classification quirk, retrieval/count digit runs, RULER's clean-up, the task
 * table and the error paths. */
#include <stdlib.h>
#include <string.h>

#include "ckv_test.h"
#include "core/status.h"
#include "eval/metrics.h"

#define NEAR(a, b) (fabs((a) - (b)) <= 1e-9)

static void check_f1(const char *p, const char *g, double want) {
    double v = -1;
    CHECK_OK(ckv_metric_qa_f1(p, g, &v));
    CHECK_MSG(NEAR(v, want), "qa_f1('%s', '%s') = %.12g, want %.12g", p, g, v, want);
}

static void check_rouge(const char *p, const char *g, double want) {
    double v = -1;
    CHECK_OK(ckv_metric_rouge_l(p, g, &v));
    CHECK_MSG(NEAR(v, want), "rouge_l('%s', '%s') = %.12g, want %.12g", p, g, v, want);
}

static void check_code(const char *p, const char *g, double want) {
    double v = -1;
    CHECK_OK(ckv_metric_code_sim(p, g, &v));
    CHECK_MSG(NEAR(v, want), "code_sim('%.30s', '%.30s') = %.12g, want %.12g", p, g, v, want);
}

static void test_normalize(void) {
    static const char *const cases[][2] = {
        {"The  Quick, brown fox!", "quick brown fox"},
        {"a banana an", "banana"},         /* articles only as whole words */
        {"the_end the", "theend"},         /* '_' is punctuation: removed before the articles */
        {"  An\tApple\n", "apple"},
        {"\xc3\x84rger \xc3\xbc" "ber", "\xc3\xa4rger \xc3\xbc" "ber"}, /* Ärger über -> ärger über */
        {"...", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        CHECK_OK(ckv_metric_normalize_answer(cases[i][0], &out));
        CHECK_MSG(out && !strcmp(out, cases[i][1]), "normalize('%s') = '%s', want '%s'", cases[i][0], out ? out : "(null)",
                  cases[i][1]);
        free(out);
    }
}

static void test_qa_f1(void) {
    check_f1("The Eiffel Tower, Paris.", "eiffel tower", 0.8); /* p = 2/3, r = 1 */
    check_f1("an apple a day", "Apple", 2.0 / 3.0);
    check_f1("the theater", "theater", 1.0);
    check_f1("", "x", 0.0);
    check_f1("U.S.A.", "usa", 1.0);
    check_f1("\xc3\x84rger \xc3\xbc" "ber", "\xc3\xa4rger", 2.0 / 3.0); /* Unicode lower case */
    check_f1("a b b b", "b b c", 2.0 / 3.0);                        /* Counter &: min(3, 2) = 2 common */
}

static void test_rouge(void) {
    /* values of rouge 1.0.1 Rouge().get_scores([p], [g], avg=True)["rouge-l"]["f"] */
    check_rouge("the cat sat on the mat", "the cat is on the mat", 0.7999999950000002);
    check_rouge("The cat sat. The dog ran.", "A cat sat. The dog walked.", 0.7272727223140496);
    check_rouge("", "a b", 0.0);   /* the package raises on an empty hypothesis: LongBench scores 0 */
    check_rouge("...", "a b", 0.0); /* only empty pieces */
    check_rouge("a .  . b", "a b", 0.7999999952000001); /* a whitespace piece is an empty sentence */
    check_rouge("the the the cat", "the cat the", 0.4999999950000001); /* distinct-word counts */
    check_rouge("Police killed the gunman. The gunman was armed.", "The gunman was shot dead by police. He was armed.",
                0.4999999950781251);
    check_rouge("x y z", "a b c", 0.0);
}

static void test_code_sim(void) {
    check_code("```python\n# comment\nx = foo(1)\n", "x = foo(2)", 0.9); /* first line without ` # // */
    check_code("\n\nreturn a + b", "return a+b", 0.91);
    check_code("# only comments\n// and this", "x", 0.0);
    check_code("same", "same", 1.0);
    check_code("", "", 1.0); /* fuzz.ratio: equal strings first */
    check_code("abcdefgh", "abcdexyz", 0.62); /* round(62.5) = 62: halves to even */
    check_code("abcdefgh", "abcdefgz", 0.88); /* round(87.5) = 88 */
    /* > 200 characters: difflib's autojunk treats characters over 1% + 1 as popular */
    const char *lp1 = "    for (int j = 0; j < n; j++) { sum += values[j] * weights[j]; if (sum >= limit) break; } return sum;  ";
    const char *lp2 = "-- weighted sum with an early exit at the limit";
    const char *lg = "for (int i = 0; i < n; i++) { total += values[i] * weights[i]; if (total > limit) { break; } } return total; "
                     "// sum of weighted values, stops at the limit ";
    char pred[1024], gt[1024];
    snprintf(pred, sizeof pred, "%s%s%s%s", lp1, lp2, lp1, lp2);
    snprintf(gt, sizeof gt, "%s    %s", lg, lg);
    gt[strlen(gt) - 1] = '\0'; /* .strip() */
    check_code(pred, gt, 0.29);
    double r = 0;
    CHECK_OK(ckv_metric_sequence_ratio(pred, gt, &r));
    CHECK_MSG(NEAR(r, 0.2852512155591572), "sequence ratio %.16g", r);
    snprintf(pred, sizeof pred, "%s// weighted sum with an early exit at the limit%s// weighted sum with an early exit at the limit",
             lp1, lp1);
    CHECK_OK(ckv_metric_sequence_ratio(pred, gt, &r));
    CHECK_MSG(NEAR(r, 0.3857374392220421), "sequence ratio %.16g", r);
    CHECK_OK(ckv_metric_sequence_ratio("abcd", "bcde", &r));
    CHECK(NEAR(r, 0.75));
    CHECK_OK(ckv_metric_sequence_ratio("", "", &r));
    CHECK(NEAR(r, 1.0));
}

static void test_classification(void) {
    const char *trec[] = {"Human", "Location", "Number", "Entity", "Description", "Abbreviation"};
    double v = -1;
    CHECK_OK(ckv_metric_classification("Location or Human", "Location", trec, 6, &v));
    CHECK(NEAR(v, 0.5));
    CHECK_OK(ckv_metric_classification("Number", "Location", trec, 6, &v));
    CHECK(NEAR(v, 0.0));
    /* removing while iterating skips the element after each removal: ["a", "ab", "abc"] -> ["ab", "abc"] */
    const char *nested[] = {"a", "ab", "abc"};
    CHECK_OK(ckv_metric_classification("abc", "abc", nested, 3, &v));
    CHECK_MSG(NEAR(v, 0.5), "classification quirk: %g", v);
}

static void test_retrieval_count(void) {
    double v = -1;
    CHECK_OK(ckv_metric_retrieval("Paragraph 3 and Paragraph 12", "Paragraph 12", 0, &v));
    CHECK(NEAR(v, 0.5));
    CHECK_OK(ckv_metric_retrieval("The answer is: Paragraph 12", "Paragraph 12", 0, &v));
    CHECK(NEAR(v, 1.0));
    CHECK_OK(ckv_metric_retrieval("no digits", "Paragraph 12", 0, &v));
    CHECK(NEAR(v, 0.0));
    CHECK_OK(ckv_metric_retrieval("\xe6\xae\xb5\xe8\x90\xbd" "7", "\xe6\xae\xb5\xe8\x90\xbd" "7", 1, &v)); /* 段落7 */
    CHECK(NEAR(v, 1.0));
    CHECK_FAILS(ckv_metric_retrieval("3", "the third", 0, &v), CKV_STATUS_ERR_FORMAT, "does not name a paragraph");
    CHECK_OK(ckv_metric_passage_count("There are 5 unique paragraphs, 5", "5", &v));
    CHECK(NEAR(v, 1.0));
    CHECK_OK(ckv_metric_passage_count("I think 4 or 5", "5", &v));
    CHECK(NEAR(v, 0.5));
    CHECK_OK(ckv_metric_passage_count("15 paragraphs", "5", &v)); /* whole digit runs */
    CHECK(NEAR(v, 0.0));
}

static void test_string_match(void) {
    const char *refs[] = {"123", "789"};
    double v = -1;
    CHECK_OK(ckv_metric_string_match("  The numbers are 123 and 456\x01 ", refs, 2, 1, &v));
    CHECK(NEAR(v, 0.5));
    CHECK_OK(ckv_metric_string_match("  The numbers are 123 and 456\x01 ", refs, 2, 0, &v));
    CHECK(NEAR(v, 1.0));
    const char *up[] = {"Sad-Apple", "ABC"};
    CHECK_OK(ckv_metric_string_match("xxsad-applexx and abc", up, 2, 1, &v)); /* case-insensitive */
    CHECK(NEAR(v, 1.0));
    /* control characters become newlines: a reference spanning one is not found */
    const char *span[] = {"12 34"};
    CHECK_OK(ckv_metric_string_match("12\x02" "34", span, 1, 1, &v));
    CHECK(NEAR(v, 0.0));
    CHECK_FAILS(ckv_metric_string_match("x", refs, 0, 1, &v), CKV_STATUS_ERR_ARG, "no reference answers");
}

static void test_score_dispatch(void) {
    const char *answers[] = {"Paris", "the city of Paris"};
    double v = -1;
    CHECK_OK(ckv_metric_score(CKV_METRIC_QA_F1, 0, "Paris, France", answers, 2, NULL, 0, &v));
    CHECK(NEAR(v, 2.0 / 3.0)); /* the best reference: "paris" */
    CHECK_OK(ckv_metric_score(CKV_METRIC_QA_F1, 1, "\n\nParis\nsecond line France", answers, 2, NULL, 0, &v));
    CHECK(NEAR(v, 1.0)); /* first line only */
    CHECK_FAILS(ckv_metric_score(CKV_METRIC_QA_F1, 0, "x", answers, 0, NULL, 0, &v), CKV_STATUS_ERR_ARG, "no reference answers");
    const char *ruler[] = {"1234567"};
    CHECK_OK(ckv_metric_score(CKV_METRIC_STRING_MATCH_ALL, 0, " 1234567.", ruler, 1, NULL, 0, &v));
    CHECK(NEAR(v, 1.0));
}

static void test_names(void) {
    ckv_metric_kind k;
    int fl = -1;
    CHECK_OK(ckv_metric_for_task("hotpotqa", &k, &fl));
    CHECK(k == CKV_METRIC_QA_F1 && fl == 0);
    CHECK_OK(ckv_metric_for_task("triviaqa_e", &k, &fl));
    CHECK(k == CKV_METRIC_QA_F1 && fl == 1);
    CHECK_OK(ckv_metric_for_task("gov_report", &k, &fl));
    CHECK(k == CKV_METRIC_ROUGE_L);
    CHECK_OK(ckv_metric_for_task("trec", &k, &fl));
    CHECK(k == CKV_METRIC_CLASSIFICATION && fl == 1);
    CHECK_OK(ckv_metric_for_task("lcc", &k, &fl));
    CHECK(k == CKV_METRIC_CODE_SIM);
    CHECK_OK(ckv_metric_for_task("passage_count", &k, &fl));
    CHECK(k == CKV_METRIC_PASSAGE_COUNT);
    CHECK_OK(ckv_metric_for_task("niah_multikey_2", &k, &fl));
    CHECK(k == CKV_METRIC_STRING_MATCH_ALL);
    CHECK_OK(ckv_metric_for_task("qa_1", &k, &fl));
    CHECK(k == CKV_METRIC_STRING_MATCH_PART);
    CHECK_FAILS(ckv_metric_for_task("dureader", &k, &fl), CKV_STATUS_ERR_UNSUPPORTED, "jieba");
    CHECK_FAILS(ckv_metric_for_task("mystery", &k, &fl), CKV_STATUS_ERR_ARG, "task 'mystery' has no known metric");
    CHECK_OK(ckv_metric_by_name("edit_sim", &k));
    CHECK(k == CKV_METRIC_CODE_SIM);
    CHECK_FAILS(ckv_metric_by_name("bleu", &k), CKV_STATUS_ERR_ARG, "unknown metric 'bleu'");
    for (int i = 0; i < CKV_METRIC_KIND_COUNT_; i++) {
        CHECK_OK(ckv_metric_by_name(ckv_metric_name((ckv_metric_kind)i), &k));
        CHECK(k == (ckv_metric_kind)i);
    }
}

int main(void) {
    test_normalize();
    test_qa_f1();
    test_rouge();
    test_code_sim();
    test_classification();
    test_retrieval_count();
    test_string_match();
    test_score_dispatch();
    test_names();
    return ckv_test_finish("test_eval_metrics");
}
