/* m_fp8.c: `fp8`, OCP FP8 (e4m3 or e5m2) with one fp32 scale per block: s = amax / fmax,
 * code = fp8(x / s), round to nearest even. Biased (error <= half an fp8 ulp of x / s).
 * Body: nblocks fp32 scales, then n fp8 codes. 8 bits + 32/B. */
#include <math.h>
#include "methods/fc_block.h"
#include "common/fc_fp8.h"
#include "methods/fc_method.h"
#include "methods/fc_simd.h"

static const char *const fp8_formats[] = {"e4m3", "e5m2", NULL};

static const fc_key fp8_keys[] = {
    FC_CHOICE(fc_fp8_cfg, format, 0, fp8_formats, "e4m3 (max 448, 3 mantissa bits) or e5m2 (max 57344, 2)"),
    FC_INT(fc_fp8_cfg, block_size, 256, 8, 1 << 24, FC_KEY_POW2, "elements per scale; a power of two"),
    FC_KEYS_END,
};

static void fp8_layout(const fc_chunk *c, fc_layout *out)
{
    const fc_fp8_cfg *cfg = (const fc_fp8_cfg *)c->cfg;
    fc_layout_set(out, 4 * fc_nblocks(c->n, cfg->block_size), c->n, c->n);
}

/* fc_f32_to_fp8 without the branch, so the loop vectorises: both the subnormal code (the same
 * float product and round_even) and the normal code (the same integer rounding) are computed
 * and one is selected, then the same clamp. M, B, maxcode are literals at each call. Checked
 * against fc_f32_to_fp8 on all finite fp32 inputs, both formats. */
static inline uint8_t fp8_select(float v, int M, int B, uint32_t maxcode)
{
    const uint32_t u = fc_f32_bits(v), a = u & 0x7fffffffu, sign = (u >> 24) & 0x80u;
    const float scaled = fc_bits_f32(a) * fc_bits_f32((uint32_t)(127 + B - 1 + M) << 23);
    /* 0 .. 2^M where selected; the clamp only keeps the unselected conversion defined */
    const float r = fc_round_even(scaled);
    const uint32_t sub = (uint32_t)(int32_t)(r < 16.0f ? r : 16.0f);
    const int drop = 23 - M;
    const uint32_t nrm = ((a + ((1u << (drop - 1)) - 1u) + ((a >> drop) & 1u)) >> drop) -
                         ((uint32_t)(127 - B) << M);
    uint32_t code = a < ((uint32_t)(128 - B) << 23) ? sub : nrm;
    code = code > maxcode ? maxcode : code;
    return (uint8_t)(sign | code);
}

static inline void fp8_codes(const float *restrict x, int64_t n, float inv, int fmt,
                             uint8_t *restrict codes)
{
    if (fmt == FC_FP8_E4M3)
        for (int64_t i = 0; i < n; i++)
            codes[i] = fp8_select(x[i] * inv, 3, 7, 0x7Eu);
    else
        for (int64_t i = 0; i < n; i++)
            codes[i] = fp8_select(x[i] * inv, 2, 15, 0x7Bu);
}

/* The reference encode below with fp8_codes for the finite blocks. */
FC_CLONES static void fp8_encode_fast(const float *x, int64_t n, int64_t bs, int fmt, uint8_t *body)
{
    const int64_t nb = fc_nblocks(n, bs);
    const float fmax = fc_fp8_max(fmt);
    float *scales = (float *)body;
    uint8_t *codes = body + 4 * nb;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, n);
        const float inv = fc_block_scale(x, lo, hi, fmax, &scales[b]);
        if (inv == 0.0f) { /* zero or non-finite block: zero codes (see fc_block_scale) */
            for (int64_t i = lo; i < hi; i++)
                codes[i] = 0;
            continue;
        }
        fp8_codes(x + lo, hi - lo, inv, fmt, codes + lo);
    }
}

static int fp8_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    const fc_fp8_cfg *cfg = (const fc_fp8_cfg *)c->cfg;
    if (!fc_cpu_reference) {
        fp8_encode_fast(x, c->n, cfg->block_size, cfg->format, body);
        fp8_layout(c, used);
        return FC_OK;
    }
    const int64_t bs = cfg->block_size, nb = fc_nblocks(c->n, bs);
    const int fmt = cfg->format;
    const float fmax = fc_fp8_max(fmt);
    float *scales = (float *)body;
    uint8_t *codes = body + 4 * nb;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        const float inv = fc_block_scale(x, lo, hi, fmax, &scales[b]);
        if (inv == 0.0f) { /* zero or non-finite block: zero codes (see fc_block_scale) */
            for (int64_t i = lo; i < hi; i++)
                codes[i] = 0;
            continue;
        }
        for (int64_t i = lo; i < hi; i++)
            codes[i] = fc_f32_to_fp8(x[i] * inv, fmt);
    }
    fp8_layout(c, used);
    return FC_OK;
}

static int fp8_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                          float *acc, fc_err *err)
{
    (void)body_bytes;
    (void)err;
    const fc_fp8_cfg *cfg = (const fc_fp8_cfg *)c->cfg;
    const int64_t bs = cfg->block_size, nb = fc_nblocks(c->n, bs);
    const float *scales = (const float *)body;
    const uint8_t *codes = body + 4 * nb;
    float lut[256]; /* 256 decodes once per chunk instead of one conversion per element */
    for (int v = 0; v < 256; v++)
        lut[v] = fc_fp8_to_f32((uint8_t)v, cfg->format);
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        const float s = alpha * scales[b];
        for (int64_t i = lo; i < hi; i++)
            acc[i] += s * lut[codes[i]];
    }
    return FC_OK;
}

const fc_method fc_method_fp8 = {
    .name = "fp8",
    .id = FC_ID_FP8,
    .flags = FC_PIECEWISE,
    .summary = "OCP FP8 (e4m3/e5m2) with an fp32 absmax scale per block; 8 bits + 32/block_size",
    .cfg_size = sizeof(fc_fp8_cfg),
    .keys = fp8_keys,
    .layout = fp8_layout,
    .encode = fp8_encode,
    .decode_add = fp8_decode_add,
};
