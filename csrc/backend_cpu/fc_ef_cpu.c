/* fc_ef_cpu.c: the CPU backend's error feedback for a residual no codec reads (PowerSGD's e):
 * fc_ef.h's rules over the tensor, counted in the State's nonfinite_in and saturated as a
 * codec's encode counts them. */
#include "common/fc_ef.h"

#include "backend_cpu/fc_cpu.h"

/* An 8-bit residual in place (fc_res8.c), a block of 64 at a time: ADD reads code * scale, KEEP
 * packs each block from its new values (x is the whole residual: no block is cut). */
static int ef_res8(fc_core *s, int op, fc_buf *xb, const fc_buf *ref, fc_buf *res, fc_err *err)
{
    float *v = (float *)xb->data, e[64];
    int64_t bad = 0, sat = 0;
    for (int64_t lo = 0; lo < xb->numel; lo += 64) {
        const int64_t len = xb->numel - lo < 64 ? xb->numel - lo : 64;
        if (op == FC_EF_ADD) {
            fc_cpu_res8_values(res, lo, len, e);
            for (int64_t i = 0; i < len; i++)
                v[lo + i] = fc_ef_add(v[lo + i], e[i], fc_core_ef_decay(s),
                                      s->common.nonfinite == FC_NONFINITE_ZERO, &bad, &sat);
            continue;
        }
        const float *r = (const float *)ref->data;
        for (int64_t i = 0; i < len; i++)
            e[i] = fc_ef_keep(v[lo + i], r[lo + i], &sat);
        int rc = fc_cpu_res8_store(s, res, lo, len, e, err);
        if (rc != FC_OK)
            return rc;
    }
    s->ctr.nonfinite_in += bad;
    s->ctr.saturated += sat;
    return FC_OK;
}

int fc_cpu_ef(fc_core *s, const fc_exec *x, int op, fc_buf *xb, const fc_buf *ref, fc_buf *res,
              fc_err *err)
{
    (void)x;
    if (res->dtype == FC_U8)
        return ef_res8(s, op, xb, ref, res, err);
    float *v = (float *)xb->data;
    const int bf16 = res->dtype == FC_BF16;
    int64_t bad = 0, sat = 0;
    if (op == FC_EF_ADD) {
        const float decay = fc_core_ef_decay(s);
        const int zero = s->common.nonfinite == FC_NONFINITE_ZERO;
        for (int64_t i = 0; i < xb->numel; i++)
            v[i] = fc_ef_add(v[i], fc_ef_load(res->data, bf16, i), decay, zero, &bad, &sat);
    }
    else {
        const float *r = (const float *)ref->data;
        for (int64_t i = 0; i < xb->numel; i++)
            fc_ef_store(res->data, bf16, i, fc_ef_keep(v[i], r[i], &sat), &sat);
    }
    s->ctr.nonfinite_in += bad;
    s->ctr.saturated += sat;
    return FC_OK;
}
