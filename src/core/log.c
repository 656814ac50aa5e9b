/* log.c - rank-aware stderr logging (see log.h); every line is escaped as error messages are
 * (status.h: ckv_escape_text), so quoted input cannot break it or drive the terminal. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>

#include "status.h"

static int ckv_log_rank = 0;
static int ckv_log_world = 1;
static ckv_log_level ckv_log_cur = CKV_LOG_LEVEL_INFO;

void ckv_log_set_rank(int rank, int world) {
    ckv_log_rank = rank;
    ckv_log_world = world;
}

void ckv_log_set_level(ckv_log_level level) { ckv_log_cur = level; }

ckv_log_level ckv_log_get_level(void) { return ckv_log_cur; }

void ckv_log(ckv_log_level level, const char *fmt, ...) {
    if (level > ckv_log_cur) return;
    if (level >= CKV_LOG_LEVEL_INFO && ckv_log_rank != 0) return;
    static const char *const tags[] = {"error: ", "warning: ", "", "debug: "};
    char raw[2048], line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    ckv_escape_text(line, sizeof line, raw);
    if (ckv_log_world > 1)
        fprintf(stderr, "ckv[%d]: %s%s\n", ckv_log_rank, tags[level], line);
    else
        fprintf(stderr, "ckv: %s%s\n", tags[level], line);
}
