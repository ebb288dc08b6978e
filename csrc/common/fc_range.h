/* fc_range.h: the driver's range and NaN rules for one element (g' = g + e, the residual, the
 * output), written once for fc_core.c and the CUDA driver so both keep the same values: a
 * residual or an output never holds a NaN/Inf that the input did not (docs/design.md,
 * "Non-finite gradients and range"). Each takes a value that already came out of the plain
 * arithmetic and only decides what a NaN/Inf there becomes, so the common path stays one add. */
#ifndef FC_RANGE_H
#define FC_RANGE_H

#include <stdint.h>
#include "common/fc_hostdev.h"
#include "common/fc_quant.h"

/* fp32's largest finite value with the sign of v. */
FC_HOSTDEV float fc_max_like(float v)
{
    return fc_bits_f32((fc_f32_bits(v) & 0x80000000u) | FC_MAX_BITS);
}

/* g' of one element where x = g + e (x = g without a residual: e = 0) is NaN/Inf. Two finite
 * terms overflowed: the sum saturates (*sat). Otherwise the gradient held NaN/Inf (a residual
 * never does; *bad): "zero" mode sends e instead, so the residual still goes out, and "pass"
 * mode keeps it, a NaN as the canonical one. */
FC_HOSTDEV float fc_gprime_fix(float x, float g, float e, int zero, int64_t *bad, int64_t *sat)
{
    if (fc_abs_bits(g) < FC_INF_BITS && fc_abs_bits(e) < FC_INF_BITS) {
        ++*sat;
        return fc_max_like(x);
    }
    ++*bad;
    return zero ? e : fc_canon_nan(x);
}

/* The residual where sum = x + dneg came out NaN/Inf: 0 where g' itself is not finite (it went
 * on the wire in "pass" mode; the old residual went out inside it, and keeping it would deliver
 * it twice); x where D is NaN (nothing of it arrived: a block with a NaN, a norm that overflowed:
 * kept to be sent again); where D is +-Inf, x minus fp32's largest value of D's sign, saturated
 * (*sat: what arrived, as far as fp32 holds it); else finite terms overflowed: fp32's largest
 * value of the sum's sign (*sat). */
FC_HOSTDEV float fc_residual_nonfinite(float x, float dneg, float sum, int64_t *sat)
{
    if (fc_abs_bits(x) >= FC_INF_BITS)
        return 0.0f;
    if (fc_abs_bits(dneg) > FC_INF_BITS)
        return x;
    if (fc_abs_bits(dneg) == FC_INF_BITS)
        return fc_add_sat(x, fc_max_like(dneg), sat);
    ++*sat;
    return fc_max_like(sum);
}

/* The residual e = g' - D of one sent element, from g' (x) and the decode with alpha = -1
 * (dneg = -D), decided element by element, whatever the rest of its chunk held: a one-pass
 * encode writes it before it knows whether the chunk passed NaN/Inf. Where x + dneg is finite
 * it is the residual (the common path: one add); fc_residual_nonfinite decides the rest. */
FC_HOSTDEV float fc_residual(float x, float dneg, int64_t *sat)
{
    const float e = x + dneg;
    return fc_abs_bits(e) < FC_INF_BITS ? e : fc_residual_nonfinite(x, dneg, e, sat);
}

/* Whether an output element's NaN/Inf goes through (fc_output_fix's `passed`), decided per
 * element so that one pass over the own chunk can decide it as it adds the element: a payload of
 * the sum flagged NONFINITE by its sender (`payloads`: its NaN/Inf are on the wire, and a block
 * codec spreads one over its block, so the whole payload counts), or the own chunk, kept exact in
 * "pass" mode (`own_pass`), holds NaN/Inf at this very element (`own`: its value there). A NaN of
 * the own chunk elsewhere does not make this element's overflow of finite terms pass
 * (docs/decisions.md, "The output's NaN/Inf rule per element"). */
FC_HOSTDEV int fc_output_passes(int payloads, int own_pass, float own)
{
    return payloads || (own_pass && !(fc_abs_bits(own) < FC_INF_BITS));
}

/* An output v = sum / W that came out NaN/Inf. With `passed` (fc_output_passes: an input of this
 * element's sum brought NaN/Inf) it goes through, a NaN as the canonical one (*nonfinite);
 * otherwise finite terms overflowed fp32: its largest value of the sign, 0 for a NaN (+Inf and
 * -Inf met), counted in *sat. */
FC_HOSTDEV float fc_output_fix(float v, int passed, int64_t *nonfinite, int64_t *sat)
{
    if (passed) {
        ++*nonfinite;
        return fc_canon_nan(v);
    }
    ++*sat;
    return fc_abs_bits(v) > FC_INF_BITS ? 0.0f : fc_max_like(v);
}

#endif
