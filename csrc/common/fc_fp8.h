/* fc_fp8.h: OCP FP8 (e4m3, e5m2) to and from fp32, round to nearest even, saturating at the
 * format's largest finite value. Bit-exact on the CPU and in CUDA kernels (no libm, no FMA). */
#ifndef FC_FP8_H
#define FC_FP8_H

#include <stdint.h>
#include "common/fc_half.h"
#include "common/fc_hostdev.h"
#include "common/fc_quant.h"

/* fmt 0: e4m3 (bias 7, 3 mantissa bits, max 448, no Inf); fmt 1: e5m2 (bias 15, max 57344). */
#define FC_FP8_E4M3 0
#define FC_FP8_E5M2 1

FC_HOSTDEV float fc_fp8_max(int fmt)
{
    return fmt == FC_FP8_E4M3 ? 448.0f : 57344.0f;
}

/* v finite. NaN and overflow never reach here: blocks are scaled to amax = max. */
FC_HOSTDEV uint8_t fc_f32_to_fp8(float v, int fmt)
{
    const int M = fmt == FC_FP8_E4M3 ? 3 : 2;
    const int B = fmt == FC_FP8_E4M3 ? 7 : 15;
    const uint32_t maxcode = fmt == FC_FP8_E4M3 ? 0x7Eu : 0x7Bu;
    uint32_t u = fc_f32_bits(v);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7fffffffu;
    uint32_t code;
    /* smallest normal 2^(1-B): exponent field 128 - B in fp32 */
    if (a < ((uint32_t)(128 - B) << 23)) {
        /* subnormal: integer multiple of 2^(1-B-M); 2^M is the smallest normal's code */
        float scaled = fc_bits_f32(a) * fc_bits_f32((uint32_t)(127 + B - 1 + M) << 23);
        code = (uint32_t)fc_round_even(scaled);
    } else {
        const int drop = 23 - M;
        uint32_t r = a + ((1u << (drop - 1)) - 1u) + ((a >> drop) & 1u);
        code = (r >> drop) - ((uint32_t)(127 - B) << M);
    }
    if (code > maxcode)
        code = maxcode;
    return (uint8_t)(sign | code);
}

FC_HOSTDEV float fc_fp8_to_f32(uint8_t h, int fmt)
{
    const int M = fmt == FC_FP8_E4M3 ? 3 : 2;
    const int B = fmt == FC_FP8_E4M3 ? 7 : 15;
    uint32_t sign = ((uint32_t)h & 0x80u) << 24;
    uint32_t e = ((uint32_t)h & 0x7fu) >> M;
    uint32_t m = (uint32_t)h & ((1u << M) - 1u);
    float v;
    if (e == 0)
        v = (float)m * fc_bits_f32((uint32_t)(127 - (B - 1) - M) << 23);
    else
        v = fc_bits_f32(((e + 127u - (uint32_t)B) << 23) | (m << (23 - M)));
    return fc_bits_f32(fc_f32_bits(v) | sign);
}

#endif
