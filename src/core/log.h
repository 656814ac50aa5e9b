/* log.h - rank-aware logging to stderr. Only rank 0 prints info/debug; warnings and errors print
 * on every rank, prefixed with the rank when the world has more than one. No exit, no abort. */
#ifndef CKV_LOG_H
#define CKV_LOG_H

typedef enum {
    CKV_LOG_LEVEL_ERROR = 0,
    CKV_LOG_LEVEL_WARN = 1,
    CKV_LOG_LEVEL_INFO = 2,
    CKV_LOG_LEVEL_DEBUG = 3
} ckv_log_level;

void ckv_log_set_rank(int rank, int world);
void ckv_log_set_level(ckv_log_level level);
ckv_log_level ckv_log_get_level(void);
void ckv_log(ckv_log_level level, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

#define CKV_LOG_ERROR(...) ckv_log(CKV_LOG_LEVEL_ERROR, __VA_ARGS__)
#define CKV_LOG_WARN(...) ckv_log(CKV_LOG_LEVEL_WARN, __VA_ARGS__)
#define CKV_LOG_INFO(...) ckv_log(CKV_LOG_LEVEL_INFO, __VA_ARGS__)
#define CKV_LOG_DEBUG(...) ckv_log(CKV_LOG_LEVEL_DEBUG, __VA_ARGS__)

#endif
