// fc_cu_fp8.cu: kernels of `fp8` (m_fp8.c): e4m3 or e5m2 codes with an fp32 absmax scale per
// block, through fc_cu_fp8_codec.
#include "fc_cu_dense.cuh"

static int codec(const fc_cuda_method_cfg *m, fc_cu_fp8_codec *c, fc_err *err)
{
    const fc_fp8_cfg *k = fc_cu_cfg_of<fc_fp8_cfg>(m);
    c->bs = k->block_size;
    c->fmt = k->format;
    if (c->fmt != FC_FP8_E4M3 && c->fmt != FC_FP8_E5M2)
        return fc_fail(err, FC_ERR_VALUE, "fp8 format must be 0 (e4m3) or 1 (e5m2), got %d", c->fmt);
    return fc_cu_check_block("fp8", "block_size", c->bs, err);
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    fc_cu_fp8_codec c;
    int rc = codec(&a->h.m, &c, err);
    return rc != FC_OK ? rc : fc_cu_launch_encode_dense(e, c, s, err);
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    fc_cu_fp8_codec c;
    int rc = codec(&a->h.m, &c, err);
    return rc != FC_OK ? rc : fc_cu_launch_decode_codec(a, d, c, s, err);
}

extern const fc_cu_method fc_cu_fp8 = {FC_ID_FP8, encode, decode};
