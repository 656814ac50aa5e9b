/* test_emu_async.cpp - cp.async and ldmatrix on the CPU execution layer (ckv_async.h,
 * emu/emu_async.cpp) against the PTX ISA's semantics (docs/gpu.md §1, §1a):
 *   ldmatrix  x1, x2, x4, each with and without .trans: every register of every lane holds the
 *             elements the documented mapping names (matrix m, row l >> 2, columns 2(l & 3) and
 *             2(l & 3) + 1, or transposed), from rows whose addresses the lanes give;
 *   cp.async  4, 8 and 16 bytes: the destination keeps its old contents until the wait that
 *             completes the copy's group; wait_group 1 lands all groups but the newest; src-size 0
 *             writes zeros;
 *   checks    (CKV_EMU_CHECK=1, set here) a thread that reads another thread's landed copy without a
 *             barrier is a racecheck finding; a misaligned cp.async fails its launch naming it;
 *   counters  (emu_profile.h) a warp's 16-byte cp.async is 16 sectors at 100% load efficiency and a
 *             1-way shared write; an ldmatrix.x4 over rows padded to an odd number of 16-byte chunks
 *             is 1-way, over 128-byte rows 8-way.
 * The checks and counters need the instrumented kernels (CKV_EMU_INSTRUMENT); without them those
 * parts are skipped with a note. Label cuda-emu. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckv_async.h"
#include "cuda_rt.h"
#include "emu/emu_profile.h"

#include "emu_test.h"

/* element (m, i, j) of the 4 source matrices: a distinct 16-bit value */
static uint16_t el(int m, int i, int j) { return (uint16_t)(0x1000 * (m + 1) + 16 * i + j); }

/* 4 matrices of 8 rows, row r of matrix m at shared row m * 8 + r of a tile of STRIDE values per row;
 * lane l gives the address of row l & 7 of matrix l >> 3 (lanes past the matrices: row 0) */
template <int X, bool TRANS, int STRIDE>
__global__ void ldmatrix_kernel(uint32_t *out, const uint16_t *src) {
    alignas(16) __shared__ uint16_t tile[32 * STRIDE];
    const int lane = (int)threadIdx.x;
    for (int i = 0; i < 32 * STRIDE; i++)
        if (i % 32 == lane) tile[i] = src[i];
    __syncthreads();
    uint32_t r[X];
    const int row = lane < 8 * X ? (lane >> 3) * 8 + (lane & 7) : 0;
    ckv_ldmatrix<X, TRANS>(r, tile + row * STRIDE);
    for (int i = 0; i < X; i++) out[lane * 4 + i] = r[i];
}

template <int X, bool TRANS> static void check_ldmatrix(uint32_t *dout, const uint16_t *dsrc) {
    CKV_LAUNCH((ldmatrix_kernel<X, TRANS, 8>), dim3(1), dim3(32), 0, (cudaStream_t)NULL, dout, dsrc);
    uint32_t got[128];
    EXPECT(cudaMemcpy(got, dout, sizeof got, cudaMemcpyDeviceToHost) == cudaSuccess, "ldmatrix x%d%s: launch failed: %s",
           X, TRANS ? ".trans" : "", cudaGetErrorString(cudaGetLastError()));
    int bad = 0;
    for (int l = 0; l < 32; l++)
        for (int m = 0; m < X; m++) {
            const int g = l >> 2, t = l & 3;
            const uint16_t lo = TRANS ? el(m, 2 * t, g) : el(m, g, 2 * t);
            const uint16_t hi = TRANS ? el(m, 2 * t + 1, g) : el(m, g, 2 * t + 1);
            const uint32_t want = (uint32_t)lo | (uint32_t)hi << 16;
            if (got[l * 4 + m] != want && bad++ < 4)
                fprintf(stderr, "  ldmatrix x%d%s lane %d register %d: got %08x, want %08x\n", X, TRANS ? ".trans" : "",
                        l, m, got[l * 4 + m], want);
        }
    EXPECT(bad == 0, "ldmatrix x%d%s: %d registers differ", X, TRANS ? ".trans" : "", bad);
    if (!bad) printf("ok   ldmatrix x%d%s: %d registers as the PTX ISA maps them\n", X, TRANS ? ".trans" : "", 32 * X);
}

/* Thread l copies 4, 8 and 16 bytes of row l in two groups; out[l] records what it saw (1 = old,
 * 2 = new, 0 = zeros, 3 = anything else) before and after each wait. */
__global__ void cp_async_kernel(int *out, const uint32_t *src) {
    alignas(16) __shared__ uint32_t a[32 * 4], b[32 * 4], c[32], z[32 * 4];
    const int l = (int)threadIdx.x;
    out += blockIdx.x * 32 * 8; /* each block starts with no copies of the last one in flight */
    for (int i = 0; i < 4; i++) a[l * 4 + i] = b[l * 4 + i] = z[l * 4 + i] = 0xdeadbeefu;
    c[l] = 0xdeadbeefu;
    const uint32_t *row = src + l * 4;
    ckv_cp_async<16>(a + l * 4, row, true);
    ckv_cp_async<4>(c + l, row, true);
    ckv_cp_async_commit(); /* group 1: a, c */
    ckv_cp_async<8>(b + l * 4, row, true);
    ckv_cp_async<8>(b + l * 4 + 2, row + 2, true);
    ckv_cp_async<16>(z + l * 4, row, false); /* src-size 0: zeros */
    ckv_cp_async_commit();                   /* group 2: b, z */
    auto seen = [&](const uint32_t *p, int n) {
        bool old = true, fresh = true, zero = true;
        for (int i = 0; i < n; i++) old &= p[i] == 0xdeadbeefu, fresh &= p[i] == row[i], zero &= p[i] == 0u;
        return old ? 1 : fresh ? 2 : zero ? 0 : 3;
    };
    out[l * 8 + 0] = seen(a + l * 4, 4); /* before any wait: old */
    ckv_cp_async_wait<1>();
    out[l * 8 + 1] = seen(a + l * 4, 4); /* group 1 landed */
    out[l * 8 + 2] = seen(c + l, 1);
    out[l * 8 + 3] = seen(b + l * 4, 4); /* group 2 not yet */
    out[l * 8 + 4] = seen(z + l * 4, 4);
    ckv_cp_async_wait<0>();
    out[l * 8 + 5] = seen(b + l * 4, 4);
    out[l * 8 + 6] = seen(z + l * 4, 4);
    out[l * 8 + 7] = 2;
}

/* thread 1 reads the row thread 0 copied, after thread 0's wait but with no barrier */
template <bool BARRIER> __global__ void cp_async_race_kernel(float *out, const float *src) {
    alignas(16) __shared__ float t[8];
    const int l = (int)threadIdx.x;
    if (l == 0) {
        ckv_cp_async<16>(t, src, true);
        ckv_cp_async_commit();
        ckv_cp_async_wait<0>();
    }
    if (BARRIER) __syncthreads();
    if (l == 1) out[0] = t[0];
}

__global__ void cp_async_misaligned_kernel(const float *src) {
    alignas(16) __shared__ float t[8];
    ckv_cp_async<16>(t, src + 1, true);
    ckv_cp_async_commit();
    ckv_cp_async_wait<0>();
}

/* one warp: 16-byte cp.async of 512 contiguous bytes, then ldmatrix.x4 over a 32-row tile */
template <int STRIDE> __global__ void traffic_kernel(uint32_t *out, const uint16_t *src) {
    alignas(16) __shared__ uint16_t tile[32 * STRIDE];
    const int lane = (int)threadIdx.x;
    ckv_cp_async<16>(tile + lane * STRIDE, src + lane * 8, true);
    ckv_cp_async_commit();
    ckv_cp_async_wait<0>();
    __syncthreads();
    uint32_t r[4];
    ckv_ldmatrix_x4(r, tile + lane * STRIDE);
    out[lane] = r[0] ^ r[1] ^ r[2] ^ r[3];
}

static void upload(void *d, const void *h, size_t n) {
    if (cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess) abort();
}

int main() {
    setenv("CKV_EMU_CHECK", "1", 1); /* before the layer reads its settings */
    uint16_t hsrc[32 * 8];
    for (int m = 0; m < 4; m++)
        for (int i = 0; i < 8; i++)
            for (int j = 0; j < 8; j++) hsrc[(m * 8 + i) * 8 + j] = el(m, i, j);
    uint16_t *dsrc = NULL;
    uint32_t *dout = NULL;
    int *dres = NULL;
    if (cudaMalloc((void **)&dsrc, sizeof hsrc) != cudaSuccess || cudaMalloc((void **)&dout, 128 * 4) != cudaSuccess ||
        cudaMalloc((void **)&dres, 2 * 32 * 8 * sizeof(int)) != cudaSuccess)
        abort();
    upload(dsrc, hsrc, sizeof hsrc);
    check_ldmatrix<1, false>(dout, dsrc);
    check_ldmatrix<2, false>(dout, dsrc);
    check_ldmatrix<4, false>(dout, dsrc);
    check_ldmatrix<1, true>(dout, dsrc);
    check_ldmatrix<2, true>(dout, dsrc);
    check_ldmatrix<4, true>(dout, dsrc);

    CKV_LAUNCH(cp_async_kernel, dim3(2), dim3(32), 0, (cudaStream_t)NULL, dres, (const uint32_t *)dsrc);
    int res[2 * 32 * 8];
    EXPECT(cudaMemcpy(res, dres, sizeof res, cudaMemcpyDeviceToHost) == cudaSuccess, "cp.async: launch failed: %s",
           cudaGetErrorString(cudaGetLastError()));
    static const int want[8] = {1, 2, 2, 1, 1, 2, 0, 2};
    static const char *what[8] = {"a before the wait", "a after wait_group 1", "c (4 bytes) after wait_group 1",
                                  "b (group 2) after wait_group 1", "z (group 2) after wait_group 1",
                                  "b after wait_group 0", "z (src-size 0) after wait_group 0", "end"};
    int bad = 0;
    for (int l = 0; l < 64; l++)
        for (int k = 0; k < 8; k++)
            if (res[l * 8 + k] != want[k] && bad++ < 4)
                fprintf(stderr, "  cp.async thread %d: %s: saw %s\n", l, what[k],
                        res[l * 8 + k] == 1 ? "the old contents" : res[l * 8 + k] == 2 ? "the copy" :
                        res[l * 8 + k] == 0 ? "zeros" : "something else");
    EXPECT(bad == 0, "cp.async: %d observations differ from the PTX ISA's", bad);
    if (!bad) printf("ok   cp.async 4/8/16 bytes: old data until the wait of its group, wait_group 1, src-size 0 zeros\n");

    if (!ckv_emu_instrumented()) {
        printf("skip: racecheck and counters need the instrumented kernels (CMake CKV_EMU_INSTRUMENT=ON)\n");
    } else {
        float *df = NULL;
        if (cudaMalloc((void **)&df, 64 * sizeof(float)) != cudaSuccess) abort();
        static const float zeros[64] = {0};
        upload(df, zeros, sizeof zeros);
        CKV_LAUNCH(cp_async_race_kernel<false>, dim3(1), dim3(32), 0, (cudaStream_t)NULL, df + 32, df);
        cudaError_t e = cudaDeviceSynchronize();
        const char *msg = cudaGetErrorString(e);
        EXPECT(e == cudaErrorLaunchFailure && strstr(msg, "racecheck") && strstr(msg, "cp_async_race_kernel"),
               "a read of another thread's landed cp.async without a barrier: want a racecheck finding, got %s", msg);
        if (e == cudaErrorLaunchFailure) printf("ok   racecheck: %s\n", msg);
        ckv_emu_reset();
        if (cudaMalloc((void **)&df, 64 * sizeof(float)) != cudaSuccess) abort();
        upload(df, zeros, sizeof zeros);
        CKV_LAUNCH(cp_async_race_kernel<true>, dim3(1), dim3(32), 0, (cudaStream_t)NULL, df + 32, df);
        e = cudaDeviceSynchronize();
        EXPECT(e == cudaSuccess, "the same read after a barrier: a false finding: %s", cudaGetErrorString(e));
        CKV_LAUNCH(cp_async_misaligned_kernel, dim3(1), dim3(1), 0, (cudaStream_t)NULL, (const float *)df);
        e = cudaDeviceSynchronize();
        msg = cudaGetErrorString(e);
        EXPECT(e != cudaSuccess && strstr(msg, "misaligned") && strstr(msg, "cp_async_misaligned_kernel"),
               "a misaligned cp.async: want a failed launch naming it, got %s", msg);
        if (e != cudaSuccess) printf("ok   misaligned cp.async: %s\n", msg);
        ckv_emu_reset();

        if (cudaMalloc((void **)&dsrc, sizeof hsrc) != cudaSuccess || cudaMalloc((void **)&dout, 128 * 4) != cudaSuccess)
            abort();
        upload(dsrc, hsrc, sizeof hsrc);
        ckv_emu_profile_start();
        CKV_LAUNCH(traffic_kernel<24>, dim3(1), dim3(32), 0, (cudaStream_t)NULL, dout, dsrc); /* 3 chunks: odd */
        CKV_LAUNCH(traffic_kernel<64>, dim3(1), dim3(32), 0, (cudaStream_t)NULL, dout, dsrc); /* 8 chunks */
        ckv_emu_profile_stop();
        ckv_emu_profile_print(stdout);
        ckv_emu_profile_stats p, u;
        EXPECT(ckv_emu_profile_get("traffic_kernel<24>", &p) && ckv_emu_profile_get("traffic_kernel<64>", &u),
               "traffic kernels not counted");
        /* global: the 512 bytes of the cp.async in 16 sectors, and the 128-byte store */
        EXPECT(p.ld_requests == 1 && p.ld_bytes == 512 && p.ld_sectors == 16,
               "cp.async: %llu load requests, %llu bytes, %llu sectors; want 1, 512, 16",
               (unsigned long long)p.ld_requests, (unsigned long long)p.ld_bytes, (unsigned long long)p.ld_sectors);
        /* shared: the landed write and the ldmatrix, 4 wavefronts each when conflict-free */
        EXPECT(p.sh_requests == 2 && p.sh_wavefronts == 8 && p.sh_ideal_wavefronts == 8,
               "padded: %llu shared requests, %llu wavefronts (ideal %llu); want 2, 8 (8)",
               (unsigned long long)p.sh_requests, (unsigned long long)p.sh_wavefronts,
               (unsigned long long)p.sh_ideal_wavefronts);
        /* 128-byte rows: every row starts in bank 0: 32 distinct words in banks 0-3 per request */
        EXPECT(u.sh_requests == 2 && u.sh_wavefronts == 64 && u.sh_ideal_wavefronts == 8,
               "128-byte rows: %llu shared requests, %llu wavefronts (ideal %llu); want 2, 64 (8)",
               (unsigned long long)u.sh_requests, (unsigned long long)u.sh_wavefronts,
               (unsigned long long)u.sh_ideal_wavefronts);
        EXPECT(p.ldsm == 1 && u.ldsm == 1, "ldmatrix count %llu, %llu; want 1, 1", (unsigned long long)p.ldsm,
               (unsigned long long)u.ldsm);
    }
    if (failures) {
        fprintf(stderr, "test_emu_async: %d check(s) FAILED\n", failures);
        return 1;
    }
    printf("test_emu_async: all checks passed\n");
    return 0;
}
