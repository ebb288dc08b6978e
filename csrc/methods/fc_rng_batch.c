/* fc_rng_batch.c: Philox-4x32-10 for runs of consecutive calls (see fc_rng_batch.h), in AVX-512,
 * AVX2 and SSE2 versions of the scalar fc_philox4x32_10, chosen by CPU at load time. */
#include "methods/fc_rng_batch.h"

#include <string.h>

void fc_rng_fill16_scalar(const fc_rng *g, int64_t first, int64_t calls, uint16_t *h)
{
    const uint32_t call0 = (uint32_t)(first >> 3);
    for (int64_t c = 0; c < calls; c++) {
        const fc_u32x4 r = fc_rng_draw8(g, call0 + (uint32_t)c);
        for (uint32_t k = 0; k < 8; k++)
            h[8 * c + k] = (uint16_t)fc_rng_h16(r, k);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

/* Calls call0 .. call0+3, 4 streams per instruction; the 4x4 transpose at the end stores
 * each call's 4 words contiguously, which read as uint16 are its 8 elements' draws in order
 * (x86 is little-endian: the low half first, as fc_rng_h16 says). */
static inline void philox_sse2(const fc_rng *g, uint32_t call0, uint16_t *h)
{
    const __m128i m0 = _mm_set1_epi32((int)0xD2511F53u), m1 = _mm_set1_epi32((int)0xCD9E8D57u);
    __m128i c0 = _mm_add_epi32(_mm_set1_epi32((int)call0), _mm_setr_epi32(0, 1, 2, 3));
    __m128i c1 = _mm_set1_epi32((int)g->chunk), c2 = _mm_set1_epi32((int)g->unit);
    __m128i c3 = _mm_set1_epi32((int)g->step);
    uint32_t k0 = g->key0, k1 = g->key1;
    for (int round = 0; round < 10; round++) {
        /* SSE2 multiplies lanes 0 and 2; lanes 1 and 3 through a shifted copy */
        const __m128i e0 = _mm_mul_epu32(c0, m0), o0 = _mm_mul_epu32(_mm_srli_epi64(c0, 32), m0);
        const __m128i e1 = _mm_mul_epu32(c2, m1), o1 = _mm_mul_epu32(_mm_srli_epi64(c2, 32), m1);
        const __m128i mask = _mm_setr_epi32(-1, 0, -1, 0);
        const __m128i lo0 = _mm_or_si128(_mm_and_si128(e0, mask), _mm_slli_epi64(o0, 32));
        const __m128i hi0 = _mm_or_si128(_mm_srli_epi64(e0, 32), _mm_andnot_si128(mask, o0));
        const __m128i lo1 = _mm_or_si128(_mm_and_si128(e1, mask), _mm_slli_epi64(o1, 32));
        const __m128i hi1 = _mm_or_si128(_mm_srli_epi64(e1, 32), _mm_andnot_si128(mask, o1));
        c0 = _mm_xor_si128(_mm_xor_si128(hi1, c1), _mm_set1_epi32((int)k0));
        c2 = _mm_xor_si128(_mm_xor_si128(hi0, c3), _mm_set1_epi32((int)k1));
        c1 = lo1;
        c3 = lo0;
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    const __m128i t0 = _mm_unpacklo_epi32(c0, c1), t1 = _mm_unpackhi_epi32(c0, c1);
    const __m128i t2 = _mm_unpacklo_epi32(c2, c3), t3 = _mm_unpackhi_epi32(c2, c3);
    _mm_storeu_si128((__m128i *)h, _mm_unpacklo_epi64(t0, t2));
    _mm_storeu_si128((__m128i *)(h + 8), _mm_unpackhi_epi64(t0, t2));
    _mm_storeu_si128((__m128i *)(h + 16), _mm_unpacklo_epi64(t1, t3));
    _mm_storeu_si128((__m128i *)(h + 24), _mm_unpackhi_epi64(t1, t3));
}

static void fill16_sse2(const fc_rng *g, int64_t first, int64_t calls, uint16_t *h)
{
    const uint32_t call0 = (uint32_t)(first >> 3);
    int64_t c = 0;
    for (; c + 4 <= calls; c += 4)
        philox_sse2(g, call0 + (uint32_t)c, h + 8 * c);
    fc_rng_fill16_scalar(g, first + 8 * c, calls - c, h + 8 * c);
}

#define FC_AVX2 __attribute__((target("avx2")))

/* hi and lo 32 bits of a[i] * m for 8 lanes: even lanes directly, odd ones shifted down. */
FC_AVX2 static inline void mulhilo_avx2(__m256i a, __m256i m, __m256i *hi, __m256i *lo)
{
    const __m256i even = _mm256_mul_epu32(a, m), odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m);
    *lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

/* Calls call0 .. call0 + 8 * sets - 1 as independent 8-stream sets, interleaved so one set's
 * multiplies run while the other waits on its own; `sets` (1 or 2) is a literal at each call. */
FC_AVX2 static inline __attribute__((always_inline)) void philox_avx2(const fc_rng *g, uint32_t call0,
                                                                     uint16_t *h, int sets)
{
    const __m256i m0 = _mm256_set1_epi32((int)0xD2511F53u), m1 = _mm256_set1_epi32((int)0xCD9E8D57u);
    const __m256i base = _mm256_add_epi32(_mm256_set1_epi32((int)call0),
                                          _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256i a[2][4];
    sets = sets > 2 ? 2 : sets;
    for (int s = 0; s < sets; s++) {
        a[s][0] = _mm256_add_epi32(base, _mm256_set1_epi32(8 * s));
        a[s][1] = _mm256_set1_epi32((int)g->chunk);
        a[s][2] = _mm256_set1_epi32((int)g->unit);
        a[s][3] = _mm256_set1_epi32((int)g->step);
    }
    uint32_t k0 = g->key0, k1 = g->key1;
    for (int round = 0; round < 10; round++) {
        const __m256i kk0 = _mm256_set1_epi32((int)k0), kk1 = _mm256_set1_epi32((int)k1);
        for (int s = 0; s < sets; s++) {
            __m256i hi0, lo0, hi1, lo1;
            mulhilo_avx2(a[s][0], m0, &hi0, &lo0);
            mulhilo_avx2(a[s][2], m1, &hi1, &lo1);
            a[s][0] = _mm256_xor_si256(_mm256_xor_si256(hi1, a[s][1]), kk0);
            a[s][2] = _mm256_xor_si256(_mm256_xor_si256(hi0, a[s][3]), kk1);
            a[s][1] = lo1;
            a[s][3] = lo0;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    for (int s = 0; s < sets; s++) {
        /* 4 x 8 transpose: each call's 4 words contiguous, calls in order */
        const __m256i t0 = _mm256_unpacklo_epi32(a[s][0], a[s][1]);
        const __m256i t1 = _mm256_unpackhi_epi32(a[s][0], a[s][1]);
        const __m256i t2 = _mm256_unpacklo_epi32(a[s][2], a[s][3]);
        const __m256i t3 = _mm256_unpackhi_epi32(a[s][2], a[s][3]);
        const __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
        const __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
        uint16_t *o = h + 64 * s;
        _mm256_storeu_si256((__m256i *)o, _mm256_permute2x128_si256(u0, u1, 0x20));
        _mm256_storeu_si256((__m256i *)(o + 16), _mm256_permute2x128_si256(u2, u3, 0x20));
        _mm256_storeu_si256((__m256i *)(o + 32), _mm256_permute2x128_si256(u0, u1, 0x31));
        _mm256_storeu_si256((__m256i *)(o + 48), _mm256_permute2x128_si256(u2, u3, 0x31));
    }
}

/* 16 calls per pass; the tail by 8, then 4 with SSE2 (so that path runs here too), then one
 * at a time */
FC_AVX2 static void fill16_avx2(const fc_rng *g, int64_t first, int64_t calls, uint16_t *h)
{
    const uint32_t call0 = (uint32_t)(first >> 3);
    int64_t c = 0;
    for (; c + 16 <= calls; c += 16)
        philox_avx2(g, call0 + (uint32_t)c, h + 8 * c, 2);
    if (c + 8 <= calls) {
        philox_avx2(g, call0 + (uint32_t)c, h + 8 * c, 1);
        c += 8;
    }
    if (c + 4 <= calls) {
        philox_sse2(g, call0 + (uint32_t)c, h + 8 * c);
        c += 4;
    }
    fc_rng_fill16_scalar(g, first + 8 * c, calls - c, h + 8 * c);
}

#define FC_AVX512 __attribute__((target("avx512f")))

FC_AVX512 static inline void mulhilo_avx512(__m512i a, __m512i m, __m512i *hi, __m512i *lo)
{
    const __m512i even = _mm512_mul_epu32(a, m), odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), m);
    *lo = _mm512_mask_blend_epi32(0xAAAA, even, _mm512_slli_epi64(odd, 32));
    *hi = _mm512_mask_blend_epi32(0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

/* philox_avx2 with 16 streams per instruction: calls call0 .. call0 + 16 * sets - 1 (sets 1
 * or 2, a literal at each call). */
FC_AVX512 static inline __attribute__((always_inline)) void philox_avx512(const fc_rng *g,
                                                                         uint32_t call0,
                                                                         uint16_t *h, int sets)
{
    const __m512i m0 = _mm512_set1_epi32((int)0xD2511F53u), m1 = _mm512_set1_epi32((int)0xCD9E8D57u);
    const __m512i base = _mm512_add_epi32(_mm512_set1_epi32((int)call0),
                                          _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11,
                                                            12, 13, 14, 15));
    __m512i a[2][4];
    sets = sets > 2 ? 2 : sets;
    for (int s = 0; s < sets; s++) {
        a[s][0] = _mm512_add_epi32(base, _mm512_set1_epi32(16 * s));
        a[s][1] = _mm512_set1_epi32((int)g->chunk);
        a[s][2] = _mm512_set1_epi32((int)g->unit);
        a[s][3] = _mm512_set1_epi32((int)g->step);
    }
    uint32_t k0 = g->key0, k1 = g->key1;
    for (int round = 0; round < 10; round++) {
        const __m512i kk0 = _mm512_set1_epi32((int)k0), kk1 = _mm512_set1_epi32((int)k1);
        for (int s = 0; s < sets; s++) {
            __m512i hi0, lo0, hi1, lo1;
            mulhilo_avx512(a[s][0], m0, &hi0, &lo0);
            mulhilo_avx512(a[s][2], m1, &hi1, &lo1);
            a[s][0] = _mm512_xor_si512(_mm512_xor_si512(hi1, a[s][1]), kk0);
            a[s][2] = _mm512_xor_si512(_mm512_xor_si512(hi0, a[s][3]), kk1);
            a[s][1] = lo1;
            a[s][3] = lo0;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    for (int s = 0; s < sets; s++) {
        /* within each 128-bit lane as in philox_avx2: u0 holds calls 0, 4, 8, 12, u1 1, 5, 9,
         * 13, and so on; two rounds of 128-bit lane shuffles put the calls in order */
        const __m512i t0 = _mm512_unpacklo_epi32(a[s][0], a[s][1]);
        const __m512i t1 = _mm512_unpackhi_epi32(a[s][0], a[s][1]);
        const __m512i t2 = _mm512_unpacklo_epi32(a[s][2], a[s][3]);
        const __m512i t3 = _mm512_unpackhi_epi32(a[s][2], a[s][3]);
        const __m512i u0 = _mm512_unpacklo_epi64(t0, t2), u1 = _mm512_unpackhi_epi64(t0, t2);
        const __m512i u2 = _mm512_unpacklo_epi64(t1, t3), u3 = _mm512_unpackhi_epi64(t1, t3);
        const __m512i v0 = _mm512_shuffle_i32x4(u0, u1, 0x88), v1 = _mm512_shuffle_i32x4(u2, u3, 0x88);
        const __m512i v2 = _mm512_shuffle_i32x4(u0, u1, 0xDD), v3 = _mm512_shuffle_i32x4(u2, u3, 0xDD);
        uint16_t *o = h + 128 * s;
        _mm512_storeu_si512((void *)o, _mm512_shuffle_i32x4(v0, v1, 0x88));
        _mm512_storeu_si512((void *)(o + 32), _mm512_shuffle_i32x4(v2, v3, 0x88));
        _mm512_storeu_si512((void *)(o + 64), _mm512_shuffle_i32x4(v0, v1, 0xDD));
        _mm512_storeu_si512((void *)(o + 96), _mm512_shuffle_i32x4(v2, v3, 0xDD));
    }
}

/* 32 calls per pass; the tail by 16, then through the AVX2, SSE2 and scalar steps (so that
 * every version runs here) */
FC_AVX512 static void fill16_avx512(const fc_rng *g, int64_t first, int64_t calls, uint16_t *h)
{
    const uint32_t call0 = (uint32_t)(first >> 3);
    int64_t c = 0;
    for (; c + 32 <= calls; c += 32)
        philox_avx512(g, call0 + (uint32_t)c, h + 8 * c, 2);
    if (c + 16 <= calls) {
        philox_avx512(g, call0 + (uint32_t)c, h + 8 * c, 1);
        c += 16;
    }
    fill16_avx2(g, first + 8 * c, calls - c, h + 8 * c);
}

typedef void (*fill16_fn)(const fc_rng *, int64_t, int64_t, uint16_t *);

/* the ifunc resolver: runs once, when the library is loaded */
static fill16_fn resolve_fill16(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? fill16_avx512
           : __builtin_cpu_supports("avx2") ? fill16_avx2 : fill16_sse2;
}

void fc_rng_fill16(const fc_rng *g, int64_t first, int64_t calls, uint16_t *h)
    __attribute__((ifunc("resolve_fill16")));
#else
void fc_rng_fill16(const fc_rng *g, int64_t first, int64_t calls, uint16_t *h)
{
    fc_rng_fill16_scalar(g, first, calls, h);
}
#endif
