/* test_emu_profile.cpp - the memory-traffic and tensor-core counters of the CPU execution layer
 * (emu/emu_profile.h) on kernels whose figures are known by hand: coalesced and strided 4-byte
 * loads, 2-byte loads of every other element (the pattern of today's prefill tile fill), row and
 * column reads of a shared tile with and without padding (1-way and 32-way bank conflicts), one mma
 * per warp. Prints the profile table. Skips (77) when the kernels are not instrumented. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckv_mma.h"
#include "cuda_rt.h"
#include "emu/emu_profile.h"

using namespace ckv_emu;

static int failures = 0;
#define EXPECT(cond, ...)                            \
    do {                                             \
        if (!(cond)) {                               \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);            \
            fprintf(stderr, "\n");                   \
            failures++;                              \
        }                                            \
    } while (0)

__global__ void coalesced_kernel(float *out, const float *in) { out[threadIdx.x] = in[threadIdx.x]; }
__global__ void strided_kernel(float *out, const float *in) { out[threadIdx.x] = in[threadIdx.x * 32]; }
__global__ void every_other_half_kernel(uint16_t *out, const uint16_t *in) { out[threadIdx.x] = in[2 * threadIdx.x]; }

/* writes a 32 x W tile row by row (lane = column), reads column 0 (lane = row) */
template <int W>
__global__ void tile_kernel(float *out, const float *in) {
    __shared__ float tile[32 * W];
    const int lane = (int)threadIdx.x;
    for (int r = 0; r < 32; r++) tile[r * W + lane] = in[r * 32 + lane];
    __syncthreads();
    out[lane] = tile[lane * W];
}

__global__ void mma_kernel(float *out) {
    const uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u}; /* bf16 pairs of 1.0 */
    const uint32_t b[2] = {0x3f803f80u, 0x3f803f80u};
    float d[4] = {0, 0, 0, 0};
    ckv_mma_bf16_16816(d, a, b, d);
    out[threadIdx.x] = d[0];
}

static ckv_emu_profile_stats stats_of(const char *kernel) {
    ckv_emu_profile_stats s;
    EXPECT(ckv_emu_profile_get(kernel, &s), "%s: no counts", kernel);
    return s;
}

int main() {
    float *in = NULL, *out = NULL;
    if (cudaMalloc((void **)&in, 4096 * sizeof(float)) != cudaSuccess ||
        cudaMalloc((void **)&out, 4096 * sizeof(float)) != cudaSuccess) {
        fprintf(stderr, "FAIL cudaMalloc\n");
        return 1;
    }
    static float zeros[4096];
    cudaMemcpy(in, zeros, sizeof zeros, cudaMemcpyHostToDevice);
    if (!ckv_emu_profile_start()) {
        printf("skip: the kernels are not instrumented (CMake CKV_EMU_INSTRUMENT=OFF): nothing to count\n");
        return 77;
    }
    CKV_LAUNCH(coalesced_kernel, dim3(1), dim3(64), 0, (cudaStream_t)NULL, out, in);
    CKV_LAUNCH(strided_kernel, dim3(2), dim3(32), 0, (cudaStream_t)NULL, out, in);
    CKV_LAUNCH(every_other_half_kernel, dim3(1), dim3(32), 0, (cudaStream_t)NULL, (uint16_t *)out, (const uint16_t *)in);
    CKV_LAUNCH(tile_kernel<32>, dim3(1), dim3(32), 0, (cudaStream_t)NULL, out, in);
    CKV_LAUNCH(tile_kernel<33>, dim3(1), dim3(32), 0, (cudaStream_t)NULL, out, in);
    CKV_LAUNCH(mma_kernel, dim3(3), dim3(64), 0, (cudaStream_t)NULL, out);
    ckv_emu_profile_stop();
    ckv_emu_profile_print(stdout);

    /* 2 warps x 32 lanes x 4 bytes: 4 sectors per request, 100% */
    ckv_emu_profile_stats s = stats_of("coalesced_kernel");
    EXPECT(s.launches == 1 && s.ld_requests == 2 && s.ld_bytes == 256 && s.ld_sectors == 8 && s.ld_ideal_sectors == 8,
           "coalesced: %llu requests, %llu bytes, %llu sectors (ideal %llu); want 2, 256, 8 (8)",
           (unsigned long long)s.ld_requests, (unsigned long long)s.ld_bytes, (unsigned long long)s.ld_sectors,
           (unsigned long long)s.ld_ideal_sectors);
    EXPECT(s.st_requests == 2 && s.st_sectors == 8, "coalesced stores: %llu requests, %llu sectors; want 2, 8",
           (unsigned long long)s.st_requests, (unsigned long long)s.st_sectors);
    /* a 128-byte stride: every lane its own sector, 12.5% (ideal 4 sectors per request) */
    s = stats_of("strided_kernel");
    EXPECT(s.ld_requests == 2 && s.ld_sectors == 64 && s.ld_ideal_sectors == 8 && s.st_sectors == 8,
           "strided: %llu requests, %llu sectors (ideal %llu), %llu store sectors; want 2, 64 (8), 8",
           (unsigned long long)s.ld_requests, (unsigned long long)s.ld_sectors, (unsigned long long)s.ld_ideal_sectors,
           (unsigned long long)s.st_sectors);
    /* 2-byte loads of every other element: 64 bytes over 128, 4 sectors for 2 worth: 50% */
    s = stats_of("every_other_half_kernel");
    EXPECT(s.ld_requests == 1 && s.ld_bytes == 64 && s.ld_sectors == 4 && s.ld_ideal_sectors == 2,
           "every other half: %llu requests, %llu bytes, %llu sectors (ideal %llu); want 1, 64, 4 (2)",
           (unsigned long long)s.ld_requests, (unsigned long long)s.ld_bytes, (unsigned long long)s.ld_sectors,
           (unsigned long long)s.ld_ideal_sectors);
    /* 32 conflict-free row stores (1 wavefront each), then a column read: 32 ways unpadded, 1 padded */
    s = stats_of("tile_kernel<32>");
    EXPECT(s.sh_requests == 33 && s.sh_wavefronts == 64 && s.sh_ideal_wavefronts == 33,
           "tile 32: %llu shared requests, %llu wavefronts (ideal %llu); want 33, 64 (33)",
           (unsigned long long)s.sh_requests, (unsigned long long)s.sh_wavefronts,
           (unsigned long long)s.sh_ideal_wavefronts);
    s = stats_of("tile_kernel<33>");
    EXPECT(s.sh_requests == 33 && s.sh_wavefronts == 33 && s.sh_ideal_wavefronts == 33,
           "tile 33: %llu shared requests, %llu wavefronts (ideal %llu); want 33, 33 (33)",
           (unsigned long long)s.sh_requests, (unsigned long long)s.sh_wavefronts,
           (unsigned long long)s.sh_ideal_wavefronts);
    /* one mma per warp: 3 blocks x 2 warps */
    s = stats_of("mma_kernel");
    EXPECT(s.mma == 6 && s.partial_flushes == 0, "mma: %llu warp mma (want 6), %llu partial flushes",
           (unsigned long long)s.mma, (unsigned long long)s.partial_flushes);
    float host[64];
    cudaMemcpy(host, out, sizeof host, cudaMemcpyDeviceToHost);
    EXPECT(host[0] == 16.0f, "mma result %g, want 16 (a row of 16 ones times a column of 16 ones)", (double)host[0]);
    cudaFree(in);
    cudaFree(out);
    if (failures) {
        fprintf(stderr, "test_emu_profile: %d failures\n", failures);
        return 1;
    }
    printf("test_emu_profile: ok (sectors, efficiency, bank wavefronts and mma counts as computed by hand)\n");
    return 0;
}
