/* srv_metrics.c - counters, histograms and their Prometheus text rendering (see srv_metrics.h). */
#include "server/srv_metrics.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* upper bounds in seconds (the last bucket is +Inf) */
static const double hist_le[CKV_SRV_HIST_BUCKETS - 1] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60};

void ckv_srv_metrics_init(ckv_srv_metrics *m) {
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
}

void ckv_srv_metrics_free(ckv_srv_metrics *m) {
    if (m) pthread_mutex_destroy(&m->mu);
}

void ckv_srv_metrics_status(ckv_srv_metrics *m, int code) {
    pthread_mutex_lock(&m->mu);
    if (code >= 100 && code < 600) m->status_codes[code]++;
    pthread_mutex_unlock(&m->mu);
}

void ckv_srv_metrics_observe(ckv_srv_metrics *m, ckv_srv_hist *h, double s) {
    pthread_mutex_lock(&m->mu);
    int b = 0;
    while (b < CKV_SRV_HIST_BUCKETS - 1 && s > hist_le[b]) b++;
    h->buckets[b]++;
    h->sum += s;
    h->count++;
    pthread_mutex_unlock(&m->mu);
}

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} outbuf;

static void out(outbuf *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(outbuf *o, const char *fmt, ...) {
    if (o->oom) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(o->p + o->len, o->cap - o->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            o->oom = 1;
            return;
        }
        if ((size_t)n < o->cap - o->len) {
            o->len += (size_t)n;
            return;
        }
        size_t cap = o->cap * 2 + (size_t)n;
        char *p = realloc(o->p, cap);
        if (!p) {
            o->oom = 1;
            return;
        }
        o->p = p;
        o->cap = cap;
    }
}

static void hist(outbuf *o, const char *name, const char *help, const ckv_srv_hist *h) {
    out(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    long cum = 0;
    for (int b = 0; b < CKV_SRV_HIST_BUCKETS; b++) {
        cum += h->buckets[b];
        if (b < CKV_SRV_HIST_BUCKETS - 1)
            out(o, "%s_bucket{le=\"%g\"} %ld\n", name, hist_le[b], cum);
        else
            out(o, "%s_bucket{le=\"+Inf\"} %ld\n", name, cum);
    }
    out(o, "%s_sum %.6f\n%s_count %ld\n", name, h->sum, name, h->count);
}

static void scalar(outbuf *o, const char *name, const char *type, const char *help, double v) {
    out(o, "# HELP %s %s\n# TYPE %s %s\n%s %.0f\n", name, help, name, type, name, v);
}

int ckv_srv_metrics_render(ckv_srv_metrics *m, char **res, size_t *len) {
    outbuf o = {malloc(8192), 0, 8192, 0};
    if (!o.p) return -1;
    pthread_mutex_lock(&m->mu);
    out(&o, "# HELP ckv_requests_total HTTP requests answered, by status code\n# TYPE ckv_requests_total counter\n");
    for (int c = 100; c < 600; c++)
        if (m->status_codes[c]) out(&o, "ckv_requests_total{status=\"%d\"} %ld\n", c, m->status_codes[c]);
    scalar(&o, "ckv_requests_cancelled_total", "counter", "requests cancelled (client gone or shutdown)", (double)m->requests_cancelled);
    scalar(&o, "ckv_request_timeouts_total", "counter", "connections closed because a request's headers and body did not arrive within --request-timeout",
           (double)m->request_timeouts);
    scalar(&o, "ckv_prompt_tokens_total", "counter", "prompt tokens prefilled", (double)m->prompt_tokens);
    scalar(&o, "ckv_reused_tokens_total", "counter", "context tokens taken from the compressed-context store", (double)m->reused_tokens);
    scalar(&o, "ckv_completion_tokens_total", "counter", "tokens generated", (double)m->completion_tokens);
    scalar(&o, "ckv_cache_hits_total", "counter", "contexts found in the compressed-context store (memory or disk)", (double)m->cache_hits);
    scalar(&o, "ckv_cache_disk_hits_total", "counter", "contexts loaded from cache files", (double)m->cache_disk_hits);
    scalar(&o, "ckv_cache_misses_total", "counter", "contexts prefilled", (double)m->cache_misses);
    scalar(&o, "ckv_prefill_batches_total", "counter", "batched prefill forwards (the waiting short contexts, up to --max-batch-tokens)",
           (double)m->prefill_batches);
    scalar(&o, "ckv_prefill_batched_contexts_total", "counter", "contexts prefilled in a batched forward", (double)m->prefill_batched_contexts);
    scalar(&o, "ckv_decode_compressions_total", "counter", "decode-time compressions that evicted rows (decode_press)",
           (double)m->decode_compressions);
    scalar(&o, "ckv_decode_evicted_entries_total", "counter", "KV entries (rows x KV heads) removed by decode-time compression",
           (double)m->decode_evicted_entries);
    scalar(&o, "ckv_queue_length", "gauge", "requests waiting for a batch slot", (double)m->queue_length);
    scalar(&o, "ckv_running_requests", "gauge", "requests holding a batch slot", (double)m->running);
    scalar(&o, "ckv_kv_bytes_in_use", "gauge", "KV-cache bytes of the running requests", (double)m->kv_bytes_in_use);
    scalar(&o, "ckv_kv_bytes_saved", "gauge", "KV-cache bytes the running requests do not hold thanks to eviction", (double)m->kv_bytes_saved);
    scalar(&o, "ckv_kv_bytes_saved_by_eviction_total", "counter", "KV-cache bytes removed by eviction, summed over contexts",
           (double)m->kv_bytes_saved_total);
    scalar(&o, "ckv_context_store_bytes", "gauge", "bytes held by the compressed-context store", (double)m->store_bytes);
    scalar(&o, "ckv_context_store_entries", "gauge", "contexts held by the compressed-context store", (double)m->store_entries);
    hist(&o, "ckv_time_to_first_token_seconds", "from submission to the first generated token", &m->ttft);
    hist(&o, "ckv_inter_token_latency_seconds", "between consecutive generated tokens of a sequence", &m->itl);
    hist(&o, "ckv_request_duration_seconds", "from submission to the last token", &m->e2e);
    pthread_mutex_unlock(&m->mu);
    if (o.oom) {
        free(o.p);
        return -1;
    }
    *res = o.p;
    *len = o.len;
    return 0;
}
