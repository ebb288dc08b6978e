/* fc_fetch_cpu.c: the CPU backend's work of a second round (fc_fetch.c checks, splits and counts
 * around it): the owner's picks padded for the all-gather, the exact values at every owner's
 * picks taken out of the residual, and the owner's sum of them with its own chunk. */
#include "backend_cpu/fc_cpu.h"

#include <string.h>

#include "common/fc_quant.h"
#include "common/fc_res8.h"

#define NO_PICK 0xFFFFFFFFu

int fc_cpu_fetch_picks(const fc_core *s, const fc_exec *x, uint32_t unit, uint32_t *out,
                       int64_t kmax, fc_err *err)
{
    (void)x;
    (void)unit;
    (void)err;
    memcpy(out, s->picks, (size_t)s->n_picks * 4);
    for (int64_t j = s->n_picks; j < kmax; j++)
        out[j] = NO_PICK;
    return FC_OK;
}

/* An owner's picks came over the wire: in range and strictly ascending, or a PayloadError. */
static int check_picks(const uint32_t *p, int64_t k, int64_t len, int owner, fc_err *err)
{
    for (int64_t j = 0; j < k; j++)
        if ((int64_t)p[j] >= len || (j > 0 && p[j] <= p[j - 1]))
            return fc_fail(err, FC_ERR_PAYLOAD, "second-round picks from rank %d: index %u at "
                           "position %lld is out of range [0, %lld) or not ascending (corrupted)",
                           owner, p[j], (long long)j, (long long)len);
    return FC_OK;
}

/* An 8-bit residual with the values at every owner's picks taken out (0), rounded again with
 * s->res8_key as an unpack, zeroing and pack of the whole unit would: a block of 64 at a time
 * on the stack, the picks (ascending within a chunk, the chunks in order) walked alongside. */
static void take_res8(fc_core *s, const uint32_t *all_picks, int64_t kmax, fc_buf *residual,
                      int world, const int64_t *send_splits)
{
    const int64_t N = fc_res8_numel(residual->numel);
    float v[FC_RES8_BLOCK];
    int c = 0;
    int64_t j = 0, start = 0, len = 0;
    fc_chunk_span(N, world, 0, &start, &len);
    for (int64_t lo = 0; lo < N; lo += FC_RES8_BLOCK) {
        const int64_t hi = N - lo < FC_RES8_BLOCK ? N : lo + FC_RES8_BLOCK;
        fc_cpu_res8_values(residual, lo, hi - lo, v);
        for (;;) { /* the picks that fall in [lo, hi) */
            while (c < world && j >= send_splits[c]) {
                if (++c < world)
                    fc_chunk_span(N, world, c, &start, &len);
                j = 0;
            }
            if (c == world || start + all_picks[c * kmax + j] >= hi)
                break;
            v[start + all_picks[c * kmax + j] - lo] = 0.0f;
            j++;
        }
        fc_err ignored = {0}; /* a whole block is packed at once: no carry, no failure */
        (void)fc_cpu_res8_store(s, residual, lo, hi - lo, v, &ignored);
    }
}

/* The CPU's work of fc_fetch_values: the picks checked first (on CUDA the device checks them),
 * then the values taken out of the residual. */
int fc_cpu_fetch_values(fc_core *s, const fc_exec *x, const uint32_t *all_picks, int64_t kmax,
                        const fc_buf *grad, fc_buf *residual, int world, int rank, uint32_t unit,
                        float *send, const int64_t *send_splits, fc_err *err)
{
    (void)x;
    (void)rank;
    const int64_t N = grad->numel;
    int64_t start, len;
    for (int c = 0; c < world; c++) { /* everything checked before anything changes */
        fc_chunk_span(N, world, c, &start, &len);
        int rc = check_picks(all_picks + c * kmax, send_splits[c], len, c, err);
        if (rc != FC_OK)
            return rc;
    }
    const int zero_bad = s->common.nonfinite == FC_NONFINITE_ZERO;
    int64_t off = 0;
    double taken_sq = 0;
    for (int c = 0; c < world; c++) {
        fc_chunk_span(N, world, c, &start, &len);
        const uint32_t *p = all_picks + c * kmax;
        for (int64_t j = 0; j < send_splits[c]; j++) {
            const int64_t i = start + p[j];
            const float g = fc_core_elem_f32(grad->data, grad->dtype, i);
            float v;
            if (residual != NULL) { /* round 1 left e = g' where g' is finite, 0 elsewhere */
                v = fc_cpu_res_at(residual, i);
                if (residual->dtype == FC_F32)
                    ((float *)residual->data)[i] = 0.0f;
                else if (residual->dtype == FC_BF16)
                    ((uint16_t *)residual->data)[i] = 0; /* 8-bit: take_res8 below */
                taken_sq += (double)v * v;
            } else {
                v = g;
            }
            /* NaN/Inf of the gradient: passed (canonical) or, in "zero" mode, g' = e (round 1
             * left it in the residual: it goes out now), 0 without a residual */
            if (!(fc_abs_bits(g) < FC_INF_BITS) && (!zero_bad || residual == NULL))
                v = zero_bad ? 0.0f : fc_canon_nan(g);
            send[off + j] = v;
        }
        off += send_splits[c];
    }
    if (residual != NULL && residual->dtype == FC_U8)
        take_res8(s, all_picks, kmax, residual, world, send_splits);
    if (residual != NULL) {
        double e = s->units[unit].residual_sq - taken_sq;
        s->units[unit].residual_sq = e > 0 ? e : 0;
    }
    return FC_OK;
}

int fc_cpu_fetch_finish(fc_core *s, const fc_exec *x, const float *recv, const fc_buf *grad,
                        fc_buf *out, int world, int rank, uint32_t unit, fc_err *err)
{
    int64_t start, n;
    (void)x;
    (void)unit;
    fc_chunk_span(grad->numel, world, rank, &start, &n);
    int rc = fc_cpu_take_x(s, n, err); /* the sum: s->x, free since the decode that picked */
    if (rc != FC_OK)
        return rc;
    float *acc = s->x;
    memset(acc, 0, (size_t)n * 4);
    /* NaN/Inf among the values received pass everywhere, as a flagged payload's do; the own
     * chunk's (counted by decode) at their own elements (fc_output_passes) */
    int passed = 0, own_exact = 0;
    /* rank order, as the one-round decode: the same sum on every rank */
    for (int r = 0; r < world && n > 0; r++) {
        if (!fc_core_sends(s, r, rank)) {
            (void)fc_cpu_add_own(s, grad, start, n, acc);
            own_exact = 1;
            continue;
        }
        for (int64_t j = 0; j < s->n_picks; j++) {
            passed |= !(fc_abs_bits(recv[j]) < FC_INF_BITS);
            acc[s->picks[j]] += recv[j];
        }
        recv += s->n_picks;
    }
    fc_cpu_write_out(s, acc, n, world, out, passed, own_exact ? grad : NULL, start);
    return FC_OK;
}
