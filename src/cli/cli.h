/* cli.h - shared pieces of the `ckv` command line: fatal errors (one line naming what is wrong),
 * value and id-list parsing, the engine configuration from the flags, and the subcommand entry
 * points (the flag table is cli_opts.h). cli/ is the only code
 * that may exit(). */
#ifndef CKV_CLI_H
#define CKV_CLI_H

#include <stdint.h>

#include "core/status.h"

/* Prints "ckv: error: <msg>" and exits 1 (2 for usage errors). */
_Noreturn void ckv_cli_die(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;
_Noreturn void ckv_cli_usage_error(const char *cmd, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
/* Dies with the library's message when s is not OK. */
void ckv_cli_check(ckv_status s);
/* The same inside a (possibly MPI) job: the failing rank prints its error (prefixed with its rank
 * when there are several) and the whole job is aborted, so no rank waits in a collective. */
struct ckv_comm;
void ckv_cli_check_comm(struct ckv_comm *comm, ckv_status s);

long ckv_cli_parse_long(const char *flag, const char *value, long min, long max);
double ckv_cli_parse_double(const char *flag, const char *value, double min, double max);

/* Parses "1,2,3" (commas, spaces or newlines) into a malloc'd array; dies naming `what` on bad input. */
int32_t *ckv_cli_parse_ids(const char *text, int *n, const char *what);

/* The runtime flags (model, backend, threads, device, chunk, KV and weight types) as the engine's
 * configuration: the one place the command line hands them to the engine. Threads default to the
 * cores shared among the node's ranks, the device to the node-local rank's GPU (--backend cuda). */
#include "cli/cli_opts.h"
#include "engine/request.h"
void ckv_cli_engine_config(const ckv_opts *o, struct ckv_comm *world, ckv_engine_config *ec);

int ckv_cmd_generate(int argc, char **argv);
int ckv_cmd_inspect(int argc, char **argv);
int ckv_cmd_tokenize(int argc, char **argv);
int ckv_cmd_analyze(int argc, char **argv);
int ckv_cmd_eval(int argc, char **argv);
int ckv_cmd_fidelity(int argc, char **argv);
int ckv_cmd_serve(int argc, char **argv);
int ckv_cmd_profile_heads(int argc, char **argv);

#endif
