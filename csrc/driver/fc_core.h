/* fc_core.h: the compressed reduce-scatter of one state, on plain pointers (no Python here).
 * Encode: g' = g + e per outgoing chunk, payload per chunk, residual update. Decode: sum in
 * fp32, in rank order, of the own exact chunk and the W-1 decoded payloads, divided by W. */
#ifndef FC_CORE_H
#define FC_CORE_H

#include <stdint.h>
#include "common/fc_chunk_rules.h"
#include "common/fc_counters.h"
#include "methods/fc_method.h"
#include "common/fc_status.h"

#define FC_MAX_WORLD 1024 /* ranks per process group the CPU driver plans for */
/* Elements of a unit or chunk any entry point accepts (2^44: 64 TiB of fp32). Every size
 * product the driver and the methods form (n times a few bytes, plus headers, times the world
 * size) then stays far below 2^63, and a payload's size below the header's 48 bits: sizes are
 * checked once where they come in, never wrapped. */
#define FC_MAX_NUMEL ((int64_t)1 << 44)
#define FC_MAX_PIECES 64  /* pieces per payload in the per-peer exchange */

typedef enum { FC_NONFINITE_PASS = 0, FC_NONFINITE_ZERO = 1 } fc_nonfinite_mode;

/* The keys every method accepts (fc_config.c parses them like a method's own). */
typedef struct {
    int error_feedback;
    double ef_decay;    /* g' = g + ef_decay * e (1: plain error feedback; < 1: DeMo's decay) */
    int residual_dtype; /* 0: fp32, 1: bf16, 2: int8 (packed, fc_res8.h) */
    int64_t seed;
    int64_t min_numel;
    int compress_own_chunk;
    int64_t error_stats_every;
    int nonfinite;
    int allgather_compress; /* all-reduce meaning: compress the all-gather of reduced shards too */
    int pipeline;           /* the Python side's per-peer exchange (fc_drive_encode_part) */
    int64_t pipeline_piece; /* elements per piece of a payload in that exchange (0: whole) */
    int param_gather;       /* FSDP2 parameter all-gather codec: 0 none, 1 bf16, 2 fp8, 3 int8 */
    int64_t param_gather_block_size; /* elements per scale of the fp8/int8 parameter codec */
} fc_common;

typedef struct {
    int64_t numel;      /* fixed the first time the unit is seen; later calls must match */
    double residual_sq; /* ||e||^2 after the unit's latest update */
    int64_t residual_elems;
    float *ustate; /* the method's persistent per-unit state (fc_method.unit_floats), or NULL */
    fc_parts *parts; /* an FC_PARTS method's parts table (fc_core_set_parts); NULL: the default,
                      * the whole unit one part of rung 0 */
} fc_unit;

/* A gradient, output, residual or wire buffer, already validated by the glue. */
typedef struct {
    void *data;
    int64_t numel;
    int dtype; /* fc_dtype */
} fc_buf;

/* Which collective call a part belongs to: a part of another one starts a new call. */
typedef struct {
    uint32_t unit, step;
    int world, rank;
    int64_t numel;
} fc_call_key;

/* What went on the wire for one chunk of an encode call, for the driver to count: its padded
 * size (0: no payload), the layout its body holds and whether a data-dependent method wrote
 * it as `none` (fell back). */
typedef struct {
    int64_t size;
    fc_layout l;
    int none;
} fc_sent;

/* One encode call in progress: fc_drive_encode runs one whole, fc_drive_encode_part a chunk at a
 * time (the pipelined exchange sends each payload as soon as it is encoded). What is counted per
 * call, not per chunk, lives here until the last chunk closes the call. */
typedef struct {
    int open;
    fc_call_key key;
    const fc_method *method; /* the unit's: `none` below min_numel */
    float *ust;
    int use_ef, stats, sample, sampled;
    int fell_back; /* a payload of a data-dependent method went as `none` */
    int todo; /* parts not yet encoded: each chunk's pieces, one part for a chunk without payload */
    int64_t raw;
    double e_sq;
    uint8_t next_piece[FC_MAX_WORLD];
    int64_t at[FC_MAX_WORLD + 1]; /* per-peer layout: where chunk c's parts start; [world]: total */
    fc_sent sent[FC_MAX_WORLD]; /* a whole encode's payloads, as its backend wrote them */
} fc_encode_call;

/* One decode_part call sequence in progress: the own chunk opens it, the other ranks' payloads
 * follow in cyclic order (rank+1, rank+2, ...), each sender's pieces in order; the last part
 * writes the output. */
typedef struct {
    int open;
    fc_call_key key;
    int k, piece;        /* the next part: piece `piece` from rank (rank + k) % world */
    int parts, own_parts; /* pieces per sender, and for the own chunk (1 when kept exact) */
    int64_t len;          /* elements per piece */
    float *ust;
    int passed;           /* a payload of this sum was flagged NONFINITE (its header) */
    int own_exact;        /* the own chunk was added exact (its NaN/Inf pass per element) */
    int64_t own_bad;      /* NaN/Inf of the own chunk: counted when the call completes */
    float *acc;           /* the running sum: s->x (fc_cpu_take_x) */
    int lost;             /* another call took s->x while this one was open */
} fc_decode_call;

/* The plan of one unit shape (numel, dtype, world), a pure function of it and the State's
 * method and config: the wire method and the payload of every chunk, which has one of two
 * lengths (per, and the last non-empty chunk's, last; the chunks after it are empty). Computed
 * once per shape by fc_core_plan_of and kept in the State, so the glue, the driver and both
 * backends read it on every call instead of asking the method table again. */
typedef struct {
    int64_t numel;
    int dtype, world;
    int used;                    /* the slot holds the plan of the key above */
    const fc_method *wire;       /* fc_core_wire_method */
    int64_t per, last;           /* fc_chunk_per, fc_chunk_last */
    int64_t pay_per, pay_last;   /* fc_payload_bytes of a chunk of per / last elements (0: none) */
    fc_layout body_per, body_last; /* their bodies' layouts with `world` (a data-dependent method's
                                    * upper bounds) */
    int64_t fetch_kmax;          /* fc_core_fetch_kmax */
} fc_plan;

/* Plans kept per State: a direct-mapped table, so a shape that collides with another is planned
 * again (the same result), never wrong. */
#define FC_PLAN_SLOTS 256

/* One block of 64 of an 8-bit residual that straddles a part boundary of the call being encoded
 * (fc_res8.c): its new values, staged until the last of them is written, then packed. */
typedef struct {
    int64_t block; /* -1: free */
    int64_t have;  /* values staged so far */
    float v[64];   /* FC_RES8_BLOCK */
} fc_res8_slot;

typedef struct {
    const fc_method *method;
    fc_common common;
    uint32_t fingerprint; /* of the config keys that decide the wire; every header carries it */
    /* 16, not 64: fc_core lives inside a Python object, which CPython aligns to 16 bytes only
     * (UBSan flags misaligned access otherwise); method configs need 8 at most. */
    _Alignas(16) unsigned char cfg[FC_CFG_MAX];
    fc_counters ctr;
    uint32_t step;
    uint32_t cursor; /* index of the next unit within this step */
    fc_unit *units;
    int32_t n_units, cap_units;
    /* The CPU's grow-only scratch, at most 8 B per element of the largest chunk (fc_decode.c's
     * fc_cpu_take_x, fc_cpu_acc): x holds one call's chunk-sized fp32 work at a time: g' of
     * the chunk being encoded, or a decode's running sum, or its compressed-domain sum (the
     * aggregate path); acc is a bf16/fp16 output's compressed-domain sum kept apart from the
     * fp32 sum in x (its own size: fc_decode.c's AGG_APART), and, within an encode call, the
     * rare residual fix's decode. */
    float *x;
    float *acc;
    void *mscr;    /* method scratch */
    float *loose;  /* unit state for compress/decompress of a unit the collective never saw */
    int64_t loose_unit;
    int64_t x_cap, acc_cap;
    size_t mscr_cap;
    /* the second round: the owner's picks from the latest decode (fc_drive_decode writes them,
     * fc_fetch.c reads them), and the unit of the latest encode (whose residuals hold g') */
    uint32_t *picks;
    int64_t picks_cap, n_picks;
    int64_t picks_unit, bad_unit; /* -1: none */
    /* An 8-bit residual read and packed in place by the CPU (fc_res8.c), no unit-sized fp32
     * copy: res8_key is the call's rounding stream (fc_res8_key, set by the caller), carry the
     * straddling blocks of the open call (carry_cap slots, grow-only, in scratch_bytes). */
    uint32_t res8_key;
    fc_res8_slot *carry;
    int64_t carry_cap;
    fc_encode_call enc;
    fc_decode_call dec_call;
    fc_plan plans[FC_PLAN_SLOTS]; /* fc_core_plan_of's memo: a cache, filled through const */
} fc_core;

/* The driver's bookkeeping, one copy for CPU and CUDA tensors (fc_cuda_path.c calls it too):
 * one payload sent (its layout, padded size, elements); one encode call closed (m: the unit's
 * wire method, fell_back: a data-dependent payload went as `none`, raw: the input's bytes);
 * whether this call samples the error statistics; the receive buffer's size against the plan
 * (recvs: the plan's receive sizes). */
void fc_core_count_payload(fc_core *s, const fc_layout *l, int64_t size, int64_t n);
void fc_core_count_call(fc_core *s, const fc_method *m, int64_t numel, int fell_back, int64_t raw);
int fc_core_stats_due(const fc_core *s, const fc_method *m, int64_t numel, int world);
int fc_core_check_recv(const fc_core *s, int64_t numel, int dtype, int world, int rank,
                       int64_t unit, int64_t have, int64_t *recvs, fc_err *err);

/* fingerprint: fc_config_fingerprint of the same config. */
void fc_core_init(fc_core *s, const fc_method *m, const fc_common *common, const void *cfg,
                  uint32_t fingerprint);
void fc_core_free(fc_core *s);

/* The method a unit of n elements uses as far as its size alone says: `none` below min_numel.
 * Where the world and dtype are unknown (unit state, checkpoints, the per-peer test). */
const fc_method *fc_core_unit_method(const fc_core *s, int64_t numel);
/* The method a unit's payloads go out with: `none` below min_numel, and `none` where the
 * method's payload for a chunk of the unit would be no smaller than `none`'s (a sketch table
 * larger than a small unit's chunk, scales and headers on a chunk of a few elements). For
 * fixed-size methods a pure function of (method, config, chunk sizes, dtype), so every rank
 * decides alike without talking; methods with a second round decide against 16-bit `none`,
 * the same answer for every dtype (fetch_kmax has none to give). Data-dependent sizes
 * (FC_VARSIZE) decide per payload when they encode: the header's method id tells the receiver. */
const fc_method *fc_core_wire_method(const fc_core *s, int64_t numel, int world, int dtype);
/* Chunk c of W over n elements: ceil(n / W) each, the last ones shorter or empty. */
void fc_chunk_span(int64_t n, int world, int c, int64_t *start, int64_t *len);
/* Whether chunk ci of a unit of N elements has a payload: not empty, and not the own chunk
 * kept exact. */
int fc_core_has_payload(const fc_core *s, int64_t N, int world, int rank, int ci);
/* Header + body, padded: 0 for an empty chunk. */
int64_t fc_payload_bytes(const fc_core *s, const fc_method *m, int64_t n, int dtype);
/* The plan of a unit of `numel` elements of `dtype` over `world` ranks (world >= 1), from the
 * State's table (planned on its first use there). A copy: the table may replace the slot. */
fc_plan fc_core_plan_of(const fc_core *s, int64_t numel, int dtype, int world);
/* Header + body of chunk c of a plan (0: empty), and its body's layout. */
static inline int64_t fc_plan_payload(const fc_plan *p, int64_t n)
{
    return n == p->per ? p->pay_per : n == p->last ? p->pay_last : 0;
}
static inline const fc_layout *fc_plan_body(const fc_plan *p, int64_t n)
{
    return n == p->per ? &p->body_per : &p->body_last;
}
/* Bytes this rank sends to / receives from each rank for a unit of `numel` elements. A method
 * whose bodies follow the unit's parts table (FC_PARTS) sizes each chunk by the table of `unit`
 * (< 0: the default table). */
void fc_core_plan(const fc_core *s, int64_t numel, int dtype, int world, int rank, int64_t unit,
                  int64_t *send_splits, int64_t *recv_splits);
/* Header + body of chunk c (n elements) of a unit, padded (0: empty): the plan's size, or for an
 * FC_PARTS method the unit's table's. */
int64_t fc_core_chunk_payload(const fc_core *s, const fc_plan *p, int64_t unit, int c, int64_t n);
/* compress()'s payload of n elements as chunk `chunk` of `unit` over `world` ranks (header,
 * body, padding): fc_payload_bytes, or for an FC_PARTS method the unit's table's share of it
 * (fc_core_make_chunk's mapping: the reduce-scatter's chunks, an all-gather half's shards). */
int64_t fc_core_single_payload(const fc_core *s, int64_t n, uint32_t unit, uint32_t chunk, int world);
/* Replaces the parts table of `unit` (an FC_PARTS method's, fc_parts): `count` parts, ends
 * ascending and the last the unit's numel, rungs below the method's; the default table (one part
 * of rung 0) is kept as NULL. Nothing changes when it is refused. */
int fc_core_set_parts(fc_core *s, int64_t unit, const int64_t *ends, const uint8_t *rungs,
                      int64_t count, fc_err *err);

/* Claims a unit for a call of `numel` elements: unit `want` (a unit seen before, or n_units
 * for a new one), or with want < 0 the next one in call order (the cursor). new_step ends the
 * step first (then want < 0 means unit 0). The size is checked against the unit's first call,
 * and nothing changes unless the claim succeeds. */
int fc_core_begin(fc_core *s, int64_t numel, int64_t want, int new_step, uint32_t *unit,
                  fc_err *err);
void fc_core_end_step(fc_core *s);

/* A second round (fc_method.fetch_k, driven by fc_fetch.c): picks per rank in the all-gather
 * (the largest chunk's k) for a unit of N elements, 0 when the unit has none (its method, its
 * config, or a world of one rank that sends nothing); and k for one chunk of `len` elements.
 * fc_drive_decode of such a unit only picks (fc_method.pick), into s->picks. */
int64_t fc_core_fetch_kmax(const fc_core *s, int64_t N, int world);
int64_t fc_core_fetch_k(const fc_core *s, const fc_method *m, int64_t len);

/* The same call one payload at a time, for an exchange that overlaps the wire with the codec.
 * Whether a unit of `numel` elements can go that way: fixed-size payloads, no second round, no
 * compressed-domain sum. */
int fc_core_per_peer_ok(const fc_core *s, int64_t numel, int world);
/* Byte sizes of the parts this rank sends for chunk `chunk` (*count of them; one 0 for a chunk
 * without payload). What rank r receives from rank s: piece plan of chunk r as rank s. */
void fc_core_piece_plan(const fc_core *s, int64_t numel, int dtype, int world, int rank, int chunk,
                        int64_t *sizes, int *count);
/* The per-peer encode is the driver's: fc_drive_encode_part (fc_backend.h); the per-peer
 * decode is the CPU backend's (fc_cpu_decode_part, backend_cpu/fc_cpu.h). */

/* Frees every unit's method state and parts table (before the unit table is replaced or
 * freed: a restored unit starts from the default table). */
void fc_core_free_unit_states(fc_core *s);
/* After decode: the floats of the unit's state to sum over ranks this step (*len 0: none). */
void fc_core_sync_span(fc_core *s, uint32_t unit, float **data, int64_t *len);
/* Stores the sum over ranks into that span and lets the method use it. */
int fc_core_sync_apply(fc_core *s, uint32_t unit, const float *sum, int64_t len, fc_err *err);

/* The unit's method state (created from the seed at first use, as the encode does); *out NULL
 * for a method without one. The CUDA path keeps a device copy of it (csrc/python/state_cuda.c). */
int fc_core_unit_state(fc_core *s, uint32_t unit, float **out, fc_err *err);
/* The state compress()/decompress() of `unit` use (the configured method's, the unit's own or,
 * for a unit the collective has not seen, a loose one seeded alike); *out NULL without one. */
int fc_core_single_state(fc_core *s, uint32_t unit, float **out, fc_err *err);

/* Floats of persistent method state a unit of `numel` elements keeps (0: none). */
int64_t fc_core_unit_floats(const fc_core *s, int64_t numel);
/* Validates a saved unit state of `len` floats for a unit of `numel` elements (checkpoints). */
int fc_core_check_unit_state(const fc_core *s, int64_t numel, const float *v, int64_t len,
                             fc_err *err);

#endif
