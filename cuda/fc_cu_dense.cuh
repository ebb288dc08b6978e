// fc_cu_dense.cuh: a dense block method on CUDA from its codec (fc_cu_codecs.cuh): the one-pass
// encode of every sent chunk of a unit (g' -> body, residual, error sums, counts, then the
// headers: fc_cu_onepass.cuh) and the fused decode (fc_cu_decode.cuh: headers, own chunk and
// payloads in one kernel) with a payload whose codes are impossible reported, not read.
#ifndef FC_CU_DENSE_CUH
#define FC_CU_DENSE_CUH

#include "fc_cu_decode.cuh"
#include "fc_cu_onepass.cuh"

// Thread blocks of warps per slice of a chunk (grid y), as many as fill the device: each warp
// encodes every warps-th unit of its chunk, the next one's tile loaded while it codes this one.
// The lean kernels (K: FC_CU_LEAN_*) hold no residual or sum state and fit 64 registers, four
// blocks of 256 threads an SM (tests/cuda/test_cuda_registers.py); FC_CU_GENERAL has the sink.
template <class C, int K>
__global__ void __launch_bounds__(FC_CU_CODEC_THREADS, K == FC_CU_GENERAL ? 2 : 4) fc_cu_encode_dense(fc_cu_enc e, C codec)
{
    const int c = blockIdx.y;
    int64_t start, n;
    uint8_t *body = fc_cu_enc_body(e, c, &start, &n);
    if (body != NULL) {
        fc_cu_gx<K> x = fc_cu_gx<K>::make(e.src, start);
        const int64_t warp = (int64_t)blockIdx.x * FC_CU_CODEC_WARPS + (threadIdx.x >> 5);
        const int64_t warps = (int64_t)gridDim.x * FC_CU_CODEC_WARPS;
        const fc_rng rng = fc_cu_chunk_rng(e.rng, c, e.geo.rank);
        uint32_t sat = 0;
        if constexpr (K == FC_CU_GENERAL) {
            fc_cu_res_sink sink = fc_cu_res_sink::make(e, start, e.sample);
            fc_cu_encode_blocks(codec, x, n, body, rng, sink, warp, warps);
            if (sink.on())
                sink.sum.flush_chunk(e.ws, c, sink.ef && e.unit_slot >= 0, sink.sample);
            sat = (uint32_t)sink.sat;
        } else {
            fc_cu_no_sink none;
            fc_cu_encode_blocks(codec, x, n, body, rng, none, warp, warps);
        }
        fc_cu_onepass_count(e, c, x.bad, x.sat + sat);
    }
    fc_cu_onepass_end(e);
}

template <class C, int K>
static int fc_cu_launch_encode_dense_as(const fc_cu_enc *e, const C &codec, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    const int64_t units = (e->geo.per + fc_cu_unit(codec.bs) - 1) / fc_cu_unit(codec.bs);
    if (units > (int64_t)UINT32_MAX) // fc_cu_encode_blocks counts units in 32 bits
        return fc_fail(err, FC_ERR_VALUE, "a chunk of %lld elements is past what the CUDA encode walks "
                       "(2^40)", (long long)e->geo.per);
    const int64_t fill = fc_cu_fill(fc_cu_encode_dense<C, K>, e->device, FC_CU_CODEC_THREADS);
    fc_cu_encode_dense<C, K><<<fc_cu_onepass_grid(fill, units, FC_CU_CODEC_WARPS, e->geo.world), FC_CU_CODEC_THREADS, 0, s>>>(
        *e, codec);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

// The whole encode of a unit, one launch (fc_cu_method.onepass).
template <class C>
static int fc_cu_launch_encode_dense(const fc_cu_enc *e, const C &codec, cudaStream_t s, fc_err *err)
{
    switch (fc_cu_onepass_kind(*e)) {
    case FC_CU_LEAN_F32:
        return fc_cu_launch_encode_dense_as<C, FC_CU_LEAN_F32>(e, codec, s, err);
    case FC_CU_LEAN_BF16:
        return fc_cu_launch_encode_dense_as<C, FC_CU_LEAN_BF16>(e, codec, s, err);
    default:
        return fc_cu_launch_encode_dense_as<C, FC_CU_GENERAL>(e, codec, s, err);
    }
}

// A codec's decoder for fc_cu_decode_dense (a method whose decode is not fused: signsgd's scaled
// payloads, with the driver's header checks): a code the encoder cannot write poisons that element
// (NaN) and makes the payload's rank, unit and step the workspace's payload error
// (FC_PAYLOAD_CODES), which counters() raises, as the CPU raises PayloadError at the decode.
template <class D> struct fc_cu_checked {
    D d;
    const uint8_t *recv;
    int64_t slot;
    int rank, skip_own;
    fc_cuda_ws *ws;

    __device__ __forceinline__ float term(const uint8_t *body, int64_t i, float alpha, int *poison) const
    {
        int bad = 0;
        const float v = d.term(body, i, alpha, &bad);
        if (!bad)
            return v;
        *poison = 1;
        const uint8_t *p = body - FC_HEADER_BYTES;
        const int k = (int)((p - recv) / slot); // slot index; the own slot is absent unless sent
        if (atomicCAS(&ws->payload_error, 0u, (unsigned int)FC_PAYLOAD_CODES) == 0u) {
            fc_header h;
            memcpy(&h, p, sizeof(h));
            ws->payload_error_rank = k + (skip_own && k >= rank);
            ws->payload_error_unit = h.unit;
            ws->payload_error_step = h.step;
        }
        return fc_bits_f32(FC_NAN_BITS);
    }
};

template <class C>
static int fc_cu_launch_decode_codec(const fc_cuda_decode_args *a, const fc_cu_dec *d, const C &codec,
                                     cudaStream_t s, fc_err *err)
{
    int64_t start, n;
    fc_cu_span(a->h.geo, a->h.geo.rank, &start, &n); // every payload received is of the own chunk
    fc_cu_checked<typename C::dec> v;
    v.d = codec.at(n);
    v.recv = d->recv;
    v.slot = d->slot;
    v.rank = d->geo.rank;
    v.skip_own = d->geo.skip_own;
    v.ws = d->ws;
    return fc_cu_launch_decode_dense(d, v, s, err);
}

// The fused decode (fc_cu_decode.cuh) of a block codec: every payload received is of the own
// chunk, so one decoder (its meta size) serves them all.
template <class C>
static int fc_cu_launch_decode_codec_fused(const fc_cuda_decode_args *a, const fc_cu_dec *d, const C &codec,
                                           cudaStream_t s, fc_err *err)
{
    int64_t start, n;
    fc_cu_span(a->h.geo, a->h.geo.rank, &start, &n);
    return fc_cu_launch_decode_fused(a, d, codec.at(n), s, err);
}

// Config checks every block codec shares: sizes the CPU's key table allows.
static inline int fc_cu_check_block(const char *method, const char *key, int64_t bs, fc_err *err)
{
    if (bs < 8 || bs > (1 << 24) || (bs & (bs - 1)) != 0)
        return fc_fail(err, FC_ERR_VALUE, "%s %s must be a power of two in [8, 2^24], got %lld",
                       method, key, (long long)bs);
    return FC_OK;
}

#endif
