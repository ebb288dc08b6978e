// fc_cu_cub.cu: the only CUB instantiations of the library, kept to two (CUB's device-wide
// algorithms are template-heavy and are compiled for every arch): a selection of indices by
// fc_cu_sel_pred, and a stable radix sort of (uint32 key, float value) pairs.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_select.cuh>
#include <thrust/iterator/counting_iterator.h>

#include "fc_cu_sparse.cuh"

cudaError_t fc_cu_select_if(void *temp, size_t *temp_bytes, const fc_cu_sel_pred &pred, int64_t *out,
                            int64_t *num, int64_t n, cudaStream_t s)
{
    return cub::DeviceSelect::If(temp, *temp_bytes, thrust::counting_iterator<int64_t>(0), out, num, n,
                                 pred, s);
}

cudaError_t fc_cu_sort_pairs(void *temp, size_t *temp_bytes, const uint32_t *kin, uint32_t *kout,
                             const float *vin, float *vout, int64_t n, int end_bit, cudaStream_t s)
{
    return cub::DeviceRadixSort::SortPairs(temp, *temp_bytes, kin, kout, vin, vout, n, 0, end_bit, s);
}
