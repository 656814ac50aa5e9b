/* cmd_eval.c - `ckv eval`: evaluate a model with KV-cache presses on RULER-style generated tasks or a
 * JSONL dataset, sweeping presses x budgets plus the full cache, resumably, into an output directory
 * (results.jsonl, summary.md/.json, score_vs_budget.svg). This file parses flags, installs the
 * SIGTERM/SIGINT handler that asks the runner to stop at the next sample, prints progress (a bar on a
 * terminal, plain lines otherwise) and the summary; the work is eval/runner.c's. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/cli_agree.h"
#include "cli/cli_opts.h"
#include "cli/cli_press.h"
#include "comm/comm.h"
#include "core/log.h"
#include "core/timer.h"
#include "eval/metrics.h"
#include "eval/progress.h"
#include "eval/ruler.h"
#include "eval/runner.h"

#define MAX_LIST 64

static const ckv_cli_command eval_cmd = {
    CKV_CMD_EVAL, "eval", "-m M (--task T --length N | --data F) [--press P --budget B] --out DIR [flags]",
    "Scores presses x budgets (a sweep, plus the full cache) on RULER-style generated tasks or a JSONL\n"
    "dataset into DIR, resumably: a rerun of the same command skips what is done."};

typedef struct {
    const char *model, *task, *length, *data, *press, *budget, *out, *haystack, *metric, *template_name, *system, *backend;
    const char *progress;
    int samples, max_new, tp, threads, chunk, no_baseline, query_aware, skip_bad, report_only, separate_prefill;
    long long seed;
} eval_args;

/* Splits a comma list into at most MAX_LIST pieces (pointers into a copy). */
static int split_list(const char *flag, const char *s, char *buf, size_t cap, const char **out) {
    if (strlen(s) >= cap) ckv_cli_die("%s: list too long", flag);
    strcpy(buf, s);
    int n = 0;
    for (char *p = buf;;) {
        char *e = strchr(p, ',');
        if (e) *e = '\0';
        if (!*p) ckv_cli_die("%s '%s': empty item", flag, s);
        if (n == MAX_LIST) ckv_cli_die("%s: at most %d items", flag, MAX_LIST);
        out[n++] = p;
        if (!e) break;
        p = e + 1;
    }
    return n;
}

static void parse_args(eval_args *a, ckv_opts *o, int argc, char **argv) {
    ckv_opts_parse(o, &eval_cmd, argc, argv);
    memset(a, 0, sizeof *a);
    a->model = ckv_opt_str(o, CKV_OPT_MODEL, NULL);
    a->task = ckv_opt_str(o, CKV_OPT_TASK, NULL);
    a->length = ckv_opt_str(o, CKV_OPT_LENGTH, NULL);
    a->samples = (int)ckv_opt_long(o, CKV_OPT_SAMPLES, 10);
    a->seed = ckv_opt_long(o, CKV_OPT_SEED, 42);
    a->haystack = ckv_opt_str(o, CKV_OPT_HAYSTACK, NULL);
    a->data = ckv_opt_str(o, CKV_OPT_DATA, NULL);
    a->metric = ckv_opt_str(o, CKV_OPT_METRIC, NULL);
    a->skip_bad = !strcmp(ckv_opt_str(o, CKV_OPT_BAD_INPUT, "stop"), "skip");
    a->separate_prefill = ckv_opt_has(o, CKV_OPT_SEPARATE_PREFILL) > 0;
    a->press = ckv_opt_str(o, CKV_OPT_PRESS, NULL);
    a->budget = ckv_opt_str(o, CKV_OPT_BUDGET, NULL);
    a->no_baseline = ckv_opt_has(o, CKV_OPT_NO_BASELINE);
    a->query_aware = ckv_opt_has(o, CKV_OPT_QUERY_AWARE);
    a->template_name = ckv_opt_str(o, CKV_OPT_TEMPLATE, NULL);
    a->system = ckv_opt_str(o, CKV_OPT_SYSTEM, NULL);
    a->max_new = (int)ckv_opt_long(o, CKV_OPT_MAX_NEW_TOKENS, 0);
    a->out = ckv_opt_str(o, CKV_OPT_OUT, NULL);
    a->tp = (int)ckv_opt_long(o, CKV_OPT_TP, 0);
    a->chunk = (int)ckv_opt_long(o, CKV_OPT_CHUNK, 0);
    a->backend = ckv_opt_str(o, CKV_OPT_BACKEND, NULL);
    a->progress = ckv_opt_str(o, CKV_OPT_PROGRESS, "auto");
    a->report_only = ckv_opt_has(o, CKV_OPT_REPORT_ONLY);
    if (!a->out) ckv_cli_usage_error("eval", "--out DIR is required");
    if (a->report_only) {
        for (int i = 0; i < o->n; i++)
            if (o->occ[i].id != CKV_OPT_OUT && o->occ[i].id != CKV_OPT_REPORT_ONLY && o->occ[i].id != CKV_OPT_PROGRESS)
                ckv_cli_usage_error("eval", "--report-only reads DIR's results only: drop %s", ckv_opt_flag(o->occ[i].id));
        return;
    }
    if (!a->model) ckv_cli_usage_error("eval", "--model is required");
    if (!a->task == !a->data) ckv_cli_usage_error("eval", "give exactly one of --task (generated samples) and --data (a JSONL file)");
    if (a->task && !a->length) ckv_cli_usage_error("eval", "--task needs --length N (tokens per sample)");
    if (a->data && (a->length || a->haystack || ckv_opt_has(o, CKV_OPT_SAMPLES) || ckv_opt_has(o, CKV_OPT_SEED)))
        ckv_cli_usage_error("eval", "--length, --samples, --seed and --haystack apply to --task, not --data");
    if (a->task && (a->metric || ckv_opt_has(o, CKV_OPT_BAD_INPUT)))
        ckv_cli_usage_error("eval", "--metric and --bad-input apply to --data, not --task");
    if (a->press && !a->budget) ckv_cli_usage_error("eval", "--press needs --budget (kept fractions, e.g. 0.1,0.2,0.4)");
    if (a->budget && !a->press) ckv_cli_usage_error("eval", "--budget needs --press");
    if (a->metric) {
        ckv_metric_kind k;
        ckv_cli_check(ckv_metric_by_name(a->metric, &k));
    }
}

/* ---- progress and notices (world rank 0) --------------------------------------------------------------- */

typedef struct {
    int mode;          /* 0 none, 1 bar, 2 lines */
    int bar_shown;
    ckv_progress p;
    int started;
} printer;

static void on_notice(void *ctx, const char *msg) {
    printer *pr = ctx;
    if (pr->bar_shown) fprintf(stderr, "\r\x1b[K");
    fprintf(stderr, "ckv eval: %s\n", msg);
    pr->bar_shown = 0;
}

static void on_event(void *ctx, const ckv_eval_event *e) {
    printer *pr = ctx;
    double now = ckv_time_now();
    if (!pr->started) {
        ckv_progress_init(&pr->p, e->total, now - e->seconds);
        pr->started = 1;
    }
    ckv_progress_advance(&pr->p, 1, now);
    char label[512], line[768];
    const char *press = strcmp(e->press, "none") ? e->press : "full cache";
    if (e->skipped)
        snprintf(label, sizeof label, "%s %s b=%g skipped: %s", e->sample, press, e->budget, e->skipped);
    else
        snprintf(label, sizeof label, "%s %s b=%g score %.2f (%.1f s)", e->sample, press, e->budget, e->score, e->seconds);
    if (e->skipped && pr->mode != 2) on_notice(pr, label + 0);
    if (pr->mode == 1) {
        char bar_label[96];
        snprintf(bar_label, sizeof bar_label, "%.90s", label);
        ckv_progress_bar(&pr->p, now, 30, bar_label, line, sizeof line);
        fputs(line, stderr);
        pr->bar_shown = 1;
        if (pr->p.done == pr->p.total) {
            fputc('\n', stderr);
            pr->bar_shown = 0;
        }
    } else if (pr->mode == 2) {
        ckv_progress_line(&pr->p, now, label, line, sizeof line);
        fprintf(stderr, "ckv eval: %s\n", line);
    }
    fflush(stderr);
}

/* ---- signals ----------------------------------------------------------------------------------------------- */

static volatile sig_atomic_t stop_signal = 0;

static void on_signal(int sig) {
    if (stop_signal) { /* a second signal: stop now */
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    stop_signal = sig;
    static const char msg[] = "\nckv eval: stopping after the sample in flight (signal again to stop now)\n";
    ssize_t w = write(2, msg, sizeof msg - 1);
    (void)w;
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

/* ---- main ---------------------------------------------------------------------------------------------------- */

int ckv_cmd_eval(int argc, char **argv) {
    eval_args a;
    ckv_opts opts;
    parse_args(&a, &opts, argc, argv);

    if (a.report_only) {
        int fd = -1, n_results = 0;
        struct stat sb;
        if (stat(a.out, &sb) != 0 || !S_ISDIR(sb.st_mode)) ckv_cli_die("--report-only: %s is not a directory of results", a.out);
        ckv_cli_check(ckv_eval_lock(a.out, &fd));
        char *table = NULL;
        ckv_cli_check(ckv_eval_finish(a.out, "ckv eval", &table, &n_results));
        if (n_results == 0)
            ckv_cli_die("--report-only: %s holds no results (an eval there ended before its first sample); run the eval first",
                        a.out);
        fputs(table, stdout);
        free(table);
        ckv_eval_unlock(fd);
        return 0;
    }

    /* samples */
    const ckv_ruler_task **tasks = NULL;
    int n_tasks = 0, lengths[MAX_LIST], n_lengths = 0;
    if (a.task) {
        ckv_cli_check(ckv_ruler_task_list(a.task, &tasks, &n_tasks));
        char buf[1024];
        const char *items[MAX_LIST];
        n_lengths = split_list("--length", a.length, buf, sizeof buf, items);
        for (int i = 0; i < n_lengths; i++) lengths[i] = (int)ckv_cli_parse_long("--length", items[i], 16, 1 << 24);
    }
    /* configurations: the full cache, then every press at every budget */
    ckv_eval_config *configs = calloc(1 + (size_t)MAX_LIST * MAX_LIST, sizeof *configs);
    if (!configs) ckv_cli_die("out of memory");
    int n_configs = 0, has_decode = 0;
    ckv_decode_press decode; /* --decode-press: every answer of every configuration */
    if (!a.no_baseline) {
        ckv_cli_check(ckv_press_parse(&configs[0].cfg, "none"));
        ckv_cli_check(ckv_press_finalize(&configs[0].cfg));
        snprintf(configs[0].press, sizeof configs[0].press, "none");
        configs[0].budget = 1.0;
        n_configs = 1;
    }
    if (a.press) {
        char pbuf[2048], bbuf[1024];
        const char *presses[MAX_LIST], *budgets[MAX_LIST];
        int np = split_list("--press", a.press, pbuf, sizeof pbuf, presses);
        int nb = split_list("--budget", a.budget, bbuf, sizeof bbuf, budgets);
        for (int p = 0; p < np; p++) {
            if (!strcmp(presses[p], "none")) continue; /* the full cache is the baseline */
            for (int b = 0; b < nb; b++) {
                ckv_eval_config *c = &configs[n_configs];
                double bv = ckv_cli_parse_double("--budget", budgets[b], -1e300, 1e300);
                ckv_cli_budget bud = {CKV_CLI_BUDGET_FRACTION, bv};
                ckv_cli_press_build(&opts, presses[p], &bud, &c->cfg);
                c->cfg.query_aware = a.query_aware;
                ckv_cli_check(ckv_press_finalize(&c->cfg));
                if (c->cfg.scorer == CKV_SCORER_FINCH) /* its window is the question's tokens */
                    ckv_cli_usage_error("eval", "--press finch: its window is the question's tokens, which eval does not "
                                        "know (query-aware prompts are encoded as one text); run ckv generate "
                                        "--query-aware or the server");
                snprintf(c->press, sizeof c->press, "%s", presses[p]);
                c->budget = bv;
                for (int k = 0; k < n_configs; k++)
                    if (!strcmp(configs[k].cfg.spec, c->cfg.spec)) ckv_cli_die("--press/--budget: '%s' at %g is listed twice", presses[p], bv);
                n_configs++;
            }
        }
    }
    if (n_configs == 0) ckv_cli_usage_error("eval", "nothing to run: --no-baseline without --press");
    {
        char what[256];
        snprintf(what, sizeof what, "--press %.240s", a.press ? a.press : "none");
        int np = n_configs - !a.no_baseline;
        ckv_press_config *pcs = calloc((size_t)np + 1, sizeof *pcs);
        if (!pcs) ckv_cli_die("out of memory");
        for (int c = 0; c < np; c++) pcs[c] = configs[c + !a.no_baseline].cfg;
        ckv_press_config *all_cfgs = calloc((size_t)n_configs, sizeof *all_cfgs);
        if (!all_cfgs) ckv_cli_die("out of memory");
        for (int c = 0; c < n_configs; c++) all_cfgs[c] = configs[c].cfg;
        has_decode = ckv_cli_decode_press(&opts, all_cfgs, n_configs, &decode);
        free(all_cfgs);
        if (has_decode) {
            pcs[np++] = decode.press; /* its options count as taken */
            snprintf(what + strlen(what), sizeof what - strlen(what), " and --decode-press");
        }
        ckv_cli_press_check_options(&opts, pcs, np, what);
        free(pcs);
    }
    if (a.query_aware && !a.press) ckv_cli_usage_error("eval", "--query-aware needs --press");

    ckv_cli_agreement ag;
    ckv_cli_agree_init(&ag, &opts, a.model);
    for (int c = 0; c < n_configs; c++) ckv_cli_agree_add(&ag, CKV_AGREE_PRESS, configs[c].cfg.spec, strlen(configs[c].cfg.spec));
    if (has_decode) ckv_cli_agree_add(&ag, CKV_AGREE_PRESS, decode.spec, strlen(decode.spec));
    ckv_comm *world = ckv_cli_world(&ag, &argc, &argv);
    install_signals();

    printer pr;
    memset(&pr, 0, sizeof pr);
    int tty = isatty(2);
    pr.mode = !strcmp(a.progress, "none") ? 0 : !strcmp(a.progress, "bar") ? 1 : !strcmp(a.progress, "lines") ? 2 : tty ? 1 : 2;

    ckv_eval_job job;
    memset(&job, 0, sizeof job);
    job.tasks = tasks;
    job.n_tasks = n_tasks;
    job.lengths = lengths;
    job.n_lengths = n_lengths;
    job.n_samples = a.samples;
    job.seed = (uint64_t)a.seed;
    job.haystack_file = a.haystack;
    job.data_path = a.data;
    job.data.skip_bad = a.skip_bad;
    job.data.metric = a.metric;
    job.data.warn = on_notice;
    job.data.warn_ctx = &pr;
    job.configs = configs;
    job.n_configs = n_configs;
    job.template_name = a.template_name;
    job.system = a.system;
    job.max_new_tokens = a.max_new;
    job.skip_bad = a.skip_bad;
    job.separate_prefill = a.separate_prefill;
    job.decode_press = has_decode ? &decode : NULL;
    job.model_path = a.model;
    job.backend = a.backend;
    ckv_engine_config ec;
    ckv_cli_engine_config(&opts, world, &ec);
    job.threads = ec.threads;
    job.device = ec.device;
    job.kv_dtype = ec.kv_dtype;
    job.weights_dtype = ec.weights_dtype;
    job.chunk = a.chunk;
    job.tp = a.tp;
    job.out_dir = a.out;
    job.version = CKV_VERSION;
    job.on_event = on_event;
    job.on_notice = on_notice;
    job.cb_ctx = &pr;
    job.stop = &stop_signal;
    if (world->rank != 0) job.data.warn = NULL;

    ckv_eval_outcome out;
    ckv_status s = ckv_eval_run(&job, world, &out);
    if (s != CKV_STATUS_OK) {
        const char *msg = ckv_error_message();
        if (pr.bar_shown) fprintf(stderr, "\n");
        if (out.collective_error || world->size == 1) {
            if (world->rank == 0) fprintf(stderr, "ckv: error: %s\n", msg[0] ? msg : ckv_status_string(s));
            fflush(stderr);
            ckv_comm_free(world);
            exit(1);
        }
        fprintf(stderr, "ckv[%d]: error: %s\n", world->rank, msg[0] ? msg : ckv_status_string(s));
        fflush(stderr);
        world->ops->abort(world, 1);
        exit(1);
    }
    if (world->rank == 0) {
        if (pr.bar_shown) fprintf(stderr, "\n");
        if (out.table) fputs(out.table, stdout);
        fflush(stdout);
        fprintf(stderr, "ckv eval: %ld item(s) run, %ld skipped, %ld done before; results %s/results.jsonl, summary %s/summary.md, "
                "plot %s/score_vs_budget.svg\n", out.items_run, out.items_skipped, out.items_done_before, a.out, a.out, a.out);
        if (out.interrupted)
            fprintf(stderr, "ckv eval: interrupted; the finished samples are saved: run the same command again to resume\n");
    }
    free(out.table);
    free(configs);
    free(tasks);
    int interrupted = out.interrupted;
    ckv_comm_free(world);
    if (interrupted) return 128 + (stop_signal ? (int)stop_signal : SIGTERM);
    return 0;
}
