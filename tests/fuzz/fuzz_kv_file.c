/* fuzz_kv_file.c - libFuzzer target for cache files (kv/kv_file.c): the first input byte is a mode
 * (bit 0: recompute the FNV-1a trailer so the input reaches the structural checks behind the
 * checksum; bit 1: load as an uncompressed cache), the rest is the file, loaded into a cache of
 * 2 layers x 2 KV heads x 4 dims with a 16-token context. The cache lives on a host-memory backend
 * defined here (the memory ops a cache file needs plus the CPU backend's kv_gather, which compaction
 * uses, on a CPU context without a thread pool), so the target links no compute kernels. Invariants besides "no crash, no sanitizer
 * report": a refusal carries a one-line printable message; what loads has at most 16 rows per head
 * at ascending positions inside the context. */
#include "fuzz_input.h" /* first: it sets _GNU_SOURCE */
#include "backend/backend.h"
#include "backend/cpu/cpu_backend.h"
#include "core/json.h"
#include "kv/kv_file.h"

enum { FZ_LAYERS = 2, FZ_KV = 2, FZ_DIM = 4, FZ_CTX = 16 };

static ckv_status host_alloc(ckv_backend *be, void **ptr, size_t bytes, const char *what) {
    (void)be;
    *ptr = calloc(1, bytes ? bytes : 1);
    return *ptr ? CKV_STATUS_OK : ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for %s", what);
}
static void host_release(ckv_backend *be, void *ptr) {
    (void)be;
    free(ptr);
}
static ckv_status host_copy(ckv_backend *be, void *dst, const void *src, size_t bytes) {
    (void)be;
    if (bytes) memcpy(dst, src, bytes);
    return CKV_STATUS_OK;
}

static ckv_status host_sync(ckv_backend *be) {
    (void)be;
    return CKV_STATUS_OK;
}
static int host_kv_dtype_ok(const ckv_backend *be, ckv_dtype t) {
    (void)be;
    return t == CKV_DTYPE_F32;
}

static const ckv_backend_ops host_ops = {.alloc = host_alloc,
                                         .alloc_raw = host_alloc,
                                         .release = host_release,
                                         .upload = host_copy,
                                         .download = host_copy,
                                         .copy = host_copy,
                                         .sync = host_sync,
                                         .kv_dtype_ok = host_kv_dtype_ok,
                                         .kv_gather = ckv_cpu_kv_gather};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static ckv_cpu_ctx cpu; /* the CPU backend's context kv_gather reads: no thread pool, so it runs on this thread */
    static ckv_backend host = {&host_ops, &cpu, "host", CKV_DEVICE_HOST, 1, CKV_DTYPE_F32, CKV_DTYPE_F32};
    ckv_backend *be = &host;
    if (size < 1) return 0;
    unsigned mode = data[0];
    size_t n = size - 1;
    uint8_t *file = malloc(n ? n : 1);
    if (!file) return 0;
    memcpy(file, data + 1, n);
    if ((mode & 1) && n >= 8) {
        uint64_t h = 0xcbf29ce484222325ull;
        for (size_t i = 0; i < n - 8; i++) h = (h ^ file[i]) * 0x100000001b3ull;
        memcpy(file + n - 8, &h, 8);
    }
    const char *path = ckv_fuzz_file(file, n);
    free(file);
    ckv_kv_cache c;
    char *meta = NULL;
    ckv_error_clear();
    if (ckv_kv_cache_init(&c, be, FZ_LAYERS, FZ_KV, FZ_DIM, CKV_DTYPE_F32) != CKV_STATUS_OK) abort();
    if (ckv_kv_cache_load(&c, path, 2, FZ_CTX, (mode >> 1) & 1, NULL, 0, &meta) != CKV_STATUS_OK) {
        ckv_fuzz_check_message();
    } else {
        for (int l = 0; l < FZ_LAYERS; l++)
            for (int h = 0; h < FZ_KV; h++) {
                const ckv_kv_layer *kl = &c.layers[l];
                if (kl->len[h] < 0 || kl->len[h] > FZ_CTX || kl->cap[h] != kl->len[h] + 2) abort();
                for (int i = 0; i < kl->len[h]; i++) {
                    int32_t p = kl->pos[kl->off[h] + i];
                    if (p < 0 || p >= FZ_CTX || (i && p <= kl->pos[kl->off[h] + i - 1])) abort();
                }
            }
        ckv_json *j = NULL;
        if (ckv_json_parse_buffer(&j, meta, strlen(meta), "cache header") == CKV_STATUS_OK) ckv_json_free(j);
    }
    free(meta);
    char *m2 = NULL;
    if (ckv_kv_file_read_meta(path, &m2) == CKV_STATUS_OK) free(m2);
    ckv_kv_cache_free(&c);
    return 0;
}
