/* m_topk.c: `topk`, the exact k largest magnitudes of each chunk (config `k`, or `ratio` of the
 * chunk). Ties at the k-th magnitude go to the lowest indices. Body: the ascending indices
 * (fc_sparse.h's coding, in index_bytes), then the k values through the value codec
 * (`quantize`: none = fp32, fp16, int8, qsgd, nc, intN). Biased: pair it with error feedback. */
#include <string.h>
#include "methods/fc_method.h"
#include "methods/fc_select.h"
#include "methods/fc_sparse.h"

static const fc_key topk_keys[] = {
    FC_FLOAT(fc_topk_cfg, ratio, 0.01, 0.0, 1.0, FC_KEY_OPEN_LO, "fraction of each chunk kept (when k is 0)"),
    FC_INT(fc_topk_cfg, k, 0, 0, 2147483647.0, 0, "coordinates kept per chunk (0: use ratio)"),
    FC_CHOICE(fc_topk_cfg, quantize, 0, fc_sparse_quant_names, "codec of the kept values"),
    FC_KEYS_END,
};

static int topk_check(void *cfg, fc_err *err)
{
    fc_topk_cfg *t = (fc_topk_cfg *)cfg;
    return fc_vcodec_init(&t->vc, t->quantize, err);
}

static int64_t topk_k(const fc_chunk *c)
{
    const fc_topk_cfg *cfg = (const fc_topk_cfg *)c->cfg;
    return fc_sparse_k(c->n, cfg->k, cfg->ratio);
}

static void topk_layout(const fc_chunk *c, fc_layout *out)
{
    const fc_topk_cfg *cfg = (const fc_topk_cfg *)c->cfg;
    const int64_t k = topk_k(c);
    fc_vcodec_layout(&cfg->vc, c, k, out);
    out->index_bytes = fc_index_bytes(c->n, k);
    out->kept = k;
}

/* The k indices and the k values of a chunk of n: k is largest for the largest chunk, which
 * the scratch is sized for (the selection itself reads x in place: fc_select.h). */
static size_t topk_scratch(const void *cfg_, int64_t n)
{
    const fc_topk_cfg *cfg = (const fc_topk_cfg *)cfg_;
    return (size_t)fc_sparse_k(n, cfg->k, cfg->ratio) * 8 + 64;
}

static int topk_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    const fc_topk_cfg *cfg = (const fc_topk_cfg *)c->cfg;
    const int64_t k = topk_k(c), n = c->n;
    uint32_t *idx = (uint32_t *)c->scratch;
    float *vals = (float *)(idx + k);
    fc_topk_indices(x, n, k, idx);
    for (int64_t j = 0; j < k; j++)
        vals[j] = x[idx[j]];
    fc_index_encode(idx, n, k, body);
    int64_t sat = 0;
    int rc = fc_vcodec_encode(&cfg->vc, c, vals, k, body + fc_index_bytes(n, k), &sat, err);
    topk_layout(c, used);
    used->saturated = sat;
    return rc;
}

static int topk_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                           float *acc, fc_err *err)
{
    (void)body_bytes;
    const fc_topk_cfg *cfg = (const fc_topk_cfg *)c->cfg;
    const int64_t k = topk_k(c), n = c->n;
    uint32_t *idx = (uint32_t *)c->scratch;
    float *vals = (float *)(idx + k);
    int rc = fc_index_decode(body, n, k, idx, err);
    return rc != FC_OK ? rc : fc_vcodec_decode_scatter(&cfg->vc, c, body + fc_index_bytes(n, k), k, idx,
                                                        alpha, vals, acc, err);
}

const fc_method fc_method_topk = {
    .name = "topk",
    .id = FC_ID_TOPK,
    /* biased: error feedback on by default (Stich et al. 2018), as users of top-k expect */
    .flags = FC_RANDOM | FC_EF_DEFAULT, /* random only through a stochastic value codec */
    .summary = "exact top-k magnitudes per chunk; indices (bitmap/16/32-bit) + values "
               "(fp32 or quantize=fp16/int8/qsgd/nc/intN)",
    .cfg_size = sizeof(fc_topk_cfg),
    .keys = topk_keys,
    .check = topk_check,
    .layout = topk_layout,
    .scratch_bytes = topk_scratch,
    .encode = topk_encode,
    .decode_add = topk_decode_add,
};
