/* threadpool.h - a fixed pool of worker threads running parallel-for loops. The caller's thread
 * takes part as worker 0; a pool of 1 thread runs everything inline. Not re-entrant: a task must
 * not call back into the same pool. */
#ifndef CKV_THREADPOOL_H
#define CKV_THREADPOOL_H

#include "status.h"

typedef struct ckv_threadpool ckv_threadpool;

/* fn(ctx, begin, end, tid): process items [begin, end) on worker tid (0 <= tid < n_threads). */
typedef void (*ckv_parallel_fn)(void *ctx, int begin, int end, int tid);

ckv_status ckv_threadpool_init(ckv_threadpool **out, int n_threads);
void ckv_threadpool_free(ckv_threadpool *pool); /* NULL is fine */
int ckv_threadpool_size(const ckv_threadpool *pool);

/* Splits [0, n) into contiguous blocks (at least `grain` items each) over the workers and waits. */
void ckv_threadpool_for(ckv_threadpool *pool, int n, int grain, ckv_parallel_fn fn, void *ctx);

/* Number of cores this process may use (sched affinity), at least 1. */
int ckv_cpu_count(void);

#endif
