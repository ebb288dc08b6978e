/* m_thresholdv.c: `thresholdv` (Strom 2015; Dryden et al. 2016): every element with
 * |x| > threshold. The count is data-dependent (FC_VARSIZE): layout() is the bound for k = n
 * and the collective exchanges the real sizes first (an extra collective, counted). Body: the
 * uint32 count (meta), the ascending indices, then the values through the value codec or, with
 * `"values": "sign"` (Strom's variant), one sign bit per kept element (each decodes to +-v,
 * the rest of x stays in the residual). */
#include <string.h>
#include "methods/fc_method.h"
#include "common/fc_quant.h"
#include "methods/fc_sparse.h"

static const char *const thrv_values[] = {"exact", "sign", NULL};

static const fc_key thrv_keys[] = {
    FC_FLOAT(fc_thresholdv_cfg, threshold, 1e-3, 0.0, 1e30, 0, "v: elements with |x| > v are sent"),
    FC_CHOICE(fc_thresholdv_cfg, quantize, 0, fc_sparse_quant_names, "codec of the kept values"),
    FC_CHOICE(fc_thresholdv_cfg, values, FC_THRV_EXACT, thrv_values,
              "what travels per kept element: its value (exact, through quantize) or its sign "
              "(sign: decodes to +-threshold, Strom)"),
    FC_KEYS_END,
};

static int thrv_check(void *cfg, fc_err *err)
{
    fc_thresholdv_cfg *t = (fc_thresholdv_cfg *)cfg;
    if (t->values == FC_THRV_SIGN && t->quantize != 0)
        return fc_fail(err, FC_ERR_VALUE, "thresholdv config key 'quantize' must be \"none\" with "
                       "\"values\": \"sign\" (only sign bits travel), got \"%s\"",
                       fc_sparse_quant_names[t->quantize]);
    if (t->values == FC_THRV_SIGN && !(t->threshold > 0))
        return fc_fail(err, FC_ERR_VALUE, "thresholdv config key 'threshold' must be > 0 with "
                       "\"values\": \"sign\" (kept elements decode to +-threshold), got %g",
                       t->threshold);
    return fc_vcodec_init(&t->vc, t->quantize, err);
}

static void layout_k(const fc_chunk *c, int64_t k, fc_layout *out)
{
    const fc_thresholdv_cfg *cfg = (const fc_thresholdv_cfg *)c->cfg;
    if (cfg->values == FC_THRV_SIGN) {
        out->value_bytes = (k + 7) / 8;
        out->meta_bytes = 0;
    } else {
        fc_vcodec_layout(&cfg->vc, c, k, out);
    }
    out->meta_bytes += 4;
    out->index_bytes = fc_index_bytes(c->n, k);
    out->kept = k;
}

static void thrv_layout(const fc_chunk *c, fc_layout *out)
{
    layout_k(c, c->n, out);
}

/* The kept values (k <= n): the indices go straight into the payload's coding (fc_sparse.h's
 * fc_index_coding, fc_index_add), so no index array is held. */
static size_t thrv_scratch(const void *cfg, int64_t n)
{
    (void)cfg;
    return (size_t)n * 4 + 64;
}

static int thrv_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    const fc_thresholdv_cfg *cfg = (const fc_thresholdv_cfg *)c->cfg;
    const int64_t n = c->n;
    const float v = (float)cfg->threshold;
    float *vals = (float *)c->scratch;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++) /* NaN is sent: passed through, not lost */
        k += fc_rule_thrv_keep(x[i], v) != 0;
    uint32_t k32 = (uint32_t)k;
    memcpy(body, &k32, 4);
    uint8_t *ib = body + 4; /* fc_index_encode's coding, written as the indices are found */
    memset(ib, 0, (size_t)fc_index_bytes(n, k));
    const int coding = fc_index_coding(n, k);
    int64_t m = 0;
    for (int64_t i = 0; i < n && m < k; i++) {
        if (!fc_rule_thrv_keep(x[i], v))
            continue;
        if (coding == 0) {
            ib[i >> 3] |= (uint8_t)(1u << (i & 7));
        } else if (coding == 2) {
            const uint16_t h = (uint16_t)i;
            memcpy(ib + 2 * m, &h, 2);
        } else {
            const uint32_t w = (uint32_t)i;
            memcpy(ib + 4 * m, &w, 4);
        }
        vals[m++] = x[i];
    }
    uint8_t *vb = body + 4 + fc_index_bytes(n, k);
    int rc = FC_OK;
    int64_t sat = 0;
    if (cfg->values == FC_THRV_SIGN) { /* bit j set: element j is negative (NaN: by its sign bit) */
        memset(vb, 0, (size_t)(k + 7) / 8);
        for (int64_t j = 0; j < k; j++)
            vb[j >> 3] |= (uint8_t)((fc_f32_bits(vals[j]) >> 31) << (j & 7));
    } else {
        rc = fc_vcodec_encode(&cfg->vc, c, vals, k, vb, &sat, err);
    }
    layout_k(c, k, used);
    used->saturated = sat;
    return rc;
}

/* vals[j] = alpha * (+-v) from the sign bits; bits past k must be zero. */
static int sign_values(const uint8_t *bits, int64_t k, float v, float alpha, float *vals,
                       fc_err *err)
{
    if ((k & 7) != 0 && (bits[k >> 3] >> (k & 7)) != 0)
        return fc_fail(err, FC_ERR_PAYLOAD, "thresholdv payload: sign bits past the %lld kept "
                       "elements are set (corrupted)", (long long)k);
    const float pos = alpha * v, neg = alpha * -v;
    for (int64_t j = 0; j < k; j++)
        vals[j] = (bits[j >> 3] >> (j & 7)) & 1u ? neg : pos;
    return FC_OK;
}

static int thrv_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                           float *acc, fc_err *err)
{
    const fc_thresholdv_cfg *cfg = (const fc_thresholdv_cfg *)c->cfg;
    const int64_t n = c->n;
    uint32_t k32;
    if (body_bytes < 4)
        return fc_fail(err, FC_ERR_PAYLOAD, "thresholdv payload: body of %lld bytes has no count",
                       (long long)body_bytes);
    memcpy(&k32, body, 4);
    const int64_t k = k32;
    if (k > n)
        return fc_fail(err, FC_ERR_PAYLOAD, "thresholdv payload: count %lld exceeds the chunk's "
                       "%lld elements (corrupted)", (long long)k, (long long)n);
    fc_layout l;
    layout_k(c, k, &l);
    if (fc_layout_bytes(&l) != body_bytes)
        return fc_fail(err, FC_ERR_PAYLOAD, "thresholdv payload: body of %lld bytes, a count of "
                       "%lld needs %lld (corrupted)", (long long)body_bytes, (long long)k,
                       (long long)fc_layout_bytes(&l));
    float *vals = (float *)c->scratch;
    int rc = fc_index_check(body + 4, n, k, err);
    if (rc != FC_OK)
        return rc;
    if (cfg->values == FC_THRV_SIGN) {
        rc = sign_values(body + 4 + fc_index_bytes(n, k), k, (float)cfg->threshold, alpha, vals,
                         err);
    } else {
        memset(vals, 0, (size_t)k * 4);
        rc = fc_vcodec_decode_add(&cfg->vc, c, body + 4 + fc_index_bytes(n, k), k, alpha, vals,
                                  err);
    }
    if (rc != FC_OK)
        return rc;
    fc_index_add(body + 4, n, k, vals, acc);
    return FC_OK;
}

const fc_method fc_method_thresholdv = {
    .name = "thresholdv",
    .id = FC_ID_THRESHOLDV,
    .flags = FC_VARSIZE | FC_RANDOM | FC_EF_DEFAULT, /* biased: Strom keeps the rest in a residual */
    .summary = "every |x| > threshold: data-dependent count (sizes exchanged first), indices + "
               "values (fp32 or quantize=fp16/int8/qsgd/nc/intN) or values=sign: 1 bit, +-threshold",
    .cfg_size = sizeof(fc_thresholdv_cfg),
    .keys = thrv_keys,
    .check = thrv_check,
    .layout = thrv_layout,
    .scratch_bytes = thrv_scratch,
    .encode = thrv_encode,
    .decode_add = thrv_decode_add,
};
