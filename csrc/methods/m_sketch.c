/* m_sketch.c: `sketch`, a count sketch (as in Sketched-SGD, Ivkin et al. 2019): rows x cols
 * fp32 table, S[j, h_j(i)] += s_j(i) x_i with hashes from the stream all ranks share. Sketches
 * add, so receivers sum the tables (the compressed domain) and decode once: estimate every
 * coordinate as the median over rows of s_j(i) S[j, h_j(i)] and keep the k largest (the heavy
 * hitters; k = 0 keeps every estimate). With `second_round`, Sketched-SGD's second round: the
 * owner only picks the k heavy coordinates (estimates of the peers' sum plus its own exact
 * chunk) and fetches the senders' exact values there (fc_fetch.c); nothing is decoded from the
 * sketch, so a sender's residual is its whole chunk but those k values: exactly what the owner
 * did not apply. Biased; error feedback on by default with the second round (Sketched-SGD's
 * own), off without it: the heavy hitters of the summed sketch are not the sum of each
 * sender's own heavy hitters (the residual's reference), so from 2 senders on (W >= 3) a
 * sender's residual is not what was left out. */
#include <string.h>
#include "common/fc_half.h"
#include "common/fc_hash.h"
#include "methods/fc_method.h"
#include "common/fc_quant.h"
#include "methods/fc_select.h"

static const fc_key sketch_keys[] = {
    FC_INT(fc_sketch_cfg, rows, 3, 1, 15, 0, "hash rows; the estimate is the median over rows"),
    FC_INT(fc_sketch_cfg, cols, 0, 0, 1 << 26, 0,
           "buckets per row; 0: sized to the chunk, n / (8 rows), from 1 to 4096 (fc_sketch_cols)"),
    FC_INT(fc_sketch_cfg, k, 256, 0, 2147483647.0, 0, "heavy hitters kept per chunk (0: every estimate)"),
    FC_BOOL(fc_sketch_cfg, second_round, 0,
            "fetch the exact values of the k heavy hitters from every rank (two extra collectives)"),
    FC_KEYS_END,
};

static int sketch_check(void *cfg, fc_err *err)
{
    const fc_sketch_cfg *g = (const fc_sketch_cfg *)cfg;
    if (g->second_round && g->k == 0)
        return fc_fail(err, FC_ERR_VALUE, "sketch config key 'k' must be > 0 with 'second_round' "
                       "(k = 0 would fetch every value), got 0");
    return FC_OK;
}

static int64_t sketch_k(const fc_chunk *c)
{
    const fc_sketch_cfg *cfg = (const fc_sketch_cfg *)c->cfg;
    return cfg->k == 0 || cfg->k > c->n ? c->n : cfg->k;
}

/* the width of this chunk's table */
static int64_t sketch_cols(const fc_chunk *c)
{
    const fc_sketch_cfg *cfg = (const fc_sketch_cfg *)c->cfg;
    return fc_sketch_cols(cfg->rows, cfg->cols, c->n);
}

static void sketch_layout(const fc_chunk *c, fc_layout *out)
{
    const fc_sketch_cfg *cfg = (const fc_sketch_cfg *)c->cfg;
    fc_layout_set(out, 0, 4 * cfg->rows * sketch_cols(c), sketch_k(c));
}

static size_t sketch_scratch(const void *cfg, int64_t n)
{
    (void)cfg;
    return (size_t)n * 4 + 64; /* the n estimates (the second round's picks are s->picks) */
}

/* The row keys: one shared draw per row, so every rank hashes alike. */
static uint32_t row_key(const fc_chunk *c, int64_t j)
{
    return fc_rng_draw4(&c->rng_shared, 0xFFFFFF00u + (uint32_t)(j >> 2)).v[j & 3];
}

static int sketch_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    const fc_sketch_cfg *cfg = (const fc_sketch_cfg *)c->cfg;
    const int64_t r = cfg->rows, cols = sketch_cols(c);
    float *t = (float *)body;
    int64_t sat = 0;
    memset(t, 0, (size_t)(r * cols) * 4);
    for (int64_t j = 0; j < r; j++) {
        const uint32_t key = row_key(c, j);
        float *row = t + j * cols;
        for (int64_t i = 0; i < c->n; i++) { /* a bucket beyond fp32 saturates */
            uint32_t h = fc_sketch_hash((uint64_t)i, key);
            float *b = &row[fc_sketch_col(h, (uint32_t)cols)];
            *b = fc_add_sat(*b, fc_sketch_sign(h) * x[i], &sat);
        }
    }
    for (int64_t i = 0; i < r * cols; i++) /* Inf - Inf or a NaN in: the canonical NaN */
        t[i] = fc_canon_nan(t[i]);
    sketch_layout(c, used);
    used->saturated = sat;
    return FC_OK;
}

/* est[i] = the median over rows of coordinate i's estimates in table t */
static void estimate(const fc_chunk *c, const float *t, float *est)
{
    const fc_sketch_cfg *cfg = (const fc_sketch_cfg *)c->cfg;
    const int64_t r = cfg->rows, cols = sketch_cols(c), n = c->n;
    uint32_t rk[15];
    for (int64_t j = 0; j < r; j++)
        rk[j] = row_key(c, j);
    for (int64_t i = 0; i < n; i++)
        est[i] = fc_sketch_estimate(t, (int)r, cols, rk, i);
}

/* acc += alpha * the k largest estimates read from table t; acc == t (FC_AGG_IN_PLACE): the
 * table is read whole into the estimates first, then acc = those picks (zeros elsewhere). */
static int unsketch(const fc_chunk *c, const float *t, float alpha, float *acc)
{
    const int64_t n = c->n, k = sketch_k(c);
    float *est = (float *)c->scratch;
    estimate(c, t, est);
    if (acc == t)
        memset(acc, 0, (size_t)n * 4);
    if (k == n) {
        for (int64_t i = 0; i < n; i++)
            acc[i] += alpha * est[i];
        return FC_OK;
    }
    /* fc_topk_indices' picks, ascending, added as they are found: no index array */
    int64_t ties, m = 0;
    const uint32_t thr = fc_topk_threshold(est, n, k, &ties);
    for (int64_t i = 0; i < n && m < k; i++) {
        const uint32_t a = fc_abs_bits(est[i]);
        if (a > thr || (a == thr && ties-- > 0)) {
            acc[i] += alpha * est[i];
            m++;
        }
    }
    return FC_OK;
}

static int sketch_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                             float *acc, fc_err *err)
{
    (void)body_bytes;
    (void)err;
    if (((const fc_sketch_cfg *)c->cfg)->second_round)
        return FC_OK; /* the values come from the second round */
    return unsketch(c, (const float *)body, alpha, acc);
}

static int64_t sketch_fetch_k(const fc_chunk *c)
{
    return ((const fc_sketch_cfg *)c->cfg)->second_round ? sketch_k(c) : 0;
}

/* The heavy coordinates of the total: the estimates of the senders' sum plus the exact own
 * chunk (what the owner adds anyway), so a coordinate heavy only in the owner's chunk is not
 * spent on. */
/* Element i of the exact own chunk as the decode's sum from zero holds it, up to a zero's sign
 * (which no pick sees): a bf16/fp16 value converts exactly. */
static float own_value(const fc_own *o, int64_t i)
{
    const int64_t k = o->start + i;
    const float v = o->dtype == FC_F32    ? ((const float *)o->data)[k]
                    : o->dtype == FC_BF16 ? fc_bf16_to_f32(((const uint16_t *)o->data)[k])
                                          : fc_f16_to_f32(((const uint16_t *)o->data)[k]);
    if (fc_abs_bits(v) < FC_INF_BITS)
        return v;
    return o->zero_bad ? 0.0f : fc_canon_nan(v);
}

static int sketch_pick(const fc_chunk *c, const uint8_t *agg, const fc_own *own, uint32_t *idx,
                       fc_err *err)
{
    (void)err;
    const int64_t n = c->n;
    float *est = (float *)c->scratch;
    estimate(c, (const float *)agg, est);
    if (own->data != NULL) /* NULL: zeros (the own chunk was compressed too); + 0 picks the same */
        for (int64_t i = 0; i < n; i++)
            est[i] += own_value(own, i);
    fc_topk_indices(est, n, sketch_k(c), idx);
    return FC_OK;
}

static int64_t sketch_agg_bytes(const fc_chunk *c)
{
    const fc_sketch_cfg *cfg = (const fc_sketch_cfg *)c->cfg;
    return 4 * cfg->rows * sketch_cols(c);
}

static int sketch_decode_agg(const fc_chunk *c, const uint8_t *agg, int senders, float alpha,
                             float *acc, fc_err *err)
{
    (void)senders;
    (void)err;
    return unsketch(c, (const float *)agg, alpha, acc);
}

/* error feedback by default with the second round only (see the top of the file) */
static int sketch_ef_default(const void *cfg)
{
    return ((const fc_sketch_cfg *)cfg)->second_round;
}

const fc_method fc_method_sketch = {
    .name = "sketch",
    .id = FC_ID_SKETCH,
    .flags = FC_LINEAR | FC_RANDOM | FC_AGG_IN_PLACE,
    .summary = "count sketch (rows x cols fp32), summed compressed; heavy hitters of the summed "
               "sketch decoded, or with second_round their exact values fetched (Sketched-SGD)",
    .cfg_size = sizeof(fc_sketch_cfg),
    .keys = sketch_keys,
    .check = sketch_check,
    .layout = sketch_layout,
    .scratch_bytes = sketch_scratch,
    .encode = sketch_encode,
    .decode_add = sketch_decode_add,
    .agg_bytes = sketch_agg_bytes,
    .aggregate = fc_aggregate_add_f32,
    .decode_agg = sketch_decode_agg,
    .fetch_k = sketch_fetch_k,
    .pick = sketch_pick,
    .ef_default = sketch_ef_default,
};
