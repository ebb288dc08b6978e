/* m_adaptive.c: `adaptive`, a per-weight codec choice under a byte budget (L-GreCo, issue 39).
 * The unit's parts table (fc_chunk.parts, set by Python's chooser through set_parts) cuts the
 * unit into spans, each sent as one rung of a fixed ladder of other methods; a chunk's body is
 * the concatenation of its spans' bodies, each at an 8-byte aligned offset. */
#include <string.h>
#include "methods/fc_adaptive.h"
#include "methods/fc_method.h"

/* The same rungs, in the same order, as fsdpcomp/_budget.py's LADDER (a test holds them equal):
 * exact to ~90x. Error feedback is the composite's (a common key), off by default. */
#define DCT(name, k)                                                                          \
    {name, "dct", {{"block", 128, NULL}, {"k", k, NULL}, {"quantize", 0, "intN"},             \
                   {"value_bits", 3, NULL}}}
const fc_rung fc_adaptive_ladder[FC_ADAPTIVE_RUNGS] = {
    {"fp32", "none", {{NULL, 0, NULL}}},
    {"bf16", "bf16", {{NULL, 0, NULL}}},
    {"int8", "int8", {{NULL, 0, NULL}}},
    {"intN 4-bit", "intN", {{"bits", 4, NULL}}},
    {"intN 3-bit", "intN", {{"bits", 3, NULL}}},
    {"intN 2-bit", "intN", {{"bits", 2, NULL}}},
    DCT("dct 32/128", 32), DCT("dct 24/128", 24), DCT("dct 15/128", 15),
    DCT("dct 12/128", 12), DCT("dct 8/128", 8), DCT("dct 4/128", 4),
};

/* Each rung's method and parsed config, built once from the key tables (a pure function of the
 * ladder, so every State and every rank holds the same bytes). */
static const fc_method *rung_m[FC_ADAPTIVE_RUNGS];
static _Alignas(16) unsigned char rung_cfg[FC_ADAPTIVE_RUNGS][FC_CFG_MAX];
static int built;

static int ladder_build(fc_err *err)
{
    if (built)
        return FC_OK;
    for (int r = 0; r < FC_ADAPTIVE_RUNGS; r++) {
        const fc_rung *g = &fc_adaptive_ladder[r];
        const fc_method *m = fc_method_by_name(g->method);
        if (m == NULL || (m->flags & (FC_VARSIZE | FC_PARTS)) || m->fetch_k != NULL ||
            m->unit_floats != NULL)
            return fc_fail(err, FC_ERR_STATE, "internal: adaptive's rung '%s' needs a fixed-size, "
                           "stateless method, '%s' is not one", g->name, g->method);
        void *cfg = rung_cfg[r];
        memset(cfg, 0, FC_CFG_MAX);
        fc_keys_defaults(m->keys, cfg);
        for (int i = 0; i < FC_RUNG_SETS && g->set[i].key != NULL; i++) {
            int rc = fc_keys_set(m->keys, cfg, g->set[i].key, g->set[i].value, g->set[i].choice, err);
            if (rc != FC_OK)
                return rc;
        }
        if (m->check != NULL) {
            int rc = m->check(cfg, err);
            if (rc != FC_OK)
                return rc;
        }
        rung_m[r] = m;
    }
    built = 1;
    return FC_OK;
}

/* ---- walking a chunk's parts */

/* The spans of chunk c, in order: part `part` (its index in the table) covers [lo, hi) of the
 * unit, as rung `rung`. No table: one span of rung 0, the whole chunk. */
typedef struct {
    const fc_chunk *c;
    int64_t part, lo, hi;
    int rung;
} walk;

static int walk_first(const fc_chunk *c, walk *w)
{
    w->c = c;
    w->lo = c->at;
    if (c->n <= 0)
        return 0;
    const fc_parts *p = c->parts;
    if (p == NULL) {
        w->part = 0;
        w->hi = c->at + c->n;
        w->rung = 0;
        return 1;
    }
    if (c->at >= p->ends[p->count - 1])
        return 0; /* an all-gather shard wholly past the unit: padding, in no part */
    int64_t a = 0, b = p->count - 1; /* the first part whose end lies past c->at */
    while (a < b) {
        const int64_t mid = a + (b - a) / 2;
        if (p->ends[mid] > c->at)
            b = mid;
        else
            a = mid + 1;
    }
    w->part = a;
    w->hi = p->ends[a] < c->at + c->n ? p->ends[a] : c->at + c->n;
    w->rung = p->rungs[a];
    return 1;
}

static int walk_next(walk *w)
{
    const fc_chunk *c = w->c;
    const int64_t end = c->at + c->n;
    if (w->hi >= end || c->parts == NULL || w->part + 1 >= c->parts->count)
        return 0;
    w->part++;
    w->lo = w->hi;
    w->hi = c->parts->ends[w->part] < end ? c->parts->ends[w->part] : end;
    w->rung = c->parts->rungs[w->part];
    return 1;
}

/* The span's own chunk: its rung's config and length, its own random streams (keyed by the part
 * index too, so two spans never draw the same numbers), the composite's scratch. */
static uint32_t part_mix(int64_t part)
{
    return 0x9E3779B9u * (uint32_t)(part + 1);
}

static fc_chunk sub_chunk(const walk *w)
{
    fc_chunk s = *w->c;
    const uint32_t mix = part_mix(w->part);
    s.cfg = rung_cfg[w->rung];
    s.n = w->hi - w->lo;
    s.rng.key0 ^= mix;
    s.rng_shared.key0 ^= mix;
    s.ustate = NULL;
    s.at = 0;
    s.parts = NULL;
    return s;
}

static int64_t align8(int64_t v)
{
    return (v + 7) / 8 * 8;
}

/* ---- the method */

static const char *const objectives[] = {"l-greco", "per-param", NULL};

static const fc_key adaptive_keys[] = {
    FC_FLOAT(fc_adaptive_cfg, ratio, 32, 1, 1e6, FC_KEY_OPEN_LO,
             "the byte budget the chooser keeps to: raw bytes / ratio"),
    FC_INT(fc_adaptive_cfg, every, 50, 1, 1 << 30, 0, "steps between two choices of the parts tables"),
    FC_CHOICE(fc_adaptive_cfg, objective, FC_ADAPTIVE_LGRECO, objectives,
              "l-greco: least summed error within the budget over all weights; per-param: each "
              "weight within its own share"),
    FC_KEYS_END,
};

static int adaptive_check(void *cfg, fc_err *err)
{
    (void)cfg;
    return ladder_build(err);
}

/* out += one part's layout l, placed after `pad` zero bytes of alignment (counted as meta). */
static void add_part(fc_layout *out, const fc_layout *l, int64_t pad)
{
    out->meta_bytes += pad + l->meta_bytes;
    out->value_bytes += l->value_bytes;
    out->index_bytes += l->index_bytes;
    out->kept += l->kept;
}

/* Each span's sub-layout at an 8-byte aligned offset: a sub-method sees the alignment it would
 * see as a whole body; the padding counts as meta bytes. */
static void adaptive_layout(const fc_chunk *c, fc_layout *out)
{
    memset(out, 0, sizeof(*out));
    fc_err err = {0};
    if (ladder_build(&err) != FC_OK)
        return;
    int64_t off = 0;
    walk w;
    for (int more = walk_first(c, &w); more; more = walk_next(&w)) {
        const fc_chunk s = sub_chunk(&w);
        fc_layout l;
        memset(&l, 0, sizeof(l));
        rung_m[w.rung]->layout(&s, &l);
        add_part(out, &l, align8(off) - off);
        off = align8(off) + fc_layout_bytes(&l);
    }
}

static size_t adaptive_scratch(const void *cfg, int64_t n)
{
    (void)cfg;
    size_t most = 0;
    fc_err err = {0};
    if (ladder_build(&err) != FC_OK)
        return 0;
    for (int r = 0; r < FC_ADAPTIVE_RUNGS; r++) {
        const size_t b = rung_m[r]->scratch_bytes ? rung_m[r]->scratch_bytes(rung_cfg[r], n) : 0;
        most = b > most ? b : most;
    }
    return most;
}

static int adaptive_encode(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used,
                           fc_err *err)
{
    memset(used, 0, sizeof(*used));
    int rc = ladder_build(err);
    if (rc != FC_OK)
        return rc;
    int64_t off = 0;
    walk w;
    for (int more = walk_first(c, &w); more; more = walk_next(&w)) {
        const fc_chunk s = sub_chunk(&w);
        const int64_t at = align8(off);
        memset(body + off, 0, (size_t)(at - off)); /* no uninitialised byte on the wire */
        fc_layout want, l;
        memset(&l, 0, sizeof(l));
        rung_m[w.rung]->layout(&s, &want);
        rc = rung_m[w.rung]->encode(&s, x + (w.lo - c->at), body + at, &l, err);
        if (rc != FC_OK)
            return rc;
        if (fc_layout_bytes(&l) != fc_layout_bytes(&want))
            return fc_fail(err, FC_ERR_STATE, "internal: adaptive's rung '%s' wrote %lld bytes, "
                           "its layout has %lld", fc_adaptive_ladder[w.rung].name,
                           (long long)fc_layout_bytes(&l), (long long)fc_layout_bytes(&want));
        add_part(used, &l, at - off);
        used->saturated += l.saturated;
        off = at + fc_layout_bytes(&l);
    }
    return FC_OK;
}

static int adaptive_decode_add(const fc_chunk *c, const uint8_t *body, int64_t body_bytes,
                               float alpha, float *acc, fc_err *err)
{
    int rc = ladder_build(err);
    if (rc != FC_OK)
        return rc;
    int64_t off = 0;
    walk w;
    for (int more = walk_first(c, &w); more; more = walk_next(&w)) {
        const fc_chunk s = sub_chunk(&w);
        fc_layout l;
        memset(&l, 0, sizeof(l));
        rung_m[w.rung]->layout(&s, &l);
        const int64_t at = align8(off), b = fc_layout_bytes(&l);
        if (at + b > body_bytes) /* checked before a sub-decoder reads a byte of it */
            return fc_fail(err, FC_ERR_PAYLOAD, "adaptive body of %lld bytes: part %lld (%s, %lld "
                           "elements) needs bytes [%lld, %lld)", (long long)body_bytes,
                           (long long)w.part, fc_adaptive_ladder[w.rung].name, (long long)s.n,
                           (long long)at, (long long)(at + b));
        rc = rung_m[w.rung]->decode_add(&s, body + at, b, alpha, acc + (w.lo - c->at), err);
        if (rc != FC_OK)
            return rc;
        off = at + b;
    }
    if (off != body_bytes)
        return fc_fail(err, FC_ERR_PAYLOAD, "adaptive body of %lld bytes, its parts use %lld",
                       (long long)body_bytes, (long long)off);
    return FC_OK;
}

int64_t fc_adaptive_spans(const fc_chunk *c, fc_adaptive_span *out, int64_t cap)
{
    fc_err err = {0};
    if (ladder_build(&err) != FC_OK)
        return 0;
    int64_t k = 0, off = 0;
    walk w;
    for (int more = walk_first(c, &w); more; more = walk_next(&w), k++) {
        const fc_chunk s = sub_chunk(&w);
        fc_layout l;
        memset(&l, 0, sizeof(l));
        rung_m[w.rung]->layout(&s, &l);
        const int64_t at = align8(off);
        off = at + fc_layout_bytes(&l);
        if (k >= cap)
            continue;
        out[k].m = rung_m[w.rung];
        out[k].cfg = rung_cfg[w.rung];
        out[k].lo = w.lo - c->at;
        out[k].n = s.n;
        out[k].at = at;
        out[k].bytes = fc_layout_bytes(&l);
        out[k].mix = part_mix(w.part); /* sub_chunk's */
    }
    return k;
}

const fc_method fc_method_adaptive = {
    .name = "adaptive",
    .id = FC_ID_ADAPTIVE,
    .flags = FC_PARTS,
    .summary = "per-weight codec choice under a byte budget (L-GreCo): each span of a unit's "
               "parts table goes as one rung of a ladder, fp32 / bf16 / int8 / intN 4-2 bit / "
               "dct 32-4 of 128; CPU and CUDA (each span through its rung's kernels)",
    .cfg_size = sizeof(fc_adaptive_cfg),
    .keys = adaptive_keys,
    .check = adaptive_check,
    .layout = adaptive_layout,
    .scratch_bytes = adaptive_scratch,
    .encode = adaptive_encode,
    .decode_add = adaptive_decode_add,
    .rungs = FC_ADAPTIVE_RUNGS,
};
