// cuda_emu_device.h (tests only): what the emulated device says of itself, for the kernels that
// size their grid to it (cuda/fc_cu_decode.cuh's fc_cu_resident_blocks): a small device, so that
// the tests' modest sizes already take several blocks and loop over their runs. FC_EMU_SMS
// (default 1) and FC_EMU_THREADS_PER_SM (default 512: two blocks of 256) change it; the
// occupancy is that thread budget alone (the host has no registers to count).
#ifndef FC_EMU_CUDA_DEVICE_H
#define FC_EMU_CUDA_DEVICE_H

// a device function kept out of line (a rare path's registers kept apart from a loop's)
#define __noinline__ __attribute__((noinline))

enum cudaDeviceAttr {
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMaxThreadsPerMultiProcessor = 39,
};

static inline int fc_emu_env_int(const char *name, int fallback)
{
    const char *v = getenv(name);
    const int got = v != nullptr ? (int)strtol(v, nullptr, 0) : 0;
    return got > 0 ? got : fallback;
}

static inline cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device)
{
    if (device != 0 || value == nullptr)
        return fc_emu_last_error = cudaErrorInvalidValue;
    switch (attr) {
    case cudaDevAttrMultiProcessorCount:
        *value = fc_emu_env_int("FC_EMU_SMS", 1);
        return cudaSuccess;
    case cudaDevAttrMaxThreadsPerMultiProcessor:
        *value = fc_emu_env_int("FC_EMU_THREADS_PER_SM", 512);
        return cudaSuccess;
    }
    return fc_emu_last_error = cudaErrorInvalidValue;
}

template <class K>
static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, K, int threads, size_t smem)
{
    if (blocks == nullptr || threads < 1 || threads > 1024 || smem > 48 * 1024)
        return fc_emu_last_error = cudaErrorInvalidValue;
    const int per = fc_emu_env_int("FC_EMU_THREADS_PER_SM", 512) / threads;
    *blocks = per > 0 ? per : 1;
    return cudaSuccess;
}

#endif
