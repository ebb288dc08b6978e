/* m_cast.c: `fp16` and `bf16`, plain casts. fp16 pre-divides by the world size (as torch's
 * FSDP does) so that the sum of W ranks stays inside fp16's range; what still overflows is
 * counted as non-finite by the driver on the decoded side. */
#include "fc_half.h"
#include "fc_method.h"

typedef struct {
    int unused;
} cast_cfg;

static const fc_key cast_keys[] = {FC_KEYS_END};

static void cast_layout(const fc_chunk *c, fc_layout *out)
{
    out->value_bytes = c->n * 2;
    out->meta_bytes = 0;
    out->index_bytes = 0;
    out->kept = c->n;
}

static int fp16_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    uint16_t *o = (uint16_t *)body;
    const float inv_w = 1.0f / (float)c->world;
    for (int64_t i = 0; i < c->n; i++)
        o[i] = fc_f32_to_f16(x[i] * inv_w);
    cast_layout(c, used);
    return FC_OK;
}

static int fp16_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                           float *acc, fc_err *err)
{
    (void)body_bytes;
    (void)err;
    const uint16_t *v = (const uint16_t *)body;
    const float a = alpha * (float)c->world;
    for (int64_t i = 0; i < c->n; i++)
        acc[i] += a * fc_f16_to_f32(v[i]);
    return FC_OK;
}

static int bf16_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    uint16_t *o = (uint16_t *)body;
    for (int64_t i = 0; i < c->n; i++)
        o[i] = fc_f32_to_bf16(x[i]);
    cast_layout(c, used);
    return FC_OK;
}

static int bf16_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                           float *acc, fc_err *err)
{
    (void)body_bytes;
    (void)err;
    const uint16_t *v = (const uint16_t *)body;
    for (int64_t i = 0; i < c->n; i++)
        acc[i] += alpha * fc_bf16_to_f32(v[i]);
    return FC_OK;
}

const fc_method fc_method_fp16 = {
    .name = "fp16",
    .id = 1,
    .flags = 0,
    .summary = "IEEE half cast, pre-divided by the world size; 16 bits",
    .cfg_size = sizeof(cast_cfg),
    .keys = cast_keys,
    .layout = cast_layout,
    .encode = fp16_encode,
    .decode_add = fp16_decode_add,
};

const fc_method fc_method_bf16 = {
    .name = "bf16",
    .id = 2,
    .flags = 0,
    .summary = "bfloat16 cast (round to nearest even); 16 bits",
    .cfg_size = sizeof(cast_cfg),
    .keys = cast_keys,
    .layout = cast_layout,
    .encode = bf16_encode,
    .decode_add = bf16_decode_add,
};
