/* fc_half.h: bit-exact fp32 <-> fp16 / bf16 conversions (round to nearest even), shared by the
 * CPU path and the CUDA kernels so both produce the same payload bytes. Narrowing saturates: a
 * finite value beyond the format's range becomes its largest finite value of the same sign
 * (fc_*_saturates tells when), Inf stays Inf, and every NaN becomes the one canonical quiet NaN
 * of the format (FC_BF16_NAN, FC_F16_NAN), whatever its sign and payload were. */
#ifndef FC_HALF_H
#define FC_HALF_H

#include <stdint.h>
#include <string.h>
#include "common/fc_hostdev.h"

FC_HOSTDEV uint32_t fc_f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

FC_HOSTDEV float fc_bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define FC_BF16_NAN 0x7fc0u
#define FC_F16_NAN 0x7e00u

/* 1 when finite f rounds beyond bf16's largest finite value (3.3895e38): what
 * fc_f32_to_bf16 clamps. */
FC_HOSTDEV int fc_bf16_saturates(float f)
{
    const uint32_t a = fc_f32_bits(f) & 0x7fffffffu;
    return a < 0x7f800000u && a + 0x7fffu + ((a >> 16) & 1u) >= 0x7f800000u;
}

FC_HOSTDEV uint16_t fc_f32_to_bf16(float f)
{
    uint32_t u = fc_f32_bits(f);
    const uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)FC_BF16_NAN;
    if (a == 0x7f800000u)
        return (uint16_t)(u >> 16);
    u += 0x7fffu + ((u >> 16) & 1u);
    if ((u & 0x7fffffffu) >= 0x7f800000u) /* rounded up to Inf: saturate */
        return (uint16_t)(((u >> 16) & 0x8000u) | 0x7f7fu);
    return (uint16_t)(u >> 16);
}

FC_HOSTDEV float fc_bf16_to_f32(uint16_t h)
{
    return fc_bits_f32((uint32_t)h << 16);
}

/* 1 when finite f rounds beyond fp16's largest finite value (65504): what fc_f32_to_f16
 * clamps. */
FC_HOSTDEV int fc_f16_saturates(float f)
{
    const uint32_t a = fc_f32_bits(f) & 0x7fffffffu;
    return a >= 0x477ff000u && a < 0x7f800000u;
}

FC_HOSTDEV uint16_t fc_f32_to_f16(float f)
{
    uint32_t u = fc_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)FC_F16_NAN;
    if (a == 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u);
    if (a >= 0x477ff000u) /* rounds to >= 65520: saturate at 65504 */
        return (uint16_t)(sign | 0x7bffu);
    if (a < 0x38800000u) { /* below the smallest normal 2^-14: subnormal or zero */
        if (a < 0x33000000u) /* below half of the smallest subnormal 2^-25 */
            return (uint16_t)sign;
        uint32_t e = a >> 23;
        uint32_t m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14..24 */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* round mantissa to 10 bits, ties to even */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

FC_HOSTDEV float fc_f16_to_f32(uint16_t h)
{
    uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
    uint32_t e = ((uint32_t)h >> 10) & 0x1fu;
    uint32_t m = (uint32_t)h & 0x3ffu;
    if (e == 0x1fu)
        return fc_bits_f32(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        /* subnormal: m * 2^-24, exact in fp32 */
        float v = (float)m * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return fc_bits_f32(sign | ((e + 112u) << 23) | (m << 13));
}

#endif
