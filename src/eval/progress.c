/* progress.c - rate, time-left and text rendering of an evaluation's progress; no printing. */
#include "eval/progress.h"

#include <stdio.h>
#include <string.h>

void ckv_progress_init(ckv_progress *p, long total, double now) {
    memset(p, 0, sizeof *p);
    p->total = total;
    p->t0 = now;
}

void ckv_progress_advance(ckv_progress *p, long n, double now) {
    for (long i = 0; i < n; i++) {
        p->stamp[p->n_stamps % CKV_PROGRESS_WINDOW] = now;
        p->n_stamps++;
    }
    p->done += n;
}

double ckv_progress_rate(const ckv_progress *p, double now) {
    if (p->done <= 0) return 0.0;
    long k = p->n_stamps < CKV_PROGRESS_WINDOW ? p->n_stamps : CKV_PROGRESS_WINDOW;
    /* the window's items over the time since the item before the window (or the start) */
    double since = p->n_stamps > CKV_PROGRESS_WINDOW ? p->stamp[p->n_stamps % CKV_PROGRESS_WINDOW] : p->t0;
    if (p->n_stamps > CKV_PROGRESS_WINDOW) k = CKV_PROGRESS_WINDOW - 1;
    double dt = now - since;
    if (k <= 0 || dt <= 0) return 0.0;
    return (double)k / dt;
}

double ckv_progress_eta(const ckv_progress *p, double now) {
    double r = ckv_progress_rate(p, now);
    if (r <= 0) return -1.0;
    long left = p->total - p->done;
    return left > 0 ? (double)left / r : 0.0;
}

void ckv_progress_duration(double s, char *buf, size_t cap) {
    if (s < 0) {
        snprintf(buf, cap, "?");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, cap, "%ldh%02ldm", t / 3600, (t / 60) % 60);
    else if (t >= 60) snprintf(buf, cap, "%ldm%02lds", t / 60, t % 60);
    else snprintf(buf, cap, "%lds", t);
}

static void rate_text(double r, char *buf, size_t cap) {
    if (r <= 0) snprintf(buf, cap, "-");
    else if (r >= 1.0) snprintf(buf, cap, "%.2f/s", r);
    else if (r * 60 >= 1.0) snprintf(buf, cap, "%.2f/min", r * 60);
    else snprintf(buf, cap, "%.2f/h", r * 3600);
}

void ckv_progress_bar(const ckv_progress *p, double now, int width, const char *label, char *buf, size_t cap) {
    char bar[256], rate[32], eta[32];
    if (width < 1) width = 1;
    if (width > (int)sizeof bar - 1) width = (int)sizeof bar - 1;
    double f = p->total > 0 ? (double)p->done / (double)p->total : 1.0;
    int fill = (int)(f * width + 1e-9);
    for (int i = 0; i < width; i++) bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    rate_text(ckv_progress_rate(p, now), rate, sizeof rate);
    ckv_progress_duration(ckv_progress_eta(p, now), eta, sizeof eta);
    snprintf(buf, cap, "\r[%s] %ld/%ld %3.0f%% %s ETA %s %s\x1b[K", bar, p->done, p->total, 100.0 * f, rate, eta,
             label ? label : "");
}

void ckv_progress_line(const ckv_progress *p, double now, const char *label, char *buf, size_t cap) {
    char rate[32], eta[32];
    rate_text(ckv_progress_rate(p, now), rate, sizeof rate);
    ckv_progress_duration(ckv_progress_eta(p, now), eta, sizeof eta);
    double f = p->total > 0 ? (double)p->done / (double)p->total : 1.0;
    snprintf(buf, cap, "%ld/%ld (%.0f%%), %s, ETA %s: %s", p->done, p->total, 100.0 * f, rate, eta, label ? label : "");
}
