/* srv_store.c - the compressed-context store (see srv_store.h): snapshots of KV rows in host memory
 * with LRU eviction, restore into fresh sessions, and the cache-file directory (engine cache files
 * plus a sidecar "<key>.ctx": magic, context ids, last logits, entry counts; ".rankN" appended to
 * both in a tensor-parallel group). In a group every rank keeps its own store of its heads' rows;
 * a lookup is a hit only when it hits on every rank. */
#define _POSIX_C_SOURCE 200809L
#include "server/srv_store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"
#include "engine/cache_io.h"

#define SIDECAR_MAGIC "CKVCTX1\n"

struct ckv_srv_entry {
    ckv_srv_entry *prev, *next;
    char spec[512];
    int32_t *ids;           /* [n] the context */
    int n;
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
        pc->sess.n_past = en->n;
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
    e->ids = malloc(sizeof(int32_t) * (size_t)n);
    e->lens = malloc(sizeof(int32_t) * (size_t)nl * nkv);
    e->logits = malloc(sizeof(float) * (size_t)c->vocab_size);
    if (!e->ids || !e->lens || !e->logits) {
        entry_free(e);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for a context snapshot");
    }
    memcpy(e->ids, ids, sizeof(int32_t) * (size_t)n);
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

typedef struct {
    int32_t n, vocab, compressed, pad;
    int64_t kept_entries, total_entries, kv_bytes_full, kv_bytes_kept;
} sidecar_head;

static ckv_status write_sidecar(const char *path, const int32_t *ids, int n, const float *logits, int vocab,
                                const ckv_prepared *pc) {
    char tmp[2200];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) return ckv_error(CKV_STATUS_ERR_IO, "%s: %s", tmp, strerror(errno));
    sidecar_head h = {n, vocab, pc->stats.compressed, 0, pc->stats.kept_entries, pc->stats.total_entries,
                      (int64_t)pc->stats.kv_bytes_full, (int64_t)pc->stats.kv_bytes_kept};
    int ok = fwrite(SIDECAR_MAGIC, 1, 8, f) == 8 && fwrite(&h, sizeof h, 1, f) == 1 &&
             fwrite(ids, sizeof(int32_t), (size_t)n, f) == (size_t)n && fwrite(logits, sizeof(float), (size_t)vocab, f) == (size_t)vocab;
    if (fclose(f) != 0) ok = 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return ckv_error(CKV_STATUS_ERR_IO, "%s: cannot write the context sidecar", path);
    }
    return CKV_STATUS_OK;
}

/* Reads a sidecar; *match = 0 when it belongs to other ids (a hash collision) or does not exist. */
static ckv_status read_sidecar(const char *path, const int32_t *ids, int n, int vocab, float *logits, sidecar_head *h,
                               int *match) {
    *match = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return CKV_STATUS_OK;
    char magic[8];
    int ok = fread(magic, 1, 8, f) == 8 && !memcmp(magic, SIDECAR_MAGIC, 8) && fread(h, sizeof *h, 1, f) == 1 &&
             h->n == n && h->vocab == vocab;
    int32_t buf[1024];
    for (int i = 0; ok && i < n; i += 1024) {
        int k = n - i < 1024 ? n - i : 1024;
        ok = fread(buf, sizeof(int32_t), (size_t)k, f) == (size_t)k && !memcmp(buf, ids + i, sizeof(int32_t) * (size_t)k);
    }
    ok = ok && fread(logits, sizeof(float), (size_t)vocab, f) == (size_t)vocab;
    fclose(f);
    *match = ok;
    return CKV_STATUS_OK;
}

/* "<dir>/<key>.ctx", with the rank appended in a tensor-parallel group (as its cache file has): on a
 * shared directory every rank writes and checks its own. */
static void sidecar_path(const ckv_srv_store *s, const char *name, char *out, size_t cap) {
    const ckv_comm *tp = s->engine->tp;
    if (tp && tp->size > 1) snprintf(out, cap, "%s/%s.ctx.rank%d", s->dir, name, tp->rank);
    else snprintf(out, cap, "%s/%s.ctx", s->dir, name);
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
    float *logits = NULL;
    CKV_TRY(ckv_alloc((void **)&logits, sizeof(float) * (size_t)V, "context logits"));
    sidecar_head h;
    int match = 0;
    ckv_status st = read_sidecar(side, ids, n, V, logits, &h, &match);
    if (st != CKV_STATUS_OK || !match) {
        ckv_free(logits);
        return st;
    }
    ckv_prepare_params pp = {0};
    pp.cache_in = cache;
    pp.reserve = reserve;
    st = ckv_engine_prepare(e, &pp, pc);
    if (st != CKV_STATUS_OK) { /* a damaged or foreign file: prefill instead */
        CKV_LOG_WARN("context store: %s is not usable, prefilling instead: %s", cache, ckv_error_message());
        ckv_free(logits);
        ckv_error_clear();
        return CKV_STATUS_OK;
    }
    pc->logits = logits;
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
        if (access(side, F_OK) != 0) {
            CKV_TRY(ckv_session_save_cache((ckv_session *)&pc->sess, cache, spec));
            CKV_TRY(write_sidecar(side, ids, n, pc->logits, s->engine->model->cfg.vocab_size, pc));
        }
    }
    return CKV_STATUS_OK;
}
