/* fc_sparse.c: index coding and the value codec of the sparsifiers (see fc_sparse.h). */
#include "methods/fc_sparse.h"

#include <string.h>

#include "common/fc_intn.h"
#include "common/fc_sparse_rules.h"

extern const fc_method fc_method_none, fc_method_fp16, fc_method_int8, fc_method_qsgd, fc_method_nc,
    fc_method_intn;

const char *const fc_sparse_quant_names[] = {"none", "fp16", "int8", "qsgd", "nc", "intN", NULL};

static const fc_method *const quant_methods[] = {
    &fc_method_none, &fc_method_fp16, &fc_method_int8, &fc_method_qsgd, &fc_method_nc, &fc_method_intn,
};

/* The value method's keys at their defaults (its own table, so the defaults stay its own). */
int fc_vcodec_init(fc_vcodec *v, int quantize, fc_err *err)
{
    v->quantize = quantize;
    const fc_method *m = quant_methods[v->quantize];
    if (m->cfg_size > FC_SUB_CFG)
        return fc_fail(err, FC_ERR_VALUE, "internal: %s's config does not fit the value codec", m->name);
    memset(v->sub, 0, sizeof(v->sub));
    for (const fc_key *k = m->keys; k->name != NULL; k++) {
        unsigned char *p = v->sub + k->offset;
        if (k->kind == FC_KEY_BOOL || k->kind == FC_KEY_CHOICE) {
            int d = (int)k->def;
            memcpy(p, &d, sizeof(d));
        } else if (k->kind == FC_KEY_INT) {
            int64_t d = (int64_t)k->def;
            memcpy(p, &d, sizeof(d));
        } else if (k->kind == FC_KEY_FLOAT) {
            memcpy(p, &k->def, sizeof(double));
        }
    }
    /* what the kernels read of it (and the CPU's byte counts, fc_rule_vc_layout) */
    fc_vc_shape *sh = &v->shape;
    memset(sh, 0, sizeof(*sh));
    sh->quantize = v->quantize;
    if (v->quantize == FC_VC_INT8) {
        const fc_int8_cfg *c = (const fc_int8_cfg *)(const void *)v->sub;
        sh->block = c->block_size;
        sh->stochastic = c->stochastic;
    } else if (v->quantize == FC_VC_QSGD) {
        const fc_qsgd_cfg *c = (const fc_qsgd_cfg *)(const void *)v->sub;
        sh->block = c->bucket_size;
        sh->levels_or_bits = c->levels;
    } else if (v->quantize == FC_VC_NC) {
        sh->block = ((const fc_nc_cfg *)(const void *)v->sub)->block_size;
    } else if (v->quantize == FC_VC_INTN) {
        const fc_intn_cfg *c = (const fc_intn_cfg *)(const void *)v->sub;
        sh->block = c->block_size;
        sh->levels_or_bits = c->bits;
        sh->minmax = c->scheme == FC_INTN_MINMAX;
        sh->stochastic = c->stochastic;
    }
    return FC_OK;
}

static fc_chunk sub_chunk(const fc_vcodec *v, const fc_chunk *parent, int64_t k)
{
    fc_chunk c = *parent;
    c.cfg = v->sub;
    c.n = k;
    c.wire_dtype = FC_F32; /* `none` carries the kept values as fp32 */
    c.scratch = NULL;
    /* the value quantiser's own stream, apart from the parent's draws */
    c.rng.chunk ^= 0x5bd1e995u;
    return c;
}

void fc_vcodec_layout(const fc_vcodec *v, const fc_chunk *parent, int64_t k, fc_layout *out)
{
    if (k == 0) {
        out->value_bytes = out->meta_bytes = 0;
        return;
    }
    fc_chunk c = sub_chunk(v, parent, k);
    fc_layout l;
    quant_methods[v->quantize]->layout(&c, &l);
    out->value_bytes = l.value_bytes;
    out->meta_bytes = l.meta_bytes;
}

int64_t fc_vcodec_bytes(const fc_vcodec *v, const fc_chunk *parent, int64_t k)
{
    fc_layout l;
    fc_vcodec_layout(v, parent, k, &l);
    return l.value_bytes + l.meta_bytes;
}

int fc_vcodec_encode(const fc_vcodec *v, const fc_chunk *parent, const float *vals, int64_t k,
                     uint8_t *out, int64_t *saturated, fc_err *err)
{
    if (k == 0)
        return FC_OK;
    fc_chunk c = sub_chunk(v, parent, k);
    fc_layout used;
    memset(&used, 0, sizeof(used));
    const int rc = quant_methods[v->quantize]->encode(&c, vals, out, &used, err);
    *saturated += used.saturated;
    return rc;
}

int fc_vcodec_decode_add(const fc_vcodec *v, const fc_chunk *parent, const uint8_t *in, int64_t k,
                         float alpha, float *vals, fc_err *err)
{
    if (k == 0)
        return FC_OK;
    fc_chunk c = sub_chunk(v, parent, k);
    return quant_methods[v->quantize]->decode_add(&c, in, fc_vcodec_bytes(v, parent, k), alpha,
                                                  vals, err);
}

int fc_vcodec_decode_scatter(const fc_vcodec *v, const fc_chunk *parent, const uint8_t *in, int64_t k,
                             const uint32_t *idx, float alpha, float *vals, float *acc, fc_err *err)
{
    memset(vals, 0, (size_t)k * 4);
    int rc = fc_vcodec_decode_add(v, parent, in, k, alpha, vals, err);
    if (rc != FC_OK)
        return rc;
    for (int64_t j = 0; j < k; j++)
        acc[idx[j]] += vals[j];
    return FC_OK;
}

static int index_width(int64_t n)
{
    return fc_rule_index_width(n);
}

static int use_bitmap(int64_t n, int64_t k)
{
    return fc_rule_use_bitmap(n, k);
}

int64_t fc_index_bytes(int64_t n, int64_t k)
{
    return fc_rule_index_bytes(n, k);
}

void fc_index_encode(const uint32_t *idx, int64_t n, int64_t k, uint8_t *out)
{
    int64_t bytes = fc_index_bytes(n, k);
    memset(out, 0, (size_t)bytes);
    if (use_bitmap(n, k)) {
        for (int64_t j = 0; j < k; j++)
            out[idx[j] >> 3] |= (uint8_t)(1u << (idx[j] & 7));
    } else if (index_width(n) == 2) {
        for (int64_t j = 0; j < k; j++) {
            uint16_t v = (uint16_t)(idx[j]);
            memcpy(out + 2 * j, &v, 2);
        }
    } else {
        memcpy(out, idx, (size_t)k * 4);
    }
}

int fc_index_decode(const uint8_t *in, int64_t n, int64_t k, uint32_t *idx, fc_err *err)
{
    /* idx NULL: the checks alone (fc_index_check) */
    if (use_bitmap(n, k)) {
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++)
            if ((in[i >> 3] >> (i & 7)) & 1u) {
                if (m == k)
                    return fc_fail(err, FC_ERR_PAYLOAD, "sparse payload: bitmap has more than the "
                                   "%lld coordinates announced (corrupted)", (long long)k);
                if (idx != NULL)
                    idx[m] = (uint32_t)i;
                m++;
            }
        if (m != k)
            return fc_fail(err, FC_ERR_PAYLOAD, "sparse payload: bitmap has %lld coordinates, "
                           "expected %lld (corrupted)", (long long)m, (long long)k);
        return FC_OK;
    }
    uint32_t prev = 0;
    for (int64_t j = 0; j < k; j++) {
        uint32_t v;
        if (index_width(n) == 2) {
            uint16_t h;
            memcpy(&h, in + 2 * j, 2);
            v = h;
        } else {
            memcpy(&v, in + 4 * j, 4);
        }
        if ((int64_t)v >= n || (j > 0 && v <= prev))
            return fc_fail(err, FC_ERR_PAYLOAD, "sparse payload: index %u at position %lld is out "
                           "of range [0, %lld) or not ascending (corrupted)", v, (long long)j,
                           (long long)n);
        if (idx != NULL)
            idx[j] = v;
        prev = v;
    }
    return FC_OK;
}

int fc_index_coding(int64_t n, int64_t k)
{
    return use_bitmap(n, k) ? 0 : index_width(n);
}

int fc_index_check(const uint8_t *in, int64_t n, int64_t k, fc_err *err)
{
    return fc_index_decode(in, n, k, NULL, err);
}

void fc_index_add(const uint8_t *in, int64_t n, int64_t k, const float *vals, float *acc)
{
    if (use_bitmap(n, k)) {
        int64_t m = 0;
        for (int64_t i = 0; i < n && m < k; i++)
            if ((in[i >> 3] >> (i & 7)) & 1u)
                acc[i] += vals[m++];
    } else if (index_width(n) == 2) {
        for (int64_t j = 0; j < k; j++) {
            uint16_t h;
            memcpy(&h, in + 2 * j, 2);
            acc[h] += vals[j];
        }
    } else {
        for (int64_t j = 0; j < k; j++) {
            uint32_t v;
            memcpy(&v, in + 4 * j, 4);
            acc[v] += vals[j];
        }
    }
}

int64_t fc_sparse_k(int64_t n, int64_t k, double ratio)
{
    return fc_rule_sparse_k(n, k, ratio);
}
