/* cli_util.c - flag parsing and fatal errors for the ckv command line. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "comm/comm.h"

/* The message as one printable line: arguments quoted from the command line may hold control bytes. */
static void cli_vprint_escaped(const char *fmt, va_list ap) {
    char raw[2048], esc[8192];
    vsnprintf(raw, sizeof raw, fmt, ap);
    ckv_escape_text(esc, sizeof esc, raw);
    fputs(esc, stderr);
}

_Noreturn void ckv_cli_die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ckv: error: ");
    cli_vprint_escaped(fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

_Noreturn void ckv_cli_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ckv %s: error: ", cmd);
    cli_vprint_escaped(fmt, ap);
    fprintf(stderr, " (see 'ckv %s --help')\n", cmd);
    va_end(ap);
    exit(2);
}

void ckv_cli_check(ckv_status s) {
    if (s != CKV_STATUS_OK) {
        const char *msg = ckv_error_message();
        ckv_cli_die("%s", msg[0] ? msg : ckv_status_string(s));
    }
}

void ckv_cli_check_comm(ckv_comm *comm, ckv_status s) {
    if (s == CKV_STATUS_OK) return;
    const char *msg = ckv_error_message();
    if (comm && comm->size > 1)
        fprintf(stderr, "ckv[%d]: error: %s\n", comm->rank, msg[0] ? msg : ckv_status_string(s));
    else
        fprintf(stderr, "ckv: error: %s\n", msg[0] ? msg : ckv_status_string(s));
    fflush(stderr);
    if (comm && comm->size > 1) comm->ops->abort(comm, 1);
    exit(1);
}

long ckv_cli_parse_long(const char *flag, const char *value, long min, long max) {
    char *end = NULL;
    errno = 0;
    long v = strtol(value, &end, 10);
    if (errno || end == value || *end != '\0')
        ckv_cli_die("%s: expected an integer, got '%s'", flag, value);
    if (v < min || v > max) ckv_cli_die("%s: %ld is outside [%ld, %ld]", flag, v, min, max);
    return v;
}

double ckv_cli_parse_double(const char *flag, const char *value, double min, double max) {
    char *end = NULL;
    errno = 0;
    double v = strtod(value, &end);
    if (errno || end == value || *end != '\0' || !isfinite(v))
        ckv_cli_die("%s: expected a number, got '%s'", flag, value);
    if (v < min || v > max) ckv_cli_die("%s: %g is outside [%g, %g]", flag, v, min, max);
    return v;
}

int32_t *ckv_cli_parse_ids(const char *text, int *n, const char *what) {
    size_t cap = 64, cnt = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) ckv_cli_die("out of memory parsing %s", what);
    const char *p = text;
    for (;;) {
        int commas = 0;
        while (*p == ',' || *p == ' ' || *p == '\n' || *p == '\t' || *p == '\r') commas += *p++ == ',';
        if (!*p) break;
        if (commas > (cnt > 0 ? 1 : 0))
            ckv_cli_die("%s: empty item before token %zu (two commas, or a leading comma)", what, cnt);
        char *end = NULL;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX) {
            int len = 0;
            while (p[len] && p[len] != ',' && p[len] != ' ' && p[len] != '\n' && len < 20) len++;
            ckv_cli_die("%s: '%.*s' at token %zu is not a non-negative token id", what, len, p, cnt);
        }
        if (*end && *end != ',' && *end != ' ' && *end != '\n' && *end != '\t' && *end != '\r')
            ckv_cli_die("%s: unexpected character '%c' after token %zu", what, *end, cnt);
        if (cnt == cap) {
            cap *= 2;
            int32_t *bigger = realloc(ids, cap * sizeof *ids);
            if (!bigger) ckv_cli_die("out of memory parsing %s", what);
            ids = bigger;
        }
        ids[cnt++] = (int32_t)v;
        p = end;
    }
    if (cnt == 0) ckv_cli_die("%s: no token ids given", what);
    if (cnt > INT32_MAX / 2) ckv_cli_die("%s: too many token ids", what);
    *n = (int)cnt;
    return ids;
}

void ckv_cli_engine_config(const ckv_opts *o, ckv_comm *world, ckv_engine_config *ec) {
    memset(ec, 0, sizeof *ec);
    ec->model_path = ckv_opt_str(o, CKV_OPT_MODEL, NULL);
    ec->backend = ckv_opt_str(o, CKV_OPT_BACKEND, "cpu");
    int local_rank = 0, local_size = 1;
    if (world) ckv_cli_check_comm(world, ckv_comm_node_local(world, &local_rank, &local_size));
    ec->threads = ckv_opts_threads(o, local_size, !world || world->rank == 0);
    ec->chunk = (int)ckv_opt_long(o, CKV_OPT_CHUNK, 512);
    ec->device = (int)ckv_opt_long(o, CKV_OPT_DEVICE, -1);
    if (ec->device < 0 && !strcmp(ec->backend, "cuda") && world && ckv_backend_cuda_available())
        ckv_cli_check_comm(world, ckv_comm_select_gpu(world, &ec->device));
    const char *kv = ckv_opt_str(o, CKV_OPT_KV_DTYPE, NULL), *w = ckv_opt_str(o, CKV_OPT_WEIGHTS_DTYPE, "auto");
    ec->kv_dtype = !kv ? CKV_DTYPE_DEFAULT : !strcmp(kv, "f32") ? CKV_DTYPE_F32 : !strcmp(kv, "f16") ? CKV_DTYPE_F16
                                                                                                  : CKV_DTYPE_BF16;
    ec->weights_dtype = !strcmp(w, "auto") ? CKV_DTYPE_DEFAULT : !strcmp(w, "f32") ? CKV_DTYPE_F32
                        : !strcmp(w, "bf16") ? CKV_DTYPE_BF16 : CKV_DTYPE_F16;
    if (ckv_opt_has(o, CKV_OPT_RANDOM_WEIGHTS)) {
        /* scores of answers and of agreement with a full cache mean nothing without trained weights */
        if (o->cmd == CKV_CMD_EVAL || o->cmd == CKV_CMD_FIDELITY)
            ckv_cli_usage_error(o->cmd_name, "--random-weights: %s scores answers, which random weights make meaningless "
                                "(use it with generate or analyze)", o->cmd_name);
        ec->random_weights = 1;
        ec->random_seed = (uint64_t)ckv_opt_long(o, CKV_OPT_RANDOM_WEIGHTS, 0);
    }
}
