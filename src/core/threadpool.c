/* threadpool.c - pthread pool with a generation counter. A loop is cut into one contiguous chunk per
 * thread (the split depends only on the item count and the pool size); any thread may run any chunk,
 * passing the chunk's index as tid, and chunks are claimed one at a time through an atomic word that
 * holds the loop's generation and the next chunk. The caller runs chunks too, so a worker that is
 * asleep or descheduled when a loop starts (a loaded machine) delays nothing: the caller takes its
 * chunk, and the worker, once it runs, finds none left. Between loops a worker spins on the counter
 * for up to CKV_SPIN_S of wall time, then sleeps on a condition variable; the caller waits for the
 * claimed chunks the same way. Each side takes the mutex only when the other is asleep (a count of
 * sleepers read after the counter moves: both sequentially consistent). It does not choose how work
 * is split (callers do). */
#define _GNU_SOURCE
#include "threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "timer.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CKV_SPIN_PAUSE() _mm_pause()
#else
#define CKV_SPIN_PAUSE() ((void)0)
#endif

/* Wall time a waiting thread spins before sleeping: longer than the serial host work between the
 * parallel phases of one eviction op and between the ops of a layer's eviction (per-head factors,
 * statistics, selection: tens to a few hundred microseconds), so those hand-offs cost a cache line's
 * round trip instead of a wake-up through the kernel; an idle pool (a server between requests) has its
 * workers asleep after it, having burnt a core for this long at most. The clock is read every
 * CKV_SPIN_CHECK pauses (a pause is 10-140 cycles depending on the CPU). */
#define CKV_SPIN_S 3e-4
#define CKV_SPIN_CHECK 64

struct ckv_threadpool {
    int n;
    pthread_t *threads; /* [n - 1] */
    pthread_mutex_t mu;
    pthread_cond_t cv_start;
    pthread_cond_t cv_done;
    atomic_ulong generation;    /* bumped to start a loop */
    atomic_uint_least64_t claim; /* generation << 32 | the next chunk to run */
    atomic_int done;            /* chunks of the current loop finished */
    atomic_int sleepers;        /* workers asleep (or about to be) on cv_start */
    atomic_int caller_asleep;   /* the caller asleep (or about to be) on cv_done */
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

/* Claims and runs chunks of loop `gen` until none is left. The loop's description is read before the
 * claim: a claim that succeeds proves the loop is still `gen` (it cannot end before the claimed chunk
 * does), so what was read is that loop's. Returns the chunks this thread ran. */
static int ckv_run_chunks(ckv_threadpool *p, unsigned long gen) {
    int ran = 0;
    for (;;) {
        ckv_parallel_fn fn = p->fn;
        void *ctx = p->ctx;
        const int total = p->total, chunks = p->chunks;
        uint64_t v = atomic_load(&p->claim);
        int c;
        do {
            if ((v >> 32) != (uint32_t)gen) return ran;
            c = (int)(uint32_t)v;
            if (c >= chunks) return ran;
        } while (!atomic_compare_exchange_weak(&p->claim, &v, v + 1));
        const int base = total / chunks, rem = total % chunks;
        const int begin = c * base + (c < rem ? c : rem), end = begin + base + (c < rem ? 1 : 0);
        if (end > begin) fn(ctx, begin, end, c);
        ran++;
        /* the last chunk wakes a caller that went to sleep */
        if (atomic_fetch_add(&p->done, 1) + 1 == chunks && atomic_load(&p->caller_asleep)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

/* Spins while the generation is `seen` (new_loop) or while chunks of a loop of `chunks` are unfinished
 * (!new_loop), for at most CKV_SPIN_S; 1 when the wait is over, 0 when the thread should sleep. */
static int ckv_spin_wait(ckv_threadpool *p, int new_loop, unsigned long seen, int chunks) {
    double t0 = 0.0;
    for (int i = 1;; i++) {
        if (new_loop ? (atomic_load_explicit(&p->generation, memory_order_acquire) != seen ||
                        atomic_load_explicit(&p->stop, memory_order_relaxed))
                     : atomic_load_explicit(&p->done, memory_order_acquire) == chunks)
            return 1;
        CKV_SPIN_PAUSE();
        if (i % CKV_SPIN_CHECK == 0) {
            const double t = ckv_time_now();
            if (t0 == 0.0)
                t0 = t;
            else if (t - t0 > CKV_SPIN_S)
                return 0;
        }
    }
}

static void *ckv_worker_main(void *arg) {
    ckv_worker_arg a = *(ckv_worker_arg *)arg;
    free(arg);
    ckv_threadpool *p = a.pool;
    unsigned long seen = 0;
    for (;;) {
        if (!ckv_spin_wait(p, 1, seen, 0)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1); /* then the counter is read: the caller sees one or the other */
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv_start, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = atomic_load(&p->generation);
        ckv_run_chunks(p, seen);
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
    p->fn = fn;
    p->ctx = ctx;
    p->total = n;
    p->chunks = chunks;
    atomic_store(&p->done, 0);
    const unsigned long gen = atomic_load(&p->generation) + 1;
    atomic_store(&p->claim, (uint64_t)(uint32_t)gen << 32);
    atomic_store(&p->generation, gen); /* then the sleepers are read: a worker sees one or the other */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_start);
        pthread_mutex_unlock(&p->mu);
    }
    ckv_run_chunks(p, gen);
    if (!ckv_spin_wait(p, 0, 0, chunks)) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->caller_asleep, 1); /* then done is read: the last chunk sees one or the other */
        while (atomic_load(&p->done) < chunks) pthread_cond_wait(&p->cv_done, &p->mu);
        atomic_store(&p->caller_asleep, 0);
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
