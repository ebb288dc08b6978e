// fc_cu_dense.cuh: a dense block method on CUDA from its codec (fc_cu_codecs.cuh): the fused
// encode of every sent chunk of a unit (g' -> body, residual, error sums) and the fused decode
// (fc_cu_decode.cuh: headers, own chunk and payloads in one kernel) with a payload whose codes
// are impossible reported, not read.
#ifndef FC_CU_DENSE_CUH
#define FC_CU_DENSE_CUH

#include "fc_cu_decode.cuh"

// One thread block of warps per slice of a chunk (grid y): each warp encodes whole units.
template <class C>
__global__ void __launch_bounds__(FC_CU_CODEC_THREADS, 2) fc_cu_encode_dense(fc_cu_enc e, C codec)
{
    const int c = blockIdx.y;
    int64_t start, n;
    uint8_t *body = fc_cu_enc_body(e, c, &start, &n);
    if (body == NULL)
        return;
    const fc_cu_chunk_x x = fc_cu_chunk_x::make(e.src, start);
    fc_cu_res_sink sink = fc_cu_res_sink::make(e, c, start);
    const int64_t warp = (int64_t)blockIdx.x * FC_CU_CODEC_WARPS + (threadIdx.x >> 5);
    fc_cu_encode_blocks(codec, x, n, body, fc_cu_chunk_rng(e.rng, c, e.geo.rank), sink, warp,
                        (int64_t)gridDim.x * FC_CU_CODEC_WARPS);
    if (sink.on()) {
        sink.sum.flush(e.ws, sink.ef ? e.unit_slot : -1, sink.sample);
        fc_cu_count(&e.ws->saturated, sink.sat);
    }
}

template <class C>
static int fc_cu_launch_encode_dense(const fc_cu_enc *e, const C &codec, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    const int64_t units = (e->geo.per + fc_cu_unit(codec.bs) - 1) / fc_cu_unit(codec.bs);
    fc_cu_encode_dense<C><<<fc_cu_grid(units, FC_CU_CODEC_WARPS, e->geo.world), FC_CU_CODEC_THREADS, 0, s>>>(
        *e, codec);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
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
