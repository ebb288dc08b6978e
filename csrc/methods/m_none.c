/* m_none.c: `none`, the exact baseline through the same all-to-all path: the gradient's own
 * dtype on the wire, so the gain of compression is never confused with that of the algorithm. */
#include "common/fc_half.h"
#include "methods/fc_method.h"

static const fc_key none_keys[] = {FC_KEYS_END};

static void none_layout(const fc_chunk *c, fc_layout *out)
{
    fc_layout_set(out, 0, c->n * fc_dtype_size(c->wire_dtype), c->n);
}

static int none_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    int64_t n = c->n, sat = 0;
    if (c->wire_dtype == FC_F32) { /* NaNs arrive canonical: the driver made them so */
        memcpy(body, x, (size_t)n * 4);
    } else if (c->wire_dtype == FC_BF16) { /* g + e can leave the gradient's dtype: saturated */
        uint16_t *o = (uint16_t *)body;
        for (int64_t i = 0; i < n; i++) {
            sat += fc_bf16_saturates(x[i]);
            o[i] = fc_f32_to_bf16(x[i]);
        }
    } else {
        uint16_t *o = (uint16_t *)body;
        for (int64_t i = 0; i < n; i++) {
            sat += fc_f16_saturates(x[i]);
            o[i] = fc_f32_to_f16(x[i]);
        }
    }
    none_layout(c, used);
    used->saturated = sat;
    return FC_OK;
}

static int none_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                           float *acc, fc_err *err)
{
    (void)body_bytes;
    (void)err;
    int64_t n = c->n;
    if (c->wire_dtype == FC_F32) {
        const float *v = (const float *)body;
        for (int64_t i = 0; i < n; i++)
            acc[i] += alpha * v[i];
    } else if (c->wire_dtype == FC_BF16) {
        const uint16_t *v = (const uint16_t *)body;
        for (int64_t i = 0; i < n; i++)
            acc[i] += alpha * fc_bf16_to_f32(v[i]);
    } else {
        const uint16_t *v = (const uint16_t *)body;
        for (int64_t i = 0; i < n; i++)
            acc[i] += alpha * fc_f16_to_f32(v[i]);
    }
    return FC_OK;
}

const fc_method fc_method_none = {
    .name = "none",
    .id = FC_ID_NONE,
    .flags = FC_UNBIASED | FC_LINEAR | FC_PIECEWISE,
    .summary = "exact: the gradient's own dtype through the compressed path's all-to-all",
    .cfg_size = sizeof(fc_none_cfg),
    .keys = none_keys,
    .layout = none_layout,
    .encode = none_encode,
    .decode_add = none_decode_add,
};
