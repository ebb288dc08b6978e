// fc_cu_tile.cuh: the warp machinery of the block codecs (fc_cu_codecs.cuh): a warp loads a
// tile of 256 values, each lane 8 consecutive ones (one Philox call, one packed group, one byte
// of sign bits), through a loader (g' of a chunk, or any fp32 array), reduces per quantisation
// block within groups of lanes, and hands (x, -D(C(x))) to a sink (error feedback, or
// nothing). Also the CPU's 8-lane double sums in its order.
#ifndef FC_CU_TILE_CUH
#define FC_CU_TILE_CUH

#include "fc_cu.cuh"

#define FC_CU_TILE 256       // elements a warp holds at once: 32 lanes x 8
#define FC_CU_CODEC_WARPS 8  // warps per thread block of every codec kernel (shared tiles)
#define FC_CU_CODEC_THREADS (32 * FC_CU_CODEC_WARPS)
#define FC_CU_FULL 0xffffffffu

// Valid elements of the group of 8 at i (a multiple of 8) in an array of n: 0..8.
__device__ __forceinline__ int fc_cu_valid8(int64_t n, int64_t i)
{
    const int64_t m = n - i;
    return m <= 0 ? 0 : m >= 8 ? 8 : (int)m;
}

// log2 of a power of two (a block size, its lanes).
__host__ __device__ __forceinline__ int fc_cu_log2(int64_t pow2)
{
#ifdef __CUDA_ARCH__
    return __ffsll(pow2) - 1; // one instruction, where a loop cost registers in every encode kernel
#else
    int s = 0;
    while (((int64_t)1 << s) < pow2)
        s++;
    return s;
#endif
}

// Lanes that share one quantisation block of bs elements (a power of two >= 8): a block below a
// tile is bs / 8 lanes, 256 / bs blocks per tile; a larger one is the whole warp, tile by tile.
__host__ __device__ __forceinline__ int fc_cu_block_lanes(int64_t bs)
{
    return bs >= FC_CU_TILE ? 32 : (int)(bs >> 3);
}

// Elements a warp encodes as one unit: one block, or one tile of several blocks.
__host__ __device__ __forceinline__ int64_t fc_cu_unit(int64_t bs)
{
    return bs > FC_CU_TILE ? bs : FC_CU_TILE;
}

// ---- reductions within the aligned groups of G lanes (G a power of two, warp-uniform)

// op(v, the value of the lane o away) for o = 1, 2, 4, ... < G: every lane of a group ends with
// the group's fold.
template <class T, class Op> __device__ __forceinline__ T fc_cu_group_fold(T v, int G, Op op)
{
    for (int o = 1; o < G; o <<= 1)
        v = op(v, __shfl_xor_sync(FC_CU_FULL, v, o));
    return v;
}

struct fc_cu_max_op {
    template <class T> __device__ __forceinline__ T operator()(T v, T w) const { return w > v ? w : v; }
};
struct fc_cu_or_op {
    template <class T> __device__ __forceinline__ T operator()(T v, T w) const { return v | w; }
};
struct fc_cu_min_op {
    template <class T> __device__ __forceinline__ T operator()(T v, T w) const { return w < v ? w : v; }
};

__device__ __forceinline__ uint32_t fc_cu_group_max(uint32_t v, int G)
{
    return fc_cu_group_fold(v, G, fc_cu_max_op());
}

__device__ __forceinline__ int32_t fc_cu_group_min_i32(int32_t v, int G)
{
    return fc_cu_group_fold(v, G, fc_cu_min_op());
}

__device__ __forceinline__ int32_t fc_cu_group_max_i32(int32_t v, int G)
{
    return fc_cu_group_fold(v, G, fc_cu_max_op());
}

__device__ __forceinline__ int32_t fc_cu_group_sum_i32(int32_t v, int G)
{
    for (int o = 1; o < G; o <<= 1)
        v += __shfl_xor_sync(FC_CU_FULL, v, o);
    return v;
}

// ---- loads and stores of 8 consecutive elements

__device__ __forceinline__ int fc_cu_aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

// v[k] = element k of the 8 at p (dtype dt); `vec`: p is 16-byte aligned.
__device__ __forceinline__ void fc_cu_load8_dt(const void *p, int dt, int vec, float v[8])
{
    if (dt == FC_CU_F32) {
        const float *f = (const float *)p;
        if (vec) {
            const float4 a = ((const float4 *)f)[0], b = ((const float4 *)f)[1];
            v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w;
            v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
        } else {
            for (int k = 0; k < 8; k++)
                v[k] = f[k];
        }
        return;
    }
    uint16_t h[8];
    if (vec) {
        const uint4 q = *(const uint4 *)p;
        const uint32_t w[4] = {q.x, q.y, q.z, q.w};
        for (int k = 0; k < 8; k++)
            h[k] = (uint16_t)(w[k >> 1] >> (16 * (k & 1)));
    } else {
        for (int k = 0; k < 8; k++)
            h[k] = ((const uint16_t *)p)[k];
    }
    for (int k = 0; k < 8; k++)
        v[k] = dt == FC_CU_BF16 ? fc_bf16_to_f32(h[k]) : fc_f16_to_f32(h[k]);
}

// g' = g (+ e) of one chunk, element i of it at start + i: fc_cu_src's rule, 8 at a time.
struct fc_cu_chunk_x {
    fc_cu_src s;
    int64_t start;
    int vec; // gradient and residual rows 16-byte aligned at every multiple of 8

    __device__ static fc_cu_chunk_x make(const fc_cu_src &s, int64_t start)
    {
        fc_cu_chunk_x x;
        x.s = s;
        x.start = start;
        const int gsz = s.gdt == FC_CU_F32 ? 4 : 2, rsz = s.rdt == FC_CU_F32 ? 4 : 2;
        x.vec = fc_cu_aligned16((const uint8_t *)s.grad + start * gsz) &&
                (s.res == NULL || fc_cu_aligned16((const uint8_t *)s.res + start * rsz));
        return x;
    }

    // v[k] = x[i + k] for k < m, 0 past it; i a multiple of 8.
    __device__ __forceinline__ void load8(int64_t i, int m, float v[8]) const
    {
        const int64_t a = start + i;
        if (m < 8 || !vec) {
            for (int k = 0; k < 8; k++)
                v[k] = k < m ? s.x(a + k) : 0.0f;
            return;
        }
        const int gsz = s.gdt == FC_CU_F32 ? 4 : 2;
        float r[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        fc_cu_load8_dt((const uint8_t *)s.grad + a * gsz, s.gdt, 1, v);
        if (s.res != NULL) {
            const int rsz = s.rdt == FC_CU_F32 ? 4 : 2;
            fc_cu_load8_dt((const uint8_t *)s.res + a * rsz, s.rdt, 1, r);
        }
        int64_t bad = 0, sat = 0; // counted once, by count_nonfinite
        for (int k = 0; k < 8; k++)
            v[k] = s.fix(v[k], s.res != NULL ? s.decayed(r[k]) : 0.0f, &bad, &sat);
    }
    __device__ __forceinline__ void reload8(int64_t i, int m, float v[8]) const { load8(i, m, v); }
};

// Any fp32 array (the kept values of a sparsifier, say).
struct fc_cu_f32_values {
    const float *v;

    __device__ __forceinline__ void load8(int64_t i, int m, float out[8]) const
    {
        if (m == 8) {
            fc_cu_load8_dt(v + i, FC_CU_F32, fc_cu_aligned16(v + i), out);
            return;
        }
        for (int k = 0; k < 8; k++)
            out[k] = k < m ? v[i + k] : 0.0f;
    }
    __device__ __forceinline__ void reload8(int64_t i, int m, float out[8]) const { load8(i, m, out); }
};

// ---- sinks: what a codec does with each element's x and its decode -D(C(x))

struct fc_cu_no_sink {
    __device__ __forceinline__ bool on() const { return false; }
    __device__ __forceinline__ void put8(int64_t, int, const float *, const float *) {}
};

// Error feedback of one chunk: e = fc_cu_residual(x, -D) into the residual (when kept), the
// sums for ||e||^2 and the sampled statistics, and what saturated, as the CPU's update_residual.
struct fc_cu_res_sink {
    void *res;
    int rdt;
    int64_t start;
    int ef, sample, vec;
    fc_cu_esum sum;
    int64_t sat;

    // Chunk c's sink from elements start on: the residual always replaced (the old one went out
    // inside g'), its error statistics summed when `sample` (fc_cu_sampled: the driver's pick; a
    // one-pass encode's: every chunk).
    __device__ static __forceinline__ fc_cu_res_sink make(const fc_cu_enc &e, int64_t start, int sample)
    {
        fc_cu_res_sink k;
        k.res = e.res;
        k.rdt = e.rdt;
        k.start = start;
        k.sat = 0;
        k.ef = e.res != NULL;
        k.sample = sample;
        k.vec = e.res != NULL && fc_cu_aligned16((const uint8_t *)e.res + start * (e.rdt == FC_CU_F32 ? 4 : 2));
        return k;
    }

    __device__ __forceinline__ bool on() const { return ef || sample; }

    // x: g' of elements i..i+m; dneg: their decode with alpha = -1.
    __device__ __forceinline__ void put8(int64_t i, int m, const float x[8], const float dneg[8])
    {
        float e[8];
        int64_t s = 0; // without error feedback nothing is kept, so nothing saturates
        for (int k = 0; k < 8; k++)
            e[k] = k < m ? fc_cu_residual(x[k], dneg[k], &s) : 0.0f;
        if (ef) {
            const int64_t a = start + i;
            if (m == 8 && vec && rdt == FC_CU_F32) {
                float4 *p = (float4 *)((float *)res + a);
                p[0] = make_float4(e[0], e[1], e[2], e[3]);
                p[1] = make_float4(e[4], e[5], e[6], e[7]);
            } else if (m == 8 && vec) {
                uint32_t w[4];
                for (int k = 0; k < 8; k++)
                    s += fc_bf16_saturates(e[k]);
                for (int k = 0; k < 4; k++)
                    w[k] = (uint32_t)fc_f32_to_bf16(e[2 * k]) | (uint32_t)fc_f32_to_bf16(e[2 * k + 1]) << 16;
                *(uint4 *)((uint16_t *)res + a) = make_uint4(w[0], w[1], w[2], w[3]);
            } else {
                for (int k = 0; k < 8; k++) // fixed trip counts: the arrays stay in registers
                    if (k < m)
                        fc_cu_store_res(res, rdt, a + k, e[k], &s);
            }
            sat += s;
        }
        for (int k = 0; k < 8; k++)
            if (k < m)
                sum.add(x[k], e[k]);
    }
};

// cnt (<= 8) bytes of c at p; 8 bytes at an 8-byte aligned p as one store, at a 4-byte aligned
// one as two words.
__device__ __forceinline__ void fc_cu_store_bytes(uint8_t *p, const uint8_t *c, int cnt)
{
    if (cnt == 8 && ((uintptr_t)p & 3u) == 0) {
        const uint32_t lo = (uint32_t)c[0] | (uint32_t)c[1] << 8 | (uint32_t)c[2] << 16 | (uint32_t)c[3] << 24;
        const uint32_t hi = (uint32_t)c[4] | (uint32_t)c[5] << 8 | (uint32_t)c[6] << 16 | (uint32_t)c[7] << 24;
        if (((uintptr_t)p & 7u) == 0) {
            *(uint2 *)p = make_uint2(lo, hi);
        } else {
            ((uint32_t *)p)[0] = lo;
            ((uint32_t *)p)[1] = hi;
        }
        return;
    }
    for (int k = 0; k < 8; k++)
        if (k < cnt)
            p[k] = c[k];
}

// The low cnt (<= 16) bytes of lo | hi << 64 at p, little-endian: a packed group of codes.
__device__ __forceinline__ void fc_cu_store_group(uint8_t *p, uint64_t lo, uint64_t hi, int cnt)
{
    if (cnt == 4 && ((uintptr_t)p & 3u) == 0) {
        *(uint32_t *)p = (uint32_t)lo;
    } else if (cnt == 2 && ((uintptr_t)p & 1u) == 0) {
        *(uint16_t *)p = (uint16_t)lo;
    } else {
        for (int k = 0; k < cnt; k++)
            p[k] = (uint8_t)(k < 8 ? lo >> (8 * k) : hi >> (8 * (k - 8)));
    }
}

// Code j (0..7) of w bits of the packed group at p (w bytes): fc_unpack8's bit order, reading
// only the group's own bytes.
__device__ __forceinline__ uint32_t fc_cu_unpack1(const uint8_t *p, int w, int j)
{
    const int bit = j * w, lo = bit >> 3;
    uint32_t v = 0;
    for (int k = 0; k < 3 && lo + k < w; k++)
        v |= (uint32_t)p[lo + k] << (8 * k);
    return (v >> (bit & 7)) & ((1u << w) - 1u);
}

// ---- the CPU's block sums (fc_block.h): 8 double lanes, element i of a block starting at lo
// adding into lane (i - lo) % 8 in increasing i, combined as ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)).

// Lanes j = lane % 8 of each aligned group of 8 hold l_j; all 8 get the total. Each add is the
// CPU's (IEEE addition commutes exactly; which NaN a sum ends with does not matter: the rules
// that read a sum, fc_qsgd_norm and fc_onebit_mean, write the canonical one).
__device__ __forceinline__ double fc_cu_lanes_total(double s)
{
    s += __shfl_xor_sync(FC_CU_FULL, s, 1);
    s += __shfl_xor_sync(FC_CU_FULL, s, 2);
    s += __shfl_xor_sync(FC_CU_FULL, s, 4);
    return s;
}

// ---- the serial lane sums of a warp's tiles, in the CPU's order: the tile goes through shared
// memory as doubles (converted by all lanes), then lane j of each block adds its column in
// sequence. NS sums per element: T::add(double v, double *s) adds v's terms.

// Element j of group g (lane g's 8 values) of a tile in shared memory: by column, padded, so
// that both the lanes' stores and the 8 columns' serial reads hit distinct banks.
#define FC_CU_TILE_WORDS (8 * 33)
__device__ __forceinline__ int fc_cu_tile_at(int g, int j)
{
    return j * 33 + g;
}

template <int NS> struct fc_cu_tile_sums {
    double run[NS]; // blocks of >= 256: this lane's running CPU lane sum (lanes 0..7)

    // This warp's FC_CU_TILE_WORDS doubles of tile and 32 x NS block totals (blocks below a tile)
    // in the kernel's static shared memory (a codec kernel's FC_CU_CODEC_WARPS warps): found from
    // the warp's index where used, not kept in registers as pointers.
    __device__ __forceinline__ static double *tile()
    {
        __shared__ double tiles[FC_CU_CODEC_WARPS][FC_CU_TILE_WORDS];
        return tiles[threadIdx.x >> 5];
    }
    __device__ __forceinline__ static double *tot()
    {
        __shared__ double tots[FC_CU_CODEC_WARPS][32 * NS];
        return tots[threadIdx.x >> 5];
    }

    // The running sums zero.
    __device__ __forceinline__ void init()
    {
        for (int k = 0; k < NS; k++)
            run[k] = 0.0;
    }

    // One tile, all lanes: v are the lane's 8 values (0 past the end: a +0 term, which leaves
    // every such sum as it was). T::add(v, s) adds element v's terms to s[0..NS).
    template <class T> __device__ __forceinline__ void tile_add(int64_t bs, const float v[8], const T &t)
    {
        const int lane = threadIdx.x & 31, j = lane & 7;
        double *tile = this->tile();
        for (int k = 0; k < 8; k++)
            tile[fc_cu_tile_at(lane, k)] = (double)v[k];
        __syncwarp();
        if (bs >= FC_CU_TILE) {
            if (lane < 8)
                for (int g = 0; g < 32; g++)
                    t.add(tile[fc_cu_tile_at(g, j)], run);
        } else {
            const int blocks = FC_CU_TILE >> fc_cu_log2(bs), gpb = (int)(bs >> 3);
            const int rounds = blocks > 4 ? blocks / 4 : 1;
            for (int it = 0; it < rounds; it++) {
                const int q = (lane >> 3) + 4 * it;
                double s[NS];
                for (int k = 0; k < NS; k++)
                    s[k] = 0.0;
                if (q < blocks)
                    for (int g = 0; g < gpb; g++)
                        t.add(tile[fc_cu_tile_at(q * gpb + g, j)], s);
                for (int k = 0; k < NS; k++)
                    s[k] = fc_cu_lanes_total(s[k]);
                if (q < blocks && j == 0)
                    for (int k = 0; k < NS; k++)
                        tot()[NS * q + k] = s[k];
            }
        }
        __syncwarp();
    }

    // After the unit's tiles: sum k of this lane's block (all lanes).
    __device__ __forceinline__ double total(int64_t bs, int k)
    {
        const int lane = threadIdx.x & 31;
        if (bs >= FC_CU_TILE)
            return __shfl_sync(FC_CU_FULL, fc_cu_lanes_total(run[k]), 0);
        return tot()[NS * (lane >> fc_cu_log2(fc_cu_block_lanes(bs))) + k];
    }
};

#endif
