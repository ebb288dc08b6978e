// emu_stubs.cpp (tests only): what the emulation of the CUDA library replaces: the NCCL transport
// (not emulated: it fails clearly) and the two CUB algorithms of fc_cu_cub.cu, as plain host
// loops with the same contract (a stable compaction in index order, a stable sort by key).
#include <algorithm>
#include <numeric>
#include <vector>

#include "fc_cu_sparse.cuh"

int fc_cu_nccl_unique_id(uint8_t *, fc_err *err) { return fc_fail(err, FC_ERR_NCCL, "no NCCL in the emulation"); }
int fc_cu_nccl_comm_init(const uint8_t *, int, int, int, fc_cuda_comm **, fc_err *err)
{
    return fc_fail(err, FC_ERR_NCCL, "no NCCL in the emulation");
}
void fc_cu_nccl_comm_free(fc_cuda_comm *) {}
int fc_cu_nccl_all_to_all(fc_cuda_ctx *, fc_cuda_comm *, int, void *, const uint8_t *, const int64_t *,
                          uint8_t *, const int64_t *, fc_err *err)
{
    return fc_fail(err, FC_ERR_NCCL, "no NCCL in the emulation");
}

cudaError_t fc_cu_select_if(void *temp, size_t *temp_bytes, const fc_cu_sel_pred &pred, int64_t *out,
                            int64_t *num, int64_t n, cudaStream_t)
{
    if (temp == NULL) {
        *temp_bytes = 64; // some, as CUB asks for
        return cudaSuccess;
    }
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++)
        if (pred(i))
            out[m++] = i;
    *num = m;
    return cudaSuccess;
}

cudaError_t fc_cu_sort_pairs(void *temp, size_t *temp_bytes, const uint32_t *kin, uint32_t *kout,
                             const float *vin, float *vout, int64_t n, int end_bit, cudaStream_t)
{
    if (temp == NULL) {
        *temp_bytes = 64;
        return cudaSuccess;
    }
    const uint32_t mask = end_bit >= 32 ? 0xffffffffu : (1u << end_bit) - 1u;
    std::vector<int64_t> order((size_t)n);
    std::iota(order.begin(), order.end(), (int64_t)0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return (kin[a] & mask) < (kin[b] & mask); });
    for (int64_t j = 0; j < n; j++) {
        kout[j] = kin[order[(size_t)j]];
        vout[j] = vin[order[(size_t)j]];
    }
    return cudaSuccess;
}
