/* cli_opts.h - the one flag table of the `ckv` command line: every option with its long name, the
 * short alias llama.cpp users expect (-m, -p, -f, -n, -c, -t), its group (input, model, runtime,
 * sampling, press, output, server), meaning, default and the commands that take it; a parser for
 * `--flag value`, `--flag=value` and `-x value` that validates every value (integer and number
 * ranges, choices) before any work starts; and --help generated from the table. Commands read the
 * parsed values by option id. It does not know what the options do. */
#ifndef CKV_CLI_OPTS_H
#define CKV_CLI_OPTS_H

#include <stdint.h>
#include <stdio.h>

typedef enum { /* commands, as bits of an option's command mask */
    CKV_CMD_GENERATE = 1 << 0,
    CKV_CMD_INSPECT = 1 << 1,
    CKV_CMD_TOKENIZE = 1 << 2,
    CKV_CMD_ANALYZE = 1 << 3,
    CKV_CMD_EVAL = 1 << 4,
    CKV_CMD_FIDELITY = 1 << 5,
    CKV_CMD_SERVE = 1 << 6,
    CKV_CMD_PROFILE_HEADS = 1 << 7
} ckv_cli_cmd;

typedef enum {
    CKV_OPT_HELP = 0,
    /* input */
    CKV_OPT_PROMPT, CKV_OPT_PROMPT_FILE, CKV_OPT_PROMPT_IDS, CKV_OPT_PROMPT_IDS_FILE, CKV_OPT_QUESTION,
    CKV_OPT_QUESTION_IDS, CKV_OPT_CHAT, CKV_OPT_TEMPLATE, CKV_OPT_SYSTEM, CKV_OPT_LOAD_CACHE, CKV_OPT_TEXT,
    CKV_OPT_TEXT_FILE, CKV_OPT_DECODE, CKV_OPT_ADD_SPECIAL, CKV_OPT_NO_SPECIAL, CKV_OPT_SPLIT_SPECIAL,
    CKV_OPT_SKIP_SPECIAL, CKV_OPT_UTF8_REPLACE, CKV_OPT_TASK, CKV_OPT_LENGTH, CKV_OPT_SAMPLES, CKV_OPT_DATA,
    CKV_OPT_METRIC, CKV_OPT_BAD_INPUT, CKV_OPT_HAYSTACK, CKV_OPT_CONTEXT, CKV_OPT_CONTINUATION, CKV_OPT_NEW_TOKENS,
    /* model */
    CKV_OPT_MODEL, CKV_OPT_BACKEND, CKV_OPT_TP, CKV_OPT_WEIGHTS_DTYPE, CKV_OPT_RANDOM_WEIGHTS,
    /* runtime */
    CKV_OPT_THREADS, CKV_OPT_CHUNK, CKV_OPT_DEVICE, CKV_OPT_KV_DTYPE, CKV_OPT_GPU_MEM_LIMIT, CKV_OPT_COMM_TIMEOUT,
    /* sampling */
    CKV_OPT_MAX_NEW_TOKENS, CKV_OPT_TEMPERATURE, CKV_OPT_TOP_K, CKV_OPT_TOP_P, CKV_OPT_SEED, CKV_OPT_IGNORE_EOS,
    /* press */
    CKV_OPT_PRESS, CKV_OPT_PRESS_A, CKV_OPT_PRESS_B, CKV_OPT_BUDGET, CKV_OPT_COMPRESSION_RATIO, CKV_OPT_BUDGET_TOKENS,
    CKV_OPT_WINDOW, CKV_OPT_KERNEL, CKV_OPT_POOL, CKV_OPT_ALPHA, CKV_OPT_EPS, CKV_OPT_SAFEGUARD, CKV_OPT_PROFILE,
    CKV_OPT_PRESS_OPT, CKV_OPT_QUERY_AWARE, CKV_OPT_NO_BASELINE,
    CKV_OPT_DECODE_PRESS, CKV_OPT_DECODE_INTERVAL, CKV_OPT_DECODE_TARGET, CKV_OPT_DECODE_RATIO,
    CKV_OPT_SEPARATE_PREFILL, CKV_OPT_LAYERWISE, CKV_OPT_TOPK, CKV_OPT_PROBES_OUT, CKV_OPT_COUNT_PROBES,
    /* output */
    CKV_OPT_OUT, CKV_OPT_STATS_JSON, CKV_OPT_DUMP_LOGITS, CKV_OPT_DUMP_KEPT, CKV_OPT_SAVE_CACHE, CKV_OPT_PROGRESS,
    CKV_OPT_REPORT_ONLY, CKV_OPT_COUNT,
    /* server */
    CKV_OPT_HOST, CKV_OPT_PORT, CKV_OPT_PORT_FILE, CKV_OPT_API_KEY, CKV_OPT_MODEL_NAME, CKV_OPT_MAX_BATCH, CKV_OPT_MAX_QUEUE,
    CKV_OPT_MAX_CONNECTIONS, CKV_OPT_MAX_BODY_BYTES, CKV_OPT_MAX_PROMPT_TOKENS, CKV_OPT_MAX_TOKENS_LIMIT,
    CKV_OPT_DEFAULT_MAX_TOKENS, CKV_OPT_CACHE_BYTES, CKV_OPT_CACHE_DIR, CKV_OPT_GRACE_SECONDS, CKV_OPT_INTERLEAVE_MS, CKV_OPT_MAX_BATCH_TOKENS, CKV_OPT_LONG_PROMPT_TOKENS,
    CKV_OPT_CORS_ORIGIN,
    /* server: hostile and slow clients */
    CKV_OPT_REQUEST_TIMEOUT, CKV_OPT_MAX_CLIENT_CONNECTIONS, CKV_OPT_SPECIAL_IN_CONTENT,
    CKV_OPT_VERIFY_WEIGHTS,
    CKV_OPT_N_
} ckv_opt_id;

typedef enum { CKV_OPT_KIND_FLAG, CKV_OPT_KIND_STR, CKV_OPT_KIND_INT, CKV_OPT_KIND_NUM } ckv_opt_kind;

typedef struct {
    ckv_opt_id id;
    const char *name;      /* long name without "--" */
    char alias;            /* short alias or 0 */
    ckv_opt_kind kind;
    const char *group;     /* help section */
    const char *metavar;   /* value placeholder in --help */
    const char *help;      /* meaning ('\n' continues on the next help line) */
    const char *def;       /* default as shown in --help (NULL: none) */
    unsigned cmds;         /* commands that take it (ckv_cli_cmd bits) */
    double min, max;       /* range of INT and NUM values */
    const char *choices;   /* STR values allowed, '|' separated (NULL: any) */
    int repeat;            /* may be given several times (values kept in order) */
    int per_rank;          /* may differ between MPI ranks: threads, device, progress, and the model path
                            * (ranks compare the model's files instead) */
} ckv_opt_def;

#define CKV_OPTS_MAX 512

typedef struct {
    ckv_cli_cmd cmd;
    const char *cmd_name;
    int n;
    struct {
        ckv_opt_id id;
        const char *value;   /* NULL for flags */
        const ckv_opt_def *def;
    } occ[CKV_OPTS_MAX];     /* in command-line order */
} ckv_opts;

typedef struct {
    ckv_cli_cmd cmd;
    const char *name;
    const char *usage;       /* the usage line(s) after "usage: ckv <name> " */
    const char *about;       /* a paragraph after the usage (NULL: none) */
} ckv_cli_command;

/* Parses argv[1..argc) of `cmd` (argv[0] is the command name). --help prints the generated help and
 * exits 0; any bad flag or value exits 2 with one line naming it. */
void ckv_opts_parse(ckv_opts *o, const ckv_cli_command *cmd, int argc, char **argv);

/* Prints the help of a command generated from the table. */
void ckv_opts_help(const ckv_cli_command *cmd, FILE *f);

int ckv_opt_has(const ckv_opts *o, ckv_opt_id id);               /* times given */
const char *ckv_opt_str(const ckv_opts *o, ckv_opt_id id, const char *def); /* last value */
long ckv_opt_long(const ckv_opts *o, ckv_opt_id id, long def);
double ckv_opt_num(const ckv_opts *o, ckv_opt_id id, double def);
/* Every value of a repeatable option, in order; returns how many (at most cap). */
int ckv_opt_all(const ckv_opts *o, ckv_opt_id id, const char **vals, int cap);
/* The table entry of an option for the parsed command ("--name" for messages). */
const ckv_opt_def *ckv_opt_def_of(const ckv_opts *o, ckv_opt_id id);
const char *ckv_opt_flag(ckv_opt_id id); /* "--name" */

/* Usage error unless at most one of the options is given: "--a and --b ..." names both. */
void ckv_opts_exclusive(const ckv_opts *o, const ckv_opt_id *ids, int n, const char *why);

/* Threads to use: --threads (capped at the machine's cores with one warning line: more threads than
 * cores only slow the matmuls down), else the cores shared among the node's ranks. */
int ckv_opts_threads(const ckv_opts *o, int ranks_on_node, int warn);

#endif
