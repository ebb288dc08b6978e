/* m_intn.c: `intN`, symmetric block-wise absmax quantisation to 2 or 4 bits (config `bits`):
 * s = amax / qmax with qmax = 2^(bits-1) - 1, q = round(x / s) (nearest, biased) or
 * floor(x / s + u) (stochastic, unbiased), stored as q + qmax in `bits` bits, packed 8 codes
 * per `bits` bytes. Body: nblocks fp32 scales, then the packed codes. bits + 32/B. */
#include <math.h>
#include "fc_block.h"
#include "fc_method.h"
#include "fc_pack.h"
#include "fc_rng_batch.h"

typedef struct {
    int64_t bits;
    int64_t block_size;
    int stochastic;
} intn_cfg;

static const fc_key intn_keys[] = {
    FC_INT(intn_cfg, bits, 4, 2, 4, FC_KEY_POW2, "bits per code: 2 or 4"),
    FC_INT(intn_cfg, block_size, 256, 8, 1 << 24, FC_KEY_POW2, "elements per scale; a power of two"),
    FC_BOOL(intn_cfg, stochastic, 0, "stochastic rounding (unbiased) instead of nearest"),
    FC_KEYS_END,
};

static void intn_layout(const fc_chunk *c, fc_layout *out)
{
    const intn_cfg *cfg = (const intn_cfg *)c->cfg;
    out->meta_bytes = 4 * fc_nblocks(c->n, cfg->block_size);
    out->value_bytes = fc_pack_bytes(c->n, (int)cfg->bits);
    out->index_bytes = 0;
    out->kept = c->n;
}

/* Codes of 2 or 4 bits, packed the fc_pack8 way: within a group of 8 little-endian bit order,
 * groups back to back, so element i sits at bit i * w. Written per byte here: the CPU loops
 * vectorise, and the bytes equal fc_pack8's, which the CUDA kernels use. */
static void pack_block(const uint8_t *t, int64_t lo, int64_t hi, int w, uint8_t *packed)
{
    const int per = 8 / w; /* codes per byte */
    for (int64_t i = lo; i < hi; i += per) {
        uint32_t byte = 0;
        for (int j = 0; j < per && i + j < hi; j++)
            byte |= (uint32_t)t[i - lo + j] << (j * w);
        packed[(i * w) >> 3] = (uint8_t)byte;
    }
}

static int intn_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    const intn_cfg *cfg = (const intn_cfg *)c->cfg;
    const int w = (int)cfg->bits;
    const int32_t qmax = (1 << (w - 1)) - 1;
    const int64_t bs = cfg->block_size, nb = fc_nblocks(c->n, bs);
    float *scales = (float *)body;
    uint8_t *restrict packed = body + 4 * nb;
    uint8_t t[4 * FC_RNG_BATCH]; /* codes of one stretch of the block, before packing */
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        uint32_t amax_bits = fc_amax_bits(x, lo, hi);
        const int ok = amax_bits < FC_INF_BITS && amax_bits != 0;
        const float amax = fc_bits_f32(amax_bits);
        const float inv = ok ? (float)qmax / amax : 0.0f;
        const float fq = (float)qmax;
        scales[b] = amax_bits == 0 ? 0.0f : ok ? amax / (float)qmax : NAN;
        /* stretches of 64 elements (a multiple of 8: whole bytes), one batched Philox each */
        for (int64_t g = lo; g < hi; g += 4 * FC_RNG_BATCH) {
            const int64_t m = hi - g < 4 * FC_RNG_BATCH ? hi - g : 4 * FC_RNG_BATCH;
            if (!ok) { /* zero or non-finite block: no arithmetic on NaN/Inf, code of 0 */
                for (int64_t j = 0; j < m; j++)
                    t[j] = (uint8_t)qmax;
            } else if (cfg->stochastic) {
                float u[4 * FC_RNG_BATCH];
                fc_u01_batch(&c->rng, g, u);
                for (int64_t j = 0; j < m; j++) {
                    int32_t q = fc_floor_i32(x[g + j] * inv + u[j]);
                    q = q > qmax ? qmax : q < -qmax ? -qmax : q;
                    t[j] = (uint8_t)(q + qmax);
                }
            } else {
                for (int64_t j = 0; j < m; j++) {
                    float q = fc_round_even(x[g + j] * inv);
                    q = q > fq ? fq : q < -fq ? -fq : q;
                    t[j] = (uint8_t)((int32_t)q + qmax);
                }
            }
            pack_block(t, g, g + m, w, packed);
        }
        /* the last group's unused code slots are zero, as fc_pack8 leaves them */
    }
    intn_layout(c, used);
    return FC_OK;
}

/* element i's code at bit i * w; `w` is a literal at each call, so the shifts specialise */
static inline uint32_t intn_block(const uint8_t *packed, int w, int32_t qmax, float s, int64_t lo,
                                  int64_t hi, float *acc)
{
    uint32_t worst = 0;
    const uint32_t mask = (1u << w) - 1u;
    for (int64_t i = lo; i < hi; i++) {
        const uint32_t code = ((uint32_t)packed[(i * w) >> 3] >> ((i * w) & 7)) & mask;
        worst = code > worst ? code : worst;
        acc[i] += s * (float)((int32_t)code - qmax);
    }
    return worst;
}

static int intn_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                           float *acc, fc_err *err)
{
    (void)body_bytes;
    const intn_cfg *cfg = (const intn_cfg *)c->cfg;
    const int w = (int)cfg->bits;
    const int32_t qmax = (1 << (w - 1)) - 1;
    const int64_t bs = cfg->block_size, nb = fc_nblocks(c->n, bs);
    const float *scales = (const float *)body;
    const uint8_t *packed = body + 4 * nb;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        const float s = alpha * scales[b];
        uint32_t worst = w == 2 ? intn_block(packed, 2, qmax, s, lo, hi, acc)
                                : intn_block(packed, 4, qmax, s, lo, hi, acc);
        if (worst > (uint32_t)(2 * qmax))
            return fc_fail(err, FC_ERR_PAYLOAD, "intN payload: code %u in block %lld is outside "
                           "[0, %d] (corrupted)", worst, (long long)b, 2 * qmax);
    }
    return FC_OK;
}

const fc_method fc_method_intn = {
    .name = "intN",
    .id = 5,
    .flags = FC_RANDOM,
    .summary = "block-wise absmax 2- or 4-bit integers, packed; bits + 32/block_size",
    .cfg_size = sizeof(intn_cfg),
    .keys = intn_keys,
    .layout = intn_layout,
    .encode = intn_encode,
    .decode_add = intn_decode_add,
};
