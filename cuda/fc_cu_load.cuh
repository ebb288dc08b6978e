// fc_cu_load.cuh: the decode's wide loads of a payload's codes, of the own chunk and of `none`'s
// values (fc_cu_decode.cuh). A payload's codes start 4-byte aligned at best (a 16-byte aligned
// slot, the 32-byte header, meta words of 4 or 8 bytes per block) and the own chunk wherever the
// rank's span starts, so each load takes the widest access its address allows: 16 bytes where
// the address is a multiple of 16, down to single bytes. Every thread of a run-per-thread loop
// steps by the same multiple of 16 bytes, so the choice is the same across a warp.
#ifndef FC_CU_LOAD_CUH
#define FC_CU_LOAD_CUH

#include "fc_cu.cuh"

// N consecutive little-endian 32-bit words at p into u (p at least 1-byte aligned).
template <int N> __device__ __forceinline__ void fc_cu_ld_words(const uint8_t *p, uint32_t (&u)[N])
{
    const uintptr_t a = (uintptr_t)p;
    if (N % 4 == 0 && (a & 15u) == 0) {
        for (int q = 0; q < N / 4; q++) {
            const uint4 t = ((const uint4 *)p)[q];
            u[4 * q] = t.x;
            u[4 * q + 1] = t.y;
            u[4 * q + 2] = t.z;
            u[4 * q + 3] = t.w;
        }
    } else if (N % 2 == 0 && (a & 7u) == 0) {
        for (int q = 0; q < N / 2; q++) {
            const unsigned long long t = ((const unsigned long long *)p)[q];
            u[2 * q] = (uint32_t)t;
            u[2 * q + 1] = (uint32_t)(t >> 32);
        }
    } else if ((a & 3u) == 0) {
        for (int q = 0; q < N; q++)
            u[q] = ((const uint32_t *)p)[q];
    } else if ((a & 1u) == 0) {
        for (int q = 0; q < N; q++)
            u[q] = (uint32_t)((const uint16_t *)p)[2 * q] | (uint32_t)((const uint16_t *)p)[2 * q + 1] << 16;
    } else {
        for (int q = 0; q < N; q++)
            u[q] = (uint32_t)p[4 * q] | (uint32_t)p[4 * q + 1] << 8 | (uint32_t)p[4 * q + 2] << 16 |
                   (uint32_t)p[4 * q + 3] << 24;
    }
}

// The nbytes (0..8) bytes at p as a little-endian word: a packed group of codes, whose length
// (the code width) is the config's.
__device__ __forceinline__ uint64_t fc_cu_ld_le(const uint8_t *p, int nbytes)
{
    const uintptr_t a = (uintptr_t)p;
    uint64_t v = 0;
    if (nbytes == 8 && (a & 7u) == 0)
        return *(const unsigned long long *)p;
    if ((nbytes & 3) == 0 && (a & 3u) == 0) {
        for (int k = 0; k < nbytes / 4; k++)
            v |= (uint64_t)((const uint32_t *)p)[k] << (32 * k);
    } else if ((nbytes & 1) == 0 && (a & 1u) == 0) {
        for (int k = 0; k < nbytes / 2; k++)
            v |= (uint64_t)((const uint16_t *)p)[k] << (16 * k);
    } else {
        for (int k = 0; k < nbytes; k++)
            v |= (uint64_t)p[k] << (8 * k);
    }
    return v;
}

// f(k, x_k) for the sixteen elements x_0.. of dtype dt (fp32, bf16 or fp16) from element i of
// p, as fp32, one 16-byte piece at a time (where the address allows it): 4 or 8 values live
// between a load and its use, not 16.
template <class F> __device__ __forceinline__ void fc_cu_each16(const void *p, int dt, int64_t i, F f)
{
    if (dt == FC_CU_F32) {
        for (int q = 0; q < 4; q++) {
            uint32_t u[4];
            fc_cu_ld_words<4>((const uint8_t *)p + 4 * (i + 4 * q), u);
            for (int k = 0; k < 4; k++)
                f(4 * q + k, fc_bits_f32(u[k]));
        }
        return;
    }
    for (int q = 0; q < 2; q++) {
        uint32_t u[4];
        fc_cu_ld_words<4>((const uint8_t *)p + 2 * (i + 8 * q), u);
        for (int k = 0; k < 8; k++) {
            const uint16_t h = (uint16_t)(u[k >> 1] >> (16 * (k & 1)));
            f(8 * q + k, dt == FC_CU_BF16 ? fc_bf16_to_f32(h) : fc_f16_to_f32(h));
        }
    }
}

#endif
