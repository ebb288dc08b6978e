/* fc_core.c: the driver of the compressed reduce-scatter, method-agnostic: state, units and
 * their method state, the wire method and `none` fallback, the plan and its per-peer layout;
 * the element work is a backend's, through fc_backend.h. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include "driver/fc_core_impl.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/fc_half.h"
#include "common/fc_quant.h"
#include "common/fc_range.h"
#include "common/fc_wire.h"

extern const fc_method fc_method_none;

double fc_core_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

float fc_core_elem_f32(const void *src, int dt, int64_t i)
{
    if (dt == FC_F32)
        return ((const float *)src)[i];
    const uint16_t h = ((const uint16_t *)src)[i];
    return dt == FC_BF16 ? fc_bf16_to_f32(h) : fc_f16_to_f32(h);
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
        free(s->units[u].parts);
        s->units[u].parts = NULL;
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
    free(s->mscr);
    free(s->picks);
    s->picks = NULL;
    free(s->carry);
    s->carry = NULL;
    s->carry_cap = 0;
    s->picks_cap = s->n_picks = 0;
    s->picks_unit = s->bad_unit = -1;
    s->units = NULL;
    s->x = s->acc = NULL;
    s->mscr = NULL;
    s->n_units = s->cap_units = 0;
    s->x_cap = s->acc_cap = 0;
    s->mscr_cap = 0;
}

/* Grows a reusable buffer to what is needed (64-byte multiples), no slack: buffers only grow,
 * so steady-state calls never allocate, and scratch_bytes is what the largest chunk needs (a
 * unit larger than every earlier one regrows once; a slack would be held for good). */
int fc_core_grow(void **p, size_t *cap, size_t need, fc_err *err)
{
    if (need <= *cap)
        return FC_OK;
    size_t want = (need + 63) / 64 * 64;
    void *q = aligned_alloc(64, want);
    if (q == NULL)
        return fc_fail(err, FC_ERR_NOMEM, "could not allocate %zu bytes of scratch", want);
    free(*p);
    *p = q;
    *cap = want;
    return FC_OK;
}

int fc_core_grow_f32(float **p, int64_t *cap, int64_t n, fc_err *err)
{
    size_t c = (size_t)*cap * 4;
    int rc = fc_core_grow((void **)p, &c, (size_t)(n > 0 ? n : 1) * 4, err);
    *cap = (int64_t)(c / 4);
    return rc;
}

/* The unit's method state, created (identically on every rank) at first use. */
int fc_core_ustate(fc_core *s, const fc_method *m, uint32_t unit, float **out, fc_err *err)
{
    *out = NULL;
    if (m->unit_floats == NULL)
        return FC_OK;
    float **slot;
    if (unit < (uint32_t)s->n_units) {
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
    if (unit >= (uint32_t)s->n_units)
        return fc_fail(err, FC_ERR_VALUE, "unit %u was never begun", unit);
    return fc_core_ustate(s, fc_core_unit_method(s, s->units[unit].numel), unit, out, err);
}

int fc_core_single_state(fc_core *s, uint32_t unit, float **out, fc_err *err)
{
    return fc_core_ustate(s, s->method, unit, out, err);
}

void fc_core_sync_span(fc_core *s, uint32_t unit, float **data, int64_t *len)
{
    *data = NULL;
    *len = 0;
    if (unit >= (uint32_t)s->n_units || s->units[unit].ustate == NULL)
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

/* fc_core_wire_method's rule, computed (the plan keeps its answer). */
static const fc_method *wire_rule(const fc_core *s, int64_t numel, int world, int dtype)
{
    const fc_method *m = fc_core_unit_method(s, numel);
    /* a parts table's payload is as small as the table makes it: its fp32 parts are exact */
    if (m == &fc_method_none || (m->flags & (FC_VARSIZE | FC_PARTS)) || numel <= 0 || world < 1)
        return m;
    /* a unit's chunks have two lengths at most: ceil(N / W), and the last non-empty one's */
    const int64_t per = fc_chunk_per(numel, world), last = fc_chunk_last(numel, per);
    if (m->fetch_k != NULL && fc_core_fetch_k(s, m, per) > 0)
        dtype = FC_BF16; /* `none` at 2 bytes per element: no larger than any dtype's */
    return no_smaller(s, m, per, dtype) || no_smaller(s, m, last, dtype) ? &fc_method_none : m;
}

const fc_method *fc_core_wire_method(const fc_core *s, int64_t numel, int world, int dtype)
{
    if (numel <= 0 || world < 1)
        return fc_core_unit_method(s, numel);
    const fc_plan p = fc_core_plan_of(s, numel, dtype, world);
    return p.wire;
}

void fc_chunk_span(int64_t n, int world, int c, int64_t *start, int64_t *len)
{
    fc_chunk_span_per(n, fc_chunk_per(n, world), c, start, len);
}

fc_chunk fc_core_make_chunk(const fc_core *s, const fc_method *m, int64_t n, int world, int dtype,
                            uint32_t unit, uint32_t chunk, int rank)
{
    fc_chunk c;
    c.cfg = m == s->method ? (const void *)s->cfg : NULL;
    c.n = n;
    c.world = world;
    c.wire_dtype = dtype;
    c.rng_shared = fc_chunk_shared_rng((uint64_t)s->common.seed, chunk, unit, s->step);
    c.rng = fc_chunk_sender_rng(c.rng_shared, rank);
    c.scratch = s->mscr;
    c.ustate = NULL;
    c.at = 0;
    c.parts = NULL;
    /* where the chunk lies in its unit, for a method that reads the unit's parts table: chunk
     * c < world is the reduce-scatter's chunk c (the plan's chunk rule); chunk world + r is rank
     * r's reduced shard in an all-reduce's all-gather half (_shard_gather.py), ceil(numel / world)
     * elements from r times that, the last shard's tail past the unit in no part (padding). A
     * chunk of another length (a piece, compress() of other data) has the default table. */
    if ((m->flags & FC_PARTS) && unit < (uint32_t)s->n_units && s->units[unit].parts != NULL &&
        world >= 1) {
        const int64_t numel = s->units[unit].numel, per = fc_chunk_per(numel, world);
        int64_t start, len;
        if (chunk < (uint32_t)world) {
            fc_chunk_span(numel, world, (int)chunk, &start, &len);
        } else {
            start = ((int64_t)chunk - world) * per;
            len = chunk < 2u * (uint32_t)world ? per : -1;
        }
        if (len == n) {
            c.at = start;
            c.parts = s->units[unit].parts;
        }
    }
    return c;
}

int64_t fc_core_chunk_bytes(const fc_core *s, const fc_method *m, const fc_chunk *c)
{
    (void)s;
    if (c->n == 0)
        return 0;
    fc_layout l;
    m->layout(c, &l);
    return fc_align_up(FC_HEADER_BYTES + fc_layout_bytes(&l));
}

int64_t fc_payload_bytes(const fc_core *s, const fc_method *m, int64_t n, int dtype)
{
    if (n == 0)
        return 0;
    fc_chunk c = fc_core_make_chunk(s, m, n, 1, dtype, 0, 0, 0);
    c.at = 0; /* a chunk of no unit: the default parts table */
    c.parts = NULL;
    return fc_core_chunk_bytes(s, m, &c);
}

int64_t fc_core_single_payload(const fc_core *s, int64_t n, uint32_t unit, uint32_t chunk, int world)
{
    if (!(s->method->flags & FC_PARTS))
        return fc_payload_bytes(s, s->method, n, FC_F32);
    const fc_chunk c = fc_core_make_chunk(s, s->method, n, world, FC_F32, unit, chunk, 0);
    return fc_core_chunk_bytes(s, s->method, &c);
}

int64_t fc_core_chunk_payload(const fc_core *s, const fc_plan *p, int64_t unit, int c, int64_t n)
{
    if (n == 0 || !(p->wire->flags & FC_PARTS))
        return fc_plan_payload(p, n);
    const fc_chunk ch = fc_core_make_chunk(s, p->wire, n, p->world, p->dtype,
                                           unit < 0 ? UINT32_MAX : (uint32_t)unit, (uint32_t)c, 0);
    return fc_core_chunk_bytes(s, p->wire, &ch);
}

static int64_t fetch_kmax_rule(const fc_core *s, const fc_method *m, int64_t N, int world);

/* The body layout of a chunk of n elements as m writes it over `world` ranks. */
static void body_layout(const fc_core *s, const fc_method *m, int64_t n, int world, int dtype,
                        fc_layout *l)
{
    fc_chunk c;
    memset(&c, 0, sizeof(c));
    memset(l, 0, sizeof(*l));
    if (n == 0)
        return;
    c.cfg = m == s->method ? (const void *)s->cfg : NULL;
    c.n = n;
    c.world = world;
    c.wire_dtype = dtype;
    m->layout(&c, l);
}

static void plan_make(const fc_core *s, int64_t numel, int dtype, int world, fc_plan *p)
{
    memset(p, 0, sizeof(*p));
    p->numel = numel;
    p->dtype = dtype;
    p->world = world;
    p->wire = wire_rule(s, numel, world, dtype);
    p->per = fc_chunk_per(numel, world);
    p->last = fc_chunk_last(numel, p->per);
    p->pay_per = fc_payload_bytes(s, p->wire, p->per, dtype);
    p->pay_last = fc_payload_bytes(s, p->wire, p->last, dtype);
    body_layout(s, p->wire, p->per, world, dtype, &p->body_per);
    body_layout(s, p->wire, p->last, world, dtype, &p->body_last);
    /* any dtype: a unit with a second round falls back alike for all of them */
    p->fetch_kmax = fetch_kmax_rule(s, dtype == FC_F32 ? p->wire : wire_rule(s, numel, world, FC_F32),
                                    numel, world);
    p->used = 1;
}

fc_plan fc_core_plan_of(const fc_core *s, int64_t numel, int dtype, int world)
{
    uint64_t h = (uint64_t)numel * 0x9E3779B97F4A7C15ull ^ (uint64_t)world * 0xBF58476D1CE4E5B9ull ^
                 (uint64_t)dtype * 0x94D049BB133111EBull;
    /* the table is a memo of pure functions of s's method and config: filling it through a
     * const State changes nothing any caller can see (one State, one thread: fc_state_enter) */
    fc_plan *slot = (fc_plan *)&s->plans[(h ^ (h >> 29)) % FC_PLAN_SLOTS];
    if (!(slot->used && slot->numel == numel && slot->dtype == dtype && slot->world == world))
        plan_make(s, numel, dtype, world, slot);
    return *slot;
}

void fc_core_plan(const fc_core *s, int64_t numel, int dtype, int world, int rank, int64_t unit,
                  int64_t *send_splits, int64_t *recv_splits)
{
    const fc_plan p = fc_core_plan_of(s, numel, dtype, world);
    int64_t start, own;
    fc_chunk_span_per(numel, p.per, rank, &start, &own);
    /* every sender's payload of the own chunk: one table, every rank's (the header checks it) */
    const int64_t p_own = fc_core_chunk_payload(s, &p, unit, rank, own);
    for (int c = 0; c < world; c++) {
        int64_t len;
        fc_chunk_span_per(numel, p.per, c, &start, &len);
        int skip = c == rank && !s->common.compress_own_chunk;
        send_splits[c] = skip ? 0 : fc_core_chunk_payload(s, &p, unit, c, len);
        recv_splits[c] = skip ? 0 : p_own;
    }
}

int fc_core_check_recv(const fc_core *s, int64_t numel, int dtype, int world, int rank,
                       int64_t unit, int64_t have, int64_t *recvs, fc_err *err)
{
    const fc_method *m = fc_core_wire_method(s, numel, world, dtype);
    const int varsize = (m->flags & FC_VARSIZE) != 0;
    int64_t sends[FC_MAX_WORLD], total = 0;
    fc_core_plan(s, numel, dtype, world, rank, unit, sends, recvs);
    for (int r = 0; r < world; r++)
        total += recvs[r];
    /* data-dependent sizes: the plan is an upper bound and the payloads lie back to back */
    if (varsize ? have > total : have != total)
        return fc_fail(err, FC_ERR_PAYLOAD, "receive buffer has %lld bytes, the plan for %lld "
                       "elements over %d ranks needs %s%lld%s", (long long)have, (long long)numel,
                       world, varsize ? "at most " : "", (long long)total,
                       (m->flags & FC_PARTS) ? " by this rank's parts table of the unit: every rank "
                       "must set_parts() the same table" : "");
    return FC_OK;
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

/* Whether chunk ci of this unit has a payload: not empty, and not the own chunk kept exact. */
int fc_core_has_payload(const fc_core *s, int64_t N, int world, int rank, int ci)
{
    int64_t start, n;
    fc_chunk_span(N, world, ci, &start, &n);
    return fc_chunk_sent(n, ci, rank, !s->common.compress_own_chunk);
}

fc_header_key fc_core_header_key(const fc_core *s, const fc_method *m, const fc_chunk *c)
{
    /* a parts table decides the body's layout: ranks whose tables differ must refuse each
     * other's payloads, not decode them as garbage */
    const uint32_t parts = (m->flags & FC_PARTS) && c->parts != NULL ? c->parts->hash : 0u;
    return fc_chunk_header_key(m->id, c->wire_dtype, c->world, c->rng_shared.unit,
                               c->rng_shared.step, s->fingerprint ^ parts);
}

fc_call_key fc_core_call_key(const fc_core *s, uint32_t unit, int world, int rank, int64_t numel)
{
    fc_call_key k = {unit, s->step, world, rank, numel};
    return k;
}

int fc_core_same_call(const fc_call_key *a, const fc_call_key *b)
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
int fc_core_chunk_parts(const fc_core *s, const fc_method *m, int64_t N, int world, int rank, int c,
                        int64_t *len)
{
    int64_t start, n;
    fc_chunk_span(N, world, c, &start, &n);
    if (!fc_core_has_payload(s, N, world, rank, c)) {
        *len = n;
        return 1;
    }
    return pieces_of(s, m, n, len);
}

/* Bytes of piece p of a chunk of n elements cut into pieces of len. */
int64_t fc_core_piece_bytes(const fc_core *s, const fc_method *m, int64_t n, int64_t len, int p,
                            int dtype)
{
    const int64_t a = p * len;
    return fc_payload_bytes(s, m, n - a < len ? n - a : len, dtype);
}

/* Bytes of all the parts of chunk c (0 without payload): every piece but the last is full. */
int64_t fc_core_chunk_part_bytes(const fc_core *s, const fc_method *m, int64_t N, int dtype,
                                 int world, int rank, int c)
{
    int64_t start, n, len;
    fc_chunk_span(N, world, c, &start, &n);
    const int parts = fc_core_chunk_parts(s, m, N, world, rank, c, &len);
    if (!fc_core_has_payload(s, N, world, rank, c))
        return 0;
    return (parts - 1) * fc_core_piece_bytes(s, m, n, len, 0, dtype) +
           fc_core_piece_bytes(s, m, n, len, parts - 1, dtype);
}

void fc_core_piece_plan(const fc_core *s, int64_t numel, int dtype, int world, int rank, int chunk,
                        int64_t *sizes, int *count)
{
    const fc_method *m = fc_core_wire_method(s, numel, world, dtype);
    const int payload = fc_core_has_payload(s, numel, world, rank, chunk);
    int64_t start, n, len;
    fc_chunk_span(numel, world, chunk, &start, &n);
    *count = fc_core_chunk_parts(s, m, numel, world, rank, chunk, &len);
    for (int p = 0; p < *count; p++)
        sizes[p] = payload ? fc_core_piece_bytes(s, m, n, len, p, dtype) : 0;
}

/* Why a unit cannot be exchanged one payload at a time (NULL: it can). */
const char *fc_core_not_per_peer(const fc_core *s, const fc_method *m, int64_t N, int world)
{
    if (m->flags & FC_VARSIZE)
        return "has data-dependent payload sizes (the receivers learn them in one exchange)";
    if (m->flags & FC_PARTS) /* pieces would cut the parts table's spans: not built yet */
        return "cuts its chunks by the unit's parts table, which the per-peer pieces do not follow yet";
    if (fc_core_fetch_kmax(s, N, world) > 0)
        return "has a second round (the owner picks coordinates from all payloads)";
    if (m->aggregate != NULL && m->agg_bytes != NULL)
        return "sums the payloads in the compressed domain before decoding them";
    return NULL;
}

int fc_core_per_peer_ok(const fc_core *s, int64_t numel, int world)
{
    return fc_core_not_per_peer(s, fc_core_unit_method(s, numel), numel, world) == NULL;
}

/* ---- the second round's first step ----
 * A method with a second round (fc_method.fetch_k, Sketched-SGD) has its owner pick coordinates
 * from the summed payloads inside fc_drive_decode. The core does that through the method table's
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

/* fc_core_fetch_kmax's rule, m the unit's wire method for fp32 (the plan keeps its answer). */
static int64_t fetch_kmax_rule(const fc_core *s, const fc_method *m, int64_t N, int world)
{
    if (m->fetch_k == NULL || N == 0 || (world == 1 && !s->common.compress_own_chunk))
        return 0;
    return fc_core_fetch_k(s, m, fc_chunk_per(N, world)); /* chunk 0 is the longest */
}

int64_t fc_core_fetch_kmax(const fc_core *s, int64_t N, int world)
{
    if (N <= 0 || world < 1)
        return 0;
    return fc_core_plan_of(s, N, FC_F32, world).fetch_kmax;
}

/* The counting rules of fc_core.h: a payload sent, a call, whether a call takes the error sample.
 * The driver (fc_drive.c) applies them for both backends. */
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

/* ---- the parts table of an FC_PARTS method (adaptive) ---- */

/* FNV-1a over the table's bytes, folded to 32 bits: every rank computes it alike. */
static uint32_t parts_hash(const int64_t *ends, const uint8_t *rungs, int64_t count)
{
    uint64_t h = 0xcbf29ce484222325ull;
    const unsigned char *b = (const unsigned char *)ends;
    for (size_t i = 0; i < (size_t)count * 8; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    for (int64_t i = 0; i < count; i++)
        h = (h ^ rungs[i]) * 0x100000001b3ull;
    h = (h ^ (uint64_t)count) * 0x100000001b3ull;
    return (uint32_t)(h ^ (h >> 32));
}

int fc_core_set_parts(fc_core *s, int64_t unit, const int64_t *ends, const uint8_t *rungs,
                      int64_t count, fc_err *err)
{
    if (unit < 0 || unit >= s->n_units)
        return fc_fail(err, FC_ERR_VALUE, "unit must be one begin() gave out, in [0, %d), got %lld",
                       s->n_units, (long long)unit);
    const int64_t numel = s->units[unit].numel;
    const fc_method *m = fc_core_unit_method(s, numel);
    if (!(s->method->flags & FC_PARTS))
        return fc_fail(err, FC_ERR_VALUE, "set_parts: method '%s' has no parts table (only "
                       "'adaptive' has one)", s->method->name);
    if (!(m->flags & FC_PARTS))
        return fc_fail(err, FC_ERR_VALUE, "set_parts: unit %lld has %lld elements, below "
                       "min_numel=%lld: it goes as 'none' and has no parts table", (long long)unit,
                       (long long)numel, (long long)s->common.min_numel);
    if ((s->enc.open && s->enc.key.unit == (uint32_t)unit) ||
        (s->dec_call.open && s->dec_call.key.unit == (uint32_t)unit))
        return fc_fail(err, FC_ERR_STATE, "set_parts: unit %lld has a call in progress; replace "
                       "its table between calls", (long long)unit);
    if (count < 1 || count > (numel > 0 ? numel : 1))
        return fc_fail(err, FC_ERR_VALUE, "set_parts: a unit of %lld elements has 1 to %lld parts, "
                       "got %lld", (long long)numel, (long long)(numel > 0 ? numel : 1),
                       (long long)count);
    for (int64_t i = 0; i < count; i++) {
        const int64_t prev = i > 0 ? ends[i - 1] : 0;
        if (ends[i] <= prev && !(numel == 0 && count == 1))
            return fc_fail(err, FC_ERR_VALUE, "set_parts: ends must be strictly ascending and "
                           "positive, got ends[%lld]=%lld after %lld", (long long)i,
                           (long long)ends[i], (long long)prev);
        if (rungs[i] >= m->rungs)
            return fc_fail(err, FC_ERR_VALUE, "set_parts: rungs[%lld]=%d is out of range: '%s' has "
                           "%d rungs (0 to %d)", (long long)i, rungs[i], m->name, m->rungs,
                           m->rungs - 1);
    }
    if (ends[count - 1] != numel)
        return fc_fail(err, FC_ERR_VALUE, "set_parts: the last end must be the unit's numel %lld, "
                       "got %lld", (long long)numel, (long long)ends[count - 1]);
    fc_parts *p = NULL;
    if (!(count == 1 && rungs[0] == 0)) { /* the default table is kept as NULL: one hash for it */
        /* one block: the struct, the ends (8-byte aligned after it), the rungs */
        const size_t head = (sizeof(fc_parts) + 7) / 8 * 8;
        unsigned char *b = (unsigned char *)malloc(head + (size_t)count * 9);
        if (b == NULL)
            return fc_fail(err, FC_ERR_NOMEM, "could not allocate a parts table of %lld parts",
                           (long long)count);
        p = (fc_parts *)b;
        int64_t *e = (int64_t *)(b + head);
        uint8_t *r = b + head + (size_t)count * 8;
        memcpy(e, ends, (size_t)count * 8);
        memcpy(r, rungs, (size_t)count);
        p->count = count;
        p->ends = e;
        p->rungs = r;
        p->hash = parts_hash(e, r, count);
    }
    free(s->units[unit].parts);
    s->units[unit].parts = p;
    return FC_OK;
}
