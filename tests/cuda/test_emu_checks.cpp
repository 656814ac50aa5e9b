/* test_emu_checks.cpp - the CPU execution layer's checks (CKV_EMU_CHECK=1, set here) on planted
 * bugs: each kernel below has one bug a GPU would not report, and each must fail its launch with
 * a message naming the check, the kernel and what went wrong (a missing __syncthreads, a read past
 * a tile, an index past one __shared__ array into the next, an unwritten shared word, a cross-block
 * write race, a kernel memcpy past its buffer, a memset racing with reads, lanes ordered by other
 * __syncwarp masks than the writers', host and freed pointers); the same kernels without the bug,
 * a partial-mask __syncwarp exchange, race-free reductions and atomics across blocks must pass. racecheck and initcheck need the
 * instrumented build (CKV_EMU_INSTRUMENT): without it those cases are skipped with a note, and
 * the run-time checks (pointer arguments, red zones) still run. Also the observer interface: it
 * sees every access of a kernel with the lanes of a warp-wide load grouped by site and seq.
 * Built only for the emulator (label cuda-emu): on a GPU these kernels are undefined behaviour. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rt.h"

#include "emu_test.h"

static void upload_iota(float *d, size_t n) {
    float *h = (float *)malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = (float)i;
    if (cudaMemcpy(d, h, n * sizeof(float), cudaMemcpyHostToDevice) != cudaSuccess) abort();
    free(h);
}

/* The launch must fail with `code` and a message holding every needle; then the device is reset. */
template <typename K> static void expect_finding(const char *what, K launch, cudaError_t code, const char *n1,
                                                 const char *n2, const char *n3) {
    launch();
    cudaError_t e = cudaDeviceSynchronize();
    const char *msg = cudaGetErrorString(e);
    const bool ok = e == code && strstr(msg, n1) && strstr(msg, n2) && strstr(msg, n3);
    EXPECT(ok, "%s: %s: %s (wanted %s with \"%s\", \"%s\", \"%s\")", what, cudaGetErrorName(e), msg,
           cudaGetErrorName(code), n1, n2, n3);
    if (ok) fprintf(stderr, "ok   %s caught: %s\n", what, msg);
    ckv_emu_reset();
}

template <typename K> static void expect_clean(const char *what, K launch) {
    launch();
    cudaError_t e = cudaDeviceSynchronize();
    EXPECT(e == cudaSuccess, "%s: a false finding: %s", what, cudaGetErrorString(e));
    if (e == cudaSuccess) fprintf(stderr, "ok   %s: no finding\n", what);
    ckv_emu_reset();
}

/* ---- planted bugs ------------------------------------------------------------------------------ */

/* Each thread stores its value, then reads its neighbour's: the __syncthreads between is missing
 * (the buffer is cleared first, so this is a race, not an uninitialised read). */
__global__ void missing_sync_kernel(float *out, const float *in) {
    __shared__ float s[128];
    const int t = (int)threadIdx.x, i = (int)blockIdx.x * 128 + t;
    s[t] = 0.0f;
    __syncthreads();
    s[t] = in[i];
    /* __syncthreads() belongs here */
    out[i] = s[(t + 1) % 128];
}

__global__ void with_sync_kernel(float *out, const float *in) {
    __shared__ float s[128];
    const int t = (int)threadIdx.x, i = (int)blockIdx.x * 128 + t;
    s[t] = in[i];
    __syncthreads();
    out[i] = s[(t + 1) % 128];
}

/* A 64-wide tile of each row loaded with an off-by-one bound: the last block reads past the array. */
__global__ void tile_overrun_kernel(float *out, const float *in, int n) {
    __shared__ float tile[65];
    const int t = (int)threadIdx.x, base = (int)blockIdx.x * 64;
    if (t <= 64 && base + t <= n) tile[t] = in[base + t]; /* "<=": one element too many */
    __syncthreads();
    if (t < 64 && base + t < n) out[base + t] = tile[t] + tile[t + 1];
}

/* The tile is filled for 63 of its 64 words; the reduction reads all 64. */
__global__ void unwritten_shared_kernel(float *out, const float *in) {
    __shared__ float s[64];
    const int t = (int)threadIdx.x;
    if (t < 63) s[t] = in[t];
    __syncthreads();
    if (t == 0) {
        float acc = 0.0f;
        for (int i = 0; i < 64; i++) acc += s[i];
        out[0] = acc;
    }
}

/* Every block writes the same word without an atomic. */
__global__ void cross_block_kernel(float *out) {
    if (threadIdx.x == 0) out[0] = (float)blockIdx.x;
}

/* The same, done right: one atomicAdd per block. */
__global__ void atomic_kernel(unsigned long long *count) {
    if (threadIdx.x == 0) atomicAdd(count, 1ull);
}

__global__ void copy_kernel(float *out, const float *in, int n) {
    const int i = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) out[i] = in[i];
}

/* A pointer hidden in a struct argument (not seen by the launch's argument check). */
struct wrapped {
    const float *p;
};
__global__ void wrapped_kernel(float *out, wrapped w) { out[threadIdx.x] = w.p[threadIdx.x]; }

/* A constant table in kernel code (constant memory on a device): no finding. */
__global__ void table_kernel(float *out) {
    static const float table[4] = {1.0f, 2.0f, 4.0f, 8.0f};
    out[threadIdx.x] = table[threadIdx.x % 4];
}

/* Writes one element past its buffer. */
__global__ void write_past_kernel(float *out, int n) {
    const int i = (int)threadIdx.x;
    if (i <= n) out[i] = 1.0f;
}

/* Two __shared__ arrays; the first is filled with an off-by-one bound, so thread 32 writes one word
 * past it (into the memory beside the second on a device). The overrun is the point: a host compiler
 * that sees it (g++ 13 and later) must not refuse the file. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#endif
__global__ void shared_overrun_kernel(float *out, const float *in, int n) {
    __shared__ float first[32];
    __shared__ float second[32];
    const int t = (int)threadIdx.x;
    if (t < 32) second[t] = 0.0f;
    if (t <= n) first[t] = in[t]; /* "<=": one element too many (n = 32) */
    __syncthreads();
    if (t < 32) out[t] = first[t] + second[t];
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

/* Thread 0 copies a row with memcpy and one element too many: the copy reads past the input. */
__global__ void memcpy_past_kernel(float *out, const float *in, int n) {
    if (threadIdx.x == 0) memcpy(out, in, (size_t)(n + 1) * sizeof(float));
}

/* __shared__ cleared by memset in thread 0, then read by all: clean (a memset is a write); without
 * the barrier the memset races with the reads. */
template <bool SYNC> __global__ void memset_shared_kernel(float *out, int n) {
    __shared__ float s[64];
    if (threadIdx.x == 0) memset(s, 0, (size_t)n * sizeof(float));
    if (SYNC) __syncthreads();
    out[threadIdx.x] = s[threadIdx.x] + 1.0f;
}

/* Lanes 0-15 exchange words under __syncwarp(0x0000ffff): ordered, clean. In the planted version
 * lanes 16-31 read what lanes 0-15 wrote, but synchronise only among themselves
 * (__syncwarp(0xffff0000)): no collective orders the writers and the readers, a race. */
template <bool BUG> __global__ void syncwarp_mask_kernel(float *out, const float *in) {
    __shared__ float s[32];
    const unsigned lane = threadIdx.x;
    if (lane < 16) {
        s[lane] = in[lane];
        __syncwarp(0x0000ffffu);
        out[lane] = s[lane ^ 1u];
    } else {
        __syncwarp(0xffff0000u);
        out[lane] = BUG ? s[lane - 16] : 0.0f;
    }
}

static void test_findings() {
    const bool inst = ckv_emu_instrumented() != 0;
    float *in = dev_floats(256), *out = dev_floats(256);
    upload_iota(in, 256);
    if (inst) {
        expect_finding("missing __syncthreads",
                       [&] { CKV_LAUNCH(missing_sync_kernel, dim3(2), dim3(128), 0, (cudaStream_t)NULL, out, in); },
                       cudaErrorLaunchFailure, "kernel missing_sync_kernel", "racecheck: ",
                       "(__shared__ missing_sync_kernel(float*, float const*)::s, byte ");
    } else {
        fprintf(stderr, "skip racecheck / initcheck / host-memory cases: kernels not instrumented (CKV_EMU_INSTRUMENT=OFF)\n");
    }
    in = dev_floats(256), out = dev_floats(256);
    upload_iota(in, 256);
    expect_clean("the same exchange with __syncthreads",
                 [&] { CKV_LAUNCH(with_sync_kernel, dim3(2), dim3(128), 0, (cudaStream_t)NULL, out, in); });

    if (inst) {
        in = dev_floats(200), out = dev_floats(200);
        upload_iota(in, 200);
        expect_finding("a read past a tile",
                       [&] { CKV_LAUNCH(tile_overrun_kernel, dim3(4), dim3(96), 0, (cudaStream_t)NULL, out, in, 200); },
                       cudaErrorIllegalAddress, "kernel tile_overrun_kernel, block (3,0,0)",
                       "memcheck: read of 4 bytes", "4 bytes past the end of a 800-byte device allocation");

        in = dev_floats(64), out = dev_floats(1);
        upload_iota(in, 64);
        expect_finding("an unwritten __shared__ word",
                       [&] { CKV_LAUNCH(unwritten_shared_kernel, dim3(1), dim3(64), 0, (cudaStream_t)NULL, out, in); },
                       cudaErrorLaunchFailure, "kernel unwritten_shared_kernel",
                       "initcheck: read of 4 bytes at 0x",
                       "::s, byte 252 of 256) by thread (0,0,0): byte 0 was not written by this block");

        out = dev_floats(1);
        expect_finding("a cross-block write race",
                       [&] { CKV_LAUNCH(cross_block_kernel, dim3(8), dim3(32), 0, (cudaStream_t)NULL, out); },
                       cudaErrorLaunchFailure, "kernel cross_block_kernel", "racecheck: write of 4 bytes",
                       "of another block of the same launch");

        in = dev_floats(64), out = dev_floats(64); /* never written: cudaMalloc'd garbage */
        expect_finding("a read of never-written device memory",
                       [&] { CKV_LAUNCH(copy_kernel, dim3(1), dim3(64), 0, (cudaStream_t)NULL, out, in, 64); },
                       cudaErrorLaunchFailure, "kernel copy_kernel", "initcheck: read of 4 bytes",
                       "never written since cudaMalloc");

        in = dev_floats(64), out = dev_floats(64);
        upload_iota(in, 64);
        expect_finding("an index past a __shared__ array (into the next one)",
                       [&] { CKV_LAUNCH(shared_overrun_kernel, dim3(1), dim3(64), 0, (cudaStream_t)NULL, out, in, 32); },
                       cudaErrorIllegalAddress, "kernel shared_overrun_kernel", "memcheck: write of 4 bytes",
                       "__shared__ memory of no variable, 0 bytes past the end of "
                       "shared_overrun_kernel(float*, float const*, int)::first of 128 bytes");

        in = dev_floats(64), out = dev_floats(64);
        upload_iota(in, 64);
        expect_finding("a memcpy in a kernel reading past its buffer",
                       [&] { CKV_LAUNCH(memcpy_past_kernel, dim3(1), dim3(32), 0, (cudaStream_t)NULL, out, in, 64); },
                       cudaErrorIllegalAddress, "kernel memcpy_past_kernel", "memcheck: read of",
                       "past the end of a 256-byte device allocation");

        out = dev_floats(64);
        expect_clean("a memset of __shared__ memory, then a barrier",
                     [&] { CKV_LAUNCH(memset_shared_kernel<true>, dim3(1), dim3(64), 0, (cudaStream_t)NULL, out, 64); });
        /* the next two in thread order (the checks' default is random:1), so the writer runs first and
         * the finding is the race, not an uninitialised read */
        ckv_emu_set_schedule("forward");
        out = dev_floats(64);
        expect_finding("a memset of __shared__ memory without a barrier",
                       [&] { CKV_LAUNCH(memset_shared_kernel<false>, dim3(1), dim3(64), 0, (cudaStream_t)NULL, out, 64); },
                       cudaErrorLaunchFailure, "kernel memset_shared_kernel", "racecheck: read of 4 bytes",
                       "races with a write by thread (0,0,0) of block (0,0,0) in the same interval");

        in = dev_floats(32), out = dev_floats(32);
        upload_iota(in, 32);
        expect_clean("an exchange among lanes 0-15 under __syncwarp(0x0000ffff)",
                     [&] { CKV_LAUNCH(syncwarp_mask_kernel<false>, dim3(1), dim3(32), 0, (cudaStream_t)NULL, out, in); });
        in = dev_floats(32), out = dev_floats(32);
        upload_iota(in, 32);
        expect_finding("lanes ordered by other __syncwarp masks than the writers'",
                       [&] { CKV_LAUNCH(syncwarp_mask_kernel<true>, dim3(1), dim3(32), 0, (cudaStream_t)NULL, out, in); },
                       cudaErrorLaunchFailure, "kernel syncwarp_mask_kernel", "racecheck: read of 4 bytes",
                       "races with a write by thread (0,0,0) of block (0,0,0) in the same interval");
        ckv_emu_set_schedule("random:1");

        float host[32] = {0};
        out = dev_floats(32);
        expect_finding("a host pointer inside a struct argument",
                       [&] { CKV_LAUNCH(wrapped_kernel, dim3(1), dim3(32), 0, (cudaStream_t)NULL, out, wrapped{host}); },
                       cudaErrorIllegalAddress, "kernel wrapped_kernel", "memcheck: read of 4 bytes",
                       "host memory, not a device allocation");
    }

    unsigned long long *count = NULL;
    cudaMalloc((void **)&count, sizeof *count);
    cudaMemsetAsync(count, 0, sizeof *count, NULL);
    expect_clean("atomicAdd from every block",
                 [&] { CKV_LAUNCH(atomic_kernel, dim3(16), dim3(32), 0, (cudaStream_t)NULL, count); });

    out = dev_floats(32);
    expect_clean("a constant table read by a kernel",
                 [&] { CKV_LAUNCH(table_kernel, dim3(1), dim3(32), 0, (cudaStream_t)NULL, out); });

    /* run-time checks: with or without the instrumentation */
    float host[64] = {0};
    out = dev_floats(64);
    expect_finding("a host pointer passed to a kernel",
                   [&] { CKV_LAUNCH(copy_kernel, dim3(1), dim3(64), 0, (cudaStream_t)NULL, out, (const float *)host, 64); },
                   cudaErrorIllegalAddress, "kernel copy_kernel", "pointer argument 2",
                   "host memory, not a device allocation");

    in = dev_floats(64), out = dev_floats(64);
    upload_iota(in, 64);
    cudaFree(in);
    expect_finding("a freed buffer passed to a kernel",
                   [&] { CKV_LAUNCH(copy_kernel, dim3(1), dim3(64), 0, (cudaStream_t)NULL, out, (const float *)in, 64); },
                   cudaErrorIllegalAddress, "kernel copy_kernel", "pointer argument 2", "freed 256-byte device allocation");

    out = dev_floats(50);
    expect_finding("a write one element past a buffer",
                   [&] { CKV_LAUNCH(write_past_kernel, dim3(1), dim3(64), 0, (cudaStream_t)NULL, out, 50); },
                   cudaErrorIllegalAddress, "kernel write_past_kernel", "memcheck:",
                   "past the end of a 200-byte device allocation");
}

/* ---- the observer ------------------------------------------------------------------------------ */

struct tally {
    int launches = 0;
    long global_reads = 0, global_writes = 0, shared = 0;
    uintptr_t site0 = 0;
    int lanes_at_site0 = 0; /* lanes whose first read came from the same instruction */
};

static void on_begin(void *u, const char *, uint64_t, dim3, dim3) { ((tally *)u)->launches++; }
static void on_access(void *u, const ckv_emu_access *a) {
    tally *t = (tally *)u;
    if (a->space == CKV_EMU_SPACE_SHARED) t->shared++;
    else if (a->kind == CKV_EMU_READ) t->global_reads++;
    else t->global_writes++;
    if (a->space == CKV_EMU_SPACE_GLOBAL && a->kind == CKV_EMU_READ && a->seq == 0 && a->warp == 0) {
        if (!t->site0) t->site0 = a->site;
        t->lanes_at_site0 += a->site == t->site0;
    }
}

static void test_observer() {
    if (!ckv_emu_instrumented()) {
        fprintf(stderr, "skip observer: kernels not instrumented\n");
        return;
    }
    float *in = dev_floats(256), *out = dev_floats(256);
    upload_iota(in, 256);
    tally t;
    ckv_emu_observer o = {};
    o.user = &t;
    o.launch_begin = on_begin;
    o.access = on_access;
    ckv_emu_observe(&o);
    CKV_LAUNCH(with_sync_kernel, dim3(2), dim3(128), 0, (cudaStream_t)NULL, out, in);
    cudaError_t e = cudaDeviceSynchronize();
    ckv_emu_observe(NULL);
    /* per thread: one global read, one shared write, one shared read, one global write */
    EXPECT(e == cudaSuccess && t.launches == 1 && t.global_reads == 256 && t.global_writes == 256 && t.shared == 512,
           "observer: %d launches, %ld global reads, %ld global writes, %ld shared accesses", t.launches,
           t.global_reads, t.global_writes, t.shared);
    EXPECT(t.lanes_at_site0 == 32 * 2, "observer: %d lanes of warp 0 share the first load's site (wanted 64: 2 blocks)",
           t.lanes_at_site0);
    if (!failures) fprintf(stderr, "ok   observer: every access of a launch, warp-wide loads grouped by site and seq\n");
    ckv_emu_reset();
}

int main() {
    setenv("CKV_EMU_CHECK", "1", 1); /* before the layer reads its settings */
    test_findings();
    test_observer();
    if (failures) {
        fprintf(stderr, "test_emu_checks: %d check(s) FAILED\n", failures);
        return 1;
    }
    fprintf(stderr, "test_emu_checks: all checks passed\n");
    return 0;
}
