/* test_threadpool.c - the thread pool's loops: every item runs exactly once, in the chunk the split
 * names (the same ranges for the same tid on every loop), with no two threads inside one chunk at
 * once; loops issued back to back (workers spinning), after pauses longer than the spin (workers
 * asleep), with fewer items than threads, and from a pool of one thread. It does not time anything. */
#define _POSIX_C_SOURCE 200809L
#include <stdatomic.h>
#include <time.h>

#include "ckv_test.h"
#include "core/threadpool.h"

#define TP_MAX_ITEMS 4096
#define TP_MAX_THREADS 8

typedef struct {
    atomic_int hits[TP_MAX_ITEMS];        /* times item i ran */
    atomic_int busy[TP_MAX_THREADS];      /* threads inside chunk tid now */
    int begin[TP_MAX_THREADS], end[TP_MAX_THREADS]; /* the range chunk tid got */
    atomic_int bad_tid, overlap;
} tp_record;

static void tp_visit(void *ctx, int begin, int end, int tid) {
    tp_record *r = ctx;
    if (tid < 0 || tid >= TP_MAX_THREADS) {
        atomic_fetch_add(&r->bad_tid, 1);
        return;
    }
    if (atomic_fetch_add(&r->busy[tid], 1) != 0) atomic_fetch_add(&r->overlap, 1);
    r->begin[tid] = begin;
    r->end[tid] = end;
    for (int i = begin; i < end; i++) atomic_fetch_add(&r->hits[i], 1);
    atomic_fetch_sub(&r->busy[tid], 1);
}

/* One loop over n items; checks each item ran once and the chunks are the split's. */
static void tp_check_loop(ckv_threadpool *pool, int threads, int n, int grain, const char *what) {
    static tp_record r;
    memset(&r, 0, sizeof r);
    for (int t = 0; t < TP_MAX_THREADS; t++) r.begin[t] = r.end[t] = -1;
    ckv_threadpool_for(pool, n, grain, tp_visit, &r);
    int wrong = 0;
    for (int i = 0; i < n; i++)
        if (atomic_load(&r.hits[i]) != 1) {
            if (wrong++ < 5) fprintf(stderr, "  %s (n %d): item %d ran %d times\n", what, n, i, atomic_load(&r.hits[i]));
        }
    CHECK_MSG(wrong == 0, "%s: %d of %d items did not run exactly once", what, wrong, n);
    CHECK_MSG(atomic_load(&r.bad_tid) == 0 && atomic_load(&r.overlap) == 0, "%s: tid out of range %d times, shared %d times",
              what, atomic_load(&r.bad_tid), atomic_load(&r.overlap));
    int chunks = threads < (n + grain - 1) / grain ? threads : (n + grain - 1) / grain;
    if (chunks < 1) chunks = 1;
    const int base = n / chunks, rem = n % chunks;
    for (int c = 0; c < chunks; c++) {
        const int b = c * base + (c < rem ? c : rem), e = b + base + (c < rem ? 1 : 0);
        CHECK_MSG(r.begin[c] == b && r.end[c] == e, "%s (n %d): chunk %d ran [%d, %d), expected [%d, %d)", what, n, c,
                  r.begin[c], r.end[c], b, e);
    }
    for (int c = chunks; c < TP_MAX_THREADS; c++) CHECK_MSG(r.begin[c] == -1, "%s (n %d): chunk %d ran", what, n, c);
}

static void tp_sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int main(void) {
    const int sizes[] = {1, 2, 3, 4};
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        const int threads = sizes[s];
        ckv_threadpool *pool = NULL;
        CHECK_OK(ckv_threadpool_init(&pool, threads));
        if (!pool) continue;
        CHECK(ckv_threadpool_size(pool) == threads);
        for (int i = 0; i < 2000; i++) tp_check_loop(pool, threads, 1 + (i * 37) % TP_MAX_ITEMS, 1, "back to back");
        for (int i = 0; i < 5; i++) {
            tp_sleep_ms(5); /* longer than the spin: the workers are asleep when the loop starts */
            tp_check_loop(pool, threads, 1000 + i, 1, "after a pause");
        }
        tp_check_loop(pool, threads, threads > 1 ? threads - 1 : 1, 1, "fewer items than threads");
        tp_check_loop(pool, threads, 1000, 400, "grain");
        ckv_threadpool_free(pool);
    }
    ckv_threadpool_free(NULL);
    ckv_threadpool *pool = NULL;
    CHECK_FAILS(ckv_threadpool_init(&pool, 0), CKV_STATUS_ERR_ARG, "thread count");
    CHECK(pool == NULL);
    return ckv_test_finish("test_threadpool");
}
