/* emu_graph.cpp - stream capture and graphs of the CPU execution layer (ckv_emu.h; docs/gpu.md §7,
 * "Graphs on the CPU execution layer"): a capture records the work queued on its stream (and on
 * the streams that joined it through an event) as nodes, each the same closure the stream would
 * have run, holding the launch's kernel and arguments, the copy's pointers, the memset's value;
 * cudaGraphInstantiate shares them with the executable graph and cudaGraphLaunch queues them as one
 * piece of work that runs them in capture order (a legal order of the graph's dependencies, which
 * are the stream order). While a capture is open, a call that makes the host wait is refused and
 * the capture invalidated (capture_refuse), as in CUDA's global capture mode. Not modelled: the
 * thread-local and relaxed modes, child graphs, cudaGraphExecUpdate, node queries and edits. The
 * queues, the launches themselves and the other refusals' call sites are ckv_emu.cpp's. */
#include "emu_internal.h"

#include <algorithm>

namespace ckv_emu {

typedef std::vector<std::function<void()>> node_list;

struct capture {
    uint64_t id;                          /* capture_id */
    ckv_emu_stream *origin;
    std::vector<ckv_emu_stream *> joined; /* streams that waited on an event recorded in it */
    std::shared_ptr<node_list> nodes = std::make_shared<node_list>();
    bool invalid = false;
};

struct ckv_emu_graph {
    int device;
    std::shared_ptr<const node_list> nodes;
};

struct ckv_emu_graph_exec {
    int device;
    std::shared_ptr<const node_list> nodes; /* shared with work queued by launches not yet run */
};

static std::vector<capture *> g_open;                 /* open captures */
static unsigned long long g_captures, g_graph_launches; /* ckv_emu_graph_counts */
static uint64_t g_next_id = 1;

void capture_record(ckv_emu_stream *s, std::function<void()> fn) { s->cap->nodes->push_back(std::move(fn)); }

cudaError_t capture_refuse(void) {
    if (g_open.empty()) return cudaSuccess;
    for (capture *c : g_open) c->invalid = true;
    return cudaErrorStreamCaptureUnsupported;
}

uint64_t capture_id(const ckv_emu_stream *s) { return s->cap ? s->cap->id : 0; }

cudaError_t capture_wait(ckv_emu_stream *s, uint64_t id) {
    capture *c = NULL;
    for (capture *o : g_open)
        if (id && o->id == id) c = o;
    if (s->cap) {
        if (c == s->cap) return cudaSuccess; /* already ordered: nodes run in capture order */
        s->cap->invalid = true;
        return cudaErrorStreamCaptureIsolation;
    }
    if (c) { /* fork: s joins the capture until it ends */
        s->cap = c;
        c->joined.push_back(s);
    }
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t st, cudaStreamCaptureMode mode) {
    LOCKED;
    if (!st) return cudaErrorStreamCaptureUnsupported; /* the legacy stream cannot be captured */
    if (mode != cudaStreamCaptureModeGlobal) return cudaErrorInvalidValue;
    if (st->cap) return cudaErrorIllegalState;
    capture *c = new capture;
    c->id = g_next_id++;
    c->origin = st;
    st->cap = c;
    g_open.push_back(c);
    return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *graph) {
    LOCKED;
    *graph = NULL;
    if (!st || !st->cap) return cudaErrorIllegalState;
    capture *c = st->cap;
    if (c->origin != st) {
        c->invalid = true;
        return cudaErrorStreamCaptureUnmatched;
    }
    st->cap = NULL;
    for (ckv_emu_stream *j : c->joined) j->cap = NULL;
    g_open.erase(std::find(g_open.begin(), g_open.end(), c));
    const bool invalid = c->invalid;
    if (!invalid) {
        *graph = new ckv_emu_graph{st->device, c->nodes};
        g_captures++;
    }
    delete c;
    return invalid ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t st, cudaStreamCaptureStatus *status) {
    LOCKED;
    const capture *c = st ? st->cap : NULL;
    *status = !c ? cudaStreamCaptureStatusNone : c->invalid ? cudaStreamCaptureStatusInvalidated
                                                            : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long flags) {
    LOCKED;
    *exec = NULL;
    if (!graph || flags) return cudaErrorInvalidValue;
    *exec = new ckv_emu_graph_exec{graph->device, graph->nodes};
    return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t st) {
    LOCKED;
    if (!exec) return cudaErrorInvalidResourceHandle;
    ckv_emu_stream *s = stream_of(st);
    if (s->device != exec->device) return cudaErrorInvalidValue;
    if (mach().devs[s->device].sticky) return mach().devs[s->device].sticky;
    if (!s->cap) g_graph_launches++;
    std::shared_ptr<const node_list> nodes = exec->nodes;
    stream_push(s, [nodes] {
        for (const std::function<void()> &n : *nodes) n();
    });
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
    LOCKED;
    delete exec;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
    LOCKED;
    delete graph;
    return cudaSuccess;
}

void ckv_emu_graph_counts(unsigned long long *captures, unsigned long long *launches) {
    LOCKED;
    if (captures) *captures = g_captures;
    if (launches) *launches = g_graph_launches;
}

} // namespace ckv_emu
