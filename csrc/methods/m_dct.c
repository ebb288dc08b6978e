/* m_dct.c: `dct`, DeMo's transform codec (Peng, Quesnelle, Kingma 2024, arXiv 2411.19870) as a
 * chunk codec: the chunk is cut into blocks of `block` elements (the last one zero-padded), each
 * block goes through the orthonormal DCT-II, and the k coefficients of largest magnitude of each
 * block travel. Body: the positions (one rank per block among the C(block, k) subsets, or
 * log2(block) bits each where that does not fit 128 bits: fc_dct_rank.h), then the nblocks * k
 * values through the value codec (`quantize`, as the sparsifiers' hybrids; intN's width `value_bits`).
 *
 * The receivers sum the coefficients of every sender in the coefficient domain (the transform is
 * linear) and invert each block once. With error feedback the residual is what the transform
 * dropped, e = g' - IDCT(sent): with `ef_decay` < 1 (a key every method takes) this is DeMo's
 * decaying momentum accumulator. Error feedback is off by default: under AdamW it hurt. */
#include <string.h>
#include "common/fc_dct.h"
#include "methods/fc_method.h"
#include "methods/fc_simd.h"
#include "methods/fc_sparse.h"

static const fc_key dct_keys[] = {
    /* the defaults: the best >= 32x config measured with AdamW (docs/methods.md, "32x with
     * AdamW"): 12 of 128 coefficients in 3 bits, 44.3x (33.7x before the positions went as
     * ranks: fc_dct_rank.h) */
    FC_INT(fc_dct_cfg, block, 128, 8, FC_DCT_MAX_BLOCK, FC_KEY_POW2,
           "elements per transform; a power of two"),
    FC_INT(fc_dct_cfg, k, 12, 1, FC_DCT_MAX_BLOCK, 0, "coefficients kept per block"),
    FC_CHOICE(fc_dct_cfg, quantize, 5, fc_sparse_quant_names, "codec of the kept coefficients"),
    FC_INT(fc_dct_cfg, value_bits, 0, 0, 4, 0,
           "quantize intN: bits per coefficient, 2-4 (0: 3)"),
    FC_BOOL(fc_dct_cfg, value_stochastic, 0,
            "quantize int8 or intN: stochastic rounding of the coefficients (unbiased)"),
    FC_KEYS_END,
};

static int dct_check(void *cfg, fc_err *err)
{
    fc_dct_cfg *d = (fc_dct_cfg *)cfg;
    if (d->k > d->block)
        return fc_fail(err, FC_ERR_VALUE, "dct: k=%lld coefficients per block exceeds block=%lld",
                       (long long)d->k, (long long)d->block);
    if (d->value_bits != 0 && d->quantize != FC_VC_INTN)
        return fc_fail(err, FC_ERR_VALUE, "dct: value_bits applies to quantize='intN' only");
    if (d->value_bits == 1)
        return fc_fail(err, FC_ERR_VALUE, "dct: value_bits must be 2, 3 or 4 (0: intN's default)");
    if (d->value_stochastic && d->quantize != FC_VC_INTN && d->quantize != FC_VC_INT8)
        return fc_fail(err, FC_ERR_VALUE, "dct: value_stochastic applies to quantize='int8' or 'intN' only");
    int rc = fc_vcodec_init(&d->vc, d->quantize, err);
    if (rc != FC_OK)
        return rc;
    /* the value codec at its defaults, but for the width and rounding asked for here; intN's
     * own default width (4) would put the default config under 32x */
    if (d->quantize == FC_VC_INTN) {
        const int64_t bits = d->value_bits != 0 ? d->value_bits : 3;
        ((fc_intn_cfg *)(void *)d->vc.sub)->bits = bits;
        d->vc.shape.levels_or_bits = bits;
    }
    if (d->value_stochastic) {
        if (d->quantize == FC_VC_INTN)
            ((fc_intn_cfg *)(void *)d->vc.sub)->stochastic = 1;
        else
            ((fc_int8_cfg *)(void *)d->vc.sub)->stochastic = 1;
        d->vc.shape.stochastic = 1;
    }
    return FC_OK;
}

static int64_t dct_kept(const fc_chunk *c)
{
    const fc_dct_cfg *cfg = (const fc_dct_cfg *)c->cfg;
    return fc_dct_kept(c->n, (int)cfg->block, (int)cfg->k);
}

static void dct_layout(const fc_chunk *c, fc_layout *out)
{
    const fc_dct_cfg *cfg = (const fc_dct_cfg *)c->cfg;
    const int64_t K = dct_kept(c);
    fc_vcodec_layout(&cfg->vc, c, K, out);
    out->index_bytes = fc_dct_index_bytes(fc_dct_blocks(c->n, (int)cfg->block), (int)cfg->block, (int)cfg->k);
    out->kept = K < c->n ? K : c->n;
}

#define LANES FC_DCT_LANES /* blocks transformed at once (fc_dct.h's lanes) */

/* Scratch: two groups of LANES blocks (first: the scratch is 64-byte aligned, as the vectors
 * want), the factors, the pick's magnitudes, then K indices and K values. */
static size_t dct_scratch(const void *cfg_, int64_t n)
{
    const fc_dct_cfg *cfg = (const fc_dct_cfg *)cfg_;
    const int64_t B = cfg->block, K = fc_dct_kept(n, (int)B, (int)cfg->k);
    return (size_t)(4 * (3 * B * LANES + fc_dct_table_len((int)B)) + 8 * K + 64);
}

typedef struct {
    fc_dct_vec *t, *u; /* B vectors each: LANES blocks, element i of block l at float i LANES + l */
    float *tf;         /* t as floats */
    float *tab;
    int32_t *mag; /* the pick's scratch */
    uint32_t *idx;
    float *vals;
} dct_work;

static dct_work work_of(const fc_chunk *c)
{
    const fc_dct_cfg *cfg = (const fc_dct_cfg *)c->cfg;
    const int64_t B = cfg->block;
    dct_work w;
    w.t = (fc_dct_vec *)c->scratch;
    w.u = w.t + B;
    w.tf = (float *)w.t;
    w.tab = (float *)(w.u + B);
    w.mag = (int32_t *)(w.tab + fc_dct_table_len((int)B));
    w.idx = (uint32_t *)(w.mag + B * LANES);
    w.vals = (float *)(w.idx + dct_kept(c));
    fc_dct_table((int)B, w.tab);
    return w;
}

/* Elements of block b that lie in the chunk (the last block's rest is padding). */
static int64_t block_len(int64_t n, int B, int64_t b)
{
    return n - b * B < B ? n - b * B : B;
}

/* Blocks b0 .. b0 + LANES of x (past the chunk: zeros) into lanes, transformed, picked: their
 * indices and values at idx / vals of block b0. Compiled for AVX2 too: each lane step is one
 * vector operation, and the same IEEE operations as one block alone (fc_dct.h). */
FC_CLONES static void encode_group(const float *x, int64_t n, int B, int k, int64_t b0,
                                   dct_work *w, int64_t *sat)
{
    const int64_t nb = fc_dct_blocks(n, B);
    memset(w->t, 0, (size_t)B * LANES * 4);
    for (int l = 0; l < LANES && b0 + l < nb; l++) {
        const float *src = x + (b0 + l) * B;
        const int64_t len = block_len(n, B, b0 + l);
        for (int64_t i = 0; i < len; i++)
            w->tf[i * LANES + l] = src[i];
    }
    fc_dct_forward(w->t, w->u, B, w->tab);
    uint32_t idx[LANES * FC_DCT_MAX_BLOCK];
    fc_dct_pick_lanes(w->tf, B, LANES, k, w->mag, idx);
    for (int l = 0; l < LANES && b0 + l < nb; l++)
        for (int j = 0; j < k; j++) {
            const uint32_t i = idx[l * k + j];
            w->idx[(b0 + l) * k + j] = i;
            w->vals[(b0 + l) * k + j] = fc_dct_clamp(w->tf[i * LANES + l], sat);
        }
}

static int dct_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    const fc_dct_cfg *cfg = (const fc_dct_cfg *)c->cfg;
    const int B = (int)cfg->block, k = (int)cfg->k, wbits = fc_dct_index_bits(B);
    const int64_t n = c->n, K = dct_kept(c), nb = fc_dct_blocks(n, B);
    dct_work w = work_of(c);
    int64_t sat = 0;
    for (int64_t b0 = 0; b0 < nb; b0 += LANES)
        encode_group(x, n, B, k, b0, &w, &sat);
    const int64_t ib = fc_dct_index_bytes(nb, B, k);
    memset(body, 0, (size_t)ib);
    if (fc_dct_ranked(B, k)) {
        const int rbits = fc_dct_rank_bits(B, k);
        for (int64_t g = 0; g < nb; g += 8) {
            fc_u128 ranks[8] = {{0}}; /* past the last block: zero, as the CUDA pack writes */
            for (int64_t b = g; b < nb && b < g + 8; b++)
                ranks[b - g] = fc_dct_rank(w.idx + b * k, k);
            fc_dct_pack_ranks8(ranks, rbits, body + g / 8 * rbits);
        }
    } else {
        for (int64_t g = 0; g < K; g += 8) {
            uint32_t codes[8] = {0};
            memcpy(codes, w.idx + g, (size_t)(K - g < 8 ? K - g : 8) * 4);
            fc_pack8(codes, wbits, body + g / 8 * wbits);
        }
    }
    int rc = fc_vcodec_encode(&cfg->vc, c, w.vals, K, body + ib, &sat, err);
    dct_layout(c, used);
    used->saturated = sat;
    return rc;
}

/* v in decimal into out (40 bytes hold 2^128 - 1 and the NUL): for the error messages. */
static const char *u128_decimal(fc_u128 v, char out[40])
{
    char *p = out + 39;
    *p = '\0';
    do {
        /* v / 10 by long division over its four 32-bit limbs, top first */
        uint64_t rem = 0;
        uint32_t limb[4] = {(uint32_t)(v.hi >> 32), (uint32_t)v.hi, (uint32_t)(v.lo >> 32), (uint32_t)v.lo};
        for (int i = 0; i < 4; i++) {
            const uint64_t cur = rem << 32 | limb[i];
            limb[i] = (uint32_t)(cur / 10);
            rem = cur % 10;
        }
        v.hi = (uint64_t)limb[0] << 32 | limb[1];
        v.lo = (uint64_t)limb[2] << 32 | limb[3];
        *--p = (char)('0' + rem);
    } while (v.lo != 0 || v.hi != 0);
    return p;
}

/* The K indices of a body from one rank per block, each checked below C(B, k) first (a larger
 * one names no subset; the unranking would still stay in the block, fc_dct_rank.h). */
static int read_ranks(const fc_chunk *c, const uint8_t *body, uint32_t *idx, fc_err *err)
{
    const fc_dct_cfg *cfg = (const fc_dct_cfg *)c->cfg;
    const int B = (int)cfg->block, k = (int)cfg->k, rbits = fc_dct_rank_bits(B, k);
    const int64_t nb = fc_dct_blocks(c->n, B);
    for (int64_t b = 0; b < nb; b++) {
        const fc_u128 r = fc_dct_rank_at(body, rbits, b);
        if (!fc_dct_rank_ok(r, B, k)) {
            char rs[40], cs[40];
            return fc_fail(err, FC_ERR_PAYLOAD, "dct payload: block %lld's position rank %s is not "
                           "below C(%d, %d) = %s (corrupted)", (long long)b, u128_decimal(r, rs), B, k,
                           u128_decimal(fc_binom(B, k), cs));
        }
        fc_dct_unrank(r, B, k, idx + b * k);
    }
    return FC_OK;
}

/* The K indices of a body, checked: ranks (read_ranks), or plain indices within a block
 * strictly ascending (each fits its block by its width). */
static int read_indices(const fc_chunk *c, const uint8_t *body, uint32_t *idx, fc_err *err)
{
    const fc_dct_cfg *cfg = (const fc_dct_cfg *)c->cfg;
    const int B = (int)cfg->block, k = (int)cfg->k, wbits = fc_dct_index_bits(B);
    const int64_t K = dct_kept(c);
    if (fc_dct_ranked(B, k))
        return read_ranks(c, body, idx, err);
    for (int64_t g = 0; g < K; g += 8) {
        uint32_t codes[8];
        fc_unpack8(body + g / 8 * wbits, wbits, codes);
        memcpy(idx + g, codes, (size_t)(K - g < 8 ? K - g : 8) * 4);
    }
    for (int64_t j = 0; j < K; j++)
        if (j % k != 0 && idx[j] <= idx[j - 1])
            return fc_fail(err, FC_ERR_PAYLOAD, "dct payload: coefficient %u of block %lld is not "
                           "above the one before (corrupted)", idx[j], (long long)(j / k));
    return FC_OK;
}

/* The kept coefficients of a body, times alpha, in w.idx / w.vals. */
static int read_body(const fc_chunk *c, const uint8_t *body, float alpha, dct_work *w, fc_err *err)
{
    const fc_dct_cfg *cfg = (const fc_dct_cfg *)c->cfg;
    const int64_t K = dct_kept(c);
    int rc = read_indices(c, body, w->idx, err);
    if (rc != FC_OK)
        return rc;
    memset(w->vals, 0, (size_t)K * 4);
    return fc_vcodec_decode_add(&cfg->vc, c, body + fc_dct_index_bytes(fc_dct_blocks(c->n, (int)cfg->block), (int)cfg->block, (int)cfg->k), K,
                                alpha, w->vals, err);
}

/* acc += the inverse of blocks b0 .. b0 + LANES, whose coefficients w->t already holds in
 * lanes (the padding of the last block dropped). */
FC_CLONES static void inverse_add_group(int64_t n, int B, int64_t b0, dct_work *w, float *acc)
{
    const int64_t nb = fc_dct_blocks(n, B);
    fc_dct_inverse(w->t, w->u, B, w->tab);
    for (int l = 0; l < LANES && b0 + l < nb; l++) {
        float *dst = acc + (b0 + l) * B;
        const int64_t len = block_len(n, B, b0 + l);
        for (int64_t i = 0; i < len; i++)
            dst[i] += w->tf[i * LANES + l];
    }
}

static int dct_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                          float *acc, fc_err *err)
{
    (void)body_bytes;
    const fc_dct_cfg *cfg = (const fc_dct_cfg *)c->cfg;
    const int B = (int)cfg->block, k = (int)cfg->k;
    const int64_t n = c->n, nb = fc_dct_blocks(n, B);
    dct_work w = work_of(c);
    int rc = read_body(c, body, alpha, &w, err);
    if (rc != FC_OK)
        return rc;
    for (int64_t b0 = 0; b0 < nb; b0 += LANES) {
        memset(w.t, 0, (size_t)B * LANES * 4);
        for (int l = 0; l < LANES && b0 + l < nb; l++)
            for (int j = 0; j < k; j++)
                w.tf[w.idx[(b0 + l) * k + j] * LANES + l] = w.vals[(b0 + l) * k + j];
        inverse_add_group(n, B, b0, &w, acc);
    }
    return FC_OK;
}

/* The receivers' sum in the coefficient domain: nblocks * block fp32 coefficients. */
static int64_t dct_agg_bytes(const fc_chunk *c)
{
    const int64_t B = ((const fc_dct_cfg *)c->cfg)->block;
    return fc_dct_blocks(c->n, (int)B) * B * 4;
}

static int dct_aggregate(const fc_chunk *c, uint8_t *agg, const uint8_t *body, int64_t body_bytes,
                         fc_err *err)
{
    (void)body_bytes;
    const fc_dct_cfg *cfg = (const fc_dct_cfg *)c->cfg;
    const int64_t B = cfg->block, k = cfg->k, K = dct_kept(c);
    float *sum = (float *)agg;
    dct_work w = work_of(c);
    int rc = read_body(c, body, 1.0f, &w, err);
    if (rc != FC_OK)
        return rc;
    for (int64_t j = 0; j < K; j++)
        sum[j / k * B + w.idx[j]] += w.vals[j];
    return FC_OK;
}

/* acc += the inverse of each block of the summed coefficients, scaled by alpha first; acc == agg
 * (FC_AGG_IN_PLACE): a group's coefficients are read before its values are written over them
 * (block b's at the same offset in both), so acc = the inverse. */
static int dct_decode_agg(const fc_chunk *c, const uint8_t *agg, int senders, float alpha,
                          float *acc, fc_err *err)
{
    (void)senders, (void)err;
    const int B = (int)((const fc_dct_cfg *)c->cfg)->block;
    const int64_t n = c->n, nb = fc_dct_blocks(n, B);
    const float *sum = (const float *)agg;
    dct_work w = work_of(c);
    for (int64_t b0 = 0; b0 < nb; b0 += LANES) {
        memset(w.t, 0, (size_t)B * LANES * 4);
        for (int l = 0; l < LANES && b0 + l < nb; l++)
            for (int64_t i = 0; i < B; i++)
                w.tf[i * LANES + l] = sum[(b0 + l) * B + i] * alpha;
        for (int l = 0; acc == sum && l < LANES && b0 + l < nb; l++)
            memset(acc + (b0 + l) * B, 0, (size_t)block_len(n, B, b0 + l) * 4);
        inverse_add_group(n, B, b0, &w, acc);
    }
    return FC_OK;
}

const fc_method fc_method_dct = {
    .name = "dct",
    .id = FC_ID_DCT,
    /* biased, but error feedback off by default: with AdamW it made every dct config worse
     * (+16-70% against +2-4% without; docs/methods.md); random only through a stochastic
     * value codec */
    .flags = FC_RANDOM | FC_AGG_IN_PLACE,
    .summary = "DeMo's transform codec: block DCT-II, the k largest coefficients per block; positions "
               "(one rank of the C(block, k) subsets per block where k <= block/2, k <= 32 and it fits 128 "
               "bits, else log2 block bits each) + values (intN 3-bit default, fp32/fp16/int8/qsgd/nc)",
    .cfg_size = sizeof(fc_dct_cfg),
    .keys = dct_keys,
    .check = dct_check,
    .layout = dct_layout,
    .scratch_bytes = dct_scratch,
    .encode = dct_encode,
    .decode_add = dct_decode_add,
    .agg_bytes = dct_agg_bytes,
    .aggregate = dct_aggregate,
    .decode_agg = dct_decode_agg,
};
