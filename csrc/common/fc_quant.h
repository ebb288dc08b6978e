/* fc_quant.h: scalar pieces the block quantisers share, written once for the CPU reference and
 * the CUDA kernels. Rounding avoids libm so that both paths, and every compiler, agree bit for
 * bit (the build disables FMA contraction for the same reason). */
#ifndef FC_QUANT_H
#define FC_QUANT_H

#include <stdint.h>
#include "common/fc_half.h"
#include "common/fc_hostdev.h"

/* Round to nearest, ties to even, for |v| < 2^22: the 1.5 * 2^23 trick. */
FC_HOSTDEV float fc_round_even(float v)
{
    const float magic = 12582912.0f;
    /* Not folded away: the build never enables -ffast-math / --use_fast_math. */
    return (v + magic) - magic;
}

/* floor(v) for |v| < 2^31 without libm. A NaN or a v outside int32 (a block whose 1 / scale
 * overflowed) gives INT32_MIN, as x86's conversion does on the CPU path; a GPU's conversion
 * saturates, so the kernels ask for x86's answer. */
FC_HOSTDEV int32_t fc_floor_i32(float v)
{
#ifdef __CUDA_ARCH__
    if (!(v >= -2147483648.0f && v < 2147483648.0f))
        return INT32_MIN;
#endif
    int32_t t = (int32_t)v;
    return t - ((float)t > v);
}

/* |x| as bits: for non-negative floats integer order is float order, and any NaN compares
 * above +Inf (0x7f800000), so a block's absmax and its "has a NaN" test are one integer max. */
FC_HOSTDEV uint32_t fc_abs_bits(float x)
{
    return fc_f32_bits(x) & 0x7fffffffu;
}

#define FC_INF_BITS 0x7f800000u
#define FC_MAX_BITS 0x7f7fffffu /* fp32's largest finite value, 3.4028235e38 */

/* The one quiet NaN every fp32 field on the wire carries (0x7fc00000, C's NAN on x86), on the
 * CPU and in CUDA (whose own NaN is 0x7fffffff and NAN no device constant): whatever NaN an
 * input or an operation produced, a payload holds this one. */
#define FC_NAN_BITS 0x7fc00000u

/* v, with any NaN replaced by the canonical one (FC_NAN_BITS). */
FC_HOSTDEV float fc_canon_nan(float v)
{
    return fc_abs_bits(v) > FC_INF_BITS ? fc_bits_f32(FC_NAN_BITS) : v;
}

/* v if finite, else the canonical NaN: what a block's metadata carries for a block that held
 * NaN or Inf (its elements then decode to NaN, so the problem is passed through and counted). */
FC_HOSTDEV float fc_finite_or_nan(float v)
{
    return fc_abs_bits(v) < FC_INF_BITS ? v : fc_bits_f32(FC_NAN_BITS);
}

/* a + b, where a sum of two finite values beyond fp32 saturates at its largest value (*sat
 * counts it); NaN and Inf operands pass as IEEE adds them. */
FC_HOSTDEV float fc_add_sat(float a, float b, int64_t *sat)
{
    const float s = a + b;
    if (fc_abs_bits(s) >= FC_INF_BITS && fc_abs_bits(a) < FC_INF_BITS &&
        fc_abs_bits(b) < FC_INF_BITS) {
        ++*sat;
        return fc_bits_f32((fc_f32_bits(s) & 0x80000000u) | FC_MAX_BITS);
    }
    return s;
}

/* a * b, saturated the same way (a product of finite values beyond fp32). */
FC_HOSTDEV float fc_mul_sat(float a, float b, int64_t *sat)
{
    const float s = a * b;
    if (fc_abs_bits(s) >= FC_INF_BITS && fc_abs_bits(a) < FC_INF_BITS &&
        fc_abs_bits(b) < FC_INF_BITS) {
        ++*sat;
        return fc_bits_f32((fc_f32_bits(s) & 0x80000000u) | FC_MAX_BITS);
    }
    return s;
}

/* A block scale s = amax / qmax whose top code must decode finite: s * qmax rounds above fp32's
 * largest value when amax is within an ulp of it, so such an s is taken one ulp smaller (the
 * elements at the top then clamp to qmax, a saturation within rounding of amax). */
FC_HOSTDEV float fc_scale_fits(float scale, float qmax)
{
    return fc_abs_bits(scale * qmax) >= FC_INF_BITS ? fc_bits_f32(fc_f32_bits(scale) - 1u) : scale;
}

/* The absmax scale of a block for a symmetric quantiser whose largest code is qmax, from the
 * block's largest |x| as bits (fc_abs_bits): writes scale = amax / qmax and returns the
 * multiplier qmax / amax, or returns 0 for a block that is all zeros (scale 0), that holds a
 * NaN/Inf (scale NaN: the block decodes to NaN, so the problem is passed through and counted
 * by the driver instead of becoming silent zeros), or whose absmax is so small that qmax / amax
 * overflows fp32 (below about 1e-36; scale 0: the block is flushed to zero, its values stay in
 * the residual with error feedback). On 0 the caller writes the zero code and does no
 * arithmetic on the block. A finite block always decodes finite (fc_scale_fits). */
FC_HOSTDEV float fc_absmax_scale(uint32_t amax_bits, float qmax, float *scale)
{
    if (amax_bits >= FC_INF_BITS || amax_bits == 0) {
        *scale = amax_bits == 0 ? 0.0f : fc_bits_f32(FC_NAN_BITS);
        return 0.0f;
    }
    const float amax = fc_bits_f32(amax_bits);
    const float inv = qmax / amax;
    if (fc_abs_bits(inv) >= FC_INF_BITS) {
        *scale = 0.0f;
        return 0.0f;
    }
    *scale = fc_scale_fits(amax / qmax, qmax);
    return inv;
}

#endif
