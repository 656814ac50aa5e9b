/* cuda_ledger.cu - the CUDA backend's ledger of its own device memory: every buffer it allocates
 * (alloc: weights, KV pools, the engine's buffers) and every workspace it grows (the GEMM's bf16
 * activations, the split-KV partials, the eviction scratch, cuBLAS's workspace), by pointer, with
 * the bytes live now and at their peak, the peak's largest parts by name (digits of a name folded,
 * so "blk.7.attn_q.weight" counts with every layer's), and the device's used bytes (every process,
 * the CUDA runtime and libraries included: cudaMemGetInfo) when that peak was reached. It explains
 * a peak read from nvidia-smi against the memory plan (`ckv inspect --backend cuda`) without a
 * profiler. It allocates host memory only while the backend allocates device memory (never in a
 * decode step), and changes no result. The page-locked staging ring is host memory: not counted. */
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

extern "C" {
#include "core/alloc.h"
}

namespace CKV_CUDA_NS {

enum { LEDGER_NAMES = 48, LEDGER_NAME_LEN = 40, LEDGER_TOP = 12 };

struct ledger_entry {
    void *ptr;   /* NULL: a free slot */
    size_t bytes;
    int name;    /* index into names */
};

struct mem_ledger {
    ledger_entry *e;                           /* [cap] live buffers (free slots reused) */
    int n, cap;                                /* slots in use (live or freed) */
    size_t live, peak, used_at_peak;           /* bytes */
    int n_names;
    char names[LEDGER_NAMES][LEDGER_NAME_LEN]; /* folded names; the last one collects the rest */
    size_t by_name[LEDGER_NAMES];              /* live bytes per name */
    size_t by_name_at_peak[LEDGER_NAMES];
};

/* `what` with every run of digits replaced by one '#', cut to fit. */
static void fold_name(char *dst, const char *what) {
    int j = 0;
    for (const char *p = what ? what : "(unnamed)"; *p && j < LEDGER_NAME_LEN - 1; p++) {
        if (*p >= '0' && *p <= '9') {
            if (j == 0 || dst[j - 1] != '#') dst[j++] = '#';
        } else {
            dst[j++] = *p;
        }
    }
    dst[j] = '\0';
}

static int name_index(mem_ledger *l, const char *what) {
    char f[LEDGER_NAME_LEN];
    fold_name(f, what);
    for (int i = 0; i < l->n_names; i++)
        if (!strcmp(l->names[i], f)) return i;
    if (l->n_names < LEDGER_NAMES - 1) {
        memcpy(l->names[l->n_names], f, sizeof f);
        return l->n_names++;
    }
    snprintf(l->names[LEDGER_NAMES - 1], LEDGER_NAME_LEN, "(other names)");
    l->n_names = LEDGER_NAMES;
    return LEDGER_NAMES - 1;
}

ckv_status ledger_add(ctx *c, void *ptr, size_t bytes, const char *what) {
    if (!ptr || !bytes) return CKV_STATUS_OK;
    if (!c->ledger) {
        void *mem = NULL;
        CKV_TRY(ckv_alloc(&mem, sizeof(mem_ledger), "the cuda memory ledger"));
        c->ledger = (mem_ledger *)mem;
    }
    mem_ledger *l = c->ledger;
    int slot = -1;
    for (int i = 0; i < l->n && slot < 0; i++)
        if (!l->e[i].ptr) slot = i;
    if (slot < 0) {
        if (l->n == l->cap) {
            const int cap = l->cap ? 2 * l->cap : 256;
            void *mem = NULL;
            CKV_TRY(ckv_alloc(&mem, (size_t)cap * sizeof(ledger_entry), "the cuda memory ledger's entries"));
            if (l->n) memcpy(mem, l->e, (size_t)l->n * sizeof(ledger_entry));
            ckv_free(l->e);
            l->e = (ledger_entry *)mem;
            l->cap = cap;
        }
        slot = l->n++;
    }
    const int name = name_index(l, what);
    l->e[slot].ptr = ptr;
    l->e[slot].bytes = bytes;
    l->e[slot].name = name;
    l->live += bytes;
    l->by_name[name] += bytes;
    if (l->live > l->peak) {
        l->peak = l->live;
        memcpy(l->by_name_at_peak, l->by_name, sizeof l->by_name);
        size_t free_b = 0, total_b = 0;
        l->used_at_peak = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess ? total_b - free_b : 0;
        (void)cudaGetLastError();
    }
    return CKV_STATUS_OK;
}

void ledger_sub(ctx *c, void *ptr) {
    mem_ledger *l = c ? c->ledger : NULL;
    if (!l || !ptr) return;
    for (int i = l->n - 1; i >= 0; i--)
        if (l->e[i].ptr == ptr) {
            l->live -= l->e[i].bytes;
            l->by_name[l->e[i].name] -= l->e[i].bytes;
            l->e[i].ptr = NULL;
            while (l->n > 0 && !l->e[l->n - 1].ptr) l->n--;
            return;
        }
}

void ledger_usage(ctx *c, ckv_backend_mem *out) {
    const mem_ledger *l = c->ledger;
    out->live_bytes = l ? l->live : 0;
    out->peak_bytes = l ? l->peak : 0;
    out->device_used_at_peak_bytes = l ? l->used_at_peak : 0;
    out->sms = c->sms;
    out->cc_major = c->cc_major;
}

static void mib(char *b, size_t n, size_t bytes) { snprintf(b, n, "%.1f MiB", (double)bytes / (1 << 20)); }

void ledger_print(ctx *c) {
    const mem_ledger *l = c->ledger;
    if (!l) return;
    char a[32], b[32];
    mib(a, sizeof a, l->peak);
    mib(b, sizeof b, l->used_at_peak);
    fprintf(stderr, "ckv: %s device memory: peak %s in this backend's buffers and workspaces (the device's used "
            "memory then, every process and the CUDA runtime included: %s); largest parts at the peak:\n",
            CKV_CUDA_BACKEND_NAME, a, b);
    int done[LEDGER_NAMES] = {0};
    for (int k = 0; k < LEDGER_TOP && k < l->n_names; k++) {
        int best = -1;
        for (int i = 0; i < l->n_names; i++)
            if (!done[i] && (best < 0 || l->by_name_at_peak[i] > l->by_name_at_peak[best])) best = i;
        if (best < 0 || !l->by_name_at_peak[best]) break;
        done[best] = 1;
        mib(a, sizeof a, l->by_name_at_peak[best]);
        fprintf(stderr, "  %12s  %s\n", a, l->names[best]);
    }
}

void ledger_free(ctx *c) {
    if (!c || !c->ledger) return;
    ckv_free(c->ledger->e);
    ckv_free(c->ledger);
    c->ledger = NULL;
}

} // namespace CKV_CUDA_NS
