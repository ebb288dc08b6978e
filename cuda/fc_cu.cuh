// fc_cu.cuh: what every .cu of the CUDA library shares: status checks, chunk geometry, the
// load/store of g' = g + e and residuals, warp reductions, and the per-method table entry.
#ifndef FC_CU_CUH
#define FC_CU_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "common/fc_chunk_rules.h"
#include "backend_cuda/fc_cuda.h"
#include "common/fc_half.h"
#include "common/fc_quant.h"
#include "common/fc_range.h"
#include "common/fc_rng.h"
#include "common/fc_wire.h"

/* dtype codes of fc_method.h (not included: it is C-only by its table's designated inits) */
#define FC_CU_F32 0
#define FC_CU_BF16 1
#define FC_CU_F16 2

// Records file:line and CUDA's message, then jumps to the function's cleanup. The failure is
// also taken out of the runtime's per-thread last-error slot: it is reported here, and left
// there it would make the next FC_CHECK_LAUNCH on this thread (a later call's, maybe another
// State's) raise it again. A sticky error (a broken context) comes back from every call anyway.
#define FC_CHECK_CUDA(call, err, label)                                                      \
    do {                                                                                     \
        cudaError_t fc_ce_ = (call);                                                         \
        if (fc_ce_ != cudaSuccess) {                                                         \
            fc_fail((err), FC_ERR_CUDA, "%s:%d: %s failed: %s (%s)", __FILE__, __LINE__,      \
                    #call, cudaGetErrorString(fc_ce_), cudaGetErrorName(fc_ce_));             \
            (void)cudaGetLastError();                                                        \
            rc = FC_ERR_CUDA;                                                                \
            goto label;                                                                      \
        }                                                                                    \
    } while (0)

// A call whose failure loses nothing but itself (a timing, a device switch back): its error
// must not stay in the last-error slot for the next FC_CHECK_LAUNCH to find.
#define FC_CUDA_IGNORE(call)                                                                 \
    do {                                                                                     \
        if ((call) != cudaSuccess)                                                           \
            (void)cudaGetLastError();                                                        \
    } while (0)

// After a launch: a bad configuration shows up here, not at the next sync.
#define FC_CHECK_LAUNCH(err, label) FC_CHECK_CUDA(cudaGetLastError(), err, label)

#define FC_CU_THREADS 256

// ---- geometry (host and device): fc_chunk_rules.h's, on the call's fc_cuda_geom

__host__ __device__ __forceinline__ void fc_cu_span(const fc_cuda_geom &g, int c, int64_t *start,
                                                    int64_t *n)
{
    fc_chunk_span_per(g.numel, g.per, c, start, n);
}

__host__ __device__ __forceinline__ int fc_cu_sent(const fc_cuda_geom &g, int c, int64_t n)
{
    return fc_chunk_sent(n, c, g.rank, g.skip_own);
}

// f(f(f(0.0f, r0), r1), ...) over the ranks r that sent the own chunk a payload, in rank order (the
// own rank's is absent where its chunk is kept exact): a receiver's sum over the senders.
template <class F> __device__ __forceinline__ float fc_cu_fold_senders(const fc_cuda_geom &g, F f)
{
    float a = 0.0f;
    for (int r = 0; r < g.world; r++)
        if (!(g.skip_own && r == g.rank))
            a = f(a, r);
    return a;
}

// Byte offset of chunk c's payload in the send buffer: every sent chunk before it is full.
__host__ __device__ __forceinline__ int64_t fc_cu_send_off(const fc_cuda_geom &g, int c)
{
    int64_t nonempty = fc_chunk_nonempty(g.numel, g.per);
    int64_t k = c < nonempty ? c : nonempty;
    if (g.skip_own && g.rank < k)
        k--;
    return k * g.pay_full;
}

__host__ __device__ __forceinline__ int64_t fc_cu_body_bytes(const fc_cuda_geom &g, int64_t n)
{
    return n == g.per ? g.body_full : g.body_last;
}

// Offset of rank r's slot in the receive buffer (the own slot is absent unless compressed).
__host__ __device__ __forceinline__ int64_t fc_cu_recv_off(const fc_cuda_geom &g, int r, int64_t slot)
{
    return (int64_t)(r - (g.skip_own && r > g.rank)) * slot;
}

// ---- element access

__device__ __forceinline__ float fc_cu_load(const void *p, int dt, int64_t i)
{
    if (dt == FC_CU_F32)
        return ((const float *)p)[i];
    uint16_t h = ((const uint16_t *)p)[i];
    return dt == FC_CU_BF16 ? fc_bf16_to_f32(h) : fc_f16_to_f32(h);
}

// What the encode kernels see of one element: g' = g + d e, as the CPU's load_chunk makes it (d:
// `ef_decay`; a sum beyond fp32 saturated, NaN/Inf of the gradient zeroed to d e or passed as
// the canonical NaN: fc_gprime_fix). count_nonfinite counts what fix() found, before the encode.
struct fc_cu_src {
    const void *grad;
    const void *res; // NULL: no error feedback
    int gdt, rdt;
    int zero_nonfinite;
    float decay; // ef_decay (fc_cuda_encode_args): read only with res

    // The residual element r as g' takes it: d * r, one float multiply as the CPU's add_f32 and
    // load_sum_f32 make it (d = 1 leaves r as it is), so the bytes match for any d.
    __device__ __forceinline__ float decayed(float r) const { return decay * r; }

    // g' from g and the decayed residual e (decayed(), 0 without a residual); *bad / *sat as
    // fc_gprime_fix counts them.
    __device__ __forceinline__ float fix(float g, float e, int64_t *bad, int64_t *sat) const
    {
        const float v = res != NULL ? g + e : g;
        return fc_abs_bits(v) < FC_INF_BITS ? v : fc_gprime_fix(v, g, e, zero_nonfinite, bad, sat);
    }

    __device__ __forceinline__ float x(int64_t i) const
    {
        int64_t bad = 0, sat = 0;
        return fix(fc_cu_load(grad, gdt, i), res != NULL ? decayed(fc_cu_load(res, rdt, i)) : 0.0f, &bad, &sat);
    }
};

// A residual element, as the CPU's store_residual keeps it: a bf16 one saturated (*sat).
__device__ __forceinline__ void fc_cu_store_res(void *res, int rdt, int64_t i, float e, int64_t *sat)
{
    if (rdt == FC_CU_F32) {
        ((float *)res)[i] = e;
    } else {
        *sat += fc_bf16_saturates(e);
        ((uint16_t *)res)[i] = fc_f32_to_bf16(e);
    }
}

// The first position of the ascending a[0, count) whose value is not below v (count if none):
// the kept indices of a selection, a group's sorted sketch keys. v converts to T, as a[]'s.
template <class T> struct fc_cu_type { typedef T type; };
template <class T>
__device__ __forceinline__ int64_t fc_cu_lower_bound(const T *a, int64_t count, typename fc_cu_type<T>::type v)
{
    int64_t lo = 0, hi = count;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (a[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

template <class T> __device__ __forceinline__ T fc_cu_warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ uint32_t fc_cu_warp_max(uint32_t v)
{
    for (int o = 16; o > 0; o >>= 1) {
        uint32_t w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

// A count of this thread's, added to a workspace counter once per warp.
__device__ __forceinline__ void fc_cu_count(unsigned long long *counter, int64_t v)
{
    unsigned long long w = fc_cu_warp_sum((unsigned long long)v);
    if ((threadIdx.x & 31) == 0 && w)
        atomicAdd(counter, w);
}

// The residual of one sent element from g' (x) and the decode with alpha = -1 (dneg = -D), as
// the CPU's update_residual makes it: fc_range.h's rule, decided per element (x + dneg where
// that is finite), so a kernel writes it without knowing what the rest of its chunk held.
__device__ __forceinline__ float fc_cu_residual(float x, float dneg, int64_t *sat)
{
    return fc_residual(x, dneg, sat);
}

// Per-thread sums for the error feedback: ||e||^2 of the unit, and the sampled statistics.
struct fc_cu_esum {
    double ee, xx, xe;
    __device__ __forceinline__ fc_cu_esum() : ee(0), xx(0), xe(0) {}
    __device__ __forceinline__ void add(float x, float e)
    {
        ee += (double)e * e;
        xx += (double)x * x;
        xe += (double)x * e;
    }
    // A one-pass encode's (fc_cu_onepass.cuh): one atomic per warp into this call's ||e||^2
    // (`unit`) and, on a sampled call, chunk c's sums, every chunk's: which one is the sample
    // is known only at the end.
    __device__ __forceinline__ void flush_chunk(fc_cuda_ws *ws, int c, bool unit, bool sample)
    {
        double a = fc_cu_warp_sum(ee), b = fc_cu_warp_sum(xx), d = fc_cu_warp_sum(xe);
        if ((threadIdx.x & 31) == 0) {
            if (unit)
                atomicAdd(&ws->enc_unit_sq, a);
            if (sample) {
                atomicAdd(&ws->enc_sum[c][0], a);
                atomicAdd(&ws->enc_sum[c][1], b);
                atomicAdd(&ws->enc_sum[c][2], d);
            }
        }
    }
    // One atomic per warp; lanes that did nothing add zeros.
    __device__ __forceinline__ void flush(fc_cuda_ws *ws, int unit_slot, int sample)
    {
        double a = fc_cu_warp_sum(ee), b = fc_cu_warp_sum(xx), c = fc_cu_warp_sum(xe);
        if ((threadIdx.x & 31) == 0) {
            if (unit_slot >= 0)
                atomicAdd(&ws->unit_sq[unit_slot], a);
            if (sample) {
                atomicAdd(&ws->call_sum[0], a);
                atomicAdd(&ws->call_sum[1], b);
                atomicAdd(&ws->call_sum[2], c);
            }
        }
    }
};

// ---- what a method's kernels receive

// Everything the encode kernel of any method needs, by value.
struct fc_cu_enc {
    fc_cuda_geom geo;
    fc_cu_src src;
    void *res;      // residual to update, NULL without error feedback
    int rdt;
    uint8_t *send;
    const unsigned int *bad; // per chunk: count_nonfinite's of this call (a one-pass encode keeps its own flags)
    fc_cuda_ws *ws;
    int unit_slot; // index into ws->unit_sq, -1 when not tracked
    int sample;    // this call samples the error statistics of ws->sample_chunk (fc_cu_sampled)
    fc_rng rng;    // chunk and key1 filled per chunk by fc_cu_chunk_rng; chunk: the base id
    int single;    // compress(): one payload for the caller, no collective follows (no size
                   // records on the host, no `none` fallback, no second round)
    fc_header_key key; // the headers' fields: a one-pass encode writes them after its bodies
    int device;        // the call's device (a one-pass encode's grid fills it)
};

// Whether chunk c's error statistics are this call's sample: the first sent chunk whose g' has
// no NaN/Inf, as the CPU picks it; chosen on the device once the non-finite counts are in.
__device__ __forceinline__ int fc_cu_sampled(const fc_cu_enc &e, int c)
{
    return e.sample && e.ws->sample_chunk == c;
}

// Chunk c of an encode: its span, and its body in the send buffer, NULL where the chunk is not
// sent (empty, or the own chunk kept exact).
__device__ __forceinline__ uint8_t *fc_cu_enc_body(const fc_cu_enc &e, int c, int64_t *start, int64_t *n)
{
    fc_cu_span(e.geo, c, start, n);
    return fc_cu_sent(e.geo, c, *n) ? e.send + fc_cu_send_off(e.geo, c) + FC_HEADER_BYTES : NULL;
}

// A call's base stream: the seed's keys, chunk 0's id (h.chunk_base), the unit and the step; the
// shared draws of randomk and sketch, and every chunk's own once fc_cu_chunk_rng keys it.
__host__ __device__ __forceinline__ fc_rng fc_cu_call_rng(const fc_cuda_head &h)
{
    return fc_chunk_shared_rng(h.seed, h.chunk_base, h.unit, h.step);
}

// The header fields of a call's payloads written with method id `method` (fc_header_make,
// fc_header_verdict); the CPU's fc_core_header_key, both fc_chunk_header_key.
__host__ __device__ __forceinline__ fc_header_key fc_cu_header_key(const fc_cuda_head &h, int method)
{
    return fc_chunk_header_key((unsigned)method, h.grad_dtype, h.geo.world, h.unit, h.step,
                               h.fingerprint);
}

// The sender's stream for chunk c (fc_chunk_sender_rng, as the CPU's make_chunk). base.chunk is
// the id of chunk 0: 0 in the collective, compress()'s `chunk` for its single payload.
__host__ __device__ __forceinline__ fc_rng fc_cu_chunk_rng(fc_rng base, int chunk, int rank)
{
    base.chunk += (uint32_t)chunk;
    return fc_chunk_sender_rng(base, rank);
}

struct fc_cu_dec {
    fc_cuda_geom geo;
    const uint8_t *recv;
    int64_t slot;
    const void *grad;
    int gdt;
    void *out;
    int odt;
    int64_t out_numel;
    const unsigned int *bad; // per source rank: 1 when its header was rejected (check_headers;
                             // a fused decode, fc_cu_method.fused_decode, checks its own)
    fc_cuda_ws *ws;
    int zero_nonfinite; // the own chunk's NaN/Inf are added as 0
    fc_header_key key;  // what the payloads' headers must carry (fc_header_verdict)
    int varsize;        // the method's body size is data-dependent (the verdict's bound)
    // decompress(): one payload in slot 0 of chunk 0, and out (fp32) += alpha * D(it), the
    // CPU's decode_add: no own chunk, no division by W, no padded tail, no vote or compressed-
    // domain sum (one payload is decoded alone). Every method's decoder honours this.
    int add;
    float alpha;
};

// A CUDA method: launches its fused kernels. encode writes the bodies and the residuals;
// decode writes `out` = (sum in rank order) / W. Headers, counts and checks are the driver's,
// but for an encode that makes them itself (`onepass`) and a decode that checks its own
// (`fused_decode`).
typedef struct {
    int id;
    int (*encode)(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err);
    int (*decode)(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err);
    // Optional (sparse, aggregate and stateful methods): the device scratch (a->x.scratch) an
    // encode (dec NULL) or a decode (enc NULL) needs, compress()/decompress() included; NULL for
    // none.
    int (*scratch)(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, int64_t *bytes,
                   fc_err *err);
    // 1: compress() cannot take a residual (the single payload carries no residual update)
    int single_without_residual;
    // 1: the encode is one pass over g (fc_cu_onepass.cuh): it counts NaN/Inf, writes the
    // headers after the bodies, picks the sample and finishes the call in its last block, so the
    // driver runs no count, header or sample kernel and clears nothing around it
    int onepass;
    // 1: decode and decompress() are one kernel that checks the payloads' headers, counts the
    // own chunk's NaN/Inf and writes every output itself (fc_cu_decode.cuh): the driver clears
    // no verdicts and launches neither check_headers nor own_nonfinite for it
    int fused_decode;
} fc_cu_method;

// The method's parsed config as its fc_cfg.h struct (the C side's bytes as they are).
template <class T> static inline const T *fc_cu_cfg_of(const fc_cuda_method_cfg *m)
{
    static_assert(sizeof(T) <= FC_CFG_MAX, "a method's config fits fc_cuda_method_cfg");
    return reinterpret_cast<const T *>(m->cfg);
}

// Grid over (blocks of one chunk, chunks): y is the chunk, as W never exceeds 65535.
static inline dim3 fc_cu_grid(int64_t units_per_chunk, int per_block, int world)
{
    int64_t x = (units_per_chunk + per_block - 1) / per_block;
    x = x < 1 ? 1 : x > 65535 ? 65535 : x;
    return dim3((unsigned)x, (unsigned)world, 1);
}

// ---- the fused decode shared by dense methods: V::term(body, i, alpha, &poison) is exactly the
// CPU decode_add's contribution alpha * D(body)[i], so the sum matches the CPU bit for bit; it
// sets poison for a code no encoder writes (the CPU raises PayloadError there).

// Output element i = v as the CPU's fc_cpu_write_out stores it: a NaN/Inf passes (canonical,
// *nonfinite) when the sum brought one (`passed`), else it is the overflow of finite terms and
// saturates (*sat, fc_output_fix); a narrow output saturates at its format's largest value.
__device__ __forceinline__ void fc_cu_store_out(void *out, int odt, int64_t i, float v, int passed,
                                                int64_t *nonfinite, int64_t *sat)
{
    if (!(fc_abs_bits(v) < FC_INF_BITS))
        v = fc_output_fix(v, passed, nonfinite, sat);
    else if (odt != FC_CU_F32)
        *sat += odt == FC_CU_BF16 ? fc_bf16_saturates(v) : fc_f16_saturates(v);
    if (odt == FC_CU_F32)
        ((float *)out)[i] = v;
    else
        ((uint16_t *)out)[i] = odt == FC_CU_BF16 ? fc_f32_to_bf16(v) : fc_f32_to_f16(v);
}

// FSDP's padded tail of a decode's output: element i past the own chunk's n is zeroed (true).
__device__ __forceinline__ bool fc_cu_out_tail(void *out, int odt, int64_t i, int64_t n)
{
    if (i < n)
        return false;
    if (odt == FC_CU_F32)
        ((float *)out)[i] = 0.0f;
    else
        ((uint16_t *)out)[i] = 0;
    return true;
}

// The own chunk's element as the CPU's fc_cpu_add_own adds it: a NaN/Inf is 0 in "zero" mode,
// else passed on, a NaN as the canonical one.
__device__ __forceinline__ float fc_cu_own(const fc_cu_dec &d, int64_t i)
{
    const float g = fc_cu_load(d.grad, d.gdt, i);
    return fc_abs_bits(g) < FC_INF_BITS ? g : d.zero_nonfinite ? 0.0f : fc_canon_nan(g);
}

// The first term of a decode's sum at own element i: the exact own chunk when it was kept
// exact (0 + its value, as the CPU's accumulator adds it to zeros), else 0.
__device__ __forceinline__ float fc_cu_own_first(const fc_cu_dec &d, int64_t i)
{
    float acc = 0.0f;
    if (d.geo.skip_own)
        acc += fc_cu_own(d, i);
    return acc;
}

// Whether the own chunk's NaN/Inf pass at their elements (fc_output_passes' own_pass): it was
// added exact, in "pass" mode.
__device__ __forceinline__ int fc_cu_own_pass(const fc_cu_dec &d)
{
    return d.geo.skip_own && !d.zero_nonfinite;
}

// The payloads' part of fc_output_passes for every element of this decode: a payload flagged
// NONFINITE (ws->passed, set by check_headers) or one rejected (its NaN poisons, never hidden).
// The own chunk's part is per element (fc_cu_own_pass). Per thread, once.
__device__ __forceinline__ int fc_cu_sum_passes(const fc_cu_dec &d)
{
    if (d.ws->passed != 0)
        return 1;
    for (int r = 0; r < d.geo.world; r++)
        if (d.bad[r] != 0)
            return 1;
    return 0;
}

// A receiver's output pass over the own chunk: acc = (0 + own) (fc_cu_own_first), then
// more(i, acc) adds the senders' part, out = acc / W in out's dtype under fc_cu_store_out's rules
// (fc_output_passes per element; FSDP's padded tail zeroed), the non-finite and saturated outputs
// counted.
template <class F> __device__ __forceinline__ void fc_cu_decode_out(const fc_cu_dec &d, F more)
{
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    const float w = (float)d.geo.world;
    const int passed = fc_cu_sum_passes(d), own_pass = fc_cu_own_pass(d);
    int64_t nonfinite = 0, sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d.out_numel; i += stride) {
        if (fc_cu_out_tail(d.out, d.odt, i, n)) // FSDP's padded tail
            continue;
        const float own = fc_cu_own_first(d, start + i); // 0 + own: NaN/Inf as the own chunk's
        const float acc = more(i, own);
        fc_cu_store_out(d.out, d.odt, i, acc / w, fc_output_passes(passed, own_pass, own), &nonfinite, &sat);
    }
    fc_cu_count(&d.ws->nonfinite_out, nonfinite);
    fc_cu_count(&d.ws->saturated, sat);
}

// *p += t as the CPU's decode_add leaves it: a NaN sum is the canonical NaN. The CPU's add of
// the canonical NaN it decoded keeps that NaN; the GPU's arithmetic writes any NaN it makes as
// 0x7fffffff, so decompress() of NaN/Inf inputs differed in the NaN's bits on the first H200
// run. Every add of decompress() and of the sparse decoders goes through here.
__device__ __forceinline__ void fc_cu_add_canon(float *p, float t)
{
    *p = fc_canon_nan(*p + t);
}

// The element-wise decode of a method whose decode is not fused (signsgd's scaled payloads):
// the driver checked the headers (d.bad, ws->passed) and counted the own chunk before it.
template <class V> __global__ void fc_cu_decode_dense(fc_cu_dec d, V v)
{
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    const float w = (float)d.geo.world;
    int64_t nonfinite = 0, sat = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if (d.add) { // decompress(): the CPU's decode_add, acc[i] += alpha * D(body)[i]
        const uint8_t *body = d.recv + FC_HEADER_BYTES;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d.out_numel; i += stride) {
            int poison = d.bad[0] != 0;
            const float t = poison ? 0.0f : v.term(body, i, d.alpha, &poison);
            fc_cu_add_canon((float *)d.out + i, poison ? fc_bits_f32(FC_NAN_BITS) : t);
        }
        return;
    }
    const int passed = d.ws->passed != 0, own_pass = fc_cu_own_pass(d); // ws->passed: check_headers'
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d.out_numel; i += stride) {
        if (fc_cu_out_tail(d.out, d.odt, i, n)) // FSDP's padded tail
            continue;
        float acc = 0.0f, own = 0.0f;
        int poison = 0; // a rejected payload or an impossible code: NaN, never hidden or saturated
        for (int r = 0; r < d.geo.world; r++) {
            if (d.geo.skip_own && r == d.geo.rank) {
                own = fc_cu_own(d, start + i);
                acc += own;
                continue;
            }
            if (d.bad[r]) {
                poison = 1;
                continue;
            }
            const uint8_t *body = d.recv + fc_cu_recv_off(d.geo, r, d.slot) + FC_HEADER_BYTES;
            acc += v.term(body, i, 1.0f, &poison);
        }
        if (poison) {
            fc_cu_store_out(d.out, d.odt, i, __int_as_float(0x7fc00000), 1, &nonfinite, &sat);
            continue;
        }
        fc_cu_store_out(d.out, d.odt, i, acc / w, fc_output_passes(passed, own_pass, own), &nonfinite, &sat);
    }
    fc_cu_count(&d.ws->nonfinite_out, nonfinite);
    fc_cu_count(&d.ws->saturated, sat);
}

template <class V>
static int fc_cu_launch_decode_dense(const fc_cu_dec *d, const V &v, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    if (d->out_numel > 0) {
        dim3 grid = fc_cu_grid(d->out_numel, FC_CU_THREADS * 4, 1);
        fc_cu_decode_dense<V><<<grid, FC_CU_THREADS, 0, s>>>(*d, v);
        FC_CHECK_LAUNCH(err, error);
    }
error:
    return rc;
}

#endif
