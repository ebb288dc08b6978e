/* fc_block.h: helpers the block-wise methods share on the CPU path: block geometry and the
 * absmax of a block as bits (NaN above Inf, so one max also detects non-finite blocks). */
#ifndef FC_BLOCK_H
#define FC_BLOCK_H

#include <math.h>
#include <stdint.h>
#include "common/fc_quant.h"
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

static inline int64_t fc_nblocks(int64_t n, int64_t bs)
{
    return (n + bs - 1) / bs;
}

/* 16 independent maxima: one running max is a dependency chain of compare-and-select per
 * vector, which was half of int8's encode time; max is exact in any order. */
static inline uint32_t fc_amax_bits(const float *x, int64_t lo, int64_t hi)
{
    uint32_t l[16] = {0};
    int64_t i = lo;
    for (; i + 16 <= hi; i += 16)
        for (int j = 0; j < 16; j++) {
            uint32_t a = fc_abs_bits(x[i + j]);
            l[j] = a > l[j] ? a : l[j];
        }
    uint32_t m = 0;
    for (; i < hi; i++) {
        uint32_t a = fc_abs_bits(x[i]);
        m = a > m ? a : m;
    }
    for (int j = 0; j < 16; j++)
        m = l[j] > m ? l[j] : m;
    return m;
}

/* fc_absmax_scale of block [lo, hi) (see fc_quant.h). */
static inline float fc_block_scale(const float *x, int64_t lo, int64_t hi, float qmax, float *scale)
{
    return fc_absmax_scale(fc_amax_bits(x, lo, hi), qmax, scale);
}

/* Block reductions in 8 double lanes, combined in a fixed order: no serial dependency chain
 * (the CPU pipelines it) and the same order anywhere (a CUDA kernel can mirror the lanes). */
#define FC_LANES 8

static inline double fc_lanes_total(const double *l)
{
    return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

static inline double fc_sum_sq(const float *x, int64_t lo, int64_t hi)
{
    double l[FC_LANES] = {0};
    for (int64_t i = lo; i < hi; i++)
        l[(i - lo) & (FC_LANES - 1)] += (double)x[i] * (double)x[i];
    return fc_lanes_total(l);
}

static inline double fc_sum_abs(const float *x, int64_t lo, int64_t hi)
{
    double l[FC_LANES] = {0};
    for (int64_t i = lo; i < hi; i++)
        l[(i - lo) & (FC_LANES - 1)] += (double)fc_bits_f32(fc_abs_bits(x[i]));
    return fc_lanes_total(l);
}

/* x's sign bits, bit j of byte g/8 for element g + j (set: negative, NaN included by its sign
 * bit), as the per-element reference loops in signsgd and onebit write them. SSE2's movemask
 * reads the same four sign bits per instruction. */
static inline void fc_sign_bits(const float *x, int64_t n, uint8_t *bits)
{
    int64_t g = 0;
#if defined(__SSE2__)
    for (; g + 8 <= n; g += 8)
        bits[g / 8] = (uint8_t)(_mm_movemask_ps(_mm_loadu_ps(x + g)) |
                                _mm_movemask_ps(_mm_loadu_ps(x + g + 4)) << 4);
#endif
    for (; g < n; g += 8) {
        uint32_t byte = 0;
        for (int j = 0; j < 8 && g + j < n; j++)
            byte |= (fc_f32_bits(x[g + j]) >> 31) << j;
        bits[g / 8] = (uint8_t)byte;
    }
}

/* fc_sum_abs with the lanes as an inner loop of 8: element i still adds into lane
 * (i - lo) % 8 in increasing i, so every lane sees the same additions in the same order. */
static inline double fc_sum_abs_blocked(const float *x, int64_t lo, int64_t hi)
{
    double l[FC_LANES] = {0};
    int64_t i = lo;
    for (; i + FC_LANES <= hi; i += FC_LANES)
        for (int j = 0; j < FC_LANES; j++)
            l[j] += (double)fc_bits_f32(fc_abs_bits(x[i + j]));
    for (; i < hi; i++)
        l[(i - lo) & (FC_LANES - 1)] += (double)fc_bits_f32(fc_abs_bits(x[i]));
    return fc_lanes_total(l);
}

#define FC_BLOCK_END(lo, bs, n) ((lo) + (bs) < (n) ? (lo) + (bs) : (n))

#endif
