/* fc_select.c: exact top-k by magnitude: a radix select over |x|'s bit patterns (three
 * histogram passes over x, 11 + 10 + 10 bits) finds the k-th largest magnitude and how many lie
 * above it, then one ascending pass takes everything above it and the lowest-index ties at it.
 * O(n), read-only on x: no copy of the keys, no sort of the values. */
#include "methods/fc_select.h"

#include <string.h>

#include "common/fc_quant.h"

/* The k-th largest (1-based) of the keys |x|'s bits (< 2^31: the sign is cleared) and, in
 * *above, how many keys are larger. Each pass histograms the next digit of the keys that share
 * the digits found so far, from the top. */
static uint32_t kth_largest(const float *x, int64_t n, int64_t k, int64_t *above)
{
    static const int shift[3] = {20, 10, 0}, bits[3] = {11, 10, 10};
    uint32_t hist[2048];
    uint32_t prefix = 0, mask = 0;
    int64_t want = k; /* the rank sought among the keys that match prefix */
    *above = 0;
    for (int level = 0; level < 3; level++) {
        const int sh = shift[level];
        const uint32_t nb = 1u << bits[level];
        memset(hist, 0, sizeof(uint32_t) * nb);
        if (level == 0) {
            for (int64_t i = 0; i < n; i++)
                hist[fc_abs_bits(x[i]) >> sh]++;
        } else {
            for (int64_t i = 0; i < n; i++) {
                const uint32_t a = fc_abs_bits(x[i]);
                if ((a & mask) == prefix)
                    hist[(a >> sh) & (nb - 1)]++;
            }
        }
        uint32_t b = nb - 1;
        int64_t cum = 0;
        while (cum + (int64_t)hist[b] < want) { /* k <= the keys matching: a bin is found */
            cum += hist[b];
            b--;
        }
        want -= cum;
        *above += cum;
        prefix |= b << sh;
        mask |= (nb - 1) << sh;
    }
    return prefix;
}

uint32_t fc_topk_threshold(const float *x, int64_t n, int64_t k, int64_t *ties)
{
    int64_t above;
    const uint32_t thr = kth_largest(x, n, k, &above);
    *ties = k - above;
    return thr;
}

void fc_topk_indices(const float *x, int64_t n, int64_t k, uint32_t *idx)
{
    int64_t ties, m = 0;
    const uint32_t thr = fc_topk_threshold(x, n, k, &ties);
    for (int64_t i = 0; i < n && m < k; i++) {
        uint32_t a = fc_abs_bits(x[i]);
        if (a > thr || (a == thr && ties-- > 0))
            idx[m++] = (uint32_t)i;
    }
}
