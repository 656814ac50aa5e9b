/* comm_ranks.c - the communicator tests that need several MPI ranks (run by the test_comm_*.sh
 * scripts under mpirun):
 *   comm_ranks timeout SECONDS [cuda|emu|split|node]
 *                                every rank takes part in one all-reduce, then the last rank stops
 *                                calling collectives (sleeps); the others must end the job, naming
 *                                the operation, once SECONDS have passed (the script times it):
 *                                in a second all-reduce; with cuda on the device communicator of
 *                                the CUDA backend (staged on one GPU, NCCL on several, enqueued on
 *                                the backend's compute stream); with emu the same on the CUDA
 *                                backend's CPU execution layer (staged: one pretend GPU); with
 *                                split in a communicator
 *                                split, with node in the split by node (ckv_comm_node_local)
 *   comm_ranks staged            the device communicator on the CPU backend with fake device ids:
 *                                equal ids choose the staged path on every rank and its all-reduce
 *                                and all-gather equal the host communicator's; host memory chooses
 *                                the host path
 *   comm_ranks tp MODEL_DIR [cuda|emu]
 *                                random weights from MODEL_DIR/config.json: prefill + greedy decode
 *                                at tp 1 (each rank alone) twice (identical) and at tp = ranks
 *                                through the staged device communicator (equal to tp 1); with cuda
 *                                on the CUDA backend through the communicator chosen for its GPUs
 *                                (ranks sharing a GPU: staged; one GPU each: NCCL); with emu on the
 *                                CUDA backend's CPU execution layer (device memory that is not the
 *                                host's to the model) through the staged path with the backend's
 *                                stream handed to it (exit 77 where the build has no such layer)
 * Exit 0 when every check passed. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ckv_test.h"
#include "comm/comm.h"
#include "engine/comm_backend.h"
#include "engine/sampler.h"
#include "engine/session.h"
#include "model/model.h"
#include "model/plan.h"
#ifdef CKV_TEST_CUDA_EMU /* the CUDA backend's kernels on the CPU (built when the CUDA sources are) */
#include "backend/cuda/cuda_emu.h"
#endif

static const char *fake_id_list; /* "a,b,c": rank r's device id is item r */

static ckv_status fake_device_id(void *ctx, char *id, size_t cap) {
    const ckv_comm *world = ctx;
    const char *p = fake_id_list;
    for (int r = 0; r < world->rank && p; r++) {
        p = strchr(p, ',');
        if (p) p++;
    }
    if (!p) return ckv_error(CKV_STATUS_ERR_ARG, "no fake device id for rank %d in '%s'", world->rank, fake_id_list);
    size_t n = strcspn(p, ",");
    snprintf(id, cap, "%.*s", (int)n, p);
    return CKV_STATUS_OK;
}

/* The CPU backend's memory seen as a device of its own, with fake ids: ckv_comm_device_io has one
 * context for every callback, so the backend's transfers are wrapped and device_id reads the rank
 * from the world communicator. */
typedef struct {
    ckv_backend *be;
    ckv_comm *world;
} io_ctx;
static ckv_status w_down(void *c, void *d, const void *s, size_t b) {
    ckv_backend *be = ((io_ctx *)c)->be;
    return be->ops->download(be, d, s, b);
}
static ckv_status w_up(void *c, void *d, const void *s, size_t b) {
    ckv_backend *be = ((io_ctx *)c)->be;
    return be->ops->upload(be, d, s, b);
}
static ckv_status w_copy(void *c, void *d, const void *s, size_t b) {
    ckv_backend *be = ((io_ctx *)c)->be;
    return be->ops->copy(be, d, s, b);
}
static ckv_status w_alloc(void *c, void **d, size_t b, const char *what) {
    ckv_backend *be = ((io_ctx *)c)->be;
    return be->ops->alloc(be, d, b, what);
}
static void w_release(void *c, void *d) {
    ckv_backend *be = ((io_ctx *)c)->be;
    be->ops->release(be, d);
}
static ckv_status w_id(void *c, char *id, size_t cap) { return fake_device_id(((io_ctx *)c)->world, id, cap); }

static ckv_comm_device_io make_io(io_ctx *x, const char *ids, int host_memory) {
    fake_id_list = ids;
    ckv_comm_device_io io = {.ctx = x, .host_memory = host_memory, .download = w_down, .upload = w_up, .copy = w_copy,
                             .alloc = w_alloc, .release = w_release, .device_id = w_id};
    return io;
}

/* The CUDA backend of this rank on its GPU (node-local rank modulo the GPUs: ranks may share one). */
static ckv_backend *cuda_backend(ckv_comm *world, int *dev) {
    ckv_backend *be = NULL;
    CHECK_OK(ckv_comm_select_gpu(world, dev));
    ckv_backend_params bp = {.name = "cuda", .n_threads = 1, .device = *dev};
    if (!ckv_test_failures) CHECK_OK(ckv_backend_init_params(&be, &bp));
    return be;
}

static int run_timeout(ckv_comm *world, double seconds, int cuda, int emu, const char *stall_in) {
    world->timeout_s = seconds;
    ckv_comm *c = world;
    ckv_backend *be = NULL;
    int dev = 0;
#ifdef CKV_TEST_CUDA_EMU
    if (emu) CHECK_OK(ckv_backend_cuda_emu_init(&be, 0));
#else
    if (emu) return CKV_SKIP_CODE;
#endif
    if (cuda || emu) { /* the device communicator over the CUDA backend's buffers */
        if (cuda) be = cuda_backend(world, &dev);
        if (be) CHECK_OK(ckv_comm_init_backend(&c, world, be, dev, 0));
        if (ckv_test_failures) return 1;
    }
    float v = 1.0f, *buf = &v;
    if (be) {
        CHECK_OK(be->ops->alloc(be, (void **)&buf, 64 * sizeof(float), "timeout test"));
        CHECK_OK(be->ops->upload(be, buf, &v, sizeof v));
    }
    CHECK_OK(ckv_comm_dev_allreduce_f32(c, buf, 1, CKV_COMM_OP_SUM));
    if (be) CHECK_OK(be->ops->download(be, &v, buf, sizeof v));
    CHECK(v == (float)world->size);
    fprintf(stderr, "rank %d: first all-reduce done (%g)\n", world->rank, (double)v);
    if (world->rank == world->size - 1) { /* stops participating */
        struct timespec ts = {(time_t)(seconds * 4 + 20), 0};
        nanosleep(&ts, NULL);
        return 0;
    }
    float w[64] = {0};
    ckv_status s = CKV_STATUS_OK;
    if (!strcmp(stall_in, "split")) { /* must not return */
        ckv_comm *sub = NULL;
        s = world->ops->split(world, 0, world->rank, &sub);
        ckv_comm_free(sub);
    } else if (!strcmp(stall_in, "node")) {
        int lr = 0, ls = 0;
        s = ckv_comm_node_local(world, &lr, &ls);
    } else {
        s = be ? ckv_comm_dev_allreduce_f32(c, buf, 64, CKV_COMM_OP_SUM)
               : world->ops->allreduce_f32(world, w, 64, CKV_COMM_OP_SUM);
    }
    if (be) CHECK_OK(be->ops->sync(be)); /* NCCL on the compute stream: the watchdog ends the job */
    fprintf(stderr, "rank %d: the %s returned %d instead of ending the job\n", world->rank,
            !strcmp(stall_in, "allreduce") ? "second all-reduce" : stall_in, (int)s);
    return 1;
}

static int run_staged(ckv_comm *world) {
    ckv_backend *be = NULL;
    CHECK_OK(ckv_backend_init(&be, "cpu", 1));
    if (!be) return 1;
    io_ctx x = {be, world};
    const int R = world->size, r = world->rank;
    /* every rank on "one GPU": staged */
    char same[256] = "", dist[256] = "";
    for (int i = 0; i < R; i++) {
        strcat(same, i ? ",gpu0" : "gpu0");
        char one[16];
        snprintf(one, sizeof one, "%sgpu%d", i ? "," : "", i);
        strcat(dist, one);
    }
    ckv_comm_device_io io = make_io(&x, same, 0);
    ckv_comm *dc = NULL;
    ckv_comm_device_params p = {.device = 0, .path = CKV_COMM_PATH_AUTO, .staging_bytes = 64, .workspace_bytes = 0};
    CHECK_OK(ckv_comm_init_device(&dc, world, &io, &p));
    if (!dc) return 1;
    CHECK_MSG(ckv_comm_device_path(dc) == CKV_COMM_PATH_STAGED, "path %s", ckv_comm_path_name(ckv_comm_device_path(dc)));
    CHECK(ckv_comm_has_device_ops(dc) && !strcmp(dc->kind, "staged") && dc->rank == r && dc->size == R);
    /* all-reduce of n floats (larger than the preallocated staging: it grows), sum and max */
    enum { N = 1000 };
    float host[N], ref[N], got[N];
    float *dev = NULL, *gdev = NULL;
    CHECK_OK(be->ops->alloc(be, (void **)&dev, sizeof host, "test"));
    CHECK_OK(be->ops->alloc(be, (void **)&gdev, sizeof host * (size_t)R, "test"));
    for (int op = 0; op < 2; op++) {
        for (int i = 0; i < N; i++) host[i] = (float)((i * 7 + r * 13) % 101) * 0.25f - 3.0f;
        memcpy(ref, host, sizeof ref);
        CHECK_OK(world->ops->allreduce_f32(world, ref, N, op ? CKV_COMM_OP_MAX : CKV_COMM_OP_SUM));
        CHECK_OK(be->ops->upload(be, dev, host, sizeof host));
        CHECK_OK(ckv_comm_dev_allreduce_f32(dc, dev, N, op ? CKV_COMM_OP_MAX : CKV_COMM_OP_SUM));
        CHECK_OK(be->ops->download(be, got, dev, sizeof got));
        ckv_test_allclose(op ? "staged all-reduce (max) vs MPI" : "staged all-reduce (sum) vs MPI", got, ref, N, 0, 0);
    }
    /* all-gather */
    float *gref = malloc(sizeof host * (size_t)R), *ggot = malloc(sizeof host * (size_t)R);
    for (int i = 0; i < N; i++) host[i] = (float)(r * N + i);
    CHECK_OK(be->ops->upload(be, dev, host, sizeof host));
    CHECK_OK(ckv_comm_dev_allgather(dc, dev, gdev, sizeof host));
    CHECK_OK(be->ops->download(be, ggot, gdev, sizeof host * (size_t)R));
    for (int i = 0; i < N * R; i++) gref[i] = (float)i;
    ckv_test_allclose("staged all-gather vs rank order", ggot, gref, (size_t)N * R, 0, 0);
    /* host collectives of the device communicator still take host buffers */
    int one = 1;
    CHECK_OK(dc->ops->allreduce_i32(dc, &one, 1, CKV_COMM_OP_SUM));
    CHECK(one == R);
    CHECK(dc->bytes > 0);
    void *ws = NULL;
    CHECK_OK(ckv_comm_dev_workspace(dc, 4096, &ws));
    CHECK(ws != NULL);
    ckv_comm_free(dc);
    /* distinct ids but device memory is host memory: the host path */
    io = make_io(&x, dist, 1);
    CHECK_OK(ckv_comm_init_device(&dc, world, &io, NULL));
    CHECK(dc && ckv_comm_device_path(dc) == CKV_COMM_PATH_HOST);
    if (dc) {
        for (int i = 0; i < N; i++) host[i] = 1.0f;
        CHECK_OK(be->ops->upload(be, dev, host, sizeof host));
        CHECK_OK(ckv_comm_dev_allreduce_f32(dc, dev, N, CKV_COMM_OP_SUM));
        CHECK_OK(be->ops->download(be, got, dev, sizeof got));
        for (int i = 0; i < N; i++) ref[i] = (float)R;
        ckv_test_allclose("host-path all-reduce", got, ref, N, 0, 0);
    }
    ckv_comm_free(dc);
    /* a missing fake id on one rank fails on that rank only with a clear message: not tested here
     * (the others would wait for it); bad arguments fail everywhere */
    ckv_comm_device_io bad = io;
    bad.download = NULL;
    CHECK_FAILS(ckv_comm_init_device(&dc, world, &bad, NULL), CKV_STATUS_ERR_ARG, "download/upload/copy");
    free(gref);
    free(ggot);
    be->ops->release(be, dev);
    be->ops->release(be, gdev);
    ckv_backend_free(be);
    return 0;
}

enum { PROMPT = 41, DECODE = 6 };

/* Prefill + greedy decode; logits [PROMPT + DECODE, V] and the greedy tokens [DECODE + 1]. */
static void run_model(const char *dir, ckv_backend *be, ckv_comm *tp, float *logits, int32_t *greedy) {
    ckv_model *m = NULL;
    CHECK_OK(ckv_model_load_random(&m, dir, be, tp, NULL, 1234));
    if (!m) return;
    const int V = m->cfg.vocab_size;
    int32_t ids[PROMPT];
    for (int i = 0; i < PROMPT; i++) ids[i] = (i * 37 + 11) % V;
    ckv_session s;
    CHECK_OK(ckv_session_init(&s, m, PROMPT + DECODE + 1, 16, 0));
    const float *last = NULL;
    CHECK_OK(ckv_session_prefill(&s, ids, PROMPT, logits, &last));
    greedy[0] = last ? ckv_argmax(last, V) : -1;
    for (int t = 0; t < DECODE && last; t++) {
        const float *lg = NULL;
        CHECK_OK(ckv_session_decode(&s, greedy[t], &lg));
        if (!lg) break;
        memcpy(logits + (size_t)(PROMPT + t) * V, lg, sizeof(float) * (size_t)V);
        greedy[t + 1] = ckv_argmax(lg, V);
    }
    ckv_session_free(&s);
    ckv_model_free(m);
}

static int run_tp(ckv_comm *world, const char *dir, int cuda, int emu) {
    ckv_backend *be = NULL;
    int dev = 0;
    if (cuda) be = cuda_backend(world, &dev);
#ifdef CKV_TEST_CUDA_EMU
    else if (emu) CHECK_OK(ckv_backend_cuda_emu_init(&be, 0));
#else
    else if (emu) return CKV_SKIP_CODE;
#endif
    else CHECK_OK(ckv_backend_init(&be, "cpu", 1));
    ckv_model_config cfg;
    CHECK_OK(ckv_config_load(&cfg, dir));
    if (!be || ckv_test_failures) return 1;
    const size_t n = (size_t)(PROMPT + DECODE) * (size_t)cfg.vocab_size;
    float *a = calloc(n, sizeof(float)), *b = calloc(n, sizeof(float)), *t = calloc(n, sizeof(float));
    int32_t ga[DECODE + 1], gb[DECODE + 1], gt[DECODE + 1];
    run_model(dir, be, NULL, a, ga);
    run_model(dir, be, NULL, b, gb);
    CHECK_MSG(!memcmp(a, b, n * sizeof(float)) && !memcmp(ga, gb, sizeof ga), "two tp 1 runs differ");
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += !isfinite(a[i]);
    CHECK_MSG(bad == 0, "%zu non-finite logits", bad);
    double mx = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(a[i]));
    CHECK_MSG(mx > 0.1 && mx < 1e3, "max |logit| %g: random weights should keep activations bounded", mx);
    /* tp = ranks: on the CPU through the staged device communicator, every rank "on one GPU"; on
     * the GPU through the communicator chosen for the real devices */
    io_ctx x = {be, world};
    char ids[256] = "";
    for (int i = 0; i < world->size; i++) strcat(ids, i ? ",gpu0" : "gpu0");
    ckv_comm_device_io io = make_io(&x, ids, 0);
    ckv_comm *dc = NULL;
    if (cuda) CHECK_OK(ckv_comm_init_backend(&dc, world, be, dev, ckv_plan_comm_workspace_bytes(&cfg, world->size)));
    else CHECK_OK(ckv_comm_init_device(&dc, world, &io, NULL));
    if (dc && !cuda) {
        /* what ckv_comm_init_backend does after the init: the backend's stream (cuda-emu: the
         * execution layer's; cpu: none) goes to the communicator, which stays staged and off it */
        CHECK_MSG((ckv_backend_stream(be) != NULL) == (be->device != CKV_DEVICE_HOST), "%s backend stream %p",
                  be->name, ckv_backend_stream(be));
        ckv_comm_use_backend_stream(dc, be);
        CHECK(ckv_comm_device_path(dc) == CKV_COMM_PATH_STAGED && !ckv_comm_device_on_stream(dc));
    }
    if (dc) {
        run_model(dir, be, dc, t, gt);
        char what[128];
        snprintf(what, sizeof what, "rank %d: tp %d (%s, %s) logits vs tp 1", world->rank, world->size, be->name,
                 ckv_comm_path_name(ckv_comm_device_path(dc)));
        /* a device backend keeps the KV cache in bf16: the partial sums' order moves logits by its
         * rounding (2^-8); greedy tokens must be equal */
        const double tol = be->device == CKV_DEVICE_HOST ? 2e-4 : 5e-3;
        ckv_test_allclose(what, t, a, n, tol, tol);
        CHECK_MSG(!memcmp(gt, ga, sizeof ga), "greedy tokens at tp %d differ from tp 1", world->size);
        fprintf(stderr, "rank %d: greedy %d %d %d %d %d %d %d, max |logit| %.3g\n", world->rank, gt[0], gt[1], gt[2], gt[3],
                gt[4], gt[5], gt[6], mx);
    }
    ckv_comm_free(dc);
    free(a);
    free(b);
    free(t);
    ckv_backend_free(be);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: comm_ranks timeout SECONDS [cuda|emu|split|node] | staged | tp MODEL_DIR [cuda|emu]\n");
        return 2;
    }
    ckv_comm *world = NULL;
    CHECK_OK(ckv_comm_init_mpi(&world, &argc, &argv));
    if (!world) return 1;
    int rc = 1;
    const int cuda = argc > 3 && !strcmp(argv[3], "cuda"), emu = argc > 3 && !strcmp(argv[3], "emu");
    const char *stall_in = argc > 3 && (!strcmp(argv[3], "split") || !strcmp(argv[3], "node")) ? argv[3] : "allreduce";
    if (!strcmp(argv[1], "timeout") && argc > 2) rc = run_timeout(world, atof(argv[2]), cuda, emu, stall_in);
    else if (!strcmp(argv[1], "staged")) rc = run_staged(world);
    else if (!strcmp(argv[1], "tp") && argc > 2) rc = run_tp(world, argv[2], cuda, emu);
    else fprintf(stderr, "comm_ranks: unknown mode '%s'\n", argv[1]);
    if (rc == CKV_SKIP_CODE) { /* the same on every rank */
        ckv_comm_free(world);
        return ckv_test_skip("this build has no CUDA execution layer (cuda-emu)");
    }
    /* every rank agrees on the outcome before finalising */
    int failed = rc != 0 || ckv_test_failures != 0;
    if (strcmp(argv[1], "timeout")) CHECK_OK(world->ops->allreduce_i32(world, &failed, 1, CKV_COMM_OP_MAX));
    char name[64];
    snprintf(name, sizeof name, "comm_ranks %s (rank %d)", argv[1], world->rank);
    ckv_comm_free(world);
    if (failed && !ckv_test_failures) ckv_test_failures = 1;
    return ckv_test_finish(name);
}
