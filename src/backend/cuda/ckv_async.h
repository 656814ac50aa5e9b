/* ckv_async.h - the asynchronous global->shared copies (cp.async) and the shared-memory matrix
 * loads (ldmatrix) of the CUDA backend's kernels, one spelling for both builds: under nvcc inline
 * PTX, under the CPU execution layer calls into emu/emu_async.cpp with the PTX ISA's semantics
 * (docs/gpu.md §1 and §1a):
 *   ckv_cp_async<B>(dst, src, valid)  cp.async of B = 4, 8 or 16 bytes (.cg for 16, .ca otherwise),
 *                                     dst __shared__, src global, both B-aligned; valid false: src
 *                                     is not read and dst gets B zero bytes (src-size 0);
 *   ckv_cp_async_commit()             cp.async.commit_group: the thread's uncommitted copies form a
 *                                     group;
 *   ckv_cp_async_wait<N>()            cp.async.wait_group N: every group but the N newest of this
 *                                     thread has landed, visible to this thread (other threads see
 *                                     the data after a barrier);
 *   ckv_ldmatrix_x4(r, p), ckv_ldmatrix_x4_trans(r, p)  ldmatrix.sync.aligned.m8n8.x4{.trans}.b16:
 *                                     lane l gives the 16-byte row address p of row l & 7 of matrix
 *                                     l >> 3; register i gets that matrix's fragment (x1 / x2:
 *                                     lanes 0-7 / 0-15, matrices 0 / 0-1).
 * On the execution layer the copy's global read happens (and is checked and counted) at the
 * cp.async, and its shared write at the wait that completes its group, so a read of the
 * destination before the wait sees old data and the racecheck orders the write at the wait; an
 * ldmatrix is each lane's 16-byte shared read and a warp collective that deals out the fragments.
 * Every lane of the warp must call an ldmatrix (no divergence). Nothing else lives here. */
#ifndef CKV_ASYNC_H
#define CKV_ASYNC_H

#include "cuda_rt.h"

#if defined(CKV_CUDA_EMU)
namespace ckv_emu {
/* emu_async.cpp: checks a cp.async of `bytes` from src to dst before its read (faults the launch
 * on a misaligned address, a size other than 4, 8, 16, or a dst outside __shared__) */
void ckv_emu_cp_async_check(const void *dst, const void *src, unsigned bytes);
/* queues the copy of `bytes` already read (data; NULL: zeros) to dst in the thread's open group */
void ckv_emu_cp_async_push(void *dst, const void *data, unsigned bytes);
void ckv_emu_cp_async_commit(void);
/* the next copy that wait_group n completes, oldest first: 1 and *dst, data [16], *bytes; 0 when
 * at most n groups are left */
int ckv_emu_cp_async_pop(int n, void **dst, void *data, unsigned *bytes);
/* checks an ldmatrix row address (16-byte aligned __shared__) */
void ckv_emu_ldmatrix_check(const void *row);
struct ckv_emu_ldmatrix_lane {
    uint32_t row[4]; /* this lane's 16-byte row (lanes past the matrices: unused) */
    uint32_t out[4];
    int x, trans;
};
void ckv_emu_ldmatrix_fn(void *lanes[32], unsigned mask); /* the collective (emu_profile.cpp counts it) */
typedef unsigned __int128 ckv_emu_u128 __attribute__((may_alias, aligned(16)));
typedef uint64_t ckv_emu_u64 __attribute__((may_alias, aligned(8)));
typedef uint32_t ckv_emu_u32 __attribute__((may_alias, aligned(4)));
} // namespace ckv_emu
#endif

template <int B> __device__ __forceinline__ void ckv_cp_async(void *dst, const void *src, bool valid) {
    static_assert(B == 4 || B == 8 || B == 16, "cp.async copies 4, 8 or 16 bytes");
#if defined(CKV_CUDA_EMU)
    ckv_emu_cp_async_check(dst, src, (unsigned)B);
    if (!valid) {
        ckv_emu_cp_async_push(dst, NULL, (unsigned)B);
        return;
    }
    unsigned char data[16];
    if (B == 16) { /* one instrumented load of B bytes: one access the checks and counters see */
        const ckv_emu_u128 v = *(const ckv_emu_u128 *)src;
        memcpy(data, &v, 16);
    } else if (B == 8) {
        const ckv_emu_u64 v = *(const ckv_emu_u64 *)src;
        memcpy(data, &v, 8);
    } else {
        const ckv_emu_u32 v = *(const ckv_emu_u32 *)src;
        memcpy(data, &v, 4);
    }
    ckv_emu_cp_async_push(dst, data, (unsigned)B);
#else
    const unsigned s = (unsigned)__cvta_generic_to_shared(dst);
    const int n = valid ? B : 0; /* src-size: 0 reads nothing and fills zeros */
    if (B == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(n) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(s), "l"(src), "n"(B), "r"(n) : "memory");
#endif
}

__device__ __forceinline__ void ckv_cp_async_commit(void) {
#if defined(CKV_CUDA_EMU)
    ckv_emu_cp_async_commit();
#else
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N> __device__ __forceinline__ void ckv_cp_async_wait(void) {
#if defined(CKV_CUDA_EMU)
    void *dst;
    unsigned char data[16];
    unsigned bytes;
    while (ckv_emu_cp_async_pop(N, &dst, data, &bytes)) { /* the writes land here, one store each */
        if (bytes == 16) {
            ckv_emu_u128 v;
            memcpy(&v, data, 16);
            *(ckv_emu_u128 *)dst = v;
        } else if (bytes == 8) {
            ckv_emu_u64 v;
            memcpy(&v, data, 8);
            *(ckv_emu_u64 *)dst = v;
        } else {
            ckv_emu_u32 v;
            memcpy(&v, data, 4);
            *(ckv_emu_u32 *)dst = v;
        }
    }
#else
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

/* X = 1, 2 or 4 matrices, TRANS: .trans */
template <int X, bool TRANS> __device__ __forceinline__ void ckv_ldmatrix(uint32_t r[X], const void *row) {
    static_assert(X == 1 || X == 2 || X == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if defined(CKV_CUDA_EMU)
    ckv_emu_ldmatrix_lane me;
    me.x = X, me.trans = TRANS;
    memset(me.row, 0, sizeof me.row);
    if (ckv_emu_lane() < 8u * X) {
        ckv_emu_ldmatrix_check(row);
        const ckv_emu_u128 v = *(const ckv_emu_u128 *)row; /* the lane's row: one 16-byte shared read */
        memcpy(me.row, &v, 16);
    }
    ckv_emu_warp_collective(ckv_emu_ldmatrix_fn, &me, 0xffffffffu);
    for (int i = 0; i < X; i++) r[i] = me.out[i];
#else
    const unsigned s = (unsigned)__cvta_generic_to_shared(row);
    if (X == 4 && TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
    else if (X == 4)
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
    else if (X == 2 && TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1]) : "r"(s) : "memory");
    else if (X == 2)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                     : "=r"(r[0]), "=r"(r[1]) : "r"(s) : "memory");
    else if (TRANS)
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s) : "memory");
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s) : "memory");
#endif
}

__device__ __forceinline__ void ckv_ldmatrix_x4(uint32_t r[4], const void *row) { ckv_ldmatrix<4, false>(r, row); }
__device__ __forceinline__ void ckv_ldmatrix_x4_trans(uint32_t r[4], const void *row) { ckv_ldmatrix<4, true>(r, row); }

#endif
