/* emu_profile.h - memory-traffic and tensor-core counters of the CPU execution layer, per kernel
 * (CKV_EMU_PROFILE=1, or the calls below): built on the layer's observer (ckv_emu_observe), so it
 * needs the instrumented kernels (CKV_EMU_INSTRUMENT). A warp-wide access is the accesses of a
 * warp's lanes with equal (block, warp, site, seq); per kernel it counts
 *   global: warp requests, bytes requested, 32-byte sectors touched (load efficiency = requested /
 *           (32 x sectors), as Nsight Compute reports it; ideal: the requested bytes in as few
 *           sectors as they fill), separately for loads and stores (atomics count as stores);
 *   shared: warp requests and wavefronts (the passes the 32 banks of 4 bytes need: the largest
 *           count of distinct words one bank serves; ideal: the distinct bytes / 128), so
 *           wavefronts / ideal is the bank-conflict degree ("ways");
 *   mma:    warp-wide mma.sync m16n8k16 (4,096 FLOPs each), and ldmatrix instructions (ldsm).
 * A cp.async (ckv_async.h) counts as its global read where it is issued and its shared write where
 * the wait lands it; an ldmatrix as its lanes' 16-byte shared reads.
 * It models no cache: sectors are what the load/store units request, not DRAM traffic. Scalar FMA
 * counts are not observable here (the instrumentation reports memory accesses only). Not
 * thread-safe, like the layer. */
#ifndef CKV_EMU_PROFILE_H
#define CKV_EMU_PROFILE_H

#include <stdint.h>
#include <stdio.h>

namespace ckv_emu {

struct ckv_emu_profile_stats {
    uint64_t launches;
    uint64_t ld_requests, ld_bytes, ld_sectors, ld_ideal_sectors; /* global loads */
    uint64_t st_requests, st_bytes, st_sectors, st_ideal_sectors; /* global stores and atomics */
    uint64_t sh_requests, sh_bytes, sh_wavefronts, sh_ideal_wavefronts; /* __shared__ */
    uint64_t mma;                                                 /* warp-wide m16n8k16 */
    uint64_t ldsm;                                                /* warp-wide ldmatrix (any .x) */
    uint64_t partial_flushes; /* warps counted before their lanes met (a very long collective-free run) */
};

/* Starts counting (drops earlier counts); 0 when the kernels are not instrumented (nothing counted). */
int ckv_emu_profile_start(void);
/* Stops counting; the counts stay readable. */
void ckv_emu_profile_stop(void);
/* The counts of the kernel launched as `kernel` (CKV_LAUNCH's spelling); 0 when it never ran. */
int ckv_emu_profile_get(const char *kernel, ckv_emu_profile_stats *out);
/* One line per kernel, with the ideal beside each figure. */
void ckv_emu_profile_print(FILE *f);
/* With CKV_EMU_PROFILE=1 in the environment: starts counting and prints the table at exit (to
 * stderr, or to the file CKV_EMU_PROFILE_FILE names). Called by the backend's init; idempotent. */
void ckv_emu_profile_from_env(void);

} // namespace ckv_emu

#endif
