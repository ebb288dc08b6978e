/* fc_wire.h: the payload header. Every chunk on the wire starts with it, so a receiver can
 * tell a payload from garbage, ranks that drifted apart (other unit, other step) and ranks that
 * run another config (fingerprint, world) from each other. All fields little-endian; the payload
 * is padded to FC_ALIGN bytes.
 *
 * Version 3 keeps the header at 32 bytes (small units, biases and norms, are common, and the
 * header is most of their overhead): the magic is 16 bits, element count and body size are 48
 * bits each (FC_MAX_NUMEL keeps every size below 2^47), which leaves room for the world size,
 * a flags byte and a 32-bit fingerprint of the config. The ranks compare their full
 * configs before the first exchange of each unit shape (fsdpcomp/_agree.py); the fingerprint
 * catches a config that changed after that. */
#ifndef FC_WIRE_H
#define FC_WIRE_H

#include <stdint.h>
#include <string.h>
#include "common/fc_hostdev.h"

#define FC_MAGIC 0x4346u /* "FC" */
/* 3: 32-bit config fingerprint, world size and flags; saturating element rules and one NaN per
 * format. 2: stochastic rounding draws 16 bits per element (fc_rng_u16). */
#define FC_WIRE_VERSION 3
#define FC_HEADER_BYTES 32
#define FC_ALIGN 16 /* payload starts stay 16-byte aligned for vector loads on both paths */

/* flags */
#define FC_HDR_NONFINITE 1u /* the sender's chunk held NaN/Inf that went on the wire ("pass") */
#define FC_HDR_FLAGS_KNOWN FC_HDR_NONFINITE

typedef struct {
    uint16_t magic;
    uint8_t version;
    uint8_t method;
    uint8_t dtype;  /* fc_dtype of the gradient the payload came from */
    uint8_t flags;  /* FC_HDR_*; unknown bits are refused */
    uint16_t world; /* ranks the payload was encoded for (fp16 pre-divides by it) */
    uint32_t unit;
    uint32_t step;
    uint32_t numel_lo; /* element count of the chunk: 48 bits */
    uint16_t numel_hi;
    uint16_t body_hi; /* body bytes: 48 bits */
    uint32_t body_lo;
    uint32_t fingerprint; /* of the config keys that decide the wire (fc_config_fingerprint) */
} fc_header;

#ifdef __cplusplus /* the CUDA kernels write headers too */
static_assert(sizeof(fc_header) == FC_HEADER_BYTES, "header layout");
#else
_Static_assert(sizeof(fc_header) == FC_HEADER_BYTES, "header layout");
_Static_assert(FC_HEADER_BYTES % FC_ALIGN == 0, "bodies start aligned");
#endif

FC_HOSTDEV uint64_t fc_header_numel(const fc_header *h)
{
    return (uint64_t)h->numel_lo | (uint64_t)h->numel_hi << 32;
}

FC_HOSTDEV uint64_t fc_header_body(const fc_header *h)
{
    return (uint64_t)h->body_lo | (uint64_t)h->body_hi << 32;
}

/* numel and body below 2^48 (FC_MAX_NUMEL keeps them there). */
FC_HOSTDEV void fc_header_set_sizes(fc_header *h, uint64_t numel, uint64_t body)
{
    h->numel_lo = (uint32_t)numel;
    h->numel_hi = (uint16_t)(numel >> 32);
    h->body_lo = (uint32_t)body;
    h->body_hi = (uint16_t)(body >> 32);
}

/* The fingerprint field of a header: the config's fingerprint mixed with the header's own method
 * id. A method's payload and its `none` fallback (thresholdv's, per payload; any method's below
 * min_numel) can be the same size, so flipping the method byte alone made another valid payload
 * that decoded to other values (tests/fuzz.py found it: 41 of 2.5M inputs); with the id mixed in,
 * that flip is a config mismatch. XOR by a value of the id only, so the same call undoes it:
 * fc_wire_fingerprint(h->fingerprint, h->method) is the sender's config fingerprint. */
FC_HOSTDEV uint32_t fc_wire_fingerprint(uint32_t fingerprint, unsigned method_id)
{
    return fingerprint ^ 0x9E3779B1u * (method_id + 1u); /* odd multiplier: distinct per id */
}

/* Why a receiver refuses a payload (0: accepted); the CUDA decode records the code in its
 * workspace (fc_cuda_ws.payload_error), the CPU names it in a PayloadError. */
enum {
    FC_PAYLOAD_MAGIC = 1,
    FC_PAYLOAD_VERSION = 2,
    FC_PAYLOAD_METHOD = 3,
    FC_PAYLOAD_DTYPE = 4,
    FC_PAYLOAD_ORDER = 5, /* unit or step differ */
    FC_PAYLOAD_NUMEL = 6,
    FC_PAYLOAD_BODY = 7,
    FC_PAYLOAD_CODES = 8, /* a code no encoder writes (the dense kernels' decoders; the CPU's
                           * PayloadError) */
    FC_PAYLOAD_CONFIG = 9, /* another config fingerprint */
    FC_PAYLOAD_WORLD = 10
};

/* What a payload of the call says about itself: every header field from the call, one
 * definition for the CPU encode and the CUDA kernels; the flags (FC_HDR_*) from its data. */
typedef struct {
    unsigned method;
    int dtype, world;
    uint32_t unit, step;
    uint32_t fingerprint; /* the config's (fc_config_fingerprint), before fc_wire_fingerprint */
} fc_header_key;

FC_HOSTDEV void fc_header_make(fc_header *h, const fc_header_key *k, uint64_t numel, uint64_t body,
                               unsigned flags)
{
    memset(h, 0, sizeof(*h));
    h->magic = FC_MAGIC;
    h->version = FC_WIRE_VERSION;
    h->method = (uint8_t)k->method;
    h->dtype = (uint8_t)k->dtype;
    h->flags = (uint8_t)flags;
    h->unit = k->unit;
    h->step = k->step;
    fc_header_set_sizes(h, numel, body);
    h->fingerprint = fc_wire_fingerprint(k->fingerprint, k->method);
    h->world = (uint16_t)k->world;
}

/* The receiver's verdict on a header, in the order the fields are checked (the first that
 * differs from the key names the fault): a chunk of `numel` elements whose body must be `body`
 * bytes (at most that with `varsize`) and fit a slot of `slot` bytes. */
FC_HOSTDEV unsigned fc_header_verdict(const fc_header *h, const fc_header_key *k, uint64_t numel,
                                      uint64_t body, int varsize, int64_t slot)
{
    if (h->magic != FC_MAGIC)
        return FC_PAYLOAD_MAGIC;
    if (h->version != FC_WIRE_VERSION)
        return FC_PAYLOAD_VERSION;
    if (h->method != k->method)
        return FC_PAYLOAD_METHOD;
    /* before unit and step: a rank that rebuilt its state with another config also restarted
     * its step count, and the config is what differs */
    if (fc_wire_fingerprint(h->fingerprint, h->method) != k->fingerprint)
        return FC_PAYLOAD_CONFIG;
    if (h->world != (uint32_t)k->world)
        return FC_PAYLOAD_WORLD;
    if (h->dtype != k->dtype || (h->flags & ~FC_HDR_FLAGS_KNOWN) != 0)
        return FC_PAYLOAD_DTYPE;
    if (h->unit != k->unit || h->step != k->step)
        return FC_PAYLOAD_ORDER;
    if (fc_header_numel(h) != numel)
        return FC_PAYLOAD_NUMEL;
    if (fc_header_body(h) > (uint64_t)(slot - FC_HEADER_BYTES) ||
        (varsize ? fc_header_body(h) > body : fc_header_body(h) != body))
        return FC_PAYLOAD_BODY;
    return 0;
}

static inline int64_t fc_align_up(int64_t v)
{
    return (v + FC_ALIGN - 1) / FC_ALIGN * FC_ALIGN;
}

#endif
