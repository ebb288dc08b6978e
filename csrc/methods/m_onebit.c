/* m_onebit.c: `onebit`, 1-bit SGD (Seide et al. 2014): one bit per element (set: x < 0) and,
 * per block, the two reconstruction values: the mean of the entries >= 0 and the mean of those
 * < 0. Biased; error feedback is on by default. Body: 2 fp32 per block, then the bits. */
#include <math.h>
#include "methods/fc_block.h"
#include "methods/fc_method.h"
#include "common/fc_onebit.h"
#include "methods/fc_simd.h"

static const fc_key onebit_keys[] = {
    FC_INT(fc_onebit_cfg, block_size, 256, 8, 1 << 24, FC_KEY_POW2,
           "elements per pair of reconstruction values; a power of two"),
    FC_KEYS_END,
};

static void onebit_layout(const fc_chunk *c, fc_layout *out)
{
    const fc_onebit_cfg *cfg = (const fc_onebit_cfg *)c->cfg;
    fc_layout_set(out, 8 * fc_nblocks(c->n, cfg->block_size), (c->n + 7) / 8, c->n);
}

/* The definition of a block's two means: 8 lanes each, fixed combination order (see
 * fc_block.h); branch-free, random signs defeating prediction. Compiled once (not inlined into
 * a clone), so a NaN's bits come out the same whichever path asks. */
static __attribute__((noinline)) void onebit_means_ref(const float *x, int64_t lo, int64_t hi, float *means)
{
    double sp8[FC_LANES] = {0}, sn8[FC_LANES] = {0};
    int64_t np = 0;
    for (int64_t i = lo; i < hi; i++) {
        const uint32_t neg = fc_f32_bits(x[i]) >> 31;
        const double v = x[i], mn = (double)neg; /* v * 0/1: exact, and no branch */
        np += 1 - (int64_t)neg;
        sn8[(i - lo) & (FC_LANES - 1)] += v * mn;
        sp8[(i - lo) & (FC_LANES - 1)] += v * (1.0 - mn);
    }
    const double sp = fc_lanes_total(sp8), sn = fc_lanes_total(sn8);
    const int64_t nn = (hi - lo) - np;
    means[0] = fc_onebit_mean(sp, np);
    means[1] = fc_onebit_mean(sn, nn);
}

/* The reference's block sums with the lanes as an inner loop of 8 (element i still adds into
 * lane (i - lo) % 8, in increasing i: the same sums), and the block's bits while it is in L1. */
FC_CLONES static void onebit_encode_fast(const float *x, int64_t n, int64_t bs, uint8_t *body)
{
    const int64_t nb = fc_nblocks(n, bs);
    float *means = (float *)body;
    uint8_t *bits = body + 8 * nb;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, n);
        double sp8[FC_LANES] = {0}, sn8[FC_LANES] = {0};
        int64_t np = 0, i = lo;
        for (; i + FC_LANES <= hi; i += FC_LANES)
            for (int j = 0; j < FC_LANES; j++) {
                const uint32_t neg = fc_f32_bits(x[i + j]) >> 31;
                const double v = x[i + j], mn = (double)neg;
                np += 1 - (int64_t)neg;
                sn8[j] += v * mn;
                sp8[j] += v * (1.0 - mn);
            }
        for (; i < hi; i++) {
            const uint32_t neg = fc_f32_bits(x[i]) >> 31;
            const double v = x[i], mn = (double)neg;
            np += 1 - (int64_t)neg;
            sn8[(i - lo) & (FC_LANES - 1)] += v * mn;
            sp8[(i - lo) & (FC_LANES - 1)] += v * (1.0 - mn);
        }
        const double sp = fc_lanes_total(sp8), sn = fc_lanes_total(sn8);
        const int64_t nn = (hi - lo) - np;
        means[2 * b] = fc_onebit_mean(sp, np);
        means[2 * b + 1] = fc_onebit_mean(sn, nn);
        /* sums of finite floats cannot overflow a double: non-finite ones mean NaN/Inf in the
         * block, whose NaN bits depend on operand order; the reference decides them */
        if (!isfinite(sp) || !isfinite(sn))
            onebit_means_ref(x, lo, hi, means + 2 * b);
        fc_sign_bits(x + lo, hi - lo, bits + lo / 8); /* blocks are multiples of 8 */
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#define ONEBIT_AVX2 1

/* One block's means and bits with AVX2: the 8 lanes of each sum are two vectors of 4 doubles,
 * lane j adding element lo + 8t + j in increasing t as in the reference; x * 0/1 becomes a
 * mask (the same sums: an added +0 and -0 leave a same-signed sum unchanged, see below). */
__attribute__((target("avx2"))) static void onebit_block_avx2(const float *x, int64_t lo,
                                                              int64_t hi, float *means,
                                                              uint8_t *bits)
{
    __m256d sp0 = _mm256_setzero_pd(), sp1 = sp0, sn0 = sp0, sn1 = sp0;
    __m256i nneg = _mm256_setzero_si256();
    int64_t i = lo;
    for (; i + 8 <= hi; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        const __m256i neg = _mm256_srai_epi32(_mm256_castps_si256(v), 31);
        nneg = _mm256_sub_epi32(nneg, neg);
        const __m256d v0 = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
        const __m256d v1 = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        const __m256d n0 = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_castsi256_si128(neg)));
        const __m256d n1 = _mm256_castsi256_pd(_mm256_cvtepi32_epi64(_mm256_extracti128_si256(neg, 1)));
        sn0 = _mm256_add_pd(sn0, _mm256_and_pd(v0, n0));
        sn1 = _mm256_add_pd(sn1, _mm256_and_pd(v1, n1));
        sp0 = _mm256_add_pd(sp0, _mm256_andnot_pd(n0, v0));
        sp1 = _mm256_add_pd(sp1, _mm256_andnot_pd(n1, v1));
        bits[i / 8] = (uint8_t)_mm256_movemask_ps(v);
    }
    double sp8[FC_LANES], sn8[FC_LANES];
    int32_t cnt[8];
    _mm256_storeu_pd(sp8, sp0);
    _mm256_storeu_pd(sp8 + 4, sp1);
    _mm256_storeu_pd(sn8, sn0);
    _mm256_storeu_pd(sn8 + 4, sn1);
    _mm256_storeu_si256((__m256i *)cnt, nneg);
    int64_t nn = 0;
    for (int j = 0; j < 8; j++)
        nn += cnt[j];
    if (i < hi) { /* the chunk's last, short group */
        uint32_t byte = 0;
        for (; i < hi; i++) {
            const uint32_t neg = fc_f32_bits(x[i]) >> 31;
            nn += neg;
            const double v = x[i];
            if (neg)
                sn8[(i - lo) & (FC_LANES - 1)] += v;
            else
                sp8[(i - lo) & (FC_LANES - 1)] += v;
            byte |= neg << ((i - lo) & 7);
        }
        bits[(hi - 1) / 8] = (uint8_t)byte;
    }
    const double sp = fc_lanes_total(sp8), sn = fc_lanes_total(sn8);
    const int64_t np = (hi - lo) - nn;
    means[0] = fc_onebit_mean(sp, np);
    means[1] = fc_onebit_mean(sn, nn);
    /* sums of finite floats cannot overflow a double: non-finite ones mean NaN/Inf in the
     * block, whose NaN bits depend on operand order; the reference decides them */
    if (!isfinite(sp) || !isfinite(sn))
        onebit_means_ref(x, lo, hi, means);
}
#endif

/* Why masks give the reference's sums: the reference adds v * 1 or v * 0 to each lane. A sign-0
 * v sent to the negative sum adds +0 there in both forms. A sign-1 v sent to the positive sum
 * adds -0 in the reference, +0 here; that sum holds only sign-0 terms from +0 on, so it is +0 or
 * positive, and adding either zero leaves it as it is. Same for -0 into the negative sum. */
static int onebit_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    const fc_onebit_cfg *cfg = (const fc_onebit_cfg *)c->cfg;
#ifdef ONEBIT_AVX2
    if (!fc_cpu_reference && __builtin_cpu_supports("avx2")) {
        const int64_t bs = cfg->block_size, nb = fc_nblocks(c->n, bs);
        for (int64_t b = 0; b < nb; b++) {
            const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
            onebit_block_avx2(x, lo, hi, (float *)body + 2 * b, body + 8 * nb);
        }
        onebit_layout(c, used);
        return FC_OK;
    }
#endif
    if (!fc_cpu_reference) {
        onebit_encode_fast(x, c->n, cfg->block_size, body);
        onebit_layout(c, used);
        return FC_OK;
    }
    const int64_t bs = cfg->block_size, nb = fc_nblocks(c->n, bs);
    float *means = (float *)body;
    uint8_t *bits = body + 8 * nb;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        onebit_means_ref(x, lo, hi, means + 2 * b);
    }
    for (int64_t g = 0; g < c->n; g += 8) {
        uint32_t byte = 0;
        for (int j = 0; j < 8 && g + j < c->n; j++)
            byte |= (fc_f32_bits(x[g + j]) >> 31) << j;
        bits[g / 8] = (uint8_t)byte;
    }
    onebit_layout(c, used);
    return FC_OK;
}

static int onebit_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                             float *acc, fc_err *err)
{
    (void)body_bytes;
    (void)err;
    const fc_onebit_cfg *cfg = (const fc_onebit_cfg *)c->cfg;
    const int64_t bs = cfg->block_size, nb = fc_nblocks(c->n, bs);
    const float *means = (const float *)body;
    const uint8_t *bits = body + 8 * nb;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        /* a table, not a branch: random signs defeat branch prediction */
        const float v2[2] = {fc_onebit_value(means + 2 * b, 0, alpha),
                             fc_onebit_value(means + 2 * b, 1, alpha)};
        for (int64_t g = lo; g < hi; g += 8) { /* one byte of bits per group of 8 */
            const uint32_t byte = bits[g >> 3];
            const int64_t m = hi - g < 8 ? hi - g : 8;
            for (int64_t j = 0; j < m; j++)
                acc[g + j] += v2[(byte >> j) & 1u];
        }
    }
    return FC_OK;
}

const fc_method fc_method_onebit = {
    .name = "onebit",
    .id = FC_ID_ONEBIT,
    .flags = FC_EF_DEFAULT | FC_PIECEWISE,
    .summary = "1-bit SGD: sign bit + mean of the positive and of the negative entries per block; "
               "1 bit + 64/block_size",
    .cfg_size = sizeof(fc_onebit_cfg),
    .keys = onebit_keys,
    .layout = onebit_layout,
    .encode = onebit_encode,
    .decode_add = onebit_decode_add,
};
