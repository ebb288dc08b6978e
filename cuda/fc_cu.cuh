// fc_cu.cuh: what every .cu of the CUDA library shares: status checks, chunk geometry, the
// load/store of g' = g + e and residuals, warp reductions, and the per-method table entry.
#ifndef FC_CU_CUH
#define FC_CU_CUH

#include <cuda_runtime.h>
#include <stdint.h>
#include <string.h>

#include "fc_cuda.h"
#include "fc_half.h"
#include "fc_quant.h"
#include "fc_rng.h"
#include "fc_wire.h"

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

// ---- geometry (host and device: same numbers on both sides)

__host__ __device__ __forceinline__ void fc_cu_span(const fc_cuda_geom &g, int c, int64_t *start,
                                                    int64_t *n)
{
    int64_t a = g.per * (int64_t)c, b = a + g.per;
    a = a > g.numel ? g.numel : a;
    b = b > g.numel ? g.numel : b;
    *start = a;
    *n = b - a;
}

__host__ __device__ __forceinline__ int fc_cu_sent(const fc_cuda_geom &g, int c, int64_t n)
{
    return n > 0 && !(g.skip_own && c == g.rank);
}

// Byte offset of chunk c's payload in the send buffer: every sent chunk before it is full.
__host__ __device__ __forceinline__ int64_t fc_cu_send_off(const fc_cuda_geom &g, int c)
{
    int64_t nonempty = g.per > 0 ? (g.numel + g.per - 1) / g.per : 0;
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

// What the encode kernels see of one element: g' = g + e, as the CPU's load_chunk makes it.
struct fc_cu_src {
    const void *grad;
    const void *res; // NULL: no error feedback
    int gdt, rdt;
    int zero_nonfinite;

    __device__ __forceinline__ float x(int64_t i) const
    {
        float v = fc_cu_load(grad, gdt, i);
        if (res != NULL)
            v = fc_add_x86(v, fc_cu_load(res, rdt, i)); // the CPU's NaN bits (fc_quant.h)
        if (zero_nonfinite && !(fc_abs_bits(v) < FC_INF_BITS))
            v = 0.0f;
        return v;
    }
};

__device__ __forceinline__ void fc_cu_store_res(void *res, int rdt, int64_t i, float e)
{
    if (rdt == FC_CU_F32)
        ((float *)res)[i] = e;
    else
        ((uint16_t *)res)[i] = fc_f32_to_bf16(e);
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
    const unsigned int *bad; // per chunk: non-finite count of this call (residual kept if > 0)
    fc_cuda_ws *ws;
    int unit_slot; // index into ws->unit_sq, -1 when not tracked
    int sample;    // this call samples the error statistics of ws->sample_chunk (fc_cu_sampled)
    fc_rng rng;    // chunk and key1 filled per chunk by fc_cu_chunk_rng; chunk: the base id
};

// Whether chunk c's error statistics are this call's sample: the first sent chunk whose g' has
// no NaN/Inf, as the CPU picks it; chosen on the device once the non-finite counts are in.
__device__ __forceinline__ int fc_cu_sampled(const fc_cu_enc &e, int c)
{
    return e.sample && e.ws->sample_chunk == c;
}

// The sender's stream for chunk c, exactly as the CPU's make_chunk builds it. base.chunk is
// the id of chunk 0: 0 in the collective, compress()'s `chunk` for its single payload.
__host__ __device__ __forceinline__ fc_rng fc_cu_chunk_rng(fc_rng base, int chunk, int rank)
{
    fc_rng r = base;
    r.chunk = base.chunk + (uint32_t)chunk;
    r.key1 ^= 0x85EBCA6Bu * (uint32_t)(rank + 1);
    return r;
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
    const unsigned int *bad; // per source rank: 1 when its header was rejected
    fc_cuda_ws *ws;
    // decompress(): one payload in slot 0 of chunk 0, and out (fp32) += alpha * D(it), the
    // CPU's decode_add: no own chunk, no division by W, no padded tail. A method's decoder
    // honours this (fc_cu_decode_dense does) or decompress() gives wrong sums.
    int add;
    float alpha;
};

// A CUDA method: launches its fused kernels. encode writes the bodies and the residuals;
// decode writes `out` = (sum in rank order) / W. Headers, counts and checks are the driver's.
typedef struct {
    int id;
    int (*encode)(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err);
    int (*decode)(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err);
    // Optional (sparse, aggregate and stateful methods): the device scratch (a->x.scratch) an
    // encode (dec NULL) or a decode (enc NULL) needs; NULL for none.
    int (*scratch)(const fc_cuda_encode_args *enc, const fc_cuda_decode_args *dec, int64_t *bytes,
                   fc_err *err);
    // Optional: why compress()/decompress() cannot run this method's kernels (its decode sums
    // a whole unit and does not honour fc_cu_dec.add, or it needs the State's device scratch,
    // which a single payload does not get); NULL: they can.
    const char *no_single;
} fc_cu_method;

// The no_single of the sparse, aggregate and stateful methods: a TypeError naming the method.
#define FC_CU_NO_SINGLE(name)                                                                      \
    "method '" name "' has no single-payload CUDA kernels yet (compress()/decompress(), the "     \
    "compressed all-gather's path); use CPU tensors"

// A config value by key name; `def` when the key is absent.
static inline double fc_cu_cfg(const fc_cuda_method_cfg *m, const char *name, double def)
{
    for (int i = 0; i < m->n_cfg; i++)
        if (strcmp(m->cfg[i].name, name) == 0)
            return m->cfg[i].value;
    return def;
}

// Grid over (blocks of one chunk, chunks): y is the chunk, as W never exceeds 65535.
static inline dim3 fc_cu_grid(int64_t units_per_chunk, int per_block, int world)
{
    int64_t x = (units_per_chunk + per_block - 1) / per_block;
    x = x < 1 ? 1 : x > 65535 ? 65535 : x;
    return dim3((unsigned)x, (unsigned)world, 1);
}

// ---- the fused decode shared by dense methods: V::term(body, i, alpha) is exactly the CPU
// decode_add's contribution alpha * D(body)[i], so the sum matches the CPU bit for bit.

__device__ __forceinline__ void fc_cu_store_out(void *out, int odt, int64_t i, float v,
                                                unsigned long long *bad)
{
    if (odt == FC_CU_F32) {
        ((float *)out)[i] = v;
        *bad += !(fc_abs_bits(v) < FC_INF_BITS);
    } else {
        uint16_t h = odt == FC_CU_BF16 ? fc_f32_to_bf16(v) : fc_f32_to_f16(v);
        ((uint16_t *)out)[i] = h;
        float back = odt == FC_CU_BF16 ? fc_bf16_to_f32(h) : fc_f16_to_f32(h);
        *bad += !(fc_abs_bits(back) < FC_INF_BITS);
    }
}

template <class V> __global__ void fc_cu_decode_dense(fc_cu_dec d, V v)
{
    int64_t start, n;
    fc_cu_span(d.geo, d.geo.rank, &start, &n);
    const float w = (float)d.geo.world;
    unsigned long long bad = 0;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    if (d.add) { // decompress(): the CPU's decode_add, acc[i] += alpha * D(body)[i]
        const uint8_t *body = d.recv + FC_HEADER_BYTES;
        for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d.out_numel; i += stride)
            ((float *)d.out)[i] += d.bad[0] ? __int_as_float(0x7fc00000) : v.term(body, i, d.alpha);
        return;
    }
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d.out_numel; i += stride) {
        if (i >= n) { // FSDP's padded tail of the output
            if (d.odt == FC_CU_F32)
                ((float *)d.out)[i] = 0.0f;
            else
                ((uint16_t *)d.out)[i] = 0;
            continue;
        }
        float acc = 0.0f;
        for (int r = 0; r < d.geo.world; r++) {
            if (d.geo.skip_own && r == d.geo.rank) {
                acc += fc_cu_load(d.grad, d.gdt, start + i);
                continue;
            }
            if (d.bad[r]) {
                acc += __int_as_float(0x7fc00000); // a rejected payload poisons, never hides
                continue;
            }
            const uint8_t *body = d.recv + fc_cu_recv_off(d.geo, r, d.slot) + FC_HEADER_BYTES;
            acc += v.term(body, i, 1.0f);
        }
        fc_cu_store_out(d.out, d.odt, i, acc / w, &bad);
    }
    bad = fc_cu_warp_sum(bad);
    if ((threadIdx.x & 31) == 0 && bad)
        atomicAdd(&d.ws->nonfinite_out, bad);
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
