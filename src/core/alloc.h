/* alloc.h - 64-byte aligned host allocation with a process-wide account of live and peak bytes,
 * and the process's resident-set figures. Device memory is the backends' business. */
#ifndef CKV_ALLOC_H
#define CKV_ALLOC_H

#include <stddef.h>

#include "status.h"

#define CKV_ALIGN 64

/* Allocates `bytes` (64-byte aligned, zeroed) into *out; a clear error naming `what` on failure.
 * The default: any buffer that may be read before every byte of it is written. */
ckv_status ckv_alloc(void **out, size_t bytes, const char *what);
/* The same without zeroing (the contents are undefined): only for a buffer whose every byte is
 * written before it is read, or whose unwritten bytes are never read (a KV pool, whose rows past a
 * segment's length nothing reads). Saves the pass over memory, and on fresh pages the clearing
 * happens once, in the kernel, where the first write touches them. */
ckv_status ckv_alloc_raw(void **out, size_t bytes, const char *what);
/* Frees memory from ckv_alloc; NULL is fine. */
void ckv_free(void *p);

/* Bytes currently held / the most ever held through ckv_alloc. */
size_t ckv_alloc_live_bytes(void);
size_t ckv_alloc_peak_bytes(void);
void ckv_alloc_reset_peak(void);

/* Peak and current resident set size of the process in bytes (0 when unknown). */
size_t ckv_mem_peak_rss(void);
size_t ckv_mem_current_rss(void);

/* Formats a byte count as "12.3 MiB" into buf. */
const char *ckv_format_bytes(double bytes, char *buf, size_t cap);

#endif
