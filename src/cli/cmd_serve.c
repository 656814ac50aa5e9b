/* cmd_serve.c - `ckv serve`: reads the server's flags from the shared flag table (cli_opts.h), loads
 * the model and its tokenizer, installs the SIGTERM/SIGINT drain, and hands over to src/server.
 * Refuses at start what would make every request fail or the server open to all: an empty key (flag
 * or CKV_API_KEY), --max-body-bytes 0, a --cache-dir that is not a writable directory; warns when a
 * non-loopback --host has no key. */
#define _POSIX_C_SOURCE 200809L
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "cli/cli.h"

#ifndef CKV_HAVE_SERVER
int ckv_cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    ckv_cli_die("ckv serve is not built: libmicrohttpd was not found when ckv was configured (install libmicrohttpd-dev, "
                "tools/setup.sh does, and configure again)");
}
#else
#include "cli/cli_agree.h"
#include "cli/cli_opts.h"
#include "cli/cli_press.h"
#include "engine/request.h"
#include "engine/text.h"
#include "server/server.h"
#include "server/srv_store.h"

static const ckv_cli_command serve_cmd = {
    CKV_CMD_SERVE, "serve", "-m PATH [flags]",
    "An OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize;\n"
    "GET /v1/models, /health, /metrics (docs/openapi.yaml). Requests may choose their own press (extension\n"
    "fields \"press\", \"budget\" or \"compression_ratio\", \"query_aware\", \"decode_press\" with \"decode_interval\",\n"
    "\"decode_target\" or \"decode_ratio\") and name the context to compress once and reuse (\"context\"); the\n"
    "press flags below are the default. SIGTERM drains and exits 0."};

typedef struct {
    ckv_server_config cfg;
    ckv_press_config press;
    ckv_decode_press decode; /* --decode-press: the default of requests */
} serve_args;

static size_t parse_bytes(const char *flag, const char *v) {
    char *end = NULL;
    double d = strtod(v, &end);
    double mul = 1;
    if (end && *end) {
        if (!strcmp(end, "K") || !strcmp(end, "k")) mul = 1024.0;
        else if (!strcmp(end, "M") || !strcmp(end, "m")) mul = 1024.0 * 1024;
        else if (!strcmp(end, "G") || !strcmp(end, "g")) mul = 1024.0 * 1024 * 1024;
        else ckv_cli_usage_error("serve", "%s: expected a byte count like 512M, got '%s'", flag, v);
    }
    if (!end || end == v || !(d >= 0) || d * mul > 1e15) ckv_cli_usage_error("serve", "%s: expected a byte count like 512M, got '%s'", flag, v);
    return (size_t)(d * mul);
}

/* Whether host names only this machine (127.0.0.0/8, ::1, localhost): then no other machine can connect. */
static int host_is_loopback(const char *host) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    if (getaddrinfo(host, NULL, &hints, &ai) != 0 || !ai) return 0; /* the server reports the bad address */
    int loop = 1;
    for (const struct addrinfo *p = ai; p; p = p->ai_next) {
        if (p->ai_family == AF_INET)
            loop &= (ntohl(((const struct sockaddr_in *)p->ai_addr)->sin_addr.s_addr) >> 24) == 127;
        else if (p->ai_family == AF_INET6)
            loop &= IN6_IS_ADDR_LOOPBACK(&((const struct sockaddr_in6 *)p->ai_addr)->sin6_addr);
        else
            loop = 0;
    }
    freeaddrinfo(ai);
    return loop;
}

static void parse_args(serve_args *a, const ckv_opts *o) {
    memset(a, 0, sizeof *a);
    ckv_server_config *c = &a->cfg;
    ckv_server_config_defaults(c);
    const char *env_key = getenv("CKV_API_KEY");
    if (!ckv_opt_has(o, CKV_OPT_API_KEY) && env_key && !env_key[0])
        ckv_cli_usage_error("serve", "CKV_API_KEY is set but empty: give a key, or unset it to serve without one");
    c->api_key = ckv_opt_str(o, CKV_OPT_API_KEY, env_key);
    if (c->api_key && !c->api_key[0]) ckv_cli_usage_error("serve", "--api-key: the key is empty");
    c->host = ckv_opt_str(o, CKV_OPT_HOST, c->host);
    c->port = (int)ckv_opt_long(o, CKV_OPT_PORT, c->port);
    c->port_file = ckv_opt_str(o, CKV_OPT_PORT_FILE, NULL);
    c->model_name = ckv_opt_str(o, CKV_OPT_MODEL_NAME, NULL);
    c->max_batch = (int)ckv_opt_long(o, CKV_OPT_MAX_BATCH, c->max_batch);
    c->max_queue = (int)ckv_opt_long(o, CKV_OPT_MAX_QUEUE, c->max_queue);
    c->max_connections = (int)ckv_opt_long(o, CKV_OPT_MAX_CONNECTIONS, c->max_connections);
    if (ckv_opt_has(o, CKV_OPT_MAX_BODY_BYTES)) c->max_body_bytes = parse_bytes("--max-body-bytes", ckv_opt_str(o, CKV_OPT_MAX_BODY_BYTES, ""));
    if (c->max_body_bytes == 0) ckv_cli_usage_error("serve", "--max-body-bytes 0: every request would get 413 (expected at least 1)");
    c->request_timeout = ckv_opt_num(o, CKV_OPT_REQUEST_TIMEOUT, c->request_timeout);
    c->max_client_connections = (int)ckv_opt_long(o, CKV_OPT_MAX_CLIENT_CONNECTIONS, c->max_client_connections);
    c->max_prompt_tokens = (int)ckv_opt_long(o, CKV_OPT_MAX_PROMPT_TOKENS, 0);
    c->max_tokens_limit = (int)ckv_opt_long(o, CKV_OPT_MAX_TOKENS_LIMIT, c->max_tokens_limit);
    c->default_max_tokens = (int)ckv_opt_long(o, CKV_OPT_DEFAULT_MAX_TOKENS, c->default_max_tokens);
    if (ckv_opt_has(o, CKV_OPT_CACHE_BYTES)) c->cache_bytes = parse_bytes("--cache-bytes", ckv_opt_str(o, CKV_OPT_CACHE_BYTES, ""));
    c->cache_dir = ckv_opt_str(o, CKV_OPT_CACHE_DIR, NULL);
    if (c->cache_dir) {
        ckv_status st = ckv_srv_store_check_dir(c->cache_dir);
        if (st != CKV_STATUS_OK) ckv_cli_usage_error("serve", "%s", ckv_error_message());
    }
    c->grace_seconds = ckv_opt_num(o, CKV_OPT_GRACE_SECONDS, c->grace_seconds);
    c->interleave_seconds = ckv_opt_num(o, CKV_OPT_INTERLEAVE_MS, c->interleave_seconds * 1e3) / 1e3;
    c->max_batch_tokens = (int)ckv_opt_long(o, CKV_OPT_MAX_BATCH_TOKENS, c->max_batch_tokens);
    c->long_prompt_tokens = (int)ckv_opt_long(o, CKV_OPT_LONG_PROMPT_TOKENS, c->long_prompt_tokens);
    if (c->max_batch_tokens > 0 && c->long_prompt_tokens > c->max_batch_tokens) {
        if (ckv_opt_has(o, CKV_OPT_LONG_PROMPT_TOKENS))
            ckv_cli_usage_error("serve", "--long-prompt-tokens %d exceeds --max-batch-tokens %d: such contexts could never be "
                                "prefilled together", c->long_prompt_tokens, c->max_batch_tokens);
        c->long_prompt_tokens = c->max_batch_tokens; /* a smaller budget alone: every context it can take */
    }
    c->chat_template = ckv_opt_str(o, CKV_OPT_TEMPLATE, NULL);
    c->cors_origin = ckv_opt_str(o, CKV_OPT_CORS_ORIGIN, NULL);
    if (c->cors_origin && (!c->cors_origin[0] || strpbrk(c->cors_origin, "\r\n ,")))
        ckv_cli_usage_error("serve", "--cors-origin: one origin such as https://app.example.com, or *");
    c->special_in_content = ckv_opt_has(o, CKV_OPT_SPECIAL_IN_CONTENT) > 0;
    if (!c->api_key && !host_is_loopback(c->host))
        fprintf(stderr, "ckv serve: warning: --host %s accepts connections from other machines and no API key is set: anyone "
                        "who can reach the port can use the model and read its answers (set --api-key or CKV_API_KEY)\n", c->host);
    /* the default press of requests that name none */
    ckv_cli_press_single(o, "serve", &a->press);
    if (ckv_cli_decode_press(o, &a->press, 1, &a->decode)) c->default_decode_press = &a->decode;
    if (!c->model_name) {
        const char *m = ckv_opt_str(o, CKV_OPT_MODEL, "");
        size_t len = strlen(m);
        while (len > 1 && m[len - 1] == '/') len--; /* a directory given with a trailing slash */
        static char name[256];
        size_t start = len;
        while (start > 0 && m[start - 1] != '/') start--;
        snprintf(name, sizeof name, "%.*s", (int)(len - start), m + start);
        c->model_name = name;
    }
}

static void on_signal(int sig) {
    (void)sig;
    ckv_server_request_stop();
}

static void on_signal_follower(int sig) { (void)sig; } /* rank 0 drains the group and tells it when to stop */

int ckv_cmd_serve(int argc, char **argv) {
    ckv_opts opts;
    ckv_opts_parse(&opts, &serve_cmd, argc, argv);
    if (!ckv_opt_has(&opts, CKV_OPT_MODEL)) ckv_cli_usage_error("serve", "--model is required");
    serve_args a;
    parse_args(&a, &opts);
    /* every rank must serve the same model with the same flags; the job is one tensor-parallel group */
    ckv_cli_agreement ag;
    ckv_cli_agree_init(&ag, &opts, ckv_opt_str(&opts, CKV_OPT_MODEL, NULL));
    ckv_cli_agree_add(&ag, CKV_AGREE_PRESS, a.press.spec, strlen(a.press.spec));
    ckv_comm *world = ckv_cli_world(&ag, &argc, &argv);
    int tp_size = (int)ckv_opt_long(&opts, CKV_OPT_TP, world->size);
    if (tp_size != world->size)
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_ARG, "ckv serve runs one tensor-parallel group per job: --tp %d with %d "
                                            "ranks (start one job per group)", tp_size, world->size));
    if (world->size > 1 && !ckv_comm_mpi_any_thread())
        ckv_cli_check_comm(world, ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "tensor-parallel serving needs an MPI library with "
                                            "MPI_THREAD_SERIALIZED (the engine thread issues the collectives)"));
    ckv_engine_config ec;
    ckv_cli_engine_config(&opts, world, &ec);
    ckv_tokenizer *tok = NULL;
    ckv_cli_check_comm(world, ckv_text_open_tokenizer(&tok, ec.model_path));
    ec.tokenizer = tok;
    ckv_engine eng;
    ckv_cli_check_comm(world, ckv_engine_init(&eng, &ec, world->size > 1 ? world : NULL));
    ckv_cli_check_comm(world, ckv_press_check_layers(&a.press, eng.model->cfg.n_layers)); /* per_layer's ratios */
    a.cfg.default_press = a.press.scorer == CKV_SCORER_NONE && !a.press.query_aware ? NULL : &a.press;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = world->rank == 0 ? on_signal : on_signal_follower;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* rank 0 answers HTTP; the others run its engine steps */
    ckv_status st = world->rank == 0 ? ckv_server_run(&eng, &a.cfg) : ckv_server_follow(&eng, &a.cfg);
    ckv_engine_free(&eng);
    ckv_tokenizer_free(tok);
    if (st != CKV_STATUS_OK) ckv_cli_check_comm(world, st);
    ckv_comm_free(world);
    return 0;
}
#endif
