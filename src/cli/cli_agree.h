/* cli_agree.h - what the ranks of an MPI job must agree on before any work: the command, the model
 * (its configuration and file sizes), every flag that shapes the work, the prompt and question ids
 * and the press specs. Each rank hashes them item by item, the ranks all-gather the hashes (the comm
 * layer), and on a mismatch every rank exits 1 after rank 0 printed one line naming the first
 * differing item and the ranks that differ from rank 0. Per-rank flags (--threads, --device,
 * --progress) may differ, and so may the model path (the model's files are compared instead). Then
 * the ranks compare a digest of each model file (--verify-weights: sampled by default, every byte
 * with full; model/weights_digest.h), since safetensors and GGUF files carry no checksum of their
 * own: a file that differs ends the job on every rank with one line naming the file and the ranks. */
#ifndef CKV_CLI_AGREE_H
#define CKV_CLI_AGREE_H

#include <stddef.h>
#include <stdint.h>

#include "cli/cli_opts.h"
#include "comm/comm.h"

enum { CKV_AGREE_COMMAND, CKV_AGREE_MODEL, CKV_AGREE_PROMPT, CKV_AGREE_QUESTIONS, CKV_AGREE_PRESS, CKV_AGREE_FIRST_OPT = 8 };
#define CKV_AGREE_ITEMS (CKV_AGREE_FIRST_OPT + CKV_OPT_N_)

typedef struct {
    uint64_t h[CKV_AGREE_ITEMS];
    double comm_timeout_s; /* --comm-timeout (0: the default), for the world communicator */
    char model_path[4096]; /* "" when the command reads no model */
    int verify;            /* ckv_digest_mode of --verify-weights (none for commands that read no weights) */
    int tp;                /* --tp (0: all ranks): the slices the sampled digest covers */
} ckv_cli_agreement;

/* Starts with the command and every flag of o that is not per-rank; the model path (may be NULL)
 * is fingerprinted from its files (config.json and safetensors sizes of a directory, size and
 * first MiB of a file). */
void ckv_cli_agree_init(ckv_cli_agreement *a, const ckv_opts *o, const char *model_path);
/* Mixes bytes into one item (prompt ids, question ids, press specs). */
void ckv_cli_agree_add(ckv_cli_agreement *a, int item, const void *data, size_t len);
/* Compares across the ranks of world, the model files' digests last; returns when they agree (or
 * world has one rank). */
void ckv_cli_agree_check(ckv_comm *world, const ckv_cli_agreement *a);

/* The world communicator of a command that may run under mpirun: MPI when launched by it, else one
 * process; the agreement is checked before returning. */
ckv_comm *ckv_cli_world(ckv_cli_agreement *a, int *argc, char ***argv);

#endif
