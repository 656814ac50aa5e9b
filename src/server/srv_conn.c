/* srv_conn.c - the server's connection bookkeeping (srv_conn.h): the per-address cap, the list of
 * open connections and the slow-client watchdog, which shuts down the socket of a request whose
 * headers and body have not all arrived request_timeout seconds after it could start (the connection
 * opened, or its previous request completed), however slowly its bytes keep coming. It does not read
 * requests or send responses (srv_http.c). */
#define _POSIX_C_SOURCE 200809L
#include "server/srv_conn.h"

#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "core/timer.h"

struct ckv_srv_conn {
    int fd;
    double t_start; /* when the current request could start */
    int receiving;  /* 1 until the request is complete (then it is being answered) */
    ckv_srv_conn *prev, *next;
};

void ckv_srv_conns_init(ckv_srv_conns *t, const ckv_server_config *cfg, ckv_srv_metrics *m) {
    memset(t, 0, sizeof *t);
    t->limit = cfg->request_timeout > 0 ? cfg->request_timeout : 0;
    t->metrics = m;
    pthread_mutex_init(&t->mu, NULL);
}

unsigned ckv_srv_conns_per_client(const ckv_server_config *cfg) {
    if (cfg->max_client_connections > 0) return (unsigned)cfg->max_client_connections;
    return (unsigned)(cfg->max_connections / 4 > 0 ? cfg->max_connections / 4 : 1);
}

int ckv_srv_conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

void ckv_srv_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    ckv_srv_conns *t = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        ckv_srv_conn *cs = calloc(1, sizeof *cs);
        *socket_context = cs;
        if (!cs) return; /* no deadline for this one: MHD's inactivity timeout still applies */
        cs->fd = ckv_srv_conn_fd(c);
        cs->t_start = ckv_time_now();
        cs->receiving = 1;
        pthread_mutex_lock(&t->mu);
        cs->next = t->open;
        if (t->open) t->open->prev = cs;
        t->open = cs;
        pthread_mutex_unlock(&t->mu);
        return;
    }
    ckv_srv_conn *cs = *socket_context;
    if (!cs) return;
    pthread_mutex_lock(&t->mu);
    if (cs->prev) cs->prev->next = cs->next;
    else t->open = cs->next;
    if (cs->next) cs->next->prev = cs->prev;
    pthread_mutex_unlock(&t->mu);
    free(cs);
    *socket_context = NULL;
}

void ckv_srv_conns_receiving(ckv_srv_conns *t, struct MHD_Connection *c, int receiving) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    ckv_srv_conn *cs = ci ? ci->socket_context : NULL;
    if (!cs) return;
    pthread_mutex_lock(&t->mu);
    cs->receiving = receiving;
    if (receiving) cs->t_start = ckv_time_now();
    pthread_mutex_unlock(&t->mu);
}

static void *watchdog_main(void *arg) {
    ckv_srv_conns *t = arg;
    for (;;) {
        struct timespec ts = {0, 100 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (__atomic_load_n(&t->watchdog_quit, __ATOMIC_SEQ_CST)) break;
        double now = ckv_time_now();
        int n = 0;
        pthread_mutex_lock(&t->mu);
        for (ckv_srv_conn *cs = t->open; cs; cs = cs->next)
            if (cs->receiving && cs->fd >= 0 && now - cs->t_start > t->limit) {
                shutdown(cs->fd, SHUT_RDWR);
                cs->receiving = 0;
                n++;
            }
        pthread_mutex_unlock(&t->mu);
        if (n) {
            pthread_mutex_lock(&t->metrics->mu);
            t->metrics->request_timeouts += n;
            pthread_mutex_unlock(&t->metrics->mu);
        }
    }
    return NULL;
}

ckv_status ckv_srv_conns_start(ckv_srv_conns *t) {
    if (t->limit <= 0) return CKV_STATUS_OK;
    int rc = pthread_create(&t->watchdog, NULL, watchdog_main, t);
    if (rc != 0) return ckv_error(CKV_STATUS_ERR_INTERNAL, "cannot start the request-deadline thread: %s", strerror(rc));
    t->watchdog_started = 1;
    return CKV_STATUS_OK;
}

void ckv_srv_conns_free(ckv_srv_conns *t) {
    if (t->watchdog_started) {
        __atomic_store_n(&t->watchdog_quit, 1, __ATOMIC_SEQ_CST);
        pthread_join(t->watchdog, NULL);
        t->watchdog_started = 0;
    }
    pthread_mutex_destroy(&t->mu);
}
