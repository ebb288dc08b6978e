/* fc_quant.h: scalar pieces the block quantisers share, written once for the CPU reference and
 * the CUDA kernels. Rounding avoids libm so that both paths, and every compiler, agree bit for
 * bit (the build disables FMA contraction for the same reason). */
#ifndef FC_QUANT_H
#define FC_QUANT_H

#include <stdint.h>
#include "fc_half.h"
#include "fc_hostdev.h"

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

/* The quiet NaN C's NAN is on x86 (0x7fc00000), as bits: what the block quantisers write for a
 * block holding a NaN or Inf, on the CPU and in CUDA (where NAN is not a device constant). */
#define FC_NAN_BITS 0x7fc00000u

/* r = a op b with the NaN x86 gives (the first NaN operand, quieted; Inf - Inf: its default NaN,
 * 0xffc00000): what the CPU path's g + e is, from its hardware. The CUDA kernels add g + e with
 * fc_add_x86, since a GPU's arithmetic returns one canonical NaN, and a NaN's sign and payload
 * reach the payload bytes (onebit's sign bits, the NaN of qsgd's and onebit's sums, casts). */
FC_HOSTDEV float fc_nan_x86(float r, float a, float b)
{
    if (fc_abs_bits(r) <= FC_INF_BITS)
        return r;
    if (fc_abs_bits(a) > FC_INF_BITS)
        return fc_bits_f32(fc_f32_bits(a) | 0x00400000u);
    if (fc_abs_bits(b) > FC_INF_BITS)
        return fc_bits_f32(fc_f32_bits(b) | 0x00400000u);
    return fc_bits_f32(0xffc00000u);
}

FC_HOSTDEV float fc_add_x86(float a, float b)
{
    return fc_nan_x86(a + b, a, b);
}

/* a * b, the same way (fp16's pre-division by the world size). */
FC_HOSTDEV float fc_mul_x86(float a, float b)
{
    return fc_nan_x86(a * b, a, b);
}

/* The absmax scale of a block for a symmetric quantiser whose largest code is qmax, from the
 * block's largest |x| as bits (fc_abs_bits): writes scale = amax / qmax and returns the
 * multiplier qmax / amax, or returns 0 for a block that is all zeros (scale 0) or holds a
 * NaN/Inf (scale NaN: the block decodes to NaN, so the problem is passed through and counted
 * by the driver instead of becoming silent zeros). On 0 the caller writes the zero code and
 * does no arithmetic on the block. */
FC_HOSTDEV float fc_absmax_scale(uint32_t amax_bits, float qmax, float *scale)
{
    if (amax_bits >= FC_INF_BITS || amax_bits == 0) {
        *scale = amax_bits == 0 ? 0.0f : fc_bits_f32(FC_NAN_BITS);
        return 0.0f;
    }
    const float amax = fc_bits_f32(amax_bits);
    *scale = amax / qmax;
    return qmax / amax;
}

#endif
