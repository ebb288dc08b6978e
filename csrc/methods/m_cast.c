/* m_cast.c: `fp16` and `bf16`, plain casts. fp16 pre-divides by the world size (as torch's
 * FSDP does) so that the sum of W ranks stays inside fp16's range; a value still beyond it
 * after the pre-divide is saturated at 65504 (bf16: at 3.3895e38) and counted, the rest stays
 * in the residual with error feedback. */
#include "common/fc_half.h"
#include "common/fc_quant.h"
#include "methods/fc_method.h"
#include "methods/fc_simd.h"

static const fc_key cast_keys[] = {FC_KEYS_END};

static void cast_layout(const fc_chunk *c, fc_layout *out)
{
    fc_layout_set(out, 0, c->n * 2, c->n);
}

/* fc_f32_to_f16 without branches, so that the loop vectorises. Same bytes: normals by the same
 * integer rounding, clamped at 0x7bff (65504: finite values saturate); Inf is sign|0x7c00 and
 * any NaN the canonical 0x7e00. Below 2^-14 the float sum 0.5 + |x| rounds |x| to a multiple of
 * 2^-24, to nearest even (0.5's ulp is 2^-24): the reference's shift-and-round of the
 * subnormal mantissa, including 0 for |x| <= 2^-25 and the carry into the smallest normal.
 * Selections are masks, not ?:, which GCC turns back into a branch around the float add.
 * Checked on all 2^32 inputs. */
static inline uint16_t f16_select(float f)
{
    const uint32_t u = fc_f32_bits(f), a = u & 0x7fffffffu, sign = (u >> 16) & 0x8000u;
    uint32_t nrm = (a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13;
    nrm = nrm < 0x7bffu ? nrm : 0x7bffu;
    const uint32_t sub = fc_f32_bits(fc_bits_f32(a) + 0.5f) - 0x3f000000u;
    const uint32_t is_sub = 0u - ((a - 0x38800000u) >> 31);          /* a < 2^-14 */
    const uint32_t is_nan = 0u - ((FC_INF_BITS - a) >> 31);          /* a > Inf */
    const uint32_t is_inf = 0u - (uint32_t)(a == FC_INF_BITS);
    const uint32_t fin = sign | (sub & is_sub) | (nrm & ~is_sub);
    return (uint16_t)((fin & ~(is_nan | is_inf)) | ((sign | 0x7c00u) & is_inf) |
                      (FC_F16_NAN & is_nan));
}

/* fc_f16_to_f32 without branches: exponent 31 gets 112 more (255: Inf/NaN, mantissa kept);
 * the subnormal product m * 2^-24 is exact either way. */
static inline float f16_widen(uint32_t h)
{
    const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    const uint32_t is_top = 0u - (uint32_t)(e == 0x1fu), is_sub = 0u - (uint32_t)(e == 0);
    const uint32_t nrm = ((e + 112u + (is_top & 112u)) << 23) | (m << 13);
    const uint32_t sub = fc_f32_bits((float)m * 5.9604644775390625e-08f);
    return fc_bits_f32(sign | (sub & is_sub) | (nrm & ~is_sub));
}

/* Returns how many finite values were saturated (fc_f16_saturates). */
FC_CLONES static int64_t fp16_encode_fast(const float *restrict x, int64_t n, float inv_w,
                                          uint16_t *restrict o)
{
    int64_t sat = 0;
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i] * inv_w;
        const uint32_t a = fc_abs_bits(v);
        sat += a >= 0x477ff000u && a < FC_INF_BITS;
        o[i] = f16_select(v);
    }
    return sat;
}

FC_CLONES static void fp16_decode_fast(const uint16_t *restrict v, int64_t n, float a,
                                       float *restrict acc)
{
    for (int64_t i = 0; i < n; i++)
        acc[i] += a * f16_widen(v[i]);
}

static int fp16_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    uint16_t *o = (uint16_t *)body;
    const float inv_w = 1.0f / (float)c->world;
    int64_t sat = 0;
    if (!fc_cpu_reference)
        sat = fp16_encode_fast(x, c->n, inv_w, o);
    else
        for (int64_t i = 0; i < c->n; i++) {
            sat += fc_f16_saturates(x[i] * inv_w);
            o[i] = fc_f32_to_f16(x[i] * inv_w);
        }
    cast_layout(c, used);
    used->saturated = sat;
    return FC_OK;
}

static int fp16_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                           float *acc, fc_err *err)
{
    (void)body_bytes;
    (void)err;
    const uint16_t *v = (const uint16_t *)body;
    const float a = alpha * (float)c->world;
    if (!fc_cpu_reference)
        fp16_decode_fast(v, c->n, a, acc);
    else
        for (int64_t i = 0; i < c->n; i++)
            acc[i] += a * fc_f16_to_f32(v[i]);
    return FC_OK;
}

static int bf16_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    uint16_t *o = (uint16_t *)body;
    int64_t sat = 0;
    for (int64_t i = 0; i < c->n; i++) {
        sat += fc_bf16_saturates(x[i]);
        o[i] = fc_f32_to_bf16(x[i]);
    }
    cast_layout(c, used);
    used->saturated = sat;
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
    .id = FC_ID_FP16,
    .flags = FC_PIECEWISE,
    .summary = "IEEE half cast, pre-divided by the world size; 16 bits",
    .cfg_size = sizeof(fc_none_cfg),
    .keys = cast_keys,
    .layout = cast_layout,
    .encode = fp16_encode,
    .decode_add = fp16_decode_add,
};

const fc_method fc_method_bf16 = {
    .name = "bf16",
    .id = FC_ID_BF16,
    .flags = FC_PIECEWISE,
    .summary = "bfloat16 cast (round to nearest even); 16 bits",
    .cfg_size = sizeof(fc_none_cfg),
    .keys = cast_keys,
    .layout = cast_layout,
    .encode = bf16_encode,
    .decode_add = bf16_decode_add,
};
