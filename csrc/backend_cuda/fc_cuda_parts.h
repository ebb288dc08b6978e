/* fc_cuda_parts.h: a parts method's calls on CUDA (adaptive): the spans of the call's chunks,
 * walked on the host from the unit's parts table (m_adaptive.c's walk), for the library to run
 * each through its rung's kernels (fc_cuda_extra.parts, cuda/fc_cu_parts.cu). */
#ifndef FC_CUDA_PARTS_H
#define FC_CUDA_PARTS_H

#include "backend_cuda/fc_cuda_path.h"

/* Sets h->x.parts to the spans of the chunks the call writes or reads, kept in k->host's list:
 * an encode (decode 0) every chunk of the unit that has a payload, a decode the own chunk
 * (`rank`); and h->fingerprint to the headers' (the table's hash in it, fc_core_header_key).
 * Nothing for a method without FC_PARTS. */
int fc_cuda_parts_unit(const fc_core *s, const fc_cuda_call *k, const fc_method *m, int64_t numel,
                       int dtype, int world, int rank, uint32_t unit, int decode, fc_cuda_head *h,
                       fc_err *err);

/* The same for compress()/decompress()'s one payload of n values: chunk `chunk` of `unit` over
 * `world` ranks, encoded by `rank` (the table applies where the CPU's fc_core_make_chunk applies
 * it), as chunk 0 of the call's geometry. */
int fc_cuda_parts_single(const fc_core *s, const fc_cuda_call *k, int64_t n, int world, int rank,
                         uint32_t unit, uint32_t chunk, fc_cuda_head *h, fc_err *err);

#endif
