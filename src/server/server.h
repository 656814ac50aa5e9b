/* server.h - `ckv serve`: an OpenAI-compatible HTTP server over one engine. The public entry: a
 * configuration (address, limits, defaults, the compressed-context store) and ckv_server_run, which
 * serves until ckv_server_request_stop (e.g. from a SIGTERM handler), then drains within the grace
 * period and returns. In a tensor-parallel group rank 0 runs ckv_server_run (HTTP, the scheduler) and
 * every other rank ckv_server_follow (the same engine steps, received from rank 0), with the same
 * configuration. It does not parse the command line (src/cli does) or load the model (the engine
 * does). */
#ifndef CKV_SERVER_H
#define CKV_SERVER_H

#include <stddef.h>

#include "core/status.h"
#include "engine/request.h"
#include "engine/decode_press.h"
#include "evict/press.h"
#include "tokenizer/tokenizer.h"

typedef struct {
    const char *host;          /* address to bind ("127.0.0.1" by default) */
    int port;                  /* 0: any free port (the bound one is printed and written to port_file) */
    const char *port_file;     /* where "host:port" is written once listening (NULL: nowhere) */
    const char *api_key;       /* NULL: no authentication; else "Authorization: Bearer <key>" is required */
    const char *model_name;    /* the id /v1/models reports and requests may name */
    int max_batch;             /* sequences decoded together in one forward (1..32) */
    int max_queue;             /* requests waiting for a batch slot before 429 */
    int max_connections;       /* concurrent HTTP connections */
    int max_client_connections; /* concurrent connections from one client address (0: max_connections / 4) */
    double request_timeout;    /* seconds a request's headers and body may take in all, from its first byte
                                * (or the end of the previous request on the connection); not reset per byte */
    size_t max_body_bytes;     /* request bodies above this get 413 */
    int max_prompt_tokens;     /* prompts above this get 400 (0: the model's window) */
    int max_tokens_limit;      /* max_tokens above this get 400 */
    int default_max_tokens;    /* cap on max_tokens when a request names none (0: none; the rest of the window) */
    size_t cache_bytes;        /* byte limit of the in-memory compressed-context store (0: no store) */
    const char *cache_dir;     /* cache files of compressed contexts (NULL: memory only) */
    double grace_seconds;      /* SIGTERM: in-flight requests get this long to finish, then are cancelled */
    double interleave_seconds; /* a prefill pauses for the running streams after a layer ending this long after
                                * their last token (0: after every layer) */
    int max_batch_tokens;      /* context tokens prefilled together in one forward (0: each context alone) */
    int long_prompt_tokens;    /* a longer context is prefilled alone, one layer per turn (1..max_batch_tokens) */
    const ckv_press_config *default_press; /* the press of requests that name none (NULL: full cache) */
    const ckv_decode_press *default_decode_press; /* decode-time compression of requests that name none (NULL: none) */
    const char *chat_template; /* template name instead of the tokenizer's own (NULL) */
    const char *cors_origin;   /* Access-Control-Allow-Origin of every response and preflight (NULL: no CORS) */
    int special_in_content;    /* 1: special-token text in message content becomes special tokens (the old
                                * behaviour); 0: content is plain text, only the template's markers are special */
} ckv_server_config;

/* Fills the defaults (127.0.0.1, port 8080, batch 8, queue 64, 256 connections (a quarter of them
 * per client address), 30 s for a request to arrive, 8 MiB bodies, 4096 max_tokens, default
 * max_tokens the rest of the window, 256 MiB store, 30 s grace, 50 ms interleave, contexts of up to
 * 256 tokens prefilled together up to 512 tokens per forward). */
void ckv_server_config_defaults(ckv_server_config *cfg);

/* Serves until ckv_server_request_stop; returns OK after a clean drain. The engine must have a
 * tokenizer (engine->cfg.tokenizer). */
ckv_status ckv_server_run(ckv_engine *engine, const ckv_server_config *cfg);

/* A rank other than 0 of the engine's tensor-parallel group: runs rank 0's engine steps until rank 0
 * stops; returns OK when it stopped cleanly. cfg must equal rank 0's (max_batch, the store). */
ckv_status ckv_server_follow(ckv_engine *engine, const ckv_server_config *cfg);

/* Async-signal-safe: asks the running server to stop accepting and drain. */
void ckv_server_request_stop(void);

#endif
