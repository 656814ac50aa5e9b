/* progress.h - progress of a long evaluation: items done out of a total, the rate (over a sliding
 * window of recent items, so a slow first item does not skew it) and the time left, rendered either
 * as a one-line bar for a terminal ("\r[#####.....] 12/50 24% 1.5/min ETA 25m10s label") or as a
 * plain log line. It formats text only: the caller decides where (and whether) to print it. */
#ifndef CKV_EVAL_PROGRESS_H
#define CKV_EVAL_PROGRESS_H

#include <stddef.h>

#define CKV_PROGRESS_WINDOW 16

typedef struct {
    long total, done;
    double t0;                               /* start time (seconds) */
    double stamp[CKV_PROGRESS_WINDOW];       /* finish times of the last items */
    long n_stamps;
} ckv_progress;

void ckv_progress_init(ckv_progress *p, long total, double now);
/* Records that `n` more items finished at time `now`. */
void ckv_progress_advance(ckv_progress *p, long n, double now);
/* Items per second (0 before the first item). */
double ckv_progress_rate(const ckv_progress *p, double now);
/* Seconds left (< 0 when unknown). */
double ckv_progress_eta(const ckv_progress *p, double now);

/* "1h02m", "3m05s", "42s" into buf. */
void ckv_progress_duration(double seconds, char *buf, size_t cap);
/* A terminal line: '\r', a bar of `width` cells, counts, percent, rate, ETA, the label, and a clear
 * to the end of the line. */
void ckv_progress_bar(const ckv_progress *p, double now, int width, const char *label, char *buf, size_t cap);
/* A log line: "12/50 (24%), 1.5 per minute, ETA 25m10s: label". */
void ckv_progress_line(const ckv_progress *p, double now, const char *label, char *buf, size_t cap);

#endif
