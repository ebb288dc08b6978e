// fc_cu_intn.cu: kernels of `intN` (m_intn.c): 2-, 3- or 4-bit codes packed 8 per `bits` bytes,
// absmax or min-max blocks, nearest or stochastic rounding, through fc_cu_intn_codec.
#include "fc_cu_dense.cuh"

static int codec(const fc_cuda_method_cfg *m, fc_cu_intn_codec *c, fc_err *err)
{
    const fc_intn_cfg *k = fc_cu_cfg_of<fc_intn_cfg>(m);
    c->bs = k->block_size;
    c->bits = (int)k->bits;
    c->stochastic = k->stochastic != 0;
    c->scheme = k->scheme;
    if (c->bits < 2 || c->bits > 4)
        return fc_fail(err, FC_ERR_VALUE, "intN bits must be 2, 3 or 4, got %d", c->bits);
    if (c->scheme != FC_INTN_ABSMAX && c->scheme != FC_INTN_MINMAX)
        return fc_fail(err, FC_ERR_VALUE, "intN scheme must be 0 (absmax) or 1 (minmax), got %d",
                       c->scheme);
    return fc_cu_check_block("intN", "block_size", c->bs, err);
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    fc_cu_intn_codec c;
    int rc = codec(&a->h.m, &c, err);
    return rc != FC_OK ? rc : fc_cu_launch_encode_dense(e, c, s, err);
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    fc_cu_intn_codec c;
    int rc = codec(&a->h.m, &c, err);
    return rc != FC_OK ? rc : fc_cu_launch_decode_codec(a, d, c, s, err);
}

extern const fc_cu_method fc_cu_intn = {FC_ID_INTN, encode, decode};
