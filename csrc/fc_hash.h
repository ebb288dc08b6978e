/* fc_hash.h: the count sketch's hash and sign functions, identical on every rank and on the
 * GPU: murmur3's finaliser of (element, row key). The top bits pick the column, bit 0 the sign. */
#ifndef FC_HASH_H
#define FC_HASH_H

#include <stdint.h>
#include "fc_hostdev.h"

FC_HOSTDEV uint32_t fc_fmix32(uint32_t h)
{
    h ^= h >> 16;
    h *= 0x85EBCA6Bu;
    h ^= h >> 13;
    h *= 0xC2B2AE35u;
    h ^= h >> 16;
    return h;
}

FC_HOSTDEV uint32_t fc_sketch_hash(uint64_t i, uint32_t row_key)
{
    return fc_fmix32((uint32_t)i * 0x9E3779B1u ^ fc_fmix32((uint32_t)(i >> 32) ^ row_key));
}

/* column in [0, cols) from the top bits (Lemire's multiply-shift) */
FC_HOSTDEV uint32_t fc_sketch_col(uint32_t h, uint32_t cols)
{
    return (uint32_t)(((uint64_t)(h | 1u) * cols) >> 32);
}

FC_HOSTDEV float fc_sketch_sign(uint32_t h)
{
    return (h & 1u) ? -1.0f : 1.0f;
}

#endif
