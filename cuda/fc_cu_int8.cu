// fc_cu_int8.cu: kernels of `int8` (m_int8.c): block-wise absmax int8, nearest or stochastic
// rounding, through fc_cu_int8_codec (a warp per block of >= 256, lanes of 8 elements each: one
// Philox call serves a lane's 8 draws, as on the CPU path).
#include "fc_cu_dense.cuh"

static int codec(const fc_cuda_method_cfg *m, fc_cu_int8_codec *c, fc_err *err)
{
    const fc_int8_cfg *k = fc_cu_cfg_of<fc_int8_cfg>(m);
    c->bs = k->block_size;
    c->stochastic = k->stochastic != 0;
    return fc_cu_check_block("int8", "block_size", c->bs, err);
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    fc_cu_int8_codec c;
    int rc = codec(&a->h.m, &c, err);
    return rc != FC_OK ? rc : fc_cu_launch_encode_dense(e, c, s, err);
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    fc_cu_int8_codec c;
    int rc = codec(&a->h.m, &c, err);
    return rc != FC_OK ? rc : fc_cu_launch_decode_codec(a, d, c, s, err);
}

extern const fc_cu_method fc_cu_int8 = {FC_ID_INT8, encode, decode};
