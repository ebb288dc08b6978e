/* fc_onebit.h: onebit's element rules (m_onebit.c), shared by the CPU path and the CUDA kernels:
 * a block's reconstruction value from its lane sum and count, and what a sign bit decodes to. */
#ifndef FC_ONEBIT_H
#define FC_ONEBIT_H

#include <stdint.h>
#include "common/fc_hostdev.h"
#include "common/fc_quant.h"

/* The mean of count entries whose sum (in double, fc_block.h's lane order) is sum; 0 for none.
 * A NaN (the block held one) is the canonical NaN, whatever NaN the sum's operand order made. */
FC_HOSTDEV float fc_onebit_mean(double sum, int64_t count)
{
    return count ? fc_canon_nan((float)(sum / (double)count)) : 0.0f;
}

/* What bit b (set: x < 0) of a block with means (pos, neg) adds, times alpha. */
FC_HOSTDEV float fc_onebit_value(const float *means, uint32_t bit, float alpha)
{
    return alpha * means[bit];
}

#endif
