/* fc_block.h: helpers the block-wise methods share on the CPU path: block geometry and the
 * absmax of a block as bits (NaN above Inf, so one max also detects non-finite blocks). */
#ifndef FC_BLOCK_H
#define FC_BLOCK_H

#include <stdint.h>
#include "fc_quant.h"

static inline int64_t fc_nblocks(int64_t n, int64_t bs)
{
    return (n + bs - 1) / bs;
}

static inline uint32_t fc_amax_bits(const float *x, int64_t lo, int64_t hi)
{
    uint32_t m = 0;
    for (int64_t i = lo; i < hi; i++) {
        uint32_t a = fc_abs_bits(x[i]);
        m = a > m ? a : m;
    }
    return m;
}

#define FC_BLOCK_END(lo, bs, n) ((lo) + (bs) < (n) ? (lo) + (bs) : (n))

#endif
