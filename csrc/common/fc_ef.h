/* fc_ef.h: error feedback for a residual that no codec's encode reads (PowerSGD's error e, the
 * State's "factors" slot), one element at a time, by the codecs' own rules (fc_range.h): written
 * once for the CPU backend (backend_cpu/fc_ef_cpu.c) and the CUDA kernel (cuda/fc_cu_ef.cu), so
 * PowerSGD's g' and e hold the values a codec's would, on either device. */
#ifndef FC_EF_H
#define FC_EF_H

#include <stdint.h>
#include "common/fc_half.h"
#include "common/fc_hostdev.h"
#include "common/fc_range.h"

/* What fc_drive_ef does to x: add the residual in, or keep what the mean left of it. */
enum { FC_EF_ADD = 0, FC_EF_KEEP = 1 };

/* g' = g + decay * e, the codecs' load_chunk: a NaN/Inf of the gradient counted in *bad (in
 * "zero" mode e goes out there, in "pass" mode the canonical NaN), a sum of two finite terms
 * beyond fp32 saturated (*sat). */
FC_HOSTDEV float fc_ef_add(float g, float e_kept, float decay, int zero, int64_t *bad, int64_t *sat)
{
    const float e = decay * e_kept;
    const float x = g + e;
    return fc_abs_bits(x) < FC_INF_BITS ? x : fc_gprime_fix(x, g, e, zero, bad, sat);
}

/* The residual of g' (x) where the mean delivered `ref` of it: x - ref by fc_residual's rule
 * (0 where g' is not finite, never NaN/Inf, saturation counted). */
FC_HOSTDEV float fc_ef_keep(float x, float ref, int64_t *sat)
{
    return fc_residual(x, -ref, sat);
}

/* e stored as the residual's dtype: fp32, or bf16 rounded to nearest even and saturated (*sat);
 * dst is element k of a residual of that dtype. */
FC_HOSTDEV void fc_ef_store(void *dst, int bf16, int64_t k, float e, int64_t *sat)
{
    if (!bf16) {
        ((float *)dst)[k] = e;
        return;
    }
    *sat += fc_bf16_saturates(e);
    ((uint16_t *)dst)[k] = fc_f32_to_bf16(e);
}

/* Element k of a kept residual (fp32 or bf16) as fp32. */
FC_HOSTDEV float fc_ef_load(const void *src, int bf16, int64_t k)
{
    return bf16 ? fc_bf16_to_f32(((const uint16_t *)src)[k]) : ((const float *)src)[k];
}

#endif
