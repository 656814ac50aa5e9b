/* request.c - the engine request API (see request.h): engine set-up, prepared contexts (prefill,
 * compression or the reason it is skipped, cache files), answers (sampling, stop ids and strings,
 * the token callback, rewind; which decode step they run: the recorded batch step of one session or
 * the session's own) and the whole-request driver. It prints nothing. */
#define _POSIX_C_SOURCE 200809L
#include "engine/request.h"

#include "engine/comm_backend.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/json.h"
#include "core/timer.h"
#include "engine/cache_io.h"
#include "kv/kv_file.h"
#include "model/config.h"
#include "model/source.h"

#define DEFAULT_CHUNK 512

/* ---- engine --------------------------------------------------------------------------------------- */

static void engine_default_stops(ckv_engine *e) {
    const ckv_model_config *c = &e->model->cfg;
    e->n_stop_ids = 0;
    for (int i = 0; i < c->n_eos && e->n_stop_ids < CKV_ENGINE_MAX_STOP_IDS; i++) e->stop_ids[e->n_stop_ids++] = c->eos_ids[i];
    if (e->cfg.tokenizer) {
        int32_t extra[CKV_ENGINE_MAX_STOP_IDS];
        int n = ckv_tokenizer_stop_ids(e->cfg.tokenizer, extra, CKV_ENGINE_MAX_STOP_IDS);
        for (int i = 0; i < n && e->n_stop_ids < CKV_ENGINE_MAX_STOP_IDS; i++) {
            int dup = 0;
            for (int j = 0; j < e->n_stop_ids; j++) dup |= e->stop_ids[j] == extra[i];
            if (!dup) e->stop_ids[e->n_stop_ids++] = extra[i];
        }
    }
}

/* The KV cache dtype the configuration asks for, the backend's when it leaves the choice open. */
static ckv_dtype engine_kv_dtype(const ckv_engine *e) {
    return e->cfg.kv_dtype == CKV_DTYPE_DEFAULT ? e->be->kv_dtype : e->cfg.kv_dtype;
}

ckv_status ckv_engine_init(ckv_engine *e, const ckv_engine_config *cfg, ckv_comm *tp) {
    memset(e, 0, sizeof *e);
    e->cfg = *cfg;
    e->tp = tp;
    e->owns = 1;
    if (!cfg->model_path) return ckv_error(CKV_STATUS_ERR_ARG, "--model is required");
    /* the caller chose the GPU (the cli: the node-local rank's); -1 is device 0 */
    ckv_backend_params bp = {cfg->backend, cfg->threads, cfg->device};
    ckv_status st = ckv_backend_init_params(&e->be, &bp);
    /* the model and the presses cross ranks only through a device communicator (engine/comm_backend.h),
     * which decides how device buffers move (directly where device memory is host memory) */
    if (st == CKV_STATUS_OK && tp && tp->size > 1)
        st = ckv_comm_init_backend(&e->tp_dev, tp, e->be, bp.device < 0 ? 0 : bp.device, 0);
    ckv_comm *mtp = e->tp_dev ? e->tp_dev : tp;
    /* auto: matrices the backend computes in their stored format stay so (GGUF blocks, F16, BF16 on
     * the cpu); an explicit dtype converts every matrix to it */
    ckv_model_opts mo = {.weights_dtype = cfg->weights_dtype,
                         .as_stored = cfg->weights_dtype == CKV_DTYPE_DEFAULT,
                         .random_weights = cfg->random_weights,
                         .random_seed = cfg->random_seed};
    if (st == CKV_STATUS_OK) st = ckv_model_load_opts(&e->model, cfg->model_path, e->be, mtp, &mo);
    if (st == CKV_STATUS_OK && e->cfg.kv_dtype != CKV_DTYPE_DEFAULT && !e->be->ops->kv_dtype_ok(e->be, engine_kv_dtype(e)))
        st = ckv_error(CKV_STATUS_ERR_UNSUPPORTED, "--kv-dtype %s: the %s backend cannot hold the KV cache in it",
                       ckv_dtype_name(engine_kv_dtype(e)), e->be->name);
    if (st != CKV_STATUS_OK) {
        ckv_engine_free(e);
        return st;
    }
    engine_default_stops(e);
    return CKV_STATUS_OK;
}

ckv_status ckv_engine_wrap(ckv_engine *e, ckv_model *m, int chunk, const ckv_tokenizer *tok) {
    memset(e, 0, sizeof *e);
    if (!m) return ckv_error(CKV_STATUS_ERR_ARG, "engine without a model");
    e->model = m;
    e->be = m->be;
    e->tp = m->tp;
    e->cfg.chunk = chunk;
    e->cfg.tokenizer = tok;
    e->cfg.device = -1;
    engine_default_stops(e);
    return CKV_STATUS_OK;
}

void ckv_engine_free(ckv_engine *e) {
    if (!e) return;
    if (e->owns) {
        ckv_model_free(e->model);
        ckv_comm_free(e->tp_dev);
        ckv_backend_free(e->be);
    }
    memset(e, 0, sizeof *e);
}

ckv_status ckv_engine_read_config(const char *path, ckv_model_config *cfg) {
    size_t n = strlen(path);
    if (n > 5 && !strcmp(path + n - 5, ".gguf")) {
        ckv_weight_source src;
        CKV_TRY(ckv_source_open(&src, cfg, path));
        ckv_source_close(&src);
        return CKV_STATUS_OK;
    }
    return ckv_config_load(cfg, path);
}

static int engine_chunk(const ckv_engine *e) { return e->cfg.chunk > 0 ? e->cfg.chunk : DEFAULT_CHUNK; }

/* ---- prepared contexts ---------------------------------------------------------------------------- */

/* The context length recorded in a cache file (PATH, or PATH.rank0 when saved by several ranks). */
static ckv_status cache_context_len(const char *path, int *n) {
    char shard0[4200];
    snprintf(shard0, sizeof shard0, "%s.rank0", path);
    int sharded = access(path, F_OK) != 0 && access(shard0, F_OK) == 0;
    char *meta = NULL;
    CKV_TRY(ckv_kv_file_read_meta(sharded ? shard0 : path, &meta));
    ckv_json *j = NULL;
    ckv_status st = ckv_json_parse_buffer(&j, meta, strlen(meta), path);
    double v = 0;
    if (st == CKV_STATUS_OK && ckv_json_is_number(ckv_json_get(j, "context_len"))) v = ckv_json_number(ckv_json_get(j, "context_len"));
    ckv_json_free(j);
    free(meta);
    CKV_TRY(st);
    if (!(v >= 1 && v <= (double)(1L << 30))) return ckv_error(CKV_STATUS_ERR_FORMAT, "%s: cache header has no context length", path);
    *n = (int)v;
    return CKV_STATUS_OK;
}

static void context_entries(ckv_prepared *pc, int L) {
    const ckv_model *m = pc->engine->model;
    long entries = (long)m->cfg.n_layers * m->plan.n_kv_local * L;
    size_t row = (size_t)m->cfg.head_dim * 2 * ckv_dtype_size(engine_kv_dtype(pc->engine));
    pc->stats.total_entries = pc->stats.kept_entries = entries;
    pc->stats.kv_bytes_full = pc->stats.kv_bytes_kept = (size_t)entries * row;
}

void ckv_prepared_fill_stats(ckv_prepared *pc, int prefilled) {
    ckv_request_stats *s = &pc->stats;
    s->context_tokens = pc->n_context;
    s->prompt_tokens = prefilled ? pc->n_context : 0;
    s->reused_tokens = prefilled ? 0 : pc->n_context;
    s->compressed = pc->compressed;
    s->uncompressed_reason = pc->uncompressed_reason;
    if (pc->compressed) {
        s->kept_entries = pc->cz.kept_entries;
        s->total_entries = pc->cz.total_entries;
        s->kv_bytes_full = pc->cz.kv_bytes_full;
        s->kv_bytes_kept = pc->cz.kv_bytes_kept;
    } else if (prefilled) {
        context_entries(pc, pc->n_context);
    }
    s->score_seconds = pc->cz.score_seconds;
    s->select_seconds = pc->cz.select_seconds;
    s->compact_seconds = pc->cz.compact_seconds;
    s->comm_bytes_compression = pc->cz.comm_bytes;
    s->chunk = pc->sess.chunk;
    s->session_bytes = ckv_session_bytes(&pc->sess);
    s->kv_bytes_peak = ckv_kv_cache_bytes_used(&pc->sess.kv);
}

ckv_status ckv_engine_prepare_begin(ckv_engine *e, const ckv_prepare_params *p, ckv_prepared *pc) {
    memset(pc, 0, sizeof *pc);
    pc->engine = e;
    ckv_model *m = e->model;
    const ckv_model_config *c = &m->cfg;
    int n = p->n;
    if (p->cache_in) CKV_TRY(cache_context_len(p->cache_in, &n));
    else if (n < 1 || !p->ids) return ckv_error(CKV_STATUS_ERR_ARG, "empty context");
    if (p->reserve < 0) return ckv_error(CKV_STATUS_ERR_ARG, "negative reserve %d", p->reserve);
    if (p->question_rows < 0 || (p->question_rows > 0 && (p->cache_in || p->question_rows >= n)))
        return ckv_error(CKV_STATUS_ERR_ARG, "a question of %d rows inside a context of %d%s", p->question_rows, n,
                         p->cache_in ? " loaded from a cache file (it records its own)" : ": expected fewer rows than the context");
    if ((long)n + p->reserve > c->max_context)
        return ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG,
                         "a context of %d tokens + %d for the question and answer exceed the context window of %d tokens "
                         "(max_position_embeddings)", n, p->reserve, c->max_context);
    const ckv_press_config *press = NULL;
    if (p->press && p->press->scorer != CKV_SCORER_NONE) {
        CKV_TRY(ckv_press_with_question(p->press, p->question_rows, &pc->press));
        press = &pc->press;
    }
    int compress = press && !p->hook && !p->cache_in;
    if (compress && press->scorer == CKV_SCORER_FINCH) CKV_TRY(ckv_press_check_context(press, n)); /* not a skip */
    if (compress && (pc->uncompressed_reason = ckv_compress_skip_reason(press, n)) != NULL) compress = 0;
    pc->compressed = compress;
    pc->cz.cfg = press;
    pc->cz.dump = p->dump_kept && compress;
    pc->cz.dump_kept = compress ? p->dump_file : NULL;
    pc->dump_kept = p->dump_kept;
    pc->dump_file = p->dump_file;
    pc->cache_out = p->cache_out;
    pc->question_inside = p->question_rows > 0;
    pc->press_spec = press ? press->spec : "none";
    pc->hook = p->hook ? p->hook : compress ? ckv_compress_layer_hook : NULL;
    pc->hook_ctx = p->hook ? p->hook_ctx : &pc->cz;
    ckv_status st = CKV_STATUS_OK;
    if (compress && press->alloc == CKV_ALLOC_HEADKV) {
        CKV_TRY(ckv_compress_headkv_budgets(press, c, n, &pc->headkv));
        pc->cz.headkv_budgets = pc->headkv;
    }
    int rows = p->reserve; /* after the context: the question and answer, or kvzip's replay before them */
    if (compress && press->scorer == CKV_SCORER_KVZIP) {
        CKV_TRY(ckv_kvzip_check(press, c->vocab_size));
        const int replay = ckv_kvzip_replay_rows(press, n);
        if ((long)n + replay > c->max_context)
            return ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG, "press kvzip: the replay of a %d-token context reaches "
                             "position %d, past the context window of %d tokens (max_position_embeddings)", n,
                             n + replay - 1, c->max_context);
        rows = replay > rows ? replay : rows;
        CKV_TRY(ckv_alloc((void **)&pc->cz.context_ids, (size_t)n * sizeof(int32_t), "kvzip context ids"));
        memcpy(pc->cz.context_ids, p->ids, (size_t)n * sizeof(int32_t));
    }
    double t0 = ckv_time_now();
    CKV_TRY_GOTO(st, ckv_session_init_kv(&pc->sess, m, n + rows, engine_chunk(e), compress || p->cache_in || p->hook,
                                         engine_kv_dtype(e)), fail);
    if (p->cache_in) {
        snprintf(pc->cache_in, sizeof pc->cache_in, "%s", p->cache_in);
        CKV_TRY_GOTO(st, ckv_alloc((void **)&pc->logits, sizeof(float) * (size_t)c->vocab_size, "context logits"), fail);
        int has_logits = 0;
        CKV_TRY_GOTO(st, ckv_session_load_cache(&pc->sess, p->cache_in, pc->cache_press, sizeof pc->cache_press, pc->logits,
                                                &has_logits, &pc->question_inside), fail);
        if (!has_logits) { /* a context-only file from --save-cache: its answers need a question */
            ckv_free(pc->logits);
            pc->logits = NULL;
        }
        pc->n_context = pc->sess.n_past;
        CKV_TRY_GOTO(st, ckv_session_mark(&pc->sess), fail);
        pc->ready = 1;
        ckv_prepared_fill_stats(pc, 0);
    } else {
        CKV_TRY_GOTO(st, ckv_session_prefill_begin(&pc->sess, p->ids, n), fail);
        pc->n_context = n;
    }
    pc->prepare_seconds = ckv_time_now() - t0;
    return CKV_STATUS_OK;
fail:
    ckv_prepared_free(pc);
    return st;
}

/* The context's prefill is over (lg: its last logits [V]): the logits kept, cache_out written, the
 * cache marked, the stats filled; the context takes questions. */
static ckv_status prepared_finish(ckv_prepared *pc, const float *lg) {
    const ckv_model_config *c = &pc->engine->model->cfg;
    if (pc->compressed) CKV_TRY(ckv_compress_context_end(pc->cz.cfg, &pc->sess));
    CKV_TRY(ckv_alloc((void **)&pc->logits, sizeof(float) * (size_t)c->vocab_size, "context logits"));
    memcpy(pc->logits, lg, sizeof(float) * (size_t)c->vocab_size);
    if (pc->cache_out)
        CKV_TRY(ckv_session_save_cache(&pc->sess, pc->cache_out, pc->press_spec, pc->question_inside ? pc->logits : NULL,
                                       pc->question_inside));
    CKV_TRY(ckv_session_mark(&pc->sess));
    pc->ready = 1;
    pc->cache_out = NULL;
    ckv_prepared_fill_stats(pc, 1);
    return CKV_STATUS_OK;
}

ckv_status ckv_prepared_advance(ckv_prepared *pc, int *ready) {
    *ready = pc->ready;
    if (pc->ready) return CKV_STATUS_OK;
    if (!pc->engine) return ckv_error(CKV_STATUS_ERR_ARG, "advance of an empty prepared context");
    double t0 = ckv_time_now();
    int done = 0;
    const float *lg = NULL;
    ckv_status st = ckv_session_prefill_layer(&pc->sess, pc->hook, pc->hook_ctx, &done);
    if (st == CKV_STATUS_OK && done) st = ckv_session_prefill_end(&pc->sess, NULL, &lg);
    pc->prepare_seconds += ckv_time_now() - t0;
    if (st == CKV_STATUS_OK && done) st = prepared_finish(pc, lg);
    if (st != CKV_STATUS_OK) {
        ckv_prepared_free(pc);
        return st;
    }
    *ready = pc->ready;
    return CKV_STATUS_OK;
}

ckv_status ckv_prepared_advance_batch(ckv_prepared *const *pcs, int n, ckv_prefill_batch *b) {
    ckv_session *sess[CKV_LOGITS_ROWS];
    ckv_layer_hook hooks[CKV_LOGITS_ROWS];
    void *ctx[CKV_LOGITS_ROWS];
    ckv_status st = n < 1 || n > CKV_LOGITS_ROWS
                        ? ckv_error(CKV_STATUS_ERR_ARG, "a batched prefill of %d contexts: expected 1 .. %d", n, CKV_LOGITS_ROWS)
                        : CKV_STATUS_OK;
    for (int i = 0; i < n && st == CKV_STATUS_OK; i++) {
        const ckv_prepared *pc = pcs[i];
        if (!pc->engine || pc->ready || pc->sess.pf_layer != 0)
            st = ckv_error(CKV_STATUS_ERR_ARG, "batched prefill: context %d is %s", i,
                           !pc->engine ? "empty" : pc->ready ? "ready already" : "part way through its layers");
        sess[i] = &pcs[i]->sess;
        hooks[i] = pcs[i]->hook;
        ctx[i] = pcs[i]->hook_ctx;
    }
    const float *lg = NULL; // [n, V]
    double t0 = ckv_time_now();
    if (st == CKV_STATUS_OK) st = ckv_prefill_batch_run(b, sess, hooks, ctx, n, &lg);
    double dt = ckv_time_now() - t0;
    const size_t V = st == CKV_STATUS_OK ? (size_t)pcs[0]->engine->model->cfg.vocab_size : 0;
    for (int i = 0; i < n; i++) {
        pcs[i]->prepare_seconds += dt;
        if (st == CKV_STATUS_OK) st = prepared_finish(pcs[i], lg + (size_t)i * V);
    }
    if (st != CKV_STATUS_OK)
        for (int i = 0; i < n; i++) ckv_prepared_free(pcs[i]);
    return st;
}

ckv_status ckv_engine_prepare(ckv_engine *e, const ckv_prepare_params *p, ckv_prepared *pc) {
    CKV_TRY(ckv_engine_prepare_begin(e, p, pc));
    for (int ready = pc->ready; !ready;) CKV_TRY(ckv_prepared_advance(pc, &ready));
    return CKV_STATUS_OK;
}

void ckv_prepared_free(ckv_prepared *pc) {
    if (!pc) return;
    ckv_decode_batch_free(pc->decoder); /* its recordings before the session whose caches they use */
    ckv_free(pc->decoder);
    ckv_compressor_release(&pc->cz);
    ckv_session_free(&pc->sess);
    ckv_free(pc->logits);
    free(pc->headkv);
    memset(pc, 0, sizeof *pc);
}

void ckv_answer_free(ckv_answer *a) {
    if (!a) return;
    ckv_free(a->ids);
    memset(a, 0, sizeof *a);
}

/* ---- answers ------------------------------------------------------------------------------------- */

/* Makes pc->decoder where the backend records decode steps (CKV_BACKEND_CAP_GRAPHS) and the group is
 * one rank: the answer's decode steps then run as a batched step of this one session, recorded as a
 * CUDA graph and replayed per token. Elsewhere (the CPU backend, tp > 1) it stays NULL and the steps
 * are ckv_session_decode's, bits unchanged. Once per context, before any decode loop. */
static ckv_status prepared_decoder(ckv_prepared *pc) {
    ckv_model *m = pc->engine->model;
    if (pc->decoder || !ckv_backend_supports(m->be, CKV_BACKEND_CAP_GRAPHS) || m->plan.tp != 1) return CKV_STATUS_OK;
    CKV_TRY(ckv_alloc((void **)&pc->decoder, sizeof *pc->decoder, "answer decode step"));
    const ckv_status st = ckv_decode_batch_init(pc->decoder, m, 1);
    if (st != CKV_STATUS_OK) {
        ckv_free(pc->decoder);
        pc->decoder = NULL;
    }
    return st;
}

/* One decode step of the answer: token at the session's next position, *lg its host logits [V]. */
static ckv_status prepared_decode(ckv_prepared *pc, int32_t token, const float **lg) {
    ckv_session *s = &pc->sess;
    if (!pc->decoder) return ckv_session_decode(s, token, lg);
    return ckv_decode_batch_step(pc->decoder, &s, &token, 1, lg);
}

ckv_status ckv_prepared_answer(ckv_prepared *pc, int question, const int32_t *ids, int n, const ckv_gen_params *g,
                               ckv_sampler *sampler, ckv_answer *out) {
    memset(out, 0, sizeof *out);
    out->stop_id = -1;
    ckv_engine *e = pc->engine;
    ckv_session *s = &pc->sess;
    int V = e->model->cfg.vocab_size;
    if (pc->spent)
        return ckv_error(CKV_STATUS_ERR_ARG, "question %d: decode-time compression of an earlier answer cut the context; "
                         "prepare it again", question);
    if (!pc->ready) return ckv_error(CKV_STATUS_ERR_ARG, "question %d: the context is still being prepared", question);
    if (g->max_new_tokens < 0) return ckv_error(CKV_STATUS_ERR_ARG, "--max-new-tokens must be >= 0, got %d", g->max_new_tokens);
    if (n < 0 || (n > 0 && !ids)) return ckv_error(CKV_STATUS_ERR_ARG, "bad question of %d tokens", n);
    if ((long)pc->n_context + n + g->max_new_tokens > s->capacity)
        return ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG,
                         "question %d: %d tokens + %d new exceed the %d tokens reserved after the context", question, n,
                         g->max_new_tokens, s->capacity - pc->n_context);
    if (n == 0 && !pc->logits && g->max_new_tokens > 0)
        return ckv_error(CKV_STATUS_ERR_ARG, "a context-only cache file (saved without --query-aware) needs a question to "
                         "answer: give --question-ids");
    if (n > 0 && pc->question_inside && pc->cache_in[0])
        return ckv_error(CKV_STATUS_ERR_ARG, "%s: a query-aware cache file holds its question already (compressed with "
                         "the context): drop --question-ids", pc->cache_in);
    if (n > 0 && pc->question_inside)
        return ckv_error(CKV_STATUS_ERR_ARG, "question %d: the context holds its question already (compressed with it): "
                         "drop --question-ids", question);
    ckv_answer_config ac = {.max_tokens = g->max_new_tokens, .eos_ids = e->stop_ids, .n_eos_ids = e->n_stop_ids,
                            .ignore_eos = g->ignore_eos, .stop_ids = g->stop_ids, .n_stop_ids = g->n_stop_ids,
                            .stop_strings = g->stop_strings, .n_stop_strings = g->n_stop_strings,
                            .tok = g->n_stop_strings > 0 ? e->cfg.tokenizer : NULL};
    ckv_answer_state as;
    CKV_TRY(ckv_answer_state_init(&as, &ac));
    ckv_sampler own;
    int own_sampler = sampler == NULL;
    ckv_status st = CKV_STATUS_OK;
    if (own_sampler) {
        st = ckv_sampler_init(&own, &g->sampling, V);
        sampler = &own;
    }
    double t0 = ckv_time_now();
    const float *lg = pc->logits;
    if (st == CKV_STATUS_OK && n > 0) st = ckv_session_prefill(s, ids, n, NULL, &lg);
    if (g->max_new_tokens == 0) ckv_answer_state_end(&as, CKV_FINISH_LENGTH);
    ckv_decode_state dstate;
    memset(&dstate, 0, sizeof dstate);
    if (st == CKV_STATUS_OK && g->decode_press) st = ckv_decode_state_init(&dstate, g->decode_press, s, pc->dump_kept, pc->dump_file);
    if (st == CKV_STATUS_OK && g->max_new_tokens > 1) st = prepared_decoder(pc);
    for (int t = 0; st == CKV_STATUS_OK && as.finish == CKV_FINISH_NONE; t++) {
        int32_t tok;
        ckv_finish_reason fin = ckv_answer_state_sample(&as, sampler, lg, &tok);
        if (t == 0) out->ttft_seconds = ckv_time_now() - t0;
        if (g->on_token && g->on_token(g->cb_ctx, question, tok, as.stop_id >= 0, lg)) {
            as.finish = CKV_FINISH_CANCELLED;
            break;
        }
        if (fin == CKV_FINISH_NONE) st = prepared_decode(pc, tok, &lg);
        if (st == CKV_STATUS_OK && fin == CKV_FINISH_NONE && g->decode_press) st = ckv_decode_state_step(&dstate, NULL);
    }
    int cut = dstate.compressions > 0; /* the context's rows were cut with the answer's: no rewind */
    pc->stats.decode_compressions += dstate.compressions;
    pc->stats.decode_evicted_entries += dstate.evicted_entries;
    pc->stats.decode_compress_seconds += dstate.seconds;
    ckv_decode_state_free(&dstate);
    out->seconds = ckv_time_now() - t0;
    if (st == CKV_STATUS_OK) { /* the answer takes over the state's ids */
        out->ids = as.ids;
        out->n = as.n_ids;
        out->stop_id = as.stop_id;
        out->finish = as.finish;
        as.ids = NULL;
    }
    ckv_answer_state_free(&as);
    if (st == CKV_STATUS_OK && g->on_answer_end) g->on_answer_end(g->cb_ctx, question, out);
    size_t kvb = ckv_kv_cache_bytes_used(&s->kv);
    if (kvb > pc->stats.kv_bytes_peak) pc->stats.kv_bytes_peak = kvb;
    if (pc->stats.ttft_seconds == 0) pc->stats.ttft_seconds = pc->prepare_seconds + out->ttft_seconds;
    if (st == CKV_STATUS_OK) {
        pc->stats.prompt_tokens += n;
        if (cut) pc->spent = 1;
        else st = ckv_session_rewind(s);
    }
    if (own_sampler) ckv_sampler_free(&own);
    if (st != CKV_STATUS_OK) ckv_answer_free(out);
    return st;
}

ckv_status ckv_prepared_forward(ckv_prepared *pc, const int32_t *ids, int n, float *all_logits) {
    if (!pc->ready) return ckv_error(CKV_STATUS_ERR_ARG, "the context is still being prepared");
    if (n < 1) return ckv_error(CKV_STATUS_ERR_ARG, "nothing to feed after the context");
    if ((long)pc->sess.n_past + n > pc->sess.capacity)
        return ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG, "%d tokens exceed the %d reserved after the context", n,
                         pc->sess.capacity - pc->sess.n_past);
    CKV_TRY(ckv_session_prefill(&pc->sess, ids, n, all_logits, NULL));
    pc->stats.prompt_tokens += n;
    size_t kvb = ckv_kv_cache_bytes_used(&pc->sess.kv);
    if (kvb > pc->stats.kv_bytes_peak) pc->stats.kv_bytes_peak = kvb;
    return ckv_session_rewind(&pc->sess);
}

/* ---- whole requests ------------------------------------------------------------------------------- */

static int question_max_new(const ckv_request *r, int q) {
    int v = r->questions && r->questions[q].max_new_tokens > 0 ? r->questions[q].max_new_tokens : r->gen.max_new_tokens;
    return v;
}

ckv_status ckv_request_check(const ckv_engine *e, const ckv_request *r) {
    int W = e->model->cfg.max_context;
    if (r->gen.max_new_tokens < 0) return ckv_error(CKV_STATUS_ERR_ARG, "--max-new-tokens must be >= 0");
    if (r->n_questions < 0 || (r->n_questions > 0 && !r->questions)) return ckv_error(CKV_STATUS_ERR_ARG, "bad question list");
    if (r->query_aware && r->n_questions == 0) return ckv_error(CKV_STATUS_ERR_ARG, "--query-aware needs at least one question");
    if (r->query_aware && r->cache_in)
        return ckv_error(CKV_STATUS_ERR_ARG, "--query-aware with --load-cache: the file records how it was compressed; drop --query-aware");
    if (r->query_aware && r->cache_out && r->n_questions != 1)
        return ckv_error(CKV_STATUS_ERR_ARG, "--save-cache with --query-aware stores one question compressed with the context: "
                         "give exactly one question, got %d", r->n_questions);
    if (r->cache_in) return CKV_STATUS_OK; /* the context length is in the file; ckv_engine_prepare checks it */
    if (r->n_context < 1 || !r->context) return ckv_error(CKV_STATUS_ERR_ARG, "empty context");
    if (r->press) CKV_TRY(ckv_press_check_layers(r->press, e->model->cfg.n_layers)); /* per_layer's ratios */
    long max_q = 0, max_new = r->n_questions ? 0 : r->gen.max_new_tokens;
    for (int q = 0; q < r->n_questions; q++) {
        if (r->questions[q].n > max_q) max_q = r->questions[q].n;
        if (question_max_new(r, q) > max_new) max_new = question_max_new(r, q);
    }
    if (r->n_context + max_q > W)
        return ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG,
                         "the prompt has %ld tokens, more than the context window of %d tokens (max_position_embeddings)",
                         r->n_context + max_q, W);
    if (r->n_context + max_q + max_new > W)
        return ckv_error(CKV_STATUS_ERR_CONTEXT_TOO_LONG,
                         "--max-new-tokens %ld: prompt (%ld) + new tokens exceed the context window of %d tokens "
                         "(max_position_embeddings)", max_new, r->n_context + max_q, W);
    return CKV_STATUS_OK;
}

static void add_stats(ckv_request_stats *a, const ckv_prepared *pc) {
    const ckv_request_stats *b = &pc->stats;
    a->prompt_tokens += b->prompt_tokens;
    a->reused_tokens += b->reused_tokens;
    a->context_tokens = b->context_tokens;
    a->compressed |= b->compressed;
    if (!a->uncompressed_reason) a->uncompressed_reason = b->uncompressed_reason;
    a->kept_entries += b->kept_entries;
    a->total_entries += b->total_entries;
    a->kv_bytes_full += b->kv_bytes_full;
    a->kv_bytes_kept += b->kv_bytes_kept;
    if (b->kv_bytes_peak > a->kv_bytes_peak) a->kv_bytes_peak = b->kv_bytes_peak;
    a->session_bytes = ckv_session_bytes(&pc->sess);
    a->chunk = pc->sess.chunk;
    a->prefill_seconds += pc->sess.prefill_seconds;
    a->decode_seconds += pc->sess.decode_seconds;
    a->prefill_tokens += pc->sess.prefill_tokens;
    a->decode_tokens += pc->sess.decode_tokens;
    a->score_seconds += b->score_seconds;
    a->select_seconds += b->select_seconds;
    a->compact_seconds += b->compact_seconds;
    a->comm_bytes_compression += b->comm_bytes_compression;
    a->decode_compressions += b->decode_compressions;
    a->decode_evicted_entries += b->decode_evicted_entries;
    a->decode_compress_seconds += b->decode_compress_seconds;
    if (a->ttft_seconds == 0) a->ttft_seconds = b->ttft_seconds;
}

ckv_status ckv_engine_run(ckv_engine *e, const ckv_request *r, ckv_result *out) {
    memset(out, 0, sizeof *out);
    CKV_TRY(ckv_request_check(e, r));
    int n_ans = r->n_questions > 0 ? r->n_questions : 1;
    out->answers = calloc((size_t)n_ans, sizeof *out->answers);
    if (!out->answers) return ckv_error(CKV_STATUS_ERR_NOMEM, "out of memory for %d answers", n_ans);
    out->n_answers = n_ans;
    ckv_sampler sampler;
    ckv_status st = ckv_sampler_init(&sampler, &r->gen.sampling, e->model->cfg.vocab_size);
    if (st != CKV_STATUS_OK) {
        ckv_result_free(out);
        return st;
    }
    ckv_gen_params g = r->gen;
    ckv_prepare_params pp = {0};
    pp.press = r->press;
    pp.dump_kept = r->dump_kept;
    pp.dump_file = r->dump_file;
    ckv_prepared pc;
    memset(&pc, 0, sizeof pc);
    if (r->query_aware) { /* each question compressed with the context */
        int32_t *all = NULL;
        for (int q = 0; q < r->n_questions && st == CKV_STATUS_OK; q++) {
            int n = r->n_context + r->questions[q].n;
            st = ckv_alloc((void **)&all, sizeof(int32_t) * (size_t)n, "query-aware prompt");
            if (st != CKV_STATUS_OK) break;
            memcpy(all, r->context, sizeof(int32_t) * (size_t)r->n_context);
            memcpy(all + r->n_context, r->questions[q].ids, sizeof(int32_t) * (size_t)r->questions[q].n);
            g.max_new_tokens = question_max_new(r, q);
            pp.ids = all;
            pp.n = n;
            pp.question_rows = r->questions[q].n;
            pp.reserve = g.max_new_tokens;
            pp.cache_out = r->cache_out; /* one question (ckv_request_check) */
            st = ckv_engine_prepare(e, &pp, &pc);
            if (st == CKV_STATUS_OK) st = ckv_prepared_answer(&pc, q, NULL, 0, &g, &sampler, &out->answers[q]);
            if (st == CKV_STATUS_OK) add_stats(&out->stats, &pc);
            ckv_prepared_free(&pc);
            ckv_free(all);
            all = NULL;
        }
    } else {
        int max_q = 0, max_new = r->n_questions ? 0 : r->gen.max_new_tokens;
        for (int q = 0; q < r->n_questions; q++) {
            if (r->questions[q].n > max_q) max_q = r->questions[q].n;
            if (question_max_new(r, q) > max_new) max_new = question_max_new(r, q);
        }
        pp.ids = r->context;
        pp.n = r->n_context;
        pp.reserve = max_q + max_new;
        pp.cache_in = r->cache_in;
        pp.cache_out = r->cache_out;
        st = ckv_engine_prepare(e, &pp, &pc);
        if (st == CKV_STATUS_OK) snprintf(out->cache_press, sizeof out->cache_press, "%s", pc.cache_press);
        for (int q = 0; q < n_ans && st == CKV_STATUS_OK; q++) {
            if (pc.spent) { /* decode-time compression cut the context: the next question gets it afresh */
                add_stats(&out->stats, &pc);
                ckv_prepared_free(&pc);
                pp.cache_out = NULL; /* written once */
                if ((st = ckv_engine_prepare(e, &pp, &pc)) != CKV_STATUS_OK) break;
            }
            g.max_new_tokens = r->n_questions ? question_max_new(r, q) : r->gen.max_new_tokens;
            const int32_t *ids = r->n_questions ? r->questions[q].ids : NULL;
            int n = r->n_questions ? r->questions[q].n : 0;
            st = ckv_prepared_answer(&pc, q, ids, n, &g, &sampler, &out->answers[q]);
        }
        if (st == CKV_STATUS_OK) add_stats(&out->stats, &pc);
        ckv_prepared_free(&pc);
    }
    ckv_sampler_free(&sampler);
    if (st != CKV_STATUS_OK) ckv_result_free(out);
    return st;
}

void ckv_result_free(ckv_result *r) {
    if (!r) return;
    for (int i = 0; r->answers && i < r->n_answers; i++) ckv_answer_free(&r->answers[i]);
    free(r->answers);
    memset(r, 0, sizeof *r);
}
