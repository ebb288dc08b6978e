/* fc_core_impl.h: what the driver's own files (fc_core.c, fc_encode.c, fc_decode.c) share
 * beyond fc_core.h: buffers, unit state, chunk contexts and the per-peer layout. Not for
 * anything outside the driver. */
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

/* The CPU backend's entries (fc_backend.h), in fc_encode.c, fc_decode.c, fc_fetch.c and
 * fc_res8.c. */
int fc_cpu_res8_pack(fc_core *s, const fc_exec *x, const fc_buf *e, fc_buf *packed, uint32_t key,
                     fc_err *err);
/* g' = g + d e: the residual's decay (`ef_decay`; 1 is plain error feedback). */
static inline float fc_core_ef_decay(const fc_core *s)
{
    return (float)s->common.ef_decay;
}

int fc_cpu_res8_unpack(fc_core *s, const fc_exec *x, const fc_buf *packed, fc_buf *e, fc_err *err);
int fc_cpu_encode(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *send,
                  fc_buf *residual, fc_sent *sent, fc_err *err);
/* The per-peer parts of the open call s->enc (fc_drive_encode_part opens, counts and closes it):
 * the CPU's scratch and per-peer layout once per call, then one piece of `len` elements of a
 * chunk into p (cap bytes), what went out in *out. */
int fc_cpu_encode_parts_open(fc_core *s, const fc_buf *grad, fc_err *err);
int fc_cpu_encode_piece(fc_core *s, const fc_buf *grad, fc_buf *residual, int chunk, int piece,
                        int64_t len, uint8_t *p, int64_t cap, fc_sent *out, fc_err *err);
int fc_cpu_decode(fc_core *s, const fc_exec *x, const fc_buf *recv, const fc_buf *grad,
                  fc_buf *out, int world, int rank, uint32_t unit, const int64_t *recvs,
                  fc_err *err);
int fc_cpu_compress(fc_core *s, const fc_exec *x, const fc_buf *in, fc_buf *payload,
                    fc_buf *residual, uint32_t unit, uint32_t chunk, int world, int rank, int64_t *written,
                    fc_err *err);
int fc_cpu_decompress(fc_core *s, const fc_exec *x, const fc_buf *payload, fc_buf *acc,
                      float alpha, uint32_t unit, uint32_t chunk, int world, fc_err *err);
int fc_cpu_fetch_picks(const fc_core *s, const fc_exec *x, uint32_t unit, uint32_t *out,
                       int64_t kmax, fc_err *err);
int fc_cpu_fetch_values(fc_core *s, const fc_exec *x, const uint32_t *all_picks, int64_t kmax,
                        const fc_buf *grad, fc_buf *residual, int world, int rank, uint32_t unit,
                        float *send, const int64_t *send_splits, fc_err *err);
int fc_cpu_fetch_finish(fc_core *s, const fc_exec *x, const float *recv, const fc_buf *grad,
                        fc_buf *out, int world, int rank, uint32_t unit, fc_err *err);

#endif
