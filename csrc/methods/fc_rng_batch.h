/* fc_rng_batch.h: the CPU path's stochastic-rounding draws in bulk: Philox for consecutive
 * calls, 8 streams per AVX2 instruction (4 with SSE2), stored so that h[e] is the 16-bit draw
 * of element first + e exactly as fc_rng_u16 defines it. */
#ifndef FC_RNG_BATCH_H
#define FC_RNG_BATCH_H

#include <stdint.h>
#include "common/fc_rng.h"

#define FC_RNG_BATCH 16 /* fc_u01_batch serves 4 * FC_RNG_BATCH elements */

/* h[e] = fc_rng_u16(g, first + e) for e < 8 * calls; first a multiple of 8. The AVX2 or SSE2
 * version is picked once at load time. */
void fc_rng_fill16(const fc_rng *g, int64_t first, int64_t calls, uint16_t *h);

/* The same numbers through the scalar definition only (tests compare the two). */
void fc_rng_fill16_scalar(const fc_rng *g, int64_t first, int64_t calls, uint16_t *h);

/* u[e] = U[0,1) draw of element first + e, for 64 elements; first a multiple of 8. */
static inline void fc_u01_batch(const fc_rng *g, int64_t first, float u[4 * FC_RNG_BATCH])
{
    uint16_t h[4 * FC_RNG_BATCH];
    fc_rng_fill16(g, first, 4 * FC_RNG_BATCH / 8, h);
    for (int e = 0; e < 4 * FC_RNG_BATCH; e++)
        u[e] = fc_u01_16(h[e]);
}

/* A stretch of draws that stays in L1, refilled as an encode loop walks the chunk. */
#define FC_RNG_STRETCH 256

typedef struct {
    int64_t base, end; /* element range the buffer holds ([0, 0): none yet) */
    uint16_t h[FC_RNG_STRETCH];
} fc_rng_buf;

/* The draws from element i (a multiple of 8, i < n) on; *avail: how many follow in the buffer. */
static inline const uint16_t *fc_rng_at(fc_rng_buf *b, const fc_rng *g, int64_t i, int64_t n,
                                        int64_t *avail)
{
    if (i < b->base || i >= b->end) {
        const int64_t m = n - i < FC_RNG_STRETCH ? n - i : FC_RNG_STRETCH;
        fc_rng_fill16(g, i, (m + 7) / 8, b->h);
        b->base = i;
        b->end = i + FC_RNG_STRETCH;
    }
    *avail = b->end - i;
    return b->h + (i - b->base);
}

#endif
