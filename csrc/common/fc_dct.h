/* fc_dct.h: the `dct` codec's per-block rules, one FC_HOSTDEV function each, called by the CPU
 * method (m_dct.c) and the CUDA kernels (cuda/fc_cu_dct.cu) alike, so both write the same bytes:
 * the orthonormal DCT-II of a block and its inverse (a fast transform: Lee's factorisation,
 * B/2 log2 B multiplies, not a B x B product), the factors it uses, the pick of the k largest
 * coefficients and the index bytes (the coding itself: fc_dct_rank.h).
 *
 * Why the factors are computed, not read from libm: cos() of the host's libm and the device's
 * may differ in the last bit, and one differing factor changes every payload byte after it. A
 * Taylor series in double, using only + - * / (correctly rounded on both, no FMA: setup.py builds
 * with -ffp-contract=off and --fmad=false), gives the same float on both. */
#ifndef FC_DCT_H
#define FC_DCT_H

#include <stdint.h>
#include "common/fc_hostdev.h"
#include "common/fc_pack.h"
#include "common/fc_dct_rank.h" /* the index coding */
#include "common/fc_quant.h" /* fc_abs_bits, fc_f32_bits, FC_MAX_BITS, fc_canon_nan */

#define FC_DCT_MAX_BLOCK 256 /* the kernels keep a block in registers/local memory */

/* Floats of the table a transform reads (fc_dct_table): B - 1 butterfly factors, then the
 * orthonormal scales of coefficient 0 and of the others. */
FC_HOSTDEV int fc_dct_table_len(int B)
{
    return B + 1;
}

/* cos(x) for x in [0, pi/2] by its Taylor series: 15 terms leave an error far below a double's
 * last bit there. */
FC_HOSTDEV double fc_dct_cos(double x)
{
    const double x2 = x * x;
    double term = 1.0, sum = 1.0;
    for (int j = 0; j < 15; j++) {
        term = -term * x2 / (double)((2 * j + 1) * (2 * j + 2));
        sum += term;
    }
    return sum;
}

/* The factors of a length-B transform: for each stage len = B, B/2, ..., 2 (at offset B - len),
 * len/2 butterfly factors 1 / (2 cos(pi (2n + 1) / (2 len))); then sqrt(1/B) and sqrt(2/B).
 * The square roots are Newton steps in double from a fixed start (every op correctly rounded),
 * for the reason the cosines are a series. */
FC_HOSTDEV double fc_dct_sqrt(double v)
{
    double r = 1.0;
    for (int j = 0; j < 40; j++)
        r = 0.5 * (r + v / r);
    return r;
}

FC_HOSTDEV void fc_dct_table(int B, float *tab)
{
    const double pi = 3.14159265358979323846;
    for (int len = B; len > 1; len >>= 1)
        for (int n = 0; n < len / 2; n++)
            tab[B - len + n] = (float)(1.0 / (2.0 * fc_dct_cos(pi * (double)(2 * n + 1) / (2.0 * len))));
    tab[B - 1] = (float)fc_dct_sqrt(1.0 / (double)B);
    tab[B] = (float)fc_dct_sqrt(2.0 / (double)B);
}

/* The transforms work on several blocks at once, laid out by lanes: element i of block l at
 * t[i L + l]. A stage's step is written once on fc_dct_vec, one float on the device (a CUDA
 * thread runs one block, L = 1) and a GCC vector of 8 floats on the CPU (8 blocks: one AVX2
 * operation per step, two SSE2 ones in the baseline clone). Each lane gets exactly the IEEE
 * operations of a lone block, in the same order, so the bytes do not depend on L. */
#if defined(__CUDACC__) || defined(__cplusplus) /* the kernels (and their host emulation) */
typedef float fc_dct_vec;
#define FC_DCT_LANES 1
#else
typedef float fc_dct_vec __attribute__((vector_size(32)));
#define FC_DCT_LANES 8
#endif
#define FC_DCT_MAX_LANES 8

/* A block whose largest magnitude reaches 2^100 is transformed scaled down by 2^-28 (exact: a
 * power of two) and scaled back after: the unnormalised stages grow values by up to ~B^2, and
 * an Inf reached inside them would meet another as Inf - Inf = NaN, a finite input sent as NaN.
 * back[l]: the factor to scale lane l back by (1 when it goes as it is). */
#define FC_DCT_BIG_BITS 0x71800000u /* 2^100 */

FC_HOSTDEV void fc_dct_prescale(float *t, int B, int L, float *back)
{
    uint32_t amax[FC_DCT_MAX_LANES];
    for (int l = 0; l < L; l++)
        amax[l] = 0;
    for (int i = 0; i < B; i++)
        for (int l = 0; l < L; l++) {
            const uint32_t m = fc_abs_bits(t[i * L + l]);
            amax[l] = m < FC_INF_BITS && m > amax[l] ? m : amax[l];
        }
    for (int l = 0; l < L; l++) {
        back[l] = 1.0f;
        if (amax[l] < FC_DCT_BIG_BITS)
            continue;
        back[l] = fc_bits_f32((127u + 28u) << 23);
        for (int i = 0; i < B; i++)
            t[i * L + l] *= fc_bits_f32((127u - 28u) << 23);
    }
}

/* The prescale undone: t times back[l]. `saturate` (the inverse: a decoded value must stay
 * finite): a finite value that overflows becomes the largest finite; without it (the forward)
 * it becomes Inf, which fc_dct_clamp saturates and counts if the coefficient is sent. NaN/Inf
 * of the input pass as they are. */
FC_HOSTDEV void fc_dct_unscale(float *t, int B, int L, const float *back, int saturate)
{
    for (int l = 0; l < L; l++) {
        if (back[l] == 1.0f)
            continue;
        for (int i = 0; i < B; i++) {
            const float x = t[i * L + l], v = x * back[l];
            const int over = saturate && fc_abs_bits(v) == FC_INF_BITS && fc_abs_bits(x) < FC_INF_BITS;
            t[i * L + l] = over ? fc_bits_f32((fc_f32_bits(v) & 0x80000000u) | FC_MAX_BITS) : v;
        }
    }
}

/* In place: each lane of t (B vectors, B a power of two) becomes its orthonormal DCT-II,
 * X_k = a_k sum_n t_n cos(pi k (2n + 1) / (2B)). u: B vectors of scratch. Lee's recursion, run
 * as stages: the butterflies u_n = t_n + t_{len-1-n}, v_n = (t_n - t_{len-1-n}) f_n for
 * len = B .. 2, then the recombinations X_{2k} = U_k, X_{2k+1} = V_k + V_{k+1} for len = 2 .. B.
 * 2 log2 B stages: the result ends in t. */
FC_HOSTDEV void fc_dct_forward(fc_dct_vec *t, fc_dct_vec *u, int B, const float *tab)
{
    float back[FC_DCT_MAX_LANES];
    fc_dct_prescale((float *)t, B, FC_DCT_LANES, back);
    fc_dct_vec *a = t, *b = u, *sw;
    for (int len = B; len > 1; len >>= 1) {
        const float *f = tab + (B - len);
        const int h = len >> 1;
        for (int off = 0; off < B; off += len)
            for (int n = 0; n < h; n++) {
                const fc_dct_vec p = a[off + n], q = a[off + len - 1 - n];
                b[off + n] = p + q;
                b[off + h + n] = (p - q) * f[n];
            }
        sw = a, a = b, b = sw;
    }
    for (int len = 2; len <= B; len <<= 1) {
        const int h = len >> 1;
        for (int off = 0; off < B; off += len) {
            for (int k = 0; k + 1 < h; k++) {
                b[off + 2 * k] = a[off + k];
                b[off + 2 * k + 1] = a[off + h + k] + a[off + h + k + 1];
            }
            b[off + 2 * h - 2] = a[off + h - 1];
            b[off + 2 * h - 1] = a[off + 2 * h - 1];
        }
        sw = a, a = b, b = sw;
    }
    t[0] *= tab[B - 1];
    for (int i = 1; i < B; i++)
        t[i] *= tab[B];
    fc_dct_unscale((float *)t, B, FC_DCT_LANES, back, 0);
}

/* In place: the inverse (the DCT-III, the forward's transpose): the stages of the forward
 * transposed, in the reverse order; large blocks prescaled as the forward's are. */
FC_HOSTDEV void fc_dct_inverse(fc_dct_vec *t, fc_dct_vec *u, int B, const float *tab)
{
    float back[FC_DCT_MAX_LANES];
    fc_dct_prescale((float *)t, B, FC_DCT_LANES, back);
    fc_dct_vec *a = t, *b = u, *sw;
    t[0] *= tab[B - 1];
    for (int i = 1; i < B; i++)
        t[i] *= tab[B];
    for (int len = B; len > 1; len >>= 1) {
        const int h = len >> 1;
        for (int off = 0; off < B; off += len) {
            b[off] = a[off];
            b[off + h] = a[off + 1];
            for (int k = 1; k < h; k++) {
                b[off + k] = a[off + 2 * k];
                b[off + h + k] = a[off + 2 * k + 1] + a[off + 2 * k - 1];
            }
        }
        sw = a, a = b, b = sw;
    }
    for (int len = 2; len <= B; len <<= 1) {
        const float *f = tab + (B - len);
        const int h = len >> 1;
        for (int off = 0; off < B; off += len)
            for (int n = 0; n < h; n++) {
                const fc_dct_vec p = a[off + n], w = a[off + h + n] * f[n];
                b[off + n] = p + w;
                b[off + len - 1 - n] = p - w;
            }
        sw = a, a = b, b = sw;
    }
    fc_dct_unscale((float *)t, B, FC_DCT_LANES, back, 1);
}

/* A coefficient as the codec sends it: one beyond fp32's range (a prescaled block's, scaled
 * back: fc_dct_unscale) saturated to the largest finite and counted in *sat; a NaN as the
 * canonical one. Why: the stages pass an input's NaN on and make new ones (Inf - Inf), and the
 * bits of those are the hardware's: x86 keeps an operand's NaN or makes 0xffc00000, a GPU writes
 * 0x7fffffff for both (the H200's run 3 sent them apart). */
FC_HOSTDEV float fc_dct_clamp(float y, int64_t *sat)
{
    if (fc_abs_bits(y) != FC_INF_BITS)
        return fc_canon_nan(y);
    ++*sat;
    return fc_bits_f32((fc_f32_bits(y) & 0x80000000u) | FC_MAX_BITS);
}

/* The k coefficients of largest magnitude of each lane's block (ties to the lower index; a NaN
 * ranks above everything, so it is sent, never lost, and every NaN alike, whatever bits the
 * hardware gave it: fc_dct_clamp): lane l's ascending indices at idx[l k .. l k + k). k passes
 * over the block (k is a few per 64), each lane alike, on the magnitudes' bits as int32 (what
 * every later pass compares): `mag`, B L int32 of scratch. */
FC_HOSTDEV void fc_dct_pick_lanes(const float *y, int B, int L, int k, int32_t *mag, uint32_t *idx)
{
    for (int i = 0; i < B * L; i++)
        mag[i] = (int32_t)fc_abs_bits(fc_canon_nan(y[i]));
    for (int j = 0; j < k; j++) {
        int32_t best[FC_DCT_MAX_LANES], at[FC_DCT_MAX_LANES];
        for (int l = 0; l < L; l++)
            best[l] = -1, at[l] = 0;
        for (int i = 0; i < B; i++)
            for (int l = 0; l < L; l++) {
                const int32_t m = mag[i * L + l];
                const int better = m > best[l];
                best[l] = better ? m : best[l];
                at[l] = better ? i : at[l];
            }
        for (int l = 0; l < L; l++)
            mag[at[l] * L + l] = -2; /* taken: below every magnitude and the start's -1 */
    }
    for (int l = 0; l < L; l++) {
        int o = 0;
        for (int i = 0; i < B && o < k; i++)
            if (mag[i * L + l] == -2)
                idx[l * k + o++] = (uint32_t)i;
    }
}

/* One block's pick (L = 1: a CUDA thread's), its scratch on the stack. */
FC_HOSTDEV void fc_dct_pick(const float *y, int B, int k, uint32_t *idx)
{
    int32_t mag[FC_DCT_MAX_BLOCK];
    fc_dct_pick_lanes(y, B, 1, k, mag, idx);
}

/* log2 B: the bits of one index (a coefficient's place in its block). */
FC_HOSTDEV int fc_dct_index_bits(int B)
{
    int w = 0;
    while ((1 << w) < B)
        w++;
    return w;
}

/* fc_dct_index_bytes with the widths decided: rbits bits per block's rank, or (rbits 0) wbits per
 * index. The kernels call it with the widths their host config computed once, so no thread
 * redoes the rule's two-word table lookups. */
FC_HOSTDEV int64_t fc_dct_index_bytes_w(int64_t nb, int k, int wbits, int rbits)
{
    const int64_t bytes = rbits ? fc_pack_bytes(nb, rbits) : fc_pack_bytes(nb * k, wbits);
    return (bytes + 3) / 4 * 4;
}

/* Bytes of the positions of nb blocks of k kept coefficients: one rank per block where
 * fc_dct_rank.h's rule allows, else log2(B)-bit indices; either in fc_pack.h's groups of 8
 * (blocks or indices), padded to 4 bytes so the values that follow start aligned. */
FC_HOSTDEV int64_t fc_dct_index_bytes(int64_t nb, int B, int k)
{
    return fc_dct_index_bytes_w(nb, k, fc_dct_index_bits(B), fc_dct_ranked(B, k) ? fc_dct_rank_bits(B, k) : 0);
}

/* Blocks of B elements covering n (the last one zero-padded). */
FC_HOSTDEV int64_t fc_dct_blocks(int64_t n, int B)
{
    return (n + B - 1) / B;
}

/* Coefficients a chunk of n elements keeps: k per block. */
FC_HOSTDEV int64_t fc_dct_kept(int64_t n, int B, int k)
{
    return fc_dct_blocks(n, B) * (int64_t)k;
}

#endif
