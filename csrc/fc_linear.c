/* fc_linear.c: the aggregate hook of linear methods whose body is a plain fp32 array (count
 * sketch tables, GradiVeQ coefficients): payloads from different ranks add elementwise. */
#include "fc_method.h"

int fc_aggregate_add_f32(const fc_chunk *c, uint8_t *agg, const uint8_t *body, int64_t body_bytes,
                         fc_err *err)
{
    (void)c;
    (void)err;
    float *a = (float *)agg;
    const float *b = (const float *)body;
    for (int64_t i = 0; i < body_bytes / 4; i++)
        a[i] += b[i];
    return FC_OK;
}
