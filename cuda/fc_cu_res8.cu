// fc_cu_res8.cu: pack and unpack of 8-bit residuals (residual_dtype "int8"), the rule and the
// layout of csrc/common/fc_res8.h. One warp per block of 64 elements: two per lane, the block's amax
// by a warp reduction (a max is exact in any order), so the bytes are the CPU's.
#include "fc_cu_ctx.cuh"
#include "common/fc_res8.h"

#define RES8_WARPS 8 // warps per thread block: 8 residual blocks per CUDA block

__global__ void res8_pack_kernel(const float *e, int64_t n, uint8_t *packed, uint32_t key)
{
    float *scales = (float *)packed;
    int8_t *codes = (int8_t *)(packed + 4 * fc_res8_blocks(n));
    const int lane = threadIdx.x & 31;
    const int64_t nb = fc_res8_blocks(n);
    const int64_t stride = (int64_t)gridDim.x * RES8_WARPS;
    for (int64_t b = (int64_t)blockIdx.x * RES8_WARPS + (threadIdx.x >> 5); b < nb; b += stride) {
        const int64_t i0 = b * FC_RES8_BLOCK + lane, i1 = i0 + 32;
        const float v0 = i0 < n ? e[i0] : 0.0f, v1 = i1 < n ? e[i1] : 0.0f;
        float amax = fmaxf(fabsf(v0), fabsf(v1));
        for (int o = 16; o > 0; o >>= 1)
            amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        const float scale = fc_res8_scale(amax);
        if (lane == 0)
            scales[b] = scale;
        if (i0 < n)
            codes[i0] = fc_res8_code(v0, scale, fc_res8_u(key, i0));
        if (i1 < n)
            codes[i1] = fc_res8_code(v1, scale, fc_res8_u(key, i1));
    }
}

__global__ void res8_unpack_kernel(const uint8_t *packed, int64_t n, float *e)
{
    const float *scales = (const float *)packed;
    const int8_t *codes = (const int8_t *)(packed + 4 * fc_res8_blocks(n));
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        e[i] = fc_res8_value(codes[i], scales[i / FC_RES8_BLOCK]);
}

static unsigned res8_grid(int64_t items, int64_t per_block)
{
    int64_t g = (items + per_block - 1) / per_block;
    return (unsigned)(g < 1 ? 1 : g > 65535 ? 65535 : g);
}

int fc_cu_res8(fc_cuda_ctx *ctx, int device, void *stream, int pack, float *e, int64_t n,
               uint8_t *packed, uint32_t key, fc_err *err)
{
    int rc = FC_OK;
    fc_cu_device_guard dg = {0, 0};
    cudaStream_t s = (cudaStream_t)stream;
    (void)ctx;
    if (n <= 0)
        return FC_OK;
    FC_TRY(fc_cu_device_enter(&dg, device, err));
    if (pack)
        res8_pack_kernel<<<res8_grid(fc_res8_blocks(n), RES8_WARPS), RES8_WARPS * 32, 0, s>>>(
            e, n, packed, key);
    else
        res8_unpack_kernel<<<res8_grid(n, 256 * 4), 256, 0, s>>>(packed, n, e);
    FC_CHECK_LAUNCH(err, error);
error:
    fc_cu_device_leave(&dg);
    return rc;
}
