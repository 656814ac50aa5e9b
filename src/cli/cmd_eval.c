/* cmd_eval.c - `ckv eval`: evaluate a model with KV-cache presses on RULER-style generated tasks or a
 * JSONL dataset, sweeping presses x budgets plus the full cache, resumably, into an output directory
 * (results.jsonl, summary.md/.json, score_vs_budget.svg). This file parses flags, installs the
 * SIGTERM/SIGINT handler that asks the runner to stop at the next sample, prints progress (a bar on a
 * terminal, plain lines otherwise) and the summary; the work is eval/runner.c's. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"
#include "comm/comm.h"
#include "core/log.h"
#include "core/timer.h"
#include "eval/metrics.h"
#include "eval/progress.h"
#include "eval/ruler.h"
#include "eval/runner.h"

#define MAX_LIST 64

static void eval_usage(FILE *f) {
    fprintf(f,
            "usage: ckv eval --model M (--task T --length N | --data F) [--press P --budget B] --out DIR [flags]\n"
            "\n"
            "samples (generated, RULER-style):\n"
            "  --task LIST           niah_single_1, niah_single_2, niah_single_3, niah_multikey_1, niah_multikey_2,\n"
            "                        niah_multikey_3, niah_multivalue, niah_multiquery, vt, cwe, fwe; groups: niah, all\n"
            "  --length LIST         prompt + answer tokens per sample (comma separated for several lengths)\n"
            "  --samples K           samples per task and length (default 10)\n"
            "  --seed S              generator seed (default 42)\n"
            "  --haystack FILE       prose for the essay haystack (default: built in, The Devil's Dictionary, public domain)\n"
            "samples (a dataset):\n"
            "  --data F              JSONL, one sample per line: context, question(s), answer_prefix, answers,\n"
            "                        max_new_tokens, task (kvpress / LongBench style)\n"
            "  --metric NAME         score every sample with NAME (default: the task's): string_match_all,\n"
            "                        string_match_part, qa_f1, rouge_l, classification, retrieval, count, code_sim\n"
            "  --bad-input skip|stop a malformed line, an answer-less sample, a sample longer than the model's window:\n"
            "                        skip it with a warning, or stop with an error (default stop)\n"
            "\n"
            "compression (a sweep: every press at every budget, plus the full cache):\n"
            "  --press LIST          e.g. snapkv,adakv:snapkv,critical:snapkv,critical_adakv:snapkv (default: none)\n"
            "  --budget LIST         kept fractions in (0, 1], e.g. 0.1,0.2,0.4\n"
            "  --no-baseline         do not run the full cache\n"
            "  --query-aware         compress context + question together (default: the context only, one compressed\n"
            "                        cache answers every question of a context)\n"
            "  --window N --kernel K --pool avg|max --alpha A --eps E --safeguard S --profile F\n"
            "  --press-opt KEY=VALUE press options, applied to every press (repeatable)\n"
            "\n"
            "prompting:\n"
            "  --template NAME       chat template (llama3, chatml, smollm2, qwen2.5, mistral, ...) or none for plain\n"
            "                        text (default: the tokenizer's own, plain text when it has none)\n"
            "  --system TEXT         system message (with a chat template)\n"
            "  --max-new-tokens N    generation limit of every question (default: the task's)\n"
            "\n"
            "run:\n"
            "  --out DIR             results.jsonl, summary.md, summary.json, score_vs_budget.svg; a rerun with the same\n"
            "                        arguments resumes (what is done is skipped)\n"
            "  --tp N                ranks per tensor-parallel group (default: all); the groups share the samples\n"
            "  --threads N --chunk N --backend cpu|cuda\n"
            "  --progress auto|bar|lines|none   (default auto: a bar on a terminal, lines otherwise)\n"
            "  --report-only         rebuild the summary and the plot from DIR's results (no model needed)\n");
}

typedef struct {
    const char *model, *task, *length, *data, *press, *budget, *out, *haystack, *metric, *template_name, *system, *backend;
    const char *progress;
    int samples, max_new, tp, threads, chunk, no_baseline, query_aware, skip_bad, report_only;
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

static int is_press_flag(const char *f) {
    static const char *const v[] = {"--window", "--kernel", "--pool", "--alpha", "--eps", "--safeguard", "--profile", "--press-opt"};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (!strcmp(f, v[i])) return 1;
    return 0;
}

static void parse_args(eval_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    a->samples = 10;
    a->seed = 42;
    a->progress = "auto";
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            eval_usage(stdout);
            exit(0);
        } else if (!strcmp(f, "--model")) a->model = ckv_cli_value(argc, argv, &i);
        else if (!strcmp(f, "--task")) a->task = ckv_cli_value(argc, argv, &i);
        else if (!strcmp(f, "--length")) a->length = ckv_cli_value(argc, argv, &i);
        else if (!strcmp(f, "--samples")) a->samples = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 24);
        else if (!strcmp(f, "--seed")) a->seed = ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 0, 0x7fffffffffffffffL);
        else if (!strcmp(f, "--haystack")) a->haystack = ckv_cli_value(argc, argv, &i);
        else if (!strcmp(f, "--data")) a->data = ckv_cli_value(argc, argv, &i);
        else if (!strcmp(f, "--metric")) a->metric = ckv_cli_value(argc, argv, &i);
        else if (!strcmp(f, "--bad-input")) {
            const char *v = ckv_cli_value(argc, argv, &i);
            if (!strcmp(v, "skip")) a->skip_bad = 1;
            else if (!strcmp(v, "stop")) a->skip_bad = 0;
            else ckv_cli_usage_error("eval", "--bad-input: expected skip or stop, got '%s'", v);
        } else if (!strcmp(f, "--press")) a->press = ckv_cli_value(argc, argv, &i);
        else if (!strcmp(f, "--budget")) a->budget = ckv_cli_value(argc, argv, &i);
        else if (!strcmp(f, "--no-baseline")) a->no_baseline = 1;
        else if (!strcmp(f, "--query-aware")) a->query_aware = 1;
        else if (is_press_flag(f)) ckv_cli_value(argc, argv, &i); /* applied per press below */
        else if (!strcmp(f, "--template")) a->template_name = ckv_cli_value(argc, argv, &i);
        else if (!strcmp(f, "--system")) a->system = ckv_cli_value(argc, argv, &i);
        else if (!strcmp(f, "--max-new-tokens")) a->max_new = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(f, "--out")) a->out = ckv_cli_value(argc, argv, &i);
        else if (!strcmp(f, "--tp")) a->tp = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 20);
        else if (!strcmp(f, "--threads")) a->threads = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 4096);
        else if (!strcmp(f, "--chunk")) a->chunk = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 24);
        else if (!strcmp(f, "--backend")) a->backend = ckv_cli_value(argc, argv, &i);
        else if (!strcmp(f, "--progress")) {
            a->progress = ckv_cli_value(argc, argv, &i);
            if (strcmp(a->progress, "auto") && strcmp(a->progress, "bar") && strcmp(a->progress, "lines") &&
                strcmp(a->progress, "none"))
                ckv_cli_usage_error("eval", "--progress: expected auto, bar, lines or none, got '%s'", a->progress);
        } else if (!strcmp(f, "--report-only")) a->report_only = 1;
        else ckv_cli_usage_error("eval", "unknown flag '%s'", f);
    }
    if (!a->out) ckv_cli_usage_error("eval", "--out DIR is required");
    if (a->report_only) return;
    if (!a->model) ckv_cli_usage_error("eval", "--model is required");
    if (!a->task == !a->data) ckv_cli_usage_error("eval", "give exactly one of --task (generated samples) and --data (a JSONL file)");
    if (a->task && !a->length) ckv_cli_usage_error("eval", "--task needs --length N (tokens per sample)");
    if (a->data && (a->length || a->haystack)) ckv_cli_usage_error("eval", "--length and --haystack apply to --task, not --data");
    if (a->press && !a->budget) ckv_cli_usage_error("eval", "--press needs --budget (kept fractions, e.g. 0.1,0.2,0.4)");
    if (a->budget && !a->press) ckv_cli_usage_error("eval", "--budget needs --press");
    if (a->metric) {
        ckv_metric_kind k;
        ckv_cli_check(ckv_metric_by_name(a->metric, &k));
    }
}

/* Applies the shared press flags to one press configuration. */
static void apply_press_flags(ckv_press_config *c, int argc, char **argv) {
    static const char *const opts[][2] = {{"--window", "window"}, {"--kernel", "kernel"}, {"--pool", "pool"}, {"--alpha", "alpha"},
                                          {"--eps", "eps"},       {"--safeguard", "safeguard"}, {"--profile", "profile"}};
    for (int i = 1; i < argc - 1; i++) {
        for (size_t j = 0; j < sizeof opts / sizeof opts[0]; j++)
            if (!strcmp(argv[i], opts[j][0])) ckv_cli_check(ckv_press_set_option(c, opts[j][1], argv[i + 1]));
        if (!strcmp(argv[i], "--press-opt")) {
            const char *kv = argv[i + 1], *eq = strchr(kv, '=');
            if (!eq || eq == kv) ckv_cli_die("--press-opt: expected KEY=VALUE, got '%s'", kv);
            char key[64];
            snprintf(key, sizeof key, "%.*s", (int)(eq - kv), kv);
            ckv_cli_check(ckv_press_set_option(c, key, eq + 1));
        }
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
    parse_args(&a, argc, argv);

    if (a.report_only) {
        int fd = -1;
        ckv_cli_check(ckv_eval_lock(a.out, &fd));
        char *table = NULL;
        ckv_cli_check(ckv_eval_finish(a.out, "ckv eval", &table));
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
    int n_configs = 0;
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
                ckv_cli_check(ckv_press_parse(&c->cfg, presses[p]));
                apply_press_flags(&c->cfg, argc, argv);
                ckv_cli_check(ckv_press_set_budget(&c->cfg, bv));
                c->cfg.query_aware = a.query_aware;
                ckv_cli_check(ckv_press_finalize(&c->cfg));
                snprintf(c->press, sizeof c->press, "%s", presses[p]);
                c->budget = bv;
                for (int k = 0; k < n_configs; k++)
                    if (!strcmp(configs[k].cfg.spec, c->cfg.spec)) ckv_cli_die("--press/--budget: '%s' at %g is listed twice", presses[p], bv);
                n_configs++;
            }
        }
    }
    if (n_configs == 0) ckv_cli_usage_error("eval", "nothing to run: --no-baseline without --press");

    ckv_comm *world = NULL;
    ckv_cli_check(ckv_comm_init_world(&world, &argc, &argv));
    ckv_log_set_rank(world->rank, world->size);
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
    job.model_path = a.model;
    job.backend = a.backend;
    job.threads = a.threads;
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
