// fc_cu_blocks.cu: the block codec methods on CUDA (int8, fp8, intN, qsgd, nc, onebit): each is
// its codec of fc_cu_codecs.cuh under fc_cu_dense.cuh's one-pass encode and fused decode, so a method's
// own part is how its config becomes its codec (make below) and one line of the table at the end.
#include "fc_cu_dense.cuh"

// The C side validated these configs already; the checks here catch a struct the two sides read
// differently, which would otherwise encode garbage that no receiver can tell from data.

// `int8` (m_int8.c): block-wise absmax int8, nearest or stochastic rounding (a warp per block of
// >= 256, lanes of 8 elements each: one Philox call serves a lane's 8 draws, as on the CPU path).
static int make(const fc_cuda_method_cfg *m, fc_cu_int8_codec *c, fc_err *err)
{
    const fc_int8_cfg *k = fc_cu_cfg_of<fc_int8_cfg>(m);
    c->bs = k->block_size;
    c->stochastic = k->stochastic != 0;
    return fc_cu_check_block("int8", "block_size", c->bs, err);
}

// `fp8` (m_fp8.c): e4m3 or e5m2 codes with an fp32 absmax scale per block.
static int make(const fc_cuda_method_cfg *m, fc_cu_fp8_codec *c, fc_err *err)
{
    const fc_fp8_cfg *k = fc_cu_cfg_of<fc_fp8_cfg>(m);
    c->bs = k->block_size;
    c->fmt = k->format;
    if (c->fmt != FC_FP8_E4M3 && c->fmt != FC_FP8_E5M2)
        return fc_fail(err, FC_ERR_VALUE, "fp8 format must be 0 (e4m3) or 1 (e5m2), got %d", c->fmt);
    return fc_cu_check_block("fp8", "block_size", c->bs, err);
}

// `intN` (m_intn.c): 2-, 3- or 4-bit codes packed 8 per `bits` bytes, absmax or min-max blocks,
// nearest or stochastic rounding.
static int make(const fc_cuda_method_cfg *m, fc_cu_intn_codec *c, fc_err *err)
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

// `qsgd` (m_qsgd.c): per bucket the L2 norm (the CPU's 8 double lanes in its order), per element
// sign + stochastic level.
static int make(const fc_cuda_method_cfg *m, fc_cu_qsgd_codec *c, fc_err *err)
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

// `nc` (m_nc.c): natural compression, a block's largest exponent and per element sign +
// stochastic power of two in one byte.
static int make(const fc_cuda_method_cfg *m, fc_cu_nc_codec *c, fc_err *err)
{
    c->bs = fc_cu_cfg_of<fc_nc_cfg>(m)->block_size;
    return fc_cu_check_block("nc", "block_size", c->bs, err);
}

// `onebit` (m_onebit.c): sign bits and per block the means of the x >= 0 and of the x < 0 (the
// CPU's double lane sums in its order).
static int make(const fc_cuda_method_cfg *m, fc_cu_onebit_codec *c, fc_err *err)
{
    c->bs = fc_cu_cfg_of<fc_onebit_cfg>(m)->block_size;
    return fc_cu_check_block("onebit", "block_size", c->bs, err);
}

template <class C> static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    C c;
    int rc = make(&a->h.m, &c, err);
    return rc != FC_OK ? rc : fc_cu_launch_encode_dense(e, c, s, err);
}

template <class C> static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    C c;
    int rc = make(&a->h.m, &c, err);
    return rc != FC_OK ? rc : fc_cu_launch_decode_codec_fused(a, d, c, s, err);
}

// A block method's table entry: its wire id and codec, nothing else differs (a one-pass encode,
// the fused decode of fc_cu_decode.cuh).
template <class C> static constexpr fc_cu_method block_method(int id)
{
    fc_cu_method m = {id, encode<C>, decode<C>, NULL, 0, 1};
    m.fused_decode = 1;
    return m;
}

extern const fc_cu_method fc_cu_int8 = block_method<fc_cu_int8_codec>(FC_ID_INT8);
extern const fc_cu_method fc_cu_fp8 = block_method<fc_cu_fp8_codec>(FC_ID_FP8);
extern const fc_cu_method fc_cu_intn = block_method<fc_cu_intn_codec>(FC_ID_INTN);
extern const fc_cu_method fc_cu_qsgd = block_method<fc_cu_qsgd_codec>(FC_ID_QSGD);
extern const fc_cu_method fc_cu_nc = block_method<fc_cu_nc_codec>(FC_ID_NC);
extern const fc_cu_method fc_cu_onebit = block_method<fc_cu_onebit_codec>(FC_ID_ONEBIT);
