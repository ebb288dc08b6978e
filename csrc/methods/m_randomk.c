/* m_randomk.c: `randomk`, k coordinates per chunk drawn uniformly without replacement from the
 * stream every rank shares (seed, step, unit, chunk): all senders pick the same ones, so only
 * the values travel (no index bytes) and they are summed in the k-dim compressed domain before
 * one decode. `scale` multiplies by n / k (unbiased with quantize none, qsgd or nc); without it
 * error feedback carries what was not sent. The draw is Knuth's selection sampling: one 32-bit
 * draw per element, exactly k picks, ascending. */
#include <string.h>
#include "methods/fc_method.h"
#include "common/fc_quant.h"
#include "methods/fc_sparse.h"

static const fc_key randk_keys[] = {
    FC_FLOAT(fc_randomk_cfg, ratio, 0.01, 0.0, 1.0, FC_KEY_OPEN_LO, "fraction of each chunk kept (when k is 0)"),
    FC_INT(fc_randomk_cfg, k, 0, 0, 2147483647.0, 0, "coordinates kept per chunk (0: use ratio)"),
    FC_CHOICE(fc_randomk_cfg, quantize, 0, fc_sparse_quant_names, "codec of the kept values"),
    FC_BOOL(fc_randomk_cfg, scale, 1, "scale the decode by n / k (unbiased)"),
    FC_KEYS_END,
};

static int randk_check(void *cfg, fc_err *err)
{
    fc_randomk_cfg *t = (fc_randomk_cfg *)cfg;
    return fc_vcodec_init(&t->vc, t->quantize, err);
}

static int64_t randk_k(const fc_chunk *c)
{
    const fc_randomk_cfg *cfg = (const fc_randomk_cfg *)c->cfg;
    return fc_sparse_k(c->n, cfg->k, cfg->ratio);
}

/* Selection sampling: element i is taken with probability need / (n - i). */
static void randk_indices(const fc_chunk *c, int64_t k, uint32_t *idx)
{
    const int64_t n = c->n;
    int64_t need = k, m = 0;
    for (int64_t g = 0; g < n && need > 0; g += 4) {
        fc_u32x4 r = fc_rng_draw4(&c->rng_shared, (uint32_t)(g >> 2));
        for (int j = 0; j < 4 && g + j < n && need > 0; j++) {
            if (fc_rule_randk_take(r.v[j], (uint64_t)(n - (g + j)), need)) {
                idx[m++] = (uint32_t)(g + j);
                need--;
            }
        }
    }
}

static void randk_layout(const fc_chunk *c, fc_layout *out)
{
    const fc_randomk_cfg *cfg = (const fc_randomk_cfg *)c->cfg;
    const int64_t k = randk_k(c);
    fc_vcodec_layout(&cfg->vc, c, k, out);
    out->index_bytes = 0;
    out->kept = k;
}

static size_t randk_scratch(const void *cfg_, int64_t n)
{
    const fc_randomk_cfg *cfg = (const fc_randomk_cfg *)cfg_;
    return (size_t)fc_sparse_k(n, cfg->k, cfg->ratio) * 8 + 64; /* k indices, k values */
}

static float randk_factor(const fc_chunk *c, int64_t k)
{
    const fc_randomk_cfg *cfg = (const fc_randomk_cfg *)c->cfg;
    return cfg->scale ? (float)((double)c->n / (double)k) : 1.0f;
}

static int randk_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    const fc_randomk_cfg *cfg = (const fc_randomk_cfg *)c->cfg;
    const int64_t k = randk_k(c);
    uint32_t *idx = (uint32_t *)c->scratch;
    float *vals = (float *)(idx + k);
    randk_indices(c, k, idx);
    for (int64_t j = 0; j < k; j++)
        vals[j] = x[idx[j]];
    /* scaled by n / k on decode: a value beyond fp32's largest / (n / k) is saturated, so the
     * receiver's decode stays finite */
    int64_t sat = 0;
    const float f = randk_factor(c, k);
    if (f != 1.0f)
        for (int64_t j = 0; j < k; j++)
            vals[j] = fc_rule_randk_value(vals[j], f, &sat);
    int rc = fc_vcodec_encode(&cfg->vc, c, vals, k, body, &sat, err);
    randk_layout(c, used);
    used->saturated = sat;
    return rc;
}

static void scatter(const fc_chunk *c, int64_t k, const float *vals, float a, float *acc)
{
    uint32_t *idx = (uint32_t *)c->scratch;
    randk_indices(c, k, idx);
    for (int64_t j = 0; j < k; j++)
        acc[idx[j]] += a * vals[j];
}

static int randk_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                            float *acc, fc_err *err)
{
    (void)body_bytes;
    const fc_randomk_cfg *cfg = (const fc_randomk_cfg *)c->cfg;
    const int64_t k = randk_k(c);
    float *vals = (float *)((uint32_t *)c->scratch + k);
    memset(vals, 0, (size_t)k * 4);
    int rc = fc_vcodec_decode_add(&cfg->vc, c, body, k, 1.0f, vals, err);
    if (rc == FC_OK)
        scatter(c, k, vals, alpha * randk_factor(c, k), acc);
    return rc;
}

/* the compressed domain: the k decoded values, summed over senders */
static int64_t randk_agg_bytes(const fc_chunk *c)
{
    return 4 * randk_k(c);
}

static int randk_aggregate(const fc_chunk *c, uint8_t *agg, const uint8_t *body, int64_t body_bytes,
                           fc_err *err)
{
    (void)body_bytes;
    const fc_randomk_cfg *cfg = (const fc_randomk_cfg *)c->cfg;
    return fc_vcodec_decode_add(&cfg->vc, c, body, randk_k(c), 1.0f, (float *)agg, err);
}

static int randk_decode_agg(const fc_chunk *c, const uint8_t *agg, int senders, float alpha,
                            float *acc, fc_err *err)
{
    (void)senders;
    (void)err;
    const int64_t k = randk_k(c);
    scatter(c, k, (const float *)agg, alpha * randk_factor(c, k), acc);
    return FC_OK;
}

const fc_method fc_method_randomk = {
    .name = "randomk",
    .id = FC_ID_RANDOMK,
    .flags = FC_UNBIASED | FC_LINEAR | FC_RANDOM,
    .summary = "k coordinates from a seed shared by all ranks: values only, summed compressed; "
               "scaled by n/k to be unbiased",
    .cfg_size = sizeof(fc_randomk_cfg),
    .keys = randk_keys,
    .check = randk_check,
    .layout = randk_layout,
    .scratch_bytes = randk_scratch,
    .encode = randk_encode,
    .decode_add = randk_decode_add,
    .agg_bytes = randk_agg_bytes,
    .aggregate = randk_aggregate,
    .decode_agg = randk_decode_agg,
};
