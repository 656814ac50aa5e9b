/* runner_dir.c - the output directory of `ckv eval` (world rank 0): creation, the lock against a
 * second job, the setup check against run.json, the done set read from the results files, and the
 * final merge into one sorted results.jsonl + the report. It runs no model. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/json.h"
#include "eval/report.h"
#include "eval/results.h"
#include "eval/ruler.h"
#include "eval/runner_internal.h"

ckv_status ckv_runner_mkdir(const char *dir) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return ckv_error(CKV_STATUS_ERR_ARG, "--out: path too long");
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return ckv_error(CKV_STATUS_ERR_IO, "--out: cannot create directory %s: %s", p, strerror(errno));
            *s = '/';
        }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        return ckv_error(CKV_STATUS_ERR_IO, "--out: cannot create directory %s: %s", p, strerror(errno));
    struct stat st;
    if (stat(p, &st) != 0 || !S_ISDIR(st.st_mode)) return ckv_error(CKV_STATUS_ERR_IO, "--out: %s is not a directory", p);
    return CKV_STATUS_OK;
}

static uint64_t fnv_file(const char *path, ckv_status *st) {
    char *buf = NULL;
    size_t len = 0;
    *st = ckv_read_file(path, &buf, &len);
    if (*st != CKV_STATUS_OK) return 0;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (unsigned char)buf[i]) * 1099511628211ull;
    free(buf);
    return h;
}

/* ---- world rank 0: lock, setup check, done set ----------------------------------------------------- */

ckv_status ckv_eval_lock(const char *dir, int *fd_out) {
    *fd_out = -1;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/.lock", dir);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) return ckv_error(CKV_STATUS_ERR_IO, "cannot create %s: %s", path, strerror(errno));
    struct flock fl;
    memset(&fl, 0, sizeof fl);
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (fcntl(fd, F_SETLK, &fl) != 0) {
        close(fd);
        return ckv_error(CKV_STATUS_ERR_IO, "%s is in use by another ckv eval (it holds %s); wait for it or use another --out",
                         dir, path);
    }
    *fd_out = fd;
    return CKV_STATUS_OK;
}

void ckv_eval_unlock(int fd) {
    if (fd >= 0) close(fd);
}

/* The setup that results of one directory must share; a different one is refused. */
static ckv_status identity_json(const runner *r, uint64_t data_hash, char **out) {
    const ckv_eval_job *j = r->job;
    ckv_strbuf b;
    ckv_strbuf_init(&b);
    ckv_strbuf_adds(&b, "{\"model\": ");
    ckv_strbuf_json_string(&b, r->model_id);
    if (j->data_path) {
        char abs[PATH_MAX];
        ckv_strbuf_adds(&b, ", \"data\": ");
        ckv_strbuf_json_string(&b, realpath(j->data_path, abs) ? abs : j->data_path);
        ckv_strbuf_printf(&b, ", \"data_fnv1a\": \"%016llx\"", (unsigned long long)data_hash);
    } else {
        ckv_strbuf_adds(&b, ", \"data\": \"ruler\", \"haystack\": ");
        ckv_strbuf_json_string(&b, j->haystack_file ? j->haystack_file : "builtin:devils-dictionary");
    }
    ckv_strbuf_adds(&b, ", \"template\": ");
    ckv_strbuf_json_string(&b, j->template_name ? j->template_name : "auto");
    ckv_strbuf_adds(&b, ", \"system\": ");
    ckv_strbuf_json_string(&b, j->system ? j->system : "");
    ckv_strbuf_printf(&b, ", \"max_new_tokens\": %d, \"decoding\": \"greedy\"}", j->max_new_tokens);
    return ckv_strbuf_take(&b, out, "run.json");
}

/* Compares the setup with the directory's run.json; *to_write (malloc'd) gets the setup to record
 * when the directory has none yet (written once every check passed). */
ckv_status ckv_runner_check_identity(const runner *r, char **to_write) {
    const ckv_eval_job *j = r->job;
    *to_write = NULL;
    ckv_status st = CKV_STATUS_OK;
    uint64_t h = j->data_path ? fnv_file(j->data_path, &st) : 0;
    CKV_TRY(st);
    char *mine = NULL;
    CKV_TRY(identity_json(r, h, &mine));
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/run.json", j->out_dir);
    if (access(path, F_OK) != 0) {
        *to_write = mine;
        return CKV_STATUS_OK;
    }
    ckv_json *old = NULL, *cur = NULL;
    st = ckv_json_parse_file(&old, path);
    if (st == CKV_STATUS_OK) st = ckv_json_parse_buffer(&cur, mine, strlen(mine), "the setup");
    static const char *const keys[] = {"model", "data", "data_fnv1a", "haystack", "template", "system", "max_new_tokens"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0] && st == CKV_STATUS_OK; k++) {
        char *a = cJSON_PrintUnformatted(ckv_json_get(old, keys[k]));
        char *b = cJSON_PrintUnformatted(ckv_json_get(cur, keys[k]));
        if ((a || b) && (!a || !b || strcmp(a, b) != 0))
            st = ckv_error(CKV_STATUS_ERR_ARG, "%s holds results of another setup: %s was %s, now %s (%s); use another --out "
                           "or remove that directory", j->out_dir, keys[k], a ? a : "(none)", b ? b : "(none)",
                           !strcmp(keys[k], "data_fnv1a") ? "the data file changed" : "see run.json");
        free(a);
        free(b);
    }
    ckv_json_free(old);
    ckv_json_free(cur);
    free(mine);
    return st;
}

static int is_part_file(const char *name) {
    size_t n = strlen(name);
    return !strncmp(name, "results.g", 9) && n > 15 && !strcmp(name + n - 6, ".jsonl");
}

/* Reads results.jsonl and every part file of dir (cutting partial last lines). */
static ckv_status read_all_results(const char *dir, ckv_eval_result **rows, int *n) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/results.jsonl", dir);
    CKV_TRY(ckv_eval_results_read(path, 1, rows, n));
    DIR *d = opendir(dir);
    if (!d) return ckv_error(CKV_STATUS_ERR_IO, "cannot list %s: %s", dir, strerror(errno));
    struct dirent *e;
    ckv_status st = CKV_STATUS_OK;
    while (st == CKV_STATUS_OK && (e = readdir(d)) != NULL)
        if (is_part_file(e->d_name)) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            st = ckv_eval_results_read(path, 1, rows, n);
        }
    closedir(d);
    return st;
}

static int cmp_cstr(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The done bitmap over (sample, configuration): every question of the sample has a result. */
ckv_status ckv_runner_compute_done(runner *r, long *n_done) {
    const ckv_eval_job *j = r->job;
    ckv_eval_result *rows = NULL;
    int n = 0;
    CKV_TRY(read_all_results(j->out_dir, &rows, &n));
    char **keys = malloc(sizeof(char *) * (size_t)(n > 0 ? n : 1));
    ckv_status st = keys ? CKV_STATUS_OK : ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory reading results");
    int nk = 0;
    for (int i = 0; i < n && st == CKV_STATUS_OK; i++) {
        st = ckv_eval_result_key(rows[i].press_spec, rows[i].sample, rows[i].question, &keys[nk]);
        if (st == CKV_STATUS_OK) nk++;
    }
    if (st == CKV_STATUS_OK) qsort(keys, (size_t)nk, sizeof *keys, cmp_cstr);
    *n_done = 0;
    for (int s = 0; s < r->n_total && st == CKV_STATUS_OK; s++) {
        char sid[320];
        int nq = 1;
        if (j->data_path) {
            snprintf(sid, sizeof sid, "%s", r->data[s].id);
            nq = r->data[s].n_questions;
        } else {
            int t, l, i;
            ckv_runner_decode_sample(j, s, &t, &l, &i);
            ckv_ruler_sample_id(j->tasks[t]->name, j->lengths[l], j->seed, i, sid, sizeof sid);
        }
        for (int c = 0; c < j->n_configs && st == CKV_STATUS_OK; c++) {
            int all = 1;
            for (int q = 0; q < nq && all && st == CKV_STATUS_OK; q++) {
                char *k = NULL;
                st = ckv_eval_result_key(j->configs[c].cfg.spec, sid, q, &k);
                if (st == CKV_STATUS_OK) all = bsearch(&k, keys, (size_t)nk, sizeof *keys, cmp_cstr) != NULL;
                free(k);
            }
            r->done[(size_t)s * j->n_configs + c] = (unsigned char)all;
            *n_done += all;
        }
    }
    for (int i = 0; i < nk; i++) free(keys[i]);
    free(keys);
    ckv_eval_results_free(rows, n);
    return st;
}

ckv_status ckv_eval_finish(const char *out_dir, const char *title, char **table, int *n_results) {
    if (table) *table = NULL;
    ckv_eval_result *rows = NULL;
    int n = 0;
    ckv_status st = read_all_results(out_dir, &rows, &n);
    if (n_results) *n_results = n;
    if (st == CKV_STATUS_OK && n_results && n == 0) return CKV_STATUS_OK; /* nothing to report: write nothing */
    if (st == CKV_STATUS_OK) ckv_eval_results_sort_unique(rows, &n);
    ckv_strbuf b;
    ckv_strbuf_init(&b);
    for (int i = 0; i < n && st == CKV_STATUS_OK; i++) {
        ckv_strbuf_adds(&b, rows[i].line);
        ckv_strbuf_addc(&b, '\n');
    }
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/results.jsonl", out_dir);
    if (st == CKV_STATUS_OK) st = ckv_strbuf_status(&b, "results.jsonl");
    if (st == CKV_STATUS_OK) st = ckv_eval_write_atomic(path, b.s ? b.s : "", b.len);
    ckv_strbuf_free(&b);
    if (st == CKV_STATUS_OK) { /* the parts are in results.jsonl now */
        DIR *d = opendir(out_dir);
        struct dirent *e;
        while (d && (e = readdir(d)) != NULL)
            if (is_part_file(e->d_name)) {
                snprintf(path, sizeof path, "%s/%s", out_dir, e->d_name);
                unlink(path);
            }
        if (d) closedir(d);
    }
    if (st == CKV_STATUS_OK) st = ckv_eval_report_write(out_dir, rows, n, title, table);
    ckv_eval_results_free(rows, n);
    return st;
}
