// emu_stubs.cpp (tests only): what the emulation of the CUDA library replaces: the two CUB
// algorithms of fc_cu_cub.cu, as plain host loops with the same contract (a stable compaction in
// index order, a stable sort by key).
#include <algorithm>
#include <numeric>
#include <vector>

#include <mutex>

#include "fc_cu_sparse.cuh"

cudaError_t fc_cu_select_if(void *temp, size_t *temp_bytes, const fc_cu_sel_pred &pred, int64_t *out,
                            int64_t *num, int64_t n, cudaStream_t)
{
    if (temp == NULL) {
        *temp_bytes = 64; // some, as CUB asks for
        return cudaSuccess;
    }
    fc_emu_tick(fc_emu_count.cub_calls);
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
    fc_emu_tick(fc_emu_count.cub_calls);
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

// ---- fresh device memory is not zeroed: the scratch a call gets (a grow-only torch buffer on a
// GPU, whatever the last call or another tensor left) is poisoned before every driver call that
// takes one. build.py compiles the driver's fc_cuda_get_api as fc_emu_real_get_api; this is the
// exported one, the real table with its calls wrapped.
extern "C" const fc_cuda_api *fc_emu_real_get_api(int abi);

static void fc_emu_poison_scratch(const fc_cuda_extra &x)
{
    if (x.scratch != nullptr && x.scratch_bytes > 0)
        memset(x.scratch, fc_emu_config().poison, (size_t)x.scratch_bytes);
}
static const fc_cuda_api *fc_emu_real;
static int fc_emu_encode(fc_cuda_ctx *ctx, const fc_cuda_encode_args *a, fc_err *err)
{
    fc_emu_poison_scratch(a->h.x);
    return fc_emu_real->encode(ctx, a, err);
}
static int fc_emu_decode(fc_cuda_ctx *ctx, const fc_cuda_decode_args *a, fc_err *err)
{
    fc_emu_poison_scratch(a->h.x);
    return fc_emu_real->decode(ctx, a, err);
}
static int fc_emu_compress(fc_cuda_ctx *ctx, const fc_cuda_encode_args *a, int64_t *written, fc_err *err)
{
    fc_emu_poison_scratch(a->h.x);
    return fc_emu_real->compress(ctx, a, written, err);
}
static int fc_emu_decompress(fc_cuda_ctx *ctx, const fc_cuda_decode_args *a, fc_err *err)
{
    fc_emu_poison_scratch(a->h.x);
    return fc_emu_real->decompress(ctx, a, err);
}

extern "C" __attribute__((visibility("default"))) const fc_cuda_api *fc_emu_get_api(int abi) __asm__("fc_cuda_get_api");
extern "C" const fc_cuda_api *fc_emu_get_api(int abi)
{
    static fc_cuda_api wrapped;
    static std::once_flag once;
    const fc_cuda_api *real = fc_emu_real_get_api(abi);
    if (real == nullptr)
        return nullptr;
    std::call_once(once, [real]() {
        fc_emu_real = real;
        wrapped = *real;
        wrapped.encode = fc_emu_encode;
        wrapped.decode = fc_emu_decode;
        wrapped.compress = fc_emu_compress;
        wrapped.decompress = fc_emu_decompress;
    });
    return &wrapped;
}

// ---- the runtime calls counted by cuda_runtime.h (fc_emu_count), for the tests to read per driver
// call: `names` is FC_EMU_COUNT_NAMES (comma-separated), out gets up to n values in that order.
extern "C" __attribute__((visibility("default"))) const char *fc_emu_counts_names(void)
{
    return FC_EMU_COUNT_NAMES;
}
extern "C" __attribute__((visibility("default"))) int fc_emu_counts_read(unsigned long long *out, int n)
{
    const std::atomic<unsigned long long> *all[] = {&fc_emu_count.launches, &fc_emu_count.memsets,
                                                    &fc_emu_count.event_creates, &fc_emu_count.event_records,
                                                    &fc_emu_count.event_queries, &fc_emu_count.host_syncs,
                                                    &fc_emu_count.d2h_copies, &fc_emu_count.mallocs,
                                                    &fc_emu_count.cub_calls};
    const int have = (int)(sizeof(all) / sizeof(all[0]));
    for (int i = 0; i < n && i < have; i++)
        out[i] = all[i]->load();
    return have;
}
extern "C" __attribute__((visibility("default"))) void fc_emu_counts_reset(void)
{
    for (auto *c : {&fc_emu_count.launches, &fc_emu_count.memsets, &fc_emu_count.event_creates,
                    &fc_emu_count.event_records, &fc_emu_count.event_queries, &fc_emu_count.host_syncs,
                    &fc_emu_count.d2h_copies, &fc_emu_count.mallocs, &fc_emu_count.cub_calls})
        c->store(0);
}
