/* weights_digest.h - a digest per file of what a model path holds, so that the ranks of a job can
 * check they read the same bytes (the ranks compare the digests; this file computes them and knows
 * no communicator). Two depths:
 *   sample: each file's size and header (GGUF: header, metadata and tensor table; safetensors: the
 *           JSON header), and for every tensor blocks of its data: the first and the last, four at
 *           offsets drawn from a fixed seed and the tensor's name, and the first and last block of
 *           every tensor-parallel part of it, split by rows and by columns (so each rank's slice of
 *           a row-split q_proj or a column-split o_proj is sampled at both ends); a few KB per tensor.
 *   full:   every byte of every file.
 * The hash is a fast 64-bit mix, not a cryptographic one: it catches copies that differ (a bad
 * transfer, another revision, an edited byte), not a rank that forges its files. Does not load or
 * convert weights. */
#ifndef CKV_MODEL_WEIGHTS_DIGEST_H
#define CKV_MODEL_WEIGHTS_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

typedef enum { CKV_DIGEST_NONE, CKV_DIGEST_SAMPLE, CKV_DIGEST_FULL } ckv_digest_mode;

#define CKV_DIGEST_BLOCK 512      /* bytes per sampled block */
#define CKV_DIGEST_MAX_PARTS 64   /* tensor-parallel parts sampled at most */
#define CKV_DIGEST_NAME 256

typedef struct {
    int n;                                /* files */
    char (*names)[CKV_DIGEST_NAME];       /* [n] file names inside the model path (the file's own for a file) */
    uint64_t *digest;                     /* [n] */
    uint64_t bytes_read;                  /* hashed bytes, all files */
} ckv_weights_digest;

/* Digests the files of model_path: a GGUF file, or a directory (config.json, the safetensors index
 * when present, then every *.safetensors in name order). parts: the tensor-parallel ranks whose slices
 * sample mode covers (1 for none). Errors name the file. *d is zeroed first; free it either way. */
ckv_status ckv_weights_digest_compute(ckv_weights_digest *d, const char *model_path, ckv_digest_mode mode, int parts);
void ckv_weights_digest_free(ckv_weights_digest *d); /* partial and zeroed objects are fine */

/* "none", "sample" or "full" -> mode; -1 for anything else. */
int ckv_digest_mode_parse(const char *s);

#endif
