// float_probe.cu (tests only): fp32 in a kernel where x86 and a GPU write different bits
// (tests/cuda/test_cuda_emu_float.py builds it as build.py builds cuda/, float rewritten, and once
// with the host's float): NaN made by an operation, NaN passed through one, a libm call's NaN,
// float-to-integer casts of NaN and of values out of range; and what keeps its bits on both
// (a copy, a shuffle, a bit cast, a finite result).
#include "cuda_runtime.h"
#include <cstdio>
#include <cstring>

static unsigned bits(float f)
{
    unsigned u;
    memcpy(&u, &f, 4);
    return u;
}

__global__ void k_nan(const float *in, float *out, int *cvt)
{
    const float inf = in[0], canon = in[1], one = in[2]; // +Inf, 0x7fc00000, 1
    out[0] = inf - inf;           // made: x86 0xffc00000
    out[1] = 0.0f * inf;          // made
    out[2] = canon + one;         // passed on: x86 keeps 0x7fc00000
    out[3] = -canon;              // neg of a NaN (PTX: unspecified)
    out[4] = sqrtf(-one);         // libm's NaN
    out[5] = (float)(double)canon; // a conversion from double
    out[6] = canon;               // a copy keeps the bits, on both
    out[7] = __shfl_sync(0xffffffffu, canon, 0); // so does a shuffle
    out[8] = one / 3.0f;          // finite: the same on both
    cvt[0] = (int)(signed char)(out[0]);  // (int8_t)NaN: 0 on the device (cvt.rzi.s32, low byte)
    cvt[1] = (int)(out[1]);               // (int32_t)NaN: 0 on the device, INT_MIN on x86
    cvt[2] = (int)(in[3]);                // (int32_t)3e9: saturates to INT_MAX on the device
}

int main()
{
    const unsigned inb[4] = {0x7f800000u, 0x7fc00000u, 0x3f800000u, 0x4f32d05eu}; // +Inf, NaN, 1, 3e9
    float in[4], out[9];
    int cvt[3];
    memcpy(in, inb, sizeof(in));
    k_nan<<<1, 32>>>(in, out, cvt);
    printf("made %08x %08x\n", bits(out[0]), bits(out[1]));
    printf("passed %08x\n", bits(out[2]));
    printf("neg %08x\n", bits(out[3]));
    printf("sqrt %08x\n", bits(out[4]));
    printf("from_double %08x\n", bits(out[5]));
    printf("kept %08x %08x\n", bits(out[6]), bits(out[7]));
    printf("finite %08x\n", bits(out[8]));
    printf("cvt %d %d %d\n", cvt[0], cvt[1], cvt[2]);
    return 0;
}
