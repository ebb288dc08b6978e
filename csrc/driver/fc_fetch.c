/* fc_fetch.c: the second round of two-round methods (see fc_fetch.h): the checks, splits and
 * counters once, for CPU and CUDA tensors; the element work by the call's backend (the CPU
 * loops here, fc_cpu_fetch_*, or the CUDA library through fc_cuda_path.c). */
#include "driver/fc_fetch.h"

#include <stdlib.h>
#include <string.h>

#include "driver/fc_core_impl.h"
#include "common/fc_quant.h"

#define NO_PICK 0xFFFFFFFFu

/* Whether rank `from` sends chunk `to` a payload (and so values in round 2). */
static int sends(const fc_core *s, int from, int to)
{
    return from != to || s->common.compress_own_chunk;
}

static int check_unit(int64_t have, uint32_t unit, const char *what, fc_err *err)
{
    if (have != (int64_t)unit)
        return fc_fail(err, FC_ERR_STATE, "second round of unit %u: %s (call encode, decode, "
                       "fetch and finish of one unit in that order)", unit, what);
    return FC_OK;
}

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

int fc_fetch_picks(const fc_core *s, const fc_exec *x, uint32_t unit, uint32_t *out,
                   int64_t kmax, fc_err *err)
{
    int rc = check_unit(s->picks_unit, unit, "decode() has not picked its coordinates", err);
    if (rc != FC_OK)
        return rc;
    if (kmax < s->n_picks)
        return fc_fail(err, FC_ERR_VALUE, "picks buffer holds %lld, need %lld", (long long)kmax,
                       (long long)s->n_picks);
    return x->b->fetch_picks(s, x, unit, out, kmax, err); /* CUDA: the picks stay on the device */
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
                v = fc_core_elem_f32(residual->data, residual->dtype, i);
                if (residual->dtype == FC_F32)
                    ((float *)residual->data)[i] = 0.0f;
                else
                    ((uint16_t *)residual->data)[i] = 0;
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
    if (residual != NULL) {
        double e = s->units[unit].residual_sq - taken_sq;
        s->units[unit].residual_sq = e > 0 ? e : 0;
    }
    return FC_OK;
}

int fc_fetch_values(fc_core *s, const fc_exec *x, const uint32_t *all_picks, int64_t kmax,
                    const fc_buf *grad, fc_buf *residual, int world, int rank, uint32_t unit,
                    float *send, int64_t send_cap, int64_t *send_splits, int64_t *recv_splits,
                    fc_err *err)
{
    int rc = FC_OK;
    const double t0 = fc_core_now_s();
    const int64_t N = grad->numel;
    const fc_method *m = fc_core_wire_method(s, N, world, grad->dtype);
    if (kmax != fc_core_fetch_kmax(s, N, world) || kmax == 0)
        return fc_fail(err, FC_ERR_VALUE, "picks of %lld per rank, the unit of %lld elements "
                       "over %d ranks has %lld", (long long)kmax, (long long)N, world,
                       (long long)fc_core_fetch_kmax(s, N, world));
    FC_TRY(check_unit(s->bad_unit, unit, "it was not the latest unit encoded", err));
    FC_TRY(check_unit(s->picks_unit, unit, "decode() has not picked its coordinates", err));
    int64_t start, len, need = 0;
    for (int c = 0; c < world; c++) {
        fc_chunk_span(N, world, c, &start, &len);
        send_splits[c] = sends(s, rank, c) ? fc_core_fetch_k(s, m, len) : 0;
        recv_splits[c] = sends(s, c, rank) ? s->n_picks : 0;
        need += send_splits[c];
    }
    if (need > send_cap)
        FC_TRY(fc_fail(err, FC_ERR_VALUE, "second-round send buffer holds %lld values, need %lld",
                       (long long)send_cap, (long long)need));
    /* on CUDA the owners' picks are checked on the device: a malformed list is reported when
     * counters are read, and its owner gets NaN values (fc_cu_fetch.cu) */
    FC_TRY(x->b->fetch_values(s, x, all_picks, kmax, grad, residual, world, rank, unit, send,
                              send_splits, err));
    const int64_t index_bytes = 4 * kmax * (world > 1 ? world - 1 : 1);
    s->ctr.index_bytes += index_bytes;
    s->ctr.value_bytes += 4 * need;
    s->ctr.bytes_sent += index_bytes + 4 * need;
    if (x->b->on_host) /* CUDA times its work with events */
        s->ctr.compress_s += fc_core_now_s() - t0;
    return FC_OK;
error:
    return rc;
}

int fc_fetch_finish(fc_core *s, const fc_exec *x, const float *recv, int64_t recv_n,
                    const fc_buf *grad, fc_buf *out, int world, int rank, uint32_t unit,
                    fc_err *err)
{
    int rc = FC_OK;
    const double t0 = fc_core_now_s();
    const int64_t N = grad->numel;
    int64_t start, n, want = 0;
    fc_chunk_span(N, world, rank, &start, &n);
    FC_TRY(check_unit(s->picks_unit, unit, "decode() has not picked its coordinates", err));
    if (out->numel < n)
        FC_TRY(fc_fail(err, FC_ERR_VALUE, "output has %lld elements, the shard needs %lld",
                       (long long)out->numel, (long long)n));
    for (int r = 0; r < world; r++)
        want += sends(s, r, rank) ? s->n_picks : 0;
    if (recv_n != want)
        FC_TRY(fc_fail(err, FC_ERR_VALUE, "second-round receive buffer has %lld values, the "
                       "senders send %lld", (long long)recv_n, (long long)want));
    FC_TRY(x->b->fetch_finish(s, x, recv, grad, out, world, rank, unit, err));
    s->picks_unit = -1; /* used once */
    if (x->b->on_host)
        s->ctr.decompress_s += fc_core_now_s() - t0;
    return FC_OK;
error:
    return rc;
}

int fc_cpu_fetch_finish(fc_core *s, const fc_exec *x, const float *recv, const fc_buf *grad,
                        fc_buf *out, int world, int rank, uint32_t unit, fc_err *err)
{
    int64_t start, n;
    (void)x;
    (void)unit;
    fc_chunk_span(grad->numel, world, rank, &start, &n);
    int rc = fc_core_take_x(s, n, err); /* the sum: s->x, free since the decode that picked */
    if (rc != FC_OK)
        return rc;
    float *acc = s->x;
    memset(acc, 0, (size_t)n * 4);
    /* NaN/Inf among the values received pass everywhere, as a flagged payload's do; the own
     * chunk's (counted by decode) at their own elements (fc_output_passes) */
    int passed = 0, own_exact = 0;
    /* rank order, as the one-round decode: the same sum on every rank */
    for (int r = 0; r < world && n > 0; r++) {
        if (!sends(s, r, rank)) {
            (void)fc_core_add_own(s, grad, start, n, acc);
            own_exact = 1;
            continue;
        }
        for (int64_t j = 0; j < s->n_picks; j++) {
            passed |= !(fc_abs_bits(recv[j]) < FC_INF_BITS);
            acc[s->picks[j]] += recv[j];
        }
        recv += s->n_picks;
    }
    fc_core_write_out(s, acc, n, world, out, passed, own_exact ? grad : NULL, start);
    return FC_OK;
}
