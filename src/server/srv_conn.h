/* srv_conn.h - the server's connection bookkeeping on libmicrohttpd: the limits handed to the daemon
 * (total and per-address connection caps), the list of open connections with the start of each one's
 * current request, and the slow-client watchdog that shuts down a connection whose request has not
 * fully arrived within its absolute deadline. It does not read requests or send responses (srv_http.c). */
#ifndef CKV_SRV_CONN_H
#define CKV_SRV_CONN_H

#include <pthread.h>

#include <microhttpd.h>

#include "core/status.h"
#include "server/server.h"
#include "server/srv_metrics.h"

typedef struct ckv_srv_conn ckv_srv_conn; /* one open connection (libmicrohttpd's socket context) */

typedef struct {
    double limit;              /* seconds a request may take to arrive whole (0: no deadline) */
    ckv_srv_metrics *metrics;  /* request_timeouts is counted here */
    pthread_mutex_t mu;
    ckv_srv_conn *open;        /* open connections (under mu) */
    pthread_t watchdog;
    int watchdog_started, watchdog_quit;
} ckv_srv_conns;

/* The tracker of cfg's deadline (request_timeout), counting timeouts into m. */
void ckv_srv_conns_init(ckv_srv_conns *t, const ckv_server_config *cfg, ckv_srv_metrics *m);
/* Starts the watchdog thread (nothing when there is no deadline). */
ckv_status ckv_srv_conns_start(ckv_srv_conns *t);
/* Stops the watchdog (if started) and releases the tracker; call after the daemon has stopped. */
void ckv_srv_conns_free(ckv_srv_conns *t);

/* Connections a single client address may hold: --max-client-connections, by default a quarter of
 * --max-connections (at least 1). */
unsigned ckv_srv_conns_per_client(const ckv_server_config *cfg);

/* The daemon's connection callback (MHD_OPTION_NOTIFY_CONNECTION, cls the tracker): adds opened
 * connections to the list and removes closed ones (MHD reports the close before closing the socket,
 * so the watchdog never touches a reused descriptor). */
void ckv_srv_conns_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code);

/* Connection c's current request is still arriving (receiving = 1: its deadline starts now) or has
 * arrived whole or been answered from its headers (0: no deadline until the next request). */
void ckv_srv_conns_receiving(ckv_srv_conns *t, struct MHD_Connection *c, int receiving);

/* The socket of connection c (-1 when libmicrohttpd does not say). */
int ckv_srv_conn_fd(struct MHD_Connection *c);

#endif
