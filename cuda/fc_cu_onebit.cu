// fc_cu_onebit.cu: kernels of `onebit` (m_onebit.c): sign bits and per block the means of the
// x >= 0 and of the x < 0 (the CPU's double lane sums in its order), through fc_cu_onebit_codec.
#include "fc_cu_dense.cuh"

static int codec(const fc_cuda_method_cfg *m, fc_cu_onebit_codec *c, fc_err *err)
{
    c->bs = fc_cu_cfg_of<fc_onebit_cfg>(m)->block_size;
    return fc_cu_check_block("onebit", "block_size", c->bs, err);
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    fc_cu_onebit_codec c;
    int rc = codec(&a->h.m, &c, err);
    return rc != FC_OK ? rc : fc_cu_launch_encode_dense(e, c, s, err);
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    fc_cu_onebit_codec c;
    int rc = codec(&a->h.m, &c, err);
    return rc != FC_OK ? rc : fc_cu_launch_decode_codec(a, d, c, s, err);
}

extern const fc_cu_method fc_cu_onebit = {FC_ID_ONEBIT, encode, decode};
