/* fc_pack.h: w-bit codes packed in groups of 8 elements (8 codes = w bytes, byte aligned), so
 * each group is packed and unpacked independently: one CUDA thread per group, no races. */
#ifndef FC_PACK_H
#define FC_PACK_H

#include <stdint.h>
#include "common/fc_hostdev.h"

/* Bytes of n codes of w bits: whole groups of 8, the last one zero-filled. */
FC_HOSTDEV int64_t fc_pack_bytes(int64_t n, int w)
{
    return (n + 7) / 8 * w;
}

/* Codes c[0..7] (each < 2^w, w <= 16) as 128 bits lo | hi << 64, code j at bit j * w. */
FC_HOSTDEV void fc_pack8_words(const uint32_t *c, int w, uint64_t *lo_out, uint64_t *hi_out)
{
    uint64_t lo = 0, hi = 0;
    for (int j = 0; j < 8; j++) {
        int pos = j * w;
        if (pos < 64) {
            lo |= (uint64_t)c[j] << pos;
            if (pos + w > 64)
                hi |= (uint64_t)c[j] >> (64 - pos);
        } else {
            hi |= (uint64_t)c[j] << (pos - 64);
        }
    }
    *lo_out = lo;
    *hi_out = hi;
}

/* Codes c[0..7] (each < 2^w, w <= 16) into w bytes, little-endian bit order. */
FC_HOSTDEV void fc_pack8(const uint32_t *c, int w, uint8_t *out)
{
    uint64_t lo, hi;
    fc_pack8_words(c, w, &lo, &hi);
    for (int b = 0; b < w; b++)
        out[b] = (uint8_t)(b < 8 ? lo >> (8 * b) : hi >> (8 * (b - 8)));
}

FC_HOSTDEV void fc_unpack8(const uint8_t *in, int w, uint32_t *c)
{
    uint64_t lo = 0, hi = 0;
    for (int b = 0; b < w; b++) {
        if (b < 8)
            lo |= (uint64_t)in[b] << (8 * b);
        else
            hi |= (uint64_t)in[b] << (8 * (b - 8));
    }
    const uint32_t mask = (1u << w) - 1u;
    for (int j = 0; j < 8; j++) {
        int pos = j * w;
        uint64_t v;
        if (pos < 64) {
            v = lo >> pos;
            if (pos + w > 64)
                v |= hi << (64 - pos);
        } else {
            v = hi >> (pos - 64);
        }
        c[j] = (uint32_t)v & mask;
    }
}

#endif
