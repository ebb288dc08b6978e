// fc_cu_signsgd.cu: kernels of `signsgd` (m_signsgd.c). Scaled: sign bits and per block the mean
// |x| (the CPU's 8-lane double sums in its order; a NaN mean is the canonical NaN), through the
// block-codec walk of fc_cu_codecs.cuh. Majority: sign bits only; the receiver sums every
// sender's vote per element (the compressed domain: the CPU's int32 vote sums) and adds
// scale * senders * sign(votes), fused with the own chunk and the division by W.
#include "fc_cu_dense.cuh"

// |x| as the CPU's fc_sum_abs adds it: the double of the float's magnitude.
struct sign_abs_terms {
    __device__ __forceinline__ void add(double v, double *s) const { s[0] += fabs(v); }
};

struct sign_scaled_codec {
    int64_t bs;

    struct red {
        fc_cu_tile_sums<1> sums;
    };
    struct blk {
        float scale;
    };

    __host__ __device__ int64_t meta_bytes(int64_t n) const { return 4 * fc_cu_nblocks(n, bs); }

    __device__ void red_init(red &r) const { r.sums.init(); }

    __device__ void red_tile(red &r, int64_t, int, const float v[8]) const
    {
        r.sums.tile_add(bs, v, sign_abs_terms());
    }

    // scale = (float)(sum / (double)len), len the block's (the last one may be shorter); a NaN
    // (the block held one) is the canonical NaN, as m_signsgd.c writes it
    __device__ blk block(red &r, int, int64_t b, int64_t n, uint8_t *body, bool lead) const
    {
        blk k;
        const double sum = r.sums.total(bs, 0);
        const int64_t lo = b * bs, len = n - lo < bs ? n - lo : bs;
        k.scale = fc_canon_nan((float)(sum / (double)len));
        if (lead)
            ((float *)body)[b] = k.scale;
        return k;
    }

    // bit set: x < 0 (a NaN by its sign bit); d = pm[bit], pm = {s, -s}, s = -1 * scale: the
    // CPU's decode_add with alpha = -1
    __device__ void code8(const blk &k, const fc_rng &, int64_t i, int m, const float v[8],
                          int64_t n, uint8_t *body, bool dec, float d[8]) const
    {
        uint32_t byte = 0;
        const float s = -1.0f * k.scale;
        for (int j = 0; j < 8; j++) {
            const uint32_t bit = j < m ? fc_f32_bits(v[j]) >> 31 : 0u;
            byte |= bit << j;
            if (dec)
                d[j] = bit ? -s : s;
        }
        body[meta_bytes(n) + (i >> 3)] = (uint8_t)byte;
    }

    struct dec {
        int64_t meta;
        int shift;
        __device__ float term(const uint8_t *b, int64_t i, float alpha, int *) const
        {
            const float s = alpha * ((const float *)b)[i >> shift];
            return (b[meta + (i >> 3)] >> (i & 7)) & 1u ? -s : s;
        }
    };
    __host__ __device__ dec at(int64_t n) const { return dec{meta_bytes(n), fc_cu_log2(bs)}; }
};

// Majority: sign bits only, each decoding to +-scale (x + pm[bit] the sender's residual).
struct sign_vote_codec {
    int64_t bs; // the walk's unit only: no scales
    float scale;

    struct red {
        int unused;
    };
    struct blk {
        int unused;
    };

    __host__ __device__ int64_t meta_bytes(int64_t) const { return 0; }
    __device__ void red_init(red &) const {}
    __device__ void red_tile(red &, int64_t, int, const float *) const {}
    __device__ blk block(red &, int, int64_t, int64_t, uint8_t *, bool) const { return blk{0}; }

    __device__ void code8(const blk &, const fc_rng &, int64_t i, int m, const float v[8], int64_t,
                          uint8_t *body, bool dec, float d[8]) const
    {
        uint32_t byte = 0;
        const float s = -1.0f * scale;
        for (int j = 0; j < 8; j++) {
            const uint32_t bit = j < m ? fc_f32_bits(v[j]) >> 31 : 0u;
            byte |= bit << j;
            if (dec)
                d[j] = bit ? -s : s;
        }
        body[i >> 3] = (uint8_t)byte;
    }
};

// The receiver's vote: per element the int32 sum of +1 (bit clear) and -1 (bit set) over the
// senders, then acc = (0 + own) + (votes > 0 ? s : votes < 0 ? -s : 0), s = scale * senders,
// as the CPU's decode_agg (it adds the 0.0f too: a -0 own becomes +0).
__global__ void sign_vote_decode(fc_cu_dec d, float s, int senders)
{
    fc_cu_decode_out(d, [&](int64_t i, float acc) {
        if (senders > 0) {
            int32_t votes = 0;
            int rejected = 0;
            for (int r = 0; r < d.geo.world; r++) {
                if (d.geo.skip_own && r == d.geo.rank)
                    continue;
                rejected |= d.bad[r] != 0;
                const uint8_t *bits = d.recv + fc_cu_recv_off(d.geo, r, d.slot) + FC_HEADER_BYTES;
                votes += 1 - 2 * (int32_t)((bits[i >> 3] >> (i & 7)) & 1u);
            }
            // a rejected payload poisons, never hides
            acc += rejected ? fc_bits_f32(FC_NAN_BITS) : votes > 0 ? s : votes < 0 ? -s : 0.0f;
        }
        return acc;
    });
}

// decompress() of a majority payload: no vote in one payload, the CPU's decode_add: out[i] +=
// (bit ? -s : s), s = alpha * scale; a rejected payload makes every element NaN.
__global__ void sign_vote_add(fc_cu_dec d, float s)
{
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    const uint8_t *bits = d.recv + FC_HEADER_BYTES;
    float *out = (float *)d.out;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < d.out_numel; i += stride)
        fc_cu_add_canon(out + i, d.bad[0] != 0 ? fc_bits_f32(FC_NAN_BITS) : (bits[i >> 3] >> (i & 7)) & 1u ? -s : s);
}

struct sign_cfg {
    int majority;
    int64_t bs;
    float scale;
};

static int config(const fc_cuda_method_cfg *m, sign_cfg *c, fc_err *err)
{
    const fc_signsgd_cfg *k = fc_cu_cfg_of<fc_signsgd_cfg>(m);
    c->majority = k->mode == FC_SIGN_MAJORITY;
    c->bs = k->block_size;
    c->scale = (float)k->scale; // the CPU's (float)cfg->scale
    return fc_cu_check_block("signsgd", "block_size", c->bs, err);
}

static int encode(const fc_cuda_encode_args *a, const fc_cu_enc *e, cudaStream_t s, fc_err *err)
{
    sign_cfg c;
    int rc = config(&a->h.m, &c, err);
    if (rc != FC_OK)
        return rc;
    if (c.majority)
        return fc_cu_launch_encode_dense(e, sign_vote_codec{256, c.scale}, s, err);
    return fc_cu_launch_encode_dense(e, sign_scaled_codec{c.bs}, s, err);
}

static int vote_add(const fc_cu_dec *d, const sign_cfg &c, cudaStream_t s, fc_err *err)
{
    int rc = FC_OK;
    sign_vote_add<<<fc_cu_grid(d->out_numel, FC_CU_THREADS * 4, 1), FC_CU_THREADS, 0, s>>>(*d, d->alpha * c.scale);
    FC_CHECK_LAUNCH(err, error);
error:
    return rc;
}

static int decode(const fc_cuda_decode_args *a, const fc_cu_dec *d, cudaStream_t s, fc_err *err)
{
    sign_cfg c;
    int rc = config(&a->h.m, &c, err);
    if (rc != FC_OK)
        return rc;
    if (!c.majority)
        return fc_cu_launch_decode_codec(a, d, sign_scaled_codec{c.bs}, s, err);
    if (d->add)
        return vote_add(d, c, s, err);
    int64_t start, n;
    fc_cu_span(a->h.geo, a->h.geo.rank, &start, &n);
    const int senders = n > 0 ? a->h.geo.world - (a->h.geo.skip_own ? 1 : 0) : 0;
    const float v = 1.0f * c.scale * (float)senders; // decode_agg's alpha * scale * senders
    if (d->out_numel > 0) {
        sign_vote_decode<<<fc_cu_grid(d->out_numel, FC_CU_THREADS * 4, 1), FC_CU_THREADS, 0, s>>>(*d, v, senders);
        FC_CHECK_LAUNCH(err, error);
    }
error:
    return rc;
}

extern const fc_cu_method fc_cu_signsgd = {FC_ID_SIGNSGD, encode, decode, NULL, 0, 1}; // one-pass encode
