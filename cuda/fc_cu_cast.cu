// fc_cu_cast.cu: kernels of `none`, `fp16` and `bf16`, element-wise codes (m_none.c, m_cast.c);
// a one-pass encode and the fused decode (fc_cu_decode.cuh).
#include "fc_cu_decode.cuh"
#include "fc_cu_onepass.cuh"

// The 8 codes q (M::code) of elements i.. of a body, W bytes each, cnt of them: one 16-byte store
// per 16 bytes where the body is 16-byte aligned (`vec`) and all 8 are there.
template <int W> __device__ __forceinline__ void cast_store8(uint8_t *body, int64_t i, const uint32_t q[8], int cnt, int vec)
{
    if (W == 4) {
        uint32_t *p = (uint32_t *)body + i;
        if (cnt == 8 && vec) {
            ((uint4 *)p)[0] = make_uint4(q[0], q[1], q[2], q[3]);
            ((uint4 *)p)[1] = make_uint4(q[4], q[5], q[6], q[7]);
        } else {
            for (int k = 0; k < 8; k++)
                if (k < cnt)
                    p[k] = q[k];
        }
    } else {
        uint16_t *p = (uint16_t *)body + i;
        if (cnt == 8 && vec) {
            *(uint4 *)p = make_uint4(q[0] | q[1] << 16, q[2] | q[3] << 16, q[4] | q[5] << 16, q[6] | q[7] << 16);
        } else {
            for (int k = 0; k < 8; k++)
                if (k < cnt)
                    p[k] = (uint16_t)q[k];
        }
    }
}

// One pass per call (fc_cu_onepass.cuh), 8 elements a thread at a time: g' -> codes -> body, the
// NaN/Inf and saturated codes counted, and with FC_CU_GENERAL e = g' - D(code) where the residual is
// kept or the call samples (fc_cu_res_sink: fc_cu_residual's per-element rule). A lean kernel is
// a copy or cast with the count folded in. W: the code's bytes.
template <class M, int W, int K> __global__ void __launch_bounds__(FC_CU_THREADS) cast_encode(fc_cu_enc e, M m)
{
    const int c = blockIdx.y;
    int64_t start, n;
    uint8_t *body = fc_cu_enc_body(e, c, &start, &n);
    if (body != NULL) {
        fc_cu_gx<K> x = fc_cu_gx<K>::make(e.src, start);
        const int vec = fc_cu_aligned16(body);
        uint32_t sat = 0; // the codes' and, with error feedback, the residuals'
        [[maybe_unused]] fc_cu_res_sink sink;
        if constexpr (K == FC_CU_GENERAL)
            sink = fc_cu_res_sink::make(e, start, e.sample);
        const int64_t stride = 8 * (int64_t)gridDim.x * blockDim.x;
        for (int64_t i = 8 * ((int64_t)blockIdx.x * blockDim.x + threadIdx.x); i < n; i += stride) {
            const int cnt = fc_cu_valid8(n, i);
            float v[8];
            uint32_t q[8];
            x.load8(i, cnt, v);
            for (int k = 0; k < 8; k++) {
                q[k] = m.code(v[k]);
                sat += k < cnt ? (uint32_t)m.sat(v[k]) : 0u;
            }
            cast_store8<W>(body, i, q, cnt, vec);
            if constexpr (K == FC_CU_GENERAL) {
                if (sink.on()) {
                    float d[8]; // decode_add's, alpha -1
                    for (int k = 0; k < 8; k++)
                        d[k] = m.value(q[k], -1.0f);
                    sink.put8(i, cnt, v, d);
                }
            }
        }
        if constexpr (K == FC_CU_GENERAL) {
            if (sink.on())
                sink.sum.flush_chunk(e.ws, c, sink.ef && e.unit_slot >= 0, sink.sample);
            sat += (uint32_t)sink.sat;
        }
        fc_cu_onepass_count(e, c, x.bad, x.sat + sat);
    }
    fc_cu_onepass_end(e);
}

// The encode's codes: code(x) the bits a body holds for g' = x, value(q, alpha) what the CPU's
// decode_add adds for it (alpha * D), sat(x) whether the code saturated; the decode's term reads
// a body. DT: the wire dtype a kernel is built for (-1: `dt`, at run time).
template <int DT> struct none_code {
    int dt; // the gradient's own dtype is the wire dtype
    __device__ __forceinline__ int wire() const { return DT >= 0 ? DT : dt; }
    __device__ __forceinline__ uint32_t code(float x) const
    {
        return wire() == FC_CU_F32 ? fc_f32_bits(x) : wire() == FC_CU_BF16 ? fc_f32_to_bf16(x) : fc_f32_to_f16(x);
    }
    __device__ __forceinline__ float value(uint32_t q, float alpha) const
    {
        return alpha * (wire() == FC_CU_F32 ? fc_bits_f32(q) : wire() == FC_CU_BF16 ? fc_bf16_to_f32((uint16_t)q)
                                                                                     : fc_f16_to_f32((uint16_t)q));
    }
    __device__ __forceinline__ int sat(float x) const
    {
        return wire() == FC_CU_F32 ? 0 : wire() == FC_CU_BF16 ? fc_bf16_saturates(x) : fc_f16_saturates(x);
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
    __device__ __forceinline__ uint32_t code(float x) const { return fc_f32_to_bf16(x); }
    __device__ __forceinline__ float value(uint32_t q, float alpha) const { return alpha * fc_bf16_to_f32((uint16_t)q); }
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

template <class M, int W, int K>
static int cast_launch_as(const fc_cu_enc *e, const M &m, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    const int64_t fill = fc_cu_fill(cast_encode<M, W, K>, e->device, FC_CU_THREADS);
    const dim3 grid = fc_cu_onepass_grid(fill, (e->geo.per + 7) / 8, FC_CU_THREADS, e->geo.world);
    cast_encode<M, W, K><<<grid, FC_CU_THREADS, 0, s>>>(*e, m);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

// The whole encode of a unit, one launch (fc_cu_method.onepass): a lean kernel for the common case.
template <class M, int W>
static int cast_launch_encode(const fc_cu_enc *e, const M &m, cudaStream_t s, fc_err *err)
{
    switch (fc_cu_onepass_kind(*e)) {
    case FC_CU_LEAN_F32:
        return cast_launch_as<M, W, FC_CU_LEAN_F32>(e, m, s, err);
    case FC_CU_LEAN_BF16:
        return cast_launch_as<M, W, FC_CU_LEAN_BF16>(e, m, s, err);
    default:
        return cast_launch_as<M, W, FC_CU_GENERAL>(e, m, s, err);
    }
}

// `none`: the wire dtype is the gradient's; the lean kernels' is known at build time.
static int none_encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    switch (fc_cu_onepass_kind(*e)) {
    case FC_CU_LEAN_F32:
        return cast_launch_as<none_code<FC_CU_F32>, 4, FC_CU_LEAN_F32>(e, none_code<FC_CU_F32>{FC_CU_F32}, s, err);
    case FC_CU_LEAN_BF16:
        return cast_launch_as<none_code<FC_CU_BF16>, 2, FC_CU_LEAN_BF16>(e, none_code<FC_CU_BF16>{FC_CU_BF16}, s, err);
    default:
        return a->h.grad_dtype == FC_CU_F32
                   ? cast_launch_as<none_code<-1>, 4, FC_CU_GENERAL>(e, none_code<-1>{a->h.grad_dtype}, s, err)
                   : cast_launch_as<none_code<-1>, 2, FC_CU_GENERAL>(e, none_code<-1>{a->h.grad_dtype}, s, err);
    }
}

static int none_decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    return fc_cu_launch_decode_fused(a, d, none_code<-1>{a->h.grad_dtype}, s, err);
}

static int fp16_encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    return cast_launch_encode<fc_cu_fp16_code, 2>(e, fc_cu_make_fp16(a->h.geo.world), s, err);
}

static int fp16_decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    return fc_cu_launch_decode_fused(a, d, fc_cu_make_fp16(a->h.geo.world), s, err);
}

static int bf16_encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    (void)a;
    return cast_launch_encode<bf16_code, 2>(e, bf16_code{0}, s, err);
}

static int bf16_decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    return fc_cu_launch_decode_fused(a, d, bf16_code{0}, s, err);
}

// A cast method's table entry: a one-pass encode, the fused decode (fc_cu_decode.cuh).
static constexpr fc_cu_method cast_method(int id, decltype(fc_cu_method::encode) enc, decltype(fc_cu_method::decode) dec)
{
    fc_cu_method m = {id, enc, dec, NULL, 0, 1};
    m.fused_decode = 1;
    return m;
}

extern const fc_cu_method fc_cu_none = cast_method(FC_ID_NONE, none_encode, none_decode);
extern const fc_cu_method fc_cu_fp16 = cast_method(FC_ID_FP16, fp16_encode, fp16_decode);
extern const fc_cu_method fc_cu_bf16 = cast_method(FC_ID_BF16, bf16_encode, bf16_decode);
