/* fc_cuda_path.c: the CUDA backend of the driver (fc_backend_cuda): builds the library's call
 * header and arguments from a fc_core (geometry, the method's config struct as parsed, RNG keys,
 * the driver's decisions for the call) and queues the kernels; the driver (fc_drive.c) checks
 * and counts around it as it does for the CPU backend. */
#include "backend_cuda/fc_cuda_path.h"
#include "backend_cuda/fc_cuda_parts.h"

#include <stdlib.h>
#include <string.h>

#include "driver/fc_core_impl.h"
#include "methods/fc_sparse.h"
#include "common/fc_wire.h"

/* The method's parsed config struct as it is (fc_cfg.h): `none` below min_numel has none. */
static void method_cfg(const fc_core *s, const fc_method *m, fc_cuda_method_cfg *out)
{
    memset(out, 0, sizeof(*out));
    out->id = m->id;
    if (m == s->method)
        memcpy(out->cfg, s->cfg, m->cfg_size);
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

/* The unit's geometry for the kernels, from its plan (p->wire's payloads). */
static void geometry(const fc_core *s, const fc_plan *p, int rank, fc_cuda_geom *g)
{
    memset(g, 0, sizeof(*g));
    g->numel = p->numel;
    g->per = p->per;
    g->world = p->world;
    g->rank = rank;
    g->skip_own = !s->common.compress_own_chunk;
    g->pay_full = p->pay_per;
    g->body_full = fc_layout_bytes(&p->body_per);
    g->pay_last = p->pay_last;
    g->body_last = fc_layout_bytes(&p->body_last);
}

static int check_method(const fc_cuda_call *k, const fc_method *m, fc_err *err)
{
    if (!k->api->has_method(m->id))
        return fc_fail(err, FC_ERR_TYPE, "method '%s' has no CUDA kernels yet; use CPU tensors",
                       m->name);
    return FC_OK;
}

/* gradiveq's learn steps: the unit state's covariance is summed over ranks after this step. */
static int learns(const fc_core *s, const fc_method *m)
{
    int64_t off;
    return m == s->method && m->sync_floats != NULL && m->sync_floats(s->cfg, s->step, &off) > 0;
}

/* The call header (fc_cuda_head): what every call to the library carries, filled here only.
 * m is the method the payloads go out with; the caller sets the geometry and what it changes. */
static void call_head(const fc_core *s, const fc_cuda_call *k, const fc_method *m,
                      const fc_buf *grad, uint32_t unit, uint32_t chunk_base, fc_cuda_head *h)
{
    memset(h, 0, sizeof(*h));
    method_cfg(s, m, &h->m);
    h->varsize = (m->flags & FC_VARSIZE) != 0;
    h->device = k->device;
    h->stream = k->stream;
    h->grad = grad != NULL ? grad->data : NULL;
    h->grad_dtype = grad != NULL ? grad->dtype : FC_F32;
    h->unit = unit;
    h->step = s->step;
    h->chunk_base = chunk_base;
    h->seed = (uint64_t)s->common.seed;
    h->fingerprint = s->fingerprint;
    h->nonfinite_zero = s->common.nonfinite == FC_NONFINITE_ZERO;
    h->ws = k->ws;
    h->x = k->x; /* scratch, unit state, fetch buffer; what a call changes, it sets */
    h->x.learn = 0;
    h->x.fetch_k = 0;
}

/* The collective's header from the unit's plan: its geometry and wire method, and whether a
 * second round follows (exactly when there is a fetch buffer: the kernels' test). */
static const fc_method *unit_head(const fc_core *s, const fc_cuda_call *k, const fc_plan *p,
                                  const fc_buf *grad, int rank, uint32_t unit, fc_cuda_head *h)
{
    call_head(s, k, p->wire, grad, unit, 0, h);
    geometry(s, p, rank, &h->geo);
    if (p->fetch_kmax == 0)
        h->x.fetch = NULL;
    return p->wire;
}

/* residual: NULL without error feedback; sample: the call samples the error statistics (the
 * driver's decisions, fc_drive.c's encode_open). */
static void encode_args(const fc_core *s, const fc_cuda_call *k, const fc_plan *p,
                        const fc_buf *grad, fc_buf *send, fc_buf *residual, int sample, int rank,
                        uint32_t unit, fc_cuda_encode_args *a)
{
    memset(a, 0, sizeof(*a));
    const fc_method *m = unit_head(s, k, p, grad, rank, unit, &a->h);
    a->h.x.learn = learns(s, m);
    a->residual = residual != NULL ? residual->data : NULL;
    a->res_dtype = residual != NULL ? residual->dtype : FC_F32;
    a->ef_decay = (float)s->common.ef_decay; /* fc_core_ef_decay's float: the CPU's product */
    a->send = send != NULL ? (uint8_t *)send->data : NULL;
    a->sample = sample;
}

/* Bytes of the fetch buffer a unit's second round keeps on the device. */
static int64_t fetch_bytes(int64_t kmax)
{
    return FC_CUDA_FETCH_PICKS + 4 * kmax;
}

/* The host records a data-dependent encode of `world` payloads reads back, kept in the State
 * from call to call: grown here when a world needs more. */
static int sent_records(fc_cuda_host *h, int world, fc_err *err)
{
    if (h->sent_cap >= world)
        return FC_OK;
    fc_cuda_sent *p = (fc_cuda_sent *)realloc(h->sent, (size_t)world * sizeof(fc_cuda_sent));
    if (p == NULL)
        return fc_fail(err, FC_ERR_NOMEM, "could not allocate %d payload records", world);
    h->sent = p;
    h->sent_cap = world;
    return FC_OK;
}

/* The open call s->enc (the driver's decisions) on the device; sent[c]: the geometry's payloads,
 * or for a data-dependent method what the device says it wrote (read back: the one wait on the
 * GPU of a hook call). */
static int cuda_encode(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *send,
                       fc_buf *residual, fc_sent *sent, fc_err *err)
{
    int rc = FC_OK;
    const fc_cuda_call *k = x->k;
    const fc_encode_call *e = &s->enc;
    const int64_t N = grad->numel;
    const int world = e->key.world, rank = e->key.rank;
    const fc_method *m = e->method;
    const int varsize = (m->flags & FC_VARSIZE) != 0;
    const fc_plan p = fc_core_plan_of(s, N, grad->dtype, world);
    fc_cuda_sent *dev = NULL;
    fc_cuda_encode_args a;
    FC_TRY(check_method(k, m, err));
    encode_args(s, k, &p, grad, send, e->use_ef ? residual : NULL, e->stats, rank, e->key.unit, &a);
    FC_TRY(fc_cuda_parts_unit(s, k, m, N, grad->dtype, world, rank, e->key.unit, 0, &a.h, err));
    if (varsize) {
        FC_TRY(sent_records(k->host, world, err));
        dev = k->host->sent;
        memset(dev, 0, (size_t)world * sizeof(fc_cuda_sent));
        a.h.x.sent = dev;
    }
    FC_TRY(k->api->encode(k->ctx, &a, err));
    for (int c = 0; c < world; c++) {
        int64_t start, n;
        fc_chunk_span_per(N, p.per, c, &start, &n);
        if (!fc_chunk_sent(n, c, rank, !s->common.compress_own_chunk)) /* fc_core_has_payload */
            continue;
        if (varsize) {
            sent[c].l.value_bytes = dev[c].value_bytes;
            sent[c].l.meta_bytes = dev[c].meta_bytes;
            sent[c].l.index_bytes = dev[c].index_bytes;
            sent[c].l.kept = dev[c].kept;
            sent[c].none = dev[c].none != 0;
            sent[c].size = dev[c].size;
        } else if (m->flags & FC_PARTS) { /* the chunk's own table sizes it (fc_core_plan's) */
            const fc_chunk ch = fc_core_make_chunk(s, m, n, world, grad->dtype, e->key.unit,
                                                   (uint32_t)c, rank);
            m->layout(&ch, &sent[c].l);
            sent[c].size = fc_core_chunk_bytes(s, m, &ch);
        } else {
            sent[c].l = *fc_plan_body(&p, n);
            sent[c].size = fc_plan_payload(&p, n);
        }
    }
error:
    return rc;
}

static void decode_args(const fc_core *s, const fc_cuda_call *k, const fc_plan *p,
                        const fc_buf *recv, const fc_buf *grad, const fc_buf *out, int rank,
                        uint32_t unit, fc_cuda_decode_args *a)
{
    int64_t start, n;
    fc_chunk_span_per(grad->numel, p->per, rank, &start, &n);
    memset(a, 0, sizeof(*a));
    const fc_method *m = unit_head(s, k, p, grad, rank, unit, &a->h);
    a->h.x.fetch_k = p->fetch_kmax > 0 ? fc_core_fetch_k(s, m, n) : 0;
    a->h.x.packed_bytes = (m->flags & FC_VARSIZE) && recv != NULL ? recv->numel : 0;
    a->recv = recv != NULL ? (const uint8_t *)recv->data : NULL;
    /* fixed sizes: every slot a payload of the own chunk (by its parts table: fc_core_plan's);
     * data-dependent: back to back */
    a->slot = (m->flags & FC_VARSIZE) ? 0
              : (m->flags & FC_PARTS) ? fc_core_chunk_payload(s, p, unit, rank, n)
                                      : fc_plan_payload(p, n);
    a->out = out->data;
    a->out_dtype = out->dtype;
    a->out_numel = out->numel;
}

/* What a CUDA encode or decode of a unit needs besides its tensors: device scratch bytes (0:
 * none), the fetch buffer's bytes (0: no second round). k->x is not read. */
static int unit_needs(const fc_core *s, const fc_cuda_call *k, int decode, const fc_buf *recv,
                      const fc_buf *grad, const fc_buf *out, int world, int rank, uint32_t unit,
                      int64_t *scratch, int64_t *fetch, fc_err *err)
{
    const fc_plan p = fc_core_plan_of(s, grad->numel, grad->dtype, world);
    const fc_method *m = p.wire;
    const int64_t kmax = fc_core_fetch_kmax(s, grad->numel, world);
    *scratch = 0;
    *fetch = kmax > 0 ? fetch_bytes(kmax) : 0;
    int rc = check_method(k, m, err);
    if (rc != FC_OK)
        return rc;
    if (decode) {
        fc_cuda_decode_args a;
        decode_args(s, k, &p, recv, grad, out, rank, unit, &a);
        rc = fc_cuda_parts_unit(s, k, m, grad->numel, grad->dtype, world, rank, unit, 1, &a.h, err);
        return rc != FC_OK ? rc : k->api->scratch_bytes(NULL, &a, scratch, err);
    }
    fc_cuda_encode_args a;
    encode_args(s, k, &p, grad, NULL, NULL, fc_core_stats_due(s, m, grad->numel, world), rank, unit,
                &a);
    rc = fc_cuda_parts_unit(s, k, m, grad->numel, grad->dtype, world, rank, unit, 0, &a.h, err);
    return rc != FC_OK ? rc : k->api->scratch_bytes(&a, NULL, scratch, err);
}

static int cuda_decode(fc_core *s, const fc_exec *x, const fc_buf *recv, const fc_buf *grad,
                       fc_buf *out, int world, int rank, uint32_t unit, const int64_t *recvs,
                       fc_err *err)
{
    int rc = FC_OK;
    const fc_cuda_call *k = x->k;
    const fc_plan p = fc_core_plan_of(s, grad->numel, grad->dtype, world);
    (void)recvs;
    FC_TRY(check_method(k, p.wire, err));
    fc_cuda_decode_args a;
    decode_args(s, k, &p, recv, grad, out, rank, unit, &a);
    FC_TRY(fc_cuda_parts_unit(s, k, p.wire, grad->numel, grad->dtype, world, rank, unit, 1, &a.h,
                              err));
    if (fc_core_fetch_kmax(s, grad->numel, world) > 0 && a.h.x.fetch == NULL)
        FC_TRY(fc_fail(err, FC_ERR_STATE, "internal: a second round without its fetch buffer"));
    FC_TRY(k->api->decode(k->ctx, &a, err)); /* a second round's picks stay on the device */
error:
    return rc;
}

/* ---- the second round's work on the device (fc_fetch.c checks, splits and counts) */

static void fetch_args(const fc_core *s, const fc_cuda_call *k, const fc_buf *grad, int world,
                       int rank, uint32_t unit, fc_cuda_fetch_args *a)
{
    const fc_plan p = fc_core_plan_of(s, grad->numel, grad->dtype, world);
    memset(a, 0, sizeof(*a));
    unit_head(s, k, &p, grad, rank, unit, &a->h);
    a->h.x.fetch = k->x.fetch;
    a->kmax = fc_core_fetch_kmax(s, grad->numel, world);
    a->n_picks = s->n_picks;
}

static int cuda_fetch_picks(const fc_core *s, const fc_exec *x, uint32_t unit, uint32_t *picks,
                            int64_t kmax, fc_err *err)
{
    const fc_cuda_call *k = x->k;
    fc_cuda_fetch_args a;
    memset(&a, 0, sizeof(a));
    call_head(s, k, s->method, NULL, unit, 0, &a.h);
    a.h.x.fetch = k->x.fetch;
    a.kmax = kmax;
    a.n_picks = s->n_picks;
    a.picks = picks;
    return k->api->fetch_picks(k->ctx, &a, err);
}

static int cuda_fetch_values(fc_core *s, const fc_exec *x, const uint32_t *all_picks,
                             int64_t kmax, const fc_buf *grad, fc_buf *residual, int world,
                             int rank, uint32_t unit, float *send, const int64_t *send_splits,
                             fc_err *err)
{
    const fc_cuda_call *k = x->k;
    fc_cuda_fetch_args a;
    (void)send_splits; /* the device splits by the same rule */
    fetch_args(s, k, grad, world, rank, unit, &a);
    a.kmax = kmax;
    a.residual = residual != NULL ? residual->data : NULL;
    a.res_dtype = residual != NULL ? residual->dtype : FC_F32;
    a.all_picks = all_picks;
    a.values = send;
    return k->api->fetch_values(k->ctx, &a, err);
}

static int cuda_fetch_finish(fc_core *s, const fc_exec *x, const float *recv, const fc_buf *grad,
                             fc_buf *out, int world, int rank, uint32_t unit, fc_err *err)
{
    const fc_cuda_call *k = x->k;
    fc_cuda_fetch_args a;
    fetch_args(s, k, grad, world, rank, unit, &a);
    a.values = (float *)recv;
    a.out = out->data;
    a.out_dtype = out->dtype;
    a.out_numel = out->numel;
    return k->api->fetch_finish(k->ctx, &a, err);
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

/* compress()'s arguments for x (x->numel values; data may be NULL when only sizing): NaN/Inf
 * go through flagged, no residual, no sample, no second round after one payload; refused for a
 * method without kernels. */
static int single_encode_args(const fc_core *s, const fc_cuda_call *k, const fc_buf *x,
                              fc_buf *payload, uint32_t unit, uint32_t chunk, int world, int rank,
                              fc_cuda_encode_args *a, fc_err *err)
{
    memset(a, 0, sizeof(*a));
    call_head(s, k, s->method, x, unit, chunk, &a->h);
    single_geometry(s, x->numel, world, rank, &a->h.geo);
    a->h.grad_dtype = FC_F32;
    a->h.nonfinite_zero = 0;
    a->h.x.learn = learns(s, s->method); /* the CPU's compress learns too (gradiveq) */
    a->h.x.fetch = NULL;
    a->h.x.sent = NULL; /* the driver reads a data-dependent size from the header */
    a->res_dtype = FC_F32;
    a->ef_decay = (float)s->common.ef_decay; /* read only when compress() takes a residual */
    a->send = payload != NULL ? (uint8_t *)payload->data : NULL;
    int rc = check_method(k, s->method, err);
    return rc != FC_OK ? rc : fc_cuda_parts_single(s, k, x->numel, world, rank, unit, chunk, &a->h,
                                                   err);
}

/* decompress()'s arguments for acc (acc->numel values; data may be NULL when only sizing);
 * refused for a method without kernels. */
static int single_decode_args(const fc_core *s, const fc_cuda_call *k, const fc_buf *payload,
                              const fc_buf *acc, float alpha, uint32_t unit, uint32_t chunk,
                              int world, fc_cuda_decode_args *a, fc_err *err)
{
    memset(a, 0, sizeof(*a));
    /* grad is never read: the own chunk is not part of a single payload's sum */
    call_head(s, k, s->method, acc, unit, chunk, &a->h);
    single_geometry(s, acc->numel, world, 0, &a->h.geo);
    a->h.grad_dtype = FC_F32;
    a->h.nonfinite_zero = 0;
    a->h.x.fetch = NULL;
    a->recv = payload != NULL ? (const uint8_t *)payload->data : NULL;
    a->slot = payload != NULL ? payload->numel : 0;
    a->h.x.packed_bytes = a->slot; /* a data-dependent method walks the one payload's header */
    a->out = acc->data;
    a->out_dtype = FC_F32;
    a->out_numel = acc->numel;
    a->alpha = alpha;
    int rc = check_method(k, s->method, err);
    /* the CPU's decompress() makes its chunk as rank 0's (fc_decode.c) */
    return rc != FC_OK ? rc : fc_cuda_parts_single(s, k, acc->numel, world, 0, unit, chunk, &a->h,
                                                   err);
}

/* The device scratch compress() (decode 0) of n values or decompress() (decode 1) into n needs;
 * k->x is not read. */
static int single_needs(const fc_core *s, const fc_cuda_call *k, int64_t n, int world, int rank,
                        uint32_t unit, uint32_t chunk, int decode, int64_t *scratch, fc_err *err)
{
    fc_buf b;
    memset(&b, 0, sizeof(b));
    b.numel = n;
    b.dtype = FC_F32;
    *scratch = 0;
    fc_cuda_encode_args ea;
    fc_cuda_decode_args da;
    int rc = decode ? single_decode_args(s, k, NULL, &b, 1.0f, unit, chunk, world, &da, err)
                    : single_encode_args(s, k, &b, NULL, unit, chunk, world, rank, &ea, err);
    if (rc != FC_OK)
        return rc;
    return k->api->scratch_bytes(decode ? NULL : &ea, decode ? &da : NULL, scratch, err);
}

static int cuda_compress(fc_core *s, const fc_exec *x, const fc_buf *in, fc_buf *payload,
                         fc_buf *residual, uint32_t unit, uint32_t chunk, int world, int rank,
                         int64_t *written, fc_err *err)
{
    fc_cuda_encode_args a;
    int rc = single_encode_args(s, x->k, in, payload, unit, chunk, world, rank, &a, err);
    if (rc == FC_OK && residual != NULL) { /* g' = x + e by the collective's rules, e replaced */
        a.residual = residual->data;
        a.res_dtype = FC_F32;
        a.h.nonfinite_zero = s->common.nonfinite == FC_NONFINITE_ZERO;
    }
    return rc != FC_OK ? rc : x->k->api->compress(x->k->ctx, &a, written, err);
}

static int cuda_decompress(fc_core *s, const fc_exec *x, const fc_buf *payload, fc_buf *acc,
                           float alpha, uint32_t unit, uint32_t chunk, int world, fc_err *err)
{
    fc_cuda_decode_args a;
    int rc = single_decode_args(s, x->k, payload, acc, alpha, unit, chunk, world, &a, err);
    return rc != FC_OK ? rc : x->k->api->decompress(x->k->ctx, &a, err);
}

static int cuda_res8_pack(fc_core *s, const fc_exec *x, const fc_buf *e, fc_buf *packed,
                          uint32_t key, fc_err *err)
{
    (void)s;
    return x->k->api->res8(x->k->ctx, x->k->device, x->k->stream, 1, (float *)e->data, e->numel,
                           (uint8_t *)packed->data, key, err);
}

static int cuda_res8_unpack(fc_core *s, const fc_exec *x, const fc_buf *packed, fc_buf *e,
                            fc_err *err)
{
    (void)s;
    return x->k->api->res8(x->k->ctx, x->k->device, x->k->stream, 0, (float *)e->data, e->numel,
                           (uint8_t *)packed->data, 0, err);
}

static int cuda_ef(fc_core *s, const fc_exec *x, int op, fc_buf *xb, const fc_buf *ref, fc_buf *res,
                   fc_err *err)
{
    fc_cuda_ef_args a;
    call_head(s, x->k, s->method, xb, 0, 0, &a.h);
    a.op = op;
    a.x = (float *)xb->data;
    a.ref = ref != NULL ? (const float *)ref->data : NULL;
    a.residual = res->data;
    a.res_dtype = res->dtype;
    a.n = xb->numel;
    a.ef_decay = (float)s->common.ef_decay; /* fc_core_ef_decay's float: the CPU's product */
    return x->k->api->ef(x->k->ctx, &a, err);
}

/* ---- what a call needs on the device, and the counters the device keeps */

/* The device buffer `name`, shared by every call of the State (grown, never shrunk). */
static int named_buffer(const fc_cuda_call *k, const char *name, int64_t bytes, void **ptr,
                        int64_t *have, fc_err *err)
{
    int fresh;
    return k->host->buffer(k->host->owner, k->like, name, 0, bytes, ptr, have, &fresh, err);
}

static int scratch_buffer(fc_cuda_call *k, int64_t bytes, fc_err *err)
{
    void *ptr = NULL;
    int64_t have = 0;
    int rc = bytes > 0 ? named_buffer(k, "scratch", bytes, &ptr, &have, err) : FC_OK;
    k->x.scratch = ptr;
    k->x.scratch_bytes = have;
    return rc;
}

/* The unit's method state on the device: made from the host's (seeded at first use, or set by
 * a sync or a restore) whenever there is no current copy. */
static int unit_state(fc_core *s, const fc_cuda_call *k, uint32_t unit, float **dev, fc_err *err)
{
    float *host;
    int fresh = 0;
    void *ptr = NULL;
    int64_t have = 0;
    const int64_t nf = fc_core_unit_floats(s, s->units[unit].numel);
    *dev = NULL;
    if (nf == 0)
        return FC_OK;
    int rc = fc_core_unit_state(s, unit, &host, err);
    if (rc == FC_OK)
        rc = k->host->buffer(k->host->owner, k->like, NULL, unit, 4 * nf, &ptr, &have, &fresh,
                             err);
    if (rc == FC_OK && fresh) /* queued on the call's stream, before the kernels that read it */
        rc = k->api->copy(k->ctx, k->device, k->stream, ptr, host, 4 * nf, 0, err);
    *dev = (float *)ptr;
    return rc;
}

/* The state compress()/decompress() of `unit` read: the collective's device copy where the unit
 * runs the method there (the same host state, fc_core_single_state, so the same copy); else a
 * device copy of the loose state made afresh each call (seeded alike on every call and rank,
 * never synced: what its learn steps add is never read). */
static int single_state(fc_core *s, const fc_cuda_call *k, uint32_t unit, float **dev,
                        fc_err *err)
{
    float *host = NULL;
    void *ptr = NULL;
    int64_t have = 0;
    *dev = NULL;
    int rc = fc_core_single_state(s, unit, &host, err);
    if (rc != FC_OK || host == NULL)
        return rc;
    if (unit < (uint32_t)s->n_units && fc_core_unit_floats(s, s->units[unit].numel) > 0)
        return unit_state(s, k, unit, dev, err);
    const int64_t nf = s->method->unit_floats(s->cfg); /* host != NULL: the method keeps one */
    rc = named_buffer(k, "single state", 4 * nf, &ptr, &have, err);
    if (rc == FC_OK) /* queued on the call's stream, before the kernels that read it */
        rc = k->api->copy(k->ctx, k->device, k->stream, ptr, host, 4 * nf, 0, err);
    *dev = (float *)ptr;
    return rc;
}

static int cuda_prepare(fc_core *s, const fc_exec *x, const fc_prep *p, fc_err *err)
{
    fc_cuda_call *k = x->k;
    int64_t scratch = 0, fetch = 0, have = 0;
    void *ptr = NULL;
    int rc = FC_OK;
    memset(&k->x, 0, sizeof(k->x));
    switch (p->kind) {
    case FC_PREP_ENCODE:
    case FC_PREP_DECODE:
        rc = unit_needs(s, k, p->kind == FC_PREP_DECODE, p->recv, p->grad, p->out, p->world,
                        p->rank, p->unit, &scratch, &fetch, err);
        if (rc == FC_OK)
            rc = scratch_buffer(k, scratch, err);
        if (rc == FC_OK && fetch > 0 &&
            (rc = named_buffer(k, "fetch", fetch, &ptr, &have, err)) == FC_OK)
            k->x.fetch = (uint8_t *)ptr;
        return rc == FC_OK ? unit_state(s, k, p->unit, &k->x.ustate, err) : rc;
    case FC_PREP_COMPRESS:
    case FC_PREP_DECOMPRESS:
        rc = single_needs(s, k, p->grad->numel, p->world, p->rank, p->unit, p->chunk,
                          p->kind == FC_PREP_DECOMPRESS, &scratch, err);
        if (rc == FC_OK)
            rc = scratch_buffer(k, scratch, err);
        return rc == FC_OK ? single_state(s, k, p->unit, &k->x.ustate, err) : rc;
    case FC_PREP_FETCH: /* the buffer the decode that picked made */
        rc = named_buffer(k, "fetch", fetch_bytes(s->n_picks), &ptr, &have, err);
        k->x.fetch = (uint8_t *)ptr;
        return rc;
    }
    return rc;
}

/* Why the device rejected a payload (fc_cuda.h's FC_PAYLOAD_* codes), for the message. */
static const char *payload_problem(unsigned code)
{
    static const char *const what[] = {"an unknown problem", "bad magic", "wrong wire version",
                                       "another method", "another dtype",
                                       "another unit or step (ranks called the hook in different "
                                       "orders)", "another element count",
                                       "a body that does not fit its slot",
                                       "a code no encoder writes",
                                       "another config (its fingerprint differs: every rank must "
                                       "run the same method and config)",
                                       "another world size"};
    return what[code < sizeof(what) / sizeof(what[0]) ? code : 0];
}

/* Waits for the GPU (the caller releases the GIL): the workspace's counts and residual norms,
 * and the event times (also of a State whose only CUDA work is comm marks: no workspace). */
static int cuda_read_counters(fc_core *s, const fc_exec *x, fc_counters *tot, double *res_sq,
                              fc_err *err)
{
    const fc_cuda_call *k = x->k;
    double sec[FC_TIME_KINDS];
    fc_cuda_ws *dws = NULL;
    int rc = FC_OK;
    if (k->ws != NULL && (dws = (fc_cuda_ws *)malloc(sizeof(fc_cuda_ws))) == NULL)
        return fc_fail(err, FC_ERR_NOMEM, "could not allocate %zu bytes for the CUDA counters",
                       sizeof(fc_cuda_ws));
    FC_TRY(k->api->read_counters(k->ctx, k->ws, dws, sec, err));
    /* harvested event times become part of the host totals; extra collectives count in
     * comm_time_s too, as add_comm(extra=True) counts them */
    s->ctr.compress_s += sec[FC_TIME_COMPRESS];
    s->ctr.comm_s += sec[FC_TIME_COMM] + sec[FC_TIME_EXTRA];
    s->ctr.extra_collective_s += sec[FC_TIME_EXTRA];
    s->ctr.decompress_s += sec[FC_TIME_DECOMPRESS];
    *tot = s->ctr;
    *res_sq = fc_drive_residual_sq(s, NULL, 0);
    if (dws == NULL)
        goto error; /* no element work ran on the device */
    /* the workspace's are cumulative until reset: read, never moved into s->ctr */
    tot->nonfinite_in += (int64_t)dws->nonfinite_in;
    tot->nonfinite_out += (int64_t)dws->nonfinite_out;
    tot->saturated += (int64_t)dws->saturated;
    tot->err_sq += dws->err_sq;
    tot->ref_sq += dws->ref_sq;
    tot->cos_sum += dws->cos_sum;
    tot->stats_samples += (int64_t)dws->samples;
    *res_sq = fc_drive_residual_sq(s, dws->unit_sq, FC_CUDA_MAX_UNITS);
    if (dws->payload_error != 0)
        rc = fc_fail(err, FC_ERR_PAYLOAD,
                     "a CUDA decode rejected the payload from rank %d (header says unit %u, step "
                     "%u): %s%s; its output was set to NaN (reset_counters() clears this)",
                     dws->payload_error_rank, dws->payload_error_unit, dws->payload_error_step,
                     payload_problem(dws->payload_error),
                     /* the header mixes the unit's parts table into the fingerprint */
                     dws->payload_error == FC_PAYLOAD_CONFIG && (s->method->flags & FC_PARTS)
                         ? ", or another parts table of the unit: every rank must set_parts() the "
                           "same table" : "");
error:
    free(dws);
    return rc;
}

static int cuda_reset_counters(fc_core *s, const fc_exec *x, fc_err *err)
{
    (void)s; /* it waits for the GPU's queued timings: the caller releases the GIL */
    return x->k->api->reset_counters(x->k->ctx, x->k->ws, err);
}

const fc_backend fc_backend_cuda = {
    0,
    cuda_prepare,
    cuda_read_counters,
    cuda_reset_counters,
    cuda_encode,
    NULL, /* the per-peer parts run on the host only (fc_drive_encode_part) */
    NULL,
    cuda_decode,
    cuda_compress,
    cuda_decompress,
    cuda_fetch_picks,
    cuda_fetch_values,
    cuda_fetch_finish,
    cuda_res8_pack,
    cuda_res8_unpack,
    cuda_ef,
};

void fc_cuda_probe(const fc_core *s, const fc_cuda_api *api, int64_t numel, int dtype, int world,
                   int rank, int64_t *rows)
{
    const fc_plan p = fc_core_plan_of(s, numel, dtype, world);
    fc_cuda_geom g;
    int64_t start, n;
    geometry(s, &p, rank, &g);
    fc_chunk_span(numel, world, rank, &start, &n);
    api->probe_geometry(&g, fc_payload_bytes(s, p.wire, n, dtype), rows);
}
