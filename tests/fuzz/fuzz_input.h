/* fuzz_input.h - what the libFuzzer targets share: the input written to an in-memory file (memfd)
 * so that readers taking a path see exactly those bytes, and the invariant every refused input must
 * meet (a non-empty one-line message of printable bytes). Header-only; fuzz targets only. */
#ifndef CKV_FUZZ_INPUT_H
#define CKV_FUZZ_INPUT_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* memfd_create; include this header before any other */
#endif
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/status.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Replaces the content of this target's memfd with data[size]; returns its /proc path. */
static inline const char *ckv_fuzz_file(const uint8_t *data, size_t size) {
    static int fd = -1;
    static char path[64];
    if (fd < 0) {
        fd = memfd_create("ckv_fuzz", 0);
        if (fd < 0) abort();
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    }
    if (ftruncate(fd, 0) != 0 || (size && pwrite(fd, data, size, 0) != (ssize_t)size)) abort();
    return path;
}

/* Aborts unless the last error message is non-empty, one line and printable. */
static inline void ckv_fuzz_check_message(void) {
    const char *m = ckv_error_message();
    if (!m[0]) abort();
    for (const unsigned char *p = (const unsigned char *)m; *p; p++)
        if (*p < 0x20 || *p == 0x7F) abort();
}

#endif
