/* fc_sparse.h: what the sparsifiers (topk, randomk, thresholdv) share: the index coding of the
 * kept coordinates and the value codec, any dense method from a short list applied to the k
 * kept values (the hybrids: `"quantize": "int8"` etc.), with index and value bytes apart. */
#ifndef FC_SPARSE_H
#define FC_SPARSE_H

#include <stdint.h>
#include "methods/fc_method.h"
#include "common/fc_sparse_rules.h"

extern const char *const fc_sparse_quant_names[]; /* none, fp16, int8, qsgd, nc, intN */

/* The value codec (fc_vcodec, fc_cfg.h) of the config's `quantize` choice: fills sub (the value
 * method's defaults) and shape; a method's config check ends with it. */
int fc_vcodec_init(fc_vcodec *v, int quantize, fc_err *err);
/* value_bytes and meta_bytes of k values (index_bytes and kept untouched) */
void fc_vcodec_layout(const fc_vcodec *v, const fc_chunk *parent, int64_t k, fc_layout *out);
int64_t fc_vcodec_bytes(const fc_vcodec *v, const fc_chunk *parent, int64_t k);
/* *saturated += the values the value method saturated */
int fc_vcodec_encode(const fc_vcodec *v, const fc_chunk *parent, const float *vals, int64_t k,
                     uint8_t *out, int64_t *saturated, fc_err *err);
/* vals[j] += alpha * decoded value j */
int fc_vcodec_decode_add(const fc_vcodec *v, const fc_chunk *parent, const uint8_t *in, int64_t k,
                         float alpha, float *vals, fc_err *err);
/* acc[idx[j]] += alpha * decoded value j of the k at `in`, in j order (vals: k floats of scratch,
 * the values decoded from 0.0f first): a sparsifier's decode at its kept coordinates. */
int fc_vcodec_decode_scatter(const fc_vcodec *v, const fc_chunk *parent, const uint8_t *in, int64_t k,
                             const uint32_t *idx, float alpha, float *vals, float *acc, fc_err *err);

/* Index coding of k ascending coordinates in [0, n): a bitmap when that is smaller, else
 * 16-bit absolute indices when n <= 65536, else 32-bit; padded to 4 bytes (counted as index). */
int64_t fc_index_bytes(int64_t n, int64_t k);
void fc_index_encode(const uint32_t *idx, int64_t n, int64_t k, uint8_t *out);
/* Checks the coordinates are in range and strictly ascending; writes them to idx unless NULL. */
int fc_index_decode(const uint8_t *in, int64_t n, int64_t k, uint32_t *idx, fc_err *err);
/* The same coding with no index array (thresholdv, whose k may reach n): which coding k of n
 * take (0: the bitmap, else the bytes per index: 2 or 4), so an encoder writes each index
 * into the zeroed coding as it finds it; fc_index_decode's checks alone; and acc[idx[j]] +=
 * vals[j] read from a checked coding, ascending. */
int fc_index_coding(int64_t n, int64_t k);
int fc_index_check(const uint8_t *in, int64_t n, int64_t k, fc_err *err);
void fc_index_add(const uint8_t *in, int64_t n, int64_t k, const float *vals, float *acc);

/* k from the config: k > 0 wins (capped at n), else max(1, ceil(ratio * n)). */
int64_t fc_sparse_k(int64_t n, int64_t k, double ratio);

#endif
