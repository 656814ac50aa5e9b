/* srv_store.c - the compressed-context store (see srv_store.h): snapshots of KV rows in host memory
 * with LRU eviction, restore into fresh sessions, and the cache-file directory (engine cache files
 * holding the context's last logits, plus a sidecar "<key>.ctx": model, press, ids digest, the cache
 * file's checksum, context ids, entry counts, its own checksum; ".rankN" appended to both in a
 * tensor-parallel group). The
 * directory is not trusted: files are read only when regular and not links, every record is verified
 * before use, and a damaged or planted pair is replaced by the next prefill. In a group every rank keeps its own store of its heads' rows;
 * a lookup is a hit only when it hits on every rank. */
#define _POSIX_C_SOURCE 200809L
#include "server/srv_store.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/atomic_file.h"
#include "core/log.h"
#include "engine/cache_io.h"
#include "kv/kv_file.h"

#define SIDECAR_MAGIC "CKVCTX3\n" /* 3: the logits moved into the cache file */

struct ckv_srv_entry {
    ckv_srv_entry *prev, *next;
    char spec[512];
    int32_t *ids;           /* [n] the context */
    int n;
    int next_pos;           /* the position after the context (n; n_kept after re-rotated keys) */
    int32_t *lens;          /* [n_layers, n_kv] rows per head */
    float *k, *v;           /* [rows, d] keys (post-RoPE) and values, heads of a layer one after another */
    int32_t *pos;           /* [rows] original positions */
    float *logits;          /* [V] the context's last logits */
    long kept_entries, total_entries;
    size_t kv_bytes_full, kv_bytes_kept;
    int compressed;
    ckv_dtype kv_dtype;     /* of the session it came from (restored sessions use the same) */
    size_t bytes;
};

static void entry_free(ckv_srv_entry *e) {
    if (!e) return;
    free(e->ids);
    free(e->lens);
    free(e->k);
    free(e->v);
    free(e->pos);
    free(e->logits);
    free(e);
}

ckv_status ckv_srv_store_check_dir(const char *dir) {
    struct stat sb;
    if (strlen(dir) + 64 >= sizeof ((ckv_srv_store *)0)->dir) return ckv_error(CKV_STATUS_ERR_ARG, "--cache-dir: path too long");
    if (stat(dir, &sb) != 0) return ckv_error(CKV_STATUS_ERR_IO, "--cache-dir %s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return ckv_error(CKV_STATUS_ERR_ARG, "--cache-dir %s: not a directory", dir);
    if (access(dir, W_OK | X_OK) != 0) return ckv_error(CKV_STATUS_ERR_IO, "--cache-dir %s: not writable: %s", dir, strerror(errno));
    return CKV_STATUS_OK;
}

ckv_status ckv_srv_store_init(ckv_srv_store *s, ckv_engine *e, size_t limit, const char *dir) {
    memset(s, 0, sizeof *s);
    s->engine = e;
    s->limit = limit;
    if (dir) {
        CKV_TRY(ckv_srv_store_check_dir(dir));
        snprintf(s->dir, sizeof s->dir, "%s", dir);
    }
    return ckv_model_fingerprint(e->model, s->fingerprint);
}

void ckv_srv_store_free(ckv_srv_store *s) {
    if (!s) return;
    for (ckv_srv_entry *e = s->head, *n; e; e = n) {
        n = e->next;
        entry_free(e);
    }
    memset(s, 0, sizeof *s);
}

static void lru_unlink(ckv_srv_store *s, ckv_srv_entry *e) {
    if (e->prev) e->prev->next = e->next;
    else s->head = e->next;
    if (e->next) e->next->prev = e->prev;
    else s->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push_front(ckv_srv_store *s, ckv_srv_entry *e) {
    e->prev = NULL;
    e->next = s->head;
    if (s->head) s->head->prev = e;
    s->head = e;
    if (!s->tail) s->tail = e;
}

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* The file name of a context: 128 bits of hash over fingerprint, press and ids. */
static void key_name(const ckv_srv_store *s, const char *spec, const int32_t *ids, int n, char out[40]) {
    uint64_t h[2] = {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull};
    for (int i = 0; i < 2; i++) {
        h[i] = fnv(h[i], s->fingerprint, strlen(s->fingerprint));
        h[i] = fnv(h[i], "|", 1);
        h[i] = fnv(h[i], spec, strlen(spec));
        h[i] = fnv(h[i], "|", 1);
        h[i] = fnv(h[i], ids, sizeof(int32_t) * (size_t)n);
    }
    snprintf(out, 40, "%016llx%016llx", (unsigned long long)h[0], (unsigned long long)h[1]);
}

static ckv_srv_entry *find(ckv_srv_store *s, const char *spec, const int32_t *ids, int n) {
    for (ckv_srv_entry *e = s->head; e; e = e->next)
        if (e->n == n && !strcmp(e->spec, spec) && !memcmp(e->ids, ids, sizeof(int32_t) * (size_t)n)) return e;
    return NULL;
}

/* A prepared context whose rows come from a snapshot. */
static ckv_status restore(ckv_srv_store *s, const ckv_srv_entry *en, int reserve, int chunk, ckv_prepared *pc) {
    ckv_engine *e = s->engine;
    ckv_model *m = e->model;
    const ckv_model_config *c = &m->cfg;
    int nl = c->n_layers, nkv = m->plan.n_kv_local, d = c->head_dim;
    memset(pc, 0, sizeof *pc);
    pc->engine = e;
    if ((long)en->n + reserve > c->max_context)
        return ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG, "a context of %d tokens + %d for the question and answer exceed the "
                         "context window of %d tokens", en->n, reserve, c->max_context);
    ckv_status st = ckv_session_init_kv(&pc->sess, m, en->n + reserve, chunk, 1, en->kv_dtype);
    int32_t *rows = NULL;
    size_t off = 0;
    for (int l = 0; l < nl && st == CKV_STATUS_OK; l++) {
        const int32_t *lens = en->lens + (size_t)l * nkv;
        int maxlen = 1;
        for (int h = 0; h < nkv; h++) maxlen = lens[h] > maxlen ? lens[h] : maxlen;
        st = ckv_kv_layer_reserve(&pc->sess.kv, l, maxlen);
        for (int h = 0; h < nkv && st == CKV_STATUS_OK; h++) {
            st = ckv_kv_head_write(&pc->sess.kv, l, h, en->k + off * d, en->v + off * d, en->pos + off, lens[h]);
            off += (size_t)lens[h];
        }
        if (st == CKV_STATUS_OK && !rows) { // [nkv, n] row lists 0, 1, 2, ... for every head
            st = ckv_alloc((void **)&rows, sizeof(int32_t) * (size_t)en->n * nkv, "restore rows");
            for (size_t i = 0; st == CKV_STATUS_OK && i < (size_t)en->n * nkv; i++) rows[i] = (int32_t)(i % (size_t)en->n);
        }
        /* every head keeps all its rows, plus room for the question and answer */
        if (st == CKV_STATUS_OK) st = ckv_kv_layer_compact(&pc->sess.kv, l, rows, en->n, lens, reserve);
    }
    ckv_free(rows);
    if (st == CKV_STATUS_OK) st = ckv_alloc((void **)&pc->logits, sizeof(float) * (size_t)c->vocab_size, "context logits");
    if (st == CKV_STATUS_OK) {
        memcpy(pc->logits, en->logits, sizeof(float) * (size_t)c->vocab_size);
        pc->sess.n_past = en->next_pos;
        pc->n_context = en->n;
        pc->compressed = en->compressed;
        st = ckv_session_mark(&pc->sess);
    }
    if (st != CKV_STATUS_OK) {
        ckv_prepared_free(pc);
        return st;
    }
    ckv_request_stats *rs = &pc->stats;
    rs->context_tokens = rs->reused_tokens = en->n;
    rs->compressed = en->compressed;
    rs->kept_entries = en->kept_entries;
    rs->total_entries = en->total_entries;
    rs->kv_bytes_full = en->kv_bytes_full;
    rs->kv_bytes_kept = en->kv_bytes_kept;
    rs->chunk = pc->sess.chunk;
    rs->session_bytes = ckv_session_bytes(&pc->sess);
    rs->kv_bytes_peak = ckv_kv_cache_bytes_used(&pc->sess.kv);
    return CKV_STATUS_OK;
}

static void evict_until(ckv_srv_store *s, size_t need) {
    while (s->tail && s->bytes + need > s->limit) {
        ckv_srv_entry *e = s->tail;
        lru_unlink(s, e);
        s->bytes -= e->bytes;
        s->n_entries--;
        entry_free(e);
    }
}

/* Snapshot of a prepared context's rows (host copies). */
static ckv_status snapshot(ckv_srv_store *s, const char *spec, const int32_t *ids, int n, const ckv_prepared *pc,
                           const float *logits, ckv_srv_entry **out) {
    ckv_model *m = s->engine->model;
    const ckv_model_config *c = &m->cfg;
    int nl = c->n_layers, nkv = m->plan.n_kv_local, d = c->head_dim;
    *out = NULL;
    ckv_srv_entry *e = calloc(1, sizeof *e);
    if (!e) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for a context snapshot");
    snprintf(e->spec, sizeof e->spec, "%s", spec);
    e->n = n;
    e->next_pos = pc->sess.n_past;
    e->ids = ids ? malloc(sizeof(int32_t) * (size_t)n) : NULL; /* NULL: a copy outside the store (no key) */
    e->lens = malloc(sizeof(int32_t) * (size_t)nl * nkv);
    e->logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    if ((ids && !e->ids) || !e->lens || !e->logits) {
        entry_free(e);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for a context snapshot");
    }
    if (ids) memcpy(e->ids, ids, sizeof(int32_t) * (size_t)n);
    memcpy(e->logits, logits, sizeof(float) * (size_t)c->vocab_size);
    ckv_kv_cache_lengths(&pc->sess.kv, e->lens);
    size_t rows = 0;
    for (int i = 0; i < nl * nkv; i++) rows += (size_t)e->lens[i];
    e->k = malloc(sizeof(float) * rows * d + 1);
    e->v = malloc(sizeof(float) * rows * d + 1);
    e->pos = malloc(sizeof(int32_t) * rows + 1);
    if (!e->k || !e->v || !e->pos) {
        entry_free(e);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for a context snapshot of %zu rows", rows);
    }
    ckv_status st = CKV_STATUS_OK;
    size_t off = 0;
    for (int l = 0; l < nl && st == CKV_STATUS_OK; l++)
        for (int h = 0; h < nkv && st == CKV_STATUS_OK; h++) {
            st = ckv_kv_head_read(&pc->sess.kv, l, h, e->k + off * d, e->v + off * d, e->pos + off);
            off += (size_t)e->lens[(size_t)l * nkv + h];
        }
    if (st != CKV_STATUS_OK) {
        entry_free(e);
        return st;
    }
    e->compressed = pc->stats.compressed;
    e->kv_dtype = pc->sess.kv.dtype;
    e->kept_entries = (long)rows;
    e->total_entries = pc->stats.total_entries ? pc->stats.total_entries : (long)rows;
    e->kv_bytes_kept = pc->stats.kv_bytes_kept;
    e->kv_bytes_full = pc->stats.kv_bytes_full;
    e->bytes = sizeof *e + rows * (2 * sizeof(float) * d + sizeof(int32_t)) + sizeof(int32_t) * (size_t)n +
               sizeof(float) * (size_t)c->vocab_size;
    *out = e;
    return CKV_STATUS_OK;
}

static void insert(ckv_srv_store *s, ckv_srv_entry *e) {
    if (e->bytes > s->limit) {
        entry_free(e);
        return;
    }
    evict_until(s, e->bytes);
    lru_push_front(s, e);
    s->bytes += e->bytes;
    s->n_entries++;
}

/* ---- cache files ----------------------------------------------------------------------------------- */

/* The sidecar "<key>.ctx" (little-endian): SIDECAR_MAGIC | sidecar_head | press spec [spec_len] |
 * ids [n] | u64 FNV-1a of every byte before it. The head names the model (fingerprint), the press
 * (its spec follows), a digest of the context ids and the checksum of the cache file written with it
 * (which holds the context's last logits, cache_io.h): a sidecar is used only when all of them match
 * the request, the ids compare equal, the checksum is right and the counts make sense, and the cache
 * file's own checksum is the one recorded (a cache file copied, linked or edited in from another
 * context is refused); the cache file's loader checks the logits are there and finite. */
typedef struct {
    int32_t n, vocab, compressed, spec_len;
    int64_t kept_entries, total_entries, kv_bytes_full, kv_bytes_kept;
    char fingerprint[16];
    uint64_t ids_digest, cache_checksum;
} sidecar_head;

static uint64_t ids_digest(const int32_t *ids, int n) { return fnv(0xcbf29ce484222325ull, ids, sizeof(int32_t) * (size_t)n); }

static ckv_status write_sidecar(const ckv_srv_store *s, const char *path, const char *cache, const char *spec, const int32_t *ids,
                                int n, int vocab, const ckv_prepared *pc) {
    sidecar_head h;
    memset(&h, 0, sizeof h);
    h.n = n;
    h.vocab = vocab;
    h.compressed = pc->stats.compressed;
    h.spec_len = (int32_t)strlen(spec);
    h.kept_entries = pc->stats.kept_entries;
    h.total_entries = pc->stats.total_entries;
    h.kv_bytes_full = (int64_t)pc->stats.kv_bytes_full;
    h.kv_bytes_kept = (int64_t)pc->stats.kv_bytes_kept;
    memcpy(h.fingerprint, s->fingerprint, sizeof h.fingerprint);
    h.ids_digest = ids_digest(ids, n);
    CKV_TRY(ckv_kv_file_checksum(cache, &h.cache_checksum));
    uint64_t sum = 0xcbf29ce484222325ull;
    sum = fnv(sum, SIDECAR_MAGIC, 8);
    sum = fnv(sum, &h, sizeof h);
    sum = fnv(sum, spec, (size_t)h.spec_len);
    sum = fnv(sum, ids, sizeof(int32_t) * (size_t)n);
    ckv_atomic_file af; /* a temporary created exclusively beside the target, then renamed */
    CKV_TRY(ckv_atomic_file_open(&af, path, "context store"));
    int ok = fwrite(SIDECAR_MAGIC, 1, 8, af.f) == 8 && fwrite(&h, sizeof h, 1, af.f) == 1 &&
             fwrite(spec, 1, (size_t)h.spec_len, af.f) == (size_t)h.spec_len &&
             fwrite(ids, sizeof(int32_t), (size_t)n, af.f) == (size_t)n && fwrite(&sum, 8, 1, af.f) == 1;
    if (!ok) {
        ckv_atomic_file_abort(&af);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: cannot write the context sidecar", path);
    }
    return ckv_atomic_file_commit(&af);
}

/* Opens path only if it is a regular file that is not a symbolic link (non-blocking first: a FIFO in
 * its place does not hang the engine thread); NULL otherwise, with a warning unless it is missing. */
static FILE *open_store_file(const char *path) {
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT) CKV_LOG_WARN("context store: skipping %s: %s", path, errno == ELOOP ? "a symbolic link" : strerror(errno));
        return NULL;
    }
    struct stat sb;
    int fl = -1;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || (fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        CKV_LOG_WARN("context store: skipping %s: not a regular file", path);
        close(fd);
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) close(fd);
    return f;
}

/* Reads and verifies a sidecar (see sidecar_head); *match = 0 when it is missing, belongs to other ids
 * or another model or press, or is damaged (then with a warning: the next prefill replaces it). */
static ckv_status read_sidecar(const ckv_srv_store *s, const char *path, const char *spec, const int32_t *ids, int n, int vocab,
                               sidecar_head *h, int *match) {
    *match = 0;
    FILE *f = open_store_file(path);
    if (!f) return CKV_STATUS_OK;
    char magic[8], sp[sizeof ((ckv_srv_entry *)0)->spec];
    uint64_t sum = 0xcbf29ce484222325ull, want = 0;
    const char *bad = NULL;
    int same = 0;
    if (fread(magic, 1, 8, f) != 8 || memcmp(magic, SIDECAR_MAGIC, 8) != 0 || fread(h, sizeof *h, 1, f) != 1) bad = "not a sidecar of this version";
    else if (memcmp(h->fingerprint, s->fingerprint, sizeof h->fingerprint) != 0) bad = "made with another model";
    else if (h->n != n || h->vocab != vocab || h->spec_len != (int32_t)strlen(spec) || h->ids_digest != ids_digest(ids, n))
        same = 0; /* another context under the same name (a hash collision): not damage */
    else if ((size_t)h->spec_len >= sizeof sp || fread(sp, 1, (size_t)h->spec_len, f) != (size_t)h->spec_len || memcmp(sp, spec, (size_t)h->spec_len) != 0) same = 0;
    else same = 1;
    if (!bad && same) {
        sum = fnv(sum, magic, 8);
        sum = fnv(sum, h, sizeof *h);
        sum = fnv(sum, spec, (size_t)h->spec_len);
        int32_t buf[1024];
        for (int i = 0; same && i < n; i += 1024) {
            int k = n - i < 1024 ? n - i : 1024;
            same = fread(buf, sizeof(int32_t), (size_t)k, f) == (size_t)k && !memcmp(buf, ids + i, sizeof(int32_t) * (size_t)k);
            sum = fnv(sum, buf, sizeof(int32_t) * (size_t)k);
        }
        if (same && fread(&want, 8, 1, f) != 1) bad = "truncated";
        if (same && !bad) {
            if (sum != want || fgetc(f) != EOF) bad = "checksum mismatch (the file is corrupted)";
            else if (h->kept_entries < 0 || h->total_entries < h->kept_entries || h->kv_bytes_kept < 0 ||
                     h->kv_bytes_full < h->kv_bytes_kept || (h->compressed != 0 && h->compressed != 1))
                bad = "impossible entry counts";
        }
    }
    fclose(f);
    if (bad) CKV_LOG_WARN("context store: ignoring %s (%s); the next prefill of its context replaces it", path, bad);
    *match = !bad && same;
    return CKV_STATUS_OK;
}

/* "<dir>/<key>.ctx", with the rank appended in a tensor-parallel group (as its cache file has): on a
 * shared directory every rank writes and checks its own. */
static void sidecar_path(const ckv_srv_store *s, const char *name, char *out, size_t cap) {
    const ckv_comm *tp = s->engine->tp;
    if (tp && tp->size > 1) snprintf(out, cap, "%s/%s.ctx.rank%d", s->dir, name, tp->rank);
    else snprintf(out, cap, "%s/%s.ctx", s->dir, name);
}

/* The file the engine writes for cache path `cache` on this rank (cache_io.h: ".rank<r>" in a group). */
static void rank_file(const ckv_srv_store *s, const char *cache, char *out, size_t cap) {
    const ckv_comm *tp = s->engine->tp;
    if (tp && tp->size > 1) snprintf(out, cap, "%s.rank%d", cache, tp->rank);
    else snprintf(out, cap, "%s", cache);
}

static ckv_status disk_get(ckv_srv_store *s, const char *spec, const int32_t *ids, int n, int reserve, ckv_prepared *pc,
                           int *hit) {
    *hit = 0;
    ckv_engine *e = s->engine;
    int V = e->model->cfg.vocab_size;
    char name[40], side[2200], cache[2200];
    key_name(s, spec, ids, n, name);
    sidecar_path(s, name, side, sizeof side);
    snprintf(cache, sizeof cache, "%s/%s.ckv", s->dir, name);
    sidecar_head h;
    int match = 0;
    ckv_status st = read_sidecar(s, side, spec, ids, n, V, &h, &match);
    if (st != CKV_STATUS_OK || !match) return st;
    /* the cache file must be the one the sidecar recorded: a regular file, not a link, with the
     * recorded checksum (the loader then checks the content against that checksum) before and after */
    char file[2300];
    rank_file(s, cache, file, sizeof file);
    FILE *cf = open_store_file(file);
    uint64_t sum0 = 0, sum1 = 0;
    if (cf) fclose(cf);
    if (!cf || ckv_kv_file_checksum(file, &sum0) != CKV_STATUS_OK || sum0 != h.cache_checksum) {
        if (cf) CKV_LOG_WARN("context store: %s is not the cache file its sidecar recorded; prefilling instead", file);
        ckv_error_clear();
        return CKV_STATUS_OK;
    }
    ckv_prepare_params pp = {0};
    pp.cache_in = cache;
    pp.reserve = reserve;
    st = ckv_engine_prepare(e, &pp, pc);
    if (st == CKV_STATUS_OK && (ckv_kv_file_checksum(file, &sum1) != CKV_STATUS_OK || sum1 != h.cache_checksum)) {
        ckv_prepared_free(pc);
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: replaced while it was read", file);
    }
    if (st == CKV_STATUS_OK && !pc->logits) {
        ckv_prepared_free(pc);
        st = ckv_error(CKV_STATUS_ERR_FORMAT, "%s: holds no logits", file);
    }
    if (st != CKV_STATUS_OK) { /* a damaged or foreign file: prefill instead */
        CKV_LOG_WARN("context store: %s is not usable, prefilling instead: %s", cache, ckv_error_message());
        ckv_error_clear();
        unlink(side); /* its trailer may still match the record: without the sidecar the prefill's put rewrites the pair */
        return CKV_STATUS_OK;
    }
    pc->compressed = h.compressed;
    pc->stats.compressed = h.compressed;
    pc->stats.kept_entries = (long)h.kept_entries;
    pc->stats.total_entries = (long)h.total_entries;
    pc->stats.kv_bytes_full = (size_t)h.kv_bytes_full;
    pc->stats.kv_bytes_kept = (size_t)h.kv_bytes_kept;
    *hit = 1;
    return CKV_STATUS_OK;
}

/* ---- public ------------------------------------------------------------------------------------------ */

/* 1 when flag is set on every rank of the engine's tensor-parallel group (the ranks' stores may
 * differ, e.g. a cache file missing on one node: then none of them uses its copy). */
static int on_every_rank(const ckv_srv_store *s, int flag) {
    ckv_comm *tp = s->engine->tp;
    if (!tp || tp->size < 2) return flag;
    int all = flag != 0;
    if (tp->ops->allreduce_i32(tp, &all, 1, CKV_COMM_OP_MIN) != CKV_STATUS_OK) {
        ckv_error_clear();
        return 0;
    }
    return all;
}

ckv_status ckv_srv_store_get(ckv_srv_store *s, const char *spec, const int32_t *ids, int n, int reserve, int chunk,
                             ckv_prepared *pc, ckv_srv_lookup *res) {
    memset(res, 0, sizeof *res);
    ckv_srv_entry *e = s->limit ? find(s, spec, ids, n) : NULL;
    if (on_every_rank(s, e != NULL)) {
        lru_unlink(s, e);
        lru_push_front(s, e);
        CKV_TRY(restore(s, e, reserve, chunk, pc));
        res->hit = 1;
        return CKV_STATUS_OK;
    }
    if (!s->dir[0]) return CKV_STATUS_OK;
    int hit = 0;
    ckv_status st = disk_get(s, spec, ids, n, reserve, pc, &hit);
    if (!on_every_rank(s, st == CKV_STATUS_OK && hit)) { /* prefill on every rank */
        if (hit) ckv_prepared_free(pc);
        return st;
    }
    res->hit = res->from_disk = 1;
    if (s->limit) { /* keep it in memory for the next request */
        ckv_srv_entry *ne = NULL;
        if (snapshot(s, spec, ids, n, pc, pc->logits, &ne) == CKV_STATUS_OK) insert(s, ne);
        ckv_error_clear();
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_srv_store_put(ckv_srv_store *s, const char *spec, const int32_t *ids, int n, const ckv_prepared *pc) {
    if (!pc->logits) return CKV_STATUS_OK;
    if (s->limit && !find(s, spec, ids, n)) {
        ckv_srv_entry *e = NULL;
        CKV_TRY(snapshot(s, spec, ids, n, pc, pc->logits, &e));
        insert(s, e);
    }
    if (s->dir[0]) {
        char name[40], side[2200], cache[2200];
        key_name(s, spec, ids, n, name);
        sidecar_path(s, name, side, sizeof side);
        snprintf(cache, sizeof cache, "%s/%s.ckv", s->dir, name);
        /* written unless a valid pair is there already (a damaged, foreign or planted one is replaced:
         * the temporaries are created exclusively and renamed over it) */
        int V = s->engine->model->cfg.vocab_size, match = 0;
        sidecar_head h;
        ckv_status st = read_sidecar(s, side, spec, ids, n, V, &h, &match);
        uint64_t sum = 0;
        char file[2300];
        rank_file(s, cache, file, sizeof file);
        if (st == CKV_STATUS_OK && match && (ckv_kv_file_checksum(file, &sum) != CKV_STATUS_OK || sum != h.cache_checksum)) match = 0;
        ckv_error_clear();
        if (st == CKV_STATUS_OK && !match) {
            unlink(side); /* no sidecar while its cache file is rewritten: nothing pairs a new file with an old record */
            unlink(file); /* a link or a foreign file in its place is replaced, never written through */
            st = ckv_session_save_cache((ckv_session *)&pc->sess, cache, spec, pc->logits, pc->question_inside);
            if (st == CKV_STATUS_OK) st = write_sidecar(s, side, file, spec, ids, n, V, pc);
        }
        CKV_TRY(st);
    }
    return CKV_STATUS_OK;
}

ckv_status ckv_srv_store_copy(ckv_srv_store *s, const ckv_prepared *pc, ckv_srv_entry **out) {
    *out = NULL;
    if (!pc->ready || !pc->logits) return ckv_error(CKV_STATUS_ERR_ARG, "a context copy needs a ready context with its logits");
    return snapshot(s, "", NULL, pc->n_context, pc, pc->logits, out);
}

ckv_status ckv_srv_store_restore(ckv_srv_store *s, const ckv_srv_entry *copy, int reserve, int chunk, ckv_prepared *pc) {
    CKV_TRY(restore(s, copy, reserve, chunk, pc));
    pc->ready = 1;
    return CKV_STATUS_OK;
}

void ckv_srv_entry_free(ckv_srv_entry *e) { entry_free(e); }
