/* fc_dct_rank.h: the `dct` codec's index coding, shared by the CPU method (m_dct.c) and the CUDA
 * kernels (cuda/fc_cu_dct.cu) so both write the same bytes.
 *
 * A block's k kept positions (ascending c_1 < ... < c_k in [0, B)) go as one number, their rank
 * among the C(B, k) subsets in the combinatorial number system (colex order):
 *     rank = C(c_1, 1) + C(c_2, 2) + ... + C(c_k, k),   0 <= rank < C(B, k),
 * in ceil(log2 C(B, k)) bits: 55 bits for 12 of 128 where plain indices take 12 * 7 = 84.
 *
 * The rule (fc_dct_ranked), the one place it is written: ranked where k <= B / 2 and C(B, k) <
 * 2^64 - 1, so a rank is one uint64 on host and device alike (no 128-bit integers: plain C has
 * none portably). That holds for every k <= B / 2 of B <= 64, k <= 15 of B = 128 and k <= 11 of
 * B = 256. Elsewhere (k > B / 2 saves little: a complement coding would; or the count past 64
 * bits) the positions go as before, log2(B) bits each (fc_pack.h's groups of 8).
 *
 * Layout of the ranks: block b's rank at bits [b w, b w + w) of the index bytes, least significant
 * bit first (w = fc_dct_rank_bits), so each group of 8 blocks fills exactly w bytes: one CUDA
 * thread packs a group with no byte shared. Their bytes: fc_dct.h's fc_dct_index_bytes. */
#ifndef FC_DCT_RANK_H
#define FC_DCT_RANK_H

#include <stdint.h>
#include "common/fc_hostdev.h"
#include "common/fc_pack.h"
#include "common/fc_binom_table.h"

/* C(n, j) for n < FC_BINOM_COLS, j < FC_BINOM_ROWS. One table: 33 x 257 uint64 (68 KB), j <= 32
 * because no ranked k exceeds 32 (B = 64's half), n <= 256 = FC_DCT_MAX_BLOCK. On the device it is
 * global memory (a thread's lookups differ from its neighbours'; constant memory would serialise
 * them, and 68 KB exceeds its 64 KB). */
#if defined(__CUDACC__)
static __device__ const uint64_t fc_binom_dev[FC_BINOM_ROWS * FC_BINOM_COLS] = FC_BINOM_TABLE_INIT;
#endif
static const uint64_t fc_binom_host[FC_BINOM_ROWS * FC_BINOM_COLS] = FC_BINOM_TABLE_INIT;

FC_HOSTDEV uint64_t fc_binom(int n, int j)
{
#if defined(__CUDACC__) && defined(__CUDA_ARCH__)
    return fc_binom_dev[j * FC_BINOM_COLS + n];
#else
    return fc_binom_host[j * FC_BINOM_COLS + n];
#endif
}

/* Whether a block's positions go as a rank (the rule above). */
FC_HOSTDEV int fc_dct_ranked(int B, int k)
{
    return k >= 1 && 2 * k <= B && k < FC_BINOM_ROWS && B < FC_BINOM_COLS && fc_binom(B, k) != UINT64_MAX;
}

/* Bits of one rank: those of C(B, k) - 1, the largest. Ranked (B, k) only. */
FC_HOSTDEV int fc_dct_rank_bits(int B, int k)
{
    const uint64_t top = fc_binom(B, k) - 1;
    int w = 0;
    while (w < 64 && (top >> w) != 0)
        w++;
    return w;
}

/* The rank of ascending positions idx[0..k). */
FC_HOSTDEV uint64_t fc_dct_rank(const uint32_t *idx, int k)
{
    uint64_t r = 0;
    for (int j = 0; j < k; j++)
        r += fc_binom((int)idx[j], j + 1);
    return r;
}

/* One step of the inverse, the positions largest first: with *r the rank of positions 1..j, all
 * below *c + 1, the j-th is the largest x with C(x, j) <= *r; *r and *c move on to the rest. x
 * stops at j - 1 (C(j - 1, j) = 0), so whatever *r holds (a corrupted rank included) the
 * positions stay strictly descending within [0, *c]: nothing is read or written out of a block.
 * Start with *c = B - 1 and j = k. */
FC_HOSTDEV uint32_t fc_dct_unrank_next(uint64_t *r, int *c, int j)
{
    int x = *c;
    while (x > j - 1 && fc_binom(x, j) > *r)
        x--;
    *r -= fc_binom(x, j);
    *c = x - 1;
    return (uint32_t)x;
}

/* The ascending positions idx[0..k) of rank r (r < C(B, k): fc_dct_rank_ok). */
FC_HOSTDEV void fc_dct_unrank(uint64_t r, int B, int k, uint32_t *idx)
{
    int c = B - 1;
    for (int j = k; j >= 1; j--)
        idx[j - 1] = fc_dct_unrank_next(&r, &c, j);
}

/* Whether r is the rank of some k of B (what a decoder checks before it unranks). */
FC_HOSTDEV int fc_dct_rank_ok(uint64_t r, int B, int k)
{
    return r < fc_binom(B, k);
}

/* Ranks r[0..8) of w bits each into w bytes (a group of 8 blocks). */
FC_HOSTDEV void fc_dct_pack_ranks8(const uint64_t *r, int w, uint8_t *out)
{
    for (int b = 0; b < w; b++)
        out[b] = 0;
    for (int j = 0; j < 8; j++) {
        uint64_t v = r[j];
        int pos = j * w, left = w;
        while (left > 0) {
            const int sh = pos & 7, take = 8 - sh < left ? 8 - sh : left;
            out[pos >> 3] |= (uint8_t)((v & ((1u << take) - 1u)) << sh);
            v >>= take;
            pos += take;
            left -= take;
        }
    }
}

/* The rank of block b: w bits at bit b w of the index bytes. */
FC_HOSTDEV uint64_t fc_dct_rank_at(const uint8_t *in, int w, int64_t b)
{
    int64_t pos = b * w;
    uint64_t v = 0;
    int got = 0;
    while (got < w) {
        const int sh = (int)(pos & 7), take = 8 - sh < w - got ? 8 - sh : w - got;
        v |= (uint64_t)((in[pos >> 3] >> sh) & ((1u << take) - 1u)) << got;
        got += take;
        pos += take;
    }
    return v;
}

#endif
