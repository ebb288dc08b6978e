/* fc_encode.c: the CPU backend's encode: g' = g + e, payloads and headers, the residual update
 * and the error statistics (fc_cpu_encode, the per-peer parts, compress()); the driver
 * (fc_drive.c) decides and counts around it for CPU and CUDA tensors alike. */
#include "backend_cpu/fc_cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/fc_half.h"
#include "backend_cpu/fc_memhint.h"
#include "common/fc_quant.h"
#include "common/fc_range.h"
#include "common/fc_res8.h"
#include "methods/fc_simd.h"
#include "common/fc_wire.h"

extern const fc_method fc_method_none;

/* ---- dtype conversion loops (one per dtype so each vectorises) ---- */

void fc_cpu_load_f32(const void *src, int dt, int64_t off, int64_t n, float *dst)
{
    if (dt == FC_F32) {
        memcpy(dst, (const float *)src + off, (size_t)n * 4);
    } else if (dt == FC_BF16) {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] = fc_bf16_to_f32(s[i]);
    } else {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] = fc_f16_to_f32(s[i]);
    }
}

/* dst += d * src: a residual's decay d (`ef_decay`) times it; d = 1 is exact (x * 1 = x). */
static void add_f32(const void *src, int dt, int64_t off, int64_t n, float d, float *dst)
{
    if (dt == FC_F32) {
        const float *s = (const float *)src + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] += d * s[i];
    } else {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] += d * (dt == FC_BF16 ? fc_bf16_to_f32(s[i]) : fc_f16_to_f32(s[i]));
    }
}

/* A residual's element k: an 8-bit one's code * scale (fc_res8.h), read where it is packed. */
float fc_cpu_res_at(const fc_buf *r, int64_t k)
{
    return r->dtype == FC_U8 ? fc_cpu_res8_at(r, k) : fc_core_elem_f32(r->data, r->dtype, k);
}

void fc_cpu_res_add(const fc_buf *r, int64_t off, int64_t n, float d, float *dst)
{
    if (r->dtype == FC_U8)
        fc_cpu_res8_add(r, off, n, d, dst);
    else
        add_f32(r->data, r->dtype, off, n, d, dst);
}

/* ---- encode ---- */

/* x = g + d r, counting the non-finite results: error feedback's load in one pass (the same
 * float operations as load_f32 then add_f32). */
FC_CLONES static int64_t load_sum_f32(const float *g, const float *r, int64_t n, float d, float *x)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = g[i] + d * r[i];
        bad += !(fc_abs_bits(x[i]) < 0x7f800000u);
    }
    return bad;
}

/* The elements of x = g (+ e) that are not finite, fixed in place by fc_gprime_fix: a sum of
 * two finite values saturates (*sat); NaN/Inf of the gradient (a residual never holds one)
 * become e in "zero" mode, so the residual still goes out, and stay in "pass" mode, a NaN as the
 * canonical one. Returns how many the input held. */
static int64_t fix_nonfinite(const fc_core *s, const fc_buf *grad, const fc_buf *res,
                             int64_t start, int64_t n, float *x, int64_t *sat)
{
    int64_t bad = 0;
    const int zero = s->common.nonfinite == FC_NONFINITE_ZERO;
    for (int64_t i = 0; i < n; i++) {
        if (fc_abs_bits(x[i]) < FC_INF_BITS)
            continue;
        const float g = fc_core_elem_f32(grad->data, grad->dtype, start + i);
        const float e = res == NULL ? 0.0f : fc_core_ef_decay(s) * fc_cpu_res_at(res, start + i);
        x[i] = fc_gprime_fix(x[i], g, e, zero, &bad, sat);
    }
    return bad;
}

/* g' = g (+ e) for one chunk: *bad counts the non-finite values the input held (zeroed in "zero"
 * mode, a canonical NaN in "pass" mode), *sat the sums that overflowed (saturated). An fp32
 * gradient without a residual and without NaN/Inf is encoded in place, read-only: no copy on
 * the common path. Returns where g' lies (s->x or the gradient itself). */
static const float *load_chunk(fc_core *s, const fc_buf *grad, const fc_buf *res, int64_t start,
                               int64_t n, int64_t *bad, int64_t *sat)
{
    int64_t nf = 0;
    *bad = *sat = 0;
    if (res == NULL && grad->dtype == FC_F32) {
        const float *g = (const float *)grad->data + start;
        for (int64_t i = 0; i < n; i++)
            nf += !(fc_abs_bits(g[i]) < FC_INF_BITS);
        if (!nf)
            return g;
    }
    float *x = s->x;
    if (res != NULL && grad->dtype == FC_F32 && res->dtype == FC_F32) {
        nf = load_sum_f32((const float *)grad->data + start, (const float *)res->data + start, n,
                          fc_core_ef_decay(s), x);
    } else if (res != NULL && grad->dtype == FC_F32 && res->dtype == FC_U8) {
        nf = fc_cpu_res8_load_sum((const float *)grad->data + start, res, start, n,
                                  fc_core_ef_decay(s), x);
    } else {
        fc_cpu_load_f32(grad->data, grad->dtype, start, n, x);
        if (res != NULL)
            fc_cpu_res_add(res, start, n, fc_core_ef_decay(s), x);
        nf = 0;
        for (int64_t i = 0; i < n; i++)
            nf += !(fc_abs_bits(x[i]) < FC_INF_BITS);
    }
    if (nf)
        *bad = fix_nonfinite(s, grad, res, start, n, x, sat);
    return x;
}

static void write_header(uint8_t *p, const fc_core *s, const fc_method *m, const fc_chunk *c,
                         int64_t body, unsigned flags)
{
    const fc_header_key k = fc_core_header_key(s, m, c);
    fc_header h;
    fc_header_make(&h, &k, (uint64_t)c->n, (uint64_t)body, flags);
    memcpy(p, &h, sizeof(h));
}

/* Encodes x (c->n values) as one payload at p; returns its padded size in *size and the method
 * it was written with in *wm: m, or (with `fallback`, in a collective) `none` where a
 * data-dependent payload would have been no smaller than `none`'s (the receiver reads which
 * from the header). flags: the header's FC_HDR_* (whether NaN/Inf of the input went on the
 * wire). */
static int encode_one(fc_core *s, const fc_method *m, const fc_chunk *c, const float *x, uint8_t *p,
                      int64_t cap, int fallback, unsigned flags, int64_t *size, fc_layout *used,
                      const fc_method **wm, fc_err *err)
{
    int64_t full = fc_core_chunk_bytes(s, m, c);
    *wm = m;
    if (full > cap)
        return fc_fail(err, FC_ERR_VALUE, "payload buffer holds %lld bytes, need %lld",
                       (long long)cap, (long long)full);
    memset(used, 0, sizeof(*used));
    int rc = m->encode(c, x, p + FC_HEADER_BYTES, used, err);
    if (rc != FC_OK)
        return rc;
    int64_t body = fc_layout_bytes(used);
    /* a data-dependent body is as long as it is: payloads are packed back to back */
    if (m->flags & FC_VARSIZE) {
        full = fc_align_up(FC_HEADER_BYTES + body);
        const int64_t plain = fc_payload_bytes(s, &fc_method_none, c->n, c->wire_dtype);
        /* most values passed: exact values cost less */
        if (fc_chunk_falls_back(fallback, full, plain)) {
            fc_chunk cn = *c;
            cn.cfg = NULL;
            if ((rc = fc_method_none.encode(&cn, x, p + FC_HEADER_BYTES, used, err)) != FC_OK)
                return rc;
            m = *wm = &fc_method_none;
            body = fc_layout_bytes(used);
            full = plain;
        }
    }
    if (FC_HEADER_BYTES + body > full)
        return fc_fail(err, FC_ERR_STATE, "internal: %s wrote %lld body bytes past its layout's %lld",
                       m->name, (long long)body, (long long)(full - FC_HEADER_BYTES));
    write_header(p, s, m, c, body, flags);
    int64_t end = FC_HEADER_BYTES + body;
    memset(p + end, 0, (size_t)(full - end)); /* padding: no uninitialised bytes on the wire */
    *size = full;
    return FC_OK;
}

int64_t fc_cpu_body_bytes(const uint8_t *p)
{
    fc_header h;
    memcpy(&h, p, sizeof(h));
    return (int64_t)fc_header_body(&h);
}

/* Without error feedback: decode into scratch and compare, on the sampled calls only. The
 * decode goes to s->x: where g' was read in place from the gradient (the common case) s->x is
 * free; where s->x holds a copy (a bf16/fp16 gradient, a NaN/Inf fixed), that copy is a pure
 * function of the gradient (load_chunk's rules, no residual), so each g' is read again from
 * the gradient beside the decode instead of keeping a second chunk-sized buffer. */
static int sample_error(fc_core *s, const fc_method *m, const fc_chunk *c, const float *xs,
                        const uint8_t *p, const fc_buf *grad, int64_t start, fc_err *err)
{
    const int again = xs == s->x;
    float *dec = s->x;
    memset(dec, 0, (size_t)c->n * 4);
    int rc = m->decode_add(c, p + FC_HEADER_BYTES, fc_cpu_body_bytes(p), 1.0f, dec, err);
    if (rc != FC_OK)
        return rc;
    double dd = 0, xx = 0, xd = 0, ee = 0;
    for (int64_t i = 0; i < c->n; i++) {
        double x = again ? fc_cpu_gprime_at(s, grad, NULL, start + i) : xs[i], d = dec[i];
        xx += x * x;
        dd += d * d;
        xd += x * d;
        ee += (x - d) * (x - d);
    }
    if (fc_sample_counts(0, ee, xx)) { /* no error feedback: finite sums only */
        s->ctr.err_sq += ee;
        s->ctr.ref_sq += xx;
        s->ctr.cos_sum += fc_sample_cos(xx, dd, xd);
        s->ctr.stats_samples++;
    }
    return FC_OK;
}

/* The blocks of 64 of an 8-bit residual that the call's part boundaries cut: chunk starts, and
 * with `pieces` the starts of the pieces too (ascending, so a block cut twice counts once). */
static int64_t cut_blocks(const fc_core *s, const fc_method *m, int64_t N, int world, int rank,
                          int pieces)
{
    int64_t cut = 0, last = -1;
    for (int c = 0; c < world; c++) {
        int64_t start, n, len = 0;
        fc_chunk_span(N, world, c, &start, &n);
        const int parts = pieces ? fc_core_chunk_parts(s, m, N, world, rank, c, &len) : 1;
        for (int p = 0; p < parts; p++) {
            const int64_t at = start + p * len;
            if (at > 0 && at < N && at % FC_RES8_BLOCK != 0 && at / FC_RES8_BLOCK != last) {
                last = at / FC_RES8_BLOCK;
                cut++;
            }
        }
    }
    return cut;
}

/* Whether the open call packs an 8-bit residual in place. */
static int packs_res8(const fc_core *s, const fc_buf *residual)
{
    return s->enc.use_ef && residual != NULL && residual->dtype == FC_U8;
}

/* The cut blocks an 8-bit residual's carry holds at once in the per-peer parts of _exchange.py's
 * order (chunks rank - 1, rank - 2, ... then the own one, a chunk's pieces in order): the own
 * chunk's two ends (kept at open, or encoded last) and the head of the chunk being encoded,
 * whatever W. Another order may need more: fc_res8.c adds slots then (grow-only). */
#define RES8_OPEN_PARTS 3

/* The CPU's scratch for the open call s->enc, grown for its largest chunk, the unit's method
 * state, an 8-bit residual's carry and, for the per-peer parts (`pieces`), the call's layout.
 * The whole encode writes its chunks in order, so one block at a time is staged; the parts may
 * come in any order (RES8_OPEN_PARTS). */
static int encode_scratch(fc_core *s, const fc_buf *grad, const fc_buf *residual, int world,
                          int rank, int pieces, fc_err *err)
{
    int rc = FC_OK;
    fc_encode_call *e = &s->enc;
    const int64_t N = grad->numel;
    const fc_method *m = e->method;
    const int64_t per = fc_chunk_per(N, world);
    FC_TRY(fc_cpu_take_x(s, per, err));
    if (m->scratch_bytes != NULL)
        FC_TRY(fc_core_grow(&s->mscr, &s->mscr_cap, m->scratch_bytes(s->cfg, per), err));
    FC_TRY(fc_core_ustate(s, m, e->key.unit, &e->ust, err));
    if (packs_res8(s, residual)) { /* at most RES8_OPEN_PARTS cut blocks open in FSDP's order */
        const int64_t cut = cut_blocks(s, m, N, world, rank, pieces);
        const int64_t most = pieces ? RES8_OPEN_PARTS : 1;
        FC_TRY(fc_cpu_res8_open(s, cut < most ? cut : most, err));
    }
    e->todo = world;
    if (pieces) { /* the per-peer layout, once per call: every part then finds its slot in O(1) */
        e->todo = 0;
        e->at[0] = 0;
        for (int c = 0; c < world; c++) {
            int64_t len;
            e->todo += fc_core_chunk_parts(s, m, N, world, rank, c, &len);
            e->at[c + 1] = e->at[c] + fc_core_chunk_part_bytes(s, m, N, grad->dtype, world, rank, c);
        }
    }
    e->open = 1;
    return FC_OK;
error:
    return rc;
}

/* Encodes piece `piece` (of `len` elements each) of chunk ci of the open call into p (cap bytes):
 * g' = g (+ e), the payload, the residual update and, on a sampled call, the error statistics
 * of the first piece encoded. A whole chunk is piece 0 of its own length. */
static int encode_chunk(fc_core *s, const fc_buf *grad, fc_buf *residual, int ci, int piece,
                        int64_t len, uint8_t *p, int64_t cap, fc_sent *out, fc_err *err)
{
    int rc = FC_OK;
    fc_encode_call *e = &s->enc;
    const fc_method *m = e->method;
    int64_t start, n;
    fc_chunk_span(e->key.numel, e->key.world, ci, &start, &n);
    start += piece * len;
    n = n - piece * len < len ? n - piece * len : len;
    /* piece 0 has the chunk's own stream: one piece is exactly the whole-chunk encode */
    const uint32_t id = (uint32_t)ci + (uint32_t)e->key.world * (uint32_t)piece;
    fc_chunk c = fc_core_make_chunk(s, m, n, e->key.world, grad->dtype, e->key.unit, id, e->key.rank);
    c.scratch = s->mscr;
    c.ustate = e->ust;
    int64_t bad, sat;
    const float *x = load_chunk(s, grad, e->use_ef ? residual : NULL, start, n, &bad, &sat);
    s->ctr.nonfinite_in += bad;
    s->ctr.saturated += sat;
    /* "pass": NaN/Inf went on the wire, and the receivers are told so (write_out) */
    const int passed = fc_chunk_passes(bad, s->common.nonfinite == FC_NONFINITE_ZERO);
    const fc_method *wm; /* m, or `none` for a data-dependent payload that fell back */
    FC_TRY(encode_one(s, m, &c, x, p, cap, 1, passed ? FC_HDR_NONFINITE : 0u, &out->size, &out->l,
                      &wm, err));
    out->none = wm != m; /* the driver counts the payload */
    if (e->use_ef) { /* a residual is always replaced: the old one went out inside g' */
        const int dots = e->stats && fc_sample_picks(e->sampled, passed);
        double ee, xx, xe;
        FC_TRY(fc_cpu_update_residual(s, wm, &c, p, grad, residual, start, dots, &ee, &xx, &xe, err));
        e->e_sq += ee;
        if (dots) { /* D = x - e: ||x - D||^2 = ||e||^2 */
            s->ctr.err_sq += ee;
            s->ctr.ref_sq += xx;
            s->ctr.cos_sum += fc_sample_cos_of_residual(ee, xx, xe);
            s->ctr.stats_samples++;
            e->sampled = 1;
        }
    } else if (e->sample && fc_sample_picks(e->sampled, passed)) {
        /* "zero" mode's chunk is finite now */
        FC_TRY(sample_error(s, wm, &c, x, p, grad, start, err));
        e->sampled = 1;
    }
    return FC_OK;
error:
    return rc;
}

int fc_cpu_encode(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *send,
                  fc_buf *residual, fc_sent *sent, fc_err *err)
{
    int rc = FC_OK;
    const fc_call_key k = s->enc.key;
    (void)x;
    FC_TRY(encode_scratch(s, grad, residual, k.world, k.rank, 0, err));
    const int packed = packs_res8(s, residual);
    uint8_t *out = (uint8_t *)send->data;
    int64_t off = 0;
    for (int ci = 0; ci < k.world; ci++) {
        int64_t start, n;
        fc_chunk_span(grad->numel, k.world, ci, &start, &n);
        if (!fc_core_has_payload(s, grad->numel, k.world, k.rank, ci)) {
            if (packed) /* in its turn: the chunks' blocks fill in order */
                FC_TRY(fc_cpu_res8_keep(s, residual, start, n, err));
            continue;
        }
        FC_TRY(encode_chunk(s, grad, residual, ci, 0, n, out + off, send->numel - off, &sent[ci],
                            err));
        off += sent[ci].size;
    }
    if (packed)
        FC_TRY(fc_cpu_res8_close(s, err));
error:
    return rc;
}

/* The parts' call opened; an 8-bit residual's chunks that no part encodes (the own one, kept
 * exact) are rounded again now, as the whole encode does: no later part reads them. */
int fc_cpu_encode_parts_open(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *residual,
                             fc_err *err)
{
    int rc = FC_OK;
    const fc_call_key k = s->enc.key;
    (void)x;
    FC_TRY(encode_scratch(s, grad, residual, k.world, k.rank, 1, err));
    for (int ci = 0; packs_res8(s, residual) && ci < k.world; ci++) {
        int64_t start, n;
        fc_chunk_span(grad->numel, k.world, ci, &start, &n);
        if (!fc_core_has_payload(s, grad->numel, k.world, k.rank, ci))
            FC_TRY(fc_cpu_res8_keep(s, residual, start, n, err));
    }
error:
    return rc;
}

int fc_cpu_encode_piece(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *residual,
                        int chunk, int piece, int64_t len, uint8_t *p, int64_t cap, fc_sent *out,
                        fc_err *err)
{
    (void)x;
    return encode_chunk(s, grad, residual, chunk, piece, len, p, cap, out, err);
}

/* ---- single chunk, for tests and benchmarks ---- */

int fc_cpu_compress(fc_core *s, const fc_exec *ex, const fc_buf *in, fc_buf *payload,
                    fc_buf *residual, uint32_t unit, uint32_t chunk, int world, int rank,
                    int64_t *written, fc_err *err)
{
    int rc = FC_OK;
    const fc_method *m = s->method;
    const float *x = (const float *)in->data;
    const int64_t n = in->numel;
    (void)ex;
    if (m->scratch_bytes != NULL)
        FC_TRY(fc_core_grow(&s->mscr, &s->mscr_cap, m->scratch_bytes(s->cfg, n), err));
    FC_TRY(fc_cpu_take_x(s, n, err));
    fc_chunk c = fc_core_make_chunk(s, m, n, world, FC_F32, unit, chunk, rank);
    FC_TRY(fc_core_ustate(s, m, unit, &c.ustate, err));
    fc_layout used;
    const fc_method *wm;
    unsigned flags = 0;
    int64_t bad = 0, sat = 0;
    if (residual != NULL) { /* g' = x + e by the collective's rules; NaN/Inf not counted */
        x = load_chunk(s, in, residual, 0, n, &bad, &sat);
        s->ctr.saturated += sat;
        bad = bad != 0 && s->common.nonfinite == FC_NONFINITE_PASS; /* went on the wire */
    } else {
        for (int64_t i = 0; i < n; i++)
            bad += !(fc_abs_bits(x[i]) < FC_INF_BITS);
        if (bad) { /* x is read in place, unless a NaN must become the canonical one first */
            for (int64_t i = 0; i < n; i++)
                s->x[i] = fc_canon_nan(x[i]);
            x = s->x;
        }
    }
    if (bad)
        flags = FC_HDR_NONFINITE;
    FC_TRY(encode_one(s, m, &c, x, (uint8_t *)payload->data, payload->numel, 0, flags, written,
                      &used, &wm, err));
    s->ctr.saturated += used.saturated;
    if (residual != NULL) { /* e = g' - D(C(g')), always finite (s->x holds g') */
        double ee, xx, xe;
        FC_TRY(fc_cpu_update_residual(s, wm, &c, (const uint8_t *)payload->data, in, residual, 0, 0, &ee,
                               &xx, &xe, err));
    }
    return FC_OK;
error:
    return rc;
}
