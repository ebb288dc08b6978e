/* m_nc.c: `nc`, natural compression (Horvath et al. 2019): each element rounded
 * stochastically to one of the two powers of two around it (unbiased, variance <= x^2 / 8).
 * One byte per element: sign + exponent relative to the block's largest exponent (uint32 per
 * block; 255 marks a non-finite block, which decodes to NaN). 8 bits + 32/B. */
#include <math.h>
#include "methods/fc_block.h"
#include "methods/fc_method.h"
#include "common/fc_nc.h"
#include "methods/fc_rng_batch.h"
#include "methods/fc_simd.h"

static const fc_key nc_keys[] = {
    FC_INT(fc_nc_cfg, block_size, 256, 8, 1 << 24, FC_KEY_POW2,
           "elements sharing one reference exponent; a power of two"),
    FC_KEYS_END,
};

static void nc_layout(const fc_chunk *c, fc_layout *out)
{
    const fc_nc_cfg *cfg = (const fc_nc_cfg *)c->cfg;
    fc_layout_set(out, 4 * fc_nblocks(c->n, cfg->block_size), c->n, c->n);
}

/* fc_nc_encode's common case, branch-free so it vectorises: every non-zero element is a
 * normal inside the block's range and no rounding reaches 2^128 */
static inline void nc_common(const float *restrict x, const uint16_t *restrict h, int64_t n,
                             uint32_t emax, uint8_t *restrict codes)
{
    for (int64_t j = 0; j < n; j++) {
        const uint32_t u = fc_f32_bits(x[j]), a = u & 0x7fffffffu;
        const uint32_t up = ((uint32_t)h[j] << 7) < (a & 0x7fffffu);
        const uint32_t cc = (emax + 2u - ((a >> 23) + up)) | ((u >> 24) & 0x80u);
        codes[j] = (uint8_t)(a ? cc : 0u);
    }
}

/* fc_amax_bits and the smallest exponent field of the non-zero elements (255 when there are
 * none) in one pass. The smallest non-zero |x| has the smallest exponent, and a - 1 sends a
 * zero to the top of the unsigned range, so both are plain unsigned max/min reductions, which
 * GCC vectorises as such (exact in any order). Written as 16 lanes by hand, GCC shuffled them
 * across vectors and this pass cost more than the rounding. */
static inline void nc_range(const float *x, int64_t lo, int64_t hi, uint32_t *amax, uint32_t *emin)
{
    uint32_t mx = 0, mn = 0xffffffffu;
    for (int64_t i = lo; i < hi; i++) {
        const uint32_t a = fc_abs_bits(x[i]), z = a - 1u;
        mx = a > mx ? a : mx;
        mn = z < mn ? z : mn;
    }
    *amax = mx;
    *emin = mn == 0xffffffffu ? 255u : (mn + 1u) >> 23;
}

/* The reference's codes with the draws made in bulk, a stretch at a time in L1. Returns the
 * saturated count (fc_nc_saturates). */
FC_CLONES static int64_t nc_encode_fast(const fc_rng *rng, const float *x, int64_t n, int64_t bs,
                                        uint8_t *body)
{
    int64_t sat = 0;
    const int64_t nb = fc_nblocks(n, bs);
    uint32_t *emaxs = (uint32_t *)body;
    uint8_t *codes = body + 4 * nb;
    fc_rng_buf buf = {0, 0, {0}};
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, n);
        uint32_t amax_bits, emin;
        nc_range(x, lo, hi, &amax_bits, &emin);
        const uint32_t emax = fc_nc_emax(amax_bits, &emaxs[b]);
        if (emax == 0) {
            for (int64_t i = lo; i < hi; i++)
                codes[i] = 0;
            continue;
        }
        const int32_t lo_e = (int32_t)emax + 1 - (FC_NC_SPAN - 1);
        const int common = emax < 254 && (int32_t)emin >= (lo_e < 1 ? 1 : lo_e);
        int64_t m;
        for (int64_t g = lo; g < hi; g += m) {
            const uint16_t *h = fc_rng_at(&buf, rng, g, n, &m);
            m = m < hi - g ? m : hi - g;
            if (common)
                nc_common(x + g, h, m, emax, codes + g);
            else
                for (int64_t j = 0; j < m; j++) {
                    sat += fc_nc_saturates(x[g + j], h[j]);
                    codes[g + j] = fc_nc_encode(x[g + j], emax, h[j]);
                }
        }
    }
    return sat;
}

static int nc_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    const fc_nc_cfg *cfg = (const fc_nc_cfg *)c->cfg;
    const int64_t bs = cfg->block_size, nb = fc_nblocks(c->n, bs);
    if (!fc_cpu_reference) {
        const int64_t sat = nc_encode_fast(&c->rng, x, c->n, bs, body);
        nc_layout(c, used);
        used->saturated = sat;
        return FC_OK;
    }
    uint32_t *emaxs = (uint32_t *)body;
    uint8_t *codes = body + 4 * nb;
    int64_t sat = 0;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        const uint32_t emax = fc_nc_emax(fc_amax_bits(x, lo, hi), &emaxs[b]);
        for (int64_t i = lo; i < hi; i++) { /* one Philox evaluation per element: the definition */
            const uint32_t h = fc_rng_u16(&c->rng, (uint64_t)i);
            sat += emax != 0 && fc_nc_saturates(x[i], h);
            codes[i] = emax ? fc_nc_encode(x[i], emax, h) : 0;
        }
    }
    nc_layout(c, used);
    used->saturated = sat;
    return FC_OK;
}

/* fc_nc_decode without a table: a valid code c (1 <= c <= emax + 1) is the float whose exponent
 * field is emax + 2 - c, times alpha; any other code adds +0 and, unless it is the zero code,
 * marks the block bad. Building the reference's 256-entry table cost as much as a 256-element
 * block; this loop is branch-free, the invalid lanes masked after the multiply, so it
 * vectorises. Returns non-zero when a code was invalid. */
FC_CLONES static uint32_t nc_decode_block(const uint8_t *restrict codes, int64_t n, uint32_t emax,
                                          float alpha, float *restrict acc)
{
    uint32_t bad = 0;
    const uint32_t top = emax + 1u; /* <= 255: the caller handles emax 255 */
    for (int64_t i = 0; i < n; i++) {
        const uint32_t v = codes[i], cc = v & 0x7fu;
        const uint32_t keep = 0u - (uint32_t)(cc - 1u < top); /* 1 <= cc <= emax + 1 */
        bad |= (uint32_t)(cc > top) | (uint32_t)(v == 0x80u);
        const float d = fc_bits_f32(((v & 0x80u) << 24) | ((emax + 2u - cc) << 23));
        acc[i] += fc_bits_f32(fc_f32_bits(alpha * d) & keep);
    }
    return bad;
}

/* The reference: codes decode through a per-block table; impossible codes (exponent above the
 * block's, or a signed zero code) are flagged by a second table. Returns non-zero on one. */
static uint32_t nc_decode_block_ref(const uint8_t *codes, int64_t n, uint32_t emax, float alpha,
                                    float *acc)
{
    float lut[256];
    uint8_t badc[256];
    for (int v = 0; v < 256; v++) {
        badc[v] = (uint8_t)fc_nc_code_bad((uint32_t)v, emax);
        lut[v] = badc[v] ? 0.0f : fc_nc_term((uint8_t)v, emax, alpha);
    }
    uint32_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        bad |= badc[codes[i]];
        acc[i] += lut[codes[i]];
    }
    return bad;
}

static int nc_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                         float *acc, fc_err *err)
{
    (void)body_bytes;
    const fc_nc_cfg *cfg = (const fc_nc_cfg *)c->cfg;
    const int64_t bs = cfg->block_size, nb = fc_nblocks(c->n, bs);
    const uint32_t *emaxs = (const uint32_t *)body;
    const uint8_t *codes = body + 4 * nb;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        const uint32_t emax = emaxs[b];
        if (emax > 255)
            return fc_fail(err, FC_ERR_PAYLOAD, "nc payload: block %lld has exponent %u > 255 "
                           "(corrupted)", (long long)b, emax);
        if (emax == 255) {
            for (int64_t i = lo; i < hi; i++)
                acc[i] += NAN;
            continue;
        }
        const uint32_t bad = fc_cpu_reference
                                 ? nc_decode_block_ref(codes + lo, hi - lo, emax, alpha, acc + lo)
                                 : nc_decode_block(codes + lo, hi - lo, emax, alpha, acc + lo);
        if (bad)
            return fc_fail(err, FC_ERR_PAYLOAD, "nc payload: a code in block %lld is outside the "
                           "block's range (corrupted)", (long long)b);
    }
    return FC_OK;
}

const fc_method fc_method_nc = {
    .name = "nc",
    .id = FC_ID_NC,
    .flags = FC_UNBIASED | FC_RANDOM | FC_PIECEWISE,
    .summary = "natural compression: stochastic rounding to a power of two (unbiased); "
               "8 bits + 32/block_size",
    .cfg_size = sizeof(fc_nc_cfg),
    .keys = nc_keys,
    .layout = nc_layout,
    .encode = nc_encode,
    .decode_add = nc_decode_add,
};
