/* fc_res8.h: the 8-bit error-feedback residual (residual_dtype "int8"), one rule for the CPU
 * loops (fc_res8.c) and the CUDA kernels (cuda/fc_cu_res8.cu).
 *
 * Layout of a residual of n elements, a uint8 tensor of fc_res8_bytes(n) bytes: first one fp32
 * scale per block of FC_RES8_BLOCK elements (so the scales are 4-byte aligned), then n int8
 * codes. Element i is code[i] * scale[i / FC_RES8_BLOCK]: 1 + 4/64 = 1.0625 bytes per element.
 *
 * Why stochastic rounding: a residual is re-quantized on every step, and with round-to-nearest
 * a component smaller than half a step would be rounded away every time and never reach the
 * wire: the error would pile up in one direction. Rounded up with probability equal to the
 * fraction, E[code * scale] = e, and the per-step errors are independent and zero-mean. The
 * draw is a pure function of (key, element), so CPU and GPU pack the same bytes. */
#ifndef FC_RES8_H
#define FC_RES8_H

#include <math.h>
#include <stdint.h>
#include "common/fc_hash.h"
#include "common/fc_hostdev.h"
#include "common/fc_quant.h" /* fc_canon_nan */

#define FC_RES8_BLOCK 64
#define FC_RES8_CODE_MAX 127 /* symmetric: -127 .. 127 */

/* What a packed residual is rounded with: salt tells the residual's homes apart (the
 * reduce-scatter's, the all-gather half's, PowerSGD's), so a step's two packs do not share
 * their draws. */
enum { FC_RES8_SALT_SCATTER = 1, FC_RES8_SALT_FETCH = 2, FC_RES8_SALT_GATHER = 3,
       FC_RES8_SALT_POWERSGD = 4 };

FC_HOSTDEV int64_t fc_res8_blocks(int64_t n)
{
    return (n + FC_RES8_BLOCK - 1) / FC_RES8_BLOCK;
}

FC_HOSTDEV int64_t fc_res8_bytes(int64_t n)
{
    return 4 * fc_res8_blocks(n) + n;
}

/* The n whose residual is `bytes` long (fc_res8_bytes(n) == bytes), or -1 where no n is: the
 * blocks are ceil(bytes / 68), since 68 (b - 1) < fc_res8_bytes(n) <= 68 b for b blocks. */
FC_HOSTDEV int64_t fc_res8_numel(int64_t bytes)
{
    const int64_t blocks = (bytes + FC_RES8_BLOCK + 3) / (FC_RES8_BLOCK + 4);
    const int64_t n = bytes - 4 * blocks;
    return bytes >= 0 && n >= 0 && fc_res8_bytes(n) == bytes ? n : -1;
}

/* The stream's key from (seed, step, unit, salt). */
FC_HOSTDEV uint32_t fc_res8_key(uint64_t seed, uint32_t step, uint32_t unit, uint32_t salt)
{
    uint32_t h = fc_fmix32((uint32_t)seed ^ 0x27D4EB2Fu * salt);
    h = fc_fmix32(h ^ (uint32_t)(seed >> 32) ^ 0x165667B1u * step);
    return fc_fmix32(h ^ 0x9E3779B1u * (unit + 1u));
}

/* Element i's draw, uniform in [0, 1) with 24 bits (exact in fp32), in two steps so a loop can
 * hoist the first: the high word's hash is one per 2^32 elements, so one per block. */
FC_HOSTDEV uint32_t fc_res8_u_high(uint32_t key, int64_t i)
{
    return fc_fmix32((uint32_t)(i >> 32) ^ key);
}

FC_HOSTDEV float fc_res8_u_low(uint32_t high, int64_t i)
{
    const uint32_t h = fc_fmix32((uint32_t)i * 0x9E3779B1u ^ high);
    return (float)(h >> 8) * 5.9604644775390625e-08f;
}

FC_HOSTDEV float fc_res8_u(uint32_t key, int64_t i)
{
    return fc_res8_u_low(fc_res8_u_high(key, i), i);
}

/* The block's scale from its largest |e| (a residual is always finite): code 127 is amax. Where
 * 127 * scale rounds past fp32 (amax within a few ulps of its largest value, which a saturated
 * residual holds: fc_max_like), the scale is one ulp smaller, so an unpacked residual stays
 * finite (127 * scale is then about 2 ulps below fp32's largest). An infinite amax (pack_residual
 * of any tensor) keeps its infinite scale: every code 0. */
FC_HOSTDEV float fc_res8_scale(float amax)
{
    const float scale = amax / (float)FC_RES8_CODE_MAX;
    const float top = (float)FC_RES8_CODE_MAX * scale;
    if (fc_abs_bits(scale) < FC_INF_BITS && !(fc_abs_bits(top) < FC_INF_BITS))
        return fc_bits_f32(fc_f32_bits(scale) - 1u);
    return scale;
}

/* floor(e / scale + u), clamped (e / scale can round a hair past 127, + u past it too). A
 * scale of 0 (an all-zero block, or one whose amax / 127 underflows) codes 0. A division and an
 * add, never a multiply-add: nothing for a compiler to contract, the same bits on both sides.
 * A NaN y (a residual is finite, but pack_residual() takes any tensor: Inf / Inf in a block whose
 * amax is Inf, a NaN e) codes 0: its conversion to an integer is undefined in C, and x86 and a
 * GPU's cvt answer differently. */
FC_HOSTDEV int8_t fc_res8_code(float e, float scale, float u)
{
    if (!(scale > 0.0f))
        return 0;
    float y = e / scale;
    y = y + u;
    if (y != y)
        return 0;
    y = y < -(float)FC_RES8_CODE_MAX ? -(float)FC_RES8_CODE_MAX
        : y > (float)FC_RES8_CODE_MAX ? (float)FC_RES8_CODE_MAX : y;
    return (int8_t)floorf(y); /* y is in [-127, 127]: floor stays there */
}

/* code * scale; a NaN (0 * Inf, a block whose scale is Inf) as the canonical one: x86 makes
 * 0xffc00000 there and a GPU 0x7fffffff (the H200's run 3 found them apart). */
FC_HOSTDEV float fc_res8_value(int8_t code, float scale)
{
    return fc_canon_nan((float)code * scale);
}

#endif
