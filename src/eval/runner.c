/* runner.c - the resumable evaluation loop (see runner.h): world rank 0's checks and the done set
 * broadcast, round-robin sharing of the samples among data-parallel groups, the prompt packets
 * broadcast inside a tensor-parallel group, one (sample, configuration) at a time with whole-line
 * appends, the stop flag at sample boundaries, and the final merge + report. The output directory
 * is runner_dir.c's, the prompts runner_prompt.c's, the items runner_item.c's. It prints nothing. */
#define _XOPEN_SOURCE 700 /* realpath */
#include "eval/runner_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/threadpool.h"
#include "core/timer.h"
#include "eval/results.h"

void ckv_runner_notice(const runner *r, const char *fmt, ...) {
    if (r->world->rank != 0 || !r->job->on_notice) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    r->job->on_notice(r->job->cb_ctx, msg);
}

int ckv_runner_n_samples(const ckv_eval_job *j) {
    return j->data_path ? 0 : j->n_tasks * j->n_lengths * j->n_samples;
}


/* ---- the run ------------------------------------------------------------------------------------------ */

static ckv_status group_stop(runner *r) {
    int flag = r->job->stop && *r->job->stop ? 1 : 0;
    if (r->tp->size > 1) CKV_TRY(r->tp->ops->allreduce_i32(r->tp, &flag, 1, CKV_COMM_OP_MAX));
    return flag ? CKV_STATUS_ERR_INTERNAL : CKV_STATUS_OK; /* used as a boolean */
}


/* Opens the tokenizer, the model and the samples for a group with work. */
static ckv_status open_group(runner *r) {
    const ckv_eval_job *j = r->job;
    int threads = j->threads;
    if (!threads) {
        threads = ckv_cpu_count() / (r->world->size > 0 ? r->world->size : 1);
        if (threads < 1) threads = 1;
    }
    CKV_TRY(ckv_runner_open_text(r, r->tp->rank == 0));
    ckv_engine_config ec = {.model_path = j->model_path, .backend = j->backend, .threads = threads, .device = j->device,
                            .kv_dtype = j->kv_dtype, .weights_dtype = j->weights_dtype,
                            .chunk = j->chunk, .tokenizer = r->tok};
    CKV_TRY(ckv_engine_init(&r->eng, &ec, r->tp));
    r->model = r->eng.model;
    if (r->tp->rank == 0 && j->data_path && !r->data) {
        ckv_dataset_options o = j->data;
        o.warn = NULL; /* world rank 0 reported them */
        CKV_TRY(ckv_dataset_load(j->data_path, &o, &r->data, &r->n_data, NULL));
        if (r->n_data != r->n_total) return ckv_error(CKV_STATUS_ERR_IO, "%s changed while the job started", j->data_path);
    }
    return CKV_STATUS_OK;
}

static void runner_free(runner *r) {
    ckv_eval_samples_free(r->data, r->n_data);
    ckv_haystack_free(&r->essay);
    free(r->fitted);
    free(r->done);
    ckv_engine_free(&r->eng);
    ckv_tokenizer_free(r->tok);
    if (r->tp) ckv_comm_free(r->tp);
}

/* Broadcast from the group leader of an agreed status + message (so every rank fails alike). */
static ckv_status group_status(runner *r, ckv_status st, int *skip, char *msg, size_t cap) {
    int32_t hdr[2] = {st == CKV_STATUS_OK ? 0 : (*skip ? 1 : 2), (int32_t)st};
    if (r->tp->rank == 0 && st != CKV_STATUS_OK) snprintf(msg, cap, "%s", ckv_error_message());
    if (r->tp->size > 1) {
        CKV_TRY(r->tp->ops->bcast(r->tp, hdr, sizeof hdr, 0));
        if (hdr[0]) CKV_TRY(r->tp->ops->bcast(r->tp, msg, cap, 0));
    }
    *skip = hdr[0] == 1;
    if (hdr[0] == 2) return ckv_error((ckv_status)hdr[1], "%s", msg);
    return CKV_STATUS_OK;
}

ckv_status ckv_eval_run(const ckv_eval_job *job, ckv_comm *world, ckv_eval_outcome *out) {
    memset(out, 0, sizeof *out);
    runner R, *r = &R;
    memset(r, 0, sizeof R);
    r->job = job;
    r->world = world;
    int lock_fd = -1;
    ckv_status st = CKV_STATUS_OK;
    char msg[1024] = "";
    long n_done_before = 0;
    int32_t hdr[3] = {0, 0, 0};

    /* phase A: world rank 0 checks the directory and reads what is done */
    if (world->rank == 0) {
        if (!realpath(job->model_path, r->model_id)) snprintf(r->model_id, sizeof r->model_id, "%s", job->model_path);
        char *setup = NULL; /* run.json is written once every check passed */
        st = ckv_runner_mkdir(job->out_dir);
        if (st == CKV_STATUS_OK) st = ckv_eval_lock(job->out_dir, &lock_fd);
        if (st == CKV_STATUS_OK) st = ckv_runner_check_identity(r, &setup);
        if (st == CKV_STATUS_OK && !job->data_path) st = ckv_runner_check_tasks(r);
        if (st == CKV_STATUS_OK && job->data_path) {
            int skipped = 0;
            st = ckv_dataset_load(job->data_path, &job->data, &r->data, &r->n_data, &skipped);
            if (st == CKV_STATUS_OK && skipped)
                ckv_runner_notice(r, "%s: %d bad line(s) skipped", job->data_path, skipped);
        }
        if (st == CKV_STATUS_OK && setup) {
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/run.json", job->out_dir);
            st = ckv_eval_write_atomic(path, setup, strlen(setup));
        }
        free(setup);
        r->n_total = job->data_path ? r->n_data : ckv_runner_n_samples(job);
        if (st == CKV_STATUS_OK) {
            r->done = calloc((size_t)r->n_total * (size_t)job->n_configs + 1, 1);
            if (!r->done) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
        }
        if (st == CKV_STATUS_OK) st = ckv_runner_compute_done(r, &n_done_before);
        if (st != CKV_STATUS_OK) snprintf(msg, sizeof msg, "%s", ckv_error_message());
        hdr[0] = st == CKV_STATUS_OK ? 0 : (int32_t)st;
        hdr[1] = r->n_total;
    }
    if (world->size > 1) {
        st = world->ops->bcast(world, hdr, sizeof hdr, 0);
        if (st == CKV_STATUS_OK && hdr[0]) st = world->ops->bcast(world, msg, sizeof msg, 0);
        if (st != CKV_STATUS_OK) goto done;
    }
    if (hdr[0]) {
        st = ckv_error((ckv_status)hdr[0], "%s", msg);
        out->collective_error = 1;
        goto done;
    }
    r->n_total = hdr[1];
    if (world->rank != 0) {
        r->done = calloc((size_t)r->n_total * (size_t)job->n_configs + 1, 1);
        if (!r->done) {
            st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
            goto done;
        }
        if (!realpath(job->model_path, r->model_id)) snprintf(r->model_id, sizeof r->model_id, "%s", job->model_path);
    }
    if (world->size > 1) CKV_TRY_GOTO(st, world->ops->bcast(world, r->done, (size_t)r->n_total * job->n_configs, 0), done);

    /* phase B: groups */
    r->tp_size = job->tp ? job->tp : world->size;
    if (world->size % r->tp_size != 0) {
        st = ckv_error(CKV_STATUS_ERR_ARG, "--tp %d does not divide the %d ranks of the job", r->tp_size, world->size);
        out->collective_error = 1;
        goto done;
    }
    r->n_groups = world->size / r->tp_size;
    r->group = world->rank / r->tp_size;
    CKV_TRY_GOTO(st, world->ops->split(world, r->group, world->rank, &r->tp), done);
    {
        /* the samples with work left, dealt round-robin; my group's items */
        long items = (long)r->n_total * job->n_configs, my_items = 0, todo_total = 0;
        int k = 0;
        for (int s = 0; s < r->n_total; s++) {
            int left = 0;
            for (int c = 0; c < job->n_configs; c++) left += !r->done[(size_t)s * job->n_configs + c];
            if (!left) continue;
            todo_total += left;
            if (k++ % r->n_groups == r->group) my_items += left;
        }
        out->items = items;
        out->items_done_before = n_done_before;
        if (todo_total == 0) ckv_runner_notice(r, "all %ld items are done in %s; nothing to run", items, job->out_dir);
        else if (n_done_before)
            ckv_runner_notice(r, "resuming: %ld of %ld items done in %s, %ld to run", n_done_before, items, job->out_dir, todo_total);
        if (r->group == 0 && r->n_groups > 1 && todo_total)
            ckv_runner_notice(r, "%d data-parallel groups of %d rank(s); progress shows group 0", r->n_groups, r->tp_size);
        if (my_items > 0) {
            st = open_group(r);
            if (st != CKV_STATUS_OK) goto done;
            if (r->group == 0) snprintf(r->results_path, sizeof r->results_path, "%s/results.jsonl", job->out_dir);
            else snprintf(r->results_path, sizeof r->results_path, "%s/results.g%d.jsonl", job->out_dir, r->group);
            long done_items = 0;
            int qa_job = ckv_runner_query_aware(job);
            k = 0;
            for (int s = 0; s < r->n_total && !out->interrupted; s++) {
                int left = 0;
                for (int c = 0; c < job->n_configs; c++) left += !r->done[(size_t)s * job->n_configs + c];
                if (!left) continue;
                if (k++ % r->n_groups != r->group) continue;
                if (group_stop(r) != CKV_STATUS_OK) {
                    out->interrupted = 1;
                    break;
                }
                /* the leader builds the prompts; the group gets them */
                ckv_eval_sample tmp;
                memset(&tmp, 0, sizeof tmp);
                const ckv_eval_sample *smp = NULL;
                packed pk;
                memset(&pk, 0, sizeof pk);
                packed pk_ctx; /* context-only layout for the full cache in a query-aware job */
                memset(&pk_ctx, 0, sizeof pk_ctx);
                int skip = 0;
                ckv_status ls = CKV_STATUS_OK;
                if (r->tp->rank == 0) {
                    ls = ckv_runner_get_sample(r, s, &tmp, &smp);
                    if (ls == CKV_STATUS_OK) ls = ckv_runner_build_packed(r, smp, qa_job, &pk);
                    if (ls == CKV_STATUS_OK && qa_job) ls = ckv_runner_build_packed(r, smp, 0, &pk_ctx);
                    if (ls == CKV_STATUS_OK) { /* the model's window */
                        const packed *chk[2] = {&pk, qa_job ? &pk_ctx : NULL};
                        for (int x = 0; x < 2 && ls == CKV_STATUS_OK; x++) {
                            if (!chk[x]) continue;
                            for (int q = 0; q < chk[x]->n_q && ls == CKV_STATUS_OK; q++) {
                                int u = chk[x]->n_units == 1 ? 0 : q;
                                long need = (long)chk[x]->unit_len[u] + chk[x]->q_len[q] + chk[x]->max_new[q];
                                if (need > r->model->cfg.max_context) {
                                    ls = ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG, "sample %s: context %d + question %d + max_new_tokens %d = "
                                                   "%ld tokens exceed the context window of %s (%d tokens)", smp->id,
                                                   chk[x]->unit_len[u], chk[x]->q_len[q], chk[x]->max_new[q], need,
                                                   job->model_path, r->model->cfg.max_context);
                                    skip = job->skip_bad;
                                }
                            }
                        }
                    }
                }
                st = group_status(r, ls, &skip, msg, sizeof msg);
                if (st != CKV_STATUS_OK) {
                    ckv_eval_sample_free(&tmp);
                    ckv_runner_packed_free(&pk);
                    ckv_runner_packed_free(&pk_ctx);
                    goto done;
                }
                /* broadcast the token packets */
                for (int x = 0; x < (qa_job ? 2 : 1) && !skip && r->tp->size > 1; x++) {
                    packed *p = x ? &pk_ctx : &pk;
                    int32_t n = p->n;
                    st = r->tp->ops->bcast(r->tp, &n, sizeof n, 0);
                    if (st == CKV_STATUS_OK && r->tp->rank != 0) {
                        p->v = malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1));
                        p->n = n;
                        if (!p->v) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory receiving a prompt");
                    }
                    if (st == CKV_STATUS_OK) st = r->tp->ops->bcast(r->tp, p->v, sizeof(int32_t) * (size_t)n, 0);
                    if (st == CKV_STATUS_OK && r->tp->rank != 0) st = ckv_runner_packed_index(p);
                    if (st != CKV_STATUS_OK) {
                        ckv_eval_sample_free(&tmp);
                        ckv_runner_packed_free(&pk);
                        ckv_runner_packed_free(&pk_ctx);
                        goto done;
                    }
                }
                answer *ans = NULL;  /* [n_configs, n_q] (shared prefill) or [n_q] */
                int32_t *tokbuf = NULL;
                int shared = !job->separate_prefill && !job->decode_press;
                size_t n_ans = (size_t)pk.n_q * (size_t)(shared ? job->n_configs : 1);
                ckv_status sweep_st = CKV_STATUS_OK;
                if (!skip) {
                    int maxn = 1;
                    for (int q = 0; q < pk.n_q; q++) maxn = pk.max_new[q] > maxn ? pk.max_new[q] : maxn;
                    ans = calloc(n_ans ? n_ans : 1, sizeof *ans);
                    tokbuf = malloc(sizeof(int32_t) * (size_t)maxn * (n_ans ? n_ans : 1));
                    if (!ans || !tokbuf) st = ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
                    for (size_t q = 0; ans && tokbuf && q < n_ans; q++) ans[q].toks = tokbuf + q * (size_t)maxn;
                    if (st == CKV_STATUS_OK && shared) { /* one prefill per unit layout for every configuration */
                        sweep_st = ckv_runner_run_sweep(r, &pk, qa_job ? &pk_ctx : NULL,
                                                        r->done + (size_t)s * job->n_configs, ans);
                        if (sweep_st == CKV_STATUS_ERR_CONTEXT_TOO_LONG && job->skip_bad)
                            snprintf(msg, sizeof msg, "%s", ckv_error_message());
                        else if (sweep_st != CKV_STATUS_OK)
                            st = sweep_st;
                    }
                }
                for (int c = 0; c < job->n_configs && st == CKV_STATUS_OK; c++) {
                    if (r->done[(size_t)s * job->n_configs + c]) continue;
                    const ckv_eval_config *cf = &job->configs[c];
                    double t0 = ckv_time_now();
                    ckv_eval_event ev = {0};
                    ev.group = r->group;
                    ev.n_groups = r->n_groups;
                    ev.press = cf->press;
                    ev.budget = cf->budget;
                    if (skip) {
                        ev.skipped = msg;
                        out->items_skipped++;
                    } else {
                        const packed *p = ckv_runner_packet_of(cf, &pk, qa_job ? &pk_ctx : NULL);
                        answer *ca = shared ? ans + (size_t)c * pk.n_q : ans;
                        ckv_status is = shared ? sweep_st : ckv_runner_run_item(r, p, cf, ca);
                        if (is == CKV_STATUS_ERR_CONTEXT_TOO_LONG && job->skip_bad) { /* does not fit the model */
                            if (!shared) snprintf(msg, sizeof msg, "%s", ckv_error_message());
                            ev.skipped = msg;
                            out->items_skipped++;
                        } else if (is != CKV_STATUS_OK) {
                            st = is;
                            break;
                        } else if (r->tp->rank == 0) {
                            ckv_strbuf lines;
                            ckv_strbuf_init(&lines);
                            double mean = 0.0;
                            st = ckv_runner_result_lines(r, smp, smp->length ? (int)(s % job->n_samples) : s, p, cf, ca, &lines, &mean);
                            if (st == CKV_STATUS_OK) st = ckv_eval_append(r->results_path, lines.s, lines.len);
                            ckv_strbuf_free(&lines);
                            ev.score = mean;
                        }
                        out->items_run++;
                    }
                    done_items++;
                    if (world->rank == 0 && job->on_event && st == CKV_STATUS_OK) {
                        ev.done = done_items;
                        ev.total = my_items;
                        ev.task = r->tp->rank == 0 && smp ? smp->task : "";
                        ev.sample = r->tp->rank == 0 && smp ? smp->id : "";
                        ev.n_questions = r->tp->rank == 0 && smp ? smp->n_questions : 0;
                        ev.seconds = ckv_time_now() - t0;
                        if (shared && ans && !ev.skipped) { /* the sweep ran before: its share of the time */
                            const answer *ca = ans + (size_t)c * pk.n_q;
                            ev.seconds = pk.n_q ? ca[0].prefill_s : 0.0;
                            for (int q = 0; q < pk.n_q; q++) ev.seconds += ca[q].answer_s;
                        }
                        job->on_event(job->cb_ctx, &ev);
                    }
                    /* a shared sweep has every configuration's answers already: they are written before a stop
                     * looks; separate prefills (one per configuration) stop after the item in flight */
                    if (!shared && c + 1 < job->n_configs && group_stop(r) != CKV_STATUS_OK) {
                        out->interrupted = 1;
                        break;
                    }
                }
                free(ans);
                free(tokbuf);
                ckv_eval_sample_free(&tmp);
                ckv_runner_packed_free(&pk);
                ckv_runner_packed_free(&pk_ctx);
                if (st != CKV_STATUS_OK) goto done;
            }
        }
    }
    /* every group is done (or stopped): merge and report */
    if (world->size > 1) { /* the job's totals: each group counted once (by its first rank) */
        int lead = !r->tp || r->tp->rank == 0;
        int v[3] = {out->interrupted, lead ? (int)out->items_run : 0, lead ? (int)out->items_skipped : 0};
        CKV_TRY_GOTO(st, world->ops->allreduce_i32(world, v, 3, CKV_COMM_OP_SUM), done);
        out->interrupted = v[0] > 0;
        out->items_run = v[1];
        out->items_skipped = v[2];
    }
    if (world->rank == 0) {
        char title[PATH_MAX + 64];
        const char *base = strrchr(job->model_path, '/');
        snprintf(title, sizeof title, "ckv eval: %s", base && base[1] ? base + 1 : job->model_path);
        st = ckv_eval_finish(job->out_dir, title, &out->table, NULL);
    }
done:
    ckv_eval_unlock(lock_fd);
    runner_free(r);
    return st;
}

