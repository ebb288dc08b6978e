/* fc_block.h: helpers the block-wise methods share on the CPU path: block geometry and the
 * absmax of a block as bits (NaN above Inf, so one max also detects non-finite blocks). */
#ifndef FC_BLOCK_H
#define FC_BLOCK_H

#include <stdint.h>
#include "fc_quant.h"

static inline int64_t fc_nblocks(int64_t n, int64_t bs)
{
    return (n + bs - 1) / bs;
}

static inline uint32_t fc_amax_bits(const float *x, int64_t lo, int64_t hi)
{
    uint32_t m = 0;
    for (int64_t i = lo; i < hi; i++) {
        uint32_t a = fc_abs_bits(x[i]);
        m = a > m ? a : m;
    }
    return m;
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

#define FC_BLOCK_END(lo, bs, n) ((lo) + (bs) < (n) ? (lo) + (bs) : (n))

#endif
