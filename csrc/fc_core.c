/* fc_core.c: the driver of the compressed reduce-scatter on the CPU, method-agnostic. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "fc_core.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fc_half.h"
#include "fc_memhint.h"
#include "fc_quant.h"
#include "fc_range.h"
#include "fc_simd.h"
#include "fc_wire.h"

extern const fc_method fc_method_none;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

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

static float elem_f32(const void *src, int dt, int64_t i)
{
    if (dt == FC_F32)
        return ((const float *)src)[i];
    const uint16_t h = ((const uint16_t *)src)[i];
    return dt == FC_BF16 ? fc_bf16_to_f32(h) : fc_f16_to_f32(h);
}

static void add_f32(const void *src, int dt, int64_t off, int64_t n, float *dst)
{
    if (dt == FC_F32) {
        const float *s = (const float *)src + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] += s[i];
    } else {
        const uint16_t *s = (const uint16_t *)src + off;
        for (int64_t i = 0; i < n; i++)
            dst[i] += dt == FC_BF16 ? fc_bf16_to_f32(s[i]) : fc_f16_to_f32(s[i]);
    }
}

/* ---- lifetime ---- */

void fc_core_init(fc_core *s, const fc_method *m, const fc_common *common, const void *cfg,
                  uint32_t fingerprint)
{
    memset(s, 0, sizeof(*s));
    s->method = m;
    s->common = *common;
    s->fingerprint = fingerprint;
    s->picks_unit = s->bad_unit = -1;
    memcpy(s->cfg, cfg, m->cfg_size);
}

void fc_core_free_unit_states(fc_core *s)
{
    s->enc.open = s->dec_call.open = 0; /* their unit state pointers go with the table */
    for (int32_t u = 0; u < s->n_units; u++) {
        free(s->units[u].ustate);
        s->units[u].ustate = NULL;
    }
}

void fc_core_free(fc_core *s)
{
    if (s->units != NULL)
        fc_core_free_unit_states(s);
    free(s->loose);
    s->loose = NULL;
    free(s->units);
    free(s->x);
    free(s->acc);
    free(s->dec);
    free(s->mscr);
    free(s->agg);
    free(s->picks);
    s->picks = NULL;
    s->picks_cap = s->n_picks = 0;
    s->picks_unit = s->bad_unit = -1;
    s->agg = NULL;
    s->agg_cap = 0;
    s->units = NULL;
    s->x = s->acc = s->dec = NULL;
    s->mscr = NULL;
    s->n_units = s->cap_units = 0;
    s->x_cap = s->acc_cap = s->dec_cap = 0;
    s->mscr_cap = 0;
}

/* Grows a reusable buffer; buffers only grow, so steady-state calls never allocate. */
static int grow(void **p, size_t *cap, size_t need, fc_err *err)
{
    if (need <= *cap)
        return FC_OK;
    size_t want = need + need / 4 + 64;
    want = (want + 63) / 64 * 64;
    void *q = aligned_alloc(64, want);
    if (q == NULL)
        return fc_fail(err, FC_ERR_NOMEM, "could not allocate %zu bytes of scratch", want);
    free(*p);
    *p = q;
    *cap = want;
    return FC_OK;
}

static int grow_f32(float **p, int64_t *cap, int64_t n, fc_err *err)
{
    size_t c = (size_t)*cap * 4;
    int rc = grow((void **)p, &c, (size_t)(n > 0 ? n : 1) * 4, err);
    *cap = (int64_t)(c / 4);
    return rc;
}

/* The unit's method state, created (identically on every rank) at first use. */
static int unit_state(fc_core *s, const fc_method *m, uint32_t unit, float **out, fc_err *err)
{
    *out = NULL;
    if (m->unit_floats == NULL)
        return FC_OK;
    float **slot;
    if ((int32_t)unit < s->n_units) {
        slot = &s->units[unit].ustate;
    } else { /* compress()/decompress() of a unit the collective has not seen */
        if (s->loose != NULL && s->loose_unit != (int64_t)unit) {
            free(s->loose);
            s->loose = NULL;
        }
        slot = &s->loose;
        s->loose_unit = unit;
    }
    if (*slot == NULL) {
        int64_t nf = m->unit_floats(s->cfg);
        float *p = (float *)calloc((size_t)nf, 4);
        if (p == NULL)
            return fc_fail(err, FC_ERR_NOMEM, "could not allocate %lld floats of unit state",
                           (long long)nf);
        uint64_t seed = (uint64_t)s->common.seed;
        fc_rng r = {(uint32_t)seed, (uint32_t)(seed >> 32), 0xFFFFFFFFu, unit, 0xFFFFFFFFu};
        m->unit_init(s->cfg, p, &r);
        *slot = p;
    }
    *out = *slot;
    return FC_OK;
}

int fc_core_unit_state(fc_core *s, uint32_t unit, float **out, fc_err *err)
{
    *out = NULL;
    if ((int32_t)unit >= s->n_units)
        return fc_fail(err, FC_ERR_VALUE, "unit %u was never begun", unit);
    return unit_state(s, fc_core_unit_method(s, s->units[unit].numel), unit, out, err);
}

int fc_core_single_state(fc_core *s, uint32_t unit, float **out, fc_err *err)
{
    return unit_state(s, s->method, unit, out, err);
}

void fc_core_sync_span(fc_core *s, uint32_t unit, float **data, int64_t *len)
{
    *data = NULL;
    *len = 0;
    if ((int32_t)unit >= s->n_units || s->units[unit].ustate == NULL)
        return;
    const fc_method *m = fc_core_unit_method(s, s->units[unit].numel);
    if (m->sync_floats == NULL)
        return;
    int64_t off = 0, n = m->sync_floats(s->cfg, s->step, &off);
    if (n > 0) {
        *data = s->units[unit].ustate + off;
        *len = n;
    }
}

int fc_core_sync_apply(fc_core *s, uint32_t unit, const float *sum, int64_t len, fc_err *err)
{
    float *data;
    int64_t want;
    fc_core_sync_span(s, unit, &data, &want);
    if (want == 0)
        return fc_fail(err, FC_ERR_STATE, "unit %u has no state to sync at step %u", unit, s->step);
    if (len != want)
        return fc_fail(err, FC_ERR_VALUE, "sync of unit %u needs %lld floats, got %lld", unit,
                       (long long)want, (long long)len);
    memcpy(data, sum, (size_t)len * 4);
    const fc_method *m = fc_core_unit_method(s, s->units[unit].numel);
    return m->sync_apply(s->cfg, s->units[unit].ustate, err);
}

int64_t fc_core_unit_floats(const fc_core *s, int64_t numel)
{
    const fc_method *m = fc_core_unit_method(s, numel);
    return m->unit_floats != NULL ? m->unit_floats(s->cfg) : 0;
}

int fc_core_check_unit_state(const fc_core *s, int64_t numel, const float *v, int64_t len,
                             fc_err *err)
{
    const fc_method *m = fc_core_unit_method(s, numel);
    const int64_t want = fc_core_unit_floats(s, numel);
    if (want == 0)
        return fc_fail(err, FC_ERR_VALUE, "a unit of %lld elements uses '%s', which keeps no unit "
                       "state, but one of %lld floats was given", (long long)numel, m->name,
                       (long long)len);
    if (len != want)
        return fc_fail(err, FC_ERR_VALUE, "'%s' keeps %lld floats of state per unit, got %lld "
                       "(another config?)", m->name, (long long)want, (long long)len);
    return m->unit_check != NULL ? m->unit_check(s->cfg, v, err) : FC_OK;
}

/* ---- geometry ---- */

const fc_method *fc_core_unit_method(const fc_core *s, int64_t numel)
{
    return numel < s->common.min_numel ? &fc_method_none : s->method;
}

/* Whether a chunk of n elements goes out no smaller as m than as `none` (padded sizes: what
 * the wire carries). */
static int no_smaller(const fc_core *s, const fc_method *m, int64_t n, int dtype)
{
    return n > 0 && fc_payload_bytes(s, m, n, dtype) >= fc_payload_bytes(s, &fc_method_none, n, dtype);
}

const fc_method *fc_core_wire_method(const fc_core *s, int64_t numel, int world, int dtype)
{
    const fc_method *m = fc_core_unit_method(s, numel);
    if (m == &fc_method_none || (m->flags & FC_VARSIZE) || numel <= 0 || world < 1)
        return m;
    /* a unit's chunks have two lengths at most: ceil(N / W), and the last non-empty one's */
    const int64_t per = (numel + world - 1) / world, last = numel - (numel - 1) / per * per;
    if (m->fetch_k != NULL && fc_core_fetch_k(s, m, per) > 0)
        dtype = FC_BF16; /* `none` at 2 bytes per element: no larger than any dtype's */
    return no_smaller(s, m, per, dtype) || no_smaller(s, m, last, dtype) ? &fc_method_none : m;
}

void fc_chunk_span(int64_t n, int world, int c, int64_t *start, int64_t *len)
{
    int64_t per = (n + world - 1) / world;
    int64_t a = per * c, b = a + per;
    if (a > n)
        a = n;
    if (b > n)
        b = n;
    *start = a;
    *len = b - a;
}

static fc_chunk make_chunk(const fc_core *s, const fc_method *m, int64_t n, int world, int dtype,
                           uint32_t unit, uint32_t chunk, int rank)
{
    fc_chunk c;
    c.cfg = m == s->method ? (const void *)s->cfg : NULL;
    c.n = n;
    c.world = world;
    c.wire_dtype = dtype;
    uint64_t seed = (uint64_t)s->common.seed;
    c.rng_shared.key0 = (uint32_t)seed;
    c.rng_shared.key1 = (uint32_t)(seed >> 32);
    c.rng_shared.chunk = chunk;
    c.rng_shared.unit = unit;
    c.rng_shared.step = s->step;
    /* The sender's own stream: stochastic rounding on different ranks must not be correlated. */
    c.rng = c.rng_shared;
    c.rng.key1 ^= 0x85EBCA6Bu * (uint32_t)(rank + 1);
    c.scratch = s->mscr;
    c.ustate = NULL;
    return c;
}

int64_t fc_payload_bytes(const fc_core *s, const fc_method *m, int64_t n, int dtype)
{
    if (n == 0)
        return 0;
    fc_chunk c = make_chunk(s, m, n, 1, dtype, 0, 0, 0);
    fc_layout l;
    m->layout(&c, &l);
    return fc_align_up(FC_HEADER_BYTES + fc_layout_bytes(&l));
}

void fc_core_plan(const fc_core *s, int64_t numel, int dtype, int world, int rank,
                  int64_t *send_splits, int64_t *recv_splits)
{
    const fc_method *m = fc_core_wire_method(s, numel, world, dtype);
    int64_t start, own;
    fc_chunk_span(numel, world, rank, &start, &own);
    int64_t p_own = fc_payload_bytes(s, m, own, dtype);
    for (int c = 0; c < world; c++) {
        int64_t len;
        fc_chunk_span(numel, world, c, &start, &len);
        int skip = c == rank && !s->common.compress_own_chunk;
        send_splits[c] = skip ? 0 : fc_payload_bytes(s, m, len, dtype);
        recv_splits[c] = skip ? 0 : p_own;
    }
}

/* ---- units and steps ---- */

int fc_core_begin(fc_core *s, int64_t numel, int64_t want, int new_step, uint32_t *unit,
                  fc_err *err)
{
    /* everything is checked, and the table grown, before the step or the cursor move: a
     * refused claim leaves the state as it was, so its retry gets the same unit */
    const uint32_t u = want >= 0 ? (uint32_t)want : new_step ? 0 : s->cursor;
    if (want > (int64_t)s->n_units)
        return fc_fail(err, FC_ERR_VALUE, "unit must be in [0, %d] (a unit seen before, or the "
                       "next new one), got %lld", s->n_units, (long long)want);
    if ((int32_t)u < s->n_units && s->units[u].numel != numel)
        return fc_fail(err, FC_ERR_VALUE,
                       "grad has %lld elements but unit %u had %lld when it was first seen: %s",
                       (long long)numel, u, (long long)s->units[u].numel,
                       want >= 0 ? "one unit key, one size"
                                 : "units are keyed by call order, which must be the same every "
                                   "step (call end_step() after each backward if the hook runs "
                                   "outside one)");
    if ((int32_t)u == s->n_units && s->n_units == s->cap_units) {
        int32_t cap = s->cap_units ? 2 * s->cap_units : 16;
        fc_unit *p = (fc_unit *)realloc(s->units, (size_t)cap * sizeof(fc_unit));
        if (p == NULL)
            return fc_fail(err, FC_ERR_NOMEM, "could not grow the unit table");
        s->units = p;
        s->cap_units = cap;
    }
    if (new_step)
        fc_core_end_step(s);
    if ((int32_t)u == s->n_units) {
        memset(&s->units[u], 0, sizeof(fc_unit));
        s->units[u].numel = numel;
        s->n_units = (int32_t)u + 1;
    }
    s->cursor = u + 1;
    *unit = u;
    return FC_OK;
}

void fc_core_end_step(fc_core *s)
{
    s->cursor = 0;
    s->step++;
}

/* ---- encode ---- */

/* x = g + r, counting the non-finite results: error feedback's load in one pass (the same
 * float additions as load_f32 then add_f32). */
FC_CLONES static int64_t load_sum_f32(const float *g, const float *r, int64_t n, float *x)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) {
        x[i] = g[i] + r[i];
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
        const float g = elem_f32(grad->data, grad->dtype, start + i);
        const float e = res != NULL ? elem_f32(res->data, res->dtype, start + i) : 0.0f;
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
        nf = load_sum_f32((const float *)grad->data + start, (const float *)res->data + start, n, x);
    } else {
        load_f32(grad->data, grad->dtype, start, n, x);
        if (res != NULL)
            add_f32(res->data, res->dtype, start, n, x);
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
    fc_header h;
    memset(&h, 0, sizeof(h));
    h.magic = FC_MAGIC;
    h.version = FC_WIRE_VERSION;
    h.method = m->id;
    h.dtype = (uint8_t)c->wire_dtype;
    h.flags = (uint8_t)flags;
    h.unit = c->rng_shared.unit;
    h.step = c->rng_shared.step;
    fc_header_set_sizes(&h, (uint64_t)c->n, (uint64_t)body);
    h.fingerprint = fc_wire_fingerprint(s->fingerprint, m->id);
    h.world = (uint16_t)c->world;
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
        if (fallback && full >= plain) { /* most values passed: exact values cost less */
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

void fc_core_count_payload(fc_core *s, const fc_layout *l, int64_t size, int64_t n)
{
    fc_counters *k = &s->ctr;
    k->chunks_sent++;
    k->bytes_sent += size;
    k->header_bytes += size - fc_layout_bytes(l);
    k->meta_bytes += l->meta_bytes;
    k->index_bytes += l->index_bytes;
    k->value_bytes += l->value_bytes;
    k->kept += l->kept;
    k->sent_elements += n;
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

/* dst = e and ||e||^2 (as sum_sq_f32) in one pass. */
FC_CLONES static double store_sum_sq_f32(float *dst, const float *e, int64_t n)
{
    double acc[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            dst[i + j] = e[i + j];
            acc[j] += (double)e[i + j] * (double)e[i + j];
        }
    for (int j = 0; i < n; i++, j++) {
        dst[i] = e[i];
        acc[j] += (double)e[i] * (double)e[i];
    }
    return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

FC_CLONES static void dots3_f32(const float *e, const float *x, int64_t n, double *ee, double *xx,
                                double *xe)
{
    double a[8] = {0}, b[8] = {0}, c[8] = {0};
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

/* The residual of a chunk whose g' (x, in s->x) held NaN/Inf ("pass" mode), element by element
 * (fc_residual_passed): never the old residual, which went out inside g'. */
static int residual_of_nonfinite(fc_core *s, const fc_method *m, const fc_chunk *c,
                                 const uint8_t *p, fc_buf *res, int64_t start, double *e_sq,
                                 fc_err *err)
{
    const int64_t n = c->n;
    float *d = s->dec;
    memset(d, 0, (size_t)n * 4);
    int rc = m->decode_add(c, p + FC_HEADER_BYTES, header_body_bytes(p), 1.0f, d, err);
    if (rc != FC_OK)
        return rc;
    int64_t sat = 0;
    for (int64_t i = 0; i < n; i++)
        s->x[i] = fc_residual_passed(s->x[i], d[i], &sat);
    *e_sq = sum_sq_f32(s->x, n);
    store_residual(res, start, s->x, n, &sat);
    s->ctr.saturated += sat;
    return FC_OK;
}

/* e of finite x that came out NaN/Inf (fc_residual_fix), fixed in place. Returns ||e||^2 again. */
static double saturate_residual(float *e, int64_t n, int64_t *sat)
{
    for (int64_t i = 0; i < n; i++)
        if (fc_abs_bits(e[i]) >= FC_INF_BITS)
            e[i] = fc_residual_fix(e[i], sat);
    return sum_sq_f32(e, n);
}

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

/* After encode, turns s->x into e = g' - D(C(g')) and stores it; returns ||e||^2. With `dots`
 * (the sampled calls), also ||g'||^2 and g' . e, for which g' is loaded again from the untouched
 * inputs; the other calls skip that pass. `nonfinite`: g' held NaN/Inf (residual_of_nonfinite).
 * A residual is always finite. */
static int update_residual(fc_core *s, const fc_method *m, const fc_chunk *c, const uint8_t *p,
                           const fc_buf *grad, fc_buf *res, int64_t start, int nonfinite, int dots,
                           double *e_sq, double *x_sq, double *x_dot_e, fc_err *err)
{
    *x_sq = *x_dot_e = 0;
    if (nonfinite)
        return residual_of_nonfinite(s, m, c, p, res, start, e_sq, err);
    int rc = m->decode_add(c, p + FC_HEADER_BYTES, header_body_bytes(p), -1.0f, s->x, err);
    if (rc != FC_OK)
        return rc;
    const int64_t n = c->n;
    int64_t sat = 0;
    if (dots) {
        float *g = s->dec; /* g' again, into the decode scratch, to pair it with e */
        load_f32(grad->data, grad->dtype, start, n, g);
        add_f32(res->data, res->dtype, start, n, g);
        dots3_f32(s->x, g, n, e_sq, x_sq, x_dot_e);
    } else if (res->dtype == FC_F32) {
        *e_sq = store_sum_sq_f32((float *)res->data + start, s->x, n);
        if (!isfinite(*e_sq)) { /* rare: fix what was stored */
            *e_sq = saturate_residual(s->x, n, &sat);
            memcpy((float *)res->data + start, s->x, (size_t)n * 4);
            s->ctr.saturated += sat;
        }
        return FC_OK;
    } else {
        *e_sq = sum_sq_f32(s->x, n);
    }
    if (!isfinite(*e_sq)) {
        *e_sq = saturate_residual(s->x, n, &sat);
        if (dots)
            dots3_f32(s->x, s->dec, n, e_sq, x_sq, x_dot_e);
    }
    store_residual(res, start, s->x, n, &sat);
    s->ctr.saturated += sat;
    return FC_OK;
}

/* Without error feedback: decode into scratch and compare, on the sampled calls only. */
static int sample_error(fc_core *s, const fc_method *m, const fc_chunk *c, const float *xs,
                        const uint8_t *p, fc_err *err)
{
    memset(s->dec, 0, (size_t)c->n * 4);
    int rc = m->decode_add(c, p + FC_HEADER_BYTES, header_body_bytes(p), 1.0f, s->dec, err);
    if (rc != FC_OK)
        return rc;
    double dd = 0, xx = 0, xd = 0, ee = 0;
    for (int64_t i = 0; i < c->n; i++) {
        double x = xs[i], d = s->dec[i];
        xx += x * x;
        dd += d * d;
        xd += x * d;
        ee += (x - d) * (x - d);
    }
    if (isfinite(xx) && isfinite(ee)) {
        s->ctr.err_sq += ee;
        s->ctr.ref_sq += xx;
        s->ctr.cos_sum += (xx > 0 && dd > 0) ? xd / sqrt(xx * dd) : (xx == 0 && dd == 0);
        s->ctr.stats_samples++;
    }
    return FC_OK;
}

/* Whether chunk ci of this unit has a payload: not empty, and not the own chunk kept exact. */
static int has_payload(const fc_core *s, int64_t N, int world, int rank, int ci)
{
    int64_t start, n;
    fc_chunk_span(N, world, ci, &start, &n);
    return n > 0 && (ci != rank || s->common.compress_own_chunk);
}

static fc_call_key call_key(const fc_core *s, uint32_t unit, int world, int rank, int64_t numel)
{
    fc_call_key k = {unit, s->step, world, rank, numel};
    return k;
}

static int same_call(const fc_call_key *a, const fc_call_key *b)
{
    return a->unit == b->unit && a->step == b->step && a->world == b->world &&
           a->rank == b->rank && a->numel == b->numel;
}

/* Pieces: the per-peer exchange may send a chunk as several payloads, each the encode of a
 * contiguous range, so that the first travels while the next is encoded and the receiver
 * decodes one while the next arrives (with one peer, W = 2, nothing else could overlap the
 * wire). Only methods that encode element- or block-wise (FC_PIECEWISE), for which a piece
 * means what the same range meant inside the chunk. Piece lengths are multiples of 64Ki
 * elements, so blocks of up to 64Ki (a power of two) are never split. */
#define FC_PIECE_ALIGN 65536

/* A chunk of n elements goes as this many pieces of *len elements (the last one shorter): 1 and
 * n unless the method is FC_PIECEWISE and n > pipeline_piece. */
static int pieces_of(const fc_core *s, const fc_method *m, int64_t n, int64_t *len)
{
    const int64_t want = s->common.pipeline_piece;
    *len = n;
    if (!(m->flags & FC_PIECEWISE) || want <= 0 || n <= want)
        return 1;
    int64_t per = (want + FC_PIECE_ALIGN - 1) / FC_PIECE_ALIGN * FC_PIECE_ALIGN;
    if ((n + per - 1) / per > FC_MAX_PIECES)
        per = ((n + FC_MAX_PIECES - 1) / FC_MAX_PIECES + FC_PIECE_ALIGN - 1) / FC_PIECE_ALIGN *
              FC_PIECE_ALIGN;
    *len = per;
    return (int)((n + per - 1) / per);
}

/* Parts of chunk c in the per-peer exchange: its pieces, or one (empty) part without payload. */
static int chunk_parts(const fc_core *s, const fc_method *m, int64_t N, int world, int rank, int c,
                       int64_t *len)
{
    int64_t start, n;
    fc_chunk_span(N, world, c, &start, &n);
    if (!has_payload(s, N, world, rank, c)) {
        *len = n;
        return 1;
    }
    return pieces_of(s, m, n, len);
}

/* Bytes of piece p of a chunk of n elements cut into pieces of len. */
static int64_t piece_bytes(const fc_core *s, const fc_method *m, int64_t n, int64_t len, int p,
                           int dtype)
{
    const int64_t a = p * len;
    return fc_payload_bytes(s, m, n - a < len ? n - a : len, dtype);
}

/* Bytes of all the parts of chunk c (0 without payload): every piece but the last is full. */
static int64_t chunk_part_bytes(const fc_core *s, const fc_method *m, int64_t N, int dtype,
                                int world, int rank, int c)
{
    int64_t start, n, len;
    fc_chunk_span(N, world, c, &start, &n);
    const int parts = chunk_parts(s, m, N, world, rank, c, &len);
    if (!has_payload(s, N, world, rank, c))
        return 0;
    return (parts - 1) * piece_bytes(s, m, n, len, 0, dtype) +
           piece_bytes(s, m, n, len, parts - 1, dtype);
}

void fc_core_piece_plan(const fc_core *s, int64_t numel, int dtype, int world, int rank, int chunk,
                        int64_t *sizes, int *count)
{
    const fc_method *m = fc_core_wire_method(s, numel, world, dtype);
    const int payload = has_payload(s, numel, world, rank, chunk);
    int64_t start, n, len;
    fc_chunk_span(numel, world, chunk, &start, &n);
    *count = chunk_parts(s, m, numel, world, rank, chunk, &len);
    for (int p = 0; p < *count; p++)
        sizes[p] = payload ? piece_bytes(s, m, n, len, p, dtype) : 0;
}

/* Opens an encode call (s->enc): what every chunk of it shares, scratch grown for its largest
 * chunk. fc_core_encode runs one in full; fc_core_encode_part one chunk per call. */
static int encode_begin(fc_core *s, const fc_buf *grad, const fc_buf *residual, int world, int rank,
                        uint32_t unit, int pieces, fc_err *err)
{
    int rc = FC_OK;
    fc_encode_call *e = &s->enc;
    const int64_t N = grad->numel;
    const fc_method *m = fc_core_wire_method(s, N, world, grad->dtype);
    e->open = 0;
    e->method = m;
    e->fell_back = 0;
    e->use_ef = m == s->method && s->common.error_feedback && residual != NULL;
    /* a second round decides what is sent after this call: no error sample from round 1 */
    e->stats = fc_core_stats_due(s, m, N, world);
    e->sample = !e->use_ef && e->stats;
    e->sampled = 0;
    e->raw = 0;
    e->e_sq = 0;
    e->key = call_key(s, unit, world, rank, N);
    memset(e->next_piece, 0, (size_t)world);
    s->bad_unit = unit;
    const int64_t per = (N + world - 1) / world;
    FC_TRY(grow_f32(&s->x, &s->x_cap, per, err));
    FC_TRY(grow_f32(&s->dec, &s->dec_cap, per, err));
    if (m->scratch_bytes != NULL)
        FC_TRY(grow(&s->mscr, &s->mscr_cap, m->scratch_bytes(s->cfg, per), err));
    FC_TRY(unit_state(s, m, unit, &e->ust, err));
    e->todo = world;
    if (pieces) { /* the per-peer layout, once per call: every part then finds its slot in O(1) */
        e->todo = 0;
        e->at[0] = 0;
        for (int c = 0; c < world; c++) {
            int64_t len;
            e->todo += chunk_parts(s, m, N, world, rank, c, &len);
            e->at[c + 1] = e->at[c] + chunk_part_bytes(s, m, N, grad->dtype, world, rank, c);
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
                        int64_t len, uint8_t *p, int64_t cap, int64_t *size, fc_err *err)
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
    fc_chunk c = make_chunk(s, m, n, e->key.world, grad->dtype, e->key.unit, id, e->key.rank);
    c.scratch = s->mscr;
    c.ustate = e->ust;
    int64_t bad, sat;
    const float *x = load_chunk(s, grad, e->use_ef ? residual : NULL, start, n, &bad, &sat);
    s->ctr.nonfinite_in += bad;
    s->ctr.saturated += sat;
    /* "pass": NaN/Inf went on the wire, and the receivers are told so (write_out) */
    const int passed = bad != 0 && s->common.nonfinite == FC_NONFINITE_PASS;
    fc_layout used;
    const fc_method *wm; /* m, or `none` for a data-dependent payload that fell back */
    FC_TRY(encode_one(s, m, &c, x, p, cap, 1, passed ? FC_HDR_NONFINITE : 0u, size, &used, &wm,
                      err));
    e->fell_back |= wm != m;
    fc_core_count_payload(s, &used, *size, n);
    s->ctr.saturated += used.saturated;
    e->raw += n * fc_dtype_size(grad->dtype);
    if (e->use_ef) { /* a residual is always replaced: the old one went out inside g' */
        const int dots = !passed && !e->sampled && e->stats;
        double ee, xx, xe;
        FC_TRY(update_residual(s, wm, &c, p, grad, residual, start, passed, dots, &ee, &xx, &xe,
                               err));
        e->e_sq += ee;
        if (dots) {
            /* D = x - e: ||x - D||^2 = ||e||^2, x . D = ||x||^2 - x . e */
            double xd = xx - xe, dd = xx - 2 * xe + ee;
            s->ctr.err_sq += ee;
            s->ctr.ref_sq += xx;
            s->ctr.cos_sum += (xx > 0 && dd > 0) ? xd / sqrt(xx * dd) : (xx == 0 && dd == 0);
            s->ctr.stats_samples++;
            e->sampled = 1;
        }
    } else if (e->sample && !e->sampled && !passed) { /* "zero" mode's chunk is finite now */
        FC_TRY(sample_error(s, wm, &c, x, p, err));
        e->sampled = 1;
    }
    return FC_OK;
error:
    return rc;
}

/* Closes the open call: the per-call counters, counted once however its chunks were encoded. */
static void encode_end(fc_core *s, const fc_buf *residual)
{
    fc_encode_call *e = &s->enc;
    if (e->use_ef) {
        s->units[e->key.unit].residual_sq = e->e_sq;
        s->units[e->key.unit].residual_elems = residual->numel;
    }
    fc_core_count_call(s, e->method, e->key.numel, e->fell_back, e->raw);
    e->open = 0;
}

void fc_core_count_call(fc_core *s, const fc_method *m, int64_t numel, int fell_back, int64_t raw)
{
    s->ctr.calls++;
    s->ctr.calls_uncompressed += m != s->method;
    /* as `none` though min_numel let the method through: the size rule, unit-wide or per payload */
    s->ctr.fallback_units += (m != s->method && fc_core_unit_method(s, numel) == s->method) ||
                             fell_back;
    s->ctr.elements += numel;
    s->ctr.bytes_raw += raw;
}

int fc_core_stats_due(const fc_core *s, const fc_method *m, int64_t numel, int world)
{
    /* a second round decides what is sent after this call: no error sample from round 1 */
    return m == s->method && s->common.error_stats_every > 0 && !fc_core_fetch_kmax(s, numel, world) &&
           s->ctr.calls % s->common.error_stats_every == 0;
}

int fc_core_encode(fc_core *s, const fc_buf *grad, fc_buf *send, fc_buf *residual, int world,
                   int rank, uint32_t unit, int64_t *sizes, fc_err *err)
{
    int rc = FC_OK;
    const double t0 = now_s();
    FC_TRY(encode_begin(s, grad, residual, world, rank, unit, 0, err));
    uint8_t *out = (uint8_t *)send->data;
    int64_t off = 0;
    for (int ci = 0; ci < world; ci++) {
        sizes[ci] = 0;
        if (!has_payload(s, grad->numel, world, rank, ci))
            continue;
        int64_t start, n;
        fc_chunk_span(grad->numel, world, ci, &start, &n);
        FC_TRY(encode_chunk(s, grad, residual, ci, 0, n, out + off, send->numel - off, &sizes[ci],
                            err));
        off += sizes[ci];
    }
    encode_end(s, residual);
    s->ctr.compress_s += now_s() - t0;
    return FC_OK;
error:
    s->enc.open = 0;
    return rc;
}

/* Why a unit cannot be exchanged one payload at a time (NULL: it can). */
static const char *not_per_peer(const fc_core *s, const fc_method *m, int64_t N, int world)
{
    if (m->flags & FC_VARSIZE)
        return "has data-dependent payload sizes (the receivers learn them in one exchange)";
    if (fc_core_fetch_kmax(s, N, world) > 0)
        return "has a second round (the owner picks coordinates from all payloads)";
    if (m->aggregate != NULL && m->agg_bytes != NULL)
        return "sums the payloads in the compressed domain before decoding them";
    return NULL;
}

int fc_core_per_peer_ok(const fc_core *s, int64_t numel, int world)
{
    return not_per_peer(s, fc_core_unit_method(s, numel), numel, world) == NULL;
}

int fc_core_encode_part(fc_core *s, const fc_buf *grad, fc_buf *send, fc_buf *residual, int world,
                        int rank, uint32_t unit, int chunk, int piece, int64_t *size, fc_err *err)
{
    int rc = FC_OK;
    const double t0 = now_s();
    const int64_t N = grad->numel;
    fc_encode_call *e = &s->enc;
    const fc_call_key key = call_key(s, unit, world, rank, N);
    *size = 0;
    const fc_method *m = fc_core_wire_method(s, N, world, grad->dtype);
    /* bad arguments leave an open call as it was; only a failed encode drops it */
    if (chunk < 0 || chunk >= world)
        return fc_fail(err, FC_ERR_VALUE, "chunk must be in [0, %d), got %d", world, chunk);
    int64_t start, n, len;
    fc_chunk_span(N, world, chunk, &start, &n);
    const int parts = chunk_parts(s, m, N, world, rank, chunk, &len);
    if (piece < 0 || piece >= parts)
        return fc_fail(err, FC_ERR_VALUE, "piece must be in [0, %d) for chunk %d, got %d", parts,
                       chunk, piece);
    if (!e->open || !same_call(&e->key, &key)) { /* a new call (an unfinished one is dropped) */
        const char *why = not_per_peer(s, m, N, world);
        if (why != NULL)
            return fc_fail(err, FC_ERR_VALUE, "method '%s' %s: encode all chunks at once with "
                           "encode()", m->name, why);
        FC_TRY(encode_begin(s, grad, residual, world, rank, unit, 1, err));
    }
    if (send->numel != e->at[world])
        return fc_fail(err, FC_ERR_VALUE, "send has %lld bytes, the parts of this call need %lld "
                       "(pieces())", (long long)send->numel, (long long)e->at[world]);
    if (piece != e->next_piece[chunk])
        return fc_fail(err, FC_ERR_STATE, "chunk %d of unit %u: piece %d, expected piece %d (the "
                       "pieces of a chunk come once each, in order)", chunk, unit, piece,
                       e->next_piece[chunk]);
    if (has_payload(s, N, world, rank, chunk)) {
        const int64_t off = e->at[chunk] + piece * piece_bytes(s, m, n, len, 0, grad->dtype);
        FC_TRY(encode_chunk(s, grad, residual, chunk, piece, len, (uint8_t *)send->data + off,
                            send->numel - off, size, err));
    }
    e->next_piece[chunk]++;
    if (--e->todo == 0)
        encode_end(s, residual);
    s->ctr.compress_s += now_s() - t0;
    return FC_OK;
error:
    e->open = 0;
    return rc;
}

/* ---- decode ---- */

static int check_header(const fc_core *s, const fc_header *h, const fc_method *m,
                        const fc_chunk *c, int64_t slot, int src, fc_err *err)
{
    if (h->magic != FC_MAGIC)
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: bad magic 0x%04x (not a "
                       "fsdpcomp payload, or corrupted)", src, h->magic);
    if (h->version != FC_WIRE_VERSION)
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: wire version %d, expected %d",
                       src, h->version, FC_WIRE_VERSION);
    if (h->method != m->id)
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: method id %d, expected %d (%s): "
                       "ranks use different methods", src, h->method, m->id, m->name);
    /* before unit and step: a rank that rebuilt its state with another config also restarted
     * its step count, and the config is what differs */
    if (fc_wire_fingerprint(h->fingerprint, h->method) != s->fingerprint)
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d was encoded under another "
                       "config (fingerprint %08x, this rank's %08x): every rank must run the same "
                       "method and config keys", src, fc_wire_fingerprint(h->fingerprint, h->method),
                       s->fingerprint);
    if (h->world != (uint32_t)c->world)
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d was encoded for world %u, this "
                       "rank runs world %d", src, h->world, c->world);
    if (h->dtype != c->wire_dtype || (h->flags & ~FC_HDR_FLAGS_KNOWN) != 0)
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: dtype code %d (flags 0x%02x), "
                       "expected %d", src, h->dtype, h->flags, c->wire_dtype);
    if (h->unit != c->rng_shared.unit || h->step != c->rng_shared.step)
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d is for unit %u of step %u, this "
                       "rank is at unit %u of step %u: ranks called the hook in different orders",
                       src, h->unit, h->step, c->rng_shared.unit, c->rng_shared.step);
    if (fc_header_numel(h) != (uint64_t)c->n)
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: %llu elements, expected %lld",
                       src, (unsigned long long)fc_header_numel(h), (long long)c->n);
    if (fc_header_body(h) > (uint64_t)(slot - FC_HEADER_BYTES))
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: body of %llu bytes does not fit "
                       "its %lld-byte slot (truncated?)", src,
                       (unsigned long long)fc_header_body(h), (long long)slot);
    return FC_OK;
}

/* Validates the payload at p (at most `slot` bytes) for chunk c: its body size in *body and
 * whether it carries NaN/Inf of its sender's input in *passed. */
static int check_payload(const fc_core *s, const fc_method *m, const fc_chunk *c, const uint8_t *p,
                         int64_t slot, int src, int64_t *body, int *passed, fc_err *err)
{
    if (slot < FC_HEADER_BYTES)
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: %lld bytes, shorter than the "
                       "%d-byte header", src, (long long)slot, FC_HEADER_BYTES);
    fc_header h;
    memcpy(&h, p, sizeof(h));
    int rc = check_header(s, &h, m, c, slot, src, err);
    if (rc != FC_OK)
        return rc;
    fc_layout l;
    m->layout(c, &l);
    const int64_t b = (int64_t)fc_header_body(&h);
    if ((m->flags & FC_VARSIZE) ? b > fc_layout_bytes(&l) : b != fc_layout_bytes(&l))
        return fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d: body of %lld bytes, the "
                       "method's layout has %lld", src, (long long)b, (long long)fc_layout_bytes(&l));
    *body = b;
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

/* Checks the output against the shard of n elements and grows the accumulator and the method
 * scratch for it. */
static int decode_scratch(fc_core *s, const fc_method *m, int64_t n, const fc_buf *out, fc_err *err)
{
    if (out->numel < n)
        return fc_fail(err, FC_ERR_VALUE, "output has %lld elements, the shard needs %lld",
                       (long long)out->numel, (long long)n);
    int rc = grow_f32(&s->acc, &s->acc_cap, n, err);
    if (rc == FC_OK && m->scratch_bytes != NULL)
        rc = grow(&s->mscr, &s->mscr_cap, m->scratch_bytes(s->cfg, n), err);
    return rc;
}

/* ---- the second round's first step ----
 * A method with a second round (fc_method.fetch_k, Sketched-SGD) has its owner pick coordinates
 * from the summed payloads inside fc_core_decode. The core does that through the method table's
 * fetch_k/pick entries, never naming the method or fc_fetch.c: the rest of the round
 * (fc_fetch.c) builds on this file, not the other way round, so there is no include cycle. */

int64_t fc_core_fetch_k(const fc_core *s, const fc_method *m, int64_t len)
{
    fc_chunk c; /* fetch_k reads only the config and the chunk length */
    memset(&c, 0, sizeof(c));
    c.cfg = s->cfg;
    c.n = len;
    return len > 0 ? m->fetch_k(&c) : 0;
}

int64_t fc_core_fetch_kmax(const fc_core *s, int64_t N, int world)
{
    /* any dtype: a unit with a second round falls back alike for all of them */
    const fc_method *m = fc_core_wire_method(s, N, world, FC_F32);
    if (m->fetch_k == NULL || N == 0 || (world == 1 && !s->common.compress_own_chunk))
        return 0;
    return fc_core_fetch_k(s, m, (N + world - 1) / world); /* chunk 0 is the longest */
}

/* The owner's picks for its chunk (c0) into s->picks, from the summed payloads in s->agg and
 * the exact own chunk `own`. */
static int pick_coordinates(fc_core *s, const fc_method *m, const fc_chunk *c0, const float *own,
                            uint32_t unit, fc_err *err)
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
        int rc = m->pick(c0, (const uint8_t *)s->agg, own, s->picks, err);
        if (rc != FC_OK)
            return rc;
    }
    s->n_picks = k;
    s->picks_unit = unit;
    return FC_OK;
}

int fc_core_check_recv(const fc_core *s, int64_t numel, int dtype, int world, int rank,
                       int64_t have, int64_t *recvs, fc_err *err)
{
    const fc_method *m = fc_core_wire_method(s, numel, world, dtype);
    const int varsize = (m->flags & FC_VARSIZE) != 0;
    int64_t sends[FC_MAX_WORLD], total = 0;
    fc_core_plan(s, numel, dtype, world, rank, sends, recvs);
    for (int r = 0; r < world; r++)
        total += recvs[r];
    /* data-dependent sizes: the plan is an upper bound and the payloads lie back to back */
    if (varsize ? have > total : have != total)
        return fc_fail(err, FC_ERR_PAYLOAD, "receive buffer has %lld bytes, the plan for %lld "
                       "elements over %d ranks needs %s%lld", (long long)have, (long long)numel,
                       world, varsize ? "at most " : "", (long long)total);
    return FC_OK;
}

int fc_core_decode(fc_core *s, const fc_buf *recv, const fc_buf *grad, fc_buf *out, int world,
                   int rank, uint32_t unit, fc_err *err)
{
    int rc = FC_OK;
    const double t0 = now_s();
    const int64_t N = grad->numel;
    const fc_method *m = fc_core_wire_method(s, N, world, grad->dtype);
    s->dec_call.open = 0; /* acc is reused: a decode_part sequence cannot go on after this */
    int64_t start, n;
    fc_chunk_span(N, world, rank, &start, &n);
    FC_TRY(decode_scratch(s, m, n, out, err));
    int64_t recvs[FC_MAX_WORLD];
    FC_TRY(fc_core_check_recv(s, N, grad->dtype, world, rank, recv->numel, recvs, err));
    const int varsize = (m->flags & FC_VARSIZE) != 0;
    float *acc = s->acc;
    memset(acc, 0, (size_t)n * 4);
    float *ust;
    FC_TRY(unit_state(s, m, unit, &ust, err));
    fc_chunk c0 = make_chunk(s, m, n, world, grad->dtype, unit, (uint32_t)rank, 0);
    c0.ustate = ust;
    const int64_t ab = n > 0 ? agg_bytes_of(m, &c0) : 0;
    int senders = 0;
    if (ab > 0) {
        FC_TRY(grow(&s->agg, &s->agg_cap, (size_t)ab, err));
        memset(s->agg, 0, (size_t)ab);
    }
    /* Rank order, starting from zero: the same summation order on every rank and as a plain
     * sequential reference, so `none` is exact against it. */
    int64_t own_bad = 0; /* counted once the call succeeds */
    int passed = 0;
    const uint8_t *p = (const uint8_t *)recv->data;
    const uint8_t *end = p + recv->numel;
    for (int r = 0; r < world; r++) {
        if (n == 0)
            break;
        if (recvs[r] == 0) { /* the own chunk, exact */
            own_bad = fc_core_add_own(s, grad, start, n, acc);
            passed |= own_bad != 0 && s->common.nonfinite == FC_NONFINITE_PASS;
            continue;
        }
        int64_t slot = varsize ? (int64_t)(end - p) : recvs[r], body = 0;
        const fc_method *pm = payload_method(m, p, slot); /* m, or `none` in its place */
        fc_chunk c = make_chunk(s, pm, n, world, grad->dtype, unit, (uint32_t)rank, r);
        c.ustate = ust;
        FC_TRY(check_payload(s, pm, &c, p, slot, r, &body, &passed, err));
        if (ab > 0) {
            FC_TRY(m->aggregate(&c, (uint8_t *)s->agg, p + FC_HEADER_BYTES, body, err));
            senders++;
        } else {
            FC_TRY(pm->decode_add(&c, p + FC_HEADER_BYTES, body, 1.0f, acc, err));
        }
        p += varsize ? fc_align_up(FC_HEADER_BYTES + body) : recvs[r];
    }
    if (p != end && n > 0)
        return fc_fail(err, FC_ERR_PAYLOAD, "receive buffer has %lld bytes, its payloads use %lld",
                       (long long)recv->numel, (long long)(p - (const uint8_t *)recv->data));
    if (fc_core_fetch_kmax(s, N, world) > 0) {
        /* a second round follows: pick the coordinates, write nothing yet. acc holds the
         * exact own chunk, or zeros when it was compressed too. */
        FC_TRY(pick_coordinates(s, m, &c0, acc, unit, err));
        s->ctr.nonfinite_in += own_bad;
        s->ctr.decompress_s += now_s() - t0;
        return FC_OK;
    }
    if (senders > 0) /* one decode of the summed compressed payloads */
        FC_TRY(m->decode_agg(&c0, (const uint8_t *)s->agg, senders, 1.0f, acc, err));
    s->ctr.nonfinite_in += own_bad;
    fc_core_write_out(s, acc, n, world, out, passed);
    s->ctr.decompress_s += now_s() - t0;
    return FC_OK;
error:
    return rc;
}

int fc_core_decode_part(fc_core *s, const fc_buf *payload, const fc_buf *grad, fc_buf *out,
                        int world, int rank, uint32_t unit, int src, int piece, fc_err *err)
{
    int rc = FC_OK;
    const double t0 = now_s();
    const int64_t N = grad->numel;
    const fc_method *m = fc_core_wire_method(s, N, world, grad->dtype);
    fc_decode_call *d = &s->dec_call;
    const fc_call_key key = call_key(s, unit, world, rank, N);
    if (src < 0 || src >= world)
        return fc_fail(err, FC_ERR_VALUE, "src must be in [0, %d), got %d", world, src);
    int64_t start, n;
    fc_chunk_span(N, world, rank, &start, &n);
    if (src == rank && piece == 0) { /* the own chunk opens the call: acc starts from it */
        d->open = 0;
        const char *why = not_per_peer(s, m, N, world);
        if (why != NULL)
            return fc_fail(err, FC_ERR_VALUE, "method '%s' %s: decode all payloads at once with "
                           "decode()", m->name, why);
        FC_TRY(decode_scratch(s, m, n, out, err));
        FC_TRY(unit_state(s, m, unit, &d->ust, err));
        memset(s->acc, 0, (size_t)n * 4);
        d->key = key;
        d->k = d->piece = 0;
        d->passed = 0;
        d->own_bad = 0;
        /* every other rank sends this chunk cut the same way; the own one may be one exact part */
        d->parts = chunk_parts(s, m, N, world, (rank + 1) % world, rank, &d->len);
        d->own_parts = has_payload(s, N, world, rank, rank) ? d->parts : 1;
        d->open = 1;
    } else if (!d->open || !same_call(&d->key, &key)) {
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
    const int exact = src == rank && !has_payload(s, N, world, rank, rank);
    const int64_t want = exact || n == 0 ? 0 : piece_bytes(s, m, n, d->len, piece, grad->dtype);
    if (payload->numel != want)
        FC_TRY(fc_fail(err, FC_ERR_PAYLOAD, "payload from rank %d (piece %d) has %lld bytes, the "
                       "plan says %lld", src, piece, (long long)payload->numel, (long long)want));
    if (exact) {
        d->own_bad = fc_core_add_own(s, grad, start, n, s->acc);
        d->passed |= d->own_bad != 0 && s->common.nonfinite == FC_NONFINITE_PASS;
    } else if (n > 0) {
        const int64_t a = piece * d->len, np = n - a < d->len ? n - a : d->len;
        const uint32_t id = (uint32_t)rank + (uint32_t)world * (uint32_t)piece;
        fc_chunk c = make_chunk(s, m, np, world, grad->dtype, unit, id, src);
        c.ustate = d->ust;
        FC_TRY(decode_one(s, m, &c, (const uint8_t *)payload->data, want, src, 1.0f, s->acc + a,
                          &d->passed, err));
    }
    if (++d->piece == (src == rank ? d->own_parts : d->parts)) {
        d->piece = 0;
        d->k++;
    }
    if (d->k == world) {
        s->ctr.nonfinite_in += d->own_bad;
        fc_core_write_out(s, s->acc, n, world, out, d->passed);
        d->open = 0;
    }
    s->ctr.decompress_s += now_s() - t0;
    return FC_OK;
error:
    d->open = 0;
    return rc;
}

int64_t fc_core_add_own(const fc_core *s, const fc_buf *grad, int64_t start, int64_t n, float *acc)
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
        const float v = elem_f32(grad->data, grad->dtype, start + i);
        if (fc_abs_bits(v) < FC_INF_BITS) {
            acc[i] += v;
            continue;
        }
        bad += grad->dtype != FC_F32; /* fp32 ones were counted above */
        acc[i] += zero ? 0.0f : fc_canon_nan(v);
    }
    return bad;
}

/* The outputs write_out left non-finite, fixed: with `passed` a NaN/Inf of the inputs goes
 * through (a NaN as the canonical one, counted as nonfinite_out); without, acc overflowed from
 * finite terms and the output saturates (Inf: the dtype's largest value of its sign, NaN: 0). */
static void fix_out(fc_core *s, const float *acc, int64_t n, int world, fc_buf *out, int passed)
{
    const float w = (float)world;
    for (int64_t i = 0; i < n; i++) {
        float v = acc[i] / w;
        if (fc_abs_bits(v) < FC_INF_BITS)
            continue;
        v = fc_output_fix(v, passed, &s->ctr.nonfinite_out, &s->ctr.saturated);
        if (out->dtype == FC_F32)
            ((float *)out->data)[i] = v;
        else /* the narrow conversions saturate +-fp32 max and keep the canonical NaN */
            ((uint16_t *)out->data)[i] = out->dtype == FC_BF16 ? fc_f32_to_bf16(v) : fc_f32_to_f16(v);
    }
}

void fc_core_write_out(fc_core *s, const float *acc, int64_t n, int world, fc_buf *out, int passed)
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
        fix_out(s, acc, n, world, out, passed);
    /* FSDP pads `out` only when the shard is the padded one; anything past the shard is zero. */
    if (out->numel > n)
        memset((uint8_t *)out->data + n * fc_dtype_size(out->dtype), 0,
               (size_t)((out->numel - n) * fc_dtype_size(out->dtype)));
}

/* ---- single chunk, for tests and benchmarks ---- */

int fc_core_compress(fc_core *s, const float *x, int64_t n, uint8_t *payload, int64_t cap,
                     uint32_t unit, uint32_t chunk, int world, int rank, int64_t *written, fc_err *err)
{
    int rc = FC_OK;
    const fc_method *m = s->method;
    if (m->scratch_bytes != NULL)
        FC_TRY(grow(&s->mscr, &s->mscr_cap, m->scratch_bytes(s->cfg, n), err));
    fc_chunk c = make_chunk(s, m, n, world, FC_F32, unit, chunk, rank);
    FC_TRY(unit_state(s, m, unit, &c.ustate, err));
    fc_layout used;
    const fc_method *wm;
    const double t0 = now_s(); /* timed like the collective's encodes: the all-gather stage uses this */
    unsigned flags = 0;
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += !(fc_abs_bits(x[i]) < FC_INF_BITS);
    if (bad) { /* x is read in place, unless a NaN must become the canonical one first */
        FC_TRY(grow_f32(&s->x, &s->x_cap, n, err));
        for (int64_t i = 0; i < n; i++)
            s->x[i] = fc_canon_nan(x[i]);
        x = s->x;
        flags = FC_HDR_NONFINITE;
    }
    /* the method as configured, whatever the size: a caller of one chunk decides for itself */
    FC_TRY(encode_one(s, m, &c, x, payload, cap, 0, flags, written, &used, &wm, err));
    s->ctr.saturated += used.saturated;
    s->ctr.compress_s += now_s() - t0;
    return FC_OK;
error:
    return rc;
}

int fc_core_decompress(fc_core *s, const uint8_t *payload, int64_t bytes, int64_t n, float alpha,
                       float *acc, uint32_t unit, uint32_t chunk, int world, fc_err *err)
{
    int rc = FC_OK;
    const fc_method *m = s->method;
    if (m->scratch_bytes != NULL)
        FC_TRY(grow(&s->mscr, &s->mscr_cap, m->scratch_bytes(s->cfg, n), err));
    fc_chunk c = make_chunk(s, m, n, world, FC_F32, unit, chunk, 0);
    FC_TRY(unit_state(s, m, unit, &c.ustate, err));
    const double t0 = now_s();
    int passed = 0; /* the caller sees NaN/Inf in acc itself */
    FC_TRY(decode_one(s, m, &c, payload, bytes, 0, alpha, acc, &passed, err));
    s->ctr.decompress_s += now_s() - t0;
    return FC_OK;
error:
    return rc;
}
