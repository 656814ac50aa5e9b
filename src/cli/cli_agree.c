/* cli_agree.c - the start-up agreement of the ranks of a job (see cli_agree.h). */
#define _POSIX_C_SOURCE 200809L
#include "cli/cli_agree.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "core/log.h"
#include "core/timer.h"
#include "model/weights_digest.h"

static uint64_t fnv(uint64_t h, const void *data, size_t len) {
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

#define FNV0 1469598103934665603ull

void ckv_cli_agree_add(ckv_cli_agreement *a, int item, const void *data, size_t len) {
    a->h[item] = fnv(a->h[item] ? a->h[item] : FNV0, data, len);
    a->h[item] = fnv(a->h[item], &len, sizeof len); /* lengths too: "1,2" + "3" differs from "1" + "2,3" */
}

/* Up to `cap` bytes of a file's start mixed into h. */
static uint64_t hash_file_head(uint64_t h, const char *path, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return fnv(h, "(unreadable)", 12);
    char buf[65536];
    size_t got, total = 0;
    while (total < cap && (got = fread(buf, 1, sizeof buf < cap - total ? sizeof buf : cap - total, f)) > 0) {
        h = fnv(h, buf, got);
        total += got;
    }
    fclose(f);
    return h;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static uint64_t model_fingerprint(const char *path) {
    uint64_t h = FNV0;
    struct stat st;
    if (stat(path, &st) != 0) return fnv(h, "(missing)", 9);
    if (!S_ISDIR(st.st_mode)) {
        long long size = (long long)st.st_size;
        h = fnv(h, &size, sizeof size);
        return hash_file_head(h, path, 1 << 20); /* a GGUF file's header and metadata */
    }
    char p[4096];
    snprintf(p, sizeof p, "%s/config.json", path);
    h = hash_file_head(h, p, 1 << 20);
    DIR *d = opendir(path);
    if (!d) return h;
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < 256) {
        size_t l = strlen(e->d_name);
        if (l > 12 && !strcmp(e->d_name + l - 12, ".safetensors")) names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof *names, cmp_names);
    for (int i = 0; i < n; i++) {
        if (!names[i]) continue;
        snprintf(p, sizeof p, "%s/%s", path, names[i]);
        long long size = stat(p, &st) == 0 ? (long long)st.st_size : -1;
        h = fnv(fnv(h, names[i], strlen(names[i])), &size, sizeof size);
        free(names[i]);
    }
    return h;
}

void ckv_cli_agree_init(ckv_cli_agreement *a, const ckv_opts *o, const char *model_path) {
    memset(a, 0, sizeof *a);
    a->comm_timeout_s = ckv_opt_num(o, CKV_OPT_COMM_TIMEOUT, 0);
    ckv_cli_agree_add(a, CKV_AGREE_COMMAND, o->cmd_name, strlen(o->cmd_name));
    if (model_path) a->h[CKV_AGREE_MODEL] = model_fingerprint(model_path);
    if (model_path) snprintf(a->model_path, sizeof a->model_path, "%s", model_path);
    a->verify = ckv_opt_def_of(o, CKV_OPT_VERIFY_WEIGHTS) ? ckv_digest_mode_parse(ckv_opt_str(o, CKV_OPT_VERIFY_WEIGHTS, "sample"))
                                                          : CKV_DIGEST_NONE;
    a->tp = ckv_opt_def_of(o, CKV_OPT_TP) ? (int)ckv_opt_long(o, CKV_OPT_TP, 0) : 0;
    for (int i = 0; i < o->n; i++) {
        if (o->occ[i].def->per_rank) continue;
        const char *v = o->occ[i].value ? o->occ[i].value : "(set)";
        ckv_cli_agree_add(a, CKV_AGREE_FIRST_OPT + (int)o->occ[i].id, v, strlen(v));
    }
}

static const char *item_name(int item, char *buf, size_t cap) {
    switch (item) {
    case CKV_AGREE_COMMAND: return "the command";
    case CKV_AGREE_MODEL: return "the model (its config and weight file sizes)";
    case CKV_AGREE_PROMPT: return "the prompt token ids";
    case CKV_AGREE_QUESTIONS: return "the question token ids";
    case CKV_AGREE_PRESS: return "the press";
    default: snprintf(buf, cap, "%s", ckv_opt_flag((ckv_opt_id)(item - CKV_AGREE_FIRST_OPT))); return buf;
    }
}

static void exit_together(ckv_comm *world) {
    fflush(stderr);
    world->ops->barrier(world);
    ckv_comm_free(world);
    exit(1);
}

/* The digest of every model file, compared across the ranks: first one word per rank (its status,
 * file count and a digest of the digests), then, when they differ, every file's. */
static void agree_weights(ckv_comm *world, const ckv_cli_agreement *a) {
    if (a->verify == CKV_DIGEST_NONE || !a->model_path[0]) return;
    int parts = a->tp > 0 ? a->tp : world->size;
    ckv_weights_digest d;
    double t0 = ckv_time_now();
    ckv_status st = ckv_weights_digest_compute(&d, a->model_path, (ckv_digest_mode)a->verify, parts);
    if (st != CKV_STATUS_OK) {
        fprintf(stderr, "ckv[%d]: error: %s\n", world->rank, ckv_error_message());
        ckv_error_clear();
    }
    const char *how = a->verify == CKV_DIGEST_FULL ? "full: every byte" : "sample: headers, tensor tables and sampled blocks";
    CKV_LOG_DEBUG("--verify-weights %s of %d files: %.1f KiB hashed in %.2f ms", a->verify == CKV_DIGEST_FULL ? "full" : "sample",
                  d.n, (double)d.bytes_read / 1024.0, 1e3 * (ckv_time_now() - t0));
    uint64_t sum = 0;
    for (int i = 0; i < d.n; i++) sum = sum * 1099511628211ull ^ d.digest[i];
    uint64_t mine[3] = {st == CKV_STATUS_OK, (uint64_t)d.n, sum};
    uint64_t *all = malloc(sizeof mine * (size_t)world->size);
    if (!all) ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory comparing the ranks' model files"));
    ckv_cli_check_comm(world, world->ops->allgather(world, mine, all, sizeof mine));
    int failed = 0, differ = 0, max_n = 0;
    for (int r = 0; r < world->size; r++) {
        failed += !all[3 * r];
        differ += all[3 * r + 1] != all[1] || all[3 * r + 2] != all[2];
        if ((int)all[3 * r + 1] > max_n) max_n = (int)all[3 * r + 1];
    }
    if (failed) { /* each failed rank printed why */
        free(all);
        ckv_weights_digest_free(&d);
        exit_together(world);
    }
    if (!differ) {
        free(all);
        ckv_weights_digest_free(&d);
        return;
    }
    /* which file: every rank's digests, padded to the longest list */
    uint64_t *files = calloc((size_t)max_n * (size_t)(world->size + 1), sizeof *files);
    if (!files) ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory comparing the ranks' model files"));
    uint64_t *gathered = files + max_n;
    memcpy(files, d.digest, sizeof *files * (size_t)d.n);
    ckv_cli_check_comm(world, world->ops->allgather(world, files, gathered, sizeof *files * (size_t)max_n));
    if (world->rank == 0) {
        int f = 0;
        for (; f < max_n; f++) {
            int any = 0;
            for (int r = 1; r < world->size; r++) any |= gathered[(size_t)r * max_n + f] != gathered[f];
            if (any) break;
        }
        char ranks[256] = "";
        size_t len = 0;
        int shown = 0;
        for (int r = 1; r < world->size; r++)
            if ((f >= max_n || gathered[(size_t)r * max_n + f] != gathered[f]) && len + 16 < sizeof ranks)
                len += (size_t)snprintf(ranks + len, sizeof ranks - len, "%s%d", shown++ ? ", " : "", r);
        struct stat sb;
        int dir = stat(a->model_path, &sb) == 0 && S_ISDIR(sb.st_mode);
        fprintf(stderr, "ckv: error: the ranks of this job read different model files: %s%s%s differs on rank%s %s from "
                "rank 0's (--verify-weights %s); give every rank the same copy of the model\n",
                dir ? (f < d.n ? d.names[f] : "a file") : a->model_path, dir ? " under " : "", dir ? a->model_path : "",
                shown > 1 ? "s" : "", ranks, how);
    }
    free(files);
    free(all);
    ckv_weights_digest_free(&d);
    exit_together(world);
}

void ckv_cli_agree_check(ckv_comm *world, const ckv_cli_agreement *a) {
    if (!world || world->size < 2) return;
    size_t bytes = sizeof a->h;
    uint64_t *all = malloc(bytes * (size_t)world->size);
    if (!all) ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory comparing the ranks"));
    ckv_cli_check_comm(world, world->ops->allgather(world, a->h, all, bytes));
    for (int item = 0; item < CKV_AGREE_ITEMS; item++) {
        int differ = 0;
        for (int r = 1; r < world->size; r++) differ += all[(size_t)r * CKV_AGREE_ITEMS + item] != all[item];
        if (!differ) continue;
        if (world->rank == 0) {
            char ranks[256] = "", nb[64];
            size_t len = 0;
            int shown = 0;
            for (int r = 1; r < world->size; r++)
                if (all[(size_t)r * CKV_AGREE_ITEMS + item] != all[item] && len + 16 < sizeof ranks) {
                    len += (size_t)snprintf(ranks + len, sizeof ranks - len, "%s%d", shown++ ? ", " : "", r);
                }
            fprintf(stderr, "ckv: error: the ranks of this job disagree on %s: rank%s %s differ%s from rank 0; start every "
                    "rank with the same command, model, flags and prompt\n", item_name(item, nb, sizeof nb),
                    differ > 1 ? "s" : "", ranks, differ > 1 ? "" : "s");
            fflush(stderr);
        }
        free(all);
        exit_together(world);
    }
    free(all);
    agree_weights(world, a);
}

ckv_comm *ckv_cli_world(ckv_cli_agreement *a, int *argc, char ***argv) {
    ckv_comm *world = NULL;
    ckv_comm_params cp;
    ckv_comm_params_default(&cp);
    if (a->comm_timeout_s > 0) cp.timeout_s = a->comm_timeout_s;
    ckv_cli_check(ckv_comm_init_world_params(&world, argc, argv, &cp));
    ckv_log_set_rank(world->rank, world->size);
    ckv_cli_agree_check(world, a);
    return world;
}
