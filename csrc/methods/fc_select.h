/* fc_select.h: exact top-k selection by magnitude on the CPU (top-k and the sketch's heavy
 * hitters). Ties at the k-th magnitude go to the lowest indices; indices come out ascending. */
#ifndef FC_SELECT_H
#define FC_SELECT_H

#include <stdint.h>

/* Writes the k indices of the largest |x| (NaN counts as largest) to idx, ascending. Reads x
 * four times and needs no scratch beyond idx (k uint32). 0 < k <= n. */
void fc_topk_indices(const float *x, int64_t n, int64_t k, uint32_t *idx);

/* The selection fc_topk_indices makes, as a rule to apply in one ascending pass with no index
 * array: element i is taken when fc_abs_bits(x[i]) > the returned key, or equals it while
 * *ties (counted down at each such element) is still > 0. 0 < k <= n. */
uint32_t fc_topk_threshold(const float *x, int64_t n, int64_t k, int64_t *ties);

#endif
