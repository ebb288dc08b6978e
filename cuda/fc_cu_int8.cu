// fc_cu_int8.cu: kernels of `int8` (m_int8.c): one warp per quantisation block, absmax then
// codes in a second sweep that hits L1/L2; each lane owns 8 consecutive elements so one
// Philox call serves them (fc_rng_draw8: 16 bits per element), as on the CPU path.
#include "fc_cu.cuh"

#define INT8_WARPS 8

struct int8_params {
    int64_t bs; // power of two
    int64_t nb_full;
    int stochastic;
};

__global__ void int8_encode(fc_cu_enc e, int8_params p)
{
    const int c = blockIdx.y;
    int64_t start, n;
    fc_cu_span(e.geo, c, &start, &n);
    if (!fc_cu_sent(e.geo, c, n))
        return;
    const int lane = threadIdx.x & 31;
    const int64_t nb = (n + p.bs - 1) / p.bs;
    uint8_t *body = e.send + fc_cu_send_off(e.geo, c) + FC_HEADER_BYTES;
    float *scales = (float *)body;
    int8_t *codes = (int8_t *)(body + 4 * nb);
    const int ef = e.res != NULL && e.bad[c] == 0;
    const int sample = fc_cu_sampled(e, c);
    const fc_rng rng = fc_cu_chunk_rng(e.rng, c, e.geo.rank);
    fc_cu_esum sum;
    const int64_t warps = (int64_t)gridDim.x * INT8_WARPS;
    for (int64_t b = (int64_t)blockIdx.x * INT8_WARPS + (threadIdx.x >> 5); b < nb; b += warps) {
        const int64_t lo = b * p.bs, hi = lo + p.bs < n ? lo + p.bs : n;
        uint32_t amax = 0;
        for (int64_t g = lo + 4 * lane; g < hi; g += 128)
            for (int k = 0; k < 4 && g + k < hi; k++) {
                uint32_t a = fc_abs_bits(e.src.x(start + g + k));
                amax = a > amax ? a : amax;
            }
        amax = fc_cu_warp_max(amax);
        const int special = amax >= FC_INF_BITS || amax == 0;
        const float scale = special ? (amax == 0 ? 0.0f : __int_as_float(0x7fc00000))
                                    : fc_bits_f32(amax) / 127.0f;
        const float inv = special ? 0.0f : 127.0f / fc_bits_f32(amax);
        if (lane == 0)
            scales[b] = scale;
        const float s_neg = -1.0f * scale; // the CPU's decode_add with alpha -1
        for (int64_t g = lo + 8 * lane; g < hi; g += 256) {
            fc_u32x4 r = {{0u, 0u, 0u, 0u}};
            if (p.stochastic && !special)
                r = fc_rng_draw8(&rng, (uint32_t)(g >> 3));
            for (int k = 0; k < 8 && g + k < hi; k++) {
                const float x = e.src.x(start + g + k);
                int32_t q = 0;
                if (!special) {
                    if (!p.stochastic) {
                        float f = fc_round_even(x * inv);
                        f = f > 127.0f ? 127.0f : f < -127.0f ? -127.0f : f;
                        q = (int32_t)f;
                    } else {
                        q = fc_floor_i32(x * inv + fc_u01_16(fc_rng_h16(r, (uint32_t)k)));
                        q = q > 127 ? 127 : q < -127 ? -127 : q;
                    }
                }
                codes[g + k] = (int8_t)q;
                if (ef || sample) {
                    const float res = x + s_neg * (float)q;
                    if (ef)
                        fc_cu_store_res(e.res, e.rdt, start + g + k, res);
                    sum.add(x, res);
                }
            }
        }
    }
    if (ef || sample)
        sum.flush(e.ws, ef ? e.unit_slot : -1, sample);
}

struct int8_value {
    int64_t nb;
    int shift; // log2(block size)
    __device__ __forceinline__ float term(const uint8_t *b, int64_t i, float alpha) const
    {
        const float s = alpha * ((const float *)b)[i >> shift];
        return s * (float)((const int8_t *)(b + 4 * nb))[i];
    }
};

static int8_params params(const fc_cuda_method_cfg *m, int64_t per)
{
    int8_params p;
    p.bs = (int64_t)fc_cu_cfg(m, "block_size", 256);
    p.stochastic = fc_cu_cfg(m, "stochastic", 0) != 0;
    p.nb_full = (per + p.bs - 1) / p.bs;
    return p;
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    int8_params p = params(&a->m, a->geo.per);
    if (p.bs < 8 || (p.bs & (p.bs - 1)) != 0)
        return fc_fail(err, FC_ERR_VALUE, "int8 block_size must be a power of two >= 8, got %lld",
                       (long long)p.bs);
    int8_encode<<<fc_cu_grid(p.nb_full, INT8_WARPS, a->geo.world), 32 * INT8_WARPS, 0, s>>>(*e, p);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    int64_t start, n;
    fc_cu_span(a->geo, a->geo.rank, &start, &n);
    int8_params p = params(&a->m, n);
    int8_value v;
    v.nb = p.nb_full; // blocks of the own chunk: the payloads received are all for it
    v.shift = 0;
    while (((int64_t)1 << v.shift) < p.bs)
        v.shift++;
    return fc_cu_launch_decode_dense(d, v, s, err);
}

extern const fc_cu_method fc_cu_int8 = {3, encode, decode};
