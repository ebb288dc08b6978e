// fc_cu_qsgd.cu: kernels of `qsgd` (m_qsgd.c): per bucket the L2 norm (the CPU's 8 double
// lanes in its order), per element sign + stochastic level, through fc_cu_qsgd_codec.
#include "fc_cu_dense.cuh"

static int codec(const fc_cuda_method_cfg *m, fc_cu_qsgd_codec *c, fc_err *err)
{
    const fc_qsgd_cfg *k = fc_cu_cfg_of<fc_qsgd_cfg>(m);
    const int64_t levels = k->levels;
    *c = fc_cu_qsgd_codec{};
    c->bs = k->bucket_size;
    if (levels < 1 || levels > 32767)
        return fc_fail(err, FC_ERR_VALUE, "qsgd levels must be in [1, 32767], got %lld", (long long)levels);
    c->levels = (int32_t)levels;
    c->w = fc_qsgd_width(c->levels);
    return fc_cu_check_block("qsgd", "bucket_size", c->bs, err);
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    fc_cu_qsgd_codec c;
    int rc = codec(&a->h.m, &c, err);
    return rc != FC_OK ? rc : fc_cu_launch_encode_dense(e, c, s, err);
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    fc_cu_qsgd_codec c;
    int rc = codec(&a->h.m, &c, err);
    return rc != FC_OK ? rc : fc_cu_launch_decode_codec(a, d, c, s, err);
}

extern const fc_cu_method fc_cu_qsgd = {FC_ID_QSGD, encode, decode};
