/* cuda_backend.cu - the CUDA backend object: device selection and its checks (no GPU, compute
 * capability below 8.0), the compute stream, the cuBLAS handle and workspaces, the memory entries of
 * the op table, error recording and sync() (which reports the first failure of a void op, or an
 * asynchronous fault naming the op launched last), small uploads staged through a page-locked ring
 * so that they need not wait for the device, and the C entry points (the recorded steps' CUDA graphs
 * are cuda_graph.cu's). Compiled twice: by nvcc
 * for the GPU ("cuda") and by the host C++ compiler against the CPU execution layer ("cuda-emu",
 * entry point ckv_backend_cuda_emu_init). The kernels live in the other .cu files. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_internal.h"

extern "C" {
#include "core/alloc.h"
#include "core/timer.h"
}

namespace CKV_CUDA_NS {

ckv_status status_cuda(cudaError_t e, const char *what) {
    return ckv_error(CKV_STATUS_ERR_DEVICE, "%s backend: %s: %s (%s)", CKV_CUDA_BACKEND_NAME, what,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}

ckv_status status_cublas(cublasStatus_t e, const char *what) {
    return ckv_error(CKV_STATUS_ERR_DEVICE, "%s backend: %s: cuBLAS %s", CKV_CUDA_BACKEND_NAME, what,
                     cublasGetStatusString(e));
}

void record(ctx *c, ckv_status s) {
    if (s == CKV_STATUS_OK || c->pending != CKV_STATUS_OK) return;
    c->pending = s;
    snprintf(c->pending_msg, sizeof c->pending_msg, "%s", ckv_error_message());
}

cudaError_t stream_wait(ctx *c) {
    cudaError_t e = cudaStreamSynchronize(c->stream);
    if (e == cudaSuccess) c->stage_used = 0; /* every staged copy has run */
    return e;
}

ckv_status take_pending(ctx *c) {
    if (c->pending == CKV_STATUS_OK) return CKV_STATUS_OK;
    const ckv_status s = c->pending;
    c->pending = CKV_STATUS_OK;
    return ckv_error(s, "%s", c->pending_msg);
}

void op_done(ctx *c, const char *op) {
    const double entered = c->prof ? ckv_time_now() : 0.0;
    c->last_op = op;
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) record(c, status_cuda(e, op));
    if (c->sync_each) CKV_CUDA_OP_CHECK(c, stream_wait(c), op);
    if (c->prof) op_profile_add(c, op, entered);
}

ckv_status grow(ctx *c, void **buf, size_t *cap_bytes, size_t bytes, const char *what) {
    if (bytes <= *cap_bytes) return CKV_STATUS_OK;
    CKV_CUDA_CHECK(stream_wait(c), what); /* the old buffer may still be in use */
    ledger_sub(c, *buf);
    CKV_CUDA_CHECK(cudaFree(*buf), what);
    *buf = NULL;
    *cap_bytes = 0;
    cudaError_t e = cudaMalloc(buf, bytes);
    if (e != cudaSuccess)
        return ckv_error(CKV_STATUS_ERR_NOMEM, "%s backend: cannot allocate %zu bytes for %s: %s",
                         CKV_CUDA_BACKEND_NAME, bytes, what, cudaGetErrorString(e));
    ckv_status s = ledger_add(c, *buf, bytes, what);
    if (s != CKV_STATUS_OK) {
        cudaFree(*buf);
        *buf = NULL;
        return s;
    }
    *cap_bytes = bytes;
    c->ws_gen++;
    return CKV_STATUS_OK;
}

ckv_status env_setting(const char *name, int max, const char *expected, int *value) {
    const char *env = getenv(name);
    if (!env || !env[0]) return CKV_STATUS_OK;
    long v = 0;
    const char *p = env;
    for (; *p >= '0' && *p <= '9' && v <= max; p++) v = 10 * v + (*p - '0');
    if (*p || v > max)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: %s=%s: expected %s", CKV_CUDA_BACKEND_NAME, name, env, expected);
    *value = (int)v;
    return CKV_STATUS_OK;
}

namespace {

void be_free(ckv_backend *be) {
    if (!be) return;
    ctx *c = ctx_of(be);
    if (c) {
        if (c->stream) cudaStreamSynchronize(c->stream);
        op_profile_free(c);
        if (c->sync_each == 2) ledger_print(c);
        ledger_free(c);
        graph_cache_free(c);
        if (c->blas) cublasDestroy(c->blas);
        cudaFreeHost(c->stage);
        cudaFree(c->blas_ws);
        cudaFree(c->xbf);
        cudaFree(c->part);
        cudaFree(c->evict_ws);
        cudaFree(c->count);
        if (c->stream) cudaStreamDestroy(c->stream);
    }
    ckv_free(c);
    ckv_free(be);
}

ckv_status be_alloc(ckv_backend *be, void **ptr, size_t bytes, const char *what) {
    ctx *c = ctx_of(be); /* allocate on the backend's device, whichever thread calls */
    if (!ptr)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: alloc of %s without an output pointer",
                         CKV_CUDA_BACKEND_NAME, what ? what : "a buffer");
    *ptr = NULL;
    if (bytes == 0) return CKV_STATUS_OK;
    cudaError_t e = cudaMalloc(ptr, bytes);
    if (e != cudaSuccess) {
        *ptr = NULL;
        size_t free_b = 0, total_b = 0;
        cudaMemGetInfo(&free_b, &total_b);
        return ckv_error(CKV_STATUS_ERR_NOMEM, "%s backend: cannot allocate %zu bytes for %s (%zu of %zu bytes free): %s",
                         CKV_CUDA_BACKEND_NAME, bytes, what ? what : "a buffer", free_b, total_b,
                         cudaGetErrorString(e));
    }
    ckv_status s = ledger_add(c, *ptr, bytes, what ? what : "a buffer");
    if (s != CKV_STATUS_OK) {
        cudaFree(*ptr);
        *ptr = NULL;
    }
    return s;
}

void be_release(ckv_backend *be, void *ptr) {
    if (!ptr) return;
    ctx *c = ctx_of(be);
    stream_wait(c); /* kernels still queued may use it */
    ledger_sub(c, ptr);
    CKV_CUDA_OP_CHECK(c, cudaFree(ptr), "release");
}

/* Staging: an upload of at most STAGE_MAX bytes is copied into the page-locked ring and queued from
 * there, so the host returns at once and the caller may reuse its buffer (the contract of upload).
 * The ring is reused only after the host has waited for the stream: when the bytes staged since
 * the last wait would not fit, this waits first. A decode step stages a few hundred bytes, so it
 * never waits here; larger uploads (weights) go through the pageable path, which waits. */
constexpr size_t STAGE_BYTES = (size_t)4 << 20;
constexpr size_t STAGE_MAX = STAGE_BYTES / 8;
constexpr size_t STAGE_ALIGN = 64;

/* src [bytes] copied into the ring; *staged its copy there, or NULL: too large to stage. */
ckv_status stage_upload(ctx *c, const void *src, size_t bytes, const void **staged, const char *what) {
    *staged = NULL;
    if (!c->stage || bytes > STAGE_MAX) return CKV_STATUS_OK;
    const size_t need = (bytes + STAGE_ALIGN - 1) & ~(STAGE_ALIGN - 1);
    size_t off = c->stage_off, skip = 0;
    if (off + need > c->stage_cap) skip = c->stage_cap - off, off = 0; /* wrap: the tail stays unused */
    if (c->stage_used + skip + need > c->stage_cap) {
        CKV_CUDA_CHECK(stream_wait(c), what); /* the oldest staged copies may not have run yet */
        off = 0;
        skip = 0;
    }
    memcpy(c->stage + off, src, bytes);
    c->stage_off = off + need;
    c->stage_used += skip + need;
    *staged = c->stage + off;
    return CKV_STATUS_OK;
}

ckv_status be_copy_kind(ckv_backend *be, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                        const char *what) {
    if (bytes == 0) return CKV_STATUS_OK;
    if (!dst || !src)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: %s of %zu bytes with a NULL %s pointer",
                         CKV_CUDA_BACKEND_NAME, what, bytes, dst ? "source" : "destination");
    ctx *c = ctx_of(be);
    if (kind == cudaMemcpyHostToDevice) {
        const void *staged = NULL;
        CKV_TRY(stage_upload(c, src, bytes, &staged, what));
        if (staged) {
            CKV_CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, kind, c->stream), what);
            return CKV_STATUS_OK;
        }
    }
    CKV_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, c->stream), what);
    if (kind == cudaMemcpyDeviceToDevice) return CKV_STATUS_OK;
    if (kind == cudaMemcpyDeviceToHost) {
        /* into pageable memory the call returned once the copy was done, so the stream's earlier
         * work is done too (and a fault of it was the call's error): no second wait */
        c->stage_used = 0;
    } else {
        CKV_CUDA_CHECK(stream_wait(c), what); /* the pageable source may be reused at once */
    }
    return take_pending(c); /* a void op queued before failed: its result is not there */
}

ckv_status be_upload(ckv_backend *be, void *dst, const void *src, size_t bytes) {
    return be_copy_kind(be, dst, src, bytes, cudaMemcpyHostToDevice, "upload");
}
ckv_status be_download(ckv_backend *be, void *dst, const void *src, size_t bytes) {
    return be_copy_kind(be, dst, src, bytes, cudaMemcpyDeviceToHost, "download");
}
ckv_status be_copy(ckv_backend *be, void *dst, const void *src, size_t bytes) {
    return be_copy_kind(be, dst, src, bytes, cudaMemcpyDeviceToDevice, "copy");
}

ckv_status be_sync(ckv_backend *be) {
    ctx *c = ctx_of(be);
    CKV_TRY(take_pending(c));
    cudaError_t e = stream_wait(c);
    if (e != cudaSuccess)
        return ckv_error(CKV_STATUS_ERR_DEVICE,
                         "%s backend: %s: %s (%s; asynchronous, surfaced at sync; CKV_CUDA_SYNC=1 names the exact op)",
                         CKV_CUDA_BACKEND_NAME, c->last_op ? c->last_op : "sync", cudaGetErrorString(e),
                         cudaGetErrorName(e));
    return CKV_STATUS_OK;
}

/* the compute stream every op is queued on (device communicators enqueue their collectives behind
 * the kernels on it); the backend keeps ownership */
void *be_stream(ckv_backend *be) { return (void *)ctx_of(be)->stream; }

ckv_status be_device_id(ckv_backend *be, char *id, size_t cap) {
    char bus[64] = "";
    CKV_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, (int)sizeof bus, ctx_of(be)->device), "device id");
    snprintf(id, cap, "%s", bus);
    return CKV_STATUS_OK;
}

void mem_usage(ckv_backend *be, ckv_backend_mem *out) { ledger_usage(ctx_of(be), out); }

int be_weight_dtype_ok(const ckv_backend *be, ckv_dtype t) {
    (void)be;
    return t == CKV_DTYPE_BF16 || t == CKV_DTYPE_F32;
}

int be_kv_dtype_ok(const ckv_backend *be, ckv_dtype t) {
    (void)be;
    return t == CKV_DTYPE_BF16 || t == CKV_DTYPE_F32;
}

ckv_backend_ops make_ops() {
    ckv_backend_ops o;
    memset(&o, 0, sizeof o);
    o.caps = CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_STREAM) | CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_DEVICE_ID) |
             CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_EVICT_RESERVE) | CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_KEYDIFF) |
             CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_LAGKV) | CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_CUR) |
             CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_LEVERAGE) | CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_CHUNK_COLSUM) |
             CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_GRAPHS) | CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_KVZIP) |
             CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_CHUNK_RANK) | CKV_BACKEND_CAP_BIT(CKV_BACKEND_CAP_MEM_USAGE);
    o.free = be_free;
    o.alloc = be_alloc;
    o.alloc_raw = be_alloc; /* cudaMalloc does not clear */
    o.release = be_release;
    o.upload = be_upload;
    o.download = be_download;
    o.copy = be_copy;
    o.sync = be_sync;
    o.stream = be_stream;
    o.device_id = be_device_id;
    o.weight_dtype_ok = be_weight_dtype_ok;
    o.kv_dtype_ok = be_kv_dtype_ok;
    o.embedding = embedding;
    o.rmsnorm = rmsnorm;
    o.matmul = matmul;
    o.rope = rope;
    o.kv_store = kv_store;
    o.attention = attention;
    o.swiglu = swiglu;
    o.add = add;
    o.count_nonfinite = count_nonfinite;
    o.kv_gather = kv_gather;
    o.kv_rerotate = kv_rerotate;
    o.evict_attn_colsum = evict_attn_colsum;
    o.evict_attn_probs = evict_attn_probs;
    o.evict_colsum_finish = evict_colsum_finish;
    o.evict_pool = evict_pool;
    o.evict_head_sum = evict_head_sum;
    o.evict_div = evict_div;
    o.evict_row_norm = evict_row_norm;
    o.evict_add_mul = evict_add_mul;
    o.evict_value_norm = evict_value_norm;
    o.evict_fill = evict_fill;
    o.evict_random = evict_random;
    o.evict_max = evict_max;
    o.evict_topk = evict_topk;
    o.evict_scatter = evict_scatter;
    o.evict_topk_counts = evict_topk_counts;
    o.evict_defensive_rows = evict_defensive_rows;
    o.evict_moments = evict_moments;
    o.evict_ea_logits = evict_ea_logits;
    o.evict_softmax_add = evict_softmax_add;
    o.evict_reserve = evict_reserve;
    o.evict_keydiff = evict_keydiff;
    o.evict_lagkv = evict_lagkv;
    o.evict_cur = evict_cur;
    o.evict_leverage = evict_leverage;
    o.evict_affine = evict_affine;
    o.evict_chunk_colsum = evict_chunk_colsum;
    o.evict_kvzip = evict_kvzip;
    o.evict_kvzip_norms = evict_kvzip_norms;
    o.evict_chunk_rank = evict_chunk_rank;
    o.evict_row_stats = evict_row_stats;
    o.sample = sample;
    o.graph_begin = graph_begin;
    o.graph_end = graph_end;
    o.graph_release = graph_release;
    o.mem_usage = mem_usage;
    return o;
}

const ckv_backend_ops the_ops = make_ops();


ckv_status init_device(ctx *c, int device) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0)
        return ckv_error(CKV_STATUS_ERR_DEVICE, "%s backend: no CUDA GPU is visible (%s)", CKV_CUDA_BACKEND_NAME,
                         e != cudaSuccess ? cudaGetErrorString(e) : "device count 0");
    if (device < 0) device = 0;
    if (device >= count)
        return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: --device %d: only %d GPU(s) visible (0..%d)",
                         CKV_CUDA_BACKEND_NAME, device, count, count - 1);
    c->device = device;
    CKV_CUDA_CHECK(cudaSetDevice(device), "select the GPU");
    CKV_CUDA_CHECK(cudaDeviceGetAttribute(&c->cc_major, cudaDevAttrComputeCapabilityMajor, device), "query the GPU");
    CKV_CUDA_CHECK(cudaDeviceGetAttribute(&c->cc_minor, cudaDevAttrComputeCapabilityMinor, device), "query the GPU");
    CKV_CUDA_CHECK(cudaDeviceGetAttribute(&c->sms, cudaDevAttrMultiProcessorCount, device), "query the GPU");
    if (c->cc_major < 8)
        return ckv_error(CKV_STATUS_ERR_UNSUPPORTED,
                         "%s backend: GPU %d has compute capability %d.%d; ckv needs 8.0 or newer (A100, H100/H200)",
                         CKV_CUDA_BACKEND_NAME, device, c->cc_major, c->cc_minor);
    CKV_CUDA_CHECK(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "create the compute stream");
    CKV_CUBLAS_CHECK(cublasCreate(&c->blas), "create the cuBLAS handle");
    CKV_CUBLAS_CHECK(cublasSetStream(c->blas, c->stream), "set the cuBLAS stream");
    c->blas_ws_bytes = ckv_gpu_blas_ws_bytes(c->cc_major); /* the fixed workspaces: backend/gpu_workspace.h */
    CKV_CUDA_CHECK(cudaMalloc(&c->blas_ws, c->blas_ws_bytes), "allocate the cuBLAS workspace");
    CKV_TRY(ledger_add(c, c->blas_ws, c->blas_ws_bytes, "the cuBLAS workspace"));
    CKV_CUBLAS_CHECK(cublasSetWorkspace(c->blas, c->blas_ws, c->blas_ws_bytes), "set the cuBLAS workspace");
    CKV_TRY(grow(c, (void **)&c->xbf, &c->xbf_cap, ckv_gpu_gemm_ws_bytes(0, 0), "the GEMM activation workspace"));
    CKV_TRY(grow(c, (void **)&c->part, &c->part_cap, prefill_split_bytes(c->sms), "the split-KV partials"));
    CKV_CUDA_CHECK(cudaMalloc((void **)&c->count, sizeof *c->count), "allocate the counter");
    CKV_TRY(ledger_add(c, c->count, sizeof *c->count, "the non-finite counter"));
    CKV_CUDA_CHECK(cudaMallocHost((void **)&c->stage, STAGE_BYTES), "allocate the page-locked upload ring");
    c->stage_cap = STAGE_BYTES;
    (void)cudaGetLastError(); /* a stale error of an earlier call in this process is not ours */
    return CKV_STATUS_OK;
}

ckv_status backend_init(ckv_backend **out, int device) {
    if (!out) return ckv_error(CKV_STATUS_ERR_ARG, "%s backend: init without an output pointer", CKV_CUDA_BACKEND_NAME);
    *out = NULL;
    void *mem = NULL;
    CKV_TRY(ckv_alloc(&mem, sizeof(ckv_backend), "the cuda backend"));
    ckv_backend *be = (ckv_backend *)mem;
    memset(be, 0, sizeof *be);
    be->ops = &the_ops;
    be->name = CKV_CUDA_BACKEND_NAME;
    be->device = CKV_DEVICE_GPU;
    be->n_threads = 1;
    be->weight_dtype = CKV_DTYPE_BF16;
    be->kv_dtype = CKV_DTYPE_BF16;
    ckv_status s = ckv_alloc(&be->ctx, sizeof(ctx), "the cuda backend context");
    if (s != CKV_STATUS_OK) {
        be_free(be);
        return s;
    }
    ctx *c = ctx_of(be);
    memset(c, 0, sizeof *c);
    char splits[96];
    snprintf(splits, sizeof splits, "0 (planned), 1 (off) or a split count up to %d", MERGE_MAX_SPLITS);
    s = env_setting("CKV_CUDA_SYNC", 2,
                    "0 (ops queue on the stream, the default), 1 (a wait after every op) or 2 (the same, and a "
                    "per-op profile printed at exit)",
                    &c->sync_each);
    if (s == CKV_STATUS_OK && c->sync_each == 2) s = op_profile_init(c);
    /* tests and measurements: force the prefill's split-K */
    if (s == CKV_STATUS_OK) s = env_setting("CKV_CUDA_PREFILL_SPLITS", MERGE_MAX_SPLITS, splits, &c->prefill_splits);
    if (s != CKV_STATUS_OK) {
        be_free(be);
        return s;
    }
    int decode_mma = 1; /* tests and measurements: 0 runs the FMA decode kernel everywhere */
    s = env_setting("CKV_CUDA_DECODE_MMA", 1,
                    "1 (the tensor-core decode kernel where it fits, the default) or 0 (the FMA kernel)", &decode_mma);
    if (s != CKV_STATUS_OK) {
        be_free(be);
        return s;
    }
    c->decode_fma = !decode_mma;
    s = init_device(c, device);
    if (s == CKV_STATUS_OK) s = graph_cache_init(c);
    if (s != CKV_STATUS_OK) {
        be_free(be);
        return s;
    }
    *out = be;
    return CKV_STATUS_OK;
}

} // namespace
} // namespace CKV_CUDA_NS

#if defined(CKV_CUDA_EMU)
/* The emulated backend: tests only (tests/cuda). */
#include "emu/emu_profile.h"
extern "C" {
#include "cuda_emu.h"
}
ckv_status ckv_backend_cuda_emu_init(ckv_backend **out, int device_index) {
    ckv_emu::ckv_emu_profile_from_env(); /* CKV_EMU_PROFILE=1: per-kernel traffic counters, printed at exit */
    return CKV_CUDA_NS::backend_init(out, device_index);
}
void ckv_cuda_emu_set_devices(int count, int major, int minor) { ckv_emu::ckv_emu_set_devices(count, major, minor); }
void ckv_cuda_emu_set_sms(int sms) { ckv_emu::ckv_emu_set_sms(sms); }
void ckv_cuda_emu_inject_fault(const char *kernel) { ckv_emu::ckv_emu_inject_fault(kernel); }
void ckv_cuda_emu_reset(void) { ckv_emu::ckv_emu_reset(); }
unsigned long long ckv_cuda_emu_alloc_calls(void) { return ckv_emu::ckv_emu_alloc_calls(); }
unsigned long long ckv_cuda_emu_host_waits(void) { return ckv_emu::ckv_emu_host_waits(); }
void ckv_cuda_emu_launches(unsigned long long *kernels, unsigned long long *gemms) {
    ckv_emu::ckv_emu_launches(kernels, gemms);
}
ckv_status ckv_cuda_emu_move_workspace(ckv_backend *be) {
    if (!be || be->ops != &CKV_CUDA_NS::the_ops || !be->ctx)
        return ckv_error(CKV_STATUS_ERR_ARG, "ckv_cuda_emu_move_workspace: not a %s backend", CKV_CUDA_BACKEND_NAME);
    CKV_CUDA_NS::ctx *c = CKV_CUDA_NS::ctx_of(be);
    return CKV_CUDA_NS::grow(c, (void **)&c->part, &c->part_cap, 2 * c->part_cap, "the split-KV partials (moved)");
}
void ckv_cuda_emu_graph_counts(unsigned long long *captures, unsigned long long *launches) {
    ckv_emu::ckv_emu_graph_counts(captures, launches);
}
int ckv_cuda_emu_capture_begin(void *stream) {
    return (int)ckv_emu::cudaStreamBeginCapture((ckv_emu::cudaStream_t)stream, ckv_emu::cudaStreamCaptureModeGlobal);
}
int ckv_cuda_emu_capture_end(void *stream) {
    ckv_emu::cudaGraph_t g = NULL;
    const ckv_emu::cudaError_t e = ckv_emu::cudaStreamEndCapture((ckv_emu::cudaStream_t)stream, &g);
    ckv_emu::cudaGraphDestroy(g);
    ckv_emu::cudaGetLastError(); /* the refused call's error: not the device's */
    return (int)e;
}
#else
extern "C" int ckv_backend_cuda_available(void) { return 1; }
extern "C" ckv_status ckv_backend_cuda_init(ckv_backend **out, int device_index) {
    return CKV_CUDA_NS::backend_init(out, device_index);
}
#endif
