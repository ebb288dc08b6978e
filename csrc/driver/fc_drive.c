/* fc_drive.c: the driver's entries for CPU and CUDA tensors alike: encode, decode, compress and
 * decompress decide, check, count and time here, and hand the element work to the call's
 * backend (fc_backend.h). */
#include "driver/fc_core_impl.h"

#include <stdlib.h>
#include <string.h>

#include "driver/fc_backend.h"
#include "common/fc_ef.h"
#include "common/fc_res8.h"
#include "common/fc_wire.h"

/* Error feedback, decided here only: a unit keeps a residual where it goes out with the
 * configured method; `none` (below min_numel, or fallen back) is exact. */
static int ef_applies(const fc_core *s, const fc_method *wire)
{
    return wire == s->method && s->common.error_feedback;
}

int fc_drive_uses_residual(const fc_core *s, int64_t numel, int world, int dtype)
{
    return ef_applies(s, fc_core_wire_method(s, numel, world, dtype));
}

/* Opens the encode call s->enc with the driver's decisions for it (wire method, error
 * feedback, sampling, the call's key), for a whole encode and for the per-peer parts alike. */
static void encode_open(fc_core *s, const fc_buf *grad, const fc_buf *residual, int world,
                        int rank, uint32_t unit)
{
    fc_encode_call *e = &s->enc;
    const int64_t N = grad->numel;
    const fc_method *m = fc_core_wire_method(s, N, world, grad->dtype);
    e->open = 0;
    e->method = m;
    e->fell_back = 0;
    e->use_ef = ef_applies(s, m) && residual != NULL;
    e->stats = fc_core_stats_due(s, m, N, world);
    e->sample = !e->use_ef && e->stats;
    e->sampled = 0;
    e->raw = 0;
    e->e_sq = 0;
    e->ust = NULL;
    e->key = fc_core_call_key(s, unit, world, rank, N);
    memset(e->next_piece, 0, (size_t)world);
    s->bad_unit = unit; /* the second round reads this encode's chunk flags */
}

/* Counts one payload of the open call (chunk of n elements) as the driver does for every
 * backend: its layout and size, a `none` fallback, the input's raw bytes. */
static void count_sent(fc_core *s, const fc_sent *p, int64_t n, int dtype)
{
    fc_core_count_payload(s, &p->l, p->size, n);
    s->ctr.saturated += p->l.saturated;
    s->enc.fell_back |= p->none;
    s->enc.raw += n * fc_dtype_size(dtype);
}

/* Closes the open call: the unit's residual bookkeeping and the per-call counters. */
static void encode_close(fc_core *s, int on_host, const fc_buf *residual)
{
    fc_encode_call *e = &s->enc;
    if (e->use_ef) {
        if (on_host) /* a CUDA unit's norm stays in the device workspace */
            s->units[e->key.unit].residual_sq = e->e_sq;
        s->units[e->key.unit].residual_elems =
            residual->dtype == FC_U8 ? fc_res8_numel(residual->numel) : residual->numel;
    }
    fc_core_count_call(s, e->method, e->key.numel, e->fell_back, e->raw);
    e->open = 0;
}

int fc_drive_encode(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *send,
                    fc_buf *residual, int world, int rank, uint32_t unit, int64_t *sizes,
                    fc_err *err)
{
    int rc = FC_OK;
    const double t0 = fc_core_now_s();
    const int64_t N = grad->numel;
    fc_sent *sent = s->enc.sent; /* kept in the State: no allocation per call */
    memset(sent, 0, (size_t)world * sizeof(fc_sent));
    encode_open(s, grad, residual, world, rank, unit);
    FC_TRY(x->b->encode(s, x, grad, send, residual, sent, err));
    for (int c = 0; c < world; c++) {
        int64_t start, n;
        fc_chunk_span(N, world, c, &start, &n);
        sizes[c] = fc_core_has_payload(s, N, world, rank, c) ? sent[c].size : 0;
        if (sizes[c] > 0)
            count_sent(s, &sent[c], n, grad->dtype);
    }
    encode_close(s, x->b->on_host, residual);
    if (x->b->on_host)
        s->ctr.compress_s += fc_core_now_s() - t0;
error:
    s->enc.open = 0;
    return rc;
}

int fc_drive_part_opens(const fc_core *s, uint32_t unit, int world, int rank, int64_t numel)
{
    const fc_call_key key = fc_core_call_key(s, unit, world, rank, numel);
    return !s->enc.open || !fc_core_same_call(&s->enc.key, &key);
}

int fc_drive_encode_part(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *send,
                         fc_buf *residual, int world, int rank, uint32_t unit, int chunk, int piece,
                         int64_t *size, fc_err *err)
{
    int rc = FC_OK;
    const double t0 = fc_core_now_s();
    const int64_t N = grad->numel;
    fc_encode_call *e = &s->enc;
    *size = 0;
    const fc_method *m = fc_core_wire_method(s, N, world, grad->dtype);
    /* bad arguments leave an open call as it was; only a failed encode drops it */
    if (x->b->encode_piece == NULL)
        return fc_fail(err, FC_ERR_TYPE, "encode_part runs on CPU tensors only; encode all chunks "
                       "at once with encode()");
    if (chunk < 0 || chunk >= world)
        return fc_fail(err, FC_ERR_VALUE, "chunk must be in [0, %d), got %d", world, chunk);
    int64_t start, n, len;
    fc_chunk_span(N, world, chunk, &start, &n);
    const int parts = fc_core_chunk_parts(s, m, N, world, rank, chunk, &len);
    if (piece < 0 || piece >= parts)
        return fc_fail(err, FC_ERR_VALUE, "piece must be in [0, %d) for chunk %d, got %d", parts,
                       chunk, piece);
    if (fc_drive_part_opens(s, unit, world, rank, N)) { /* an unfinished call is dropped */
        const char *why = fc_core_not_per_peer(s, m, N, world);
        if (why != NULL)
            return fc_fail(err, FC_ERR_VALUE, "method '%s' %s: encode all chunks at once with "
                           "encode()", m->name, why);
        encode_open(s, grad, residual, world, rank, unit);
        FC_TRY(x->b->encode_parts_open(s, x, grad, residual, err));
    }
    if (send->numel != e->at[world])
        return fc_fail(err, FC_ERR_VALUE, "send has %lld bytes, the parts of this call need %lld "
                       "(pieces())", (long long)send->numel, (long long)e->at[world]);
    if (piece != e->next_piece[chunk])
        return fc_fail(err, FC_ERR_STATE, "chunk %d of unit %u: piece %d, expected piece %d (the "
                       "pieces of a chunk come once each, in order)", chunk, unit, piece,
                       e->next_piece[chunk]);
    if (fc_core_has_payload(s, N, world, rank, chunk)) {
        const int64_t off = e->at[chunk] + piece * fc_core_piece_bytes(s, m, n, len, 0, grad->dtype);
        fc_sent p;
        FC_TRY(x->b->encode_piece(s, x, grad, residual, chunk, piece, len,
                                  (uint8_t *)send->data + off, send->numel - off, &p, err));
        const int64_t np = n - piece * len < len ? n - piece * len : len;
        count_sent(s, &p, np, grad->dtype);
        *size = p.size;
    }
    e->next_piece[chunk]++;
    if (--e->todo == 0)
        encode_close(s, 1, residual); /* the parts run on the host only */
    s->ctr.compress_s += fc_core_now_s() - t0;
    return FC_OK;
error:
    e->open = 0;
    return rc;
}

int fc_drive_decode(fc_core *s, const fc_exec *x, const fc_buf *recv, const fc_buf *grad,
                    fc_buf *out, int world, int rank, uint32_t unit, fc_err *err)
{
    int rc = FC_OK;
    const double t0 = fc_core_now_s();
    const int64_t N = grad->numel;
    const fc_method *m = fc_core_wire_method(s, N, world, grad->dtype);
    int64_t start, n, recvs[FC_MAX_WORLD];
    fc_chunk_span(N, world, rank, &start, &n);
    if (out->numel < n)
        return fc_fail(err, FC_ERR_VALUE, "output has %lld elements, the shard needs %lld",
                       (long long)out->numel, (long long)n);
    s->dec_call.open = 0; /* the accumulator is reused: a decode_part sequence ends here */
    FC_TRY(fc_core_check_recv(s, N, grad->dtype, world, rank, unit, recv->numel, recvs, err));
    s->picks_unit = -1;
    FC_TRY(x->b->decode(s, x, recv, grad, out, world, rank, unit, recvs, err));
    if (fc_core_fetch_kmax(s, N, world) > 0) { /* the picks a second round reads next */
        s->n_picks = fc_core_fetch_k(s, m, n);
        s->picks_unit = unit;
    }
    if (x->b->on_host)
        s->ctr.decompress_s += fc_core_now_s() - t0;
error:
    return rc;
}

int fc_drive_compress(fc_core *s, const fc_exec *x, const fc_buf *in, fc_buf *payload,
                      fc_buf *residual, uint32_t unit, uint32_t chunk, int world, int rank,
                      int64_t *written, fc_err *err)
{
    /* the method as configured, whatever the size: a caller of one chunk decides for itself
     * (an FC_PARTS method: by the unit's table where the chunk is one of its own) */
    const int64_t need = fc_core_single_payload(s, in->numel, unit, chunk, world);
    *written = 0;
    if (payload->numel < need)
        return fc_fail(err, FC_ERR_VALUE, "payload buffer holds %lld bytes, need %lld",
                       (long long)payload->numel, (long long)need);
    /* fp32, or on the host a packed 8-bit one: the caller's view (state_chunk.c) */
    const int64_t want = residual != NULL && residual->dtype == FC_U8 ? fc_res8_bytes(in->numel)
                                                                      : in->numel;
    if (residual != NULL && residual->numel != want)
        return fc_fail(err, FC_ERR_VALUE, "residual must have x's %lld elements, got %lld",
                       (long long)want, (long long)residual->numel);
    const double t0 = fc_core_now_s(); /* the all-gather stage's encodes count as the collective's */
    int rc = x->b->compress(s, x, in, payload, residual, unit, chunk, world, rank, written, err);
    if (rc == FC_OK && x->b->on_host)
        s->ctr.compress_s += fc_core_now_s() - t0;
    return rc;
}

int fc_drive_decompress(fc_core *s, const fc_exec *x, const fc_buf *payload, fc_buf *acc,
                        float alpha, uint32_t unit, uint32_t chunk, int world, fc_err *err)
{
    /* the header itself must be readable before anything reads it */
    if (payload->numel < FC_HEADER_BYTES)
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank 0: %lld bytes, shorter than the "
                       "%d-byte header", (long long)payload->numel, FC_HEADER_BYTES);
    const double t0 = fc_core_now_s();
    int rc = x->b->decompress(s, x, payload, acc, alpha, unit, chunk, world, err);
    if (rc == FC_OK && x->b->on_host)
        s->ctr.decompress_s += fc_core_now_s() - t0;
    return rc;
}

static int res8_sizes(const fc_buf *packed, const fc_buf *e, fc_err *err)
{
    if (e->dtype != FC_F32 || packed->dtype != FC_U8)
        return fc_fail(err, FC_ERR_TYPE, "an 8-bit residual is a uint8 tensor unpacked into fp32");
    if (packed->numel != fc_res8_bytes(e->numel))
        return fc_fail(err, FC_ERR_VALUE, "an 8-bit residual of %lld elements has %lld bytes, got "
                       "%lld", (long long)e->numel, (long long)fc_res8_bytes(e->numel),
                       (long long)packed->numel);
    return FC_OK;
}

int fc_drive_res8_unpack(fc_core *s, const fc_exec *x, const fc_buf *packed, fc_buf *e,
                         fc_err *err)
{
    int rc = res8_sizes(packed, e, err);
    return rc != FC_OK ? rc : x->b->res8_unpack(s, x, packed, e, err);
}

int fc_drive_res8_pack(fc_core *s, const fc_exec *x, const fc_buf *e, fc_buf *packed,
                       uint32_t unit, uint32_t salt, fc_err *err)
{
    int rc = res8_sizes(packed, e, err);
    const uint32_t key = fc_res8_key((uint64_t)s->common.seed, s->step, unit, salt);
    return rc != FC_OK ? rc : x->b->res8_pack(s, x, e, packed, key, err);
}

int fc_drive_ef(fc_core *s, const fc_exec *x, int op, fc_buf *xb, const fc_buf *ref, fc_buf *res,
                fc_err *err)
{
    if (op != FC_EF_ADD && op != FC_EF_KEEP)
        return fc_fail(err, FC_ERR_VALUE, "error feedback: no operation %d", op);
    /* a packed 8-bit residual (FC_U8) on the host only: a device's is unpacked around the call */
    const int packed = res->dtype == FC_U8 && x->b->on_host;
    if (xb->dtype != FC_F32 || (res->dtype != FC_F32 && res->dtype != FC_BF16 && !packed) ||
        (op == FC_EF_KEEP && (ref == NULL || ref->dtype != FC_F32)))
        return fc_fail(err, FC_ERR_TYPE, "error feedback takes fp32 x and ref and an fp32 or bf16 residual");
    if (res->numel != (packed ? fc_res8_bytes(xb->numel) : xb->numel) ||
        (op == FC_EF_KEEP && ref->numel != xb->numel))
        return fc_fail(err, FC_ERR_VALUE, "error feedback: x has %lld elements, the residual %lld%s",
                       (long long)xb->numel, (long long)res->numel,
                       op == FC_EF_KEEP && ref->numel != xb->numel ? ", ref another count" : "");
    return x->b->ef(s, x, op, xb, ref, res, err);
}

double fc_drive_residual_sq(const fc_core *s, const double *dev, int32_t n_dev)
{
    double sum = 0;
    for (int32_t u = 0; u < s->n_units; u++) {
        const double sq = u < n_dev ? dev[u] : s->units[u].residual_sq;
        sum += sq > 0 ? sq : 0;
    }
    return sum;
}
