// emu_float.h (tests only): fp32 as a GPU computes it, where that differs from the host's x86
// and the bytes can show it. build.py rewrites every `float` of the emulated sources (cuda/ and
// the csrc/common/ rules they include) into fc_emu_f32, a float whose operations behave as the
// device's:
//
// - NaN bits. x86 makes the "default NaN" 0xffc00000 (Inf - Inf, 0 * Inf, 0 / 0, sqrt(-1)) and
//   an operation on a NaN passes that NaN's payload on (0x7fc00000 + 1 is 0x7fc00000); a GPU's
//   arithmetic writes every NaN it returns, made or passed, as 0x7fffffff (PTX leaves neg/abs of a
//   NaN unspecified: taken as the same). The host emulation wrote the host's bits, equal to the
//   CPU reference's, and so passed where the H200 failed (run 3: dct's coefficients, the 8-bit
//   residual's 0 * Inf). Here every arithmetic result, conversion to fp32 and libm call on an
//   fc_emu_f32 that is NaN comes out as 0x7fffffff: a NaN reaches the wire as the project's
//   canonical one (FC_NAN_BITS) only where the code made it so, as on the device.
// - Float to integer conversions written as casts (`(int32_t)x`, `(int8_t)floorf(y)`): the
//   device's cvt.rzi saturates to the destination's range and turns NaN into 0, where x86 gives
//   the "integer indefinite" (INT_MIN) for both; C calls it undefined. An implicit conversion
//   (`int i = x;`) stays the host's: C++ lets only explicit conversion functions tell the two
//   apart without making every mixed float/int expression ambiguous.
//
// Loads, stores, copies, shuffles and bit casts keep the bits, as on the device. What is the same
// on both and needs nothing: + - * / and sqrt correctly rounded (nvcc's defaults, -prec-div and
// -prec-sqrt; setup.py's --fmad=false and the emulator's -ffp-contract=off keep products apart
// from sums), subnormals kept (no -ftz on either side: run 3's denormal block of the res8 test
// was not its failure).
//
// What it still cannot show: transcendental functions (the host's libm, never CUDA's: the
// project's rules avoid them in anything that reaches the bytes, fc_dct.h says why), contraction
// or fast-math flags a build might add, double's NaN bits (doubles stay the host's), and host
// code in cuda/*.cu, which the real build runs on x86 but this one rewrites too (none of it
// makes NaNs today).
#ifndef FC_EMU_FLOAT_H
#define FC_EMU_FLOAT_H

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#define FC_EMU_DEVICE_NAN 0x7fffffffu // the one NaN a GPU's fp32 arithmetic writes

// r, any NaN made the device's
constexpr float fc_emu_dev(float r)
{
    return (std::bit_cast<uint32_t>(r) & 0x7fffffffu) > 0x7f800000u ? std::bit_cast<float>(FC_EMU_DEVICE_NAN) : r;
}

template <class T> concept fc_emu_arith = std::is_arithmetic_v<T>;

struct fc_emu_f32 {
    float v;
    fc_emu_f32() = default; // trivial: a member of a union, memcpy'd, passed as a float is
    constexpr fc_emu_f32(float f) : v(f) {} // a copy of a float: its bits
    // a conversion to fp32 (from double, an integer): an operation, NaN as the device writes it
    template <fc_emu_arith T>
        requires(!std::is_same_v<T, float>)
    constexpr fc_emu_f32(T x) : v(fc_emu_dev((float)x))
    {
    }
    constexpr operator float() const { return v; }
    // (int32_t)x, (uint32_t)x, (int64_t)x ...: cvt.rzi's saturation, NaN to 0; a narrower type
    // (int8_t)x, as nvcc compiles it (PTX of fc_cu_res8.cu): cvt.rzi.s32.f32 (u32 for an
    // unsigned type), then its low bits
    template <class I>
        requires(std::is_integral_v<I> && !std::is_same_v<I, bool>)
    constexpr explicit operator I() const
    {
        if constexpr (sizeof(I) < 4) {
            using W = std::conditional_t<std::is_signed_v<I>, int32_t, uint32_t>;
            return (I)(W) * this;
        } else {
            if (v != v)
                return 0;
            using L = std::numeric_limits<I>;
            if (v <= (float)L::min())
                return L::min();
            if (v >= (float)L::max()) // max() as a float rounds up to a power of two: at or above saturates
                return L::max();
            return (I)v;
        }
    }
    constexpr fc_emu_f32 operator-() const { return fc_emu_dev(-v); }
    constexpr fc_emu_f32 operator+() const { return *this; }
};
static_assert(sizeof(fc_emu_f32) == 4 && std::is_trivially_copyable_v<fc_emu_f32>, "a float's layout");

// The four operations: fp32 with fp32 (or an operand that converts to it, as C's usual
// conversions do) is the device's fp32 operation; with a double operand C computes in double,
// and the result is a double (its conversion back, if any, is a constructor above).
#define FC_EMU_BINOP(op)                                                                                \
    constexpr fc_emu_f32 operator op(fc_emu_f32 a, fc_emu_f32 b) { return fc_emu_dev(a.v op b.v); }     \
    template <fc_emu_arith T> constexpr auto operator op(fc_emu_f32 a, T b)                             \
    {                                                                                                   \
        if constexpr (std::is_same_v<decltype(a.v op b), float>)                                        \
            return fc_emu_f32(fc_emu_dev(a.v op b));                                                    \
        else                                                                                            \
            return a.v op b;                                                                            \
    }                                                                                                   \
    template <fc_emu_arith T> constexpr auto operator op(T a, fc_emu_f32 b)                             \
    {                                                                                                   \
        if constexpr (std::is_same_v<decltype(a op b.v), float>)                                        \
            return fc_emu_f32(fc_emu_dev(a op b.v));                                                    \
        else                                                                                            \
            return a op b.v;                                                                            \
    }                                                                                                   \
    template <class T> constexpr fc_emu_f32 &operator op##=(fc_emu_f32 &a, T b) { return a = a op b; } \
    template <fc_emu_arith T> constexpr T &operator op##=(T &a, fc_emu_f32 b) { return a = (T)(a op b); }
FC_EMU_BINOP(+)
FC_EMU_BINOP(-)
FC_EMU_BINOP(*)
FC_EMU_BINOP(/)
#undef FC_EMU_BINOP

// The libm calls the kernels make on fp32 (the device's instructions: cvt.rmi, sqrt.rn, max, abs),
// NaN as the device writes it. fmaxf / fminf return the other operand of one NaN on both.
#define FC_EMU_UNARY(name)                                                                  \
    static inline fc_emu_f32 name(fc_emu_f32 x) { return fc_emu_dev(::name(x.v)); }
FC_EMU_UNARY(floorf)
FC_EMU_UNARY(ceilf)
FC_EMU_UNARY(truncf)
FC_EMU_UNARY(rintf)
FC_EMU_UNARY(roundf)
FC_EMU_UNARY(sqrtf)
FC_EMU_UNARY(fabsf)
#undef FC_EMU_UNARY
static inline fc_emu_f32 floor(fc_emu_f32 x) { return floorf(x); }
static inline fc_emu_f32 ceil(fc_emu_f32 x) { return ceilf(x); }
static inline fc_emu_f32 sqrt(fc_emu_f32 x) { return sqrtf(x); }
static inline fc_emu_f32 fabs(fc_emu_f32 x) { return fabsf(x); }
static inline fc_emu_f32 fmaxf(fc_emu_f32 a, fc_emu_f32 b) { return fc_emu_dev(::fmaxf(a.v, b.v)); }
static inline fc_emu_f32 fminf(fc_emu_f32 a, fc_emu_f32 b) { return fc_emu_dev(::fminf(a.v, b.v)); }

// cuda_runtime.h (included after this header, and not rewritten) writes through a float *: the
// rewritten callers pass an fc_emu_f32 * (found at the call, by argument-dependent lookup)
template <class Ev> static inline auto cudaEventElapsedTime(fc_emu_f32 *ms, Ev a, Ev b)
{
    float f = 0.0f;
    const auto rc = cudaEventElapsedTime(&f, a, b);
    *ms = f;
    return rc;
}

#endif
