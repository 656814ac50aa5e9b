/* atomic_file.h - writing a file so that readers see either the old content or the complete new
 * one: the data goes to a temporary file in the target's directory, is synced, and is renamed over
 * the target, whose directory is then synced. Only a regular file (or a path that does not exist
 * yet) is replaced: a directory, symbolic link, device, FIFO or socket at the target is refused
 * with an error naming it, so `--save-cache /dev/full` cannot turn a device into a file. It does
 * not lock: two writers of one path leave one of the two complete files. */
#ifndef CKV_ATOMIC_FILE_H
#define CKV_ATOMIC_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "status.h"

typedef struct {
    FILE *f;    /* write the content through this stream */
    char *path; /* the target */
    char *tmp;  /* the temporary beside it */
} ckv_atomic_file;

/* Whether path may be written by ckv_atomic_file_open (a regular file or nothing there), without
 * writing anything: lets a command refuse a bad output path before it starts its work. */
ckv_status ckv_atomic_file_check(const char *path, const char *what);

/* Checks the target and creates the temporary (mode: the target's when it exists, else 0666 less
 * the umask). `what` names the file's role in errors (e.g. "--save-cache"); may be NULL. */
ckv_status ckv_atomic_file_open(ckv_atomic_file *a, const char *path, const char *what);

/* Flushes, syncs and closes the temporary, renames it over the target and syncs the directory.
 * On failure the temporary is removed and the target is left as it was. Always releases *a. */
ckv_status ckv_atomic_file_commit(ckv_atomic_file *a);

/* Closes and removes the temporary; accepts a zeroed or already released object. */
void ckv_atomic_file_abort(ckv_atomic_file *a);

/* open + one write of data[len] + commit. */
ckv_status ckv_write_file_atomic(const char *path, const void *data, size_t len, const char *what);

#endif
