/* fc_method.h: the compressor table. Each method is one C file that fills one fc_method: its
 * config keys, its payload layout (a pure function of config and chunk size), encode and
 * decode-accumulate. The reduce-scatter driver (fc_core.c) knows nothing method-specific. */
#ifndef FC_METHOD_H
#define FC_METHOD_H

#include <stddef.h>
#include <stdint.h>
#include "methods/fc_cfg.h"
#include "common/fc_method_id.h"
#include "common/fc_rng.h"
#include "common/fc_status.h"

/* ---- config keys: one table per method, parsed and validated by fc_config.c ---- */

typedef enum { FC_KEY_END = 0, FC_KEY_BOOL, FC_KEY_INT, FC_KEY_FLOAT, FC_KEY_CHOICE, FC_KEY_REMOVED } fc_key_kind;

#define FC_KEY_POW2 1u     /* INT: must be a power of two */
#define FC_KEY_OPEN_LO 2u  /* FLOAT: lower bound excluded */
#define FC_KEY_LOCAL 4u    /* a rank's own choice: not part of the wire fingerprint */

typedef struct {
    const char *name;
    fc_key_kind kind;
    size_t offset; /* BOOL and CHOICE: int; INT: int64_t; FLOAT: double; REMOVED: none */
    double def;    /* CHOICE: index into choices; REMOVED: its value in the fingerprint */
    double lo, hi; /* inclusive range for INT and FLOAT */
    unsigned flags;
    const char *const *choices; /* NULL-terminated, CHOICE only */
    const char *doc; /* REMOVED: why it went */
} fc_key;

#define FC_BOOL(T, f, def, doc) {#f, FC_KEY_BOOL, offsetof(T, f), (def), 0, 1, 0, NULL, doc}
#define FC_INT(T, f, def, lo, hi, fl, doc) {#f, FC_KEY_INT, offsetof(T, f), (def), (lo), (hi), (fl), NULL, doc}
#define FC_FLOAT(T, f, def, lo, hi, fl, doc) {#f, FC_KEY_FLOAT, offsetof(T, f), (def), (lo), (hi), (fl), NULL, doc}
#define FC_CHOICE(T, f, def, ch, doc) {#f, FC_KEY_CHOICE, offsetof(T, f), (def), 0, 0, 0, (ch), doc}
/* A key each rank may set alone (FC_KEY_LOCAL): it never changes what goes on the wire. */
#define FC_BOOL_LOCAL(T, f, def, doc) {#f, FC_KEY_BOOL, offsetof(T, f), (def), 0, 1, FC_KEY_LOCAL, NULL, doc}
#define FC_CHOICE_LOCAL(T, f, def, ch, doc) {#f, FC_KEY_CHOICE, offsetof(T, f), (def), 0, 0, FC_KEY_LOCAL, (ch), doc}
/* A key that was removed: a config naming it is refused, saying why. One that was part of the
 * fingerprint keeps its place there with the value every config had (`def`: a bool, an int or a
 * choice's index), so payload headers stay byte for byte what they were; nothing else (the
 * resolved config, method_info, the list of valid keys) shows it. */
#define FC_REMOVED(name, def, fl, why) {name, FC_KEY_REMOVED, 0, (def), 0, 0, (fl), NULL, why}
#define FC_KEYS_END {NULL, FC_KEY_END, 0, 0, 0, 0, 0, NULL, NULL}

/* ---- element types of gradients and residuals ---- */

/* FC_I64: index tensors only (adaptive's parts table), never a gradient or a wire buffer. */
typedef enum { FC_F32 = 0, FC_BF16 = 1, FC_F16 = 2, FC_U8 = 3, FC_I64 = 4, FC_DTYPE_COUNT } fc_dtype;

static inline int64_t fc_dtype_size(int dt)
{
    return dt == FC_F32 ? 4 : dt == FC_U8 ? 1 : dt == FC_I64 ? 8 : 2;
}

/* A unit's parts table (adaptive, FC_PARTS): part i covers [ends[i-1], ends[i]) of the unit
 * (ends[-1] = 0, ends[count-1] = the unit's numel) and goes as ladder rung rungs[i]. hash mixes
 * into the payload headers' fingerprint, so ranks whose tables differ refuse each other's
 * payloads. One allocation holds the struct and both arrays (fc_core_set_parts). */
typedef struct {
    int64_t count;
    uint32_t hash;
    const int64_t *ends;
    const uint8_t *rungs;
} fc_parts;

/* ---- one chunk's worth of context handed to a method ---- */

typedef struct {
    const void *cfg;  /* the method's own parsed config struct */
    int64_t n;        /* elements in this chunk */
    int world;        /* W: fp16 pre-divides by it, as torch's FSDP does */
    int wire_dtype;   /* fc_dtype of the gradient (`none` sends it as is) */
    fc_rng rng;        /* the sender's own stream, (seed, rank, step, unit, chunk): rounding */
    fc_rng rng_shared; /* the same on every rank, (seed, step, unit, chunk): shared choices */
    void *scratch;    /* scratch_bytes(cfg, n) bytes, 64-byte aligned, or NULL */
    float *ustate;    /* the unit's persistent method state (unit_floats), or NULL */
    int64_t at;       /* FC_PARTS methods: the chunk's first element within its unit */
    const fc_parts *parts; /* FC_PARTS methods: the unit's parts table; NULL otherwise, and for
                            * the default table (one part of rung 0) */
} fc_chunk;

/* Where a payload body's bytes go; the header is counted apart. */
typedef struct {
    int64_t value_bytes; /* codes or values */
    int64_t meta_bytes;  /* scales, norms, counts */
    int64_t index_bytes; /* coordinates of sparse entries */
    int64_t kept;        /* coordinates carried (n for dense methods): density = kept / n */
    int64_t saturated;   /* encode only: finite values beyond the format's range, clamped to
                            its largest (the driver zeroes it before encode; layout() leaves it) */
} fc_layout;

static inline int64_t fc_layout_bytes(const fc_layout *l)
{
    return l->value_bytes + l->meta_bytes + l->index_bytes;
}

/* A layout without indices (a dense method's, or a sketch's): meta and value bytes, kept of the
 * chunk's coordinates carried; saturated left as it is. */
static inline void fc_layout_set(fc_layout *out, int64_t meta, int64_t value, int64_t kept)
{
    out->meta_bytes = meta;
    out->value_bytes = value;
    out->index_bytes = 0;
    out->kept = kept;
}

/* The exact own chunk a second round's pick adds to its estimates: values [start, start + n) of
 * data (fp32, bf16 or fp16: FC_F32, FC_BF16, FC_F16), read where they lie rather than converted
 * into a chunk-sized copy; a NaN/Inf as the decode's sum takes it (0 in "zero" mode, else the
 * canonical NaN); data NULL: zeros. */
typedef struct {
    const void *data;
    int dtype;
    int zero_bad;
    int64_t start;
} fc_own;

#define FC_UNBIASED 1u    /* E[D(C(x))] = x */
#define FC_LINEAR 2u      /* payloads of different ranks may be summed before one decode */
#define FC_RANDOM 4u      /* uses the counter-based RNG */
#define FC_VARSIZE 8u     /* body size is data-dependent: layout() is an upper bound */
#define FC_EF_DEFAULT 16u /* error feedback on unless the config turns it off */
#define FC_PIECEWISE 32u  /* encodes element- or block-wise: a chunk may go as independent pieces */
/* decode_agg also takes acc == agg (an fp32 sum of the chunk's length at least): then it sets acc
 * to alpha * D(agg) instead of adding, reading each part of agg before it writes over it. A
 * bf16/fp16 output's decode then needs no accumulator beside the sum (fc_decode.c). */
#define FC_AGG_IN_PLACE 64u
/* The body is cut by the unit's parts table (fc_chunk.parts, adaptive): its size depends on the
 * unit, not only on n, so the driver sizes such payloads per chunk and never falls back to
 * `none` by the size rule (the table decides what is exact). */
#define FC_PARTS 128u

typedef struct fc_method {
    const char *name;
    uint8_t id; /* on the wire; stable across versions */
    unsigned flags;
    const char *summary; /* one line for methods_info() and README's table */
    size_t cfg_size;
    const fc_key *keys;
    /* Cross-key checks after parsing; NULL when every key stands alone. */
    int (*check)(void *cfg, fc_err *err);
    /* Exact body layout for a chunk of c->n elements (an upper bound for FC_VARSIZE). */
    void (*layout)(const fc_chunk *c, fc_layout *out);
    /* Scratch the method needs per chunk; NULL for none. */
    size_t (*scratch_bytes)(const void *cfg, int64_t n);
    /* x: c->n finite-or-not fp32 values. Writes the body, and the layout actually used. */
    int (*encode)(const fc_chunk *c, const float *x, uint8_t *body, fc_layout *used, fc_err *err);
    /* acc[i] += alpha * D(body)[i]. body_bytes comes from the (validated) header; the decoder
     * must check anything in the body that could send it out of bounds. */
    int (*decode_add)(const fc_chunk *c, const uint8_t *body, int64_t body_bytes, float alpha,
                      float *acc, fc_err *err);
    /* Optional: receivers sum the payloads in a compressed domain, then decode once (linear
     * methods, and votes). agg_bytes: size of that sum for chunk c (0: no aggregate path);
     * aggregate: agg += body (agg starts zeroed); decode_agg: acc += alpha * D(agg), where
     * `senders` payloads were summed. */
    int64_t (*agg_bytes)(const fc_chunk *c);
    int (*aggregate)(const fc_chunk *c, uint8_t *agg, const uint8_t *body, int64_t body_bytes,
                     fc_err *err);
    int (*decode_agg)(const fc_chunk *c, const uint8_t *agg, int senders, float alpha, float *acc,
                      fc_err *err);
    /* Optional persistent state per unit, identical on every rank (gradiveq's basis):
     * unit_floats(cfg) floats, filled by unit_init at the unit's first use; `rng` is keyed by
     * (seed, unit) only. */
    int64_t (*unit_floats)(const void *cfg);
    void (*unit_init)(const void *cfg, float *ustate, const fc_rng *rng);
    /* Optional: after the decode of `step`, sync_floats floats of the unit state from *offset
     * must be summed over ranks (an extra collective), then sync_apply runs on the sum in place.
     * Returns 0 when no sync is due. */
    int64_t (*sync_floats)(const void *cfg, uint32_t step, int64_t *offset);
    int (*sync_apply)(const void *cfg, float *ustate, fc_err *err);
    /* Optional: refuses a unit state loaded from a checkpoint that this method could not have
     * written (non-finite, not orthonormal, ...); NULL accepts any of the right length. */
    int (*unit_check)(const void *cfg, const float *ustate, fc_err *err);
    /* Optional second round (Sketched-SGD, driven by fc_fetch.c): when fetch_k(c) > 0, the owner
     * of chunk c does not decode the summed payloads but picks fetch_k(c) coordinates from them
     * (own: its exact chunk, read from the gradient, its data NULL for zeros when that was
     * compressed too; idx: ascending), and the
     * senders send their exact values there and keep the rest as residual. decode_add of such a
     * config adds nothing: no value comes from the first round. */
    int64_t (*fetch_k)(const fc_chunk *c);
    int (*pick)(const fc_chunk *c, const uint8_t *agg, const fc_own *own, uint32_t *idx,
                fc_err *err);
    /* Optional: whether error feedback is on by default for this parsed config (NULL: the flag
     * FC_EF_DEFAULT decides). For a method whose receivers, in some modes, apply something else
     * than the sum of the senders' decodes (a vote, heavy hitters of a summed sketch): there a
     * sender's residual cannot be what was applied (docs/methods.md), so it is off by default. */
    int (*ef_default)(const void *cfg);
    /* FC_PARTS: how many ladder rungs a parts table may name (rungs 0 .. rungs - 1). */
    int rungs;
} fc_method;

/* The aggregate hook of methods whose body is one fp32 array: agg += body (fc_linear.c). */
int fc_aggregate_add_f32(const fc_chunk *c, uint8_t *agg, const uint8_t *body, int64_t body_bytes,
                         fc_err *err);

/* The defaults of a key table written into a config struct (fc_config.c's parse starts there;
 * adaptive's ladder builds its rungs' configs from them: fc_keys.c). */
void fc_keys_defaults(const fc_key *keys, void *cfg);
/* Sets key `name` of a parsed config: an INT (or BOOL) to `value`, or a CHOICE to the choice
 * named `choice`. FC_ERR_VALUE when the table has no such key or choice, or the value is out of
 * its range. */
int fc_keys_set(const fc_key *keys, void *cfg, const char *name, double value, const char *choice,
                fc_err *err);

/* The table (methods.c). */
const fc_method *fc_method_by_name(const char *name);
int fc_method_count(void);
const fc_method *fc_method_at(int i);

#endif
