/* fc_qsgd.h: QSGD's per-element step (Alistarh et al. 2017): level l of s, rounded up with
 * probability s|x|/||x|| - l, so E[decode] = x. Code = level << 1 | sign, 1 + ceil(log2(s+1))
 * bits. Shared by the CPU path and CUDA kernels. */
#ifndef FC_QSGD_H
#define FC_QSGD_H

#include <math.h>
#include <stdint.h>
#include "common/fc_half.h"
#include "common/fc_hostdev.h"
#include "common/fc_quant.h"
#include "common/fc_rng.h"

FC_HOSTDEV int fc_qsgd_width(int64_t levels)
{
    int b = 0;
    while (((int64_t)1 << b) < levels + 1)
        b++;
    return 1 + b;
}

/* A bucket's norm from its sum of squares, as the body carries it: the canonical NaN for a
 * bucket that held NaN/Inf, and fp32's largest value for a finite bucket whose norm is beyond
 * it (any norm >= max |x| keeps the levels in [0, s] and the rounding unbiased). */
FC_HOSTDEV float fc_qsgd_norm(double sum_sq)
{
    if (!(sum_sq <= 1.7976931348623157e308)) /* NaN or Inf: the bucket was not finite */
        return fc_bits_f32(FC_NAN_BITS);
    const double r = sqrt(sum_sq);
    return r >= (double)fc_bits_f32(FC_MAX_BITS) ? fc_bits_f32(FC_MAX_BITS) : (float)r;
}

/* Whether a bucket gets codes: a zero or non-finite norm sends the zero code everywhere. */
FC_HOSTDEV int fc_qsgd_ok(float norm)
{
    return norm > 0 && fc_abs_bits(norm) < FC_INF_BITS;
}

/* inv = s / ||x|| (finite, > 0); h: the element's 16-bit draw (fc_rng_u16). */
FC_HOSTDEV uint32_t fc_qsgd_code(float x, float inv, int32_t levels, uint32_t h)
{
    float p = fc_bits_f32(fc_abs_bits(x)) * inv;
    int32_t l = fc_floor_i32(p);
    l += fc_u01_16(h) < p - (float)l;
    if (l > levels)
        l = levels;
    return ((uint32_t)l << 1) | (fc_f32_bits(x) >> 31);
}

/* step = ||x|| / s */
FC_HOSTDEV float fc_qsgd_value(uint32_t code, float step)
{
    float v = (float)(code >> 1) * step;
    return (code & 1u) ? -v : v;
}

#endif
