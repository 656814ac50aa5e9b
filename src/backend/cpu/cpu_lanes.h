/* cpu_lanes.h - private to backend/cpu: the lane sums of backend.h (CKV_EVICT_LANES double partial
 * sums, lane l over channels l, l + 8, ..., then a fixed tree) over one row of fp32 channels, written
 * as plain C loops over the lanes that the compiler turns into one vector of 8 doubles (AVX-512) or
 * two (AVX2), and that run as scalars elsewhere with the same bits; four rows at a time. They read
 * only their arguments and write only their output. The ops that use them: cpu_evict_rows.c (row norms)
 * and cpu_evict_keys.c (KeyDiff, LagKV, CUR). */
#ifndef CKV_CPU_LANES_H
#define CKV_CPU_LANES_H

#include "backend/backend.h"

enum { CKV_CPU_LANES = CKV_EVICT_LANES };

/* ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
static inline double ckv_cpu_lanes_total(const double *l) {
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* out[r] = the lane sum over a < d of TERM(r, a) for the CKV_CPU_LANE_ROWS rows r, their lanes
 * interleaved in one loop (independent sums the core overlaps); a caller with fewer rows repeats
 * its last row. With AVX-512 each row's lanes are one vector: STEP(acc, xv, r) returns acc plus the
 * terms of xv (channels a_ .. a_ + 7 of row r in double); the tail's missing channels masked off. */
enum { CKV_CPU_LANE_ROWS = 4 };
#if defined(__AVX512F__) && defined(__AVX512VL__)
#include <immintrin.h>
#define CKV_CPU_LANE_SUMS(out, d, TERM, STEP)                                                                 \
    do {                                                                                                      \
        __m512d acc_[CKV_CPU_LANE_ROWS];                                                                      \
        for (int r_ = 0; r_ < CKV_CPU_LANE_ROWS; r_++) acc_[r_] = _mm512_setzero_pd();                        \
        int a_ = 0;                                                                                           \
        for (; a_ + CKV_CPU_LANES <= (d); a_ += CKV_CPU_LANES)                                                \
            for (int r_ = 0; r_ < CKV_CPU_LANE_ROWS; r_++)                                                    \
                acc_[r_] = STEP(acc_[r_], _mm512_cvtps_pd(_mm256_loadu_ps(x[r_] + a_)), r_);                  \
        if (a_ < (d)) {                                                                                       \
            const __mmask8 m_ = (__mmask8)((1u << ((d) - a_)) - 1u);                                          \
            for (int r_ = 0; r_ < CKV_CPU_LANE_ROWS; r_++)                                                    \
                acc_[r_] = _mm512_mask_mov_pd(acc_[r_], m_,                                                   \
                                              STEP(acc_[r_], _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m_, x[r_] + a_)), r_)); \
        }                                                                                                     \
        for (int r_ = 0; r_ < CKV_CPU_LANE_ROWS; r_++) {                                                      \
            const __m256d h_ = _mm256_add_pd(_mm512_castpd512_pd256(acc_[r_]), _mm512_extractf64x4_pd(acc_[r_], 1)); \
            const __m128d q_ = _mm_add_pd(_mm256_castpd256_pd128(h_), _mm256_extractf128_pd(h_, 1));         \
            (out)[r_] = _mm_cvtsd_f64(q_) + _mm_cvtsd_f64(_mm_unpackhi_pd(q_, q_));                           \
        }                                                                                                     \
    } while (0)
#else
#define CKV_CPU_LANE_SUMS(out, d, TERM, STEP)                                                                 \
    do {                                                                                                      \
        double l_[CKV_CPU_LANE_ROWS][CKV_CPU_LANES] = {{0.0}};                                                \
        int a_ = 0;                                                                                           \
        for (; a_ + CKV_CPU_LANES <= (d); a_ += CKV_CPU_LANES)                                                \
            for (int r_ = 0; r_ < CKV_CPU_LANE_ROWS; r_++)                                                    \
                for (int i_ = 0; i_ < CKV_CPU_LANES; i_++) l_[r_][i_] += TERM(r_, a_ + i_);                   \
        for (int r_ = 0; r_ < CKV_CPU_LANE_ROWS; r_++)                                                        \
            for (int i_ = 0; a_ + i_ < (d); i_++) l_[r_][i_] += TERM(r_, a_ + i_);                            \
        for (int r_ = 0; r_ < CKV_CPU_LANE_ROWS; r_++) (out)[r_] = ckv_cpu_lanes_total(l_[r_]);               \
    } while (0)
#endif

/* Rows x[r] of the sums below: CKV_CPU_LANE_ROWS pointers to d fp32 channels each. */
typedef const float *const ckv_cpu_lane_rows[CKV_CPU_LANE_ROWS];

/* out[r] = sum over a < d of (double)x[r][a]^2 */
static inline void ckv_cpu_lanes_sumsq(double *out, ckv_cpu_lane_rows x, int d) {
#define SUMSQ_TERM(r, a) ((double)x[r][a] * (double)x[r][a])
#define SUMSQ_STEP(acc, xv, r) _mm512_fmadd_pd(xv, xv, acc)
    CKV_CPU_LANE_SUMS(out, d, SUMSQ_TERM, SUMSQ_STEP);
#undef SUMSQ_TERM
#undef SUMSQ_STEP
}

/* out[r] = sum over a < d of (double)x[r][a] * y[a] */
static inline void ckv_cpu_lanes_dot(double *out, ckv_cpu_lane_rows x, const double *restrict y, int d) {
#define DOT_TERM(r, a) ((double)x[r][a] * y[a])
#define DOT_STEP(acc, xv, r) _mm512_fmadd_pd(xv, _mm512_maskz_loadu_pd((__mmask8)((d) - a_ >= 8 ? 0xffu : (1u << ((d) - a_)) - 1u), y + a_), acc)
    CKV_CPU_LANE_SUMS(out, d, DOT_TERM, DOT_STEP);
#undef DOT_TERM
#undef DOT_STEP
}

/* out[r] = sum over a < d of (double)x[r][a] */
static inline void ckv_cpu_lanes_sum(double *out, ckv_cpu_lane_rows x, int d) {
#define SUM_TERM(r, a) ((double)x[r][a])
#define SUM_STEP(acc, xv, r) _mm512_add_pd(acc, xv)
    CKV_CPU_LANE_SUMS(out, d, SUM_TERM, SUM_STEP);
#undef SUM_TERM
#undef SUM_STEP
}

#if defined(__AVX512F__) && defined(__AVX512VL__)
static inline __m512d ckv_cpu_lanes_sqdev_step(__m512d acc, __m512d xv, double m) {
    const __m512d e = _mm512_sub_pd(xv, _mm512_set1_pd(m));
    return _mm512_fmadd_pd(e, e, acc);
}
#endif

/* out[r] = sum over a < d of ((double)x[r][a] - m[r])^2 */
static inline void ckv_cpu_lanes_sqdev(double *out, ckv_cpu_lane_rows x, const double *m, int d) {
#define SQDEV_TERM(r, a) (((double)x[r][a] - m[r]) * ((double)x[r][a] - m[r]))
#define SQDEV_STEP(acc, xv, r) ckv_cpu_lanes_sqdev_step(acc, xv, m[r])
    CKV_CPU_LANE_SUMS(out, d, SQDEV_TERM, SQDEV_STEP);
#undef SQDEV_TERM
#undef SQDEV_STEP
}

/* The CKV_CPU_LANE_ROWS row pointers of rows x + i * ld, i < n (1 <= n), the last repeated. */
static inline void ckv_cpu_lane_rows_of(const float **rows, const float *x, size_t ld, int n) {
    for (int i = 0; i < CKV_CPU_LANE_ROWS; i++) rows[i] = x + (size_t)(i < n ? i : n - 1) * ld;
}

#endif
