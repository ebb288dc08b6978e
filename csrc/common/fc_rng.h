/* fc_rng.h: Philox-4x32-10 (Salmon et al., SC 2011), a counter-based generator: the number for
 * (seed, step, unit, chunk, element) is a pure function of those, so the CPU reference and the
 * CUDA kernels draw identical randomness in any thread order. */
#ifndef FC_RNG_H
#define FC_RNG_H

#include <stdint.h>
#include "common/fc_hostdev.h"

typedef struct {
    uint32_t v[4];
} fc_u32x4;

/* The stream of one chunk: key from the seed, counter words 1..3 from (chunk, unit, step). */
typedef struct {
    uint32_t key0, key1;
    uint32_t chunk, unit, step;
} fc_rng;

FC_HOSTDEV void fc_mulhilo32(uint32_t a, uint32_t b, uint32_t *hi, uint32_t *lo)
{
    uint64_t p = (uint64_t)a * (uint64_t)b;
    *hi = (uint32_t)(p >> 32);
    *lo = (uint32_t)p;
}

FC_HOSTDEV fc_u32x4 fc_philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3,
                                     uint32_t k0, uint32_t k1)
{
    fc_u32x4 r;
    for (int round = 0; round < 10; round++) {
        uint32_t hi0, lo0, hi1, lo1;
        fc_mulhilo32(0xD2511F53u, c0, &hi0, &lo0);
        fc_mulhilo32(0xCD9E8D57u, c2, &hi1, &lo1);
        uint32_t n0 = hi1 ^ c1 ^ k0;
        uint32_t n1 = lo1;
        uint32_t n2 = hi0 ^ c3 ^ k1;
        uint32_t n3 = lo0;
        c0 = n0;
        c1 = n1;
        c2 = n2;
        c3 = n3;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    r.v[0] = c0;
    r.v[1] = c1;
    r.v[2] = c2;
    r.v[3] = c3;
    return r;
}

/* Four 32-bit draws for elements 4*group .. 4*group+3 of the chunk (32-bit users). */
FC_HOSTDEV fc_u32x4 fc_rng_draw4(const fc_rng *g, uint32_t group)
{
    return fc_philox4x32_10(group, g->chunk, g->unit, g->step, g->key0, g->key1);
}

/* Uniform in [0, 1) with 24 random bits: exactly representable, identical on CPU and GPU. */
FC_HOSTDEV float fc_u01(uint32_t bits)
{
    return (float)(bits >> 8) * 5.9604644775390625e-08f;
}

/* The draw for one element, when a method needs 32 bits (random-k indices, bases). */
FC_HOSTDEV uint32_t fc_rng_u32(const fc_rng *g, uint64_t element)
{
    fc_u32x4 r = fc_rng_draw4(g, (uint32_t)(element >> 2));
    return r.v[element & 3u];
}

/* Stochastic rounding draws 16 bits per element: element i takes half (i & 1) (0: the low
 * half) of word (i >> 1) & 3 of Philox call i >> 3, so one call serves 8 elements and the
 * calls' words, stored in order, read as uint16 are the elements' draws in order (the CPU
 * batch relies on that). u = h * 2^-16 is exact in fp32; rounding up with probability
 * P(u < frac) is then biased by less than 2^-16 of a quantisation step. */
FC_HOSTDEV fc_u32x4 fc_rng_draw8(const fc_rng *g, uint32_t call)
{
    return fc_philox4x32_10(call, g->chunk, g->unit, g->step, g->key0, g->key1);
}

/* The 16 bits of element k (0..7) of a call's result. */
FC_HOSTDEV uint32_t fc_rng_h16(fc_u32x4 r, uint32_t k)
{
    return (r.v[(k >> 1) & 3u] >> (16u * (k & 1u))) & 0xFFFFu;
}

FC_HOSTDEV float fc_u01_16(uint32_t h)
{
    return (float)h * 1.52587890625e-05f; /* 2^-16 */
}

/* Element i's 16-bit draw alone: the definition the batched paths must reproduce. */
FC_HOSTDEV uint32_t fc_rng_u16(const fc_rng *g, uint64_t element)
{
    return fc_rng_h16(fc_rng_draw8(g, (uint32_t)(element >> 3)), (uint32_t)(element & 7u));
}

#endif
