/* runner_prompt.c - the prompts of `ckv eval`: samples generated (RULER-style, haystack sizes fitted
 * to the requested length and checked before any work) or read from the dataset, encoded the way
 * kvpress splits them (the compressed part, then the question and answer prefix), and packed into
 * one int32 packet a group leader broadcasts to its tensor-parallel group. */
#include "eval/runner_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/text.h"
#include "eval/ruler.h"

/* generated sample s -> (task, length, index) */
void ckv_runner_decode_sample(const ckv_eval_job *j, int s, int *t, int *l, int *i) {
    *i = s % j->n_samples;
    *l = (s / j->n_samples) % j->n_lengths;
    *t = s / (j->n_samples * j->n_lengths);
}

void ckv_runner_packed_free(packed *p) {
    free(p->v);
    free(p->unit_ids);
    free(p->q_ids);
    memset(p, 0, sizeof *p);
}

ckv_status ckv_runner_packed_index(packed *p) {
    if (p->n < 2) return ckv_error(CKV_STATUS_ERR_INTERNAL, "empty prompt packet");
    p->n_q = p->v[0];
    p->n_units = p->v[1];
    p->unit_len = p->v + 2;
    p->q_len = p->unit_len + p->n_units;
    p->max_new = p->q_len + p->n_q;
    p->unit_ids = malloc(sizeof(int32_t *) * (size_t)p->n_units);
    p->q_ids = malloc(sizeof(int32_t *) * (size_t)p->n_q);
    if (!p->unit_ids || !p->q_ids) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory unpacking a prompt");
    const int32_t *d = p->max_new + p->n_q;
    for (int u = 0; u < p->n_units; u++) p->unit_ids[u] = d, d += p->unit_len[u];
    for (int q = 0; q < p->n_q; q++) p->q_ids[q] = d, d += p->q_len[q];
    return CKV_STATUS_OK;
}

/* Encodes (compressed part, part fed after) the way kvpress splits them; the answer prefix follows
 * the question (plain text) or the assistant header (chat). */
static ckv_status encode_pair(const runner *r, const char *cpart, const char *qpart, const char *prefix, int32_t **a,
                              int *na, int32_t **b, int *nb) {
    const ckv_eval_job *j = r->job;
    *a = *b = NULL;
    if (!r->chat) {
        size_t l1 = strlen(qpart), l2 = strlen(prefix);
        char *q = malloc(l1 + l2 + 1);
        if (!q) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building a prompt");
        memcpy(q, qpart, l1);
        memcpy(q + l1, prefix, l2 + 1);
        ckv_status st = ckv_text_encode_split(r->tok, cpart, q, 0, NULL, NULL, a, na, b, nb);
        free(q);
        return st;
    }
    CKV_TRY(ckv_text_encode_split(r->tok, cpart, qpart, CKV_TEXT_CHAT, j->template_name, j->system, a, na, b, nb));
    if (!*prefix) return CKV_STATUS_OK;
    int32_t *p = NULL;
    size_t np = 0;
    ckv_status st = ckv_tokenizer_encode(r->tok, prefix, strlen(prefix), CKV_TOKENIZE_UTF8_REPLACE, &p, &np);
    if (st == CKV_STATUS_OK) {
        int32_t *nbuf = realloc(*b, sizeof(int32_t) * ((size_t)*nb + np + 1));
        if (!nbuf) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building a prompt");
        else {
            memcpy(nbuf + *nb, p, sizeof(int32_t) * np);
            *b = nbuf;
            *nb += (int)np;
        }
    }
    free(p);
    if (st != CKV_STATUS_OK) {
        free(*a);
        free(*b);
        *a = *b = NULL;
    }
    return st;
}

int ckv_runner_query_aware(const ckv_eval_job *j) {
    for (int c = 0; c < j->n_configs; c++)
        if (j->configs[c].cfg.query_aware) return 1;
    return 0;
}

const packed *ckv_runner_packet_of(const ckv_eval_config *c, const packed *pk, const packed *pk_ctx) {
    return c->cfg.query_aware || !pk_ctx ? pk : pk_ctx;
}

static char *concat2(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (s) {
        memcpy(s, a, la);
        memcpy(s + la, b, lb + 1);
    }
    return s;
}

/* Packs the prompts of sample s; query_aware selects the unit layout. */
ckv_status ckv_runner_build_packed(const runner *r, const ckv_eval_sample *s, int query_aware, packed *out) {
    memset(out, 0, sizeof *out);
    int nq = s->n_questions, nu = query_aware ? nq : 1;
    int32_t **ua = calloc((size_t)nu, sizeof(int32_t *)), **qb = calloc((size_t)nq, sizeof(int32_t *));
    int *una = calloc((size_t)nu, sizeof(int)), *qnb = calloc((size_t)nq, sizeof(int));
    ckv_status st = (ua && qb && una && qnb) ? CKV_STATUS_OK : ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building prompts");
    for (int q = 0; q < nq && st == CKV_STATUS_OK; q++) {
        const ckv_eval_question *Q = &s->questions[q];
        int32_t *a = NULL;
        int na = 0;
        if (query_aware) {
            char *cq = concat2(s->context, Q->question);
            if (!cq) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory building prompts");
            else st = encode_pair(r, cq, "", Q->answer_prefix, &a, &na, &qb[q], &qnb[q]);
            free(cq);
            if (st == CKV_STATUS_OK) ua[q] = a, una[q] = na;
        } else {
            st = encode_pair(r, s->context, Q->question, Q->answer_prefix, &a, &na, &qb[q], &qnb[q]);
            if (st == CKV_STATUS_OK && q == 0) {
                ua[0] = a, una[0] = na;
            } else if (st == CKV_STATUS_OK) {
                if (na != una[0] || memcmp(a, ua[0], sizeof(int32_t) * (size_t)na) != 0)
                    st = ckv_error(CKV_STATUS_ERR_INTERNAL, "sample %s: the context encodes differently with question %d",
                                   s->id, q);
                free(a);
            }
        }
    }
    if (st == CKV_STATUS_OK) {
        long total = 2 + nu + 2L * nq;
        for (int u = 0; u < nu; u++) total += una[u];
        for (int q = 0; q < nq; q++) total += qnb[q];
        if (total > INT_MAX / 2) st = ckv_error(CKV_STATUS_ERR_RANGE, "sample %s: prompt too large", s->id);
        else if (!(out->v = malloc(sizeof(int32_t) * (size_t)total))) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
        if (st == CKV_STATUS_OK) {
            int32_t *v = out->v;
            int k = 0;
            v[k++] = nq;
            v[k++] = nu;
            for (int u = 0; u < nu; u++) v[k++] = una[u];
            for (int q = 0; q < nq; q++) v[k++] = qnb[q];
            for (int q = 0; q < nq; q++) {
                int mn = r->job->max_new_tokens > 0 ? r->job->max_new_tokens : s->questions[q].max_new_tokens;
                v[k++] = mn > 0 ? mn : 1;
            }
            for (int u = 0; u < nu; u++) memcpy(v + k, ua[u], sizeof(int32_t) * (size_t)una[u]), k += una[u];
            for (int q = 0; q < nq; q++) memcpy(v + k, qb[q], sizeof(int32_t) * (size_t)qnb[q]), k += qnb[q];
            out->n = k;
            st = ckv_runner_packed_index(out);
        }
    }
    for (int u = 0; ua && u < nu; u++) free(ua[u]);
    for (int q = 0; qb && q < nq; q++) free(qb[q]);
    free(ua);
    free(qb);
    free(una);
    free(qnb);
    if (st != CKV_STATUS_OK) ckv_runner_packed_free(out);
    return st;
}

/* Token counter for the RULER length fit: the prompt of question 0 as it will run. */
static ckv_status count_tokens(void *ctx, const ckv_eval_sample *s, long *tokens) {
    const runner *r = ctx;
    int32_t *a = NULL, *b = NULL;
    int na = 0, nb = 0;
    const ckv_eval_question *q = &s->questions[0];
    ckv_status st;
    if (ckv_runner_query_aware(r->job)) {
        char *cq = concat2(s->context, q->question);
        if (!cq) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory counting tokens");
        st = encode_pair(r, cq, "", q->answer_prefix, &a, &na, &b, &nb);
        free(cq);
    } else {
        st = encode_pair(r, s->context, q->question, q->answer_prefix, &a, &na, &b, &nb);
    }
    free(a);
    free(b);
    *tokens = (long)na + nb;
    return st;
}

/* The leader's sample s (generated or from the dataset); *owned = 1 when it must be freed. */
ckv_status ckv_runner_get_sample(runner *r, int s, ckv_eval_sample *tmp, const ckv_eval_sample **out) {
    const ckv_eval_job *j = r->job;
    if (j->data_path) {
        *out = &r->data[s];
        return CKV_STATUS_OK;
    }
    int t, l, i;
    ckv_runner_decode_sample(j, s, &t, &l, &i);
    ckv_ruler_params p = {j->tasks[t], j->lengths[l], j->seed, &r->essay, j->max_new_tokens, count_tokens, r};
    long *fit = &r->fitted[t * j->n_lengths + l];
    if (j->lengths[l] > r->model->cfg.max_context)
        return ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG, "--length %d exceeds the context window of %s (%d tokens)",
                         j->lengths[l], j->model_path, r->model->cfg.max_context);
    if (*fit == 0) CKV_TRY(ckv_ruler_fit(&p, fit));
    CKV_TRY(ckv_ruler_generate(&p, i, *fit, tmp, NULL));
    *out = tmp;
    return CKV_STATUS_OK;
}

/* Opens the tokenizer and the prompt format; a leader (who builds the prompts) also the haystack. */
ckv_status ckv_runner_open_text(runner *r, int leader) {
    const ckv_eval_job *j = r->job;
    if (!r->tok) {
        CKV_TRY(ckv_text_open_tokenizer(&r->tok, j->model_path));
        const ckv_chat_template *own = ckv_tokenizer_chat_template(r->tok);
        if (j->template_name && !strcmp(j->template_name, "none")) {
            r->chat = 0;
        } else if (j->template_name) {
            ckv_chat_template t;
            CKV_TRY(ckv_chat_template_by_name(j->template_name, &t));
            r->chat = 1;
        } else {
            r->chat = own && own->family != CKV_CHAT_NONE;
        }
        snprintf(r->template_label, sizeof r->template_label, "%s",
                 !r->chat ? "none" : j->template_name ? j->template_name : own->name);
    }
    if (leader && !j->data_path && !r->have_essay) {
        if (j->haystack_file) CKV_TRY(ckv_haystack_open_file(&r->essay, j->haystack_file));
        else CKV_TRY(ckv_haystack_open_builtin(&r->essay));
        r->have_essay = 1;
        r->fitted = calloc((size_t)(j->n_tasks * j->n_lengths), sizeof(long));
        if (!r->fitted) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
    }
    return CKV_STATUS_OK;
}

/* The model's context window from its configuration alone (no weights). */
static ckv_status model_window(const char *path, int *window) {
    ckv_model_config c;
    CKV_TRY(ckv_engine_read_config(path, &c));
    *window = c.max_context;
    return CKV_STATUS_OK;
}

/* Before any work (world rank 0): every --length fits the model and every task can be generated at
 * every length (the haystack sizes are fitted now, so a bad pair fails before the first sample). */
ckv_status ckv_runner_check_tasks(runner *r) {
    const ckv_eval_job *j = r->job;
    int window = 0;
    CKV_TRY(model_window(j->model_path, &window));
    for (int l = 0; l < j->n_lengths; l++)
        if (j->lengths[l] > window)
            return ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG, "--length %d exceeds the context window of %s (%d tokens)",
                             j->lengths[l], j->model_path, window);
    CKV_TRY(ckv_runner_open_text(r, 1));
    for (int t = 0; t < j->n_tasks; t++)
        for (int l = 0; l < j->n_lengths; l++) {
            ckv_ruler_params p = {j->tasks[t], j->lengths[l], j->seed, &r->essay, j->max_new_tokens, count_tokens, r};
            CKV_TRY(ckv_ruler_fit(&p, &r->fitted[t * j->n_lengths + l]));
        }
    return CKV_STATUS_OK;
}
