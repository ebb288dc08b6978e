/* fc_linear.c: the aggregate hook of linear methods whose body is a plain fp32 array (count
 * sketch tables, GradiVeQ coefficients): payloads from different ranks add elementwise. */
#include "methods/fc_method.h"
#include "common/fc_quant.h"

int fc_aggregate_add_f32(const fc_chunk *c, uint8_t *agg, const uint8_t *body, int64_t body_bytes,
                         fc_err *err)
{
    (void)c;
    (void)err;
    float *a = (float *)agg;
    const float *b = (const float *)body;
    for (int64_t i = 0; i < body_bytes / 4; i++) {
        /* a sum of finite terms beyond fp32 saturates; a NaN/Inf that came in passes */
        const float s = a[i] + b[i];
        const int over = fc_abs_bits(s) >= FC_INF_BITS && fc_abs_bits(a[i]) < FC_INF_BITS &&
                         fc_abs_bits(b[i]) < FC_INF_BITS;
        a[i] = over ? fc_bits_f32((fc_f32_bits(s) & 0x80000000u) | FC_MAX_BITS) : s;
    }
    return FC_OK;
}
