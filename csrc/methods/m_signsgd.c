/* m_signsgd.c: `signsgd`, one sign bit per element (bit set: x < 0). mode "scaled"
 * (EF-signSGD, Karimireddy et al. 2019): one fp32 ||x||_1 / d per block, decode +-that, with
 * error feedback (on by default). mode "majority" (Bernstein et al. 2018): no scale; the
 * receiver sums the senders' votes and outputs `scale` * sign(sum) (ties: 0) for the W-1
 * received chunks; the own chunk stays exact unless compress_own_chunk, which gives the paper's
 * full vote. Error feedback is off by default there, as in the paper: the vote's outcome is not
 * the sum of the senders' +-scale, so a sender's residual x - scale * sign(x) is not what was
 * left out (exact only while at most 2 senders vote: W <= 3). */
#include <math.h>
#include <string.h>
#include "methods/fc_block.h"
#include "methods/fc_method.h"
#include "methods/fc_simd.h"

static const char *const sign_modes[] = {"scaled", "majority", NULL};

static const fc_key sign_keys[] = {
    FC_CHOICE(fc_signsgd_cfg, mode, 0, sign_modes, "scaled: EF-signSGD's L1 scale per block; majority: vote"),
    FC_INT(fc_signsgd_cfg, block_size, 256, 8, 1 << 24, FC_KEY_POW2, "elements per L1 scale (scaled mode)"),
    FC_FLOAT(fc_signsgd_cfg, scale, 1.0, 0.0, 1e30, FC_KEY_OPEN_LO,
             "majority mode: magnitude of the voted result (a learning-rate scale)"),
    FC_KEYS_END,
};

static int64_t sign_nb(const fc_chunk *c)
{
    const fc_signsgd_cfg *cfg = (const fc_signsgd_cfg *)c->cfg;
    return cfg->mode == FC_SIGN_MAJORITY ? 0 : fc_nblocks(c->n, cfg->block_size);
}

static void sign_layout(const fc_chunk *c, fc_layout *out)
{
    fc_layout_set(out, 4 * sign_nb(c), (c->n + 7) / 8, c->n);
}

static void sign_bits(const float *x, int64_t n, uint8_t *bits)
{
    for (int64_t g = 0; g < n; g += 8) {
        uint32_t byte = 0;
        for (int j = 0; j < 8 && g + j < n; j++)
            byte |= (fc_f32_bits(x[g + j]) >> 31) << j;
        bits[g / 8] = (uint8_t)byte;
    }
}

/* The reference's scales (lane loop blocked: fc_sum_abs_blocked, same sums) and bits, block by
 * block while the block is in L1 instead of two passes over the chunk. */
FC_CLONES static void sign_encode_fast(const float *x, int64_t n, int64_t nb, int64_t bs, uint8_t *body)
{
    float *scales = (float *)body;
    uint8_t *bits = body + 4 * nb;
    if (nb == 0)
        fc_sign_bits(x, n, bits);
    for (int64_t b = 0; b < nb; b++) { /* blocks are multiples of 8: whole bytes */
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, n);
        double sum = fc_sum_abs_blocked(x, lo, hi);
        if (!isfinite(sum)) /* NaN/Inf in the block (finite floats cannot overflow a double):
                               NaN bits depend on operand order, the reference decides them */
            sum = fc_sum_abs(x, lo, hi);
        scales[b] = fc_canon_nan((float)(sum / (double)(hi - lo)));
        fc_sign_bits(x + lo, hi - lo, bits + lo / 8);
    }
}

static int sign_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    const fc_signsgd_cfg *cfg = (const fc_signsgd_cfg *)c->cfg;
    const int64_t nb = sign_nb(c), bs = cfg->block_size;
    float *scales = (float *)body;
    if (!fc_cpu_reference) {
        sign_encode_fast(x, c->n, nb, bs, body);
        sign_layout(c, used);
        return FC_OK;
    }
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        /* NaN/Inf in, NaN (the canonical one)/Inf scale out */
        scales[b] = fc_canon_nan((float)(fc_sum_abs(x, lo, hi) / (double)(hi - lo)));
    }
    sign_bits(x, c->n, body + 4 * nb);
    sign_layout(c, used);
    return FC_OK;
}

static int sign_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                           float *acc, fc_err *err)
{
    (void)body_bytes;
    (void)err;
    const fc_signsgd_cfg *cfg = (const fc_signsgd_cfg *)c->cfg;
    const int64_t nb = sign_nb(c), bs = cfg->block_size;
    const float *scales = (const float *)body;
    const uint8_t *bits = body + 4 * nb;
    /* groups of 8 share one byte and, blocks being multiples of 8, one scale */
    for (int64_t g = 0; g < c->n; g += 8) {
        const float s = alpha * (cfg->mode == FC_SIGN_MAJORITY ? (float)cfg->scale : scales[g / bs]);
        const float pm[2] = {s, -s}; /* a table, not a branch: random signs defeat prediction */
        const uint32_t byte = bits[g >> 3];
        const int64_t m = c->n - g < 8 ? c->n - g : 8;
        for (int64_t j = 0; j < m; j++)
            acc[g + j] += pm[(byte >> j) & 1u];
    }
    return FC_OK;
}

/* majority vote: the aggregate is one int32 vote sum per element */
static int64_t sign_agg_bytes(const fc_chunk *c)
{
    const fc_signsgd_cfg *cfg = (const fc_signsgd_cfg *)c->cfg;
    return cfg->mode == FC_SIGN_MAJORITY ? 4 * c->n : 0;
}

static int sign_aggregate(const fc_chunk *c, uint8_t *agg, const uint8_t *body, int64_t body_bytes,
                          fc_err *err)
{
    (void)body_bytes;
    (void)err;
    int32_t *votes = (int32_t *)agg;
    for (int64_t i = 0; i < c->n; i++)
        votes[i] += 1 - 2 * (int32_t)((body[i >> 3] >> (i & 7)) & 1u);
    return FC_OK;
}

static int sign_decode_agg(const fc_chunk *c, const uint8_t *agg, int senders, float alpha,
                           float *acc, fc_err *err)
{
    (void)err;
    const fc_signsgd_cfg *cfg = (const fc_signsgd_cfg *)c->cfg;
    const int32_t *votes = (const int32_t *)agg;
    /* sign(sum) stands for all senders: the average over W then weighs it by senders / W */
    const float s = alpha * (float)cfg->scale * (float)senders;
    for (int64_t i = 0; i < c->n; i++)
        acc[i] += votes[i] > 0 ? s : votes[i] < 0 ? -s : 0.0f;
    return FC_OK;
}

/* error feedback by default in scaled mode only (see the top of the file) */
static int sign_ef_default(const void *cfg)
{
    return ((const fc_signsgd_cfg *)cfg)->mode != FC_SIGN_MAJORITY;
}

const fc_method fc_method_signsgd = {
    .name = "signsgd",
    .id = FC_ID_SIGNSGD,
    .flags = FC_EF_DEFAULT, /* EF-signSGD (Karimireddy et al.), the default mode */
    .summary = "sign bits; scaled (EF-signSGD, L1 scale per block) or majority vote; "
               "1 bit (+ 32/block_size when scaled)",
    .cfg_size = sizeof(fc_signsgd_cfg),
    .keys = sign_keys,
    .layout = sign_layout,
    .encode = sign_encode,
    .decode_add = sign_decode_add,
    .agg_bytes = sign_agg_bytes,
    .aggregate = sign_aggregate,
    .decode_agg = sign_decode_agg,
    .ef_default = sign_ef_default,
};
