/* fc_wire.h: the payload header. Every chunk on the wire starts with it, so a receiver can
 * tell a payload from garbage and ranks that drifted apart (other unit, other step) from each
 * other. All fields little-endian; the payload is padded to FC_ALIGN bytes. */
#ifndef FC_WIRE_H
#define FC_WIRE_H

#include <stdint.h>
#include <string.h>

#define FC_MAGIC 0x43445346u /* "FSDC" */
#define FC_WIRE_VERSION 2 /* 2: stochastic rounding draws 16 bits per element (fc_rng_u16) */
#define FC_HEADER_BYTES 32
#define FC_ALIGN 16 /* payload starts stay 16-byte aligned for vector loads on both paths */

typedef struct {
    uint32_t magic;
    uint8_t version;
    uint8_t method;
    uint8_t dtype;    /* fc_dtype of the gradient the payload came from */
    uint8_t reserved; /* 0 */
    uint32_t unit;
    uint32_t step;
    uint64_t numel;
    uint64_t body_bytes;
} fc_header;

#ifdef __cplusplus /* the CUDA kernels write headers too */
static_assert(sizeof(fc_header) == FC_HEADER_BYTES, "header layout");
#else
_Static_assert(sizeof(fc_header) == FC_HEADER_BYTES, "header layout");
#endif

static inline int64_t fc_align_up(int64_t v)
{
    return (v + FC_ALIGN - 1) / FC_ALIGN * FC_ALIGN;
}

#endif
