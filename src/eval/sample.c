/* sample.c - freeing and building evaluation samples. No I/O. */
#include "eval/sample.h"

#include <stdlib.h>
#include <string.h>

static void free_strings(char **v, int n) {
    if (!v) return;
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}

void ckv_eval_sample_free(ckv_eval_sample *s) {
    if (!s) return;
    free(s->id);
    free(s->task);
    free(s->context);
    for (int i = 0; i < s->n_questions; i++) {
        ckv_eval_question *q = &s->questions[i];
        free(q->question);
        free(q->answer_prefix);
        free_strings(q->answers, q->n_answers);
        free(q->id);
    }
    free(s->questions);
    free_strings(s->all_classes, s->n_classes);
    memset(s, 0, sizeof *s);
}

void ckv_eval_samples_free(ckv_eval_sample *s, int n) {
    if (!s) return;
    for (int i = 0; i < n; i++) ckv_eval_sample_free(&s[i]);
    free(s);
}

ckv_status ckv_eval_strdup(const char *src, char **out, const char *what) {
    size_t n = strlen(src);
    *out = malloc(n + 1);
    if (!*out) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory copying %s (%zu bytes)", what, n);
    memcpy(*out, src, n + 1);
    return CKV_STATUS_OK;
}

ckv_status ckv_eval_sample_add_question(ckv_eval_sample *s, const char *question, const char *answer_prefix,
                                        const char *const *answers, int n_answers, int max_new_tokens, int line,
                                        const char *id) {
    ckv_eval_question *qs = realloc(s->questions, sizeof *qs * (size_t)(s->n_questions + 1));
    if (!qs) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory adding a question");
    s->questions = qs;
    ckv_eval_question *q = &qs[s->n_questions];
    memset(q, 0, sizeof *q);
    s->n_questions++; /* counted now so that a failure below is freed with the sample */
    q->max_new_tokens = max_new_tokens;
    q->line = line;
    CKV_TRY(ckv_eval_strdup(question ? question : "", &q->question, "a question"));
    CKV_TRY(ckv_eval_strdup(answer_prefix ? answer_prefix : "", &q->answer_prefix, "an answer prefix"));
    if (id) CKV_TRY(ckv_eval_strdup(id, &q->id, "a question id"));
    if (n_answers > 0) {
        q->answers = calloc((size_t)n_answers, sizeof(char *));
        if (!q->answers) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory adding answers");
        for (int i = 0; i < n_answers; i++) {
            CKV_TRY(ckv_eval_strdup(answers[i], &q->answers[i], "an answer"));
            q->n_answers = i + 1;
        }
    }
    return CKV_STATUS_OK;
}
