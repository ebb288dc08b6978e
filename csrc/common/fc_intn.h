/* fc_intn.h: intN's element rules (m_intn.c), written once for the CPU reference and the CUDA
 * kernels: the order key of a float, a block's code map from its absmax or its min and max,
 * one element's code, and what a code decodes to. */
#ifndef FC_INTN_H
#define FC_INTN_H

#include <stdint.h>
#include "common/fc_half.h"
#include "common/fc_hostdev.h"
#include "common/fc_quant.h"

enum { FC_INTN_ABSMAX = 0, FC_INTN_MINMAX = 1 };

/* How one block maps x to a code: x clamped to [-lim, lim], t = ((x - off) * pre) * inv,
 * q = round(t) or floor(t + u) clamped to [qlo, qhi], code = q - qlo. pre is 2^64 for blocks
 * below 2^-64, so inv stays finite for subnormal blocks (scaling by a power of two is exact
 * there) and t is never NaN. lim is fp32's largest value (no clamp) except in a min-max block
 * whose top code would decode beyond fp32 (values of both signs near 3.4e38): there it is
 * 2^126 (FC_INTN_LIM), the block's values are saturated to it and decode finite. A block that
 * is all zeros or holds a NaN/Inf (ok = 0) gets the code of 0 everywhere. */
typedef struct {
    float off, pre, inv, lim;
    int32_t qlo, qhi;
    int ok;
} fc_intn_map;

#define FC_INTN_TINY 0x1p-64f
#define FC_INTN_BIG 0x1p64f
#define FC_INTN_LIM 0x1p126f

/* fp32 bits as a signed integer in the order of the floats (-0 < +0), so that a block's min
 * and max are exact integer reductions in any order; NaNs land beyond -Inf and +Inf. The map
 * is its own inverse. */
FC_HOSTDEV int32_t fc_intn_key(uint32_t bits)
{
    return (int32_t)(bits ^ ((0u - (bits >> 31)) >> 1));
}

#define FC_INTN_KEY_NEG_INF ((int32_t)0x807FFFFF) /* fc_intn_key(-Inf bits) */

/* An absmax block from its largest |x| as bits: the map, and the block's scale for the body
 * (amax / qmax; 0 for a zero block, NaN for a non-finite one). */
FC_HOSTDEV float fc_intn_absmax_map(int bits, uint32_t amax_bits, fc_intn_map *p)
{
    const int32_t qmax = (1 << (bits - 1)) - 1;
    const float amax = fc_bits_f32(amax_bits);
    p->ok = amax_bits < FC_INF_BITS && amax_bits != 0;
    p->off = 0.0f;
    p->lim = fc_bits_f32(FC_MAX_BITS);
    p->pre = p->ok && amax < FC_INTN_TINY ? FC_INTN_BIG : 1.0f;
    p->inv = p->ok ? (float)qmax / (amax * p->pre) : 0.0f;
    p->qlo = -qmax;
    p->qhi = qmax;
    return amax_bits == 0 ? 0.0f
           : p->ok        ? fc_scale_fits(amax / (float)qmax, (float)qmax)
                          : fc_bits_f32(FC_NAN_BITS);
}

/* A min-max block from its smallest and largest value (`finite`: neither is NaN/Inf): the map,
 * and (m, d) for the body, m = min + 0 (a zero min is +0). Non-finite: (NaN, NaN), so the block
 * decodes to NaN and is counted, as absmax does. A block whose top code, m + L * d, would not
 * be finite (a range near or beyond fp32's, values of both signs near 3.4e38) is saturated:
 * its values are clamped to [-2^126, 2^126] first (map.lim), and it decodes finite. Constant:
 * (m, 0) and code 0, exact. */
FC_HOSTDEV void fc_intn_minmax_map(int bits, float small, float big, int finite, fc_intn_map *p,
                                   float *m_out, float *d_out)
{
    const int32_t levels = (1 << bits) - 1;
    float m = finite ? small + 0.0f : 0.0f;
    float range = finite ? big - m : 0.0f;
    p->lim = fc_bits_f32(FC_MAX_BITS);
    if (finite && (fc_abs_bits(range) >= FC_INF_BITS ||
                   fc_abs_bits((float)levels * (range / (float)levels)) >= FC_INF_BITS ||
                   fc_abs_bits(m + (float)levels * (range / (float)levels)) >= FC_INF_BITS)) {
        p->lim = FC_INTN_LIM;
        small = small < -FC_INTN_LIM ? -FC_INTN_LIM : small;
        big = big > FC_INTN_LIM ? FC_INTN_LIM : big;
        m = small + 0.0f;
        range = big - m;
    }
    const int valid = finite;
    p->ok = valid && range > 0.0f;
    p->off = p->ok ? m : 0.0f;
    p->pre = p->ok && range < FC_INTN_TINY ? FC_INTN_BIG : 1.0f;
    p->inv = p->ok ? (float)levels / (range * p->pre) : 0.0f;
    p->qlo = 0;
    p->qhi = levels;
    *m_out = valid ? m : fc_bits_f32(FC_NAN_BITS);
    *d_out = !valid ? fc_bits_f32(FC_NAN_BITS) : p->ok ? range / (float)levels : 0.0f;
}

/* The min-max block's (small, big, finite) from its integer key range. */
FC_HOSTDEV void fc_intn_key_range_values(int32_t kmin, int32_t kmax, float *small, float *big,
                                         int *finite)
{
    *small = fc_bits_f32((uint32_t)fc_intn_key((uint32_t)kmin));
    *big = fc_bits_f32((uint32_t)fc_intn_key((uint32_t)kmax));
    *finite = kmax < (int32_t)FC_INF_BITS && kmin > FC_INTN_KEY_NEG_INF;
}

/* The definition of one element's code; u: its draw in [0, 1) when stochastic. */
FC_HOSTDEV uint32_t fc_intn_code(const fc_intn_map *p, float x, int stochastic, float u)
{
    if (!p->ok)
        return (uint32_t)-p->qlo;
    x = x < -p->lim ? -p->lim : x > p->lim ? p->lim : x;
    const float t = ((x - p->off) * p->pre) * p->inv;
    int32_t q = stochastic ? fc_floor_i32(t + u) : (int32_t)fc_round_even(t);
    q = q < p->qlo ? p->qlo : q > p->qhi ? p->qhi : q;
    return (uint32_t)(q - p->qlo);
}

/* What code q of block b decodes to, times alpha: the definition both CPU decoders and the
 * CUDA kernels follow, in this order of operations (no fma: the builds forbid contraction).
 * absmax: (alpha * s) * (q - qmax); minmax: alpha * (m + q * d). */
typedef struct {
    float s, m, d, alpha;
    int32_t qmax; /* absmax: the code of 0 */
    uint32_t top; /* the largest code an encoder writes */
    int minmax;
} fc_intn_dec;

FC_HOSTDEV fc_intn_dec fc_intn_dec_block(int bits, int scheme, const float *meta, int64_t b,
                                         float alpha)
{
    fc_intn_dec d;
    d.s = d.m = d.d = 0.0f;
    d.qmax = 0;
    d.minmax = scheme == FC_INTN_MINMAX;
    d.alpha = alpha;
    if (d.minmax) {
        d.m = meta[2 * b];
        d.d = meta[2 * b + 1];
        d.top = (1u << bits) - 1u;
    } else {
        d.qmax = (1 << (bits - 1)) - 1;
        d.s = alpha * meta[b];
        d.top = (uint32_t)(2 * d.qmax);
    }
    return d;
}

FC_HOSTDEV float fc_intn_value(const fc_intn_dec *d, uint32_t code)
{
    if (d->minmax)
        return d->alpha * (d->m + (float)code * d->d);
    return d->s * (float)((int32_t)code - d->qmax);
}

#endif
