/* fc_dct_rank.h: the `dct` codec's index coding, shared by the CPU method (m_dct.c) and the CUDA
 * kernels (cuda/fc_cu_dct.cu) so both write the same bytes.
 *
 * A block's k kept positions (ascending c_1 < ... < c_k in [0, B)) go as one number, their rank
 * among the C(B, k) subsets in the combinatorial number system (colex order):
 *     rank = C(c_1, 1) + C(c_2, 2) + ... + C(c_k, k),   0 <= rank < C(B, k),
 * in ceil(log2 C(B, k)) bits: 55 bits for 12 of 128 where plain indices take 12 * 7 = 84, 70 for
 * 17 of 128 where they take 119.
 *
 * The rule (fc_dct_ranked), the one place it is written: ranked where 1 <= k <= B / 2, k <= 32
 * (the table's rows) and C(B, k) < 2^128 - 1, so a rank is two 64-bit words (fc_u128 below: plain
 * C has no portable 128-bit integer, and the same code must compile for host C and the device).
 * That holds for every k <= B / 2 of B <= 64, k <= 32 of B = 128 (101 bits; 33 would fit 102, the
 * rows stop it) and k <= 29 of B = 256 (127 bits). Elsewhere (k > B / 2 saves little: a complement coding would; k > 32; or the count past
 * 128 bits) the positions go as before, log2(B) bits each (fc_pack.h's groups of 8). Until ranks
 * had two words the bound was 2^64 - 1 (k <= 15 of 128, k <= 11 of 256); those (B, k) write the
 * same bytes as then: a rank below 2^64 has a zero high word and the same w bits.
 *
 * Layout of the ranks: block b's rank at bits [b w, b w + w) of the index bytes, least significant
 * bit first (w = fc_dct_rank_bits <= 128), so each group of 8 blocks fills exactly w bytes: one
 * CUDA thread packs a group with no byte shared. Their bytes: fc_dct.h's fc_dct_index_bytes. */
#ifndef FC_DCT_RANK_H
#define FC_DCT_RANK_H

#include <stdint.h>
#include "common/fc_hostdev.h"
#include "common/fc_pack.h"
#include "common/fc_binom_table.h"

/* An unsigned 128-bit number as two words, value lo + 2^64 hi: only what ranks need (add,
 * subtract, compare, bit length, bits moved in and out a byte at a time). */
typedef struct {
    uint64_t lo, hi;
} fc_u128;

FC_HOSTDEV fc_u128 fc_u128_add(fc_u128 a, fc_u128 b)
{
    fc_u128 r;
    r.lo = a.lo + b.lo;
    r.hi = a.hi + b.hi + (r.lo < a.lo); /* the carry out of the low word */
    return r;
}

/* a - b, for a >= b. */
FC_HOSTDEV fc_u128 fc_u128_sub(fc_u128 a, fc_u128 b)
{
    fc_u128 r;
    r.lo = a.lo - b.lo;
    r.hi = a.hi - b.hi - (a.lo < b.lo); /* the borrow */
    return r;
}

FC_HOSTDEV int fc_u128_lt(fc_u128 a, fc_u128 b)
{
    return a.hi < b.hi || (a.hi == b.hi && a.lo < b.lo);
}

/* Bits of a: the position of its highest set bit plus one, 0 for 0. */
FC_HOSTDEV int fc_u128_bits(fc_u128 a)
{
    uint64_t top = a.hi ? a.hi : a.lo;
    int w = a.hi ? 64 : 0;
    while (top != 0) {
        top >>= 1;
        w++;
    }
    return w;
}

/* The low t bits of *v (1 <= t <= 8), shifted out of it. */
FC_HOSTDEV uint32_t fc_u128_take(fc_u128 *v, int t)
{
    const uint32_t x = (uint32_t)(v->lo & ((1u << t) - 1u));
    v->lo = (v->lo >> t) | (v->hi << (64 - t)); /* t >= 1: no shift by 64 */
    v->hi >>= t;
    return x;
}

/* *v with x or'ed in at bit `at`: x below 2^t for some t <= 8 with at + t <= 128. */
FC_HOSTDEV void fc_u128_or_at(fc_u128 *v, uint32_t x, int at)
{
    if (at >= 64) {
        v->hi |= (uint64_t)x << (at - 64);
    } else {
        v->lo |= (uint64_t)x << at;
        if (at > 56) /* x straddles the words */
            v->hi |= (uint64_t)x >> (64 - at);
    }
}

/* C(n, j) for n < FC_BINOM_COLS, j < FC_BINOM_ROWS. One table: 33 x 257 entries of two words
 * (136 KB), j <= 32 because no ranked k exceeds 32, n <= 256 = FC_DCT_MAX_BLOCK. On the device it
 * is global memory (a thread's lookups differ from its neighbours'; constant memory would
 * serialise them, and 136 KB exceeds its 64 KB). */
#if defined(__CUDACC__)
static __device__ const fc_u128 fc_binom_dev[FC_BINOM_ROWS * FC_BINOM_COLS] = FC_BINOM_TABLE_INIT;
#endif
static const fc_u128 fc_binom_host[FC_BINOM_ROWS * FC_BINOM_COLS] = FC_BINOM_TABLE_INIT;

FC_HOSTDEV fc_u128 fc_binom(int n, int j)
{
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
    return fc_binom_dev[j * FC_BINOM_COLS + n];
#else
    return fc_binom_host[j * FC_BINOM_COLS + n];
#endif
}

/* Whether a block's positions go as a rank (the rule above; the table saturates at 2^128 - 1). */
FC_HOSTDEV int fc_dct_ranked(int B, int k)
{
    if (k < 1 || 2 * k > B || k >= FC_BINOM_ROWS || B >= FC_BINOM_COLS)
        return 0;
    const fc_u128 c = fc_binom(B, k);
    return !(c.lo == UINT64_MAX && c.hi == UINT64_MAX);
}

/* Bits of one rank: those of C(B, k) - 1, the largest. Ranked (B, k) only. */
FC_HOSTDEV int fc_dct_rank_bits(int B, int k)
{
    const fc_u128 one = {1u, 0u};
    return fc_u128_bits(fc_u128_sub(fc_binom(B, k), one));
}

/* The rank of ascending positions idx[0..k). No carry is lost: the sum stays below C(B, k). */
FC_HOSTDEV fc_u128 fc_dct_rank(const uint32_t *idx, int k)
{
    fc_u128 r = {0u, 0u};
    for (int j = 0; j < k; j++)
        r = fc_u128_add(r, fc_binom((int)idx[j], j + 1));
    return r;
}

/* One step of the inverse, the positions largest first: with *r the rank of positions 1..j, all
 * below *c + 1, the j-th is the largest x with C(x, j) <= *r; *r and *c move on to the rest. x
 * stops at j - 1 (C(j - 1, j) = 0), so whatever *r holds (a corrupted rank included) the
 * positions stay strictly descending within [0, *c] and *r never goes below 0: nothing is read or
 * written out of a block. The entries read are C(x, j) <= C(B, k) for x < B, j <= k <= B / 2,
 * none saturated. Start with *c = B - 1 and j = k. */
FC_HOSTDEV uint32_t fc_dct_unrank_next(fc_u128 *r, int *c, int j)
{
    int x = *c;
    fc_u128 cx = fc_binom(x, j);
    while (x > j - 1 && fc_u128_lt(*r, cx))
        cx = fc_binom(--x, j);
    *r = fc_u128_sub(*r, cx);
    *c = x - 1;
    return (uint32_t)x;
}

/* The ascending positions idx[0..k) of rank r (r < C(B, k): fc_dct_rank_ok). Where C(B, k) and
 * r fit one word (k <= 15 of 128, the default 12 among them) every C(x, j) the scan reads does
 * too (C(x, j) <= C(B, k) for x < B, j <= k <= B / 2), so the one-word loop makes the same
 * comparisons as fc_dct_unrank_next on low words alone: the two-word steps cost the CPU decode
 * ~15% where they were not needed. */
FC_HOSTDEV void fc_dct_unrank(fc_u128 r, int B, int k, uint32_t *idx)
{
    int c = B - 1;
    if (r.hi == 0 && fc_binom(B, k).hi == 0) {
        uint64_t v = r.lo;
        for (int j = k; j >= 1; j--) {
            int x = c;
            uint64_t cx = fc_binom(x, j).lo;
            while (x > j - 1 && v < cx)
                cx = fc_binom(--x, j).lo;
            v -= cx;
            c = x - 1;
            idx[j - 1] = (uint32_t)x;
        }
        return;
    }
    for (int j = k; j >= 1; j--)
        idx[j - 1] = fc_dct_unrank_next(&r, &c, j);
}

/* Whether r is the rank of some k of B (what a decoder checks before it unranks). */
FC_HOSTDEV int fc_dct_rank_ok(fc_u128 r, int B, int k)
{
    return fc_u128_lt(r, fc_binom(B, k));
}

/* Ranks r[0..8) of w bits each into w bytes (a group of 8 blocks). */
FC_HOSTDEV void fc_dct_pack_ranks8(const fc_u128 *r, int w, uint8_t *out)
{
    for (int b = 0; b < w; b++)
        out[b] = 0;
    for (int j = 0; j < 8; j++) {
        fc_u128 v = r[j];
        int pos = j * w, left = w;
        while (left > 0) {
            const int sh = pos & 7, take = 8 - sh < left ? 8 - sh : left;
            out[pos >> 3] |= (uint8_t)(fc_u128_take(&v, take) << sh);
            pos += take;
            left -= take;
        }
    }
}

/* The rank of block b: w bits at bit b w of the index bytes (w <= 64: gathered in one word). */
FC_HOSTDEV fc_u128 fc_dct_rank_at(const uint8_t *in, int w, int64_t b)
{
    int64_t pos = b * w;
    fc_u128 v = {0u, 0u};
    if (w <= 64) {
        for (int got = 0; got < w;) {
            const int sh = (int)(pos & 7), take = 8 - sh < w - got ? 8 - sh : w - got;
            v.lo |= (uint64_t)((in[pos >> 3] >> sh) & ((1u << take) - 1u)) << got;
            got += take;
            pos += take;
        }
        return v;
    }
    int got = 0;
    while (got < w) {
        const int sh = (int)(pos & 7), take = 8 - sh < w - got ? 8 - sh : w - got;
        fc_u128_or_at(&v, (uint32_t)((in[pos >> 3] >> sh) & ((1u << take) - 1u)), got);
        got += take;
        pos += take;
    }
    return v;
}

#endif
