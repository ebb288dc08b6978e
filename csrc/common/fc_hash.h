/* fc_hash.h: the count sketch's hash and sign functions, identical on every rank and on the
 * GPU: murmur3's finaliser of (element, row key). The top bits pick the column, bit 0 the sign.
 * The median over rows that estimates a coordinate is here too: one definition for both. */
#ifndef FC_HASH_H
#define FC_HASH_H

#include <stdint.h>
#include "common/fc_hostdev.h"
#include "common/fc_quant.h"

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

/* Columns of the table of a chunk of n elements: the config's `cols`, or with cols 0 (the
 * default) the table sized to the chunk, as topk's ratio sizes its k: n / (8 rows) columns, an
 * eighth of the chunk's values (8x fewer bytes than fp32, 4x than bf16, so a small unit
 * compresses instead of going as `none`), at least 1, and at most 4096, the fixed default
 * before, reached from 98,304 elements on (3 rows). A unit's last chunk can be shorter than
 * the others, and then its table narrower: each chunk's width is a function of its length. */
#define FC_SKETCH_AUTO_DIV 8
#define FC_SKETCH_AUTO_MAX 4096

FC_HOSTDEV int64_t fc_sketch_cols(int64_t rows, int64_t cols, int64_t n)
{
    if (cols > 0)
        return cols;
    const int64_t c = n / (FC_SKETCH_AUTO_DIV * rows); /* rows >= 1: the key table's range */
    return c < 1 ? 1 : c > FC_SKETCH_AUTO_MAX ? FC_SKETCH_AUTO_MAX : c;
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

/* The median of r (<= 15) values by insertion sort (the same comparisons everywhere, NaN
 * included), an even count's two middle values halved first where their sum leaves fp32. */
FC_HOSTDEV float fc_sketch_median(float *v, int r)
{
    for (int a = 1; a < r; a++) {
        const float key = v[a];
        int b = a - 1;
        while (b >= 0 && v[b] > key) {
            v[b + 1] = v[b];
            b--;
        }
        v[b + 1] = key;
    }
    if (r & 1)
        return v[r / 2];
    const float s = v[r / 2 - 1] + v[r / 2]; /* two estimates near fp32's largest: halve first */
    return fc_abs_bits(s) >= FC_INF_BITS ? 0.5f * v[r / 2 - 1] + 0.5f * v[r / 2] : 0.5f * s;
}

/* Coordinate i's estimate in table t (rows x cols, row j hashed by keys[j]): the median over
 * rows of sign * t[row][col]. */
FC_HOSTDEV float fc_sketch_estimate(const float *t, int rows, int64_t cols, const uint32_t *keys, int64_t i)
{
    float v[15];
    for (int j = 0; j < rows; j++) {
        const uint32_t h = fc_sketch_hash((uint64_t)i, keys[j]);
        v[j] = fc_sketch_sign(h) * t[j * cols + fc_sketch_col(h, (uint32_t)cols)];
    }
    return fc_sketch_median(v, rows);
}

#endif
