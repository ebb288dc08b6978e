/* fc_half.h: bit-exact fp32 <-> fp16 / bf16 conversions (round to nearest even), shared by the
 * CPU path and the CUDA kernels so both produce the same payload bytes. */
#ifndef FC_HALF_H
#define FC_HALF_H

#include <stdint.h>
#include <string.h>
#include "fc_hostdev.h"

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

FC_HOSTDEV uint16_t fc_f32_to_bf16(float f)
{
    uint32_t u = fc_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a (quiet) NaN */
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

FC_HOSTDEV float fc_bf16_to_f32(uint16_t h)
{
    return fc_bits_f32((uint32_t)h << 16);
}

FC_HOSTDEV uint16_t fc_f32_to_f16(float f)
{
    uint32_t u = fc_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* Inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
    if (a >= 0x477ff000u) /* rounds to >= 65520: overflow to Inf */
        return (uint16_t)(sign | 0x7c00u);
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
