// fc_cu_cast.cu: kernels of `none`, `fp16` and `bf16`, element-wise codes (m_none.c, m_cast.c);
// their decode is the fused one (fc_cu_decode.cuh).
#include "fc_cu_decode.cuh"

// One fused pass per chunk: g' -> code -> body; e = g' - D(code) where the residual is kept
// (fc_cu_residual: always replaced, saturated, the CPU's rule for a chunk that passed NaN/Inf).
template <class M> __global__ void cast_encode(fc_cu_enc e, M m)
{
    const int c = blockIdx.y;
    int64_t start, n;
    uint8_t *body = fc_cu_enc_body(e, c, &start, &n);
    if (body == NULL)
        return;
    const int ef = e.res != NULL;
    const int passed = fc_cu_passed(e, c);
    const int sample = fc_cu_sampled(e, c);
    fc_cu_esum sum;
    int64_t sat = 0; // the codes' and, with error feedback, the residuals'
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float x = e.src.x(start + i);
        sat += m.sat(x);
        m.put(body, i, x);
        if (ef || sample) {
            int64_t s = 0;
            const float r = fc_cu_residual(x, m.term(body, i, -1.0f), passed, &s); // decode_add, alpha -1
            if (ef) {
                fc_cu_store_res(e.res, e.rdt, start + i, r, &s);
                sat += s;
            }
            sum.add(x, r);
        }
    }
    if (ef || sample)
        sum.flush(e.ws, ef ? e.unit_slot : -1, sample);
    fc_cu_count(&e.ws->saturated, sat);
}

struct none_code {
    int dt; // the gradient's own dtype is the wire dtype
    __device__ __forceinline__ void put(uint8_t *b, int64_t i, float x) const
    {
        if (dt == FC_CU_F32)
            ((float *)b)[i] = x;
        else
            ((uint16_t *)b)[i] = dt == FC_CU_BF16 ? fc_f32_to_bf16(x) : fc_f32_to_f16(x);
    }
    __device__ __forceinline__ int sat(float x) const
    {
        return dt == FC_CU_F32 ? 0 : dt == FC_CU_BF16 ? fc_bf16_saturates(x) : fc_f16_saturates(x);
    }
    __device__ __forceinline__ float term(const uint8_t *b, int64_t i, float alpha) const
    {
        return alpha * fc_cu_load(b, dt, i);
    }
    __device__ __forceinline__ float term(const uint8_t *b, int64_t i, float alpha, int *) const
    {
        return term(b, i, alpha);
    }
    __device__ __forceinline__ void add16(const uint8_t *b, int64_t i0, float alpha, float acc[16], uint32_t *) const
    {
        fc_cu_each16(b, dt, i0, [&](int k, float x) { acc[k] += alpha * x; });
    }
};

struct bf16_code {
    int unused;
    __device__ __forceinline__ void put(uint8_t *b, int64_t i, float x) const
    {
        ((uint16_t *)b)[i] = fc_f32_to_bf16(x);
    }
    __device__ __forceinline__ int sat(float x) const { return fc_bf16_saturates(x); }
    __device__ __forceinline__ float term(const uint8_t *b, int64_t i, float alpha) const
    {
        return alpha * fc_bf16_to_f32(((const uint16_t *)b)[i]);
    }
    __device__ __forceinline__ float term(const uint8_t *b, int64_t i, float alpha, int *) const
    {
        return term(b, i, alpha);
    }
    __device__ __forceinline__ void add16(const uint8_t *b, int64_t i0, float alpha, float acc[16], uint32_t *) const
    {
        fc_cu_each16(b, FC_CU_BF16, i0, [&](int k, float x) { acc[k] += alpha * x; });
    }
};

template <class M>
static int cast_launch_encode(const fc_cu_enc *e, const M &m, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    cast_encode<M><<<fc_cu_grid(e->geo.per, FC_CU_THREADS * 4, e->geo.world), FC_CU_THREADS, 0, s>>>(*e, m);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

static int none_encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    return cast_launch_encode(e, none_code{a->h.grad_dtype}, s, err);
}

static int none_decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    return fc_cu_launch_decode_fused(a, d, none_code{a->h.grad_dtype}, s, err);
}

static int fp16_encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    return cast_launch_encode(e, fc_cu_make_fp16(a->h.geo.world), s, err);
}

static int fp16_decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    return fc_cu_launch_decode_fused(a, d, fc_cu_make_fp16(a->h.geo.world), s, err);
}

static int bf16_encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    (void)a;
    return cast_launch_encode(e, bf16_code{0}, s, err);
}

static int bf16_decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    return fc_cu_launch_decode_fused(a, d, bf16_code{0}, s, err);
}

// A cast method's table entry: its decode is the fused one (fc_cu_decode.cuh).
static constexpr fc_cu_method cast_method(int id, decltype(fc_cu_method::encode) enc, decltype(fc_cu_method::decode) dec)
{
    fc_cu_method m = {id, enc, dec};
    m.fused_decode = 1;
    return m;
}

extern const fc_cu_method fc_cu_none = cast_method(FC_ID_NONE, none_encode, none_decode);
extern const fc_cu_method fc_cu_fp16 = cast_method(FC_ID_FP16, fp16_encode, fp16_decode);
extern const fc_cu_method fc_cu_bf16 = cast_method(FC_ID_BF16, bf16_encode, bf16_decode);
