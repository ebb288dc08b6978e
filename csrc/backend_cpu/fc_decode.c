/* fc_decode.c: the driver's decode on the CPU: header checks, rank-order accumulation (or the
 * compressed-domain sum), the owner's picks of a second round, the output's cast and range rules
 * (fc_drive_decode, its per-peer parts, decompress()). */
#include "backend_cpu/fc_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fc_half.h"
#include "backend_cpu/fc_memhint.h"
#include "common/fc_quant.h"
#include "common/fc_range.h"
#include "methods/fc_simd.h"
#include "common/fc_wire.h"

extern const fc_method fc_method_none;

/* The method a received payload was written with: the unit's, or `none` where a data-dependent
 * method fell back for this one payload (any other id is check_header's to refuse). */
static const fc_method *payload_method(const fc_method *m, const uint8_t *p, int64_t slot)
{
    if (!(m->flags & FC_VARSIZE) || slot < FC_HEADER_BYTES)
        return m;
    fc_header h;
    memcpy(&h, p, sizeof(h));
    return h.method == fc_method_none.id ? &fc_method_none : m;
}

/* ---- decode ---- */

static uint32_t k_fingerprint(const fc_core *s, const fc_method *m, const fc_chunk *c)
{
    return fc_core_header_key(s, m, c).fingerprint;
}

/* The PayloadError of a header fc_header_verdict refused (code): which field, what it held. */
static int header_error(const fc_core *s, const fc_header *h, const fc_method *m, const fc_chunk *c,
                        int64_t slot, int64_t layout, int src, unsigned code, fc_err *err)
{
    switch (code) {
    case FC_PAYLOAD_MAGIC:
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: bad magic 0x%04x (not a "
                       "fsdpcomp payload, or corrupted)", src, h->magic);
    case FC_PAYLOAD_VERSION:
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: wire version %d, expected %d",
                       src, h->version, FC_WIRE_VERSION);
    case FC_PAYLOAD_METHOD:
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: method id %d, expected %d (%s): "
                       "ranks use different methods", src, h->method, m->id, m->name);
    case FC_PAYLOAD_CONFIG:
        if (m->flags & FC_PARTS) /* the header mixes the unit's parts table into the fingerprint */
            return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d was encoded under another "
                           "parts table of unit %u or another config (fingerprint %08x, this "
                           "rank's %08x with its table): the ranks' parts tables differ; every "
                           "rank must set_parts() the same table", src, c->rng_shared.unit,
                           fc_wire_fingerprint(h->fingerprint, h->method), k_fingerprint(s, m, c));
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d was encoded under another "
                       "config (fingerprint %08x, this rank's %08x): every rank must run the same "
                       "method and config keys", src, fc_wire_fingerprint(h->fingerprint, h->method),
                       s->fingerprint);
    case FC_PAYLOAD_WORLD:
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d was encoded for world %u, this "
                       "rank runs world %d", src, h->world, c->world);
    case FC_PAYLOAD_DTYPE:
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: dtype code %d (flags 0x%02x), "
                       "expected %d", src, h->dtype, h->flags, c->wire_dtype);
    case FC_PAYLOAD_ORDER:
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d is for unit %u of step %u, this "
                       "rank is at unit %u of step %u: ranks called the hook in different orders",
                       src, h->unit, h->step, c->rng_shared.unit, c->rng_shared.step);
    case FC_PAYLOAD_NUMEL:
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: %llu elements, expected %lld",
                       src, (unsigned long long)fc_header_numel(h), (long long)c->n);
    default: /* FC_PAYLOAD_BODY */
        if (fc_header_body(h) > (uint64_t)(slot - FC_HEADER_BYTES))
            return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: body of %llu bytes does not "
                           "fit its %lld-byte slot (truncated?)", src,
                           (unsigned long long)fc_header_body(h), (long long)slot);
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: body of %lld bytes, the "
                       "method's layout has %lld", src, (long long)fc_header_body(h), (long long)layout);
    }
}

/* Validates the payload at p (at most `slot` bytes) for chunk c by the receiver's rule
 * (fc_header_verdict, the CUDA decode's too): its body size in *body and whether it carries
 * NaN/Inf of its sender's input in *passed. */
static int check_payload(const fc_core *s, const fc_method *m, const fc_chunk *c, const uint8_t *p,
                         int64_t slot, int src, int64_t *body, int *passed, fc_err *err)
{
    if (slot < FC_HEADER_BYTES)
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: %lld bytes, shorter than the "
                       "%d-byte header", src, (long long)slot, FC_HEADER_BYTES);
    fc_header h;
    memcpy(&h, p, sizeof(h));
    fc_layout l;
    m->layout(c, &l);
    const fc_header_key k = fc_core_header_key(s, m, c);
    const unsigned code = fc_header_verdict(&h, &k, (uint64_t)c->n, (uint64_t)fc_layout_bytes(&l),
                                            (m->flags & FC_VARSIZE) != 0, slot);
    if (code != 0)
        return header_error(s, &h, m, c, slot, fc_layout_bytes(&l), src, code, err);
    *body = (int64_t)fc_header_body(&h);
    *passed |= (h.flags & FC_HDR_NONFINITE) != 0;
    return FC_OK;
}

/* Validates a payload for chunk c and adds alpha * its decode to acc. */
static int decode_one(const fc_core *s, const fc_method *m, const fc_chunk *c, const uint8_t *p,
                      int64_t slot, int src, float alpha, float *acc, int *passed, fc_err *err)
{
    int64_t body = 0;
    m = payload_method(m, p, slot);
    int rc = check_payload(s, m, c, p, slot, src, &body, passed, err);
    if (rc != FC_OK)
        return rc;
    return m->decode_add(c, p + FC_HEADER_BYTES, body, alpha, acc, err);
}

static int64_t agg_bytes_of(const fc_method *m, const fc_chunk *c)
{
    return m->aggregate != NULL && m->agg_bytes != NULL ? m->agg_bytes(c) : 0;
}

/* Whether an fp32 output holds the shard's n values and shares no byte with the gradient: the
 * sum can then run in it. */
static int out_sums(const fc_buf *grad, const fc_buf *out, int64_t n)
{
    const uintptr_t o = (uintptr_t)out->data, g = (uintptr_t)grad->data;
    const uintptr_t o_end = o + (uintptr_t)out->numel * (uintptr_t)fc_dtype_size(out->dtype);
    const uintptr_t g_end = g + (uintptr_t)grad->numel * (uintptr_t)fc_dtype_size(grad->dtype);
    return out->dtype == FC_F32 && out->numel >= n && (o_end <= g || g_end <= o);
}

int fc_cpu_acc(fc_core *s, const fc_buf *grad, fc_buf *out, int64_t n, float **acc, fc_err *err)
{
    if (out_sums(grad, out, n)) {
        fc_memhint_fresh_output(out->data, (size_t)n * 4); /* before the sum first touches it */
        *acc = (float *)out->data;
        return FC_OK;
    }
    int rc = fc_core_grow_f32(&s->acc, &s->acc_cap, n, err);
    *acc = s->acc;
    return rc;
}

int fc_cpu_take_x(fc_core *s, int64_t n, fc_err *err)
{
    if (s->dec_call.open) { /* its running sum is in s->x: the call cannot go on */
        s->dec_call.open = 0;
        s->dec_call.lost = 1;
    }
    return fc_core_grow_f32(&s->x, &s->x_cap, n, err);
}

/* Checks the output against the shard of n elements and grows the method scratch for it. */
static int decode_scratch(fc_core *s, const fc_method *m, int64_t n, const fc_buf *out,
                          fc_err *err)
{
    if (out->numel < n)
        return fc_fail(err, FC_ERR_VALUE, "output has %lld elements, the shard needs %lld",
                       (long long)out->numel, (long long)n);
    if (m->scratch_bytes != NULL)
        return fc_core_grow(&s->mscr, &s->mscr_cap, m->scratch_bytes(s->cfg, n), err);
    return FC_OK;
}

/* The owner's picks for its chunk (c0) into s->picks, from the summed payloads in agg and
 * the exact own chunk `own`. */
static int pick_coordinates(fc_core *s, const fc_method *m, const fc_chunk *c0, const uint8_t *agg,
                            const fc_own *own, uint32_t unit, fc_err *err)
{
    const int64_t k = fc_core_fetch_k(s, m, c0->n);
    if (k > s->picks_cap) {
        uint32_t *p = (uint32_t *)realloc(s->picks, (size_t)k * 4);
        if (p == NULL)
            return fc_fail(err, FC_ERR_NOMEM, "could not allocate %lld picks", (long long)k);
        s->picks = p;
        s->picks_cap = k;
    }
    s->picks_unit = -1;
    if (k > 0) {
        int rc = m->pick(c0, agg, own, s->picks, err);
        if (rc != FC_OK)
            return rc;
    }
    s->n_picks = k;
    s->picks_unit = unit;
    return FC_OK;
}

/* Where a compressed-domain sum (agg, ab bytes) lies (fc_cpu_decode). The sum runs in s->x
 * (fc_cpu_take_x), the encode's working copy, free outside an encode call: no second
 * chunk-sized buffer is held. A compressed-domain sum takes s->x instead, and the values then
 * sum in an fp32 output itself (fc_cpu_acc) once every payload was taken: only the own chunk
 * and the one decode of agg go there, so a refused payload leaves the output as it was
 * (AGG_X; a second round's pick reads agg there too, the own chunk from the gradient). An
 * output that cannot hold that sum (bf16/fp16, or one that overlaps the gradient) gets it in
 * s->x: a method that decodes agg over itself (FC_AGG_IN_PLACE: dct, sketch, whose agg or
 * scratch are chunk-sized) keeps agg there, any other has it apart in s->acc, grown to its
 * own size only (at most 4 B per element: signsgd majority's counts). Within 8 B per element
 * either way. */
enum { AGG_NONE, AGG_X, AGG_IN_PLACE, AGG_APART };

static int agg_place(const fc_method *m, const fc_buf *grad, const fc_buf *out, int64_t n,
                     int64_t ab, int fetch)
{
    if (ab == 0)
        return AGG_NONE;
    if (fetch || out_sums(grad, out, n))
        return AGG_X;
    return m->flags & FC_AGG_IN_PLACE ? AGG_IN_PLACE : AGG_APART;
}

/* The floats s->x holds for the decode: the sum of n values, agg, or both over each other. */
static int64_t x_floats(int where, int64_t n, int64_t ab)
{
    const int64_t a = (ab + 3) / 4;
    return where == AGG_X ? a : where == AGG_IN_PLACE && a > n ? a : n;
}

/* The own chunk's NaN/Inf (the decode counts them once its call succeeds). */
static int64_t count_bad(const fc_buf *grad, int64_t start, int64_t n)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += !(fc_abs_bits(fc_core_elem_f32(grad->data, grad->dtype, start + i)) < FC_INF_BITS);
    return bad;
}

/* The sum of a compressed-domain decode into *acc: zeros, the own chunk, then the decode of
 * agg, the order the payload loop would have added them. In place (agg in s->x, the sum over
 * it), agg's decode comes first and the own chunk is added to it from the gradient: the same two
 * terms per element, and a + b = b + a in IEEE arithmetic (a zero's sign too: 0 + a is added
 * first either way); only a NaN's payload could differ, and the output writes the canonical
 * one. */
static int agg_combine(fc_core *s, const fc_method *m, const fc_chunk *c0, const fc_buf *grad,
                       fc_buf *out, int64_t start, int where, uint8_t *agg, int senders,
                       int own_exact, float **acc, int64_t *own_bad, fc_err *err)
{
    const int64_t n = c0->n;
    int rc;
    if (where == AGG_IN_PLACE) {
        *acc = s->x;
        if (senders == 0)
            memset(*acc, 0, (size_t)n * 4);
        else if ((rc = m->decode_agg(c0, agg, senders, 1.0f, *acc, err)) != FC_OK)
            return rc;
        if (own_exact)
            *own_bad = fc_cpu_add_own(s, grad, start, n, *acc);
        return FC_OK;
    }
    if (where == AGG_APART)
        *acc = s->x;
    else if ((rc = fc_cpu_acc(s, grad, out, n, acc, err)) != FC_OK)
        return rc;
    memset(*acc, 0, (size_t)n * 4);
    if (own_exact)
        *own_bad = fc_cpu_add_own(s, grad, start, n, *acc);
    if (senders > 0) /* one decode of the summed compressed payloads */
        return m->decode_agg(c0, agg, senders, 1.0f, *acc, err);
    return FC_OK;
}

int fc_cpu_decode(fc_core *s, const fc_exec *x, const fc_buf *recv, const fc_buf *grad,
                  fc_buf *out, int world, int rank, uint32_t unit, const int64_t *recvs,
                  fc_err *err)
{
    int rc = FC_OK;
    const int64_t N = grad->numel;
    const fc_method *m = fc_core_wire_method(s, N, world, grad->dtype);
    int64_t start, n;
    (void)x;
    fc_chunk_span(N, world, rank, &start, &n);
    FC_TRY(decode_scratch(s, m, n, out, err));
    const int varsize = (m->flags & FC_VARSIZE) != 0;
    float *ust;
    FC_TRY(fc_core_ustate(s, m, unit, &ust, err));
    fc_chunk c0 = fc_core_make_chunk(s, m, n, world, grad->dtype, unit, (uint32_t)rank, 0);
    c0.ustate = ust;
    const int64_t ab = n > 0 ? agg_bytes_of(m, &c0) : 0;
    int senders = 0;
    const int fetch = fc_core_fetch_kmax(s, N, world) > 0;
    int own_exact = 0; /* the own chunk is summed exact (a sender of nothing) */
    for (int r = 0; r < world && n > 0; r++)
        own_exact |= recvs[r] == 0;
    const int where = agg_place(m, grad, out, n, ab, fetch);
    uint8_t *agg = NULL;
    float *acc = NULL;
    FC_TRY(fc_cpu_take_x(s, x_floats(where, n, ab), err));
    if (where == AGG_APART) {
        FC_TRY(fc_core_grow_f32(&s->acc, &s->acc_cap, (ab + 3) / 4, err));
        agg = (uint8_t *)s->acc;
    } else if (where != AGG_NONE) {
        agg = (uint8_t *)s->x;
    }
    if (agg != NULL) {
        memset(agg, 0, (size_t)ab);
    } else {
        acc = s->x;
        memset(acc, 0, (size_t)n * 4);
    }
    /* Rank order, starting from zero: the same summation order on every rank and as a plain
     * sequential reference, so `none` is exact against it. */
    int64_t own_bad = 0; /* counted once the call succeeds */
    int passed = 0; /* a flagged payload */
    const uint8_t *p = (const uint8_t *)recv->data;
    const uint8_t *end = p + recv->numel;
    for (int r = 0; r < world; r++) {
        if (n == 0)
            break;
        if (recvs[r] == 0) { /* the own chunk, exact (with agg: once the payloads are in) */
            if (ab == 0)
                own_bad = fc_cpu_add_own(s, grad, start, n, acc);
            continue;
        }
        int64_t slot = varsize ? (int64_t)(end - p) : recvs[r], body = 0;
        const fc_method *pm = payload_method(m, p, slot); /* m, or `none` in its place */
        fc_chunk c = fc_core_make_chunk(s, pm, n, world, grad->dtype, unit, (uint32_t)rank, r);
        c.ustate = ust;
        FC_TRY(check_payload(s, pm, &c, p, slot, r, &body, &passed, err));
        if (ab > 0) {
            FC_TRY(m->aggregate(&c, agg, p + FC_HEADER_BYTES, body, err));
            senders++;
        } else {
            FC_TRY(pm->decode_add(&c, p + FC_HEADER_BYTES, body, 1.0f, acc, err));
        }
        p += varsize ? fc_align_up(FC_HEADER_BYTES + body) : recvs[r];
    }
    if (p != end && n > 0)
        return fc_fail(err, FC_ERR_PAYLOAD, "receive buffer has %lld bytes, its payloads use %lld",
                       (long long)recv->numel, (long long)(p - (const uint8_t *)recv->data));
    if (fetch) {
        /* a second round follows: pick the coordinates, write nothing yet (the output is not
         * written before the second round); the own chunk is read where it lies */
        const fc_own own = {own_exact ? grad->data : NULL, grad->dtype,
                            s->common.nonfinite == FC_NONFINITE_ZERO, start};
        FC_TRY(pick_coordinates(s, m, &c0, agg, &own, unit, err));
        s->ctr.nonfinite_in += ab > 0 && own_exact ? count_bad(grad, start, n) : own_bad;
        return FC_OK;
    }
    if (ab > 0)
        FC_TRY(agg_combine(s, m, &c0, grad, out, start, where, agg, senders, own_exact, &acc,
                           &own_bad, err));
    s->ctr.nonfinite_in += own_bad;
    fc_cpu_write_out(s, acc, n, world, out, passed, own_exact ? grad : NULL, start);
    return FC_OK;
error:
    return rc;
}

int fc_cpu_decode_part(fc_core *s, const fc_buf *payload, const fc_buf *grad, fc_buf *out,
                       int world, int rank, uint32_t unit, int src, int piece, fc_err *err)
{
    int rc = FC_OK;
    const double t0 = fc_core_now_s();
    const int64_t N = grad->numel;
    const fc_method *m = fc_core_wire_method(s, N, world, grad->dtype);
    fc_decode_call *d = &s->dec_call;
    const fc_call_key key = fc_core_call_key(s, unit, world, rank, N);
    if (src < 0 || src >= world)
        return fc_fail(err, FC_ERR_VALUE, "src must be in [0, %d), got %d", world, src);
    int64_t start, n;
    fc_chunk_span(N, world, rank, &start, &n);
    if (src == rank && piece == 0) { /* the own chunk opens the call: acc starts from it */
        d->open = 0;
        const char *why = fc_core_not_per_peer(s, m, N, world);
        if (why != NULL)
            return fc_fail(err, FC_ERR_VALUE, "method '%s' %s: decode all payloads at once with "
                           "decode()", m->name, why);
        FC_TRY(decode_scratch(s, m, n, out, err));
        FC_TRY(fc_core_ustate(s, m, unit, &d->ust, err));
        FC_TRY(fc_cpu_take_x(s, n, err)); /* the running sum, as decode's */
        d->acc = s->x;
        d->lost = 0;
        memset(d->acc, 0, (size_t)n * 4);
        d->key = key;
        d->k = d->piece = 0;
        d->passed = 0;
        d->own_exact = 0;
        d->own_bad = 0;
        /* every other rank sends this chunk cut the same way; the own one may be one exact part */
        d->parts = fc_core_chunk_parts(s, m, N, world, (rank + 1) % world, rank, &d->len);
        d->own_parts = fc_core_has_payload(s, N, world, rank, rank) ? d->parts : 1;
        d->open = 1;
    } else if (!d->open && d->lost) {
        return fc_fail(err, FC_ERR_STATE, "decode_part: an encode or decode call on this state ran "
                       "after the own chunk (src=%d) opened this one and took its running sum; "
                       "finish a unit's decode_part calls before the next call", rank);
    } else if (!d->open || !fc_core_same_call(&d->key, &key)) {
        return fc_fail(err, FC_ERR_STATE, "decode_part: the own chunk (src=%d) comes first, then "
                       "the others in cyclic order; got src=%d with no call open for unit %u",
                       rank, src, unit);
    }
    const int expected = (rank + d->k) % world;
    if (src != expected || piece != d->piece) /* a misordered part leaves the call as it was */
        return fc_fail(err, FC_ERR_STATE, "decode_part: parts come in cyclic order from the own "
                       "rank, each sender's pieces in order, so the sum is the same on every run; "
                       "expected src=%d piece %d, got src=%d piece %d", expected, d->piece, src,
                       piece);
    const int exact = src == rank && !fc_core_has_payload(s, N, world, rank, rank);
    const int64_t want = exact || n == 0 ? 0 : fc_core_piece_bytes(s, m, n, d->len, piece, grad->dtype);
    if (payload->numel != want)
        FC_TRY(fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d (piece %d) has %lld bytes, the "
                       "plan says %lld", src, piece, (long long)payload->numel, (long long)want));
    if (exact) {
        d->own_bad = fc_cpu_add_own(s, grad, start, n, d->acc);
        d->own_exact = 1;
    } else if (n > 0) {
        const int64_t a = piece * d->len, np = n - a < d->len ? n - a : d->len;
        const uint32_t id = (uint32_t)rank + (uint32_t)world * (uint32_t)piece;
        fc_chunk c = fc_core_make_chunk(s, m, np, world, grad->dtype, unit, id, src);
        c.ustate = d->ust;
        FC_TRY(decode_one(s, m, &c, (const uint8_t *)payload->data, want, src, 1.0f, d->acc + a,
                          &d->passed, err));
    }
    if (++d->piece == (src == rank ? d->own_parts : d->parts)) {
        d->piece = 0;
        d->k++;
    }
    if (d->k == world) {
        s->ctr.nonfinite_in += d->own_bad;
        fc_cpu_write_out(s, d->acc, n, world, out, d->passed, d->own_exact ? grad : NULL, start);
        d->open = 0;
    }
    s->ctr.decompress_s += fc_core_now_s() - t0;
    return FC_OK;
error:
    d->open = 0;
    return rc;
}

int64_t fc_cpu_add_own(const fc_core *s, const fc_buf *grad, int64_t start, int64_t n, float *acc)
{
    const int zero = s->common.nonfinite == FC_NONFINITE_ZERO;
    int64_t bad = 0;
    if (grad->dtype == FC_F32) {
        const float *g = (const float *)grad->data + start;
        for (int64_t i = 0; i < n; i++)
            bad += !(fc_abs_bits(g[i]) < FC_INF_BITS);
        if (!bad) {
            for (int64_t i = 0; i < n; i++)
                acc[i] += g[i];
            return 0;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        const float v = fc_core_elem_f32(grad->data, grad->dtype, start + i);
        if (fc_abs_bits(v) < FC_INF_BITS) {
            acc[i] += v;
            continue;
        }
        bad += grad->dtype != FC_F32; /* fp32 ones were counted above */
        acc[i] += zero ? 0.0f : fc_canon_nan(v);
    }
    return bad;
}

/* The outputs write_out left non-finite, fixed: where an input of the element's sum brought
 * NaN/Inf (fc_output_passes: a flagged payload, `passed`, or the own chunk's element in "pass"
 * mode, read from `own` at own_start + i) it goes through (a NaN as the canonical one, counted as
 * nonfinite_out); elsewhere acc overflowed from finite terms and the output saturates (Inf: the
 * dtype's largest value of its sign, NaN: 0). */
static void fix_out(fc_core *s, const float *acc, int64_t n, int world, fc_buf *out, int passed,
                    const fc_buf *own, int64_t own_start)
{
    const float w = (float)world;
    const int own_pass = own != NULL && s->common.nonfinite == FC_NONFINITE_PASS;
    const int in_place = acc == (const float *)out->data; /* write_out divided it already */
    for (int64_t i = 0; i < n; i++) {
        float v = in_place ? acc[i] : acc[i] / w;
        if (fc_abs_bits(v) < FC_INF_BITS)
            continue;
        const float g = own_pass ? fc_core_elem_f32(own->data, own->dtype, own_start + i) : 0.0f;
        v = fc_output_fix(v, fc_output_passes(passed, own_pass, g), &s->ctr.nonfinite_out,
                          &s->ctr.saturated);
        if (out->dtype == FC_F32)
            ((float *)out->data)[i] = v;
        else /* the narrow conversions saturate +-fp32 max and keep the canonical NaN */
            ((uint16_t *)out->data)[i] = out->dtype == FC_BF16 ? fc_f32_to_bf16(v) : fc_f32_to_f16(v);
    }
}

void fc_cpu_write_out(fc_core *s, const float *acc, int64_t n, int world, fc_buf *out, int passed,
                      const fc_buf *own, int64_t own_start)
{
    const float w = (float)world;
    int64_t bad = 0, sat = 0;
    fc_memhint_fresh_output(out->data, (size_t)n * (size_t)fc_dtype_size(out->dtype));
    if (out->dtype == FC_F32) {
        float *o = (float *)out->data;
        for (int64_t i = 0; i < n; i++) {
            o[i] = acc[i] / w;
            bad += !(fc_abs_bits(o[i]) < FC_INF_BITS);
        }
    } else {
        uint16_t *o = (uint16_t *)out->data;
        const int bf = out->dtype == FC_BF16;
        for (int64_t i = 0; i < n; i++) {
            const float v = acc[i] / w;
            bad += !(fc_abs_bits(v) < FC_INF_BITS);
            sat += bf ? fc_bf16_saturates(v) : fc_f16_saturates(v);
            o[i] = bf ? fc_f32_to_bf16(v) : fc_f32_to_f16(v);
        }
    }
    s->ctr.saturated += sat;
    if (bad)
        fix_out(s, acc, n, world, out, passed, own, own_start);
    /* FSDP pads `out` only when the shard is the padded one; anything past the shard is zero. */
    if (out->numel > n)
        memset((uint8_t *)out->data + n * fc_dtype_size(out->dtype), 0,
               (size_t)((out->numel - n) * fc_dtype_size(out->dtype)));
}

int fc_cpu_decompress(fc_core *s, const fc_exec *x, const fc_buf *payload, fc_buf *acc,
                      float alpha, uint32_t unit, uint32_t chunk, int world, fc_err *err)
{
    int rc = FC_OK;
    const fc_method *m = s->method;
    const int64_t n = acc->numel;
    (void)x;
    if (m->scratch_bytes != NULL)
        FC_TRY(fc_core_grow(&s->mscr, &s->mscr_cap, m->scratch_bytes(s->cfg, n), err));
    fc_chunk c = fc_core_make_chunk(s, m, n, world, FC_F32, unit, chunk, 0);
    FC_TRY(fc_core_ustate(s, m, unit, &c.ustate, err));
    int passed = 0; /* the caller sees NaN/Inf in acc itself */
    FC_TRY(decode_one(s, m, &c, (const uint8_t *)payload->data, payload->numel, 0, alpha,
                      (float *)acc->data, &passed, err));
    /* A payload that brought NaN/Inf (its header flagged): every NaN of acc as the canonical
     * one, as the device's adds write it. A method's add may make another (signsgd's -s of a NaN
     * scale is 0xffc00000), and the GPU's arithmetic makes 0x7fffffff of any NaN. A finite
     * payload adds no NaN to a finite acc, so the common case makes no second pass over acc. */
    if (passed) {
        float *a = (float *)acc->data;
        for (int64_t i = 0; i < n; i++)
            a[i] = fc_canon_nan(a[i]);
    }
    return FC_OK;
error:
    return rc;
}
