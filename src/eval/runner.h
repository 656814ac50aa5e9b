/* runner.h - the resumable evaluation loop behind `ckv eval`. A job is a set of samples (generated
 * RULER-style tasks, or a JSONL dataset) times a set of configurations (the full cache and every
 * press x budget of a sweep). World rank 0 locks the output directory, checks that it holds results
 * of the same setup (run.json), reads what is already done (the results files) and broadcasts it;
 * the samples still to do are dealt round-robin to the data-parallel groups (world = dp x tp), whose
 * tensor-parallel ranks load the model and run each (sample, configuration): the context prefilled
 * layer-major and compressed by the press (context-only; with query_aware the question joins the
 * compressed part, as kvpress does), every question answered greedily from the same compressed cache,
 * the answers scored (metrics.h). The context of a sample is prefilled once for all configurations
 * and each press derives its compressed cache from that prefill (engine/sweep.h; bit-identical to a
 * prefill per configuration, which separate_prefill asks for). Each group's first rank appends the sample's lines to its results
 * file in one write + fsync, so a killed job loses at most the sample in flight; a stop request (a
 * signal flag) ends the loop at the next sample boundary. At the end world rank 0 merges the files
 * into one sorted results.jsonl and writes the report (report.h).
 * Library code: it prints nothing; progress and notices go through the callbacks (world rank 0). */
#ifndef CKV_EVAL_RUNNER_H
#define CKV_EVAL_RUNNER_H

#include <signal.h>
#include <stdint.h>

#include "comm/comm.h"
#include "core/status.h"
#include "core/tensor.h"
#include "engine/decode_press.h"
#include "eval/dataset.h"
#include "eval/haystack.h"
#include "eval/ruler.h"
#include "evict/press.h"

typedef struct {
    char press[128];        /* the press as given ("none": the full cache) */
    ckv_press_config cfg;   /* parsed, budget set, finalised */
    double budget;          /* the kept fraction (1 for the full cache) */
} ckv_eval_config;

typedef struct {            /* after every (sample, configuration) of world rank 0's group */
    long done, total;       /* items of this group done in this run / to do in this run */
    int group, n_groups;
    const char *task, *sample, *press;
    double budget;
    int n_questions;
    double score;           /* mean over the questions, [0, 1] */
    double seconds;
    const char *skipped;    /* why the sample was skipped, or NULL */
} ckv_eval_event;

typedef struct {
    /* samples: generated tasks ... */
    const ckv_ruler_task *const *tasks;
    int n_tasks;
    const int *lengths;
    int n_lengths;
    int n_samples;
    uint64_t seed;
    const char *haystack_file;   /* essay haystack (NULL: the built-in public-domain prose) */
    /* ... or a dataset */
    const char *data_path;
    ckv_dataset_options data;
    /* configurations */
    const ckv_eval_config *configs;
    int n_configs;
    /* prompting */
    const char *template_name;   /* NULL: the tokenizer's chat template if it has one; "none": plain text */
    const char *system;          /* system message with a chat template (NULL: none) */
    int max_new_tokens;          /* for every question (0: the sample's) */
    int skip_bad;                /* skip samples that cannot run (too long for the model) instead of failing */
    int separate_prefill;        /* prefill every (sample, configuration) on its own instead of once per sample
                                  * for all configurations (engine/sweep.h; the same results, slower) */
    const ckv_decode_press *decode_press; /* decode-time compression of every answer (NULL: none); implies
                                  * separate prefills (a cut context is prepared again per question) */
    /* model and parallelism */
    const char *model_path;
    const char *backend;         /* "cpu" (default) or "cuda" */
    int threads;                 /* 0: the cores of the machine shared among its ranks */
    int chunk;                   /* prefill chunk (0: 512) */
    int tp;                      /* ranks per tensor-parallel group (0: all) */
    int device;                  /* GPU index (-1: device 0 of the rank's view) */
    ckv_dtype kv_dtype, weights_dtype; /* CKV_DTYPE_DEFAULT: the backend's choice */
    /* output */
    const char *out_dir;
    const char *version;         /* ckv version recorded in every line */
    /* callbacks, on world rank 0 only (may be NULL) */
    void (*on_event)(void *ctx, const ckv_eval_event *e);
    void (*on_notice)(void *ctx, const char *msg);
    void *cb_ctx;
    volatile sig_atomic_t *stop; /* non-zero: start no new sample */
} ckv_eval_job;

typedef struct {
    long items, items_done_before, items_run, items_skipped; /* over the job (world rank 0's view) */
    int interrupted;             /* the stop flag ended the run early */
    int collective_error;        /* the error is the same on every rank (print it once) */
    char *table;                 /* the summary table (world rank 0; malloc'd) */
} ckv_eval_outcome;

/* Runs the job on every rank of `world`. */
ckv_status ckv_eval_run(const ckv_eval_job *job, ckv_comm *world, ckv_eval_outcome *out);

/* Locks out_dir against a second ckv eval (an fcntl lock on out_dir/.lock, released when the
 * process ends, so a killed job leaves no stale lock); the error names the directory. */
ckv_status ckv_eval_lock(const char *out_dir, int *fd);
void ckv_eval_unlock(int fd); /* -1 is fine */

/* Merges the results files of `out_dir` into results.jsonl and writes the report; *table (may be
 * NULL) gets the summary table, *n_results (may be NULL) the number of results lines; with
 * n_results, a directory without results is left untouched (*table stays NULL). No model needed. */
ckv_status ckv_eval_finish(const char *out_dir, const char *title, char **table, int *n_results);

#endif
