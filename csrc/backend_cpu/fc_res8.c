/* fc_res8.c: the CPU backend's pack and unpack of 8-bit residuals (fc_res8.h has the rule and
 * the layout); the driver calls them around every call that reads or replaces a residual. */
#include "common/fc_res8.h"

#include <string.h>

#include "backend_cpu/fc_cpu.h"
#include "methods/fc_simd.h"

/* An AVX2 clone where the CPU has it: floorf is one vroundss there, a libm call in baseline
 * x86-64. GCC does not vectorise the loop under -ftrapping-math (about 5 ns per element here). */
FC_CLONES static void pack_host(const float *e, int64_t n, uint8_t *dst, uint32_t key)
{
    float *scales = (float *)dst; /* the tensor's data: 4-byte aligned by the allocator */
    int8_t *codes = (int8_t *)(dst + 4 * fc_res8_blocks(n));
    for (int64_t b = 0; b * FC_RES8_BLOCK < n; b++) {
        const int64_t lo = b * FC_RES8_BLOCK;
        const int64_t hi = lo + FC_RES8_BLOCK < n ? lo + FC_RES8_BLOCK : n;
        float amax = 0.0f;
        for (int64_t i = lo; i < hi; i++) {
            const float a = fabsf(e[i]);
            amax = a > amax ? a : amax;
        }
        const float scale = fc_res8_scale(amax);
        scales[b] = scale;
        /* a block never straddles 2^32 (64 divides it): one high-word hash per block */
        const uint32_t high = fc_res8_u_high(key, lo);
        for (int64_t i = lo; i < hi; i++)
            codes[i] = fc_res8_code(e[i], scale, fc_res8_u_low(high, i));
    }
}

static void unpack_host(const uint8_t *src, int64_t n, float *e)
{
    const float *scales = (const float *)src;
    const int8_t *codes = (const int8_t *)(src + 4 * fc_res8_blocks(n));
    for (int64_t b = 0; b * FC_RES8_BLOCK < n; b++) {
        const int64_t lo = b * FC_RES8_BLOCK;
        const int64_t hi = lo + FC_RES8_BLOCK < n ? lo + FC_RES8_BLOCK : n;
        const float scale = scales[b];
        for (int64_t i = lo; i < hi; i++)
            e[i] = fc_res8_value(codes[i], scale);
    }
}

int fc_cpu_res8_pack(fc_core *s, const fc_exec *x, const fc_buf *e, fc_buf *packed, uint32_t key,
                     fc_err *err)
{
    (void)s;
    (void)x;
    (void)err;
    pack_host((const float *)e->data, e->numel, (uint8_t *)packed->data, key);
    return FC_OK;
}

int fc_cpu_res8_unpack(fc_core *s, const fc_exec *x, const fc_buf *packed, fc_buf *e, fc_err *err)
{
    (void)s;
    (void)x;
    (void)err;
    unpack_host((const uint8_t *)packed->data, e->numel, (float *)e->data);
    return FC_OK;
}
