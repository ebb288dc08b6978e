/* fc_select.c: exact top-k by magnitude: a quickselect over |x|'s bit patterns finds the k-th
 * largest magnitude, then one ascending pass takes everything above it and the lowest-index
 * ties at it. O(n) expected, no sort of the values. */
#include "methods/fc_select.h"

#include "common/fc_quant.h"

/* k-th largest (1-based) of a[0..n) by iterative quickselect; a is permuted. */
static uint32_t kth_largest(uint32_t *a, int64_t n, int64_t k)
{
    int64_t lo = 0, hi = n - 1, want = k - 1; /* position in descending order */
    uint32_t seed = 0x9E3779B9u;
    while (lo < hi) {
        seed = seed * 1664525u + 1013904223u; /* pivot choice: fixed sequence, deterministic */
        uint32_t pivot = a[lo + (int64_t)(seed % (uint32_t)(hi - lo + 1))];
        /* three-way partition into > pivot | == pivot | < pivot */
        int64_t i = lo, lt = lo, gt = hi;
        while (i <= gt) {
            if (a[i] > pivot) {
                uint32_t t = a[lt]; a[lt] = a[i]; a[i] = t;
                lt++;
                i++;
            } else if (a[i] < pivot) {
                uint32_t t = a[gt]; a[gt] = a[i]; a[i] = t;
                gt--;
            } else {
                i++;
            }
        }
        if (want < lt)
            hi = lt - 1;
        else if (want > gt)
            lo = gt + 1;
        else
            return pivot;
    }
    return a[lo];
}

void fc_topk_indices(const float *x, int64_t n, int64_t k, uint32_t *keys, uint32_t *idx)
{
    for (int64_t i = 0; i < n; i++)
        keys[i] = fc_abs_bits(x[i]);
    uint32_t thr = kth_largest(keys, n, k);
    int64_t above = 0;
    for (int64_t i = 0; i < n; i++)
        above += fc_abs_bits(x[i]) > thr;
    int64_t ties = k - above, m = 0;
    for (int64_t i = 0; i < n && m < k; i++) {
        uint32_t a = fc_abs_bits(x[i]);
        if (a > thr || (a == thr && ties-- > 0))
            idx[m++] = (uint32_t)i;
    }
}
