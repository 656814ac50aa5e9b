/* status.h - status codes (X-macro table: enum + string) and the thread-local error message.
 * Library code returns a ckv_status and records a one-line message naming the file, tensor, flag
 * or request at fault with ckv_error(). It never prints or exits; that is left to cli/ and tests. */
#ifndef CKV_STATUS_H
#define CKV_STATUS_H

#include <stddef.h>

#define CKV_STATUS_TABLE(X)                        \
    X(OK, "ok")                                    \
    X(ERR_ARG, "invalid argument")                 \
    X(ERR_IO, "i/o error")                         \
    X(ERR_FORMAT, "malformed input")               \
    X(ERR_UNSUPPORTED, "unsupported")              \
    X(ERR_SHAPE, "shape mismatch")                 \
    X(ERR_NOMEM, "out of memory")                  \
    X(ERR_RANGE, "out of range")                   \
    X(ERR_COMM, "communication error")             \
    X(ERR_DEVICE, "device error")                  \
    X(ERR_NUMERIC, "non-finite values")            \
    X(ERR_CONTEXT_TOO_LONG, "context too long")    \
    X(ERR_CANCELLED, "cancelled")                  \
    X(ERR_INTERNAL, "internal error")

typedef enum {
#define CKV_STATUS_ENUM_(name, str) CKV_STATUS_##name,
    CKV_STATUS_TABLE(CKV_STATUS_ENUM_)
#undef CKV_STATUS_ENUM_
    CKV_STATUS_COUNT_
} ckv_status;

/* Short name of a status ("malformed input"). */
const char *ckv_status_string(ckv_status s);

/* Records a printf-style message for this thread and returns `code` (so: return ckv_error(...)).
 * The formatted message is stored escaped as ckv_escape_text does, so it is always one printable
 * line whatever the arguments quote. */
ckv_status ckv_error(ckv_status code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Copies the NUL-terminated `in` to out[cap] with every control byte, DEL, C1 control and byte
 * that is not valid UTF-8 written as \xNN (printable ASCII and valid UTF-8 are kept); stops before
 * a sequence that would not fit. Returns the length written. Idempotent: escaping twice changes
 * nothing. */
size_t ckv_escape_text(char *out, size_t cap, const char *in);

/* The last message recorded on this thread ("" when none). */
const char *ckv_error_message(void);

/* Clears this thread's message. */
void ckv_error_clear(void);

/* Propagates a failing status to the caller. */
#define CKV_TRY(expr)                                          \
    do {                                                       \
        ckv_status ckv_try_s_ = (expr);                        \
        if (ckv_try_s_ != CKV_STATUS_OK) return ckv_try_s_;    \
    } while (0)

/* Same, but jumps to a cleanup label with the status stored in `var`. */
#define CKV_TRY_GOTO(var, expr, label)                         \
    do {                                                       \
        (var) = (expr);                                        \
        if ((var) != CKV_STATUS_OK) goto label;                \
    } while (0)

#endif
