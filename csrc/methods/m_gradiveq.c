/* m_gradiveq.c: `gradiveq` (Yu et al. 2018): the chunk cut into slices of `dim` elements (the
 * last zero-padded), each sent as its k coefficients on an orthonormal basis U (dim x k):
 * C(g_s) = U^T g_s, D(c) = U c. Linear: receivers sum the coefficients, then decode once.
 * U is per unit and identical on every rank: it starts as a random orthonormal basis from the
 * shared seed; on the first `warmup` steps and every `refresh` steps after, each rank adds the
 * covariance of the slices it encodes, the ranks sum it (one all-reduce of dim^2 floats, an
 * extra collective) and every rank takes the same top-k eigenvectors (PCA) of the same sum.
 * Body: ceil(n / dim) * k fp32, i.e. k / dim of the floats. Biased; error feedback advised. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "methods/fc_eig.h"
#include "methods/fc_method.h"
#include "common/fc_quant.h"

static const fc_key gvq_keys[] = {
    FC_INT(fc_gradiveq_cfg, dim, 32, 2, 256, 0, "slice length m"),
    FC_INT(fc_gradiveq_cfg, k, 4, 1, 256, 0, "coefficients per slice (basis size), <= dim"),
    FC_INT(fc_gradiveq_cfg, warmup, 2, 0, 1000000, 0, "first steps whose slices (re)learn the basis"),
    FC_INT(fc_gradiveq_cfg, refresh, 50, 0, 1000000000, 0, "relearn the basis every this many steps (0: never)"),
    FC_KEYS_END,
};

static int gvq_check(void *cfg, fc_err *err)
{
    const fc_gradiveq_cfg *g = (const fc_gradiveq_cfg *)cfg;
    if (g->k > g->dim)
        return fc_fail(err, FC_ERR_VALUE, "gradiveq config key 'k' must be <= dim (%lld), got %lld",
                       (long long)g->dim, (long long)g->k);
    return FC_OK;
}

static int64_t slices(const fc_chunk *c)
{
    const fc_gradiveq_cfg *cfg = (const fc_gradiveq_cfg *)c->cfg;
    return (c->n + cfg->dim - 1) / cfg->dim;
}

static void gvq_layout(const fc_chunk *c, fc_layout *out)
{
    const fc_gradiveq_cfg *cfg = (const fc_gradiveq_cfg *)c->cfg;
    fc_layout_set(out, 0, 4 * slices(c) * cfg->k, c->n);
}

/* ustate: U (k vectors of dim), then the covariance sum (dim x dim) */
static int64_t gvq_unit_floats(const void *cfg)
{
    const fc_gradiveq_cfg *g = (const fc_gradiveq_cfg *)cfg;
    return g->dim * g->k + g->dim * g->dim;
}

static int due(const fc_gradiveq_cfg *g, uint32_t step)
{
    return (int64_t)step < g->warmup || (g->refresh > 0 && ((int64_t)step + 1) % g->refresh == 0);
}

static int64_t gvq_sync_floats(const void *cfg, uint32_t step, int64_t *offset)
{
    const fc_gradiveq_cfg *g = (const fc_gradiveq_cfg *)cfg;
    *offset = g->dim * g->k;
    return due(g, step) ? g->dim * g->dim : 0;
}

/* Modified Gram-Schmidt of uniform random vectors: a basis that needs no data yet. */
static void gvq_unit_init(const void *cfg, float *u, const fc_rng *rng)
{
    const fc_gradiveq_cfg *g = (const fc_gradiveq_cfg *)cfg;
    const int64_t m = g->dim, k = g->k;
    memset(u, 0, (size_t)gvq_unit_floats(cfg) * 4);
    for (int64_t j = 0; j < k; j++) {
        double v[256], norm = 0;
        for (int64_t i = 0; i < m; i++)
            v[i] = 2.0 * fc_u01(fc_rng_u32(rng, (uint64_t)(j * m + i))) - 1.0;
        for (int64_t p = 0; p < j; p++) {
            double d = 0;
            for (int64_t i = 0; i < m; i++)
                d += v[i] * u[p * m + i];
            for (int64_t i = 0; i < m; i++)
                v[i] -= d * u[p * m + i];
        }
        for (int64_t i = 0; i < m; i++)
            norm += v[i] * v[i];
        norm = sqrt(norm);
        for (int64_t i = 0; i < m; i++)
            u[j * m + i] = (float)(v[i] / norm);
    }
}

static int gvq_sync_apply(const void *cfg, float *ustate, fc_err *err)
{
    const fc_gradiveq_cfg *g = (const fc_gradiveq_cfg *)cfg;
    const int64_t m = g->dim;
    float *cov = ustate + m * g->k;
    double *a = (double *)malloc((size_t)(2 * m * m) * sizeof(double));
    if (a == NULL)
        return fc_fail(err, FC_ERR_NOMEM, "gradiveq: no memory for a %lld x %lld eigenproblem",
                       (long long)m, (long long)m);
    double tr = 0;
    for (int64_t i = 0; i < m * m; i++)
        a[i] = cov[i];
    for (int64_t i = 0; i < m; i++)
        tr += a[i * m + i];
    if (tr > 0 && isfinite(tr)) /* nothing learned from zero or non-finite gradients: keep U */
        fc_top_eigvecs(a, (int)m, (int)g->k, a + m * m, ustate);
    free(a);
    memset(cov, 0, (size_t)(m * m) * 4);
    return FC_OK;
}

/* A checkpointed basis must be what sync_apply or unit_init could have produced: finite and
 * orthonormal (fp32 rounding of a double-precision basis is far below the tolerance). */
static int gvq_unit_check(const void *cfg, const float *u, fc_err *err)
{
    const fc_gradiveq_cfg *g = (const fc_gradiveq_cfg *)cfg;
    const int64_t m = g->dim, k = g->k;
    for (int64_t i = 0; i < m * k + m * m; i++)
        if (!isfinite(u[i]))
            return fc_fail(err, FC_ERR_VALUE, "gradiveq unit state: value %lld is %f (%s)",
                           (long long)i, (double)u[i], i < m * k ? "basis" : "covariance");
    for (int64_t a = 0; a < k; a++)
        for (int64_t b = 0; b <= a; b++) {
            double d = 0;
            for (int64_t i = 0; i < m; i++)
                d += (double)u[a * m + i] * u[b * m + i];
            if (fabs(d - (a == b)) > 1e-4)
                return fc_fail(err, FC_ERR_VALUE, "gradiveq unit state: basis vectors %lld and "
                               "%lld have dot product %g, expected %d: not an orthonormal basis",
                               (long long)a, (long long)b, d, a == b);
        }
    return FC_OK;
}

static int gvq_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err)
{
    (void)err;
    const fc_gradiveq_cfg *cfg = (const fc_gradiveq_cfg *)c->cfg;
    const int64_t m = cfg->dim, k = cfg->k, ns = slices(c);
    const float *u = c->ustate;
    float *cov = c->ustate + m * k;
    const int learn = due(cfg, c->rng_shared.step);
    float *coef = (float *)body;
    /* D(c) = U c sums k terms |u| <= 1: coefficients up to fp32's largest / k decode finite */
    const float lim = fc_bits_f32(FC_MAX_BITS) / (float)k;
    int64_t sat = 0, cov_sat = 0;
    for (int64_t s = 0; s < ns; s++) {
        float v[256];
        const int64_t lo = s * m;
        for (int64_t i = 0; i < m; i++)
            v[i] = lo + i < c->n ? x[lo + i] : 0.0f;
        for (int64_t j = 0; j < k; j++) {
            float d = 0;
            for (int64_t i = 0; i < m; i++)
                d += u[j * m + i] * v[i];
            if (!(fc_bits_f32(fc_abs_bits(d)) <= lim)) { /* beyond lim, or NaN/Inf: rare */
                double e = 0;
                int finite = 1;
                for (int64_t i = 0; i < m; i++) {
                    e += (double)u[j * m + i] * v[i];
                    finite &= fc_abs_bits(v[i]) < FC_INF_BITS;
                }
                if (finite) {
                    d = e > lim ? lim : e < -lim ? -lim : (float)e;
                    sat += fabs(e) > lim;
                } else {
                    d = fc_canon_nan(d);
                }
            }
            coef[s * k + j] = d;
        }
        if (learn) /* a covariance beyond fp32 saturates: it is a unit state, checkpointed */
            for (int64_t p = 0; p < m; p++)
                for (int64_t q = 0; q < m; q++)
                    cov[p * m + q] = fc_add_sat(cov[p * m + q], fc_mul_sat(v[p], v[q], &cov_sat),
                                                &cov_sat);
    }
    gvq_layout(c, used);
    used->saturated = sat;
    return FC_OK;
}

static int gvq_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                          float *acc, fc_err *err)
{
    (void)body_bytes;
    (void)err;
    const fc_gradiveq_cfg *cfg = (const fc_gradiveq_cfg *)c->cfg;
    const int64_t m = cfg->dim, k = cfg->k, ns = slices(c);
    const float *u = c->ustate;
    const float *coef = (const float *)body;
    for (int64_t s = 0; s < ns; s++) {
        const int64_t lo = s * m;
        for (int64_t i = 0; i < m && lo + i < c->n; i++) {
            float d = 0;
            for (int64_t j = 0; j < k; j++)
                d += u[j * m + i] * coef[s * k + j];
            acc[lo + i] += alpha * d;
        }
    }
    return FC_OK;
}

static int64_t gvq_agg_bytes(const fc_chunk *c)
{
    const fc_gradiveq_cfg *cfg = (const fc_gradiveq_cfg *)c->cfg;
    return 4 * slices(c) * cfg->k;
}

static int gvq_decode_agg(const fc_chunk *c, const uint8_t *agg, int senders, float alpha,
                          float *acc, fc_err *err)
{
    (void)senders;
    return gvq_decode_add(c, agg, gvq_agg_bytes(c), alpha, acc, err);
}

const fc_method fc_method_gradiveq = {
    .name = "gradiveq",
    .id = FC_ID_GRADIVEQ,
    .flags = FC_LINEAR | FC_RANDOM,
    .summary = "GradiVeQ: slices of dim projected on a PCA basis shared by all ranks, summed "
               "compressed; 32 * k / dim bits",
    .cfg_size = sizeof(fc_gradiveq_cfg),
    .keys = gvq_keys,
    .check = gvq_check,
    .layout = gvq_layout,
    .encode = gvq_encode,
    .decode_add = gvq_decode_add,
    .agg_bytes = gvq_agg_bytes,
    .aggregate = fc_aggregate_add_f32,
    .decode_agg = gvq_decode_agg,
    .unit_floats = gvq_unit_floats,
    .unit_init = gvq_unit_init,
    .sync_floats = gvq_sync_floats,
    .sync_apply = gvq_sync_apply,
    .unit_check = gvq_unit_check,
};
