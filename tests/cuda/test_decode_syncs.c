/* test_decode_syncs.c - how often a decode step makes the host wait for the GPU, and how many
 * kernels and GEMMs it launches, counted by the CPU execution layer (cuda-emu). On the bf16 fixture
 * model (production path: bf16 weights and KV cache), three sessions of 30, 55 and 80 prompt tokens
 * decode 6 steps together:
 *   - sampled on the device (ckv_decode_batch_step_ids; row 0 greedy, rows 1 and 2 sampled with the
 *     same settings): exactly 1 host wait per step, and exactly 2 sample calls (rows with equal
 *     settings share one; their kernels counted as cuda_sample.cu launches them), the first step of the process too (the split-KV partials are reserved
 *     when the backend starts: no step grows a workspace); ids equal to the CPU sample op's on the
 *     same step's host logits;
 *   - host logits (ckv_decode_batch_step) and one session alone (ckv_session_decode): 1 wait each;
 *   - no device allocation after the first step;
 *   - last, the batched step inside a stream capture of the backend's stream: everything before
 *     its download records (no host wait, allocation or pageable copy inside the step), the
 *     download is the one refused call (what a CUDA graph of the step must leave outside it).
 * These run with the backend's recorded steps off (CKV_CUDA_GRAPHS=0). Before the capture, the recorded steps: a
 * second backend with them on decodes 18 device-sampled steps of four sessions (prompts of 120, 90,
 * 250 and 60 ids) beside the first: members {0, 1, 2} for 8 steps (the longest crosses the key bound
 * 256 at step 6), {0, 3, 2} for 2 (other members, same key), {0, 3, 2, 1} for 4, {0, 3, 2} for 2
 * (a known key: its graph replays, the 4-row step having moved no workspace: the split-KV partials
 * are reserved when the backend starts, docs/gpu.md §3b), {0, 3, 2} for 2 more after the test hook
 * moved the recording backend's split-KV partials (ckv_cuda_emu_move_workspace: reallocated, as a
 * workspace growth would): the key's next step is recorded again, not replayed from the graph that
 * holds the old address, and the one after replays; then the same members for 5 steps returning
 * host logits (ckv_decode_batch_step: a key of its own, the partials moved again before its fourth,
 * recorded again; the logits equal to the unrecorded backend's bit for bit). The moves need the
 * CPU execution layer's hook: a GPU run decodes the same steps without them.
 * Each key's first step runs unrecorded, its second is recorded and launched, later ones replay: exactly 1 graph launch,
 * 1 host wait and no kernel or GEMM launched from the host per replayed step; ids equal to the
 * unrecorded backend's at every step. Under CKV_EMU_CHECK=1 the replays go through the layer's checks.
 * CKV_CUDA_GRAPHS and CKV_CUDA_SYNC other than unset, 0 or 1 are refused at init; a recording whose step makes a refused call
 * (a wait) is that step's error naming the call, and recording stays off.
 *   test_decode_syncs [cuda-emu]   the above (label cuda-emu)
 *   test_decode_syncs cuda         on a GPU (label cuda): the recorded steps' ids and host logits
 *                                  against a backend with recording off (no counters); skips without one
 * Every wait the layer counts is one a GPU would make the host take (stream and device syncs,
 * copies into pageable memory); small uploads are staged through page-locked memory, whose copies
 * the layer runs late, so a staging bug shows up as wrong ids. Prints waits, kernels and GEMMs per
 * step and per layer. Label cuda-emu. */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/gpu_workspace.h"
#include "backend/cuda/cuda_emu.h"
#include "ckv_test.h"
#include "cuda_test_backend.h"
#include "graph_test.h"
#include "engine/batch.h"
#include "engine/session.h"
#include "model/model.h"

enum { NS = 3, STEPS = 6, CAP = 160, GS = 4, GSTEPS = 23, GCAP = 320 };

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) b = x[i] > x[b] ? i : b;
    return b;
}

/* Session i prefilled with n ids of a fixed pattern in a cache of cap rows; *first its greedy next
 * token. */
static void prefill_n(ckv_session *s, ckv_model *m, int i, int n, int cap, int32_t *first) {
    const int V = m->cfg.vocab_size;
    int32_t ids[GCAP];
    for (int t = 0; t < n; t++) ids[t] = (int32_t)((7 * t + 13 * i + 1) % V);
    const float *last = NULL;
    CHECK_OK(ckv_session_init_kv(s, m, cap, 16, 0, CKV_DTYPE_BF16));
    CHECK_OK(ckv_session_prefill(s, ids, n, NULL, &last));
    *first = last ? argmax(last, V) : 0;
}

/* Session i prefilled with 30 + 25 i ids. */
static void prefill(ckv_session *s, ckv_model *m, int i, int32_t *first) { prefill_n(s, m, i, 30 + 25 * i, CAP, first); }

/* The recorded steps (see the top): model pm on a backend with them off, gm with them on. */
static void recorded_steps(ckv_model *pm, ckv_model *gm, int counted) {
    static const int prompt[GS] = {120, 90, 250, 60};
    /* members of each step; and what the recording backend does: 0 unrecorded, 1 recorded, 2 replayed
     * (a key: rows, each layer's key bound, the rows' settings; a new key runs once unrecorded) */
    static const int rows[GSTEPS][GS + 1] = { /* n, then the sessions */
        {3, 0, 1, 2}, {3, 0, 1, 2}, {3, 0, 1, 2}, {3, 0, 1, 2}, {3, 0, 1, 2}, {3, 0, 1, 2},
        {3, 0, 1, 2}, {3, 0, 1, 2}, /* step 6: session 2 holds 257 rows after the step: bound 512 */
        {3, 0, 3, 2}, {3, 0, 3, 2}, /* other members, the same key */
        {4, 0, 3, 2, 1}, {4, 0, 3, 2, 1}, {4, 0, 3, 2, 1}, {4, 0, 3, 2, 1},
        {3, 0, 3, 2}, {3, 0, 3, 2}, /* a known key: replayed (the split-KV partials are reserved at start, so the
                                       4-row step moved no workspace) */
        {3, 0, 3, 2}, {3, 0, 3, 2}, /* the same key after a workspace moved: recorded again, then replayed */
        {3, 0, 3, 2}, {3, 0, 3, 2}, {3, 0, 3, 2}, /* host logits (ckv_decode_batch_step) */
        {3, 0, 3, 2}, {3, 0, 3, 2}}; /* host logits after a workspace moved */
    static const int want_kind[GSTEPS] = {0, 1, 2, 2, 2, 2, 0, 1, 2, 2, 0, 1, 2, 2, 2, 2, 1, 2, 0, 1, 2, 1, 2};
    /* before these steps the recording backend's split-KV partials move (counted runs: the test hook
     * of the CPU execution layer; nothing in decode moves a workspace) */
    static const int moved[GSTEPS] = {[16] = 1, [21] = 1};
    enum { HOST_FROM = 18 }; /* the steps from here return host logits */
    static const char *const kind_name[3] = {"unrecorded", "recorded", "replayed"};
    ckv_session ps[GS], gs[GS];
    int32_t tok[GS];
    for (int i = 0; i < GS; i++) {
        int32_t t2 = 0;
        prefill_n(&ps[i], pm, i, prompt[i], GCAP, &tok[i]);
        prefill_n(&gs[i], gm, i, prompt[i], GCAP, &t2);
        CHECK(t2 == tok[i]);
    }
    ckv_decode_batch pb, gb;
    CHECK_OK(ckv_decode_batch_init(&pb, pm, GS));
    CHECK_OK(ckv_decode_batch_init(&gb, gm, GS));
    uint64_t rng = 0x9a7eULL;
    int wrong_ids = 0, wrong_kind = 0, wrong_counts = 0, replays = 0;
    double max_err = 0.0;
    for (int step = 0; step < GSTEPS; step++) {
        const int n = rows[step][0];
        ckv_session *pp[GS], *gp[GS];
        int32_t in[GS], pid[GS] = {0}, gid[GS] = {0};
        ckv_batch_pick picks[GS];
        for (int r = 0; r < n; r++) {
            const int i = rows[step][1 + r];
            pp[r] = &ps[i], gp[r] = &gs[i], in[r] = tok[i];
            picks[r] = r == 0 ? (ckv_batch_pick){0.0f, 1.0f, 0, 0.0}
                              : (ckv_batch_pick){0.8f, 0.9f, 20, ckv_test_rng_double(&rng)};
        }
        const int host = step >= HOST_FROM, V = pm->cfg.vocab_size;
        const float *plg = NULL, *glg = NULL;
        if (host) {
            CHECK_OK(ckv_decode_batch_step(&pb, pp, in, n, &plg));
            for (int r = 0; plg && r < n; r++) pid[r] = argmax(plg + (size_t)r * V, V);
        } else {
            CHECK_OK(ckv_decode_batch_step_ids(&pb, pp, in, n, picks, pid));
        }
        if (counted && moved[step]) CHECK_OK(ckv_cuda_emu_move_workspace(gm->be));
        emu_counts c0 = emu_counts_now();
        const ckv_status st = host ? ckv_decode_batch_step(&gb, gp, in, n, &glg)
                                   : ckv_decode_batch_step_ids(&gb, gp, in, n, picks, gid);
        emu_counts c = emu_counts_since(c0);
        for (int r = 0; host && glg && plg && r < n; r++) {
            gid[r] = argmax(glg + (size_t)r * V, V);
            for (int v = 0; v < V; v++) {
                const double e = fabs((double)glg[(size_t)r * V + v] - (double)plg[(size_t)r * V + v]);
                max_err = e > max_err ? e : max_err;
            }
        }
        CHECK_MSG(st == CKV_STATUS_OK, "recorded step %d: %s", step, ckv_error_message());
        if (st != CKV_STATUS_OK) break;
        const unsigned long long captures = c.captures, launches = c.graph_launches;
        const int kind = !counted ? want_kind[step] : launches == 0 ? 0 : captures == 1 ? 1 : 2;
        if (kind != want_kind[step] && wrong_kind++ < 5)
            fprintf(stderr, "  step %d: %s (%llu captures, %llu graph launches), want %s\n", step, kind_name[kind],
                    captures, launches, kind_name[want_kind[step]]);
        /* recorded and replayed steps: one graph launch, nothing launched from the host, one wait */
        const int bad = counted && kind > 0 &&
                        (launches != 1 || c.kernels != 0 || c.gemms != 0 || c.waits != 1 || c.allocs != 0);
        if (bad && wrong_counts++ < 5)
            fprintf(stderr, "  step %d (%s): %llu graph launches, %llu kernels, %llu GEMMs, %llu host waits, %llu "
                    "allocations (want 1, 0, 0, 1, 0)\n", step, kind_name[kind], launches, c.kernels, c.gemms, c.waits,
                    c.allocs);
        replays += kind == 2;
        for (int r = 0; r < n; r++) {
            if (pid[r] != gid[r] && wrong_ids++ < 5)
                fprintf(stderr, "  step %d row %d (session %d): id %d recorded/replayed, %d unrecorded\n", step, r,
                        rows[step][1 + r], gid[r], pid[r]);
            tok[rows[step][1 + r]] = pid[r];
        }
        if (counted)
            fprintf(stderr, "     step %2d: %d rows, %s, %-10s %llu graph launch, %llu kernels, %llu GEMMs, %llu host wait\n",
                    step, n, host ? "host logits" : "ids       ", kind_name[kind], launches, c.kernels, c.gemms, c.waits);
    }
    CHECK_MSG(wrong_kind == 0, "%d steps were not recorded or replayed when they should", wrong_kind);
    CHECK_MSG(wrong_counts == 0, "%d recorded or replayed steps launched or waited other than once", wrong_counts);
    CHECK_MSG(wrong_ids == 0, "%d ids of the recorded steps differ from the unrecorded backend's", wrong_ids);
    CHECK_MSG(max_err == 0.0, "the recorded steps' host logits differ from the unrecorded backend's by up to %g", max_err);
    fprintf(stderr, "%s %d recorded steps (%d replays%s), ids equal to the unrecorded backend's over a key bound "
            "crossing, changes of members, a known key after a larger step and keys recorded again after a workspace "
            "moved; host logits max error %g\n",
            wrong_kind || wrong_counts || wrong_ids || max_err > 0.0 ? "FAIL" : "ok  ", GSTEPS, replays,
            counted ? ": 1 graph launch and 1 host wait each" : ", as designed: a GPU run does not count them", max_err);
    ckv_decode_batch_free(&pb);
    ckv_decode_batch_free(&gb);
    for (int i = 0; i < GS; i++) ckv_session_free(&ps[i]), ckv_session_free(&gs[i]);
}

/* A recording that fails: a call inside it waits for the device (a void op, release, whose refused
 * cudaFree is recorded for later) is graph_end's error naming that call, and recording stays off for
 * the backend: the key's next step runs unrecorded and nothing is captured. */
static void recording_failure(void) {
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_cuda_emu_init(&be, 0));
    if (!be) return;
    void *buf = NULL;
    CHECK_OK(be->ops->alloc(be, &buf, 256, "test buffer"));
    const int owner = 0, key = 7;
    int replayed = -1, ok = 1;
    unsigned long long cap0, cap1, gl0, gl1;
    CHECK_OK(be->ops->graph_begin(be, &owner, &key, sizeof key, &replayed)); /* the key's first step */
    CHECK(replayed == 0);
    CHECK_OK(be->ops->graph_end(be, CKV_STATUS_OK));
    CHECK_OK(be->ops->graph_begin(be, &owner, &key, sizeof key, &replayed)); /* recorded */
    be->ops->release(be, buf); /* waits for the stream and frees: refused in a capture */
    ckv_error_clear();
    const ckv_status st = be->ops->graph_end(be, CKV_STATUS_OK);
    const char *msg = ckv_error_message();
    ok &= st == CKV_STATUS_ERR_DEVICE && strstr(msg, "recording the decode step as a CUDA graph failed") &&
          strstr(msg, "release") && strstr(msg, "are off");
    CHECK_MSG(ok, "a refused call inside a recording: graph_end gave %s '%s'", ckv_status_string(st), msg);
    ckv_cuda_emu_graph_counts(&cap0, &gl0);
    CHECK_OK(be->ops->graph_begin(be, &owner, &key, sizeof key, &replayed)); /* off: runs unrecorded */
    CHECK_OK(be->ops->graph_end(be, CKV_STATUS_OK));
    ckv_cuda_emu_graph_counts(&cap1, &gl1);
    CHECK_MSG(replayed == 0 && cap1 == cap0 && gl1 == gl0, "after a failed recording: replayed %d, %llu captures, %llu "
              "graph launches (want 0, 0, 0)", replayed, cap1 - cap0, gl1 - gl0);
    CHECK_OK(be->ops->sync(be));
    be->ops->release(be, buf);
    CHECK_OK(be->ops->sync(be));
    ckv_backend_free(be);
    if (ok) fprintf(stderr, "ok   a refused call inside a recording fails the step naming it; recording stays off\n");
}

/* Kernels one sample call launches (cuda_sample.cu, docs/gpu.md): greedy 2; sampled 3, then 3 for
 * the first of its cuts and 4 for each further one (top-k when 0 < top_k < V, top-p when top_p < 1,
 * the draw). */
static unsigned long long sample_kernels(const ckv_batch_pick *p, int V) {
    if (p->temperature == 0.0f) return 2;
    const int cuts = 1 + (p->top_k > 0 && p->top_k < V) + (p->top_p < 1.0f);
    return 3 + 3 + 4ull * (unsigned long long)(cuts - 1);
}

/* Everything the CPU execution layer counts (see the top): dev and m with recorded steps off, gm with
 * them on, cpu the reference sample op's backend. */
static void emu_steps(ckv_backend *dev, ckv_backend *cpu, ckv_model *m, ckv_model *gm) {
    const int V = m->cfg.vocab_size, L = m->cfg.n_layers;

    ckv_session sa[NS], sb[NS], solo;
    ckv_session *pa[NS], *pb[NS];
    int32_t tok[NS], first_solo = 0;
    for (int i = 0; i < NS; i++) {
        int32_t t2 = 0;
        prefill(&sa[i], m, i, &tok[i]);
        prefill(&sb[i], m, i, &t2);
        CHECK(t2 == tok[i]);
        pa[i] = &sa[i];
        pb[i] = &sb[i];
    }
    prefill(&solo, m, 2, &first_solo);
    ckv_decode_batch ba, bb;
    CHECK_OK(ckv_decode_batch_init(&ba, m, 4));
    CHECK_OK(ckv_decode_batch_init(&bb, m, 4));

    uint64_t rng = 0x5eedULL;
    ckv_batch_pick picks[NS] = {{0.0f, 1.0f, 0, 0.0}, {0.8f, 0.9f, 20, 0.0}, {0.8f, 0.9f, 20, 0.0}};
    int wrong_waits = 0, wrong_ids = 0, wrong_launches = 0, allocs_after_first = 0;
    emu_counts per_ids = {0}, per_host = {0};
    for (int step = 0; step < STEPS; step++) {
        for (int i = 1; i < NS; i++) picks[i].u = ckv_test_rng_double(&rng);
        int32_t ids[NS];
        emu_counts c0 = emu_counts_now();
        ckv_status st = ckv_decode_batch_step_ids(&ba, pa, tok, NS, picks, ids);
        emu_counts ci = emu_counts_since(c0);
        CHECK_MSG(st == CKV_STATUS_OK, "step %d (device sampling): %s", step, ckv_error_message());
        const float *lg = NULL;
        c0 = emu_counts_now();
        st = ckv_decode_batch_step(&bb, pb, tok, NS, &lg);
        emu_counts ch = emu_counts_since(c0);
        CHECK_MSG(st == CKV_STATUS_OK && lg, "step %d (host logits): %s", step, ckv_error_message());
        if (st != CKV_STATUS_OK || !lg) break;
        /* the reference: the CPU sample op on this step's host logits with the same draws */
        int32_t want[NS];
        for (int i = 0; i < NS; i++)
            cpu->ops->sample(cpu, &want[i], lg + (size_t)i * V, 1, V, picks[i].temperature, picks[i].top_k,
                             picks[i].top_p, &picks[i].u);
        for (int i = 0; i < NS; i++)
            if (ids[i] != want[i]) {
                if (wrong_ids++ < 5)
                    fprintf(stderr, "  step %d row %d: device-sampled id %d, cpu sample op on the host logits %d\n", step,
                            i, ids[i], want[i]);
            }
        if (ci.waits != 1 || ch.waits != 1) {
            if (wrong_waits++ < 5)
                fprintf(stderr, "  step %d: %llu host waits sampling on the device, %llu with host logits (want 1, 1)\n",
                        step, ci.waits, ch.waits);
        }
        /* the same forward; the difference is the sample calls: greedy row 0, then rows 1-2 */
        const unsigned long long want_sample = sample_kernels(&picks[0], V) + sample_kernels(&picks[1], V);
        if (ci.kernels != ch.kernels + want_sample || ci.gemms != ch.gemms) {
            if (wrong_launches++ < 5)
                fprintf(stderr, "  step %d: %llu kernels and %llu GEMMs sampling on the device, %llu and %llu with host "
                        "logits (want %llu more kernels: one sample call per run of equal settings)\n",
                        step, ci.kernels, ci.gemms, ch.kernels, ch.gemms, want_sample);
        }
        if (step > 0) allocs_after_first += (int)(ci.allocs + ch.allocs);
        if (step == STEPS - 1) per_ids = ci, per_host = ch;
        for (int i = 0; i < NS; i++) tok[i] = ids[i];
    }
    CHECK_MSG(wrong_waits == 0, "%d steps waited for the device more (or less) than once", wrong_waits);
    CHECK_MSG(wrong_ids == 0, "%d device-sampled ids differ from the cpu sample op's", wrong_ids);
    CHECK_MSG(wrong_launches == 0, "%d steps launched other than one sample call per run of equal settings",
              wrong_launches);
    CHECK_MSG(allocs_after_first == 0, "decode steps after the first allocated %d device buffers", allocs_after_first);
    fprintf(stderr, "%s batch of %d, %d layers, per step: device sampling %llu wait, %llu kernels (%.1f per layer), "
            "%llu GEMMs; host logits %llu wait, %llu kernels, %llu GEMMs\n",
            wrong_waits || wrong_ids || wrong_launches ? "FAIL" : "ok  ", NS, L, per_ids.waits, per_ids.kernels,
            (double)per_ids.kernels / L, per_ids.gemms, per_host.waits, per_host.kernels, per_host.gemms);

    /* one session alone, unrecorded (ckv_session_decode: the decode of a request where steps are not recorded) */
    int32_t t = first_solo;
    int solo_bad = 0;
    emu_counts c1 = {0};
    for (int step = 0; step < 3; step++) {
        const float *lg = NULL;
        emu_counts c0 = emu_counts_now();
        CHECK_OK(ckv_session_decode(&solo, t, &lg));
        c1 = emu_counts_since(c0);
        if (c1.waits != 1) solo_bad++;
        t = lg ? argmax(lg, V) : 0;
    }
    CHECK_MSG(solo_bad == 0, "a single session's decode step waited for the device %llu times (want 1)", c1.waits);
    fprintf(stderr, "%s one session: %llu wait, %llu kernels, %llu GEMMs per step\n", solo_bad ? "FAIL" : "ok  ",
            c1.waits, c1.kernels, c1.gemms);

    recorded_steps(m, gm, 1);
    recording_failure();

    /* the step under a stream capture (last: the sessions' step does not complete): everything up to
     * the download records (no host wait, allocation or pageable copy inside the step), and the
     * download, the step's one host wait, is the one refused call */
    void *stream = dev->ops->stream(dev);
    int32_t ids[NS];
    const int begin = ckv_cuda_emu_capture_begin(stream);
    const ckv_status st = ckv_decode_batch_step_ids(&ba, pa, tok, NS, picks, ids);
    const char *why = st != CKV_STATUS_OK ? ckv_error_message() : "";
    const int refused_at_download = strstr(why, "download: ") && strstr(why, "capturing");
    char msg[256];
    snprintf(msg, sizeof msg, "%s", why);
    const int end = ckv_cuda_emu_capture_end(stream);
    CHECK_MSG(begin == 0 && refused_at_download && end == 901,
              "a captured step: begin %d, step '%s' (want a refused download), end %d (want 901, invalidated)", begin,
              msg, end);
    if (begin == 0 && refused_at_download && end == 901)
        fprintf(stderr, "ok   a batched step under capture records up to its download, the one refused call\n");

    ckv_decode_batch_free(&ba);
    ckv_decode_batch_free(&bb);
    for (int i = 0; i < NS; i++) ckv_session_free(&sa[i]), ckv_session_free(&sb[i]);
    ckv_session_free(&solo);
}

/* The backend's ledger of its device memory (mem_usage): after init it holds the plan's fixed
 * workspaces for its device, exactly; buffers of 1 and 2 MiB raise the live and
 * peak bytes by exactly that; a release lowers the live bytes and keeps the peak; a smaller buffer
 * after it leaves the peak where it was. */
static void check_mem_usage(void) {
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_cuda_emu_init(&be, 0));
    if (!be) return;
    CHECK(ckv_backend_supports(be, CKV_BACKEND_CAP_MEM_USAGE));
    ckv_backend_mem m0 = {0}, m1 = {0}, m2 = {0}, m3 = {0};
    be->ops->mem_usage(be, &m0);
    CHECK_MSG(m0.live_bytes > 0 && m0.peak_bytes == m0.live_bytes,
              "after init: live %zu, peak %zu bytes (the workspaces: expected live > 0 and equal to the peak)",
              m0.live_bytes, m0.peak_bytes);
    /* what the backend holds after init is what the memory plan's "backend workspaces" line counts
     * for this device (model/plan.c, backend/gpu_workspace.h) at a chunk within the GEMM workspace's
     * initial size */
    const size_t fixed = ckv_gpu_fixed_workspace_bytes(m0.sms, m0.cc_major, 512, 4096);
    CHECK_MSG(m0.live_bytes == fixed, "after init on %d SMs, cc %d: live %zu bytes, the plan's fixed workspaces %zu",
              m0.sms, m0.cc_major, m0.live_bytes, fixed);
    const size_t mib = (size_t)1 << 20;
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(be->ops->alloc(be, &a, mib, "a"));
    CHECK_OK(be->ops->alloc(be, &b, 2 * mib, "b"));
    be->ops->mem_usage(be, &m1);
    CHECK_MSG(m1.live_bytes == m0.live_bytes + 3 * mib && m1.peak_bytes == m1.live_bytes && m1.device_used_at_peak_bytes > 0,
              "after 1 + 2 MiB: live %zu, peak %zu, device used %zu bytes (expected live = peak = %zu, used > 0)",
              m1.live_bytes, m1.peak_bytes, m1.device_used_at_peak_bytes, m0.live_bytes + 3 * mib);
    be->ops->release(be, a);
    CHECK_OK(be->ops->alloc(be, &c, mib / 2, "c"));
    be->ops->mem_usage(be, &m2);
    CHECK_MSG(m2.live_bytes == m0.live_bytes + 2 * mib + mib / 2 && m2.peak_bytes == m1.peak_bytes,
              "after releasing 1 MiB and taking 0.5 MiB: live %zu, peak %zu bytes (expected %zu and %zu)",
              m2.live_bytes, m2.peak_bytes, m0.live_bytes + 2 * mib + mib / 2, m1.peak_bytes);
    be->ops->release(be, b);
    be->ops->release(be, c);
    be->ops->mem_usage(be, &m3);
    CHECK_MSG(m3.live_bytes == m0.live_bytes, "after every release: live %zu bytes, expected %zu", m3.live_bytes,
              m0.live_bytes);
    ckv_backend_free(be);
    printf("mem_usage: 1 + 2 MiB buffers counted (peak +3 MiB), a release and a smaller buffer left the peak as it was\n");
}

/* CKV_CUDA_SYNC=2: three add ops and one rmsnorm, then the backend freed: its op profile on stderr
 * (captured into a temporary file) names both ops with their call counts. */
static void check_op_profile(void) {
    setenv("CKV_CUDA_SYNC", "2", 1);
    ckv_backend *be = NULL;
    const ckv_status st = ckv_backend_cuda_emu_init(&be, 0);
    CHECK_MSG(st == CKV_STATUS_OK, "CKV_CUDA_SYNC=2: %s", ckv_error_message());
    float *x = NULL, *w = NULL; // [2 x 64] device buffers
    CHECK_OK(be->ops->alloc(be, (void **)&x, 128 * sizeof(float), "x"));
    CHECK_OK(be->ops->alloc(be, (void **)&w, 128 * sizeof(float), "w"));
    float h[128];
    for (int i = 0; i < 128; i++) h[i] = 0.01f * (float)i;
    CHECK_OK(be->ops->upload(be, x, h, sizeof h));
    CHECK_OK(be->ops->upload(be, w, h, sizeof h));
    for (int i = 0; i < 3; i++) be->ops->add(be, x, w, 128);
    be->ops->rmsnorm(be, x, x, w, 2, 64, 1e-6f);
    CHECK_OK(be->ops->sync(be));
    be->ops->release(be, x);
    be->ops->release(be, w);
    fflush(stderr);
    char path[] = "/tmp/ckv_op_profile_XXXXXX";
    const int fd = mkstemp(path), saved = dup(2);
    CHECK_MSG(fd >= 0 && saved >= 0, "cannot capture stderr into %s", path);
    dup2(fd, 2);
    ckv_backend_free(be); /* prints the profile */
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char text[8192];
    const ssize_t got = pread(fd, text, sizeof text - 1, 0);
    close(fd);
    unlink(path);
    text[got > 0 ? got : 0] = 0;
    CHECK_MSG(strstr(text, "op profile (CKV_CUDA_SYNC=2"), "no op profile on stderr after the backend's free: '%s'", text);
    const char *add = strstr(text, " add "), *norm = strstr(text, " rmsnorm ");
    CHECK_MSG(add && norm, "the profile does not name the add and rmsnorm ops: '%s'", text);
    long calls = strtol(add + 5, NULL, 10);
    CHECK_MSG(calls == 3, "the profile counts %ld add calls, expected 3: '%s'", calls, text);
    calls = strtol(norm + 9, NULL, 10);
    CHECK_MSG(calls == 1, "the profile counts %ld rmsnorm calls, expected 1: '%s'", calls, text);
    CHECK_MSG(strstr(text, "device memory: peak") && strstr(text, "  w\n"),
              "no device memory peak naming the buffer 'w' after the op profile: '%s'", text);
    printf("CKV_CUDA_SYNC=2: the op profile names add (3 calls) and rmsnorm (1 call); the memory peak names 'w'\n");
}

int main(int argc, char **argv) {
    ckv_backend *dev = NULL, *gdev = NULL, *cpu = NULL;
    ckv_model *m = NULL, *gm = NULL;
    const int gpu = argc > 1 && strcmp(argv[1], "cuda") == 0;
    if (!gpu) {
        setenv("CKV_CUDA_GRAPHS", "yes", 1); /* neither 0 nor 1: init refuses it in one line */
        CHECK_FAILS(ckv_backend_cuda_emu_init(&dev, 0), CKV_STATUS_ERR_ARG, "CKV_CUDA_GRAPHS=yes: expected 0");
        unsetenv("CKV_CUDA_GRAPHS");
        static const char *const bad_sync[] = {"3", "yes", "-1", "1 "}; /* CKV_CUDA_SYNC: unset, 0, 1 or 2 */
        for (int i = 0; i < 4; i++) {
            char want[32];
            snprintf(want, sizeof want, "CKV_CUDA_SYNC=%s: expected 0", bad_sync[i]);
            setenv("CKV_CUDA_SYNC", bad_sync[i], 1);
            CHECK_FAILS(ckv_backend_cuda_emu_init(&dev, 0), CKV_STATUS_ERR_ARG, want);
        }
        static const char *const good_sync[] = {"0", "1", ""};
        for (int i = 0; i < 3; i++) {
            setenv("CKV_CUDA_SYNC", good_sync[i], 1);
            const ckv_status st = ckv_backend_cuda_emu_init(&dev, 0);
            CHECK_MSG(st == CKV_STATUS_OK, "CKV_CUDA_SYNC='%s': %s", good_sync[i], ckv_error_message());
            ckv_backend_free(dev);
            dev = NULL;
        }
        check_op_profile();
        unsetenv("CKV_CUDA_SYNC");
        check_mem_usage();
        unsetenv("CKV_CUDA_SYNC");
    }
    const int rc = graph_test_open(argc, argv, "test_decode_syncs", &dev, &gdev); /* recording off, on */
    if (rc >= 0) return rc;
    CHECK_OK(ckv_backend_init(&cpu, "cpu", 1));
    const ckv_model_opts opts = {.weights_dtype = CKV_DTYPE_BF16};
    CHECK_OK(ckv_model_load_opts(&m, CKV_FIXTURES "/models/llama_gqa_bf16", dev, NULL, &opts));
    CHECK_OK(ckv_model_load_opts(&gm, CKV_FIXTURES "/models/llama_gqa_bf16", gdev, NULL, &opts));
    if (!m || !gm || !cpu) return ckv_test_finish("test_decode_syncs");
    CHECK(ckv_backend_supports(gdev, CKV_BACKEND_CAP_GRAPHS));
    if (gpu) /* the GPU: the recorded steps' ids and logits against the unrecorded backend's (no counters) */
        recorded_steps(m, gm, 0);
    else
        emu_steps(dev, cpu, m, gm);

    ckv_model_free(m);
    ckv_model_free(gm);
    ckv_backend_free(cpu);
    ckv_backend_free(dev);
    ckv_backend_free(gdev);
    return ckv_test_finish("test_decode_syncs");
}
