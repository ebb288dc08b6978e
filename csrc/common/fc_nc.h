/* fc_nc.h: natural compression (Horvath et al. 2019): stochastic rounding of |x| to one of the
 * two powers of two around it, unbiased. One byte per element: sign bit + 7-bit exponent code
 * relative to the block's largest exponent (0: zero). Shared by the CPU path and CUDA. */
#ifndef FC_NC_H
#define FC_NC_H

#include <stdint.h>
#include "common/fc_half.h"
#include <string.h>
#include "common/fc_hostdev.h"

#define FC_NC_SPAN 126 /* codes 1..126: exponents emax+1 down to emax-124 */

/* Code of x for a block whose largest fp32 exponent field is emax (1..254); h: the element's
 * 16-bit draw (u = h * 2^-16, fc_rng_u16).
 * code c means |value| = 2^(emax + 2 - c - 127). */
FC_HOSTDEV uint8_t fc_nc_encode(float x, uint32_t emax, uint32_t h)
{
    uint32_t u = fc_f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    int32_t e = (int32_t)(a >> 23);
    uint32_t mant = a & 0x7fffffu;
    int32_t lo = (int32_t)emax + 1 - (FC_NC_SPAN - 1); /* smallest exponent field kept */
    if (lo < 1)
        lo = 1; /* fp32 subnormals have no implicit bit: they go through the path below */
    if (a == 0)
        return 0;
    if (e >= lo) {
        /* 2^e <= |x| < 2^(e+1): up when u < mant / 2^23, i.e. with probability
         * ceil(mant / 2^7) / 2^16, within 2^-16 of mant / 2^23 */
        int32_t up = (h << 7) < mant;
        if (e + up > 254) /* 2^128 is not a float */
            up = 0;
        return (uint8_t)(sign | (uint8_t)((int32_t)emax + 2 - (e + up)));
    }
    /* below the range: 0 or 2^lo, with P(2^lo) = |x| / 2^lo, computed in double (exact) */
    uint64_t bits = (uint64_t)(1023 + 127 - lo) << 52;
    double scale;
    memcpy(&scale, &bits, 8);
    double q = (double)fc_bits_f32(a) * scale;
    double ur = (double)h * (1.0 / 65536.0);
    return ur < q ? (uint8_t)(sign | (uint8_t)((int32_t)emax + 2 - lo)) : (uint8_t)0;
}

/* 1 when fc_nc_encode saturates x: its draw rounds |x| up to 2^128, which is not a float, so
 * it is rounded down to 2^127 instead (the rest stays in the residual with error feedback). */
FC_HOSTDEV int fc_nc_saturates(float x, uint32_t h)
{
    const uint32_t a = fc_f32_bits(x) & 0x7fffffffu;
    return (a >> 23) == 254u && (h << 7) < (a & 0x7fffffu);
}

/* The block's reference exponent from its absmax bits: *stored is what the body carries (255:
 * Inf/NaN in the block, 0: all zeros, 1 for a block of subnormals only, referenced to the
 * smallest normal exponent); returns the emax the codes use, 0 when the block gets zero codes. */
FC_HOSTDEV uint32_t fc_nc_emax(uint32_t amax_bits, uint32_t *stored)
{
    uint32_t emax = amax_bits >> 23;
    if (emax == 0 && amax_bits != 0)
        emax = 1;
    *stored = emax;
    return emax == 255 || amax_bits == 0 ? 0u : emax;
}

/* A code the encoder cannot write for a block of exponent emax (< 255): an exponent above the
 * block's (7-bit code above emax + 1) or a signed zero code. */
FC_HOSTDEV int fc_nc_code_bad(uint32_t code, uint32_t emax)
{
    const uint32_t cc = code & 0x7fu;
    return cc > emax + 1u || (cc == 0 && code != 0);
}

FC_HOSTDEV float fc_nc_decode(uint8_t code, uint32_t emax)
{
    uint32_t c = code & 0x7fu;
    if (c == 0)
        return 0.0f;
    uint32_t e = emax + 2u - c;
    return fc_bits_f32(((uint32_t)(code & 0x80u) << 24) | (e << 23));
}

/* What decode_add adds for a valid code: alpha * value, and +0 (not alpha * 0) for the zero
 * code, as both CPU decoders do. */
FC_HOSTDEV float fc_nc_term(uint8_t code, uint32_t emax, float alpha)
{
    return (code & 0x7fu) == 0 ? 0.0f : alpha * fc_nc_decode(code, emax);
}

#endif
