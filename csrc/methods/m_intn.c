/* m_intn.c: `intN`, block-wise quantisation to 2, 3 or 4 bits (config `bits`), codes packed 8
 * per `bits` bytes. scheme "absmax" (symmetric): s = amax / qmax with qmax = 2^(bits-1) - 1,
 * q = round(x / s) (nearest, biased) or floor(x / s + u) (stochastic, unbiased), stored as
 * q + qmax; body: nblocks fp32 scales, then the codes; bits + 32/B. scheme "minmax" (all 2^bits
 * levels, L = 2^bits - 1): per block the min m and the step d = (M - m) / L, q = round((x - m)
 * / d) or floor(... + u), decoded as m + q * d; body: nblocks (m, d) fp32 pairs, then the
 * codes; bits + 64/B.
 * Two encoders and two decoders: the scalar reference (element by element, fc_pack8, the
 * definition a CUDA kernel follows) and the fast path (a stretch of 64 codes computed
 * branch-free into an L1 buffer, then packed 8 at a time with shifts), which must write the
 * same bytes and decode to the same floats (tests/core/test_fastpath.py). */
#include <math.h>
#include <string.h>
#include "methods/fc_block.h"
#include "common/fc_intn.h"
#include "methods/fc_method.h"
#include "common/fc_pack.h"
#include "methods/fc_rng_batch.h"
#include "methods/fc_simd.h"

static const char *const intn_schemes[] = {"absmax", "minmax", NULL};

static const fc_key intn_keys[] = {
    FC_INT(fc_intn_cfg, bits, 4, 2, 4, 0, "bits per code: 2, 3 or 4"),
    FC_INT(fc_intn_cfg, block_size, 256, 8, 1 << 24, FC_KEY_POW2, "elements per scale; a power of two"),
    FC_BOOL(fc_intn_cfg, stochastic, 0, "stochastic rounding (unbiased) instead of nearest"),
    FC_CHOICE(fc_intn_cfg, scheme, FC_INTN_ABSMAX, intn_schemes,
              "absmax: symmetric, one fp32 scale per block; minmax: fp32 min and step per block, "
              "all 2^bits levels"),
    FC_KEYS_END,
};

/* Inlined into each FC_CLONES version, so that the body is compiled for AVX2 too and the
 * code width `w` is a constant there (shifts by constants, fixed-size copies). */
#define INTN_INLINE __attribute__((always_inline)) static inline

/* Elements per random batch and per code stretch: fc_u01_batch's 64 draws, 8 whole groups. */
#define INTN_STRETCH (4 * FC_RNG_BATCH)

/* Bytes of block metadata before the codes: a scale, or a (min, step) pair. */
static int64_t intn_meta_bytes(const fc_intn_cfg *cfg, int64_t n)
{
    return (cfg->scheme == FC_INTN_MINMAX ? 8 : 4) * fc_nblocks(n, cfg->block_size);
}

static void intn_layout(const fc_chunk *c, fc_layout *out)
{
    const fc_intn_cfg *cfg = (const fc_intn_cfg *)c->cfg;
    fc_layout_set(out, intn_meta_bytes(cfg, c->n), fc_pack_bytes(c->n, (int)cfg->bits), c->n);
}

/* The smallest and largest key of block [lo, hi), in 16 independent lanes (as fc_amax_bits). */
static inline void intn_key_range(const float *x, int64_t lo, int64_t hi, int32_t *kmin, int32_t *kmax)
{
    int32_t l[16], h[16];
    for (int j = 0; j < 16; j++) {
        l[j] = INT32_MAX;
        h[j] = INT32_MIN;
    }
    int64_t i = lo;
    for (; i + 16 <= hi; i += 16)
        for (int j = 0; j < 16; j++) {
            const int32_t k = fc_intn_key(fc_f32_bits(x[i + j]));
            l[j] = k < l[j] ? k : l[j];
            h[j] = k > h[j] ? k : h[j];
        }
    for (; i < hi; i++) {
        const int32_t k = fc_intn_key(fc_f32_bits(x[i]));
        l[0] = k < l[0] ? k : l[0];
        h[0] = k > h[0] ? k : h[0];
    }
    for (int j = 1; j < 16; j++) {
        l[0] = l[j] < l[0] ? l[j] : l[0];
        h[0] = h[j] > h[0] ? h[j] : h[0];
    }
    *kmin = l[0];
    *kmax = h[0];
}

/* The fast path's block range: float min and max and a NaN flag. `v < l ? v : l` is what
 * minps computes (the second operand when unordered, so a NaN never enters a lane), but GCC
 * does not vectorise it as a reduction: SSE intrinsics, 16 lanes as 4 vectors. Which zero a
 * min or max of zeros returns depends on the order, but m is taken as min + 0 (always +0) and
 * a zero M gives the same M - m either way, so the bytes equal the keys'. Returns whether the
 * block is finite. */
INTN_INLINE int intn_float_range(const float *x, int64_t lo, int64_t hi, float *mn, float *mx)
{
    float l[16], h[16];
    int nan = 0;
    for (int j = 0; j < 16; j++) {
        l[j] = INFINITY;
        h[j] = -INFINITY;
    }
    int64_t i = lo;
#if defined(__SSE2__)
    __m128 l4[4], h4[4], bad = _mm_setzero_ps();
    for (int k = 0; k < 4; k++) {
        l4[k] = _mm_set1_ps(INFINITY);
        h4[k] = _mm_set1_ps(-INFINITY);
    }
    for (; i + 16 <= hi; i += 16)
        for (int k = 0; k < 4; k++) {
            const __m128 v = _mm_loadu_ps(x + i + 4 * k);
            l4[k] = _mm_min_ps(v, l4[k]);
            h4[k] = _mm_max_ps(v, h4[k]);
            bad = _mm_or_ps(bad, _mm_cmpunord_ps(v, v));
        }
    for (int k = 0; k < 4; k++) {
        _mm_storeu_ps(l + 4 * k, l4[k]);
        _mm_storeu_ps(h + 4 * k, h4[k]);
    }
    nan = _mm_movemask_ps(bad) != 0;
#endif
    for (; i < hi; i++) {
        const float v = x[i];
        l[0] = v < l[0] ? v : l[0];
        h[0] = v > h[0] ? v : h[0];
        nan |= fc_abs_bits(v) > FC_INF_BITS;
    }
    for (int j = 1; j < 16; j++) {
        l[0] = l[j] < l[0] ? l[j] : l[0];
        h[0] = h[j] > h[0] ? h[j] : h[0];
    }
    *mn = l[0];
    *mx = h[0];
    return !nan && fc_abs_bits(l[0]) < FC_INF_BITS && fc_abs_bits(h[0]) < FC_INF_BITS;
}

/* Min-max block: (m, d) into meta[2b], meta[2b + 1] and its map (fc_intn_minmax_map). The
 * reference finds min and max as integer keys, the fast path as floats: the same m and M - m. */
INTN_INLINE void intn_minmax_map(const fc_intn_cfg *cfg, const float *x, int64_t lo, int64_t hi,
                                 float *meta, int64_t b, fc_intn_map *p, int fast)
{
    float small, big;
    int finite;
    if (fast) {
        finite = intn_float_range(x, lo, hi, &small, &big);
    } else {
        int32_t kmin, kmax;
        intn_key_range(x, lo, hi, &kmin, &kmax);
        fc_intn_key_range_values(kmin, kmax, &small, &big, &finite);
    }
    fc_intn_minmax_map((int)cfg->bits, small, big, finite, p, &meta[2 * b], &meta[2 * b + 1]);
}

/* Block [lo, hi)'s metadata into the body and its code map; `fast` picks how a min-max block
 * finds its range (the same result). Returns how many of its values the map saturates (a
 * min-max block clamped to [-lim, lim], see fc_intn_minmax_map). */
INTN_INLINE int64_t intn_block_map(const fc_intn_cfg *cfg, const float *x, int64_t lo, int64_t hi,
                                   float *meta, int64_t b, fc_intn_map *p, int fast)
{
    if (cfg->scheme == FC_INTN_MINMAX)
        intn_minmax_map(cfg, x, lo, hi, meta, b, p, fast);
    else
        meta[b] = fc_intn_absmax_map((int)cfg->bits, fc_amax_bits(x, lo, hi), p);
    int64_t sat = 0;
    if (p->ok && p->lim < fc_bits_f32(FC_MAX_BITS))
        for (int64_t i = lo; i < hi; i++)
            sat += fc_abs_bits(x[i]) > fc_f32_bits(p->lim);
    return sat;
}

/* Reference encode: element by element, groups of 8 packed by fc_pack8 (the CUDA layout:
 * element i at bit i * w, the last group's unused slots zero). Random draws come in stretches
 * of 64 that start at multiples of 64, the same numbers for any block size. */
static int64_t intn_encode_ref(const fc_chunk *c, const float *x, uint8_t *body)
{
    int64_t sat = 0;
    const fc_intn_cfg *cfg = (const fc_intn_cfg *)c->cfg;
    const int w = (int)cfg->bits;
    const int64_t bs = cfg->block_size, n = c->n;
    uint8_t *packed = body + intn_meta_bytes(cfg, n);
    fc_intn_map map = {0};
    for (int64_t g = 0; g < n; g += INTN_STRETCH) {
        const int64_t m = n - g < INTN_STRETCH ? n - g : INTN_STRETCH;
        float u[INTN_STRETCH] = {0};
        uint32_t codes[INTN_STRETCH] = {0};
        if (cfg->stochastic)
            fc_u01_batch(&c->rng, g, u);
        for (int64_t j = 0; j < m; j++) {
            const int64_t i = g + j;
            if (i % bs == 0)
                sat += intn_block_map(cfg, x, i, FC_BLOCK_END(i, bs, n), (float *)body, i / bs,
                                      &map, 0);
            codes[j] = fc_intn_code(&map, x[i], cfg->stochastic, u[j]);
        }
        for (int64_t k = 0; k < m; k += 8)
            fc_pack8(codes + k, w, packed + (g + k) / 8 * w);
    }
    return sat;
}

/* Codes of x[0..m) under one finite block's map, branch-free so that the loops vectorise. */
INTN_INLINE void intn_codes(const float *restrict x, int64_t m, const fc_intn_map *p,
                              const float *restrict u, uint8_t *restrict t)
{
    const float off = p->off, pre = p->pre, inv = p->inv, lim = p->lim;
    const int32_t qlo = p->qlo, qhi = p->qhi;
    if (u) {
        for (int64_t j = 0; j < m; j++) {
            float v = x[j] < -lim ? -lim : x[j];
            v = v > lim ? lim : v;
            int32_t q = fc_floor_i32(((v - off) * pre) * inv + u[j]);
            q = q < qlo ? qlo : q;
            q = q > qhi ? qhi : q;
            t[j] = (uint8_t)(q - qlo);
        }
    } else { /* clamped as floats (min/max instructions): rounding and clamp commute */
        const float flo = (float)qlo, fhi = (float)qhi;
        for (int64_t j = 0; j < m; j++) {
            float v = x[j] < -lim ? -lim : x[j];
            v = v > lim ? lim : v;
            float q = fc_round_even(((v - off) * pre) * inv);
            q = q < flo ? flo : q;
            q = q > fhi ? fhi : q;
            t[j] = (uint8_t)((int32_t)q - qlo);
        }
    }
}

/* 8 codes of w <= 4 bits, one per byte of v (little-endian), to w * 8 bits, element j at bit
 * w * j: pairs, then quads, then the eight merged with a shift and a mask each. */
static inline uint64_t intn_squeeze(uint64_t v, int w)
{
    v = (v | v >> (8 - w)) & 0x00FF00FF00FF00FFull;
    v = (v | v >> (16 - 2 * w)) & 0x0000FFFF0000FFFFull;
    return (v | v >> (32 - 4 * w)) & 0xFFFFFFFFull;
}

/* The inverse: w * 8 bits to 8 bytes of w bits each. */
static inline uint64_t intn_spread(uint64_t v, int w)
{
    const uint64_t m1 = 0x0101010101010101ull * ((1u << w) - 1u);
    const uint64_t m2 = 0x0001000100010001ull * ((1u << 2 * w) - 1u);
    const uint64_t m4 = 0x0000000100000001ull * ((1u << 4 * w) - 1u);
    v = (v | v << (32 - 4 * w)) & m4;
    v = (v | v << (16 - 2 * w)) & m2;
    return (v | v << (8 - w)) & m1;
}

static inline uint64_t intn_load8(const uint8_t *t)
{
    uint64_t v = 0;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(&v, t, 8);
#else
    for (int j = 0; j < 8; j++)
        v |= (uint64_t)t[j] << (8 * j);
#endif
    return v;
}

static inline void intn_store8(uint8_t *t, uint64_t v)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(t, &v, 8);
#else
    for (int j = 0; j < 8; j++)
        t[j] = (uint8_t)(v >> (8 * j));
#endif
}

/* ceil(m / 8) groups of 8 codes (t zero past m) into w bytes each, fc_pack8's bit order; `w`
 * is a literal at every call, so the shifts and copy sizes are constants. */
INTN_INLINE void intn_pack(const uint8_t *t, int64_t m, int w, uint8_t *out)
{
#if defined(__SSE2__) && defined(__x86_64__)
    /* a whole stretch: intn_squeeze on two groups per instruction, whose 8w bits each are
     * then joined into 2w bytes */
    if (m == INTN_STRETCH) {
        const __m128i m1 = _mm_set1_epi64x(0x00FF00FF00FF00FFll);
        const __m128i m2 = _mm_set1_epi64x(0x0000FFFF0000FFFFll);
        const uint64_t keep = (1ull << (8 * w)) - 1u;
        for (int k = 0; k < 4; k++, out += 2 * w) {
            __m128i v = _mm_loadu_si128((const __m128i *)(t + 16 * k));
            v = _mm_and_si128(_mm_or_si128(v, _mm_srli_epi64(v, 8 - w)), m1);
            v = _mm_and_si128(_mm_or_si128(v, _mm_srli_epi64(v, 16 - 2 * w)), m2);
            v = _mm_or_si128(v, _mm_srli_epi64(v, 32 - 4 * w));
            const uint64_t lo = (uint64_t)_mm_cvtsi128_si64(v) & keep;
            const uint64_t hi = (uint64_t)_mm_cvtsi128_si64(_mm_unpackhi_epi64(v, v)) & keep;
            const uint64_t r = lo | hi << (8 * w);
            memcpy(out, &r, (size_t)(2 * w)); /* little-endian, as every x86 */
        }
        return;
    }
#endif
    for (int64_t k = 0; k < m; k += 8, out += w) {
        const uint64_t v = intn_squeeze(intn_load8(t + k), w);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        memcpy(out, &v, (size_t)w);
#else
        for (int b = 0; b < w; b++)
            out[b] = (uint8_t)(v >> (8 * b));
#endif
    }
}

INTN_INLINE int64_t intn_encode_w(const fc_chunk *c, const float *x, uint8_t *body, int w)
{
    int64_t sat = 0;
    const fc_intn_cfg *cfg = (const fc_intn_cfg *)c->cfg;
    const int64_t bs = cfg->block_size, n = c->n;
    uint8_t *packed = body + intn_meta_bytes(cfg, n);
    fc_intn_map map = {0};
    for (int64_t g = 0; g < n; g += INTN_STRETCH) {
        const int64_t m = n - g < INTN_STRETCH ? n - g : INTN_STRETCH;
        float u[INTN_STRETCH];
        uint8_t t[INTN_STRETCH];
        if (cfg->stochastic)
            fc_u01_batch(&c->rng, g, u);
        if (m < INTN_STRETCH)
            memset(t, 0, sizeof t); /* the last group's unused slots */
        /* the stretch's pieces of one block each (one piece when block_size >= 64) */
        for (int64_t s = g; s < g + m;) {
            const int64_t end = FC_BLOCK_END(s - s % bs, bs, n), e = end < g + m ? end : g + m;
            if (s % bs == 0)
                sat += intn_block_map(cfg, x, s, end, (float *)body, s / bs, &map, 1);
            if (map.ok)
                intn_codes(x + s, e - s, &map, cfg->stochastic ? u + (s - g) : NULL, t + (s - g));
            else
                memset(t + (s - g), -map.qlo, (size_t)(e - s));
            s = e;
        }
        intn_pack(t, m, w, packed + g / 8 * w);
    }
    return sat;
}

FC_CLONES static int64_t intn_encode_fast(const fc_chunk *c, const float *x, uint8_t *body)
{
    const int w = (int)((const fc_intn_cfg *)c->cfg)->bits;
    return w == 2 ? intn_encode_w(c, x, body, 2)
         : w == 3 ? intn_encode_w(c, x, body, 3)
                  : intn_encode_w(c, x, body, 4);
}

static int intn_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    const int64_t sat = fc_cpu_reference ? intn_encode_ref(c, x, body) : intn_encode_fast(c, x, body);
    intn_layout(c, used);
    used->saturated = sat;
    return FC_OK;
}

/* Absmax codes above 2 * qmax are never written: finding one means the payload is corrupt. */
static int intn_bad_code(uint32_t worst, int64_t b, uint32_t top, fc_err *err)
{
    return fc_fail(err, FC_ERR_PAYLOAD, "intN payload: code %u in block %lld is outside [0, %u] "
                   "(corrupted)", worst, (long long)b, top);
}

/* The reference decode of one group of m (<= 8) codes: unpacked by fc_unpack8, element by
 * element; returns the largest code. */
static inline uint32_t intn_decode_group_ref(const uint8_t *in, int64_t m, int w, const fc_intn_dec *d,
                                             float *acc)
{
    uint32_t codes[8], worst = 0;
    fc_unpack8(in, w, codes);
    for (int64_t j = 0; j < m; j++) {
        worst = codes[j] > worst ? codes[j] : worst;
        acc[j] += fc_intn_value(d, codes[j]);
    }
    return worst;
}

/* ceil(m / 8) groups of w bytes back to one code per byte of t, a group of 8 per load. */
INTN_INLINE void intn_unpack(const uint8_t *in, int64_t m, int w, uint8_t *t)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    if (m == INTN_STRETCH && (w == 2 || w == 4)) { /* 8 groups side by side: vectorises */
        for (int k = 0; k < 8; k++) {
            uint32_t r32 = 0;
            uint16_t r16 = 0;
            if (w == 4)
                memcpy(&r32, in + 4 * k, 4);
            else
                memcpy(&r16, in + 2 * k, 2);
            const uint64_t v = intn_spread(w == 4 ? r32 : r16, w);
            memcpy(t + 8 * k, &v, 8);
        }
        return;
    }
    if (m == INTN_STRETCH && w == 3) { /* two groups (6 bytes) per word, read as 4 + 2 bytes */
        for (int k = 0; k < 4; k++) {
            uint32_t lo;
            uint16_t hi;
            memcpy(&lo, in + 6 * k, 4);
            memcpy(&hi, in + 6 * k + 4, 2);
            const uint64_t r = lo | (uint64_t)hi << 32;
            const uint64_t v0 = intn_spread(r & 0xFFFFFFu, 3), v1 = intn_spread(r >> 24, 3);
            memcpy(t + 16 * k, &v0, 8);
            memcpy(t + 16 * k + 8, &v1, 8);
        }
        return;
    }
#endif
    for (int64_t k = 0; k < m; k += 8, in += w) {
        /* bytes shifted in, not memcpy'd: a 3-byte copy into a stack word read back whole
         * stalls store forwarding (half the 3-bit decode time) */
        uint64_t v = 0;
        for (int b = 0; b < w; b++)
            v |= (uint64_t)in[b] << (8 * b);
        intn_store8(t + k, intn_spread(v, w));
    }
}

/* Up to 64 codes of one block: unpacked, then the arithmetic over the stretch (vectorised);
 * returns the largest code. `w` is a literal at every call. */
INTN_INLINE uint32_t intn_decode_stretch(const uint8_t *restrict in, int64_t m, int w,
                                           const fc_intn_dec *d, float *restrict acc)
{
    uint8_t t[INTN_STRETCH];
    intn_unpack(in, m, w, t);
    uint8_t worst = 0;
    if (d->minmax) { /* every code is valid: no worst to track */
        const float mn = d->m, step = d->d, alpha = d->alpha;
        for (int64_t j = 0; j < m; j++)
            acc[j] += alpha * (mn + (float)t[j] * step);
        return 0;
    }
    const float s = d->s;
    const int32_t qmax = d->qmax;
    for (int64_t j = 0; j < m; j++) {
        worst = t[j] > worst ? t[j] : worst;
        acc[j] += s * (float)((int32_t)t[j] - qmax);
    }
    return worst;
}

/* The decode of every block, a code above the block's top refused: the reference a group of 8
 * at a time (ref), else a stretch at a time with `w` a literal at every call. */
INTN_INLINE int intn_decode_w(const fc_chunk *c, const uint8_t *body, float alpha, float *acc,
                                int w, int ref, fc_err *err)
{
    const fc_intn_cfg *cfg = (const fc_intn_cfg *)c->cfg;
    const int64_t bs = cfg->block_size, n = c->n, nb = fc_nblocks(n, bs);
    const int64_t step = ref ? 8 : INTN_STRETCH;
    const uint8_t *packed = body + intn_meta_bytes(cfg, n);
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, n);
        const fc_intn_dec d =
            fc_intn_dec_block((int)cfg->bits, cfg->scheme, (const float *)body, b, alpha);
        uint32_t worst = 0;
        for (int64_t k = lo; k < hi; k += step) {
            const int64_t m = hi - k < step ? hi - k : step;
            const uint32_t s = ref ? intn_decode_group_ref(packed + k / 8 * w, m, w, &d, acc + k)
                                   : intn_decode_stretch(packed + k / 8 * w, m, w, &d, acc + k);
            worst = s > worst ? s : worst;
        }
        if (worst > d.top)
            return intn_bad_code(worst, b, d.top, err);
    }
    return FC_OK;
}

FC_CLONES static int intn_decode_fast(const fc_chunk *c, const uint8_t *body, float alpha,
                                      float *acc, fc_err *err)
{
    const int w = (int)((const fc_intn_cfg *)c->cfg)->bits;
    return w == 2 ? intn_decode_w(c, body, alpha, acc, 2, 0, err)
         : w == 3 ? intn_decode_w(c, body, alpha, acc, 3, 0, err)
                  : intn_decode_w(c, body, alpha, acc, 4, 0, err);
}

static int intn_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                           float *acc, fc_err *err)
{
    (void)body_bytes;
    const int w = (int)((const fc_intn_cfg *)c->cfg)->bits;
    return fc_cpu_reference ? intn_decode_w(c, body, alpha, acc, w, 1, err)
                            : intn_decode_fast(c, body, alpha, acc, err);
}

const fc_method fc_method_intn = {
    .name = "intN",
    .id = FC_ID_INTN,
    .flags = FC_RANDOM | FC_PIECEWISE,
    .summary = "block-wise 2-, 3- or 4-bit integers, packed; absmax scale (bits + 32/block_size) "
               "or min-max (bits + 64/block_size)",
    .cfg_size = sizeof(fc_intn_cfg),
    .keys = intn_keys,
    .layout = intn_layout,
    .encode = intn_encode,
    .decode_add = intn_decode_add,
};
