/* runner_item.c - one (sample, configuration) of `ckv eval`: each unit of the prompt packet prepared
 * (compressed) once through the engine request API and its questions answered greedily from it, then
 * the answers scored and written as results lines (JSON through cJSON). */
#include "eval/runner_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sweep.h"
#include "eval/metrics.h"
#include "tokenizer/tokenizer.h"

/* Answers questions q0 .. q1 - 1 of the packet greedily from a prepared unit of L tokens. With the
 * job's decode press, an answer that cut the cache spends the unit: it is prepared again from pp
 * (NULL: never spent, no decode press) for the next question. */
static ckv_status answer_unit(const runner *r, ckv_prepared *pc, const ckv_prepare_params *pp, const packed *pk, int q0,
                              int q1, int L, double prefill_s, answer *ans) {
    double kept = pc->stats.total_entries ? (double)pc->stats.kept_entries / (double)pc->stats.total_entries : 1.0;
    for (int q = q0; q < q1; q++) {
        ckv_gen_params g = {.max_new_tokens = pk->max_new[q], .decode_press = pp ? r->job->decode_press : NULL};
        g.sampling.top_p = 1.0f; /* greedy */
        if (pc->spent) {
            ckv_engine *e = pc->engine;
            ckv_prepared_free(pc);
            CKV_TRY(ckv_engine_prepare(e, pp, pc));
        }
        ckv_answer a;
        CKV_TRY(ckv_prepared_answer(pc, q, pk->q_ids[q], pk->q_len[q], &g, NULL, &a));
        memcpy(ans[q].toks, a.ids, sizeof(int32_t) * (size_t)a.n);
        ans[q].n_new = a.n;
        ans[q].stopped = a.finish == CKV_FINISH_EOS;
        ans[q].answer_s = a.seconds;
        ans[q].prefill_s = prefill_s;
        ans[q].unit_len = L;
        ans[q].kept = kept;
        ans[q].compressed = pc->compressed;
        ckv_answer_free(&a);
    }
    return CKV_STATUS_OK;
}

/* Unit u's questions [q0, q1) and the session room they need (longest question + answer). */
static int unit_questions(const packed *pk, int u, int *q0, int *q1) {
    *q0 = pk->n_units == 1 ? 0 : u;
    *q1 = pk->n_units == 1 ? pk->n_q : u + 1;
    int max_q = 0, max_new = 1;
    for (int q = *q0; q < *q1; q++) {
        if (pk->q_len[q] > max_q) max_q = pk->q_len[q];
        if (pk->max_new[q] > max_new) max_new = pk->max_new[q];
    }
    return max_q + max_new;
}

/* One configuration on one prompt packet: each unit (the context, or context + question when
 * query-aware) is prepared once and answers its questions greedily (engine/request.h). */
ckv_status ckv_runner_run_item(runner *r, const packed *pk, const ckv_eval_config *c, answer *ans) {
    ckv_status st = CKV_STATUS_OK;
    for (int u = 0; u < pk->n_units && st == CKV_STATUS_OK; u++) {
        int q0, q1, reserve = unit_questions(pk, u, &q0, &q1);
        ckv_prepare_params pp = {.ids = pk->unit_ids[u], .n = pk->unit_len[u], .press = &c->cfg, .reserve = reserve};
        ckv_prepared pc;
        CKV_TRY(ckv_engine_prepare(&r->eng, &pp, &pc));
        st = answer_unit(r, &pc, &pp, pk, q0, q1, pk->unit_len[u], pc.prepare_seconds, ans);
        ckv_prepared_free(&pc);
    }
    return st;
}

ckv_status ckv_runner_run_sweep(runner *r, const packed *pk, const packed *pk_ctx, const unsigned char *done,
                                answer *ans) {
    const ckv_eval_job *j = r->job;
    const int n_q = pk->n_q;
    for (int x = 0; x < 2; x++) {
        const packed *p = x ? pk_ctx : pk;
        if (!p) continue;
        for (int u = 0; u < p->n_units; u++) {
            int q0, q1, reserve = unit_questions(p, u, &q0, &q1), L = p->unit_len[u];
            int xn_first = INT_MAX, any = 0; /* the earliest attention input any configuration reads */
            for (int c = 0; c < j->n_configs; c++) {
                const ckv_eval_config *cf = &j->configs[c];
                if (done[c] || ckv_runner_packet_of(cf, pk, pk_ctx) != p) continue;
                int f = ckv_sweep_xn_first(&cf->cfg, L);
                if (f < xn_first) xn_first = f;
                any = 1;
            }
            if (!any) break;
            ckv_sweep sw;
            CKV_TRY(ckv_sweep_init(&sw, &r->eng, p->unit_ids[u], L, reserve, xn_first));
            ckv_status st = CKV_STATUS_OK;
            for (int c = 0; c < j->n_configs && st == CKV_STATUS_OK; c++) {
                const ckv_eval_config *cf = &j->configs[c];
                if (done[c] || ckv_runner_packet_of(cf, pk, pk_ctx) != p) continue;
                ckv_prepared pc, *use = NULL;
                st = ckv_sweep_derive(&sw, &cf->cfg, 0, NULL, &pc, &use);
                if (st == CKV_STATUS_OK)
                    st = answer_unit(r, use, NULL, p, q0, q1, L, sw.prefill_seconds + (use == &pc ? pc.prepare_seconds : 0.0),
                                     ans + (size_t)c * n_q);
                ckv_sweep_release(&sw, &pc);
            }
            ckv_sweep_free(&sw);
            CKV_TRY(st);
        }
    }
    return CKV_STATUS_OK;
}

/* v rounded to `digits` decimals (timings and fractions need no more). */
static double rounded(double v, int digits) {
    double m = pow(10.0, digits);
    return round(v * m) / m;
}

/* One results line (JSON object) of question q. */
static cJSON *result_object(const runner *r, const ckv_eval_sample *s, int sample_index, const packed *pk,
                            const ckv_eval_config *c, const answer *a, int q, const char *pred, double score) {
    const ckv_eval_job *j = r->job;
    const ckv_eval_question *Q = &s->questions[q];
    cJSON *o = cJSON_CreateObject();
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "schema", 1);
    cJSON_AddStringToObject(o, "ckv_version", j->version ? j->version : "");
    cJSON_AddStringToObject(o, "model", j->model_path);
    cJSON_AddStringToObject(o, "task", s->task);
    cJSON_AddNumberToObject(o, "length", s->length);
    cJSON_AddStringToObject(o, "sample", s->id);
    cJSON_AddNumberToObject(o, "sample_index", sample_index);
    cJSON_AddNumberToObject(o, "question", q);
    if (Q->line) cJSON_AddNumberToObject(o, "line", Q->line);
    if (Q->id) cJSON_AddStringToObject(o, "id", Q->id);
    if (!j->data_path) { /* exact beyond 2^53 */
        char seed[32];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)j->seed);
        cJSON_AddRawToObject(o, "seed", seed);
    }
    cJSON_AddStringToObject(o, "press", c->press);
    cJSON_AddStringToObject(o, "press_spec", c->cfg.spec);
    if (j->decode_press) cJSON_AddStringToObject(o, "decode_press", j->decode_press->spec);
    cJSON_AddNumberToObject(o, "budget", c->budget);
    cJSON_AddBoolToObject(o, "query_aware", c->cfg.query_aware);
    cJSON_AddStringToObject(o, "template", r->template_label);
    cJSON_AddStringToObject(o, "metric", ckv_metric_name(s->metric));
    cJSON_AddNumberToObject(o, "score", score);
    cJSON_AddStringToObject(o, "prediction", pred);
    cJSON *answers = cJSON_AddArrayToObject(o, "answers");
    for (int k = 0; answers && k < Q->n_answers; k++) cJSON_AddItemToArray(answers, cJSON_CreateString(Q->answers[k]));
    cJSON_AddNumberToObject(o, "context_tokens", a->unit_len);
    cJSON_AddNumberToObject(o, "question_tokens", pk->q_len[q]);
    cJSON_AddNumberToObject(o, "max_new_tokens", pk->max_new[q]);
    cJSON_AddNumberToObject(o, "new_tokens", a->n_new);
    cJSON_AddBoolToObject(o, "stopped", a->stopped);
    cJSON_AddNumberToObject(o, "kept_fraction", rounded(a->kept, 6));
    if (c->cfg.scorer != CKV_SCORER_NONE) cJSON_AddBoolToObject(o, "compressed", a->compressed);
    cJSON_AddNumberToObject(o, "prefill_s", rounded(a->prefill_s, 4));
    cJSON_AddNumberToObject(o, "answer_s", rounded(a->answer_s, 4));
    cJSON_AddNumberToObject(o, "dp", r->n_groups);
    cJSON_AddNumberToObject(o, "tp", r->tp_size);
    return o;
}

/* The results lines of one (sample, configuration) (leader). */
ckv_status ckv_runner_result_lines(const runner *r, const ckv_eval_sample *s, int sample_index, const packed *pk,
                                   const ckv_eval_config *c, const answer *ans, ckv_strbuf *b, double *mean) {
    *mean = 0.0;
    for (int q = 0; q < s->n_questions; q++) {
        const ckv_eval_question *Q = &s->questions[q];
        char *pred = NULL;
        size_t plen = 0;
        CKV_TRY(ckv_tokenizer_decode(r->tok, ans[q].toks, (size_t)ans[q].n_new, CKV_DETOKENIZE_SKIP_SPECIAL, &pred, &plen));
        double score = 0.0;
        ckv_status st = ckv_metric_score(s->metric, s->first_line, pred, (const char *const *)Q->answers, Q->n_answers,
                                         (const char *const *)s->all_classes, s->n_classes, &score);
        if (st != CKV_STATUS_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", ckv_error_message());
            free(pred);
            return ckv_error(st, "sample %s question %d: %s", s->id, q, msg);
        }
        *mean += score / s->n_questions;
        cJSON *o = result_object(r, s, sample_index, pk, c, &ans[q], q, pred, score);
        char *line = o ? cJSON_PrintUnformatted(o) : NULL;
        cJSON_Delete(o);
        if (!line) {
            free(pred);
            return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory writing a results line");
        }
        ckv_strbuf_adds(b, line);
        ckv_strbuf_addc(b, '\n');
        cJSON_free(line);
        free(pred);
    }
    return ckv_strbuf_status(b, "results lines");
}