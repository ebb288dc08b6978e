/* fc_resid_cpu.c: the CPU encode's residual update, e = g' - D(C(g')) per chunk (fc_range.h's
 * rules, the rare NaN/Inf path, the sampled calls' dot products) stored in the residual's dtype:
 * fp32, bf16, or an 8-bit one packed in place (fc_res8.c). Split from fc_encode.c, which calls
 * it after each payload. */
#include "backend_cpu/fc_cpu.h"

#include <math.h>
#include <string.h>

#include "common/fc_half.h"
#include "common/fc_quant.h"
#include "common/fc_range.h"
#include "methods/fc_simd.h"

/* Sums of squares and products in double over 8 interleaved partial sums, combined in a fixed
 * order. One running sum is a loop-carried chain that -O3 may not reassociate, which made these
 * loops latency-bound: 3/4 of what error feedback cost per element. Statistics only: no payload
 * byte depends on them. */
FC_CLONES static double sum_sq_f32(const float *a, int64_t n)
{
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += (double)a[i + j] * (double)a[i + j];
    for (int j = 0; i < n; i++, j++)
        acc[j] += (double)a[i] * (double)a[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* dst = e and ||e||^2 (as sum_sq_f32, the same lanes in the same order) in one pass, a block of
 * 2048 at a time: a block is stored only once the sum over it is finite (so is each of its e),
 * so from the first block that holds a NaN/Inf on, dst is still the old residual for
 * update_residual's rare path. Returns where that block starts: n when every block was stored,
 * *e_sq then their ||e||^2. */
FC_CLONES static int64_t store_sum_sq_f32(float *dst, const float *e, int64_t n, double *e_sq)
{
    double acc[8] = {0};
    for (int64_t lo = 0; lo < n; lo += 2048) {
        const int64_t hi = n - lo < 2048 ? n : lo + 2048;
        int64_t i = lo;
        for (; i + 8 <= hi; i += 8)
            for (int j = 0; j < 8; j++)
                acc[j] += (double)e[i + j] * (double)e[i + j];
        for (int j = 0; i < hi; i++, j++)
            acc[j] += (double)e[i] * (double)e[i];
        *e_sq = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        if (!isfinite(*e_sq))
            return lo;
        memcpy(dst + lo, e + lo, (size_t)(hi - lo) * 4);
    }
    *e_sq = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    return n;
}

/* dots3 over x[0..n) into the lanes a, b, c (carried across blocks of a multiple of 8, the
 * tail only in the last): the same sums in the same order as one pass over the whole chunk. */
FC_CLONES static void dots3_lanes(const float *e, const float *x, int64_t n, double *a, double *b,
                                  double *c)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            const double ej = e[i + j], xj = x[i + j];
            a[j] += ej * ej;
            b[j] += xj * xj;
            c[j] += xj * ej;
        }
    for (int j = 0; i < n; i++, j++) {
        const double ej = e[i], xj = x[i];
        a[j] += ej * ej;
        b[j] += xj * xj;
        c[j] += xj * ej;
    }
}

/* ||e||^2, ||g'||^2 and g' . e (8 lanes, combined in a fixed order) with g' = g + d r loaded
 * again from the untouched gradient and residual (as load_chunk reads them, the same float
 * operations), a block of 2048 at a time on the stack: no chunk-sized copy of g' is held for
 * the sampled calls. */
static void dots3_gprime(const fc_core *s, const float *e, const fc_buf *grad, const fc_buf *res,
                         int64_t start, int64_t n, double *ee, double *xx, double *xe)
{
    double a[8] = {0}, b[8] = {0}, c[8] = {0};
    float g[2048];
    for (int64_t lo = 0; lo < n; lo += 2048) {
        const int64_t len = n - lo < 2048 ? n - lo : 2048;
        fc_cpu_load_f32(grad->data, grad->dtype, start + lo, len, g);
        fc_cpu_res_add(res, start + lo, len, fc_core_ef_decay(s), g);
        for (int64_t i = 0; i < len; i++) /* NaN/Inf as the encode fixed them ("zero" mode: a
                                           * chunk that held some goes out finite and is sampled) */
            if (!(fc_abs_bits(g[i]) < FC_INF_BITS))
                g[i] = fc_cpu_gprime_at(s, grad, res, start + lo + i);
        dots3_lanes(e + lo, g, len, a, b, c);
    }
    *ee = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    *xx = ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
    *xe = ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
}

/* Stores e (n fp32 values) as the residual in res's dtype, a bf16 one saturated (*sat), an
 * 8-bit one packed in place (fc_res8.c). */
static int store_residual(fc_core *s, fc_buf *res, int64_t start, const float *e, int64_t n,
                          int64_t *sat, fc_err *err)
{
    if (res->dtype == FC_U8)
        return fc_cpu_res8_store(s, res, start, n, e, err);
    if (res->dtype == FC_F32) {
        memcpy((float *)res->data + start, e, (size_t)n * 4);
        return FC_OK;
    }
    uint16_t *r = (uint16_t *)res->data + start;
    for (int64_t i = 0; i < n; i++) {
        *sat += fc_bf16_saturates(e[i]);
        r[i] = fc_f32_to_bf16(e[i]);
    }
    return FC_OK;
}

/* g' of element k as load_chunk made it: g + d e, NaN/Inf fixed by fc_gprime_fix (no count: the
 * load counted them). The residual's rare path reads it again where the decode overwrote it. */
float fc_cpu_gprime_at(const fc_core *s, const fc_buf *grad, const fc_buf *res, int64_t k)
{
    const float g = fc_core_elem_f32(grad->data, grad->dtype, k);
    const float e = res == NULL ? 0.0f : fc_core_ef_decay(s) * fc_cpu_res_at(res, k);
    const float x = res == NULL ? g : g + e;
    int64_t bad = 0, sat = 0;
    return fc_abs_bits(x) < FC_INF_BITS
               ? x
               : fc_gprime_fix(x, g, e, s->common.nonfinite == FC_NONFINITE_ZERO, &bad, &sat);
}

/* The residual's rare path: the elements of e = s->x (g' + -D, in place) from `from` on that came
 * out NaN/Inf, decided one by one (fc_residual_nonfinite) from g' read again (gprime_at: res
 * still holds the old residual there) and D decoded into zeros (in s->acc, free within an
 * encode call: grown to a chunk only here, on this rare path, so the common path holds no
 * second chunk-sized copy). */
static int fix_residual(fc_core *s, const fc_method *m, const fc_chunk *c, const uint8_t *p,
                        const fc_buf *grad, const fc_buf *res, int64_t start, int64_t from,
                        int64_t *sat, fc_err *err)
{
    int rc = fc_core_grow_f32(&s->acc, &s->acc_cap, c->n, err);
    if (rc != FC_OK)
        return rc;
    float *d = s->acc, *e = s->x;
    memset(d, 0, (size_t)c->n * 4);
    rc = m->decode_add(c, p + FC_HEADER_BYTES, fc_cpu_body_bytes(p), 1.0f, d, err);
    if (rc != FC_OK)
        return rc;
    for (int64_t i = from; i < c->n; i++)
        if (!(fc_abs_bits(e[i]) < FC_INF_BITS))
            e[i] = fc_residual_nonfinite(fc_cpu_gprime_at(s, grad, res, start + i), -d[i], e[i], sat);
    return FC_OK;
}

/* After encode, turns s->x into e = g' - D(C(g')) by fc_range.h's per-element rule (fc_residual:
 * the decode added in place, alpha = -1; where that came out NaN/Inf, fix_residual) and stores
 * it; returns ||e||^2. With `dots` (the sampled calls), also ||g'||^2 and g' . e, for which g'
 * is loaded again from the untouched inputs; the other calls skip that pass. A residual is
 * always finite. */
int fc_cpu_update_residual(fc_core *s, const fc_method *m, const fc_chunk *c, const uint8_t *p,
                           const fc_buf *grad, fc_buf *res, int64_t start, int dots,
                           double *e_sq, double *x_sq, double *x_dot_e, fc_err *err)
{
    *x_sq = *x_dot_e = 0;
    int rc = m->decode_add(c, p + FC_HEADER_BYTES, fc_cpu_body_bytes(p), -1.0f, s->x, err);
    if (rc != FC_OK)
        return rc;
    const int64_t n = c->n;
    int64_t sat = 0;
    if (!dots && res->dtype == FC_F32) { /* stored as it is summed, up to a NaN/Inf */
        const int64_t from = store_sum_sq_f32((float *)res->data + start, s->x, n, e_sq);
        if (from == n)
            return FC_OK;
        FC_TRY(fix_residual(s, m, c, p, grad, res, start, from, &sat, err));
        *e_sq = sum_sq_f32(s->x, n);
        memcpy((float *)res->data + start + from, s->x + from, (size_t)(n - from) * 4);
        s->ctr.saturated += sat;
        return FC_OK;
    }
    if (dots) { /* g' again, from the inputs, to pair it with e */
        dots3_gprime(s, s->x, grad, res, start, n, e_sq, x_sq, x_dot_e);
    } else {
        *e_sq = sum_sq_f32(s->x, n);
    }
    if (!isfinite(*e_sq)) { /* rare: ||e||^2 is finite exactly when every e is */
        FC_TRY(fix_residual(s, m, c, p, grad, res, start, 0, &sat, err));
        *e_sq = sum_sq_f32(s->x, n);
        if (dots) /* the fixed e against g' once more */
            dots3_gprime(s, s->x, grad, res, start, n, e_sq, x_sq, x_dot_e);
    }
    FC_TRY(store_residual(s, res, start, s->x, n, &sat, err));
    s->ctr.saturated += sat;
    return FC_OK;
error:
    return rc;
}
