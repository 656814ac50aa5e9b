/* srv_http.c - the HTTP side of `ckv serve` on libmicrohttpd (one thread per connection, so a
 * handler may wait for its job): routing, bearer-key authentication, body limits, JSON and
 * server-sent-event responses, client-disconnect detection (the job is cancelled and its memory
 * freed), Retry-After on 429/503, and the serve loop with its SIGTERM drain. It does not validate
 * request fields (srv_api.c) or touch the model (srv_sched.c). */
#define _POSIX_C_SOURCE 200809L
#include "server/server.h"

#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "core/log.h"
#include "core/timer.h"
#include "server/srv_api.h"
#include "server/srv_metrics.h"
#include "server/srv_sched.h"

static volatile sig_atomic_t stop_requested;

void ckv_server_request_stop(void) { stop_requested = 1; }

void ckv_server_config_defaults(ckv_server_config *c) {
    memset(c, 0, sizeof *c);
    c->host = "127.0.0.1";
    c->port = 8080;
    c->max_batch = 8;
    c->max_queue = 64;
    c->max_connections = 256;
    c->max_body_bytes = 8u << 20;
    c->max_tokens_limit = 4096;
    c->default_max_tokens = 0; /* the rest of the window, at most max_tokens_limit */
    c->cache_bytes = 256u << 20;
    c->grace_seconds = 30;
    c->interleave_seconds = 0.05;
}

typedef struct {
    const ckv_server_config *cfg;
    ckv_srv_api api;
    ckv_srv_metrics metrics;
    ckv_srv_sched sched;
    volatile int draining;
    int in_flight;          /* requests between their first byte and their completion (atomic) */
} server;

typedef struct {
    char *body;             /* [cap] the request body */
    size_t len, cap;
    int too_big;
} conn_ctx;

/* ---- responses ---------------------------------------------------------------------------------------- */

/* --cors-origin: every response names the allowed origin (browsers then read it). */
static void add_cors(const server *s, struct MHD_Response *r) {
    if (!s->cfg->cors_origin) return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", s->cfg->cors_origin);
    if (strcmp(s->cfg->cors_origin, "*") != 0) MHD_add_response_header(r, "Vary", "Origin");
}

/* A CORS preflight (OPTIONS with --cors-origin): 204 allowing the API's methods and headers. */
static enum MHD_Result send_preflight(server *s, struct MHD_Connection *c) {
    struct MHD_Response *r = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!r) return MHD_NO;
    add_cors(s, r);
    MHD_add_response_header(r, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(r, "Access-Control-Allow-Headers", "Authorization, Content-Type");
    MHD_add_response_header(r, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(c, 204, r);
    MHD_destroy_response(r);
    ckv_srv_metrics_status(&s->metrics, 204);
    return ret;
}

static enum MHD_Result send_body(server *s, struct MHD_Connection *c, int code, char *body, const char *type) {
    if (!body) {
        code = 500;
        body = strdup("{\"error\": {\"message\": \"out of memory\", \"type\": \"server_error\", \"param\": null, \"code\": null}}");
        if (!body) return MHD_NO;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", type);
    add_cors(s, r);
    if (code == 429 || code == 503) MHD_add_response_header(r, "Retry-After", code == 429 ? "1" : "5");
    if (code == 401) MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)code, r);
    MHD_destroy_response(r);
    ckv_srv_metrics_status(&s->metrics, code);
    return ret;
}

static enum MHD_Result send_json(server *s, struct MHD_Connection *c, int code, char *body) {
    return send_body(s, c, code, body, "application/json");
}

static enum MHD_Result send_error(server *s, struct MHD_Connection *c, const ckv_srv_error *e) {
    return send_json(s, c, e->http, ckv_srv_api_error_json(e));
}

static enum MHD_Result send_simple_error(server *s, struct MHD_Connection *c, int code, const char *type, const char *param,
                                         const char *ecode, const char *msg) {
    ckv_srv_error e;
    ckv_srv_error_set(&e, code, type, param, ecode, "%s", msg);
    return send_error(s, c, &e);
}

/* 1 while the peer of connection fd is still there. */
static int client_alive(int fd) {
    if (fd < 0) return 1;
    char b;
    ssize_t r = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    if (r > 0) return 1;
    if (r == 0) return 0;
    return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
}

static int connection_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static void cancel_job(ckv_srv_job *j) {
    pthread_mutex_lock(&j->mu);
    if (!j->done) j->cancelled = 1;
    pthread_mutex_unlock(&j->mu);
}

/* Waits (100 ms at a time) until the job has news; 0 when the client went away. */
static int wait_job(ckv_srv_job *j, int fd) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&j->mu);
    if (!j->done) pthread_cond_timedwait(&j->cv, &j->mu, &ts);
    pthread_mutex_unlock(&j->mu);
    return client_alive(fd);
}

/* ---- streaming (server-sent events) ---------------------------------------------------------------- */

typedef struct {
    server *srv;
    ckv_srv_job *job;
    int fd;
    char *buf;              /* [cap] formatted events not yet handed to MHD */
    size_t len, off, cap;
    size_t sent[CKV_SRV_MAX_CHOICES];
    int started[CKV_SRV_MAX_CHOICES], fin_sent[CKV_SRV_MAX_CHOICES];
    int finished;
} stream_ctx;

static int stream_put(stream_ctx *sc, const char *a, size_t na, const char *b, size_t nb, const char *c, size_t nc) {
    size_t need = sc->len + na + nb + nc;
    if (need > sc->cap) {
        size_t cap = need * 2 + 256;
        char *p = realloc(sc->buf, cap);
        if (!p) return -1;
        sc->buf = p;
        sc->cap = cap;
    }
    memcpy(sc->buf + sc->len, a, na);
    memcpy(sc->buf + sc->len + na, b, nb);
    memcpy(sc->buf + sc->len + na + nb, c, nc);
    sc->len = need;
    return 0;
}

static int stream_event(stream_ctx *sc, char *json) {
    if (!json) return -1;
    int r = stream_put(sc, "data: ", 6, json, strlen(json), "\n\n", 2);
    free(json);
    return r;
}

/* Formats whatever the job produced since the last call; returns 1 when something was added. */
static int stream_fill(stream_ctx *sc) {
    ckv_srv_job *j = sc->job;
    const ckv_srv_api *a = &sc->srv->api;
    int added = 0, all_fin = 1, failed = 0;
    pthread_mutex_lock(&j->mu);
    for (int c = 0; c < j->n_choices; c++) {
        const ckv_srv_choice *ch = &j->choices[c];
        size_t safe = ch->finish ? ch->text_len : ch->safe_len;
        while (safe > sc->sent[c] && !ch->finish && ((unsigned char)ch->text[safe] & 0xC0) == 0x80) safe--;
        if (safe > sc->sent[c] || (!sc->started[c] && j->kind == CKV_SRV_CHAT && ch->finish == 0 && ch->n_ids > 0)) {
            stream_event(sc, ckv_srv_api_chunk(a, j, c, ch->text + sc->sent[c], safe - sc->sent[c], !sc->started[c], CKV_FINISH_NONE));
            sc->sent[c] = safe;
            sc->started[c] = 1;
            added = 1;
        }
        if (ch->finish && !sc->fin_sent[c]) {
            stream_event(sc, ckv_srv_api_chunk(a, j, c, NULL, 0, !sc->started[c], ch->finish));
            sc->fin_sent[c] = sc->started[c] = 1;
            added = 1;
        }
        if (!sc->fin_sent[c]) all_fin = 0;
    }
    int done = j->done;
    failed = j->status != CKV_STATUS_OK;
    char err[512];
    snprintf(err, sizeof err, "%s", j->err);
    pthread_mutex_unlock(&j->mu);
    if (done && (all_fin || failed) && !sc->finished) {
        if (failed) {
            ckv_srv_error e;
            ckv_srv_error_set(&e, 500, "server_error", "", NULL, "%s", err);
            stream_event(sc, ckv_srv_api_error_json(&e));
        } else if (j->include_usage) {
            stream_event(sc, ckv_srv_api_usage_chunk(a, j));
        }
        stream_put(sc, "data: [DONE]\n\n", 14, "", 0, "", 0);
        sc->finished = 1;
        added = 1;
    }
    return added;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    stream_ctx *sc = cls;
    for (;;) {
        if (sc->off < sc->len) {
            size_t n = sc->len - sc->off < max ? sc->len - sc->off : max;
            memcpy(buf, sc->buf + sc->off, n);
            sc->off += n;
            if (sc->off == sc->len) sc->off = sc->len = 0;
            return (ssize_t)n;
        }
        if (sc->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        if (stream_fill(sc)) continue;
        if (!wait_job(sc->job, sc->fd)) {
            cancel_job(sc->job);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    stream_ctx *sc = cls;
    cancel_job(sc->job); /* no-op when it finished */
    ckv_srv_job_release(sc->job);
    free(sc->buf);
    free(sc);
}

static enum MHD_Result serve_stream(server *s, struct MHD_Connection *c, ckv_srv_job *j) {
    stream_ctx *sc = calloc(1, sizeof *sc);
    if (!sc) {
        cancel_job(j);
        ckv_srv_job_release(j);
        return send_simple_error(s, c, 500, "server_error", "", NULL, "out of memory");
    }
    sc->srv = s;
    sc->job = j;
    sc->fd = connection_fd(c);
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, sc, stream_free);
    if (!r) {
        stream_free(sc);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    add_cors(s, r);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    ckv_srv_metrics_status(&s->metrics, 200);
    return ret;
}

/* ---- endpoints ------------------------------------------------------------------------------------------ */

/* Releases the parse's references of jobs [n] that were never submitted. */
static void drop_jobs(ckv_srv_job **jobs, int n) {
    for (int i = 0; i < n; i++) {
        jobs[i]->refs = 1;
        ckv_srv_job_release(jobs[i]);
    }
}

/* Waits for job j; 0 when the client went away (j cancelled). */
static int wait_done(ckv_srv_job *j, int fd) {
    for (;;) {
        pthread_mutex_lock(&j->mu);
        int done = j->done;
        pthread_mutex_unlock(&j->mu);
        if (done) return 1;
        if (!wait_job(j, fd)) {
            cancel_job(j);
            return 0;
        }
    }
}

static enum MHD_Result serve_generate(server *s, struct MHD_Connection *c, ckv_srv_kind kind, const conn_ctx *cc) {
    ckv_srv_job *jobs[CKV_SRV_MAX_CHOICES];
    int n_jobs = 0;
    ckv_srv_error err;
    if (ckv_srv_api_parse(&s->api, kind, cc->body ? cc->body : "", cc->len, jobs, CKV_SRV_MAX_CHOICES, &n_jobs, &err))
        return send_error(s, c, &err);
    int submitted = 0, code = 0;
    while (submitted < n_jobs && !code) { /* a list of prompts: every job or none (the queue's answer) */
        code = s->draining ? 503 : ckv_srv_sched_submit(&s->sched, jobs[submitted]);
        if (!code) submitted++;
    }
    if (code) {
        for (int i = 0; i < submitted; i++) { /* already queued: cancelled, their engine reference dropped there */
            cancel_job(jobs[i]);
            ckv_srv_job_release(jobs[i]);
        }
        drop_jobs(jobs + submitted, n_jobs - submitted);
        return send_simple_error(s, c, code, code == 429 ? "rate_limit_error" : "server_error", "",
                                 code == 429 ? "queue_full" : "shutting_down",
                                 code == 429 ? "the request queue is full; retry later" : "the server is shutting down");
    }
    ckv_srv_job *j = jobs[0];
    if (j->stream) return serve_stream(s, c, j); /* one job: a list of prompts cannot stream */
    int fd = connection_fd(c), alive = 1;
    for (int i = 0; i < n_jobs; i++) {
        if (alive) alive = wait_done(jobs[i], fd);
        else cancel_job(jobs[i]);
    }
    if (!alive) { /* the client went away: cancel and drop the connection */
        for (int i = 0; i < n_jobs; i++) ckv_srv_job_release(jobs[i]);
        return MHD_NO;
    }
    enum MHD_Result ret;
    ckv_srv_job *failed = NULL;
    for (int i = 0; i < n_jobs && !failed; i++)
        if (jobs[i]->status != CKV_STATUS_OK) failed = jobs[i];
    if (failed) { /* what the request asked for cannot be done: 400; else the server failed */
        ckv_status e = failed->status;
        int ctx = e == CKV_STATUS_ERR_CONTEXT_TOO_LONG;
        int client = ctx || e == CKV_STATUS_ERR_ARG || e == CKV_STATUS_ERR_RANGE || e == CKV_STATUS_ERR_UNSUPPORTED;
        ret = send_simple_error(s, c, client ? 400 : 500, client ? "invalid_request_error" : "server_error",
                                ctx ? "max_tokens" : "", ctx ? "context_length_exceeded" : client ? "unsupported" : NULL, failed->err);
    } else {
        ret = send_json(s, c, 200, ckv_srv_api_response(&s->api, jobs, n_jobs));
    }
    for (int i = 0; i < n_jobs; i++) ckv_srv_job_release(jobs[i]);
    return ret;
}

static int authorized(const server *s, struct MHD_Connection *c) {
    if (!s->cfg->api_key) return 1;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (!h || strncmp(h, "Bearer ", 7) != 0) return 0;
    const char *k = h + 7, *want = s->cfg->api_key;
    size_t lk = strlen(k), lw = strlen(want);
    unsigned diff = (unsigned)(lk ^ lw);
    for (size_t i = 0; i < lw; i++) diff |= (unsigned)(unsigned char)want[i] ^ (unsigned)(unsigned char)(i < lk ? k[i] : 0);
    return diff == 0;
}

static enum MHD_Result route(server *s, struct MHD_Connection *c, const char *url, const char *method, const conn_ctx *cc) {
    int get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (s->cfg->cors_origin && !strcmp(method, "OPTIONS")) return send_preflight(s, c); /* browsers send no key */
    if (!strncmp(url, "/v1/models/", 11) && url[11]) { /* GET /v1/models/{id} */
        if (!authorized(s, c)) return send_simple_error(s, c, 401, "invalid_request_error", "", "invalid_api_key", "missing or wrong API key (Authorization: Bearer KEY)");
        if (!get) return send_simple_error(s, c, 405, "invalid_request_error", "", "method_not_allowed", "use GET /v1/models/{id}");
        ckv_srv_error err;
        char *body = ckv_srv_api_model(&s->api, url + 11, &err);
        return body ? send_json(s, c, 200, body) : send_error(s, c, &err);
    }
    if (!strcmp(url, "/health")) {
        if (!get) return send_simple_error(s, c, 405, "invalid_request_error", "", "method_not_allowed", "use GET /health");
        return send_json(s, c, s->draining ? 503 : 200, strdup(s->draining ? "{\"status\": \"draining\"}" : "{\"status\": \"ok\"}"));
    }
    static const char *const known[] = {"/v1/models", "/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize", "/metrics"};
    int k = -1;
    for (int i = 0; i < 6; i++)
        if (!strcmp(url, known[i])) k = i;
    if (k < 0) {
        char msg[256];
        snprintf(msg, sizeof msg, "no such endpoint: %.200s", url);
        return send_simple_error(s, c, 404, "invalid_request_error", "", "not_found", msg);
    }
    if (!authorized(s, c)) return send_simple_error(s, c, 401, "invalid_request_error", "", "invalid_api_key", "missing or wrong API key (Authorization: Bearer KEY)");
    int want_get = k == 0 || k == 5;
    if ((want_get && !get) || (!want_get && !post)) {
        char msg[128];
        snprintf(msg, sizeof msg, "use %s %s", want_get ? "GET" : "POST", url);
        return send_simple_error(s, c, 405, "invalid_request_error", "", "method_not_allowed", msg);
    }
    if (cc->too_big) {
        char msg[128];
        snprintf(msg, sizeof msg, "the request body exceeds the limit of %zu bytes", s->cfg->max_body_bytes);
        return send_simple_error(s, c, 413, "invalid_request_error", "", "request_too_large", msg);
    }
    ckv_srv_error err;
    char *body = NULL;
    switch (k) {
    case 0: return send_json(s, c, 200, ckv_srv_api_models(&s->api));
    case 1: return serve_generate(s, c, CKV_SRV_COMPLETION, cc);
    case 2: return serve_generate(s, c, CKV_SRV_CHAT, cc);
    case 3:
    case 4:
        body = k == 3 ? ckv_srv_api_tokenize(&s->api, cc->body ? cc->body : "", cc->len, &err)
                      : ckv_srv_api_detokenize(&s->api, cc->body ? cc->body : "", cc->len, &err);
        return body ? send_json(s, c, 200, body) : send_error(s, c, &err);
    default: {
        size_t len = 0;
        if (ckv_srv_metrics_render(&s->metrics, &body, &len) != 0) body = NULL;
        return send_body(s, c, 200, body, "text/plain; version=0.0.4; charset=utf-8");
    }
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
    server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) {
        cc = calloc(1, sizeof *cc);
        if (!cc) return MHD_NO;
        *con_cls = cc;
        __atomic_add_fetch(&s->in_flight, 1, __ATOMIC_SEQ_CST);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->cfg->max_body_bytes) cc->too_big = 1;
        return MHD_YES;
    }
    if (*upload_size > 0) {
        size_t n = *upload_size;
        *upload_size = 0;
        if (cc->too_big || cc->len + n > s->cfg->max_body_bytes) {
            cc->too_big = 1;
            return MHD_YES;
        }
        if (cc->len + n + 1 > cc->cap) {
            size_t cap = (cc->len + n + 1) * 2;
            char *p = realloc(cc->body, cap);
            if (!p) return MHD_NO;
            cc->body = p;
            cc->cap = cap;
        }
        memcpy(cc->body + cc->len, upload, n);
        cc->len += n;
        cc->body[cc->len] = '\0';
        return MHD_YES;
    }
    return route(s, c, url, method, cc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    server *s = cls;
    conn_ctx *cc = *con_cls;
    if (!cc) return;
    __atomic_sub_fetch(&s->in_flight, 1, __ATOMIC_SEQ_CST);
    free(cc->body);
    free(cc);
    *con_cls = NULL;
}

/* ---- the serve loop ----------------------------------------------------------------------------------- */

static ckv_status write_port_file(const char *path, const char *host, int port) {
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) return ckv_error(CKV_STATUS_ERR_IO, "--port-file %s: %s", path, strerror(errno));
    int ok = fprintf(f, "%s:%d\n", host, port) > 0;
    if (fclose(f) != 0 || !ok || rename(tmp, path) != 0) return ckv_error(CKV_STATUS_ERR_IO, "--port-file %s: cannot write", path);
    return CKV_STATUS_OK;
}

ckv_status ckv_server_run(ckv_engine *engine, const ckv_server_config *cfg) {
    server *s = calloc(1, sizeof *s);
    if (!s) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory");
    s->cfg = cfg;
    ckv_srv_metrics_init(&s->metrics);
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char port[16];
    snprintf(port, sizeof port, "%d", cfg->port);
    struct MHD_Daemon *d = NULL;
    /* first the part every rank of the group runs (the followers are in ckv_server_follow) */
    ckv_status st = ckv_srv_sched_init(&s->sched, engine, &s->metrics, cfg->max_batch, cfg->max_queue, cfg->cache_bytes,
                                       cfg->cache_dir);
    int sched_ready = st == CKV_STATUS_OK;
    if (sched_ready) s->sched.interleave_s = cfg->interleave_seconds;
    if (st == CKV_STATUS_OK && (getaddrinfo(cfg->host, port, &hints, &ai) != 0 || !ai))
        st = ckv_error(CKV_STATUS_ERR_ARG, "--host %s: not an address this machine can bind", cfg->host);
    if (st == CKV_STATUS_OK) st = ckv_srv_api_init(&s->api, engine, cfg, s->sched.piece_cap);
    if (st == CKV_STATUS_OK) st = ckv_srv_sched_start(&s->sched);
    if (st == CKV_STATUS_OK) {
        unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC | MHD_USE_ERROR_LOG;
        if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
        d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                             MHD_OPTION_CONNECTION_LIMIT, (unsigned)cfg->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, 600u,
                             MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
        if (!d) st = ckv_error(CKV_STATUS_ERR_IO, "cannot listen on %s:%d (in use, or not allowed)", cfg->host, cfg->port);
    }
    if (ai) freeaddrinfo(ai);
    if (st == CKV_STATUS_OK) {
        const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
        int bound = di ? di->port : cfg->port;
        int ranks = engine->tp ? engine->tp->size : 1;
        fprintf(stderr, "ckv serve: listening on http://%s:%d (model %s, batch %d, queue %d, %d tensor-parallel rank%s)\n",
                cfg->host, bound, cfg->model_name ? cfg->model_name : "ckv", cfg->max_batch, cfg->max_queue, ranks,
                ranks == 1 ? "" : "s");
        if (cfg->port_file) st = write_port_file(cfg->port_file, cfg->host, bound);
    }
    while (st == CKV_STATUS_OK && !stop_requested) {
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (d) {
        s->draining = 1;
        MHD_socket ls = MHD_quiesce_daemon(d); /* no new connections */
        if (ls != MHD_INVALID_SOCKET) close(ls);
        fprintf(stderr, "ckv serve: draining (grace %.0f s)\n", cfg->grace_seconds);
    }
    ckv_srv_sched_drain(&s->sched, cfg->grace_seconds);
    /* every job has ended: let the handlers send what they hold (bounded) before closing connections */
    double t_end = ckv_time_now() + 5;
    while (d && __atomic_load_n(&s->in_flight, __ATOMIC_SEQ_CST) > 0 && ckv_time_now() < t_end) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    if (d) MHD_stop_daemon(d);
    if (sched_ready) ckv_srv_step_quit(&s->sched.steps, st != CKV_STATUS_OK); /* the followers return */
    ckv_srv_sched_free(&s->sched);
    ckv_srv_metrics_free(&s->metrics);
    free(s);
    if (st == CKV_STATUS_OK) fprintf(stderr, "ckv serve: stopped\n");
    return st;
}

ckv_status ckv_server_follow(ckv_engine *engine, const ckv_server_config *cfg) {
    ckv_srv_steps steps;
    CKV_TRY(ckv_srv_steps_init(&steps, engine, cfg->max_batch, cfg->cache_bytes, cfg->cache_dir));
    ckv_status st = ckv_srv_steps_follow(&steps);
    ckv_srv_steps_free(&steps);
    return st;
}
