/* runner_internal.h - what the files of the evaluation loop share (runner.c drives the run,
 * runner_dir.c owns the output directory, runner_prompt.c builds the prompts, runner_item.c runs and
 * records one (sample, configuration)). Not a public interface: only src/eval/runner*.c include it. */
#ifndef CKV_EVAL_RUNNER_INTERNAL_H
#define CKV_EVAL_RUNNER_INTERNAL_H

#include <limits.h>
#include <stdint.h>

#include "engine/request.h"
#include "eval/runner.h"
#include "eval/strbuf.h"

#ifndef PATH_MAX
#define PATH_MAX 4096
#endif

typedef struct {
    const ckv_eval_job *job;
    ckv_comm *world, *tp;
    int group, n_groups, tp_size;
    ckv_engine eng;             /* the group's model (engine/request.h) */
    ckv_model *model;           /* eng.model */
    ckv_tokenizer *tok;
    int chat;                   /* prompts use the chat template */
    char template_label[64];    /* recorded in the results */
    ckv_eval_sample *data;      /* dataset samples (group leaders) */
    int n_data;
    ckv_haystack essay;
    int have_essay;
    long *fitted;               /* [n_tasks * n_lengths] fitted haystack sizes (leader), 0 = not yet */
    int n_total;                /* samples of the job */
    unsigned char *done;        /* [n_total * n_configs] */
    char results_path[PATH_MAX];
    char model_id[PATH_MAX];
} runner;

/* ---- prompts ---------------------------------------------------------------------------------------- */

/* Token ids of one sample as the group runs it, packed for a broadcast:
 * [n_q, n_units, unit_len[n_units], q_len[n_q], max_new[n_q], unit ids ..., question ids ...]. A unit
 * is what is prefilled and compressed: the context (one unit, context-only) or context + question
 * (one per question, query-aware). */
typedef struct {
    int32_t *v;
    int n;
    int n_q, n_units;
    const int32_t *unit_len, *q_len, *max_new;
    const int32_t **unit_ids, **q_ids; /* [n_units], [n_q] pointers into v */
} packed;


typedef struct {
    int32_t *toks;  /* [max_new] generated ids (no stop token) */
    int n_new, stopped;
    double prefill_s, answer_s, kept;
    int unit_len;
    int compressed; /* 0: the press left the context as it is (too short, or a budget keeping all) */
} answer;

/* runner.c */
void ckv_runner_notice(const runner *r, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
int ckv_runner_n_samples(const ckv_eval_job *j);

/* runner_dir.c: world rank 0's checks of the output directory */
ckv_status ckv_runner_mkdir(const char *dir);
/* Compares the setup with out_dir/run.json; *to_write (malloc'd) gets the setup to record when the
 * directory has none yet (written once every check passed). */
ckv_status ckv_runner_check_identity(const runner *r, char **to_write);
/* The done bitmap over (sample, configuration): every question of the sample has a result. */
ckv_status ckv_runner_compute_done(runner *r, long *n_done);

/* runner_prompt.c */
void ckv_runner_decode_sample(const ckv_eval_job *j, int s, int *t, int *l, int *i); /* generated s -> (task, length, index) */
int ckv_runner_query_aware(const ckv_eval_job *j);  /* some configuration is query-aware */
/* The packet configuration c runs on: pk, or pk_ctx (context-only) in a query-aware job for the
 * configurations that are not. */
const packed *ckv_runner_packet_of(const ckv_eval_config *c, const packed *pk, const packed *pk_ctx);
void ckv_runner_packed_free(packed *p);
ckv_status ckv_runner_packed_index(packed *p);     /* fills the views of p->v */
/* Packs the prompts of sample s; query_aware selects the unit layout. */
ckv_status ckv_runner_build_packed(const runner *r, const ckv_eval_sample *s, int query_aware, packed *out);
/* The leader's sample s (generated into *tmp, or from the dataset). */
ckv_status ckv_runner_get_sample(runner *r, int s, ckv_eval_sample *tmp, const ckv_eval_sample **out);
/* The tokenizer and prompt format; a leader also the haystack. */
ckv_status ckv_runner_open_text(runner *r, int leader);
/* Before any work: every --length fits the model and every task can be generated at every length. */
ckv_status ckv_runner_check_tasks(runner *r);

/* runner_item.c */
ckv_status ckv_runner_run_item(runner *r, const packed *pk, const ckv_eval_config *c, answer *ans);
/* Every configuration c not done[c] of the job on one sample from one prefill per unit layout
 * (engine/sweep.h): pk the job's packet, pk_ctx its context-only layout in a query-aware job (or
 * NULL); answers of configuration c at ans[c * pk->n_q ..]. */
ckv_status ckv_runner_run_sweep(runner *r, const packed *pk, const packed *pk_ctx, const unsigned char *done,
                                answer *ans);
/* The results lines of one (sample, configuration) (leader). */
ckv_status ckv_runner_result_lines(const runner *r, const ckv_eval_sample *s, int sample_index, const packed *pk,
                                   const ckv_eval_config *c, const answer *ans, ckv_strbuf *b, double *mean);

#endif
