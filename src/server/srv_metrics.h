/* srv_metrics.h - the server's counters, gauges and latency histograms, updated from the HTTP threads
 * and the engine thread under one mutex, rendered in the Prometheus text exposition format for
 * GET /metrics. It does not serve HTTP. */
#ifndef CKV_SRV_METRICS_H
#define CKV_SRV_METRICS_H

#include <pthread.h>
#include <stddef.h>

#define CKV_SRV_HIST_BUCKETS 14

typedef struct {
    double sum;
    long count;
    long buckets[CKV_SRV_HIST_BUCKETS]; /* cumulative at render time; stored per bucket */
} ckv_srv_hist;

typedef struct {
    pthread_mutex_t mu;
    long status_codes[600];
    long prompt_tokens, completion_tokens, reused_tokens;
    long cache_hits, cache_misses, cache_disk_hits;
    long prefill_batches, prefill_batched_contexts; /* batched prefill forwards, the contexts they took */
    long requests_cancelled;
    long decode_compressions, decode_evicted_entries; /* decode-time compressions that evicted rows, rows x KV heads evicted */
    long request_timeouts;  /* connections shut down because a request did not arrive in time */
    ckv_srv_hist ttft, itl, e2e;
    /* gauges (engine thread) */
    long queue_length, running;
    size_t kv_bytes_in_use, kv_bytes_saved, store_bytes;
    long store_entries;
    unsigned long long kv_bytes_saved_total;
} ckv_srv_metrics;

void ckv_srv_metrics_init(ckv_srv_metrics *m);
void ckv_srv_metrics_free(ckv_srv_metrics *m);

void ckv_srv_metrics_status(ckv_srv_metrics *m, int http_status);
void ckv_srv_metrics_observe(ckv_srv_metrics *m, ckv_srv_hist *h, double seconds); /* h: &m->ttft, ... */

/* Renders every metric (*out malloc'd). */
int ckv_srv_metrics_render(ckv_srv_metrics *m, char **out, size_t *len);

#endif
