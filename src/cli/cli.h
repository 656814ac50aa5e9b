/* cli.h - shared pieces of the `ckv` command line: strict flag-value parsing that ends the program
 * with a one-line error naming the flag, and the subcommand entry points. cli/ is the only code
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

/* Returns argv[*i + 1] as the value of flag argv[*i] and advances *i; dies when it is missing. */
const char *ckv_cli_value(int argc, char **argv, int *i);
long ckv_cli_parse_long(const char *flag, const char *value, long min, long max);
double ckv_cli_parse_double(const char *flag, const char *value, double min, double max);

/* Parses "1,2,3" (commas, spaces or newlines) into a malloc'd array; dies naming `what` on bad input. */
int32_t *ckv_cli_parse_ids(const char *text, int *n, const char *what);

int ckv_cmd_generate(int argc, char **argv);
int ckv_cmd_inspect(int argc, char **argv);
int ckv_cmd_tokenize(int argc, char **argv);
int ckv_cmd_analyze(int argc, char **argv);
int ckv_cmd_eval(int argc, char **argv);
int ckv_cmd_fidelity(int argc, char **argv);
int ckv_cmd_serve(int argc, char **argv);

#endif
