/* fc_cpu.h: the CPU backend's functions: the entries of its table (fc_backend_cpu, fc_backend.h)
 * in fc_encode.c, fc_decode.c, fc_fetch_cpu.c and fc_res8.c, the loops they share, and the
 * per-peer decode the glue calls for CPU tensors. The driver reaches none of them but through
 * the table. */
#ifndef FC_CPU_H
#define FC_CPU_H

#include "driver/fc_core_impl.h"

int fc_cpu_encode(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *send,
                  fc_buf *residual, fc_sent *sent, fc_err *err);
/* The per-peer parts of the open call s->enc (fc_drive_encode_part opens, counts and closes it):
 * the CPU's scratch and per-peer layout once per call, then one piece of `len` elements of a
 * chunk into p (cap bytes), what went out in *out. */
int fc_cpu_encode_parts_open(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *residual,
                             fc_err *err);
int fc_cpu_encode_piece(fc_core *s, const fc_exec *x, const fc_buf *grad, fc_buf *residual,
                        int chunk, int piece, int64_t len, uint8_t *p, int64_t cap, fc_sent *out,
                        fc_err *err);
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
int fc_cpu_res8_pack(fc_core *s, const fc_exec *x, const fc_buf *e, fc_buf *packed, uint32_t key,
                     fc_err *err);
int fc_cpu_res8_unpack(fc_core *s, const fc_exec *x, const fc_buf *packed, fc_buf *e, fc_err *err);
/* An 8-bit residual (an FC_U8 buffer of fc_res8_bytes(n) bytes) read and written in place,
 * without a unit-sized fp32 copy (fc_res8.c): element i's value, or those of [start, start +
 * len) into v; dst[i] += d * e[start + i]; x = g + d e (an fp32 chunk g) counting NaN/Inf;
 * new values of [start, start + len) packed with s->res8_key as their blocks fill (a block cut
 * by a part boundary staged in s->carry meanwhile); a range rounded again unchanged (a chunk
 * the call does not encode). fc_cpu_res8_open sizes and clears the carry for a call that stages
 * at most `slots` blocks at once; fc_cpu_res8_close checks every block was packed. */
float fc_cpu_res8_at(const fc_buf *r, int64_t i);
void fc_cpu_res8_values(const fc_buf *r, int64_t start, int64_t len, float *v);
void fc_cpu_res8_add(const fc_buf *r, int64_t start, int64_t len, float d, float *dst);
int64_t fc_cpu_res8_load_sum(const float *g, const fc_buf *r, int64_t start, int64_t len, float d,
                             float *x);
int fc_cpu_res8_store(fc_core *s, fc_buf *r, int64_t start, int64_t len, const float *e,
                      fc_err *err);
int fc_cpu_res8_keep(fc_core *s, fc_buf *r, int64_t start, int64_t len, fc_err *err);
int fc_cpu_res8_open(fc_core *s, int64_t slots, fc_err *err);
int fc_cpu_res8_close(const fc_core *s, fc_err *err);
/* A residual's element k as fp32 (fp32, bf16 or packed 8-bit), and dst[i] += d * r[off + i]. */
float fc_cpu_res_at(const fc_buf *r, int64_t k);
void fc_cpu_res_add(const fc_buf *r, int64_t off, int64_t n, float d, float *dst);
/* fc_resid_cpu.c: e = g' - D(C(g')) for the chunk [start, start + c->n) of the open encode
 * (s->x holds g', p the payload just written) stored in res, ||e||^2 into *e_sq; with `dots`,
 * ||g'||^2 and g'.e too (fc_encode.c's encode_chunk and compress). */
int fc_cpu_update_residual(fc_core *s, const fc_method *m, const fc_chunk *c, const uint8_t *p,
                           const fc_buf *grad, fc_buf *res, int64_t start, int dots,
                           double *e_sq, double *x_sq, double *x_dot_e, fc_err *err);
/* g' of element k as the encode's load made it: g (+ d e), NaN/Inf fixed (fc_gprime_fix, not
 * counted); res NULL: no residual. The rare paths read it again from the untouched inputs. */
float fc_cpu_gprime_at(const fc_core *s, const fc_buf *grad, const fc_buf *res, int64_t k);
/* x[0..n) = the fp32 values of src[off..off + n) (fp32, bf16 or fp16). */
void fc_cpu_load_f32(const void *src, int dt, int64_t off, int64_t n, float *dst);
/* The body bytes a payload's header says. */
int64_t fc_cpu_body_bytes(const uint8_t *p);
/* fc_ef_cpu.c: the table's `ef` (fc_backend.h) */
int fc_cpu_ef(fc_core *s, const fc_exec *x, int op, fc_buf *xb, const fc_buf *ref, fc_buf *res,
              fc_err *err);

/* Adds piece `piece` of the payload from rank `src` (empty for an own chunk kept exact). src =
 * rank opens the call, then rank+1, rank+2, ... (mod world), each sender's pieces in order: a
 * fixed order, so every run sums the same way; it differs from fc_drive_decode's rank order
 * (0, 1, ...) for world > 2 in rounding only. The last part writes `out`. */
int fc_cpu_decode_part(fc_core *s, const fc_buf *payload, const fc_buf *grad, fc_buf *out,
                       int world, int rank, uint32_t unit, int src, int piece, fc_err *err);

/* out = acc / world in out's dtype (zero past n). A value the output cannot hold saturates
 * (counted); where acc is not finite, fc_output_passes decides per element whether it goes
 * through, canonical and counted as nonfinite_out, or is the overflow of finite terms:
 * saturated (NaN: 0). `passed`: a payload of the sum was flagged NONFINITE (every element
 * passes); `own`: the gradient whose chunk [own_start, own_start + n) the sum took exact (NULL
 * when the own chunk was compressed too), whose NaN/Inf pass at their own elements in "pass"
 * mode. */
void fc_cpu_write_out(fc_core *s, const float *acc, int64_t n, int world, fc_buf *out, int passed,
                      const fc_buf *own, int64_t own_start);
/* acc += the exact own chunk (grad[start, start + n)), its NaN/Inf zeroed in "zero" mode (a
 * NaN passed as the canonical one); returns how many there were (the caller counts them once
 * its call succeeds). */
int64_t fc_cpu_add_own(const fc_core *s, const fc_buf *grad, int64_t start, int64_t n, float *acc);
/* Where a decode that keeps s->x for a compressed-domain sum adds the values of the shard of n
 * elements: an fp32 output that holds them and shares no byte with the gradient is summed in
 * place (write_out then divides it where it lies); any other output gets s->acc, grown to n. */
int fc_cpu_acc(fc_core *s, const fc_buf *grad, fc_buf *out, int64_t n, float **acc, fc_err *err);
/* s->x (the encode's working copy of g', a decode's running sum: one call's at a time), grown
 * to n floats for the call about to use it. An open decode_part call, whose sum it holds, is
 * closed (its next part is refused, saying so). */
int fc_cpu_take_x(fc_core *s, int64_t n, fc_err *err);

#endif
