// fc_cu_codecs.cuh: the dense value codecs (int8, fp8, intN, qsgd, nc, onebit; fp16's element
// rule) as device code that encodes any array of values to the bytes the CPU's m_<name>.c
// writes for it, and decodes one element of such a body. The dense methods' kernels
// (fc_cu_blocks.cu via fc_cu_dense.cuh) and the sparsifiers' value codecs both use them.
//
// Encoding: every lane of a warp calls fc_cu_encode_blocks(codec, x, n, body, rng, sink, warp,
// warps) with the same arguments; warp `warp` of `warps` takes every warps-th unit (fc_cu_unit)
// of the array. x is a loader (fc_cu_chunk_x, fc_cu_f32_values, a one-pass kernel's fc_cu_gx:
// load8 the first read of 8 elements, reload8 a second one), rng the stream the CPU's
// encode got (its fc_chunk.rng), sink receives (x, -D(C(x))) per element when sink.on()
// (fc_cu_no_sink for none). Launch with FC_CU_CODEC_THREADS threads per block: qsgd and onebit
// keep their tiles in static shared memory indexed by warp. tests/cuda_emu/emu_main.cpp's
// encode_array / decode_array are a minimal example of both on an array.
// As a sparsifier's value codec (fc_sparse.c): the codec at its method's defaults, the k kept
// values as the array, rng = the chunk's stream with chunk ^= 0x5bd1e995 (sub_chunk); `none`
// is the fp32 values as they are, `fp16` fc_cu_fp16_code with the parent chunk's world.
// Decoding: C::dec d = codec.at(n) for an array of n; d.term(body, i, alpha, &bad) is exactly
// what the CPU's decode_add adds to acc[i] (alpha * D(body)[i]); *bad set for a code the
// encoder cannot write (the CPU raises PayloadError there). d.add16(body, i0, alpha, acc, &bad)
// does the same for the 16 elements from i0 (a multiple of 16, all of them in the array: the
// fused decode's run, fc_cu_decode.cuh), acc[k] += the term of element i0 + k, from one wide load
// of their codes (fc_cu_load.cuh) and one block's meta per group of 8; bit k of *bad set for a
// code no encoder writes (acc[k] then holds anything).
#ifndef FC_CU_CODECS_CUH
#define FC_CU_CODECS_CUH

#include "fc_cu_tile.cuh"
#include "fc_cu_load.cuh"
#include "common/fc_fp8.h"
#include "common/fc_intn.h"
#include "common/fc_nc.h"
#include "common/fc_onebit.h"
#include "common/fc_pack.h"
#include "common/fc_qsgd.h"

// Blocks of bs in n. Every codec's bs is a power of two (fc_cu_check_block): a shift, not a
// 64-bit division, which is a call of many registers on the device.
__host__ __device__ __forceinline__ int64_t fc_cu_nblocks(int64_t n, int64_t bs)
{
    return (n + bs - 1) >> fc_cu_log2(bs);
}

// The block codecs' common walk: per unit, pass 1 loads the tiles and reduces them (C::red),
// the block's parameters follow (C::block, which writes the block's metadata), pass 2 writes the
// codes of each group of 8 (C::code8) and hands x and D_{-1}(code) to the sink. A unit of one
// tile keeps its values in registers and loads the warp's next unit before coding this one (two
// tiles in flight per warp); larger blocks reload their tiles in pass 2 (from L1/L2).
template <class C, class L, class S>
__device__ __forceinline__ void fc_cu_encode_blocks(const C &c, L &x, int64_t n,
                                                    uint8_t *body, const fc_rng &rng, S &sink,
                                                    int64_t warp, int64_t warps)
{
    const int lane = threadIdx.x & 31;
    const int64_t bs = c.bs;
    const int G = fc_cu_block_lanes(bs);
    const bool dec = sink.on();
    if (bs <= FC_CU_TILE) { // units of one tile, in registers, the next one loading meanwhile
        const uint32_t units = (uint32_t)((n + FC_CU_TILE - 1) / FC_CU_TILE); // n < 2^40 (fc_cu_dense.cuh refuses more)
        float next[8];
        if (warp < units)
            x.load8(warp * FC_CU_TILE + 8 * lane, fc_cu_valid8(n, warp * FC_CU_TILE + 8 * lane), next);
        for (uint32_t u = (uint32_t)warp; u < units; u += (uint32_t)warps) {
            const int64_t i = (int64_t)u * FC_CU_TILE + 8 * lane;
            const int64_t b = i >> fc_cu_log2(bs); // the lane's block
            const int m = fc_cu_valid8(n, i);
            float v[8];
            for (int j = 0; j < 8; j++)
                v[j] = next[j];
            if (u + warps < units)
                x.load8(i + warps * FC_CU_TILE, fc_cu_valid8(n, i + warps * FC_CU_TILE), next);
            typename C::red r;
            c.red_init(r);
            c.red_tile(r, i - b * bs, m, v);
            const typename C::blk k = c.block(r, G, b, n, body, lane % G == 0 && b * bs < n);
            if (m == 0)
                continue; // no collective below
            float d[8];
            c.code8(k, rng, i, m, v, n, body, dec, d);
            if (dec)
                sink.put8(i, m, v, d); // d: the CPU's decode_add(alpha = -1)
        }
        return;
    }
    const uint32_t units = (uint32_t)((n + bs - 1) >> fc_cu_log2(bs)); // a block a unit, tile by tile
    for (uint32_t u = (uint32_t)warp; u < units; u += (uint32_t)warps) {
        const int64_t lo = (int64_t)u * bs;
        typename C::red r;
        c.red_init(r);
        float v[8];
        for (int64_t t = lo; t < lo + bs; t += FC_CU_TILE) {
            const int64_t i = t + 8 * lane;
            const int m = fc_cu_valid8(n, i);
            x.load8(i, m, v);
            c.red_tile(r, i - lo, m, v);
        }
        const typename C::blk k = c.block(r, G, u, n, body, lane == 0 && lo < n);
        for (int64_t t = lo; t < lo + bs; t += FC_CU_TILE) {
            const int64_t i = t + 8 * lane;
            const int m = fc_cu_valid8(n, i);
            if (m == 0)
                continue; // no collective below
            x.reload8(i, m, v); // what load8 counted is not counted again
            float d[8];
            c.code8(k, rng, i, m, v, n, body, dec, d);
            if (dec)
                sink.put8(i, m, v, d); // d: the CPU's decode_add(alpha = -1)
        }
    }
}

// A block's meta words (a scale, a norm, an exponent; intN's min-max and onebit's two means:
// a pair), at its index b among the body's blocks, written once by the group's lead lane.
template <class T> __device__ __forceinline__ void fc_cu_put_meta(uint8_t *body, int64_t b, bool lead, T v)
{
    if (lead)
        ((T *)body)[b] = v;
}

__device__ __forceinline__ void fc_cu_put_meta2(uint8_t *body, int64_t b, bool lead, float v0, float v1)
{
    if (lead) {
        ((float *)body)[2 * b] = v0;
        ((float *)body)[2 * b + 1] = v1;
    }
}

// ---- absmax reductions (int8, fp8, nc, intN absmax): the largest |x| as bits

struct fc_cu_amax_red {
    uint32_t amax;
};

__device__ __forceinline__ void fc_cu_amax_tile(uint32_t &amax, const float v[8])
{
    for (int k = 0; k < 8; k++) { // the zeros past the end are neutral
        const uint32_t a = fc_abs_bits(v[k]);
        amax = a > amax ? a : amax;
    }
}

// ---- what int8, fp8 and nc share: the block's absmax is all they reduce, and one 32-bit word
// of meta per block comes of it (int8's and fp8's scale, nc's exponent)

struct fc_cu_amax_codec {
    int64_t bs;

    typedef fc_cu_amax_red red;

    __host__ __device__ int64_t meta_bytes(int64_t n) const { return 4 * fc_cu_nblocks(n, bs); }
    __device__ void red_init(red &r) const { r.amax = 0; }
    __device__ void red_tile(red &r, int64_t, int, const float v[8]) const { fc_cu_amax_tile(r.amax, v); }
};

// int8's and fp8's block: s = amax / qmax in the meta (written by the group's lead lane), and
// the 1 / s the codes are scaled by (0: zero codes, fc_absmax_scale).
struct fc_cu_scale_blk {
    float scale, inv;

    __device__ static fc_cu_scale_blk make(const fc_cu_amax_red &r, int G, int64_t b, uint8_t *body,
                                           bool lead, float qmax)
    {
        fc_cu_scale_blk k;
        k.inv = fc_absmax_scale(fc_cu_group_max(r.amax, G), qmax, &k.scale);
        fc_cu_put_meta(body, b, lead, k.scale);
        return k;
    }
};

// int8's and fp8's decode: element i is alpha * its block's scale (the meta) * code(byte i of
// the codes), one per byte; they differ only in what a byte means (code).
template <class Code> struct fc_cu_scale8_dec {
    int64_t meta;
    int shift;
    Code code;
    __device__ float term(const uint8_t *b, int64_t i, float alpha, int *) const
    {
        const float s = alpha * ((const float *)b)[i >> shift];
        return s * code(b[meta + i]);
    }
    __device__ void add16(const uint8_t *b, int64_t i0, float alpha, float acc[16], uint32_t *) const
    {
        uint32_t u[4];
        fc_cu_ld_words<4>(b + meta + i0, u);
        for (int g = 0; g < 2; g++) {
            const float s = alpha * ((const float *)b)[(i0 + 8 * g) >> shift];
            for (int j = 0; j < 8; j++)
                acc[8 * g + j] += s * code((uint8_t)(u[2 * g + (j >> 2)] >> (8 * (j & 3))));
        }
    }
};

// ---- int8 (m_int8.c): per block s = amax / 127, q = round(x / s) or floor(x / s + u)

struct fc_cu_int8_codec : fc_cu_amax_codec {
    int stochastic;

    typedef fc_cu_scale_blk blk;

    __device__ blk block(red &r, int G, int64_t b, int64_t, uint8_t *body, bool lead) const
    {
        return blk::make(r, G, b, body, lead, 127.0f);
    }

    __device__ void code8(const blk &k, const fc_rng &rng, int64_t i, int m, const float v[8],
                          int64_t n, uint8_t *body, bool dec, float d[8]) const
    {
        uint8_t q8[8];
        fc_u32x4 r = {{0u, 0u, 0u, 0u}};
        if (stochastic && k.inv != 0.0f)
            r = fc_rng_draw8(&rng, (uint32_t)(i >> 3));
        const float s_neg = -1.0f * k.scale; // decode_add's alpha * scale, alpha = -1
        for (int j = 0; j < 8; j++) {
            int32_t q = 0;
            if (k.inv != 0.0f) { // zero or non-finite block: zero codes (fc_absmax_scale)
                // finite: a block with NaN/Inf, or whose 1 / scale overflows, has inv 0
                const float t = v[j] * k.inv;
                if (!stochastic) {
                    float f = fc_round_even(t);
                    f = f > 127.0f ? 127.0f : f < -127.0f ? -127.0f : f;
                    q = (int32_t)f;
                } else {
                    q = fc_floor_i32(t + fc_u01_16(fc_rng_h16(r, (uint32_t)j)));
                    q = q > 127 ? 127 : q < -127 ? -127 : q;
                }
            }
            q8[j] = (uint8_t)(int8_t)q;
            if (dec)
                d[j] = s_neg * (float)q;
        }
        fc_cu_store_bytes(body + meta_bytes(n) + i, q8, m);
    }

    struct code { // q's byte as the signed integer it is
        __device__ float operator()(uint8_t q) const { return (float)(int8_t)q; }
    };
    struct dec : fc_cu_scale8_dec<code> {};
    __host__ __device__ dec at(int64_t n) const { return dec{{meta_bytes(n), fc_cu_log2(bs), code{}}}; }
};

// ---- fp8 (m_fp8.c): per block s = amax / fmax, code = fp8(x / s)

struct fc_cu_fp8_codec : fc_cu_amax_codec {
    int fmt; // FC_FP8_E4M3 or FC_FP8_E5M2

    typedef fc_cu_scale_blk blk;

    __device__ blk block(red &r, int G, int64_t b, int64_t, uint8_t *body, bool lead) const
    {
        return blk::make(r, G, b, body, lead, fc_fp8_max(fmt));
    }

    __device__ void code8(const blk &k, const fc_rng &, int64_t i, int m, const float v[8],
                          int64_t n, uint8_t *body, bool dec, float d[8]) const
    {
        uint8_t q8[8];
        const float s_neg = -1.0f * k.scale;
        for (int j = 0; j < 8; j++) {
            q8[j] = k.inv != 0.0f ? fc_f32_to_fp8(v[j] * k.inv, fmt) : (uint8_t)0;
            if (dec)
                d[j] = s_neg * fc_fp8_to_f32(q8[j], fmt);
        }
        fc_cu_store_bytes(body + meta_bytes(n) + i, q8, m);
    }

    struct code { // q's byte as the fp8 value it encodes
        int fmt;
        __device__ float operator()(uint8_t q) const { return fc_fp8_to_f32(q, fmt); }
    };
    struct dec : fc_cu_scale8_dec<code> {};
    __host__ __device__ dec at(int64_t n) const { return dec{{meta_bytes(n), fc_cu_log2(bs), code{fmt}}}; }
};

// ---- nc (m_nc.c): per block the largest exponent, per element sign + stochastic power of two

struct fc_cu_nc_codec : fc_cu_amax_codec {
    struct blk {
        uint32_t emax, stored;
    };

    __device__ blk block(red &r, int G, int64_t b, int64_t, uint8_t *body, bool lead) const
    {
        blk k;
        k.emax = fc_nc_emax(fc_cu_group_max(r.amax, G), &k.stored);
        fc_cu_put_meta(body, b, lead, k.stored);
        return k;
    }

    __device__ void code8(const blk &k, const fc_rng &rng, int64_t i, int m, const float v[8],
                          int64_t n, uint8_t *body, bool dec, float d[8]) const
    {
        uint8_t q8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (k.emax != 0) {
            const fc_u32x4 r = fc_rng_draw8(&rng, (uint32_t)(i >> 3));
            for (int j = 0; j < 8; j++)
                q8[j] = fc_nc_encode(v[j], k.emax, fc_rng_h16(r, (uint32_t)j));
        }
        if (dec)
            for (int j = 0; j < 8; j++) // the decode of the block as stored (255: NaN)
                d[j] = k.stored == 255 ? fc_bits_f32(FC_NAN_BITS) : fc_nc_term(q8[j], k.stored, -1.0f);
        fc_cu_store_bytes(body + meta_bytes(n) + i, q8, m);
    }

    struct dec {
        int64_t meta;
        int shift;
        __device__ float term(const uint8_t *b, int64_t i, float alpha, int *bad) const
        {
            const uint32_t emax = ((const uint32_t *)b)[i >> shift];
            const uint8_t code = b[meta + i];
            if (emax == 255)
                return fc_bits_f32(FC_NAN_BITS); // a non-finite block passes NaN on
            if (emax > 255 || fc_nc_code_bad(code, emax)) {
                *bad = 1;
                return 0.0f;
            }
            return fc_nc_term(code, emax, alpha);
        }
        __device__ void add16(const uint8_t *b, int64_t i0, float alpha, float acc[16], uint32_t *bad) const
        {
            uint32_t u[4];
            fc_cu_ld_words<4>(b + meta + i0, u);
            for (int g = 0; g < 2; g++) {
                const uint32_t emax = ((const uint32_t *)b)[(i0 + 8 * g) >> shift];
                for (int j = 0; j < 8; j++) {
                    const uint8_t code = (uint8_t)(u[2 * g + (j >> 2)] >> (8 * (j & 3)));
                    if (emax == 255) // a non-finite block passes NaN on
                        acc[8 * g + j] += fc_bits_f32(FC_NAN_BITS);
                    else if (emax > 255 || fc_nc_code_bad(code, emax))
                        *bad |= 1u << (8 * g + j);
                    else
                        acc[8 * g + j] += fc_nc_term(code, emax, alpha);
                }
            }
        }
    };
    __host__ __device__ dec at(int64_t n) const { return dec{meta_bytes(n), fc_cu_log2(bs)}; }
};

// ---- intN (m_intn.c): bits-wide codes packed 8 per `bits` bytes; absmax scale or (min, step)

struct fc_cu_intn_codec {
    int64_t bs;
    int bits, stochastic, scheme;

    struct red {
        uint32_t amax;
        int32_t kmin, kmax; // fc_intn_key range (minmax)
    };
    struct blk {
        fc_intn_map map;
        fc_intn_dec dneg; // decode with alpha = -1, for the residual
    };

    __host__ __device__ int64_t meta_bytes(int64_t n) const
    {
        return (scheme == FC_INTN_MINMAX ? 8 : 4) * fc_cu_nblocks(n, bs);
    }
    __device__ void red_init(red &r) const
    {
        r.amax = 0;
        r.kmin = INT32_MAX;
        r.kmax = INT32_MIN;
    }
    __device__ void red_tile(red &r, int64_t, int m, const float v[8]) const
    {
        if (scheme != FC_INTN_MINMAX) {
            fc_cu_amax_tile(r.amax, v);
            return;
        }
        for (int j = 0; j < 8; j++) {
            const int32_t key = fc_intn_key(fc_f32_bits(v[j]));
            r.kmin = j < m && key < r.kmin ? key : r.kmin;
            r.kmax = j < m && key > r.kmax ? key : r.kmax;
        }
    }

    __device__ blk block(red &r, int G, int64_t b, int64_t, uint8_t *body, bool lead) const
    {
        blk k;
        float meta[2];
        if (scheme == FC_INTN_MINMAX) {
            float small, big;
            int finite;
            fc_intn_key_range_values(fc_cu_group_min_i32(r.kmin, G), fc_cu_group_max_i32(r.kmax, G),
                                     &small, &big, &finite);
            fc_intn_minmax_map(bits, small, big, finite, &k.map, &meta[0], &meta[1]);
            fc_cu_put_meta2(body, b, lead, meta[0], meta[1]);
        } else {
            meta[0] = fc_intn_absmax_map(bits, fc_cu_group_max(r.amax, G), &k.map);
            fc_cu_put_meta(body, b, lead, meta[0]);
        }
        k.dneg = fc_intn_dec_block(bits, scheme, meta, 0, -1.0f);
        return k;
    }

    __device__ void code8(const blk &k, const fc_rng &rng, int64_t i, int m, const float v[8],
                          int64_t n, uint8_t *body, bool dec, float d[8]) const
    {
        fc_u32x4 r = {{0u, 0u, 0u, 0u}};
        if (stochastic && k.map.ok)
            r = fc_rng_draw8(&rng, (uint32_t)(i >> 3));
        uint32_t codes[8]; // the group's unused slots are code 0, as the CPU packs them
        for (int j = 0; j < 8; j++) {
            codes[j] = j < m ? fc_intn_code(&k.map, v[j], stochastic, fc_u01_16(fc_rng_h16(r, (uint32_t)j)))
                             : 0u;
            if (dec)
                d[j] = fc_intn_value(&k.dneg, codes[j]);
        }
        uint64_t lo, hi;
        fc_pack8_words(codes, bits, &lo, &hi);
        fc_cu_store_group(body + meta_bytes(n) + (i >> 3) * bits, lo, hi, bits);
    }

    struct dec {
        int64_t meta;
        int shift, bits, scheme;
        __device__ float term(const uint8_t *b, int64_t i, float alpha, int *bad) const
        {
            const fc_intn_dec d = fc_intn_dec_block(bits, scheme, (const float *)b, i >> shift, alpha);
            const uint32_t code = fc_cu_unpack1(b + meta + (i >> 3) * bits, bits, (int)(i & 7));
            if (code > d.top) { // absmax: a code above 2 * qmax is never written
                *bad = 1;
                return 0.0f;
            }
            return fc_intn_value(&d, code);
        }
        // the run's two groups: 2 * bits <= 8 bytes, its codes back to back
        __device__ void add16(const uint8_t *b, int64_t i0, float alpha, float acc[16], uint32_t *bad) const
        {
            uint64_t codes = fc_cu_ld_le(b + meta + (i0 >> 3) * bits, 2 * bits);
            for (int g = 0; g < 2; g++) {
                const fc_intn_dec d = fc_intn_dec_block(bits, scheme, (const float *)b, (i0 + 8 * g) >> shift, alpha);
                for (int j = 0; j < 8; j++) {
                    const uint32_t code = (uint32_t)codes & ((1u << bits) - 1u);
                    codes >>= bits;
                    if (code > d.top)
                        *bad |= 1u << (8 * g + j);
                    else
                        acc[8 * g + j] += fc_intn_value(&d, code);
                }
            }
        }
    };
    __host__ __device__ dec at(int64_t n) const
    {
        return dec{meta_bytes(n), fc_cu_log2(bs), bits, scheme};
    }
};

// ---- qsgd (m_qsgd.c): per bucket the L2 norm, per element sign + stochastic level

// The terms of a bucket's sum of squares.
struct fc_cu_sq_terms {
    __device__ __forceinline__ void add(double v, double *s) const { s[0] += v * v; }
};

struct fc_cu_qsgd_codec {
    int64_t bs;
    int32_t levels;
    int w; // fc_qsgd_width(levels)

    struct red {
        fc_cu_tile_sums<1> sums;
    };
    struct blk {
        float norm, inv, step;
        int ok;
    };

    __host__ __device__ int64_t meta_bytes(int64_t n) const { return 4 * fc_cu_nblocks(n, bs); }

    __device__ void red_init(red &r) const { r.sums.init(); }
    __device__ void red_tile(red &r, int64_t, int, const float v[8]) const
    {
        r.sums.tile_add(bs, v, fc_cu_sq_terms());
    }

    __device__ blk block(red &r, int G, int64_t b, int64_t, uint8_t *body, bool lead) const
    {
        blk k;
        (void)G;
        k.norm = fc_qsgd_norm(r.sums.total(bs, 0)); // NaN/Inf in the sum: the canonical NaN
        k.ok = fc_qsgd_ok(k.norm);
        k.inv = k.ok ? (float)levels / k.norm : 0.0f;
        k.step = k.norm / (float)levels;
        fc_cu_put_meta(body, b, lead, k.norm);
        return k;
    }

    __device__ void code8(const blk &k, const fc_rng &rng, int64_t i, int m, const float v[8],
                          int64_t n, uint8_t *body, bool dec, float d[8]) const
    {
        uint32_t codes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (k.ok) {
            const fc_u32x4 r = fc_rng_draw8(&rng, (uint32_t)(i >> 3));
            for (int j = 0; j < 8; j++)
                if (j < m)
                    codes[j] = fc_qsgd_code(v[j], k.inv, levels, fc_rng_h16(r, (uint32_t)j));
        }
        if (dec)
            for (int j = 0; j < 8; j++)
                d[j] = -1.0f * fc_qsgd_value(codes[j], k.step);
        uint64_t lo, hi;
        fc_pack8_words(codes, w, &lo, &hi);
        fc_cu_store_group(body + meta_bytes(n) + (i >> 3) * w, lo, hi, w);
    }

    struct dec {
        int64_t meta;
        int shift, w;
        int32_t levels;
        __device__ float term(const uint8_t *b, int64_t i, float alpha, int *bad) const
        {
            const float step = ((const float *)b)[i >> shift] / (float)levels;
            const uint32_t code = fc_cu_unpack1(b + meta + (i >> 3) * w, w, (int)(i & 7));
            if ((code >> 1) > (uint32_t)levels) {
                *bad = 1;
                return 0.0f;
            }
            return alpha * fc_qsgd_value(code, step);
        }
        // a group of 8 codes is w <= 16 bytes, each code read from its own bytes (a 128-bit
        // window of a width known only at run time cost twice the registers the kernel has)
        __device__ void add16(const uint8_t *b, int64_t i0, float alpha, float acc[16], uint32_t *bad) const
        {
            for (int g = 0; g < 2; g++) {
                const uint8_t *p = b + meta + ((i0 >> 3) + g) * w;
                const float step = ((const float *)b)[(i0 + 8 * g) >> shift] / (float)levels;
                for (int j = 0; j < 8; j++) {
                    const uint32_t code = fc_cu_unpack1(p, w, j);
                    if ((code >> 1) > (uint32_t)levels)
                        *bad |= 1u << (8 * g + j);
                    else
                        acc[8 * g + j] += alpha * fc_qsgd_value(code, step);
                }
            }
        }
    };
    __host__ __device__ dec at(int64_t n) const { return dec{meta_bytes(n), fc_cu_log2(bs), w, levels}; }
};

// ---- onebit (m_onebit.c): sign bits, per block the mean of the x >= 0 and of the x < 0

// The terms of a block's two sums: x adds to the positive sum (s[0]) or, sign bit set, to the
// negative one (s[1]). The CPU adds x * 1 to one and x * 0 (a zero of x's sign) to the other;
// a zero of the sum's own sign leaves it unchanged, so the sums are the same (m_onebit.c).
struct fc_cu_sign_terms {
    __device__ __forceinline__ void add(double v, double *s) const
    {
        if (__double_as_longlong(v) < 0)
            s[1] += v;
        else
            s[0] += v;
    }
};

struct fc_cu_onebit_codec {
    int64_t bs;

    struct red {
        fc_cu_tile_sums<2> sums;
        uint32_t nan; // bit s: a NaN term reached sum s (0 the positive, 1 the negative one)
        int32_t pos, count;
    };
    struct blk {
        float mean[2];
    };

    __host__ __device__ int64_t meta_bytes(int64_t n) const { return 8 * fc_cu_nblocks(n, bs); }

    __device__ void red_init(red &r) const
    {
        r.sums.init();
        r.nan = 0;
        r.pos = r.count = 0;
    }

    // The CPU's NaN terms: a NaN adds itself to both sums, an Inf times 0 is a NaN in the other
    // sign's (-Inf's in the positive sum, +Inf's in the negative one); the kernels' sums add
    // each value to its own sign's sum only, so those NaNs are flagged here.
    __device__ void red_tile(red &r, int64_t, int m, const float v[8]) const
    {
        r.sums.tile_add(bs, v, fc_cu_sign_terms());
        for (int j = 0; j < 8; j++) {
            const uint32_t u = fc_f32_bits(v[j]), a = u & 0x7fffffffu;
            if (j >= m)
                break;
            r.pos += 1 - (int32_t)(u >> 31);
            if (a < FC_INF_BITS)
                continue;
            const int k = a > FC_INF_BITS ? -1 : (int)(u >> 31) ^ 1; // -1: both sums
            if (k != 1)
                r.nan |= 1u;
            if (k != 0)
                r.nan |= 2u;
        }
        r.count += m;
    }

    __device__ blk block(red &r, int G, int64_t b, int64_t, uint8_t *body, bool lead) const
    {
        blk k;
        const int32_t pos = fc_cu_group_sum_i32(r.pos, G), cnt = fc_cu_group_sum_i32(r.count, G);
        const int64_t counts[2] = {pos, cnt - pos};
        const uint32_t nans = fc_cu_group_fold(r.nan, G, fc_cu_or_op());
        for (int s = 0; s < 2; s++) {
            const uint32_t nan = (nans >> s) & 1u;
            const double sum = r.sums.total(bs, s);
            k.mean[s] = nan && counts[s] ? fc_bits_f32(FC_NAN_BITS) : fc_onebit_mean(sum, counts[s]);
        }
        fc_cu_put_meta2(body, b, lead, k.mean[0], k.mean[1]);
        return k;
    }

    __device__ void code8(const blk &k, const fc_rng &, int64_t i, int m, const float v[8],
                          int64_t n, uint8_t *body, bool dec, float d[8]) const
    {
        uint32_t byte = 0;
        for (int j = 0; j < 8; j++) {
            const uint32_t bit = j < m ? fc_f32_bits(v[j]) >> 31 : 0u;
            byte |= bit << j;
            if (dec)
                d[j] = fc_onebit_value(k.mean, bit, -1.0f);
        }
        body[meta_bytes(n) + (i >> 3)] = (uint8_t)byte;
    }

    struct dec {
        int64_t meta;
        int shift;
        __device__ float term(const uint8_t *b, int64_t i, float alpha, int *) const
        {
            const uint32_t bit = (b[meta + (i >> 3)] >> (i & 7)) & 1u;
            return fc_onebit_value((const float *)b + 2 * (i >> shift), bit, alpha);
        }
        __device__ void add16(const uint8_t *b, int64_t i0, float alpha, float acc[16], uint32_t *) const
        {
            const uint32_t bits = (uint32_t)fc_cu_ld_le(b + meta + (i0 >> 3), 2);
            for (int g = 0; g < 2; g++) {
                const float *means = (const float *)b + 2 * ((i0 + 8 * g) >> shift);
                for (int j = 0; j < 8; j++)
                    acc[8 * g + j] += fc_onebit_value(means, (bits >> (8 * g + j)) & 1u, alpha);
            }
        }
    };
    __host__ __device__ dec at(int64_t n) const { return dec{meta_bytes(n), fc_cu_log2(bs)}; }
};

// ---- fp16 (m_cast.c): element-wise, pre-divided by the world size (1 / W as the CPU divides)

struct fc_cu_fp16_code {
    float inv_w, w;
    __device__ __forceinline__ void put(uint8_t *b, int64_t i, float x) const
    {
        ((uint16_t *)b)[i] = fc_f32_to_f16(x * inv_w); // saturating; any NaN the canonical one
    }
    // put's code as bits, and what the CPU's decode_add adds for it (a one-pass encode's)
    __device__ __forceinline__ uint32_t code(float x) const { return fc_f32_to_f16(x * inv_w); }
    __device__ __forceinline__ float value(uint32_t q, float alpha) const
    {
        return (alpha * w) * fc_f16_to_f32((uint16_t)q);
    }
    // How many of put's values saturate (fc_f16_saturates after the pre-divide).
    __device__ __forceinline__ int sat(float x) const { return fc_f16_saturates(x * inv_w); }
    __device__ __forceinline__ float term(const uint8_t *b, int64_t i, float alpha) const
    {
        return (alpha * w) * fc_f16_to_f32(((const uint16_t *)b)[i]);
    }
    __device__ __forceinline__ float term(const uint8_t *b, int64_t i, float alpha, int *) const
    {
        return term(b, i, alpha);
    }
    __device__ __forceinline__ void add16(const uint8_t *b, int64_t i0, float alpha, float acc[16], uint32_t *) const
    {
        fc_cu_each16(b, FC_CU_F16, i0, [&](int k, float x) { acc[k] += (alpha * w) * x; });
    }
};

static inline fc_cu_fp16_code fc_cu_make_fp16(int world)
{
    fc_cu_fp16_code m;
    m.w = (float)world;
    m.inv_w = 1.0f / (float)world; // the same IEEE division as the CPU encoder's
    return m;
}

#endif
