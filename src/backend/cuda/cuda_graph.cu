/* cuda_graph.cu - recorded steps: the CUDA backend's cache of CUDA graphs behind graph_begin,
 * graph_end and graph_release (backend.h, family CKV_BACKEND_CAP_GRAPHS; docs/gpu.md §7). A step
 * is recorded by stream capture of the compute stream and replayed by one cudaGraphLaunch. The
 * cache holds GRAPH_SLOTS entries, each an owner (the caller's object), its key (bytes the caller
 * builds from everything the step's launch arguments depend on) and the instantiated graph; the
 * least recently used entry makes room. A key's first step runs as usual (its workspaces grow to
 * their size: cudaMalloc is refused in a capture), the second is recorded and launched, later ones
 * replay. A graph holds the workspaces' addresses: when grow() reallocates one (ws_gen moves), the
 * graphs recorded before are recorded again at their next use. It does not decide what a step is or
 * what its key holds (the engine does: engine/batch.c) and launches no kernel of its own.
 * CKV_CUDA_GRAPHS=0 (and CKV_CUDA_SYNC=1, whose waits cannot be captured) turns recording off. */
#include <stdio.h>
#include <string.h>

#include "cuda_internal.h"

extern "C" {
#include "core/alloc.h"
}

namespace CKV_CUDA_NS {

constexpr int GRAPH_SLOTS = 16;
constexpr size_t GRAPH_KEY_MAX = 2048; /* bytes; a longer key runs its steps unrecorded */

struct graph_slot {
    const void *owner;             /* NULL: free */
    size_t key_bytes;
    unsigned char key[GRAPH_KEY_MAX];
    cudaGraphExec_t exec;          /* NULL: the key ran once unrecorded */
    unsigned long long gen;        /* ws_gen when recorded */
    unsigned long long used;       /* clock of the last use */
};

namespace {

void slot_clear(graph_slot *s) {
    if (s->exec) cudaGraphExecDestroy(s->exec);
    s->exec = NULL;
    s->owner = NULL;
    s->key_bytes = 0;
    s->used = 0;
}

} // namespace

struct graph_cache {
    graph_slot slot[GRAPH_SLOTS];
    unsigned long long clock;
    int recording; /* the slot whose step is being captured, or -1 */
    int off;       /* recording off: CKV_CUDA_GRAPHS=0, CKV_CUDA_SYNC=1, or after a failed capture */
};

ckv_status graph_cache_init(ctx *c) {
    int on = 1;
    CKV_TRY(env_setting("CKV_CUDA_GRAPHS", 1, "0 (decode steps launch by launch) or 1 (recorded as CUDA graphs, the "
                        "default)", &on));
    void *mem = NULL;
    CKV_TRY(ckv_alloc(&mem, sizeof(graph_cache), "the CUDA graph cache"));
    graph_cache *g = (graph_cache *)mem;
    memset(g, 0, sizeof *g);
    g->recording = -1;
    g->off = !on || c->sync_each;
    c->graphs = g;
    return CKV_STATUS_OK;
}

void graph_cache_free(ctx *c) {
    graph_cache *g = c->graphs;
    if (!g) return;
    for (int i = 0; i < GRAPH_SLOTS; i++) slot_clear(&g->slot[i]);
    ckv_free(g);
    c->graphs = NULL;
}

ckv_status graph_begin(ckv_backend *be, const void *owner, const void *key, size_t key_bytes, int *replayed) {
    ctx *c = ctx_of(be);
    graph_cache *g = c->graphs;
    *replayed = 0;
    if (!g || g->off || !owner || key_bytes > GRAPH_KEY_MAX) return CKV_STATUS_OK;
    if (g->recording >= 0)
        return ckv_error(CKV_STATUS_ERR_INTERNAL, "%s backend: graph_begin while a step is being recorded",
                         CKV_CUDA_BACKEND_NAME);
    graph_slot *hit = NULL, *victim = &g->slot[0];
    for (int i = 0; i < GRAPH_SLOTS; i++) {
        graph_slot *s = &g->slot[i];
        if (s->owner == owner && s->key_bytes == key_bytes && memcmp(s->key, key, key_bytes) == 0) hit = s;
        if (s->used < victim->used) victim = s; /* free slots have used 0 */
    }
    g->clock++;
    if (!hit) { /* the key's first step: it runs as usual and sizes its workspaces */
        slot_clear(victim);
        victim->owner = owner;
        victim->key_bytes = key_bytes;
        memcpy(victim->key, key, key_bytes);
        victim->used = g->clock;
        return CKV_STATUS_OK;
    }
    hit->used = g->clock;
    if (hit->exec && hit->gen == c->ws_gen) {
        CKV_CUDA_CHECK(cudaGraphLaunch(hit->exec, c->stream), "launch the recorded step");
        c->last_op = "a recorded step (CUDA graph)";
        *replayed = 1;
        return CKV_STATUS_OK;
    }
    if (hit->exec) cudaGraphExecDestroy(hit->exec); /* a workspace moved since it was recorded */
    hit->exec = NULL;
    CKV_CUDA_CHECK(cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeGlobal), "begin recording the step");
    g->recording = (int)(hit - g->slot);
    return CKV_STATUS_OK;
}

ckv_status graph_end(ckv_backend *be, ckv_status step) {
    ctx *c = ctx_of(be);
    graph_cache *g = c->graphs;
    if (!g || g->recording < 0) return step;
    graph_slot *s = &g->slot[g->recording];
    g->recording = -1;
    cudaGraph_t graph = NULL;
    const cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
    if (step != CKV_STATUS_OK || e != cudaSuccess) {
        cudaGraphDestroy(graph);
        slot_clear(s);
        (void)cudaGetLastError(); /* the refused call's error, not a fault of the device */
        if (step != CKV_STATUS_OK) return step;
        /* a call of the step was refused (it waits for the device or allocates): the void op that
         * made it recorded why; the step never ran, and recording stays off from now on */
        g->off = 1;
        char why[320] = "a call of the step is not allowed in a capture";
        if (take_pending(c) != CKV_STATUS_OK) snprintf(why, sizeof why, "%s", ckv_error_message());
        return ckv_error(CKV_STATUS_ERR_DEVICE, "%s backend: recording the decode step as a CUDA graph failed (%s): %s; "
                         "CUDA graphs are off for this backend from now on (CKV_CUDA_GRAPHS=0 turns them off at the start)",
                         CKV_CUDA_BACKEND_NAME, cudaGetErrorName(e), why);
    }
    const cudaError_t ei = cudaGraphInstantiate(&s->exec, graph, 0);
    cudaGraphDestroy(graph);
    if (ei != cudaSuccess) {
        s->exec = NULL;
        slot_clear(s);
        return status_cuda(ei, "instantiate the recorded step");
    }
    s->gen = c->ws_gen;
    CKV_CUDA_CHECK(cudaGraphLaunch(s->exec, c->stream), "launch the recorded step");
    return CKV_STATUS_OK;
}

void graph_release(ckv_backend *be, const void *owner) {
    ctx *c = ctx_of(be);
    graph_cache *g = c->graphs;
    if (!g || !owner) return;
    for (int i = 0; i < GRAPH_SLOTS; i++)
        if (g->slot[i].owner == owner) slot_clear(&g->slot[i]);
}

} // namespace CKV_CUDA_NS
