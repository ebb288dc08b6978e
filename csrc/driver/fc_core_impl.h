/* fc_core_impl.h: what the driver's files (fc_core.c, fc_drive.c, fc_fetch.c) and the backends
 * working over its state share beyond fc_core.h: buffers, unit state, chunk contexts and the
 * per-peer layout. Not for the glue or the methods. */
#ifndef FC_CORE_IMPL_H
#define FC_CORE_IMPL_H

#include "driver/fc_backend.h"
#include "driver/fc_core.h"
#include "common/fc_wire.h"

double fc_core_now_s(void);
float fc_core_elem_f32(const void *src, int dt, int64_t i);
int fc_core_grow(void **p, size_t *cap, size_t need, fc_err *err);
int fc_core_grow_f32(float **p, int64_t *cap, int64_t n, fc_err *err);
int fc_core_ustate(fc_core *s, const fc_method *m, uint32_t unit, float **out, fc_err *err);
fc_chunk fc_core_make_chunk(const fc_core *s, const fc_method *m, int64_t n, int world, int dtype,
                            uint32_t unit, uint32_t chunk, int rank);
/* Header + body of chunk c as m writes it, padded (0: empty): the chunk's own parts table. */
int64_t fc_core_chunk_bytes(const fc_core *s, const fc_method *m, const fc_chunk *c);
/* The header fields of chunk c's payloads written with m (fc_header_make, fc_header_verdict). */
fc_header_key fc_core_header_key(const fc_core *s, const fc_method *m, const fc_chunk *c);
fc_call_key fc_core_call_key(const fc_core *s, uint32_t unit, int world, int rank, int64_t numel);
int fc_core_same_call(const fc_call_key *a, const fc_call_key *b);
int fc_core_chunk_parts(const fc_core *s, const fc_method *m, int64_t N, int world, int rank, int c,
                        int64_t *len);
int64_t fc_core_piece_bytes(const fc_core *s, const fc_method *m, int64_t n, int64_t len, int p,
                            int dtype);
int64_t fc_core_chunk_part_bytes(const fc_core *s, const fc_method *m, int64_t N, int dtype,
                                 int world, int rank, int c);
const char *fc_core_not_per_peer(const fc_core *s, const fc_method *m, int64_t N, int world);

/* g' = g + d e: the residual's decay (`ef_decay`; 1 is plain error feedback). */
static inline float fc_core_ef_decay(const fc_core *s)
{
    return (float)s->common.ef_decay;
}

/* Whether rank `from` sends chunk `to` a payload, and so values in a second round. */
static inline int fc_core_sends(const fc_core *s, int from, int to)
{
    return from != to || s->common.compress_own_chunk;
}

#endif
