/* status.c - status strings and the thread-local error message buffer. */
#include "status.h"

#include <stdarg.h>
#include <stdio.h>

static const char *const ckv_status_strings[] = {
#define CKV_STATUS_STR_(name, str) str,
    CKV_STATUS_TABLE(CKV_STATUS_STR_)
#undef CKV_STATUS_STR_
};

static _Thread_local char ckv_error_buf[1024];

const char *ckv_status_string(ckv_status s) {
    if ((int)s < 0 || s >= CKV_STATUS_COUNT_) return "unknown status";
    return ckv_status_strings[s];
}

ckv_status ckv_error(ckv_status code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ckv_error_buf, sizeof ckv_error_buf, fmt, ap);
    va_end(ap);
    return code;
}

const char *ckv_error_message(void) { return ckv_error_buf; }

void ckv_error_clear(void) { ckv_error_buf[0] = '\0'; }
