/* fc_sparse_rules.h: the sparsifiers' rules that the CPU (fc_sparse.c, m_randomk.c,
 * m_thresholdv.c) and the CUDA kernels share: how many coordinates a chunk keeps, the index
 * coding's size, random-k's selection step, thresholdv's test, and how many bytes the value
 * codec of `quantize` writes for k values (the CUDA side sizes thresholdv's payloads on the
 * device with it; tests compare it with the CPU methods' own layouts). */
#ifndef FC_SPARSE_RULES_H
#define FC_SPARSE_RULES_H

#include <stdint.h>
#include "common/fc_hostdev.h"
#include "common/fc_pack.h"
#include "common/fc_qsgd.h"
#include "common/fc_quant.h"

/* k from the config: k > 0 wins (capped at n), else max(1, ceil(ratio * n)). */
FC_HOSTDEV int64_t fc_rule_sparse_k(int64_t n, int64_t k, double ratio)
{
    if (n <= 0)
        return 0;
    if (k > 0)
        return k < n ? k : n;
    double want = ratio * (double)n;
    int64_t r = (int64_t)want;
    if ((double)r < want)
        r++;
    return r < 1 ? 1 : r > n ? n : r;
}

/* Index coding of k ascending coordinates in [0, n): a bitmap when that is smaller, else 16-bit
 * absolute indices when n <= 65536, else 32-bit; padded to 4 bytes. */
FC_HOSTDEV int fc_rule_index_width(int64_t n)
{
    return n <= 65536 ? 2 : 4;
}

FC_HOSTDEV int fc_rule_use_bitmap(int64_t n, int64_t k)
{
    return (n + 7) / 8 < k * fc_rule_index_width(n);
}

FC_HOSTDEV int64_t fc_rule_index_bytes(int64_t n, int64_t k)
{
    int64_t b = fc_rule_use_bitmap(n, k) ? (n + 7) / 8 : k * fc_rule_index_width(n);
    return (b + 3) / 4 * 4;
}

/* Random-k's selection sampling (Knuth's algorithm S): with `need` picks still to make and
 * `left` elements left including this one, the element is taken when r / 2^32 < need / left,
 * r its shared 32-bit draw. Exactly k picks, ascending; each step depends on the ones before. */
FC_HOSTDEV int fc_rule_randk_take(uint32_t r, uint64_t left, int64_t need)
{
    return (uint64_t)r * left < ((uint64_t)need << 32);
}

/* Random-k's scaled decode multiplies a value by f = n / k: the largest magnitude whose decode
 * stays finite, fp32's largest / f (one ulp less where that times f rounds past fp32). Finite
 * values beyond it are saturated before the value codec, the rest staying in the residual. */
FC_HOSTDEV float fc_rule_randk_lim(float f)
{
    float lim = fc_bits_f32(FC_MAX_BITS) / f;
    if (fc_abs_bits(lim * f) >= FC_INF_BITS)
        lim = fc_bits_f32(fc_f32_bits(lim) - 1u);
    return lim;
}

/* A kept value as random-k's codec gets it (f: the decode's factor; 1 without `scale`); *sat
 * counts a saturation. NaN/Inf pass as they are. */
FC_HOSTDEV float fc_rule_randk_value(float x, float f, int64_t *sat)
{
    if (f == 1.0f || !(fc_abs_bits(x) < FC_INF_BITS))
        return x;
    const float lim = fc_rule_randk_lim(f);
    if (fc_abs_bits(x) <= fc_f32_bits(lim))
        return x;
    ++*sat;
    return x < 0 ? -lim : lim;
}

/* thresholdv sends x when |x| > v; a NaN fails every comparison, so it is sent (passed through
 * and counted, never lost). In magnitude bits: abs_bits(x) > bits(v) for v >= 0. */
FC_HOSTDEV int fc_rule_thrv_keep(float x, float v)
{
    return !(fc_bits_f32(fc_abs_bits(x)) <= v);
}

/* The value codecs of `quantize` (fc_sparse_quant_names' order), each a dense method at its
 * defaults applied to the k kept values. */
enum { FC_VC_NONE = 0, FC_VC_FP16 = 1, FC_VC_INT8 = 2, FC_VC_QSGD = 3, FC_VC_NC = 4, FC_VC_INTN = 5 };

/* What the value codec's config holds (its method's defaults): the block (bucket) size, qsgd's
 * levels or intN's bits, intN's scheme (1: min-max), stochastic rounding (int8, intN). */
typedef struct {
    int quantize;
    int64_t block;
    int64_t levels_or_bits;
    int minmax;
    int stochastic;
} fc_vc_shape;

/* value_bytes and meta_bytes the codec writes for k values (0 and 0 for k = 0), as the
 * method's own layout() says for a chunk of k elements. */
FC_HOSTDEV void fc_rule_vc_layout(const fc_vc_shape *v, int64_t k, int64_t *value, int64_t *meta)
{
    const int64_t nb = v->block > 0 ? (k + v->block - 1) / v->block : 0;
    *value = *meta = 0;
    if (k <= 0)
        return;
    switch (v->quantize) {
    case FC_VC_NONE: /* fp32: the sub-chunk's wire dtype */
        *value = 4 * k;
        break;
    case FC_VC_FP16:
        *value = 2 * k;
        break;
    case FC_VC_INT8:
    case FC_VC_NC:
        *value = k;
        *meta = 4 * nb;
        break;
    case FC_VC_QSGD:
        *value = fc_pack_bytes(k, fc_qsgd_width(v->levels_or_bits));
        *meta = 4 * nb;
        break;
    default: /* FC_VC_INTN */
        *value = fc_pack_bytes(k, (int)v->levels_or_bits);
        *meta = (v->minmax ? 8 : 4) * nb;
        break;
    }
}

#endif
