/* fc_rng_batch.h: the CPU path's Philox for 16 consecutive groups at once (64 draws), in
 * structure-of-arrays form: SSE2 (every x86-64) runs 4 streams per instruction, other CPUs
 * the plain loop, which the compiler may vectorise. Same numbers as
 * fc_rng_draw4 for each group: word j of group g is out[j][g - group0]. */
#ifndef FC_RNG_BATCH_H
#define FC_RNG_BATCH_H

#include <stdint.h>
#include "fc_rng.h"

#define FC_RNG_BATCH 16

#if defined(__SSE2__)
#include <emmintrin.h>

/* hi and lo 32 bits of the 4 products a[i] * m: SSE2 multiplies lanes 0 and 2, so lanes 1
 * and 3 go through a shifted copy, and the halves are interleaved back. */
static inline void fc_mulhilo_x4(__m128i a, __m128i m, __m128i *hi, __m128i *lo)
{
    __m128i even = _mm_shuffle_epi32(_mm_mul_epu32(a, m), _MM_SHUFFLE(3, 1, 2, 0));
    __m128i odd = _mm_shuffle_epi32(_mm_mul_epu32(_mm_srli_epi64(a, 32), m), _MM_SHUFFLE(3, 1, 2, 0));
    *lo = _mm_unpacklo_epi32(even, odd);
    *hi = _mm_unpackhi_epi32(even, odd);
}

static inline void fc_rng_draw_batch(const fc_rng *g, uint32_t group0, uint32_t out[4][FC_RNG_BATCH])
{
    const __m128i m0 = _mm_set1_epi32((int)0xD2511F53u), m1 = _mm_set1_epi32((int)0xCD9E8D57u);
    for (int v = 0; v < FC_RNG_BATCH / 4; v++) {
        const uint32_t b = group0 + 4u * (uint32_t)v;
        __m128i c0 = _mm_setr_epi32((int)b, (int)(b + 1u), (int)(b + 2u), (int)(b + 3u));
        __m128i c1 = _mm_set1_epi32((int)g->chunk), c2 = _mm_set1_epi32((int)g->unit);
        __m128i c3 = _mm_set1_epi32((int)g->step);
        uint32_t k0 = g->key0, k1 = g->key1;
        for (int round = 0; round < 10; round++) {
            __m128i hi0, lo0, hi1, lo1;
            fc_mulhilo_x4(c0, m0, &hi0, &lo0);
            fc_mulhilo_x4(c2, m1, &hi1, &lo1);
            c0 = _mm_xor_si128(_mm_xor_si128(hi1, c1), _mm_set1_epi32((int)k0));
            c2 = _mm_xor_si128(_mm_xor_si128(hi0, c3), _mm_set1_epi32((int)k1));
            c1 = lo1;
            c3 = lo0;
            k0 += 0x9E3779B9u;
            k1 += 0xBB67AE85u;
        }
        _mm_storeu_si128((__m128i *)&out[0][4 * v], c0);
        _mm_storeu_si128((__m128i *)&out[1][4 * v], c1);
        _mm_storeu_si128((__m128i *)&out[2][4 * v], c2);
        _mm_storeu_si128((__m128i *)&out[3][4 * v], c3);
    }
}
#else
static inline void fc_rng_draw_batch(const fc_rng *g, uint32_t group0, uint32_t out[4][FC_RNG_BATCH])
{
    uint32_t c0[FC_RNG_BATCH], c1[FC_RNG_BATCH], c2[FC_RNG_BATCH], c3[FC_RNG_BATCH];
    for (int i = 0; i < FC_RNG_BATCH; i++) {
        c0[i] = group0 + (uint32_t)i;
        c1[i] = g->chunk;
        c2[i] = g->unit;
        c3[i] = g->step;
    }
    uint32_t k0 = g->key0, k1 = g->key1;
    for (int round = 0; round < 10; round++) {
        for (int i = 0; i < FC_RNG_BATCH; i++) {
            uint64_t p0 = (uint64_t)0xD2511F53u * c0[i];
            uint64_t p1 = (uint64_t)0xCD9E8D57u * c2[i];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[i] ^ k0;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[i] ^ k1;
            c1[i] = (uint32_t)p1;
            c3[i] = (uint32_t)p0;
            c0[i] = n0;
            c2[i] = n2;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    for (int i = 0; i < FC_RNG_BATCH; i++) {
        out[0][i] = c0[i];
        out[1][i] = c1[i];
        out[2][i] = c2[i];
        out[3][i] = c3[i];
    }
}

#endif

/* u[e] = U[0,1) draw of element first + e, for 64 elements; first a multiple of 4. */
static inline void fc_u01_batch(const fc_rng *g, int64_t first, float u[4 * FC_RNG_BATCH])
{
    uint32_t r[4][FC_RNG_BATCH];
    fc_rng_draw_batch(g, (uint32_t)(first >> 2), r);
    for (int i = 0; i < FC_RNG_BATCH; i++)
        for (int j = 0; j < 4; j++)
            u[4 * i + j] = fc_u01(r[j][i]);
}

#endif
