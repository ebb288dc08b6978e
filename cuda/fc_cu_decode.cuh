// fc_cu_decode.cuh: the fused decode of the dense methods (int8, fp8, intN, qsgd, nc, onebit
// through fc_cu_dense.cuh; none, fp16 and bf16 in fc_cu_cast.cu): one kernel per decode and per
// decompress(), no memset, nothing else launched (their fc_cu_method.fused_decode). Each block
// checks the headers it reads (fc_header_verdict, the CPU's rule), warp by warp; a thread
// then takes runs of 16 output elements (FC_CU_RUN): the own chunk's 16 values (its NaN/Inf
// counted in nonfinite_in here, in the same pass), each payload's 16 codes from one wide load
// with its block's meta in a register, added in rank order from zero exactly as the CPU's
// decode_add adds them, then acc / W under the output rules (fc_output_passes per element, then
// fc_output_fix) and 16-byte stores. The grid is what the device holds at once (SMs x resident
// blocks, fc_cu_onepass.cuh's fc_cu_fill), looping over the rest.
#ifndef FC_CU_DECODE_CUH
#define FC_CU_DECODE_CUH

#include "fc_cu_codecs.cuh"
#include "fc_cu_onepass.cuh" // fc_cu_fill: the grid that fills the device

#define FC_CU_RUN 16 // output elements per thread and step: 16 one-byte codes are one 16-byte load

// What a block knows of the payloads it reads once fc_cu_check_payloads ran: one was rejected
// (every output NaN, as the CPU raises; nothing is decoded), one accepted is flagged NONFINITE
// (every output's NaN/Inf goes through).
struct fc_cu_verdicts {
    unsigned rejected, flagged;
};

// The first malformed payload of the call, kept for counters() to raise: check_headers' and
// fc_cu_reject's rule (the first code to land wins, and brings its rank, unit and step).
__device__ __forceinline__ void fc_cu_payload_error(fc_cuda_ws *ws, unsigned code, int r, uint32_t unit, uint32_t step)
{
    if (atomicCAS(&ws->payload_error, 0u, code) == 0u) {
        ws->payload_error_rank = r;
        ws->payload_error_unit = unit;
        ws->payload_error_step = step;
    }
}

__device__ __forceinline__ const uint8_t *fc_cu_payload_at(const fc_cu_dec &d, int r)
{
    return d.recv + (d.add ? 0 : fc_cu_recv_off(d.geo, r, d.slot));
}

// Every payload's header of this call (decompress(): its one), checked by each warp, its lanes
// taking 32 ranks at a time: a warp needs every verdict before its first element, and a second
// kernel (or one block checking for all, with a grid-wide wait) would cost a launch or a sync per
// call. A warp's own check needs no shared memory and no block barrier, and the headers it reads
// again are L1/L2 hits. Warp 0 of block 0 alone records a rejection, so the error is written
// once. All 32 lanes of the warp call it.
__device__ __forceinline__ fc_cu_verdicts fc_cu_check_payloads(const fc_cu_dec &d, int64_t n)
{
    const int senders = n > 0 && d.slot > 0 ? (d.add ? 1 : d.geo.world) : 0;
    const int lane = (int)(threadIdx.x & 31), records = blockIdx.x == 0 && threadIdx.x < 32;
    const uint64_t body = (uint64_t)fc_cu_body_bytes(d.geo, n);
    unsigned rejected = 0, flagged = 0;
    for (int base = 0; base < senders; base += 32) { // the same trips on every lane
        const int r = base + lane;
        unsigned code = 0, flag = 0;
        if (r < senders && !(!d.add && d.geo.skip_own && r == d.geo.rank)) { // the own chunk kept exact: no payload
            fc_header h;
            memcpy(&h, fc_cu_payload_at(d, r), sizeof(h));
            code = fc_header_verdict(&h, &d.key, (uint64_t)n, body, d.varsize, d.slot);
            flag = code == 0 && (h.flags & FC_HDR_NONFINITE); // the sender's NaN/Inf are on the wire
            if (code != 0 && records)
                fc_cu_payload_error(d.ws, code, r, h.unit, h.step);
        }
        rejected |= __ballot_sync(0xffffffffu, code != 0);
        flagged |= __ballot_sync(0xffffffffu, flag != 0);
    }
    return fc_cu_verdicts{rejected != 0, flagged != 0};
}

// A code no encoder writes in rank r's payload: the CPU raises PayloadError there; here its
// elements become NaN and counters() raises FC_PAYLOAD_CODES. Not inlined: a rare path whose
// header copy would otherwise take registers from the run loop (qsgd's spilled).
static __device__ __noinline__ void fc_cu_codes_error(const fc_cu_dec &d, int r)
{
    fc_header h;
    memcpy(&h, fc_cu_payload_at(d, r), sizeof(h));
    fc_cu_payload_error(d.ws, FC_PAYLOAD_CODES, r, h.unit, h.step);
}

// The own chunk's element as the sum takes it (fc_cu_own's rule on a loaded value).
__device__ __forceinline__ float fc_cu_own_value(float g, int zero)
{
    return fc_abs_bits(g) < FC_INF_BITS ? g : zero ? 0.0f : fc_canon_nan(g);
}

// out[i0 .. i0 + 16) = acc / W in out's dtype with 16-byte stores where out allows them: an
// element of `poison` is NaN, one of `pass` passes NaN/Inf (fc_output_fix), a narrow output
// saturates at its format's largest value; the counts as fc_cu_store_out makes them.
// The counts are a thread's, 32 bits (a thread stores far fewer than 2^32 elements).
__device__ __forceinline__ void fc_cu_put16(void *out, int odt, int64_t i0, float acc[16], float w, uint32_t pass,
                                            uint32_t poison, uint32_t *nonfinite, uint32_t *sat)
{
    for (int k = 0; k < 16; k++) {
        float v = (poison >> k) & 1u ? fc_bits_f32(FC_NAN_BITS) : acc[k] / w;
        if (!(fc_abs_bits(v) < FC_INF_BITS)) {
            int64_t nf = 0, st = 0;
            v = fc_output_fix(v, (int)(((pass | poison) >> k) & 1u), &nf, &st);
            *nonfinite += (uint32_t)nf;
            *sat += (uint32_t)st;
        } else if (odt != FC_CU_F32) {
            *sat += (uint32_t)(odt == FC_CU_BF16 ? fc_bf16_saturates(v) : fc_f16_saturates(v));
        }
        acc[k] = v;
    }
    if (odt == FC_CU_F32) {
        float *o = (float *)out + i0;
        if (((uintptr_t)o & 15u) == 0) {
            for (int q = 0; q < 4; q++)
                ((float4 *)o)[q] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
        } else {
            for (int k = 0; k < 16; k++)
                o[k] = acc[k];
        }
        return;
    }
    uint32_t h[8];
    for (int q = 0; q < 8; q++) {
        const float a = acc[2 * q], b = acc[2 * q + 1];
        h[q] = odt == FC_CU_BF16 ? (uint32_t)fc_f32_to_bf16(a) | (uint32_t)fc_f32_to_bf16(b) << 16
                                 : (uint32_t)fc_f32_to_f16(a) | (uint32_t)fc_f32_to_f16(b) << 16;
    }
    uint16_t *o = (uint16_t *)out + i0;
    if (((uintptr_t)o & 15u) == 0) {
        ((uint4 *)o)[0] = make_uint4(h[0], h[1], h[2], h[3]);
        ((uint4 *)o)[1] = make_uint4(h[4], h[5], h[6], h[7]);
    } else {
        for (int k = 0; k < 16; k++)
            o[k] = (uint16_t)(h[k >> 1] >> (16 * (k & 1)));
    }
}

// FSDP's padded tail: out[i, i + cnt) zeroed, 16 bytes at a time where out allows it.
__device__ __forceinline__ void fc_cu_zero_run(void *out, int odt, int64_t i, int cnt)
{
    const int es = odt == FC_CU_F32 ? 4 : 2;
    uint8_t *o = (uint8_t *)out + i * es;
    if (cnt == 16 && ((uintptr_t)o & 15u) == 0) {
        for (int q = 0; q < es; q++)
            ((uint4 *)o)[q] = make_uint4(0u, 0u, 0u, 0u);
        return;
    }
    for (int k = 0; k < cnt; k++)
        (void)fc_cu_out_tail(out, odt, i + k, 0);
}

// The collective's output element i of a run that is cut by the own chunk's end (the chunk's
// last partial run): the sum element by element, as the run's, with the codec's scalar term.
// Returns the own chunk's NaN/Inf at i (0 or 1) for nonfinite_in.
template <class V>
__device__ __forceinline__ int fc_cu_decode_one(const fc_cu_dec &d, const V &v, fc_cu_verdicts pv, int64_t start,
                                                int64_t i, float w, uint32_t *nonfinite, uint32_t *sat)
{
    float acc = 0.0f;
    int poison = pv.rejected != 0, pass = pv.flagged != 0, own_bad = 0;
    for (int r = 0; r < d.geo.world; r++) {
        if (d.geo.skip_own && r == d.geo.rank) {
            const float g = fc_cu_load(d.grad, d.gdt, start + i);
            own_bad = !(fc_abs_bits(g) < FC_INF_BITS);
            pass = fc_output_passes(pass, fc_cu_own_pass(d), g);
            acc += fc_cu_own_value(g, d.zero_nonfinite);
            continue;
        }
        if (pv.rejected)
            continue;
        int bad = 0;
        acc += v.term(fc_cu_payload_at(d, r) + FC_HEADER_BYTES, i, 1.0f, &bad);
        if (bad) {
            poison = 1;
            fc_cu_codes_error(d, r);
        }
    }
    int64_t nf = 0, st = 0;
    fc_cu_store_out(d.out, d.odt, i, poison ? fc_bits_f32(FC_NAN_BITS) : acc / w, pass || poison, &nf, &st);
    *nonfinite += (uint32_t)nf;
    *sat += (uint32_t)st;
    return own_bad;
}

// decompress(): out (fp32) += alpha * D(the one payload), every NaN the canonical one
// (fc_cu_add_canon's rule), every element NaN where the header was rejected or its code is one
// no encoder writes. Run by run, the last partial run element by element. A kernel apart from
// the collective's decode: each keeps only its own path's registers.
template <class V> __global__ void __launch_bounds__(FC_CU_THREADS, 4) fc_cu_decompress_fused(fc_cu_dec d, V v)
{
    const fc_cu_verdicts pv = fc_cu_check_payloads(d, d.geo.numel);
    const uint8_t *body = d.recv + FC_HEADER_BYTES;
    float *out = (float *)d.out;
    const int64_t runs = (d.out_numel + FC_CU_RUN - 1) / FC_CU_RUN, stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < runs; k += stride) {
        const int64_t i0 = k * FC_CU_RUN;
        if (i0 + FC_CU_RUN > d.out_numel) {
            for (int64_t i = i0; i < d.out_numel; i++) {
                int bad = pv.rejected != 0;
                const float t = bad ? 0.0f : v.term(body, i, d.alpha, &bad);
                if (bad && !pv.rejected)
                    fc_cu_codes_error(d, 0);
                fc_cu_add_canon(out + i, bad ? fc_bits_f32(FC_NAN_BITS) : t);
            }
            continue;
        }
        float acc[16];
        fc_cu_each16(out, FC_CU_F32, i0, [&](int j, float x) { acc[j] = x; });
        uint32_t bad = pv.rejected ? 0xFFFFu : 0u;
        if (!pv.rejected)
            v.add16(body, i0, d.alpha, acc, &bad);
        if (bad && !pv.rejected)
            fc_cu_codes_error(d, 0);
        for (int j = 0; j < 16; j++)
            acc[j] = fc_canon_nan((bad >> j) & 1u ? fc_bits_f32(FC_NAN_BITS) : acc[j]);
        if (((uintptr_t)(out + i0) & 15u) == 0) {
            for (int q = 0; q < 4; q++)
                ((float4 *)(out + i0))[q] = make_float4(acc[4 * q], acc[4 * q + 1], acc[4 * q + 2], acc[4 * q + 3]);
        } else {
            for (int j = 0; j < 16; j++)
                out[i0 + j] = acc[j];
        }
    }
}

// The collective's decode of a dense method whose codec V has term and add16. At most 64
// registers (four blocks of 256 threads per SM; ptxas -v shows none spilled): 16 sums, the run's
// codes of one payload at a time, the masks and the counts.
template <class V> __global__ void __launch_bounds__(FC_CU_THREADS, 4) fc_cu_decode_fused(fc_cu_dec d, V v)
{
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    const fc_cu_verdicts pv = fc_cu_check_payloads(d, n);
    const float w = (float)d.geo.world;
    const int own_pass = fc_cu_own_pass(d);
    const uint32_t all = pv.flagged ? 0xFFFFu : 0u, rejected = pv.rejected ? 0xFFFFu : 0u;
    uint32_t nonfinite = 0, sat = 0, own_bad = 0; // this thread's
    const int64_t step = (int64_t)gridDim.x * blockDim.x * FC_CU_RUN;
    for (int64_t i0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * FC_CU_RUN; i0 < d.out_numel; i0 += step) {
        if (i0 + FC_CU_RUN > n) { // the own chunk's last partial run, or FSDP's padded tail
            const int64_t end = i0 + FC_CU_RUN < d.out_numel ? i0 + FC_CU_RUN : d.out_numel;
            if (i0 >= n) {
                fc_cu_zero_run(d.out, d.odt, i0, (int)(end - i0));
                continue;
            }
            for (int64_t i = i0; i < end; i++)
                if (!fc_cu_out_tail(d.out, d.odt, i, n))
                    own_bad += fc_cu_decode_one(d, v, pv, start, i, w, &nonfinite, &sat);
            continue;
        }
        float acc[16];
        for (int j = 0; j < 16; j++)
            acc[j] = 0.0f; // the CPU's sum starts from zero: 0 + own turns a -0 into +0
        uint32_t pass = all, poison = rejected;
        for (int r = 0; r < d.geo.world; r++) {
            if (d.geo.skip_own && r == d.geo.rank) {
                fc_cu_each16(d.grad, d.gdt, start + i0, [&](int j, float g) {
                    own_bad += !(fc_abs_bits(g) < FC_INF_BITS);
                    pass |= (uint32_t)fc_output_passes(pv.flagged != 0, own_pass, g) << j;
                    acc[j] += fc_cu_own_value(g, d.zero_nonfinite);
                });
                continue;
            }
            if (pv.rejected)
                continue;
            uint32_t bad = 0;
            v.add16(fc_cu_payload_at(d, r) + FC_HEADER_BYTES, i0, 1.0f, acc, &bad);
            if (bad) {
                poison |= bad;
                fc_cu_codes_error(d, r);
            }
        }
        fc_cu_put16(d.out, d.odt, i0, acc, w, pass, poison, &nonfinite, &sat);
    }
    fc_cu_count(&d.ws->nonfinite_out, nonfinite);
    fc_cu_count(&d.ws->saturated, sat);
    fc_cu_count(&d.ws->nonfinite_in, own_bad); // the own chunk kept exact: the CPU's decode counts it
}

// The grid of a fused kernel over `numel` outputs: a block per FC_CU_THREADS runs, at most what
// the device holds at once.
static inline unsigned fc_cu_fused_grid(int64_t numel, int64_t most)
{
    const int64_t runs = (numel + FC_CU_RUN - 1) / FC_CU_RUN;
    const int64_t blocks = (runs + FC_CU_THREADS - 1) / FC_CU_THREADS;
    return (unsigned)(most > 0 && blocks > most ? most : blocks > 65535 ? 65535 : blocks);
}

// The one launch of a fused decode: decompress()'s (d->add) or the collective's.
template <class V>
static int fc_cu_launch_decode_fused(const fc_cuda_decode_args *a, const fc_cu_dec *d, const V &v, cudaStream_t s,
                                     fc_err *err)
{
    int rc = FC_OK;
    if (d->out_numel > 0 && d->add) {
        const int64_t most = fc_cu_fill(fc_cu_decompress_fused<V>, a->h.device, FC_CU_THREADS);
        fc_cu_decompress_fused<V><<<fc_cu_fused_grid(d->out_numel, most), FC_CU_THREADS, 0, s>>>(*d, v);
        FC_CHECK_LAUNCH(err, error);
    } else if (d->out_numel > 0) {
        const int64_t most = fc_cu_fill(fc_cu_decode_fused<V>, a->h.device, FC_CU_THREADS);
        fc_cu_decode_fused<V><<<fc_cu_fused_grid(d->out_numel, most), FC_CU_THREADS, 0, s>>>(*d, v);
        FC_CHECK_LAUNCH(err, error);
    }
error:
    return rc;
}

#endif
