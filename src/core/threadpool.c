/* threadpool.c - pthread pool with a generation counter. Between loops a worker first spins for a
 * few microseconds on the counter (decode issues one short loop per op, and a wake-up through the
 * kernel costs more than the op), then sleeps on a condition variable; the caller waits for the
 * workers the same way. It does not choose how work is split (callers do). */
#define _GNU_SOURCE
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CKV_SPIN_PAUSE() _mm_pause()
#else
#define CKV_SPIN_PAUSE() ((void)0)
#endif

/* Spin iterations before sleeping: a pause is 10-140 cycles depending on the CPU, so this is on the
 * order of 10-100 microseconds: longer than the gap between two ops of a decode step, much shorter
 * than anything a waiting thread could otherwise use the core for. */
#define CKV_SPIN_ITERS 2048

struct ckv_threadpool {
    int n;
    pthread_t *threads; /* [n - 1] */
    pthread_mutex_t mu;
    pthread_cond_t cv_start;
    pthread_cond_t cv_done;
    atomic_ulong generation; /* bumped (under mu) to start a loop */
    atomic_int pending;      /* workers still running the current loop */
    atomic_int stop;
    /* the current loop */
    ckv_parallel_fn fn;
    void *ctx;
    int total;
    int chunks;
};

typedef struct {
    ckv_threadpool *pool;
    int tid;
} ckv_worker_arg;

static void ckv_run_chunk(ckv_threadpool *p, int tid) {
    if (tid >= p->chunks) return;
    int base = p->total / p->chunks, rem = p->total % p->chunks;
    int begin = tid * base + (tid < rem ? tid : rem);
    int end = begin + base + (tid < rem ? 1 : 0);
    if (end > begin) p->fn(p->ctx, begin, end, tid);
}

static void *ckv_worker_main(void *arg) {
    ckv_worker_arg a = *(ckv_worker_arg *)arg;
    free(arg);
    ckv_threadpool *p = a.pool;
    unsigned long seen = 0;
    for (;;) {
        /* spin first; the loop's description was written before the counter moved (release) */
        for (int i = 0; i < CKV_SPIN_ITERS && atomic_load_explicit(&p->generation, memory_order_acquire) == seen &&
                        !atomic_load_explicit(&p->stop, memory_order_relaxed);
             i++)
            CKV_SPIN_PAUSE();
        if (atomic_load_explicit(&p->generation, memory_order_acquire) == seen) {
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv_start, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        ckv_run_chunk(p, a.tid);
        /* the last worker wakes a caller that went to sleep (it checks pending under mu) */
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

ckv_status ckv_threadpool_init(ckv_threadpool **out, int n_threads) {
    *out = NULL;
    if (n_threads < 1) return ckv_error(CKV_STATUS_ERR_ARG, "thread count must be >= 1, got %d", n_threads);
    ckv_threadpool *p = calloc(1, sizeof *p);
    if (!p) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory creating the thread pool");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads) {
            ckv_threadpool_free(p);
            return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory creating the thread pool");
        }
        for (int i = 1; i < n_threads; i++) {
            ckv_worker_arg *a = malloc(sizeof *a);
            if (!a || pthread_create(&p->threads[i - 1], NULL, ckv_worker_main, a ? (a->pool = p, a->tid = i, a) : NULL) != 0) {
                free(a);
                p->n = i; /* only i - 1 workers exist */
                ckv_threadpool_free(p);
                return ckv_error(CKV_STATUS_ERR_NOMEM, "could not start worker thread %d of %d", i, n_threads);
            }
        }
    }
    *out = p;
    return CKV_STATUS_OK;
}

void ckv_threadpool_free(ckv_threadpool *p) {
    if (!p) return;
    if (p->threads) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->stop, 1);
        pthread_cond_broadcast(&p->cv_start);
        pthread_mutex_unlock(&p->mu);
        for (int i = 1; i < p->n; i++) pthread_join(p->threads[i - 1], NULL);
        free(p->threads);
    }
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    free(p);
}

int ckv_threadpool_size(const ckv_threadpool *p) { return p ? p->n : 1; }

void ckv_threadpool_for(ckv_threadpool *p, int n, int grain, ckv_parallel_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int chunks = p ? p->n : 1;
    if (chunks > (n + grain - 1) / grain) chunks = (n + grain - 1) / grain;
    if (chunks <= 1) {
        fn(ctx, 0, n, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    p->chunks = chunks;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    ckv_run_chunk(p, 0);
    for (int i = 0; i < CKV_SPIN_ITERS && atomic_load_explicit(&p->pending, memory_order_acquire) > 0; i++)
        CKV_SPIN_PAUSE();
    if (atomic_load_explicit(&p->pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0) pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

int ckv_cpu_count(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int c = CPU_COUNT(&set);
        if (c > 0) return c;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}
