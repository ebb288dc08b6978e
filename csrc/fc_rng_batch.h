/* fc_rng_batch.h: the CPU path's Philox for 16 consecutive groups at once (64 draws), in
 * structure-of-arrays form so the compiler vectorises the rounds. Same numbers as
 * fc_rng_draw4 for each group: word j of group g is out[j][g - group0]. */
#ifndef FC_RNG_BATCH_H
#define FC_RNG_BATCH_H

#include <stdint.h>
#include "fc_rng.h"

#define FC_RNG_BATCH 16

static inline void fc_rng_draw_batch(const fc_rng *g, uint32_t group0, uint32_t out[4][FC_RNG_BATCH])
{
    uint32_t c0[FC_RNG_BATCH], c1[FC_RNG_BATCH], c2[FC_RNG_BATCH], c3[FC_RNG_BATCH];
    for (int i = 0; i < FC_RNG_BATCH; i++) {
        c0[i] = group0 + (uint32_t)i;
        c1[i] = g->chunk;
        c2[i] = g->unit;
        c3[i] = g->step;
    }
    uint32_t k0 = g->key0, k1 = g->key1;
    for (int round = 0; round < 10; round++) {
        for (int i = 0; i < FC_RNG_BATCH; i++) {
            uint64_t p0 = (uint64_t)0xD2511F53u * c0[i];
            uint64_t p1 = (uint64_t)0xCD9E8D57u * c2[i];
            uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1[i] ^ k0;
            uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3[i] ^ k1;
            c1[i] = (uint32_t)p1;
            c3[i] = (uint32_t)p0;
            c0[i] = n0;
            c2[i] = n2;
        }
        k0 += 0x9E3779B9u;
        k1 += 0xBB67AE85u;
    }
    for (int i = 0; i < FC_RNG_BATCH; i++) {
        out[0][i] = c0[i];
        out[1][i] = c1[i];
        out[2][i] = c2[i];
        out[3][i] = c3[i];
    }
}

/* u[e] = U[0,1) draw of element first + e, for 64 elements; first a multiple of 4. */
static inline void fc_u01_batch(const fc_rng *g, int64_t first, float u[4 * FC_RNG_BATCH])
{
    uint32_t r[4][FC_RNG_BATCH];
    fc_rng_draw_batch(g, (uint32_t)(first >> 2), r);
    for (int i = 0; i < FC_RNG_BATCH; i++)
        for (int j = 0; j < 4; j++)
            u[4 * i + j] = fc_u01(r[j][i]);
}

#endif
