/* read_bw.c - the machine's memory read bandwidth, for the decode rooflines of bench_llamacpp.py and
 * the byte floors of bench_press_cost.py: T threads each sum their contiguous share of a buffer of MiB
 * mebibytes (far larger than the caches) with 8 independent accumulators, 5 times; prints the best
 * pass as {"read_gb_s": ...}.
 * usage: read_bw [THREADS (2)] [MIB (1024)] */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef struct {
    const float *p;
    size_t n;
    double sum;
} share;

static void *sum_share(void *arg) {
    share *s = arg;
    float acc[8] = {0};
    for (size_t i = 0; i + 8 <= s->n; i += 8)
        for (int l = 0; l < 8; l++) acc[l] += s->p[i + l];
    for (int l = 0; l < 8; l++) s->sum += acc[l];
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    if (threads < 1 || threads > 256 || mib < 64) {
        fprintf(stderr, "usage: read_bw [THREADS 1..256] [MIB >= 64]\n");
        return 2;
    }
    size_t n = mib * 1024 * 1024 / sizeof(float);
    float *buf = malloc(n * sizeof *buf);
    if (!buf) {
        fprintf(stderr, "read_bw: out of memory for %zu MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 7);
    pthread_t tid[256];
    share sh[256];
    double best = 0, check = 0;
    for (int pass = 0; pass < 5; pass++) {
        double t0 = now();
        for (int t = 0; t < threads; t++) {
            sh[t] = (share){buf + n / (size_t)threads * (size_t)t, n / (size_t)threads, 0};
            pthread_create(&tid[t], NULL, sum_share, &sh[t]);
        }
        for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL), check += sh[t].sum;
        double gbs = (double)(n / (size_t)threads * (size_t)threads) * sizeof(float) / (now() - t0) / 1e9;
        if (gbs > best) best = gbs;
    }
    printf("{\"read_gb_s\": %.3f, \"threads\": %d, \"mib\": %zu, \"check\": %.0f}\n", best, threads, mib, check);
    free(buf);
    return 0;
}
