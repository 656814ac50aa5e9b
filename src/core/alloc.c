/* alloc.c - aligned allocation with live/peak accounting, and /proc based RSS figures. */
#include "alloc.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t bytes;
    size_t pad[7]; /* keeps the payload 64-byte aligned */
} ckv_alloc_header;

static atomic_size_t ckv_live_bytes;
static atomic_size_t ckv_peak_bytes;

ckv_status ckv_alloc_raw(void **out, size_t bytes, const char *what) {
    *out = NULL;
    size_t total = bytes + sizeof(ckv_alloc_header);
    if (total < bytes) return ckv_error(CKV_STATUS_ERR_NOMEM, "allocation of %zu bytes for %s overflows", bytes, what);
    total = (total + CKV_ALIGN - 1) / CKV_ALIGN * CKV_ALIGN;
    ckv_alloc_header *h = aligned_alloc(CKV_ALIGN, total);
    if (!h) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes, what);
    h->bytes = bytes;
    size_t now = atomic_fetch_add(&ckv_live_bytes, bytes) + bytes;
    size_t peak = atomic_load(&ckv_peak_bytes);
    while (now > peak && !atomic_compare_exchange_weak(&ckv_peak_bytes, &peak, now)) {
    }
    *out = h + 1;
    return CKV_STATUS_OK;
}

ckv_status ckv_alloc(void **out, size_t bytes, const char *what) {
    CKV_TRY(ckv_alloc_raw(out, bytes, what));
    memset(*out, 0, bytes);
    return CKV_STATUS_OK;
}

void ckv_free(void *p) {
    if (!p) return;
    ckv_alloc_header *h = (ckv_alloc_header *)p - 1;
    atomic_fetch_sub(&ckv_live_bytes, h->bytes);
    free(h);
}

size_t ckv_alloc_live_bytes(void) { return atomic_load(&ckv_live_bytes); }
size_t ckv_alloc_peak_bytes(void) { return atomic_load(&ckv_peak_bytes); }
void ckv_alloc_reset_peak(void) { atomic_store(&ckv_peak_bytes, atomic_load(&ckv_live_bytes)); }

static size_t ckv_proc_status_kb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    size_t kb = 0, klen = strlen(key);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, key, klen) == 0) {
            kb = strtoull(line + klen, NULL, 10);
            break;
        }
    }
    fclose(f);
    return kb * 1024;
}

size_t ckv_mem_peak_rss(void) { return ckv_proc_status_kb("VmHWM:"); }
size_t ckv_mem_current_rss(void) { return ckv_proc_status_kb("VmRSS:"); }

const char *ckv_format_bytes(double bytes, char *buf, size_t cap) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (bytes >= 1024.0 && u < 4) {
        bytes /= 1024.0;
        u++;
    }
    snprintf(buf, cap, u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
    return buf;
}
