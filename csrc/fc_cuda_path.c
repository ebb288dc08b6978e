/* fc_cuda_path.c: builds the CUDA library's arguments from a fc_core (geometry, the method's
 * config by key name, RNG keys) and keeps the host-side counters the CPU driver keeps. */
#include "fc_cuda_path.h"

#include <string.h>

#include "fc_wire.h"

static void method_cfg(const fc_core *s, const fc_method *m, fc_cuda_method_cfg *out)
{
    memset(out, 0, sizeof(*out));
    out->id = m->id;
    if (m != s->method)
        return; /* `none` below min_numel: no keys */
    for (const fc_key *k = m->keys; k->name != NULL && out->n_cfg < FC_CUDA_MAX_CFG; k++) {
        const unsigned char *p = s->cfg + k->offset;
        double v = 0;
        if (k->kind == FC_KEY_BOOL || k->kind == FC_KEY_CHOICE) {
            int i;
            memcpy(&i, p, sizeof(i));
            v = i;
        } else if (k->kind == FC_KEY_INT) {
            int64_t i;
            memcpy(&i, p, sizeof(i));
            v = (double)i;
        } else {
            memcpy(&v, p, sizeof(v));
        }
        out->cfg[out->n_cfg].name = k->name;
        out->cfg[out->n_cfg].value = v;
        out->n_cfg++;
    }
}

static int64_t body_bytes(const fc_core *s, const fc_method *m, int64_t n, int world, int dtype,
                          fc_layout *l)
{
    fc_chunk c;
    memset(&c, 0, sizeof(c));
    c.cfg = m == s->method ? (const void *)s->cfg : NULL;
    c.n = n;
    c.world = world;
    c.wire_dtype = dtype;
    m->layout(&c, l);
    return fc_layout_bytes(l);
}

static void geometry(const fc_core *s, const fc_method *m, int64_t N, int dtype, int world,
                     int rank, fc_cuda_geom *g)
{
    fc_layout l;
    memset(g, 0, sizeof(*g));
    g->numel = N;
    g->per = (N + world - 1) / world;
    g->world = world;
    g->rank = rank;
    g->skip_own = !s->common.compress_own_chunk;
    int64_t last_n = g->per > 0 ? N - (N - 1) / g->per * g->per : 0;
    g->pay_full = fc_payload_bytes(s, m, g->per, dtype);
    g->body_full = g->per > 0 ? body_bytes(s, m, g->per, world, dtype, &l) : 0;
    g->pay_last = fc_payload_bytes(s, m, last_n, dtype);
    g->body_last = last_n > 0 ? body_bytes(s, m, last_n, world, dtype, &l) : 0;
}

int fc_cuda_encode(fc_core *s, const fc_cuda_call *k, const fc_buf *grad, fc_buf *send,
                   fc_buf *residual, int world, int rank, uint32_t unit, fc_err *err)
{
    int rc = FC_OK;
    const int64_t N = grad->numel;
    const fc_method *m = fc_core_wire_method(s, N, world, grad->dtype); /* as the CPU plan says */
    const int use_ef = m == s->method && s->common.error_feedback && residual != NULL;
    /* the CPU's rule (fc_core.c encode_begin): no sample from a call a second round follows */
    const int sample = m == s->method && s->common.error_stats_every > 0 &&
                       !fc_core_fetch_kmax(s, N, world) &&
                       s->ctr.calls % s->common.error_stats_every == 0;
    if (m->flags & FC_VARSIZE)
        return fc_fail(err, FC_ERR_TYPE, "method '%s' has a data-dependent size: its CUDA path "
                       "is not implemented yet; use CPU tensors", m->name);
    if (!k->api->has_method(m->id))
        return fc_fail(err, FC_ERR_TYPE, "method '%s' has no CUDA kernels yet; use CPU tensors",
                       m->name);
    fc_cuda_encode_args a;
    memset(&a, 0, sizeof(a));
    method_cfg(s, m, &a.m);
    a.varsize = (m->flags & FC_VARSIZE) != 0;
    a.device = k->device;
    a.stream = k->stream;
    geometry(s, m, N, grad->dtype, world, rank, &a.geo);
    a.grad = grad->data;
    a.grad_dtype = grad->dtype;
    a.residual = use_ef ? residual->data : NULL;
    a.res_dtype = use_ef ? residual->dtype : FC_F32;
    a.send = (uint8_t *)send->data;
    a.unit = unit;
    a.step = s->step;
    a.seed = (uint64_t)s->common.seed;
    a.nonfinite_zero = s->common.nonfinite == FC_NONFINITE_ZERO;
    a.sample = sample;
    a.ws = k->ws;
    a.fingerprint = s->fingerprint;
    FC_TRY(k->api->encode(k->ctx, &a, err));

    /* what went on the wire: a pure function of the geometry, counted on the host */
    int64_t raw = 0;
    for (int c = 0; c < world; c++) {
        int64_t start, n;
        fc_chunk_span(N, world, c, &start, &n);
        if ((c == rank && !s->common.compress_own_chunk) || n == 0)
            continue;
        fc_layout l;
        int64_t body = body_bytes(s, m, n, world, grad->dtype, &l);
        int64_t size = fc_payload_bytes(s, m, n, grad->dtype);
        s->ctr.chunks_sent++;
        s->ctr.bytes_sent += size;
        s->ctr.header_bytes += size - body;
        s->ctr.meta_bytes += l.meta_bytes;
        s->ctr.index_bytes += l.index_bytes;
        s->ctr.value_bytes += l.value_bytes;
        s->ctr.kept += l.kept;
        s->ctr.sent_elements += n;
        raw += n * fc_dtype_size(grad->dtype);
    }
    if (use_ef)
        s->units[unit].residual_elems = residual->numel;
    s->ctr.calls++;
    s->ctr.calls_uncompressed += m != s->method;
    s->ctr.fallback_units += m != s->method && fc_core_unit_method(s, N) == s->method;
    s->ctr.elements += N;
    s->ctr.bytes_raw += raw;
    return FC_OK;
error:
    return rc;
}

int fc_cuda_decode(fc_core *s, const fc_cuda_call *k, const fc_buf *recv, const fc_buf *grad,
                   fc_buf *out, int world, int rank, uint32_t unit, fc_err *err)
{
    int rc = FC_OK;
    const int64_t N = grad->numel;
    const fc_method *m = fc_core_wire_method(s, N, world, grad->dtype);
    int64_t start, n;
    int64_t sends[FC_MAX_WORLD], recvs[FC_MAX_WORLD];
    fc_chunk_span(N, world, rank, &start, &n);
    if (out->numel < n)
        return fc_fail(err, FC_ERR_VALUE, "output has %lld elements, the shard needs %lld",
                       (long long)out->numel, (long long)n);
    if (!k->api->has_method(m->id))
        return fc_fail(err, FC_ERR_TYPE, "method '%s' has no CUDA kernels yet; use CPU tensors",
                       m->name);
    fc_core_plan(s, N, grad->dtype, world, rank, sends, recvs);
    int64_t total = 0;
    for (int r = 0; r < world; r++)
        total += recvs[r];
    if (recv->numel != total)
        return fc_fail(err, FC_ERR_PAYLOAD, "receive buffer has %lld bytes, the plan for %lld "
                       "elements over %d ranks needs %lld", (long long)recv->numel, (long long)N,
                       world, (long long)total);
    fc_cuda_decode_args a;
    memset(&a, 0, sizeof(a));
    method_cfg(s, m, &a.m);
    a.varsize = (m->flags & FC_VARSIZE) != 0;
    a.device = k->device;
    a.stream = k->stream;
    geometry(s, m, N, grad->dtype, world, rank, &a.geo);
    a.recv = (const uint8_t *)recv->data;
    a.slot = fc_payload_bytes(s, m, n, grad->dtype);
    a.grad = grad->data;
    a.grad_dtype = grad->dtype;
    a.out = out->data;
    a.out_dtype = out->dtype;
    a.out_numel = out->numel;
    a.unit = unit;
    a.step = s->step;
    a.seed = (uint64_t)s->common.seed;
    a.nonfinite_zero = s->common.nonfinite == FC_NONFINITE_ZERO;
    a.ws = k->ws;
    a.fingerprint = s->fingerprint;
    FC_TRY(k->api->decode(k->ctx, &a, err));
    return FC_OK;
error:
    return rc;
}

/* One chunk of n elements as its own unit: chunk 0 is all of it and the other W - 1 are empty,
 * so the kernels' chunk 0 is the CPU's single payload; the RNG's chunk id and rank come in
 * apart (chunk_base, geo.rank). */
static void single_geometry(const fc_core *s, int64_t n, int world, int rank, fc_cuda_geom *g)
{
    fc_layout l;
    memset(g, 0, sizeof(*g));
    g->numel = n;
    g->per = n;
    g->world = world;
    g->rank = rank;
    g->skip_own = 0;
    g->pay_full = g->pay_last = fc_payload_bytes(s, s->method, n, FC_F32);
    g->body_full = g->body_last = body_bytes(s, s->method, n, world, FC_F32, &l);
}

int fc_cuda_compress(fc_core *s, const fc_cuda_call *k, const fc_buf *x, fc_buf *payload,
                     uint32_t unit, uint32_t chunk, int world, int rank, int64_t *written,
                     fc_err *err)
{
    const fc_method *m = s->method;
    const int64_t need = fc_payload_bytes(s, m, x->numel, FC_F32);
    if (!k->api->has_method(m->id))
        return fc_fail(err, FC_ERR_TYPE, "method '%s' has no CUDA kernels yet; use CPU tensors",
                       m->name);
    if (m->unit_floats != NULL)
        return fc_fail(err, FC_ERR_TYPE, "method '%s' keeps per-unit state, which compress() "
                       "does not keep on the GPU yet; use CPU tensors", m->name);
    if (payload->numel < need)
        return fc_fail(err, FC_ERR_VALUE, "payload buffer holds %lld bytes, need %lld",
                       (long long)payload->numel, (long long)need);
    fc_cuda_encode_args a;
    memset(&a, 0, sizeof(a));
    method_cfg(s, m, &a.m);
    a.varsize = (m->flags & FC_VARSIZE) != 0;
    a.device = k->device;
    a.stream = k->stream;
    single_geometry(s, x->numel, world, rank, &a.geo);
    a.grad = x->data;
    a.grad_dtype = FC_F32;
    a.res_dtype = FC_F32;
    a.send = (uint8_t *)payload->data;
    a.unit = unit;
    a.step = s->step;
    a.chunk_base = chunk;
    a.seed = (uint64_t)s->common.seed;
    a.ws = k->ws;
    a.fingerprint = s->fingerprint;
    return k->api->compress(k->ctx, &a, written, err);
}

int fc_cuda_decompress(fc_core *s, const fc_cuda_call *k, const fc_buf *payload, fc_buf *acc,
                       float alpha, uint32_t unit, uint32_t chunk, int world, fc_err *err)
{
    const fc_method *m = s->method;
    if (!k->api->has_method(m->id))
        return fc_fail(err, FC_ERR_TYPE, "method '%s' has no CUDA kernels yet; use CPU tensors",
                       m->name);
    if (m->unit_floats != NULL)
        return fc_fail(err, FC_ERR_TYPE, "method '%s' keeps per-unit state, which decompress() "
                       "does not keep on the GPU yet; use CPU tensors", m->name);
    /* the CPU's first check, here on the host: the header itself must be readable */
    if (payload->numel < FC_HEADER_BYTES)
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank 0: %lld bytes, shorter than the "
                       "%d-byte header", (long long)payload->numel, FC_HEADER_BYTES);
    fc_cuda_decode_args a;
    memset(&a, 0, sizeof(a));
    method_cfg(s, m, &a.m);
    a.varsize = (m->flags & FC_VARSIZE) != 0;
    a.device = k->device;
    a.stream = k->stream;
    single_geometry(s, acc->numel, world, 0, &a.geo);
    a.recv = (const uint8_t *)payload->data;
    a.slot = payload->numel;
    a.grad = acc->data; /* never read: the own chunk is not part of a single payload's sum */
    a.grad_dtype = FC_F32;
    a.out = acc->data;
    a.out_dtype = FC_F32;
    a.out_numel = acc->numel;
    a.unit = unit;
    a.step = s->step;
    a.chunk_base = chunk;
    a.seed = (uint64_t)s->common.seed;
    a.alpha = alpha;
    a.ws = k->ws;
    a.fingerprint = s->fingerprint;
    return k->api->decompress(k->ctx, &a, err);
}

void fc_cuda_probe(const fc_core *s, const fc_cuda_api *api, int64_t numel, int dtype, int world,
                   int rank, int64_t *rows)
{
    const fc_method *m = fc_core_wire_method(s, numel, world, dtype); /* as fc_cuda_encode */
    fc_cuda_geom g;
    int64_t start, n;
    geometry(s, m, numel, dtype, world, rank, &g);
    fc_chunk_span(numel, world, rank, &start, &n);
    api->probe_geometry(&g, fc_payload_bytes(s, m, n, dtype), rows);
}
