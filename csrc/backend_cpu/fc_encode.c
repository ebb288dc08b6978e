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
#include "methods/fc_simd.h"
#include "common/fc_wire.h"

extern const fc_method fc_method_none;

/* ---- dtype conversion loops (one per dtype so each vectorises) ---- */

static void load_f32(const void *src, int dt, int64_t off, int64_t n, float *dst)
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
        const float e = res == NULL ? 0.0f
                        : fc_core_ef_decay(s) * fc_core_elem_f32(res->data, res->dtype, start + i);
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
    } else {
        load_f32(grad->data, grad->dtype, start, n, x);
        if (res != NULL)
            add_f32(res->data, res->dtype, start, n, fc_core_ef_decay(s), x);
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
    int64_t full = fc_payload_bytes(s, m, c->n, c->wire_dtype);
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

static int64_t header_body_bytes(const uint8_t *p)
{
    fc_header h;
    memcpy(&h, p, sizeof(h));
    return (int64_t)fc_header_body(&h);
}

/* Sums of squares and products in double over 8 interleaved partial sums, combined in a fixed
 * order. One running sum is a loop-carried chain that -O3 may not reassociate, which made these
 * loops latency-bound: 3/4 of what error feedback cost per element. Statistics only: no payload
 * byte depends on them. */
FC_CLONES static double sum_sq_f32(const float *a, int64_t n)
{
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += (double)a[i + j] * (double)a[i + j];
    for (int j = 0; i < n; i++, j++)
        acc[j] += (double)a[i] * (double)a[i];
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* dst = e and ||e||^2 (as sum_sq_f32, the same lanes in the same order) in one pass, a block of
 * 2048 at a time: a block is stored only once the sum over it is finite (so is each of its e),
 * so from the first block that holds a NaN/Inf on, dst is still the old residual for
 * update_residual's rare path. Returns where that block starts: n when every block was stored,
 * *e_sq then their ||e||^2. */
FC_CLONES static int64_t store_sum_sq_f32(float *dst, const float *e, int64_t n, double *e_sq)
{
    double acc[8] = {0};
    for (int64_t lo = 0; lo < n; lo += 2048) {
        const int64_t hi = n - lo < 2048 ? n : lo + 2048;
        int64_t i = lo;
        for (; i + 8 <= hi; i += 8)
            for (int j = 0; j < 8; j++)
                acc[j] += (double)e[i + j] * (double)e[i + j];
        for (int j = 0; i < hi; i++, j++)
            acc[j] += (double)e[i] * (double)e[i];
        *e_sq = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
        if (!isfinite(*e_sq))
            return lo;
        memcpy(dst + lo, e + lo, (size_t)(hi - lo) * 4);
    }
    *e_sq = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    return n;
}

/* dots3 over x[0..n) into the lanes a, b, c (carried across blocks of a multiple of 8, the
 * tail only in the last): the same sums in the same order as one pass over the whole chunk. */
FC_CLONES static void dots3_lanes(const float *e, const float *x, int64_t n, double *a, double *b,
                                  double *c)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            const double ej = e[i + j], xj = x[i + j];
            a[j] += ej * ej;
            b[j] += xj * xj;
            c[j] += xj * ej;
        }
    for (int j = 0; i < n; i++, j++) {
        const double ej = e[i], xj = x[i];
        a[j] += ej * ej;
        b[j] += xj * xj;
        c[j] += xj * ej;
    }
}

/* ||e||^2, ||g'||^2 and g' . e (8 lanes, combined in a fixed order) with g' = g + d r loaded
 * again from the untouched gradient and residual (load_f32 then add_f32, the same float
 * operations), a block of 2048 at a time on the stack: no chunk-sized copy of g' is held for
 * the sampled calls. */
static void dots3_gprime(const fc_core *s, const float *e, const fc_buf *grad, const fc_buf *res,
                         int64_t start, int64_t n, double *ee, double *xx, double *xe)
{
    double a[8] = {0}, b[8] = {0}, c[8] = {0};
    float g[2048];
    for (int64_t lo = 0; lo < n; lo += 2048) {
        const int64_t len = n - lo < 2048 ? n - lo : 2048;
        load_f32(grad->data, grad->dtype, start + lo, len, g);
        add_f32(res->data, res->dtype, start + lo, len, fc_core_ef_decay(s), g);
        dots3_lanes(e + lo, g, len, a, b, c);
    }
    *ee = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    *xx = ((b[0] + b[1]) + (b[2] + b[3])) + ((b[4] + b[5]) + (b[6] + b[7]));
    *xe = ((c[0] + c[1]) + (c[2] + c[3])) + ((c[4] + c[5]) + (c[6] + c[7]));
}

/* Stores e (n fp32 values) as the residual in res's dtype, a bf16 one saturated (*sat). */
static void store_residual(fc_buf *res, int64_t start, const float *e, int64_t n, int64_t *sat)
{
    if (res->dtype == FC_F32) {
        memcpy((float *)res->data + start, e, (size_t)n * 4);
        return;
    }
    uint16_t *r = (uint16_t *)res->data + start;
    for (int64_t i = 0; i < n; i++) {
        *sat += fc_bf16_saturates(e[i]);
        r[i] = fc_f32_to_bf16(e[i]);
    }
}

/* g' of element k as load_chunk made it: g + d e, NaN/Inf fixed by fc_gprime_fix (no count: the
 * load counted them). The residual's rare path reads it again where the decode overwrote it. */
static float gprime_at(const fc_core *s, const fc_buf *grad, const fc_buf *res, int64_t k)
{
    const float g = fc_core_elem_f32(grad->data, grad->dtype, k);
    const float e = res == NULL ? 0.0f : fc_core_ef_decay(s) * fc_core_elem_f32(res->data, res->dtype, k);
    const float x = res == NULL ? g : g + e;
    int64_t bad = 0, sat = 0;
    return fc_abs_bits(x) < FC_INF_BITS
               ? x
               : fc_gprime_fix(x, g, e, s->common.nonfinite == FC_NONFINITE_ZERO, &bad, &sat);
}

/* The residual's rare path: the elements of e = s->x (g' + -D, in place) from `from` on that came
 * out NaN/Inf, decided one by one (fc_residual_nonfinite) from g' read again (gprime_at: res
 * still holds the old residual there) and D decoded into zeros (in s->acc, a decode's accumulator,
 * free within an encode call: grown only here, for sample_error's samples and for a bf16/fp16
 * output's compressed-domain sum, so the common path holds no second chunk-sized copy). */
static int fix_residual(fc_core *s, const fc_method *m, const fc_chunk *c, const uint8_t *p,
                        const fc_buf *grad, const fc_buf *res, int64_t start, int64_t from,
                        int64_t *sat, fc_err *err)
{
    int rc = fc_core_grow_f32(&s->acc, &s->acc_cap, c->n, err);
    if (rc != FC_OK)
        return rc;
    float *d = s->acc, *e = s->x;
    memset(d, 0, (size_t)c->n * 4);
    rc = m->decode_add(c, p + FC_HEADER_BYTES, header_body_bytes(p), 1.0f, d, err);
    if (rc != FC_OK)
        return rc;
    for (int64_t i = from; i < c->n; i++)
        if (!(fc_abs_bits(e[i]) < FC_INF_BITS))
            e[i] = fc_residual_nonfinite(gprime_at(s, grad, res, start + i), -d[i], e[i], sat);
    return FC_OK;
}

/* After encode, turns s->x into e = g' - D(C(g')) by fc_range.h's per-element rule (fc_residual:
 * the decode added in place, alpha = -1; where that came out NaN/Inf, fix_residual) and stores
 * it; returns ||e||^2. With `dots` (the sampled calls), also ||g'||^2 and g' . e, for which g'
 * is loaded again from the untouched inputs; the other calls skip that pass. A residual is
 * always finite. */
static int update_residual(fc_core *s, const fc_method *m, const fc_chunk *c, const uint8_t *p,
                           const fc_buf *grad, fc_buf *res, int64_t start, int dots,
                           double *e_sq, double *x_sq, double *x_dot_e, fc_err *err)
{
    *x_sq = *x_dot_e = 0;
    int rc = m->decode_add(c, p + FC_HEADER_BYTES, header_body_bytes(p), -1.0f, s->x, err);
    if (rc != FC_OK)
        return rc;
    const int64_t n = c->n;
    int64_t sat = 0;
    if (!dots && res->dtype == FC_F32) { /* stored as it is summed, up to a NaN/Inf */
        const int64_t from = store_sum_sq_f32((float *)res->data + start, s->x, n, e_sq);
        if (from == n)
            return FC_OK;
        FC_TRY(fix_residual(s, m, c, p, grad, res, start, from, &sat, err));
        *e_sq = sum_sq_f32(s->x, n);
        memcpy((float *)res->data + start + from, s->x + from, (size_t)(n - from) * 4);
        s->ctr.saturated += sat;
        return FC_OK;
    }
    if (dots) { /* g' again, from the inputs, to pair it with e */
        dots3_gprime(s, s->x, grad, res, start, n, e_sq, x_sq, x_dot_e);
    } else {
        *e_sq = sum_sq_f32(s->x, n);
    }
    if (!isfinite(*e_sq)) { /* rare: ||e||^2 is finite exactly when every e is */
        FC_TRY(fix_residual(s, m, c, p, grad, res, start, 0, &sat, err));
        *e_sq = sum_sq_f32(s->x, n);
        if (dots) /* the fixed e against g' once more */
            dots3_gprime(s, s->x, grad, res, start, n, e_sq, x_sq, x_dot_e);
    }
    store_residual(res, start, s->x, n, &sat);
    s->ctr.saturated += sat;
    return FC_OK;
error:
    return rc;
}

/* Without error feedback: decode into scratch and compare, on the sampled calls only. The
 * decode goes to s->x where g' was read in place from the gradient (the common case: s->x is
 * then free), else into s->acc (a decode's accumulator, free within an encode call), grown for
 * it. */
static int sample_error(fc_core *s, const fc_method *m, const fc_chunk *c, const float *xs,
                        const uint8_t *p, fc_err *err)
{
    float *dec = s->x;
    if (xs == s->x) {
        int rc = fc_core_grow_f32(&s->acc, &s->acc_cap, c->n, err);
        if (rc != FC_OK)
            return rc;
        dec = s->acc;
    }
    memset(dec, 0, (size_t)c->n * 4);
    int rc = m->decode_add(c, p + FC_HEADER_BYTES, header_body_bytes(p), 1.0f, dec, err);
    if (rc != FC_OK)
        return rc;
    double dd = 0, xx = 0, xd = 0, ee = 0;
    for (int64_t i = 0; i < c->n; i++) {
        double x = xs[i], d = dec[i];
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

/* The CPU's scratch for the open call s->enc, grown for its largest chunk, the unit's method
 * state and, for the per-peer parts (`pieces`), the call's layout. */
static int encode_scratch(fc_core *s, const fc_buf *grad, int world, int rank, int pieces,
                          fc_err *err)
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
        FC_TRY(update_residual(s, wm, &c, p, grad, residual, start, dots, &ee, &xx, &xe, err));
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
        FC_TRY(sample_error(s, wm, &c, x, p, err));
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
    FC_TRY(encode_scratch(s, grad, k.world, k.rank, 0, err));
    uint8_t *out = (uint8_t *)send->data;
    int64_t off = 0;
    for (int ci = 0; ci < k.world; ci++) {
        if (!fc_core_has_payload(s, grad->numel, k.world, k.rank, ci))
            continue;
        int64_t start, n;
        fc_chunk_span(grad->numel, k.world, ci, &start, &n);
        FC_TRY(encode_chunk(s, grad, residual, ci, 0, n, out + off, send->numel - off, &sent[ci],
                            err));
        off += sent[ci].size;
    }
error:
    return rc;
}

int fc_cpu_encode_parts_open(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_err *err)
{
    (void)x;
    return encode_scratch(s, grad, s->enc.key.world, s->enc.key.rank, 1, err);
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
        FC_TRY(update_residual(s, wm, &c, (const uint8_t *)payload->data, in, residual, 0, 0, &ee,
                               &xx, &xe, err));
    }
    return FC_OK;
error:
    return rc;
}
