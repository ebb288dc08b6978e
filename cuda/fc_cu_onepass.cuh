// fc_cu_onepass.cuh: what the one-pass encodes share (the dense block codecs, fc_cu_dense.cuh,
// and the casts, fc_cu_cast.cu): one kernel reads g (and e) once and does what the driver's
// count, header and sample kernels did around the others (fc_cu_method.onepass).
//
// Each warp counts its chunk's NaN/Inf and saturated sums as it loads g' (fc_cu_gx) and, with
// error feedback or on a sampled call, sums ||e||^2 and the sample's terms per chunk (every
// chunk's: which one is the sample is known only when all are done). Every block then takes a
// ticket (fc_cu_onepass_end), the blocks of unsent chunks too; the last one writes every sent
// chunk's header and padding after its body (the NONFINITE flag needs the chunk's count), picks
// the sample (the CPU's rule: the first sent chunk that passes no NaN/Inf), sets the unit's
// ||e||^2 and leaves the workspace's per-call part (fc_cuda_ws.enc_*) zero for the next call, so
// that no memset runs before one. The residual needs no count: its rule is per element
// (fc_range.h's fc_residual).
#ifndef FC_CU_ONEPASS_CUH
#define FC_CU_ONEPASS_CUH

#include <atomic>
#include "fc_cu_tile.cuh"

// What a one-pass kernel is built for, as a template parameter so that a lean kernel holds no
// state for what it does not do: the common case (no residual, no sample) with an fp32 or a
// bf16 gradient, or everything else (an fp16 gradient, error feedback, a sampled call) with the
// dtypes and the sinks decided at run time.
enum { FC_CU_LEAN_F32 = 0, FC_CU_LEAN_BF16 = 1, FC_CU_GENERAL = 2 };

// g' = g (+ d e) of one chunk, element i at start + i, 8 at a time, by fc_cu_src's rule, counting
// what it fixes: the gradient's NaN/Inf (bad) and the sums of two finite values beyond fp32
// (sat). A lean kernel's has the gradient's dtype as a constant and no residual.
template <int K> struct fc_cu_gx {
    fc_cu_src s;
    const uint8_t *g, *r; // the chunk's first element of the gradient and of the residual
    int vec;              // both 16-byte aligned at every multiple of 8
    uint32_t bad, sat;

    __device__ static fc_cu_gx make(const fc_cu_src &s, int64_t start)
    {
        fc_cu_gx x;
        x.s = s;
        x.bad = x.sat = 0;
        x.g = (const uint8_t *)s.grad + start * (x.gdt() == FC_CU_F32 ? 4 : 2);
        x.r = x.ef() ? (const uint8_t *)s.res + start * (s.rdt == FC_CU_F32 ? 4 : 2) : NULL;
        x.vec = fc_cu_aligned16(x.g) && (!x.ef() || fc_cu_aligned16(x.r));
        return x;
    }

    __device__ __forceinline__ int gdt() const
    {
        return K == FC_CU_LEAN_F32 ? FC_CU_F32 : K == FC_CU_LEAN_BF16 ? FC_CU_BF16 : s.gdt;
    }
    __device__ __forceinline__ bool ef() const { return K == FC_CU_GENERAL && s.res != NULL; }

    // v[k] = g'[i + k] for k < m, 0 past it; i a multiple of 8. Counted.
    __device__ __forceinline__ void load8(int64_t i, int m, float v[8]) { get8(i, m, v, true); }
    // The same, not counted again: a block codec's second pass over a block larger than a tile.
    __device__ __forceinline__ void reload8(int64_t i, int m, float v[8]) { get8(i, m, v, false); }

    __device__ __forceinline__ void get8(int64_t i, int m, float v[8], bool count)
    {
        const int dt = gdt();
        float r[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (m == 8 && vec) {
            fc_cu_load8_dt(g + i * (dt == FC_CU_F32 ? 4 : 2), dt, 1, v);
            if (ef())
                fc_cu_load8_dt(this->r + i * (s.rdt == FC_CU_F32 ? 4 : 2), s.rdt, 1, r);
        } else {
            for (int k = 0; k < 8; k++)
                v[k] = k < m ? fc_cu_load(g, dt, i + k) : 0.0f;
            if (ef())
                for (int k = 0; k < 8; k++)
                    r[k] = k < m ? fc_cu_load(this->r, s.rdt, i + k) : 0.0f;
        }
        if constexpr (K != FC_CU_GENERAL) { // g' = g: a NaN/Inf is fc_gprime_fix's, without branches
            for (int k = 0; k < 8; k++) {
                const bool bad_k = !(fc_abs_bits(v[k]) < FC_INF_BITS);
                bad += count && bad_k;
                v[k] = bad_k ? (s.zero_nonfinite ? 0.0f : fc_canon_nan(v[k])) : v[k];
            }
        } else {
            for (int k = 0; k < 8; k++) { // the zeros past m are finite: never counted
                const float e = ef() ? s.decayed(r[k]) : 0.0f;
                const float x = ef() ? v[k] + e : v[k];
                if (fc_abs_bits(x) < FC_INF_BITS) {
                    v[k] = x;
                    continue;
                }
                int64_t b = 0, t = 0;
                v[k] = fc_gprime_fix(x, v[k], e, s.zero_nonfinite, &b, &t);
                if (count) {
                    bad += (uint32_t)b;
                    sat += (uint32_t)t;
                }
            }
        }
    }
};

// This warp's counts of chunk c, once per kernel: the chunk's NaN/Inf flag (its header and the
// sample need only whether it held one), nonfinite_in (the collective's; compress() counts
// none), the saturated values.
__device__ __forceinline__ void fc_cu_onepass_count(const fc_cu_enc &e, int c, uint32_t bad, uint32_t sat)
{
    const unsigned long long b = fc_cu_warp_sum((unsigned long long)bad);
    const unsigned long long t = fc_cu_warp_sum((unsigned long long)sat);
    if ((threadIdx.x & 31) == 0) {
        if (b) {
            atomicOr(&e.ws->enc_bad[c], 1u);
            if (!e.single)
                atomicAdd(&e.ws->nonfinite_in, b);
        }
        if (t)
            atomicAdd(&e.ws->saturated, t);
    }
}

// The call's end, by one block, all its threads, once every other block has finished: what the
// driver's write_headers, pick_sample and finish_sample did, from this call's counts and sums
// (read through volatile: other blocks' atomics, not this block's L1), which it leaves zero.
__device__ __forceinline__ void fc_cu_onepass_finish(const fc_cu_enc &e)
{
    fc_cuda_ws *ws = e.ws;
    const volatile unsigned int *bad = ws->enc_bad;
    const int zero = e.src.zero_nonfinite;
    for (int c = threadIdx.x; c < e.geo.world; c += blockDim.x) {
        int64_t start, n;
        uint8_t *body = fc_cu_enc_body(e, c, &start, &n);
        if (body == NULL)
            continue;
        uint8_t *p = body - FC_HEADER_BYTES;
        const int64_t bytes = fc_cu_body_bytes(e.geo, n), size = n == e.geo.per ? e.geo.pay_full : e.geo.pay_last;
        fc_header h;
        fc_header_make(&h, &e.key, (uint64_t)n, (uint64_t)bytes,
                       fc_chunk_passes(bad[c], zero) ? FC_HDR_NONFINITE : 0u);
        memcpy(p, &h, sizeof(h));
        for (int64_t i = FC_HEADER_BYTES + bytes; i < size; i++) // padding: < 16 bytes
            p[i] = 0;
    }
    if (threadIdx.x == 0) {
        int pick = -1;
        for (int c = 0; e.sample && c < e.geo.world; c++) {
            int64_t start, n;
            fc_cu_span(e.geo, c, &start, &n);
            if (fc_cu_sent(e.geo, c, n) && fc_sample_picks(pick >= 0, fc_chunk_passes(bad[c], zero)))
                pick = c;
        }
        if (pick >= 0) {
            const volatile double *sum = ws->enc_sum[pick];
            const double ee = sum[0], xx = sum[1], xe = sum[2];
            if (fc_sample_counts(e.res != NULL, ee, xx)) {
                ws->err_sq += ee;
                ws->ref_sq += xx;
                ws->cos_sum += fc_sample_cos_of_residual(ee, xx, xe);
                ws->samples++;
            }
        }
        if (e.unit_slot >= 0) {
            ws->unit_sq[e.unit_slot] = *(volatile double *)&ws->enc_unit_sq;
            ws->enc_unit_sq = 0;
        }
        ws->enc_ticket = 0; // every block has taken its ticket
    }
    __syncthreads(); // every count read before it is cleared
    for (int c = threadIdx.x; c < e.geo.world; c += blockDim.x) {
        ws->enc_bad[c] = 0;
        if (e.sample)
            ws->enc_sum[c][0] = ws->enc_sum[c][1] = ws->enc_sum[c][2] = 0;
    }
}

// Every block of a one-pass kernel ends here, all its threads (the blocks of unsent chunks too):
// its writes fenced, a ticket taken, and the last block to take one finishes the call.
__device__ __forceinline__ void fc_cu_onepass_end(const fc_cu_enc &e)
{
    __shared__ int fc_cu_onepass_last;
    __threadfence(); // this thread's bodies, residuals, counts and sums before the ticket
    __syncthreads();
    if (threadIdx.x == 0)
        fc_cu_onepass_last = atomicAdd(&e.ws->enc_ticket, 1u) == gridDim.x * gridDim.y - 1;
    __syncthreads();
    if (fc_cu_onepass_last) {
        __threadfence(); // the other blocks' writes, fenced before their tickets, seen after this one
        fc_cu_onepass_finish(e);
    }
}

// ---- host side

// The kernel a call takes (FC_CU_LEAN_*, FC_CU_GENERAL).
static inline int fc_cu_onepass_kind(const fc_cu_enc &e)
{
    if (e.res != NULL || e.sample)
        return FC_CU_GENERAL;
    return e.src.gdt == FC_CU_F32 ? FC_CU_LEAN_F32 : e.src.gdt == FC_CU_BF16 ? FC_CU_LEAN_BF16 : FC_CU_GENERAL;
}

// Blocks of `threads` threads of `kernel` that fill `device` (the current one) once: its SMs
// times the blocks one SM holds at a time, asked once per device and kernel (a launch must not
// pay for two attribute queries). A query that fails is forgotten, and 1024 blocks taken.
#define FC_CU_FILL_DEVICES 64
template <class K> static int64_t fc_cu_fill(K kernel, int device, int threads)
{
    static std::atomic<int> cache[FC_CU_FILL_DEVICES];
    const bool known = device >= 0 && device < FC_CU_FILL_DEVICES;
    if (known) {
        const int v = cache[device].load(std::memory_order_relaxed);
        if (v > 0)
            return v;
    }
    int sms = 0, per = 0;
    if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, kernel, threads, 0) != cudaSuccess || sms < 1 ||
        per < 1) {
        (void)cudaGetLastError();
        return 1024;
    }
    if (known)
        cache[device].store(sms * per, std::memory_order_relaxed);
    return (int64_t)sms * per;
}

// The grid of a one-pass kernel: y the chunks, x blocks each, as many as fill the device once
// over the world's chunks (so a warp walks several units and keeps the next one in flight), no
// more than the chunk's `items` at `per_block` a block need.
static inline dim3 fc_cu_onepass_grid(int64_t fill, int64_t items, int64_t per_block, int world)
{
    const int64_t want = (items + per_block - 1) / per_block;
    int64_t x = fill / world;
    x = x < want ? x : want;
    x = x < 1 ? 1 : x > 65535 ? 65535 : x;
    return dim3((unsigned)x, (unsigned)world, 1);
}

#endif
