/* m_qsgd.c: `qsgd` (Alistarh et al. 2017): per bucket the L2 norm (fp32), and per element a
 * sign and a level in [0, s] rounded stochastically so E[decode] = x (unbiased). Codes of
 * 1 + ceil(log2(s + 1)) bits, packed 8 per group. Body: nbuckets norms, then the codes. */
#include <math.h>
#include "fc_block.h"
#include "fc_method.h"
#include "fc_pack.h"
#include "fc_qsgd.h"
#include "fc_rng_batch.h"

typedef struct {
    int64_t levels;
    int64_t bucket_size;
} qsgd_cfg;

static const fc_key qsgd_keys[] = {
    FC_INT(qsgd_cfg, levels, 15, 1, 32767, 0, "s, the number of positive levels"),
    FC_INT(qsgd_cfg, bucket_size, 512, 8, 1 << 24, FC_KEY_POW2, "elements per norm; a power of two"),
    FC_KEYS_END,
};

static void qsgd_layout(const fc_chunk *c, fc_layout *out)
{
    const qsgd_cfg *cfg = (const qsgd_cfg *)c->cfg;
    out->meta_bytes = 4 * fc_nblocks(c->n, cfg->bucket_size);
    out->value_bytes = fc_pack_bytes(c->n, fc_qsgd_width(cfg->levels));
    out->index_bytes = 0;
    out->kept = c->n;
}

static int qsgd_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    const qsgd_cfg *cfg = (const qsgd_cfg *)c->cfg;
    const int w = fc_qsgd_width(cfg->levels);
    const int32_t s = (int32_t)cfg->levels;
    const int64_t bs = cfg->bucket_size, nb = fc_nblocks(c->n, bs);
    float *norms = (float *)body;
    uint8_t *packed = body + 4 * nb;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        const float norm = (float)sqrt(fc_sum_sq(x, lo, hi));
        const int ok = norm > 0 && isfinite(norm);
        norms[b] = norm;
        const float inv = ok ? (float)s / norm : 0.0f;
        for (int64_t g = lo; g < hi; g += 4 * FC_RNG_BATCH) { /* 64 draws per batched Philox */
            uint32_t r[4][FC_RNG_BATCH], codes[4 * FC_RNG_BATCH];
            fc_rng_draw_batch(&c->rng, (uint32_t)(g >> 2), r);
            const int64_t m = hi - g < 4 * FC_RNG_BATCH ? hi - g : 4 * FC_RNG_BATCH;
            for (int64_t j = 0; j < 4 * FC_RNG_BATCH; j++)
                codes[j] = ok && j < m ? fc_qsgd_code(x[g + j], inv, s, r[j & 3][j >> 2]) : 0;
            for (int64_t j = 0; j < m; j += 8)
                fc_pack8(codes + j, w, packed + ((g + j) / 8) * w);
        }
    }
    qsgd_layout(c, used);
    return FC_OK;
}

/* One bucket of packed codes; `w` is a literal at the common call sites, so it specialises. */
static inline uint32_t qsgd_bucket(const uint8_t *packed, int w, float step, float alpha,
                                   int64_t lo, int64_t hi, float *acc)
{
    uint32_t worst = 0;
    for (int64_t g = lo; g < hi; g += 8) {
        uint32_t codes[8];
        fc_unpack8(packed + (g / 8) * w, w, codes);
        const int64_t m = hi - g < 8 ? hi - g : 8;
        for (int64_t j = 0; j < m; j++) {
            worst = codes[j] > worst ? codes[j] : worst;
            acc[g + j] += alpha * fc_qsgd_value(codes[j], step);
        }
    }
    return worst;
}

static int qsgd_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                           float *acc, fc_err *err)
{
    (void)body_bytes;
    const qsgd_cfg *cfg = (const qsgd_cfg *)c->cfg;
    const int w = fc_qsgd_width(cfg->levels);
    const int64_t bs = cfg->bucket_size, nb = fc_nblocks(c->n, bs);
    const uint32_t top = (uint32_t)cfg->levels << 1 | 1u;
    const float *norms = (const float *)body;
    const uint8_t *packed = body + 4 * nb;
    for (int64_t b = 0; b < nb; b++) {
        const int64_t lo = b * bs, hi = FC_BLOCK_END(lo, bs, c->n);
        const float step = norms[b] / (float)cfg->levels;
        uint32_t worst;
        switch (w) {
        case 3: worst = qsgd_bucket(packed, 3, step, alpha, lo, hi, acc); break;
        case 4: worst = qsgd_bucket(packed, 4, step, alpha, lo, hi, acc); break;
        case 5: worst = qsgd_bucket(packed, 5, step, alpha, lo, hi, acc); break;
        case 8: worst = qsgd_bucket(packed, 8, step, alpha, lo, hi, acc); break;
        default: worst = qsgd_bucket(packed, w, step, alpha, lo, hi, acc); break;
        }
        if (worst > top)
            return fc_fail(err, FC_ERR_PAYLOAD, "qsgd payload: level %u in bucket %lld exceeds "
                           "%lld levels (corrupted)", worst >> 1, (long long)b, (long long)cfg->levels);
    }
    return FC_OK;
}

const fc_method fc_method_qsgd = {
    .name = "qsgd",
    .id = 6,
    .flags = FC_UNBIASED | FC_RANDOM,
    .summary = "QSGD: per-bucket L2 norm, sign + stochastic level per element (unbiased); "
               "1 + ceil(log2(levels + 1)) bits + 32/bucket_size",
    .cfg_size = sizeof(qsgd_cfg),
    .keys = qsgd_keys,
    .layout = qsgd_layout,
    .encode = qsgd_encode,
    .decode_add = qsgd_decode_add,
};
