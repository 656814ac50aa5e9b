/* srv_job.c - job creation, failure and reference counting (see srv_job.h). */
#include "server/srv_job.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

ckv_status ckv_srv_job_create(ckv_srv_job **out, int max_tokens, int n_choices, size_t piece_cap) {
    *out = NULL;
    if (n_choices < 1 || n_choices > CKV_SRV_MAX_CHOICES) return ckv_error(CKV_STATUS_ERR_RANGE, "n must be in 1..%d", CKV_SRV_MAX_CHOICES);
    ckv_srv_job *j = calloc(1, sizeof *j);
    if (!j) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for a request");
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, NULL);
    j->refs = 2;
    j->max_tokens = max_tokens;
    j->n_choices = n_choices;
    ckv_status st = CKV_STATUS_OK;
    for (int c = 0; c < n_choices && st == CKV_STATUS_OK; c++) {
        ckv_srv_choice *ch = &j->choices[c];
        ch->text_cap = (size_t)(max_tokens + 1) * piece_cap + 1;
        st = ckv_alloc((void **)&ch->ids, sizeof(int32_t) * (size_t)(max_tokens > 0 ? max_tokens : 1), "answer ids");
        if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&ch->text, ch->text_cap, "answer text");
    }
    if (st != CKV_STATUS_OK) {
        j->refs = 1;
        ckv_srv_job_release(j);
        return st;
    }
    *out = j;
    return CKV_STATUS_OK;
}

ckv_status ckv_srv_job_alloc_logprobs(ckv_srv_job *j, int top_logprobs) {
    j->logprobs = 1;
    j->top_logprobs = top_logprobs;
    size_t n = (size_t)(j->max_tokens > 0 ? j->max_tokens : 1), k = (size_t)(top_logprobs > 0 ? top_logprobs : 1);
    for (int c = 0; c < j->n_choices; c++) {
        ckv_srv_choice *ch = &j->choices[c];
        CKV_TRY(ckv_alloc((void **)&ch->lp, sizeof(float) * n, "token logprobs"));
        CKV_TRY(ckv_alloc((void **)&ch->top_ids, sizeof(int32_t) * n * k, "top logprob ids"));
        CKV_TRY(ckv_alloc((void **)&ch->top_lp, sizeof(float) * n * k, "top logprobs"));
        CKV_TRY(ckv_alloc((void **)&ch->tok_end, sizeof(uint32_t) * n, "token text offsets"));
    }
    if (j->echo_scored) {
        size_t e = (size_t)(j->n_echo > 0 ? j->n_echo : 1);
        CKV_TRY(ckv_alloc((void **)&j->echo_lp, sizeof(float) * e, "prompt logprobs"));
        CKV_TRY(ckv_alloc((void **)&j->echo_top_ids, sizeof(int32_t) * e * k, "prompt top logprob ids"));
        CKV_TRY(ckv_alloc((void **)&j->echo_top_lp, sizeof(float) * e * k, "prompt top logprobs"));
        size_t off = (size_t)(j->n_echo - j->n_q);
        for (size_t i = 0; i < off; i++) j->echo_lp[i] = NAN;
        j->score = (ckv_sched_score){j->echo_lp + off, j->echo_top_ids + off * k, j->echo_top_lp + off * k, top_logprobs};
    }
    return CKV_STATUS_OK;
}

static void job_free(ckv_srv_job *j) {
    for (int c = 0; c < CKV_SRV_MAX_CHOICES; c++) {
        ckv_srv_choice *ch = &j->choices[c];
        ckv_free(ch->ids);
        ckv_free(ch->text);
        ckv_free(ch->lp);
        ckv_free(ch->top_ids);
        ckv_free(ch->top_lp);
        ckv_free(ch->tok_end);
    }
    free(j->echo_ids);
    free(j->echo_text);
    ckv_free(j->echo_lp);
    ckv_free(j->echo_top_ids);
    ckv_free(j->echo_top_lp);
    for (int i = 0; i < j->n_stop; i++) free(j->stop[i]);
    for (int c = 0; j->tool_parsers && c < j->n_choices; c++) ckv_toolcall_parser_free(&j->tool_parsers[c]);
    free(j->tool_parsers);
    free(j->ctx_ids);
    free(j->q_ids);
    ckv_grammar_free(&j->grammar);
    pthread_mutex_destroy(&j->mu);
    pthread_cond_destroy(&j->cv);
    free(j);
}

void ckv_srv_job_release(ckv_srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left == 0) job_free(j);
}

void ckv_srv_job_fail(ckv_srv_job *j, ckv_status st) {
    pthread_mutex_lock(&j->mu);
    j->status = st;
    snprintf(j->err, sizeof j->err, "%s", ckv_error_message());
    j->done = 1;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
    ckv_error_clear();
}
