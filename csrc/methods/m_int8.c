/* m_int8.c: `int8`, symmetric block-wise absmax quantisation. Per block of block_size elements
 * s = amax / 127 and q = round(x / s), to nearest (biased, error <= s/2) or stochastically
 * (unbiased, error < s). Body: nblocks fp32 scales, then n int8 codes. 8 bits + 32/B. */
#include <math.h>
#include "methods/fc_method.h"
#include "methods/fc_block.h"
#include "common/fc_quant.h"
#include "methods/fc_rng_batch.h"
#include "methods/fc_simd.h"

static const fc_key int8_keys[] = {
    FC_INT(fc_int8_cfg, block_size, 256, 8, 1 << 24, FC_KEY_POW2,
           "elements per scale; a power of two"),
    FC_BOOL(fc_int8_cfg, stochastic, 0, "stochastic rounding (unbiased) instead of nearest"),
    FC_KEYS_END,
};

static int64_t int8_blocks(const fc_chunk *c)
{
    const fc_int8_cfg *cfg = (const fc_int8_cfg *)c->cfg;
    return (c->n + cfg->block_size - 1) / cfg->block_size;
}

static void int8_layout(const fc_chunk *c, fc_layout *out)
{
    fc_layout_set(out, 4 * int8_blocks(c), c->n, c->n);
}

/* Round-to-nearest codes of one finite block: the reference's expression, in a function of its
 * own so that it is compiled for AVX2 as well (same IEEE operations, so the same codes). */
static inline void int8_nearest(const float *restrict x, int64_t n, float inv, int8_t *restrict codes)
{
    for (int64_t i = 0; i < n; i++) {
        float q = fc_round_even(x[i] * inv);
        q = q > 127.0f ? 127.0f : q;
        q = q < -127.0f ? -127.0f : q;
        codes[i] = (int8_t)(int32_t)q;
    }
}

/* Stochastic codes of one finite block stretch: floor(x / s + u), u = h * 2^-16. */
static inline void int8_stoch(const float *restrict x, const uint16_t *restrict h, int64_t n,
                              float inv, int8_t *restrict codes)
{
    for (int64_t i = 0; i < n; i++) {
        int32_t q = fc_floor_i32(x[i] * inv + fc_u01_16(h[i]));
        q = q > 127 ? 127 : q;
        q = q < -127 ? -127 : q;
        codes[i] = (int8_t)q;
    }
}

/* The reference's encode, blocks and special blocks included: nearest rounding without rng,
 * else stochastic with the draws made in bulk (fc_rng_fill16), a stretch at a time in L1; the
 * rounding loops compiled for AVX2 as well. */
FC_CLONES static void int8_encode_fast(const fc_rng *rng, const float *x, int64_t n, int64_t bs,
                                       uint8_t *body)
{
    const int64_t nb = fc_nblocks(n, bs);
    float *scales = (float *)body;
    int8_t *codes = (int8_t *)(body + 4 * nb);
    fc_rng_buf buf = {0, 0, {0}};
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, n);
        const float inv = fc_block_scale(x, lo, hi, 127.0f, &scales[b]);
        if (inv == 0.0f) { /* zero or non-finite block: zero codes (see fc_block_scale) */
            for (int64_t i = lo; i < hi; i++)
                codes[i] = 0;
            continue;
        }
        if (rng == NULL) {
            int8_nearest(x + lo, hi - lo, inv, codes + lo);
            continue;
        }
        int64_t m;
        for (int64_t g = lo; g < hi; g += m) {
            const uint16_t *h = fc_rng_at(&buf, rng, g, n, &m);
            m = m < hi - g ? m : hi - g;
            int8_stoch(x + g, h, m, inv, codes + g);
        }
    }
}

static int int8_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    const fc_int8_cfg *cfg = (const fc_int8_cfg *)c->cfg;
    if (!fc_cpu_reference) {
        int8_encode_fast(cfg->stochastic ? &c->rng : NULL, x, c->n, cfg->block_size, body);
        int8_layout(c, used);
        return FC_OK;
    }
    const int64_t bs = cfg->block_size, nb = int8_blocks(c);
    float *scales = (float *)body;
    /* restrict: codes never alias x (int8_t may alias anything, which stops vectorisation) */
    int8_t *restrict codes = (int8_t *)(body + 4 * nb);
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = lo + bs < c->n ? lo + bs : c->n;
        const float inv = fc_block_scale(x, lo, hi, 127.0f, &scales[b]);
        if (inv == 0.0f) { /* zero or non-finite block: zero codes (see fc_block_scale) */
            for (int64_t i = lo; i < hi; i++)
                codes[i] = 0;
            continue;
        }
        for (int64_t i = lo; i < hi; i++) {
            int32_t q;
            if (!cfg->stochastic) {
                float f = fc_round_even(x[i] * inv);
                f = f > 127.0f ? 127.0f : f < -127.0f ? -127.0f : f;
                q = (int32_t)f;
            } else { /* element i's own 16-bit draw, one Philox evaluation each: the definition */
                q = fc_floor_i32(x[i] * inv + fc_u01_16(fc_rng_u16(&c->rng, (uint64_t)i)));
                q = q > 127 ? 127 : q < -127 ? -127 : q;
            }
            codes[i] = (int8_t)q;
        }
    }
    int8_layout(c, used);
    return FC_OK;
}

static int int8_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                           float *acc, fc_err *err)
{
    (void)body_bytes;
    (void)err;
    const fc_int8_cfg *cfg = (const fc_int8_cfg *)c->cfg;
    const int64_t bs = cfg->block_size, nb = int8_blocks(c);
    const float *scales = (const float *)body;
    const int8_t *codes = (const int8_t *)(body + 4 * nb);
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = lo + bs < c->n ? lo + bs : c->n;
        const float s = alpha * scales[b];
        for (int64_t i = lo; i < hi; i++)
            acc[i] += s * (float)codes[i];
    }
    return FC_OK;
}

const fc_method fc_method_int8 = {
    .name = "int8",
    .id = FC_ID_INT8,
    .flags = FC_RANDOM | FC_PIECEWISE, /* unbiased only with stochastic rounding */
    .summary = "block-wise absmax int8, nearest or stochastic rounding; 8 bits + 32/block_size",
    .cfg_size = sizeof(fc_int8_cfg),
    .keys = int8_keys,
    .layout = int8_layout,
    .encode = int8_encode,
    .decode_add = int8_decode_add,
};
