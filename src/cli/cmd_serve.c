/* cmd_serve.c - `ckv serve`: parses the server's flags (`--flag value` and `--flag=value`), loads the
 * model and its tokenizer, installs the SIGTERM/SIGINT drain, and hands over to src/server. */
#define _POSIX_C_SOURCE 200809L
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"

#ifndef CKV_HAVE_SERVER
int ckv_cmd_serve(int argc, char **argv) {
    (void)argc;
    (void)argv;
    ckv_cli_die("ckv serve is not built: libmicrohttpd was not found when ckv was configured (install libmicrohttpd-dev, "
                "tools/setup.sh does, and configure again)");
}
#else
#include "core/threadpool.h"
#include "engine/request.h"
#include "engine/text.h"
#include "server/server.h"

static void serve_usage(FILE *f) {
    fprintf(f,
            "usage: ckv serve --model PATH [flags]\n"
            "\n"
            "An OpenAI-compatible HTTP server: POST /v1/completions, /v1/chat/completions, /tokenize, /detokenize;\n"
            "GET /v1/models, /health, /metrics. Requests may choose their own press (extension fields \"press\",\n"
            "\"budget\" or \"compression_ratio\", \"query_aware\", \"context\"). SIGTERM drains and exits 0.\n"
            "\n"
            "  -m, --model PATH         Hugging Face model directory or GGUF file (with its tokenizer)\n"
            "  --model-name NAME        the model id clients send and /v1/models reports (default: the file name)\n"
            "  --host ADDR              address to bind (default 127.0.0.1: this machine only)\n"
            "  --port N                 TCP port (default 8080; 0: any free port)\n"
            "  --port-file F            write \"host:port\" to F once listening\n"
            "  --api-key KEY            require \"Authorization: Bearer KEY\" (default: $CKV_API_KEY, else none)\n"
            "  --max-batch N            sequences decoded together in one forward (default 8, at most 32)\n"
            "  --max-queue N            requests waiting for a batch slot before 429 (default 64)\n"
            "  --max-connections N      concurrent HTTP connections (default 256)\n"
            "  --max-body-bytes N       larger request bodies get 413 (default 8388608)\n"
            "  --max-prompt-tokens N    longer prompts get 400 (default: the model's window)\n"
            "  --max-tokens-limit N     larger max_tokens get 400 (default 4096)\n"
            "  --default-max-tokens N   max_tokens of chat requests that name none (default 16)\n"
            "  --cache-bytes N          memory for compressed contexts reused across requests, K/M/G suffixes\n"
            "                           (default 256M; 0: no reuse)\n"
            "  --cache-dir DIR          also keep compressed contexts as cache files in DIR (survive restarts)\n"
            "  --grace-seconds S        on SIGTERM, in-flight requests get S seconds before they are cancelled (30)\n"
            "  --chat-template NAME     chat template instead of the model's own (llama3, chatml, mistral, ...)\n"
            "  -t, --threads N          CPU threads (default: all cores)\n"
            "  --chunk N                prefill chunk in tokens (default 512)\n"
            "  --backend NAME           cpu or cuda (default cpu)\n"
            "\n"
            "Default press of requests that name none:\n"
            "  --press SPEC             none (default), snapkv, critical_adakv:snapkv, ... (docs/presses.md)\n"
            "  --budget B | --compression-ratio R | --budget-tokens N\n"
            "  --window N --kernel K --pool avg|max --alpha A --eps E --safeguard S --press-opt KEY=VALUE\n"
            "  --query-aware            compress the question with the context\n");
}

typedef struct {
    const char *model, *backend, *press_spec;
    int threads, chunk;
    ckv_server_config cfg;
    ckv_press_config press;
} serve_args;

static size_t parse_bytes(const char *flag, const char *v) {
    char *end = NULL;
    double d = strtod(v, &end);
    double mul = 1;
    if (end && *end) {
        if (!strcmp(end, "K") || !strcmp(end, "k")) mul = 1024.0;
        else if (!strcmp(end, "M") || !strcmp(end, "m")) mul = 1024.0 * 1024;
        else if (!strcmp(end, "G") || !strcmp(end, "g")) mul = 1024.0 * 1024 * 1024;
        else ckv_cli_die("%s: expected a byte count like 512M, got '%s'", flag, v);
    }
    if (!end || end == v || !(d >= 0) || d * mul > 1e15) ckv_cli_die("%s: expected a byte count like 512M, got '%s'", flag, v);
    return (size_t)(d * mul);
}

/* --flag=value becomes two arguments so every flag is read the same way (every string is a copy). */
static char **split_equals(int argc, char **argv, int *out_argc) {
    char **v = calloc((size_t)argc * 2 + 1, sizeof *v);
    if (!v) ckv_cli_die("out of memory");
    int n = 0;
    for (int i = 0; i < argc; i++) {
        const char *eq = strncmp(argv[i], "--", 2) == 0 ? strchr(argv[i], '=') : NULL;
        if (eq) {
            v[n++] = strndup(argv[i], (size_t)(eq - argv[i]));
            v[n++] = strdup(eq + 1);
            if (!v[n - 1] || !v[n - 2]) ckv_cli_die("out of memory");
        } else if (!(v[n++] = strdup(argv[i]))) {
            ckv_cli_die("out of memory");
        }
    }
    *out_argc = n;
    return v;
}

static void parse_press_flag(serve_args *a, const char *f, const char *val) {
    static const char *const opts[][2] = {{"--window", "window"}, {"--kernel", "kernel"}, {"--pool", "pool"}, {"--alpha", "alpha"},
                                          {"--eps", "eps"},       {"--safeguard", "safeguard"}, {"--profile", "profile"}};
    for (size_t j = 0; j < sizeof opts / sizeof opts[0]; j++)
        if (!strcmp(f, opts[j][0])) {
            ckv_cli_check(ckv_press_set_option(&a->press, opts[j][1], val));
            return;
        }
    if (!strcmp(f, "--press-opt")) {
        const char *eq = strchr(val, '=');
        if (!eq || eq == val) ckv_cli_die("--press-opt: expected KEY=VALUE, got '%s'", val);
        char key[64];
        snprintf(key, sizeof key, "%.*s", (int)(eq - val), val);
        ckv_cli_check(ckv_press_set_option(&a->press, key, eq + 1));
    } else if (!strcmp(f, "--budget")) {
        ckv_cli_check(ckv_press_set_budget(&a->press, ckv_cli_parse_double(f, val, -1e300, 1e300)));
    } else if (!strcmp(f, "--compression-ratio")) {
        ckv_cli_check(ckv_press_set_compression_ratio(&a->press, ckv_cli_parse_double(f, val, -1e300, 1e300)));
    } else if (!strcmp(f, "--budget-tokens")) {
        ckv_cli_check(ckv_press_set_budget_tokens(&a->press, (int)ckv_cli_parse_long(f, val, -(1L << 30), 1L << 30)));
    }
}

static int is_press_flag(const char *f) {
    static const char *const flags[] = {"--window", "--kernel", "--pool", "--alpha", "--eps", "--safeguard", "--profile",
                                        "--press-opt", "--budget", "--compression-ratio", "--budget-tokens"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(f, flags[i])) return 1;
    return 0;
}

static void parse_args(serve_args *a, int argc, char **argv) {
    memset(a, 0, sizeof *a);
    ckv_server_config_defaults(&a->cfg);
    a->cfg.api_key = getenv("CKV_API_KEY");
    if (a->cfg.api_key && !a->cfg.api_key[0]) a->cfg.api_key = NULL;
    a->backend = "cpu";
    a->press_spec = "none";
    int budget_flags = 0;
    for (int i = 1; i < argc - 1; i++)
        if (!strcmp(argv[i], "--press")) a->press_spec = argv[i + 1];
    ckv_cli_check(ckv_press_parse(&a->press, a->press_spec));
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        ckv_server_config *c = &a->cfg;
        if (!strcmp(f, "--help") || !strcmp(f, "-h")) {
            serve_usage(stdout);
            exit(0);
        } else if (!strcmp(f, "--model") || !strcmp(f, "-m")) {
            a->model = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--model-name")) {
            c->model_name = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--host")) {
            c->host = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--port")) {
            c->port = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 0, 65535);
        } else if (!strcmp(f, "--port-file")) {
            c->port_file = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--api-key")) {
            c->api_key = ckv_cli_value(argc, argv, &i);
            if (!c->api_key[0]) ckv_cli_die("--api-key: the key is empty");
        } else if (!strcmp(f, "--max-batch")) {
            c->max_batch = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 32);
        } else if (!strcmp(f, "--max-queue")) {
            c->max_queue = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 20);
        } else if (!strcmp(f, "--max-connections")) {
            c->max_connections = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 16);
        } else if (!strcmp(f, "--max-body-bytes")) {
            c->max_body_bytes = parse_bytes(f, ckv_cli_value(argc, argv, &i));
        } else if (!strcmp(f, "--max-prompt-tokens")) {
            c->max_prompt_tokens = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 30);
        } else if (!strcmp(f, "--max-tokens-limit")) {
            c->max_tokens_limit = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 24);
        } else if (!strcmp(f, "--default-max-tokens")) {
            c->default_max_tokens = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 0, 1 << 24);
        } else if (!strcmp(f, "--cache-bytes")) {
            c->cache_bytes = parse_bytes(f, ckv_cli_value(argc, argv, &i));
        } else if (!strcmp(f, "--cache-dir")) {
            c->cache_dir = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--grace-seconds")) {
            c->grace_seconds = ckv_cli_parse_double(f, ckv_cli_value(argc, argv, &i), 0, 86400);
        } else if (!strcmp(f, "--chat-template")) {
            c->chat_template = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--threads") || !strcmp(f, "-t")) {
            a->threads = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 4096);
        } else if (!strcmp(f, "--chunk")) {
            a->chunk = (int)ckv_cli_parse_long(f, ckv_cli_value(argc, argv, &i), 1, 1 << 24);
        } else if (!strcmp(f, "--backend")) {
            a->backend = ckv_cli_value(argc, argv, &i);
        } else if (!strcmp(f, "--press")) {
            ckv_cli_value(argc, argv, &i); /* read above: it resets the options */
        } else if (is_press_flag(f)) {
            const char *val = ckv_cli_value(argc, argv, &i);
            budget_flags += !strcmp(f, "--budget") || !strcmp(f, "--compression-ratio") || !strcmp(f, "--budget-tokens");
            parse_press_flag(a, f, val);
        } else if (!strcmp(f, "--query-aware")) {
            a->press.query_aware = 1;
        } else {
            ckv_cli_usage_error("serve", "unknown flag '%s'", f);
        }
    }
    if (!a->model) ckv_cli_usage_error("serve", "--model is required");
    if (budget_flags > 1) ckv_cli_usage_error("serve", "give one of --budget, --compression-ratio and --budget-tokens");
    if (a->press.scorer != CKV_SCORER_NONE && budget_flags == 0)
        ckv_cli_die("--press %s needs a budget: --budget B, --compression-ratio R or --budget-tokens N", a->press_spec);
    ckv_cli_check(ckv_press_finalize(&a->press));
    if (!a->cfg.model_name) {
        const char *slash = strrchr(a->model, '/');
        a->cfg.model_name = slash && slash[1] ? slash + 1 : a->model;
    }
}

static void on_signal(int sig) {
    (void)sig;
    ckv_server_request_stop();
}

/* Tensor-parallel serving is not there yet: refuse to start one server per rank of a larger job. */
static void check_single_rank(void) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
        const char *v = getenv(vars[i]);
        if (v && atoi(v) > 1)
            ckv_cli_die("ckv serve runs on one rank for now (%s=%s): tensor-parallel serving is not implemented; start one "
                        "server per rank group with one task each", vars[i], v);
    }
}

int ckv_cmd_serve(int argc, char **argv) {
    int n = 0;
    char **args = split_equals(argc, argv, &n);
    serve_args a;
    parse_args(&a, n, args);
    check_single_rank();
    ckv_tokenizer *tok = NULL;
    ckv_cli_check(ckv_text_open_tokenizer(&tok, a.model));
    ckv_engine_config ec = {.model_path = a.model, .backend = a.backend, .threads = a.threads ? a.threads : ckv_cpu_count(),
                            .device = -1, .chunk = a.chunk, .tokenizer = tok};
    ckv_engine eng;
    ckv_cli_check(ckv_engine_init(&eng, &ec, NULL));
    a.cfg.default_press = a.press.scorer == CKV_SCORER_NONE && !a.press.query_aware ? NULL : &a.press;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    ckv_status st = ckv_server_run(&eng, &a.cfg);
    ckv_engine_free(&eng);
    ckv_tokenizer_free(tok);
    for (int i = 0; i < n; i++) free(args[i]);
    free(args);
    ckv_cli_check(st);
    return 0;
}
#endif
