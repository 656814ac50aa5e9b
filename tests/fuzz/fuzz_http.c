/* fuzz_http.c - fuzz target of the HTTP request path of `ckv serve`: request bytes in, a well-formed
 * reply out. A server on the fixture model (tests/fixtures/models/llama_gqa, or $CKV_FUZZ_MODEL) runs
 * in this process on a loopback port; each input is written as the bytes of one connection, which is
 * then half-closed, and everything the server sends back is read (within 20 s: a hang is a finding).
 * The reply must be either nothing (the connection dropped: bytes that are not a request) or a
 * sequence of responses with a status line, headers, a body framed by Content-Length or chunked
 * encoding exactly as announced, and a JSON body that is valid UTF-8 JSON. The server is stopped and
 * freed at exit, so the leak checker sees a clean teardown. It does not check the answers' content
 * (tests/server does). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <cjson/cJSON.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/log.h"
#include "engine/request.h"
#include "engine/text.h"
#include "server/server.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#ifndef CKV_FIXTURES
#define CKV_FIXTURES "tests/fixtures"
#endif

static struct {
    ckv_tokenizer *tok;
    ckv_engine eng;
    ckv_server_config cfg;
    pthread_t thread;
    char port_file[512];
    int port, running;
} g;

static void *server_main(void *arg) {
    (void)arg;
    if (ckv_server_run(&g.eng, &g.cfg) != CKV_STATUS_OK) {
        fprintf(stderr, "fuzz_http: the server failed: %s\n", ckv_error_message());
        abort();
    }
    return NULL;
}

static void server_stop(void) {
    if (!g.running) return;
    ckv_server_request_stop();
    pthread_join(g.thread, NULL);
    ckv_engine_free(&g.eng);
    ckv_tokenizer_free(g.tok);
    unlink(g.port_file);
    g.running = 0;
}

static void server_start(void) {
    const char *model = getenv("CKV_FUZZ_MODEL");
    static char path[1024];
    if (!model) {
        snprintf(path, sizeof path, "%s/models/llama_gqa", CKV_FIXTURES);
        model = path;
    }
    signal(SIGPIPE, SIG_IGN);
    ckv_log_set_level(CKV_LOG_LEVEL_ERROR);
    ckv_engine_config ec = {0};
    ec.model_path = model;
    ec.threads = 1;
    ec.device = -1;
    ec.kv_dtype = ec.weights_dtype = CKV_DTYPE_DEFAULT;
    if (ckv_text_open_tokenizer(&g.tok, model) != CKV_STATUS_OK) goto fail;
    ec.tokenizer = g.tok;
    if (ckv_engine_init(&g.eng, &ec, NULL) != CKV_STATUS_OK) goto fail;
    ckv_server_config_defaults(&g.cfg);
    g.cfg.port = 0;
    const char *tmp = getenv("TMPDIR"); /* the temporary directory, never the working tree */
    snprintf(g.port_file, sizeof g.port_file, "%s/ckv_fuzz_http.%d.port", tmp && tmp[0] ? tmp : "/tmp", (int)getpid());
    unlink(g.port_file);
    g.cfg.port_file = g.port_file;
    g.cfg.model_name = "fuzz";
    g.cfg.max_tokens_limit = 8;
    g.cfg.default_max_tokens = 2;
    g.cfg.max_body_bytes = 1 << 16;
    g.cfg.request_timeout = 5;
    g.cfg.grace_seconds = 0.2;
    g.cfg.cache_bytes = 1 << 20;
    if (pthread_create(&g.thread, NULL, server_main, NULL) != 0) abort();
    g.running = 1;
    atexit(server_stop);
    for (int i = 0; i < 6000; i++) { /* up to 60 s to listen */
        FILE *f = fopen(g.port_file, "r");
        if (f) {
            char host[64];
            int ok = fscanf(f, "%63[^:]:%d", host, &g.port) == 2;
            fclose(f);
            if (ok) return;
        }
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    fprintf(stderr, "fuzz_http: the server did not start listening\n");
    abort();
fail:
    fprintf(stderr, "fuzz_http: cannot load %s: %s\n", model, ckv_error_message());
    abort();
}

/* ---- the reply ----------------------------------------------------------------------------------- */

static int utf8_valid(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return 0;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xC0) != 0x80) return 0;
        i += k;
    }
    return 1;
}

static const char *find(const char *s, size_t n, const char *pat) {
    return memmem(s, n, pat, strlen(pat));
}

/* The value of header `name` inside head[0..n) (case-insensitive name), copied into out. */
static int header(const char *head, size_t n, const char *name, char *out, size_t cap) {
    size_t ln = strlen(name);
    for (const char *p = head; p < head + n;) {
        const char *eol = find(p, (size_t)(head + n - p), "\r\n");
        if (!eol) eol = head + n;
        if ((size_t)(eol - p) > ln && !strncasecmp(p, name, ln) && p[ln] == ':') {
            const char *v = p + ln + 1;
            while (v < eol && *v == ' ') v++;
            snprintf(out, cap, "%.*s", (int)(eol - v), v);
            return 1;
        }
        p = eol + 2;
    }
    return 0;
}

/* A response that stops short: fine only after a reset (the unsent rest of a refused request). */
#define SHORT()                                                                                             \
    do {                                                                                                    \
        if (reset) return;                                                                                  \
        abort();                                                                                            \
    } while (0)

/* libmicrohttpd 0.9.75 sends the header block of its own error pages for a malformed or huge
 * Content-Length twice ("HTTP/1.1 400 ...\r\n\r\nHTTP/1.1 400 ...\r\n\r\n<html>..."), before ckv
 * sees the request: a known upstream defect, counted and reported at exit rather than stopping the
 * run, so the fuzzer keeps exploring the rest of the path. */
static long upstream_duplicates;

static void report_upstream(void) {
    if (upstream_duplicates) fprintf(stderr, "fuzz_http: %ld replies with libmicrohttpd's duplicated error header block\n", upstream_duplicates);
}

/* Checks every response in r[0..n); aborts on a malformed one. */
static void check_reply(const char *r, size_t n, int reset) {
    static char body[1 << 20];
    while (n > 0) {
        const char *end0 = find(r, n, "\r\n\r\n");
        if (end0) { /* the upstream duplicate (see above): skip the first copy */
            size_t hl = (size_t)(end0 - r) + 4;
            if (2 * hl <= n && !memcmp(r, r + hl, hl) && find(r, hl, "Connection: close")) {
                if (!upstream_duplicates++) atexit(report_upstream);
                r += hl;
                n -= hl;
            }
        }
        if (n < 12) SHORT();
        if (memcmp(r, "HTTP/1.", 7) != 0 || r[8] != ' ') abort();
        int code = atoi(r + 9);
        if (code < 100 || code > 599) abort();
        const char *end = find(r, n, "\r\n\r\n");
        if (!end) SHORT();
        size_t hl = (size_t)(end - r) + 4, bl = 0;
        char cl[32], te[32], ct[128] = "";
        header(r, hl, "Content-Type", ct, sizeof ct);
        const char *b = r + hl;
        size_t left = n - hl, used = 0;
        if (code < 200) { /* an interim response: no body */
            r += hl;
            n -= hl;
            continue;
        }
        if (header(r, hl, "Transfer-Encoding", te, sizeof te)) {
            if (strcasecmp(te, "chunked") != 0) abort();
            for (;;) {
                char *e;
                unsigned long len = strtoul(b + used, &e, 16);
                const char *crlf = find(b + used, left - used, "\r\n");
                if (!crlf) SHORT();
                if (e == b + used) abort();
                used = (size_t)(crlf - b) + 2;
                if (len == 0) {
                    const char *fin = find(b + used - 2, left - used + 2, "\r\n\r\n");
                    if (!fin) SHORT();
                    used = (size_t)(fin - b) + 4;
                    break;
                }
                if (used + len + 2 > left) SHORT();
                if (memcmp(b + used + len, "\r\n", 2) != 0) abort();
                if (bl + len < sizeof body) memcpy(body + bl, b + used, len);
                bl += len;
                used += len + 2;
            }
        } else if (header(r, hl, "Content-Length", cl, sizeof cl)) {
            char *e;
            unsigned long len = strtoul(cl, &e, 10);
            if (*e) abort();
            if (len > left) SHORT();
            if (len < sizeof body) memcpy(body, b, len);
            bl = len;
            used = len;
        } else {
            used = left; /* to the end of the connection */
            if (used < sizeof body) memcpy(body, b, used);
            bl = used;
        }
        if (bl >= sizeof body) abort();
        if (strstr(ct, "application/json")) {
            if (!utf8_valid((const unsigned char *)body, bl)) abort();
            cJSON *j = cJSON_ParseWithLength(body, bl);
            if (!j) abort();
            if (code >= 400) {
                const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
                if (!cJSON_IsObject(e) || !cJSON_IsString(cJSON_GetObjectItemCaseSensitive(e, "message"))) abort();
            }
            cJSON_Delete(j);
        }
        r = b + used;
        n = left - used;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g.running) server_start();
    static char reply[1 << 21];
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) abort();
    struct sockaddr_in a = {0};
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)g.port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) abort();
    size_t off = 0, n = 0;
    int reset = 0;
    while (off < size) {
        ssize_t w = send(fd, data + off, size - off, MSG_NOSIGNAL);
        if (w <= 0) break; /* the server closed early (e.g. after refusing the headers) */
        off += (size_t)w;
    }
    shutdown(fd, SHUT_WR);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        struct pollfd p = {fd, POLLIN, 0};
        int pr = poll(&p, 1, 1000);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 20) {
            fprintf(stderr, "fuzz_http: no end of the reply within 20 s\n");
            abort();
        }
        if (pr <= 0) continue;
        ssize_t r = recv(fd, reply + n, sizeof reply - n, 0);
        if (r <= 0) { /* the end, or a reset after a refused request */
            reset = r < 0;
            break;
        }
        n += (size_t)r;
        if (n == sizeof reply) abort();
    }
    close(fd);
    check_reply(reply, n, reset);
    return 0;
}
