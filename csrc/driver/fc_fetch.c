/* fc_fetch.c: the second round of two-round methods (see fc_fetch.h): the checks, splits and
 * counters once, for CPU and CUDA tensors; the element work by the call's backend (the CPU's
 * loops in backend_cpu/fc_fetch_cpu.c, or the CUDA library through fc_cuda_path.c). */
#include "driver/fc_fetch.h"

#include "driver/fc_core_impl.h"

static int check_unit(int64_t have, uint32_t unit, const char *what, fc_err *err)
{
    if (have != (int64_t)unit)
        return fc_fail(err, FC_ERR_STATE, "second round of unit %u: %s (call encode, decode, "
                       "fetch and finish of one unit in that order)", unit, what);
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
        send_splits[c] = fc_core_sends(s, rank, c) ? fc_core_fetch_k(s, m, len) : 0;
        recv_splits[c] = fc_core_sends(s, c, rank) ? s->n_picks : 0;
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
        want += fc_core_sends(s, r, rank) ? s->n_picks : 0;
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
