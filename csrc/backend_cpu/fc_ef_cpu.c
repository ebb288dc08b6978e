/* fc_ef_cpu.c: the CPU backend's error feedback for a residual no codec reads (PowerSGD's e):
 * fc_ef.h's rules over the tensor, counted in the State's nonfinite_in and saturated as a
 * codec's encode counts them. */
#include "common/fc_ef.h"

#include "backend_cpu/fc_cpu.h"

int fc_cpu_ef(fc_core *s, const fc_exec *x, int op, fc_buf *xb, const fc_buf *ref, fc_buf *res,
              fc_err *err)
{
    (void)x;
    (void)err;
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
